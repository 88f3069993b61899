import sys; sys.path.insert(0, "tests")
import numpy as np, knnkit
from test_edge_sweep import SETS, _distances, N, K
A, metric = SETS["cosine_shared_direction"]
X, Q = A[:N], A[N:]
D = _distances(X, Q, metric)
order = np.argsort(D, axis=1)
for meth in ("auto", "gemm"):
    d, i = knnkit.knn(X, Q, k=K, metric=metric, device="gpu", method=meth)
    i = i.get() if hasattr(i, "get") else i; d = d.get() if hasattr(d, "get") else d
    dc, ic = knnkit.knn(X, Q, k=K, metric=metric, device="cpu", method=meth)
    for r in range(len(Q)):
        if set(i[r]) != set(order[r, :K]):
            print(meth, "row", r, "gpu", i[r].tolist(), "\n  true", order[r, :K+2].tolist(),
                  "\n  D64", D[r, order[r, :K+2]].tolist(), "\n  gpu d", d[r].tolist(), "\n cpu", ic[r].tolist(), dc[r].tolist())
