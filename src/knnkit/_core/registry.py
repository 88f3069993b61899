"""The method registry: one table of the algorithms behind ``knn(method=...)`` and
``knn_graph(method=...)``.

Each entry declares what it can do (devices, metrics, dtypes) and names its engine function and
parameter class by import path, so the table costs no import until a method is used. The table
itself is in :mod:`knnkit.api.methods` (one line per method); this module holds the mechanism.

Engine contracts (arrays already validated, on their device, metric transform applied):

* task ``"exact"``: ``engine(X, Q, k, *, metric, exclude_self, params, seed) -> (dist, idx, stats)``
  with ``X``/``Q`` prepared float32 (numpy for the CPU, cupy for the GPU; ``Q is X`` when
  ``exclude_self``), ``metric`` internal (``"l2"`` squared Euclidean or ``"ip"`` negative inner
  product), ``dist`` float32 (m, k) internal and ``idx`` int64 (m, k), sorted by (dist, idx).
* task ``"graph"``: ``engine(X, k, *, metric, params, seed, device) -> (idx, dist, stats)`` with
  ``idx`` (n, k) self excluded, ``dist`` internal, rows sorted.
"""

import dataclasses
import importlib

__all__ = ["Method", "Registry"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Method:
    name: str
    task: str
    engine: str
    params: str
    devices: tuple = ("cpu", "gpu")
    metrics: tuple = ("sqeuclidean", "euclidean", "inner_product", "cosine")
    dtypes: tuple = ("float32", "float16", "uint8", "int8")
    exact: bool = False
    summary: str = ""

    def load_engine(self):
        return _load(self.engine)

    def params_class(self):
        return _load(self.params)

    def supports(self, *, device=None, metric=None):
        return (device is None or device in self.devices) and (metric is None or metric in self.metrics)


def _load(path):
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


class Registry:
    """Methods by (task, name), in registration order."""

    def __init__(self, methods=()):
        self._table = {}
        for m in methods:
            self.register(m)

    def register(self, method):
        key = (method.task, method.name)
        if key in self._table:
            raise ValueError(f"method {method.name!r} is registered twice for task {method.task!r}")
        self._table[key] = method

    def list(self, task=None):
        return [m for m in self._table.values() if task is None or m.task == task]

    def get(self, task, name, *, device=None, metric=None):
        """The method ``name`` of ``task``; ``ValueError`` naming the ones that exist when it is
        unknown or cannot serve ``device``/``metric``."""
        m = self._table.get((task, name))
        names = [x.name for x in self.list(task)]
        if m is None:
            raise ValueError(f"unknown method {name!r} for {task}; available: {', '.join(names)} (or 'auto')")
        if device is not None and device not in m.devices:
            raise ValueError(f"method {name!r} does not run on the {device} (it runs on: {', '.join(m.devices)})")
        if metric is not None and metric not in m.metrics:
            ok = [x.name for x in self.list(task) if metric in x.metrics]
            raise ValueError(f"method {name!r} does not support metric {metric!r} "
                             f"(it supports {', '.join(m.metrics)}; methods for {metric!r}: {', '.join(ok)})")
        return m


_ALL_METRICS = ("sqeuclidean", "euclidean", "inner_product", "cosine")

#: THE table: one line per method. A new algorithm package adds its line here (engine and
#: parameter class by import path, imported at first use).
REGISTRY = Registry([
    Method(name="gemm", task="exact", engine="knnkit.exact:knn_lists", params="knnkit.exact:ExactParams",
           exact=True, summary="GEMM + k-selection (cuBLAS + topk.cu on the GPU, BLAS + Numba on the CPU)"),
    Method(name="sweet", task="exact", engine="knnkit.exact.sweet:sweet_knn", params="knnkit.exact.sweet:SweetParams",
           metrics=("sqeuclidean", "euclidean", "cosine"), exact=True,
           summary="exact k-NN join with triangle-inequality filtering (Sweet KNN), for low dimensions"),
    Method(name="nndescent", task="graph", engine="knnkit.graph.nndescent:nndescent_graph",
           params="knnkit.graph.nndescent:NNDescentParams", metrics=_ALL_METRICS + ("manhattan",),
           summary="NN-Descent (GNND on the GPU, Numba on the CPU)"),
    Method(name="brute", task="graph", engine="knnkit.graph._brute:brute_graph", params="knnkit.exact:ExactParams",
           metrics=_ALL_METRICS + ("manhattan",), exact=True,
           summary="exact k-NN graph by the GEMM path (manhattan by a CPU loop)"),
    Method(name="rsfk", task="graph", engine="knnkit.graph.rsfk._engine:rsfk_graph", params="knnkit.graph.rsfk:RSFKParams",
           metrics=_ALL_METRICS, summary="random-sample forest + nearest-neighbour exploration (RSFK / w-KNNG)"),
])
