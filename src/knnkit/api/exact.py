"""Public exact search: :func:`knn`."""

from __future__ import annotations

import warnings

import numpy as np

from .._core.backend import get_array_module, wrap_output
from .._core.config import logger
from .._core.metrics import finalize_distances
from .._core.params import merge_params
from .._core.prepare import prepare, prepare_queries, rescaled
from .._core.registry import REGISTRY
from .._core.types import ArrayLike, Device, Metric, NeighborPair, Params, Seed
from .._core.underflow import EXACT64_MAX_WORK, answer_in_float64, underflow_rows, warn_unresolved_cosine
from .._core.validation import check_k
from ..exact import ExactParams

__all__ = ["knn"]


def knn(data: ArrayLike, queries: ArrayLike | None = None, k: int = 10, *, metric: Metric = "sqeuclidean",
        method: str = "auto", device: Device = "auto", precision: str | None = None, batch_size: int | None = None,
        params: Params | None = None, random_state: Seed = None,
        filter: ArrayLike | None = None) -> NeighborPair:
    """Exact k nearest neighbours by brute force (the library's ground truth).

    Parameters
    ----------
    data : array-like, shape (n, d)
        Data points: numpy, cupy or torch (CPU or CUDA), float32/float16/uint8/int8
        (float64 is converted to float32; everything is computed in float32).
    queries : array-like, shape (m, d), optional
        Query points. ``None`` builds the all-points k-NN graph of ``data``: row ``i`` holds the
        neighbours of ``data[i]`` excluding ``i`` itself (by index: an exact duplicate of point
        ``i`` stored at another index is returned, at distance 0).
    k : int, default 10
        Neighbours per query, ``1 <= k <= n`` (``k <= n - 1`` when ``queries`` is None).
    metric : {"sqeuclidean", "euclidean", "inner_product", "cosine"}
        ``inner_product`` returns similarities sorted descending; ``cosine`` returns
        ``1 - cos`` distances.
    device : {"auto", "cpu", "gpu"} or int
        ``"auto"`` uses the GPU when one is usable (and always when the input is on a GPU).
    method : str, default "auto"
        A registered exact method (``knnkit.methods("exact")``): ``"gemm"`` (dense GEMM +
        k-selection) or ``"sweet"`` (Sweet KNN: triangle-inequality filtering, Euclidean metrics,
        pays in low dimensions). ``"auto"`` picks Sweet KNN for Euclidean data (and cosine) up to
        8 dimensions, and up to 64 when its filters are estimated to save >= 95 % (GPU, up to 16-D)
        / 98 % (GPU, above) / 90 % (CPU) of the distance computations: on the CPU first on a subset
        of the rows, then on a sample of queries inside the Sweet KNN run, which gives way to the
        GEMM path when they fall short; the GEMM path otherwise. Every method returns the same
        exact result.
    precision : {"exact", "fp16_rerank", "tf32_rerank", "bf16_rerank"}, default "exact"
        GPU only: on the CPU anything but "exact" is refused. ``"exact"`` uses a float32 GEMM. The
        ``*_rerank`` modes are faster on tensor cores: a low-precision GEMM (float16 of centred,
        scaled vectors; TF32; bfloat16) picks ``k' > k`` candidates, which are re-ranked with
        exact float32 distances; each row is then checked against a worst-case rounding bound
        (from the vector norms and the format's unit roundoff) and rows whose candidate margin
        is too small are recomputed in exact mode. Results can differ from ``"exact"`` only
        among distances equal to float32 rounding.
    batch_size : int, optional
        Queries per tile (GPU) or per block (CPU); by default sized from the memory budget.
    params : ExactParams or SweetParams, optional
        The chosen method's parameters (``precision`` and ``batch_size`` are shortcuts for
        ``ExactParams``).
    random_state : None or int
        Seed of the methods' random choices (Sweet KNN's landmarks); results do not depend on it.
    filter : array-like, optional
        Only points that pass are returned (needs ``queries``). One for all queries: a boolean
        mask of length n, or a packed bitset (uint8 or uint32 words, bit ``j % w`` of word
        ``j // w`` set for point ``j``, little-endian as cuVS's bitset). One per query: a boolean
        array (m, n), a bitset (m, words), or a list of m arrays of point ids. The search runs
        exactly over the passing points (per distinct filter row), so results are exact; a query
        with fewer than ``k`` passing points gets index ``-1`` and distance ``inf`` (``-inf`` for
        ``inner_product``) in the remaining slots: there, no point exists.

    Returns
    -------
    distances : array, float32, shape (m, k)
        Sorted ascending (``inner_product``: similarities sorted descending).
    indices : array, int64, shape (m, k)
        Indices into ``data``; equal distances are ordered by smaller index.
        Both are returned on the framework/device of ``queries`` (of ``data`` when
        ``queries`` is None), per :func:`knnkit.set_output`.

    Examples
    --------
    >>> import numpy as np, knnkit
    >>> X = np.random.default_rng(0).standard_normal((1000, 16)).astype(np.float32)
    >>> d, i = knnkit.knn(X, X[:5], k=3, device="cpu")
    >>> i[:, 0].tolist()
    [0, 1, 2, 3, 4]
    >>> d, i = knnkit.knn(X, k=3, device="cpu")   # all-points graph, self excluded
    >>> bool((i != np.arange(1000)[:, None]).all())
    True
    """
    shortcuts = dict(precision=precision, batch_size=batch_size)
    if filter is not None:
        return _filtered(data, queries, k, filter, metric=metric, method=method, device=device, params=params,
                         shortcuts=shortcuts, random_state=random_state)
    return exact_arrays(data, queries, k, metric=metric, method=method, device=device, params=params,
                        shortcuts=shortcuts, random_state=random_state)


def filter_rows(filt, n, m):
    """A validated ``filter`` as ``(shared, rows)``: ``shared`` True with one sorted int64 id array
    (numpy) passing for every query, or False with a list of m such arrays (one per query)."""
    import numpy as np

    from .._core.backend import as_host

    if isinstance(filt, (list, tuple)):
        if len(filt) != m:
            raise ValueError(f"filter: a list needs one id array per query ({m}), got {len(filt)}")
        rows = []
        for r in filt:
            ids = np.asarray(as_host(r) if hasattr(r, "__cuda_array_interface__") else r)
            if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
                raise TypeError("filter: each list entry must be a 1-D array of integer point ids")
            ids = np.unique(ids.astype(np.int64))
            if ids.size and (ids[0] < 0 or ids[-1] >= n):
                raise ValueError(f"filter: point ids must be in [0, {n})")
            rows.append(ids)
        return False, rows
    a = filt
    if hasattr(a, "__cuda_array_interface__") or type(a).__module__.startswith("torch"):
        a = as_host(a)
    a = np.asarray(a)
    if a.dtype == bool:
        mask = a
    elif a.dtype in (np.uint8, np.uint32):
        w = 8 * a.dtype.itemsize
        words = -(-n // w)
        if a.shape[-1] != words or a.ndim not in (1, 2):
            raise ValueError(f"filter: a {a.dtype} bitset over n={n} points has {words} words per row, "
                             f"got shape {a.shape}")
        bits = np.unpackbits(a.view(np.uint8).reshape(a.shape[:-1] + (-1,)), axis=-1, bitorder="little")
        mask = bits[..., :n].astype(bool)
    else:
        raise TypeError(f"filter must be a boolean mask, a uint8/uint32 bitset or a list of id arrays, "
                        f"got dtype {a.dtype}")
    if mask.ndim == 1:
        if mask.shape[0] != n:
            raise ValueError(f"filter: mask length must be n={n}, got {mask.shape[0]}")
        return True, np.flatnonzero(mask).astype(np.int64)
    if mask.ndim == 2 and mask.shape == (m, n):
        return False, [np.flatnonzero(r).astype(np.int64) for r in mask]
    raise ValueError(f"filter: a mask must have shape ({n},) or ({m}, {n}), got {mask.shape}")


def _filtered(data, queries, k, filt, *, metric, method, device, params, shortcuts, random_state):
    """knn over the points that pass ``filt``: one exact search per distinct filter row."""
    import dataclasses

    import numpy as np

    if queries is None:
        raise ValueError("filter needs queries (give the points themselves as queries for an all-points search)")
    P = prepare(data, metric=metric, device=device, int32_ids=False)  # (int64 ids on the CPU)
    Q = prepare_queries(queries, P)
    P = rescaled(P, Q.scale)
    k = check_k(k, P.n)
    m = Q.n
    shared, rows = filter_rows(filt, P.n, m)
    xp = get_array_module(P.X)
    fill = -np.inf if P.metric == "inner_product" else np.inf
    out_d = xp.full((m, k), fill, dtype=xp.float32)
    out_i = xp.full((m, k), -1, dtype=xp.int64)
    groups = [(np.arange(m), rows)] if shared else group_filter_rows(rows)
    for qrows, ids in groups:
        kk = min(k, int(ids.size))
        if kk == 0:
            continue
        sel = xp.asarray(ids)
        Psub = dataclasses.replace(P, raw=P.raw[sel], X=P.X[sel])
        qsel = xp.asarray(qrows)
        Qsub = Q if shared else dataclasses.replace(Q, raw=Q.raw[qsel], X=Q.X[qsel])
        d, i, _stats = exact_search(Psub, Qsub, kk, method=method, params=params, shortcuts=shortcuts,
                                    random_state=random_state)
        out_d[qsel, :kk] = d
        out_i[qsel, :kk] = sel[i]
    return wrap_output(out_d, Q.info), wrap_output(out_i, Q.info)


def group_filter_rows(rows):
    """``[(query rows, ids)]``: queries with identical filters searched together."""
    import numpy as np

    groups = {}
    for q, ids in enumerate(rows):
        groups.setdefault(ids.tobytes(), (ids, []))[1].append(q)
    return [(np.asarray(qs, dtype=np.int64), ids) for ids, qs in groups.values()]


def exact_arrays(data, queries, k, *, metric="sqeuclidean", method="auto", device="auto", params=None,
                 shortcuts=None, random_state=None):
    """What :func:`knn` does, for the library's own facades (evaluate, the CLI)."""
    P = prepare(data, metric=metric, device=device, int32_ids=False)  # (int64 ids on the CPU)
    Q = None
    if queries is not None:
        Q = prepare_queries(queries, P)  # its scale covers both magnitudes
        P = rescaled(P, Q.scale)
    d, i, _stats = exact_search(P, Q, k, method=method, params=params, shortcuts=shortcuts,
                                random_state=random_state)
    out = P.info if Q is None else Q.info
    return wrap_output(d, out), wrap_output(i, out)


#: ``method="auto"`` asks Sweet KNN to estimate its savings inside the run (``gate`` of
#: :func:`knnkit.exact.sweet.sweet_knn`) instead of a separate estimate first: the run keeps its
#: clusters and level 1, passes at once when level 1 alone saves enough (its count over all queries
#: is exact), and otherwise samples level 2 before finishing or giving way to the GEMM path.
#: H100, 500k all points (``benchmarks/results/h100-2026-11-26-s14/sweet/``), auto against the
#: better of Sweet KNN and GEMM: clustered 16 / 32 / 64-D 1.00-1.01x with the gate, 1.05-1.07x with
#: the separate estimate; uniform 16-D 1.02-1.05x (1.01-1.04x); uniform 64-D 1.05-1.09x (1.06-1.09x).
#: (The first gate, one thread per sampled query and no level-1 shortcut, was slower: uniform 16-D
#: 1.46-2.08 s against GEMM's ~1.0 s.) The CPU twin gates the same way: 30k clustered 16-D, 2 cores,
#: the separate estimate added ~60 ms to a ~160 ms join.
SWEET_AUTO_GATE = True


#: ``auto``'s first look on the CPU: (rows, fraction, slack). Before the gated Sweet KNN run (whose
#: clusters phase and level 1 over all rows cost 4-9 % of the GEMM path where it then gives way),
#: the savings are estimated on a random subset of ``max(rows, n // fraction)`` rows (128 sampled
#: queries); below the asked fraction minus ``slack`` the GEMM path is taken at once. All points,
#: 50k, CPU: the 4,096-row subset reads 0.05-0.31 on uniform 16-64-D (the full sets 0.01-0.60,
#: asked 0.9) and 0.945-0.977 on clustered 12-64-D (full 0.98), in 7-25 ms against 0.1-0.5 s for
#: the full estimate. A subset saves less than the whole set (sparser), so the slack keeps
#: borderline sets for the full gate, and a subset that already saves the asked fraction runs
#: Sweet KNN without the gate (its sample cost 3-8 % of a clustered 32-D join, where ``auto`` was
#: 1.13x Sweet KNN's time; 1.03x without: ``benchmarks/results/cpu/
#: sweet_auto_paired_clustered_2026-11-29_s19_*.json``). None on the GPU (its gate and level-1
#: floor were within 0.98-1.07 of the better method there).
SWEET_AUTO_PREGATE = {"cpu": (4096, 8, 0.2), "gpu": None}


def _subset_may_pay(X, Q, k, need, device, seed):
    """What a random subset of ``X`` says of Sweet KNN's savings (``SWEET_AUTO_PREGATE``): False
    when they fall short of ``need`` by more than the pre-gate's slack (the GEMM path then
    answers), ``"sure"`` when the subset alone saves ``need`` (the whole set, denser, saves more:
    no gate inside the run), else True (the run's own gate decides)."""
    pre = SWEET_AUTO_PREGATE.get(device)
    n = int(X.shape[0])
    if pre is None:
        return True
    rows, fraction, slack = pre
    s = max(rows, n // fraction)
    if s >= n // 2:
        return True
    from ..exact.sweet import estimate_savings

    xp = get_array_module(X)
    rng = np.random.default_rng(seed)
    sub = X[xp.asarray(np.sort(rng.choice(n, size=s, replace=False)))]
    saved = estimate_savings(sub, Q, k, sample=128, seed=seed)
    logger.debug("knn auto: Sweet KNN saves %.3f on a %d-row subset (asked %.2f - %.2f)", saved, s, need, slack)
    if saved >= need:
        return "sure"
    return saved >= need - slack


def choose_exact_method(method, P, Q, k, seed=0, allow_sweet=True, gated=False):
    """The registered exact method for ``method``. ``"auto"``: Sweet KNN where its filters save
    nearly every distance (low dimension, Euclidean, a problem large enough for the GEMM to cost
    something; estimated on a sample of queries), the GEMM path otherwise.

    ``gated=True`` (the search itself) returns ``(method, (min_saved, level1_floor))``: with
    ``SWEET_AUTO_GATE`` on, where the estimate would decide, Sweet KNN, the savings it
    must reach and the level-1 fraction below which it gives up at once, for a run that estimates
    them itself (``gate`` of :func:`knnkit.exact.sweet.sweet_knn`); else ``(method, None)``."""
    if not isinstance(method, str):
        raise TypeError(f"method must be a string, got {type(method).__name__}")
    need = None
    if method == "auto":
        from ..exact.sweet import SWEET_AUTO_SAMPLE, level1_floor, sweet_pays, sweet_threshold

        l2_like = P.internal == "l2" or P.metric == "cosine"  # cosine: unit rows, squared L2
        QX = None if Q is None else Q.X
        sweet = False
        if allow_sweet and l2_like:
            threshold = sweet_threshold(P.X, QX, k, device=P.device)
            m = P.n if Q is None else Q.n
            if not isinstance(threshold, bool) and gated and SWEET_AUTO_GATE and m >= 4 * SWEET_AUTO_SAMPLE:
                # the run estimates (its own sample), unless a subset already says the filters
                # cannot save what is asked
                sweet = _subset_may_pay(P.X, QX, k, threshold, P.device, seed)
                if sweet is True:  # (not "sure": the subset already saves what is asked)
                    need = (threshold, level1_floor(P.X, P.device))
                sweet = bool(sweet)
            else:
                sweet = sweet_pays(P.X, QX, k, device=P.device, seed=seed)
        method = "sweet" if sweet else "gemm"
    m = REGISTRY.get("exact", method, device=P.device, metric=P.metric)
    return (m, need) if gated else m


def _engine_params(m, params, shortcuts, device):
    """The parameter object of method ``m`` from the user's ``params`` and GEMM ``shortcuts``."""
    cls = m.params_class()
    if cls is ExactParams:
        params = merge_params(cls, params, **(shortcuts or {}))
    else:
        given = [name for name, v in (shortcuts or {}).items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} apply to method='gemm', not {m.name!r}")
        params = merge_params(cls, params)
    if device == "cpu" and getattr(params, "precision", "exact") != "exact":
        raise ValueError(f"precision={params.precision!r} needs the GPU (tensor cores); the CPU path is always "
                         f"exact: use precision='exact' or device='gpu'")
    return params


def exact_search(P, Q, k, *, method="auto", params=None, shortcuts=None, random_state=None):
    """Exact k-NN of prepared queries ``Q`` (None: all points of ``P``, self excluded).
    Returns user-metric distances, int64 ids and the engine's statistics (device arrays)."""
    from .._core.prepare import device_scope
    from .._core.random import seed_from

    self_excluded = Q is None
    k = check_k(k, P.n, self_excluded=self_excluded)
    seed = seed_from(0 if random_state is None else random_state)
    # GEMM parameters given (precision, batch_size, ExactParams) are a request for the GEMM path
    gemm_asked = isinstance(params, ExactParams) or any(v is not None for v in (shortcuts or {}).values())
    m, need = choose_exact_method(method, P, Q, k, seed, allow_sweet=not gemm_asked, gated=True)
    with device_scope(P.device, P.device_id):
        X = P.X

        def run(m, gate=None):
            # cosine through normalisation: the prepared rows are unit vectors, where the squared
            # Euclidean distance 2 - 2cos ranks as cosine does and obeys the triangle inequality
            # Sweet KNN's bounds need; it goes back to the internal form -cos in _finish
            via_l2 = m.name == "sweet" and P.metric == "cosine"
            extra = {} if gate is None else {"gate": gate}
            d, i, stats = m.load_engine()(X, X if self_excluded else Q.X, k, metric="l2" if via_l2 else P.internal,
                                          exclude_self=self_excluded, params=_engine_params(m, params, shortcuts,
                                                                                            P.device),
                                          seed=seed, **extra)
            return d, i, stats, via_l2

        if need is None:
            d, i, stats, via_l2 = run(m)
        else:
            from ..exact.sweet import SWEET_AUTO_SAMPLE

            # Sweet KNN estimates its own savings after level 1 and gives way to the GEMM path below
            # them (no separate estimate: it repeated the clusters and level 1)
            d, i, stats, via_l2 = run(m, gate=(need[0], SWEET_AUTO_SAMPLE, need[1]))
            if d is None:
                gate = stats["gate"]
                d, i, stats, via_l2 = run(REGISTRY.get("exact", "gemm", device=P.device, metric=P.metric))
                stats["sweet_gate"] = gate  # why Sweet KNN gave way
        return _finish(P, Q, k, d, i, stats, via_l2)


def _finish(P, Q, k, d, i, stats, via_l2):
    """The engine's internal distances and ids as ``exact_search`` returns them (inside the
    device scope): cosine back from squared L2, rows closer than float32 resolves answered in
    float64, distances in the user's metric."""
    self_excluded = Q is None
    if via_l2:
        d = d * 0.5 - 1.0
    # neighbours closer than float32 resolves (values spanning more than ~1e19): found from
    # the result, answered again in float64 below (or refused); an empty check otherwise
    tiny = underflow_rows(d, i, P.raw, P.raw if self_excluded else Q.raw, P.internal, P.scale)
    warn_unresolved_cosine(d, i, P.raw, P.raw if self_excluded else Q.raw, P.metric, stacklevel=6)
    d = finalize_distances(d, P.metric, P.scale)
    if tiny.size:
        src = P.raw if self_excluded else Q.raw
        d, i = answer_in_float64(d, i, tiny, P.raw, src[get_array_module(src).asarray(tiny)], k, P.metric,
                                 n_queries=P.n if self_excluded else Q.n,
                                 absmax=max(P.absmax, 0.0 if self_excluded else Q.absmax),
                                 max_work=EXACT64_MAX_WORK, exclude=tiny if self_excluded else None, stacklevel=6)
        stats["float64_rows"] = int(tiny.size)
    # an exact search has no missing neighbours, and unscaled data (|x| <= 2^50) cannot overflow
    # float32 distances: only a scaled result can hold inf (checked there alone: a device sync)
    xp = get_array_module(d)
    if P.scale != 1.0 and not bool(xp.isfinite(d).all()):
        warnings.warn("some distances exceed the float32 range and are returned as inf; the neighbour "
                      "ids are exact (computed at a safe scale)", RuntimeWarning, stacklevel=4)
    return d, i, stats
