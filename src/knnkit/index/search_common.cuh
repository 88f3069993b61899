// Shared helpers of the graph-search kernels (search.cu) and the RobustPrune kernel (prune.cu).
//
// Vector chunks: a data row is read in 16-byte chunks (float4 for fp32, 8 halves for fp16) when the
// dimension allows it, else element by element; every helper converts to float and accumulates in
// float, so fp16 storage only changes what is read from memory (GGNN sec. 4 / BANG sec. 4.5:
// the search is bound by the latency and volume of these gathers, not by arithmetic).
#pragma once
#include <cuda_fp16.h>

#define KK_INF __int_as_float(0x7f800000)
#define KK_INT_MAX 0x7fffffff
#define KK_FLAG 0x80000000u  // top bit of a beam index: "already expanded"

namespace kk {

// Load chunk `c` (EPC elements) of a row into floats.
template <typename T, int EPC>
__device__ __forceinline__ void load_chunk(const T* __restrict__ row, int c, float (&v)[EPC]) {
    if constexpr (sizeof(T) == 4 && EPC == 4) {
        float4 x = __ldg(reinterpret_cast<const float4*>(row) + c);
        v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
    } else if constexpr (sizeof(T) == 2 && EPC == 8) {
        uint4 x = __ldg(reinterpret_cast<const uint4*>(row) + c);
        const __half2* h = reinterpret_cast<const __half2*>(&x);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float2 f = __half22float2(h[i]);
            v[2 * i] = f.x; v[2 * i + 1] = f.y;
        }
    } else if constexpr (sizeof(T) == 2 && EPC == 2) {
        __half2 x = reinterpret_cast<const __half2*>(row)[c];
        float2 f = __half22float2(x);
        v[0] = f.x; v[1] = f.y;
    } else if constexpr (sizeof(T) == 2) {
        v[0] = __half2float(row[c]);
    } else {
        v[0] = __ldg(row + c);
    }
}

// Lexicographic (distance, index) order: ties resolved by the smaller index, so results are
// deterministic whatever the order in which threads produced them.
__device__ __forceinline__ bool key_less(float da, int ia, float db, int ib) {
    return da < db || (da == db && ia < ib);
}

}  // namespace kk
