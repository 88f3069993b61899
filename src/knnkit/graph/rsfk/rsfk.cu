// rsfk.cu -- random-sample forest k-NN graph (RSFK) with the warp-centric k-NN set updates of
// Meyer, Pozo & Nunan Zola, "Warp-centric K-Nearest Neighbor Graphs construction on GPU" (ICPP 2021
// workshops, DUAC):
//   "RSFK Tree Construction" (random sample split: the hyperplane equidistant to two random points of
//   the node; or a random projection through the node's median), one tree at a time, level by level
//                                                         -> rsfk_side_sample, rsfk_project, rsfk_partition
//   "KNN Sets Update step", warp-centric: one warp per pair, lanes over dimensions + shuffle reduction,
//   lists kept sorted without heaps or sorting:
//     Atomic approach   (each pair offered to both lists under a per-list lock)   -> rsfk_leaf_atomic
//     Tiles approach    (32x32 tiles of the leaf's upper triangle; row then column
//                        owners, one warp per list, no locks)                      -> rsfk_leaf_tiles
//     Diagonal approach (one diagonal of the upper triangle at a time: distances,
//                        barrier, row lists, barrier, column lists)                -> rsfk_leaf_diagonal
//   "Nearest Neighbor Exploration" (NNE) post-pass: each point checks its neighbours' neighbours
//                                                                                  -> rsfk_nne
// plus rsfk_fill (lists left with holes by very small leaves get arbitrary distinct points).
// Lists: idx (n, K) int32 and dist (n, K) float32, each row sorted by (distance, id), -1 / +inf at the
// end; an id never appears twice in a row. metric 0 = squared L2, 1 = negative inner product.
// NVRTC has no standard headers: only builtins are used.

#define RSFK_FULL 0xffffffffu

__device__ __forceinline__ float rsfk_inf() { return __int_as_float(0x7f800000); }

// splitmix64 finaliser; the CPU twin (_cpu.py) uses the same hash so both build the same trees
// (up to float rounding of the side tests)
__device__ __forceinline__ unsigned long long rsfk_mix(unsigned long long x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__device__ __forceinline__ unsigned long long rsfk_hash(unsigned long long seed, unsigned long long salt,
                                                        unsigned long long tree, unsigned long long level,
                                                        unsigned long long x) {
    const unsigned long long g = 0x9E3779B97F4A7C15ull;
    unsigned long long h = rsfk_mix(seed + g);
    h = rsfk_mix(h + salt + g);
    h = rsfk_mix(h + tree + g);
    h = rsfk_mix(h + level + g);
    return rsfk_mix(h + x + g);
}

__device__ __forceinline__ float rsfk_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(RSFK_FULL, v, o);
    return v;
}

// distance of rows a and b, the warp's lanes striding over the dimensions; every lane gets the result
__device__ __forceinline__ float rsfk_warp_dist(const float* __restrict__ X, int d, int metric, int a, int b,
                                                int lane) {
    const float* xa = X + (long long)a * d;
    const float* xb = X + (long long)b * d;
    float acc = 0.f;
    if (metric == 0) {
        for (int j = lane; j < d; j += 32) { float t = xa[j] - xb[j]; acc += t * t; }
        return rsfk_warp_sum(acc);
    }
    for (int j = lane; j < d; j += 32) acc += xa[j] * xb[j];
    return -rsfk_warp_sum(acc);
}

// Offer (cand, dc) to the sorted list (li, ld of length K) of point `owner`; the whole warp calls it with
// the same arguments, and the warp must be the only writer of the list while it runs (tiles, diagonal,
// NNE, fill: one owner warp per list per phase). Returns 1 when the list changed. Self (cand == owner)
// and cand < 0 are never inserted, whatever the caller passes. The result after any set of offers is the
// top K by (distance, id) of the distinct offered candidates, independent of the order of the offers.
__device__ int rsfk_warp_offer(volatile int* li, volatile float* ld, int K, int owner, int cand, float dc,
                               int lane) {
    if (cand < 0 || cand == owner) return 0;  // warp-uniform
    float wd = ld[K - 1];
    int wi = li[K - 1];
    if (!(dc < wd || (dc == wd && (wi < 0 || cand < wi)))) return 0;
    int before = 0;
    bool dup = false;
    for (int base = 0; base < K; base += 32) {
        int j = base + lane;
        bool in = j < K;
        int e = in ? li[j] : -1;
        float ed = in ? ld[j] : rsfk_inf();
        dup = dup || (in && e == cand);
        bool b = in && e >= 0 && (ed < dc || (ed == dc && e < cand));
        before += __popc(__ballot_sync(RSFK_FULL, b));
    }
    if (__any_sync(RSFK_FULL, dup)) return 0;
    const int pos = before;  // <= K - 1: the last entry orders after (cand, dc)
    // shift [pos, K - 2] up by one, highest 32-entry chunk first so that every read precedes the
    // write of the same slot
    for (int base = ((K - 1) / 32) * 32; base >= 0; base -= 32) {
        int j = base + lane;
        bool mv = j > pos && j < K;
        int e = 0;
        float ed = 0.f;
        if (mv) { e = li[j - 1]; ed = ld[j - 1]; }
        __syncwarp();
        if (mv) { li[j] = e; ld[j] = ed; }
        __syncwarp();
    }
    if (lane == 0) { li[pos] = cand; ld[pos] = dc; }
    __syncwarp();
    return 1;
}

// The same offer done by one thread (the atomic variant: lane 0, inside the list's lock, so that the
// whole check-and-insert is one critical section of one thread -- the plain spinlock pattern).
__device__ int rsfk_thread_offer(volatile int* li, volatile float* ld, int K, int owner, int cand, float dc) {
    if (cand < 0 || cand == owner) return 0;
    const float wd = ld[K - 1];
    const int wi = li[K - 1];
    if (!(dc < wd || (dc == wd && (wi < 0 || cand < wi)))) return 0;
    int pos = 0;
    for (int j = 0; j < K; j++) {
        const int e = li[j];
        if (e == cand) return 0;
        const float ed = ld[j];
        if (e >= 0 && (ed < dc || (ed == dc && e < cand))) pos++;
    }
    for (int j = K - 1; j > pos; j--) { li[j] = li[j - 1]; ld[j] = ld[j - 1]; }
    li[pos] = cand;
    ld[pos] = dc;
    return 1;
}

// ------------------------------------------------------------------------------------------ trees
// Per-position state of one tree: perm[pos] = point id, [seg_lo[pos], seg_hi[pos]) = the node holding
// the position. A node with more than leaf_size points is split at every level.

// Random sample split: side = 0 when the point is nearer pivot a (l2: (x - (a+b)/2).(a - b) > 0; ip: the
// angular version x.(a/|a| - b/|b|) > 0); exact ties go to a random side. One warp per position.
extern "C" __global__ void rsfk_side_sample(const float* __restrict__ X, int n, int d, int metric,
                                            const float* __restrict__ inv_norm, const int* __restrict__ perm,
                                            const int* __restrict__ seg_lo, const int* __restrict__ seg_hi,
                                            int leaf_size, unsigned long long seed, int tree, int level,
                                            int* __restrict__ side) {
    const int lane = threadIdx.x & 31;
    const long long pos = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (pos >= n) return;
    const int lo = seg_lo[pos], m = seg_hi[pos] - lo;
    if (m <= leaf_size) {
        if (lane == 0) side[pos] = 0;
        return;
    }
    unsigned long long r1 = rsfk_hash(seed, 1, tree, level, 2ull * lo);
    unsigned long long r2 = rsfk_hash(seed, 1, tree, level, 2ull * lo + 1);
    int pa = (int)((r1 >> 11) % (unsigned long long)m);
    int pb = (int)((r2 >> 11) % (unsigned long long)(m - 1));
    if (pb >= pa) pb++;
    const int a = perm[lo + pa], b = perm[lo + pb], x = perm[pos];
    const float* xa = X + (long long)a * d;
    const float* xb = X + (long long)b * d;
    const float* xx = X + (long long)x * d;
    float s = 0.f;
    if (metric == 0) {
        for (int j = lane; j < d; j += 32) s += (xx[j] - 0.5f * (xa[j] + xb[j])) * (xa[j] - xb[j]);
    } else {
        const float ia = inv_norm[a], ib = inv_norm[b];
        for (int j = lane; j < d; j += 32) s += xx[j] * (xa[j] * ia - xb[j] * ib);
    }
    s = rsfk_warp_sum(s);
    if (lane == 0) {
        int sd;
        if (s > 0.f) sd = 0;
        else if (s < 0.f) sd = 1;
        else sd = (int)(rsfk_hash(seed, 2, tree, level, (unsigned long long)x) >> 63);
        side[pos] = sd;
    }
}

// Random projection: proj = x . r with r a random +-1 vector per node (bits of a hash of the node);
// the driver sorts each node by proj and splits it at the median. One warp per position.
extern "C" __global__ void rsfk_project(const float* __restrict__ X, int n, int d, const int* __restrict__ perm,
                                        const int* __restrict__ seg_lo, const int* __restrict__ seg_hi,
                                        int leaf_size, unsigned long long seed, int tree, int level,
                                        float* __restrict__ proj) {
    const int lane = threadIdx.x & 31;
    const long long pos = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (pos >= n) return;
    const int lo = seg_lo[pos], m = seg_hi[pos] - lo;
    if (m <= leaf_size) {
        if (lane == 0) proj[pos] = 0.f;
        return;
    }
    const unsigned long long node = rsfk_hash(seed, 3, tree, level, (unsigned long long)lo);
    const float* xx = X + (long long)perm[pos] * d;
    float s = 0.f;
    for (int j = lane; j < d; j += 32) {
        unsigned long long bits = rsfk_mix(node + (unsigned long long)(j >> 6));
        s += ((bits >> (j & 63)) & 1ull) ? xx[j] : -xx[j];
    }
    s = rsfk_warp_sum(s);
    if (lane == 0) proj[pos] = s;
}

// Moves every position of a split node to its child; cum_right = exclusive prefix sum of side (n + 1).
// mode 0 (sample split): left = side 0; a split leaving a child below min_child points is not applied
// (the node is retried at the next level with new pivots); mode 1 (median, after the driver sorted the
// nodes by projection) or force_balanced: halves by position. One thread per position.
extern "C" __global__ void rsfk_partition(int n, const int* __restrict__ perm, const int* __restrict__ seg_lo,
                                          const int* __restrict__ seg_hi, const int* __restrict__ side,
                                          const int* __restrict__ cum_right, int leaf_size, int min_child,
                                          int mode, int force_balanced, int* __restrict__ out_perm,
                                          int* __restrict__ out_lo, int* __restrict__ out_hi) {
    const long long pos = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (pos >= n) return;
    const int lo = seg_lo[pos], hi = seg_hi[pos], m = hi - lo;
    int dest = (int)pos, nlo = lo, nhi = hi;
    if (m > leaf_size) {
        if (mode == 1 || force_balanced) {
            const int mid = lo + m / 2;
            if (pos < mid) nhi = mid; else nlo = mid;
        } else {
            const int nright = cum_right[hi] - cum_right[lo], nleft = m - nright;
            if (nleft >= min_child && nright >= min_child) {
                const int r = cum_right[pos] - cum_right[lo];
                if (side[pos]) { dest = lo + nleft + r; nlo = lo + nleft; }
                else { dest = lo + ((int)pos - lo - r); nhi = lo + nleft; }
            }
        }
    }
    out_perm[dest] = perm[pos];
    out_lo[dest] = nlo;
    out_hi[dest] = nhi;
}

// ------------------------------------------------------------------------------ leaf k-NN updates
// One thread block per leaf (grid-stride over the leaves), one warp per task.

// Atomic approach: warps take the pairs (i < j) of the leaf; each pair goes to list a then list b, each
// under that list's spinlock (one lock held at a time: no deadlock). The warp computes the distance;
// lane 0 alone takes the lock, checks and inserts (rsfk_thread_offer) and releases it, so the critical
// section is one thread's: acquire = atomicCAS + __threadfence, release = __threadfence + atomicExch,
// and every list access inside is volatile (L1 is not coherent across SMs). Lists of one tree are
// touched by one leaf only, but the pairs of a leaf run on all the block's warps at once.
extern "C" __global__ void rsfk_leaf_atomic(const float* __restrict__ X, int d, int metric,
                                            const int* __restrict__ perm, const int* __restrict__ leaf_lo,
                                            const int* __restrict__ leaf_hi, int nleaves, int* idx, float* dist,
                                            int K, int* locks) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int leaf = blockIdx.x; leaf < nleaves; leaf += gridDim.x) {
        const int lo = leaf_lo[leaf], m = leaf_hi[leaf] - lo;
        const long long npairs = (long long)m * m;
        for (long long t = warp; t < npairs; t += nwarps) {
            const int i = (int)(t / m), j = (int)(t % m);
            if (j <= i) continue;  // warp-uniform
            const int a = perm[lo + i], b = perm[lo + j];
            const float dd = rsfk_warp_dist(X, d, metric, a, b, lane);
            if (lane == 0) {
                for (int side = 0; side < 2; side++) {
                    const int owner = side ? b : a, cand = side ? a : b;
                    volatile float* ld = dist + (long long)owner * K;
                    volatile int* li = idx + (long long)owner * K;
                    // the last distance only decreases: an unlocked reject is final
                    if (dd > ld[K - 1]) continue;
                    while (atomicCAS(locks + owner, 0, 1) != 0) { }
                    __threadfence();
                    rsfk_thread_offer(li, ld, K, owner, cand, dd);
                    __threadfence();
                    atomicExch(locks + owner, 0);
                }
            }
            __syncwarp();
        }
    }
}

#define RSFK_TW 32

// Tiles approach: the upper triangle of the leaf's distance matrix in 32x32 tiles; all warps compute a
// tile into shared memory, then each warp owns rows (offers the tile's row to that point's list), then
// columns. A list has one owner per phase, so there are no locks.
extern "C" __global__ void rsfk_leaf_tiles(const float* __restrict__ X, int d, int metric,
                                           const int* __restrict__ perm, const int* __restrict__ leaf_lo,
                                           const int* __restrict__ leaf_hi, int nleaves, int* idx, float* dist,
                                           int K) {
    __shared__ float tile[RSFK_TW][RSFK_TW + 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int leaf = blockIdx.x; leaf < nleaves; leaf += gridDim.x) {
        const int lo = leaf_lo[leaf], m = leaf_hi[leaf] - lo;
        const int nt = (m + RSFK_TW - 1) / RSFK_TW;
        for (int rt = 0; rt < nt; rt++) {
            for (int ct = rt; ct < nt; ct++) {
                for (int c = warp; c < RSFK_TW * RSFK_TW; c += nwarps) {
                    const int r = c / RSFK_TW, cc = c % RSFK_TW;
                    const int i = rt * RSFK_TW + r, j = ct * RSFK_TW + cc;
                    float dd = rsfk_inf();
                    if (i < m && j < m && j > i) dd = rsfk_warp_dist(X, d, metric, perm[lo + i], perm[lo + j], lane);
                    if (lane == 0) tile[r][cc] = dd;
                }
                __syncthreads();
                for (int phase = 0; phase < 2; phase++) {
                    // phase 0: warp owns tile row r (point i), candidates along the row;
                    // phase 1: warp owns tile column r (point j), candidates down the column
                    for (int r = warp; r < RSFK_TW; r += nwarps) {
                        const int own = (phase == 0 ? rt : ct) * RSFK_TW + r;
                        if (own >= m) continue;
                        const int owner = perm[lo + own];
                        const int other = (phase == 0 ? ct : rt) * RSFK_TW + lane;
                        const float dd = phase == 0 ? tile[r][lane] : tile[lane][r];
                        // only the strict upper triangle holds distances (the rest of the tile is +inf
                        // padding): row owners take the points after them, column owners those before.
                        // Offering the padding inserted self and (inf, id) entries, whose id then
                        // rejected the real distance as a duplicate (first GPU run, NOTES_rsfk.md)
                        const bool pair = other < m && (phase == 0 ? other > own : other < own);
                        const int cand = pair ? perm[lo + other] : -1;
                        int* li = idx + (long long)owner * K;
                        float* ld = dist + (long long)owner * K;
                        unsigned mask = __ballot_sync(RSFK_FULL, pair && dd <= ld[K - 1]);
                        while (mask) {
                            const int l = __ffs(mask) - 1;
                            mask &= mask - 1;
                            const float cd = __shfl_sync(RSFK_FULL, dd, l);
                            const int cb = __shfl_sync(RSFK_FULL, cand, l);
                            rsfk_warp_offer(li, ld, K, owner, cb, cd, lane);
                        }
                    }
                    __syncthreads();
                }
            }
        }
    }
}

// Diagonal approach: diagonal o holds the pairs (t, t + o); all warps compute its distances into shared
// memory, then the row lists (points t, all distinct) take them, then the column lists (points t + o).
// Dynamic shared memory: leaf_size floats.
extern "C" __global__ void rsfk_leaf_diagonal(const float* __restrict__ X, int d, int metric,
                                              const int* __restrict__ perm, const int* __restrict__ leaf_lo,
                                              const int* __restrict__ leaf_hi, int nleaves, int* idx, float* dist,
                                              int K) {
    extern __shared__ float diag[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int leaf = blockIdx.x; leaf < nleaves; leaf += gridDim.x) {
        const int lo = leaf_lo[leaf], m = leaf_hi[leaf] - lo;
        for (int o = 1; o < m; o++) {
            const int L = m - o;
            for (int t = warp; t < L; t += nwarps) {
                const float dd = rsfk_warp_dist(X, d, metric, perm[lo + t], perm[lo + t + o], lane);
                if (lane == 0) diag[t] = dd;
            }
            __syncthreads();
            for (int phase = 0; phase < 2; phase++) {
                for (int t = warp; t < L; t += nwarps) {
                    const int owner = perm[lo + t + (phase ? o : 0)];
                    const int cand = perm[lo + t + (phase ? 0 : o)];
                    rsfk_warp_offer(idx + (long long)owner * K, dist + (long long)owner * K, K, owner, cand, diag[t],
                                    lane);
                }
                __syncthreads();
            }
        }
    }
}

// ---------------------------------------------------------------------------------- post-passes

// NNE: warp per point i; candidates are the neighbours of i's neighbours in the snapshot idx_old (so the
// result does not depend on the order in which warps run); only i's own list is written. The snapshot
// has W >= K columns: the lists, then (W > K) sampled reverse neighbours; -1 entries anywhere are skipped.
extern "C" __global__ void rsfk_nne(const float* __restrict__ X, int n, int d, int metric,
                                    const int* __restrict__ idx_old, int W, int* idx, float* dist, int K) {
    const int lane = threadIdx.x & 31;
    const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (i >= n) return;
    int* li = idx + i * K;
    float* ld = dist + i * K;
    for (int a = 0; a < W; a++) {
        const int j = idx_old[i * W + a];
        if (j < 0) continue;  // warp-uniform: every lane reads the same entry
        for (int base = 0; base < W; base += 32) {
            const int c = base + lane < W ? idx_old[(long long)j * W + base + lane] : -1;
            unsigned mask = __ballot_sync(RSFK_FULL, c >= 0 && c != (int)i);
            while (mask) {
                const int l = __ffs(mask) - 1;
                mask &= mask - 1;
                const int cand = __shfl_sync(RSFK_FULL, c, l);
                bool known = false;  // skip the distance when cand is already listed
                for (int q = lane; q < K; q += 32) known = known || li[q] == cand;
                if (__any_sync(RSFK_FULL, known)) continue;
                const float dd = rsfk_warp_dist(X, d, metric, (int)i, cand, lane);
                rsfk_warp_offer(li, ld, K, (int)i, cand, dd, lane);
            }
        }
    }
}

// Lists that still have holes although n - 1 >= K (possible only when leaves are smaller than K + 1)
// are topped up with the points i+1, i+2, ... (mod n): offering 2K distinct points always fills them.
extern "C" __global__ void rsfk_fill(const float* __restrict__ X, int n, int d, int metric, int* idx,
                                     float* dist, int K) {
    const int lane = threadIdx.x & 31;
    const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (i >= n) return;
    int* li = idx + i * K;
    float* ld = dist + i * K;
    const int tries = min(n - 1, 2 * K);
    volatile int* vli = li;
    // loop condition warp-uniform: lane 0's read of the last id (after the offer's __syncwarp) for all
    for (int t = 1; t <= tries && __shfl_sync(RSFK_FULL, vli[K - 1], 0) < 0; t++) {
        const int cand = (int)((i + t) % n);
        const float dd = rsfk_warp_dist(X, d, metric, (int)i, cand, lane);
        rsfk_warp_offer(li, ld, K, (int)i, cand, dd, lane);
    }
}
