// BANG host-placement search kernels: Karthik et al., "BANG: Billion-Scale ANN Search using a
// Single GPU", section 4 -- 4.4 (Bloom filter of visited nodes, one per query), 4.5 (neighbour
// distances from the per-query PQ distance tables of 4.2, a group of GS lanes per neighbour with a
// sub-warp reduction), 4.6 (prefetch: the next candidates are chosen right after the distances,
// before the work list is merged, so the host gathers their neighbours while the merge runs),
// 4.7-4.8 (sorting the new neighbours and merging them with the work list by binary searches).
// Search width W (CAGRA's "search width", not in BANG): each iteration expands the W best
// unexpanded entries of a query at once, so a walk needs ~1/W as many host round trips.
//
// The graph is not here: the host gathers the neighbour rows of each query's W candidates and
// copies them in (``nbrs``, W*R ids per query). One thread block per query in every kernel. Order
// of entries: by distance, then by node id (a total order, as in the CPU twin _search_cpu.py, so
// both keep the same lists; ids in a list are distinct because a node passes the Bloom filter once).
// Work list layout per query: ids[L], dist[L], flag[L] (1 = expanded); empty slots hold id -1 and
// distance +inf and sort last.

#include <cuda_fp16.h>

#define BANG_INF __int_as_float(0x7f800000)
#define BANG_MAX_W 64  // largest search width (shared scratch of the selection); the host checks

namespace bang {

// Same blocked Bloom filter as index/search.cu (and _search_cpu._bloom_slot): the three bits of a
// node lie in one 32-bit word. Read and written apart: a step's neighbours are all tested against
// the filter as it was before the step, then the fresh ones are marked, so whether a node counts as
// visited no longer depends on which of the step's concurrent inserts came first (a node whose
// three bits only OTHER nodes of the same step set was a false positive or not, run to run). The
// CPU twin (_search_cpu._bloom_step) does the same.
__device__ __forceinline__ void bloom_hash(int node, unsigned wmask, unsigned& word, unsigned& bits) {
    unsigned h = (unsigned)node;
    h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
    bits = (1u << ((h >> 17) & 31u)) | (1u << ((h >> 22) & 31u)) | (1u << (h >> 27));
    word = h & wmask;
}

__device__ __forceinline__ bool bloom_contains(const unsigned* __restrict__ words, unsigned wmask, int node) {
    unsigned w, bits;
    bloom_hash(node, wmask, w, bits);
    return (words[w] & bits) == bits;
}

__device__ __forceinline__ void bloom_set(unsigned* __restrict__ words, unsigned wmask, int node) {
    unsigned w, bits;
    bloom_hash(node, wmask, w, bits);
    atomicOr(words + w, bits);
}

// Exact de-duplication of a step's ids (two candidates may share a neighbour): an open-addressing
// set in shared memory (slots: a power of two >= 2x the ids, -1 = empty). True for exactly one
// caller per id (which one does not matter: same id, same distance).
__device__ __forceinline__ bool hash_claim(int* slots, unsigned mask, int node) {
    unsigned h = (unsigned)node * 0x9E3779B1u;
    h ^= h >> 15;
    for (unsigned i = h & mask;; i = (i + 1) & mask) {
        const int prev = atomicCAS(slots + i, -1, node);
        if (prev == -1) return true;
        if (prev == node) return false;
    }
}

__device__ __forceinline__ bool key_less(float da, int ia, float db, int ib) {
    return da < db || (da == db && (unsigned)ia < (unsigned)ib);  // id -1 -> largest
}

// Positions of the first (at most) W unexpanded entries of a work list, in list order, into
// s_pos[0..*s_npos). Warp 0 scans 32 entries per step with a ballot and stops once it has W, so
// an early hit costs one step. Called by the whole block (ends with a barrier).
__device__ void first_unexpanded(const int* ids, const unsigned char* x, int L, int W,
                                 int* s_pos, int* s_npos) {
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        int found = 0;
        for (int c = 0; c < L && found < W; c += 32) {  // `found` is warp-uniform: same ballots
            const int i = c + lane;
            const bool open = i < L && ids[i] >= 0 && !x[i];
            const unsigned mask = __ballot_sync(0xffffffffu, open);
            const int r = found + __popc(mask & ((1u << lane) - 1u));
            if (open && r < W) s_pos[r] = i;
            found = min(W, found + __popc(mask));
        }
        if (lane == 0) *s_npos = found;
    }
    __syncthreads();
}

// Log the chosen node of query q as its next expansion (thread-serial; `ne` = n_exp so far).
__device__ __forceinline__ void log_expansion(int q, int ne, int node, float d, int* __restrict__ log_ids,
                                              float* __restrict__ log_d, int max_iters) {
    log_ids[(size_t)q * max_iters + ne] = node;
    log_d[(size_t)q * max_iters + ne] = d;
}

// Entry i of a distance table: float32, or (bf16) its bfloat16 bits, rounded to nearest with ties
// to even -- the bit operation of _pq.round_bf16, so CPU and GPU tables hold equal values.
__device__ __forceinline__ void store_entry(void* __restrict__ T, size_t i, float t, int bf16) {
    if (bf16) {
        const unsigned u = __float_as_uint(t);
        static_cast<unsigned short*>(T)[i] = (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    } else {
        static_cast<float*>(T)[i] = t;
    }
}

// One entry of a direct PQ table (4.2): the squared distance between query subvector qv and
// centroid cv (dsub floats each) in dimension order, every step rounded (no fused multiply-add),
// or (ip) minus their inner product -- _pq._tables_cpu's order, so CPU and GPU tables agree bit
// for bit. Shared by bang_tables_direct and bang_walk's in-block table.
__device__ __forceinline__ float table_entry(const float* __restrict__ qv, const float* __restrict__ cv, int dsub,
                                             int ip) {
    float t = 0.f;
    if (ip) {
        for (int u = 0; u < dsub; ++u) t = __fadd_rn(t, __fmul_rn(qv[u], cv[u]));
        return -t;
    }
    for (int u = 0; u < dsub; ++u) {
        const float e = __fsub_rn(qv[u], cv[u]);
        t = __fadd_rn(t, __fmul_rn(e, e));
    }
    return t;
}

// A node's PQ distance (4.5): its code row scored against the query's table (float32 entries, or
// bfloat16 ones in the upper 16 bits), the m subspaces strided over the GS lanes of its group, then
// a shuffle tree inside the group. Every lane of the group calls it, active or not (the shuffles
// need them all); lane 0 holds the sum. Shared by bang_distances and bang_walk: the same order of
// additions, so the same bits.
__device__ __forceinline__ float pq_score(const unsigned char* row, bool active, const float* Tf,
                                          const unsigned short* Th, int m, int ksub, int bf16, int lane, int GS) {
    float acc = 0.f;
    if (active) {
        if (bf16) {
            for (int t = lane; t < m; t += GS) acc += __uint_as_float((unsigned)Th[t * ksub + row[t]] << 16);
        } else {
            for (int t = lane; t < m; t += GS) acc += Tf[t * ksub + row[t]];
        }
    }
    for (int o = GS / 2; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o, GS);
    return acc;
}

// Entries of a sorted list (d, ids; n of them) that come before the key (kd, ki): the slot the
// key takes in it (binary search; 4.7-4.8's merge places every entry by this count).
__device__ __forceinline__ int count_before(const float* d, const int* ids, int n, float kd, int ki) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (key_less(d[mid], ids[mid], kd, ki)) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// Merge `cnt` new entries (rd, ri; flags nx, or none: all unexpanded) into a sorted work list of L
// slots (wl_d, wl_ids, wl_x) -- sections 4.7-4.8: the new entries are rank-sorted into (sd, si,
// sx), then each list entry goes to slot i + (new entries before it) and each new entry to slot
// j + (list entries before it), both by binary search, through (od, oi, ox), and back into the
// list; what lands past L drops out. One block; called with the block synchronised (rd, ri
// written), returns synchronised. Shared by bang_merge (list in global memory) and bang_walk (in
// shared memory): the same placements, hence the same lists.
__device__ __forceinline__ void merge_into_list(float* wl_d, int* wl_ids, unsigned char* wl_x, int L,
                                                const float* rd, const int* ri, const unsigned char* nx, int cnt,
                                                float* sd, int* si, unsigned char* sx, float* od, int* oi,
                                                unsigned char* ox) {
    for (int t = threadIdx.x; t < cnt; t += blockDim.x) {
        const float d = rd[t];
        const int id = ri[t];
        int r = 0;
        for (int u = 0; u < cnt; ++u) r += key_less(rd[u], ri[u], d, id) ? 1 : 0;
        sd[r] = d; si[r] = id;
        if (nx) sx[r] = nx[t];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < L; i += blockDim.x) {  // list entries: slot i + #new smaller
        const float d = wl_d[i];
        const int id = wl_ids[i];
        const int pos = i + count_before(sd, si, cnt, d, id);
        if (pos < L) { od[pos] = d; oi[pos] = id; ox[pos] = wl_x[i]; }
    }
    for (int j = threadIdx.x; j < cnt; j += blockDim.x) {  // new entries: slot j + #list smaller
        const float d = sd[j];
        const int id = si[j];
        const int pos = j + count_before(wl_d, wl_ids, L, d, id);
        if (pos < L) { od[pos] = d; oi[pos] = id; ox[pos] = nx ? sx[j] : (unsigned char)0; }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < L; i += blockDim.x) { wl_d[i] = od[i]; wl_ids[i] = oi[i]; wl_x[i] = ox[i]; }
    __syncthreads();
}

// A query's whole table into shared memory T (m x ksub entries, float32 or bfloat16 bits) by the
// block, from its padded subvectors qs (m x dsub) and the codebook C (m x ksub x dsub: entry i's
// centroid is C + i dsub). Entry values are table_entry's (the same bits as bang_tables_direct).
// Why the DS template: one entry at a time left each thread with ~96 dependent L2 loads in series
// (m = 48, ksub = 256, 128 threads), ~15 us per block; with dsub known, U entries' centroids are
// loaded before any is used, so U loads are in flight per thread.
template <int DS>
__device__ __forceinline__ void build_table_fixed(void* __restrict__ T, const float* __restrict__ qs,
                                                  const float* __restrict__ C, int m, int ksub, int ip, int bf16) {
    constexpr int U = 8;
    const int total = m * ksub;
    for (int base = threadIdx.x; base < total; base += U * blockDim.x) {
        float cv[U][DS];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = base + u * blockDim.x;
            if (i < total) {
#pragma unroll
                for (int t = 0; t < DS; ++t) cv[u][t] = __ldg(C + (size_t)i * DS + t);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = base + u * blockDim.x;
            if (i < total) store_entry(T, i, table_entry(qs + (i / ksub) * DS, cv[u], DS, ip), bf16);
        }
    }
}

__device__ void build_table(void* __restrict__ T, const float* __restrict__ qs, const float* __restrict__ C, int m,
                            int ksub, int dsub, int ip, int bf16) {
    switch (dsub) {
        case 1: build_table_fixed<1>(T, qs, C, m, ksub, ip, bf16); return;
        case 2: build_table_fixed<2>(T, qs, C, m, ksub, ip, bf16); return;
        case 3: build_table_fixed<3>(T, qs, C, m, ksub, ip, bf16); return;
        case 4: build_table_fixed<4>(T, qs, C, m, ksub, ip, bf16); return;
        case 8: build_table_fixed<8>(T, qs, C, m, ksub, ip, bf16); return;
        default:
            for (int i = threadIdx.x; i < m * ksub; i += blockDim.x)
                store_entry(T, i, table_entry(qs + (i / ksub) * dsub, C + (size_t)i * dsub, dsub, ip), bf16);
    }
}

}  // namespace bang

// PQ distances of each query's fresh neighbours (section 4.5). nbrs: (nq, width) ids (-1 = none;
// width = W*R, or the seed count on the first call); tables: (nq, m, ksub) float, or with bf16 their
// bfloat16 bits (uint16; the upper half of a float32, so widening is a shift); copied to shared
// memory when use_smem (4.2), with 16-byte loads when vec_load (0: the 4-byte loop of v1/v2, kept
// for the legacy path of the per-call profile). Neighbours that pass the Bloom filter and beat the work list's worst
// entry are appended to new_ids/new_d/new_x (nq, new_cap >= width; flag 0) and counted in n_new.
// With `select` (prefetch, 4.6) the next W candidates are chosen here already: the W smallest
// unexpanded entries of (work list + new entries) whose rank in that union is < L -- exactly the
// first W unexpanded entries of the list the merge will produce (an entry of rank >= L is dropped
// by the merge, and every larger entry has a larger rank). Chosen work-list entries get flag 1 in
// wl_x, chosen new entries flag 1 in new_x (the merge keeps it); cand (nq, W) gets their ids in
// key order, -1 padded. GS: lanes per neighbour, a power of two <= 32 dividing blockDim.x.
extern "C" __global__ void bang_distances(
    const int* __restrict__ nbrs, int width, const unsigned char* __restrict__ codes, int m,
    const void* __restrict__ tables, int ksub, int bf16, int use_smem, int vec_load, unsigned* __restrict__ bloom,
    int bloom_words, int hash_slots,
    const int* __restrict__ wl_ids, const float* __restrict__ wl_d, unsigned char* __restrict__ wl_x, int L,
    int* __restrict__ new_ids, float* __restrict__ new_d, unsigned char* __restrict__ new_x, int* __restrict__ n_new,
    int new_cap, int select, int W, int* __restrict__ cand, int* __restrict__ log_ids, float* __restrict__ log_d,
    int* __restrict__ n_exp, int max_iters, int GS, int nq) {
    extern __shared__ __align__(16) float s_table[];
    __shared__ int s_cnt, s_nold;
    __shared__ int s_opos[BANG_MAX_W];   // positions of the first W unexpanded work-list entries
    __shared__ int s_oless[BANG_MAX_W];  // per such entry: new entries smaller than it
    __shared__ int s_nidx[BANG_MAX_W];   // index (in new_*) of the new entry of rank r < W
    __shared__ int s_nless[BANG_MAX_W];  // per such entry: work-list entries smaller than it
    const int q = blockIdx.x;
    if (q >= nq) return;
    const int* my_nbrs = nbrs + (size_t)q * width;
    // a query whose candidates are all gone (finished) sends no rows: skip its table load, which
    // would otherwise cost m*ksub*4 bytes per finished query per iteration until the batch ends
    int has = 0;
    for (int j = threadIdx.x; j < width && !has; j += blockDim.x) has = my_nbrs[j] >= 0;
    has = __syncthreads_or(has);
    if (threadIdx.x == 0) s_cnt = 0;
    const size_t wb = (size_t)q * L;
    int* my_new_ids = new_ids + (size_t)q * new_cap;
    float* my_new_d = new_d + (size_t)q * new_cap;
    unsigned char* my_new_x = new_x + (size_t)q * new_cap;
    if (has) {
        // bf16: entries are the upper 16 bits of float32 values (bfloat16), half the bytes per load
        const int esz = bf16 ? 2 : 4;
        const unsigned char* T = static_cast<const unsigned char*>(tables) + (size_t)q * m * ksub * esz;
        // dynamic shared memory: [table (use_smem)] [hash_slots ints] [width fresh flags]
        int* s_hash = reinterpret_cast<int*>(reinterpret_cast<unsigned char*>(s_table) +
                                             (use_smem ? (size_t)m * ksub * esz : 0));
        unsigned char* s_fresh = reinterpret_cast<unsigned char*>(s_hash + hash_slots);
        unsigned* words = bloom + (size_t)q * bloom_words;
        const unsigned wmask = (unsigned)(bloom_words - 1);
        for (int i = threadIdx.x; i < hash_slots; i += blockDim.x) s_hash[i] = -1;
        __syncthreads();
        // 4.4, order-independent: fresh = not in the filter as it was before this step, once per id
        for (int j = threadIdx.x; j < width; j += blockDim.x) {
            const int node = my_nbrs[j];
            s_fresh[j] = (node >= 0 && !bang::bloom_contains(words, wmask, node) &&
                          bang::hash_claim(s_hash, (unsigned)(hash_slots - 1), node)) ? 1 : 0;
        }
        // (the table fill's barrier below also ends the tests before any bit is set)
        if (use_smem) {
            const int nbytes = m * ksub * esz;
            if (vec_load && (nbytes & 15) == 0 && (reinterpret_cast<size_t>(T) & 15) == 0) {
                // 16-byte loads, four in flight per thread: the table (48 KB at m = 48 in float32,
                // 24 KB in bfloat16) is reloaded by every live query every iteration, and 4-byte
                // loads at 4 blocks per SM left the fill latency-bound (same bytes, results unchanged)
                const float4* T4 = reinterpret_cast<const float4*>(T);
                float4* S4 = reinterpret_cast<float4*>(s_table);
                const int n4 = nbytes >> 4, bs = blockDim.x;
                int i = threadIdx.x;
                for (; i + 3 * bs < n4; i += 4 * bs) {  // four loads issued before the first store
                    const float4 a = __ldg(T4 + i), b = __ldg(T4 + i + bs), c = __ldg(T4 + i + 2 * bs),
                                 e = __ldg(T4 + i + 3 * bs);
                    S4[i] = a; S4[i + bs] = b; S4[i + 2 * bs] = c; S4[i + 3 * bs] = e;
                }
                for (; i < n4; i += bs) S4[i] = __ldg(T4 + i);
            } else if (bf16) {
                const unsigned short* Tg = reinterpret_cast<const unsigned short*>(T);
                unsigned short* Ts = reinterpret_cast<unsigned short*>(s_table);
                for (int i = threadIdx.x; i < m * ksub; i += blockDim.x) Ts[i] = Tg[i];
            } else {
                const float* Tg = reinterpret_cast<const float*>(T);
                for (int i = threadIdx.x; i < m * ksub; i += blockDim.x) s_table[i] = Tg[i];
            }
            T = reinterpret_cast<const unsigned char*>(s_table);
        }
        __syncthreads();
        const float* Tf = reinterpret_cast<const float*>(T);
        const unsigned short* Th = reinterpret_cast<const unsigned short*>(T);
        const float worst_d = wl_ids[wb + L - 1] >= 0 ? wl_d[wb + L - 1] : BANG_INF;
        const int worst_i = wl_ids[wb + L - 1];
        const int lane = threadIdx.x % GS;
        const int groups = blockDim.x / GS;
        for (int base = 0; base < width; base += groups) {  // uniform trip count across the block
            const int j = base + threadIdx.x / GS;
            const int node = j < width ? my_nbrs[j] : -1;
            int fresh = 0;
            if (lane == 0 && j < width && s_fresh[j]) {
                bang::bloom_set(words, wmask, node);
                fresh = 1;
            }
            fresh = __shfl_sync(0xffffffffu, fresh, 0, GS);
            const float acc = bang::pq_score(fresh ? codes + (size_t)node * m : nullptr, fresh, Tf, Th, m, ksub,
                                             bf16, lane, GS);
            if (lane == 0 && fresh && bang::key_less(acc, node, worst_d, worst_i)) {
                const int p = atomicAdd(&s_cnt, 1);
                my_new_ids[p] = node;
                my_new_d[p] = acc;
                my_new_x[p] = 0;
            }
        }
    }
    __syncthreads();
    const int cnt = s_cnt;
    if (threadIdx.x == 0) n_new[q] = cnt;
    if (!select) return;
    // --- 4.6 prefetch of the next W candidates (see the comment above the kernel)
    bang::first_unexpanded(wl_ids + wb, wl_x + wb, L, W, s_opos, &s_nold);
    const int nold = s_nold;
    for (int i = threadIdx.x; i < W; i += blockDim.x) { s_oless[i] = 0; s_nidx[i] = -1; }
    __syncthreads();
    // the W smallest new entries by rank counting (cnt <= W*R; a count stops once it reaches W),
    // each with the number of work-list entries below it (binary search: the list is sorted)
    for (int t = threadIdx.x; t < cnt; t += blockDim.x) {
        const float d = my_new_d[t];
        const int id = my_new_ids[t];
        int r = 0;
        for (int u = 0; u < cnt && r < W; ++u) r += bang::key_less(my_new_d[u], my_new_ids[u], d, id) ? 1 : 0;
        if (r < W) {
            const int below = bang::count_before(wl_d + wb, wl_ids + wb, L, d, id);
            s_nidx[r] = t;
            s_nless[r] = below;
        }
        // new entries below each of the first W unexpanded work-list entries (rank in the union)
        for (int o = 0; o < nold; ++o) {
            const int p = s_opos[o];
            if (bang::key_less(d, id, wl_d[wb + p], wl_ids[wb + p])) atomicAdd(&s_oless[o], 1);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // two sorted short lists: take the W smallest whose union rank < L
        const int nnew = min(cnt, W);
        int ne = n_exp[q];
        int io = 0, in = 0, c = 0;
        while (c < W && ne < max_iters && (io < nold || in < nnew)) {
            bool take_old;
            if (io >= nold) take_old = false;
            else if (in >= nnew) take_old = true;
            else {
                const int p = s_opos[io], t = s_nidx[in];
                take_old = bang::key_less(wl_d[wb + p], wl_ids[wb + p], my_new_d[t], my_new_ids[t]);
            }
            int node;
            float d;
            if (take_old) {
                const int p = s_opos[io];
                if (p + s_oless[io] >= L) break;  // the merge drops it, and everything after it
                node = wl_ids[wb + p]; d = wl_d[wb + p];
                wl_x[wb + p] = 1;
                ++io;
            } else {
                const int t = s_nidx[in];
                if (in + s_nless[in] >= L) break;
                node = my_new_ids[t]; d = my_new_d[t];
                my_new_x[t] = 1;
                ++in;
            }
            bang::log_expansion(q, ne, node, d, log_ids, log_d, max_iters);
            cand[(size_t)q * W + c] = node;
            ++ne; ++c;
        }
        n_exp[q] = ne;
        for (; c < W; ++c) cand[(size_t)q * W + c] = -1;
    }
}

// Merge each query's new entries into its work list (sections 4.7-4.8): the new entries are
// rank-sorted in shared memory (one thread per entry counts the smaller ones), then every element of
// both lists finds its output slot by a binary search in the other list; the first L slots are kept.
// new_x flags the new entries the prefetch already expanded. With `select` (no prefetch) the next
// W candidates are chosen afterwards from the merged list: its first W unexpanded entries.
// Shared memory: new_cap * 17 + L * 9 bytes.
extern "C" __global__ void bang_merge(int* __restrict__ wl_ids, float* __restrict__ wl_d,
                                      unsigned char* __restrict__ wl_x, int L, const int* __restrict__ new_ids,
                                      const float* __restrict__ new_d, const unsigned char* __restrict__ new_x,
                                      const int* __restrict__ n_new, int new_cap, int select, int W,
                                      int* __restrict__ cand, int* __restrict__ log_ids, float* __restrict__ log_d,
                                      int* __restrict__ n_exp, int max_iters, int nq) {
    extern __shared__ float smem[];
    __shared__ int s_pos[BANG_MAX_W];
    __shared__ int s_npos;
    const int q = blockIdx.x;
    if (q >= nq) return;
    const int cnt = n_new[q];
    const size_t wb = (size_t)q * L;
    if (cnt > 0) {
        float* rd = smem;                              // new distances as computed [new_cap]
        int* ri = (int*)(rd + new_cap);                // new ids as computed [new_cap]
        float* sd = (float*)(ri + new_cap);            // sorted new distances [new_cap]
        int* si = (int*)(sd + new_cap);                // sorted new ids [new_cap]
        float* od = (float*)(si + new_cap);            // merged distances [L]
        int* oi = (int*)(od + L);                      // merged ids [L]
        unsigned char* sx = (unsigned char*)(oi + L);  // sorted new flags [new_cap]
        unsigned char* ox = sx + new_cap;              // merged flags [L]
        const size_t nb = (size_t)q * new_cap;
        for (int t = threadIdx.x; t < cnt; t += blockDim.x) { rd[t] = new_d[nb + t]; ri[t] = new_ids[nb + t]; }
        __syncthreads();
        bang::merge_into_list(wl_d + wb, wl_ids + wb, wl_x + wb, L, rd, ri, new_x + nb, cnt, sd, si, sx, od, oi, ox);
    }
    if (!select) return;
    // next candidates without prefetch, fused here (one launch less per iteration)
    bang::first_unexpanded(wl_ids + wb, wl_x + wb, L, W, s_pos, &s_npos);
    if (threadIdx.x == 0) {
        int ne = n_exp[q];
        int c = 0;
        for (; c < s_npos && ne < max_iters; ++c, ++ne) {
            const int p = s_pos[c];
            wl_x[wb + p] = 1;
            bang::log_expansion(q, ne, wl_ids[wb + p], wl_d[wb + p], log_ids, log_d, max_iters);
            cand[(size_t)q * W + c] = wl_ids[wb + p];
        }
        n_exp[q] = ne;
        for (; c < W; ++c) cand[(size_t)q * W + c] = -1;
    }
}

// Per-query PQ distance tables (section 4.2) from the batched GEMM's dot products, one pass:
// dots (m, nq, ksub) = Q_j . C_j^T as cuBLAS returned it, qn (m, nq) = |Q_j|^2, cn (m, ksub) =
// |C_j|^2; T (nq, m, ksub) = max((qn - 2 dot) + cn, 0) for l2 (each step rounded as the CuPy
// expression of _pq.pq_tables rounds it, so T is bit-identical to it), -dot for ip; with bf16 each
// entry is stored as its bfloat16 bits (uint16), rounded as _pq.round_bf16 rounds. Replaces five
// elementwise passes and a transposing copy of the whole (m, nq, ksub) array.
extern "C" __global__ void bang_tables(const float* __restrict__ dots, const float* __restrict__ qn,
                                       const float* __restrict__ cn, void* __restrict__ T, int nq, int m,
                                       int ksub, int ip, int bf16) {
    const size_t total = (size_t)nq * m * ksub;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % ksub);
        const size_t qj = i / ksub;
        const int j = (int)(qj % m);
        const int q = (int)(qj / m);
        const float dot = dots[((size_t)j * nq + q) * ksub + c];
        float t;
        if (ip) {
            t = -dot;
        } else {
            t = __fadd_rn(__fsub_rn(qn[(size_t)j * nq + q], __fmul_rn(2.0f, dot)), cn[(size_t)j * ksub + c]);
            t = (t >= 0.f || isnan(t)) ? t : 0.f;  // cupy.maximum(T, 0.0)
        }
        bang::store_entry(T, i, t, bf16);
    }
}

// Per-query PQ distance tables (section 4.2) computed directly, one pass that only writes the table:
// T[q, j, c] = sum over s < dsub of (Qs[q, j, s] - C[j, c, s])^2 (ip: minus the sum of the
// products), in dimension order with every step rounded (no fused multiply-add), exactly as
// _pq._tables_cpu adds them, so CPU and GPU tables are equal bit for bit. Qs (nq, m, dsub): the
// padded (and OPQ-rotated) queries; C (m, ksub, dsub): the codebook (98 KB at m = 48, cached).
// bf16: T holds each entry's bfloat16 bits (rounded as _pq.round_bf16). Replaces the batched GEMM
// (float32 dot products of every entry written, then read again by bang_tables).
extern "C" __global__ void bang_tables_direct(const float* __restrict__ Qs, const float* __restrict__ C,
                                              void* __restrict__ T, int nq, int m, int ksub, int dsub, int ip,
                                              int bf16) {
    const size_t total = (size_t)nq * m * ksub;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % ksub);
        const size_t qj = i / ksub;  // q * m + j
        const int j = (int)(qj % m);
        bang::store_entry(T, i, bang::table_entry(Qs + qj * dsub, C + ((size_t)j * ksub + c) * dsub, dsub, ip), bf16);
    }
}

// Re-rank rows gathered during the walk (BANG 3.2.3 / 4.9: the candidates' full vectors travel with
// their neighbour rows, so they are on the GPU when the re-rank starts). rows: (nrows, row_bytes)
// as the host gathered them for this iteration's candidates; dst[r]: the slot (query * S + log
// position) row r goes to, -1 = not kept. word: 16, 4 or 1 bytes per copy (row_bytes a multiple).
extern "C" __global__ void bang_stash(const unsigned char* __restrict__ rows, const int* __restrict__ dst, int nrows,
                                      int row_bytes, int word, unsigned char* __restrict__ slots) {
    const int wpr = row_bytes / word;
    const size_t total = (size_t)nrows * wpr;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(i / wpr);
        const int w = (int)(i % wpr);
        const int to = dst[r];
        if (to < 0) continue;
        const size_t src_off = (size_t)r * row_bytes, dst_off = (size_t)to * row_bytes;
        if (word == 16) {
            reinterpret_cast<uint4*>(slots + dst_off)[w] = reinterpret_cast<const uint4*>(rows + src_off)[w];
        } else if (word == 4) {
            reinterpret_cast<unsigned*>(slots + dst_off)[w] = reinterpret_cast<const unsigned*>(rows + src_off)[w];
        } else {
            slots[dst_off + w] = rows[src_off + w];
        }
    }
}

// ---------------------------------------------------------------------------- mapped host step
// Zero-copy host step (not in BANG, whose host threads gather the rows of section 4.3/4.6): the
// graph and the vectors stay in host memory, mapped for the GPU (managed memory kept on the host,
// or page-locked with cudaHostRegister: _search_gpu._map_arrays), and the GPU
// reads each candidate's neighbour row over PCIe itself, so a walk step needs no copy of candidates
// to the host, no host gather and no wait of the host: the host only queues kernels. The rows are
// what gather_walk writes: nbrs (nrows, R) with the graph row of cand[r], -1 rows for -1
// candidates. A warp reads 32 consecutive ids of one row (R = 32: one 128-byte PCIe read).
extern "C" __global__ void bang_gather_graph(const int* __restrict__ cand, long long nrows,
                                             const int* __restrict__ graph, int R, int* __restrict__ nbrs) {
    const long long total = nrows * (long long)R;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / R;
        const int c = cand[r];
        nbrs[i] = c >= 0 ? graph[(long long)c * R + (i - r * R)] : -1;
    }
}

// How many of a batch's nrows candidate slots hold a node (one block): 0 = every query of the batch
// has finished its walk. The mapped host loop reads it every few steps.
extern "C" __global__ void bang_live(const int* __restrict__ cand, int nrows, int* __restrict__ out) {
    __shared__ int s_live;
    if (threadIdx.x == 0) s_live = 0;
    __syncthreads();
    int c = 0;
    for (int i = threadIdx.x; i < nrows; i += blockDim.x) c += cand[i] >= 0;
    for (int o = 16; o > 0; o >>= 1) c += __shfl_down_sync(0xffffffffu, c, o);
    if ((threadIdx.x & 31) == 0 && c) atomicAdd(&s_live, c);
    __syncthreads();
    if (threadIdx.x == 0) out[0] = s_live;
}

// ---------------------------------------------------------------------------- re-rank (4.9)
// A finished batch's re-rank in two kernels, around the exact distances (prepared rows, CuPy's
// einsum: unchanged, so the results keep their bits). Before, ~35 CuPy calls per batch (two Thrust
// argsorts that wait on the host, take_along_axis, masks) cost the host loop 3-6 ms of a 15-20 ms
// call at 3M x 96, L = 16-32, while the other batch's walk waited for its next launch.
// Both selections are a stable argsort of a row: 64-bit keys (orderable float bits << 32 | column;
// distinct, so the order is total and equals a stable sort's), bitonic-sorted in shared memory by
// one block per query; Cp = the row width rounded up to a power of two (the host keeps wider rows
// on the CuPy path).
__device__ __forceinline__ unsigned long long bang_order_key(float v, unsigned col) {
    if (v == 0.0f) v = 0.0f;                     // -0 and +0 are equal to a comparison sort
    if (v != v) v = __int_as_float(0x7fc00000);  // every NaN after +inf, in column order (NumPy's rule)
    unsigned u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | col;
}

// Ascending sort of s[0 .. Cp) (Cp a power of two) by the whole block; ends with a barrier.
__device__ void bang_bitonic(unsigned long long* s, int Cp) {
    __syncthreads();
    for (int k = 2; k <= Cp; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < Cp; i += blockDim.x) {
                const int p = i ^ j;
                if (p > i) {
                    const unsigned long long a = s[i], b = s[p];
                    if ((a > b) == ((i & k) == 0)) {
                        s[i] = b;
                        s[p] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// The re-rank plan and its rows: the rr best of a query's first C log entries by PQ distance
// (ties by log position; positions >= C are empty: id -1, position C), their ids (cand), log
// positions (pos) and full vectors (rows, row_bytes each, zero where there is none). Rows come
// from the stash slots (from_slots: slot q * S + position, missing when the position is >= S, to
// be gathered on the host) or from the device copy of the vectors (row = id). row_bytes = 0: plan
// only. word: 16, 4 or 1 bytes per copy (row_bytes a multiple).
extern "C" __global__ void bang_rerank_rows(const int* __restrict__ log_ids, const float* __restrict__ log_d,
                                            long long ld, int C, int Cp, int rr,
                                            const unsigned char* __restrict__ src, int from_slots, int S,
                                            int row_bytes, int word, int* __restrict__ cand,
                                            long long* __restrict__ pos, unsigned char* __restrict__ rows,
                                            unsigned char* __restrict__ missing, int* __restrict__ n_missing) {
    extern __shared__ unsigned long long s_keys[];
    const long long q = blockIdx.x;
    for (int i = threadIdx.x; i < Cp; i += blockDim.x)
        s_keys[i] = i < C ? bang_order_key(log_d[q * ld + i], (unsigned)i) : ~0ull;  // padding sorts last
    bang_bitonic(s_keys, Cp);
    for (int j = threadIdx.x; j < rr; j += blockDim.x) {
        const int p = j < C ? (int)(s_keys[j] & 0xffffffffull) : C;
        const int id = j < C ? log_ids[q * ld + p] : -1;
        cand[q * rr + j] = id;
        pos[q * rr + j] = p;
        const bool miss = from_slots && id >= 0 && p >= S;
        missing[q * rr + j] = miss;
        if (miss) atomicAdd(n_missing, 1);
    }
    if (row_bytes == 0) return;
    const int wpr = row_bytes / word;
    for (int t = threadIdx.x; t < rr * wpr; t += blockDim.x) {
        const int j = t / wpr, w = t % wpr;
        const int p = j < C ? (int)(s_keys[j] & 0xffffffffull) : C;
        const int id = j < C ? log_ids[q * ld + p] : -1;
        const bool ok = id >= 0 && (!from_slots || p < S);
        const long long from = from_slots ? q * S + p : (long long)id;
        unsigned char* dst = rows + (q * rr + j) * (long long)row_bytes;
        if (word == 16) {
            reinterpret_cast<uint4*>(dst)[w] = ok ? reinterpret_cast<const uint4*>(src + from * row_bytes)[w]
                                                  : make_uint4(0u, 0u, 0u, 0u);
        } else if (word == 4) {
            reinterpret_cast<unsigned*>(dst)[w] = ok ? reinterpret_cast<const unsigned*>(src + from * row_bytes)[w] : 0u;
        } else {
            dst[w] = ok ? src[from * row_bytes + w] : (unsigned char)0;
        }
    }
}

// The k best of a query's c re-ranked candidates by exact distance (ties by column), as
// exact_topk of _search_cpu.py: distance +inf where the candidate is -1, id -1 where the distance
// is not finite, kk = min(k, c) sorted entries, then +inf / -1 up to k.
extern "C" __global__ void bang_rerank_select(const float* __restrict__ dist, const int* __restrict__ cand, int c,
                                              int Cp, int k, float* __restrict__ D, long long* __restrict__ I) {
    extern __shared__ unsigned long long s_keys[];
    const long long q = blockIdx.x;
    for (int i = threadIdx.x; i < Cp; i += blockDim.x)
        s_keys[i] = i < c ? bang_order_key(cand[q * c + i] >= 0 ? dist[q * c + i] : BANG_INF, (unsigned)i) : ~0ull;
    bang_bitonic(s_keys, Cp);
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        float v = BANG_INF;
        long long id = -1;
        if (j < c) {
            const int p = (int)(s_keys[j] & 0xffffffffull);
            const int cd = cand[q * c + p];
            v = cd >= 0 ? dist[q * c + p] : BANG_INF;
            id = isfinite(v) ? (long long)cd : -1;
        }
        D[q * k + j] = v;
        I[q * k + j] = id;
    }
}

// Exact re-rank distances (4.9) read straight from the stored vectors: dist[q, j] = the internal
// distance of prepared query q (Qp, nq x d float32) to candidate cand[q, j]'s vector, whose row is
// read by id from `src` (by_id: the device copy of the vectors, or the mapped host vectors over
// PCIe -- no row buffer in GPU memory) or by position from `src` = a row buffer (q * c + j: the
// stash's slots or rows uploaded from the host). The row is prepared as prepare_vectors prepares
// it: widened from its storage dtype (0 float32, 1 float16, 2 uint8, 3 int8), times `scale` (a
// power of two, through double), and for cosine divided by its norm -- folded into the product,
// -(x . q) / |x| (an empty row keeps norm 1). l2: sum of (x - q)^2; ip / cosine: minus the inner
// product. One warp per candidate; each lane adds its dimensions in order, then a fixed shuffle
// tree: the same bits whichever source the row came from (the GPU re-rank modes agree exactly).
// Candidates -1 get +inf. Dynamic shared memory: the query (d floats).
__device__ __forceinline__ float bang_load_elem(const unsigned char* __restrict__ row, int t, int dtype) {
    switch (dtype) {
        case 1: return __half2float(reinterpret_cast<const __half*>(row)[t]);
        case 2: return (float)row[t];
        case 3: return (float)reinterpret_cast<const signed char*>(row)[t];
        default: return reinterpret_cast<const float*>(row)[t];
    }
}

extern "C" __global__ void bang_rerank_exact(const float* __restrict__ Qp, int d, const int* __restrict__ cand, int c,
                                             const unsigned char* __restrict__ src, int by_id, int dtype,
                                             int row_bytes, double scale, int cosine, int ip,
                                             float* __restrict__ dist, int nq) {
    extern __shared__ float s_q[];
    const long long q = blockIdx.x;
    if (q >= nq) return;
    for (int t = threadIdx.x; t < d; t += blockDim.x) s_q[t] = Qp[q * d + t];
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const bool scaled = scale != 1.0;
    for (int j = warp; j < c; j += nw) {
        const int id = cand[q * c + j];
        if (id < 0) {
            if (lane == 0) dist[q * c + j] = BANG_INF;
            continue;
        }
        const unsigned char* row = src + (by_id ? (long long)id : q * c + j) * (long long)row_bytes;
        float acc = 0.f, ss = 0.f;
#pragma unroll 4
        for (int t = lane; t < d; t += 32) {
            float x = bang_load_elem(row, t, dtype);
            if (scaled) x = (float)((double)x * scale);
            if (ip || cosine) {
                acc = __fmaf_rn(x, s_q[t], acc);
                if (cosine) ss = __fmaf_rn(x, x, ss);
            } else {
                const float e = __fsub_rn(x, s_q[t]);
                acc = __fmaf_rn(e, e, acc);
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, o));
            if (cosine) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
        }
        if (lane == 0) {
            float v = acc;
            if (cosine) {
                const float nrm = sqrtf(ss);
                v = __fdiv_rn(acc, nrm > 0.f ? nrm : 1.f);
            }
            dist[q * c + j] = (ip || cosine) ? -v : v;
        }
    }
}

// ---------------------------------------------------------------------------- fused mapped walk
// The whole walk of a query in one launch (mapped access only; not in BANG, whose host gathers
// each iteration's rows, 4.3 / 4.6). One block per query loops over the steps that
// bang_gather_graph -> bang_distances -> bang_merge take one launch each: it reads its candidates'
// graph rows over PCIe from the mapped host graph, tests them against its Bloom filter (4.4, the
// same order-independent test-then-mark), scores the fresh ones from its PQ table (4.5; loaded into
// shared memory once per query, not once per step), merges them into its work list (4.7-4.8; the
// list stays in shared memory) and chooses its next W candidates (no prefetch: nothing leaves the
// GPU between steps, and the choice equals the merge's). A query that finishes frees its block for
// the next one, where the step-per-launch walk ran every step until the slowest query of the batch
// was done; and no host look at a live count is needed. Same arithmetic in the same order as the
// three kernels, hence the same logs bit for bit (the GPU tests compare).
// A step's fresh neighbours are compacted first and, with `stage`, their code rows loaded into
// shared memory at once (16-byte loads where aligned): each group of GS lanes then scores a node
// from shared memory, where reading its row from global memory inside the scoring loop put one
// memory latency per group of nodes in series (16 of them a step at W R = 128, GS = 16).
// build_table (table in shared memory only): the block makes its query's table itself from Qs
// (nq, m, dsub: the padded, centred, rotated query) and the codebook C (m, ksub, dsub), with
// bang_tables_direct's arithmetic (bang::table_entry), so the walk is the same bit for bit and no
// per-query table (24 KB at m = 48, bfloat16) is written to and read back from global memory.
// Shared memory (host: _search_gpu.walk_shared_bytes, same order): [table if use_smem, 16-aligned]
// [code rows if stage: cap m, 16-aligned] [Bloom words if bloom_smem] [wl_d, wl_ids, od, oi: L
// each] [nbrs, rd, ri, sd, si, fids: cap each] [hash: hslots] [wl_x, ox: L each],
// cap = max(W R, s).
extern "C" __global__ void bang_walk(
    const int* __restrict__ graph, int R, const int* __restrict__ seeds, int s,
    const unsigned char* __restrict__ codes, int m, const void* __restrict__ tables, int ksub, int bf16,
    int use_smem, int stage, unsigned* __restrict__ bloom, int bloom_words, int bloom_smem, int hslots, int L, int W,
    int max_iters, int* __restrict__ log_ids, float* __restrict__ log_d, int* __restrict__ n_exp,
    int* __restrict__ steps, int GS, int nq, const float* __restrict__ Qs, const float* __restrict__ C, int dsub,
    int ip, int build_table) {
    extern __shared__ __align__(16) unsigned char s_mem[];
    __shared__ int s_cnt, s_nc, s_npos, s_nf;
    __shared__ int s_pos[BANG_MAX_W];
    __shared__ int s_cand[BANG_MAX_W];
    const int q = blockIdx.x;
    if (q >= nq) return;
    const int cap = max(W * R, s);
    const int esz = bf16 ? 2 : 4;
    size_t off = 0;
    unsigned char* s_tab = s_mem;
    if (use_smem) off += ((size_t)m * ksub * esz + 15) & ~(size_t)15;
    unsigned char* s_codes = s_mem + off;
    if (stage) off += ((size_t)cap * m + 15) & ~(size_t)15;
    unsigned* words = bloom_smem ? reinterpret_cast<unsigned*>(s_mem + off) : bloom + (size_t)q * bloom_words;
    if (bloom_smem) off += (size_t)bloom_words * 4;
    float* wl_d = reinterpret_cast<float*>(s_mem + off); off += (size_t)L * 4;
    int* wl_ids = reinterpret_cast<int*>(s_mem + off); off += (size_t)L * 4;
    float* od = reinterpret_cast<float*>(s_mem + off); off += (size_t)L * 4;
    int* oi = reinterpret_cast<int*>(s_mem + off); off += (size_t)L * 4;
    int* nbrs = reinterpret_cast<int*>(s_mem + off); off += (size_t)cap * 4;
    float* rd = reinterpret_cast<float*>(s_mem + off); off += (size_t)cap * 4;
    int* ri = reinterpret_cast<int*>(s_mem + off); off += (size_t)cap * 4;
    float* sd = reinterpret_cast<float*>(s_mem + off); off += (size_t)cap * 4;
    int* si = reinterpret_cast<int*>(s_mem + off); off += (size_t)cap * 4;
    int* fids = reinterpret_cast<int*>(s_mem + off); off += (size_t)cap * 4;
    int* hash = reinterpret_cast<int*>(s_mem + off); off += (size_t)hslots * 4;
    unsigned char* wl_x = s_mem + off; off += L;
    unsigned char* ox = s_mem + off;
    // code rows: 16-byte copies when every row starts 16-aligned, else 4 or 1
    const int cword = ((m & 15) == 0 && (reinterpret_cast<size_t>(codes) & 15) == 0) ? 16 : ((m & 3) == 0 ? 4 : 1);

    // the query's PQ table, once (4.2): made here from its padded subvectors Qs and the codebook C
    // (build_table: bang_tables_direct's arithmetic, so the same bits; no table array in global
    // memory, no table kernel), or loaded from `tables` with 16-byte loads where aligned
    // the query's log starts empty here (no fill kernels before the walk): the re-rank reads
    // every column, and columns past the walk's expansions must hold -1 / +inf
    for (int i = threadIdx.x; i < max_iters; i += blockDim.x) {
        log_ids[(size_t)q * max_iters + i] = -1;
        log_d[(size_t)q * max_iters + i] = BANG_INF;
    }
    const unsigned char* T = static_cast<const unsigned char*>(tables) + (size_t)q * m * ksub * esz;
    if (use_smem && build_table) {
        bang::build_table(s_tab, Qs + (size_t)q * m * dsub, C, m, ksub, dsub, ip, bf16);
        T = s_tab;
    } else if (use_smem) {
        const int nbytes = m * ksub * esz;
        if ((nbytes & 15) == 0 && (reinterpret_cast<size_t>(T) & 15) == 0) {
            const float4* T4 = reinterpret_cast<const float4*>(T);
            float4* S4 = reinterpret_cast<float4*>(s_tab);
            for (int i = threadIdx.x; i < (nbytes >> 4); i += blockDim.x) S4[i] = __ldg(T4 + i);
        } else {
            for (int i = threadIdx.x; i < nbytes; i += blockDim.x) s_tab[i] = T[i];
        }
        T = s_tab;
    }
    const float* Tf = reinterpret_cast<const float*>(T);
    const unsigned short* Th = reinterpret_cast<const unsigned short*>(T);
    // the filter starts empty, in shared or global memory (no fill kernel before the walk)
    for (int i = threadIdx.x; i < bloom_words; i += blockDim.x) words[i] = 0u;
    for (int i = threadIdx.x; i < L; i += blockDim.x) { wl_ids[i] = -1; wl_d[i] = BANG_INF; wl_x[i] = 0; }
    for (int j = threadIdx.x; j < s; j += blockDim.x) nbrs[j] = seeds[(size_t)q * s + j];
    int width = s;  // step 0: the seeds are the "neighbour row"
    int ne = 0;     // expansions logged (thread 0's count)
    int step = 0;
    const unsigned wmask = (unsigned)(bloom_words - 1);
    const int lane = threadIdx.x % GS;
    const int groups = blockDim.x / GS;
    for (;;) {
        __syncthreads();  // nbrs (and on entry the table, filter, list) written
        int has = 0;
        for (int j = threadIdx.x; j < width && !has; j += blockDim.x) has = nbrs[j] >= 0;
        has = __syncthreads_or(has);
        if (threadIdx.x == 0) s_cnt = 0;
        if (has) {  // --- distances (bang_distances without prefetch)
            for (int i = threadIdx.x; i < hslots; i += blockDim.x) hash[i] = -1;
            if (threadIdx.x == 0) s_nf = 0;
            __syncthreads();
            // fresh = not in the filter as it was before this step, once per id (any order: the
            // new entries are rank-sorted by the merge)
            for (int j = threadIdx.x; j < width; j += blockDim.x) {
                const int node = nbrs[j];
                if (node >= 0 && !bang::bloom_contains(words, wmask, node) &&
                    bang::hash_claim(hash, (unsigned)(hslots - 1), node))
                    fids[atomicAdd(&s_nf, 1)] = node;
            }
            __syncthreads();
            const int nf = s_nf;
            for (int i = threadIdx.x; i < nf; i += blockDim.x) bang::bloom_set(words, wmask, fids[i]);
            if (stage) {
                const int wpr = m / cword;
                for (int t = threadIdx.x; t < nf * wpr; t += blockDim.x) {
                    const int r = t / wpr, w = t - r * wpr;
                    const size_t src = (size_t)fids[r] * m;
                    if (cword == 16) {
                        reinterpret_cast<uint4*>(s_codes + (size_t)r * m)[w] = __ldg(reinterpret_cast<const uint4*>(codes + src) + w);
                    } else if (cword == 4) {
                        reinterpret_cast<unsigned*>(s_codes + (size_t)r * m)[w] = __ldg(reinterpret_cast<const unsigned*>(codes + src) + w);
                    } else {
                        s_codes[(size_t)r * m + w] = codes[src + w];
                    }
                }
                __syncthreads();
            }
            const float worst_d = wl_ids[L - 1] >= 0 ? wl_d[L - 1] : BANG_INF;
            const int worst_i = wl_ids[L - 1];
            for (int base = 0; base < nf; base += groups) {  // uniform trip count across the block
                const int j = base + threadIdx.x / GS;
                const bool f = j < nf;
                const int node = f ? fids[j] : -1;
                const unsigned char* row = !f ? nullptr : stage ? s_codes + (size_t)j * m : codes + (size_t)node * m;
                const float acc = bang::pq_score(row, f, Tf, Th, m, ksub, bf16, lane, GS);
                if (lane == 0 && f && bang::key_less(acc, node, worst_d, worst_i)) {
                    const int p = atomicAdd(&s_cnt, 1);
                    rd[p] = acc;
                    ri[p] = node;
                }
            }
        }
        __syncthreads();
        const int cnt = s_cnt;
        if (cnt > 0)  // --- merge (as bang_merge): the new entries, all unexpanded
            bang::merge_into_list(wl_d, wl_ids, wl_x, L, rd, ri, nullptr, cnt, sd, si, nullptr, od, oi, ox);
        // --- the next W candidates: the first W unexpanded entries (logged as expansions)
        bang::first_unexpanded(wl_ids, wl_x, L, W, s_pos, &s_npos);
        if (threadIdx.x == 0) {
            int c = 0;
            for (; c < s_npos && ne < max_iters; ++c, ++ne) {
                const int p = s_pos[c];
                wl_x[p] = 1;
                bang::log_expansion(q, ne, wl_ids[p], wl_d[p], log_ids, log_d, max_iters);
                s_cand[c] = wl_ids[p];
            }
            s_nc = c;
        }
        ++step;
        __syncthreads();
        const int nc = s_nc;
        if (nc == 0) break;
        // --- their graph rows, read over PCIe from the mapped host graph (bang_gather_graph)
        width = nc * R;
        for (int j = threadIdx.x; j < width; j += blockDim.x) {
            const int c = j / R;
            nbrs[j] = graph[(long long)s_cand[c] * R + (j - c * R)];
        }
    }
    if (threadIdx.x == 0) { n_exp[q] = ne; steps[q] = step; }
}
