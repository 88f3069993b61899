// Graph search kernel: best-first search with backtracking on a k-NN / pruned search graph.
//
// Implements GGNN (Groh et al.) section 4 -- one thread block per query, all per-query state in
// shared memory ("cache": sorted best list + priority queue + visited set), neighbour fetch and
// distance computation spread over the block with coalesced 16-byte loads, and the slack stopping
// criterion of sec. 4.1.2 (stop once the best unexpanded candidate is farther than
// d_best_k + tau * min(d_best_1, d_nn1+)).  From BANG (sec. 4.7-4.9) it takes the parallel merge of
// sorted lists (every element finds its output slot by binary search in the other list) and the
// exact fp32 re-ranking of the final candidate list when traversal reads an fp16 copy of the data.
//
// Differences from the papers, and why:
//  * The best list and the priority queue are ONE sorted list of `L` (= beam) entries whose index
//    carries an "expanded" flag in its top bit (as in CAGRA's internal top-k list).  GGNN keeps
//    them apart; merging them saves one insertion per candidate and one list in shared memory, and
//    the front-most unflagged entry is exactly GGNN's priority-queue head.
//  * Candidates of one expansion are inserted in a batch: rank-sorted in shared memory, then merged
//    with the list by binary searches (BANG 4.8) -- one barrier per step instead of one insertion
//    per candidate (GGNN's Push).  See NOTES_search.md for the measurements.
//  * Visited set (VIS = 0): open-addressing hash table in shared memory.  When it would pass half
//    load it is cleared and refilled with the current list.  This is exact: once the list is full
//    its worst key only decreases, so a forgotten node that was already rejected is rejected again
//    (wasted distance only), and nodes in the list are never forgotten, so the list never holds
//    duplicates.
//  * Visited set (VIS = 1, the default): Bloom filter (BANG 4.4), 8x denser than the hash, so it
//    is refilled less often in the same shared memory (every refill makes rejected nodes be
//    evaluated again) and still fits with lists of thousands of entries.  BANG sets 2 bits
//    (FNV-1a hashes) anywhere in the array; here the bits of one node all lie in ONE 32-bit word
//    (a "blocked" Bloom filter) so that a single atomicOr both tests and sets them: of two threads
//    inserting the same node exactly one sees a bit missing, so a node is never taken twice (no
//    duplicate in the list).
//    A false positive only skips a node (recall, never wrong distances).  The filter is cleared
//    and refilled with the list like the hash (when 1/16 of its bits' worth of nodes went in,
//    false-positive rate ~1 %), which also bounds how long a false positive lasts.
//  * The slack test is applied on a Euclidean-like scale c(d) = sqrt(max(d + shift, 0)) (the CPU
//    reference _search_cpu.py does the same): 'l2' distances are squared internally, so c is the
//    Euclidean distance and tau keeps GGNN's meaning; for 'ip' (negative dot product) shift =
//    |q| * max_i |x_i| makes d + shift >= 0, and for unit vectors c(d) = |q - x| / sqrt(2).
#include "search_common.cuh"

namespace kk {

// Distance between the query (shared memory, float) and one data row, computed by a team of
// TEAM consecutive lanes; every lane issues up to MAXCH 16-byte loads before using any of them so
// that the loads are in flight together (memory-level parallelism is what bounds this kernel).
template <typename T, int EPC, int TEAM, int MAXCH, int METRIC>
__device__ __forceinline__ float team_distance(const T* __restrict__ row, const float* __restrict__ qs,
                                               int nchunks, int lane, bool active) {
    float acc = 0.f;
    if constexpr (sizeof(T) == 2 && EPC == 8) {
        // fp16: keep the loads as raw 16-byte words (4 registers, not 8) until they are used.
        for (int base = 0; base < nchunks; base += TEAM * MAXCH) {
            uint4 raw[MAXCH];
#pragma unroll
            for (int u = 0; u < MAXCH; ++u) {
                const int c = base + u * TEAM + lane;
                raw[u] = (active && c < nchunks) ? __ldg(reinterpret_cast<const uint4*>(row) + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < MAXCH; ++u) {
                const int c = base + u * TEAM + lane;
                if (active && c < nchunks) {
                    const __half2* h = reinterpret_cast<const __half2*>(&raw[u]);
                    const float4 q0 = *reinterpret_cast<const float4*>(qs + c * 8);
                    const float4 q1 = *reinterpret_cast<const float4*>(qs + c * 8 + 4);
                    const float qv[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float2 f = __half22float2(h[e]);
                        if constexpr (METRIC == 0) {
                            const float t0 = qv[2 * e] - f.x, t1 = qv[2 * e + 1] - f.y;
                            acc = fmaf(t0, t0, acc);
                            acc = fmaf(t1, t1, acc);
                        } else {
                            acc = fmaf(qv[2 * e], f.x, acc);
                            acc = fmaf(qv[2 * e + 1], f.y, acc);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int o = TEAM / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        return METRIC == 0 ? acc : -acc;
    }
    for (int base = 0; base < nchunks; base += TEAM * MAXCH) {
        float v[MAXCH][EPC];
#pragma unroll
        for (int u = 0; u < MAXCH; ++u) {
            int c = base + u * TEAM + lane;
            if (active && c < nchunks) {
                load_chunk<T, EPC>(row, c, v[u]);
            } else {
#pragma unroll
                for (int e = 0; e < EPC; ++e) v[u][e] = 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < MAXCH; ++u) {
            int c = base + u * TEAM + lane;
            if (active && c < nchunks) {
                float qv[EPC];
                if constexpr (EPC % 4 == 0) {
#pragma unroll
                    for (int e = 0; e < EPC; e += 4) {
                        float4 t = *reinterpret_cast<const float4*>(qs + c * EPC + e);
                        qv[e] = t.x; qv[e + 1] = t.y; qv[e + 2] = t.z; qv[e + 3] = t.w;
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < EPC; ++e) qv[e] = qs[c * EPC + e];
                }
#pragma unroll
                for (int e = 0; e < EPC; ++e) {
                    if constexpr (METRIC == 0) {
                        float t = qv[e] - v[u][e];
                        acc = fmaf(t, t, acc);
                    } else {
                        acc = fmaf(qv[e], v[u][e], acc);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int o = TEAM / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return METRIC == 0 ? acc : -acc;
}

// Number of entries of the sorted (d, i) list that are strictly before key (kd, ki).
__device__ __forceinline__ int count_before(const float* __restrict__ d, const int* __restrict__ idx, int n,
                                            float kd, int ki) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (key_less(d[mid], idx[mid] & KK_INT_MAX, kd, ki)) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// Insert `node` into the visited hash; true when it was not there before.
__device__ __forceinline__ bool hash_insert(int* __restrict__ table, int mask, int node) {
    unsigned h = (unsigned)node * 2654435761u;
    int slot = (int)((h ^ (h >> 15)) & (unsigned)mask);
    while (true) {
        int prev = atomicCAS(table + slot, -1, node);
        if (prev == -1) return true;
        if (prev == node) return false;
        slot = (slot + 1) & mask;
    }
}

// Insert `node` into a blocked Bloom filter of (wmask + 1) 32-bit words; true when at least one of
// its bits was clear (first insertion, or never: a false positive).  Word and bit positions come
// from one murmur3 finaliser of the id (node ids are often consecutive: they need full mixing).
// wmask < 2^17, so bits 17..31 of the hash are independent of the word.
__device__ __forceinline__ bool bloom_insert(unsigned* __restrict__ words, unsigned wmask, int node) {
    unsigned h = (unsigned)node;
    h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
    const unsigned bits = (1u << ((h >> 17) & 31u)) | (1u << ((h >> 22) & 31u)) | (1u << (h >> 27));
    const unsigned old = atomicOr(words + (h & wmask), bits);
    return (old & bits) != bits;
}

template <int VIS>
__device__ __forceinline__ bool visit(int* __restrict__ table, int mask, int node) {
    if constexpr (VIS == 0) return hash_insert(table, mask, node);
    else return bloom_insert(reinterpret_cast<unsigned*>(table), (unsigned)mask, node);
}

// Exact fp32 distance of one row by a team (generic loads: used once per final entry only).
template <int TEAM, int METRIC>
__device__ __forceinline__ float team_distance_f32(const float* __restrict__ row, const float* __restrict__ qs, int d,
                                                   int lane, bool active) {
    float acc = 0.f;
    if (active) {
        for (int e = lane; e < d; e += TEAM) {
            const float x = __ldg(row + e);
            if constexpr (METRIC == 0) { const float t = qs[e] - x; acc = fmaf(t, t, acc); }
            else acc = fmaf(qs[e], x, acc);
        }
    }
#pragma unroll
    for (int o = TEAM / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return METRIC == 0 ? acc : -acc;
}

// In-block bitonic sort of np (a power of two) (distance, index) pairs in shared memory.
template <int NT>
__device__ __forceinline__ void block_bitonic_sort(float* __restrict__ d, int* __restrict__ idx, int np, int tid) {
    for (int size = 2; size <= np; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = tid; t < (np >> 1); t += NT) {
                const int lo = 2 * t - (t & (stride - 1));
                const int hi = lo + stride;
                const bool asc = (lo & size) == 0;
                if (key_less(d[hi], idx[hi], d[lo], idx[lo]) == asc) {
                    float a = d[lo]; d[lo] = d[hi]; d[hi] = a;
                    int b = idx[lo]; idx[lo] = idx[hi]; idx[hi] = b;
                }
            }
            __syncthreads();
        }
    }
}

}  // namespace kk

enum { C_NCAND = 0, C_NVALID = 1, C_NPAR = 2, C_NCTRL = 4 };

// One block per query (grid-stride over queries).  Dynamic shared memory layout, in this order:
//   qs[dpad] float | bd[2][Lp] float | bi[2][Lp] int | cidx[cmax] int | cdist[cmax] float |
//   sd[cmax] float | si[cmax] int | cvi[cmax] int | vis[vis_words] int | parents[width] int
// VIS: 0 = visited hash table (vis_words slots), 1 = Bloom filter (vis_words 32-bit words); either
// is cleared and refilled with the list before more than vis_cap insertions would have gone in.
// MINB: minimum resident blocks per SM asked of the register allocator (1 = no constraint).
// MODE: 0 = write the list's first k entries; 1 = re-score the whole list in fp32 and sort it here
// (fp16 traversal, fused); 2 = write the list's indices to out_list for rerank_topk (split: the
// traversal kernel then needs fewer registers).
// GL: 0 = the two list buffers bd[2][Lp] / bi[2][Lp] in shared memory (as above); 1 = in global
// memory, 4 * Lp words per block at glist + blockIdx.x * 4 * Lp (the grid is then capped so that
// the slabs stay few), for beams whose list does not fit in shared memory (beam > 8192 at R = 128).
// The algorithm is the same; __syncthreads orders a block's global writes for its own threads as it
// does its shared ones. A template parameter, not a runtime test: a pointer that may be either
// space makes every list access a generic load in the shared-memory kernel too.
template <typename T, int EPC, int TEAM, int MAXCH, int METRIC, int NT, int MODE, int MINB, int VIS, int GL>
__global__ void __launch_bounds__(NT, MINB) graph_search(
    const T* __restrict__ X, const float* __restrict__ Xf, int n, int d,
    const int* __restrict__ graph, int R,
    const float* __restrict__ Q, const float* __restrict__ qshift, int nq, const int* __restrict__ seeds, int S,
    int k, int L, int Lp, int width, int cmax, int vis_words, int vis_cap, float tau, float nn1, int max_iters,
    float* __restrict__ out_d, long long* __restrict__ out_i, int* __restrict__ stats, int* __restrict__ out_list,
    float* glist) {
    using namespace kk;
    extern __shared__ float4 smem_raw[];
    __shared__ int ctrl[C_NCTRL];

    const int dpad = (d + 3) & ~3;
    float* qs = reinterpret_cast<float*>(smem_raw);
    // the list buffers: shared memory after the query, or this block's slab of glist (GL = 1)
    float* bdA = GL ? glist + (long long)blockIdx.x * 4 * Lp : qs + dpad;
    float* bdB = bdA + Lp;
    int* biA = reinterpret_cast<int*>(bdB + Lp);
    int* biB = biA + Lp;
    int* cidx = GL ? reinterpret_cast<int*>(qs + dpad) : biB + Lp;
    float* cdist = reinterpret_cast<float*>(cidx + cmax);
    float* sd = cdist + cmax;
    int* si = reinterpret_cast<int*>(sd + cmax);
    int* cvi = si + cmax;
    int* hash = cvi + cmax;
    int* parents = hash + vis_words;

    const int tid = threadIdx.x;
    const int team = tid / TEAM, lane = tid % TEAM;
    constexpr int NTEAMS = NT / TEAM;
    const int nchunks = d / EPC;
    const int hmask = vis_words - 1;

    for (int q = blockIdx.x; q < nq; q += gridDim.x) {
        for (int i = tid; i < d; i += NT) qs[i] = Q[(long long)q * d + i];
        for (int i = tid; i < vis_words; i += NT) hash[i] = VIS == 0 ? -1 : 0;
        const float shift = METRIC == 0 ? 0.f : qshift[q];
        float* bd = bdA; int* bi = biA; float* nbd = bdB; int* nbi = biB;
        int cnt = 0, hcount = 0, ndist = 0, it = 0;

        // Evaluate the candidates cidx[0..nc) and merge the ones that beat the list's worst entry.
        // Entered after a barrier that published cidx / ctrl[C_NCAND]; ctrl[C_NVALID] must be 0.
        auto evaluate_and_merge = [&](int nc) {
            const float worst_d = cnt == L ? bd[L - 1] : KK_INF;
            const int worst_i = cnt == L ? (bi[L - 1] & KK_INT_MAX) : KK_INT_MAX;
            for (int jb = 0; jb < nc; jb += NTEAMS) {
                const int j = jb + team;
                const bool active = j < nc;
                const int node = active ? cidx[j] : 0;
                float dist = team_distance<T, EPC, TEAM, MAXCH, METRIC>(X + (long long)node * d, qs, nchunks, lane,
                                                                        active);
                if (active && lane == 0 && dist < KK_INF && key_less(dist, node, worst_d, worst_i)) {
                    // compact the survivors: most candidates late in a search lose to the worst entry
                    const int slot = atomicAdd(&ctrl[C_NVALID], 1);
                    cdist[slot] = dist;
                    cvi[slot] = node;
                }
            }
            ndist += nc;
            __syncthreads();
            const int m = ctrl[C_NVALID];
            if (m == 0) return;  // uniform: every thread read the same counter
            // Rank sort of the m survivors (m <= width * R, usually a handful): one thread per survivor.
            for (int j = tid; j < m; j += NT) {
                const float dj = cdist[j];
                const int ij = cvi[j];
                int r = 0;
                for (int i = 0; i < m; ++i) r += key_less(cdist[i], cvi[i], dj, ij);
                sd[r] = dj; si[r] = ij;
            }
            __syncthreads();
            // Parallel merge (BANG 4.8): every element's output slot is its own rank plus its rank in
            // the other list; slots past L fall off the end.
            for (int i = tid; i < cnt; i += NT) {
                const float di = bd[i];
                const int ii = bi[i];
                const int pos = i + count_before(sd, si, m, di, ii & KK_INT_MAX);
                if (pos < L) { nbd[pos] = di; nbi[pos] = ii; }
            }
            for (int j = tid; j < m; j += NT) {
                const int pos = j + count_before(bd, bi, cnt, sd[j], si[j]);
                if (pos < L) { nbd[pos] = sd[j]; nbi[pos] = si[j]; }
            }
            __syncthreads();
            float* t = bd; bd = nbd; nbd = t;
            int* u = bi; bi = nbi; nbi = u;
            cnt = min(L, cnt + m);
        };

        // Forget the visited set but keep the list in it (exact, see the header comment).  Entered
        // and left at a barrier; uniform (hcount is the same in every thread).
        auto forget = [&]() {
            for (int i = tid; i < vis_words; i += NT) hash[i] = VIS == 0 ? -1 : 0;
            __syncthreads();
            for (int i = tid; i < cnt; i += NT) visit<VIS>(hash, hmask, bi[i] & KK_INT_MAX);
            hcount = cnt;
            __syncthreads();
        };

        // Seeds, in chunks of cmax.
        for (int s0 = 0; s0 < S; s0 += cmax) {
            const int ns = min(cmax, S - s0);
            if (hcount + ns > vis_cap) { __syncthreads(); forget(); }
            if (tid == 0) { ctrl[C_NCAND] = 0; ctrl[C_NVALID] = 0; }
            __syncthreads();
            for (int t = tid; t < ns; t += NT) {
                const int nb = seeds[(long long)q * S + s0 + t];
                if (nb >= 0 && nb < n && visit<VIS>(hash, hmask, nb)) cidx[atomicAdd(&ctrl[C_NCAND], 1)] = nb;
            }
            hcount += ns;
            __syncthreads();
            evaluate_and_merge(ctrl[C_NCAND]);
        }

        for (; it < max_iters; ++it) {
            // Pick up to `width` parents: the front-most unexpanded entries that pass the slack test.
            if (tid < 32) {
                int found = 0;
                bool stop = false;
                float slack_bound = KK_INF;
                if (cnt >= k) {
                    // Slack test on a Euclidean-like scale c(d) = sqrt(max(d + shift, 0)); shift = 0 for
                    // 'l2', |q| * max|x| for 'ip' (Cauchy-Schwarz makes d + shift >= 0; for unit
                    // vectors c is |q - x| / sqrt(2)).  Stop once c(d) > c(d_k) + tau * min(c(d_1), nn1).
                    const float c1 = sqrtf(fmaxf(bd[0] + shift, 0.f));
                    const float b = sqrtf(fmaxf(bd[k - 1] + shift, 0.f)) + tau * fminf(c1, nn1);
                    // back to the distance scale; NaN (inf * 0) or inf means no stop
                    slack_bound = (b == b && b < KK_INF) ? b * b - shift : KK_INF;
                }
                for (int base = 0; base < cnt && found < width && !stop; base += 32) {
                    const int i = base + tid;
                    const bool un = i < cnt && !(bi[i] & KK_FLAG);
                    unsigned msk = __ballot_sync(0xffffffffu, un);
                    while (msk && found < width) {
                        const int pos = base + __ffs(msk) - 1;
                        if (bd[pos] > slack_bound) { stop = true; break; }  // sorted: the rest fail too
                        if (tid == 0) { parents[found] = bi[pos]; bi[pos] |= KK_FLAG; }
                        ++found;
                        msk &= msk - 1;
                    }
                    __syncwarp();
                }
                if (tid == 0) { ctrl[C_NPAR] = found; ctrl[C_NCAND] = 0; ctrl[C_NVALID] = 0; }
            }
            __syncthreads();
            const int npar = ctrl[C_NPAR];
            if (npar == 0) break;
            if (hcount + npar * R > vis_cap) forget();
            // Fetch the parents' neighbour rows (coalesced) and keep the unvisited ones.
            for (int t = tid; t < npar * R; t += NT) {
                const int p = parents[t / R] & KK_INT_MAX;
                const int nb = graph[(long long)p * R + (t % R)];
                if (nb >= 0 && nb < n && visit<VIS>(hash, hmask, nb)) cidx[atomicAdd(&ctrl[C_NCAND], 1)] = nb;
            }
            hcount += npar * R;
            __syncthreads();
            evaluate_and_merge(ctrl[C_NCAND]);
        }

        const float* fd = bd;
        const int* fi = bi;
        if constexpr (MODE == 2) {
            for (int i = tid; i < L; i += NT) out_list[(long long)q * L + i] = i < cnt ? (bi[i] & KK_INT_MAX) : -1;
        }
        if constexpr (MODE == 1) {
            // BANG 4.9: exact fp32 distances for the whole final list, then sort them.
            int np = 1;
            while (np < cnt) np <<= 1;
            for (int i = cnt + tid; i < np; i += NT) { nbd[i] = KK_INF; nbi[i] = KK_INT_MAX; }
            for (int jb = 0; jb < cnt; jb += NTEAMS) {
                const int j = jb + team;
                const bool active = j < cnt;
                const int node = active ? (bi[j] & KK_INT_MAX) : 0;
                const float dist = team_distance_f32<TEAM, METRIC>(Xf + (long long)node * d, qs, d, lane, active);
                if (active && lane == 0) { nbd[j] = dist; nbi[j] = node; }
            }
            __syncthreads();
            block_bitonic_sort<NT>(nbd, nbi, np, tid);
            fd = nbd; fi = nbi;
        }
        if constexpr (MODE != 2) {
            for (int i = tid; i < k; i += NT) {
                const bool ok = i < cnt;
                out_d[(long long)q * k + i] = ok ? fd[i] : KK_INF;
                out_i[(long long)q * k + i] = ok ? (long long)(fi[i] & KK_INT_MAX) : -1LL;
            }
        }
        if (stats != nullptr && tid == 0) { stats[2 * q] = it; stats[2 * q + 1] = ndist; }
        __syncthreads();  // shared memory is reused by the next query of this block
    }
}

// Split re-ranking (BANG 4.9 as its own kernel): exact fp32 distances of each query's final list
// (indices from graph_search<..., MODE 2>, -1 = empty), bitonic sort, first k written out.
// Shared memory: qs[dpad] | sd[Lp] | si[Lp].
template <int TEAM, int METRIC, int NT>
__global__ void __launch_bounds__(NT) rerank_topk(const float* __restrict__ Xf, int d, const float* __restrict__ Q,
                                                  const int* __restrict__ list, int nq, int L, int Lp, int k,
                                                  float* __restrict__ out_d, long long* __restrict__ out_i) {
    using namespace kk;
    extern __shared__ float4 smem_raw[];
    const int dpad = (d + 3) & ~3;
    float* qs = reinterpret_cast<float*>(smem_raw);
    float* sd = qs + dpad;
    int* si = reinterpret_cast<int*>(sd + Lp);
    const int tid = threadIdx.x, team = tid / TEAM, lane = tid % TEAM;
    constexpr int NTEAMS = NT / TEAM;
    for (int q = blockIdx.x; q < nq; q += gridDim.x) {
        for (int i = tid; i < d; i += NT) qs[i] = Q[(long long)q * d + i];
        __syncthreads();
        for (int jb = 0; jb < Lp; jb += NTEAMS) {
            const int j = jb + team;
            const int node = j < L ? list[(long long)q * L + j] : -1;
            const bool active = node >= 0;
            const float dist = team_distance_f32<TEAM, METRIC>(Xf + (long long)(active ? node : 0) * d, qs, d, lane,
                                                               active);
            if (lane == 0 && j < Lp) { sd[j] = active ? dist : KK_INF; si[j] = active ? node : KK_INT_MAX; }
        }
        __syncthreads();
        block_bitonic_sort<NT>(sd, si, Lp, tid);
        for (int i = tid; i < k; i += NT) {
            const bool ok = sd[i] < KK_INF;
            out_d[(long long)q * k + i] = ok ? sd[i] : KK_INF;
            out_i[(long long)q * k + i] = ok ? (long long)si[i] : -1LL;
        }
        __syncthreads();
    }
}

// The warp's smallest (distance, index) key: every lane ends with it (xor shuffles; ties by index).
__device__ __forceinline__ void warp_min_key(float& vd, int& vj) {
    using namespace kk;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float od = __shfl_xor_sync(0xffffffffu, vd, off);
        const int oj = __shfl_xor_sync(0xffffffffu, vj, off);
        if (key_less(od, oj, vd, vj)) { vd = od; vj = oj; }
    }
}

// Entry-point selection from a (nq, c) matrix of dots Q C^T (cuBLAS) in global memory, one warp per
// query (seed_select's have_dots mode staged two queries' rows in shared memory per 256-thread
// block, and 2 of its 8 warps selected: 250 us for 10k queries x 4096 centroids on an H200).  Each
// lane keeps the SEED_KEEP smallest (distance, centroid) keys of its slots j = lane mod 32, sorted
// in registers; a round takes the warp's smallest head (shuffles), the winning lane shifts its list
// and, once the list is spent while its slots may hold more, rescans them for the smallest keys
// above the last one it gave (keys are distinct: their centroid ids).  Those are exactly the
// remaining keys seed_select's rescans find, so the seeds are the same, in the same order
// (distance |c|^2 - 2 dot or -dot, ties by smaller index, NaN never chosen).  Reads only.
#define SEED_KEEP 4
__device__ __forceinline__ void seed_keep_insert(float v, int j, float (&kd)[SEED_KEEP], int (&kj)[SEED_KEEP]) {
    using namespace kk;
    if (!key_less(v, j, kd[SEED_KEEP - 1], kj[SEED_KEEP - 1])) return;
    kd[SEED_KEEP - 1] = v;
    kj[SEED_KEEP - 1] = j;
#pragma unroll
    for (int i = SEED_KEEP - 1; i > 0; --i) {
        if (key_less(kd[i], kj[i], kd[i - 1], kj[i - 1])) {
            const float td = kd[i]; kd[i] = kd[i - 1]; kd[i - 1] = td;
            const int tj = kj[i]; kj[i] = kj[i - 1]; kj[i - 1] = tj;
        }
    }
}

// the lane's SEED_KEEP smallest keys above (lo_d, lo_j) among its slots; true if all were taken
// from more slots than fit (the lane may hold more)
__device__ __forceinline__ bool seed_scan(const float* __restrict__ row, const float* __restrict__ cn, int c,
                                          int metric_ip, int lane, float lo_d, int lo_j, float (&kd)[SEED_KEEP],
                                          int (&kj)[SEED_KEEP]) {
    using namespace kk;
#pragma unroll
    for (int i = 0; i < SEED_KEEP; ++i) { kd[i] = KK_INF; kj[i] = KK_INT_MAX; }
    int found = 0;
#pragma unroll 4
    for (int j = lane; j < c; j += 32) {
        const float dot = __ldg(row + j);
        const float v = metric_ip ? -dot : __ldg(cn + j) - 2.f * dot;
        if (v == v && key_less(lo_d, lo_j, v, j)) {
            ++found;
            seed_keep_insert(v, j, kd, kj);
        }
    }
    return found > SEED_KEEP;
}

template <int NT>
__global__ void __launch_bounds__(NT) seed_select_rows(const float* __restrict__ dots, const float* __restrict__ cn,
                                                       const int* __restrict__ medoids, int nq, int c, int metric_ip,
                                                       int s, int* __restrict__ out) {
    using namespace kk;
    const int lane = threadIdx.x & 31;
    const int q = blockIdx.x * (NT / 32) + (threadIdx.x >> 5);
    if (q >= nq) return;  // (whole warps)
    const float* row = dots + (long long)q * c;
    float kd[SEED_KEEP];
    int kj[SEED_KEEP];
    bool more = seed_scan(row, cn, c, metric_ip, lane, -KK_INF, -1, kd, kj);
    int* o = out + (long long)q * s;
    for (int t = 0; t < s; ++t) {
        float vd = kd[0];
        int vj = kj[0];
        warp_min_key(vd, vj);
        if (lane == 0) o[t] = vj != KK_INT_MAX ? medoids[vj] : -1;
        if (vj != KK_INT_MAX && (vj & 31) == lane) {  // the winner gives its head
#pragma unroll
            for (int i = 0; i < SEED_KEEP - 1; ++i) { kd[i] = kd[i + 1]; kj[i] = kj[i + 1]; }
            kd[SEED_KEEP - 1] = KK_INF;
            kj[SEED_KEEP - 1] = KK_INT_MAX;
            if (kj[0] == KK_INT_MAX && more) more = seed_scan(row, cn, c, metric_ip, lane, vd, vj, kd, kj);
        }
    }
}

// Entry-point selection: for each query, the medoids of its `s` nearest of `c` centroids (nearest
// first; -1 past c).  Replaces a CuPy chain (GEMM, norms, s rounds of argmin, gathers: ~25
// launches) that dominated small-batch latency.  A block of NT threads serves QB queries:
//  * have_dots == 0 (small batches): the block computes the distances itself, one centroid per
//    thread against the QB queries held in shared memory, so every centroid row read from L2
//    serves QB queries;
//  * have_dots != 0 (large batches): the (nq, c) matrix Q C^T comes from cuBLAS and is only read.
// Then warp w selects for query w: each lane keeps the minimum of its own slots (j = lane mod 32);
// s rounds of a warp argmin, after which only the winning lane rescans its slots.  Ties: smaller
// centroid index first.  metric_ip: distance -dot, else |c|^2 - 2 dot (|q|^2 does not rank).
// Shared memory: dist[QB][c] float | qs[QB][dpad] float (direct mode only).
template <int NT, int QB>
__global__ void __launch_bounds__(NT) seed_select(const float* __restrict__ Q, const float* __restrict__ C,
                                                  const float* __restrict__ cn, const float* __restrict__ dots,
                                                  int have_dots, const int* __restrict__ medoids, int nq, int c,
                                                  int d, int metric_ip, int s, int* __restrict__ out) {
    using namespace kk;
    extern __shared__ float4 smem_raw[];
    const int dpad = (d + 3) & ~3;
    float* dist = reinterpret_cast<float*>(smem_raw);
    float* qs = dist + QB * c;
    const int tid = threadIdx.x;
    const int q0 = blockIdx.x * QB;
    const int nqb = min(QB, nq - q0);
    if (!have_dots) {
        for (int i = tid; i < QB * dpad; i += NT) {
            const int qi = i / dpad, e = i % dpad;
            qs[i] = (qi < nqb && e < d) ? Q[(long long)(q0 + qi) * d + e] : 0.f;
        }
        __syncthreads();
        for (int j = tid; j < c; j += NT) {
            float acc[QB];
#pragma unroll
            for (int qi = 0; qi < QB; ++qi) acc[qi] = 0.f;
            const float* row = C + (long long)j * d;
            if ((d & 3) == 0) {
                for (int e = 0; e < d; e += 4) {
                    const float4 x = __ldg(reinterpret_cast<const float4*>(row + e));
#pragma unroll
                    for (int qi = 0; qi < QB; ++qi) {
                        const float4 v = *reinterpret_cast<const float4*>(qs + qi * dpad + e);
                        acc[qi] = fmaf(v.x, x.x, fmaf(v.y, x.y, fmaf(v.z, x.z, fmaf(v.w, x.w, acc[qi]))));
                    }
                }
            } else {
                for (int e = 0; e < d; ++e) {
                    const float x = __ldg(row + e);
#pragma unroll
                    for (int qi = 0; qi < QB; ++qi) acc[qi] = fmaf(qs[qi * dpad + e], x, acc[qi]);
                }
            }
            const float cj = metric_ip ? 0.f : cn[j];
#pragma unroll
            for (int qi = 0; qi < QB; ++qi)
                if (qi < nqb) dist[qi * c + j] = metric_ip ? -acc[qi] : cj - 2.f * acc[qi];
        }
    } else {
        for (int i = tid; i < nqb * c; i += NT) {
            const int qi = i / c, j = i - qi * c;
            const float dot = dots[(long long)(q0 + qi) * c + j];
            dist[i] = metric_ip ? -dot : cn[j] - 2.f * dot;
        }
    }
    __syncthreads();
    const int warp = tid >> 5, lane = tid & 31;
    for (int qi = warp; qi < nqb; qi += NT / 32) {
        float* row = dist + qi * c;
        float bd = KK_INF;
        int bj = KK_INT_MAX;
        // NaN marks a slot already taken (and any NaN distance: never selected)
        for (int j = lane; j < c; j += 32) {
            const float v = row[j];
            if (v == v && key_less(v, j, bd, bj)) { bd = v; bj = j; }
        }
        int* o = out + (long long)(q0 + qi) * s;
        for (int t = 0; t < s; ++t) {
            float vd = bd;
            int vj = bj;
            warp_min_key(vd, vj);
            if (lane == 0) o[t] = vj != KK_INT_MAX ? medoids[vj] : -1;
            if (vj != KK_INT_MAX && (vj & 31) == lane) {
                row[vj] = __int_as_float(0x7fffffff);
                bd = KK_INF;
                bj = KK_INT_MAX;
                for (int j = lane; j < c; j += 32) {
                    const float v = row[j];
                    if (v == v && key_less(v, j, bd, bj)) { bd = v; bj = j; }
                }
            }
        }
    }
}
