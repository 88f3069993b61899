"""Connectivity of a search graph: components, reachability from the entry points, and a repair
that links every component to its nearest neighbouring components and makes every node
reachable from the entries (issue 11, part 1).

A fixed-degree graph built from k-NN candidates falls apart into one piece per cluster on data
made of tight, well-separated clusters; a beam search started from entry points that miss a
piece can never return its points, whatever the beam (GGNN section 3.2.1 names this pitfall:
``y in N_x`` does not give ``x in N_y``, and a kNN graph has no link between far groups). The
functions here are pure functions on arrays: numpy (CPU, Numba loops) or cupy (GPU: the kernels of
``connect.cu`` through ``_connect_gpu.py``, CuPy array operations for the rest), chosen by the type
of the ``graph`` argument.

Graphs are int32 ``(n, R)`` arrays of neighbour ids, ``-1`` in empty slots. Metrics are the internal
ones: ``"l2"`` (squared Euclidean) and ``"ip"`` (negative inner product).
"""

import time
import warnings

import numpy as np

from .._core.backend import get_array_module
from .._core.config import logger
from ._search_cpu import njit as _njit

__all__ = ["components", "reachable_from", "repair_connectivity", "entry_points_per_component",
           "combine_entry_points"]

#: GPU graphs use the kernels of ``connect.cu`` (components, reachability, edge lengths) and skip
#: the host copy when the graph is one component reachable from the entries. False: the earlier
#: path (CuPy label propagation and frontier expansion, CuPy gathers for the edge lengths, the
#: graph copied to the host for the union-find and the BFS), kept for A/B timings.
GPU_KERNELS = True


def gpu_kernels_on():
    """The current value of :data:`GPU_KERNELS` (read at call time, so a caller outside this module
    sees a flag switched after its import)."""
    return GPU_KERNELS


# ---------------------------------------------------------------------------------- helpers
def _xp_of(a):
    return get_array_module(a)


def _to_host(a):
    return a if isinstance(a, np.ndarray) else a.get()


def _check_graph(graph):
    if graph.ndim != 2:
        raise ValueError(f"graph must be 2-D (n, R), got shape {graph.shape}")
    if graph.dtype.kind not in "iu":
        raise ValueError(f"graph must hold integer ids, got dtype {graph.dtype}")


def _scatter_min(xp, a, idx, val):
    if xp is np:
        np.minimum.at(a, idx, val)
    else:
        import cupyx

        cupyx.scatter_min(a, idx, val)


# ---------------------------------------------------------------------------------- components
@_njit(cache=True)
def _find(parent, x):
    while parent[x] != x:
        parent[x] = parent[parent[x]]  # path halving
        x = parent[x]
    return x


@_njit(cache=True)
def _union_find_roots(graph):
    """Root of each node's weak component; the root is the smallest id in the component
    (union by smaller root). Ids outside [0, n) are ignored."""
    n, R = graph.shape
    parent = np.empty(n, np.int64)
    for i in range(n):
        parent[i] = i
    for i in range(n):
        for j in range(R):
            v = graph[i, j]
            if v < 0 or v >= n:
                continue
            a = _find(parent, i)
            b = _find(parent, v)
            if a < b:
                parent[b] = a
            elif b < a:
                parent[a] = b
    for i in range(n):
        parent[i] = _find(parent, i)
    return parent


def _propagate_roots(xp, graph):
    """Smallest node id of each node's weak component by min-label propagation with hooking and
    pointer jumping, in array operations (the GPU path; runs on numpy too, for the tests).

    Invariant: ``lab[x]`` is a node of x's component with ``lab[x] <= x``, so ``lab[lab[x]]`` is a
    valid replacement (pointer jumping). At the fixed point the two ends of every edge share a label
    and ``lab[lab] == lab``; the component's smallest id m keeps ``lab[m] == m``, so that is the label.
    """
    n, R = graph.shape
    g = graph.ravel()
    valid = (g >= 0) & (g < n)
    src = (xp.arange(n * R, dtype=xp.int64) // R)[valid].astype(xp.int32)
    dst = g[valid].astype(xp.int32)
    lab = xp.arange(n, dtype=xp.int32)
    while True:
        old = lab.copy()
        ls, ld = lab[src], lab[dst]
        m = xp.minimum(ls, ld)
        _scatter_min(xp, lab, src, m)
        _scatter_min(xp, lab, dst, m)
        _scatter_min(xp, lab, ls, m)   # hook the current labels too: fewer rounds on long paths
        _scatter_min(xp, lab, ld, m)
        while True:
            nl = lab[lab]
            if bool((nl == lab).all()):
                break
            lab = nl
        if bool((lab == old).all()):
            return lab


def components(graph, *, method=None):
    """Weakly connected components of a fixed-degree graph.

    Parameters
    ----------
    graph : int array (n, R), numpy or cupy
        Neighbour ids, ``-1`` (or any id outside ``[0, n)``) for an empty slot.
    method : {None, "union_find", "propagate", "kernel"}
        ``None``: Numba union-find for numpy, the ``connect.cu`` kernels (``"kernel"``: hooking and
        pointer jumping) for cupy (label propagation when ``GPU_KERNELS`` is False).
        ``"propagate"`` forces the array-operation label propagation on numpy too.

    Returns
    -------
    labels : int32 array (n,), same module as ``graph``
        Component number of each node; components are numbered by their smallest node id (the
        component of node 0 is 0), so CPU and GPU give identical labels.
    n_components : int

    Examples
    --------
    >>> import numpy as np
    >>> g = np.array([[1, -1], [-1, -1], [3, -1], [2, -1], [-1, -1]], np.int32)
    >>> labels, c = components(g)
    >>> labels.tolist(), c
    ([0, 0, 1, 1, 2], 3)
    """
    _check_graph(graph)
    xp = _xp_of(graph)
    n = graph.shape[0]
    if n == 0:
        return xp.zeros(0, xp.int32), 0
    if method is None:
        method = "union_find" if xp is np else "kernel" if GPU_KERNELS else "propagate"
    if method == "union_find":
        if xp is not np:
            raise ValueError("method='union_find' needs a numpy graph")
        roots = _union_find_roots(np.ascontiguousarray(graph))
    elif method == "propagate":
        roots = _propagate_roots(xp, graph)
    elif method == "kernel":
        if xp is np:
            raise ValueError("method='kernel' needs a cupy graph")
        from ._connect_gpu import component_roots

        roots = component_roots(graph)
    else:
        raise ValueError(f"method must be None, 'union_find', 'propagate' or 'kernel', got {method!r}")
    is_root = roots == xp.arange(n, dtype=roots.dtype)
    rank = xp.cumsum(is_root.astype(xp.int32)) - 1  # roots are their component's smallest id
    labels = rank[roots].astype(xp.int32)
    return labels, int(is_root.sum())


# ---------------------------------------------------------------------------------- reachability
def _frontier(xp, graph, seen, frontier):
    n = graph.shape[0]
    while frontier.size:
        nb = graph[frontier].ravel()
        nb = nb[(nb >= 0) & (nb < n)]
        nb = nb[~seen[nb]]
        if nb.size == 0:
            break
        nb = xp.unique(nb)
        seen[nb] = True
        frontier = nb
    return seen


def reachable_from(graph, sources, *, method=None):
    """Nodes reachable from ``sources`` along the directed edges of ``graph``.

    Parameters
    ----------
    graph : int array (n, R), numpy or cupy
        ``-1`` (or any id outside ``[0, n)``) for an empty slot.
    sources : int array-like
        Start nodes (entry points); negative ids are ignored.
    method : {None, "bfs", "frontier", "kernel"}
        ``None``: Numba BFS for numpy, the ``connect.cu`` BFS kernels (``"kernel"``) for cupy
        (frontier expansion in array operations when ``GPU_KERNELS`` is False); ``"frontier"``
        forces the array version on numpy.

    Returns
    -------
    bool array (n,), same module as ``graph``
        True where a node can be reached (sources included).

    Examples
    --------
    >>> import numpy as np
    >>> g = np.array([[1], [2], [-1], [0]], np.int32)
    >>> reachable_from(g, [0]).tolist()
    [True, True, True, False]
    """
    _check_graph(graph)
    xp = _xp_of(graph)
    n = graph.shape[0]
    src = xp.asarray(sources).ravel().astype(xp.int64)
    if src.size and bool((src >= n).any()):
        raise ValueError(f"sources must be node ids < n = {n}")
    src = src[src >= 0]
    if method is None:
        method = "bfs" if xp is np else "kernel" if GPU_KERNELS else "frontier"
    if method == "kernel":
        if xp is np:
            raise ValueError("method='kernel' needs a cupy graph")
        from ._connect_gpu import reachable_mask

        return reachable_mask(graph, src)
    seen = xp.zeros(n, dtype=bool)
    seen[src] = True
    if method == "bfs":
        if xp is not np:
            raise ValueError("method='bfs' needs a numpy graph")
        parent = np.empty(n, np.int64)
        _bfs_tree(np.ascontiguousarray(graph), np.unique(src), parent, np.empty(n, np.int64))
        return parent != -2
    if method == "frontier":
        return _frontier(xp, graph, seen, xp.unique(src))
    raise ValueError(f"method must be None, 'bfs', 'frontier' or 'kernel', got {method!r}")


# ---------------------------------------------------------------------------------- geometry
def _component_sums(xp, X, labels, c):
    """(c, d) float64-free sums and (c,) counts of the rows of X per label."""
    d = X.shape[1]
    cnt = xp.bincount(labels, minlength=c).astype(xp.float32)
    if xp is np:
        import scipy.sparse as sp

        S = sp.csr_matrix((np.ones(labels.shape[0], np.float32), (labels, np.arange(labels.shape[0]))),
                          shape=(c, labels.shape[0]))
        sums = np.asarray(S @ X, dtype=np.float32)
    else:
        # a sparse (c, n) one-hot matrix times X (cuSPARSE SpMM): scatter_add's atomics all land
        # on the few rows of the big components and serialise (20M x 96 points in ~1000
        # components: about a minute)
        import cupyx.scipy.sparse as csp

        n = labels.shape[0]
        S = csp.coo_matrix((xp.ones(n, xp.float32), (labels.astype(xp.int32), xp.arange(n, dtype=xp.int32))),
                           shape=(c, n)).tocsr()
        sums = xp.ascontiguousarray(S @ X, dtype=xp.float32)
        if d and sums.shape != (c, d):
            raise RuntimeError(f"component sums have shape {sums.shape}, expected {(c, d)}")
    return sums, cnt


def _centroids(xp, X, labels, c):
    sums, cnt = _component_sums(xp, X, labels, c)
    return (sums / xp.maximum(cnt, 1)[:, None]).astype(xp.float32), cnt


def _nearest_components(xp, C, L, block=2048):
    """(c, L) ids of the L nearest other centroids (squared l2, GEMM in row blocks)."""
    c = C.shape[0]
    # centred: the expansion below cancels in float32 when a common offset dwarfs the spread
    C = (C - C.astype(xp.float64).mean(axis=0).astype(C.dtype)) if c else C
    cn = (C * C).sum(axis=1)
    out = xp.empty((c, L), xp.int64)
    for s in range(0, c, block):
        D = cn[s:s + block, None] - 2 * (C[s:s + block] @ C.T) + cn[None, :]
        rows = xp.arange(D.shape[0])
        D[rows, rows + s] = xp.inf
        if L < c - 1:
            part = xp.argpartition(D, L - 1, axis=1)[:, :L]
        else:
            part = xp.argsort(D, axis=1)[:, :L]
        pd = xp.take_along_axis(D, part, axis=1)
        out[s:s + block] = xp.take_along_axis(part, xp.argsort(pd, axis=1), axis=1)
    return out


def _dist_rows(xp, A, B, metric):
    """Row-wise internal distance between A (m, d) and B (m, d) (squared l2 from the differences:
    the expansion cancels on data far from the origin)."""
    if metric == "ip":
        return -(A * B).sum(axis=1)
    diff = A - B
    return (diff * diff).sum(axis=1)


_HOST_COPY_MAX_BYTES = 2 << 30
#: Where a GPU graph's component rounds run. ``"hybrid"``: the passes over every point
#: (centroids, nearest components, each component's node nearest another's centroid) on the GPU,
#: the per-target member searches on a host copy of X; ``"device"``: everything on the GPU;
#: ``"host"``: everything on the host copy (the earlier default). ``"auto"``: device when the
#: components hold at least :data:`LINK_DEVICE_BYTES` of X each on average (few, large
#: components: one member search per target reads a large block, where the GPU wins), else hybrid
#: (many small components: a launch and a sync per target cost more than the host's search).
#: H100, tight clusters (``benchmarks/results/h100-2026-11-26-s12/connectivity/``): 1M x 128 in
#: ~360 components (1.4 MB each): host 4.5-4.9 s, hybrid 2.5-3.0 s, device 0.87 s (2.8 s in the
#: process's first device round); 100k x 64 in 1000 (26 KB each): host 0.28, hybrid 0.14, device
#: 0.23-0.50 s. The same links in every placement where the graph was deterministic (100k).
LINK_PLACEMENT = "auto"
LINK_DEVICE_BYTES = 1 << 20


# ---------------------------------------------------------------------------------- link insertion
class _Inserter:
    """Puts links into the rows of a host (numpy) graph: an empty slot if the row has one,
    otherwise the last slot whose target keeps another in-link (so no node loses its only in-link)
    and that is not a link added by the repair itself; the last unprotected slot when every target
    has in-degree 1. A row takes at most ``cap`` repair links (``R // 2``, at least 1), so hubs are
    not overwritten; :meth:`source_near` finds another source when a row is full."""

    def __init__(self, gh, indeg=None):
        self.g = gh
        n, self.R = gh.shape
        if indeg is None:
            g = gh.ravel()
            g = g[(g >= 0) & (g < n)]
            indeg = np.bincount(g, minlength=n)
        self.indeg = np.asarray(indeg).astype(np.int64, copy=False)
        self.nprot = np.zeros(n, np.int32)
        self.protected = {}  # row -> set of columns written by the repair
        self.cap = max(1, self.R // 2)
        self.added = 0

    def has_room(self, s):
        return self.nprot[s] < self.cap

    def source_near(self, r, labels, comp, limit=512):
        """``r`` if its row has room, else the first node with room found breadth-first from ``r``
        through nodes of component ``comp`` (``labels[v] == comp``, host labels); None if none within
        ``limit``. (A per-call boolean mask over all n nodes made a round O(components x n): 37 s of
        a 5M-point build with ~1000 components.)"""
        if self.has_room(r):
            return r
        seen = {r}
        queue = [r]
        head = 0
        while head < len(queue) and len(seen) < limit:
            u = queue[head]
            head += 1
            for v in self.g[u]:
                v = int(v)
                if v < 0 or v in seen or labels[v] != comp:
                    continue
                if self.has_room(v):
                    return v
                seen.add(v)
                queue.append(v)
        return None

    def insert(self, s, t):
        """Add the link s -> t; returns True if the graph changed."""
        s, t = int(s), int(t)
        row = self.g[s]
        if s == t or (row == t).any():
            return False
        prot = self.protected.setdefault(s, set())
        empty = np.flatnonzero(row < 0)
        if empty.size:
            j = int(empty[0])
        else:
            j = -1
            for jj in range(self.R - 1, -1, -1):
                if jj not in prot and self.indeg[row[jj]] > 1:
                    j = jj
                    break
            if j < 0:
                free = [jj for jj in range(self.R - 1, -1, -1) if jj not in prot]
                j = free[0] if free else self.R - 1
            self.indeg[row[j]] -= 1
        row[j] = t
        self.indeg[t] += 1
        if j not in prot:
            prot.add(j)
            self.nprot[s] += 1
        self.added += 1
        return True


# ---------------------------------------------------------------------------------- repair
def _argmin_per_label(xp, labels, d):
    """For each label present (in increasing label order), the index of its smallest ``d`` (ties:
    the smaller index). Two stable sorts on a GPU (radix sorts; ``lexsort`` on float64 keys was
    a suspect of the slow 5M component round), one lexsort on the host."""
    if xp is np:
        order = np.lexsort((d, labels))
    else:
        o1 = xp.argsort(d)  # CuPy's sorts are stable
        order = o1[xp.argsort(labels[o1])]
    first = xp.ones(labels.shape[0], dtype=bool)
    ls = labels[order]
    first[1:] = ls[1:] != ls[:-1]
    return order[first]


def _nearest_members(xp, X, pairs, order_all, starts, metric, block=65536):
    """For each pair (a, b, u): the member of component b nearest node u. Pairs are grouped by b so
    that each component's rows are read once, in row blocks, against all the u's that target it
    (one small GEMM per block). A scan per pair copied the giant component's rows once per pair:
    338 components around one giant one of a 1M x 128 set took 101 s."""
    v_of = np.empty(len(pairs), np.int64)
    by_b = {}
    for i, (_a, b, _u) in enumerate(pairs):
        by_b.setdefault(b, []).append(i)
    for b, idx in by_b.items():
        members = order_all[starts[b]:starts[b + 1]]
        us = np.fromiter((pairs[i][2] for i in idx), np.int64, len(idx))
        U = X[xp.asarray(us)]                                  # (m, d)
        # keys |a|^2 - 2 a.u relative to one of the targets: on data far from the origin the
        # expansion would cancel in float32 (translation does not change the nearest member)
        origin = U[0] if metric != "ip" else None
        if origin is not None:
            U = U - origin
        best = np.full(len(idx), np.inf)
        arg = np.zeros(len(idx), np.int64)
        for s in range(0, members.shape[0], block):
            mem = members[s:s + block]
            A = X[xp.asarray(mem)]
            if origin is not None:
                A = A - origin
            dots = A @ U.T                                     # (rows, m)
            dist = -dots if metric == "ip" else (A * A).sum(axis=1)[:, None] - 2 * dots
            j = xp.argmin(dist, axis=0)
            dj = _to_host(dist[j, xp.arange(len(idx))]).astype(np.float64)
            jj = _to_host(j)
            better = dj < best                                 # ties keep the earlier block
            best[better] = dj[better]
            arg[better] = mem[jj[better]]
        v_of[idx] = arg
    return v_of


def _link_components(xp, X, labels, c, metric, L, ins, members=None):
    """One Boruvka-style round: each component to its L nearest components (centroid GEMM), both
    ways: u = the node of A nearest B's centroid, v = the node of B nearest u. ``members``:
    ``(module, X)`` where the per-target member searches run (default ``(xp, X)``; the repair
    passes a host copy of a GPU ``X``: many small searches, see :data:`LINK_PLACEMENT`)."""
    n = X.shape[0]
    C, _ = _centroids(xp, X, labels, c)
    T = _nearest_components(xp, C, L)                    # (c, L)
    lab64 = labels.astype(xp.int64)
    # u for every (a, j): argmin over the nodes of a of dist(x, C[T[a, j]])
    u_host = np.empty((c, L), np.int64)
    for j in range(L):
        dj = xp.empty(n, xp.float32)
        for s in range(0, n, 65536):
            xb = X[s:s + 65536]
            dj[s:s + 65536] = _dist_rows(xp, xb, C[T[lab64[s:s + 65536], j]], metric)
        u_host[:, j] = _to_host(_argmin_per_label(xp, lab64, dj))  # one per component, in label order
    T_host = _to_host(T)
    lab_host = _to_host(labels)
    order_all = np.argsort(lab_host, kind="stable")
    starts = np.searchsorted(lab_host[order_all], np.arange(c + 1))
    seen_pairs = set()
    pairs = []  # (a, b, u) in the order the links are inserted
    for a in range(c):
        for j in range(L):
            b = int(T_host[a, j])
            key = (min(a, b), max(a, b))
            if key in seen_pairs:
                continue
            seen_pairs.add(key)
            pairs.append((a, b, int(u_host[a, j])))
    xm, Xm = members if members is not None else (xp, X)
    v_of = _nearest_members(xm, Xm, pairs, order_all, starts, metric)
    added = 0
    for (a, b, u), v in zip(pairs, v_of):
        v = int(v)
        # a full row hands the link to a nearby node of the same component
        su = ins.source_near(u, lab_host, a)
        sv = ins.source_near(v, lab_host, b)
        added += ins.insert(su if su is not None else u, v)
        added += ins.insert(sv if sv is not None else v, u)
    return added


@_njit(cache=True)
def _bfs_tree(graph, entry, parent, queue):
    """Breadth-first tree from ``entry``: ``parent[v]`` = the node that first reached v, -1 for an
    entry, -2 for an unreachable node. Returns the number of reachable nodes."""
    for v in range(parent.shape[0]):
        parent[v] = -2
    tail = 0
    for e in entry:
        if parent[e] == -2:
            parent[e] = -1
            queue[tail] = e
            tail += 1
    return _expand(graph, parent, queue, 0, tail)


@_njit(cache=True)
def _expand(graph, parent, queue, head, tail):
    """Breadth-first from the nodes ``queue[head:tail]``: every node they reach whose ``parent``
    is -2 (unreachable) gets the node that first reached it as parent and joins the queue.
    Returns the queue's new tail."""
    n, R = graph.shape
    while head < tail:
        u = queue[head]
        head += 1
        for j in range(R):
            v = graph[u, j]
            if v < 0 or v >= n or parent[v] != -2:
                continue
            parent[v] = u
            queue[tail] = v
            tail += 1
    return tail


@_njit(cache=True)
def _free_slot(graph, parent, r):
    """A slot of row ``r`` that can take a new link without losing reachability: an empty one,
    else the last one whose edge is not a tree edge (its target has another parent; the repair's
    own links are tree edges, see :func:`_put_link`); -1 if none."""
    R = graph.shape[1]
    for s in range(R):
        if graph[r, s] < 0:
            return s
    for s in range(R - 1, -1, -1):
        t = graph[r, s]
        if parent[t] != r:
            return s
    return -1


@_njit(cache=True)
def _open_state(parent, repair_links, cap):
    """One byte per node for the repair passes: bit 0 = reachable (``parent != -2``), bit 1 = open
    (reachable and under ``cap`` repair links, so it may take a link). The passes read this 1-byte
    array (1 MB at 1M nodes, cache-resident) for every out-neighbour they consider instead of
    ``parent`` (8 MB) and ``repair_links`` (4 MB): a pass over 1M x 128 rows whose neighbours
    cannot take a link cost 6.3 s on 2 cores with those random reads (49 ns a check; on an H200
    host 5 s a pass, three passes in the skewed-norm inner-product 1M build)."""
    n = parent.shape[0]
    state = np.zeros(n, np.uint8)
    for v in range(n):
        if parent[v] != -2:
            state[v] = 3 if repair_links[v] < cap else 1
    return state


@_njit(cache=True)
def _put_link(graph, parent, repair_links, cap, r, u, state):
    """Write the link r -> u if ``r`` is a reachable node with room (``state``, see
    :func:`_open_state` and :func:`_free_slot`); the link becomes u's tree edge (``parent[u] =
    r``), so no later link replaces it. A row found without a free slot is closed
    (``repair_links[r] = cap``): slots only ever turn into tree edges (parents never change), so it
    can take no link later either. ``state`` is kept in step with ``parent`` and ``repair_links``."""
    if r < 0 or (state[r] & 2) == 0:
        return False
    s = _free_slot(graph, parent, r)
    if s < 0:
        repair_links[r] = cap
        state[r] = 1
        return False
    graph[r, s] = u
    parent[u] = r
    state[u] = 3  # newly reached: it has never been a source, so it has room
    repair_links[r] += 1
    if repair_links[r] >= cap:
        state[r] = 1
    return True


@_njit(cache=True)
def _mark_reached(graph, u, parent, queue, state):
    """``u`` was just linked from a reachable node: mark (parent pointers, as the BFS tree would,
    and ``state``) every unreachable node that ``u`` reaches; returns how many were marked besides
    ``u``. Each node is marked once over a whole repair, so the marking costs one BFS in all."""
    n, R = graph.shape
    queue[0] = u
    head = 0
    tail = 1
    while head < tail:
        w = queue[head]
        head += 1
        for j in range(R):
            v = graph[w, j]
            if v < 0 or v >= n or (state[v] & 1) != 0:
                continue
            parent[v] = w
            state[v] = 3
            queue[tail] = v
            tail += 1
    return tail - 1


@_njit(cache=True)
def _link_unreachable(graph, parent, repair_links, cap, queue, state):
    """Every node u still unreachable when the pass comes to it, with a reachable out-neighbour r
    with room (the nearest first: rows are in distance order), gets the reverse link r -> u, and
    what u reaches is marked reachable at once (:func:`_mark_reached`), so a part reached through
    one link takes no more. Tree edges (``parent``) are never replaced, so every node reachable
    before stays reachable; a row takes at most ``cap`` repair links in all. ``state``
    (:func:`_open_state`) answers "reachable?" and "may take a link?" per node and is kept in step.
    Returns ``(links added, nodes newly reached)``."""
    n, R = graph.shape
    added = 0
    newly = 0
    for u in range(n):
        if (state[u] & 1) != 0:
            continue
        # most rows have no open out-neighbour once the hubs are full: one pass of independent
        # loads answers that (the loop below, a call per neighbour, waits on each load in turn)
        any_open = 0
        for j in range(R):
            r = graph[u, j]
            if 0 <= r < n:
                any_open |= state[r]
        if (any_open & 2) == 0:
            continue
        for j in range(R):
            r = graph[u, j]
            if r < n and _put_link(graph, parent, repair_links, cap, r, u, state):
                added += 1
                newly += 1 + _mark_reached(graph, u, parent, queue, state)
                break
    return added, newly


@_njit(cache=True)
def _insert_links(graph, parent, repair_links, cap, src_cand, dst, queue, state):
    """For each ``dst[i]`` still unreachable, the first candidate source of ``src_cand[i]`` with
    room gets dst[i] (marked reachable with what it reaches). Returns ``(added, newly reached)``."""
    added = 0
    newly = 0
    for i in range(dst.shape[0]):
        u = dst[i]
        if (state[u] & 1) != 0:
            continue
        for c in range(src_cand.shape[1]):
            if _put_link(graph, parent, repair_links, cap, src_cand[i, c], u, state):
                added += 1
                newly += 1 + _mark_reached(graph, u, parent, queue, state)
                break
    return added, newly


#: Sources sampled per batch of nearest-reachable links when more than a batch is unreachable.
MANY_UNREACHABLE_SAMPLE = 512


def _link_from_nearest_reachable(xp, X, gh, parent, repair_links, cap, metric, entry, queue, state,
                                 batch=16384, sample=2048, cands=16):
    """Unreachable nodes with no reachable out-neighbour (a part that only links into itself, or
    whose reachable neighbours are full): link up to ``batch`` of them from their nearest reachable
    nodes among a sample of ``sample`` reachable ones (exact distances, one GEMM). Returns
    ``(links added, nodes newly reached)``."""
    un = np.flatnonzero(parent == -2)
    reach = np.flatnonzero(parent != -2)
    if un.size == 0 or reach.size == 0:
        return 0, 0
    if un.size > batch:
        # many left (inner-product graphs: nearly every row behind full hubs): a smaller sample
        # of sources per batch, since the cost is rows x sample and any reachable source with
        # room will do for rows that no walk from a hub reached
        sample = min(sample, MANY_UNREACHABLE_SAMPLE)
        un = un[:batch]
    rs = np.random.default_rng(int(un.size) * 7919 + int(reach.size))
    pool = np.unique(np.concatenate([entry, rs.choice(reach, size=min(sample, reach.size), replace=False)]))
    pool = pool[parent[pool] != -2]
    P = X[xp.asarray(pool)]
    U = X[xp.asarray(un)]
    m = min(cands, pool.size)
    # candidate sources by the metric, then (inner product) by Euclidean nearness: the best dot
    # products are hubs whose rows are often full already
    keys = ["ip", "l2"] if metric == "ip" else ["l2"]
    parts = []
    if xp is np:
        # the host's exact top-m (one fused GEMM + selection): NumPy's argpartition of the whole
        # (batch x sample) key matrix cost 1.8 s per block of 4096 (skewed_norms_ip 100k x 64: 23
        # blocks, 13.4 s of a 36 s build), knn_cpu 0.2 s for both keys
        from ..exact._cpu import knn_cpu

        P = np.ascontiguousarray(P, dtype=np.float32)
        U = np.ascontiguousarray(U, dtype=np.float32)
        for key in keys:
            _d, part = knn_cpu(P, U, m, key, False)
            parts.append(pool[np.asarray(part, dtype=np.int64)])
    else:
        G = U @ P.T
        for key in keys:
            D = -G if key == "ip" else (P * P).sum(axis=1)[None, :] - 2 * G
            part = xp.argpartition(D, m - 1, axis=1)[:, :m] if m < pool.size else xp.argsort(D, axis=1)
            part = xp.take_along_axis(part, xp.argsort(xp.take_along_axis(D, part, axis=1), axis=1), axis=1)
            parts.append(pool[_to_host(part)])
    # last resort: random reachable nodes (a row with room always exists among them)
    parts.append(rs.choice(reach, size=(un.size, 8)))
    src = np.concatenate(parts, axis=1).astype(np.int64)
    added, newly = _insert_links(gh, parent, repair_links, cap, src, un.astype(np.int64), queue, state)
    return int(added), int(newly)


def _nothing_to_repair(graph, copy, t0):
    """``repair_connectivity``'s result for a graph that is one component with every node
    reachable (the same stats as the host path gives it)."""
    sec = round(time.perf_counter() - t0, 4)
    stats = {"components_before": 1, "unreachable_before": 0, "component_rounds": 0, "component_seconds": sec,
             "reach_rounds": 0, "reach_seconds": 0.0, "components_after": 1, "unreachable_after": 0,
             "links_added": 0, "seconds": sec, "link_placement": None}
    logger.debug("repair_connectivity: components 1 -> 1, unreachable 0 -> 0, 0 links added (%.3f s, GPU check)", sec)
    return (graph.copy() if copy else graph), stats


#: A GPU graph that is one component with at most this many nodes unreachable from the entries is
#: repaired on the device (:func:`_repair_few_on_device`) instead of through the host copy and the
#: host BFS tree (uniform 1M x 128: 2 unreachable nodes cost the build 0.9 s the host way).
FEW_UNREACHABLE_MAX = 4096


def _repair_few_on_device(g, entry, *, max_rounds=8, mask_fn=None, first_mask=None):
    """Link the few nodes of ``g`` (one weak component, int32 (n, R), modified in place) that the
    entries do not reach, without a host copy of the graph: each unreachable node ``u`` gets the
    link ``r -> u`` from its first out-neighbour ``r`` that is reachable and has room (rows are in
    distance order: the nearest such), into an empty slot of ``r`` or else its last slot whose
    target keeps another in-link and that the repair did not write (the rule of ``_Inserter``; a
    row takes at most ``R // 2`` repair links). No BFS tree says which edges are tree edges, so
    reachability is counted again after every round and the rounds go on while anything is left
    unreachable. Returns ``(links_added, rounds, unreachable_before)``, or None when a node has
    no reachable out-neighbour with room, more than :data:`FEW_UNREACHABLE_MAX` nodes are left,
    or ``max_rounds`` do not finish (the caller then takes the host path, from ``g`` as it is:
    every link written is a valid edge).

    ``mask_fn(g, entry)`` -> boolean (n,) reachability (default: the device BFS of ``connect.cu``;
    the CPU tests pass the host BFS); ``first_mask``: that mask for ``g`` as given, when the caller
    has it (the first round then runs no BFS)."""
    xp = _xp_of(g)
    if mask_fn is None:
        from ._connect_gpu import reachable_mask as mask_fn
    n, R = g.shape
    cap = max(1, R // 2)
    ok = (g >= 0) & (g < n)
    indeg = xp.bincount(g[ok].ravel().astype(xp.int64), minlength=n)
    del ok
    nrep = {}   # row -> repair links written into it
    prot = {}   # row -> its slots written by the repair
    added, before = 0, None
    for rounds in range(max_rounds + 1):
        mask = xp.asarray(first_mask if rounds == 0 and first_mask is not None else mask_fn(g, entry))
        un = xp.flatnonzero(~mask)
        m = int(un.size)
        if before is None:
            before = m
        if m == 0:
            return added, rounds, before
        if m > FEW_UNREACHABLE_MAX or rounds == max_rounds:
            return None
        rows_u = _to_host(g[un])                                   # (m, R) out-lists of the unreachable
        valid = (rows_u >= 0) & (rows_u < n)
        reach_u = np.zeros(rows_u.shape, np.bool_)
        reach_u[valid] = _to_host(mask[xp.asarray(rows_u[valid])])
        srcs = np.unique(rows_u[reach_u])
        if srcs.size == 0:
            return None
        rows_r = _to_host(g[xp.asarray(srcs)]).copy()             # the candidate sources' rows
        tgt = np.unique(rows_r[(rows_r >= 0) & (rows_r < n)])
        deg = dict(zip(tgt.tolist(), _to_host(indeg[xp.asarray(tgt)]).tolist()))  # their in-degrees
        pos = {int(r): i for i, r in enumerate(srcs)}
        un_h = _to_host(un)
        linked = 0
        for i in range(m):
            u = int(un_h[i])
            for j in range(R):
                if not reach_u[i, j]:
                    continue
                r = int(rows_u[i, j])
                if nrep.get(r, 0) >= cap:
                    continue
                row, pr = rows_r[pos[r]], prot.setdefault(r, set())
                if (row == u).any():
                    break  # linked already this round
                empty = np.flatnonzero(row < 0)
                if empty.size:
                    slot = int(empty[0])
                else:
                    free = [s for s in range(R - 1, -1, -1) if s not in pr]
                    if not free:
                        continue
                    keep = [s for s in free if deg.get(int(row[s]), 0) > 1]
                    slot = keep[0] if keep else free[0]
                    deg[int(row[slot])] = deg.get(int(row[slot]), 1) - 1
                row[slot] = u
                deg[u] = deg.get(u, 0) + 1
                pr.add(slot)
                nrep[r] = nrep.get(r, 0) + 1
                linked += 1
                break
        if linked == 0:
            return None
        g[xp.asarray(srcs)] = xp.asarray(rows_r)
        ok = (g >= 0) & (g < n)
        indeg = xp.bincount(g[ok].ravel().astype(xp.int64), minlength=n)
        del ok
        added += linked
    return None


#: Off: every graph with unreachable nodes takes the host path (the A/B of the device repair).
FEW_ON_DEVICE = True


def _repaired_on_device(graph, g, copy, t0, added, rounds, before):
    """``repair_connectivity``'s result after :func:`_repair_few_on_device` (host-path stats)."""
    sec = round(time.perf_counter() - t0, 4)
    stats = {"components_before": 1, "unreachable_before": int(before), "component_rounds": 0,
             "component_seconds": 0.0, "reach_rounds": int(rounds), "reach_seconds": sec, "components_after": 1,
             "unreachable_after": 0, "links_added": int(added), "seconds": sec, "link_placement": None,
             "reach_placement": "device"}
    logger.info("repair_connectivity: components 1 -> 1, unreachable %d -> 0, %d links added (%.3f s, on the device)",
                before, added, sec)
    if not copy and g is not graph:
        graph[...] = g
        g = graph
    return g, stats


def repair_connectivity(X, graph, *, metric, entry_ids, links_per_component=2, max_rounds=64, copy=True,
                        components_of=None):
    """Make every node of a search graph reachable from the entry points.

    Two phases, each repeated until it holds:

    1. **Weak connectivity** (Boruvka rounds): find the weakly connected components; link each to
       its ``links_per_component`` nearest other components (centroid distances by one GEMM,
       ``O(c^2 d)``), in both directions, between the node of A nearest B's centroid and the node of B
       nearest that node (exact distances). Every round at least halves the number of components.
    2. **Reachability** (host Numba, also for a GPU graph): a breadth-first tree from
       ``entry_ids``; every unreachable node ``u`` with an edge to a reachable node ``r`` gets the
       reverse link ``r -> u`` (all of them in one pass); a part with no such edge is linked from
       the nearest reachable nodes of a sample (one GEMM); repeated until nothing is unreachable.
       A link never replaces a BFS-tree edge, so a node reachable before a round stays reachable.

    A link goes into an empty slot if the row has one, otherwise it replaces the last slot whose
    target has another in-link (rows of a pruned graph end with their farthest neighbours) and that
    was not itself written by the repair.

    A GPU graph (``GPU_KERNELS``) is first checked on the device (``connect.cu``): one component with
    every node reachable is returned as it is, with the stats the host path gives, without a host
    copy; anything else goes the host way above (with the kernels' component labels).

    Parameters
    ----------
    X : float32 array (n, d), numpy or cupy (same module as ``graph``)
        Prepared vectors (unit rows for cosine).
    graph : int32 array (n, R)
        Search graph, ``-1`` in empty slots. Modified in place when ``copy=False``.
    metric : {"l2", "ip"}
        Internal metric (squared Euclidean, negative inner product) used to pick link endpoints;
        components are paired by squared Euclidean distance between their centroids.
    entry_ids : int array-like
        Node ids searches start from.
    links_per_component : int
        Nearest components each component is linked to per round (>= 1).
    max_rounds : int
        Cap on the rounds of each phase (the stats say if anything was left).
    copy : bool
        Work on a copy of ``graph`` (default) or in place.
    components_of : (labels, count), optional
        The graph's weakly connected components when the caller has them already (host or device
        labels): saves one union-find pass.

    Returns
    -------
    graph : int32 array (n, R)
        The repaired graph (same module).
    stats : dict
        ``components_before``, ``components_after``, ``unreachable_before``, ``unreachable_after``,
        ``links_added``, ``component_rounds``, ``reach_rounds``, ``seconds`` (and its parts
        ``component_seconds``, ``reach_seconds``).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0, 0], [0, 1], [9, 9], [9, 8]], np.float32)
    >>> g = np.array([[1], [0], [3], [2]], np.int32)
    >>> g2, st = repair_connectivity(X, np.concatenate([g, np.full((4, 1), -1, np.int32)], 1),
    ...                              metric="l2", entry_ids=[0])
    >>> st["components_before"], st["components_after"], st["unreachable_after"]
    (2, 1, 0)
    """
    t0 = time.perf_counter()
    _check_graph(graph)
    xp = _xp_of(graph)
    if _xp_of(X) is not xp:
        raise ValueError("X and graph must live in the same array module (both numpy or both cupy)")
    if X.ndim != 2 or X.shape[0] != graph.shape[0]:
        raise ValueError(f"X must be (n, d) with n = graph rows = {graph.shape[0]}, got {X.shape}")
    if metric not in ("l2", "ip"):
        raise ValueError(f"metric must be 'l2' or 'ip', got {metric!r}")
    if isinstance(links_per_component, bool) or int(links_per_component) != links_per_component \
            or links_per_component < 1:
        raise ValueError(f"links_per_component must be an integer >= 1, got {links_per_component!r}")
    n = graph.shape[0]
    entry = np.unique(_to_host(xp.asarray(entry_ids)).ravel().astype(np.int64))
    entry = entry[entry >= 0]
    if entry.size == 0 or entry.max() >= n:
        raise ValueError(f"entry_ids must hold at least one node id in [0, {n})")
    on_kernels = xp is not np and GPU_KERNELS
    reached_gpu = None  # reachability counted on the device (None: not counted, or too many levels)
    if on_kernels:
        # the common case on the GPU: one component, every node reachable -- answered by the
        # kernels of connect.cu on the device graph, without the host copy and the host BFS
        from ._connect_gpu import MAX_BFS_LEVELS, mask_of_bits, reach_bits, reach_count

        if components_of is None:
            components_of = components(graph)
        # None: too many BFS levels, ask the host; the bits are the first round's mask of the
        # device repair (one BFS, not two)
        bits, reached_gpu = reach_bits(graph, entry, max_levels=MAX_BFS_LEVELS)
        if int(components_of[1]) == 1:
            if reached_gpu == n:
                return _nothing_to_repair(graph, copy, t0)
            if reached_gpu is not None and n - reached_gpu <= FEW_UNREACHABLE_MAX and FEW_ON_DEVICE:
                g = graph.copy() if copy else graph
                done = _repair_few_on_device(g, entry, first_mask=mask_of_bits(bits, n))
                if done is not None:
                    return _repaired_on_device(graph, g, copy, t0, *done)
                graph, copy = g, False  # the host path goes on from the links written so far
            logger.debug("repair_connectivity: %s of %d reachable on the GPU; host repair",
                         "?" if reached_gpu is None else n - reached_gpu, n)
    # links are written into a host copy (the GPU graph is refreshed from it after each round);
    # a GPU graph's host copy is new already (the kernel path copies it once)
    gh = _to_host(graph).astype(np.int32, copy=copy or (xp is not np and not GPU_KERNELS))
    X = X.astype(xp.float32, copy=False)
    stats = {}

    uploaded = None  # a device copy of gh made after the component rounds, while gh is unchanged

    def dev():
        return gh if xp is np else uploaded if uploaded is not None else xp.asarray(gh)

    # (GPU graphs: one copy to the host here, one back at the end)
    # components and reachability run on the host copy (Numba union-find and BFS: at 1M x 64 a
    # fraction of a second, where CuPy label propagation took seconds); X stays on its device
    if components_of is not None:
        labels, c = np.asarray(_to_host(components_of[0])), int(components_of[1])
    else:
        labels, c = components(gh)
    stats["components_before"] = c
    parent = np.empty(n, np.int64)
    queue = np.empty(n, np.int64)
    # the BFS tree (parents) is needed only by phase 2; a device count answers "all reached"
    # without the host BFS (1M x 64: ~0.3 s a pass)
    have_tree = reached_gpu is None
    reached = _bfs_tree(gh, entry, parent, queue) if have_tree else int(reached_gpu)
    stats["unreachable_before"] = int(n - reached)
    # the inserter's in-degree count is a pass over every edge: only when there is work
    # (1M x 64 connected graphs paid 0.5 s for it; counted on the device for a GPU graph)
    ins = None
    if c > 1 or reached < n:
        indeg = None
        if xp is not np:
            ok = (graph >= 0) & (graph < n)
            indeg = _to_host(xp.bincount(graph[ok].ravel().astype(xp.int64), minlength=n))
            del ok
        ins = _Inserter(gh, indeg)
    rounds = 0
    # where the rounds run (LINK_PLACEMENT): a host copy of X when it fits _HOST_COPY_MAX_BYTES,
    # made once: a round's per-target member searches are many small GEMMs, each a launch and a
    # sync on a GPU (5M x 96, 1000 components: 19.7 s on an H100 against ~4 s on the host with
    # everything there; 3M on 2 CPU cores 2.3 s)
    placement = LINK_PLACEMENT if xp is not np else "device"
    if placement not in ("auto", "hybrid", "host", "device"):
        raise ValueError(f"LINK_PLACEMENT must be 'auto', 'hybrid', 'host' or 'device', got {placement!r}")
    if placement == "auto":
        placement = "device" if X.nbytes >= LINK_DEVICE_BYTES * max(c, 1) else "hybrid"
    used_placement = placement if c > 1 and xp is not np else None
    bulk = members = (xp, X)
    if c > 1 and placement != "device" and X.nbytes <= _HOST_COPY_MAX_BYTES:
        members = (np, _to_host(X))
        if placement == "host":
            bulk = members
    while c > 1 and rounds < max_rounds:
        L = int(min(links_per_component, c - 1))
        if _link_components(bulk[0], bulk[1], bulk[0].asarray(labels), c, metric, L, ins, members=members) == 0:
            break
        labels, c = components(gh)
        rounds += 1
    del members, bulk
    stats["component_rounds"] = rounds
    if rounds:
        reached_gpu = None
        if on_kernels:
            uploaded = xp.asarray(gh)  # also the result, unless phase 2 writes more links
            reached_gpu = reach_count(uploaded, entry)
        have_tree = reached_gpu is None
        reached = _bfs_tree(gh, entry, parent, queue) if have_tree else int(reached_gpu)
    if reached < n and not have_tree:  # phase 2 walks the BFS tree
        reached = _bfs_tree(gh, entry, parent, queue)
        have_tree = True
    stats["component_seconds"] = round(time.perf_counter() - t0, 4)

    # phase 2 on the host copy: BFS tree from the entries, then reverse links into the unreachable
    # part, never removing a tree edge (so nothing reachable is lost), in Numba passes that mark
    # what each link reaches at once. Where neighbours cannot take the links (inner-product graphs:
    # every row points at the same few long vectors, whose R // 2 repair slots fill; skewed norms
    # 1M x 96 left 993k nodes unreachable), the rest are linked from their nearest reachable nodes,
    # batch after batch in the same round (one BFS per round cost 3.5 s at 1M and 64 rounds did
    # not finish).
    rounds = 0
    repair_links = np.zeros(n, np.int32)
    cap = max(1, gh.shape[1] // 2)
    state = _open_state(parent, repair_links, cap) if reached < n else None
    while reached < n and rounds < max_rounds:
        added, newly = _link_unreachable(gh, parent, repair_links, cap, queue, state)
        reached += newly
        logger.debug("repair_connectivity: reach round %d, %d linked from a neighbour, %d unreachable left",
                     rounds, added, n - reached)
        if added == 0:
            while reached < n:
                a, newly = _link_from_nearest_reachable(xp, X, gh, parent, repair_links, cap, metric,
                                                        entry, queue, state)
                if a == 0:
                    break
                added += a
                reached += newly
            if added == 0:
                break
        ins.added += added
        rounds += 1
        uploaded = None  # gh changed
    if rounds:  # the count from the marks, checked by one BFS
        reached = _bfs_tree(gh, entry, parent, queue)
    stats["reach_rounds"] = rounds
    stats["reach_seconds"] = round(time.perf_counter() - t0 - stats["component_seconds"], 4)
    # links only ever merge components: recount only when some were left after phase 1
    if c > 1:
        labels, c = components(gh)
    stats["components_after"] = c
    stats["unreachable_after"] = int(n - reached)
    g = dev() if ins is not None else graph if not copy else graph.copy()
    stats["links_added"] = ins.added if ins is not None else 0
    stats["seconds"] = round(time.perf_counter() - t0, 4)
    stats["link_placement"] = used_placement  # where a GPU graph's component rounds ran (None: none)
    level = logger.info if stats["components_before"] > 1 or stats["unreachable_before"] else logger.debug
    level("repair_connectivity: components %d -> %d, unreachable %d -> %d, %d links added (%.3f s)",
          stats["components_before"], c, stats["unreachable_before"], stats["unreachable_after"],
          stats["links_added"], stats["seconds"])
    if c > 1 or stats["unreachable_after"]:  # a search can miss these: say so (max_rounds ran out)
        warnings.warn(f"repair_connectivity: after {max_rounds} rounds {c} components and "
                      f"{stats['unreachable_after']} nodes unreachable from the entry points are left; "
                      f"searches cannot return those nodes", RuntimeWarning, stacklevel=2)
    if not copy:  # write the result into the caller's array (numpy or cupy)
        if g is not graph:
            graph[...] = g
        g = graph
    return g, stats


# ---------------------------------------------------------------------------------- soft components
#: An edge is "long" when its squared distance exceeds this many times the larger of its two end
#: rows' shortest positive edge (8x in Euclidean distance); rows with no positive edge
#: (duplicates) never call an edge long.
LONG_EDGE_FACTOR = 64.0
#: n * R * d from which the host edge distances use the Numba kernel (below: NumPy, no compile)
NUMBA_EDGE_WORK = 2e7


def short_edge_components(X, graph, metric="l2", *, factor=LONG_EDGE_FACTOR, block=8192, components_of=None):
    """Weakly connected components of ``graph`` without its long edges (labels, count).

    Separated clusters joined only by a few stray links (a GPU NN-Descent graph keeps some of its
    random start: 10,000 clusters of 1M x 128 were one component) are one component of the graph
    but several here, so each can get its own entry point. ``X``: prepared vectors (numpy or
    cupy, like ``graph``); ``metric``: internal (``"ip"``: unit rows are compared by squared
    Euclidean distance too). ``components_of``: the graph's own ``(labels, count)``, returned as
    they are when no edge is long. Labels are host arrays, but device arrays on the GPU kernel
    path (``GPU_KERNELS``), where the edge lengths are summed in dimension order (float32, see
    ``connect.cu``) instead of CuPy's reduction order: an edge within a few float32 roundings of
    ``factor`` times its scale may be judged the other way.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0, 0], [0, 1], [1, 0], [100, 0], [100, 1], [101, 0]], np.float32)
    >>> g = np.array([[1, 2, 3], [0, 2, -1], [0, 1, -1], [4, 5, -1], [3, 5, -1], [3, 4, -1]], np.int32)
    >>> components(g)[1], short_edge_components(X, g)[1]  # 0 -> 3 is a stray link
    (1, 2)
    """
    xp = _xp_of(graph)
    n, R = graph.shape
    if xp is not np and GPU_KERNELS:
        # one kernel for the edge lengths (no (block, R, d) gathers), one for the long-edge rule;
        # the short graph's components on the GPU too (labels stay on the device)
        from ._connect_gpu import drop_long_edges, edge_sqdist

        dist = edge_sqdist(X, graph)
        near = xp.where(dist > 0, dist, xp.inf).min(axis=1)
        near = xp.where(xp.isfinite(near), near, 0).astype(xp.float32)
        short, n_long = drop_long_edges(graph, dist, near, factor)
        del dist
        if components_of is not None and n_long == 0:
            return components_of
        return components(short)
    if xp is np and n * R * X.shape[1] > NUMBA_EDGE_WORK:
        # large graphs: the Numba edge-distance kernel of the pruning step (squared l2, +inf at
        # -1); small ones stay in NumPy, so a first run does not compile it for them
        from ._prune_cpu import pair_distances

        dist = pair_distances(np.ascontiguousarray(X, dtype=np.float32), np.where(graph < n, graph, -1), "l2")
        dist[~np.isfinite(dist)] = np.nan
    else:
        dist = xp.empty((n, R), xp.float32)
        if xp is np:
            # host: bound the gathered (block, R, d) temporary to ~32 MB (the whole graph was one
            # block below 8192 rows: 2000 x 64 edges in 960-d made a 0.5 GB temporary)
            block = max(1, min(block, (32 << 20) // (4 * max(1, R * X.shape[1]))))
        for s0 in range(0, n, block):
            g = graph[s0:s0 + block]
            valid = (g >= 0) & (g < n)
            nb = X[xp.where(valid, g, 0)]
            d = ((nb - X[s0:s0 + block, None, :]) ** 2).sum(axis=2)
            dist[s0:s0 + block] = xp.where(valid, d, xp.nan)
    # a row's scale is its shortest positive edge: the median was itself a long edge in rows that
    # the reverse-edge pass had filled with links to other clusters (1M x 128, 10,000 tight
    # clusters: 7,708 components by the median, 9,942 by the shortest edge; recall 0.978 -> 1.0)
    near = xp.where(dist > 0, dist, xp.inf).min(axis=1)
    near = xp.where(xp.isfinite(near), near, 0)
    gi = xp.where((graph >= 0) & (graph < n), graph, 0)
    scale = xp.maximum(near[:, None], near[gi])
    long_ = (dist > factor * scale) & (near[:, None] > 0) & (near[gi] > 0)
    if components_of is not None and not bool(long_.any()):
        # no long edge: the short-edge components are the graph's own (broad data; saves the
        # union-find pass and the host copy)
        return components_of
    keep = _to_host(~long_)
    short = np.where(keep, _to_host(graph), -1).astype(np.int32)
    return components(short)


# ---------------------------------------------------------------------------------- entry points
def entry_points_per_component(labels, X, *, metric="l2", max_entries=16384):
    """One entry point per component: its member nearest (squared l2) to the component centroid.

    Call it on the labels of the graph *before* :func:`repair_connectivity` (one component per
    separated cluster) so that every cluster has its own door; the number of entries then follows
    the data (one per component) instead of a fixed ``sqrt(n)``.

    Parameters
    ----------
    labels : int array (n,), numpy or cupy
        Component labels ``0 .. c-1`` (from :func:`components`).
    X : float32 array (n, d), same module
        Prepared vectors.
    metric : {"l2", "ip"}
        ``"ip"`` normalises the returned centroids (spherical, like ``build_entry_points``) so that
        ``EntryPoints.seeds_for`` ranks them by direction.
    max_entries : int
        At most this many entries: when there are more components, the largest ones are kept (the
        others are still reachable after the repair).

    Returns
    -------
    medoids : int32 array (m,)
        Entry node ids, one per kept component, ordered by component label.
    centroids : float32 array (m, d)
        The centroids they stand for (for ``EntryPoints(centroids, medoids, metric)``).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0, 0], [0, 2], [0, 1], [9, 9]], np.float32)
    >>> med, cen = entry_points_per_component(np.array([0, 0, 0, 1]), X)
    >>> med.tolist()
    [2, 3]
    """
    xp = _xp_of(X)
    if metric not in ("l2", "ip"):
        raise ValueError(f"metric must be 'l2' or 'ip', got {metric!r}")
    if isinstance(max_entries, bool) or int(max_entries) != max_entries or max_entries < 1:
        raise ValueError(f"max_entries must be an integer >= 1, got {max_entries!r}")
    labels = xp.asarray(labels).astype(xp.int64)
    if labels.shape != (X.shape[0],):
        raise ValueError(f"labels must have shape ({X.shape[0]},), got {labels.shape}")
    if labels.size == 0 or bool((labels < 0).any()):
        raise ValueError("labels must be non-negative component numbers")
    X = X.astype(xp.float32, copy=False)
    c = int(labels.max()) + 1
    C, cnt = _centroids(xp, X, labels, c)
    d = xp.empty(labels.shape[0], xp.float32)
    step = 1 << 20  # C[labels] in row blocks: a full (n, d) copy is as large as X
    for s in range(0, labels.shape[0], step):
        d[s:s + step] = _dist_rows(xp, X[s:s + step], C[labels[s:s + step]], "l2")
    med = _argmin_per_label(xp, labels, d)   # one per present label, in label order
    present = labels[med]
    C = C[present]
    if present.shape[0] > max_entries:
        keep = xp.sort(xp.argsort(-cnt[present], kind="stable")[:max_entries])
        logger.info("entry_points_per_component: %d components, keeping the %d largest as entries",
                    int(present.shape[0]), int(max_entries))
        med, C = med[keep], C[keep]
    if metric == "ip":
        nrm = xp.sqrt((C * C).sum(axis=1))[:, None]
        C = (C / xp.where(nrm > 0, nrm, 1)).astype(xp.float32)
    return med.astype(xp.int32), C.astype(xp.float32)


def combine_entry_points(entry, medoids, centroids):
    """An ``EntryPoints`` holding the k-means entries of ``entry`` plus per-component ones.

    Parameters
    ----------
    entry : EntryPoints
        From ``build_entry_points`` (k-means centroids and medoids).
    medoids, centroids : arrays
        From :func:`entry_points_per_component` (same module as ``entry``'s arrays).

    Returns
    -------
    EntryPoints
        Centroid/medoid pairs of both, with duplicate medoids dropped (the k-means one kept).

    Examples
    --------
    >>> import numpy as np
    >>> from knnkit.index._entry import EntryPoints
    >>> ep = EntryPoints(np.zeros((1, 2), np.float32), np.array([5], np.int32), "l2")
    >>> both = combine_entry_points(ep, np.array([5, 7], np.int32), np.ones((2, 2), np.float32))
    >>> both.medoids.tolist()
    [5, 7]
    """
    from ._entry import EntryPoints

    xp = _xp_of(entry.centroids)
    medoids = xp.asarray(medoids).astype(xp.int32)
    centroids = xp.asarray(centroids).astype(xp.float32)
    new = ~xp.isin(medoids, entry.medoids)
    M = xp.concatenate([entry.medoids.astype(xp.int32), medoids[new]])
    C = xp.concatenate([entry.centroids.astype(xp.float32), centroids[new]])
    return EntryPoints(C, M, entry.metric)
