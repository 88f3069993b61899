"""Batched best-first graph search on the GPU (GGNN sec. 4 with BANG's parallel merge and
fp16 traversal + exact re-ranking).

One thread block per query keeps a sorted candidate list of ``beam`` entries (each flagged once
expanded), a visited set (by default a Bloom filter as in BANG 4.4, or an exact hash table) and
the query in shared memory; see ``search.cu`` for the
algorithm and ``NOTES_search.md`` for measurements.  ``select_seeds_gpu`` picks each
query's entry points (nearest k-means centroids) in one kernel.
"""

import math

import numpy as np

from .._core.config import logger
from .._core.cuda import get_kernel, kernel_path

_KERNEL = kernel_path(__file__, "search.cu")

__all__ = ["search_gpu", "search_config", "select_seeds_gpu"]

_MAX_SMEM = 227 * 1024  # opt-in shared memory per block on sm_80 / sm_90
_SMALL_BATCH = 256  # up to this many queries per call, 256 threads per block (latency, not throughput)
_BLOOM_LOAD = 16  # Bloom filter refilled after bits / 16 insertions (false-positive rate ~1 %)


#: Beams whose search state does not fit in shared memory keep their list in global memory (when
#: the beam is above this; below it such a state is a caller's width or degree: ValueError).
GLOBAL_LIST_FROM = 4096
#: Blocks per SM of a global-list search (each owns a slab of 4 * beam words; one block per SM
#: is resident at these shared-memory sizes anyway, the second hides a block's tail).
GLOBAL_LIST_BLOCKS_PER_SM = 2
#: ... and fewer blocks where the slabs would take more than this (a beam near n of a large index)
GLOBAL_LIST_MAX_BYTES = 1 << 30

#: Nodes expanded per step when the caller gives no ``width`` (None: :func:`default_width`).
#: A module knob for the benchmarks (``benchmarks/search_width_gpu.py``).
DEFAULT_WIDTH = None
#: fp16 traversal: (beam from which, width) steps of :func:`default_width`.
WIDTH_STEPS = ((256, 4), (2048, 8))


def default_width(beam, fp16):
    """Nodes expanded per step of a search at ``beam`` when the caller gives none: 1 for fp32
    traversal, 2 for fp16 traversal below beam 256, 4 up to 2047 and 8 from 2048 on.

    Why: every step whose candidates enter the list rewrites the whole list (a merge of O(beam)
    work between barriers), so at long lists fewer, wider steps pay. Measured on an H200, 1M
    points, 10k queries (``benchmarks/results/h200-2026-11-29-s23/``): broad 128-d QPS at recall
    0.99 17.4k -> 41.5k, at 0.98 89k -> 122k, at 0.95 363k -> 403k; broad 96-d at 0.99 136k ->
    148k; uniform 128-d and tight clusters unchanged (+-3 %); below beam 256 width 2 stays the
    fastest. The fp32 traversal (no fp16 copy) was not measured at long lists and keeps 1.

    Examples
    --------
    >>> [default_width(b, fp16=True) for b in (64, 256, 1024, 2048)]
    [2, 4, 4, 8]
    >>> default_width(1024, fp16=False)
    1
    """
    if not fp16:
        return 1
    width = 2
    for at, w in WIDTH_STEPS:
        if beam >= at:
            width = w
    return width


def _kernel(name):
    return get_kernel(_KERNEL, name, name_expressions=(name,))


def _pow2ceil(x):
    return 1 << max(0, int(math.ceil(math.log2(max(1, x)))))


def search_config(d, *, fp16=False, team=None, block=None):
    """Kernel shape for dimension ``d``: ``(EPC, TEAM, MAXCH, NT)``.

    EPC: elements per load (16-byte loads when ``d`` allows it); TEAM: lanes computing one
    distance; MAXCH: loads in flight per lane; NT: threads per block.  The defaults aim at about
    four 16-byte loads per lane per distance (enough memory-level parallelism, few idle lanes).
    """
    if fp16:
        epc = 8 if d % 8 == 0 else (2 if d % 2 == 0 else 1)
    else:
        epc = 4 if d % 4 == 0 else 1
    nchunks = d // epc
    if team is None:
        team = min(32, _pow2ceil(-(-nchunks // 4)))
    team = int(team)
    if team not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"team must be a power of two <= 32, got {team}")
    maxch = min(8, _pow2ceil(-(-nchunks // team)))
    if block is None:
        block = 128 if team <= 8 else 256
    block = int(block)
    if block not in (32, 64, 128, 256, 512):
        raise ValueError(f"block must be one of 32, 64, 128, 256, 512, got {block}")
    return epc, team, maxch, block


def search_gpu(X, graph, queries, k, *, seeds, beam, tau, max_iters, metric, X_fp16=None, width=None,
               xnorm_max=None, nn1_max=None, hash_size=None, team=None, block=None, min_blocks=None,
               rerank="fused", return_stats=False, visited="auto", bloom_bits=None, list_memory="auto"):
    """Search ``graph`` for the ``k`` nearest neighbours of every query (internal metric).

    Best-first search with backtracking: from the ``seeds`` of each query, repeatedly expand the
    closest not yet expanded entries of a sorted list of ``beam`` candidates, until none is left,
    the slack test fails or ``max_iters`` expansions were made.  Slack test (GGNN sec. 4.1.2, same
    as ``search_cpu``): stop when ``c(d) > c(d_best_k) + tau * min(c(d_best_1), nn1_max)`` for the
    best unexpanded ``d``, where ``c(d) = sqrt(max(d + shift, 0))``, ``shift = 0`` for ``'l2'``
    (Euclidean scale) and ``|q| * xnorm_max`` for ``'ip'`` (non-negative by Cauchy-Schwarz; for
    unit vectors ``c`` is the Euclidean distance over sqrt(2)).

    Parameters
    ----------
    X : cupy.ndarray, float32 (n, d)
        Prepared data vectors.
    graph : cupy.ndarray, int32 (n, R)
        Search graph, -1 padded.
    queries : cupy.ndarray, float32 (nq, d)
        Prepared queries.
    k : int
        Neighbours wanted (``k <= beam``).
    seeds : cupy.ndarray, int32 (nq, s) or (s,)
        Start nodes per query (-1 = none); a 1-D array is shared by all queries.
    beam : int
        Candidate list size (``>= k``). Up to 8192 (at degree 128, less with wide steps) the list
        lives in shared memory; past that it moves to global memory (4 * beam words per resident
        block, the grid capped at :data:`GLOBAL_LIST_BLOCKS_PER_SM` blocks per SM): slower per
        step and limited only by memory, so a hard data set's recall keeps rising past the
        largest shared-memory list (``NOTES_search.md``).
    tau : float or None
        GGNN slack factor; None or ``inf`` disables the slack test (plain beam search).
    max_iters : int or None
        Cap on expansion steps (each expands ``width`` nodes).
    metric : {"l2", "ip"}
        Internal metric (squared L2 or negative dot product).
    X_fp16 : cupy.ndarray, float16 (n, d), optional
        Half-precision copy read during traversal; the final list is re-ranked with ``X`` (BANG 4.9).
    width : int, optional
        Nodes expanded per step (more parallel work per step, fewer barriers per distance).
        Default :func:`default_width` (with ``X_fp16``: 2 below beam 256, 4 below 2048, then 8,
        halved where the search state would not fit in shared memory; else 1).
    xnorm_max : float, optional
        ``max_i |x_i|`` for the ``'ip'`` slack scale; computed from ``X`` when None.
    nn1_max : float, optional
        GGNN's ``d_nn1+`` (largest nearest-neighbour Euclidean distance in the data); inf if None.
    hash_size, team, block, min_blocks : int, optional
        Kernel tuning (visited-table slots, lanes per distance, threads per block, minimum
        resident blocks per SM asked of the register allocator).
    rerank : {"fused", "split"}
        With ``X_fp16``: re-rank inside the search kernel, or in a second kernel.
    visited : {"auto", "hash", "bloom"}
        Visited set.  ``"hash"``: exact open-addressing table (4 bytes per slot, at least twice
        ``beam + width * R`` slots).  ``"bloom"``: Bloom filter (BANG 4.4), 8x fewer bytes per
        remembered node, so long lists (``beam`` in the thousands, k up to 1024) still fit in
        shared memory; a false positive skips a node (recall only: distances stay exact, no
        duplicates).  ``"auto"``: the Bloom filter (measured 10-50 % faster at beam 32-512 and 2x
        at k = 1000 on 1M x 128, recall within 0.0004 of the hash), or the hash when only
        ``hash_size`` is given.  Both are cleared and
        refilled with the list when full (see ``search.cu``).
    bloom_bits : int, optional
        Bloom filter size in bits (rounded up to a power of two, at least 1024; default
        ``max(65536, 32 * (beam + width * R))``, refilled after 1/16 as many insertions).
    list_memory : {"auto", "shared", "global"}
        Where the candidate list lives: ``"auto"`` in shared memory while the search state fits
        there, else (beam past :data:`GLOBAL_LIST_FROM`) in global memory; the others force one
        (the same walk and results either way; "global" for tests and measurements).
    return_stats : bool
        Also return an int32 (nq, 2) array: expansion steps and distances computed per query.

    Returns
    -------
    dist : cupy.ndarray, float32 (nq, k)
        Internal distances, ascending; ``inf`` where fewer than ``k`` points were reached.
    idx : cupy.ndarray, int64 (nq, k)
        Indices; -1 where fewer than ``k`` points were reached.

    Examples
    --------
    >>> import cupy as cp  # doctest: +SKIP
    >>> X = cp.random.rand(2000, 32, dtype=cp.float32)  # doctest: +SKIP
    >>> G = cp.argsort(((X[:, None] - X[None]) ** 2).sum(-1), 1)[:, 1:17].astype(cp.int32)  # doctest: +SKIP
    >>> seeds = cp.zeros((5, 1), dtype=cp.int32)  # doctest: +SKIP
    >>> d, i = search_gpu(X, G, X[:5], 3, seeds=seeds, beam=32, tau=None, max_iters=None,
    ...                   metric="l2")  # doctest: +SKIP
    """
    import cupy as cp

    if metric not in ("l2", "ip"):
        raise ValueError(f"search_gpu: metric must be 'l2' or 'ip', got {metric!r}")
    X = cp.ascontiguousarray(X, dtype=cp.float32)
    graph = cp.ascontiguousarray(graph, dtype=cp.int32)
    queries = cp.ascontiguousarray(queries, dtype=cp.float32)
    n, d = X.shape
    nq = queries.shape[0]
    if queries.ndim != 2 or queries.shape[1] != d:
        raise ValueError(f"queries must have shape (nq, {d}), got {queries.shape}")
    if graph.ndim != 2 or graph.shape[0] != n:
        raise ValueError(f"graph must have shape ({n}, R), got {graph.shape}")
    R = graph.shape[1]
    auto_width = width is None
    if auto_width:
        width = DEFAULT_WIDTH if DEFAULT_WIDTH is not None else default_width(int(beam), X_fp16 is not None)
    k, L, width = int(k), int(beam), int(width)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if L < k:
        raise ValueError(f"beam ({L}) must be >= k ({k})")
    # a list longer than the data is never full: the walk at n is the walk at any larger beam, and
    # the state (a global list's slabs) stays bounded by the data
    L = max(k, min(L, n))
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    seeds = cp.asarray(seeds, dtype=cp.int32)
    if seeds.ndim == 1:
        seeds = cp.broadcast_to(seeds[None, :], (nq, seeds.shape[0]))
    seeds = cp.ascontiguousarray(seeds)
    if seeds.shape[0] != nq:
        raise ValueError(f"seeds must have one row per query ({nq}), got {seeds.shape}")
    S = seeds.shape[1]
    # every slot is written by the kernel: no fill launches (they cost more than a 1-query search's
    # arithmetic at small batches, NOTES_search.md)
    out_d = cp.empty((nq, k), dtype=cp.float32)
    out_i = cp.empty((nq, k), dtype=cp.int64)
    stats = cp.empty((nq, 2), dtype=cp.int32)  # always written (8 bytes per query), returned on request
    if nq == 0:
        return (out_d, out_i, stats) if return_stats else (out_d, out_i)

    fp16 = X_fp16 is not None
    if fp16:
        X_fp16 = cp.ascontiguousarray(X_fp16, dtype=cp.float16)
        if X_fp16.shape != X.shape:
            raise ValueError(f"X_fp16 shape {X_fp16.shape} differs from X shape {X.shape}")
    if block is None and nq <= _SMALL_BATCH:
        # few blocks in flight: twice the teams per block compute a step's distances in fewer
        # rounds (1 query: 0.103 -> 0.095 ms; slower from ~1k queries on, NOTES_search.md)
        block = max(256, search_config(d, fp16=fp16, team=team)[3])
    epc, team, maxch, block = search_config(d, fp16=fp16, team=team, block=block)
    if min_blocks is None:
        # Register cap: ~40 registers (12 blocks of 128 threads per SM) where that does not spill,
        # else ~64 (see NOTES_search.md).
        min_blocks = (1536 if maxch <= 4 else 1024) // block
    Lp = _pow2ceil(L)
    dpad = (d + 3) // 4 * 4
    if list_memory not in ("auto", "shared", "global"):
        raise ValueError(f"list_memory must be 'auto', 'shared' or 'global', got {list_memory!r}")
    cfg = (L, Lp, R, dpad, auto_width, visited, hash_size, bloom_bits)
    state = _search_state(*cfg, width, glist=list_memory == "global")
    glist = list_memory == "global" or (list_memory == "auto" and state[-1] > _MAX_SMEM and L > GLOBAL_LIST_FROM)
    if glist and list_memory == "auto":
        # the list in global memory: shared memory keeps the query, the step's candidates and the
        # visited set, so the asked (or default) width is back
        state = _search_state(*cfg, width, glist=True)
    width, cmax, vis, vis_words, vis_cap, smem = state
    if glist:
        if rerank == "split":
            # the split re-rank sorts the whole list in shared memory: fused re-ranks it in place
            rerank = "fused"
    if smem > _MAX_SMEM:
        raise ValueError(f"search state needs {smem} bytes of shared memory per query (> {_MAX_SMEM}); "
                         f"lower beam ({L}), width ({width}) or the graph degree ({R})")
    if max_iters is None:
        max_iters = 1 << 30
    tau = np.inf if tau is None else float(tau)
    nn1 = np.inf if nn1_max is None else float(nn1_max)
    if metric == "ip":
        if xnorm_max is None:
            xnorm_max = float(cp.sqrt((X * X).sum(axis=1).max()))
        qshift = (cp.sqrt((queries * queries).sum(axis=1)) * cp.float32(xnorm_max)).astype(cp.float32)
    else:
        qshift = queries  # not read for 'l2' (any float pointer: saves an allocation and a fill)
    if rerank not in ("fused", "split"):
        raise ValueError(f"rerank must be 'fused' or 'split', got {rerank!r}")
    mode = 0 if not fp16 else (1 if rerank == "fused" else 2)
    T = "__half" if fp16 else "float"
    mcode = 0 if metric == "l2" else 1
    name = f"graph_search<{T},{epc},{team},{maxch},{mcode},{block},{mode},{int(min_blocks)},{vis},{int(glist)}>"
    kern = _kernel(name)
    if smem > 48 * 1024:
        kern.max_dynamic_shared_size_bytes = smem
    logger.debug("search_gpu: nq=%d k=%d beam=%d width=%d kernel=%s smem=%d visited=%s words=%d", nq, k, L,
                 width, name, smem, "bloom" if vis else "hash", vis_words)
    out_list = cp.empty((nq, L), dtype=cp.int32) if mode == 2 else stats
    grid = int(min(nq, 1 << 30))
    if glist:
        # one slab of 4 * Lp words per block; the blocks stride over the queries
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        grid = int(max(1, min(nq, GLOBAL_LIST_BLOCKS_PER_SM * sms, GLOBAL_LIST_MAX_BYTES // (16 * Lp))))
        slabs = cp.empty(grid * 4 * Lp, dtype=cp.float32)
    else:
        slabs = out_d  # not read (GL = 0): any float pointer
    kern((grid,), (block,),
         (X_fp16 if fp16 else X, X, np.int32(n), np.int32(d), graph, np.int32(R), queries, qshift, np.int32(nq), seeds,
          np.int32(S), np.int32(k), np.int32(L), np.int32(Lp), np.int32(width), np.int32(cmax),
          np.int32(vis_words), np.int32(vis_cap), np.float32(tau), np.float32(nn1),
          np.int32(min(int(max_iters), 2**31 - 1)), out_d, out_i, stats, out_list, slabs), shared_mem=smem)
    if mode == 2:
        rteam = 32 if d >= 64 else min(32, _pow2ceil(d))
        rname = f"rerank_topk<{rteam},{mcode},128>"
        rk = _kernel(rname)
        rsmem = 4 * (dpad + 2 * Lp)
        if rsmem > 48 * 1024:
            rk.max_dynamic_shared_size_bytes = rsmem
        rk((grid,), (128,), (X, np.int32(d), queries, out_list, np.int32(nq), np.int32(L), np.int32(Lp), np.int32(k),
                             out_d, out_i), shared_mem=rsmem)
    return (out_d, out_i, stats) if return_stats else (out_d, out_i)


def _search_state(L, Lp, R, dpad, auto_width, visited, hash_size, bloom_bits, width, *, glist):
    """``(width, cmax, vis, vis_words, vis_cap, smem)`` of one search: shared-memory bytes per block
    for the query, the list (``4 Lp`` words, none when ``glist``: global memory), the step's
    candidates and the visited set, the width halved (when not the caller's) until it fits. A
    global-list search whose default Bloom filter would not fit gets a smaller one: refilled more
    often (its load factor kept), never fewer than ``L + cmax`` insertions between refills (the
    refill re-inserts the list)."""
    while True:
        cmax = max(32, width * R)
        vis, vis_words, vis_cap = _visited_config(visited, L, cmax, hash_size, bloom_bits)
        base = 4 * (dpad + (0 if glist else 4 * Lp) + 5 * cmax + width)
        if glist and vis == 1 and bloom_bits is None and base + 4 * vis_words > _MAX_SMEM:
            vis_words = 1 << int(math.floor(math.log2(max(32, (_MAX_SMEM - base) // 4))))
            vis_cap = max(vis_words * 32 // _BLOOM_LOAD, L + cmax)
        smem = base + 4 * vis_words
        if smem <= _MAX_SMEM or not auto_width or width == 1:
            return width, cmax, vis, vis_words, vis_cap, smem
        width //= 2  # a width the caller did not ask for never costs a beam that fits with less


def _visited_config(visited, L, cmax, hash_size, bloom_bits):
    """``(vis, words, cap)``: kernel VIS code, 32-bit words of the visited set, insertions before a
    refill.  ``"auto"``: the Bloom filter, unless ``hash_size`` alone was given."""
    if visited not in ("auto", "hash", "bloom"):
        raise ValueError(f"visited must be 'auto', 'hash' or 'bloom', got {visited!r}")
    # hash: at least 2 slots per node it may hold (refilled at half load)
    hsize = max(2048, _pow2ceil(4 * (L + cmax))) if hash_size is None else int(hash_size)
    hsize = _pow2ceil(max(hsize, 2 * (L + cmax)))
    # Bloom: refilled after bits / _BLOOM_LOAD insertions.  Default at least 64 Kibit (8 KiB, the
    # default hash's bytes at beam <= 256): each refill forgets rejected nodes that are then
    # evaluated again (up to 30 % of the distances at beam 128 with 16 Kibit), and 64 Kibit was the
    # fastest size measured at beam 32-512 (NOTES_search.md).  A smaller filter given by the
    # caller is refilled no more often than after one expansion past a full list (its
    # false-positive rate rises instead).
    bbits = max(65536, _pow2ceil(_BLOOM_LOAD * 2 * (L + cmax))) if bloom_bits is None else int(bloom_bits)
    bwords = min(_pow2ceil(max(bbits, 1024)) // 32, 1 << 17)  # word index < 2^17 (see bloom_insert)
    if visited == "auto":
        # Measured (NOTES_search.md, 1M x 128): the Bloom filter is faster at every beam (8x denser
        # than the hash: fewer refills in the same shared memory, which also keeps more blocks
        # resident at long lists) for <= 0.0006 recall.  An explicit hash_size asks for the hash.
        visited = "hash" if (hash_size is not None and bloom_bits is None) else "bloom"
    if visited == "hash":
        return 0, hsize, hsize // 2
    return 1, bwords, max(bwords * 32 // _BLOOM_LOAD, L + cmax)


def seed_block_queries(c, d, *, direct):
    """Queries one block of ``seed_select`` serves over ``c`` centroids of ``d`` dimensions: as many
    rows of distances (and, ``direct``, of the queries themselves) as fit 48 KB of shared memory,
    up to 8. The direct kernel reads every centroid row once per block."""
    per_q = 4 * (int(c) + ((int(d) + 3) // 4 * 4 if direct else 0))
    return next((b for b in (8, 4, 2, 1) if b * per_q <= 48 * 1024), 1)


#: "gemm" seeds selected by ``seed_select_rows`` (one warp a query, reading the dots in place);
#: False: by ``seed_select``'s shared-memory mode, two queries a block at 4096 centroids (the same
#: seeds; kept for measuring the two against each other)
SEED_SELECT_ROWS = True


def select_seeds_gpu(queries, centroids, medoids, s, metric, *, cnorms=None, method="auto"):
    """Entry points per query: medoids of its ``s`` nearest centroids, nearest first (one kernel).

    Parameters
    ----------
    queries : cupy.ndarray, float32 (nq, d)
        Prepared queries.
    centroids : cupy.ndarray, float32 (c, d)
    medoids : cupy.ndarray, int32 (c,)
        Data point standing for each centroid.
    s : int
        Seeds per query (slots past ``c`` hold -1).
    metric : {"l2", "ip"}
        Internal metric: ``|c|^2 - 2 q.c`` (the query norm does not change the order) or ``-q.c``.
    cnorms : cupy.ndarray, float32 (c,), optional
        ``|c|^2`` (computed when None; pass it to save a launch per call).
    method : {"auto", "direct", "gemm"}
        ``"direct"``: distances computed in the selection kernel (one launch); ``"gemm"``:
        ``queries @ centroids.T`` by cuBLAS first, then the selection kernel.  ``"auto"``: gemm
        (measured faster at every batch size, even one query).

    Returns
    -------
    cupy.ndarray, int32 (nq, s)

    Examples
    --------
    >>> import cupy as cp  # doctest: +SKIP
    >>> C = cp.asarray([[0, 0], [5, 5]], cp.float32)  # doctest: +SKIP
    >>> select_seeds_gpu(cp.asarray([[4, 4]], cp.float32), C, cp.asarray([3, 7], cp.int32), 2, "l2")  # doctest: +SKIP
    array([[7, 3]], dtype=int32)
    """
    import cupy as cp

    nq, d = queries.shape
    c = int(centroids.shape[0])
    s = int(s)
    out = cp.empty((nq, s), dtype=cp.int32)
    if nq == 0 or s == 0:
        return out
    if method not in ("auto", "direct", "gemm"):
        raise ValueError(f"method must be 'auto', 'direct' or 'gemm', got {method!r}")
    if method == "auto":
        # measured faster at every batch size (1 query: 39 vs 53 us; 10k: 0.16 vs 0.32 ms,
        # NOTES_search.md): the direct kernel is latency bound (one thread walks whole centroid rows)
        method = "gemm"
    if cnorms is None:
        cnorms = (centroids * centroids).sum(axis=1) if metric == "l2" else centroids[:1, 0]
    if method == "gemm" and SEED_SELECT_ROWS:
        # one warp a query over its row of Q C^T (no shared memory: any number of centroids)
        dots = queries @ centroids.T
        _kernel("seed_select_rows<256>")(((nq + 7) // 8,), (256,), (dots, cnorms, medoids, np.int32(nq), np.int32(c),
                                                                    np.int32(metric == "ip"), np.int32(s), out))
        return out
    qb = seed_block_queries(c, d, direct=method == "direct")
    smem = qb * 4 * (c + ((d + 3) // 4 * 4 if method == "direct" else 0))
    if smem > _MAX_SMEM:
        raise ValueError(f"seed selection over {c} centroids needs {smem} bytes of shared memory")
    dots = queries @ centroids.T if method == "gemm" else None
    name = f"seed_select<256,{qb}>"
    kern = _kernel(name)
    if smem > 48 * 1024:
        kern.max_dynamic_shared_size_bytes = smem
    grid = (nq + qb - 1) // qb
    kern((grid,), (256,), (queries, centroids, cnorms, queries if dots is None else dots, np.int32(dots is not None),
                           medoids, np.int32(nq), np.int32(c), np.int32(d), np.int32(metric == "ip"), np.int32(s), out),
         shared_mem=smem)
    return out

