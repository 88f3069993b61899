// gnnd.cu -- GPU NN-Descent (GNND) of Wang, Zhao & Zeng, "Large-Scale Approximate k-NN Graph
// Construction on GPU":
//   section 4.1  fixed-size NEW/OLD sampling (first p of each kind per list, reverse samples appended
//                atomically up to 2p, duplicates removed per list)           -> gnnd_sample, gnnd_reverse,
//                (optionally a uniform sample of the reverse ones)              gnnd_reverse_count,
//                                                                              dedupe in gnnd_local_join
//   section 4.2  cross-matching of one node's samples in one thread block: NEW-NEW pairs through the
//                triangle index mapping (eqs. 1-2, applied to 4x4 register tiles), NEW-OLD pairs as a
//                tiled distance "matrix product" with the metric in place of the dot product; vectors
//                of any d pass through shared memory in chunks of 64 dimensions  -> gnnd_local_join
//                (TC = 1: the same products on tensor cores, fp16 rows, mma.sync m16n8k16 with fp32
//                accumulation, l2 / ip only)                                   -> tc_distances
//   section 4.3  selective update (Alg. 2: warp-shuffle argmin of the nearest NEW and nearest OLD object
//                of each sample) and insertion into sorted lists under one spinlock per 32-entry segment
//                (or one per list), 8-lane groups inserting in parallel         -> group_insert
//   section 5.1  GGM: with split = s only cross pairs (one id < s, the other >= s) are compared.
// Graph layout: idx (n, K <= 256) int32 with bit 31 = NEW flag, dist (n, K) float32; a list is nseg sorted
// segments [seg*K/nseg, (seg+1)*K/nseg); neighbour v lives in segment v % nseg.
// NVRTC has no standard headers: only builtins are used here (fp16 is converted with inline PTX).

#define GNND_NEW 0x80000000u
#define GNND_MASK 0x7fffffff
#define GNND_FULL 0xffffffffu
// lanes per insertion group for segments of <= 32 entries (4 or 8; -DGNND_GROUP=...): smaller
// groups mean more concurrent insertions per block but more registers (hence fewer blocks/SM)
// GNND_MINB: minimum resident 128-thread blocks per SM asked of the register allocator (occupancy
// matters most: the join is latency-bound; measured on H200 in NOTES_gnnd.md)
#ifndef GNND_GROUP
#define GNND_GROUP 8
#endif
#ifndef GNND_MINB
#if GNND_GROUP == 4
#define GNND_MINB 5
#else
#define GNND_MINB 8
#endif
#endif

// distances: 0 = squared L2, 1 = negative inner product, 2 = L1
template <int M>
__device__ __forceinline__ float macc(float acc, float a, float b) {
    if (M == 0) { float t = a - b; return fmaf(t, t, acc); }
    if (M == 1) return fmaf(a, b, acc);
    return acc + fabsf(a - b);
}
template <int M>
__device__ __forceinline__ float mfinal(float acc) { return M == 1 ? -acc : acc; }

// element loaders: float32, fp16 (as raw bits), uint8, int8 -- smaller types cut the bytes moved
struct f16 { unsigned short x; };
template <typename T> __device__ __forceinline__ float gload(const T* p) { return (float)__ldg(p); }
template <> __device__ __forceinline__ float gload<f16>(const f16* p) {
    unsigned short h = __ldg(reinterpret_cast<const unsigned short*>(p));
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned long long mix64(unsigned long long x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__device__ __forceinline__ unsigned lanemask_lt() {
    unsigned m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

// (d, id) lexicographic "less": ties broken by the smaller id, as the library's conventions ask
__device__ __forceinline__ bool pair_less(float da, int ia, float db, int ib) {
    return da < db || (da == db && ia < ib);
}

__device__ __forceinline__ void warp_argmin(float& d, int& v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float od = __shfl_xor_sync(GNND_FULL, d, o);
        int ov = __shfl_xor_sync(GNND_FULL, v, o);
        if (pair_less(od, ov, d, v)) { d = od; v = ov; }
    }
}

// ---------------------------------------------------------------------------------------------
// Initial / final list preparation, one warp per node, E entries per lane (K <= 32 E: E = 4 up to
// K = 128, E = 8 up to 256; a separate instantiation so that short lists keep their registers).
// Drops invalid, self and duplicate ids, computes missing distances, routes every neighbour v to
// segment v % nseg (a segment keeps its nearest K/nseg; holes are filled with random ids of the
// segment's residue class, drawn from a hash of seed and node so that a run repeats), sorts each
// segment by (distance, id) and sets the flags. Used for the random or given init graph
// (mark = 1: all NEW, or with split only the entries across the split) and for the final output
// (nseg = 1, mark = 0: flags stripped, segments merged by the sort).
// ---------------------------------------------------------------------------------------------
template <typename T, int M>
__device__ void fill_distances(const T* __restrict__ X, int d, int u, int lo, int hi, const int* sid, float* sd,
                               int lane) {
    // 4 entries at a time so that 4 independent row loads are in flight per lane
    const T* xu = X + (size_t)u * d;
    for (int j0 = lo; j0 < hi; j0 += 4) {
        bool need[4];
        const T* xv[4];
        float acc[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int j = j0 + q;
            need[q] = j < hi && isnan(sd[j]);
            xv[q] = X + (size_t)(need[q] ? sid[j] : u) * d;
            acc[q] = 0.f;
        }
        if (!(need[0] || need[1] || need[2] || need[3])) continue;  // warp-uniform (shared reads)
        for (int t = lane; t < d; t += 32) {
            const float a = gload(xu + t);
#pragma unroll
            for (int q = 0; q < 4; ++q)
                if (need[q]) acc[q] = macc<M>(acc[q], a, gload(xv[q] + t));
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            float s = acc[q];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(GNND_FULL, s, o);
            if (need[q] && lane == 0) sd[j0 + q] = mfinal<M>(s);
        }
    }
    __syncwarp();
}

// ---------------------------------------------------------------------------------------------
// Statistics for the tensor-core join's fp16 copies (column means, largest |x - mean|): each block
// takes rows blockIdx.x, blockIdx.x + gridDim.x, ..., each thread a set of columns (coalesced row
// reads), and writes its partial column sums (centre == nullptr) or its partial max |x - centre|.
// CuPy's column reductions ran one block per column (~1 s for 10M x 96, 11 % of a whole build).
// ---------------------------------------------------------------------------------------------
template <typename T>
__global__ void gnnd_col_stats(const T* __restrict__ X, long long n, int d, const float* __restrict__ centre,
                               float* __restrict__ partial) {
    __shared__ float red[32];
    float m = 0.f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float c = centre ? centre[j] : 0.f;
        float acc = 0.f;
        for (long long r = blockIdx.x; r < n; r += gridDim.x) {
            const float x = gload(X + r * d + j);
            if (centre) acc = fmaxf(acc, fabsf(x - c)); else acc += x;
        }
        if (centre) m = fmaxf(m, acc); else partial[(size_t)blockIdx.x * d + j] = acc;
    }
    if (!centre) return;
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(GNND_FULL, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w) m = fmaxf(m, red[w]);
        partial[blockIdx.x] = m;
    }
}

template <typename T, int M, int E>
__global__ void gnnd_prepare(const T* __restrict__ X, int n, int d, int K, int nseg,
                             const int* __restrict__ in_idx, const float* __restrict__ in_dist,
                             int* __restrict__ out_idx, float* __restrict__ out_dist,
                             unsigned long long seed, int split, int mark, int row0, int nrows) {
    // rows row0 .. row0 + nrows - 1 of the graph (the list arrays hold just those rows, so that a
    // caller can work in row tiles); u is the point id of the row
    extern __shared__ int psm[];
    const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
    const int r = blockIdx.x * (blockDim.x >> 5) + wib;
    if (r >= nrows) return;  // warp-uniform
    const int u = row0 + r;
    int* aid = psm + wib * 4 * K;
    float* ad = reinterpret_cast<float*>(aid + K);
    int* bid = aid + 2 * K;
    float* bd = reinterpret_cast<float*>(aid + 3 * K);
    const float qnan = __int_as_float(0x7fc00000);

    // A: load, drop invalid / self / later duplicates, compact in order
    int ids[E];
    float ds[E];
    bool ok[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int j = e * 32 + lane;
        ids[e] = -1; ds[e] = qnan; ok[e] = false;
        if (j < K) {
            if (in_idx) {
                int v = in_idx[(size_t)r * K + j];
                if (v != -1) v &= GNND_MASK;  // flags of a running graph
                ids[e] = v;
                if (in_dist) ds[e] = in_dist[(size_t)r * K + j];
                ok[e] = v >= 0 && v < n && v != u;
            }
            aid[j] = ok[e] ? ids[e] : -1;
        }
    }
    __syncwarp();
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int j = e * 32 + lane;
        if (ok[e])
            for (int k = 0; k < j; ++k)
                if (aid[k] == ids[e]) { ok[e] = false; break; }
    }
    __syncwarp();
    int cnt = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) {  // ids live in registers, so compacting in place is safe
        const unsigned b = __ballot_sync(GNND_FULL, ok[e]);
        const int pos = cnt + __popc(b & lanemask_lt());
        if (ok[e]) { aid[pos] = ids[e]; ad[pos] = ds[e]; }
        cnt += __popc(b);
    }
    __syncwarp();
    // B: distances the caller did not give
    fill_distances<T, M>(X, d, u, 0, cnt, aid, ad, lane);

    // C: route to segments, keep the nearest L of each
    int fill[E];
#pragma unroll
    for (int s = 0; s < E; ++s) fill[s] = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int j = e * 32 + lane;
        int sg = -1, rank = 0;
        if (j < cnt) {
            const int v = aid[j];
            const float dv = ad[j];
            sg = v % nseg;
            for (int k = 0; k < cnt; ++k) rank += (aid[k] % nseg == sg) && pair_less(ad[k], aid[k], dv, v);
            const int beg = sg * K / nseg, L = (sg + 1) * K / nseg - beg;
            if (rank < L) { bid[beg + rank] = v; bd[beg + rank] = dv; }
        }
#pragma unroll
        for (int s = 0; s < E; ++s) fill[s] += __popc(__ballot_sync(GNND_FULL, sg == s));
    }
    __syncwarp();
    // D: fill each segment's holes with random ids of its residue class (then a sweep, which
    // terminates because the caller makes every class larger than a segment). In a merge
    // (split >= 0) the fills come from the other subset when its class is large enough: a
    // same-side id is never compared there (only cross pairs are), so it would only hold a slot.
    for (int s = 0; s < nseg; ++s) {
        const int beg = s * K / nseg, L = (s + 1) * K / nseg - beg;
        int first = s;  // candidates are first + r * nseg, r < csize
        unsigned csize = (unsigned)((n - 1 - s) / nseg + 1);
        if (split >= 0) {
            const int lo = u < split ? split : 0, hi = u < split ? n : split;
            const int f0 = lo + ((s - lo % nseg) % nseg + nseg) % nseg;
            const int cnt = f0 < hi ? (hi - 1 - f0) / nseg + 1 : 0;
            if (cnt >= L) { first = f0; csize = (unsigned)cnt; }  // u is not in that range
        }
        int f = min(fill[s], L);
        for (int round = 0; f < L; ++round) {
            unsigned r;
            if (round < 64)
                r = (unsigned)(mix64(seed ^ mix64(((unsigned long long)u << 24) + (s << 20) + round * 32 + lane)) % csize);
            else
                r = (unsigned)(((unsigned long long)(u / nseg) + 1 + (unsigned long long)(round - 64) * 32 + lane) % csize);
            const int c = first + (int)r * nseg;
            bool good = c != u;
            for (int k = 0; k < f && good; ++k)
                if (bid[beg + k] == c) good = false;
            for (int l = 0; l < 32; ++l) {
                const int oc = __shfl_sync(GNND_FULL, c, l);
                if (l < lane && oc == c) good = false;
            }
            const unsigned b = __ballot_sync(GNND_FULL, good);
            const int pos = f + __popc(b & lanemask_lt());
            if (good && pos < L) { bid[beg + pos] = c; bd[beg + pos] = qnan; }
            f = min(L, f + __popc(b));
            __syncwarp();
        }
    }
    // E: distances of the fills
    fill_distances<T, M>(X, d, u, 0, K, bid, bd, lane);
    // F: sort each segment by (distance, id); ids are unique so ranks are a permutation
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int j = e * 32 + lane;
        if (j < K) {
            int sg = 0;
            while (sg + 1 < nseg && (sg + 1) * K / nseg <= j) ++sg;
            const int beg = sg * K / nseg, end = (sg + 1) * K / nseg;
            const int v = bid[j];
            const float dv = bd[j];
            int rank = 0;
            for (int k = beg; k < end; ++k) rank += pair_less(bd[k], bid[k], dv, v);
            unsigned flag = 0;
            if (mark) flag = (split < 0 || ((u < split) != (v < split))) ? GNND_NEW : 0u;
            out_idx[(size_t)r * K + beg + rank] = (int)((unsigned)v | flag);
            out_dist[(size_t)r * K + beg + rank] = dv;
        }
    }
}


// ---------------------------------------------------------------------------------------------
// Section 4.1, forward part: the first (nearest) p NEW and p OLD entries of each list, one warp
// per node (E entries per lane, K <= 32 E). Sampled NEW entries become OLD. Lists with several
// segments are ranked across them.
// ---------------------------------------------------------------------------------------------
template <int E>
__global__ void gnnd_sample(int* __restrict__ g_idx, const float* __restrict__ g_dist, int n, int K,
                            int nseg, int p, int maxs, int* __restrict__ new_s, int* __restrict__ new_cnt,
                            int* __restrict__ new_fwd, int* __restrict__ old_s, int* __restrict__ old_cnt,
                            int* __restrict__ old_fwd) {
    extern __shared__ int ssm[];
    const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
    const int u = blockIdx.x * (blockDim.x >> 5) + wib;
    if (u >= n) return;
    float* sd = reinterpret_cast<float*>(ssm + wib * 2 * K);
    int* sn = ssm + wib * 2 * K + K;
    int ids[E];
    float ds[E];
    bool isn[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        int j = e * 32 + lane;
        ids[e] = 0; ds[e] = 0.f; isn[e] = false;
        if (j < K) {
            ids[e] = g_idx[(size_t)u * K + j];
            ds[e] = g_dist[(size_t)u * K + j];
            isn[e] = ((unsigned)ids[e] & GNND_NEW) != 0;
            if (nseg > 1) { sd[j] = ds[e]; sn[j] = isn[e]; }
        }
    }
    __syncwarp();
    int cn = 0, co = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
        int j = e * 32 + lane;
        bool valid = j < K;
        unsigned bn = __ballot_sync(GNND_FULL, valid && isn[e]);
        unsigned bo = __ballot_sync(GNND_FULL, valid && !isn[e]);
        int rank;
        if (nseg == 1) {  // one sorted list: rank = position among entries of the same kind
            rank = isn[e] ? cn + __popc(bn & lanemask_lt()) : co + __popc(bo & lanemask_lt());
        } else {          // sorted segments: rank by (distance, slot) across the whole list
            rank = 0;
            if (valid)
                for (int k = 0; k < K; ++k)
                    rank += (sn[k] == (int)isn[e]) && (sd[k] < ds[e] || (sd[k] == ds[e] && k < j));
        }
        cn += __popc(bn);
        co += __popc(bo);
        if (valid && rank < p) {
            int v = ids[e] & GNND_MASK;
            if (isn[e]) {
                new_s[(size_t)u * maxs + rank] = v;
                g_idx[(size_t)u * K + j] = v;  // sampled NEW becomes OLD
            } else {
                old_s[(size_t)u * maxs + rank] = v;
            }
        }
    }
    if (lane == 0) {
        int fn = min(cn, p), fo = min(co, p);
        new_fwd[u] = fn; new_cnt[u] = fn;
        old_fwd[u] = fo; old_cnt[u] = fo;
    }
}

// Section 4.1, reverse part: v in G_new[u] appends u to G_new[v] (atomically, while below cap = 2p);
// the same for G_old. Appends land after the forward samples, which nobody writes here.
// indeg == nullptr: first come, first served (the paper). Otherwise indeg[0..n) / indeg[n..2n) hold
// how many lists sampled v as NEW / OLD this iteration (gnnd_reverse_count), and each reverse
// candidate is kept with probability min(1, 1.25 room / indeg): a uniform sample of the reverse
// neighbours instead of the ones whose threads happen to run first. Why: with a skewed in-degree
// (hub points, e.g. under an unnormalised inner product) first-come serves the same few nodes at
// every iteration and the others never see their neighbours' neighbours (NOTES_gnnd.md).
__device__ __forceinline__ bool keep_reverse(const int* indeg, int v, int room, int u, unsigned long long salt) {
    if (indeg == nullptr) return true;
    const int c = indeg[v];
    if (c <= room) return true;
    const unsigned long long h = mix64(salt ^ mix64(((unsigned long long)(unsigned)u << 32) | (unsigned)v));
    const float r = (float)(h >> 40) * (1.0f / 16777216.0f);  // uniform in [0, 1)
    return r * (float)c < 1.25f * (float)room;
}

// vlo .. vhi - 1: the nodes whose reverse samples are wanted (all of them on one device; a device
// sharing the descent joins only its own nodes)
__global__ void gnnd_reverse_count(int n, int maxs, const int* __restrict__ new_s, const int* __restrict__ new_fwd,
                                   const int* __restrict__ old_s, const int* __restrict__ old_fwd,
                                   int* __restrict__ indeg, int vlo, int vhi) {
    int u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= n) return;
    for (int i = 0, fn = new_fwd[u]; i < fn; ++i) {
        const int v = new_s[(size_t)u * maxs + i];
        if (v >= vlo && v < vhi) atomicAdd(&indeg[v], 1);
    }
    for (int i = 0, fo = old_fwd[u]; i < fo; ++i) {
        const int v = old_s[(size_t)u * maxs + i];
        if (v >= vlo && v < vhi) atomicAdd(&indeg[n + v], 1);
    }
}

__global__ void gnnd_reverse(int n, int maxs, int cap, int* __restrict__ new_s, const int* __restrict__ new_fwd,
                             int* __restrict__ new_cnt, int* __restrict__ old_s, const int* __restrict__ old_fwd,
                             int* __restrict__ old_cnt, const int* __restrict__ indeg, unsigned long long salt,
                             int vlo, int vhi) {
    int u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= n) return;
    int fn = new_fwd[u], fo = old_fwd[u];
    for (int i = 0; i < fn; ++i) {
        int v = new_s[(size_t)u * maxs + i];
        if (v < vlo || v >= vhi || new_cnt[v] >= cap) continue;  // cheap early out; the atomic below is the real check
        if (!keep_reverse(indeg, v, cap - new_fwd[v], u, salt)) continue;
        int pos = atomicAdd(&new_cnt[v], 1);
        if (pos < cap) new_s[(size_t)v * maxs + pos] = u;
    }
    for (int i = 0; i < fo; ++i) {
        int v = old_s[(size_t)u * maxs + i];
        if (v < vlo || v >= vhi || old_cnt[v] >= cap) continue;
        if (!keep_reverse(indeg ? indeg + n : nullptr, v, cap - old_fwd[v], u, ~salt)) continue;
        int pos = atomicAdd(&old_cnt[v], 1);
        if (pos < cap) old_s[(size_t)v * maxs + pos] = u;
    }
}

// ---------------------------------------------------------------------------------------------
// Section 4.3: insert (v, dv) into list u by a group of G lanes holding E entries each (G = GNND_GROUP,
// E = 32 / G when a segment has <= 32 entries, else the whole warp with E = EW = 4 or 8). The list is cut in
// nseg segments, each sorted
// and guarded by its own spinlock (nseg = 1: one lock per list). Several groups of a warp
// insert into different lists at once, which hides the latency of lock, read, write.
// Returns true when inserted.
// ---------------------------------------------------------------------------------------------
template <int G, int E>
__device__ __forceinline__ bool group_insert(int u, int v, float dv, int K, int nseg, int* __restrict__ g_idx,
                                            float* __restrict__ g_dist, int* __restrict__ locks, int lane) {
    const unsigned mask = G == 32 ? GNND_FULL : (((1u << G) - 1u) << (lane & ~(G - 1)));
    const int gl = lane & (G - 1);
    const int seg = nseg == 1 ? 0 : v % nseg;
    const int beg = seg * K / nseg, L = (seg + 1) * K / nseg - beg;
    int* li = g_idx + (size_t)u * K + beg;
    float* ld = g_dist + (size_t)u * K + beg;
    int* lk = locks + (size_t)u * nseg + seg;
    if (gl == 0)
        while (atomicCAS(lk, 0, 1) != 0) __nanosleep(32);  // lets a lock-holding group of this warp run
    __syncwarp(mask);
    __threadfence();
    int ids[E];
    float ds[E];
    bool dup = false;
    unsigned below = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int j = e * G + gl;
        ids[e] = 0; ds[e] = 0.f;
        if (j < L) {
            ids[e] = __ldcg(li + j);
            ds[e] = __ldcg(ld + j);
            const int w = ids[e] & GNND_MASK;
            dup |= (w == v);
            below += pair_less(ds[e], w, dv, v);
        }
    }
    dup = __any_sync(mask, dup);
    const int pos = (int)__reduce_add_sync(mask, below);
    const bool ins = !dup && pos < L;
    if (ins) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const int j = e * G + gl;
            if (j >= pos && j < L - 1) { __stcg(li + j + 1, ids[e]); __stcg(ld + j + 1, ds[e]); }
            if (j == pos) { __stcg(li + j, (int)((unsigned)v | GNND_NEW)); __stcg(ld + j, dv); }
        }
    }
    __threadfence();
    __syncwarp(mask);
    if (gl == 0) atomicExch(lk, 0);
    return ins;
}

// chunk loader: every thread keeps 8 loads in flight (a row at a time per warp would serialise
// ~30 global-memory latencies per block); float4 when rows are 16-byte aligned
template <typename T, int MAXS, int DCP>
__device__ __forceinline__ void load_chunk(const T* __restrict__ X, int d, int c0, int cl, int cl4, int mn, int mo,
                                           const int* sid, float* Xs) {
    const int total = (mn + mo) * cl4;
    for (int base = 0; base < total; base += 8 * blockDim.x) {
        float v[8];
        int dst[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            const int e = base + q * blockDim.x + threadIdx.x;
            dst[q] = -1;
            if (e < total) {
                const int rr = e / cl4, j = e - rr * cl4;
                const int r = rr < mn ? rr : MAXS + rr - mn;
                v[q] = j < cl ? gload(X + (size_t)sid[r] * d + c0 + j) : 0.f;
                dst[q] = r * DCP + j;
            }
        }
#pragma unroll
        for (int q = 0; q < 8; ++q)
            if (dst[q] >= 0) Xs[dst[q]] = v[q];
    }
}

template <int MAXS, int DCP>
__device__ __forceinline__ void load_chunk_f4(const float* __restrict__ X, int d, int c0, int cl4, int mn, int mo,
                                              const int* sid, float* Xs) {
    const int nv = cl4 >> 2, total = (mn + mo) * nv;
    for (int base = 0; base < total; base += 4 * blockDim.x) {
        float4 v[4];
        int dst[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int e = base + q * blockDim.x + threadIdx.x;
            dst[q] = -1;
            if (e < total) {
                const int rr = e / nv, c = e - rr * nv;
                const int r = rr < mn ? rr : MAXS + rr - mn;
                v[q] = __ldg(reinterpret_cast<const float4*>(X + (size_t)sid[r] * d + c0) + c);
                dst[q] = r * DCP + 4 * c;
            }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
            if (dst[q] >= 0) *reinterpret_cast<float4*>(Xs + dst[q]) = v[q];
    }
}

template <typename T> struct is_f32 { static constexpr bool value = false; };
template <> struct is_f32<float> { static constexpr bool value = true; };

// ---------------------------------------------------------------------------------------------
// Tensor-core distances (the issue's "tiled 16x16 distance matrix product", as cuVS does; TC = 1):
// the sample rows of a chunk of GNND_DCT = 128 dimensions are kept as fp16 pairs in shared memory
// (row stride 68 words, so that the 8 rows x 4 words of one fragment load hit 32 distinct banks);
// NEW-NEW (lower triangle of 16x16 tiles, eqs. 1-2 on tiles) and NEW-OLD dot products are
// mma.sync m16n8k16 (fp16 in, fp32 accumulate), one warp per 16x16 tile = 2 MMAs per k-step of
// 16. Squared L2 = |a|^2 + |b|^2 - 2 a.b with the norms summed in fp32 from the same fp16 values
// (the result is the fp32-accumulated distance of the rounded vectors; clamped at 0). Before the
// rounding, rows are centred (l2 only: translation-invariant; mu = column means) and scaled by a power
// of two (tc_scale, largest |value| near 1024) so that data with an offset or a small or large range
// keep fp16's 11 significant bits on what differs between them; distances are scaled back. l1 has no
// product form: fp32 SIMT only. Inline PTX rather than <mma.h>: NVRTC with CuPy's pip CUDA headers
// cannot open crt/mma.h (measured on the H200 machine), and PTX needs no header at all.
// ---------------------------------------------------------------------------------------------
#define GNND_DCT 128
#define GNND_DCW (GNND_DCT / 2 + 4)   // row stride in 32-bit words (fp16 pairs)

__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float half_lo(unsigned v) {
    float f;
    asm("{ .reg .f16 l, h; mov.b32 {l, h}, %1; cvt.f32.f16 %0, l; }" : "=f"(f) : "r"(v));
    return f;
}
__device__ __forceinline__ float half_hi(unsigned v) {
    float f;
    asm("{ .reg .f16 l, h; mov.b32 {l, h}, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "r"(v));
    return f;
}
__device__ __forceinline__ void mma_16816(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                          unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <typename T, int MAXS>
__device__ __forceinline__ void tc_load_chunk(const T* __restrict__ X, int d, int c0, int cl, int cl16, int mn,
                                              int mo, const int* sid, unsigned* Xh, const float* __restrict__ mu,
                                              float scale) {
    // groups of 4 elements, 4 groups in flight per thread; zero padding up to a multiple of 16
    const int ng = cl16 >> 2, total = (mn + mo) * ng;
    const bool vec = is_f32<T>::value && (d & 3) == 0;
    for (int base = 0; base < total; base += 4 * blockDim.x) {
        float4 v[4];
        int dst[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int e = base + q * blockDim.x + threadIdx.x;
            dst[q] = -1;
            if (e < total) {
                const int rr = e / ng, c = e - rr * ng;
                const int r = rr < mn ? rr : MAXS + rr - mn;
                const int j = 4 * c;
                const T* src = X + (size_t)sid[r] * d + c0 + j;
                if (vec && j < cl) {
                    v[q] = __ldg(reinterpret_cast<const float4*>(src));
                } else {
                    v[q].x = j < cl ? gload(src) : 0.f;
                    v[q].y = j + 1 < cl ? gload(src + 1) : 0.f;
                    v[q].z = j + 2 < cl ? gload(src + 2) : 0.f;
                    v[q].w = j + 3 < cl ? gload(src + 3) : 0.f;
                }
                dst[q] = r * GNND_DCW + 2 * c;
            }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
            if (dst[q] >= 0) {
                if (mu) {  // (x - mu) * scale; the padding columns stay 0
                    const int j = c0 + 2 * (dst[q] % GNND_DCW);
                    if (j < d) v[q].x = (v[q].x - __ldg(mu + j)) * scale;
                    if (j + 1 < d) v[q].y = (v[q].y - __ldg(mu + j + 1)) * scale;
                    if (j + 2 < d) v[q].z = (v[q].z - __ldg(mu + j + 2)) * scale;
                    if (j + 3 < d) v[q].w = (v[q].w - __ldg(mu + j + 3)) * scale;
                } else {
                    v[q].x *= scale; v[q].y *= scale; v[q].z *= scale; v[q].w *= scale;
                }
                Xh[dst[q]] = pack_half2(v[q].x, v[q].y);
                Xh[dst[q] + 1] = pack_half2(v[q].z, v[q].w);
            }
    }
}

// D[r][c] (NEW-NEW, both triangles) and D[r][MAXS + c] (NEW-OLD) as in the fp32 path: dot products
// for ip, squared L2 for l2. Ends with a __syncthreads.
template <typename T, int M, int MAXS, int DS>
__device__ void tc_distances(const T* __restrict__ X, int d, int mn, int mo, const int* sid, float* D, float* nrm,
                             unsigned* Xh, const float* __restrict__ mu, float scale) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const int g = lane >> 2, tg = lane & 3;  // mma fragment coordinates: row group, thread in group
    const int Tn = (mn + 15) >> 4, To = (mo + 15) >> 4;
    const int nNN = Tn * (Tn + 1) / 2, nItems = nNN + Tn * To;
    for (int c0 = 0; c0 < d; c0 += GNND_DCT) {
        const int cl = min(GNND_DCT, d - c0), cl16 = (cl + 15) & ~15;
        const bool first = c0 == 0, last = c0 + GNND_DCT >= d;
        tc_load_chunk<T, MAXS>(X, d, c0, cl, cl16, mn, mo, sid, Xh, mu, scale);
        __syncthreads();
        if (M == 0)
            for (int rr = tid; rr < mn + mo; rr += blockDim.x) {
                const int r = rr < mn ? rr : MAXS + rr - mn;
                float s = 0.f;
                for (int j = 0; j < (cl16 >> 1); ++j) {
                    const unsigned h = Xh[r * GNND_DCW + j];
                    const float lo = half_lo(h), hi = half_hi(h);
                    s = fmaf(lo, lo, fmaf(hi, hi, s));
                }
                nrm[r] = first ? s : nrm[r] + s;
            }
        for (int it = warp; it < nItems; it += nw) {
            int U, V;
            const bool nn = it < nNN;
            if (nn) {  // eqs. (1)-(2) on 16x16 tiles
                int uu = (int)ceilf(sqrtf(2.f * it + 2.25f) - 0.5f);
                if (uu * (uu - 1) / 2 > it) --uu;
                if (uu * (uu + 1) / 2 <= it) ++uu;
                U = uu - 1; V = it - uu * (uu - 1) / 2;
            } else {
                const int q = it - nNN;
                U = q / To; V = q - U * To;
            }
            const int col = (nn ? 0 : MAXS) + 16 * V;
            // A rows 16U + g (+8), B rows col + g (+8 for the second n-half); k pairs tg, tg + 4
            const unsigned* pa = Xh + (16 * U + g) * GNND_DCW + tg;
            const unsigned* pb = Xh + (col + g) * GNND_DCW + tg;
            float acc[2][4];
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[h][i] = 0.f;
            for (int k = 0; k < (cl16 >> 1); k += 8) {
                const unsigned a0 = pa[k], a1 = pa[8 * GNND_DCW + k], a2 = pa[k + 4], a3 = pa[8 * GNND_DCW + k + 4];
                mma_16816(acc[0], a0, a1, a2, a3, pb[k], pb[k + 4]);
                mma_16816(acc[1], a0, a1, a2, a3, pb[8 * GNND_DCW + k], pb[8 * GNND_DCW + k + 4]);
            }
            // c0,c1: row g, cols 2tg, 2tg+1 of the n-half; c2,c3: row g + 8
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int r = 16 * U + g + (i >> 1) * 8, c = 16 * V + 8 * h + 2 * tg + (i & 1);
                    float* p = D + r * DS + (nn ? 0 : MAXS) + c;
                    const float v = first ? acc[h][i] : *p + acc[h][i];
                    *p = v;
                    if (last && nn && U != V) D[c * DS + r] = v;  // the mirror tile (U > V)
                }
        }
        __syncthreads();
    }
    // back to the caller's units (scale is a power of two: exact)
    const float inv2 = 1.f / (scale * scale);
    if (M == 0 || inv2 != 1.f) {
        const int w = mn + mo;
        for (int e = tid; e < mn * w; e += blockDim.x) {
            const int r = e / w, c = e - r * w;
            const int cc = c < mn ? c : MAXS + c - mn;   // column of D and row of the norms
            float* p = D + r * DS + cc;
            *p = (M == 0 ? fmaxf(0.f, nrm[r] + nrm[cc] - 2.f * *p) : *p) * inv2;
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------------------------
// Sections 4.2 + 4.3: the local join of one node per thread block.
// Shared memory: Xs = 2*MAXS sample rows (NEW rows [0, MAXS), OLD rows [MAXS, 2 MAXS)) x one
// chunk of DC = 64 dimensions (row stride 68 floats = 4 mod 32 banks, so that 8 threads of a
// quarter warp reading float4 from 8 consecutive rows hit distinct banks); D = MAXS x (2 MAXS + 1)
// distances: D[r][c] NEW-NEW (both triangles), D[r][MAXS + c] NEW-OLD.
// Work items are 4x4 register tiles whose rows/cols are strided (U + i*T), which keeps the LDS.128
// of neighbouring threads on consecutive rows (conflict-free). NEW-NEW tiles enumerate the lower
// triangle of the T x T tile grid with eqs. (1)-(2) of the paper; NEW-OLD tiles are the full
// T x TO grid (the tiled "matrix product" with the metric in place of the dot product).
// EW: entries per lane when a whole warp inserts into one list (basic update, or segments longer
// than 32 with locks="global"): 4 for K <= 128, 8 for K <= 256.
// dirty (optional): dirty[u] = 1 for every list u an insertion changed; the descent shared between
// devices sends only those rows to their owners (_gpu.py _merge_copies).
// ---------------------------------------------------------------------------------------------
template <typename T, int M, int MAXS, int EW, int TC>
__global__ void __launch_bounds__(MAXS == 32 ? 128 : 256, MAXS == 32 ? (EW == 4 ? GNND_MINB : 6) : 2)
gnnd_local_join(const T* __restrict__ X, int n, int d, int K, int nseg, int cap,
                const int* __restrict__ new_s, const int* __restrict__ new_cnt,
                const int* __restrict__ old_s, const int* __restrict__ old_cnt,
                int* __restrict__ g_idx, float* __restrict__ g_dist, int* __restrict__ locks,
                int split, int basic, unsigned long long* __restrict__ updates,
                const float* __restrict__ tc_mu, float tc_scale, unsigned char* __restrict__ dirty) {
    constexpr int DC = 64, DCP = DC + 4, DS = 2 * MAXS + 1;
    extern __shared__ float4 smem4[];
    // fp32: [Xs: 2 MAXS x DCP][D]; tensor cores: [D][norms: 2 MAXS][Xh: 2 MAXS x GNND_DCW fp16 pairs]
    float* Xs = reinterpret_cast<float*>(smem4);
    float* D = TC ? Xs : Xs + 2 * MAXS * DCP;
    __shared__ int sraw[2 * MAXS];
    __shared__ int sid[2 * MAXS];
    __shared__ int scount[2];
    __shared__ int skeep[2 * MAXS];
    __shared__ unsigned supd;
    __shared__ int cv[3 * MAXS];    // selective-update candidates (-1: none)
    __shared__ float cd[3 * MAXS];

    const int s = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const int rn = min(new_cnt[s], cap);
    if (rn == 0) return;  // no NEW sample: nothing new to learn around s
    const int ro = min(old_cnt[s], cap);
    for (int r = tid; r < 2 * MAXS; r += blockDim.x) {
        int v = -1;
        if (r < MAXS) { if (r < rn) v = new_s[(size_t)s * MAXS + r]; }
        else if (r - MAXS < ro) v = old_s[(size_t)s * MAXS + r - MAXS];
        sraw[r] = v;
    }
    if (tid == 0) supd = 0;
    for (int q = tid; q < 3 * MAXS; q += blockDim.x) cv[q] = -1;
    __syncthreads();
    // dedupe (section 4.1): keep the first copy; an OLD id that is also a NEW sample is dropped
    // (its pairs are already covered by NEW-NEW). Then compact each half in order.
    for (int r = tid; r < 2 * MAXS; r += blockDim.x) {
        const int v = sraw[r], base = r < MAXS ? 0 : MAXS;
        bool keep = v >= 0;
        for (int k = base; k < r && keep; ++k) keep = sraw[k] != v;
        if (keep && base == MAXS)
            for (int k = 0; k < rn && keep; ++k) keep = sraw[k] != v;
        skeep[r] = keep;
    }
    __syncthreads();
    for (int r = tid; r < 2 * MAXS; r += blockDim.x) {
        const int base = r < MAXS ? 0 : MAXS;
        int pos = 0;
        for (int k = base; k < r; ++k) pos += skeep[k];
        if (skeep[r]) sid[base + pos] = sraw[r];
        if (r == base + MAXS - 1) scount[base == 0 ? 0 : 1] = pos + skeep[r];
    }
    __syncthreads();
    const int mn = scount[0], mo = scount[1];
    const int Tn = (mn + 3) >> 2, To = (mo + 3) >> 2;
    const int nNN = Tn * (Tn + 1) / 2, nItems = nNN + Tn * To;

    if constexpr (TC != 0) {
        static_assert(M != 2, "l1 has no tensor-core form");
        float* nrm = D + MAXS * DS;
        tc_distances<T, M, MAXS, DS>(X, d, mn, mo, sid, D, nrm, reinterpret_cast<unsigned*>(nrm + 2 * MAXS), tc_mu,
                                     tc_scale);
    } else
    for (int c0 = 0; c0 < d; c0 += DC) {
        const int cl = min(DC, d - c0), cl4 = (cl + 3) & ~3;
        if (is_f32<T>::value && (d & 3) == 0)
            load_chunk_f4<MAXS, DCP>(reinterpret_cast<const float*>(X), d, c0, cl4, mn, mo, sid, Xs);
        else
            load_chunk<T, MAXS, DCP>(X, d, c0, cl, cl4, mn, mo, sid, Xs);
        __syncthreads();
        for (int it = tid; it < nItems; it += blockDim.x) {
            int U, V, ta, tb, cb;
            const bool nn = it < nNN;
            if (nn) {  // eqs. (1)-(2): item -> (u', v') of the strict lower triangle of a (Tn+1) grid
                int uu = (int)ceilf(sqrtf(2.f * it + 2.25f) - 0.5f);
                if (uu * (uu - 1) / 2 > it) --uu;
                if (uu * (uu + 1) / 2 <= it) ++uu;
                U = uu - 1; V = it - uu * (uu - 1) / 2;
                ta = Tn; tb = Tn; cb = 0;
            } else {
                const int q = it - nNN;
                U = q / To; V = q - U * To;
                ta = Tn; tb = To; cb = MAXS;
            }
            float acc[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int k = 0; k < 4; ++k) acc[i][k] = 0.f;
            const float* pa = Xs + U * DCP;
            const float* pb = Xs + (cb + V) * DCP;
            for (int j = 0; j < cl4; j += 4) {
                float4 a[4], b[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    a[i] = *reinterpret_cast<const float4*>(pa + i * ta * DCP + j);
                    b[i] = *reinterpret_cast<const float4*>(pb + i * tb * DCP + j);
                }
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        float t = acc[i][k];
                        t = macc<M>(t, a[i].x, b[k].x);
                        t = macc<M>(t, a[i].y, b[k].y);
                        t = macc<M>(t, a[i].z, b[k].z);
                        t = macc<M>(t, a[i].w, b[k].w);
                        acc[i][k] = t;
                    }
            }
            const bool first = c0 == 0;
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int r = U + i * ta, c = V + k * tb;
                    if (nn) {
                        if (r < mn && c < mn) {
                            float* p1 = D + r * DS + c;
                            *p1 = first ? acc[i][k] : *p1 + acc[i][k];
                            if (U != V) {  // mirror; a diagonal tile holds both orders itself
                                float* p2 = D + c * DS + r;
                                *p2 = first ? acc[i][k] : *p2 + acc[i][k];
                            }
                        }
                    } else if (r < mn && c < mo) {
                        float* p1 = D + r * DS + MAXS + c;
                        *p1 = first ? acc[i][k] : *p1 + acc[i][k];
                    }
                }
        }
        __syncthreads();
    }

    // Section 4.3 update.
    unsigned myupd = 0;
    if (basic) {
        // classic NN-Descent: offer every compared pair to both lists (ablation GNND-r1), one warp
        // per sample row
        for (int rr = warp; rr < mn + mo; rr += nw) {
            const bool isnew = rr < mn;
            const int u = sid[isnew ? rr : MAXS + rr - mn];
            const bool ulow = u < split;
            const int ncand = isnew ? mn + mo : mn;
            for (int c = 0; c < ncand; ++c) {
                int v;
                float dv;
                if (isnew) {
                    if (c == rr) continue;
                    v = c < mn ? sid[c] : sid[MAXS + c - mn];
                    dv = c < mn ? D[rr * DS + c] : D[rr * DS + MAXS + c - mn];
                } else {
                    v = sid[c];
                    dv = D[c * DS + MAXS + (rr - mn)];
                }
                if (v == u || (split >= 0 && ((v < split) == ulow))) continue;
                dv = mfinal<M>(dv);
                const int seg = nseg == 1 ? 0 : v % nseg;
                const float worst = __shfl_sync(GNND_FULL, lane == 0 ? __ldcg(g_dist + (size_t)u * K +
                                                    (seg + 1) * K / nseg - 1) : 0.f, 0);
                if (!(dv < worst)) continue;  // a segment's last distance only decreases
                if (group_insert<32, EW>(u, v, dv, K, nseg, g_idx, g_dist, locks, lane)) {
                    ++myupd;
                    if (dirty && lane == 0) dirty[u] = 1;
                }
            }
        }
    } else {
        // U1 (Alg. 2): per sample row, the nearest other NEW and nearest OLD object (NEW rows, slots
        // 2r and 2r+1) or the nearest NEW object (OLD rows, slot 2 MAXS + o), by warp-shuffle argmin
        const float inf = __int_as_float(0x7f800000);
        for (int rr = warp; rr < mn + mo; rr += nw) {
            const bool isnew = rr < mn;
            const int u = sid[isnew ? rr : MAXS + rr - mn];
            const bool ulow = u < split;
            if (isnew) {
                float d1 = inf, d2 = inf;
                int v1 = 0x7fffffff, v2 = 0x7fffffff;
                for (int c = lane; c < mn; c += 32) {
                    const int v = sid[c];
                    if (c == rr || v == u || (split >= 0 && ((v < split) == ulow))) continue;
                    const float dv = mfinal<M>(D[rr * DS + c]);
                    if (pair_less(dv, v, d1, v1)) { d1 = dv; v1 = v; }
                }
                for (int c = lane; c < mo; c += 32) {
                    const int v = sid[MAXS + c];
                    if (v == u || (split >= 0 && ((v < split) == ulow))) continue;
                    const float dv = mfinal<M>(D[rr * DS + MAXS + c]);
                    if (pair_less(dv, v, d2, v2)) { d2 = dv; v2 = v; }
                }
                warp_argmin(d1, v1);
                warp_argmin(d2, v2);
                if (lane == 0) {
                    cv[2 * rr] = v1 == 0x7fffffff ? -1 : v1; cd[2 * rr] = d1;
                    cv[2 * rr + 1] = v2 == 0x7fffffff ? -1 : v2; cd[2 * rr + 1] = d2;
                }
            } else {
                const int o = rr - mn;
                float d1 = inf;
                int v1 = 0x7fffffff;
                for (int c = lane; c < mn; c += 32) {
                    const int v = sid[c];
                    if (v == u || (split >= 0 && ((v < split) == ulow))) continue;
                    const float dv = mfinal<M>(D[c * DS + MAXS + o]);
                    if (pair_less(dv, v, d1, v1)) { d1 = dv; v1 = v; }
                }
                warp_argmin(d1, v1);
                if (lane == 0) { cv[2 * MAXS + o] = v1 == 0x7fffffff ? -1 : v1; cd[2 * MAXS + o] = d1; }
            }
        }
        __syncthreads();
        // U2: all candidates against the last distance of their target segment at once (one
        // memory latency for the block instead of one per candidate)
        for (int q = tid; q < 3 * MAXS; q += blockDim.x) {
            const int v = cv[q];
            if (v < 0) continue;
            const int u = q < 2 * MAXS ? sid[q >> 1] : sid[MAXS + q - 2 * MAXS];
            const int seg = nseg == 1 ? 0 : v % nseg;
            if (!(cd[q] < __ldcg(g_dist + (size_t)u * K + (seg + 1) * K / nseg - 1))) cv[q] = -1;
        }
        __syncthreads();
        // U3: the survivors, one per lane group
        if ((K + nseg - 1) / nseg <= 32) {
            const int g = tid / GNND_GROUP, ng = blockDim.x / GNND_GROUP;
            unsigned cnt = 0;
            for (int q = g; q < 3 * MAXS; q += ng) {
                const int v = cv[q];
                if (v < 0) continue;
                const int u = q < 2 * MAXS ? sid[q >> 1] : sid[MAXS + q - 2 * MAXS];
                if (group_insert<GNND_GROUP, 32 / GNND_GROUP>(u, v, cd[q], K, nseg, g_idx, g_dist, locks, lane)) {
                    ++cnt;
                    if (dirty && (lane & (GNND_GROUP - 1)) == 0) dirty[u] = 1;
                }
            }
            if ((lane & (GNND_GROUP - 1)) == 0) myupd += cnt;
        } else {
            for (int q = warp; q < 3 * MAXS; q += nw) {
                const int v = cv[q];
                if (v < 0) continue;
                const int u = q < 2 * MAXS ? sid[q >> 1] : sid[MAXS + q - 2 * MAXS];
                if (group_insert<32, EW>(u, v, cd[q], K, nseg, g_idx, g_dist, locks, lane)) {
                    ++myupd;
                    if (dirty && lane == 0) dirty[u] = 1;
                }
            }
            if (lane != 0) myupd = 0;
        }
    }
    if (basic && lane != 0) myupd = 0;
    if (myupd) atomicAdd(&supd, myupd);
    __syncthreads();
    if (tid == 0 && supd) atomicAdd(updates, (unsigned long long)supd);
}

// ---------------------------------------------------------------------------------------------
// One descent on several devices (knnkit.dask.knn_graph(partition="descent"); GNND section 4 run as
// is, its local joins shared out): every device holds the whole graph, runs the joins of its own
// nodes, and after each iteration the copies (all-gathered) are merged here, segment by segment, into
// the L nearest distinct ids of their union, sorted by (distance, id). Every copy started the
// iteration equal, so a copy differs from the others only by the insertions of its own joins and by
// the sampling of its own rows (sampled NEW entries become OLD in the owner's copy only); an id in
// both copies keeps a's entry, NEW (bit 31) only when both copies have it NEW. One warp per (row,
// segment), segments of at most 32 entries. ``out`` may alias ``a`` or ``b``: a warp reads its
// segment of both before it writes. ``rows`` (optional): b's row u is a copy of a's (and out's)
// row rows[u] (the changed rows only, packed by gnnd_pack_rows); n counts b's rows.
extern "C" __global__ void gnnd_merge_copies(const int* a_idx, const float* a_dist, const int* b_idx,
                                             const float* b_dist, int* out_idx, float* out_dist,
                                             long long n, int K, int nseg, const int* rows) {
    const int lane = threadIdx.x & 31;
    const long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (w >= n * nseg) return;  // warp-uniform
    const long long u = w / nseg;
    const int s = (int)(w - u * nseg);
    const int beg = s * K / nseg, L = (s + 1) * K / nseg - beg;
    const size_t boff = (size_t)u * K + beg;
    const size_t off = (rows ? (size_t)rows[u] : (size_t)u) * K + beg;
    const bool have = lane < L;
    int ai = 0, bi = 0;
    float ad = 0.f, bd = 0.f;
    if (have) { ai = a_idx[off + lane]; ad = a_dist[off + lane]; bi = b_idx[boff + lane]; bd = b_dist[boff + lane]; }
    // a segment no join of the other copy touched (most of them after the first iterations): a as is
    if (__all_sync(GNND_FULL, ai == bi && __float_as_int(ad) == __float_as_int(bd))) {
        if (have && out_idx != a_idx) { out_idx[off + lane] = ai; out_dist[off + lane] = ad; }
        return;
    }
    const int av = ai & GNND_MASK, bv = bi & GNND_MASK;
    bool anew = have && ((unsigned)ai & GNND_NEW) != 0;
    const bool bnew = have && ((unsigned)bi & GNND_NEW) != 0;
    // b's entries that a also holds (lane of the copy in a, or -1)
    int in_a = -1;
    for (int j = 0; j < L; ++j) {
        const int x = __shfl_sync(GNND_FULL, av, j);
        if (have && x == bv) in_a = j;
    }
    const bool bkeep = have && in_a < 0;
    for (int j = 0; j < L; ++j) {  // an entry in both copies is NEW only if NEW in both
        const int f = __shfl_sync(GNND_FULL, in_a, j);
        const bool fn = __shfl_sync(GNND_FULL, bnew, j);
        if (f == lane && !fn) anew = false;
    }
    // ranks in the union: a's entry i has i of a before it and the kept b's smaller than it; b's
    // kept entry j the kept b's before j and the a's smaller than it (ids are distinct: no ties)
    int ra = lane, rb = 0;
    const unsigned kept = __ballot_sync(GNND_FULL, bkeep);
    rb = __popc(kept & lanemask_lt());
    for (int j = 0; j < L; ++j) {
        const float xd = __shfl_sync(GNND_FULL, bd, j), yd = __shfl_sync(GNND_FULL, ad, j);
        const int xv = __shfl_sync(GNND_FULL, bv, j), yv = __shfl_sync(GNND_FULL, av, j);
        if (((kept >> j) & 1u) && pair_less(xd, xv, ad, av)) ++ra;
        if (pair_less(yd, yv, bd, bv)) ++rb;
    }
    __syncwarp();
    if (have && ra < L) {
        out_idx[off + ra] = (int)((unsigned)av | (anew ? GNND_NEW : 0u));
        out_dist[off + ra] = ad;
    }
    if (bkeep && rb < L) {
        out_idx[off + rb] = (int)((unsigned)bv | (bnew ? GNND_NEW : 0u));
        out_dist[off + rb] = bd;
    }
}

// The changed rows of the shared descent in one buffer [ids (m) | idx (m x K) | dist bits (m x K)]:
// rows base + ids[i] of the lists, one warp per row (coalesced along the row).
extern "C" __global__ void gnnd_pack_rows(const int* __restrict__ g_idx, const float* __restrict__ g_dist,
                                          long long base, const int* __restrict__ ids, long long m, int K,
                                          int* __restrict__ buf) {
    const long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= m) return;
    const int r = ids[w];
    const size_t src = (size_t)(base + r) * K, dst = (size_t)w * K;
    int* bi = buf + m;
    int* bd = buf + m + m * (size_t)K;
    if (lane == 0) buf[w] = r;
    for (int j = lane; j < K; j += 32) {
        bi[dst + j] = g_idx[src + j];
        bd[dst + j] = __float_as_int(g_dist[src + j]);
    }
}

// ... and back: row base + ids[i] of the lists = packed row i.
extern "C" __global__ void gnnd_unpack_rows(const int* __restrict__ buf, long long m, int K, long long base,
                                            int* __restrict__ g_idx, float* __restrict__ g_dist) {
    const long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= m) return;
    const size_t dst = (size_t)(base + buf[w]) * K, src = (size_t)w * K;
    const int* bi = buf + m;
    const int* bd = buf + m + m * (size_t)K;
    for (int j = lane; j < K; j += 32) {
        g_idx[dst + j] = bi[src + j];
        g_dist[dst + j] = __int_as_float(bd[src + j]);
    }
}
