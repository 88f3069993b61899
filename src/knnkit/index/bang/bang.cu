// BANG host-placement search kernels: Karthik et al., "BANG: Billion-Scale ANN Search using a
// Single GPU", section 4 -- 4.4 (Bloom filter of visited nodes, one per query), 4.5 (neighbour
// distances from the per-query PQ distance tables of 4.2, a group of GS lanes per neighbour with a
// sub-warp reduction), 4.6 (prefetch: the next candidate is chosen right after the distances, before
// the work list is merged, so the host gathers its neighbours while the merge runs), 4.7-4.8 (sorting
// the new neighbours and merging them with the work list by binary searches).
//
// The graph is not here: the host gathers the neighbour rows of each query's candidate and copies
// them in (``nbrs``). One thread block per query in every kernel. Order of entries: by distance,
// then by node id (a total order, as in the CPU twin _search_cpu.py, so both keep the same lists;
// ids in a list are distinct because a node passes the Bloom filter once).
// Work list layout per query: ids[L], dist[L], flag[L] (1 = expanded); empty slots hold id -1 and
// distance +inf and sort last.

#define BANG_INF __int_as_float(0x7f800000)

namespace bang {

// Same blocked Bloom filter as index/search.cu (and _search_cpu._bloom_insert): the three bits of a
// node lie in one 32-bit word, so one atomicOr tests and sets them.
__device__ __forceinline__ bool bloom_insert(unsigned* __restrict__ words, unsigned wmask, int node) {
    unsigned h = (unsigned)node;
    h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
    const unsigned bits = (1u << ((h >> 17) & 31u)) | (1u << ((h >> 22) & 31u)) | (1u << (h >> 27));
    const unsigned old = atomicOr(words + (h & wmask), bits);
    return (old & bits) != bits;
}

__device__ __forceinline__ bool key_less(float da, int ia, float db, int ib) {
    return da < db || (da == db && (unsigned)ia < (unsigned)ib);  // id -1 -> largest
}

// Choose the next node to expand: the first unexpanded work-list entry or the best new neighbour
// (`nbest`, index in the new list, -1 when none), whichever is smaller; log it. Called by the
// whole block; `s_first` is shared scratch.
__device__ void select_next(int q, const int* __restrict__ wl_ids, const float* __restrict__ wl_d,
                            unsigned char* __restrict__ wl_x, int L, const int* __restrict__ new_ids,
                            const float* __restrict__ new_d, int nbest, int* __restrict__ new_taken,
                            int* __restrict__ cand, int* __restrict__ log_ids, float* __restrict__ log_d,
                            int* __restrict__ n_exp, int max_iters, int* s_first) {
    if (threadIdx.x == 0) *s_first = L;
    __syncthreads();
    const size_t base = (size_t)q * L;
    for (int i = threadIdx.x; i < L; i += blockDim.x)
        if (wl_ids[base + i] >= 0 && !wl_x[base + i]) atomicMin(s_first, i);
    __syncthreads();
    if (threadIdx.x == 0) {
        const int ne = n_exp[q];
        const int iw = *s_first;
        int node = -1;
        float d = BANG_INF;
        int take_new = -1;
        if (ne < max_iters) {
            if (iw < L) { node = wl_ids[base + iw]; d = wl_d[base + iw]; }
            if (nbest >= 0) {
                const int nb = nbest;  // new_ids/new_d point at this query's new list
                if (node < 0 || key_less(new_d[nb], new_ids[nb], d, node)) {
                    node = new_ids[nb]; d = new_d[nb]; take_new = nbest;
                }
            }
            if (node >= 0) {
                if (take_new < 0) wl_x[base + iw] = 1;
                log_ids[(size_t)q * max_iters + ne] = node;
                log_d[(size_t)q * max_iters + ne] = d;
                n_exp[q] = ne + 1;
            }
        }
        if (new_taken) new_taken[q] = take_new;
        cand[q] = node;
    }
    __syncthreads();
}

}  // namespace bang

// PQ distances of each query's fresh neighbours (section 4.5). nbrs: (nq, width) ids (-1 = none);
// tables: (nq, m, ksub) float; copied to shared memory when use_smem (4.2). Neighbours that pass the
// Bloom filter and beat the work list's worst entry are appended to new_ids/new_d (nq, new_cap,
// new_cap >= width) and counted in n_new. With `select` (prefetch, 4.6) the next candidate is
// chosen here already. GS: lanes per neighbour, a power of two <= 32 dividing blockDim.x.
extern "C" __global__ void bang_distances(
    const int* __restrict__ nbrs, int width, const unsigned char* __restrict__ codes, int m,
    const float* __restrict__ tables, int ksub, int use_smem, unsigned* __restrict__ bloom, int bloom_words,
    const int* __restrict__ wl_ids, const float* __restrict__ wl_d, unsigned char* __restrict__ wl_x, int L,
    int* __restrict__ new_ids, float* __restrict__ new_d, int* __restrict__ n_new, int new_cap, int select,
    int* __restrict__ new_taken, int* __restrict__ cand, int* __restrict__ log_ids, float* __restrict__ log_d,
    int* __restrict__ n_exp, int max_iters, int GS, int nq) {
    extern __shared__ float s_table[];
    __shared__ int s_cnt, s_first, s_best;
    const int q = blockIdx.x;
    if (q >= nq) return;
    const float* T = tables + (size_t)q * m * ksub;
    if (use_smem) {
        for (int i = threadIdx.x; i < m * ksub; i += blockDim.x) s_table[i] = T[i];
        T = s_table;
    }
    if (threadIdx.x == 0) s_cnt = 0;
    __syncthreads();
    const size_t wb = (size_t)q * L;
    const float worst_d = wl_ids[wb + L - 1] >= 0 ? wl_d[wb + L - 1] : BANG_INF;
    const int worst_i = wl_ids[wb + L - 1];
    unsigned* words = bloom + (size_t)q * bloom_words;
    const int lane = threadIdx.x % GS;
    const int groups = blockDim.x / GS;
    int* my_new_ids = new_ids + (size_t)q * new_cap;
    float* my_new_d = new_d + (size_t)q * new_cap;
    for (int base = 0; base < width; base += groups) {  // uniform trip count across the block
        const int j = base + threadIdx.x / GS;
        const int node = j < width ? nbrs[(size_t)q * width + j] : -1;
        int fresh = 0;
        if (lane == 0 && node >= 0) fresh = bang::bloom_insert(words, (unsigned)(bloom_words - 1), node) ? 1 : 0;
        fresh = __shfl_sync(0xffffffffu, fresh, 0, GS);
        float acc = 0.f;
        if (fresh) {
            const unsigned char* row = codes + (size_t)node * m;
            for (int t = lane; t < m; t += GS) acc += T[t * ksub + row[t]];
        }
        for (int off = GS / 2; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off, GS);
        if (lane == 0 && fresh && bang::key_less(acc, node, worst_d, worst_i)) {
            const int p = atomicAdd(&s_cnt, 1);
            my_new_ids[p] = node;
            my_new_d[p] = acc;
        }
    }
    __syncthreads();
    const int cnt = s_cnt;
    if (threadIdx.x == 0) n_new[q] = cnt;
    if (!select) return;
    if (threadIdx.x == 0) {  // best new entry: at most `width` of them
        int b = -1;
        for (int i = 0; i < cnt; ++i)
            if (b < 0 || bang::key_less(my_new_d[i], my_new_ids[i], my_new_d[b], my_new_ids[b])) b = i;
        s_best = b;
    }
    __syncthreads();
    bang::select_next(q, wl_ids, wl_d, wl_x, L, my_new_ids, my_new_d, s_best, new_taken, cand, log_ids, log_d,
                      n_exp, max_iters, &s_first);
}

// Merge each query's new entries into its work list (sections 4.7-4.8): the new entries are
// rank-sorted in shared memory (one thread per entry counts the smaller ones), then every element of
// both lists finds its output slot by a binary search in the other list; the first L slots are kept.
// new_taken[q] (>= 0) marks the new entry that the prefetch already expanded.
// Shared memory: new_cap * 9 + L * 9 bytes.
extern "C" __global__ void bang_merge(int* __restrict__ wl_ids, float* __restrict__ wl_d,
                                      unsigned char* __restrict__ wl_x, int L, const int* __restrict__ new_ids,
                                      const float* __restrict__ new_d, const int* __restrict__ n_new, int new_cap,
                                      const int* __restrict__ new_taken, int nq) {
    extern __shared__ float smem[];
    const int q = blockIdx.x;
    if (q >= nq) return;
    const int cnt = n_new[q];
    if (cnt == 0) return;
    float* sd = smem;                              // sorted new distances [new_cap]
    int* si = (int*)(sd + new_cap);                // sorted new ids [new_cap]
    float* od = (float*)(si + new_cap);            // merged distances [L]
    int* oi = (int*)(od + L);                      // merged ids [L]
    unsigned char* sx = (unsigned char*)(oi + L);  // sorted new flags [new_cap]
    unsigned char* ox = sx + new_cap;              // merged flags [L]
    const size_t nb = (size_t)q * new_cap;
    const size_t wb = (size_t)q * L;
    const int taken = new_taken ? new_taken[q] : -1;
    for (int t = threadIdx.x; t < cnt; t += blockDim.x) {
        const float d = new_d[nb + t];
        const int id = new_ids[nb + t];
        int r = 0;
        for (int u = 0; u < cnt; ++u) r += bang::key_less(new_d[nb + u], new_ids[nb + u], d, id) ? 1 : 0;
        sd[r] = d; si[r] = id; sx[r] = (t == taken) ? 1 : 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < L; i += blockDim.x) {  // work-list entries: slot i + #new smaller
        const float d = wl_d[wb + i];
        const int id = wl_ids[wb + i];
        int lo = 0, hi = cnt;
        while (lo < hi) { const int mid = (lo + hi) >> 1; if (bang::key_less(sd[mid], si[mid], d, id)) lo = mid + 1; else hi = mid; }
        const int pos = i + lo;
        if (pos < L) { od[pos] = d; oi[pos] = id; ox[pos] = wl_x[wb + i]; }
    }
    for (int j = threadIdx.x; j < cnt; j += blockDim.x) {  // new entries: slot j + #work-list smaller
        const float d = sd[j];
        const int id = si[j];
        int lo = 0, hi = L;
        while (lo < hi) { const int mid = (lo + hi) >> 1; if (bang::key_less(wl_d[wb + mid], wl_ids[wb + mid], d, id)) lo = mid + 1; else hi = mid; }
        const int pos = j + lo;
        if (pos < L) { od[pos] = d; oi[pos] = id; ox[pos] = sx[j]; }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < L; i += blockDim.x) { wl_d[wb + i] = od[i]; wl_ids[wb + i] = oi[i]; wl_x[wb + i] = ox[i]; }
}

// Next candidate without prefetch: the first unexpanded entry of the merged work list.
extern "C" __global__ void bang_select(const int* __restrict__ wl_ids, const float* __restrict__ wl_d,
                                       unsigned char* __restrict__ wl_x, int L, int* __restrict__ cand,
                                       int* __restrict__ log_ids, float* __restrict__ log_d, int* __restrict__ n_exp,
                                       int max_iters, int nq) {
    __shared__ int s_first;
    const int q = blockIdx.x;
    if (q >= nq) return;
    bang::select_next(q, wl_ids, wl_d, wl_x, L, nullptr, nullptr, -1, nullptr, cand, log_ids, log_d, n_exp,
                      max_iters, &s_first);
}
