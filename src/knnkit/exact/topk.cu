// topk.cu -- row-wise k-selection for brute-force k-NN on the GPU.
//
// Implements the selection stage of exact brute-force search ("FAISS-BF" in the seeds): the
// distance tile produced by a cuBLAS GEMM is reduced, row by row, to a running top-k that is
// merged across data tiles. The merge of a candidate list into a sorted k-NN list with
// Batcher's bitonic network follows GNND (seed 000, Sec. 5.1 ablation "GNN-D-r1": distances
// sorted by a bitonic network, then merged with the k-NN list); the exact re-ranking of
// low-precision candidates follows BANG (seed 003, Sec. 3.2.3 / 4.9 "Re-ranking").
// The design is a threshold filter in the spirit of FAISS BlockSelect: one thread block per
// row streams the row once, coalesced (16-byte vector loads, one chunk prefetched); an element is kept only when it beats the current k-th
// best (kept in a register-cached shared variable), so after a short warm-up almost every
// element costs one load and one compare and the kernel runs at memory bandwidth. Kept
// elements are appended to a shared-memory buffer; when the buffer could overflow (and at the
// end of the row) the block sorts [current top-K | buffer] with a bitonic network over the
// used prefix only (next power of two of K + count), which makes the common end-of-tile
// flush with a handful of candidates cheap.
//
// Keys: key = colbias[c] + alpha * D[r, c] (colbias NULL -> 0). For squared L2 the caller
// passes D = Q X^T, alpha = -2 and colbias = ||x||^2 (the row constant ||q||^2 does not change
// the order). Ties are broken by the smaller global column index, everywhere.
//
// NVRTC: no standard headers beyond cuda_fp16.h.

#include <cuda_fp16.h>

#define TOPK_INF __int_as_float(0x7f800000)
#define TOPK_NOIDX 0x7fffffff

__device__ __forceinline__ float topk_load(const float* p) { return __ldg(p); }
__device__ __forceinline__ float topk_load(const __half* p) { return __half2float(*p); }

// (a, ia) < (b, ib) in (key, index) lexicographic order.
__device__ __forceinline__ bool topk_less(float a, int ia, float b, int ib) {
    return a < b || (a == b && ia < ib);
}

// Ascending bitonic sort of sd/si[0, P) (P a power of two) by (key, index). All threads of
// the block must call it; it starts and ends with a barrier.
template <int NT>
__device__ void topk_bitonic_sort(float* sd, int* si, int P) {
    __syncthreads();
    for (int size = 2; size <= P; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = threadIdx.x; t < (P >> 1); t += NT) {
                int lo = 2 * t - (t & (stride - 1));
                int hi = lo + stride;
                bool up = (lo & size) == 0;
                float a = sd[lo], b = sd[hi];
                int ia = si[lo], ib = si[hi];
                bool swap = up ? topk_less(b, ib, a, ia) : topk_less(a, ia, b, ib);
                if (swap) {
                    sd[lo] = b; sd[hi] = a;
                    si[lo] = ib; si[hi] = ia;
                }
            }
            __syncthreads();
        }
    }
}

// 16-byte loads of V consecutive elements (4 floats or 8 halves) converted to float.
__device__ __forceinline__ void topk_load_vec(const float* p, float* out) {
    float4 f = __ldg(reinterpret_cast<const float4*>(p));
    out[0] = f.x; out[1] = f.y; out[2] = f.z; out[3] = f.w;
}
__device__ __forceinline__ void topk_load_vec(const __half* p, float* out) {
    uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
    unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        __half2 h = *reinterpret_cast<__half2*>(&w[i]);
        float2 f = __half22float2(h);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

// One block per row r of a (m x ncols) tile D (row stride ld). best_d/best_i (m x k) hold the
// running top-k of every row (sorted; read when has_prev != 0) and receive the updated top-k.
// self_ids (optional): row r never selects global column self_ids[r].
// K: power of two >= k (queue length), NT: threads, S: shared capacity (power of two >= 2K).
// Loads: 16-byte vectors when every row start is 16-byte aligned (the GEMM tiles are padded
// for this), else V scalar loads per thread; the next chunk is loaded before the current one
// is filtered, so two 16-byte loads per thread are in flight to cover memory latency.
template <typename T, int K, int NT, int S>
__global__ void __launch_bounds__(NT) topk_tile(
    const T* __restrict__ D, long long ld, int m, int ncols, int col_offset,
    const float* __restrict__ colbias, float alpha, const int* __restrict__ self_ids,
    float* __restrict__ best_d, int* __restrict__ best_i, int k, int has_prev)
{
    constexpr int V = 16 / (int)sizeof(T);
    constexpr int CHUNK = NT * V;
    constexpr int CAP = S - K;  // buffer capacity
    static_assert(CAP >= CHUNK, "buffer must hold one chunk");
    __shared__ float sd[S];
    __shared__ int si[S];
    __shared__ int s_count;
    __shared__ float s_thr;
    __shared__ int s_thr_i;

    const int r = blockIdx.x;
    if (r >= m) return;
    const T* row = D + (long long)r * ld;
    float* bd = best_d + (long long)r * k;
    int* bi = best_i + (long long)r * k;
    const bool vec = (ld % V) == 0 && ((unsigned long long)D & 15ull) == 0;

    for (int t = threadIdx.x; t < S; t += NT) {
        bool valid = has_prev && t < k;
        sd[t] = valid ? bd[t] : TOPK_INF;
        si[t] = valid ? bi[t] : TOPK_NOIDX;
    }
    if (threadIdx.x == 0) {
        s_count = 0;
        s_thr = has_prev ? bd[k - 1] : TOPK_INF;
        s_thr_i = has_prev ? bi[k - 1] : TOPK_NOIDX;
    }
    const int self_local = self_ids ? self_ids[r] - col_offset : -1;
    __syncthreads();
    float thr = s_thr;
    int thr_i = s_thr_i;

    // column of element e of this thread in the chunk starting at b
#define TOPK_COL(b, e) (vec ? (b) + (int)threadIdx.x * V + (e) : (b) + (e) * NT + (int)threadIdx.x)
    // keys need colbias[col]: in vector mode it is loaded as 16-byte vectors next to the tile
    // values (a scalar load per element would touch a separate 32-byte sector per lane)
    const bool vbias = vec && colbias != nullptr && (col_offset & 3) == 0 &&
                       ((unsigned long long)colbias & 15ull) == 0;
    float cur[V], nxt[V], bcur[V], bnxt[V];
#define TOPK_LOAD(b, out, bout)                                                    \
    do {                                                                           \
        if (vec) {                                                                 \
            int c0_ = (b) + (int)threadIdx.x * V;                                  \
            if (c0_ < ncols) {                                                     \
                topk_load_vec(row + c0_, out);                                     \
                if (vbias) {                                                       \
                    if (c0_ + V <= ncols) {                                        \
                        _Pragma("unroll") for (int h_ = 0; h_ < V; h_ += 4) {      \
                            float4 f_ = __ldg(reinterpret_cast<const float4*>(     \
                                colbias + col_offset + c0_ + h_));                 \
                            bout[h_] = f_.x; bout[h_ + 1] = f_.y;                  \
                            bout[h_ + 2] = f_.z; bout[h_ + 3] = f_.w;              \
                        }                                                          \
                    } else {                                                       \
                        _Pragma("unroll") for (int h_ = 0; h_ < V; ++h_)           \
                            bout[h_] = (c0_ + h_ < ncols)                          \
                                ? __ldg(colbias + col_offset + c0_ + h_) : 0.f;    \
                    }                                                              \
                }                                                                  \
            }                                                                      \
        } else {                                                                   \
            _Pragma("unroll") for (int e_ = 0; e_ < V; ++e_) {                     \
                int c_ = (b) + e_ * NT + (int)threadIdx.x;                         \
                out[e_] = (c_ < ncols) ? topk_load(row + c_) : 0.f;                \
            }                                                                      \
        }                                                                          \
    } while (0)

    TOPK_LOAD(0, cur, bcur);
    for (int base = 0; base < ncols; base += CHUNK) {
        if (base + CHUNK < ncols) TOPK_LOAD(base + CHUNK, nxt, bnxt);
#pragma unroll
        for (int e = 0; e < V; ++e) {
            int c = TOPK_COL(base, e);
            if (c < ncols && c != self_local) {
                float bias = vbias ? bcur[e] : (colbias ? __ldg(colbias + col_offset + c) : 0.f);
                float key = bias + alpha * cur[e];
                int gi = col_offset + c;
                if (topk_less(key, gi, thr, thr_i)) {
                    int pos = atomicAdd(&s_count, 1);
                    sd[K + pos] = key;
                    si[K + pos] = gi;
                }
            }
        }
        __syncthreads();
        int cnt = s_count;
        // second barrier: nobody may append to s_count for the next chunk before every thread
        // has read it, or the flush decision below could differ between threads
        __syncthreads();
        bool last = base + CHUNK >= ncols;
        if (cnt > CAP - CHUNK || (last && cnt > 0)) {
            int used = K + cnt;
            int P = 2 * K;
            while (P < used) P <<= 1;
            topk_bitonic_sort<NT>(sd, si, P);
            // keep the first K (only k are meaningful); reset the touched rest to +inf
            for (int t = K + threadIdx.x; t < P; t += NT) {
                sd[t] = TOPK_INF;
                si[t] = TOPK_NOIDX;
            }
            if (threadIdx.x == 0) {
                s_count = 0;
                s_thr = sd[k - 1];
                s_thr_i = si[k - 1];
            }
            __syncthreads();
            thr = s_thr;
            thr_i = s_thr_i;
        }
#pragma unroll
        for (int e = 0; e < V; ++e) {
            cur[e] = nxt[e];
            bcur[e] = bnxt[e];
        }
    }
#undef TOPK_LOAD
#undef TOPK_COL
    __syncthreads();
    for (int t = threadIdx.x; t < k; t += NT) {
        bd[t] = sd[t];
        bi[t] = si[t];
    }
}

// Sort each row's kc (key, index) pairs ascending and keep the first k (one block per row;
// P a power of two >= kc). Used after exact re-ranking of candidates.
template <int P, int NT>
__global__ void __launch_bounds__(NT) topk_sort_pairs(
    const float* __restrict__ in_d, const int* __restrict__ in_i, int m, int kc,
    float* __restrict__ out_d, int* __restrict__ out_i, int k)
{
    __shared__ float sd[P];
    __shared__ int si[P];
    const int r = blockIdx.x;
    if (r >= m) return;
    for (int t = threadIdx.x; t < P; t += NT) {
        bool valid = t < kc;
        sd[t] = valid ? in_d[(long long)r * kc + t] : TOPK_INF;
        si[t] = valid ? in_i[(long long)r * kc + t] : TOPK_NOIDX;
    }
    topk_bitonic_sort<NT>(sd, si, P);
    for (int t = threadIdx.x; t < k; t += NT) {
        out_d[(long long)r * k + t] = sd[t];
        out_i[(long long)r * k + t] = si[t];
    }
}

// Exact float32 distance of each (query r, candidate cand[r, t]) pair: one warp per pair,
// lanes stride over the dimensions, shuffle reduction. use_l2: sum (q - x)^2, else -sum q*x.
// Invalid candidates (TOPK_NOIDX or negative) get +inf.
extern "C" __global__ void topk_pair_distances(
    const float* __restrict__ X, const float* __restrict__ Q, int dim,
    const int* __restrict__ cand, long long npairs, int kc, int use_l2, float* __restrict__ out)
{
    const int lane = threadIdx.x & 31;
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long p = warp; p < npairs; p += nwarps) {
        const long long r = p / kc;
        const int j = cand[p];
        if (j < 0 || j == TOPK_NOIDX) {
            if (lane == 0) out[p] = TOPK_INF;
            continue;
        }
        const float* q = Q + r * dim;
        const float* x = X + (long long)j * dim;
        // float64 accumulation, as the CPU twin's refinement (products of float32 values are exact
        // in double), so both devices re-rank by the same sums; the output is float32
        double acc = 0.0;
        if (use_l2) {
            for (int c = lane; c < dim; c += 32) {
                double diff = (double)__ldg(q + c) - (double)__ldg(x + c);
                acc = fma(diff, diff, acc);
            }
        } else {
            for (int c = lane; c < dim; c += 32) acc = fma((double)__ldg(q + c), (double)__ldg(x + c), acc);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0) out[p] = (float)(use_l2 ? acc : -acc);
    }
}

// fp32 -> bfloat16 bits with round-to-nearest-even (inputs are finite).
extern "C" __global__ void topk_to_bf16(const float* __restrict__ in, unsigned short* __restrict__ out,
                                        long long n)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        unsigned int u = __float_as_uint(in[i]);
        u += 0x7fffu + ((u >> 16) & 1u);
        out[i] = (unsigned short)(u >> 16);
    }
}

// fp32 -> nearest TF32 value (10 explicit mantissa bits), kept in fp32 storage. The GEMM's own
// fp32 -> TF32 conversion is then exact whatever its rounding mode, so the rounding error is
// known exactly (and bounded from the actual vectors).
extern "C" __global__ void topk_round_tf32(const float* __restrict__ in, float* __restrict__ out,
                                           long long n)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        unsigned int u = __float_as_uint(in[i]);
        u += 0xfffu + ((u >> 13) & 1u);
        out[i] = __uint_as_float(u & 0xffffe000u);
    }
}

// bfloat16 bits -> fp32 (to measure the rounding error of the bf16 copy).
extern "C" __global__ void topk_from_bf16(const unsigned short* __restrict__ in, float* __restrict__ out,
                                          long long n)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = __uint_as_float(((unsigned int)in[i]) << 16);
}

// Float64 fallback of the exact mode (rows whose float32 certificate failed): every point whose
// squared L2 distance to query r, summed in float64 from the coordinate differences (so without
// the norm expansion's cancellation), is <= ub[r] is appended to row r's list of `cap` slots;
// cnt[r] counts every such point, so cnt[r] > cap tells the caller the list overflowed. ub[r]
// is the float32-exact distance of the row's k-th candidate with a rounding margin, so the list
// holds the true top-k and every float32 tie of the k-th. A partial sum above ub[r] stops the
// point early (the terms are non-negative). Grid: x strides over the points, y over tiles of
// `qt` queries kept in shared memory (qt * dim floats); self_ids (nullable) excludes one point
// per query.
extern "C" __global__ void topk_rows_within_f64(
    const float* __restrict__ X, long long n, int dim, const float* __restrict__ Q, int m, int qt,
    const double* __restrict__ ub, const int* __restrict__ self_ids, int cap,
    int* __restrict__ cnt, int* __restrict__ out_i)
{
    extern __shared__ float within_sq[];
    const int q0 = blockIdx.y * qt;
    const int nq = min(qt, m - q0);
    for (int t = threadIdx.x; t < nq * dim; t += blockDim.x) within_sq[t] = Q[(long long)q0 * dim + t];
    __syncthreads();
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (long long)gridDim.x * blockDim.x) {
        const float* x = X + j * dim;
        for (int r = 0; r < nq; ++r) {
            const int row = q0 + r;
            if (self_ids != nullptr && self_ids[row] == (int)j) continue;
            const double bound = ub[row];
            const float* q = within_sq + r * dim;
            double acc = 0.0;
            int c = 0;
            for (; c < dim; ++c) {
                const double diff = (double)q[c] - (double)__ldg(x + c);
                acc = fma(diff, diff, acc);
                if ((c & 7) == 7 && acc > bound) break;
            }
            if (c == dim && acc <= bound) {
                const int p = atomicAdd(cnt + row, 1);
                if (p < cap) out_i[(long long)row * cap + p] = (int)j;
            }
        }
    }
}
