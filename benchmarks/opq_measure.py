import numpy as np, time, sys
sys.path.insert(0, "/work/main/src")
from knnkit.index.bang._pq import train_pq, encode, reconstruct, pq_tables, pad_dim
from knnkit.datasets.suite import robustness_sets
from knnkit.exact._cpu import knn_cpu

def opq_train(S, m, iters=6, seed=0):
    d = S.shape[1]; dsub, dp = pad_dim(d, m)
    Sp = np.zeros((S.shape[0], dp), np.float32); Sp[:, :d] = S
    R = np.eye(dp, dtype=np.float32)
    for it in range(iters):
        Y = Sp @ R
        cb = train_pq(Y, m, random_state=seed, iters=4)
        Yh = reconstruct(encode(Y, cb), cb, dp)
        U, _, Vt = np.linalg.svd(Sp.T.astype(np.float64) @ Yh.astype(np.float64))
        R = (U @ Vt).astype(np.float32)
    cb = train_pq(Sp @ R, m, random_state=seed)
    return R, cb

def evaluate(X, Q, m, R=None, cb=None):
    d = X.shape[1]; dsub, dp = pad_dim(d, m)
    def rot(A):
        if R is None: return A
        Ap = np.zeros((A.shape[0], dp), np.float32); Ap[:, :d] = A; return Ap @ R
    codes = encode(rot(X), cb)
    T = pq_tables(rot(Q), cb, "l2")  # (nq, m, ksub)
    D = T[:, np.arange(m)[None, :], codes.astype(np.int64)].sum(-1) if False else None
    out = []
    for qi in range(Q.shape[0]):
        dq = T[qi][np.arange(m)[None, :], codes].sum(1)
        out.append(np.argpartition(dq, 100)[:100][np.argsort(dq[np.argpartition(dq, 100)[:100]])])
    return np.array(out)

names = sys.argv[1].split(",")
mdiv = int(sys.argv[2]) if len(sys.argv) > 2 else 2
for name, X, Q, metric in robustness_sets("small", names=names, n_queries=300):
    if metric != "sqeuclidean": continue
    X = np.asarray(X, np.float32)[:50000]; Q = np.asarray(Q, np.float32)[:300]
    d = X.shape[1]; m = max(1, -(-d // mdiv))
    _, truth = knn_cpu(X, Q, 10, "l2", False)
    S = X[np.random.default_rng(0).choice(len(X), min(20000, len(X)), replace=False)]
    t = time.time(); cb = train_pq(S, m); t_pq = time.time() - t
    t = time.time(); R, cbo = opq_train(S, m); t_opq = time.time() - t
    for label, RR, C in (("pq", None, cb), ("opq", R, cbo)):
        top = evaluate(X, Q, m, RR, C)
        r10 = np.mean([len(set(top[i, :10]) & set(truth[i])) for i in range(len(Q))]) / 10
        r100 = np.mean([len(set(top[i, :100]) & set(truth[i])) for i in range(len(Q))]) / 10
        print(f"{name:16s} d={d:4d} m={m:3d} {label:4s} recall10@10={r10:.3f} recall10@100={r100:.3f} train={t_pq if RR is None else t_opq:.1f}s", flush=True)
