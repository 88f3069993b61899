"""Property fuzzing of the public API on the CPU: every call either raises a clear ValueError /
TypeError, or returns a correct result. ``knnkit.knn`` is checked against a float64 numpy reference
(ties allowed, see ``_check_knn``); ``knn_graph(method="brute")`` and ``GraphIndex`` are checked for
the exception type and the shape and range of what they return.

Examples are derandomized so that CI is reproducible; set ``KNNKIT_FUZZ_RANDOM=1`` to explore."""

import os
import warnings

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import knnkit  # noqa: E402

FUZZ = settings(deadline=None, database=None, derandomize=not os.environ.get("KNNKIT_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
METRICS = ["sqeuclidean", "euclidean", "inner_product", "cosine"]
BAD_METRICS = ["manhattan", "l2", "", "COSINE", None, 3]
DTYPES = [np.float32, np.float16, np.uint8, np.int8, np.float64]
F32_MAX = float(np.finfo(np.float32).max)


# ----------------------------------------------------------------------------- data

@st.composite
def matrices(draw, n, d, dtype, exp=None):
    """(n, d) arrays of ``dtype``: random values at a random magnitude (``10**exp`` when given),
    often with duplicate rows and small integers (ties)."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["normal", "small_ints", "constant", "far_cluster"]))
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = (0, 4) if kind == "small_ints" else (info.min, info.max)
        X = rng.integers(lo, hi + 1, size=(n, d)).astype(dtype)
    else:
        if exp is not None:
            pass
        elif dtype == np.float16:
            exp = draw(st.integers(-3, 3))       # float16 holds 6e-5 .. 65504
        else:
            exp = draw(st.integers(-30, 30))     # the float32 range, tiny to huge
        if kind == "small_ints":
            X = rng.integers(-2, 3, size=(n, d)) * 10.0 ** exp
        elif kind == "far_cluster":
            # a tight cluster far from the origin: float32 |x|^2 - 2 x.q + |q|^2 cancels
            far = 10.0 ** draw(st.integers(1, 2 if dtype == np.float16 else 4))
            X = (rng.normal(size=(1, d)) * far + rng.normal(size=(n, d))) * 10.0 ** min(exp, 30 - 4)
        else:
            X = rng.normal(size=(n, d)) * 10.0 ** exp
        X = X.astype(dtype)
    if kind == "constant":
        X[:] = X[0]
    elif n > 2 and draw(st.booleans()):  # some exact duplicates
        m = draw(st.integers(1, n - 1))
        X[rng.integers(0, n, m)] = X[rng.integers(0, n, m)]
    return X


def _ref_distances(X, Q, metric):
    """float64 distances (smaller = nearer; inner product negated) of the data as knnkit sees it
    (float64 input is converted to float32, so the reference uses those values)."""
    X = X.astype(np.float32).astype(np.float64)
    Q = Q.astype(np.float32).astype(np.float64)
    if metric in ("sqeuclidean", "euclidean"):
        D = ((Q[:, None, :] - X[None, :, :]) ** 2).sum(-1)  # no cancellation, unlike the GEMM form
        return D, np.sqrt(D) if metric == "euclidean" else D
    if metric == "inner_product":
        ip = Q @ X.T
        return -ip, ip
    nx = np.linalg.norm(X, axis=1)
    nq = np.linalg.norm(Q, axis=1)
    # a zero vector has no direction: knnkit treats its cosine with anything as 0 (distance 1)
    Xn = np.where(nx[:, None] > 0, X / np.where(nx > 0, nx, 1)[:, None], 0)
    Qn = np.where(nq[:, None] > 0, Q / np.where(nq > 0, nq, 1)[:, None], 0)
    c = 1.0 - Qn @ Xn.T
    return c, c


def _scale(X, Q, metric):
    """Absolute tolerance of a float32 computation on this data, in the ranking units of
    ``_ref_distances`` (squared for the Euclidean metrics)."""
    X = X.astype(np.float32).astype(np.float64)
    Q = Q.astype(np.float32).astype(np.float64)
    mx = float((X * X).sum(1).max()) if X.size else 0.0
    mq = float((Q * Q).sum(1).max()) if Q.size else 0.0
    if metric in ("sqeuclidean", "euclidean"):
        # relative to the spread of the data, not to its norms: the distances are translation
        # invariant, and a tolerance in |x|^2 would hide the cancellation of a far-away cluster
        D = ((Q[:, None, :] - X[None, :, :]) ** 2).sum(-1)
        return 1e-5 * float(D.max())
    if metric == "inner_product":
        return 1e-5 * np.sqrt(mx * mq)
    return 1e-5


def _check_knn(X, Q, k, metric, self_excluded, D, I, caught):
    n = X.shape[0]
    m = Q.shape[0]
    D = np.asarray(D)
    I = np.asarray(I)
    assert I.dtype == np.int64 and D.dtype == np.float32
    assert I.shape == (m, k) and D.shape == (m, k)
    assert ((I >= 0) & (I < n)).all(), "ids out of range (or -1 padding) although n >= k"
    if self_excluded:
        assert (I != np.arange(n)[:, None]).all(), "a point is its own neighbour"
    for row in I:
        assert len(set(row.tolist())) == k, "an id repeated in a row"
    rank, user = _ref_distances(X, Q, metric)
    if self_excluded:
        np.fill_diagonal(rank, np.inf)
    atol = _scale(X, Q, metric)
    best = np.sort(rank, axis=1)[:, :k]
    got_rank = np.take_along_axis(rank, I, axis=1)
    # the returned ids are the k nearest: each one's reference distance equals the reference's
    # k smallest at its position, within float32 rounding (ties may come in any order)
    tol = 1e-4 * np.abs(best) + atol
    bad = np.abs(got_rank - best) > tol
    assert not bad.any(), f"wrong neighbours: ref {best[bad][:4]} got {got_rank[bad][:4]} (tol {atol:.3g})"
    # the returned distances are the float32 values of the reference's (inf above float32's range)
    ref_user = np.take_along_axis(user, I, axis=1)
    ref32 = ref_user.astype(np.float32)
    overflow = ~np.isfinite(ref32)
    assert (np.isinf(D) == overflow).all(), "inf distances do not match the float32 overflow"
    if overflow.any():
        assert any("float32 range" in str(w.message) for w in caught), "overflow to inf not reported"
    f = ~overflow
    user_atol = np.sqrt(atol) if metric == "euclidean" else atol
    err = np.abs(D[f].astype(np.float64) - ref_user[f])
    assert (err <= 1e-4 * np.abs(ref_user[f]) + user_atol + 1e-37).all(), \
        f"distances off: {D[f][err.argmax()]} vs {ref_user[f][err.argmax()]}"
    # rows sorted (similarities descending)
    step = np.diff(D.astype(np.float64), axis=1)
    if metric == "inner_product":
        assert (step[np.isfinite(step)] <= 0).all()
    else:
        assert (step[np.isfinite(step)] >= 0).all()
    # exact methods: among exact duplicates of a returned point, the smaller index goes first
    Xh = X.astype(np.float32)
    for r in range(m):
        chosen = set(I[r].tolist())
        for j in I[r]:
            same = np.flatnonzero((Xh == Xh[j]).all(1))
            for s in same[same < j]:
                if self_excluded and s == r:
                    continue
                assert s in chosen, f"row {r}: id {j} returned but its duplicate {s} (smaller) not"


# ----------------------------------------------------------------------------- knn

K_BAD = [0, -1, 2.5, True, None, "3", float("nan")]


@settings(FUZZ, max_examples=150)
@given(data=st.data())
def test_fuzz_knn(data):
    n = data.draw(st.integers(1, 60), label="n")
    d = data.draw(st.integers(1, 9), label="d")
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    metric = data.draw(st.sampled_from(METRICS + BAD_METRICS if data.draw(st.integers(0, 7)) == 0 else METRICS),
                       label="metric")
    X = data.draw(matrices(n, d, dtype), label="X")
    self_excluded = data.draw(st.booleans(), label="self_excluded")
    if self_excluded:
        Q = X
    else:
        m = data.draw(st.integers(1, 8), label="m")
        how = data.draw(st.sampled_from(["separate", "rows", "near_rows"]), label="queries")
        if how == "separate":
            # queries at the data's magnitude: see test_knn_queries_of_another_magnitude
            top = float(np.abs(X.astype(np.float64)).max())
            exp = int(np.clip(round(np.log10(top)), -30, 30)) if top > 0 else 0
            Q = data.draw(matrices(m, d, dtype, exp=exp), label="Q")
        else:
            Q = X[np.arange(m) % n].copy()
            if how == "near_rows" and np.dtype(dtype).kind == "f":
                Xf = X.astype(np.float64)
                spread = float(Xf.std(0).max()) if n > 1 else 1.0
                jitter = np.random.default_rng(m).normal(size=Q.shape) * 0.1 * spread
                Q = (Q.astype(np.float64) + jitter).astype(dtype)
    limit = n - 1 if self_excluded else n
    k = data.draw(st.one_of(st.integers(1, max(1, limit)), st.sampled_from(K_BAD + [limit + 1, 3.0])),
                  label="k")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            D, I = knnkit.knn(X, None if self_excluded else Q, k=k, metric=metric, device="cpu")
        except (ValueError, TypeError) as e:
            assert str(e), "an error without a message"
            # an integral float (3.0) may be refused or accepted; a real integer in range must work
            valid_k = isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= limit
            assert not (valid_k and metric in METRICS), f"valid call refused: {e}"
            return
    assert metric in METRICS, f"metric {metric!r} accepted"
    assert not isinstance(k, bool) and float(k).is_integer() and 1 <= k <= limit, f"k={k!r} accepted"
    _check_knn(X, Q, int(k), metric, self_excluded, D, I, caught)


# data and queries share one power-of-two scale chosen from both (api/exact.py)
@pytest.mark.parametrize("x,q", [(1.2573022e-18, 1.2571701e21),   # -1 id for k=1 <= n
                                 (1.2573022e-17, 1257.3022),      # inf for a distance of 1.6e6
                                 (0.12573022, 1.2571701e20)])     # inf (right) but not reported
def test_knn_queries_of_another_magnitude(x, q):
    X = np.array([[x]], np.float32)
    Q = np.array([[q]], np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        D, I = knnkit.knn(X, Q, k=1, metric="sqeuclidean", device="cpu")
    _check_knn(X, Q, 1, "sqeuclidean", False, D, I, caught)


# ----------------------------------------------------------------------------- knn_graph / GraphIndex

ODD = st.one_of(st.none(), st.integers(-3, 70), st.floats(-2, 3),
                st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e300]),
                st.booleans(), st.sampled_from(["", "2", "auto", "brute", "nndescent"]))
OK_ERRORS = (ValueError, TypeError)


def _points(draw, n, d):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    X = rng.normal(size=(n, d)).astype(np.float32)
    if draw(st.booleans()):
        X[: n // 2] = X[0]
    return X


@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_fuzz_knn_graph_brute_parameters(data):
    n = data.draw(st.integers(2, 40), label="n")
    X = _points(data.draw, n, data.draw(st.integers(1, 6), label="d"))
    k = data.draw(st.one_of(st.integers(1, n - 1), ODD), label="k")
    kw = {}
    for name in ("include_self", "random_state", "metric"):
        if data.draw(st.booleans()):
            kw[name] = data.draw(ODD if name != "metric" else st.sampled_from(METRICS + BAD_METRICS), label=name)
    try:
        g = knnkit.knn_graph(X, k=k, method="brute", device="cpu", **kw)
    except OK_ERRORS as e:
        assert str(e)
        return
    I = np.asarray(g.indices)
    kk = I.shape[1]
    assert I.shape[0] == n and 1 <= kk <= n
    assert ((I >= 0) & (I < n)).all()
    assert np.isfinite(np.asarray(g.distances)).all()


@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_fuzz_graph_index_parameters(data):
    n = data.draw(st.integers(2, 40), label="n")
    d = data.draw(st.integers(1, 6), label="d")
    X = _points(data.draw, n, d)
    build = {}
    for name in ("graph_degree", "intermediate_degree", "alpha", "n_entry", "beam", "tau", "max_iters",
                 "n_seeds", "random_state", "build_algo", "diversify", "connectivity"):
        if data.draw(st.integers(0, 3)) == 0:
            build[name] = data.draw(ODD, label=name)
    try:
        ix = knnkit.GraphIndex.build(X, device="cpu", **build)
    except OK_ERRORS as e:
        assert str(e)
        return
    search = {}
    for name in ("beam", "tau", "max_iters", "n_seeds", "batch_size"):
        if data.draw(st.integers(0, 2)) == 0:
            search[name] = data.draw(ODD, label=name)
    k = data.draw(st.one_of(st.integers(1, n), ODD), label="k")
    try:
        D, I = ix.search(X[: min(n, 5)], k=k, **search)
    except OK_ERRORS as e:
        assert str(e)
        return
    I = np.asarray(I)
    assert I.dtype == np.int64 and I.shape == (min(n, 5), int(k))
    assert ((I >= 0) & (I < n)).all(), "-1 or out-of-range ids from a search with k <= n"


# ----------------------------------------------------------------------------- findings of the adversarial pass

def _index(X, **kw):
    return knnkit.GraphIndex.build(X, device="cpu", random_state=0, **kw)


@pytest.mark.parametrize("data_scale,query_scale", [(1.0, 1e20),    # recall 0, every distance inf
                                                    (1e-30, 1.0),   # inf for distances of ~1
                                                    (1e20, 1e20)])  # inf (right) but not reported
def test_index_search_queries_beyond_the_index_scale(data_scale, query_scale):
    # the index stores its vectors at the data's power-of-two scale; queries that overflow float32
    # there are answered exactly (knnkit.knn's result), and inf distances are reported
    rng = np.random.default_rng(0)
    X = rng.standard_normal((100, 4))
    data = (X * data_scale).astype(np.float32)
    Q = (X[:5] * query_scale).astype(np.float32)
    ix = _index(data)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        D, I = ix.search(Q, k=3)
    _check_knn(data, Q, 3, "sqeuclidean", False, D, I, caught)


def test_index_extend_refuses_what_the_index_cannot_hold():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((100, 4)).astype(np.float32)
    ix = _index(X.astype(np.float16))
    with pytest.raises(ValueError, match="float16"):  # was stored as inf
        ix.extend(X[:3] * 1e5)
    ix = _index(X)
    with pytest.raises(ValueError, match="new_data has values up to"):  # was NaN in the graph build
        ix.extend(X[:3] * np.float32(1e30))
    assert ix.n == 100
    D, I = ix.search(X[:3], k=3)
    assert np.isfinite(D).all() and (I[:, 0] == np.arange(3)).all()


def test_index_delete_every_point():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 4)).astype(np.float32)
    ix = _index(X)
    with pytest.raises(ValueError, match="every point"):
        ix.delete(np.arange(60), compact=True)
    assert ix.n_deleted == 0  # refused before anything was marked
    ix.delete(np.arange(59))
    ix.delete([59])  # raised from the automatic compaction, after marking
    assert ix.n_deleted == 60
    with pytest.raises(ValueError, match="every point"):
        ix.search(X[:2], k=1)
    ix.extend(X[:3] + 0.5)
    D, I = ix.search(X[:3] + 0.5, k=1)
    assert (I[:, 0] == np.arange(60, 63)).all()


def test_graph_recall_of_a_graph_with_self():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 5)).astype(np.float32)
    g = knnkit.knn_graph(X, k=6, method="brute", device="cpu", include_self=True)
    assert knnkit.evaluate.graph_recall(X, g, device="cpu") == 1.0  # was 5/6: self counted as a miss
    assert knnkit.evaluate.graph_recall(X, g, device="cpu", ties=True) == 1.0


@pytest.mark.parametrize("kw,err", [(dict(k=2.5), TypeError), (dict(k=True), TypeError), (dict(k="3"), TypeError),
                                    (dict(eps=float("nan")), ValueError), (dict(eps=-0.5), ValueError),
                                    (dict(similarity="no"), TypeError), (dict(average="no"), TypeError)])
def test_recall_parameters(kw, err):
    I = np.arange(12).reshape(3, 4)
    D = np.ones((3, 4), np.float32)
    with pytest.raises(err):  # k=2.5 was recall@2, eps=nan gave recall 0, "no" was True
        knnkit.evaluate.recall(I, I, found_distances=D, true_distances=D, **kw)


@pytest.mark.parametrize("kw,err", [(dict(k=2.5), TypeError), (dict(sample=2.5), TypeError),
                                    (dict(sample=True), TypeError), (dict(eps=float("nan"), ties=True), ValueError),
                                    (dict(ties="yes"), TypeError)])
def test_graph_recall_parameters(kw, err):
    X = np.random.default_rng(0).standard_normal((50, 3)).astype(np.float32)
    g = knnkit.knn_graph(X, k=4, method="brute", device="cpu")
    with pytest.raises(err):
        knnkit.evaluate.graph_recall(X, g, device="cpu", **kw)


@pytest.mark.parametrize("dtype", [">f8", ">f4"])
def test_big_endian_input(dtype):
    X = np.random.default_rng(0).standard_normal((40, 3))
    D, I = knnkit.knn(X.astype(dtype), X[:4].astype(dtype), k=3, device="cpu")  # >f8 was refused
    D0, I0 = knnkit.knn(X.astype(np.float32), X[:4].astype(np.float32), k=3, device="cpu")
    assert np.array_equal(I, I0) and np.array_equal(D, D0)


@pytest.mark.parametrize("kw,err", [(dict(shard_size=150.5), TypeError), (dict(memory_budget=-1), ValueError),
                                    (dict(return_graph="yes"), ValueError), (dict(verbose="no"), TypeError)])
def test_out_of_core_parameters(tmp_path, kw, err):
    path = str(tmp_path / "x.fbin")
    knnkit.io.write(path, np.random.default_rng(0).standard_normal((300, 4)).astype(np.float32))
    with pytest.raises(err):  # 150.5 was 150 points, -1 and "yes" were accepted
        knnkit.knn_graph_out_of_core(path, k=5, workdir=str(tmp_path / "w"), device="cpu", random_state=0, **kw)


def test_sklearn_values_beyond_float32():
    pytest.importorskip("sklearn")
    from knnkit.sklearn import NearestNeighbors

    X = np.random.default_rng(0).standard_normal((30, 3))
    with pytest.raises(ValueError, match="float32 range"):  # was "data contains NaN or Inf values"
        NearestNeighbors(n_neighbors=2, device="cpu").fit(X * 1e300).kneighbors(X[:2])
    nn = NearestNeighbors(n_neighbors=2, device="cpu").fit(X)
    with pytest.raises(ValueError, match="float32 range"):
        nn.kneighbors(X[:2] * 1e300)


@pytest.mark.parametrize("scale", [1e-39, 1e-44, 1e-300])
def test_float64_values_below_float32_normal_range_refused(scale):
    # converted to float32 they become subnormals or zeros: 1e-44 x Gaussian rows returned 10 % of
    # the ids wrong against float64 with no warning
    X = np.random.default_rng(0).standard_normal((300, 4))
    with pytest.raises(ValueError, match="below float32's normal range"):
        knnkit.knn(X * scale, X[:3] * scale, k=5, device="cpu")
    # the same values as float32 input are exact and searched at a power-of-two scale; float64 data
    # whose largest value is normal may hold tiny ones (they round as float32 does), and all zeros
    # lose nothing
    Xs = (X * 1e-39).astype(np.float32)
    assert knnkit.knn(Xs, Xs[:3], k=5, device="cpu")[1].shape == (3, 5)
    Xm = X.copy()
    Xm[:, 0] = 1.0
    Xm[:, 1:] *= 1e-45
    knnkit.knn(Xm, Xm[:3], k=5, device="cpu")
    knnkit.knn(np.zeros((10, 3)), np.zeros((2, 3)), k=2, device="cpu")


def test_more_points_than_int32_ids_refused_before_any_copy():
    """Graphs, indexes and the GPU kernels hold point ids as int32: 2**31 rows are refused at the
    entry point, naming the limit, before anything is copied (the broadcast view below would be
    an 8 GiB copy); the exact CPU search (int64 ids) is not held to it."""
    from knnkit._core.prepare import MAX_POINTS, prepare

    X = np.broadcast_to(np.zeros((1, 1), np.float32), (MAX_POINTS + 1, 1))
    with pytest.raises(ValueError, match=r"int32 ids.*2\*\*31 - 2"):
        knnkit.knn_graph(X, k=5, device="cpu")
    with pytest.raises(ValueError, match="int32 ids"):
        knnkit.GraphIndex.build(X, device="cpu")
    with pytest.raises(ValueError, match="int32 ids"):
        prepare(X, device="cpu")
    small = np.broadcast_to(np.zeros((1, 2), np.float32), (100, 2))
    assert prepare(small, device="cpu").raw.shape == (100, 2)


# --- neighbours closer than float32 resolves (knnkit._core.underflow) --------------------------

def _truth64(X, Q, k, exclude_self):
    X64, Q64 = X.astype(np.float64), Q.astype(np.float64)
    D = ((Q64[:, None, :] - X64[None, :, :]) ** 2).sum(-1)
    if exclude_self:
        np.fill_diagonal(D, np.inf)
    return np.argsort(D, axis=1, kind="stable")[:, :k]


def _wide_range_sets(rng):
    tiny = (rng.random((600, 6)) * 1e-25).astype(np.float32)
    tiny[0] = 1.0  # sets no scale (max 1): the tiny rows' squared distances underflow float32
    outlier = rng.random((600, 6)).astype(np.float32)
    outlier[0] = 1e25  # sets the scale (max -> ~1): the other rows become ~1e-25
    return {"tiny": tiny, "outlier": outlier}


@pytest.mark.parametrize("method", ["gemm", "sweet"])
def test_knn_neighbours_below_float32_resolution_are_exact(rng, method):
    """Values spanning more than ~1e19: float32 distances underflow to 0 and the ids came out in index
    order (recall ~0.39) without a word; those rows are now answered in float64, with a warning."""
    for name, X in _wide_range_sets(rng).items():
        with pytest.warns(RuntimeWarning, match="closer than float32 resolves"):
            _, i = knnkit.knn(X, k=5, device="cpu", method=method)
        truth = _truth64(X, X, 5, True)
        assert (i[1:] == truth[1:]).all(), name  # row 0 (1.0 or 1e25) ties everything in float64 too
        with pytest.warns(RuntimeWarning, match="closer than float32 resolves"):
            _, i = knnkit.knn(X, X[1:40], k=5, device="cpu", method=method)
        assert (i == _truth64(X, X[1:40], 5, False)).all(), name


def test_knn_graph_and_index_below_float32_resolution(rng):
    X = _wide_range_sets(rng)["tiny"]
    truth = _truth64(X, X, 5, True)
    for method in ("brute", "nndescent"):
        with pytest.warns(RuntimeWarning, match="closer than float32 resolves"):
            g = knnkit.knn_graph(X, k=5, device="cpu", method=method, random_state=0)
        assert (g.indices[1:] == truth[1:]).all(), method
        assert g.stats["float64_rows"] >= len(X) - 1
    index = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
    Q = (rng.random((30, 6)) * 1e-25).astype(np.float32)
    with pytest.warns(RuntimeWarning, match="closer than float32 resolves"):
        _, i = index.search(Q, k=5)
    assert (i == _truth64(X, Q, 5, False)).all()


def test_below_float32_resolution_refused_when_too_many_rows(rng, monkeypatch):
    import knnkit.api._graphops as graphops
    import knnkit.api.exact as exact

    monkeypatch.setattr(exact, "EXACT64_MAX_WORK", 1e3)
    monkeypatch.setattr(graphops, "EXACT64_MAX_WORK", 1e3)
    X = _wide_range_sets(rng)["tiny"]
    with pytest.raises(ValueError, match="range too wide for float32"):
        knnkit.knn(X, k=5, device="cpu", method="gemm")
    with pytest.raises(ValueError, match="range too wide for float32"):
        knnkit.knn_graph(X, k=5, device="cpu", method="brute")


def test_duplicates_and_ordinary_data_are_not_float64_rows(rng):
    """True duplicates (distance 0, equal rows) and ordinary data never take the float64 path."""
    import warnings

    X = rng.random((400, 5)).astype(np.float32)
    X[10:20] = X[10]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        knnkit.knn(X, k=12, device="cpu")
        g = knnkit.knn_graph(X, k=12, device="cpu", random_state=0)
    assert "float64_rows" not in g.stats


def test_many_copies_proved_by_one_pass(rng, monkeypatch):
    """Data with many exact copies (every row's neighbours at distance 0) is cleared by one pass
    over the rows (the smallest non-zero magnitude at the search's scale) instead of comparing
    every zero-distance pair; with the tiny rows of a wide-range set among the copies the pass
    cannot clear it and the pairs are compared as before (float64 rows, with the warning)."""
    import warnings

    from knnkit._core import underflow

    calls = []
    real = underflow._resolvable
    monkeypatch.setattr(underflow, "_resolvable", lambda A, s: calls.append(s) or real(A, s))
    base = (rng.random((60, 4)) * 3).astype(np.float32)
    X = base[rng.integers(0, 60, 3000)]  # ~50 copies of each row, float32 (not integer keys)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d, i = knnkit.knn(X, k=30, device="cpu")
    assert calls  # the one-pass proof ran
    assert (np.asarray(d)[:, :20] == 0).all()
    tiny = _wide_range_sets(rng)["tiny"]
    Y = np.concatenate([tiny[rng.integers(0, len(tiny), 2000)], tiny])
    calls.clear()
    with pytest.warns(RuntimeWarning, match="closer than float32 resolves"):
        knnkit.knn(Y, k=5, device="cpu", method="gemm")
    assert calls and not real(Y, 1.0)


@pytest.mark.gpu
def test_gpu_exact_search_refuses_more_points_than_int32_ids():
    """The exact CPU search keeps int64 ids, the GPU's top-k kernels int32 column ids: 2**31 - 1 GPU
    rows (8 GiB) are refused by name, not searched with wrapped ids."""
    if not knnkit.gpu_available():
        pytest.skip("needs an NVIDIA GPU and CuPy")
    import cupy as cp

    from knnkit._core.prepare import MAX_POINTS

    X = cp.zeros((MAX_POINTS + 1, 1), cp.float32)
    try:
        with pytest.raises(ValueError, match="GPU kernels index points with int32 ids"):
            knnkit.knn(X, X[:2], k=1)
    finally:
        del X
        cp.get_default_memory_pool().free_all_blocks()


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["gemm", "sweet"])
def test_below_float32_resolution_on_the_gpu(rng, method):
    """The GPU paths' results go through the same check (written without a GPU session: the first
    GPU run of this test is the check that GPU distances of distinct rows are never 0 where the
    rows' true distance is ordinary, i.e. no false float64 rows)."""
    import cupy as cp

    for name, X in _wide_range_sets(rng).items():
        with pytest.warns(RuntimeWarning, match="closer than float32 resolves"):
            _, i = knnkit.knn(cp.asarray(X), k=5, device="gpu", method=method)
        assert (cp.asnumpy(i)[1:] == _truth64(X, X, 5, True)[1:]).all(), name
    X = _wide_range_sets(rng)["tiny"]
    with pytest.warns(RuntimeWarning, match="closer than float32 resolves"):
        g = knnkit.knn_graph(X, k=5, device="gpu", random_state=0)
    assert (cp.asnumpy(g.indices)[1:] == _truth64(X, X, 5, True)[1:]).all()
    import warnings

    Y = rng.random((20000, 32)).astype(np.float32)
    Y[100:200] = Y[100] + np.float32(1e-3) * rng.random((100, 32)).astype(np.float32)  # near-duplicates
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*closer than float32 resolves")
        knnkit.knn(Y, k=10, device="gpu")
        g = knnkit.knn_graph(Y, k=10, device="gpu", random_state=0)
        knnkit.GraphIndex.build(Y, device="gpu", random_state=0).search(Y[:500], k=10)
    assert "float64_rows" not in g.stats
