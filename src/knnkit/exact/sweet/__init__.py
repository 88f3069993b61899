"""Sweet KNN: exact k-NN join with two-level triangle-inequality filtering (Chen, Ding, Shen,
"Sweet KNN: An Efficient KNN on GPU through Reconciliation between Redundancy Removal and
Regularity", ICDE 2017).

Landmarks cluster the queries and the data (``3 sqrt(n)`` each); level 1 discards whole data
clusters per query cluster with two-landmark bounds, level 2 discards single points with the
one-landmark bound, visiting members in descending distance to their centre so that the rest
of a cluster is skipped at once. The filter strength (full vs partial level 2) and the
parallelism (one worker per query vs several) adapt to the problem; see ``NOTES_sweet.md``.

The engine follows the exact-engine contract of :mod:`knnkit._core.registry`: numpy input runs
the Numba twin (:mod:`._cpu`), cupy input the CUDA kernels of ``sweet.cu`` (:mod:`._gpu`).
Results equal the GEMM path's: squared Euclidean float32 distances computed as the GEMM path
re-computes them, rows sorted by (distance, index).
"""

import numpy as np

from ._plan import SweetParams

__all__ = ["SweetParams", "sweet_knn", "estimate_savings", "sweet_pays", "sweet_threshold"]


def _check(X, Q, k, metric, exclude_self, params):
    if metric != "l2":
        raise ValueError(f"sweet supports only the l2 metric (squared Euclidean); got {metric!r}: "
                         "the inner product is not a metric, so the triangle inequality gives no bounds")
    if params is None:
        params = SweetParams()
    elif not isinstance(params, SweetParams):
        raise TypeError(f"params must be a SweetParams, got {type(params).__name__}")
    if exclude_self and Q is not X:
        raise ValueError("exclude_self requires Q to be X (the all-points join)")
    n = X.shape[0]
    limit = n - 1 if exclude_self else n
    if not 1 <= int(k) <= limit:
        raise ValueError(f"k must be in [1, {limit}], got {k}")
    if X.ndim != 2 or Q.ndim != 2 or X.shape[1] != Q.shape[1]:
        raise ValueError(f"X and Q must be 2-D with the same dimension, got {X.shape} and {Q.shape}")
    return params


def sweet_knn(X, Q, k, *, metric="l2", exclude_self=False, params=None, seed=0, gate=None):
    """Exact k-NN of the rows of ``Q`` among the rows of ``X`` with Sweet KNN filtering.

    Parameters
    ----------
    X : numpy or cupy ndarray, float32, shape (n, d)
        Prepared data (numpy runs the CPU twin, cupy the GPU engine).
    Q : ndarray, float32, shape (m, d)
        Queries; ``X`` itself with ``exclude_self=True`` for the all-points join.
    k : int
        Neighbours per query, ``1 <= k <= n`` (``n - 1`` when excluding self).
    metric : {"l2"}
        Internal metric; only squared Euclidean (``"ip"`` raises ValueError).
    exclude_self : bool
        Row i never returns index i (duplicates at other indices are returned, at distance 0).
    params : SweetParams, optional
    seed : int
        Seed of the landmark sampling (the result does not depend on it, only the speed).
    gate : (float, int[, float]), optional
        ``method="auto"``: ``(min_saved, sample[, floor])``. After level 1 the join goes on when
        level 1 alone saves ``min_saved`` of the distance computations, returns ``(None, None,
        stats)`` when it saves less than ``floor``, and otherwise runs level 2 on ``sample`` random
        queries first and returns None when they save less than ``min_saved`` (``stats["gate"]``).

    Returns
    -------
    dist : float32 (m, k)
        Squared Euclidean distances, ascending.
    idx : int64 (m, k)
        Indices into ``X``; equal distances ordered by smaller index.
    stats : dict
        Choices made (filter, parallelism, landmark counts), fractions of distance computations
        saved at level 1 (``saved_level1``), additionally at level 2 (``saved_level2``) and in
        total (``saved_total``), and times per phase in seconds (``times``).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).random((500, 3), dtype=np.float32)
    >>> d, i, stats = sweet_knn(X, X, 5, metric="l2", exclude_self=True)
    >>> d.shape, i.dtype, stats["filter"]
    ((500, 5), dtype('int64'), 'full')
    """
    params = _check(X, Q, k, metric, exclude_self, params)
    k = int(k)
    if isinstance(X, np.ndarray):
        from ._cpu import sweet_cpu

        X = np.ascontiguousarray(X, dtype=np.float32)
        Q = X if exclude_self else np.ascontiguousarray(Q, dtype=np.float32)
        return sweet_cpu(X, Q, k, params, int(seed), bool(exclude_self), gate=gate)
    from ._gpu import sweet_gpu

    return sweet_gpu(X, Q, k, params, int(seed), bool(exclude_self), gate=gate)


def estimate_savings(X, Q, k, *, sample=1000, seed=0, params=None, need=None, floor=None):
    """Fraction of the ``m * n`` distance computations the filters would save.

    Clusters and level 1 are built on the full sets; level 2 runs on ``sample`` random queries
    (counting only), unless ``need`` is given and level 1 alone already saves that much over all
    queries (then level 1's exact fraction is returned: a lower bound, at least ``need``).
    ``Q=None`` or ``Q is X`` estimates the all-points join. Used by ``method="auto"`` to choose
    between Sweet KNN and the GEMM path.

    Parameters
    ----------
    X, Q : numpy or cupy float32 arrays (Q may be None)
    k : int
    sample : int, default 1000
        Queries on which the level-2 filter is run.
    seed : int
    params : SweetParams, optional
    need : float, optional
        The fraction the caller asks for (``method="auto"``); lets the estimate stop after level 1.
    floor : float, optional
        Stop after level 1 also when level 1 saves less than this (level 1's fraction is returned).

    Returns
    -------
    float
        Estimated ``saved_total`` in [0, 1].
    """
    all_points = Q is None or Q is X
    Q = X if all_points else Q
    params = _check(X, Q, k, "l2", all_points, params)
    m = Q.shape[0]
    rng = np.random.default_rng(seed)
    sel = np.sort(rng.choice(m, size=min(int(sample), m), replace=False))
    if isinstance(X, np.ndarray):
        from ._cpu import sweet_cpu

        _, _, stats = sweet_cpu(np.ascontiguousarray(X, np.float32), Q if all_points else
                                np.ascontiguousarray(Q, np.float32), int(k), params, int(seed), all_points,
                                qsel=sel, enough=need, hopeless=floor)
    else:
        from ._gpu import sweet_gpu

        _, _, stats = sweet_gpu(X, Q, int(k), params, int(seed), all_points, qsel=sel, enough=need, hopeless=floor)
    return float(stats["saved_total"])


#: Sweet KNN is considered only up to this dimension, from this many query-point pairs on, and
#: taken when the estimated fraction of distance computations saved reaches the device's
#: threshold. On the GPU Sweet KNN's fixed cost (landmarks, duplicate gate, level 1) is ~2-3 ms
#: (it was ~25 ms) and the GEMM path does 2.5e9 pairs in ~10 ms (H200, d = 3, 10k queries x
#: 250k: sweet 4.4 ms), so sweet pays from ~1e9 pairs on. On the CPU the GEMM path is slow at
#: low d (60k x 60k x 3: 33 s vs 0.5 s). The dimension limit was 16 until the full GPU sweep
#: (H100, 500k all points, ``benchmarks/results/h100-2026-11-26-s13/``): separated clusters at
#: 32-D and 64-D save 99 % and Sweet KNN took 0.46 / 0.89 s where the GEMM path ``auto`` chose
#: took 1.14-1.25 / 1.58-1.70 s; CPU 60k x 32 / x 64, k = 20: 1.3 / 1.9 s against 7.7 / 10.5 s.
SWEET_AUTO_MAX_D = 64
SWEET_AUTO_MIN_PAIRS = {"gpu": 1e9, "cpu": 1e8}
#: Up to this dimension Sweet KNN is taken without the savings estimate, which costs a second
#: clusters phase and level 1 (H200, all points k = 20 through ``knnkit.knn``: skin auto 11.7 ms vs
#: sweet 7.0 ms with it; clustered 8-D 22.7 vs 17.7 ms; 10k 8-D queries 17.4 vs 10.6 ms). Uniform
#: 8-D, the filters' worst case at this dimension, still ran at 0.91x the GEMM path's time (165 vs
#: 181 ms); above 8 dimensions the estimate decides.
SWEET_AUTO_ALWAYS_D = 8
#: Estimated savings needed above ``SWEET_AUTO_ALWAYS_D``, per device, up to 16 dimensions and
#: above. Why the GPU asks more above 16-D: a distance Sweet KNN still computes costs ~0.1 ns at
#: 16-D, ~0.2 ns at 32-D and ~0.36 ns at 64-D (H100, 500k all points), where the GEMM path costs
#: ~4 ps per pair up to 16-D and ~6 ps at 64-D, so Sweet KNN pays when more than ~96 % (16-D)
#: and ~98 % (32-64-D) of the pairs are skipped. Uniform 16-D (50-83 % saved) took 4.7-12 s
#: through Sweet KNN against 1.0-1.1 s by GEMM.
SWEET_AUTO_MIN_SAVED = {"gpu": (0.95, 0.98), "cpu": (0.9, 0.9)}


def sweet_threshold(X, Q, k, *, device):
    """Whether Sweet KNN may answer this squared-L2 exact search (``method="auto"``): False (the
    GEMM path), True (Sweet KNN without an estimate) or the fraction of distance computations it
    must save (a float) for the sampled estimate to decide."""
    n, d = int(X.shape[0]), int(X.shape[1])
    m = n if Q is None else int(Q.shape[0])
    if d > SWEET_AUTO_MAX_D or float(m) * n < SWEET_AUTO_MIN_PAIRS[device] or k > 128:
        return False
    if d <= SWEET_AUTO_ALWAYS_D:
        return True
    low, high = SWEET_AUTO_MIN_SAVED[device]
    return low if d <= 16 else high


#: Queries of the savings estimate (``estimate_savings``, and the GPU run's gate)
SWEET_AUTO_SAMPLE = 256
#: Above 16 dimensions ``auto`` on the GPU gives up on Sweet KNN right after level 1 when level 1
#: saves less than this: on uniform data level 2 does not make up the rest (uniform 16-D: level 1
#: 0 %, level 2 50-83 %, against the 98 % asked above 16-D; uniform 32 / 64-D 0-4 % in all), and the
#: sampled level 2 cost uniform 32 / 64-D 6-10 % over the GEMM path's time (H100, 500k all points).
#: It was 0.5 until clustered data at 50k showed that level 1 alone is no verdict (CPU, 2 cores, all
#: points: clustered 32 / 64-D level 1 saves 19-23 %, level 2 brings it to 98 %, and Sweet KNN takes
#: 1.0-1.9 s where the GEMM path auto gave way to took 3.7-4.7 s; 12-D clusters of std 4: level 1
#: 1-2 %, in all 96 %). None on the CPU: there the gate's sample stops at its first chunk over
#: budget (``_cpu._GATE_CHUNK``), so hopeless data cost a chunk or three, not the sample.
SWEET_AUTO_LEVEL1_FLOOR = {"gpu": 0.1, "cpu": None}


def level1_floor(X, device):
    """The level-1 fraction below which ``auto`` stops estimating on ``device`` (None: always
    sample level 2)."""
    return SWEET_AUTO_LEVEL1_FLOOR[device] if int(X.shape[1]) > 16 else None


def sweet_pays(X, Q, k, *, device, seed=0):
    """True when Sweet KNN should answer this squared-L2 exact search instead of the GEMM path
    (the exact graph of :func:`knnkit.knn_graph`; ``knnkit.knn(method="auto")`` estimates inside
    the Sweet KNN run instead, see ``knnkit.api.exact.SWEET_AUTO_GATE`` and ``gate`` of
    :func:`sweet_knn`). The estimate stops
    after level 1 when level 1 alone saves what is asked.

    ``X`` prepared data (n, d), ``Q`` prepared queries or None (all points); the caller has
    checked that the internal metric is squared L2."""
    need = sweet_threshold(X, Q, k, device=device)
    if isinstance(need, bool):
        return need
    return estimate_savings(X, Q, k, sample=SWEET_AUTO_SAMPLE, seed=seed, need=need,
                            floor=level1_floor(X, device)) >= need
