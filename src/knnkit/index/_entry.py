"""Entry points of the graph search: a coarse k-means over the data, each centroid represented by
its nearest data point (its medoid). A query starts from the medoids of its nearest centroids,
so every cluster of clustered data has a door even where the graph links clusters poorly
(GGNN section 5.4 starts from several scattered points for the same reason).

The code is array-module agnostic: numpy on the CPU, cupy on the GPU.
"""

import numpy as np

from .._core.backend import as_host, get_array_module
from .._core.kmeans import lloyd, nearest_centroid as _nearest_centroid, sqnorms as _sqnorms

__all__ = ["EntryPoints", "build_entry_points", "build_entry_cells"]

# GPU seed selection in one kernel (``select_seeds_gpu``); False falls back to the CuPy chain
# (GEMM + argmin rounds), kept for the benchmark's before/after comparison.
_GPU_SEED_KERNEL = True
# CPU seed selection (``select_seeds_cpu``): from this many entries on, they are grouped into about
# sqrt(c) cells and a query visits the cells nearest to it first; below it, every entry (one cell).
# Scanning all ~1,300 entries of 100k x 64 tight clusters cost 5x the graph walk at beam 10
# (NOTES_search.md, "CPU seeds").
_CPU_CELLS_MIN = 256
#: Up to this many entry points the CPU's seeds are exact: the cells only order the scan, and a
#: cell whose triangle-inequality bound cannot beat the s-th nearest entry seen is skipped (where the
#: cells are loose, as in high dimension, every entry is scanned). A count of entries, not of their
#: coordinates: the scan and the walk both grow with d, so their ratio is the entries' against the
#: walk's distances. The approximate rule (from _CPU_PROBES cells on while the next centre is nearer
#: than the nearest entry seen) missed nearest entries and capped the walk. Recall at beam 64 / 128,
#: approximate -> exact, QPS within 0-15 %: SIFT-like uint8 100k (316 entries) 0.993 / 0.996 ->
#: 1.000 / 1.000, 300k (548 entries) 0.995 / 0.998 -> 0.998 / 1.000; Zipf-sized clusters (606
#: entries, 32-d) 0.975 / 0.986 -> 0.987 / 0.992. Past it the exact scan cost the walk's time
#: several times over without a recall change (tight clusters, 64-d: 1,289 entries 2x, 10,281
#: entries 8x the QPS at beam 10): NOTES_search.md, "Exact CPU seeds".
_CPU_EXACT_SEEDS_MAX = 1024
_CPU_PROBES = 2


class EntryPoints:
    """Centroids of a coarse k-means and, for each, the id of its nearest data point.

    Parameters
    ----------
    centroids : array, float32 (c, d)
    medoids : array, int32 (c,)
    metric : {"l2", "ip"}

    Examples
    --------
    >>> import numpy as np
    >>> ep = EntryPoints(np.array([[0, 0], [5, 5]], np.float32), np.array([3, 7], np.int32), "l2")
    >>> ep.seeds_for(np.array([[4, 4]], np.float32), 1).tolist()
    [[7]]
    """

    def __init__(self, centroids, medoids, metric):
        self.centroids = centroids
        self.medoids = medoids
        self.metric = metric
        self._dev = None  # (source centroids, C, M int32, |C|^2, shift) on the GPU, built on first GPU use
        self._cells = None  # (source centroids, cells, offsets, C, M, shift) on the CPU, built on first CPU use
        self._mu = None  # (source centroids, shift) of _shift, made once

    def _shift(self):
        """The centroids' mean (float32, host) where squared L2 keys need it subtracted, else None
        (computed once per set of centroids).

        The seed selection ranks centroids by ``|c|^2 - 2 q.c`` (a GEMM on the GPU) and the CPU's
        cells come from a k-means with the same expansion: on data whose common offset is large
        against its spread (4x the centroids' own spread or more) that cancels in float32, so
        queries and centroids are then centred first (squared L2 is translation invariant)."""
        if self._mu is None or self._mu[0] is not self.centroids:
            mu = None
            if self.metric == "l2" and self.centroids.shape[0] > 0:
                C64 = np.asarray(as_host(self.centroids), np.float64)
                m = C64.mean(axis=0)
                spread2 = float(((C64 - m) ** 2).sum(axis=1).mean())
                mu = m.astype(np.float32) if float(m @ m) > 16.0 * spread2 else None
            self._mu = (self.centroids, mu)
        return self._mu[1]

    def __len__(self):
        return int(self.medoids.shape[0])

    def to(self, xp):
        """A copy living in ``xp`` (numpy or cupy)."""
        if xp is np:
            conv = lambda a: a if isinstance(a, np.ndarray) else a.get()  # noqa: E731
        else:
            conv = xp.asarray
        return EntryPoints(conv(self.centroids), conv(self.medoids), self.metric)

    def seeds_for(self, queries, s, *, exact=False, gpu_method="auto"):
        """(nq, s) int32 medoid ids of the ``s`` nearest centroids of each query (-1 padded).

        ``gpu_method``: :func:`~._search_gpu.select_seeds_gpu`'s ``method`` on the GPU ("direct":
        no (nq, c) matrix of dot products in GPU memory).

        On the GPU every centroid is scanned. On the CPU the entries are grouped into cells
        (:func:`build_entry_cells`). Up to ``_CPU_EXACT_SEEDS_MAX`` entry points, or
        with ``exact=True``, a query skips only the cells whose bound shows they cannot hold one of
        its ``s`` nearest: the GPU's seeds (up to rounding ties). Past it a query scans the cells
        nearest to it only (approximate, sub-linear in the number of entries).
        """
        xp = get_array_module(queries)
        if xp is not np and _GPU_SEED_KERNEL and self.centroids.shape[0] > 0:
            return self._seeds_gpu(queries, s, gpu_method)
        if xp is np:
            from ._search_cpu import select_seeds_cpu

            cells, offs, C, M, mu, radii = self._cpu_cells()
            q = queries if mu is None else np.asarray(queries, np.float32) - mu
            if exact or C.shape[0] <= _CPU_EXACT_SEEDS_MAX:
                return select_seeds_cpu(q, cells, offs, C, M, int(max(1, s)), self.metric, radii=radii)
            return select_seeds_cpu(q, cells, offs, C, M, int(max(1, s)), self.metric, probes=_CPU_PROBES)
        C = self.centroids if get_array_module(self.centroids) is xp else xp.asarray(self.centroids)
        M = self.medoids if get_array_module(self.medoids) is xp else xp.asarray(self.medoids)
        mu = self._shift()
        if mu is not None:
            C = C - xp.asarray(mu)
            queries = queries - xp.asarray(mu)
        nq = queries.shape[0]
        c = C.shape[0]
        s = int(max(1, s))
        out = xp.full((nq, s), -1, dtype=xp.int32)
        if c == 0:
            return out
        take = min(s, c)
        dots = queries @ C.T
        d = -dots if self.metric == "ip" else _sqnorms(xp, C)[None, :] - 2 * dots
        if xp is not np and take <= 16 and take < c:
            # a few argmin rounds: CuPy's argpartition sorts whole rows and cost more than the
            # graph search itself at 10k queries (NOTES_search.md)
            d = d.copy()
            rows = xp.arange(nq)
            for j in range(take):
                a = xp.argmin(d, axis=1)
                out[:, j] = M[a].astype(xp.int32)
                d[rows, a] = xp.inf
            return out
        if take < c:
            part = xp.argpartition(d, take - 1, axis=1)[:, :take]
        else:
            part = xp.broadcast_to(xp.arange(c), (nq, c))
        # nearest first, so a seed cap in the search keeps the best ones
        pd = xp.take_along_axis(d, part, axis=1)
        part = xp.take_along_axis(part, xp.argsort(pd, axis=1), axis=1)
        out[:, :take] = M[part].astype(xp.int32)
        return out

    def _cpu_cells(self):
        """``(cells, offsets, centroids, medoids, shift, radii)`` of :func:`build_entry_cells`
        (and :func:`._search_cpu.cell_radii`), cached."""
        if self._cells is None or self._cells[0] is not self.centroids:
            from ._search_cpu import cell_radii

            C = self.centroids if isinstance(self.centroids, np.ndarray) else self.centroids.get()
            M = self.medoids if isinstance(self.medoids, np.ndarray) else self.medoids.get()
            mu = self._shift()
            if mu is not None:
                C = np.ascontiguousarray(C - mu, dtype=np.float32)
            cells = build_entry_cells(C, M)
            self._cells = (self.centroids,) + cells + (mu, cell_radii(cells[0], cells[1], cells[2]))
        return self._cells[1:]

    def _seeds_gpu(self, queries, s, method="auto"):
        """seeds_for on the GPU: a cuBLAS GEMM and one selection kernel, no host sync."""
        import cupy as cp

        from ._search_gpu import select_seeds_gpu

        if self._dev is None or self._dev[0] is not self.centroids:
            C = cp.ascontiguousarray(cp.asarray(self.centroids), dtype=cp.float32)
            M = cp.ascontiguousarray(cp.asarray(self.medoids), dtype=cp.int32)
            mu = self._shift()
            if mu is not None:
                mu = cp.asarray(mu)
                C = cp.ascontiguousarray(C - mu)
            self._dev = (self.centroids, C, M, (C * C).sum(axis=1), mu)
        _, C, M, cn, mu = self._dev
        q = cp.ascontiguousarray(queries if mu is None else queries - mu, dtype=cp.float32)
        return select_seeds_gpu(q, C, M, int(max(1, s)), self.metric, cnorms=cn, method=method)


def build_entry_cells(centroids, medoids, *, min_entries=None, n_iter=8, random_state=0):
    """Group entry centroids into about ``sqrt(c)`` cells for the CPU's two-level seed selection.

    A small k-means (k-means|| seeding, ``n_iter`` Lloyd rounds, squared Euclidean) over the
    centroids themselves; every centroid goes to the cell of its nearest centre, empty cells are
    dropped.
    Fewer than ``min_entries`` centroids: one cell holding all of them (the exact scan).

    Parameters
    ----------
    centroids : ndarray, float32 (c, d)
    medoids : ndarray, int32 (c,)
    min_entries : int, optional
        Default ``_CPU_CELLS_MIN``.
    n_iter : int
    random_state : int

    Returns
    -------
    cells : ndarray, float32 (m, d)
    offsets : ndarray, int64 (m + 1,)
        Cell ``j`` holds rows ``offsets[j] .. offsets[j + 1] - 1`` of the two arrays below.
    centroids : ndarray, float32 (c, d)
        Ordered by cell.
    medoids : ndarray, int32 (c,)
        Same order.

    Examples
    --------
    >>> import numpy as np
    >>> C = np.random.default_rng(0).standard_normal((400, 8)).astype(np.float32)
    >>> cells, offs, C2, M2 = build_entry_cells(C, np.arange(400, dtype=np.int32))
    >>> cells.shape[0] <= 20, int(offs[-1]), sorted(M2.tolist()) == list(range(400))
    (True, 400, True)
    """
    C = np.ascontiguousarray(centroids, dtype=np.float32)
    M = np.ascontiguousarray(medoids, dtype=np.int32)
    c = C.shape[0]
    if C.ndim != 2 or M.shape != (c,):
        raise ValueError(f"centroids (c, d) and medoids (c,) must agree, got {C.shape} and {M.shape}")
    min_entries = _CPU_CELLS_MIN if min_entries is None else int(min_entries)
    m = int(np.ceil(np.sqrt(c))) if c >= max(2, min_entries) else 1
    if m <= 1:
        return (C.mean(axis=0, keepdims=True) if c else np.zeros((0, C.shape[1]), np.float32),
                np.array([0, c], np.int64), C, M)
    rng = np.random.default_rng(random_state)
    K = _seed_centroids(np, C, m, rng)
    for _ in range(n_iter):
        lab = _nearest_centroid(np, C, K, "l2")
        cnt = np.bincount(lab, minlength=K.shape[0])
        keep = cnt > 0
        # member sums by a segmented reduction over the rows sorted by cell (np.add.at is slow)
        order = np.argsort(lab, kind="stable")
        starts = np.concatenate([[0], np.cumsum(cnt)[:-1]])[keep]
        sums = np.add.reduceat(C[order].astype(np.float64), starts, axis=0)
        K = (sums / cnt[keep, None]).astype(np.float32)
    # every entry in the cell of its nearest centre (the centres of the last round): a query near
    # an entry then finds it in its own nearest cell
    lab = _nearest_centroid(np, C, K, "l2")
    keep = np.bincount(lab, minlength=K.shape[0]) > 0
    K = K[keep]
    lab = np.cumsum(keep)[lab] - 1
    order = np.argsort(lab, kind="stable")
    offsets = np.zeros(K.shape[0] + 1, np.int64)
    offsets[1:] = np.cumsum(np.bincount(lab, minlength=K.shape[0]))
    return K, offsets, np.ascontiguousarray(C[order]), np.ascontiguousarray(M[order])


def _seed_centroids(xp, S, c, rng, rounds=8):
    """k-means|| seeding (D^2 sampling in a few batched rounds).

    Uniform random centroids leave about e^-1 of equally weighted, well-separated clusters without
    a centroid when c is near their number, and Lloyd iterations cannot move a centroid across
    empty space: queries of such a cluster then start in another one and may never reach theirs
    (10M x 96, 1000 separated clusters: recall stalled at 0.81 for any beam). D^2 sampling puts
    centroids where the current ones are far, so every separated cluster gets one.
    """
    m = S.shape[0]
    if c <= 2 * rounds or c >= m:
        return S[xp.asarray(rng.choice(m, min(c, m), replace=False))].astype(xp.float32).copy()
    first = rng.choice(m, c // rounds, replace=False)
    chosen = [xp.asarray(first)]
    C = S[chosen[0]]
    sn = _sqnorms(xp, S)
    for r in range(1, rounds):
        dmin = xp.full(m, xp.inf, dtype=xp.float32)
        for a in range(0, m, 65536):  # bound the (block, c) distance matrix
            blk = S[a:a + 65536]
            d = sn[a:a + 65536, None] - 2 * (blk @ C.T) + _sqnorms(xp, C)[None, :]
            dmin[a:a + 65536] = xp.maximum(d.min(axis=1), 0)
        w = dmin.astype(xp.float64)
        tot = float(w.sum())
        want = c // rounds if r < rounds - 1 else c - sum(int(x.shape[0]) for x in chosen)
        if tot <= 0:
            break
        p = (w / tot)
        p = p.get() if xp is not np else p
        pick = rng.choice(m, want, replace=True, p=p / p.sum())
        chosen.append(xp.asarray(pick))
        C = S[xp.unique(xp.concatenate(chosen))]
    return C.astype(xp.float32).copy()


def build_entry_points(X, n_entry, metric, *, n_iter=8, sample=None, random_state=None):
    """Coarse k-means on a sample of X (numpy or cupy), then the medoid of each centroid.

    Parameters
    ----------
    X : array, float32 (n, d)
        Prepared vectors.
    n_entry : int
        Number of centroids (clipped to n).
    metric : {"l2", "ip"}
    n_iter : int
        Lloyd iterations (few: the centroids only need to cover the data).
    sample : int, optional
        Points used for the k-means (default ``min(n, 64 * n_entry)``).
    random_state : int or None

    Returns
    -------
    EntryPoints
    """
    xp = get_array_module(X)
    n = X.shape[0]
    c = int(max(1, min(n_entry, n)))
    rng = np.random.default_rng(random_state)
    m = int(min(n, sample or 64 * c))
    samp = np.sort(rng.choice(n, m, replace=False)) if m < n else np.arange(n)
    S = X[xp.asarray(samp)]
    mu = None
    if metric == "l2":
        # the k-means keys |s|^2 - 2 s.c + |c|^2 cancel in float32 on data far from the origin
        # against its spread: centred, they do not (squared L2 is translation invariant)
        mu = S.astype(xp.float64).mean(axis=0).astype(xp.float32)
        S = S - mu
    C = _seed_centroids(xp, S, c, rng)
    c = C.shape[0]
    C = lloyd(xp, S, C, n_iter, metric)
    # medoid: the sample point nearest (in l2) to each centroid -- a data point inside the
    # cluster; the sample keeps this O(64 c^2 d) instead of O(n c d)
    lab = _nearest_centroid(xp, S, C, "l2")
    d = _sqnorms(xp, S) - 2 * (S * C[lab]).sum(axis=1)
    order = xp.lexsort(xp.stack([d, lab.astype(d.dtype)]))
    lab_sorted = lab[order]
    first = xp.ones(m, dtype=bool)
    first[1:] = lab_sorted[1:] != lab_sorted[:-1]
    keep_lab = lab_sorted[first]
    med = xp.asarray(samp)[order[first]].astype(xp.int32)
    C = C[keep_lab] if mu is None else C[keep_lab] + mu
    return EntryPoints(C.astype(xp.float32), med, metric)
