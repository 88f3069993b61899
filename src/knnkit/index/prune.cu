// RobustPrune (DiskANN / Vamana, Subramanya et al. 2019, Alg. 2) for every node in parallel, the
// diversification step that turns a k-NN graph into a search graph (GGNN sec. 5.2 does the same job
// with its own rule).  For node v with candidates sorted by distance, candidate c is kept when for
// every already kept p:  alpha * d(p, c) > d(v, c); at most R are kept.
//
// One block per node (grid-stride).  The greedy pass is sequential by nature, so the block first
// computes the whole "p occludes c" relation among the candidates in parallel -- a small
// all-pairs distance tile loop over the gathered candidate vectors (64 x 64 tiles, 4 x 4 per thread,
// d staged through shared memory 32 dims at a time) -- and stores it as a C x C bit matrix; the
// greedy pass is then one AND over C / 32 words per candidate.
//
// Distances among candidates are exact (direct differences, not |a|^2 + |b|^2 - 2ab, so the
// result matches the CPU reference _prune_cpu.py except on near-ties).  The rule, shared with it:
// alpha^2 * (d(p, c) + shift) > d(v, c) + shift on the internal distances; 'l2' (squared, shift 0)
// is Vamana's Euclidean rule, 'ip' uses shift = max |x|^2 so both sides are >= 0 (for unit vectors
// d + shift = |a - b|^2 / 2: the Euclidean rule again).  With `fill`, slots left free are filled
// with the nearest pruned candidates.  `out_d` (optional) receives the distance of every kept edge,
// so the reverse-edge step (Vamana's "add the reverse of every edge") needs no recomputation: the
// internal metrics are symmetric, d(u, v) = d(v, u).
//
// node_ids[v]: the node whose candidates row v holds (the identity for a whole graph; the reverse-edge
// step re-prunes a subset of rows, its hubs, with longer candidate lists).
//
// new_reverse_edges: marks the edges u -> v of a pruned graph whose reverse v -> u is not already in
// v's list (the only ones the reverse-edge step adds); one warp per node u reads each target's row
// coalesced (a thread per edge reading a whole row alone took 153 ms at 1M x 128, H200).
#include "search_common.cuh"

#define PR_TILE 64
#define PR_DK 32

// Slot `at` of the output lists: neighbour `id` at distance `d` (distances only when asked for).
__device__ __forceinline__ void pr_put(int* __restrict__ out, float* __restrict__ out_d, long long at, float d,
                                       int id) {
    if (out_d) out_d[at] = d;
    out[at] = id;
}

// Row v of the candidate lists (node `self`) into shared memory, ready for the greedy pass: ids
// that are invalid, `self`, at an infinite distance, or repeated (the copy of smallest (distance,
// position) kept) dropped; the rest ranked by (distance, id, position) into sd / si; the C x W
// occlusion words zeroed. Every thread of the block calls it; returns M, the candidates kept (in
// *s_m, a __shared__ int), after a __syncthreads.
__device__ __forceinline__ int pr_gather_sorted(const int* __restrict__ cand_idx, const float* __restrict__ cand_dist,
                                                int n, int C, int CP, int W, int v, int self, float* cd, int* ci,
                                                float* sd, int* si, unsigned* occl, int* s_m) {
    const int tid = threadIdx.x;
    if (tid == 0) *s_m = 0;
    for (int j = tid; j < CP; j += blockDim.x) {
        int id = -1;
        float dist = KK_INF;
        if (j < C) {
            id = cand_idx[(long long)v * C + j];
            dist = cand_dist[(long long)v * C + j];
            if (id < 0 || id >= n || id == self || !(dist < KK_INF)) { id = -1; dist = KK_INF; }
        }
        ci[j] = id; cd[j] = dist;
    }
    for (int j = tid; j < CP * W; j += blockDim.x) occl[j] = 0u;
    __syncthreads();
#ifndef PT_SKIP_DUP
    for (int j = tid; j < C; j += blockDim.x) {  // duplicates: keep the smallest (distance, position)
        const int id = ci[j];
        if (id < 0) continue;
        const float dj = cd[j];
        bool dup = false;
#pragma unroll 4
        for (int i = 0; i < C; ++i) {
            const float di = cd[i];
            dup |= (ci[i] == id) & (i != j) & ((di < dj) | ((di == dj) & (i < j)));
        }
        if (dup) ci[j] = -2;  // marked, dropped below (distance kept for the other threads' test)
    }
    __syncthreads();
#endif
    for (int j = tid; j < C; j += blockDim.x) {  // rank in (distance, id, position) order
        const int id = ci[j];
        if (id < 0) continue;
        const float dj = cd[j];
        int r = 0;
#pragma unroll 4
        for (int i = 0; i < C; ++i) {
            const int o = ci[i];
            const float di = cd[i];
            r += (o >= 0) & ((di < dj) | ((di == dj) & ((o < id) | ((o == id) & (i < j)))));
        }
        sd[r] = dj; si[r] = id;
        atomicAdd(s_m, 1);
    }
    __syncthreads();
    return *s_m;
}

template <int METRIC>
__global__ void __launch_bounds__(256) robust_prune(
    const float* __restrict__ X, int n, int d, const int* __restrict__ cand_idx,
    const float* __restrict__ cand_dist, int n_nodes, int C, int CP, int R, float factor, float shift,
    int fill, int* __restrict__ out, float* __restrict__ out_d, const int* __restrict__ node_ids) {
    extern __shared__ float4 smem_raw[];
    __shared__ float A[PR_TILE][PR_DK + 1];
    __shared__ float B[PR_TILE][PR_DK + 1];
    __shared__ int s_m;

    const int W = CP / 32;
    float* cd = reinterpret_cast<float*>(smem_raw);  // input order
    int* ci = reinterpret_cast<int*>(cd + CP);
    float* sd = reinterpret_cast<float*>(ci + CP);   // sorted, valid only
    int* si = reinterpret_cast<int*>(sd + CP);
    unsigned* occl = reinterpret_cast<unsigned*>(si + CP);  // CP rows x W words

    const int tid = threadIdx.x;
    const int tx = tid % 16, ty = tid / 16;

    for (int v = blockIdx.x; v < n_nodes; v += gridDim.x) {
        const int self = node_ids[v];  // row v holds the candidates of node self (a subset of rows)
        const int M = pr_gather_sorted(cand_idx, cand_dist, n, C, CP, W, v, self, cd, ci, sd, si, occl, &s_m);
        const int nt = (M + PR_TILE - 1) / PR_TILE;
        for (int ta = 0; ta < nt; ++ta) {
            for (int tb = 0; tb <= ta; ++tb) {
                float acc[4][4];
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
                for (int k0 = 0; k0 < d; k0 += PR_DK) {
                    for (int t = tid; t < PR_TILE * PR_DK; t += 256) {
                        const int r = t / PR_DK, c = t % PR_DK;
                        const int a = ta * PR_TILE + r, b = tb * PR_TILE + r;
                        const bool inside = k0 + c < d;
                        A[r][c] = (a < M && inside) ? X[(long long)si[a] * d + k0 + c] : 0.f;
                        B[r][c] = (b < M && inside) ? X[(long long)si[b] * d + k0 + c] : 0.f;
                    }
                    __syncthreads();
#pragma unroll 8
                    for (int c = 0; c < PR_DK; ++c) {
                        float av[4], bv[4];
#pragma unroll
                        for (int i = 0; i < 4; ++i) { av[i] = A[ty * 4 + i][c]; bv[i] = B[tx * 4 + i][c]; }
#pragma unroll
                        for (int i = 0; i < 4; ++i)
#pragma unroll
                            for (int j = 0; j < 4; ++j) {
                                if constexpr (METRIC == 0) { const float t = av[i] - bv[j]; acc[i][j] = fmaf(t, t, acc[i][j]); }
                                else acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
                            }
                    }
                    __syncthreads();
                }
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int a = ta * PR_TILE + ty * 4 + i;  // candidate c
                    if (a >= M) continue;
                    const float dvc = sd[a];
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const int b = tb * PR_TILE + tx * 4 + j;  // earlier candidate p
                        if (b >= a) continue;
                        const float dpc = METRIC == 0 ? acc[i][j] : -acc[i][j];
                        if (!(factor * (dpc + shift) > dvc + shift)) atomicOr(&occl[a * W + (b >> 5)], 1u << (b & 31));
                    }
                }
            }
        }
        __syncthreads();
        // Greedy pass in sorted order: keep c unless a kept p occludes it.  The kept set lives in the
        // sorted-position bit mask, reusing the first W words of cd (free now).
        if (tid == 0) {
            unsigned* kept = reinterpret_cast<unsigned*>(cd);
            for (int w = 0; w < W; ++w) kept[w] = 0u;
            int nk = 0;
            for (int c = 0; c < M && nk < R; ++c) {
                bool blocked = false;
                for (int w = 0; w <= (c >> 5) && !blocked; ++w) blocked = (occl[c * W + w] & kept[w]) != 0u;
                if (!blocked) {
                    kept[c >> 5] |= 1u << (c & 31);
                    pr_put(out, out_d, (long long)v * R + nk++, sd[c], si[c]);
                }
            }
            if (fill) {  // free slots: the nearest pruned candidates (same as the CPU reference)
                for (int c = 0; c < M && nk < R; ++c)
                    if (!(kept[c >> 5] & (1u << (c & 31)))) {
                        pr_put(out, out_d, (long long)v * R + nk++, sd[c], si[c]);
                    }
            }
            s_m = nk;
        }
        __syncthreads();
        for (int r = s_m + tid; r < R; r += 256) pr_put(out, out_d, (long long)v * R + r, KK_INF, -1);
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------------------------
// robust_prune_tc: the same rule for 'l2', with the pairwise distances on tensor cores and computed
// only as far as the greedy pass needs them (twentieth session).
//  * Centred on the node: y_c = (x_c - x_v) * s, s a power of two putting max |x_c - x_v| near 1024
//    (so fp16's 11 significant bits go to what differs between the candidates, whatever the data's
//    offset or magnitude), rounded to fp16; d(p, c) = (|y_p|^2 + |y_c|^2 - 2 y_p.y_c) / s^2 with the
//    norms summed in fp32 from the same fp16 values and the products by mma.sync m16n8k16 (fp32
//    accumulation), the form of the GNND join (gnnd.cu). Where the occlusion test is within
//    2^-12 (|y_p|^2 + |y_c|^2) of its threshold (the typical rounding error; the worst case is 2^-9),
//    d(p, c) is recomputed in fp32 as the fp32 kernel does. Graphs of 1M x 128 uniform and broad data
//    came out identical to the fp32 kernel's; tight clusters (every intra-cluster test a near-tie)
//    flip ~0.2 % of rows; without the recheck 7 % of hub lists flipped there. The 2^-9 band gave
//    identical rows everywhere but rechecked so often that the kernel lost to the fp32 one.
//  * Bands: candidates in sorted order are taken 32 at a time; band b computes the tiles of its rows
//    against every earlier row (16 x 16 tiles of the lower triangle, at most MAXT = CP / 64 per warp,
//    accumulated in registers), sets the occlusion bits, and the greedy pass (one warp, one candidate
//    per step, the kept set one 32-bit word per lane) runs over its 32 candidates. Once R are kept the remaining
//    bands are skipped: their distances cannot change the result (the greedy pass never looks past
//    the R-th kept candidate, and `fill` needs no distance).
//  * Rows in shared memory: up to 128 dimensions every candidate row stays resident once staged, so
//    a band loads only its own 32 rows; wider data goes in 128-dimension chunks, each band staging
//    every row it needs per chunk. Staging keeps four 16-byte loads per thread in flight (the loads
//    are random rows: latency, not bandwidth, is their cost).
// PT_SKIP_* (compile options, benchmarks/prune_kernel_parts.py only) drop one part for timing.
// ---------------------------------------------------------------------------------------------
#define PT_BAND 32
#define PT_DMAX 128  // dimensions per staged chunk
// Blocks per SM the register allocation must allow: 4 (64 registers) for lists of up to 128 (their
// rows take ~40 KB of shared memory: 5 blocks fit), 2 (128 registers) above, where shared memory
// holds 2 blocks anyway and a tighter cap spills (benchmarks/prune_kernel_parts.py).
#ifndef PT_MIN_BLOCKS
#define PT_MIN_BLOCKS (MAXT <= 2 ? 4 : 2)
#endif
#ifndef PT_TIE_SHIFT
#define PT_TIE_SHIFT 12  // near-tie band of the recheck: 2^-12 (|y_p|^2 + |y_c|^2)
#endif

__device__ __forceinline__ unsigned pt_pack_half2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float pt_half_sq(unsigned v) {
    float lo, hi;
    asm("{ .reg .f16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }"
        : "=f"(lo), "=f"(hi) : "r"(v));
    return fmaf(lo, lo, hi * hi);
}
__device__ __forceinline__ void pt_mma(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                       unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Rows [rlo, rhi) of the sorted candidates, dimensions [c0, c0 + cw) (q4 groups of 4, zero past cw
// and past M), centred on xv, scaled and rounded into Xh (row stride `stride` words).
__device__ __forceinline__ void pt_stage(const float* __restrict__ X, const float* __restrict__ xv, int d,
                                         const int* si, int M, int rlo, int rhi, int c0, int cw, int q4,
                                         int stride, float scale, bool vec, unsigned* Xh) {
    const int total = (rhi - rlo) * q4;
    for (int base = threadIdx.x; base < total; base += 4 * 256) {
        float4 y[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {  // loads first: four in flight
            const int e = base + u * 256;
            y[u] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (e < total) {
                const int rr = e / q4, j = 4 * (e - rr * q4), r = rlo + rr;
#ifndef PT_SKIP_STAGE
                if (r < M && j < cw) {
                    const float* xr = X + (long long)si[r] * d + c0 + j;
                    const float* xo = xv + c0 + j;
                    if (vec) {
                        const float4 a = __ldg(reinterpret_cast<const float4*>(xr));
                        const float4 o = __ldg(reinterpret_cast<const float4*>(xo));
                        y[u] = make_float4(a.x - o.x, a.y - o.y, a.z - o.z, a.w - o.w);
                    } else {
                        y[u].x = __ldg(xr) - __ldg(xo);
                        if (j + 1 < cw) y[u].y = __ldg(xr + 1) - __ldg(xo + 1);
                        if (j + 2 < cw) y[u].z = __ldg(xr + 2) - __ldg(xo + 2);
                        if (j + 3 < cw) y[u].w = __ldg(xr + 3) - __ldg(xo + 3);
                    }
                }
#endif
            }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int e = base + u * 256;
            if (e < total) {
                const int rr = e / q4, q = e - rr * q4;
                unsigned* dst = Xh + (rlo + rr) * stride + 2 * q;
                dst[0] = pt_pack_half2(y[u].x * scale, y[u].y * scale);
                dst[1] = pt_pack_half2(y[u].z * scale, y[u].w * scale);
            }
        }
    }
}

// Squared L2 between rows a and b in fp32 by direct differences, summed in dimension order: the
// fp32 kernel's value bit for bit (its tiles accumulate each pair over k = 0 .. d-1 with fmaf).
__device__ __noinline__ float pt_exact_l2(const float* __restrict__ X, int a, int b, int d) {
    const float* xa = X + (long long)a * d;
    const float* xb = X + (long long)b * d;
    float acc = 0.f;
    for (int k = 0; k < d; ++k) {
        const float t = __ldg(xa + k) - __ldg(xb + k);
        acc = fmaf(t, t, acc);
    }
    return acc;
}

// Tile `it` of band b: 16-row tile U of the band (0 or 1) against 16-row tile V of the candidates
// (V <= 2 b + U: the lower triangle, diagonal tiles included; 4 b + 3 tiles in all).
__device__ __forceinline__ void pt_tile(int it, int b, int& U, int& V) {
    U = it >= 2 * b + 1;
    V = it - (U ? 2 * b + 1 : 0);
}

template <int MAXT>
__global__ void __launch_bounds__(256, PT_MIN_BLOCKS) robust_prune_tc(
    const float* __restrict__ X, int n, int d, const int* __restrict__ cand_idx,
    const float* __restrict__ cand_dist, int n_nodes, int C, int CP, int R, float factor, float shift,
    int fill, int* __restrict__ out, float* __restrict__ out_d, const int* __restrict__ node_ids) {
    extern __shared__ float4 smem_raw[];
    __shared__ int s_m, s_nk;

    const int W = CP / 32;
    float* cd = reinterpret_cast<float*>(smem_raw);  // input order
    int* ci = reinterpret_cast<int*>(cd + CP);
    float* sd = reinterpret_cast<float*>(ci + CP);   // sorted, valid only
    int* si = reinterpret_cast<int*>(sd + CP);
    unsigned* occl = reinterpret_cast<unsigned*>(si + CP);  // CP rows x W words
    float* nrm = reinterpret_cast<float*>(occl + CP * W);   // |y_c|^2 (scaled units)
    unsigned* Xh = reinterpret_cast<unsigned*>(nrm + CP);   // CP rows x stride words (fp16 pairs)

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tg = lane & 3;  // mma fragment coordinates
    const bool vec = (d & 3) == 0;
    const int nch = (d + PT_DMAX - 1) / PT_DMAX;
    const int dpad = nch == 1 ? (d + 31) & ~31 : PT_DMAX;  // staged dimensions per chunk
    const int stride = dpad / 2 + 4;  // = 4 mod 16 words or 20 mod 32: conflict-free fragment loads
    const bool resident = nch == 1;

    for (int v = blockIdx.x; v < n_nodes; v += gridDim.x) {
        const int self = node_ids[v];
        if (tid == 0) s_nk = 0;
        const int M = pr_gather_sorted(cand_idx, cand_dist, n, C, CP, W, v, self, cd, ci, sd, si, occl, &s_m);
        // the farthest candidate's distance sets the scale (sd is sorted ascending)
        float scale = 1.f;
        if (M > 0 && sd[M - 1] > 0.f) scale = exp2f(floorf(log2f(1024.f / sqrtf(sd[M - 1]))));
        const float inv2 = 1.f / (scale * scale);
        const float* xv = X + (long long)self * d;
        unsigned kept_w = 0u;  // warp 0: lane w holds word w of the kept set (sorted positions)
        int nk = 0;            // warp 0: edges kept so far
        const int nb = (M + PT_BAND - 1) / PT_BAND;
        for (int b = 0; b < nb; ++b) {
            const int r0 = b * PT_BAND;
            const int rows = min((M + 15) & ~15, r0 + PT_BAND);  // rows [0, rows) staged, zero past M
            const int ntiles = 4 * b + 3;
            float acc[MAXT][2][4];
#pragma unroll
            for (int t = 0; t < MAXT; ++t)
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[t][h][i] = 0.f;
            for (int ch = 0; ch < nch; ++ch) {
                const int c0 = ch * PT_DMAX, cw = min(PT_DMAX, d - c0);
                pt_stage(X, xv, d, si, M, resident ? r0 : 0, rows, c0, cw, dpad / 4, stride, scale, vec, Xh);
                __syncthreads();
                if (tid < PT_BAND && r0 + tid < rows) {  // the band's norms, from the same fp16 values
                    const unsigned* row = Xh + (r0 + tid) * stride;
                    float s = 0.f;
                    for (int w = 0; w < dpad / 2; ++w) s += pt_half_sq(row[w]);
                    nrm[r0 + tid] = ch == 0 ? s : nrm[r0 + tid] + s;
                }
#ifndef PT_SKIP_MMA
#pragma unroll
                for (int t = 0; t < MAXT; ++t) {
                    const int it = warp + 8 * t;
                    if (it >= ntiles) break;
                    int U, V;
                    pt_tile(it, b, U, V);
                    const int ra = r0 + 16 * U;
                    if (ra >= M) continue;
                    const unsigned* pa = Xh + (ra + g) * stride + tg;
                    const unsigned* pb = Xh + (16 * V + g) * stride + tg;
                    for (int k = 0; k < dpad / 2; k += 8) {
                        const unsigned a0 = pa[k], a1 = pa[8 * stride + k], a2 = pa[k + 4], a3 = pa[8 * stride + k + 4];
                        pt_mma(acc[t][0], a0, a1, a2, a3, pb[k], pb[k + 4]);
                        pt_mma(acc[t][1], a0, a1, a2, a3, pb[8 * stride + k], pb[8 * stride + k + 4]);
                    }
                }
#endif
                __syncthreads();
            }
            // occlusion bits of the band's rows c against the earlier candidates p
#pragma unroll
            for (int t = 0; t < MAXT; ++t) {
                const int it = warp + 8 * t;
                if (it >= ntiles) break;
                int U, V;
                pt_tile(it, b, U, V);
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int c = r0 + 16 * U + g + (i >> 1) * 8;    // candidate c (row)
                        const int p = 16 * V + 8 * h + 2 * tg + (i & 1); // earlier candidate p (column)
                        if (c >= M || p >= c) continue;
                        float dpc = fmaxf(0.f, nrm[c] + nrm[p] - 2.f * acc[t][h][i]) * inv2;
                        // fp16 rounding moves dpc by at most 2^-9 (|y_p|^2 + |y_c|^2), typically ~sqrt(d)
                        // times less (independent roundings): inside 2^-PT_TIE_SHIFT of that sum around
                        // the threshold the test is decided on the fp32 distance (the fp32 kernel's)
                        const float err = ldexpf((nrm[c] + nrm[p]) * inv2, -PT_TIE_SHIFT) + 1e-6f * (dpc + sd[c]);
                        if (fabsf(factor * dpc - sd[c]) <= factor * err) dpc = pt_exact_l2(X, si[c], si[p], d);
                        if (!(factor * (dpc + shift) > sd[c] + shift)) atomicOr(&occl[c * W + (p >> 5)], 1u << (p & 31));
                    }
            }
            __syncthreads();
#ifndef PT_SKIP_GREEDY
            if (warp == 0) {  // greedy pass over the band, in sorted order
                const int c1 = min(M, r0 + PT_BAND);
                for (int c = r0; c < c1 && nk < R; ++c) {
                    const unsigned hit = lane < W ? (occl[c * W + lane] & kept_w) : 0u;
                    if (!__any_sync(0xffffffffu, hit != 0u)) {
                        if (lane == (c >> 5)) kept_w |= 1u << (c & 31);
                        if (lane == 0) pr_put(out, out_d, (long long)v * R + nk, sd[c], si[c]);
                        ++nk;
                    }
                }
                if (lane == 0) s_nk = nk;
            }
            __syncthreads();
            if (s_nk >= R) break;
#endif
        }
        if (warp == 0) {
            if (fill) {  // free slots: the nearest pruned candidates (same as the CPU reference)
                for (int c = 0; c < M && nk < R; ++c) {
                    const unsigned word = __shfl_sync(0xffffffffu, kept_w, c >> 5);
                    if (!((word >> (c & 31)) & 1u)) {
                        if (lane == 0) pr_put(out, out_d, (long long)v * R + nk, sd[c], si[c]);
                        ++nk;
                    }
                }
            }
            if (lane == 0) s_nk = nk;
        }
        __syncthreads();
        for (int r = s_nk + tid; r < R; r += 256) pr_put(out, out_d, (long long)v * R + r, KK_INF, -1);
        __syncthreads();
    }
}

#define NRE_UNROLL 4
extern "C" __global__ void new_reverse_edges(const int* __restrict__ graph, int n, int R,
                                             unsigned char* __restrict__ is_new) {
    // one warp per node u: 32 of its edges loaded at once, then NRE_UNROLL targets at a time, each
    // target's row read by the whole warp (lane i: entries i, i + 32, ...) and the hits voted
    const unsigned FULL = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const long long u = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (u >= n) return;  // whole warps leave together (blockDim.x is a multiple of 32)
    const int* urow = graph + u * R;
    for (int j0 = 0; j0 < R; j0 += 32) {
        const int mine = j0 + lane < R ? urow[j0 + lane] : -1;
        const int span = min(32, R - j0);
        unsigned char flag = 0;
        for (int t0 = 0; t0 < span; t0 += NRE_UNROLL) {
            int v[NRE_UNROLL];
            bool hit[NRE_UNROLL];
#pragma unroll
            for (int x = 0; x < NRE_UNROLL; ++x) {
                v[x] = __shfl_sync(FULL, mine, min(t0 + x, span - 1));
                hit[x] = false;
            }
#pragma unroll
            for (int x = 0; x < NRE_UNROLL; ++x) {
                if (t0 + x < span && v[x] >= 0 && v[x] < n && v[x] != (int)u) {  // warp-uniform
                    const int* row = graph + (long long)v[x] * R;
                    for (int i = lane; i < R; i += 32) hit[x] |= row[i] == (int)u;
                }
            }
#pragma unroll
            for (int x = 0; x < NRE_UNROLL; ++x) {
                const bool fresh = t0 + x < span && v[x] >= 0 && v[x] < n && v[x] != (int)u
                                   && !__any_sync(FULL, hit[x]);
                if (lane == t0 + x) flag = fresh ? 1 : 0;
            }
        }
        if (j0 + lane < R) is_new[u * R + j0 + lane] = flag;
    }
}
