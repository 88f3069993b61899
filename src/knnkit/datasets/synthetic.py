"""Seeded synthetic vector sets, generated in chunks on the CPU (NumPy, threads) or the GPU (CuPy).

Every chunk of rows draws from its own random stream derived from ``random_state`` and the
chunk's number, so the output depends only on the seed and the shape, never on the thread count.
The data rows and the query rows use different streams: the data for a seed is the same whether or
not queries are asked for.
"""

import concurrent.futures
import os

import numpy as np

from .._core.backend import resolve_device, cupy_or_none
from .._core.config import progress
from .._core.params import check_float, check_int

__all__ = ["make_clustered", "make_uniform"]

_CPU_CHUNK = 1 << 15       # rows per CPU task: small enough to stay in cache-friendly temporaries
_GPU_CHUNK = 1 << 20       # most rows per GPU step (fewer for large d, see _generate)
_STREAM_MODEL, _STREAM_DATA, _STREAM_QUERIES = 0, 1, 2
_OUT_DTYPES = (np.float32, np.float16, np.uint8, np.int8)


def _root_seed(random_state):
    """A SeedSequence from None, an int, a SeedSequence or a numpy Generator/RandomState."""
    if isinstance(random_state, np.random.SeedSequence):
        return random_state
    if isinstance(random_state, np.random.Generator):
        return np.random.SeedSequence(int(random_state.integers(2 ** 63)))
    if isinstance(random_state, np.random.RandomState):
        return np.random.SeedSequence(int(random_state.randint(2 ** 31)))
    if random_state is None or isinstance(random_state, (int, np.integer)):
        return np.random.SeedSequence(None if random_state is None else int(random_state))
    raise TypeError(f"random_state must be None, an int, a SeedSequence or a numpy Generator, "
                    f"got {type(random_state).__name__}")


def _child(root, *key):
    return np.random.SeedSequence(root.entropy, spawn_key=tuple(root.spawn_key) + key)


def _check_sizes(n, d, n_queries, dtype):
    for name, v, lo in (("n", n, 1), ("d", d, 1), ("n_queries", n_queries, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be float32, float16, uint8 or int8, got {dtype!r}") from None
    if dtype.type not in _OUT_DTYPES:
        raise TypeError(f"dtype must be float32, float16, uint8 or int8, got {dtype}")
    return dtype


def _generate(n_rows, d, dtype, chunk_fn, root, stream, device):
    """Fill an (n_rows, d) array chunk by chunk; ``chunk_fn(xp, rand, m)`` makes m rows."""
    kind, dev_id = resolve_device(device)
    if kind == "gpu":
        cp = cupy_or_none()
        ctx = cp.cuda.Device(dev_id) if dev_id is not None else cp.cuda.Device()
        with ctx:
            out = cp.empty((n_rows, d), dtype)
            # rows per step: a power of two with each float32 (rows, d) temporary under 256 MiB (about
            # four live at once). It depends on d only, never on free memory, so the output depends on
            # the seed and the shape alone.
            rows = _GPU_CHUNK
            while rows > 4096 and rows * 4 * (d + 16) > (256 << 20):
                rows //= 2
            for c, s in enumerate(range(0, n_rows, rows)):
                m = min(rows, n_rows - s)
                seed = int(_child(root, stream, c).generate_state(1, np.uint64)[0] >> np.uint64(1))  # 63 bits
                out[s:s + m] = chunk_fn(cp, _CupyRandom(cp, seed), m)
            return out
    out = np.empty((n_rows, d), dtype)

    def task(c):
        s = c * _CPU_CHUNK
        m = min(_CPU_CHUNK, n_rows - s)
        out[s:s + m] = chunk_fn(np, np.random.default_rng(_child(root, stream, c)), m)

    n_chunks = -(-n_rows // _CPU_CHUNK)
    workers = min(n_chunks, os.cpu_count() or 1)
    with progress(total=n_rows, desc="generating", unit="rows") as bar:
        if workers <= 1:
            for c in range(n_chunks):
                task(c)
                bar.update(min(_CPU_CHUNK, n_rows - c * _CPU_CHUNK))
        else:
            # numpy's random fills and BLAS release the GIL, so threads scale
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                for c, _ in enumerate(pool.map(task, range(n_chunks))):
                    bar.update(min(_CPU_CHUNK, n_rows - c * _CPU_CHUNK))
    return out


class _CupyRandom:
    """The two draws the generators need, on the GPU (cuRAND through CuPy)."""

    def __init__(self, cp, seed):
        # Philox: cheap to seed (XORWOW, cuRAND's default, runs a setup kernel per generator)
        try:
            from cupy.cuda import curand

            self._rs = cp.random.RandomState(seed, method=curand.CURAND_RNG_PSEUDO_PHILOX4_32_10)
        except (ImportError, AttributeError, TypeError):
            self._rs = cp.random.RandomState(seed)

    def standard_normal(self, size, dtype=np.float32):
        return self._rs.standard_normal(size, dtype=dtype)

    def random(self, size, dtype=np.float32):
        return self._rs.random_sample(size, dtype=dtype)


def _quantize(x, xp, dtype, bound):
    """float32 values in about [-bound, bound] -> dtype (float types are cast, integer types scaled)."""
    if dtype.kind == "f":
        return x.astype(dtype, copy=False)
    if dtype == np.uint8:
        y = x * np.float32(127.5 / bound) + np.float32(127.5)
        return xp.clip(xp.rint(y), 0, 255).astype(dtype)
    y = x * np.float32(127.0 / bound)
    return xp.clip(xp.rint(y), -127, 127).astype(dtype)


def _split(make, n, n_queries):
    data = make(n, _STREAM_DATA)
    if n_queries == 0:
        return data
    return data, make(n_queries, _STREAM_QUERIES)


def make_clustered(n, d, *, n_queries=0, n_clusters=64, latent_dim=None, cluster_std=0.3, noise=0.05,
                   dtype=np.float32, random_state=None, device="auto"):
    """Clustered vectors on a low-dimensional subspace plus isotropic noise.

    A model of descriptors and embeddings: their neighbourhoods live near a manifold of low intrinsic
    dimension. Points are drawn as:

    1. ``n_clusters`` centres ~ N(0, I) in a ``latent_dim``-dimensional latent space, with mixture
       weights and per-cluster spreads each varying by a factor up to 3 between clusters (so densities
       differ, as in real data);
    2. a latent point = a centre (chosen by weight) + N(0, (cluster_std * spread)^2 I);
    3. embedded linearly in ``d`` dimensions by a random matrix with orthonormal rows
       (distances between latent points are preserved);
    4. plus N(0, noise^2) independently in every one of the ``d`` dimensions.

    Parameters
    ----------
    n, d : int
        Number and dimension of the data vectors.
    n_queries : int
        When > 0, also return that many query vectors drawn independently from the same
        distribution (fresh draws, not rows of the data).
    n_clusters : int
        Number of mixture components (default 64).
    latent_dim : int, optional
        Intrinsic dimension of the subspace, at most ``d``; default ``min(d, 16)``. Larger values
        make nearest neighbour search harder.
    cluster_std : float
        Standard deviation within a cluster, per latent coordinate, relative to the unit spread of
        the centres (default 0.3).
    noise : float
        Standard deviation of the isotropic noise in every ambient dimension (default 0.05).
    dtype : {float32, float16, uint8, int8}
        Output type. Integer types are scaled into their range (uint8 centred on 127.5, int8 on 0)
        with a fixed scale derived from the model, then rounded and clipped.
    random_state : None, int, numpy.random.Generator or SeedSequence
        Seed. The same seed gives the same arrays on the same kind of device (the CPU and GPU
        random streams differ).
    device : {"auto", "cpu", "gpu"} or int
        Where to generate; the result is a numpy array on the CPU, a cupy array on the GPU.

    Returns
    -------
    data : (n, d) array
    queries : (n_queries, d) array
        Only when ``n_queries > 0``.

    Examples
    --------
    >>> from knnkit.datasets import make_clustered
    >>> x, q = make_clustered(1000, 32, n_queries=10, random_state=0, device="cpu")
    >>> x.shape, q.shape, x.dtype.name
    ((1000, 32), (10, 32), 'float32')
    """
    dtype = _check_sizes(n, d, n_queries, dtype)
    # NaN passes "< 0" tests and int() truncates 2.5: the checks name the parameter and refuse both
    latent_dim = min(d, 16) if latent_dim is None else check_int(latent_dim, "latent_dim", minimum=1)
    if latent_dim > d:
        raise ValueError(f"latent_dim must be in [1, d={d}], got {latent_dim}")
    n_clusters = check_int(n_clusters, "n_clusters", minimum=1)
    cluster_std = check_float(cluster_std, "cluster_std", minimum=0.0)
    noise = check_float(noise, "noise", minimum=0.0)
    root = _root_seed(random_state)

    # the model is small: always drawn on the host with numpy, identical for both devices
    g = np.random.default_rng(_child(root, _STREAM_MODEL))
    centres = g.standard_normal((n_clusters, latent_dim))
    weights = g.uniform(0.5, 1.5, n_clusters)
    cum = np.cumsum(weights / weights.sum()).astype(np.float32)
    spread = (cluster_std * g.uniform(0.5, 1.5, n_clusters)).astype(np.float32)
    q, r = np.linalg.qr(g.standard_normal((d, latent_dim)))
    basis = (q * np.sign(np.diag(r))).T.astype(np.float32)            # (latent_dim, d), orthonormal rows
    embedded = (centres @ basis).astype(np.float32)                   # centres in the ambient space
    # integer outputs: scale so that 5 standard deviations of a coordinate fill the range (clipping
    # is then rare); a coordinate's variance is that of the centres plus the average in-cluster share
    # (latent_dim/d of the spread, the basis rows being orthonormal) plus the noise
    std = np.sqrt((embedded.astype(np.float64) ** 2).mean() + (spread.astype(np.float64) ** 2).mean()
                  * latent_dim / d + noise ** 2)
    bound = float(5.0 * std + 1e-12)

    def chunk(xp, rand, m):
        to = (lambda a: a) if xp is np else xp.asarray
        labels = xp.minimum(xp.searchsorted(to(cum), rand.random(m, dtype=np.float32)), n_clusters - 1)
        z = rand.standard_normal((m, latent_dim), dtype=np.float32)
        z *= to(spread)[labels][:, None]
        x = z @ to(basis)
        x += to(embedded)[labels]
        if noise > 0:
            x += np.float32(noise) * rand.standard_normal((m, d), dtype=np.float32)
        return _quantize(x, xp, dtype, bound)

    return _split(lambda rows, stream: _generate(rows, d, dtype, chunk, root, stream, device), n, n_queries)


def make_uniform(n, d, *, n_queries=0, low=None, high=None, dtype=np.float32, random_state=None, device="auto"):
    """Vectors uniform in the box ``[low, high)^d`` (the hardest case for nearest neighbour search).

    Parameters
    ----------
    n, d : int
        Number and dimension of the data vectors.
    n_queries : int
        When > 0, also return that many query vectors, independent draws from the same box.
    low, high : float, optional
        Bounds; default [0, 1) for float types and the whole range of an integer ``dtype``
        (inclusive).
    dtype : {float32, float16, uint8, int8}
    random_state : None, int, numpy.random.Generator or SeedSequence
    device : {"auto", "cpu", "gpu"} or int

    Returns
    -------
    data : (n, d) array
    queries : (n_queries, d) array
        Only when ``n_queries > 0``.

    Examples
    --------
    >>> from knnkit.datasets import make_uniform
    >>> x = make_uniform(5, 3, dtype="uint8", random_state=1, device="cpu")
    >>> x.shape, x.dtype.name
    ((5, 3), 'uint8')
    """
    dtype = _check_sizes(n, d, n_queries, dtype)
    root = _root_seed(random_state)
    if dtype.kind == "f":
        lo = 0.0 if low is None else check_float(low, "low")
        hi = 1.0 if high is None else check_float(high, "high")
        if not hi > lo:
            raise ValueError(f"high must exceed low, got [{lo}, {hi})")
        # the box must be representable in float32 (the draws) and in the output type
        top = float(np.finfo(dtype).max) if dtype.itemsize < 4 else float(np.finfo(np.float32).max)
        if max(abs(lo), abs(hi)) > top or not np.isfinite(np.float32(hi) - np.float32(lo)):
            raise ValueError(f"low and high must lie within +-{top:.4g} for {dtype.name} output, got [{lo}, {hi})")

        def chunk(xp, rand, m):
            u = rand.random((m, d), dtype=np.float32)
            return (u * np.float32(hi - lo) + np.float32(lo)).astype(dtype, copy=False)
    else:
        info = np.iinfo(dtype)
        lo = info.min if low is None else check_int(low, "low")
        hi = info.max if high is None else check_int(high, "high")
        if not info.min <= lo <= hi <= info.max:
            raise ValueError(f"[{lo}, {hi}] is not a range inside {dtype.name}")

        def chunk(xp, rand, m):
            u = rand.random((m, d), dtype=np.float32)
            v = xp.floor(u * np.float32(hi - lo + 1)) + np.float32(lo)
            return xp.clip(v, lo, hi).astype(dtype)

    return _split(lambda rows, stream: _generate(rows, d, dtype, chunk, root, stream, device), n, n_queries)
