"""Seeded data sets of the robustness suite (issue 11): inputs that knnkit's own default
generator (:func:`knnkit.datasets.make_clustered`) does not produce and on which graph indexes are
known to fail -- tight well-separated clusters (more clusters than entry points), broad overlapping
clusters, a curved low-dimensional manifold, many exact duplicates, skewed norms for inner
products, 2-D points and SIFT-like uint8 vectors -- plus :func:`robustness_sets`, which lists the
suite at a given scale together with the real sets found on this machine.

Every generator is NumPy (CPU) only and deterministic for a given ``random_state``; the data rows
and the query rows come from different random streams, so the data for a seed does not depend on
``n_queries``. With ``n_queries=0`` a generator returns the data alone, otherwise
``(data, queries)``, as :func:`knnkit.datasets.make_clustered` does.

Examples
--------
>>> from knnkit.datasets.suite import make_tight_clusters
>>> data, queries = make_tight_clusters(2000, 16, 50, 0.01, n_queries=10, random_state=0)
>>> data.shape, queries.shape, data.dtype.name
((2000, 16), (10, 16), 'float32')
"""

import math
import numbers
import os

import numpy as np

from .._core.config import logger

__all__ = ["make_tight_clusters", "make_broad_clusters", "make_manifold", "make_duplicates",
           "make_skewed_norms", "make_sift_like_uint8", "make_2d", "make_uniform_cube", "robustness_sets",
           "SCALES"]

SCALES = ("ci", "small", "full")
_DATA, _QUERIES, _MODEL = 1, 2, 0


# ---------------------------------------------------------------------------------- validation
def _int(name, v, lo, hi=None):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be an integer {rng}, got {v!r}")
    return int(v)


def _pos_float(name, v, *, allow_zero=False):
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number, got {v!r}") from None
    if isinstance(v, bool) or not math.isfinite(f) or f < 0 or (f == 0 and not allow_zero):
        raise ValueError(f"{name} must be a finite number {'>=' if allow_zero else '>'} 0, got {v!r}")
    return f


def _streams(random_state):
    """Three independent generators (model, data, queries) from one seed."""
    if isinstance(random_state, np.random.Generator):
        random_state = int(random_state.integers(2 ** 63))
    if random_state is not None and not isinstance(random_state, numbers.Integral):
        raise TypeError(f"random_state must be None, an int or a numpy Generator, got {type(random_state).__name__}")
    root = np.random.SeedSequence(None if random_state is None else int(random_state))
    model, data, queries = root.spawn(3)
    return np.random.default_rng(model), np.random.default_rng(data), np.random.default_rng(queries)


def _out(data, queries, n_queries):
    return data if n_queries == 0 else (data, queries)


# ---------------------------------------------------------------------------------- generators
def make_tight_clusters(n, d, n_clusters, spread=0.01, *, n_queries=0, random_state=None):
    """Many tight, well-separated Gaussian clusters of roughly equal size.

    Centres are standard normal in ``d`` dimensions (typical centre distance ``sqrt(2 d)``); each
    point is its centre plus ``spread`` times a standard normal vector, so a cluster's radius is about
    ``spread * sqrt(d)``. With the default spread the clusters are far apart compared with their size
    and a k-NN graph splits into one component per cluster: the case where ``sqrt(n)`` k-means entry
    points leave clusters without an entry (issue 11).

    Parameters
    ----------
    n, d : int
        Number of points and dimension.
    n_clusters : int
        Number of clusters, ``1 <= n_clusters <= n``.
    spread : float
        Per-coordinate standard deviation inside a cluster (> 0, finite).
    n_queries : int
        Query rows drawn from the same mixture (0: return the data alone).
    random_state : int, numpy Generator or None

    Returns
    -------
    data : ndarray float32 (n, d)
    queries : ndarray float32 (n_queries, d)
        Only when ``n_queries > 0``.

    Examples
    --------
    >>> X = make_tight_clusters(1000, 8, 20, 0.01, random_state=0)
    >>> X.shape
    (1000, 8)
    """
    n, d = _int("n", n, 1), _int("d", d, 1)
    n_clusters = _int("n_clusters", n_clusters, 1, n)
    spread = _pos_float("spread", spread)
    n_queries = _int("n_queries", n_queries, 0)
    rm, rd, rq = _streams(random_state)
    centres = rm.standard_normal((n_clusters, d)).astype(np.float32)
    # every cluster gets n // n_clusters or one more point, in shuffled order
    lab = rd.permutation(np.arange(n) % n_clusters)
    data = centres[lab] + np.float32(spread) * rd.standard_normal((n, d), dtype=np.float32)
    ql = rq.integers(0, n_clusters, n_queries)
    queries = centres[ql] + np.float32(spread) * rq.standard_normal((n_queries, d), dtype=np.float32)
    return _out(data.astype(np.float32), queries.astype(np.float32), n_queries)


def make_broad_clusters(n, d, n_clusters=32, spread=1.0, *, n_queries=0, random_state=None):
    """Broad, overlapping Gaussian clusters of unequal sizes and widths.

    Centres are standard normal; cluster ``j`` has a per-coordinate deviation ``spread * s_j`` with
    ``s_j`` log-normal (sigma 0.5) and a Dirichlet-distributed share of the points, so the clusters
    overlap (``spread`` of 1 is as wide as the spread of the centres) and differ in density.

    Parameters
    ----------
    n, d : int
    n_clusters : int
        ``1 <= n_clusters <= n``.
    spread : float
        Typical per-coordinate deviation inside a cluster (> 0, finite).
    n_queries : int
    random_state : int, numpy Generator or None

    Returns
    -------
    data : ndarray float32 (n, d)
    queries : ndarray float32 (n_queries, d)
        Only when ``n_queries > 0``.

    Examples
    --------
    >>> make_broad_clusters(500, 4, random_state=1).shape
    (500, 4)
    """
    n, d = _int("n", n, 1), _int("d", d, 1)
    n_clusters = _int("n_clusters", n_clusters, 1, n)
    spread = _pos_float("spread", spread)
    n_queries = _int("n_queries", n_queries, 0)
    rm, rd, rq = _streams(random_state)
    centres = rm.standard_normal((n_clusters, d)).astype(np.float32)
    scale = (spread * rm.lognormal(0.0, 0.5, n_clusters)).astype(np.float32)
    w = rm.dirichlet(np.full(n_clusters, 2.0))

    def draw(rng, m):
        lab = rng.choice(n_clusters, m, p=w)
        return (centres[lab] + scale[lab, None] * rng.standard_normal((m, d), dtype=np.float32)).astype(np.float32)

    return _out(draw(rd, n), draw(rq, n_queries), n_queries)


def make_manifold(n, d=128, *, intrinsic=4, noise=1e-3, n_queries=0, random_state=None):
    """Points on a smooth curved ``intrinsic``-dimensional manifold embedded in ``d`` dimensions.

    A latent ``z`` uniform in ``[-1, 1]^intrinsic`` goes through a random two-layer map
    ``x = tanh(z A + b) B`` (hidden width 64, ``A`` with scale 3 so the map bends), then isotropic
    noise of deviation ``noise``. The local intrinsic dimension is ``intrinsic`` while the ambient one
    is ``d``: graph parameters chosen from the ambient dimension are wrong here.

    Parameters
    ----------
    n : int
    d : int
        Ambient dimension (>= intrinsic).
    intrinsic : int
        Latent dimension, ``1 <= intrinsic <= d``.
    noise : float
        Deviation of the ambient noise (>= 0, finite).
    n_queries : int
    random_state : int, numpy Generator or None

    Returns
    -------
    data : ndarray float32 (n, d)
    queries : ndarray float32 (n_queries, d)
        Only when ``n_queries > 0``.

    Examples
    --------
    >>> make_manifold(300, 32, intrinsic=2, random_state=0).shape
    (300, 32)
    """
    n, d = _int("n", n, 1), _int("d", d, 1)
    intrinsic = _int("intrinsic", intrinsic, 1, d)
    noise = _pos_float("noise", noise, allow_zero=True)
    n_queries = _int("n_queries", n_queries, 0)
    rm, rd, rq = _streams(random_state)
    h = 64
    A = (3.0 / np.sqrt(intrinsic)) * rm.standard_normal((intrinsic, h))
    b = rm.uniform(-1, 1, h)
    B = rm.standard_normal((h, d)) / np.sqrt(h)

    def draw(rng, m):
        z = rng.uniform(-1, 1, (m, intrinsic))
        x = np.tanh(z @ A + b) @ B
        if noise > 0:
            x += noise * rng.standard_normal((m, d))
        return x.astype(np.float32)

    return _out(draw(rd, n), draw(rq, n_queries), n_queries)


def make_duplicates(n, d, n_distinct, *, n_queries=0, random_state=None):
    """Data made of only ``n_distinct`` different rows, repeated with Zipf-like frequencies.

    Every distinct row (standard normal, clustered loosely in 16 groups) appears at least once and
    the rest of the ``n`` rows repeat them with weights ``1 / rank``, so some rows have thousands of
    exact copies (as in the UCI skin set: 245,057 rows, 51,433 distinct). Half of the queries are
    exact copies of distinct rows, half are distinct rows plus small noise.

    Parameters
    ----------
    n, d : int
    n_distinct : int
        Number of different rows, ``1 <= n_distinct <= n``.
    n_queries : int
    random_state : int, numpy Generator or None

    Returns
    -------
    data : ndarray float32 (n, d)
    queries : ndarray float32 (n_queries, d)
        Only when ``n_queries > 0``.

    Examples
    --------
    >>> X = make_duplicates(1000, 3, 100, random_state=0)
    >>> len(set(map(tuple, X.tolist())))
    100
    """
    n, d = _int("n", n, 1), _int("d", d, 1)
    n_distinct = _int("n_distinct", n_distinct, 1, n)
    n_queries = _int("n_queries", n_queries, 0)
    rm, rd, rq = _streams(random_state)
    groups = rm.standard_normal((16, d)) * 3
    base = (groups[rm.integers(0, 16, n_distinct)] + rm.standard_normal((n_distinct, d))).astype(np.float32)
    base = np.unique(base, axis=0)  # continuous draws: no collisions in practice, but guarantee it
    while base.shape[0] < n_distinct:  # pragma: no cover - measure-zero event
        extra = rm.standard_normal((n_distinct - base.shape[0], d)).astype(np.float32)
        base = np.unique(np.concatenate([base, extra]), axis=0)
    base = base[rm.permutation(n_distinct)]
    w = 1.0 / np.arange(1, n_distinct + 1)
    rows = np.concatenate([np.arange(n_distinct), rd.choice(n_distinct, n - n_distinct, p=w / w.sum())])
    data = base[rd.permutation(rows)]
    qrows = rq.integers(0, n_distinct, n_queries)
    queries = base[qrows].copy()
    jitter = rq.random(n_queries) < 0.5
    queries[jitter] += 0.05 * rq.standard_normal((int(jitter.sum()), d)).astype(np.float32)
    return _out(np.ascontiguousarray(data, np.float32), queries.astype(np.float32), n_queries)


def make_skewed_norms(n, d, *, norm_sigma=1.0, n_clusters=32, n_queries=0, random_state=None):
    """Vectors for inner-product search whose norms vary over orders of magnitude.

    Directions come from ``n_clusters`` loose directional clusters on the unit sphere; each row is
    scaled by a log-normal norm (``sigma = norm_sigma``), so a few long vectors are the top inner
    products of most queries (hubs), as with recommender and some embedding models. Queries are unit
    directions from the same clusters.

    Parameters
    ----------
    n, d : int
    norm_sigma : float
        Log-normal sigma of the norms (> 0, finite).
    n_clusters : int
        ``1 <= n_clusters <= n``.
    n_queries : int
    random_state : int, numpy Generator or None

    Returns
    -------
    data : ndarray float32 (n, d)
    queries : ndarray float32 (n_queries, d)
        Only when ``n_queries > 0``.

    Examples
    --------
    >>> X = make_skewed_norms(2000, 16, random_state=0)
    >>> bool(np.linalg.norm(X, axis=1).max() > 10 * np.median(np.linalg.norm(X, axis=1)))
    True
    """
    n, d = _int("n", n, 1), _int("d", d, 1)
    norm_sigma = _pos_float("norm_sigma", norm_sigma)
    n_clusters = _int("n_clusters", n_clusters, 1, n)
    n_queries = _int("n_queries", n_queries, 0)
    rm, rd, rq = _streams(random_state)
    cen = rm.standard_normal((n_clusters, d))
    cen /= np.linalg.norm(cen, axis=1, keepdims=True)

    def directions(rng, m):
        x = cen[rng.integers(0, n_clusters, m)] + (0.7 / np.sqrt(d)) * rng.standard_normal((m, d))
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    data = directions(rd, n) * rd.lognormal(0.0, norm_sigma, n)[:, None]
    return _out(data.astype(np.float32), directions(rq, n_queries).astype(np.float32), n_queries)


def make_sift_like_uint8(n, d=128, *, n_clusters=256, n_queries=0, random_state=None):
    """Non-negative, sparse, heavy-tailed uint8 vectors resembling SIFT descriptors.

    Each row is a gamma-distributed cluster profile (many near-zero bins, a few large ones) times
    gamma noise, scaled to a mean around 25 and rounded into ``[0, 255]``, so there are many ties and
    exact zeros, as in SIFT1M.

    Parameters
    ----------
    n : int
    d : int
    n_clusters : int
        Number of profiles, ``1 <= n_clusters <= n``.
    n_queries : int
    random_state : int, numpy Generator or None

    Returns
    -------
    data : ndarray uint8 (n, d)
    queries : ndarray uint8 (n_queries, d)
        Only when ``n_queries > 0``.

    Examples
    --------
    >>> X = make_sift_like_uint8(500, random_state=0)
    >>> X.dtype.name, X.shape
    ('uint8', (500, 128))
    """
    n, d = _int("n", n, 1), _int("d", d, 1)
    n_clusters = _int("n_clusters", n_clusters, 1, n)
    n_queries = _int("n_queries", n_queries, 0)
    rm, rd, rq = _streams(random_state)
    prof = rm.gamma(0.5, 1.0, (n_clusters, d))

    def draw(rng, m):
        x = prof[rng.integers(0, n_clusters, m)] * rng.gamma(2.0, 0.5, (m, d)) * 25.0
        return np.clip(np.rint(x), 0, 255).astype(np.uint8)

    return _out(draw(rd, n), draw(rq, n_queries), n_queries)


def make_2d(n, *, n_queries=0, random_state=None):
    """2-D points: a uniform background, Gaussian blobs of several widths and a noisy ring.

    Very low dimension is its own failure mode for graph indexes (long thin paths, many equidistant
    candidates pruned away).

    Parameters
    ----------
    n : int
    n_queries : int
    random_state : int, numpy Generator or None

    Returns
    -------
    data : ndarray float32 (n, 2)
    queries : ndarray float32 (n_queries, 2)
        Only when ``n_queries > 0``.

    Examples
    --------
    >>> make_2d(100, random_state=0).shape
    (100, 2)
    """
    n = _int("n", n, 1)
    n_queries = _int("n_queries", n_queries, 0)
    rm, rd, rq = _streams(random_state)
    cen = rm.uniform(-10, 10, (20, 2))
    wid = rm.lognormal(-1.0, 1.0, 20)

    def draw(rng, m):
        kind = rng.choice(3, m, p=[0.2, 0.6, 0.2])
        out = rng.uniform(-10, 10, (m, 2))
        b = kind == 1
        lab = rng.integers(0, 20, int(b.sum()))
        out[b] = cen[lab] + wid[lab, None] * rng.standard_normal((int(b.sum()), 2))
        r = kind == 2
        t = rng.uniform(0, 2 * np.pi, int(r.sum()))
        out[r] = np.stack([6 * np.cos(t), 6 * np.sin(t)], 1) + 0.05 * rng.standard_normal((int(r.sum()), 2))
        return out.astype(np.float32)

    return _out(draw(rd, n), draw(rq, n_queries), n_queries)


def make_uniform_cube(n, d, *, n_queries=0, random_state=None):
    """Uniform random points in ``[0, 1]^d`` (the worst case for graphs at large ``d``).

    Parameters
    ----------
    n, d : int
    n_queries : int
    random_state : int, numpy Generator or None

    Returns
    -------
    data : ndarray float32 (n, d)
    queries : ndarray float32 (n_queries, d)
        Only when ``n_queries > 0``.

    Examples
    --------
    >>> make_uniform_cube(10, 3, random_state=0).shape
    (10, 3)
    """
    n, d = _int("n", n, 1), _int("d", d, 1)
    n_queries = _int("n_queries", n_queries, 0)
    _, rd, rq = _streams(random_state)
    return _out(rd.random((n, d), dtype=np.float32), rq.random((n_queries, d), dtype=np.float32), n_queries)


# ---------------------------------------------------------------------------------- the suite
# (name, generator, {scale: kwargs}, metric); a scale missing from the dict skips the set there.
def _spec():
    tc = make_tight_clusters
    return [
        ("uniform_d32", make_uniform_cube, {"ci": dict(n=3000, d=32), "small": dict(n=100_000, d=32),
                                            "full": dict(n=1_000_000, d=32)}, "sqeuclidean"),
        ("uniform_d128", make_uniform_cube, {"ci": dict(n=3000, d=128), "small": dict(n=100_000, d=128),
                                             "full": dict(n=1_000_000, d=128)}, "sqeuclidean"),
        ("uniform_d960", make_uniform_cube, {"ci": dict(n=2000, d=960), "small": dict(n=50_000, d=960),
                                             "full": dict(n=200_000, d=960)}, "sqeuclidean"),
        # ci: clusters of 80 points (more than the index's candidate degree, so the candidate graph
        # cannot link clusters) and more clusters than sqrt(n) entry points (100 > 89, 125 > 100)
        ("tight_c1000", tc, {"ci": dict(n=8000, d=64, n_clusters=100, spread=0.01),
                             "small": dict(n=100_000, d=64, n_clusters=1000, spread=0.01),
                             "full": dict(n=1_000_000, d=128, n_clusters=1000, spread=0.01)}, "sqeuclidean"),
        ("tight_c10000", tc, {"ci": dict(n=10_000, d=32, n_clusters=125, spread=0.01),
                              "small": dict(n=100_000, d=64, n_clusters=10_000, spread=0.01),
                              "full": dict(n=1_000_000, d=128, n_clusters=10_000, spread=0.01)}, "sqeuclidean"),
        ("broad_clusters", make_broad_clusters, {"ci": dict(n=4000, d=64), "small": dict(n=100_000, d=64),
                                                 "full": dict(n=1_000_000, d=96)}, "sqeuclidean"),
        # the "hard" 1M x 128 shape of the acceptance numbers (GPU, full scale only)
        ("broad_d128", make_broad_clusters, {"full": dict(n=1_000_000, d=128)}, "sqeuclidean"),
        ("duplicates", make_duplicates, {"ci": dict(n=5000, d=3, n_distinct=1000),
                                         "small": dict(n=245_057, d=3, n_distinct=51_433),
                                         "full": dict(n=1_000_000, d=3, n_distinct=200_000)}, "sqeuclidean"),
        ("manifold", make_manifold, {"ci": dict(n=4000, d=128, intrinsic=4),
                                     "small": dict(n=100_000, d=128, intrinsic=4),
                                     "full": dict(n=1_000_000, d=128, intrinsic=6)}, "sqeuclidean"),
        ("skewed_norms_ip", make_skewed_norms, {"ci": dict(n=4000, d=64), "small": dict(n=100_000, d=64),
                                                "full": dict(n=1_000_000, d=96)}, "inner_product"),
        ("points_2d", make_2d, {"ci": dict(n=4000), "small": dict(n=100_000), "full": dict(n=1_000_000)},
         "sqeuclidean"),
        ("sift_like_u8", make_sift_like_uint8, {"ci": dict(n=4000), "small": dict(n=100_000),
                                                "full": dict(n=1_000_000)}, "sqeuclidean"),
    ]


_N_QUERIES = {"ci": 200, "small": 1000, "full": 1000}
_REAL_ROWS = {"ci": 6000, "small": None, "full": None}  # ci takes a seeded subset of a real set


def _find_skin():
    """Path of skin_rgb_u8.npy: $KNNKIT_DATA/skin/, then ../shared/data/skin/ relative to the
    current directory (where the benchmarks run), or None."""
    cands = []
    env = os.environ.get("KNNKIT_DATA")
    if env:
        cands += [os.path.join(env, "skin", "skin_rgb_u8.npy"), os.path.join(env, "skin_rgb_u8.npy")]
    cands.append(os.path.join(os.getcwd(), "..", "shared", "data", "skin", "skin_rgb_u8.npy"))
    cands.append(os.path.join(os.getcwd(), ".data", "skin", "skin_rgb_u8.npy"))
    return next((c for c in cands if os.path.isfile(c)), None)


def _holdout(X, nq, rows, rng):
    """Seeded held-out queries (and an optional row subset) from a real set."""
    perm = rng.permutation(X.shape[0])
    q = X[perm[:nq]]
    base = perm[nq:] if rows is None else perm[nq:nq + rows]
    return np.ascontiguousarray(X[np.sort(base)]), np.ascontiguousarray(q)


def _real_sets(scale, nq, random_state):
    from .real import load_fashion_mnist, load_siftsmall

    rng = np.random.default_rng(random_state)
    rows = _REAL_ROWS[scale]
    out = []
    try:
        base, queries, _gt = load_siftsmall()
        if rows is not None:
            base = base[:rows]
        out.append(("siftsmall", np.ascontiguousarray(base, np.float32), np.ascontiguousarray(queries, np.float32),
                    "sqeuclidean"))
    except (FileNotFoundError, OSError) as e:
        logger.info("robustness_sets: siftsmall skipped (%s)", str(e).split(";")[0])
    path = _find_skin()
    if path is None:
        logger.info("robustness_sets: skin skipped (skin_rgb_u8.npy not in $KNNKIT_DATA/skin or ../shared/data/skin)")
    else:
        X = np.load(path)
        b, q = _holdout(X, nq, rows, rng)
        out.append(("skin_u8", b, q, "sqeuclidean"))
    try:
        train, test = load_fashion_mnist()
        if rows is not None:
            train = train[np.sort(rng.choice(train.shape[0], rows, replace=False))]
        out.append(("fashion_mnist_u8", np.ascontiguousarray(train), np.ascontiguousarray(test[:nq]), "sqeuclidean"))
    except (FileNotFoundError, OSError) as e:
        logger.info("robustness_sets: fashion-mnist skipped (%s)", str(e).split(";")[0])
    return out


def robustness_sets(scale="ci", *, names=None, real=True, n_queries=None, random_state=0):
    """The data sets of the robustness suite at one scale.

    Parameters
    ----------
    scale : {"ci", "small", "full"}
        ``"ci"``: a few thousand points per set (CPU tests, seconds); ``"small"``: about 100k (the
        tight clusters then have more clusters than ``sqrt(n)`` entry points); ``"full"``: about 1M
        where that makes sense (GPU).
    names : iterable of str, optional
        Only these sets (unknown names raise ValueError).
    real : bool
        Include the real sets (siftsmall, skin, Fashion-MNIST) that are found; each missing one is
        skipped with a log message. At ``"ci"`` scale the real sets are cut to a seeded 6000-row subset.
    n_queries : int, optional
        Queries per set (default 200 at ``"ci"``, 1000 otherwise; siftsmall keeps its own 100).
    random_state : int
        Seed of every generator (each set uses its own stream derived from it).

    Returns
    -------
    list of (name, data, queries, metric)
        numpy arrays; ``metric`` is a knnkit metric name.

    Examples
    --------
    >>> sets = robustness_sets("ci", names=["points_2d"], real=False)
    >>> [(s[0], s[1].shape, s[3]) for s in sets]
    [('points_2d', (4000, 2), 'sqeuclidean')]
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    nq = _N_QUERIES[scale] if n_queries is None else _int("n_queries", n_queries, 1)
    spec = _spec()
    real_names = ("siftsmall", "skin_u8", "fashion_mnist_u8")
    if names is not None:
        names = list(names)
        known = {s[0] for s in spec} | set(real_names)
        bad = [x for x in names if x not in known]
        if bad:
            raise ValueError(f"names: unknown set(s) {bad}; known: {sorted(known)}")
    out = []
    for i, (name, gen, by_scale, metric) in enumerate(spec):
        if (names is not None and name not in names) or scale not in by_scale:
            continue
        seed = None if random_state is None else int(random_state) * 1000 + i
        data, queries = gen(**by_scale[scale], n_queries=nq, random_state=seed)
        out.append((name, data, queries, metric))
    if real and (names is None or any(x in real_names for x in names)):
        for item in _real_sets(scale, nq, random_state):
            if names is None or item[0] in names:
                out.append(item)
    return out
