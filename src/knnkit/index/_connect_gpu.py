"""The GPU side of the connectivity checks (``connect.cu``): weakly connected components,
reachability from the entry points, the edge lengths of the short-edge components.

A built index's graph is usually one component with every point reachable; the build then only
needs two answers ("how many components", "how many reachable") and they come from a few kernel
launches on the device-resident graph, with no host copy of it (``_connect.repair_connectivity``
falls back to its host path, unchanged, when the answer is not "1 and all").

- :func:`component_roots`: ECL-CC hooking with pointer jumping; the root of each node is the
  smallest id of its component, so the labels ``_connect.components`` ranks from it equal the host
  union-find's.
- :func:`reach_bits` / :func:`reach_count` / :func:`reachable_mask`: level-synchronous BFS from
  the sources, a visited bitmap and a frontier queue per level; the host reads the frontier sizes
  once per batch of levels (4, 8, ... 64) and gives up past ``max_levels`` levels.
- :func:`edge_sqdist`, :func:`drop_long_edges`: squared l2 of every edge (sequential float32 sum
  over the dimensions, no FMA) and the long-edge rule of ``short_edge_components``.

Every function takes and returns CuPy arrays; ``_kernel`` is the one door to the compiled module
(the CPU tests replace it and ``cupy`` with NumPy emulations, ``tests/_connect_fake_gpu.py``).
"""

import functools

import numpy as np

from .._core.cuda import get_kernel, kernel_path

__all__ = ["component_roots", "reach_bits", "reach_count", "reachable_mask", "mask_of_bits", "edge_sqdist", "drop_long_edges",
           "MAX_BFS_LEVELS"]

_KERNEL = kernel_path(__file__, "connect.cu")
_THREADS = 256
#: BFS levels the build's reachability check runs before it leaves the question to the host BFS
#: (one launch per level: a path-like graph of 1M points would otherwise cost ~1M launches)
MAX_BFS_LEVELS = 16384
_BATCH_MAX = 64


def _cp():
    import cupy

    return cupy


def _kernel(name):
    return get_kernel(_KERNEL, name)


@functools.lru_cache(maxsize=None)
def _sm_count_of(device_id):
    return int(_cp().cuda.Device(device_id).attributes["MultiProcessorCount"])


def _sm_count():
    return _sm_count_of(_cp().cuda.Device().id)


def _blocks(work, per_block, cap_per_sm):
    """Blocks for ``work`` items at ``per_block`` a block, at most ``cap_per_sm`` per SM (grid-stride)."""
    return int(max(1, min(-(-int(work) // per_block), cap_per_sm * _sm_count())))


def _graph32(graph):
    """The graph as a C-contiguous int32 device array (ids outside ``[0, n)`` made -1 when the
    dtype is not int32 already; the kernels skip them either way)."""
    cp = _cp()
    n = graph.shape[0]
    if graph.dtype == np.int32:
        return cp.ascontiguousarray(graph)
    return cp.ascontiguousarray(cp.where((graph >= 0) & (graph < n), graph, -1).astype(cp.int32))


# ---------------------------------------------------------------------------------- components
def component_roots(graph):
    """The smallest node id of each node's weak component (int32 (n,), device).

    Three launches: every node's parent starts at its smallest smaller out-neighbour (``cc_init``),
    every edge hooks its two trees (``cc_hook``, one thread per edge), every node is pointed at its
    root (``cc_flatten``)."""
    cp = _cp()
    g = _graph32(graph)
    n, R = g.shape
    parent = cp.empty(n, cp.int32)
    if n == 0:
        return parent
    i32 = np.int32
    _kernel("cc_init")((_blocks(n, _THREADS // 32, 16),), (_THREADS,), (g, i32(n), i32(R), parent))
    if R:
        _kernel("cc_hook")((_blocks(n * R, _THREADS, 16),), (_THREADS,), (g, i32(n), i32(R), parent))
    _kernel("cc_flatten")((_blocks(n, _THREADS, 16),), (_THREADS,), (i32(n), parent))
    return parent


# ---------------------------------------------------------------------------------- reachability
def reach_bits(graph, sources, *, max_levels=None):
    """Breadth-first search from ``sources`` along the directed edges.

    Parameters
    ----------
    graph : cupy int array (n, R)
    sources : int array-like (host or device); ids outside ``[0, n)`` are ignored
    max_levels : int, optional
        Give up after this many levels (None: run to the end).

    Returns
    -------
    bits : cupy uint32 (ceil(n / 32),)
        Bit ``v & 31`` of word ``v >> 5`` set for every reached node (sources included).
    reached : int
        Number of reached nodes. ``(None, None)`` when ``max_levels`` levels were not enough.
    """
    cp = _cp()
    g = _graph32(graph)
    n, R = g.shape
    i32 = np.int32
    src = np.asarray(sources.get() if hasattr(sources, "get") else sources).ravel().astype(np.int64)
    src = cp.asarray(np.where((src >= 0) & (src < n), src, -1).astype(np.int32))
    bits = cp.zeros(max(1, -(-n // 32)), cp.uint32)
    if n == 0 or src.size == 0:
        return bits, 0
    cap = n if max_levels is None else int(min(n, max_levels))
    counts = cp.zeros(cap + 2, cp.int32)   # counts[l]: size of level l's frontier
    bufs = (cp.empty(n, cp.int32), cp.empty(n, cp.int32))
    _kernel("bfs_seed")((_blocks(src.size, _THREADS, 4),), (_THREADS,),
                        (src, i32(src.size), i32(n), bits, bufs[0], counts))
    reached = int(counts[:1].get()[0])
    if reached == 0 or R == 0:
        return bits, reached
    expand = _kernel("bfs_expand")
    grid = (_blocks(n * R, _THREADS, 8),)
    level, batch = 0, 4
    while True:
        stop = min(level + batch, cap)
        for lv in range(level, stop):  # frontier sizes stay on the device: no sync per level
            expand(grid, (_THREADS,), (g, i32(n), i32(R), bits, counts, i32(lv), bufs[lv % 2], bufs[(lv + 1) % 2]))
        sizes = counts[level + 1:stop + 1].get()
        empty = np.flatnonzero(sizes == 0)
        if empty.size:
            return bits, reached + int(sizes[:empty[0]].sum())
        reached += int(sizes.sum())
        level = stop
        if level >= cap:   # level `cap` has a frontier still (only with max_levels < n)
            return None, None
        batch = min(2 * batch, _BATCH_MAX)


def reach_count(graph, sources, *, max_levels=None):
    """Number of nodes reachable from ``sources``; None when the BFS needs more than ``max_levels``
    levels (default :data:`MAX_BFS_LEVELS`; the caller then asks the host BFS)."""
    return reach_bits(graph, sources, max_levels=MAX_BFS_LEVELS if max_levels is None else max_levels)[1]


def reachable_mask(graph, sources):
    """Boolean (n,) device mask of the nodes reachable from ``sources`` (sources included)."""
    return mask_of_bits(reach_bits(graph, sources)[0], graph.shape[0])


def mask_of_bits(bits, n):
    """Boolean (n,) device mask of :func:`reach_bits`'s bit set."""
    cp = _cp()
    idx = cp.arange(n, dtype=cp.int32)
    return ((bits[idx >> 5] >> (idx & 31).astype(cp.uint32)) & cp.uint32(1)).astype(cp.bool_)


# ---------------------------------------------------------------------------------- edge lengths
def edge_sqdist(X, graph):
    """Squared l2 length of every edge, float32 (n, R), NaN in empty slots.

    ``sum_k (X[v, k] - X[u, k])**2`` added in dimension order, every step rounded to float32 (what a
    sequential float32 loop gives; CuPy's gather-and-reduce added them in another order)."""
    cp = _cp()
    X = cp.ascontiguousarray(X, dtype=cp.float32)
    g = _graph32(graph)
    n, R = g.shape
    out = cp.empty((n, R), cp.float32)
    if n and R:
        warps = n * -(-R // 32)
        _kernel("edge_sqdist")((_blocks(warps, _THREADS // 32, 16),), (_THREADS,),
                               (X, np.int32(n), np.int32(X.shape[1]), g, np.int32(R), out))
    return out


def drop_long_edges(graph, dist, near, factor):
    """The graph with its long edges set to -1 (int32 (n, R), device) and their number.

    Long: ``dist > factor * max(near[u], near[v])`` with both ``near`` > 0 (float32 arithmetic,
    ``factor`` rounded to float32), the rule of ``_connect.short_edge_components``."""
    cp = _cp()
    g = _graph32(graph)
    n, R = g.shape
    short = cp.empty_like(g)
    n_long = cp.zeros(1, cp.uint64)
    if n and R:
        _kernel("short_graph")((_blocks(n * R, _THREADS, 16),), (_THREADS,),
                               (g, cp.ascontiguousarray(dist, dtype=cp.float32),
                                cp.ascontiguousarray(near, dtype=cp.float32), np.int32(n), np.int32(R),
                                np.float32(factor), short, n_long))
    return short, int(n_long.get()[0])
