"""``GraphIndex``: approximate nearest-neighbour search on a fixed out-degree proximity graph.

Build: k-NN graph (NN-Descent or exact) -> diversification (RobustPrune + reverse edges, or GGNN
symmetric links) -> k-means entry points. Search: best-first beam search with the GGNN slack
stop, one query per GPU thread block (``_search_gpu``) or per CPU thread (``_search_cpu``).
"""

import contextlib
import functools
import numbers

import numpy as np

from .._core.config import logger
from .._core.backend import (as_host, cupy_or_none, get_array_module, resolve_device,
                        wrap_output)
from .._core.metrics import finalize_distances, internal_metric, prepare_vectors
from .._core.validation import check_k, check_matrix, check_metric, check_pair
from ..graph._build import default_update
from ._auto import auto_build_params, estimate_intrinsic_dim
from ._build import candidate_graph, diversify, exact_knn_cpu, nn1_max
from ._entry import EntryPoints, build_entry_points
from ._format import read_index_file, write_index_file, VERSION
from ._prune_cpu import add_reverse_edges, prune_cpu
from ._search_cpu import search_cpu

__all__ = ["GraphIndex"]

MAX_K = 1024
_SEARCH_KEYS = ("beam", "tau", "max_iters", "n_seeds")


@functools.lru_cache(maxsize=1)
def _blas_controller():
    try:
        from threadpoolctl import ThreadpoolController

        return ThreadpoolController()
    except Exception:  # optional dependency
        return None


def _blas_single_thread():
    """Run the small seed matmul on one BLAS thread: woken OpenBLAS workers keep spinning after
    the call and halve the speed of the Numba search threads that follow (measured 53 -> 32 ms
    for 1000 queries on 2 cores)."""
    c = _blas_controller()
    return c.limit(limits=1, user_api="blas") if c is not None else contextlib.nullcontext()


def _default_n_entry(n):
    # sqrt(n), up to 4096: enough centroids to cover a few thousand separated clusters
    return int(max(1, min(4096, round(np.sqrt(n)))))


def _default_intermediate_degree(R):
    return 2 * R if R < 64 else max(R + 32, (3 * R) // 2)


def _resolve_auto_params(X, bp, random_state):
    """Fill ``graph_degree``, ``intermediate_degree`` and ``alpha`` left as None (in place) from
    the estimated intrinsic dimension of ``X`` (see ``_auto.py``)."""
    if bp["graph_degree"] is not None and bp["alpha"] is not None:
        if bp["intermediate_degree"] is None:
            bp["intermediate_degree"] = _default_intermediate_degree(bp["graph_degree"])
        return
    lid = estimate_intrinsic_dim(X, random_state=random_state)
    R, K, alpha = auto_build_params(lid)
    bp["intrinsic_dim"] = round(lid, 2) if np.isfinite(lid) else None
    if bp["graph_degree"] is None:
        bp["graph_degree"] = R
        if bp["intermediate_degree"] is None:
            bp["intermediate_degree"] = K
    elif bp["intermediate_degree"] is None:
        bp["intermediate_degree"] = _default_intermediate_degree(bp["graph_degree"])
    bp["intermediate_degree"] = max(bp["intermediate_degree"], bp["graph_degree"])
    if bp["alpha"] is None:
        bp["alpha"] = alpha
    logger.info("GraphIndex: estimated intrinsic dimension %.1f -> graph_degree=%d, intermediate_degree=%d, "
                "alpha=%.2f", lid, bp["graph_degree"], bp["intermediate_degree"], bp["alpha"])


def _check_positive_int(v, name, minimum=1):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or int(v) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return int(v)


class GraphIndex:
    """Graph-based approximate nearest-neighbour index (GPU or CPU).

    Create one with :meth:`GraphIndex.build` or :meth:`GraphIndex.load`.

    Attributes
    ----------
    metric : str
        User metric: "sqeuclidean", "euclidean", "inner_product" or "cosine".
    n, dim : int
        Number of indexed points and their dimension.
    dtype : numpy.dtype
        Storage dtype of the vectors (float32, float16, uint8 or int8); distances are float32.
    graph_degree : int
        Out-degree R of the search graph.
    device : str
        "cpu" or "gpu": where the vectors and the graph live.
    search_params : dict
        Default ``beam``, ``tau``, ``max_iters`` and ``n_seeds`` of :meth:`search`.

    Examples
    --------
    >>> import numpy as np, knnkit
    >>> rng = np.random.default_rng(0)
    >>> data = rng.standard_normal((2000, 16)).astype(np.float32)
    >>> index = knnkit.GraphIndex.build(data, graph_degree=16, device="cpu", random_state=0)
    >>> dist, idx = index.search(data[:5], k=3)
    >>> idx[:, 0].tolist()
    [0, 1, 2, 3, 4]
    """

    def __init__(self, data, graph, entry, *, metric, build_params, search_params, device="cpu",
                 nn1_max=None):
        self.metric = metric
        self._imetric = internal_metric(metric)
        self._data = data
        self._graph = graph
        self._entry = entry
        self.build_params = dict(build_params)
        self.search_params = dict(search_params)
        self.device = device
        self._X = prepare_vectors(data, metric)
        self._host = None  # host copies when a GPU index is searched on the CPU
        self._xnorm_max = None
        self._gpu = None  # device copies when a CPU index is searched on the GPU
        self._x16_cache = None  # (prepared vectors, their float16 copy or None) for fp16 traversal
        self.nn1_max = float("inf") if nn1_max is None else float(nn1_max)

    # ------------------------------------------------------------------ properties
    @property
    def n(self):
        return int(self._data.shape[0])

    @property
    def dim(self):
        return int(self._data.shape[1])

    @property
    def dtype(self):
        return np.dtype(self._data.dtype)

    @property
    def graph_degree(self):
        return int(self._graph.shape[1])

    @property
    def graph(self):
        """The search graph, int32 (n, R), ``-1`` in unused slots (a host numpy copy)."""
        return np.array(as_host(self._graph), copy=True)

    @property
    def data(self):
        """The indexed vectors in their storage dtype (numpy or cupy, where the index lives)."""
        return self._data

    @property
    def entry_points(self):
        """Medoid ids of the coarse k-means centroids used as search seeds (host int32)."""
        return np.array(as_host(self._entry.medoids), copy=True)

    def __len__(self):
        return self.n

    def __repr__(self):
        bp = ", ".join(f"{k}={self.build_params[k]!r}" for k in
                       ("intermediate_degree", "alpha", "build_algo", "diversify", "n_entry")
                       if k in self.build_params)
        sp = ", ".join(f"{k}={self.search_params.get(k)!r}" for k in _SEARCH_KEYS)
        return (f"GraphIndex(n={self.n}, dim={self.dim}, metric={self.metric!r}, dtype={self.dtype.name}, "
                f"graph_degree={self.graph_degree}, device={self.device!r}, {bp}, search=({sp}))")

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, data, *, metric="sqeuclidean", graph_degree=None, intermediate_degree=None, alpha=None,
              build_algo="nndescent", diversify="prune", n_entry=None, device="auto", random_state=None,
              beam=64, tau=None, max_iters=None, n_seeds=4):
        """Build a graph search index over ``data``.

        Parameters
        ----------
        data : array-like (n, d)
            float32, float16, uint8 or int8 vectors (float64 is converted to float32); numpy,
            cupy or torch. Stored in its dtype, distances computed in float32.
        metric : {"sqeuclidean", "euclidean", "inner_product", "cosine"}
        graph_degree : int, optional
            Out-degree R of the search graph. Default: chosen from the data's estimated local
            intrinsic dimension (LID, Levina-Bickel MLE on 500 sampled points, see
            ``index/_auto.py``): 32 below LID 28 (SIFT, Fashion-MNIST, most embeddings),
            48 up to 40, 64 above (noise-dominated neighbourhoods need more edges).
        intermediate_degree : int, optional
            Degree of the k-NN graph that is diversified (default: 64 for R = 32, 96 for
            R = 48 or 64, otherwise ``2R`` below 64 and ``1.5R`` from 64 on).
        alpha : float, optional
            RobustPrune slack (>= 1): larger keeps more long edges. Default 1.1 below LID 28 and
            1.0 above (1.0 gave +0.03-0.05 recall at equal beam on LID ~45 data; 1.1 is
            marginally better on low-LID data).
        build_algo : {"nndescent", "brute"}
            How the k-NN graph is built (NN-Descent, or exact; small inputs are always exact).
        diversify : {"prune", "ggnn"}
            ``"prune"`` (default): RobustPrune plus reverse edges, pruned on the GPU when the index
            is built there; ``"ggnn"``: GGNN's R/2 nearest plus up to R/2 symmetric links (CPU).
            Measured on clustered 100k x 128, SIFT10K and Fashion-MNIST: equal recall for the same
            number of distance evaluations within noise, so the default is the one with a GPU kernel.
        n_entry : int, optional
            Number of k-means entry points (default ``sqrt(n)``, at most 4096).
        device : "auto", "cpu", "gpu" or int
            Where the index is built and lives.
        random_state : int or None
            Seed for the k-NN graph and the k-means (results repeatable).
        beam, tau, max_iters, n_seeds :
            Default search parameters stored in the index (see :meth:`search`).

        Returns
        -------
        GraphIndex

        Examples
        --------
        >>> import numpy as np, knnkit
        >>> data = np.random.default_rng(1).random((1000, 8), dtype=np.float32)
        >>> index = knnkit.GraphIndex.build(data, metric="cosine", graph_degree=8, device="cpu")
        >>> index.graph.shape
        (1000, 8)
        """
        metric = check_metric(metric)
        a, info = check_matrix(data, "data")
        n = a.shape[0]
        R = _check_positive_int(graph_degree, "graph_degree") if graph_degree is not None else None
        K = (_check_positive_int(intermediate_degree, "intermediate_degree")
             if intermediate_degree is not None else None)
        if R is not None and K is not None and K < R:
            raise ValueError(f"intermediate_degree ({K}) must be >= graph_degree ({R})")
        if alpha is not None and not alpha >= 1.0:
            raise ValueError(f"alpha must be >= 1, got {alpha}")
        if build_algo not in ("nndescent", "brute"):
            raise ValueError(f"build_algo must be 'nndescent' or 'brute', got {build_algo!r}")
        if diversify not in ("prune", "ggnn"):
            raise ValueError(f"diversify must be 'prune' or 'ggnn', got {diversify!r}")
        if n < 2:
            raise ValueError("a GraphIndex needs at least 2 data points")
        n_entry = _default_n_entry(n) if n_entry is None else _check_positive_int(n_entry, "n_entry")
        dev, dev_id = resolve_device(device, info)
        search_params = cls._check_search_params(dict(beam=beam, tau=tau, max_iters=max_iters,
                                                      n_seeds=n_seeds))
        build_params = dict(graph_degree=R, intermediate_degree=K,
                            alpha=None if alpha is None else float(alpha),
                            build_algo=build_algo, diversify=diversify, n_entry=int(n_entry),
                            random_state=(int(random_state) if isinstance(random_state, numbers.Integral)
                                          else None if random_state is None else repr(random_state)))
        if dev == "gpu":
            cp = cupy_or_none()
            with cp.cuda.Device(dev_id if dev_id is not None else cp.cuda.Device().id):
                return cls._build_on(cp.asarray(a), metric, build_params, search_params, "gpu", random_state)
        return cls._build_on(as_host(a), metric, build_params, search_params, "cpu", random_state)

    @classmethod
    def _build_on(cls, a, metric, bp, sp, dev, random_state):
        import time

        from ._build import build_graph_gpu

        xp = get_array_module(a)
        im = internal_metric(metric)
        t_start = time.perf_counter()
        X = prepare_vectors(a, metric)
        n = a.shape[0]
        _resolve_auto_params(X, bp, random_state)
        timings = {"prepare_auto": time.perf_counter() - t_start}
        R = min(bp["graph_degree"], n - 1)
        K = min(bp["intermediate_degree"], n - 1)
        algo = bp["build_algo"] if n > 4096 else "brute"
        logger.info("GraphIndex: %s candidate graph (n=%d, K=%d) on %s", algo, n, K, dev)
        t0 = time.perf_counter()
        if dev == "gpu" and bp["diversify"] == "prune":
            # all on the device: candidates with their distances, prune, reverse edges (_build.py)
            # NN-Descent runs on the internal metric ('ip' for cosine's unit rows), but its update
            # rule is the one of the user's metric (default_update: cosine has no hubs)
            g, nn1 = build_graph_gpu(X, R, K, im, alpha=bp["alpha"], build_algo=algo,
                                     random_state=random_state, timings=timings,
                                     knn_params={"update": default_update("gpu", metric)})
        else:
            cand, cand_dist = candidate_graph(X, K, im, build_algo=algo, device=dev, random_state=random_state,
                                              user_metric=metric)
            nn1 = nn1_max(np.ascontiguousarray(as_host(X)), cand_dist, im)
            logger.info("GraphIndex: diversify (%s) to R=%d", bp["diversify"], R)
            g = diversify(X, cand, R, im, alpha=bp["alpha"], method=bp["diversify"], device=dev,
                          cand_dist=cand_dist)
            g = xp.asarray(g) if xp is not np else g
            timings["graph"] = time.perf_counter() - t0
        if g.shape[1] < bp["graph_degree"]:  # tiny n: keep the requested width, -1 padded
            g = xp.concatenate([g, xp.full((n, bp["graph_degree"] - g.shape[1]), -1, xp.int32)], axis=1)
        t1 = time.perf_counter()
        entry = build_entry_points(X, bp["n_entry"], im, random_state=random_state)
        if dev == "gpu":
            xp.cuda.get_current_stream().synchronize()
        timings["entry_points"] = time.perf_counter() - t1
        logger.info("GraphIndex: build phases (s): %s", {k: round(v, 3) for k, v in timings.items()})
        index = cls(a, g, entry, metric=metric, build_params=bp, search_params=sp, device=dev,
                    nn1_max=nn1)
        index._build_timings = timings  # seconds per phase of this build (not saved with the index)
        return index

    # ------------------------------------------------------------------ search
    @staticmethod
    def _check_search_params(p):
        out = {}
        out["beam"] = _check_positive_int(p["beam"], "beam") if p.get("beam") is not None else None
        tau = p.get("tau")
        if tau is not None:
            tau = float(tau)
            if not tau >= 0:
                raise ValueError(f"tau must be >= 0 (or None for no slack stop), got {p['tau']!r}")
            if tau == float("inf"):
                tau = None
        out["tau"] = tau
        out["max_iters"] = (_check_positive_int(p["max_iters"], "max_iters")
                            if p.get("max_iters") is not None else None)
        out["n_seeds"] = _check_positive_int(p["n_seeds"], "n_seeds") if p.get("n_seeds") is not None else None
        return out

    def _resolved(self, k, beam, tau, max_iters, n_seeds):
        given = self._check_search_params(dict(beam=beam, tau=tau, max_iters=max_iters, n_seeds=n_seeds))
        p = {key: (given[key] if given[key] is not None else self.search_params.get(key)) for key in given}
        if tau is not None and given["tau"] is None:  # tau=inf given: slack stop off for this call
            p["tau"] = None
        beam = max(p["beam"] or 64, k)
        max_iters = p["max_iters"] or max(64, 8 * beam)
        # a long candidate list wants entries from several clusters: well separated clusters can
        # leave the k-NN graph disconnected, and only seeds reach the other components
        n_seeds = min(max(p["n_seeds"] or 4, beam // 16), max(1, len(self._entry)))
        return beam, (np.inf if p["tau"] is None else p["tau"]), max_iters, n_seeds

    def _host_arrays(self):
        if self.device == "cpu":
            return self._X, self._graph, self._entry
        if self._host is None:
            self._host = (as_host(self._X), as_host(self._graph), self._entry.to(np))
        return self._host

    def _xmax(self):
        if self._xnorm_max is None:
            X = self._X
            self._xnorm_max = float(np.sqrt(float((X * X).sum(axis=1).max())))
        return self._xnorm_max

    def search(self, queries, k=10, *, beam=None, tau=None, max_iters=None, n_seeds=None, device=None,
               batch_size=None, traversal="auto"):
        """Approximate k nearest neighbours of each query.

        Parameters
        ----------
        queries : array-like (nq, d)
            Same dimension as the data; any supported dtype (computed in float32).
        k : int
            Neighbours per query, ``1 <= k <= min(n, 1024)``.
        beam : int, optional
            Candidate-list size (raised to ``k`` when smaller). Larger: higher recall, slower.
        tau : float, optional
            GGNN slack: stop once the next candidate is farther than
            ``d_k + tau * min(d_1, d_nn1+)`` on a Euclidean scale (see ``_search_cpu``).
            ``inf`` disables it (plain beam search, the default unless the index stores a tau);
            None takes the index default. Useful values are small (0.02 - 0.2) with a long
            ``beam``. Smaller: faster.
        max_iters : int, optional
            Cap on node expansions per query (default ``max(64, 8 * beam)``).
        n_seeds : int, optional
            Entry points per query (medoids of its nearest k-means centroids); at least
            ``beam // 16`` are used.
        device : None, "cpu", "gpu" or int
            Where to search (default: where the index lives).
        batch_size : int, optional
            Queries per batch (bounds temporary memory).
        traversal : {"auto", "fp16", "fp32"}
            GPU only. ``"fp16"`` walks the graph on a cached float16 copy of the vectors (half the
            bytes per expansion) and re-ranks the final candidate list with exact float32
            distances (BANG section 4.9): returned distances are exact, the neighbour set can
            differ slightly from an fp32 walk. ``"auto"`` (default) uses fp16 when every
            vector component fits float16's range; ``"fp32"`` never does.

        Returns
        -------
        distances : float32 (nq, k)
            In the user metric, best first (inner_product: largest first). Slots beyond the
            reachable points hold ``inf`` (``-inf`` for inner_product).
        indices : int64 (nq, k)
            ``-1`` in those slots.

        Examples
        --------
        >>> import numpy as np, knnkit
        >>> data = np.random.default_rng(0).random((500, 4), dtype=np.float32)
        >>> index = knnkit.GraphIndex.build(data, graph_degree=8, device="cpu")
        >>> d, i = index.search(data[:2], k=1, beam=16)
        >>> i.ravel().tolist()
        [0, 1]
        """
        q, info = check_matrix(queries, "queries")
        check_pair(self._data, q)
        k = check_k(k, self.n, max_k=MAX_K)
        beam, tau, max_iters, n_seeds = self._resolved(k, beam, tau, max_iters, n_seeds)
        if device is None:
            dev = self.device
        else:
            dev, _ = resolve_device(device, info)
        nq = q.shape[0]
        if dev == "gpu":
            if traversal not in ("auto", "fp16", "fp32"):
                raise ValueError(f"traversal must be 'auto', 'fp16' or 'fp32', got {traversal!r}")
            d, i = self._search_gpu(q, k, beam, tau, max_iters, n_seeds, batch_size, traversal)
        else:
            X, graph, entry = self._host_arrays()
            qh = prepare_vectors(np.ascontiguousarray(as_host(q)), self.metric)
            bs = int(batch_size) if batch_size else max(1, nq)
            d = np.empty((nq, k), np.float32)
            i = np.empty((nq, k), np.int64)
            xmax = self._xmax() if self._imetric == "ip" else None
            for s in range(0, nq, bs):
                qb = qh[s:s + bs]
                with _blas_single_thread():
                    seeds = entry.seeds_for(qb, n_seeds)
                d[s:s + bs], i[s:s + bs] = search_cpu(X, graph, qb, k, seeds=seeds, beam=beam, tau=tau,
                                                      max_iters=max_iters, metric=self._imetric,
                                                      xnorm_max=xmax, nn1_max=self.nn1_max)
        d = finalize_distances(d, self.metric)
        return wrap_output(d, info), wrap_output(i, info)

    def _search_gpu(self, q, k, beam, tau, max_iters, n_seeds, batch_size, traversal="auto"):
        cp = cupy_or_none()
        if cp is None:
            raise RuntimeError("GPU search asked for but no CUDA GPU is usable")
        from ._search_gpu import search_gpu

        if self.device != "gpu":  # a CPU index searched on the GPU: move it once
            self._to_gpu_cache()
            X, graph, entry = self._gpu
            data = None
        else:
            X, graph, entry = self._X, self._graph, self._entry
            data = self._data
        # float16 storage: traversing the stored half vectors is lossless (they are exactly the
        # float32 values) and halves the bytes read; cosine data is renormalised, so not there
        X16 = data if (data is not None and self.dtype == np.float16 and self.metric != "cosine") else None
        if X16 is None and traversal != "fp32":
            X16 = self._fp16_copy(X, required=traversal == "fp16")
        qd = prepare_vectors(cp.asarray(q), self.metric)
        xmax = self._xmax() if self._imetric == "ip" else None
        nq = qd.shape[0]
        bs = int(batch_size) if batch_size else max(1, nq)
        parts = []
        for s in range(0, nq, bs):
            qb = qd[s:s + bs]
            seeds = entry.seeds_for(qb, n_seeds)
            parts.append(search_gpu(X, graph, qb, k, seeds=seeds, beam=beam, tau=tau, max_iters=max_iters,
                                    metric=self._imetric, X_fp16=X16, xnorm_max=xmax, nn1_max=self.nn1_max))
        if len(parts) == 1:  # one batch: no output copies (two launches saved on small batches)
            return parts[0]
        return cp.concatenate([p[0] for p in parts]), cp.concatenate([p[1] for p in parts])

    def _fp16_copy(self, X, required):
        """Cached float16 copy of the prepared vectors for fp16 traversal (None when it would overflow)."""
        cache = self._x16_cache
        if cache is not None and cache[0] is X:
            return cache[1]
        cp = cupy_or_none()
        if float(cp.abs(X).max()) >= 60000.0:
            if required:
                raise ValueError("traversal='fp16': vector components exceed the float16 range")
            self._x16_cache = (X, None)
            return None
        x16 = X.astype(cp.float16)
        self._x16_cache = (X, x16)
        return x16

    def _to_gpu_cache(self):
        if self._gpu is None:
            cp = cupy_or_none()
            self._gpu = (cp.asarray(self._X), cp.asarray(self._graph), self._entry.to(cp))

    # ------------------------------------------------------------------ extend
    def extend(self, new_data, *, batch_size=None, beam=None):
        """Insert new points (ids ``n, n+1, ...``); the index stays searchable with high recall.

        Each batch of new points searches its neighbours in the current index, adds exact
        neighbours among the batch itself, prunes the candidates with RobustPrune and adds the
        reverse edges (re-pruning lists that overflow). Entry points are recomputed. The update
        runs on the CPU (a GPU index is copied back to the GPU afterwards).

        Parameters
        ----------
        new_data : array-like (m, d)
            Same dimension as the index; converted to the index's storage dtype.
        batch_size : int, optional
            Points inserted per batch (default ``max(1024, n // 2)``).
        beam : int, optional
            Candidate-list size of the neighbour search (default ``2 * intermediate_degree``).

        Returns
        -------
        self

        Examples
        --------
        >>> import numpy as np, knnkit
        >>> rng = np.random.default_rng(0)
        >>> index = knnkit.GraphIndex.build(rng.random((500, 4), dtype=np.float32), device="cpu")
        >>> new = rng.random((100, 4), dtype=np.float32)
        >>> len(index.extend(new))
        600
        """
        a, info = check_matrix(new_data, "new_data")
        check_pair(self._data, a)
        a = as_host(a)
        if a.dtype != self.dtype:
            if self.dtype.kind == "f" and a.dtype.kind == "f":
                a = a.astype(self.dtype)
            elif self.dtype.kind in "iu" and a.dtype.kind in "iu":
                info_t = np.iinfo(self.dtype)
                if a.min() < info_t.min or a.max() > info_t.max:
                    raise ValueError(f"new_data values do not fit the index dtype {self.dtype}")
                a = a.astype(self.dtype)
            else:
                raise TypeError(f"new_data has dtype {a.dtype}, the index stores {self.dtype}")
        X, graph, _entry = self._host_arrays()
        X = np.asarray(X)
        graph = np.asarray(graph)
        data = np.asarray(as_host(self._data))
        bp = self.build_params
        R = self.graph_degree
        K = bp["intermediate_degree"]
        alpha = bp["alpha"]
        im = self._imetric
        beam = int(beam) if beam else 2 * K
        bs = int(batch_size) if batch_size else max(1024, data.shape[0] // 2)
        Xn_all = prepare_vectors(a, self.metric)
        nn1 = self.nn1_max if np.isfinite(self.nn1_max) else 0.0
        for s in range(0, a.shape[0], bs):
            Xn = np.ascontiguousarray(Xn_all[s:s + bs])
            m = Xn.shape[0]
            n0 = X.shape[0]
            kk = min(K, n0)
            entry = build_entry_points(X, _default_n_entry(n0), im, random_state=0) if s else _entry
            seeds = entry.seeds_for(Xn, 8)
            d_old, i_old = search_cpu(X, graph, Xn, kk, seeds=seeds, beam=max(beam, kk), tau=np.inf,
                                      max_iters=8 * beam, metric=im)
            if m > 1:
                kn = min(K, m - 1)
                d_new, i_new = exact_knn_cpu(Xn, Xn, kn, im, exclude_self=True)
                cand_i = np.concatenate([i_old, i_new + n0], axis=1)
                cand_d = np.concatenate([d_old, d_new], axis=1)
            else:
                cand_i, cand_d = i_old, d_old
            X = np.concatenate([X, Xn], axis=0)
            xmax = float(np.sqrt(np.einsum("ij,ij->i", X, X).max())) if im == "ip" else None
            nn1 = max(nn1, nn1_max(Xn, cand_d, im, xnorm_max=xmax))
            rows = prune_cpu(X, cand_i, cand_d, R, alpha, im, node_ids=np.arange(n0, n0 + m))
            graph = np.concatenate([graph, rows], axis=0)
            graph = add_reverse_edges(X, graph, R, alpha, im, new_graph_rows=rows, row_offset=n0)
        data = np.concatenate([data, a], axis=0)
        seed = bp.get("random_state")
        entry = build_entry_points(X, bp["n_entry"], im, random_state=seed if isinstance(seed, int) else 0)
        bp["n_extended"] = int(bp.get("n_extended", 0)) + int(a.shape[0])
        if self.device == "gpu":
            cp = cupy_or_none()
            self._data, self._X, self._graph = cp.asarray(data), cp.asarray(X), cp.asarray(graph)
            self._entry = entry.to(cp)
        else:
            self._data, self._X, self._graph, self._entry = data, X, graph, entry
        self._host = None
        self._gpu = None
        self._x16_cache = None
        self._xnorm_max = None
        self.nn1_max = nn1
        return self

    # ------------------------------------------------------------------ persistence
    def save(self, path):
        """Write the index to ``path`` (format in :mod:`knnkit.index._format`).

        Examples
        --------
        >>> import numpy as np, knnkit, tempfile, os
        >>> index = knnkit.GraphIndex.build(np.random.default_rng(0).random((300, 4), dtype=np.float32),
        ...                                 device="cpu")
        >>> path = os.path.join(tempfile.mkdtemp(), "index.knnkit")
        >>> index.save(path)
        >>> knnkit.load(path, device="cpu").n
        300
        """
        from .. import __version__

        meta = {
            "format": "knnkit.GraphIndex", "format_version": VERSION, "knnkit_version": __version__,
            "metric": self.metric, "dtype": self.dtype.name, "n": self.n, "dim": self.dim,
            "graph_degree": self.graph_degree, "build_params": self.build_params,
            "search_params": self.search_params, "entry_metric": self._entry.metric,
            "nn1_max": self.nn1_max if np.isfinite(self.nn1_max) else None,
        }
        arrays = {
            "data": as_host(self._data),
            "graph": as_host(self._graph).astype(np.int32, copy=False),
            "entry_centroids": as_host(self._entry.centroids).astype(np.float32, copy=False),
            "entry_medoids": as_host(self._entry.medoids).astype(np.int32, copy=False),
        }
        write_index_file(path, meta, arrays)

    @classmethod
    def load(cls, path, *, device="auto"):
        """Read an index written by :meth:`save` (CPU-only machines load GPU-built indexes).

        Parameters
        ----------
        path : str or os.PathLike
        device : "auto", "cpu", "gpu" or int
            Where the loaded index lives ("auto": the GPU when one is usable).

        Returns
        -------
        GraphIndex

        Raises
        ------
        ValueError
            For files that are not knnkit indexes, of an unknown format version, truncated or
            corrupted (SHA-256 mismatch).

        Examples
        --------
        >>> import numpy as np, knnkit, tempfile, os
        >>> index = knnkit.GraphIndex.build(np.eye(8, dtype=np.float32), device="cpu")
        >>> path = os.path.join(tempfile.mkdtemp(), "eye.knnkit")
        >>> index.save(path)
        >>> knnkit.GraphIndex.load(path, device="cpu").search(np.eye(8, dtype=np.float32)[:1], k=1)[1]
        array([[0]])
        """
        meta, arrays = read_index_file(path)
        if meta.get("format") != "knnkit.GraphIndex":
            raise ValueError(f"{path}: not a GraphIndex file")
        try:
            data, graph = arrays["data"], arrays["graph"]
            cent, med = arrays["entry_centroids"], arrays["entry_medoids"]
            metric = check_metric(meta["metric"])
        except KeyError as e:
            raise ValueError(f"{path}: corrupted GraphIndex file (missing {e})") from None
        n = data.shape[0]
        if (data.ndim != 2 or graph.ndim != 2 or graph.shape[0] != n or data.shape[1] != meta["dim"]
                or n != meta["n"] or med.shape[0] != cent.shape[0] or (med.size and (med.max() >= n))
                or (graph.size and graph.max() >= n) or str(data.dtype) != meta["dtype"]):
            raise ValueError(f"{path}: inconsistent GraphIndex file")
        dev, dev_id = resolve_device(device, None)
        entry = EntryPoints(cent, med, meta.get("entry_metric", internal_metric(metric)))
        sp = meta.get("search_params", {})
        if dev == "gpu":
            cp = cupy_or_none()
            with cp.cuda.Device(dev_id if dev_id is not None else cp.cuda.Device().id):
                return cls(cp.asarray(data), cp.asarray(graph), entry.to(cp), metric=metric,
                           build_params=meta.get("build_params", {}), search_params=sp, device="gpu",
                           nn1_max=meta.get("nn1_max"))
        return cls(data, graph, entry, metric=metric, build_params=meta.get("build_params", {}),
                   search_params=sp, device="cpu", nn1_max=meta.get("nn1_max"))
