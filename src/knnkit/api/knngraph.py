"""The :class:`KnnGraph` result object: neighbour lists, conversions, persistence.

Storage: ``indices``/``distances`` are kept where they were computed (numpy arrays for a CPU
build, cupy arrays for a GPU build); the public attributes return them through
:func:`knnkit.set_output` rules (by default on the input's device and framework). Methods that
need the host (``recall``, ``to_csr``, ``save``) copy to the host once.

Dask-backed graphs (:func:`knnkit.dask.knn_graph` given a dask array, or ``compute=False``):
``indices``/``distances`` are dask arrays whose row blocks stay on the workers (the lists may not
fit this process). ``n``, ``k``, ``shape``, ``stats`` and the two arrays work as they are;
``host_arrays()`` and ``compute()`` gather the lists explicitly; the methods that need every
list in this process (``recall``, ``to_csr``, ``to_umap``, ``save``, ``extend``, and the graph as
an input of ``merge_graphs`` or ``init_graph``) raise a ``TypeError`` that says to call
``.compute()`` first, rather than gathering the lists silently.

Files: the knnkit container (:mod:`knnkit._core.persist`, kind ``"graph"``: arrays
``indices``/``distances``, header with metric, n, k, include_self, stats). Files of the first
release (``KNNKGRPH``) still load. Loading validates content, not only the checksum.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._core.backend import ArrayInfo, as_host, resolve_device, wrap_output
from .._core.persist import read_container, sniff, write_container
from .._core.persist_checks import read_legacy_graph, validate_graph
from .._core.stats import BuildStats
from .._core.types import Array, ArrayLike, Device, HostArray, Metric, PathLike
from ._graphops import index_dtype_for

__all__ = ["KnnGraph", "index_dtype_for"]


def _is_dask(a):
    """A dask array (told by its type's module: an in-memory graph never imports dask)."""
    return type(a).__module__.startswith("dask.array")


def _recall_rows(a, b):
    """Mean fraction of b's ids found in a (row-wise), chunked to bound memory."""
    n, m = a.shape
    hits = 0
    step = max(1, (1 << 22) // max(1, a.shape[1] * b.shape[1]))
    for s in range(0, n, step):
        x = a[s:s + step, :, None]
        y = b[s:s + step, None, :]
        eq = (x == y) & (y >= 0)
        hits += int(eq.any(axis=1).sum())
    return hits / float(b.shape[0] * b.shape[1])


class KnnGraph:
    """An approximate (or exact) k-nearest-neighbour graph.

    Attributes
    ----------
    indices : (n, k) int32 array (int64 when n >= 2**31)
        Row ``i`` lists the neighbours of point ``i``, nearest first; ``-1`` marks a slot that
        could not be filled. With ``include_self=True`` column 0 is ``i`` itself.
    distances : (n, k) float32 array
        In the user's metric (``inner_product``: similarities, sorted descending).
    k : int
    metric : str
    include_self : bool
    stats : dict
        Build statistics: ``method``, ``iterations``, ``updates`` (per iteration),
        ``time_s`` (per iteration), ``phase_s`` (time per phase), parameters used.
    is_dask : bool
        True when ``indices``/``distances`` are dask arrays left on the workers (see the module
        docstring: :meth:`compute` gathers them; whole-graph methods raise until then).

    Examples
    --------
    >>> import numpy as np, knnkit
    >>> X = np.random.default_rng(0).random((300, 4), dtype=np.float32)
    >>> g = knnkit.knn_graph(X, k=5, device="cpu", random_state=0)
    >>> g.indices.shape, g.k
    ((300, 5), 5)
    """

    def __init__(self, indices: Array, distances: Array, *, metric: Metric = "sqeuclidean", include_self: bool = False,
                 stats: BuildStats | dict[str, Any] | None = None, info: ArrayInfo | None = None,
                 data: ArrayLike | None = None, params: dict[str, Any] | None = None) -> None:
        if _is_dask(indices) != _is_dask(distances):
            raise TypeError("indices and distances must both be dask arrays or neither, got "
                            f"{type(indices).__name__} and {type(distances).__name__}")
        if indices.shape != distances.shape or indices.ndim != 2:
            raise ValueError(f"indices {indices.shape} and distances {distances.shape} must be equal 2-D shapes")
        self._ind = indices
        self._dist = distances
        self._info = info if info is not None else ArrayInfo("numpy", False)
        self.metric = metric
        self.include_self = bool(include_self)
        self.stats = stats if isinstance(stats, BuildStats) else BuildStats.from_dict(stats)
        self._data = data          # reference kept for extend(); None after load()
        self._params = dict(params or {})

    # ------------------------------------------------------------------ basic properties
    @property
    def is_dask(self) -> bool:
        return _is_dask(self._ind)

    @property
    def indices(self) -> Array:
        # a dask-backed graph's arrays are returned as they are (whatever set_output says): converting
        # them would gather every block to this process
        return self._ind if self.is_dask else wrap_output(self._ind, self._info)

    @property
    def distances(self) -> Array:
        return self._dist if self.is_dask else wrap_output(self._dist, self._info)

    @property
    def n(self) -> int:
        return int(self._ind.shape[0])

    @property
    def k(self) -> int:
        return int(self._ind.shape[1])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return (f"KnnGraph(n={self.n}, k={self.k}, metric={self.metric!r}, include_self={self.include_self}, "
                f"method={self.stats.get('method')!r}{', dask' if self.is_dask else ''})")

    def host_arrays(self) -> tuple[HostArray, HostArray]:
        """``(indices, distances)`` as numpy arrays (a dask-backed graph's blocks are computed and
        gathered to this process: all n x k of them)."""
        if self.is_dask:
            import dask

            try:
                ind, dist = dask.compute(self._ind, self._dist)
            except Exception as e:  # noqa: BLE001 - dask's forms of "those futures are gone", re-raised otherwise
                # the blocks are futures of the client that built the graph, gone with it: with no
                # client left dask reports a missing dependency; with another client, a cancelled future
                if not ("Missing dependency" in str(e) or type(e).__name__ in ("FutureCancelledError", "CancelledError")):
                    raise
                raise RuntimeError("this dask-backed KnnGraph's lists lived on the workers of a Dask client that "
                                   "is closed (or lost them); compute the graph before closing its client, or "
                                   "build it with compute=True") from e
            return np.asarray(as_host(ind)), np.asarray(as_host(dist))
        return as_host(self._ind), as_host(self._dist)

    def compute(self) -> KnnGraph:
        """The graph with its lists in this process: a dask-backed graph's blocks gathered into
        numpy arrays (same metric, ``include_self`` and stats); an in-memory graph is returned
        as it is.

        Examples
        --------
        >>> import numpy as np, knnkit
        >>> g = knnkit.knn_graph(np.eye(8, dtype=np.float32), k=2, device="cpu")
        >>> g.compute() is g, g.is_dask
        (True, False)
        """
        if not self.is_dask:
            return self
        ind, dist = self.host_arrays()
        return KnnGraph(ind, dist, metric=self.metric, include_self=self.include_self, stats=self.stats,
                        params=self._params)

    def require_in_memory(self, what: str) -> None:
        """Raise ``TypeError`` when the lists are dask arrays on the workers: ``what`` (a method,
        or a function taking this graph) needs every list in this process, and gathering them
        silently could exhaust its memory."""
        if self.is_dask:
            raise TypeError(f"{what} needs the whole graph in this process, but its lists are dask arrays on the "
                            "workers: call .compute() first (it gathers all n x k ids and distances here)")

    # ------------------------------------------------------------------ quality
    def recall(self, truth_indices: ArrayLike) -> float:
        """Fraction of true neighbours found (the paper's Recall@k, eq. 4).

        Parameters
        ----------
        truth_indices : (n, >= m) array
            Exact neighbour ids excluding each point itself (e.g. the indices returned by
            ``knnkit.knn(data, k=...)``). ``m`` = the graph's neighbour columns (``k``, or
            ``k - 1`` with ``include_self``); when ``truth_indices`` has fewer columns, Recall@m
            is computed over that many instead.

        Returns
        -------
        float in [0, 1]
        """
        self.require_in_memory("KnnGraph.recall()")
        t = np.asarray(as_host(truth_indices) if not isinstance(truth_indices, np.ndarray) else truth_indices)
        ind = as_host(self._ind)
        if self.include_self:
            ind = ind[:, 1:]
        if t.ndim != 2 or t.shape[0] != ind.shape[0]:
            raise ValueError(f"truth_indices must have shape ({ind.shape[0]}, m), got {t.shape}")
        m = min(ind.shape[1], t.shape[1])
        if m == 0:
            raise ValueError("nothing to compare: the graph has no neighbour columns")
        return _recall_rows(ind[:, :m].astype(np.int64), t[:, :m].astype(np.int64))

    # ------------------------------------------------------------------ conversions
    def to_csr(self, *, mode: str = "distance", squared: bool | None = None) -> Any:
        """The graph as a scipy ``csr_matrix`` of shape (n, n).

        Same conventions as ``sklearn.neighbors.kneighbors_graph``: entry ``(i, j)`` holds the
        distance from ``i`` to neighbour ``j`` (explicit zeros kept, e.g. for duplicates and for the
        self column of ``include_self=True``), or 1 with ``mode="connectivity"``; rows have sorted
        column indices; ``-1`` slots are left out.

        Parameters
        ----------
        mode : {"distance", "connectivity"}
        squared : bool, optional
            For a ``"sqeuclidean"`` graph: ``False`` (default) stores Euclidean distances, the
            values of scikit-learn's default metric, so the matrix can be handed to estimators
            with ``metric="precomputed"``; ``True`` keeps the squared values. Other metrics store
            their own values (``squared`` must then be None).

        Examples
        --------
        >>> import numpy as np, knnkit
        >>> X = np.array([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0]], np.float32)
        >>> g = knnkit.knn_graph(X, k=1, device="cpu")
        >>> g.to_csr().toarray().tolist()
        [[0.0, 5.0, 0.0], [5.0, 0.0, 0.0], [0.0, 5.0, 0.0]]
        >>> g.to_csr(squared=True)[0, 1], g.to_csr(mode="connectivity")[0, 1]
        (np.float32(25.0), np.float32(1.0))
        """
        import scipy.sparse as sp

        self.require_in_memory("KnnGraph.to_csr()")
        if mode not in ("distance", "connectivity"):
            raise ValueError(f"mode must be 'distance' or 'connectivity', got {mode!r}")
        if squared is not None and not isinstance(squared, bool):
            raise TypeError(f"squared must be a bool or None, got {type(squared).__name__}")
        if squared is not None and self.metric != "sqeuclidean":
            raise ValueError(f"squared applies to 'sqeuclidean' graphs, this one is {self.metric!r}")
        ind, dist = self.host_arrays()
        if mode == "connectivity":
            dist = np.ones_like(dist, dtype=np.float32)
        elif self.metric == "sqeuclidean" and not squared:
            dist = np.sqrt(np.maximum(dist, 0))
        n, k = ind.shape
        valid = ind >= 0
        counts = valid.sum(axis=1)
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        # sort each row by column id (stable), dropping -1 slots (they sort first as -1)
        order = np.argsort(np.where(valid, ind, -1), axis=1, kind="stable")
        cols = np.take_along_axis(ind, order, axis=1)
        vals = np.take_along_axis(dist, order, axis=1)
        keep = np.take_along_axis(valid, order, axis=1)
        idx_t = np.int32 if n < 2 ** 31 and indptr[-1] < 2 ** 31 else np.int64
        m = sp.csr_matrix((vals[keep].astype(np.float32), cols[keep].astype(idx_t), indptr.astype(idx_t)),
                          shape=(n, n))
        m.has_sorted_indices = True
        return m

    def to_umap(self) -> tuple[HostArray, HostArray]:
        """``(knn_indices, knn_dists)`` as ``umap.UMAP(precomputed_knn=...)`` takes them.

        Each row starts with the point itself at distance 0 (UMAP's own nearest-neighbour
        output does), followed by its neighbours; ``n_neighbors`` of the UMAP model must equal
        the number of columns. Distances are in UMAP's metric: Euclidean (not squared) for
        ``"sqeuclidean"``/``"euclidean"`` graphs (use ``metric="euclidean"`` in UMAP), ``1 - cos``
        for ``"cosine"``. ``inner_product`` graphs have no UMAP metric and raise ``ValueError``.

        Returns
        -------
        knn_indices : int64 (n, m)
        knn_dists : float32 (n, m)
            ``m = k + 1`` when the graph excludes self, ``k`` when it already includes it.

        Examples
        --------
        >>> import numpy as np, knnkit
        >>> X = np.random.default_rng(0).random((300, 4), dtype=np.float32)
        >>> ind, dist = knnkit.knn_graph(X, k=14, device="cpu", random_state=0).to_umap()
        >>> ind.shape, bool((ind[:, 0] == np.arange(300)).all()), float(dist[:, 0].max())
        ((300, 15), True, 0.0)
        """
        self.require_in_memory("KnnGraph.to_umap()")
        if self.metric not in ("sqeuclidean", "euclidean", "cosine"):
            raise ValueError(f"a {self.metric!r} graph has no UMAP metric (use euclidean or cosine)")
        ind, dist = self.host_arrays()
        ind = ind.astype(np.int64)
        dist = dist.astype(np.float32)
        if self.metric == "sqeuclidean":
            dist = np.sqrt(np.maximum(dist, 0))
        if not self.include_self:
            n = ind.shape[0]
            ind = np.concatenate([np.arange(n, dtype=np.int64)[:, None], ind], axis=1)
            dist = np.concatenate([np.zeros((n, 1), np.float32), dist], axis=1)
        else:
            dist[:, 0] = 0.0
        if bool((ind < 0).any()):
            raise ValueError("the graph has empty (-1) slots; UMAP needs full rows (build with a smaller k)")
        return ind, dist

    # ------------------------------------------------------------------ persistence
    def save(self, path: PathLike) -> None:
        """Write the graph to ``path`` (format in the module docstring); atomic (tmp + rename).

        Examples
        --------
        >>> import numpy as np, knnkit, tempfile, os
        >>> g = knnkit.knn_graph(np.eye(8, dtype=np.float32), k=2, device="cpu")
        >>> p = os.path.join(tempfile.mkdtemp(), "g.knng")
        >>> g.save(p); knnkit.load(p).k
        2
        """
        self.require_in_memory("KnnGraph.save()")
        ind, dist = self.host_arrays()
        n, k = ind.shape
        itype = index_dtype_for(n) if ind.dtype.itemsize <= 4 else np.int64
        meta = {"metric": self.metric, "n": int(n), "k": int(k), "include_self": self.include_self,
                "stats": self.stats.as_dict()}
        write_container(path, "graph", meta, {"indices": np.ascontiguousarray(ind, dtype=itype),
                                              "distances": np.ascontiguousarray(dist, dtype=np.float32)})

    @classmethod
    def load(cls, path: PathLike, *, device: Device = "cpu", mmap: bool = False) -> KnnGraph:
        """Read a graph written by :meth:`save` (or by knnkit's first release).

        Parameters
        ----------
        path : str or os.PathLike
        device : {"cpu", "gpu", "auto"} or int, default "cpu"
            Where the arrays live after loading (``indices``/``distances`` are returned as numpy
            for "cpu", cupy for the GPU).
        mmap : bool
            Memory-map the arrays (read-only) instead of reading them.

        Raises
        ------
        ValueError
            Not a knnkit graph, unknown version, truncated or corrupted file, or content that
            cannot be a graph (ids out of range, unknown metric, wrong dtypes).
        """
        kind, dev_id = resolve_device(device, None)
        if sniff(path) == "legacy-graph":
            meta, arrays = read_legacy_graph(path)
        else:
            meta, arrays = read_container(path, kind="graph", mmap=mmap)
        validate_graph(meta, arrays, path)
        ind, dist = arrays["indices"], arrays["distances"]
        info = ArrayInfo("numpy", False)
        if kind == "gpu":
            import cupy

            with cupy.cuda.Device(dev_id if dev_id is not None else cupy.cuda.Device().id):
                ind, dist = cupy.asarray(ind), cupy.asarray(dist)
            info = ArrayInfo("cupy", True, dev_id)
        return cls(ind, dist, metric=meta["metric"], include_self=bool(meta.get("include_self", False)),
                   stats=meta.get("stats", {}), info=info)

    # ------------------------------------------------------------------ incremental build
    def extend(self, new_data: ArrayLike, data: ArrayLike | None = None, **kwargs: Any) -> KnnGraph:
        """Add points: build a graph on ``new_data`` and merge it in (paper section 5, GGM).

        Parameters
        ----------
        new_data : (m, d) array
            New points; they get ids ``n .. n + m - 1``.
        data : (n, d) array, optional
            The points this graph was built on. Needed when the graph holds no reference to
            them (graphs built by :func:`knn_graph` keep one; loaded graphs do not). A sample of
            the graph's stored distances is recomputed from it: data the graph was not built on
            (or changed in place since) is refused with a ``ValueError``, as by :func:`merge_graphs`.
        **kwargs
            Passed to :func:`knn_graph` / :func:`merge_graphs` (``device``, ``random_state``,
            ``n_neighbors_internal``, ...).

        Returns
        -------
        KnnGraph
            A new graph over ``concat(data, new_data)``; it keeps a reference to the
            concatenated data so that ``extend`` can be chained.

        Examples
        --------
        >>> import numpy as np, knnkit
        >>> rng = np.random.default_rng(0)
        >>> g = knnkit.knn_graph(rng.random((400, 4), dtype=np.float32), k=5, device="cpu")
        >>> g2 = g.extend(rng.random((100, 4), dtype=np.float32))
        >>> g2.indices.shape
        (500, 5)
        """
        from .._core.prepare import prepare
        from ._graphops import build_graph, merge_prepared

        self.require_in_memory("KnnGraph.extend()")
        if isinstance(new_data, (list, tuple)):
            new_data = np.asarray(new_data)
        base = data if data is not None else self._data
        if base is None:
            raise ValueError("this graph keeps no reference to its data (e.g. it was loaded from disk); "
                             "pass data=the points it was built on")
        if self.include_self:
            raise ValueError("extend() needs a graph built with include_self=False")
        unknown = set(kwargs) - {"device", "random_state", "n_neighbors_internal", "sample", "max_iters", "delta",
                                 "update", "verbose"}
        if unknown:
            raise TypeError(f"extend() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
        device = kwargs.get("device", self._params.get("device", "auto"))
        P_old = prepare(base, metric=self.metric, device=device, name="data", metrics=_GRAPH_METRICS)
        if P_old.n != self.n:
            raise ValueError(f"data has {P_old.n} rows but the graph has {self.n}")
        P_new = prepare(new_data, metric=self.metric, device=P_old.device_id if P_old.device_id is not None
                        else P_old.device, name="new_data", metrics=_GRAPH_METRICS)
        if P_new.d != P_old.d:
            raise ValueError(f"new_data has d={P_new.d}, the graph's data has d={P_old.d}")
        # the graph must be this data's (a loaded graph given other data of the same shape, or data
        # changed in place since the build, merged into nonsense without a word): a sample of its
        # stored distances is recomputed, as merge_graphs does
        from ._graphops import _check_graph_matches, _neighbour_part

        _check_graph_matches(P_old, *_neighbour_part(self), "the graph", "data")
        m = P_new.n
        kk = min(self.k, m - 1) if m > 1 else 0
        if kk < 1:
            raise ValueError("extend() needs at least 2 new points")
        nnd = {k: kwargs.get(k) for k in ("n_neighbors_internal", "sample", "max_iters", "delta", "verbose")}
        g_new = KnnGraph(**build_graph(P_new, kk, random_state=kwargs.get("random_state"), shortcuts=nnd,
                                       data=new_data, device_arg=device))
        from ..graph.nndescent import NNDescentParams

        prm = NNDescentParams(**{k: v for k, v in dict(nnd, update=kwargs.get("update")).items() if v is not None})
        return KnnGraph(**merge_prepared(P_old, self, P_new, g_new, k=self.k,
                                         random_state=kwargs.get("random_state"), params=prm, device_arg=device,
                                         check_content=False))


_GRAPH_METRICS = ("sqeuclidean", "euclidean", "inner_product", "cosine", "manhattan")
