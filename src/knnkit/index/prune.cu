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
// v's list (the only ones the reverse-edge step adds); one thread per edge scans v's R entries.
#include "search_common.cuh"

#define PR_TILE 64
#define PR_DK 32

template <int METRIC>
__global__ void __launch_bounds__(256) robust_prune(
    const float* __restrict__ X, int n, int d, const int* __restrict__ cand_idx,
    const float* __restrict__ cand_dist, int n_nodes, int C, int CP, int R, float factor, float shift,
    int fill, int* __restrict__ out, float* __restrict__ out_d, const int* __restrict__ node_ids) {
    using kk::key_less;
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
        if (tid == 0) s_m = 0;
        for (int j = tid; j < CP; j += 256) {
            int id = -1;
            float dist = KK_INF;
            if (j < C) {
                id = cand_idx[(long long)v * C + j];
                dist = cand_dist[(long long)v * C + j];
                if (id < 0 || id >= n || id == self || !(dist < KK_INF)) { id = -1; dist = KK_INF; }
            }
            ci[j] = id; cd[j] = dist;
        }
        for (int j = tid; j < CP * W; j += 256) occl[j] = 0u;
        __syncthreads();
        // Duplicates: keep the copy with the smallest (distance, position).
        for (int j = tid; j < C; j += 256) {
            const int id = ci[j];
            if (id < 0) continue;
            const float dj = cd[j];
            bool dup = false;
            for (int i = 0; i < C; ++i)
                dup |= (i != j) && ci[i] == id && key_less(cd[i], i, dj, j);
            if (dup) ci[j] = -2;  // marked, dropped below (distance kept for the other threads' test)
        }
        __syncthreads();
        for (int j = tid; j < C; j += 256) {
            const int id = ci[j];
            if (id < 0) continue;
            const float dj = cd[j];
            int r = 0;
            for (int i = 0; i < C; ++i) {
                const int o = ci[i];
                r += o >= 0 && (cd[i] < dj || (cd[i] == dj && (o < id || (o == id && i < j))));
            }
            sd[r] = dj; si[r] = id;
            atomicAdd(&s_m, 1);
        }
        __syncthreads();
        const int M = s_m;
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
                    if (out_d) out_d[(long long)v * R + nk] = sd[c];
                    out[(long long)v * R + nk++] = si[c];
                }
            }
            if (fill) {  // free slots: the nearest pruned candidates (same as the CPU reference)
                for (int c = 0; c < M && nk < R; ++c)
                    if (!(kept[c >> 5] & (1u << (c & 31)))) {
                        if (out_d) out_d[(long long)v * R + nk] = sd[c];
                        out[(long long)v * R + nk++] = si[c];
                    }
            }
            s_m = nk;
        }
        __syncthreads();
        for (int r = s_m + tid; r < R; r += 256) {
            out[(long long)v * R + r] = -1;
            if (out_d) out_d[(long long)v * R + r] = KK_INF;
        }
        __syncthreads();
    }
}

extern "C" __global__ void new_reverse_edges(const int* __restrict__ graph, int n, int R,
                                             unsigned char* __restrict__ is_new) {
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)n * R) return;
    const int u = (int)(e / R);
    const int v = graph[e];
    bool fresh = v >= 0 && v < n && v != u;
    if (fresh) {
        const int* row = graph + (long long)v * R;
        for (int j = 0; j < R; ++j)
            if (row[j] == u) { fresh = false; break; }
    }
    is_new[e] = fresh ? 1 : 0;
}
