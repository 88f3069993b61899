// Connectivity of a fixed-degree search graph on the GPU: weakly connected components, reachability
// from the entry points and the edge lengths of the short-edge components -- the checks behind
// knnkit's connectivity guarantee (every point reachable from the entries; issue 11,
// index/_connect.py, NOTES_search.md "Connectivity on the GPU"). GGNN (Groh et al.) section 3.2.1
// names the pitfall this guards against: y in N_x does not give x in N_y, so a k-NN graph is
// directed and falls apart between far groups; its section 5.2 symmetric links only approximate
// an undirected graph, hence the explicit check.
//
// Graphs are int32 (n, R), row-major, ids outside [0, n) (-1) are empty slots.
//
// Components (cc_init, cc_hook, cc_flatten): ECL-CC (Jaiganesh & Burtscher, HPDC 2018) on the
// directed edges taken as undirected -- each node's parent starts at its smallest out-neighbour
// (or itself), every edge hooks the larger of its two representatives under the smaller by
// atomicCAS (intermediate pointer jumping while finding them), and a final pass points every node
// at its root. parent[x] <= x holds throughout and links only join nodes of one component, so a
// root is its component's smallest id: the labels are those of the host union-find
// (_connect._union_find_roots), not only the same partition. Afforest's skipping of the largest
// component is not used: it needs every edge in both adjacency lists, and a directed graph lists
// u -> v only in u's row.
//
// Reachability (bfs_seed, bfs_expand): level-synchronous breadth-first search from the entries, a
// frontier queue per level (two ping-pong buffers), the visited set as a bitmap set by atomicOr,
// one thread per (frontier node, slot) and warp-aggregated pushes. counts[l] is level l's
// frontier size; each launch reads its own from device memory, so the host launches several
// levels between synchronisations.
//
// Edge lengths (edge_sqdist): squared l2 of every edge, one warp per (row, 32 slots): the 32
// neighbour rows are staged 32 dimensions at a time in shared memory with coalesced loads, each
// lane sums its own edge sequentially over the dimensions, without FMA contraction:
// s = s + (x_v[k] - x_u[k])^2, k = 0 .. d-1, every step rounded to float32 -- exactly what a
// sequential float32 loop on the host gives (the test checks equality). short_graph then drops
// the long edges (the rule of _connect.short_edge_components) and counts them.
//
// The per-thread bodies are __host__ __device__ functions: with CN_HOST_ONLY defined the file is
// plain C++ (no kernels, atomics become plain reads and writes), which the CPU tests compile with
// the host compiler and run thread by thread in a shuffled order (tests/test_connect_kernels_host.py).

#ifdef CN_HOST_ONLY
#define CN_HD static inline
#else
#define CN_HD __host__ __device__ inline
#endif

// ------------------------------------------------------------------------------ atomics (host: plain)
CN_HD int cn_cas(int* p, int expected, int desired) {
#ifdef __CUDA_ARCH__
    return atomicCAS(p, expected, desired);
#else
    int old = *p;
    if (old == expected) *p = desired;
    return old;
#endif
}

CN_HD unsigned int cn_or(unsigned int* p, unsigned int m) {
#ifdef __CUDA_ARCH__
    return atomicOr(p, m);
#else
    unsigned int old = *p;
    *p = old | m;
    return old;
#endif
}

CN_HD float cn_sq_step(float s, float a, float b) {
    // s + (a - b)^2, each operation rounded on its own (no fused multiply-add)
#ifdef __CUDA_ARCH__
    const float t = __fsub_rn(a, b);
    return __fadd_rn(s, __fmul_rn(t, t));
#else
    volatile float t = a - b;
    volatile float q = t * t;
    return s + q;
#endif
}

// ------------------------------------------------------------------------------ components
// The smallest valid id among slots j0, j0 + step, ... of row v that is below p, else p (the
// parent a node starts with: its smallest out-neighbour if smaller than itself; the kernel splits
// a row over the lanes of a warp, the host test takes j0 = 0, step = 1).
CN_HD int cn_init_part(const int* g, int n, int R, int v, int j0, int step, int p) {
    const long long base = (long long)v * R;
    for (int j = j0; j < R; j += step) {
        const int u = g[base + j];
        if (u >= 0 && u < n && u < p) p = u;
    }
    return p;
}

// Root of x's tree, halving the path on the way (ECL-CC "representative"). parent[y] < y for every
// non-root y, so the walk ends; a write stores an ancestor, never a root's slot.
CN_HD int cn_find(int* parent, int x) {
    int curr = parent[x];
    if (curr != x) {
        int prev = x, next;
        while (curr > (next = parent[curr])) {
            parent[prev] = next;
            prev = curr;
            curr = next;
        }
    }
    return curr;
}

// Hook the trees of a and b: the larger representative goes under the smaller, by compare-and-swap
// on its (still) root slot; a failed swap returns the new parent, and the loop goes on from it.
CN_HD void cn_hook_pair(int* parent, int a, int b) {
    int ra = cn_find(parent, a);
    int rb = cn_find(parent, b);
    while (ra != rb) {
        if (ra < rb) {
            const int ret = cn_cas(&parent[rb], rb, ra);
            if (ret == rb) break;
            rb = ret;
        } else {
            const int ret = cn_cas(&parent[ra], ra, rb);
            if (ret == ra) break;
            ra = ret;
        }
    }
}

// Edge e = v * R + j.
CN_HD void cn_hook_edge(const int* g, int n, int R, int* parent, long long e) {
    const int u = g[e];
    const int v = (int)(e / R);
    if (u < 0 || u >= n || u == v) return;
    cn_hook_pair(parent, v, u);
}

// Root of x once no hooking runs any more (the final pass).
CN_HD int cn_root(const int* parent, int x) {
    int r = x, next;
    while (r > (next = parent[r])) r = next;
    return r;
}

// ------------------------------------------------------------------------------ reachability
// Marks v visited; true when this call set its bit (the caller pushes v).
CN_HD bool cn_visit(unsigned int* bits, int n, int v) {
    if (v < 0 || v >= n) return false;
    const unsigned int m = 1u << (v & 31);
    if (bits[v >> 5] & m) return false;  // a stale read only sends us to the atomic
    return !(cn_or(&bits[v >> 5], m) & m);
}

// ------------------------------------------------------------------------------ edge lengths
// The rule of _connect.short_edge_components for edge e = u * R + j, v = g[e]: long when
// dist > factor * max(near[u], near[v]) and both near > 0 (near: a row's shortest positive edge,
// 0 when it has none); NaN distances (empty slots) are never long.
CN_HD bool cn_is_long(const int* g, const float* dist, const float* near, int n, int R, float factor,
                      long long e) {
    const int v = g[e];
    if (v < 0 || v >= n) return false;
    const float nu = near[e / R], nv = near[v];
    const float scale = nu > nv ? nu : nv;
#ifdef __CUDA_ARCH__
    const float lim = __fmul_rn(factor, scale);
#else
    volatile float lim = factor * scale;
#endif
    return dist[e] > lim && nu > 0.f && nv > 0.f;
}

// ------------------------------------------------------------------------------ kernels
#ifndef CN_HOST_ONLY
// One warp per row (coalesced reads of the row), a shuffle min over the lanes.
extern "C" __global__ void __launch_bounds__(256) cc_init(const int* __restrict__ g, int n, int R,
                                                          int* __restrict__ parent) {
    const int lane = threadIdx.x & 31;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    for (int v = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; v < n; v += warps) {
        int p = cn_init_part(g, n, R, v, lane, 32, v);
        for (int o = 16; o > 0; o >>= 1) p = min(p, __shfl_xor_sync(0xffffffffu, p, o));
        if (lane == 0) parent[v] = p;
    }
}

extern "C" __global__ void __launch_bounds__(256) cc_hook(const int* __restrict__ g, int n, int R, int* parent) {
    const long long total = (long long)n * R;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride)
        cn_hook_edge(g, n, R, parent, e);
}

extern "C" __global__ void __launch_bounds__(256) cc_flatten(int n, int* parent) {
    for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < n; v += gridDim.x * blockDim.x) {
        const int r = cn_root(parent, v);
        if (r != parent[v]) parent[v] = r;
    }
}

// Warp-aggregated append of v (where push) to q at counter *cnt; every lane of the warp calls it.
__device__ __forceinline__ void cn_push(bool push, int v, int* q, int* cnt) {
    const unsigned int mask = __ballot_sync(0xffffffffu, push);
    if (!mask) return;
    const int lane = threadIdx.x & 31;
    const int leader = __ffs(mask) - 1;
    int pos = 0;
    if (lane == leader) pos = atomicAdd(cnt, __popc(mask));
    pos = __shfl_sync(0xffffffffu, pos, leader);
    if (push) q[pos + __popc(mask & ((1u << lane) - 1u))] = v;
}

// The distinct valid sources become level 0: frontier[0 .. counts[0]).
extern "C" __global__ void __launch_bounds__(256) bfs_seed(const int* __restrict__ src, int m, int n,
                                                           unsigned int* bits, int* __restrict__ frontier,
                                                           int* counts) {
    for (int base = blockIdx.x * blockDim.x; base < m; base += gridDim.x * blockDim.x) {
        const int i = base + threadIdx.x;
        int v = -1;
        bool push = false;
        if (i < m) {
            v = src[i];
            push = cn_visit(bits, n, v);
        }
        cn_push(push, v, frontier, &counts[0]);
    }
}

// One level: the out-neighbours of frontier[0 .. counts[level]) not yet visited go to
// next[0 .. counts[level + 1]) (counts[level + 1] is zero before the launch).
extern "C" __global__ void __launch_bounds__(256) bfs_expand(const int* __restrict__ g, int n, int R,
                                                             unsigned int* bits, int* counts, int level,
                                                             const int* __restrict__ frontier,
                                                             int* __restrict__ next) {
    const long long total = (long long)counts[level] * R;
    const long long stride = (long long)gridDim.x * blockDim.x;
    // block-uniform loop: every lane reaches the warp vote in cn_push
    for (long long base = (long long)blockIdx.x * blockDim.x; base < total; base += stride) {
        const long long e = base + threadIdx.x;
        int v = -1;
        bool push = false;
        if (e < total) {
            const int u = frontier[e / R];
            v = g[(long long)u * R + (e % R)];
            push = cn_visit(bits, n, v);
        }
        cn_push(push, v, next, &counts[level + 1]);
    }
}

#define ED_WARPS 8
#define ED_DK 32

// out[u, j] = sum_k (X[v, k] - X[u, k])^2 for v = g[u, j] in [0, n) (sequential in k, see the
// header), NaN for an empty slot.
extern "C" __global__ void __launch_bounds__(ED_WARPS * 32) edge_sqdist(const float* __restrict__ X, int n, int d,
                                                                      const int* __restrict__ g, int R,
                                                                      float* __restrict__ out) {
    __shared__ float tile[ED_WARPS][32][ED_DK + 1];
    __shared__ float xs[ED_WARPS][ED_DK];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int groups = (R + 31) >> 5;
    const long long total = (long long)n * groups;
    for (long long w = (long long)blockIdx.x * ED_WARPS + warp; w < total; w += (long long)gridDim.x * ED_WARPS) {
        const int row = (int)(w / groups);
        const int j = (int)(w % groups) * 32 + lane;
        const int v = j < R ? g[(long long)row * R + j] : -1;
        const bool valid = v >= 0 && v < n;
        float s = 0.f;
        for (int k0 = 0; k0 < d; k0 += ED_DK) {
            const int kk = min(ED_DK, d - k0);
            if (lane < kk) xs[warp][lane] = X[(long long)row * d + k0 + lane];
#pragma unroll 8
            for (int r = 0; r < 32; ++r) {
                const int vr = __shfl_sync(0xffffffffu, v, r);
                if (vr >= 0 && vr < n && lane < kk) tile[warp][r][lane] = X[(long long)vr * d + k0 + lane];
            }
            __syncwarp();
            if (valid)
                for (int k = 0; k < kk; ++k) s = cn_sq_step(s, tile[warp][lane][k], xs[warp][k]);
            __syncwarp();
        }
        if (j < R) out[(long long)row * R + j] = valid ? s : __int_as_float(0x7fc00000);
    }
}

// short[e] = -1 for a long edge, g[e] otherwise; *n_long += the number of long edges.
extern "C" __global__ void __launch_bounds__(256) short_graph(const int* __restrict__ g,
                                                              const float* __restrict__ dist,
                                                              const float* __restrict__ near, int n, int R,
                                                              float factor, int* __restrict__ short_g,
                                                              unsigned long long* n_long) {
    const long long total = (long long)n * R;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long base = (long long)blockIdx.x * blockDim.x; base < total; base += stride) {
        const long long e = base + threadIdx.x;
        bool lng = false;
        if (e < total) {
            lng = cn_is_long(g, dist, near, n, R, factor, e);
            short_g[e] = lng ? -1 : g[e];
        }
        const unsigned int mask = __ballot_sync(0xffffffffu, lng);
        if (mask && (threadIdx.x & 31) == __ffs(mask) - 1) atomicAdd(n_long, (unsigned long long)__popc(mask));
    }
}
#endif  // CN_HOST_ONLY
