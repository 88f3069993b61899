// Sweet KNN kernels: Chen, Ding, Shen, "Sweet KNN: An Efficient KNN on GPU through
// Reconciliation between Redundancy Removal and Regularity" (ICDE 2017).
//   sweet_spread / sweet_pick_landmarks / sweet_assign_lowdim / sweet_member_stats /
//       sweet_cluster_offsets / sweet_cluster_bucket / sweet_cluster_rank: Step 1 (section III-A),
//       landmarks by repeated random sampling, assignment, member distances (float64, stored
//       rounded up) and the member order; sweet_level1: Algorithm 1 (centre distances, UB,
//       candidate clusters), one block per query cluster;
//   sweet_level2<KCAP, MODE>: level-2 point filtering, Algorithm 2 (section III-C), with the
//       elastic filter strength of section IV-B1 (MODE 0 = full filter, a per-worker k-best list
//       whose k-th distance shrinks theta; MODE 1/2 = partial filter: count, then write the
//       survivors of the fixed level-1 bound), the elastic parallelism of IV-B2 (``parts``
//       workers per query, round-robin over its candidate clusters, theta shared through
//       atomicMin), the thread-to-query remapping of IV-C1 (``qseq`` lists the queries grouped by
//       cluster, so a warp's threads walk the same candidate list) and the kNearests placement of
//       IV-C2/IV-D2 (KCAP > 0: a per-thread array the compiler keeps in registers/local memory;
//       KCAP == 0: global memory, slot-major so that a warp's accesses to one slot coalesce).
//   sweet_row_hash / sweet_row_starts / sweet_dup_tables / sweet_expand_unique: repeated rows merged (not in the
//       paper; NOTES_sweet.md, "GPU repeated-row merge"). All-points joins whose rows repeat often
//       run level 2 on the distinct rows only: rows are grouped by a 64-bit hash of their bits
//       (sorted on the host side by CuPy) with an exact comparison of neighbouring rows, a distinct
//       row's k + 1 nearest original rows (self included) are found once, its copies offered to
//       the k-best lists as their own indices, and every original row finally takes its distinct
//       row's list without itself (the same mechanism as the CPU twin's _find_duplicates).
// Exactness: every pruning test is "lower bound > theta + rel * (theta + a + b)" with a slack
// ``rel`` far above the rounding of the quantities involved, so neither a true neighbour nor a
// candidate whose float32 distance ties the k-th one is ever skipped. Reported distances use the
// very arithmetic of topk_pair_distances (exact/topk.cu): 32 lane partial sums combined by the
// butterfly, so they are bit-identical to the GEMM path's.

#define SWEET_NOIDX 0x7fffffff
#define SWEET_INF __int_as_float(0x7f800000)

// The squared distance as topk_pair_distances computes it with one warp: lane c accumulates
// coordinates c, c + 32, ... with fmaf, then the xor-butterfly (16, 8, 4, 2, 1) sums the lanes.
// The explicit _rn intrinsics keep the compiler from contracting a product into a later add.
__device__ __forceinline__ float sweet_sq_dist(const float* __restrict__ q, const float* __restrict__ x, int dim)
{
    float s[32];
#pragma unroll
    for (int c = 0; c < 32; ++c) s[c] = 0.f;
    for (int base = 0; base < dim; base += 32) {
#pragma unroll
        for (int c = 0; c < 32; ++c) {
            if (base + c < dim) {
                const float diff = __fsub_rn(__ldg(q + base + c), __ldg(x + base + c));
                s[c] = __fmaf_rn(diff, diff, s[c]);
            }
        }
    }
    // lane 0's result of the butterfly: ((s0 + s16) + (s8 + s24)) + ... level by level
#pragma unroll
    for (int c = 0; c < 16; ++c) s[c] = __fadd_rn(s[c], s[c + 16]);
#pragma unroll
    for (int c = 0; c < 8; ++c) s[c] = __fadd_rn(s[c], s[c + 8]);
#pragma unroll
    for (int c = 0; c < 4; ++c) s[c] = __fadd_rn(s[c], s[c + 4]);
    s[0] = __fadd_rn(s[0], s[2]);
    s[1] = __fadd_rn(s[1], s[3]);
    return __fadd_rn(s[0], s[1]);
}

__device__ __forceinline__ double sweet_centre_distance(const float* __restrict__ p, const float* __restrict__ c, int dim)
{
    double acc = 0.0;
    for (int j = 0; j < dim; ++j) {
        const double diff = (double)__ldg(p + j) - (double)__ldg(c + j);
        acc = fma(diff, diff, acc);
    }
    return sqrt(acc);
}

// ---------------------------------------------------------------- Step 1: clusters (section III-A)
// The whole phase is a handful of launches and one host sync (NOTES_sweet.md, "GPU clustering
// phase"): all landmark trials scored in one kernel, the winner chosen and gathered on the device,
// assignment, member distances, sizes and radii in two passes, members ordered by a counting
// scatter and a rank inside each cluster instead of a sort of all points.

// Coordinates of a row in registers: D > 0 is the dimension fixed at compile time (the loops
// unroll and p[] stays in registers), D == 0 any dim <= 32 (p[] in local memory).
template <int D>
__device__ __forceinline__ int sweet_dim(int dim) { return D > 0 ? D : dim; }

// Spread of every landmark trial (sum of pairwise Euclidean distances, float64 like the CPU
// twin's _spread): block (b, t) adds, for the landmarks i of its 256-slice of trial t, the
// distances to all landmarks of the trial (both orders, so twice the CPU's triangle sum; the
// argmax is the same). The trial's landmarks stream through shared memory in tiles. One partial
// sum per block, reduced in a fixed order, so the result is deterministic.
#define SWEET_TILE 256
template <int D>
__global__ void sweet_spread(const float* __restrict__ P, const long long* __restrict__ picks, int count, int dim,
                             double* __restrict__ partial)
{
    __shared__ float tile[SWEET_TILE * 32];
    __shared__ double red[SWEET_TILE];
    const int nd = sweet_dim<D>(dim);
    const long long* pk = picks + (long long)blockIdx.y * count;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const bool active = i < count;
    float p[D > 0 ? D : 32];
#pragma unroll
    for (int c = 0; c < (D > 0 ? D : 32); ++c) p[c] = 0.f;
    if (active) {
        const float* row = P + pk[i] * nd;
        for (int c = 0; c < nd; ++c) p[c] = row[c];
    }
    double acc = 0.0;
    for (int t0 = 0; t0 < count; t0 += SWEET_TILE) {
        const int m = min(SWEET_TILE, count - t0);
        __syncthreads();
        for (int e = threadIdx.x; e < m * nd; e += blockDim.x) {
            const int r = e / nd;
            tile[e] = P[pk[t0 + r] * nd + (e - r * nd)];
        }
        __syncthreads();
        if (active) {
            for (int j = 0; j < m; ++j) {
                double s = 0.0;
                for (int c = 0; c < nd; ++c) {
                    const double diff = (double)p[c] - (double)tile[j * nd + c];
                    s = fma(diff, diff, s);
                }
                acc += sqrt(s);
            }
        }
    }
    red[threadIdx.x] = acc;
    __syncthreads();
    for (int h = SWEET_TILE / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h) red[threadIdx.x] += red[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[(long long)blockIdx.y * gridDim.x + blockIdx.x] = red[0];
}

// The trial with the largest spread (the first of equal ones, as np.argmax) and its landmark rows
// gathered into L (count x dim). Every block finds the winner itself (trials * nblk additions,
// L2-resident) and copies its share of L: no host round trip between the trials and the gather.
// nblk == 0: one trial, nothing to compare.
extern "C" __global__ void sweet_pick_landmarks(const float* __restrict__ P, const long long* __restrict__ picks,
                                                const double* __restrict__ partial, int nblk, int trials,
                                                int count, int dim, float* __restrict__ L)
{
    __shared__ int best;
    if (threadIdx.x == 0) {
        int b = 0;
        double bs = 0.0;
        for (int t = 0; t < (nblk > 0 ? trials : 1); ++t) {
            double s = 0.0;
            for (int k = 0; k < nblk; ++k) s += partial[(long long)t * nblk + k];
            if (t == 0 || s > bs) { bs = s; b = t; }
        }
        best = b;
    }
    __syncthreads();
    const long long* pk = picks + (long long)best * count;
    const long long total = (long long)count * dim;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        const long long r = e / dim;
        L[e] = P[pk[r] * dim + (e - r * dim)];
    }
}

// Step 1's assignment for low dimensions: each thread keeps its point's nearest landmark while
// the block streams the landmarks through shared memory in tiles. For d <= 32 this replaces a
// GEMM of inner dimension d, whose (n x landmarks) output is pure memory traffic. Ties go to the
// smaller landmark index (as argmin); the float32 sum is a fmaf chain in coordinate order for
// every D, so the labels do not depend on the instantiation. The assignment only has to be good,
// not exact: every bound uses the exact distance to the landmark actually assigned.
template <int D>
__global__ void sweet_assign_lowdim(const float* __restrict__ P, const float* __restrict__ L,
                                    long long n, int count, int dim, int* __restrict__ labels)
{
    __shared__ float tile[SWEET_TILE * 32];
    const int nd = sweet_dim<D>(dim);
    float p[D > 0 ? D : 32];
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const bool active = i < n;
#pragma unroll
    for (int c = 0; c < (D > 0 ? D : 32); ++c) p[c] = 0.f;
    if (active) {
        for (int c = 0; c < nd; ++c) p[c] = P[i * nd + c];
    }
    float best = SWEET_INF;
    int best_j = 0;
    for (int t0 = 0; t0 < count; t0 += SWEET_TILE) {
        const int m = min(SWEET_TILE, count - t0);
        __syncthreads();
        for (int e = threadIdx.x; e < m * nd; e += blockDim.x) tile[e] = L[(long long)t0 * nd + e];
        __syncthreads();
        if (active) {
            for (int j = 0; j < m; ++j) {
                float s = 0.f;
                for (int c = 0; c < nd; ++c) {
                    const float diff = __fsub_rn(p[c], tile[j * nd + c]);
                    s = __fmaf_rn(diff, diff, s);
                }
                if (s < best) { best = s; best_j = t0 + j; }
            }
        }
    }
    if (active) labels[i] = best_j;
}

// Per point: the exact (float64) distance to its landmark, stored as float32 rounded *up*
// (__double2float_ru is the smallest float >= the value: only loosens bounds), the cluster sizes
// (atomicAdd) and radii (atomicMax on the bits: non-negative floats order like their bit
// patterns). size and radius must be zero on entry.
extern "C" __global__ void sweet_member_stats(const float* __restrict__ P, const float* __restrict__ L,
                                              const int* __restrict__ labels, long long n, int dim,
                                              float* __restrict__ dist, unsigned long long* __restrict__ size,
                                              int* __restrict__ radius_bits)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int c = labels[i];
        const float d = __double2float_ru(sweet_centre_distance(P + i * dim, L + (long long)c * dim, dim));
        dist[i] = d;
        atomicAdd(size + c, 1ull);
        atomicMax(radius_bits + c, __float_as_int(d));
    }
}

// One block of 1024 threads: off = exclusive prefix sum of size (count + 1 entries), fill = a copy
// of off[0 .. count) (the scatter's cursors), info[0] = sum of size^2 (the rank pass's work).
#define SWEET_SCAN_THREADS 1024
extern "C" __global__ void sweet_cluster_offsets(const long long* __restrict__ size, int count,
                                                 long long* __restrict__ off, unsigned long long* __restrict__ fill,
                                                 unsigned long long* __restrict__ info)
{
    __shared__ long long part[SWEET_SCAN_THREADS];
    __shared__ unsigned long long sq;
    const int per = (count + SWEET_SCAN_THREADS - 1) / SWEET_SCAN_THREADS;
    const int lo = min(count, (int)threadIdx.x * per), hi = min(count, lo + per);
    long long s = 0;
    unsigned long long s2 = 0;
    for (int c = lo; c < hi; ++c) { s += size[c]; s2 += (unsigned long long)size[c] * (unsigned long long)size[c]; }
    if (threadIdx.x == 0) sq = 0;
    part[threadIdx.x] = s;
    __syncthreads();
    atomicAdd(&sq, s2);
    // inclusive Hillis-Steele scan of the per-thread sums
    for (int h = 1; h < SWEET_SCAN_THREADS; h <<= 1) {
        const long long v = threadIdx.x >= h ? part[threadIdx.x - h] : 0;
        __syncthreads();
        part[threadIdx.x] += v;
        __syncthreads();
    }
    long long run = part[threadIdx.x] - s;  // exclusive
    for (int c = lo; c < hi; ++c) { off[c] = run; fill[c] = (unsigned long long)run; run += size[c]; }
    if (threadIdx.x == SWEET_SCAN_THREADS - 1) { off[count] = part[threadIdx.x]; info[0] = sq; }
}

// Counting scatter: every point to a free slot of its cluster (slot order inside a cluster is
// arbitrary; sweet_cluster_rank fixes it). key = (distance bits << 32) | ~index: descending key is
// descending distance, then ascending index.
extern "C" __global__ void sweet_cluster_bucket(const int* __restrict__ labels, const float* __restrict__ dist,
                                                long long n, unsigned long long* __restrict__ fill,
                                                unsigned long long* __restrict__ keys)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const unsigned long long pos = atomicAdd(fill + labels[i], 1ull);
        keys[pos] = ((unsigned long long)__float_as_uint(dist[i]) << 32) | (unsigned long long)(0xFFFFFFFFu - (unsigned int)i);
    }
}

// The member order of Step 1: slot s of cluster c goes to position off[c] + (number of keys of c
// larger than its own), i.e. descending distance, equal distances by ascending index: the order
// of the former stable sort of (cluster, ~distance bits). Work sum(size^2); the threads of a warp
// that share a cluster read the same key at each step (one broadcast load).
extern "C" __global__ void sweet_cluster_rank(const unsigned long long* __restrict__ keys,
                                              const int* __restrict__ labels, const long long* __restrict__ off,
                                              long long n, int* __restrict__ order, float* __restrict__ mdist)
{
    for (long long s = (long long)blockIdx.x * blockDim.x + threadIdx.x; s < n; s += (long long)gridDim.x * blockDim.x) {
        const unsigned long long key = keys[s];
        const int i = (int)(0xFFFFFFFFu - (unsigned int)(key & 0xFFFFFFFFull));
        const int c = labels[i];
        const long long beg = off[c], end = off[c + 1];
        long long r = 0;
        for (long long t = beg; t < end; ++t) r += keys[t] > key;
        order[beg + r] = i;
        mdist[beg + r] = __uint_as_float((unsigned int)(key >> 32));
    }
}

// ---------------------------------------------------------------- level 1 (Algorithm 1) in one kernel
// One block per query cluster (row of the centre-distance table) does all of level 1 for it: the
// row D(cq, .) (float64, sweet_centre_distance, the arithmetic the former sweet_centre_dist table had), its order by (distance, index) (the
// stable argsort the CuPy version used, as a bitonic sort of cluster indices), UB = the k_eff-th
// smallest of (rq + D) + r_t(i) pooled over the members closest to the `near` nearest data
// centres (all clusters when those hold fewer than k_eff points), and the candidate clusters in
// that order, written to row cq of a padded (mq x mt) table with their count and their points.
// Replaces ~55 CuPy launches, two Thrust sorts and three host syncs (NOTES_sweet.md, "GPU level 1
// in fewer launches"). IdxT = unsigned short: row and order in shared memory (mt <= ~4096);
// IdxT = int: in the global scratch Dg / Ig (one slice per block of the launch), any mt.
#define SWEET_L1_REG 8

// Block-wide sum (blockDim a multiple of 32, every thread calls it). Two buffers used
// alternately: a thread can only overwrite a buffer again after the next call's barrier, which
// every thread reaches only after reading this call's sums, so one barrier per call suffices.
__device__ __forceinline__ unsigned long long sweet_block_sum(unsigned long long v, unsigned long long* buf,
                                                              int& parity)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    unsigned long long* b = buf + parity * 32;
    if ((threadIdx.x & 31) == 0) b[threadIdx.x >> 5] = v;
    __syncthreads();
    unsigned long long s = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) s += b[w];
    parity ^= 1;
    return s;
}

// (D[x], x) < (D[y], y); positions >= mt (the padding up to a power of two) after all clusters
template <typename IdxT>
__device__ __forceinline__ bool sweet_l1_less(const double* sD, int mt, IdxT x, IdxT y)
{
    const int a = (int)x, b = (int)y;
    if (a >= mt || b >= mt) return a < b;
    const double da = sD[a], db = sD[b];
    return da < db || (da == db && a < b);
}

// Element e of the pool: list j = e / k_eff (cluster sI[j] of the sorted row, or cluster j),
// member t = e % k_eff counted from the centre; (rq + D) + r is the CuPy version's evaluation
// order, so the values, and hence the k-th, are bit-identical. Missing members are +inf.
template <typename IdxT>
__device__ __forceinline__ double sweet_l1_pool(long long e, int k_eff, const double* sD, const IdxT* sI,
                                                bool sorted, double rqa, const long long* __restrict__ tsize,
                                                const long long* __restrict__ toff, const float* __restrict__ tdist)
{
    const int j = (int)(e / k_eff);
    const int t = (int)(e - (long long)j * k_eff);
    const int c = sorted ? (int)sI[j] : j;
    if (t >= tsize[c]) return (double)SWEET_INF;
    return (rqa + sD[c]) + (double)tdist[toff[c + 1] - 1 - t];
}

// The k_eff-th smallest pool value over nl lists: bisection on the bit pattern (non-negative
// doubles order like their bits), the smallest pattern with at least k_eff values <= it, which is
// the k-th value itself (what the CuPy version read from a sorted pool). ~63 rounds of a count
// (the first SWEET_L1_REG * blockDim values cached in registers, the rest re-read, L1-resident)
// and one block sum: no pool array, any k. +inf when fewer than k_eff values are finite.
template <typename IdxT>
__device__ double sweet_l1_kth(int nl, bool sorted, int k_eff, const double* sD, const IdxT* sI, double rqa,
                               const long long* __restrict__ tsize, const long long* __restrict__ toff,
                               const float* __restrict__ tdist, unsigned long long* buf, int& parity)
{
    const long long total = (long long)nl * k_eff;
    const int tid = threadIdx.x, nt = blockDim.x;
    double reg[SWEET_L1_REG];
    unsigned long long cnt = 0;
#pragma unroll
    for (int r = 0; r < SWEET_L1_REG; ++r) {
        const long long e = tid + (long long)r * nt;
        reg[r] = e < total ? sweet_l1_pool(e, k_eff, sD, sI, sorted, rqa, tsize, toff, tdist) : (double)SWEET_INF;
        cnt += reg[r] < (double)SWEET_INF;
    }
    for (long long e = tid + (long long)SWEET_L1_REG * nt; e < total; e += nt)
        cnt += sweet_l1_pool(e, k_eff, sD, sI, sorted, rqa, tsize, toff, tdist) < (double)SWEET_INF;
    if (sweet_block_sum(cnt, buf, parity) < (unsigned long long)k_eff) return (double)SWEET_INF;
    unsigned long long lo = 0, hi = 0x7FF0000000000000ull;  // count(<= +inf) >= k_eff holds
    while (lo < hi) {  // block-uniform: every thread sees the same sums
        const unsigned long long mid = lo + ((hi - lo) >> 1);
        const double v = __longlong_as_double((long long)mid);
        cnt = 0;
#pragma unroll
        for (int r = 0; r < SWEET_L1_REG; ++r) cnt += reg[r] <= v;
        for (long long e = tid + (long long)SWEET_L1_REG * nt; e < total; e += nt)
            cnt += sweet_l1_pool(e, k_eff, sD, sI, sorted, rqa, tsize, toff, tdist) <= v;
        if (sweet_block_sum(cnt, buf, parity) >= (unsigned long long)k_eff) hi = mid; else lo = mid + 1;
    }
    return __longlong_as_double((long long)hi);
}

// Grid: one block per row row0 + blockIdx.x (< mq). Shared variant: dynamic shared memory of
// 8 mt + 2 p2 bytes. p2 = the power of two >= mt the bitonic sort works on.
// Outputs per row: ub (0 for an empty query cluster, as before), cand[row * mt + j] (j < ncand),
// ncand, rowpairs = points in the candidate clusters (level-1 pairs per query of the row).
template <typename IdxT>
__global__ void __launch_bounds__(256, 4) sweet_level1(const float* __restrict__ Lq, const float* __restrict__ Lt, int mq, int mt, int dim,
                             int row0, const float* __restrict__ rq_f, const long long* __restrict__ qsize,
                             const float* __restrict__ Rt_f, const long long* __restrict__ tsize,
                             const long long* __restrict__ toff, const float* __restrict__ tdist, int k_eff,
                             int near, double rel, int p2, double* __restrict__ Dg, int* __restrict__ Ig,
                             double* __restrict__ ub_out, int* __restrict__ cand, int* __restrict__ ncand,
                             long long* __restrict__ rowpairs)
{
    extern __shared__ double sweet_l1_smem[];
    __shared__ unsigned long long buf[64];
    __shared__ int wcount[2][32];
    const int row = row0 + blockIdx.x;
    if (row >= mq) return;  // whole block
    double* sD;
    IdxT* sI;
    if (sizeof(IdxT) == 2) {
        sD = sweet_l1_smem;
        sI = (IdxT*)(sweet_l1_smem + mt);
    } else {
        sD = Dg + (long long)blockIdx.x * mt;
        sI = (IdxT*)(Ig + (long long)blockIdx.x * p2);
    }
    const int tid = threadIdx.x, nt = blockDim.x;
    int parity = 0;
    const float* lq = Lq + (long long)row * dim;
    for (int c = tid; c < mt; c += nt) sD[c] = sweet_centre_distance(lq, Lt + (long long)c * dim, dim);
    for (int p = tid; p < p2; p += nt) sI[p] = (IdxT)p;
    __syncthreads();
    // bitonic sort of the cluster indices by (D, index): ties by the smaller index, as the stable sort
    for (int size = 2; size <= p2; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < p2; i += nt) {
                const int j = i ^ stride;
                if (j > i) {
                    const IdxT x = sI[i], y = sI[j];
                    const bool up = (i & size) == 0;
                    if (up ? sweet_l1_less(sD, mt, y, x) : sweet_l1_less(sD, mt, x, y)) { sI[i] = y; sI[j] = x; }
                }
            }
            __syncthreads();
        }
    }
    const double rqa = (double)rq_f[row];
    double u = sweet_l1_kth(near, true, k_eff, sD, sI, rqa, tsize, toff, tdist, buf, parity);
    // the nearest clusters hold fewer than k_eff points: pool over all of them (order irrelevant)
    if (u == (double)SWEET_INF && near < mt) u = sweet_l1_kth(mt, false, k_eff, sD, sI, rqa, tsize, toff, tdist, buf, parity);
    if (qsize[row] <= 0) u = 0.0;
    if (tid == 0) ub_out[row] = u;
    // candidates in sorted order: an ordered compaction, blockDim positions at a time. The test is
    // the CuPy version's, operation by operation (_rn: nothing contracted into an fma).
    const long long out0 = (long long)row * mt;
    const int lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
    int written = 0, wp = 0;
    long long pts = 0;
    for (int p0 = 0; p0 < mt; p0 += nt) {
        const int p = p0 + tid;
        bool keep = false;
        int c = 0;
        if (p < mt) {
            c = (int)sI[p];
            const double Dc = sD[c], R = (double)Rt_f[c];
            const double lb = __dsub_rn(__dsub_rn(Dc, rqa), R);
            const double slack = __dadd_rn(__dadd_rn(__dadd_rn(u, Dc), rqa), R);
            keep = !(lb > __dadd_rn(u, __dmul_rn(rel, slack))) && tsize[c] > 0;
        }
        const unsigned int bal = __ballot_sync(0xffffffffu, keep);
        if (lane == 0) wcount[wp][warp] = __popc(bal);
        __syncthreads();
        int before = 0, all = 0;
        for (int w = 0; w < nw; ++w) {
            const int v = wcount[wp][w];
            before += w < warp ? v : 0;
            all += v;
        }
        if (keep) {
            cand[out0 + written + before + __popc(bal & ((1u << lane) - 1u))] = c;
            pts += tsize[c];
        }
        written += all;
        wp ^= 1;  // the next chunk writes the other buffer (same argument as sweet_block_sum)
    }
    const unsigned long long tot = sweet_block_sum((unsigned long long)pts, buf, parity);
    if (tid == 0) {
        ncand[row] = written;
        rowpairs[row] = (long long)tot;
    }
}

template __global__ void sweet_level1<unsigned short>(const float*, const float*, int, int, int, int, const float*,
    const long long*, const float*, const long long*, const long long*, const float*, int, int, double, int, double*,
    int*, double*, int*, int*, long long*);
template __global__ void sweet_level1<int>(const float*, const float*, int, int, int, int, const float*,
    const long long*, const float*, const long long*, const long long*, const float*, int, int, double, int, double*,
    int*, double*, int*, int*, long long*);

// (d1, i1) < (d2, i2) lexicographically: the order of the final lists
__device__ __forceinline__ bool sweet_less(float d1, int i1, float d2, int i2)
{
    return d1 < d2 || (d1 == d2 && i1 < i2);
}

// replace the root of the max-heap (largest (d, i) on top) and sift down; slot t at t * stride
__device__ __forceinline__ void sweet_heap_replace_top(float* hd, int* hi, long long stride, int k, float d, int ix)
{
    int pos = 0;
    while (true) {
        int c = 2 * pos + 1;
        if (c >= k) break;
        float dc = hd[c * stride];
        int ic = hi[c * stride];
        if (c + 1 < k) {
            const float dr = hd[(c + 1) * stride];
            const int ir = hi[(c + 1) * stride];
            if (sweet_less(dc, ic, dr, ir)) { ++c; dc = dr; ic = ir; }
        }
        if (!sweet_less(d, ix, dc, ic)) break;
        hd[pos * stride] = dc;
        hi[pos * stride] = ic;
        pos = c;
    }
    hd[pos * stride] = d;
    hi[pos * stride] = ix;
}

// Offer point t at squared distance d to the max-heap of k entries (slot u at u * hs). With dup,
// t is a distinct row standing for the original rows uidx[uoff[t] .. uoff[t + 1]) (ascending):
// each copy is offered as its own index and the first refused ends the loop, since the later
// copies tie on d with larger indices, so ties still go to the smaller original index.
// True when anything entered the heap.
__device__ __forceinline__ bool sweet_offer(float* hd, int* hi, long long hs, int k, float d, int t, int dup,
                                            const long long* __restrict__ uoff, const int* __restrict__ uidx)
{
    if (!dup) {
        if (!sweet_less(d, t, hd[0], hi[0])) return false;
        sweet_heap_replace_top(hd, hi, hs, k, d, t);
        return true;
    }
    if (d > hd[0]) return false;  // most candidates: refused before the copy tables are read
    bool took = false;
    for (long long r = uoff[t]; r < uoff[t + 1]; ++r) {
        const int o = uidx[r];
        if (!sweet_less(d, o, hd[0], hi[0])) break;
        sweet_heap_replace_top(hd, hi, hs, k, d, o);
        took = true;
    }
    return took;
}

// One thread = one (query, part) task; task = p * parts + s works for query qseq[p] on the
// candidate clusters s, s + parts, ... of the query's cluster (Algorithm 2 lines 5-20).
// Xs holds the data rows in member order (Xs[i] = X[members[i]]): a cluster's rows are contiguous.
//   MODE 0 (full): heap in registers/local (KCAP > 0) or in heap_d/heap_i (KCAP == 0); the final
//       heap goes to heap_d/heap_i[slot * ntask + task] (unsorted; the host sorts and merges).
//   MODE 1 (partial, count): counts[task] = keys to write for the survivors of the fixed bound.
//   MODE 2 (partial, write): survivors as (float bits << 32 | index) keys from surv[woff[task]];
//       counts[task] = distances computed.
// dup (all-points join on distinct rows, see sweet_offer): members[] are distinct rows, the lists
// hold original indices; the partial filter writes one key per copy, at most k per survivor (the
// (k+1)-th copy of one point can never beat the first k, which tie with it at smaller indices).
template <int KCAP, int MODE>
__global__ void sweet_level2(const float* __restrict__ Xs, const float* __restrict__ Q, const float* __restrict__ Lt,
                             int dim, const int* __restrict__ members, const float* __restrict__ mdist,
                             const long long* __restrict__ moff, const float* __restrict__ Rt,
                             const int* __restrict__ qseq, int nq, const int* __restrict__ qlab,
                             const double* __restrict__ ub, const int* __restrict__ ncand, long long cstride,
                             const int* __restrict__ cand, int k, int parts, int exclude_self, double rel,
                             float* __restrict__ theta_shared, float* __restrict__ heap_d, int* __restrict__ heap_i,
                             unsigned long long* __restrict__ surv, const long long* __restrict__ woff,
                             long long* __restrict__ counts, int dup, const long long* __restrict__ uoff,
                             const int* __restrict__ uidx, int direct, float* __restrict__ out_d,
                             long long* __restrict__ out_i)
{
    const long long ntask = (long long)nq * parts;
    const long long task = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (task >= ntask) return;
    const int p = (int)(task / parts);
    const int s = (int)(task - (long long)p * parts);
    const int qi = qseq[p];
    const float* q = Q + (long long)qi * dim;
    const int cq = qlab[qi];
    double theta = ub[cq];

    float local_d[KCAP > 0 ? KCAP : 1];
    int local_i[KCAP > 0 ? KCAP : 1];
    float* hd;
    int* hi;
    long long hs;
    if (KCAP > 0) { hd = local_d; hi = local_i; hs = 1; }
    else { hd = heap_d + task; hi = heap_i + task; hs = ntask; }
    if (MODE == 0) {
        for (int t = 0; t < k; ++t) { hd[t * hs] = SWEET_INF; hi[t * hs] = SWEET_NOIDX; }
    }
    long long w = 0, wend = 0;
    if (MODE == 2) { w = woff[task]; wend = woff[task + 1]; }
    long long ndist = 0, nwrite = 0;

    // candidate clusters of cq: row cq of the padded table (sweet_level1), ncand[cq] entries
    const long long cbeg = (long long)cq * cstride, cend = cbeg + ncand[cq];
    for (long long j = cbeg + s; j < cend; j += parts) {
        const int c = cand[j];
        if (MODE == 0 && parts > 1) {
            const double shared = (double)theta_shared[p];
            if (shared < theta) theta = shared;
        }
        const double a = sweet_centre_distance(q, Lt + (long long)c * dim, dim);
        const double rc = (double)Rt[c];
        double thr = theta + rel * (theta + a + rc);
        if (a - rc > thr) continue;  // even the farthest member is too close to the centre
        const long long beg = moff[c], end = moff[c + 1];
        if (MODE == 0) {
            // Outward from the members at the query's own centre distance: the one-landmark
            // bound |a - b| grows on both sides of that position, so the closest candidates come
            // first, theta shrinks early, and each side stops at its first member past the bound.
            long long up = end, down;
            {
                long long lo = beg;
                while (lo < up) {
                    const long long mid = (lo + up) >> 1;
                    if ((double)mdist[mid] > a) lo = mid + 1; else up = mid;
                }
                down = lo;
                up = lo - 1;
            }
            while (true) {
                // both sides exhausted: the gap tests below cannot stop the loop when theta is
                // still infinite (merged rows: fewer distinct rows than k + 1 make UB infinite)
                if (up < beg && down >= end) break;
                const double gu = up >= beg ? (double)mdist[up] - a : (double)SWEET_INF;
                const double gd = down < end ? a - (double)mdist[down] : (double)SWEET_INF;
                long long i;
                if (gu <= gd) {
                    if (gu > thr) break;  // the other side is at least as far
                    i = up--;
                } else {
                    if (gd > thr) break;
                    i = down++;
                }
                const int t = members[i];
                if (exclude_self && t == qi) continue;
                const float d = sweet_sq_dist(q, Xs + i * dim, dim);
                ++ndist;
                if (sweet_offer(hd, hi, hs, k, d, t, dup, uoff, uidx)) {
                    const float top = hd[0];
                    if (top < SWEET_INF) {  // k real entries: the k-th distance bounds the answer
                        const double th = sqrt((double)top);
                        if (th < theta) {
                            theta = th;
                            thr = theta + rel * (theta + a + rc);
                            if (parts > 1)  // non-negative floats order like their bit patterns
                                atomicMin((int*)(theta_shared + p), __float_as_int(__double2float_ru(theta)));
                        }
                    }
                }
            }
            continue;
        }
        // partial filter (theta fixed): members are in descending distance to the centre, so
        // one binary search skips those too far outside and the loop breaks at the first one
        // too far inside
        long long lo = beg;
        {
            const double limit = a + thr;
            long long h = end;
            while (lo < h) {
                const long long mid = (lo + h) >> 1;
                if ((double)mdist[mid] > limit) lo = mid + 1; else h = mid;
            }
        }
        for (long long i = lo; i < end; ++i) {
            const double b = (double)mdist[i];
            if (a - b > thr) break;
            if (b - a > thr) continue;
            const int t = members[i];
            if (exclude_self && t == qi) continue;
            const long long r0 = dup ? uoff[t] : 0;
            long long r1 = 1;  // copies worth writing: at most k of one point
            if (dup) r1 = uoff[t + 1] < r0 + k ? uoff[t + 1] : r0 + k;
            if (MODE == 1) { nwrite += r1 - r0; continue; }
            const float d = sweet_sq_dist(q, Xs + i * dim, dim);
            ++ndist;
            const unsigned long long key = (unsigned long long)__float_as_uint(d) << 32;
            if (!dup) {
                if (w < wend) surv[w++] = key | (unsigned int)t;
                continue;
            }
            for (long long r = r0; r < r1 && w < wend; ++r) surv[w++] = key | (unsigned int)uidx[r];
        }
    }
    counts[task] = MODE == 1 ? nwrite : ndist;
    if (MODE == 0 && direct) {
        // one worker per query (parts == 1): the heap is the answer. Sorted here by heapsort (the
        // max goes to the end, the rest sifts down) into ascending (distance, index), the order
        // the host's key sort gave, and written to the query's output row: no key arrays, no
        // segmented sort of nq * k keys, no scatter.
        for (int kk = k; kk > 1; --kk) {
            const float d0 = hd[0];
            const int i0 = hi[0];
            const float dl = hd[(kk - 1) * hs];
            const int il = hi[(kk - 1) * hs];
            hd[(kk - 1) * hs] = d0;
            hi[(kk - 1) * hs] = i0;
            sweet_heap_replace_top(hd, hi, hs, kk - 1, dl, il);
        }
        for (int t = 0; t < k; ++t) {
            out_d[(long long)qi * k + t] = hd[t * hs];
            out_i[(long long)qi * k + t] = (long long)hi[t * hs];
        }
        return;
    }
    if (MODE == 0 && KCAP > 0) {
        for (int t = 0; t < k; ++t) { heap_d[t * ntask + task] = hd[t]; heap_i[t * ntask + task] = hi[t]; }
    }
}

// explicit instantiations (NVRTC name expressions list the same set)
template __global__ void sweet_level2<32, 0>(const float*, const float*, const float*, int, const int*, const float*,
    const long long*, const float*, const int*, int, const int*, const double*, const int*, long long, const int*, int,
    int, int, double, float*, float*, int*, unsigned long long*, const long long*, long long*, int, const long long*,
    const int*, int, float*, long long*);
template __global__ void sweet_level2<128, 0>(const float*, const float*, const float*, int, const int*, const float*,
    const long long*, const float*, const int*, int, const int*, const double*, const int*, long long, const int*, int,
    int, int, double, float*, float*, int*, unsigned long long*, const long long*, long long*, int, const long long*,
    const int*, int, float*, long long*);
template __global__ void sweet_level2<0, 0>(const float*, const float*, const float*, int, const int*, const float*,
    const long long*, const float*, const int*, int, const int*, const double*, const int*, long long, const int*, int,
    int, int, double, float*, float*, int*, unsigned long long*, const long long*, long long*, int, const long long*,
    const int*, int, float*, long long*);
template __global__ void sweet_level2<1, 1>(const float*, const float*, const float*, int, const int*, const float*,
    const long long*, const float*, const int*, int, const int*, const double*, const int*, long long, const int*, int,
    int, int, double, float*, float*, int*, unsigned long long*, const long long*, long long*, int, const long long*,
    const int*, int, float*, long long*);
template __global__ void sweet_level2<1, 2>(const float*, const float*, const float*, int, const int*, const float*,
    const long long*, const float*, const int*, int, const int*, const double*, const int*, long long, const int*, int,
    int, int, double, float*, float*, int*, unsigned long long*, const long long*, long long*, int, const long long*,
    const int*, int, float*, long long*);

// Step 1 instantiations: dimensions 1-3 fixed (registers, unrolled), 0 = any dim <= 32
template __global__ void sweet_spread<0>(const float*, const long long*, int, int, double*);
template __global__ void sweet_spread<1>(const float*, const long long*, int, int, double*);
template __global__ void sweet_spread<2>(const float*, const long long*, int, int, double*);
template __global__ void sweet_spread<3>(const float*, const long long*, int, int, double*);
template __global__ void sweet_assign_lowdim<0>(const float*, const float*, long long, int, int, int*);
template __global__ void sweet_assign_lowdim<1>(const float*, const float*, long long, int, int, int*);
template __global__ void sweet_assign_lowdim<2>(const float*, const float*, long long, int, int, int*);
template __global__ void sweet_assign_lowdim<3>(const float*, const float*, long long, int, int, int*);

// ---------------------------------------------------------------- repeated rows (all-points join)
// 64-bit hash of each row's float32 bit patterns (equal rows, equal hashes; -0.0 and 0.0 differ,
// which only misses a merge). The host sorts the hashes; equal hashes are then confirmed by
// comparing the rows themselves (sweet_row_starts), so a collision never merges unequal rows.
__device__ __forceinline__ unsigned long long sweet_hash_row(const float* __restrict__ r, int dim)
{
    unsigned long long h = 0x9E3779B97F4A7C15ull ^ (unsigned long long)dim;
    for (int c = 0; c < dim; ++c) {
        h ^= (unsigned long long)__float_as_uint(r[c]);
        h *= 0xFF51AFD7ED558CCDull;
        h ^= h >> 29;
    }
    // final avalanche (the splitmix64 finaliser)
    h ^= h >> 30; h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 27; h *= 0x94D049BB133111EBull;
    h ^= h >> 31;
    return h;
}

extern "C" __global__ void sweet_row_hash(const float* __restrict__ X, long long n, int dim,
                                          unsigned long long* __restrict__ out)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = sweet_hash_row(X + i * dim, dim);
}

// The repeated-row gate's count (_plan.mean_copies) on the device: the number of pairs a < b of
// the sampled rows X[pick[a]], X[pick[b]] with equal bit patterns, the sum of c (c - 1) / 2 over
// the groups the host counted after copying the sample over. One block: the hashes in shared
// memory, every pair's hashes compared, equal hashes confirmed row by row (a collision is not
// counted). s <= SWEET_SAMPLE_MAX; out[0] = the count. ~8 M hash comparisons at s = 4096.
#define SWEET_SAMPLE_MAX 4096
extern "C" __global__ void sweet_sample_pairs(const float* __restrict__ X, const long long* __restrict__ pick,
                                              int s, int dim, unsigned long long* __restrict__ out)
{
    __shared__ unsigned long long hs[SWEET_SAMPLE_MAX];
    __shared__ unsigned long long buf[64];
    int parity = 0;
    for (int a = threadIdx.x; a < s; a += blockDim.x) hs[a] = sweet_hash_row(X + pick[a] * dim, dim);
    __syncthreads();
    unsigned long long cnt = 0;
    for (int a = threadIdx.x; a < s; a += blockDim.x) {
        const unsigned long long h = hs[a];
        const float* ra = X + pick[a] * dim;
        for (int b = a + 1; b < s; ++b) {
            if (hs[b] != h) continue;
            const float* rb = X + pick[b] * dim;
            bool eq = true;
            for (int c = 0; c < dim && eq; ++c) eq = __float_as_uint(ra[c]) == __float_as_uint(rb[c]);
            cnt += eq;
        }
    }
    const unsigned long long tot = sweet_block_sum(cnt, buf, parity);
    if (threadIdx.x == 0) out[0] = tot;
}

// new[p] = 1 where the row at sorted position p starts a group of identical rows: the first
// position, a change of hash, or (a collision) an equal hash with different bits. order[] lists
// the rows by (hash, index), so a group's rows come in ascending index; h is the unsorted hash.
extern "C" __global__ void sweet_row_starts(const float* __restrict__ X, const long long* __restrict__ order,
                                            const unsigned long long* __restrict__ h, long long n, int dim,
                                            int* __restrict__ is_new)
{
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += (long long)gridDim.x * blockDim.x) {
        int fresh = p == 0 || h[order[p]] != h[order[p - 1]];
        if (!fresh) {
            const float* a = X + order[p] * dim;
            const float* b = X + order[p - 1] * dim;
            for (int c = 0; c < dim; ++c) {
                if (__float_as_uint(a[c]) != __float_as_uint(b[c])) { fresh = 1; break; }
            }
        }
        is_new[p] = fresh;
    }
}

// The merge tables from the sorted positions in one pass (group = inclusive prefix sum of is_new,
// so position p is in distinct row group[p] - 1): inv (distinct row of every original row), uidx
// (the original rows group by group, ascending inside a group: order itself, as int32), uoff (start
// of each group, n at the end) and U (the distinct rows, copied from each group's first row).
extern "C" __global__ void sweet_dup_tables(const float* __restrict__ X, const long long* __restrict__ order,
                                            const int* __restrict__ is_new, const long long* __restrict__ group,
                                            long long n, int dim, long long* __restrict__ inv,
                                            long long* __restrict__ uoff, int* __restrict__ uidx,
                                            float* __restrict__ U)
{
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += (long long)gridDim.x * blockDim.x) {
        const long long i = order[p];
        const long long g = group[p] - 1;
        inv[i] = g;
        uidx[p] = (int)i;
        if (is_new[p]) {
            uoff[g] = p;
            for (int c = 0; c < dim; ++c) U[g * dim + c] = X[i * dim + c];
        }
        if (p == n - 1) uoff[g + 1] = n;
    }
}

// Every original row i from its distinct row's list: ud/ui hold, per distinct row, its k + 1
// nearest original rows (self included) by (distance, index); row i takes that list without i
// itself, or without its last entry when i is not in it (i was then a tie past the list: a copy
// with a larger index than k + 1 others).
extern "C" __global__ void sweet_expand_unique(const float* __restrict__ ud, const long long* __restrict__ ui,
                                               const long long* __restrict__ inv, long long n, int k,
                                               float* __restrict__ out_d, long long* __restrict__ out_i)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long u = inv[i];
        const float* rd = ud + u * (k + 1);
        const long long* ri = ui + u * (k + 1);
        int w = 0;
        for (int t = 0; t <= k && w < k; ++t) {
            if (ri[t] == i) continue;
            out_d[i * k + w] = rd[t];
            out_i[i * k + w] = ri[t];
            ++w;
        }
    }
}
