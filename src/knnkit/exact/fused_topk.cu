// fused_topk.cu -- fused fp16 tensor-core distance GEMM + running top-k' selection for the
// "fp16_rerank" mode of exact brute-force k-NN (see NOTES_topk.md, "Fused kernel").
//
// Why: the unfused fp16 mode writes the fp16 distance tile Q_t X_t^T to global memory (cuBLAS)
// and topk_tile (topk.cu) reads it back; for an all-points 1M x 128 graph that is ~4 TB of tile
// traffic, about 2.7 s of the 3.3 s. Here the dot products of a block of queries with a chunk of
// data points are computed with mma.sync (m16n8k16, fp16 inputs, fp32 accumulation) and the keys
// are filtered straight from the accumulator registers; no distance ever leaves the SM.
// The threshold filter + buffered merge is the same idea as topk_tile (FAISS BlockSelect style);
// the operand staging (cp.async ring of k-slices, ldmatrix fragments, padded rows so ldmatrix
// is free of bank conflicts) is the textbook Ampere/Hopper GEMM main loop.
//
// Keys (identical to topk_tile's so the caller's re-rank and certificate apply unchanged):
//   key[r, c] = colbias[c] + alpha * (Q[r] . X[c])      (colbias NULL -> 0)
// with Q, X the scaled, centred fp16 operands of the fp16 mode, alpha = -2 / (sx sq) for squared
// L2 (colbias = ||x - mu||^2) or -1 / (sx sq) for the inner product. The dot product is the fp32
// tensor-core accumulation itself (never rounded to fp16), so the caller's error bound may drop
// its "fp16 tile storage" term. Ties are broken by the smaller column index, as in topk.cu.
//
// Output: best_d / best_i (m x kc, row-major), each row sorted ascending by (key, index), padded
// with (+inf, 0x7fffffff) when fewer than kc points are available.
//
// Shape constraints (checked by the caller, _gpu.py):
//   * Q (m x dp) and X (n x dp) fp16, row-major, dp = d rounded up to a multiple of 32, zero
//     padded (the zero columns add exact zeros); base pointers 16-byte aligned.
//   * 1 <= kc <= 1024 (the list lives in global memory; merges stream it).
//   * block = 32 * NW threads, BM = 16 * MT * NW query rows per block, BN = 64 data points per
//     chunk; dynamic shared memory = fused_smem_bytes(MT, NW, dp) (Python mirrors the formula).
//   * sm_80 or newer (cp.async, ldmatrix, mma.sync m16n8k16).
//
// Selection: each warp owns 16*MT query rows and all 64 columns of a chunk. Lane (g = lane/4,
// t = lane%4) holds, per 16-row tile and per 8-column tile, keys of rows g and g+8 at columns
// 2t, 2t+1 (the mma accumulator layout). A key survives when key <= the row's current kc-th best
// key (a register copy). Survivors are appended to a per-row shared buffer (CAP entries) and
// merged into the row's sorted list (global memory) by the warp alone (no block barrier): sort the
// <= 32 buffered pairs with a register bitonic network (one per lane), rank every element in the
// merged order, scatter in place. After warm-up (~kc ln(n/kc) survivors per row in total) the
// steady state is one FFMA + one compare per key. Two protocols (same outputs, bit for bit):
//   v2 (default; "selection v2" below): counts in registers, slots by quad shuffles, no atomics,
//       merge when a row's buffer would overflow, ranks by shuffle searches over list slots held
//       in registers;
//   v1 (-DFT_SEL_V1, kept for A/B): exact (key, index) test against the shared threshold, shared
//       atomics, merge rows holding > CAP - 8 before a slow step, ranks of the buffer by binary
//       search over the list in global memory.
//
// Main loop of the register-resident kernel (padded d <= 128): v2 (default; "main loop v2" at the
// end of the file: half-chunk software pipeline, the filter of one 32-column half runs between the
// mma of the other) or the original one (-DFT_MAIN_V1, kept for A/B). Same keys and outputs.
//
// NVRTC: no headers at all; fp16 operands are passed as raw 16-bit words (unsigned short) and
// only ever touched by cp.async / ldmatrix / mma.

#define FT_INF __int_as_float(0x7f800000)
#define FT_NOIDX 0x7fffffff
#define FT_BN 64      // data points per chunk
#define FT_KS 64      // k-slice (halves) staged per cp.async group
#define FT_STAGES 3   // cp.async ring depth
#define FT_CAP 32     // survivor buffer per row (<= 32: one entry per lane in the merge sort)
#define FT_XS (FT_KS + 8)  // staged X row stride (halves): 144 B rows -> ldmatrix conflict free

__device__ __forceinline__ bool ft_less(float a, int ia, float b, int ib) {
    return a < b || (a == b && ia < ib);
}

// generic -> shared-window address for cp.async / ldmatrix (inline PTX: no header needed)
__device__ __forceinline__ unsigned ft_smem_addr(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ int ft_min(int a, int b) { return a < b ? a : b; }

__device__ __forceinline__ void ft_cp_async16(void* smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(ft_smem_addr(smem)), "l"(gmem));
}
__device__ __forceinline__ void ft_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void ft_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ft_ldmatrix_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3,
                                               const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(ft_smem_addr(p)));
}

// d += a * b, m16n8k16, fp16 inputs, fp32 accumulators
__device__ __forceinline__ void ft_mma(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Shared-memory layout (bytes), mirrored by _gpu._fused_smem_bytes:
//   Q tile   BM x (dp + 8) halves
//   X ring   FT_STAGES x FT_BN x FT_XS halves
//   buffers  BM x FT_CAP floats + BM x FT_CAP ints
//   per row  count, threshold key, threshold index (3 x BM x 4)
__host__ __device__ constexpr int ft_bm(int MT, int NW) { return 16 * MT * NW; }

// Merge row br's survivor buffer into its sorted global list L (kc entries), warp-synchronous.
// Updates the row's threshold and clears its buffer. All 32 lanes must call it.
// Not inlined: it is called from 9 places (8 unrolled column steps + the final flush) and runs
// rarely; inlining would multiply the code size for nothing.
__device__ __noinline__ void ft_merge_row(int br, float* __restrict__ Ld, int* __restrict__ Li, int kc,
                                             float* s_bk, int* s_bi, int* s_cnt, float* s_thr, int* s_thri,
                                             int lane) {
    const int cnt = s_cnt[br];
    float bk = lane < cnt ? s_bk[br * FT_CAP + lane] : FT_INF;
    int bi = lane < cnt ? s_bi[br * FT_CAP + lane] : FT_NOIDX;
    // bitonic sort of the 32 (key, index) pairs across the lanes, ascending
#pragma unroll
    for (int size = 2; size <= 32; size <<= 1) {
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            float ok = __shfl_xor_sync(0xffffffffu, bk, stride);
            int oi = __shfl_xor_sync(0xffffffffu, bi, stride);
            bool up = (lane & size) == 0;  // size == 32: every lane ascending
            bool lower = (lane & stride) == 0;
            bool take_min = (lower == up);
            bool other_less = ft_less(ok, oi, bk, bi);
            if (take_min ? other_less : ft_less(bk, bi, ok, oi)) { bk = ok; bi = oi; }
        }
    }
    // rank of my buffer element in the merged order: lane + #(list elements before it);
    // computed before anything is written (the list is read in its old state)
    int brank = 0x7fffffff;
    if (lane < cnt) {
        int lo = 0;
        for (int step = 1024; step > 0; step >>= 1) {
            int probe = lo + step - 1;
            if (probe < kc && ft_less(Ld[probe], Li[probe], bk, bi)) lo += step;
        }
        brank = lane + lo;
    }
    // list elements, top slot first: element i moves to i + #(buffer elements before it) >= i,
    // i.e. into a slot that has already been read (higher slots) or is read in this round
    const int nslot = (kc + 31) >> 5;
    for (int s = nslot - 1; s >= 0; --s) {
        const int i = s * 32 + lane;
        float lk = FT_INF;
        int li = FT_NOIDX;
        if (i < kc) { lk = Ld[i]; li = Li[i]; }
        int lo = 0;
#pragma unroll
        for (int step = 32; step > 0; step >>= 1) {
            int probe = lo + step - 1;
            float pk = __shfl_sync(0xffffffffu, bk, probe & 31);
            int pi = __shfl_sync(0xffffffffu, bi, probe & 31);
            if (probe < cnt && ft_less(pk, pi, lk, li)) lo += step;
        }
        __syncwarp();  // every lane has read slot s before any lane overwrites it
        const int rank = i + lo;
        if (i < kc && rank < kc) {
            Ld[rank] = lk;
            Li[rank] = li;
            if (rank == kc - 1) { s_thr[br] = lk; s_thri[br] = li; }
        }
        __syncwarp();
    }
    if (brank < kc) {
        Ld[brank] = bk;
        Li[brank] = bi;
        if (brank == kc - 1) { s_thr[br] = bk; s_thri[br] = bi; }
    }
    if (lane == 0) s_cnt[br] = 0;
    __syncwarp();
}

// Selection of one chunk (FT_BN columns starting at c0) from the accumulator registers: keys are
// formed in place (key = colbias + alpha * dot, folded in by the caller), filtered against the
// register copy of each row's threshold, survivors appended to the row buffers; rows whose buffer
// could overflow are merged first. One 8-column step at a time; a warp vote skips a step where no
// lane has a survivor (the steady state). Shared by both kernels below.
template <int MT>
__device__ __forceinline__ void ft_select_chunk(float (&acc)[MT][8][4], const float (&cb)[8][2], float (&thr)[MT][2],
                                                const int (&sid)[MT][2], int c0, int n, int kc, int row0,
                                                int wrow, int lane, int t4, int g, float* __restrict__ best_d,
                                                int* __restrict__ best_i, float* s_bk, int* s_bi, int* s_cnt,
                                                float* s_thr, int* s_thri, float alpha) {
    constexpr int WR = 16 * MT;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        bool maybe = false;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float key = fmaf(alpha, acc[mt][j][e], cb[j][e & 1]);
                acc[mt][j][e] = key;
                maybe |= key <= thr[mt][e >> 1];
            }
        if (!__any_sync(0xffffffffu, maybe)) continue;
        // slow path: make room (merge rows whose buffer could overflow), then append
        {
            bool full = lane < WR && s_cnt[wrow + lane] > FT_CAP - 8;
            unsigned need = __ballot_sync(0xffffffffu, full);
            if (need) {
                while (need) {
                    int lr = __ffs(need) - 1;
                    need &= need - 1;
                    int br = wrow + lr;
                    long long off = (long long)(row0 + br) * kc;
                    ft_merge_row(br, best_d + off, best_i + off, kc, s_bk, s_bi, s_cnt, s_thr, s_thri, lane);
                }
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) thr[mt][h] = s_thr[wrow + mt * 16 + h * 8 + g];
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int h = e >> 1;
                const int br = wrow + mt * 16 + h * 8 + g;
                const int c = c0 + j * 8 + 2 * t4 + (e & 1);
                const float key = acc[mt][j][e];
                // exact (key, index) test against the row's threshold; column range and self
                if (c < n && c != sid[mt][h] && ft_less(key, c, s_thr[br], s_thri[br])) {
                    int pos = atomicAdd(&s_cnt[br], 1);
                    s_bk[br * FT_CAP + pos] = key;
                    s_bi[br * FT_CAP + pos] = c;
                }
            }
        __syncwarp();
    }
}

// Final merge of every row of this warp whose buffer is not empty.
template <int MT>
__device__ __forceinline__ void ft_flush_rows(int row0, int wrow, int lane, int kc, float* __restrict__ best_d,
                                              int* __restrict__ best_i, float* s_bk, int* s_bi, int* s_cnt,
                                              float* s_thr, int* s_thri) {
    constexpr int WR = 16 * MT;
    bool any = lane < WR && s_cnt[wrow + lane] > 0;
    unsigned need = __ballot_sync(0xffffffffu, any);
    while (need) {
        int lr = __ffs(need) - 1;
        need &= need - 1;
        int br = wrow + lr;
        long long off = (long long)(row0 + br) * kc;
        ft_merge_row(br, best_d + off, best_i + off, kc, s_bk, s_bi, s_cnt, s_thr, s_thri, lane);
    }
}

// ===================================== selection v2 ===========================================
// The default since issue 11's selection rework (NOTES_topk.md, "Cheaper selection"); compile with
// -DFT_SEL_V1 for the protocol above (ft_select_chunk / ft_flush_rows / ft_merge_row), kept for
// A/B. Same outputs, bit for bit: both keep, per row, the kc smallest (key, column) pairs of all
// columns, and nothing else depends on the order in which survivors reach the list.
// What changed, and why (H200: the selection was ~40 % of the kernel, 0.10 of 0.25 s):
//  * slow step without shared-memory round trips: v1 re-read each key's row threshold (key, id)
//    from shared memory and appended with one shared atomicAdd per survivor; the compiler could not
//    reorder the loads across the atomics, so 8 dependent LDS -> compare -> ATOMS chains ran per
//    slow step (~100 instructions, ~450 cycles of latency, divergent). v2 tests the register copy of
//    the threshold only (key <= thr: the vote's own predicate), counts the survivors per row in a
//    packed byte per row (4 rows per lane, one 32-bit register), and finds each survivor's slot by a
//    quad prefix sum of those packed counts (2 shuffles for all 4 rows); the counts stay in a
//    register (no s_cnt), so no atomics and no shared loads.
//  * masking once per chunk: columns past n and each row's excluded (self) column get a NaN dot
//    product, hence a NaN key, which no test accepts; v1 tested c < n and c != self per key.
//  * a key equal to the threshold but with a larger column than the threshold's is appended too
//    (v1 refused it): harmless, a merge ranks it past kc and drops it.
//  * merge only when needed: a row is merged when its count plus this step's survivors would pass
//    FT_CAP (v1: whenever it held > CAP - 8 before a slow step): ~31 instead of ~26 entries per
//    merge, ~16 % fewer merges (benchmarks/sim_fused_selection.py: 1712 -> 1431 per warp of
//    32 rows, 1M columns, kc 128).
//  * merge without dependent global loads: v1 ranked each buffer entry by an 11-step binary search
//    over the list in global memory (11 dependent L2 round trips per merge); v2 loads the list slots
//    first (all of them into registers when kc <= 128, else one slot ahead), and gets both ranks by
//    shuffle searches per slot (list element among the buffer, buffer entry among the slot); list
//    elements that do not move are not rewritten.

#define FT_NAN __int_as_float(0x7fffffff)
#define FT_REG_SLOTS 4  // lists of kc <= 128 (the default kc for k <= 32) are merged from registers

// one buffer entry: plain st.shared, so each address is one register plus an immediate (the
// generic-pointer form cost two IMADs per store)
// (key at shared address a, column at a + BI: s_bi starts BI bytes after s_bk)
template <unsigned BI>
__device__ __forceinline__ void ft_sts2(unsigned a, float key, int col) {
    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a), "f"(key) : "memory");
    asm volatile("st.shared.s32 [%0+%2], %1;\n" ::"r"(a), "r"(col), "n"(BI) : "memory");
}

// 0xffffffff when a <= b, else 0 (false when either is NaN, as the C comparison): one FSET, so the
// per-row survivor counts are integer adds instead of predicate selects.
__device__ __forceinline__ unsigned ft_le_mask(float a, float b) {
    unsigned r;
    asm("set.le.u32.f32 %0, %1, %2;" : "=r"(r) : "f"(a), "f"(b));
    return r;
}

// Ascending bitonic sort of one (key, index) pair per lane across the warp.
__device__ __forceinline__ void ft_sort32(float& bk, int& bi, int lane) {
#pragma unroll
    for (int size = 2; size <= 32; size <<= 1) {
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            float ok = __shfl_xor_sync(0xffffffffu, bk, stride);
            int oi = __shfl_xor_sync(0xffffffffu, bi, stride);
            bool up = (lane & size) == 0;  // size == 32: every lane ascending
            bool lower = (lane & stride) == 0;
            bool take_min = (lower == up);
            bool other_less = ft_less(ok, oi, bk, bi);
            if (take_min ? other_less : ft_less(bk, bi, ok, oi)) { bk = ok; bi = oi; }
        }
    }
}

// Ranks for one 32-element slot of the sorted list (this lane: list element (lk, li); padding past
// kc is (+inf, NOIDX)) against the sorted buffer (this lane: (bk, bi); real entries in lanes < cnt):
//   lo: # buffer entries before my list element (it moves from i to i + lo),
//   cb: # elements of this slot before my buffer entry (summed over the slots: its list rank).
// Two independent 6-step shuffle searches.
__device__ __forceinline__ void ft_slot_ranks(float lk, int li, float bk, int bi, int cnt, int& lo, int& cb) {
    lo = 0;
    cb = 0;
#pragma unroll
    for (int step = 32; step > 0; step >>= 1) {
        const int p = lo + step - 1, q = cb + step - 1;
        const float pk = __shfl_sync(0xffffffffu, bk, p & 31);
        const int pi = __shfl_sync(0xffffffffu, bi, p & 31);
        const float qk = __shfl_sync(0xffffffffu, lk, q & 31);
        const int qi = __shfl_sync(0xffffffffu, li, q & 31);
        if (p < cnt && ft_less(pk, pi, lk, li)) lo += step;
        if (q < 32 && ft_less(qk, qi, bk, bi)) cb += step;
    }
}

// Merge row br's cnt buffered pairs (any order, cnt <= 32) into its sorted global list L (kc
// entries); updates s_thr[br] to the new kc-th key. Warp-synchronous: all 32 lanes call it with the
// same arguments. An element of the list moves from i to i + lo >= i and a buffer entry j goes to
// j + (# list elements before it); the targets are distinct, so with every read done before the
// writes of a slot (registers: all slots; streaming: slots top first, the next one read ahead, the
// targets of slot s are >= 32 s) the list is merged in place. Not inlined (rare; 9 call sites).
__device__ __noinline__ void ft_merge_row2(int br, int cnt, float* __restrict__ Ld, int* __restrict__ Li, int kc,
                                           const float* s_bk, const int* s_bi, float* s_thr, int lane) {
    float bk = lane < cnt ? s_bk[br * FT_CAP + lane] : FT_INF;
    int bi = lane < cnt ? s_bi[br * FT_CAP + lane] : FT_NOIDX;
    int before = 0;  // list elements before my buffer entry
    if (kc <= 32 * FT_REG_SLOTS) {
        float lk[FT_REG_SLOTS];
        int li[FT_REG_SLOTS];
#pragma unroll
        for (int s = 0; s < FT_REG_SLOTS; ++s) {  // issued before the sort: its latency hides theirs
            const int i = s * 32 + lane;
            lk[s] = i < kc ? Ld[i] : FT_INF;
            li[s] = i < kc ? Li[i] : FT_NOIDX;
        }
        ft_sort32(bk, bi, lane);
        // all slots, also those past kc (padding: no list element before a buffer entry, never
        // written): no branch, so the four independent searches interleave
        int lo[FT_REG_SLOTS];
#pragma unroll
        for (int s = 0; s < FT_REG_SLOTS; ++s) {
            int cb;
            ft_slot_ranks(lk[s], li[s], bk, bi, cnt, lo[s], cb);
            before += cb;
        }
        __syncwarp();  // every lane has read the whole list
#pragma unroll
        for (int s = 0; s < FT_REG_SLOTS; ++s) {
            const int i = s * 32 + lane, rank = i + lo[s];
            if (i < kc && lo[s] > 0 && rank < kc) {  // lo == 0: already in place
                Ld[rank] = lk[s];
                Li[rank] = li[s];
                if (rank == kc - 1) s_thr[br] = lk[s];
            }
        }
    } else {
        const int nslot = (kc + 31) >> 5;
        int i = (nslot - 1) * 32 + lane;
        float lk = i < kc ? Ld[i] : FT_INF;
        int li = i < kc ? Li[i] : FT_NOIDX;
        ft_sort32(bk, bi, lane);
        for (int s = nslot - 1; s >= 0; --s, i -= 32) {
            float nk = FT_INF;
            int ni = FT_NOIDX;
            if (s > 0) { nk = Ld[i - 32]; ni = Li[i - 32]; }  // next slot, read before this slot's writes
            int lo, cb;
            ft_slot_ranks(lk, li, bk, bi, cnt, lo, cb);
            before += cb;
            __syncwarp();  // every lane has read slot s (and s - 1) before any lane overwrites it
            const int rank = i + lo;
            if (i < kc && lo > 0 && rank < kc) {
                Ld[rank] = lk;
                Li[rank] = li;
                if (rank == kc - 1) s_thr[br] = lk;
            }
            lk = nk;
            li = ni;
        }
    }
    const int brank = lane + before;
    if (lane < cnt && brank < kc) {
        Ld[brank] = bk;
        Li[brank] = bi;
        if (brank == kc - 1) s_thr[br] = bk;
    }
    __syncwarp();
}

// Merge the rows flagged in `need` (bit 4 g + r: row slot r = 2 mt + h of quad g, as reported by
// lane (g, t4 = r)); counts come from the packed per-lane register. Then every lane reloads its
// rows' thresholds. Warp-uniform.
template <int MT>
__device__ __forceinline__ void ft_merge_flagged(unsigned need, unsigned cntpk, float (&thr)[MT][2], int row0,
                                                 int wrow, int g, int lane, int kc, float* __restrict__ best_d,
                                                 int* __restrict__ best_i, const float* s_bk, const int* s_bi,
                                                 float* s_thr) {
    __syncwarp();  // the buffer entries written by every lane are visible to every lane
    while (need) {
        const int p = __ffs(need) - 1;
        need &= need - 1;
        const int r = p & 3;
        const int br = wrow + (r >> 1) * 16 + (r & 1) * 8 + (p >> 2);
        const int cnt = (__shfl_sync(0xffffffffu, cntpk, p) >> (8 * r)) & 0xff;
        const long long off = (long long)(row0 + br) * kc;
        ft_merge_row2(br, cnt, best_d + off, best_i + off, kc, s_bk, s_bi, s_thr, lane);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) thr[mt][h] = s_thr[wrow + mt * 16 + h * 8 + g];
}

// v2 slow step j (compile-time after unrolling) of a chunk whose keys are already formed in acc[.][j]:
// survivors per row against the current register thresholds, merges of the rows that would overflow,
// appends. Warp-uniform; a step where no key survives appends nothing (so a caller may enter it on a
// superset test, e.g. thresholds older than the current ones, which only ever decrease).
// ak: shared byte address of this lane's first row buffer (s_bk + (wrow + g) FT_CAP); m1 / m2: masks
// of the quad lanes before this one (see ft_select_chunk2).
template <int MT, int NW>
__device__ __forceinline__ void ft_slow_step2(const int j, float (&acc)[MT][8][4], float (&thr)[MT][2],
                                              unsigned& cntpk, int c0, int kc, int row0, int wrow, int lane, int t4,
                                              int g, float* __restrict__ best_d, int* __restrict__ best_i,
                                              float* s_bk, int* s_bi, float* s_thr, unsigned m1, unsigned m2,
                                              unsigned ak) {
    // slow step: survivors per row (byte 2 mt + h), quad prefix, merge rows that would overflow
    unsigned sv[MT][4];  // survivor masks (0 / ~0): key <= the row's threshold (NaN: never)
    unsigned ex, tot;
    for (;;) {  // at most twice: after a merge the merged rows hold 0 (+ <= 8 <= FT_CAP)
        unsigned x = 0;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                sv[mt][2 * h] = ft_le_mask(acc[mt][j][2 * h], thr[mt][h]);
                sv[mt][2 * h + 1] = ft_le_mask(acc[mt][j][2 * h + 1], thr[mt][h]);
                x += (0u - sv[mt][2 * h] - sv[mt][2 * h + 1]) << (8 * (2 * mt + h));
            }
        const unsigned px = __shfl_xor_sync(0xffffffffu, x, 1);
        const unsigned pair = x + px;
        const unsigned opp = __shfl_xor_sync(0xffffffffu, pair, 2);
        tot = pair + opp;                  // the quad's survivors per row (bytes <= 8)
        ex = (px & m1) + (opp & m2);       // survivors of the quad's lanes before mine
        // byte of cntpk + tot > FT_CAP (bytes <= FT_CAP + 8: no carry between bytes)
        const unsigned over = (cntpk + tot + (0x7fu - FT_CAP) * 0x01010101u) & 0x80808080u;
        const unsigned need = __ballot_sync(0xffffffffu, (over >> (8 * t4 + 7)) & 1u);
        if (!need) break;
        ft_merge_flagged<MT>(need, cntpk, thr, row0, wrow, g, lane, kc, best_d, best_i, s_bk, s_bi, s_thr);
        // clear the merged rows' counts: bit r of my quad's nibble -> byte r
        const unsigned mine = (need >> (lane & ~3)) & 0xfu;
        cntpk &= ~(((mine * 0x00204081u) & 0x01010101u) * 0xffu);
    }
    const unsigned pos = cntpk + ex;
    cntpk += tot;
    const int ca = c0 + j * 8 + 2 * t4;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            // byte offsets of my entries: row (mt, h) at + (16 mt + 8 h) FT_CAP 4 (an immediate)
            const unsigned o = __byte_perm(pos, 0u, 0x4440u + 2 * mt + h) * 4u;
            const unsigned o1 = o - sv[mt][2 * h] * 4u;  // after my first column's entry, if any
            constexpr unsigned BI = ft_bm(MT, NW) * FT_CAP * 4;
            const unsigned a = ak + (mt * 16 + h * 8) * FT_CAP * 4;  // constant per unrolled (mt, h)
            if (sv[mt][2 * h]) ft_sts2<BI>(a + o, acc[mt][j][2 * h], ca);
            if (sv[mt][2 * h + 1]) ft_sts2<BI>(a + o1, acc[mt][j][2 * h + 1], ca + 1);
        }
}

// v2 selection of one chunk (see ft_select_chunk for the layout). cntpk: this lane's buffer
// counts, byte r = 2 mt + h for row wrow + 16 mt + 8 h + g (the same on the 4 lanes of a quad).
template <int MT, int NW>
__device__ __forceinline__ void ft_select_chunk2(float (&acc)[MT][8][4], const float (&cb)[8][2],
                                                 float (&thr)[MT][2], const int (&sid)[MT][2], unsigned& cntpk,
                                                 int c0, int n, int kc, int row0, int wrow, int lane, int t4, int g,
                                                 float* __restrict__ best_d, int* __restrict__ best_i, float* s_bk,
                                                 int* s_bi, float* s_thr, float alpha) {
    static_assert(MT <= 2, "one count byte per row: 4 rows per lane at most");
    // columns past n and excluded columns: NaN dot product -> NaN key, refused by every test
    // (warp-uniform branch, taken for the last chunk and the chunks holding a row's own column)
    {
        bool hit = c0 + FT_BN > n;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) hit |= (unsigned)(sid[mt][h] - c0) < (unsigned)FT_BN;
        if (__any_sync(0xffffffffu, hit)) {
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int c = c0 + j * 8 + 2 * t4 + (e & 1);
                        if (c >= n || c == sid[mt][e >> 1]) acc[mt][j][e] = FT_NAN;
                    }
        }
    }
    const unsigned m1 = (t4 & 1) ? 0xffffffffu : 0u, m2 = (t4 & 2) ? 0xffffffffu : 0u;
    // shared-window byte address of my rows' key buffers (row (mt, h): + (16 mt + 8 h) FT_CAP entries;
    // the columns follow at s_bi = s_bk + BM FT_CAP)
    const unsigned ak = ft_smem_addr(s_bk + (wrow + g) * FT_CAP);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        bool maybe = false;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float key = fmaf(alpha, acc[mt][j][e], cb[j][e & 1]);
                acc[mt][j][e] = key;
                maybe |= key <= thr[mt][e >> 1];
            }
        if (!__any_sync(0xffffffffu, maybe)) continue;
        ft_slow_step2<MT, NW>(j, acc, thr, cntpk, c0, kc, row0, wrow, lane, t4, g, best_d, best_i, s_bk, s_bi, s_thr,
                              m1, m2, ak);
    }
}

// v2 final merge of every row of this warp whose buffer is not empty.
template <int MT>
__device__ __forceinline__ void ft_flush_rows2(unsigned cntpk, float (&thr)[MT][2], int row0, int wrow, int g,
                                               int lane, int t4, int kc, float* __restrict__ best_d,
                                               int* __restrict__ best_i, const float* s_bk, const int* s_bi,
                                               float* s_thr) {
    const unsigned need = __ballot_sync(0xffffffffu, ((cntpk >> (8 * t4)) & 0xffu) != 0);
    if (need) ft_merge_flagged<MT>(need, cntpk, thr, row0, wrow, g, lane, kc, best_d, best_i, s_bk, s_bi, s_thr);
}

// Per-row state of the block and the warp's output lists: lists start as (+inf, NOIDX); rows past
// m never accept anything (no key is <= -inf). FT_EXP_NOSELECT (experiments only: the cost of
// the main loop + filter alone) makes every row refuse everything.
template <int MT, int NW>
__device__ __forceinline__ void ft_init_rows(int row0, int m, int wrow, int tid, int lane, int kc,
                                             float* __restrict__ best_d, int* __restrict__ best_i, int* s_cnt,
                                             float* s_thr, int* s_thri) {
    constexpr int BM = ft_bm(MT, NW);
    for (int r = tid; r < BM; r += 32 * NW) {
        s_cnt[r] = 0;
        bool valid = row0 + r < m;
#ifdef FT_EXP_NOSELECT
        valid = false;
#endif
        s_thr[r] = valid ? FT_INF : -FT_INF;
        s_thri[r] = valid ? FT_NOIDX : -1;
    }
    for (int r = 0; r < 16 * MT; ++r) {
        int gr = row0 + wrow + r;
        if (gr >= m) break;
        for (int j = lane; j < kc; j += 32) {
            best_d[(long long)gr * kc + j] = FT_INF;
            best_i[(long long)gr * kc + j] = FT_NOIDX;
        }
    }
}

// Register copies of this lane's rows' thresholds and excluded (self) ids; lr = mt*16 + h*8 + g.
template <int MT>
__device__ __forceinline__ void ft_row_registers(float (&thr)[MT][2], int (&sid)[MT][2], const float* s_thr,
                                                 const int* __restrict__ self_ids, int row0, int wrow, int g,
                                                 int m) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int br = wrow + mt * 16 + h * 8 + g;
            thr[mt][h] = s_thr[br];
            sid[mt][h] = (self_ids && row0 + br < m) ? self_ids[row0 + br] : -1;
        }
}

// Start of a chunk at column c0: accumulators cleared, this lane's 16 colbias values loaded (used
// only after the last k-step, so the load latency is hidden behind the main loop).
template <int MT>
__device__ __forceinline__ void ft_chunk_start(float (&acc)[MT][8][4], float (&cb)[8][2],
                                               const float* __restrict__ colbias, int c0, int n, int t4) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            int c = c0 + j * 8 + 2 * t4 + e;
            cb[j][e] = (colbias && c < n) ? __ldg(colbias + c) : 0.f;
        }
}

template <int MT, int NW>
__global__ void __launch_bounds__(32 * NW, 2) fused_topk_fp16(
    const unsigned short* __restrict__ Q, const unsigned short* __restrict__ X, int m, int n, int dp,
    const float* __restrict__ colbias, float alpha, const int* __restrict__ self_ids,
    float* __restrict__ best_d, int* __restrict__ best_i, int kc)
{
    constexpr int BM = ft_bm(MT, NW);
    constexpr int WR = 16 * MT;      // rows per warp
    constexpr int NT = 32 * NW;      // threads
    extern __shared__ uint4 ft_smem[];  // uint4: 16-byte aligned
    const int QS = dp + 8;           // Q row stride (halves): dp/8 + 1 odd -> conflict free
    unsigned short* sQ = reinterpret_cast<unsigned short*>(ft_smem);
    unsigned short* sX = sQ + (long long)BM * QS;
    float* s_bk = reinterpret_cast<float*>(sX + FT_STAGES * FT_BN * FT_XS);
    int* s_bi = reinterpret_cast<int*>(s_bk + BM * FT_CAP);
    int* s_cnt = s_bi + BM * FT_CAP;
    float* s_thr = reinterpret_cast<float*>(s_cnt + BM);
    int* s_thri = reinterpret_cast<int*>(s_thr + BM);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int row0 = blockIdx.x * BM;
    const int wrow = warp * WR;      // first block row of this warp

    // --- Q tile -> shared (rows past m clamp to m - 1; their results are never written)
    {
        const int cpr = dp >> 3;     // 16-byte pieces per row
        for (int p = tid; p < BM * cpr; p += NT) {
            int r = p / cpr, c = (p - r * cpr) << 3;
            int gr = ft_min(row0 + r, m - 1);
            ft_cp_async16(sQ + r * QS + c, Q + (long long)gr * dp + c);
        }
        ft_cp_commit();
    }
    ft_init_rows<MT, NW>(row0, m, wrow, tid, lane, kc, best_d, best_i, s_cnt, s_thr, s_thri);

    const int nsl = (dp + FT_KS - 1) / FT_KS;      // k-slices per chunk
    const int nchunk = (n + FT_BN - 1) / FT_BN;
    const int total = nchunk * nsl;

    // stage the k-slice `it` (chunk it / nsl, slice it % nsl) of X into ring slot it % FT_STAGES
    auto load_stage = [&](int it) {
        if (it < total) {
            const int ch = it / nsl, sl = it - ch * nsl;
            const int k0 = sl * FT_KS;
            const int w = ft_min(FT_KS, dp - k0);   // 32 or 64
            const int cpr = w >> 3;
            unsigned short* dst = sX + (it % FT_STAGES) * (FT_BN * FT_XS);
            for (int p = tid; p < FT_BN * cpr; p += NT) {
                int r = p / cpr, c = (p - r * cpr) << 3;
                int gc = ft_min(ch * FT_BN + r, n - 1);   // past n: clamped, masked in selection
                ft_cp_async16(dst + r * FT_XS + c, X + (long long)gc * dp + k0 + c);
            }
        }
        ft_cp_commit();  // always commit: keeps the group count uniform for wait_group
    };
#pragma unroll
    for (int s = 0; s < FT_STAGES - 1; ++s) load_stage(s);

    __syncthreads();  // per-row state visible
    float thr[MT][2];
    int sid[MT][2];
    ft_row_registers<MT>(thr, sid, s_thr, self_ids, row0, wrow, g, m);
#ifndef FT_SEL_V1
    unsigned cntpk = 0;  // v2: buffer counts of this lane's rows, one byte each
#endif

    float acc[MT][8][4];
    float cb[8][2];  // colbias of my 16 columns of the current chunk

    for (int it = 0; it < total; ++it) {
        ft_cp_wait<FT_STAGES - 2>();
        __syncthreads();  // slice `it` staged for everyone; slot (it - 1) % STAGES free again
        load_stage(it + FT_STAGES - 1);

        const int ch = it / nsl, sl = it - ch * nsl;
        const int c0 = ch * FT_BN;
        if (sl == 0) ft_chunk_start<MT>(acc, cb, colbias, c0, n, t4);
        const unsigned short* xs = sX + (it % FT_STAGES) * (FT_BN * FT_XS);
        const int k0 = sl * FT_KS;
        const int ksteps = ft_min(FT_KS, dp - k0) >> 4;
        for (int ks = 0; ks < ksteps; ++ks) {
            unsigned a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                ft_ldmatrix_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
                               sQ + (wrow + mt * 16 + (lane & 15)) * QS + k0 + ks * 16 + ((lane >> 4) << 3));
#pragma unroll
            for (int p = 0; p < 4; ++p) {
                unsigned b0, b1, b2, b3;
                ft_ldmatrix_x4(b0, b1, b2, b3,
                               xs + (p * 16 + (lane & 7) + ((lane >> 4) << 3)) * FT_XS + ks * 16 +
                                   (((lane >> 3) & 1) << 3));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    ft_mma(acc[mt][2 * p], a[mt], b0, b1);
                    ft_mma(acc[mt][2 * p + 1], a[mt], b2, b3);
                }
            }
        }
        if (sl != nsl - 1) continue;

#ifdef FT_SEL_V1
        ft_select_chunk<MT>(acc, cb, thr, sid, c0, n, kc, row0, wrow, lane, t4, g, best_d, best_i, s_bk, s_bi,
                            s_cnt, s_thr, s_thri, alpha);
#else
        ft_select_chunk2<MT, NW>(acc, cb, thr, sid, cntpk, c0, n, kc, row0, wrow, lane, t4, g, best_d, best_i, s_bk,
                             s_bi, s_thr, alpha);
#endif
    }
    ft_cp_wait<0>();

#ifdef FT_SEL_V1
    ft_flush_rows<MT>(row0, wrow, lane, kc, best_d, best_i, s_bk, s_bi, s_cnt, s_thr, s_thri);
#else
    ft_flush_rows2<MT>(cntpk, thr, row0, wrow, g, lane, t4, kc, best_d, best_i, s_bk, s_bi, s_thr);
#endif
}

// Variant for padded d = 16 KST <= 128: the block's query fragments live in registers for the
// whole pass (KST x MT x 4 words per lane; the query tile passes through shared memory once, in
// the space the data ring uses afterwards), and a ring stage holds a whole chunk (FT_BN points x
// all dp halves), so one barrier per chunk instead of one per 64-half slice and only the data
// fragments are read from shared memory in the main loop (4 ldmatrix.x4 per 16 mma instead of 6).
// The k-steps are unrolled at compile time, so the compiler can issue the next step's ldmatrix
// while this step's mma run (register double-buffering without writing it by hand).
// Same keys, selection, outputs and constraints as fused_topk_fp16 (dp == 16 * KST exactly).
__host__ __device__ constexpr int ft_ar_stride(int kst) { return 16 * kst + 8; }  // halves

// Main loop of fused_topk_fp16_ar: v2 (default; NOTES_topk.md, "Pipelined main loop") or the
// original one (-DFT_MAIN_V1, kept for A/B; implied by -DFT_SEL_V1, whose step code v2 does not use).
#if defined(FT_MAIN_V1) || defined(FT_SEL_V1)
#define FT_AR_MAIN_V1 1
#endif

#ifdef FT_AR_MAIN_V1
template <int MT, int NW, int KST>
__global__ void __launch_bounds__(32 * NW, 2) fused_topk_fp16_ar(
    const unsigned short* __restrict__ Q, const unsigned short* __restrict__ X, int m, int n, int dp,
    const float* __restrict__ colbias, float alpha, const int* __restrict__ self_ids,
    float* __restrict__ best_d, int* __restrict__ best_i, int kc)
{
    constexpr int BM = ft_bm(MT, NW);
    constexpr int WR = 16 * MT;
    constexpr int NT = 32 * NW;
    constexpr int S = ft_ar_stride(KST);     // row stride (halves) of the query tile and the ring
    constexpr int DP = 16 * KST;
    static_assert(FT_STAGES * FT_BN >= BM, "the query tile is staged in the ring's space");
    extern __shared__ uint4 ft_smem[];
    unsigned short* sX = reinterpret_cast<unsigned short*>(ft_smem);   // ring; query tile at start
    float* s_bk = reinterpret_cast<float*>(sX + FT_STAGES * FT_BN * S);
    int* s_bi = reinterpret_cast<int*>(s_bk + BM * FT_CAP);
    int* s_cnt = s_bi + BM * FT_CAP;
    float* s_thr = reinterpret_cast<float*>(s_cnt + BM);
    int* s_thri = reinterpret_cast<int*>(s_thr + BM);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int row0 = blockIdx.x * BM;
    const int wrow = warp * WR;
    constexpr int CPR = DP / 8;                // 16-byte pieces per row

    // --- query tile -> shared (rows past m clamp to m - 1) -> registers
    for (int p = tid; p < BM * CPR; p += NT) {
        int r = p / CPR, c = (p - r * CPR) << 3;
        int gr = ft_min(row0 + r, m - 1);
        ft_cp_async16(sX + r * S + c, Q + (long long)gr * DP + c);
    }
    ft_cp_commit();
    ft_init_rows<MT, NW>(row0, m, wrow, tid, lane, kc, best_d, best_i, s_cnt, s_thr, s_thri);
    ft_cp_wait<0>();
    __syncthreads();
    unsigned areg[KST][MT][4];
#pragma unroll
    for (int ks = 0; ks < KST; ++ks)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            ft_ldmatrix_x4(areg[ks][mt][0], areg[ks][mt][1], areg[ks][mt][2], areg[ks][mt][3],
                           sX + (wrow + mt * 16 + (lane & 15)) * S + ks * 16 + ((lane >> 4) << 3));
    float thr[MT][2];
    int sid[MT][2];
    ft_row_registers<MT>(thr, sid, s_thr, self_ids, row0, wrow, g, m);
#ifndef FT_SEL_V1
    unsigned cntpk = 0;  // v2: buffer counts of this lane's rows, one byte each
#endif
    __syncthreads();  // every warp holds its fragments: the ring may overwrite the query tile

    const int nchunk = (n + FT_BN - 1) / FT_BN;
    auto load_stage = [&](int ch) {
        if (ch < nchunk) {
            unsigned short* dst = sX + (ch % FT_STAGES) * (FT_BN * S);
            for (int p = tid; p < FT_BN * CPR; p += NT) {
                int r = p / CPR, c = (p - r * CPR) << 3;
                int gc = ft_min(ch * FT_BN + r, n - 1);   // past n: clamped, masked in selection
                ft_cp_async16(dst + r * S + c, X + (long long)gc * DP + c);
            }
        }
        ft_cp_commit();
    };
#pragma unroll
    for (int s = 0; s < FT_STAGES - 1; ++s) load_stage(s);

    float acc[MT][8][4];
    float cb[8][2];
    for (int ch = 0; ch < nchunk; ++ch) {
        ft_cp_wait<FT_STAGES - 2>();
        __syncthreads();  // chunk ch staged for everyone; slot (ch - 1) % STAGES free again
        load_stage(ch + FT_STAGES - 1);
        const int c0 = ch * FT_BN;
        ft_chunk_start<MT>(acc, cb, colbias, c0, n, t4);
        const unsigned short* xs = sX + (ch % FT_STAGES) * (FT_BN * S);
#pragma unroll
        for (int ks = 0; ks < KST; ++ks) {
#pragma unroll
            for (int p = 0; p < 4; ++p) {
                unsigned b0, b1, b2, b3;
                ft_ldmatrix_x4(b0, b1, b2, b3,
                               xs + (p * 16 + (lane & 7) + ((lane >> 4) << 3)) * S + ks * 16 +
                                   (((lane >> 3) & 1) << 3));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    ft_mma(acc[mt][2 * p], areg[ks][mt], b0, b1);
                    ft_mma(acc[mt][2 * p + 1], areg[ks][mt], b2, b3);
                }
            }
        }
#ifdef FT_SEL_V1
        ft_select_chunk<MT>(acc, cb, thr, sid, c0, n, kc, row0, wrow, lane, t4, g, best_d, best_i, s_bk, s_bi,
                            s_cnt, s_thr, s_thri, alpha);
#else
        ft_select_chunk2<MT, NW>(acc, cb, thr, sid, cntpk, c0, n, kc, row0, wrow, lane, t4, g, best_d, best_i, s_bk,
                             s_bi, s_thr, alpha);
#endif
    }
    ft_cp_wait<0>();
#ifdef FT_SEL_V1
    ft_flush_rows<MT>(row0, wrow, lane, kc, best_d, best_i, s_bk, s_bi, s_cnt, s_thr, s_thri);
#else
    ft_flush_rows2<MT>(cntpk, thr, row0, wrow, g, lane, t4, kc, best_d, best_i, s_bk, s_bi, s_thr);
#endif
}

#else  // main loop v2

// ===================================== main loop v2 ===========================================
// Same keys, bit for bit (every accumulator still sums its k-steps 0..KST-1 in order, starting from
// zero, and key = fmaf(alpha, dot, colbias) as before), same selection (ft_slow_step2 is v2's step),
// same outputs. What changed (NOTES_topk.md, "Pipelined main loop"):
//  * half-chunk software pipeline: a chunk's 64 columns are two halves of 32 (A: acc[.][0..3],
//    B: acc[.][4..7]); the keys of one half are formed and tested (FFMA + FSETP + one warp vote per
//    half) in the same basic block as the mma of the other half, so the filter runs in the issue
//    slots between mma instead of after them:
//        barrier(c); loads(c + 2); [mma A(c) | keys B(c - 1)]; slow steps B(c - 1) if the vote fired;
//        [mma B(c) | keys A(c)]; slow steps A(c) if the vote fired
//    (the B half of chunk c - 1 is filtered after the barrier of chunk c: its accumulators are
//    registers, its colbias is in a 4-deep ring of its own, FT_CBS, so the loads of chunk c + 2 do
//    not overwrite it). Within a half the mma go k-step outer, 8 independent accumulators per k-step.
//  * a half whose vote fires re-tests each of its 4 steps against the current thresholds (a merge in
//    step j lowers them for step j + 1), so the slow steps are exactly v2's;
//  * 32-bit shared addresses with immediate offsets for ldmatrix / cp.async / colbias (v1 built a
//    64-bit generic address per ldmatrix and ran a generic strided copy loop per chunk: ~300 integer
//    instructions per chunk and warp, more than the 128 mma);
//  * colbias staged by cp.async with the chunk (v1: 16 predicated global loads per chunk and lane).
#define FT_CBS 4  // colbias ring depth in chunks (> FT_STAGES: chunk c - 1's entry outlives the loads of c + 2)

__device__ __forceinline__ void ft_ldsm_x4a(unsigned (&r)[4], unsigned a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ft_cp16a(unsigned s, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void ft_cp4a(unsigned s, const void* gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}

// mma of half H (columns 32 H .. 32 H + 31, acc[.][4 H .. 4 H + 3]) of the chunk staged at xs (this
// lane's ldmatrix address in the ring stage); the accumulators start from zero.
template <int MT, int KST, int S, int H>
__device__ __forceinline__ void ft_mma_half(float (&acc)[MT][8][4], const unsigned (&areg)[KST][MT][4],
                                            unsigned xs) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 4 * H; j < 4 * H + 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KST; ++ks)
#pragma unroll
        for (int pp = 0; pp < 2; ++pp) {
            const int p = 2 * H + pp;  // 16-column pair: n8 tiles 2p, 2p + 1
            unsigned b[4];
            ft_ldsm_x4a(b, xs + (unsigned)((p * 16 * S + ks * 16) * 2));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                ft_mma(acc[mt][2 * p], areg[ks][mt], b[0], b[1]);
                ft_mma(acc[mt][2 * p + 1], areg[ks][mt], b[2], b[3]);
            }
        }
}

// Columns past n and excluded (self) columns of half H of the chunk at c0: NaN dot product.
template <int MT, int H>
__device__ __forceinline__ void ft_mask_half(float (&acc)[MT][8][4], int c0, int n, const int (&sid)[MT][2], int t4) {
#pragma unroll
    for (int j = 4 * H; j < 4 * H + 4; ++j)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = c0 + j * 8 + 2 * t4 + (e & 1);
                if (c >= n || c == sid[mt][e >> 1]) acc[mt][j][e] = FT_NAN;
            }
}

// Keys of half H formed in place (key = colbias + alpha dot, as ft_select_chunk2), tested against the
// register thresholds; returns the warp vote "some key of the half may survive". cbs: colbias of the
// chunk (its ring entry; this lane's columns 8 j + 2 t4, + 1 at cbs[8 j], cbs[8 j + 1]).
template <int MT, int H>
__device__ __forceinline__ bool ft_keys_half(float (&acc)[MT][8][4], const float* cbs, const float (&thr)[MT][2],
                                             float alpha) {
    bool maybe = false;
#pragma unroll
    for (int j = 4 * H; j < 4 * H + 4; ++j) {
        const float2 cb = *reinterpret_cast<const float2*>(cbs + 8 * j);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float key = fmaf(alpha, acc[mt][j][e], (e & 1) ? cb.y : cb.x);
                acc[mt][j][e] = key;
                maybe |= key <= thr[mt][e >> 1];
            }
    }
    return __any_sync(0xffffffffu, maybe);
}

// The 4 steps of half H whose half vote fired: each re-tested against the current thresholds
// (v2's per-step vote), slow step where a key survives.
template <int MT, int NW, int H>
__device__ __forceinline__ void ft_slow_half(float (&acc)[MT][8][4], float (&thr)[MT][2], unsigned& cntpk, int c0,
                                             int kc, int row0, int wrow, int lane, int t4, int g,
                                             float* __restrict__ best_d, int* __restrict__ best_i, float* s_bk,
                                             int* s_bi, float* s_thr, unsigned m1, unsigned m2, unsigned ak) {
#pragma unroll
    for (int j = 4 * H; j < 4 * H + 4; ++j) {
        bool maybe = false;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) maybe |= acc[mt][j][e] <= thr[mt][e >> 1];
        if (__any_sync(0xffffffffu, maybe))
            ft_slow_step2<MT, NW>(j, acc, thr, cntpk, c0, kc, row0, wrow, lane, t4, g, best_d, best_i, s_bk, s_bi,
                                  s_thr, m1, m2, ak);
    }
}

template <int MT, int NW, int KST>
__global__ void __launch_bounds__(32 * NW, 2) fused_topk_fp16_ar(
    const unsigned short* __restrict__ Q, const unsigned short* __restrict__ X, int m, int n, int dp,
    const float* __restrict__ colbias, float alpha, const int* __restrict__ self_ids,
    float* __restrict__ best_d, int* __restrict__ best_i, int kc)
{
    constexpr int BM = ft_bm(MT, NW);
    constexpr int WR = 16 * MT;
    constexpr int NT = 32 * NW;
    constexpr int S = ft_ar_stride(KST);       // row stride (halves) of the query tile and the ring
    constexpr int DP = 16 * KST;
    constexpr int CPR = DP / 8;                // 16-byte pieces per row
    constexpr int PIECES = FT_BN * CPR;        // per chunk: 128 KST, i.e. KST per thread when NT = 128
    constexpr unsigned STB = FT_BN * S * 2;    // bytes per ring stage
    static_assert(FT_STAGES * FT_BN >= BM, "the query tile is staged in the ring's space");
    static_assert(FT_CBS > FT_STAGES && (FT_CBS & (FT_CBS - 1)) == 0, "colbias ring");
    extern __shared__ uint4 ft_smem[];
    unsigned short* sX = reinterpret_cast<unsigned short*>(ft_smem);   // ring; query tile at start
    float* s_bk = reinterpret_cast<float*>(sX + FT_STAGES * FT_BN * S);
    int* s_bi = reinterpret_cast<int*>(s_bk + BM * FT_CAP);
    int* s_cnt = s_bi + BM * FT_CAP;
    float* s_thr = reinterpret_cast<float*>(s_cnt + BM);
    int* s_thri = reinterpret_cast<int*>(s_thr + BM);
    float* s_cb = reinterpret_cast<float*>(s_thri + BM);   // FT_CBS x FT_BN colbias (16-byte aligned)

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int row0 = blockIdx.x * BM;
    const int wrow = warp * WR;

    // --- query tile -> shared (rows past m clamp to m - 1) -> registers (as v1)
    for (int p = tid; p < BM * CPR; p += NT) {
        int r = p / CPR, c = (p - r * CPR) << 3;
        int gr = ft_min(row0 + r, m - 1);
        ft_cp_async16(sX + r * S + c, Q + (long long)gr * DP + c);
    }
    ft_cp_commit();
    ft_init_rows<MT, NW>(row0, m, wrow, tid, lane, kc, best_d, best_i, s_cnt, s_thr, s_thri);
    ft_cp_wait<0>();
    __syncthreads();
    unsigned areg[KST][MT][4];
#pragma unroll
    for (int ks = 0; ks < KST; ++ks)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            ft_ldmatrix_x4(areg[ks][mt][0], areg[ks][mt][1], areg[ks][mt][2], areg[ks][mt][3],
                           sX + (wrow + mt * 16 + (lane & 15)) * S + ks * 16 + ((lane >> 4) << 3));
    float thr[MT][2];
    int sid[MT][2];
    ft_row_registers<MT>(thr, sid, s_thr, self_ids, row0, wrow, g, m);
    unsigned cntpk = 0;  // v2: buffer counts of this lane's rows, one byte each
    const bool has_cb = colbias != nullptr;
    const bool cb16 = has_cb && (reinterpret_cast<unsigned long long>(colbias) & 15u) == 0;
    if (!has_cb)
        for (int i = tid; i < FT_CBS * FT_BN; i += NT) s_cb[i] = 0.f;
    __syncthreads();  // every warp holds its fragments: the ring may overwrite the query tile

    const int nchunk = (n + FT_BN - 1) / FT_BN;
    const unsigned sx0 = ft_smem_addr(sX), scb0 = ft_smem_addr(s_cb);
    // a chunk is FT_BN contiguous rows of DP halves in X: piece p (16 bytes) of it is at byte 16 p there
    // and at byte 16 (p + p / CPR) in the stage (rows padded by 8 halves)
    const char* xg = reinterpret_cast<const char*>(X) + 16 * tid;
    auto load_chunk = [&](int ch) {
        if (ch < nchunk) {
            const unsigned dst = sx0 + (unsigned)(ch % FT_STAGES) * STB;
            const unsigned cdst = scb0 + (unsigned)(ch & (FT_CBS - 1)) * (FT_BN * 4);
            if ((ch + 1) * FT_BN <= n) {
                const char* src = xg + (long long)ch * (FT_BN * DP * 2);
#pragma unroll
                for (int i = 0; i < (PIECES + NT - 1) / NT; ++i) {
                    const int p = tid + NT * i;
                    const int r = (NT % CPR == 0) ? tid / CPR + i * (NT / CPR) : p / CPR;
                    if (PIECES % NT == 0 || p < PIECES) ft_cp16a(dst + 16u * (unsigned)(p + r), src + 16 * NT * i);
                }
                if (cb16 && tid < FT_BN / 4) ft_cp16a(cdst + 16u * tid, colbias + ch * FT_BN + 4 * tid);
                else if (has_cb && !cb16 && tid < FT_BN) ft_cp4a(cdst + 4u * tid, colbias + ch * FT_BN + tid);
            } else {  // the last, partial chunk: rows past n clamped to n - 1 (masked in the selection)
                for (int p = tid; p < PIECES; p += NT) {
                    const int r = p / CPR, c = p - r * CPR;
                    const int gc = ft_min(ch * FT_BN + r, n - 1);
                    ft_cp16a(dst + 16u * (unsigned)(p + r), X + (long long)gc * DP + 8 * c);
                }
                if (has_cb && tid < FT_BN) ft_cp4a(cdst + 4u * tid, colbias + ft_min(ch * FT_BN + tid, n - 1));
            }
        }
        ft_cp_commit();  // always commit: keeps the group count uniform for wait_group
    };
#pragma unroll
    for (int s = 0; s < FT_STAGES - 1; ++s) load_chunk(s);

    // this lane's ldmatrix offset in a stage (rows of the 16-column pair, 8-half k offset), bytes
    const unsigned lb = (unsigned)(((((lane & 7) + ((lane >> 4) << 3)) * S) + (((lane >> 3) & 1) << 3)) * 2);
    const float* cbl = s_cb + 2 * t4;  // + entry * FT_BN: this lane's colbias columns
    const unsigned m1 = (t4 & 1) ? 0xffffffffu : 0u, m2 = (t4 & 2) ? 0xffffffffu : 0u;
    const unsigned ak = ft_smem_addr(s_bk + (wrow + g) * FT_CAP);

    float acc[MT][8][4];
    // the B half of "chunk -1": NaN keys, no survivor, no vote
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 4; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][j][e] = FT_NAN;
    bool hit_prev = false;  // chunk ch - 1 needs masking (past n or a row's own column)

    for (int ch = 0; ch < nchunk; ++ch) {
        ft_cp_wait<FT_STAGES - 2>();
        __syncthreads();  // chunk ch staged for everyone; stage (ch - 1) % STAGES free again
        load_chunk(ch + FT_STAGES - 1);
        const int c0 = ch * FT_BN;
        const unsigned xs = sx0 + (unsigned)(ch % FT_STAGES) * STB + lb;
        bool hit = c0 + FT_BN > n;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) hit |= (unsigned)(sid[mt][h] - c0) < (unsigned)FT_BN;
        hit = __any_sync(0xffffffffu, hit);

        // mma of the A half of chunk ch | keys of the B half of chunk ch - 1
        if (hit_prev) ft_mask_half<MT, 1>(acc, c0 - FT_BN, n, sid, t4);
        ft_mma_half<MT, KST, S, 0>(acc, areg, xs);
        if (ft_keys_half<MT, 1>(acc, cbl + ((ch - 1) & (FT_CBS - 1)) * FT_BN, thr, alpha))
            ft_slow_half<MT, NW, 1>(acc, thr, cntpk, c0 - FT_BN, kc, row0, wrow, lane, t4, g, best_d, best_i, s_bk,
                                    s_bi, s_thr, m1, m2, ak);

        // mma of the B half of chunk ch | keys of the A half of chunk ch
        if (hit) ft_mask_half<MT, 0>(acc, c0, n, sid, t4);
        ft_mma_half<MT, KST, S, 1>(acc, areg, xs);
        if (ft_keys_half<MT, 0>(acc, cbl + (ch & (FT_CBS - 1)) * FT_BN, thr, alpha))
            ft_slow_half<MT, NW, 0>(acc, thr, cntpk, c0, kc, row0, wrow, lane, t4, g, best_d, best_i, s_bk, s_bi,
                                    s_thr, m1, m2, ak);
        hit_prev = hit;
    }
    if (nchunk > 0) {  // the B half of the last chunk
        const int c0 = (nchunk - 1) * FT_BN;
        if (hit_prev) ft_mask_half<MT, 1>(acc, c0, n, sid, t4);
        if (ft_keys_half<MT, 1>(acc, cbl + ((nchunk - 1) & (FT_CBS - 1)) * FT_BN, thr, alpha))
            ft_slow_half<MT, NW, 1>(acc, thr, cntpk, c0, kc, row0, wrow, lane, t4, g, best_d, best_i, s_bk, s_bi,
                                    s_thr, m1, m2, ak);
    }
    ft_cp_wait<0>();
    ft_flush_rows2<MT>(cntpk, thr, row0, wrow, g, lane, t4, kc, best_d, best_i, s_bk, s_bi, s_thr);
}
#endif  // main loop v2
