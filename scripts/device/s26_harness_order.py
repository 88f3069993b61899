"""tight_c1000 1M x 128: GraphIndex.build after the robustness harness's own calls (knn_graph and its
recall on the GPU), and alone after it, with the build's phases (twenty-sixth session)."""
import time
import cupy as cp
import knnkit
from knnkit.datasets.suite import make_tight_clusters
from knnkit.evaluate import graph_recall

X = cp.asarray(make_tight_clusters(1_000_000, 128, 1000, 0.01, random_state=0))
Xw = make_tight_clusters(20_000, 128, 400, random_state=1)
knnkit.GraphIndex.build(cp.asarray(Xw), metric="sqeuclidean", device="gpu", random_state=0)  # compile


def build(tag):
    cp.cuda.Device().synchronize(); t = time.perf_counter()
    idx = knnkit.GraphIndex.build(X, metric="sqeuclidean", device="gpu", random_state=0)
    cp.cuda.Device().synchronize()
    print(tag, round(time.perf_counter() - t, 3), {k: round(v, 3) for k, v in idx.build_timings.items()}, flush=True)


for rep in range(2):
    g = knnkit.knn_graph(X, k=10, metric="sqeuclidean", device="gpu", random_state=0)
    r = graph_recall(X, g, sample=1000, metric="sqeuclidean", random_state=0, device="gpu", ties=True)
    pool = cp.get_default_memory_pool()
    print("graph", round(float(r), 4), "pool used/total GB", round(pool.used_bytes() / 1e9, 2), round(pool.total_bytes() / 1e9, 2))
    build(f"after graph {rep}")
    del g
    build(f"alone {rep}")
