"""scikit-learn estimators backed by knnkit (public face: :mod:`knnkit.sklearn`).

``NearestNeighbors`` and ``KNeighborsTransformer`` follow the semantics of their namesakes in
``sklearn.neighbors`` (parameters stored untouched by ``__init__`` and validated in ``fit``;
fitted attributes ending in ``_``; ``kneighbors()`` without ``X`` leaves each training sample out
of its own list; the transformer's distance graph holds ``n_neighbors + 1`` entries per row, the
sample itself included, so that it chains into ``Isomap``, ``TSNE(metric="precomputed")``,
``DBSCAN(metric="precomputed")`` and ``SpectralClustering(affinity="precomputed_nearest_neighbors")``;
``radius_neighbors`` and ``radius_neighbors_graph`` as scikit-learn's, always exact).
The neighbours come from knnkit: exact search (GEMM or Sweet KNN) on the GPU when one is usable,
or the approximate k-NN graph / graph index for large data (``method``).
"""

import numbers

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from .._core.prepare import prepare
from ..graph import GRAPH_METRICS
from ._graphops import build_graph
from .exact import exact_arrays
from .index import GraphIndex

__all__ = ["NearestNeighbors", "KNeighborsTransformer"]

# scikit-learn metric names -> knnkit's (minkowski only with p = 2)
_METRICS = {"minkowski": "euclidean", "euclidean": "euclidean", "l2": "euclidean", "sqeuclidean": "sqeuclidean",
            "cosine": "cosine", "inner_product": "inner_product"}
_METHODS = ("auto", "exact", "graph", "index")
# "auto" searches exactly up to this many fit points (CPU) / on the GPU always up to 2M
_AUTO_EXACT_MAX_N = {"cpu": 50_000, "gpu": 2_000_000}


def _device_kind(device):
    if device == "auto":
        from .._core.backend import gpu_available

        return "gpu" if gpu_available() else "cpu"
    return "cpu" if device == "cpu" else "gpu"


class NearestNeighbors(BaseEstimator):
    """Unsupervised nearest-neighbour search with scikit-learn's interface, computed by knnkit.

    Parameters
    ----------
    n_neighbors : int, default 5
        Neighbours returned by :meth:`kneighbors` when its ``n_neighbors`` is not given.
    radius : float, default 1.0
        Radius of :meth:`radius_neighbors` when its ``radius`` is not given.
    metric : {"minkowski", "euclidean", "l2", "sqeuclidean", "cosine", "inner_product"}, default "minkowski"
        ``"minkowski"`` needs ``p=2`` (Euclidean, scikit-learn's default). Distances are those of
        scikit-learn for the same metric (Euclidean, not squared; ``cosine``: ``1 - cos``);
        ``inner_product`` (knnkit's) returns similarities, largest first.
    p : int, default 2
        Minkowski power; only 2 is supported (a ``ValueError`` names other values at ``fit``).
    method : {"auto", "exact", "graph", "index"}, default "auto"
        ``"exact"``: exact k-NN (knnkit's GEMM path or Sweet KNN). ``"graph"``: ``kneighbors()``
        of the fit data from the approximate k-NN graph (NN-Descent); queries other than the fit
        data are answered exactly. ``"index"``: a :class:`~knnkit.GraphIndex` built at ``fit``
        answers every query (approximate, fast for many queries). ``"auto"``: exact up to 50,000
        fit points on the CPU (2,000,000 on the GPU), ``"index"`` above.
    device : {"auto", "cpu", "gpu"}, default "auto"
        Where knnkit computes; inputs and outputs are numpy arrays either way.
    random_state : None or int
        Seed of the approximate methods.

    Attributes
    ----------
    n_features_in_ : int
    n_samples_fit_ : int
    effective_metric_ : str
        The knnkit metric used.
    method_ : str
        The method ``"auto"`` resolved to.

    Examples
    --------
    >>> import numpy as np
    >>> from knnkit.sklearn import NearestNeighbors
    >>> X = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [5.0, 5.0]])
    >>> nn = NearestNeighbors(n_neighbors=2, device="cpu").fit(X)
    >>> d, i = nn.kneighbors([[0.1, 0.0]])
    >>> i.tolist(), np.round(d, 3).tolist()
    ([[0, 1]], [[0.1, 0.9]])
    >>> nn.kneighbors()[1].tolist()   # each training sample leaves itself out
    [[1, 2], [0, 2], [0, 1], [2, 1]]
    """

    def __init__(self, n_neighbors=5, *, radius=1.0, metric="minkowski", p=2, method="auto", device="auto",
                 random_state=None):
        self.n_neighbors = n_neighbors
        self.radius = radius
        self.metric = metric
        self.p = p
        self.method = method
        self.device = device
        self.random_state = random_state

    # ------------------------------------------------------------------ fit
    def _check_params(self):
        if isinstance(self.n_neighbors, bool) or not isinstance(self.n_neighbors, numbers.Integral) \
                or self.n_neighbors < 1:
            raise ValueError(f"n_neighbors must be an integer >= 1, got {self.n_neighbors!r}")
        if self.metric not in _METRICS:
            raise ValueError(f"metric must be one of {sorted(_METRICS)}, got {self.metric!r}")
        if self.metric == "minkowski" and self.p != 2:
            raise ValueError(f"p={self.p!r}: only p=2 (Euclidean) is supported with metric='minkowski'")
        if self.method not in _METHODS:
            raise ValueError(f"method must be one of {_METHODS}, got {self.method!r}")
        if self.device not in ("auto", "cpu", "gpu"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'gpu', got {self.device!r}")

    def fit(self, X, y=None):
        """Store (and for ``method="index"`` index) the training data ``X`` (n_samples, n_features)."""
        self._check_params()
        X = validate_data(self, X, dtype=[np.float64, np.float32], ensure_min_samples=1)
        self._fit_X = np.ascontiguousarray(X)
        self.n_samples_fit_ = X.shape[0]
        self.effective_metric_ = _METRICS[self.metric]
        kind = _device_kind(self.device)
        method = self.method
        if method == "auto":
            method = "exact" if X.shape[0] <= _AUTO_EXACT_MAX_N[kind] else "index"
        self.method_ = method
        self._index = None
        if method == "index" and X.shape[0] > 1:
            # float64 goes in as is: knnkit converts it, refusing values beyond float32 by name (a cast
            # here turned them into inf, reported as "contains NaN or Inf")
            self._index = GraphIndex.build(self._fit_X, metric=self.effective_metric_,
                                           device=self.device, random_state=self.random_state)
        return self

    # ------------------------------------------------------------------ queries
    def _neighbors(self, X, k):
        """(distances, indices) as numpy arrays: exact or approximate by ``method_``."""
        metric = self.effective_metric_
        data = self._fit_X
        if X is None:
            if self.method_ == "graph" or (self._index is not None and self.method_ == "index"):
                P = prepare(data, metric=metric, device=self.device, metrics=GRAPH_METRICS)
                g = build_graph(P, k, random_state=self.random_state, device_arg=self.device)
                return np.asarray(g["distances"]), np.asarray(g["indices"]).astype(np.int64)
            d, i = exact_arrays(data, None, k, metric=metric, device=self.device, random_state=self.random_state)
        elif self._index is not None:
            d, i = self._index.search(X, k=k, device="cpu" if self.device == "cpu" else None)
        else:
            d, i = exact_arrays(data, X, k, metric=metric, device=self.device,
                                random_state=self.random_state)
        return _host(d), _host(i).astype(np.int64)

    def kneighbors(self, X=None, n_neighbors=None, return_distance=True):
        """Nearest neighbours of each query (of each training sample, itself left out, when ``X``
        is None).

        Returns
        -------
        distances : ndarray (n_queries, n_neighbors), only when ``return_distance``
        indices : ndarray of int64 (n_queries, n_neighbors)
            Sorted by distance (ties by smaller index).
        """
        check_is_fitted(self)
        if n_neighbors is None:
            n_neighbors = self.n_neighbors
        if isinstance(n_neighbors, bool) or not isinstance(n_neighbors, numbers.Integral) or n_neighbors < 1:
            raise ValueError(f"n_neighbors must be an integer >= 1, got {n_neighbors!r}")
        n_fit = self.n_samples_fit_
        if X is not None:
            X = validate_data(self, X, dtype=[np.float64, np.float32], reset=False)
        limit = n_fit - 1 if X is None else n_fit
        if n_neighbors > limit:
            raise ValueError(f"Expected n_neighbors <= n_samples_fit{' - 1' if X is None else ''}, but "
                             f"n_neighbors = {n_neighbors}, n_samples_fit = {n_fit}")
        d, i = self._neighbors(X, int(n_neighbors))
        dtype = self._fit_X.dtype if X is None else X.dtype
        d = d.astype(dtype, copy=False)
        return (d, i) if return_distance else i

    def kneighbors_graph(self, X=None, n_neighbors=None, mode="connectivity"):
        """Sparse (n_queries, n_samples_fit) CSR graph of the neighbours: ones (``mode=
        "connectivity"``) or distances (``mode="distance"``), as scikit-learn builds it."""
        import scipy.sparse as sp

        if mode not in ("connectivity", "distance"):
            raise ValueError(f"mode must be 'connectivity' or 'distance', got {mode!r}")
        d, i = self.kneighbors(X, n_neighbors=n_neighbors, return_distance=True)
        nq, k = i.shape
        data = np.ones(nq * k, dtype=d.dtype) if mode == "connectivity" else d.ravel()
        indptr = np.arange(0, nq * k + 1, k)
        return sp.csr_matrix((data, i.ravel(), indptr), shape=(nq, self.n_samples_fit_))

    def radius_neighbors(self, X=None, radius=None, return_distance=True, sort_results=False):
        """Every fit point within ``radius`` of each query (boundary included), as scikit-learn's
        ``radius_neighbors``; each training sample leaves itself out when ``X`` is None.

        Always exact, whatever ``method``: exact k-NN with k doubled for the queries whose k-th
        neighbour still lies within the radius, so a query costs about the size of its ball.
        Distances as :meth:`kneighbors` computes them (knnkit's exact search). Results come
        sorted by distance (ties by smaller index) whatever ``sort_results``.

        Returns
        -------
        distances : ndarray of object (n_queries,), arrays of floats, only when ``return_distance``
        indices : ndarray of object (n_queries,), arrays of int64
        """
        check_is_fitted(self)
        radius = getattr(self, "radius", 1.0) if radius is None else radius
        if isinstance(radius, bool) or not isinstance(radius, numbers.Real) or not np.isfinite(radius) or radius < 0:
            raise ValueError(f"radius must be a finite number >= 0, got {radius!r}")
        if self.effective_metric_ == "inner_product":
            raise ValueError("radius_neighbors needs a distance; metric='inner_product' ranks by similarity")
        if X is not None:
            X = validate_data(self, X, dtype=[np.float64, np.float32], reset=False)
        data = self._fit_X
        n_fit = self.n_samples_fit_
        nq = n_fit if X is None else X.shape[0]
        dtype = data.dtype if X is None else X.dtype
        dist = np.empty(nq, dtype=object)
        ind = np.empty(nq, dtype=object)
        pending = np.arange(nq)
        # X is None: each row asks for one more neighbour and drops itself; once a row's last
        # neighbour lies outside the ball (or every point is listed) the ball is complete, so the
        # row itself (distance 0) is among them even among more than k duplicates
        extra = 1 if X is None else 0
        k = min(n_fit - extra, max(int(self.n_neighbors), 16))
        while pending.size:
            kk = min(n_fit, k + extra)
            Q = data[pending] if X is None else X[pending]
            d, i = exact_arrays(data, Q, kk, metric=self.effective_metric_, device=self.device,
                                random_state=self.random_state)
            d, i = _host(d), _host(i).astype(np.int64)
            done = (d[:, -1] > radius) | (kk >= n_fit)
            for row in np.flatnonzero(done):
                q = pending[row]
                keep = d[row] <= radius
                if X is None:
                    keep &= i[row] != q
                dist[q] = d[row][keep].astype(dtype, copy=False)
                ind[q] = i[row][keep]
            pending = pending[~done]
            k = min(n_fit - extra, 2 * k)
        return (dist, ind) if return_distance else ind

    def radius_neighbors_graph(self, X=None, radius=None, mode="connectivity", sort_results=False):
        """Sparse (n_queries, n_samples_fit) CSR graph of :meth:`radius_neighbors`: ones
        (``mode="connectivity"``) or distances (``mode="distance"``)."""
        import scipy.sparse as sp

        if mode not in ("connectivity", "distance"):
            raise ValueError(f"mode must be 'connectivity' or 'distance', got {mode!r}")
        d, i = self.radius_neighbors(X, radius=radius, return_distance=True)
        counts = np.fromiter((len(r) for r in i), dtype=np.int64, count=len(i))
        indptr = np.concatenate([[0], np.cumsum(counts)])
        cols = np.concatenate(list(i)) if len(i) else np.zeros(0, np.int64)
        vals = np.concatenate(list(d)) if len(d) else np.zeros(0)
        if mode == "connectivity":
            vals = np.ones(cols.shape[0], dtype=vals.dtype if vals.size else np.float64)
        return sp.csr_matrix((vals, cols, indptr), shape=(len(i), self.n_samples_fit_))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        return tags


class KNeighborsTransformer(TransformerMixin, NearestNeighbors):
    """Transform data into a sparse k-nearest-neighbour graph (scikit-learn's
    ``KNeighborsTransformer``), computed by knnkit.

    Parameters
    ----------
    mode : {"distance", "connectivity"}, default "distance"
        ``"distance"``: each row holds ``n_neighbors + 1`` entries, the sample itself (distance 0)
        included when the transformed data is the fit data, as scikit-learn does, so that
        estimators with ``metric="precomputed"`` see every sample's neighbourhood.
        ``"connectivity"``: ``n_neighbors`` ones per row.
    n_neighbors, metric, p, method, device, random_state
        As in :class:`NearestNeighbors`.

    Examples
    --------
    >>> import numpy as np
    >>> from knnkit.sklearn import KNeighborsTransformer
    >>> X = np.array([[0.0], [1.0], [3.0], [7.0]])
    >>> G = KNeighborsTransformer(n_neighbors=1, device="cpu").fit_transform(X)
    >>> G.toarray().round(1).tolist()
    [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 4.0, 0.0]]
    """

    def __init__(self, *, mode="distance", n_neighbors=5, metric="minkowski", p=2, method="auto", device="auto",
                 random_state=None):
        # not NearestNeighbors.__init__: that would also set ``radius``, which is not a parameter here
        self.n_neighbors = n_neighbors
        self.metric = metric
        self.p = p
        self.method = method
        self.device = device
        self.random_state = random_state
        self.mode = mode

    def fit(self, X, y=None):
        """Fit on the training data ``X``."""
        if self.mode not in ("distance", "connectivity"):
            raise ValueError(f"mode must be 'distance' or 'connectivity', got {self.mode!r}")
        return super().fit(X, y)

    def transform(self, X):
        """The sparse graph of the neighbours of ``X`` among the fit data, shape
        (n_samples, n_samples_fit)."""
        check_is_fitted(self)
        add_one = self.mode == "distance"
        return self.kneighbors_graph(X, mode=self.mode, n_neighbors=self.n_neighbors + add_one)

    def fit_transform(self, X, y=None):
        """``fit(X).transform(X)``."""
        return self.fit(X).transform(X)


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)
