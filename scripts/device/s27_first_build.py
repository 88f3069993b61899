"""Which CuPy / knnkit kernels compile, and what takes the time, in the first 1M tight_c1000 index
build after the robustness suite's warm-up (twenty-seventh session: 5.7-6.4 s first, ~2.6 s warm).

Patches CuPy's compile entry points to log every compilation with its duration, runs the suite's
warm-up sequence, then builds tight_c1000 (1M x 128) three times with the phase timings."""
import time

import cupy as cp
import numpy as np

import knnkit
from knnkit.datasets.suite import make_tight_clusters, robustness_sets

log = []
import cupy.cuda.compiler as _cc  # noqa: E402

_depth = [0]
for fn_name in [n for n in dir(_cc) if "compile" in n and callable(getattr(_cc, n))]:
    orig = getattr(_cc, fn_name)

    def wrapped(*a, _orig=orig, _n=fn_name, **k):
        _depth[0] += 1
        t = time.perf_counter()
        try:
            return _orig(*a, **k)
        finally:
            _depth[0] -= 1
            if _depth[0] == 0:  # outermost call only
                import re
                names = re.findall(r"__global__\s+void\s+(\w+)", str(a[0]))
                import traceback
                site = [f"{fr.filename.split('knnkit/')[-1]}:{fr.lineno}" for fr in traceback.extract_stack()
                        if "/knnkit/" in fr.filename][-2:]
                log.append((_n, time.perf_counter() - t,
                            " ".join(names)[:200] + " @ " + " <- ".join(reversed(site))))
    setattr(_cc, fn_name, wrapped)

(name, X, Q, metric), = robustness_sets("full", names=["tight_c1000"], real=False)
K = 10
Xw = cp.asarray(X[:150_000])
knnkit.knn_graph(Xw, k=K, metric=metric, device="gpu", random_state=0)
index = knnkit.GraphIndex.build(Xw, metric=metric, device="gpu", random_state=0)
for beam in (16, 256, 2048):
    index.search(Xw[:100], k=K, beam=beam)
for n_warm, n_clusters in ((200_000, 2000), (20_000, 400)):
    Xt = make_tight_clusters(n_warm, X.shape[1], n_clusters, random_state=0)
    knnkit.GraphIndex.build(cp.asarray(Xt.astype(np.float32)), metric=metric, device="gpu", random_state=0)
print("warm-up compiles:", len(log), "total", round(sum(t for _, t, _ in log), 2), "s", flush=True)
log.clear()
Xd = cp.asarray(X)
g = knnkit.knn_graph(Xd, k=K, metric=metric, device="gpu", random_state=0)
print("knn_graph compiles:", len(log), round(sum(t for _, t, _ in log), 2), flush=True)
for rep in range(3):
    log.clear()
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    idx = knnkit.GraphIndex.build(Xd, metric=metric, device="gpu", random_state=0)
    cp.cuda.Device().synchronize()
    dt = time.perf_counter() - t
    print(f"build {rep}: {dt:.2f} s", {k: round(v, 3) for k, v in idx.build_timings.items()},
          "components", idx.build_params["connectivity"]["components_before"], flush=True)
    print(f"  compiles during build {rep}: {len(log)}, {sum(t for _, t, _ in log):.2f} s")
    import traceback  # noqa: F401
    for n_, t_, src in sorted(log, key=lambda r: -r[1])[:12]:
        print(f"   {t_:.3f} s {n_} {src}")
    print("  pool used/total GB", round(cp.get_default_memory_pool().used_bytes() / 1e9, 2),
          round(cp.get_default_memory_pool().total_bytes() / 1e9, 2))
