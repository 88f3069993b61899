"""Reverse-edge insertion (Vamana / DiskANN: "add the reverse of every kept edge, re-prune the lists
that overflow R") on the GPU, without leaving the device.

The CPU version (``_prune_cpu.add_reverse_edges``) builds a CSR of reverse edges and re-prunes each
overflowing union ``forward list + reverse sources`` with distances it recomputes. Here:

1. the edges ``u -> v`` of the pruned graph whose reverse ``v -> u`` is not already in ``v``'s list
   are marked (one thread per edge, ``new_reverse_edges`` in ``prune.cu``);
2. they are sorted by ``(v, d(u, v), u)`` -- one stable radix sort of 64-bit keys ``v << 32 |
   order-preserving bits of d`` -- and the nearest ``cap`` of each ``v`` are scattered into a
   ``(n, cap)`` matrix; their distances are the forward edges' ones (the internal metrics are
   symmetric), returned by the first prune;
3. ``[forward | reverse]`` (n, R + cap) goes through ``prune_gpu`` once more, with ``fill``.

Step 3 gives the CPU's result: a row whose union holds at most ``R`` distinct ids keeps all of them
(RobustPrune with ``fill`` keeps every candidate when there are no more than ``R``), a row with more
is RobustPruned over the union. The one difference is ``cap``: a node with more than ``cap`` new
reverse edges (default ``R``; hubs) is pruned again, alone, over its nearest ``8 R`` of them, where
the CPU offers all (rows of (n, R + cap) for every node would not fit at 20M points).
Rows come out sorted by distance (kept edges, then filled ones), where the CPU
keeps the original order of a row that does not overflow: the edge sets are the same.

``reverse_candidates`` is array-module agnostic (numpy or cupy) so the CPU tests can check it
against ``add_reverse_edges``.
"""

import time

import numpy as np

from .._core.backend import get_array_module
from .._core.config import get_memory_budget, logger

__all__ = ["reverse_candidates", "add_reverse_edges_gpu"]


def _order_bits(d, xp):
    """uint64 bits of float32 ``d`` whose unsigned order is the float order (negative values too)."""
    b = xp.ascontiguousarray(d, dtype=xp.float32).view(xp.uint32)
    neg = (b >> 31).astype(xp.bool_)
    return xp.where(neg, ~b, b | xp.uint32(0x80000000)).astype(xp.uint64)


def _new_reverse_mask_xp(graph, xp):
    if xp is not np:
        from ._prune_gpu import new_reverse_mask

        return new_reverse_mask(graph)
    n, R = graph.shape
    u = np.repeat(np.arange(n, dtype=np.int64), R)
    v = graph.ravel().astype(np.int64)
    ok = (v >= 0) & (v != u)
    mutual = np.zeros(v.shape, np.bool_)
    mutual[ok] = (graph[v[ok]] == u[ok, None]).any(axis=1)
    return ok & ~mutual


def reverse_candidates(graph, graph_dist, cap, *, rows=None, return_counts=False, hubs_cap=None):
    """The nearest ``cap`` new reverse edges of every node (or of the nodes ``rows``).

    Parameters
    ----------
    graph : numpy or cupy int32 (n, R)
        Out-lists, ``-1`` padded, no repeated ids in a row.
    graph_dist : same module, float32 (n, R)
        Internal distance of each edge (a symmetric metric).
    cap : int
        Reverse candidates kept per node.
    rows : int array (m,), optional
        Only these target nodes (distinct ids), in this order; default all ``n``.
    return_counts : bool
        Also return the number of new reverse edges of every node (int64 (n,)).
    hubs_cap : callable, optional
        ``hubs_cap(counts)`` -> int ``h_cap``, given the new-reverse-edge count of every node:
        the nodes with more than ``cap`` (hubs) also get their nearest ``h_cap`` from the same
        sort (what a second call with ``cap=h_cap, rows=hubs`` returns, without its sort).

    Returns
    -------
    rev_idx : int32 (n, cap) or (m, cap)
        Row ``v``: sources ``u`` of edges ``u -> v`` with ``u`` not in ``graph[v]``, nearest first
        (ties: smaller ``u``), ``-1`` padded.
    rev_dist : float32 (n, cap) or (m, cap)
        Their distances (``+inf`` in the ``-1`` slots).
    counts : int64 (n,)
        Only with ``return_counts``.
    hubs, hub_idx, hub_dist : int64 (h,), int32 (h, h_cap), float32 (h, h_cap)
        Only with ``hubs_cap``, last; ``hub_idx`` / ``hub_dist`` are None when ``h_cap <= cap``.

    Examples
    --------
    >>> import numpy as np
    >>> g = np.array([[1, 2], [0, -1], [1, -1]], np.int32)
    >>> d = np.array([[1, 4], [1, np.inf], [1, np.inf]], np.float32)
    >>> reverse_candidates(g, d, 2)[0].tolist()
    [[-1, -1], [2, -1], [0, -1]]
    """
    xp = get_array_module(graph)
    graph = xp.ascontiguousarray(graph, dtype=xp.int32)
    n, R = graph.shape
    cap = int(cap)
    pos = None
    m = n
    if rows is not None:  # row of each target in the output, -1 for targets not asked for
        rows = xp.asarray(rows, dtype=xp.int64)
        m = int(rows.shape[0])
        pos = xp.full(n, -1, dtype=xp.int64)
        pos[rows] = xp.arange(m, dtype=xp.int64)
    rev_idx = xp.full((m, cap), -1, dtype=xp.int32)
    rev_dist = xp.full((m, cap), xp.inf, dtype=xp.float32)
    all_counts = xp.zeros(n, dtype=xp.int64) if return_counts else None
    hub = [xp.zeros(0, dtype=xp.int64), None, None]  # hubs, their ids, their distances
    hub_pos = None

    def done():
        out = (rev_idx, rev_dist, all_counts) if return_counts else (rev_idx, rev_dist)
        return out + tuple(hub) if hubs_cap is not None else out

    if n == 0 or R == 0 or cap == 0:
        return done()
    keep = _new_reverse_mask_xp(graph, xp)
    e_all = xp.nonzero(keep)[0]
    del keep
    if e_all.size == 0:
        return done()
    v_all = graph.ravel()[e_all]
    flat_d = xp.ascontiguousarray(graph_dist, dtype=xp.float32).ravel()
    if hubs_cap is not None:
        per_node = xp.bincount(v_all, minlength=n)
        h_cap = int(hubs_cap(per_node))
        hub[0] = xp.nonzero(per_node > cap)[0].astype(xp.int64)
        if h_cap > cap and hub[0].size:
            hub_pos = xp.full(n, -1, dtype=xp.int64)
            hub_pos[hub[0]] = xp.arange(hub[0].size, dtype=xp.int64)
            hub[1] = xp.full((hub[0].size, h_cap), -1, dtype=xp.int32)
            hub[2] = xp.full((hub[0].size, h_cap), xp.inf, dtype=xp.float32)
        del per_node
    # the sort needs ~48 bytes per edge: split the targets into ranges when that exceeds the budget
    n_chunks = 1
    if xp is not np:
        from .._core.config import get_memory_budget

        budget = max(get_memory_budget(), 1 << 28)
        n_chunks = max(1, -(-int(e_all.size) * 48 // budget))
    bounds = np.linspace(0, n, n_chunks + 1).astype(np.int64)
    for v0, v1 in zip(bounds[:-1], bounds[1:]):
        if n_chunks == 1:
            e, v = e_all, v_all.astype(xp.int64)
        else:
            m = (v_all >= int(v0)) & (v_all < int(v1))
            e = e_all[m]
            v = v_all[m].astype(xp.int64)
            del m
        d = flat_d[e]
        # edges are enumerated in increasing u and the sort is stable: ties in (v, d) stay by u
        key = (v.astype(xp.uint64) << xp.uint64(32)) | _order_bits(d, xp)
        order = xp.argsort(key, kind="stable") if xp is np else xp.argsort(key)
        del key
        e, v, d = e[order], v[order], d[order]
        del order
        counts = xp.bincount(v - int(v0), minlength=int(v1 - v0))
        if return_counts:
            all_counts[int(v0):int(v1)] = counts
        starts = xp.cumsum(counts) - counts
        rank = xp.arange(v.size, dtype=xp.int64) - starts[v - int(v0)]
        if hub_pos is not None:  # the hubs' longer lists, from the same sorted edges
            hp = hub_pos[v]
            hs = (hp >= 0) & (rank < h_cap)
            hub[1][hp[hs], rank[hs]] = (e[hs] // R).astype(xp.int32)
            hub[2][hp[hs], rank[hs]] = d[hs]
            del hp, hs
        sel = rank < cap
        v, r = v[sel], rank[sel]
        e, d = e[sel], d[sel]
        if pos is not None:
            out_row = pos[v]
            mine = out_row >= 0
            v, r, e, d = out_row[mine], r[mine], e[mine], d[mine]
        rev_idx[v, r] = (e // R).astype(xp.int32)
        rev_dist[v, r] = d
    return done()


def add_reverse_edges_gpu(X, graph, graph_dist, R, alpha, metric, *, cap=None, fill=True, shift=None, stats=None):
    """Add the reverse of every edge of ``graph`` and re-prune (GPU, cupy arrays in and out).

    Parameters
    ----------
    X : cupy float32 (n, d)
        Prepared vectors.
    graph, graph_dist : cupy int32 / float32 (n, R)
        Pruned out-lists and their internal distances (``prune_gpu(..., return_distances=True)``).
    R : int
        Out-degree of the result.
    alpha : float
        RobustPrune slack, as for the first prune.
    metric : {"l2", "ip"}
        Internal metric.
    cap : int, optional
        New reverse candidates offered per node (default ``R``).
    fill : bool
        Fill free slots with the nearest pruned candidates.
    shift : float, optional
        Occlusion-test shift (``prune_shift``), computed when not given.
    stats : dict, optional
        Receives ``hubs`` (nodes re-pruned over more reverse candidates), ``hub_cap`` and the
        synchronised seconds of the two prunes (``first_s``: the sort of the reverse edges, the
        hubs' lists and the first prune; ``hubs_s``: the hubs' prune).

    Returns
    -------
    cupy int32 (n, R)

    Examples
    --------
    >>> import cupy as cp  # doctest: +SKIP
    >>> g, gd = prune_gpu(X, cand, cand_d, 32, 1.2, "l2", return_distances=True)  # doctest: +SKIP
    >>> g = add_reverse_edges_gpu(X, g, gd, 32, 1.2, "l2")  # doctest: +SKIP
    """
    import cupy as cp

    from ._prune_gpu import prune_gpu

    cap = int(R if cap is None else cap)
    t0 = time.perf_counter()
    graph = cp.asarray(graph, dtype=cp.int32)
    graph_dist = cp.asarray(graph_dist, dtype=cp.float32)
    budget = max(get_memory_budget(), 1 << 28)

    def hub_cap_of(counts):
        # hubs: nodes with more new reverse edges than ``cap`` are pruned again over up to
        # ``hub_cap`` of them. Their farthest in-links are the long ones that tie separated parts of
        # the data together; cutting them at R (tight_c10000, 100k x 64) left a graph at recall 0.95
        # for any beam where the CPU's uncapped merge reaches 1.0 (benchmarks/diagnose_prune_steps.py).
        n_hubs = int((counts > cap).sum())
        if n_hubs == 0:
            return 0
        factor = HUB_REVERSE_CAP_FACTOR if R <= 64 else HUB_REVERSE_CAP_FACTOR_WIDE
        hub_cap = int(max(cap, min(int(counts.max()), factor * R)))
        per_row = (R + hub_cap) * 8 * 3  # ids + distances, concatenated copies
        if n_hubs * per_row > budget // 2:
            hub_cap = max(cap, int(budget // 2 // (n_hubs * 24)) - R)
            logger.info("reverse edges: hub lists limited to %d by the memory budget", hub_cap)
        return hub_cap

    # one sort of the new reverse edges gives every node's nearest ``cap`` and the hubs' longer lists
    rev_idx, rev_dist, hubs, ri, rd = reverse_candidates(graph, graph_dist, cap, hubs_cap=hub_cap_of)
    rows = None  # the nodes of the first prune (None: all)
    if ri is not None and FIRST_PASS_SKIPS_HUBS:
        # the hubs are pruned below over their longer lists: the first pass leaves them out (their
        # rows are the full, costliest ones: broad 1M x 128, a fifth of the nodes)
        rest = cp.ones(graph.shape[0], dtype=cp.bool_)
        rest[hubs] = False
        rows = cp.nonzero(rest)[0].astype(cp.int32)
        del rest

    def of_rows(a):
        return a if rows is None else a[rows]

    cand = cp.concatenate([of_rows(graph), of_rows(rev_idx)], axis=1)
    del rev_idx
    cand_d = cp.concatenate([of_rows(graph_dist), of_rows(rev_dist)], axis=1)
    del rev_dist
    first = prune_gpu(X, cand, cand_d, R, alpha, metric, fill=fill, shift=shift, node_ids=rows)
    if rows is None:
        out = first
    else:
        out = cp.empty_like(graph)
        out[rows] = first
    del first
    del cand, cand_d
    if stats is not None:
        cp.cuda.get_current_stream().synchronize()
        t1 = time.perf_counter()
        stats.update(first_s=t1 - t0, hubs=int(hubs.size), hub_cap=0 if ri is None else int(ri.shape[1]),
                     hubs_s=0.0)
    if ri is not None:
        hc = cp.concatenate([graph[hubs], ri], axis=1)
        hd = cp.concatenate([graph_dist[hubs], rd], axis=1)
        del ri, rd
        out[hubs] = prune_gpu(X, hc, hd, R, alpha, metric, fill=fill, shift=shift, node_ids=hubs)
        if stats is not None:
            cp.cuda.get_current_stream().synchronize()
            stats.update(hubs_s=time.perf_counter() - t1)
    return out


#: The first prune leaves out the hubs, whose rows the hub pass writes anyway (same graph; off
#: only for the A/B in ``benchmarks/build_flag_ab.py``).
FIRST_PASS_SKIPS_HUBS = True

#: Hubs (nodes with more new reverse edges than the first pass offers) are re-pruned over up to this
#: many times R reverse candidates: 8 R matched the CPU's uncapped merge on tight_c10000 (recall 1.0
#: at beam 256; 2 R 0.974, 4 R 0.996, R 0.894).
HUB_REVERSE_CAP_FACTOR = 8
#: ... and this many for graphs wider than 64 (the GPU's top tier, R = 128, high intrinsic
#: dimension): 8 R = 1,024 hub candidates made the reverse stage 1.9-3.1 s of a 3.6-4.3 s build at 1M,
#: 2 R 0.77-0.91 s with the same recall at every beam 128-4096 (within 0.001; 4 R in between), on
#: uniform 128-d / 960-d and broad 128-d (H200, `benchmarks/gpu_hard_degree.py`,
#: `benchmarks/results/h200-2026-11-29-s16/hard_degree/gpu_hard_degree_hubcap.json`). The 8 R lists
#: serve the separated clusters of the R = 64 tier.
HUB_REVERSE_CAP_FACTOR_WIDE = 2
