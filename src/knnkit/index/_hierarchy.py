"""Hierarchical entry structure of the graph search (GGNN, Groh et al., sections 4-5).

An alternative to the k-means entry points of :mod:`._entry`: a stack of layers over nested random
subsets of the data, sizes ``n / ratio``, ``n / ratio^2``, ... down to at most ``top_size`` points.
Every layer below the top holds a small search graph of its own subset (exact k-NN of the subset,
RobustPrune or GGNN diversification, reverse links), in the layer's local ids. A batch of queries
descends: the top layer is searched exhaustively (it is small), its nearest points start a beam
search of the layer below, and so on; the bottom layer's results, mapped to ids of the full data,
are the seeds of the search in the full graph. One search launch per layer, as in GGNN.

Compared with the k-means entries, the doors are spread as the data is (a random sample, so dense
regions get more) instead of one per centroid, and a query's seeds are its approximately nearest
sample points rather than the medoids of its nearest centroids.

Layout: layer ``j`` (0 = bottom, ``L - 1`` = top) has ``ids[j]`` (sorted int32 ids in the full
data) and ``down[j]`` (int32 positions of its points in layer ``j - 1``; for ``j = 0`` the ids
themselves), so a layer's search results map to the layer below by one gather. Layers are nested
(``ids[j]`` is a subset of ``ids[j - 1]``), as in HNSW and GGNN.

The code is array-module agnostic: numpy on the CPU (searches by :func:`._search_cpu.search_cpu`),
cupy on the GPU (:func:`._search_gpu.search_gpu`, top layer by the seed-selection kernel).
"""

import math
import time

import numpy as np

from .._core.backend import as_host, get_array_module
from .._core.config import logger
from ._entry import EntryPoints

__all__ = ["HierarchicalEntry", "build_hierarchy"]


def _layer_sizes(n, ratio, top_size, min_top):
    """Sizes of the nested layers, bottom first: ``ceil(n / ratio)``, then divided by ``ratio``
    until a layer holds at most ``top_size`` points. The bottom layer keeps at least ``min_top``
    points (or n) so that small data still gets a few dozen spread-out seeds."""
    m = min(n, max(int(math.ceil(n / ratio)), min_top))
    sizes = [m]
    while m > top_size:
        m = max(int(math.ceil(m / ratio)), 1)
        if m < min_top and sizes[-1] <= 4 * top_size:
            # a top layer of a few points would be a worse start than searching the layer below
            # exhaustively: stop at the current one (at most 4 top_size points, still cheap)
            break
        sizes.append(m)
    return sizes


def _layer_graph(Xs, R, K, metric, alpha, diversify, build_algo, random_state):
    """Search graph (int32 (m, R), -1 padded, same module as ``Xs``) of one layer's vectors."""
    from ._build import build_graph_gpu, candidate_graph
    from ._build import diversify as _diversify

    xp = get_array_module(Xs)
    m = Xs.shape[0]
    if m < 2:
        return xp.full((m, R), -1, dtype=xp.int32)
    Rm = min(R, m - 1)
    Km = min(max(K, Rm), m - 1)
    # exact k-NN while the subset is small (GGNN builds each layer exactly too); NN-Descent above
    algo = build_algo if build_algo != "auto" else ("brute" if m <= 32768 else "nndescent")
    if xp is not np and diversify == "prune":
        g, _ = build_graph_gpu(Xs, Rm, Km, metric, alpha=alpha, build_algo=algo, random_state=random_state)
    else:
        cand, cand_d = candidate_graph(Xs, Km, metric, build_algo=algo, device="cpu" if xp is np else "gpu",
                                       random_state=random_state)
        g = _diversify(Xs, cand, Rm, metric, alpha=alpha, method=diversify, device="cpu", cand_dist=cand_d)
        g = xp.asarray(g, dtype=xp.int32)
    if Rm < R:
        g = xp.concatenate([g, xp.full((m, R - Rm), -1, xp.int32)], axis=1)
    return xp.ascontiguousarray(g, dtype=xp.int32)


class HierarchicalEntry:
    """GGNN-style layer hierarchy answering ``seeds_for`` (same interface as :class:`EntryPoints`).

    Parameters
    ----------
    ids : list of int32 arrays
        Sorted ids (in the full data) of each layer's points, bottom layer first; nested.
    graphs : list of int32 arrays
        Search graph of every layer but the top, shape (len(ids[j]), R), local ids, -1 padded.
    vectors : list of float32 arrays
        Prepared vectors of each layer's points (``X[ids[j]]``).
    metric : {"l2", "ip"}
        Internal metric.
    layer_beam : int
        Beam of each layer's search.
    layer_k : int
        Results carried from a layer to the one below (also the top layer's exhaustive pick).
    xnorm_max : float
        ``max |x|`` over the data (the search's ``'ip'`` scale; unused while tau is off).

    Attributes
    ----------
    medoids : int32 array
        Ids of the bottom layer's points (the doors into the full graph; for reachability repair).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).random((2000, 8), dtype=np.float32)
    >>> h = build_hierarchy(X, "l2", ratio=4, top_size=64, random_state=0)
    >>> [len(i) for i in h.ids]
    [500, 125]
    >>> s = h.seeds_for(X[:3], 4)
    >>> s.shape, bool(np.isin(s, h.medoids).all())
    ((3, 4), True)
    """

    def __init__(self, ids, graphs, vectors, metric, *, layer_beam=32, layer_k=8, xnorm_max=0.0):
        if len(ids) < 1 or len(graphs) != len(ids) - 1 or len(vectors) != len(ids):
            raise ValueError("HierarchicalEntry: need L layers of ids and vectors and L - 1 graphs")
        self.ids = list(ids)
        self.graphs = list(graphs)
        self.vectors = list(vectors)
        self.metric = metric
        self.layer_beam = int(layer_beam)
        self.layer_k = int(layer_k)
        self.xnorm_max = float(xnorm_max)
        xp = get_array_module(self.ids[0])
        # positions of each layer's points in the layer below (sorted ids: one searchsorted)
        self.down = [self.ids[0].astype(xp.int32)]
        for j in range(1, len(self.ids)):
            self.down.append(xp.searchsorted(self.ids[j - 1], self.ids[j]).astype(xp.int32))
        # the top layer is searched exhaustively: an EntryPoints whose "centroids" are the top
        # points and whose "medoids" are their positions in the layer below reuses the GEMM +
        # selection code (and the GPU seed-selection kernel) unchanged
        self._top = EntryPoints(self.vectors[-1], self.down[-1], metric)

    # ------------------------------------------------------------------ interface of EntryPoints
    @property
    def medoids(self):
        return self.ids[0]

    @property
    def n_layers(self):
        return len(self.ids)

    @property
    def sizes(self):
        return [int(i.shape[0]) for i in self.ids]

    def __len__(self):
        return int(self.ids[0].shape[0])

    def to(self, xp):
        """A copy living in ``xp`` (numpy or cupy)."""
        conv = (lambda a: np.asarray(as_host(a))) if xp is np else xp.asarray  # noqa: E731
        return HierarchicalEntry([conv(a) for a in self.ids], [conv(a) for a in self.graphs],
                                 [conv(a) for a in self.vectors], self.metric, layer_beam=self.layer_beam,
                                 layer_k=self.layer_k, xnorm_max=self.xnorm_max)

    def seeds_for(self, queries, s, *, beam=None):
        """(nq, s) int32 seed ids in the full data, nearest first, -1 padded.

        The top layer's ``layer_k`` nearest points (exhaustive) start a beam search of the layer
        below, whose ``layer_k`` best start the next, ...; the bottom layer returns its ``s`` best.

        Parameters
        ----------
        queries : array, float32 (nq, d)
            Prepared queries (numpy or cupy; a structure in the other module is converted once).
        s : int
            Seeds per query.
        beam : int, optional
            Beam of the layer searches (default ``layer_beam``; the bottom one at least ``s``).
        """
        xp = get_array_module(queries)
        h = self if get_array_module(self.ids[0]) is xp else self._in(xp)
        return h._descend(queries, int(max(1, s)), int(beam or self.layer_beam))

    # ------------------------------------------------------------------ internals
    def _in(self, xp):
        """Cached copy in ``xp`` (a CPU structure searched with GPU queries or the reverse)."""
        cache = self.__dict__.setdefault("_copies", {})
        if xp not in cache:
            cache[xp] = self.to(xp)
        return cache[xp]

    def _search_layer(self, j, queries, k, seeds, beam):
        xp = get_array_module(queries)
        kw = dict(seeds=seeds, beam=max(beam, k), tau=None, max_iters=8 * max(beam, k), metric=self.metric,
                  xnorm_max=self.xnorm_max)
        if xp is np:
            from ._search_cpu import search_cpu

            _, idx = search_cpu(self.vectors[j], self.graphs[j], queries, k, **kw)
        else:
            from ._search_gpu import search_gpu

            _, idx = search_gpu(self.vectors[j], self.graphs[j], queries, k, **kw)
        return idx

    def _map_down(self, j, local):
        """Local ids of layer ``j`` (-1 = none) -> positions in layer ``j - 1`` (ids for j = 0)."""
        xp = get_array_module(local)
        ok = local >= 0
        return xp.where(ok, self.down[j][xp.where(ok, local, 0)], -1).astype(xp.int32)

    def _descend(self, queries, s, beam):
        xp = get_array_module(queries)
        L = len(self.ids)
        nq = queries.shape[0]
        top_k = s if L == 1 else self.layer_k
        # positions in layer L-2 (global ids when the top is the only layer); -1 padded
        seeds = self._top.seeds_for(queries, top_k, exact=True)  # the top layer is scanned whole
        for j in range(L - 2, -1, -1):
            m = int(self.ids[j].shape[0])
            k = min(s if j == 0 else self.layer_k, m)
            local = self._search_layer(j, queries, k, seeds, beam)
            seeds = self._map_down(j, local)
        if seeds.shape[1] == s:
            return xp.ascontiguousarray(seeds, dtype=xp.int32)
        out = xp.full((nq, s), -1, dtype=xp.int32)
        w = min(s, seeds.shape[1])
        out[:, :w] = seeds[:, :w]
        return out

    # ------------------------------------------------------------------ persistence
    def to_arrays(self, *, vectors=False):
        """Named host arrays for the index container.

        ``hier_sizes`` int64 (L,), ``hier_ids`` int32 (sum of sizes,), ``hier_graph`` int32
        (sum of sizes but the top's, R), ``hier_params`` float64 ``[layer_beam, layer_k,
        xnorm_max]``; with ``vectors=True`` also ``hier_vectors`` float32 (else they are gathered
        from the data at load).
        """
        R = int(self.graphs[0].shape[1]) if self.graphs else 0
        out = {
            "hier_sizes": np.asarray(self.sizes, np.int64),
            "hier_ids": np.concatenate([np.asarray(as_host(a), np.int32) for a in self.ids]),
            "hier_graph": (np.concatenate([np.asarray(as_host(g), np.int32) for g in self.graphs])
                           if self.graphs else np.zeros((0, R), np.int32)),
            "hier_params": np.asarray([self.layer_beam, self.layer_k, self.xnorm_max], np.float64),
        }
        if vectors:
            out["hier_vectors"] = np.concatenate([np.asarray(as_host(v), np.float32) for v in self.vectors])
        return out

    @classmethod
    def from_arrays(cls, arrays, metric, X=None):
        """Inverse of :meth:`to_arrays`; ``X`` (the prepared data, numpy or cupy) supplies the layer
        vectors when the arrays do not hold them. The result lives where ``X`` does (host if None)."""
        xp = np if X is None else get_array_module(X)
        sizes = [int(v) for v in np.asarray(arrays["hier_sizes"])]
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        ids_h = np.asarray(arrays["hier_ids"], np.int32)
        gr_h = np.asarray(arrays["hier_graph"], np.int32)
        ids = [xp.asarray(ids_h[bounds[j]:bounds[j + 1]]) for j in range(len(sizes))]
        graphs = [xp.asarray(gr_h[bounds[j]:bounds[j + 1]]) for j in range(len(sizes) - 1)]
        if "hier_vectors" in arrays:
            V = np.asarray(arrays["hier_vectors"], np.float32)
            vectors = [xp.asarray(V[bounds[j]:bounds[j + 1]]) for j in range(len(sizes))]
        elif X is not None:
            vectors = [xp.ascontiguousarray(X[i]) for i in ids]
        else:
            raise ValueError("HierarchicalEntry.from_arrays: no 'hier_vectors' and no X to gather them from")
        beam, k, xmax = (float(v) for v in np.asarray(arrays["hier_params"]))
        return cls(ids, graphs, vectors, metric, layer_beam=int(beam), layer_k=int(k), xnorm_max=xmax)


def build_hierarchy(X, metric, *, ratio=16, top_size=512, min_top=64, degree=24, candidates=None, alpha=1.2,
                    diversify="prune", build_algo="auto", layer_beam=32, layer_k=8, random_state=None,
                    timings=None):
    """Build a :class:`HierarchicalEntry` over prepared data ``X`` (numpy or cupy).

    Parameters
    ----------
    X : array, float32 (n, d)
        Prepared vectors (unit rows for cosine), where the structure is to live.
    metric : {"l2", "ip"}
        Internal metric.
    ratio : int
        Size ratio of consecutive layers (GGNN's growth factor; the bottom layer has ``n / ratio``
        points). Larger: fewer, sparser layers (cheaper build, fewer doors).
    top_size : int
        The top layer has at most this many points and is searched exhaustively.
    min_top : int
        Lower bound of the bottom layer's size (small data).
    degree : int
        Out-degree of the layer graphs.
    candidates : int, optional
        k-NN list length before diversification (default ``2 * degree``).
    alpha : float
        RobustPrune slack (``diversify="prune"``).
    diversify : {"prune", "ggnn"}
        RobustPrune + reverse edges, or GGNN's nearest half + symmetric links.
    build_algo : {"auto", "brute", "nndescent"}
        k-NN of a layer: ``"auto"`` exact up to 32768 points, NN-Descent above.
    layer_beam, layer_k : int
        Search defaults (see :class:`HierarchicalEntry`).
    random_state : int or None
        Seed of the random subsets (and of NN-Descent).
    timings : dict, optional
        Receives ``hierarchy_s`` (seconds, synchronised on the GPU).

    Returns
    -------
    HierarchicalEntry
    """
    t0 = time.perf_counter()
    xp = get_array_module(X)
    n = int(X.shape[0])
    ratio = int(ratio)
    if ratio < 2:
        raise ValueError(f"ratio must be >= 2, got {ratio}")
    sizes = _layer_sizes(n, ratio, int(top_size), int(min_top))
    rng = np.random.default_rng(random_state)
    ids_h = []
    prev = np.arange(n)
    for m in sizes:
        prev = np.sort(rng.choice(prev, m, replace=False))
        ids_h.append(prev.astype(np.int32))
    ids = [xp.asarray(a) for a in ids_h]
    vectors = [xp.ascontiguousarray(X[i], dtype=xp.float32) for i in ids]
    K = int(candidates or 2 * degree)
    graphs = [_layer_graph(vectors[j], int(degree), K, metric, alpha, diversify, build_algo, random_state)
              for j in range(len(sizes) - 1)]
    if metric == "ip":
        xmax = float(xp.sqrt((X * X).sum(axis=1).max()))
    else:
        xmax = 0.0
    h = HierarchicalEntry(ids, graphs, vectors, metric, layer_beam=layer_beam, layer_k=layer_k, xnorm_max=xmax)
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()
    dt = time.perf_counter() - t0
    if timings is not None:
        timings["hierarchy_s"] = dt
    logger.info("hierarchy: layers %s (bottom first), degree %d, %.3f s", sizes, degree, dt)
    return h
