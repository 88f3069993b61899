"""k-NN graph construction engines: NN-Descent (``nndescent/``: GNND on the GPU, Numba on the
CPU), the exact graph (``_brute.py``), GGM merge (``_merge.py``), inner-product hub refinement
(``_hubs.py``) and the out-of-core build (``_out_of_core.py``).

Paper: Wang, Zhao & Zeng, "Large-Scale Approximate k-NN Graph Construction on GPU" (GNND
section 4, GGM and out-of-memory construction section 5).

:func:`build_lists` is the one entry the facades (and the out-of-core build, and the index
build) use: it picks the method through the registry and runs its engine on prepared arrays.
"""

import time

from .._core.backend import device_of
from .._core.registry import REGISTRY

__all__ = ["build_lists", "choose_method", "BRUTE_AUTO_MAX_N", "GRAPH_METRICS"]

GRAPH_METRICS = ("sqeuclidean", "euclidean", "inner_product", "cosine", "manhattan")

#: ``method="auto"`` uses the exact brute-force graph up to this many points (it is then both
#: exact and about as fast as NN-Descent); NN-Descent above.
BRUTE_AUTO_MAX_N = {"cpu": 20_000, "gpu": 100_000}


def choose_method(method, n, device, metric):
    """The registered graph method for ``method`` (``"auto"``: by size and device)."""
    if method == "auto":
        method = "brute" if n <= BRUTE_AUTO_MAX_N[device] else "nndescent"
    return REGISTRY.get("graph", method, device=device, metric=metric)


def default_params(method):
    """A default parameter object of a registered graph method."""
    return method.params_class()()


def build_lists(X, k, *, metric, method, params=None, seed=0, **engine_kw):
    """k-NN lists of prepared ``X`` (self excluded) by a registered graph method.

    Parameters
    ----------
    X : array (n, d)
        Prepared float32 data (numpy: CPU, cupy: GPU).
    k : int
        Neighbours per point, ``1 <= k <= n - 1``.
    metric : str
        USER metric (parameter objects resolve their defaults from it).
    method : Method
        From :func:`choose_method`.
    params : Params, optional
        The method's parameter object (default: its defaults); resolved here when it has a
        ``resolve`` method.

    Returns
    -------
    I, D, stats : ids (n, k), internal distances (n, k), dict of statistics.
    """
    from .._core.metrics import internal_metric

    device = device_of(X)
    n = int(X.shape[0])
    params = params if params is not None else default_params(method)
    if hasattr(params, "resolve"):
        params = params.resolve(k=k, n=n, device=device, metric=metric)
    t0 = time.perf_counter()
    I, D, st = method.load_engine()(X, k, metric=internal_metric(metric), params=params, seed=seed, **engine_kw)
    stats = {"method": method.name, "device": device}
    stats.update(st)
    stats.setdefault("phase_s", {})
    stats["phase_s"].setdefault(method.name if method.name == "brute" else "engine", time.perf_counter() - t0)
    if method.name == "brute":
        stats.update(iterations=0, updates=[], time_s=[])
    return I, D, stats
