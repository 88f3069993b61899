"""knn_graph and GraphIndex defaults on data the robustness suite does not make (issue 11: "others will
test on data you have not seen"). Twenty-four generators written for this probe: Zipf-sized clusters,
GloVe-like anisotropic embeddings (cosine and inner product), binary bag-of-words uint8, magnitudes
of 1e-19 and a 1e4 offset, mixed column scales, int8 and float16 embeddings, a 3-D integer grid,
sklearn's digits, Cauchy 1-D, Student-t (df 2), clusters in random 4-d subspaces, low-rank
transformer-like embeddings, TF-IDF-like sparse rows (cosine), points on a sphere, concentric shells,
rows scaled by 10^U(-3, 3), Poisson counts, three-hot rows, float16 values ~1e4, windows of one random
walk.

Recall is strict by float64 distance (a found neighbour counts when its distance is within 1e-6 of
the true k-th), over 300 held-out rows (index) and 300 data rows (graph, self excluded).

    python benchmarks/unseen_probe.py [n] [cpu|gpu] [set,set,...]
"""
import sys
import time

import numpy as np

import knnkit
from knnkit.evaluate import float64_distances


def glove_like(n, d=50, seed=1):
    rng = np.random.default_rng(seed)
    spec = 1.0 / np.arange(1, d + 1) ** 0.8
    X = rng.standard_normal((n, d)) * np.sqrt(spec)
    X = X @ np.linalg.qr(rng.standard_normal((d, d)))[0]
    X += 0.6 * rng.standard_normal(d)          # common mean direction
    X *= rng.lognormal(0, 0.3, (n, 1))         # varied norms
    return X.astype(np.float32)


def offset_cube(n, d=16, seed=2):
    rng = np.random.default_rng(seed)
    return (rng.random((n, d)) + 1e4).astype(np.float32)


def tiny(n, d=24, seed=3):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, d)) * 1e-19).astype(np.float32)


def mixed_scale(n, d=20, seed=4):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X[:, 0] *= 1e3
    X[:, 1] *= 30
    return X.astype(np.float32)


def binary_bow(n, d=256, seed=5):
    rng = np.random.default_rng(seed)
    p = rng.beta(0.3, 6, d)
    return (rng.random((n, d)) < p).astype(np.uint8)


def int8_emb(n, d=64, seed=6):
    rng = np.random.default_rng(seed)
    C = rng.standard_normal((200, d)) * 40
    X = C[rng.integers(0, 200, n)] + rng.standard_normal((n, d)) * 15
    return np.clip(np.round(X), -128, 127).astype(np.int8)


def zipf_clusters(n, d=32, seed=7):
    rng = np.random.default_rng(seed)
    nc = 2000
    w = 1.0 / np.arange(1, nc + 1) ** 1.2
    w /= w.sum()
    lab = rng.choice(nc, n, p=w)
    C = rng.standard_normal((nc, d)) * 5
    sp = rng.lognormal(-2, 1, nc)
    return (C[lab] + rng.standard_normal((n, d)) * sp[lab, None]).astype(np.float32)


def grid3(n, seed=8):
    g = np.stack(np.meshgrid(*[np.arange(22)] * 3, indexing="ij"), -1).reshape(-1, 3)
    return g[:n].astype(np.float32)


def digits(n=None, seed=0):  # (sklearn ships it: no network)
    from sklearn.datasets import load_digits
    return load_digits().data.astype(np.float32)


def line1d(n, seed=9):
    rng = np.random.default_rng(seed)
    return np.sort(rng.standard_cauchy(n)).astype(np.float32)[:, None]


def f16_emb(n, d=96, seed=10):
    return glove_like(n, d, seed).astype(np.float16)


def dist64(B, Q, metric):
    """float64 keys, smaller is nearer (knnkit.evaluate.float64_distances; inner product negated)."""
    D = float64_distances(B, Q, metric)
    return -D if metric == "inner_product" else D


def tie_recall(B, Q, I, metric, exclude=None, k=10):
    D = dist64(B, Q, metric)
    if exclude is not None:
        D[np.arange(len(Q)), exclude] = np.inf
    kth = np.partition(D, k - 1, axis=1)[:, k - 1]
    I = np.asarray(I)
    ok = I >= 0
    fd = np.where(ok, D[np.arange(len(Q))[:, None], np.where(ok, I, 0)], np.inf)
    tol = np.abs(kth) * 1e-6 + 1e-300
    hit = ok & (fd <= kth[:, None] + tol[:, None])
    # no id counted twice
    return float(hit.sum() / (k * len(Q)))


SETS = [("glove_like_cos", glove_like, "cosine"), ("offset_1e4", offset_cube, "sqeuclidean"),
        ("tiny_1e-19", tiny, "sqeuclidean"), ("mixed_scale", mixed_scale, "sqeuclidean"),
        ("binary_bow_u8", binary_bow, "sqeuclidean"), ("int8_emb", int8_emb, "sqeuclidean"),
        ("zipf_clusters", zipf_clusters, "sqeuclidean"), ("grid3", grid3, "sqeuclidean"),
        ("digits", digits, "sqeuclidean"), ("cauchy_1d", line1d, "euclidean"),
        ("f16_ip", f16_emb, "inner_product"), ("glove_like_ip", glove_like, "inner_product")]


def student_t(n, d=32, seed=11):
    return np.random.default_rng(seed).standard_t(2, (n, d)).astype(np.float32)


def subspace_clusters(n, d=64, seed=12):
    rng = np.random.default_rng(seed)
    nc = 50
    lab = rng.integers(0, nc, n)
    bases = [np.linalg.qr(rng.standard_normal((d, 4)))[0] for _ in range(nc)]
    C = rng.standard_normal((nc, d)) * 2
    X = np.empty((n, d))
    for c in range(nc):
        m = lab == c
        X[m] = C[c] + rng.standard_normal((m.sum(), 4)) @ bases[c].T
    return X.astype(np.float32)


def transformer_like(n, d=384, seed=13):
    rng = np.random.default_rng(seed)
    r = 30
    A = rng.standard_normal((r, d)) * (1.0 / np.arange(1, r + 1))[:, None]
    X = rng.standard_normal((n, r)) @ A + 0.05 * rng.standard_normal((n, d)) + 1.5 * rng.standard_normal(d)
    return X.astype(np.float32)


def tfidf_like(n, d=300, seed=14):
    rng = np.random.default_rng(seed)
    p = rng.beta(0.2, 8, d)
    M = rng.random((n, d)) < p
    X = M * rng.exponential(1.0, (n, d))
    X[M.sum(1) == 0, 0] = 1.0
    return X.astype(np.float32)


def sphere3(n, seed=15):
    X = np.random.default_rng(seed).standard_normal((n, 3))
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)


def shells(n, d=8, seed=16):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return (X * rng.integers(1, 11, (n, 1))).astype(np.float32)


def row_scales(n, d=16, seed=17):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, d)) * 10.0 ** rng.uniform(-3, 3, (n, 1))).astype(np.float32)


def poisson_counts(n, d=100, seed=18):
    return np.random.default_rng(seed).poisson(0.1, (n, d)).astype(np.float32)


def onehot3(n, d=50, seed=19):
    rng = np.random.default_rng(seed)
    X = np.zeros((n, d), np.float32)
    for j in range(3):
        X[np.arange(n), rng.integers(0, d, n)] = 1
    return X


def f16_big(n, d=24, seed=20):
    return (np.random.default_rng(seed).standard_normal((n, d)) * 1e4).astype(np.float16)


def walk_windows(n, d=64, seed=21):
    s = np.cumsum(np.random.default_rng(seed).standard_normal(n + d))
    idx = np.arange(n)[:, None] + np.arange(d)[None]
    return s[idx].astype(np.float32)


SETS2 = [("student_t2", student_t, "sqeuclidean"), ("subspace_cl", subspace_clusters, "sqeuclidean"),
         ("transformer_cos", transformer_like, "cosine"), ("tfidf_cos", tfidf_like, "cosine"),
         ("sphere3", sphere3, "euclidean"), ("shells8", shells, "sqeuclidean"),
         ("row_scales", row_scales, "sqeuclidean"), ("poisson", poisson_counts, "sqeuclidean"),
         ("onehot3", onehot3, "sqeuclidean"), ("f16_big", f16_big, "sqeuclidean"),
         ("walk_windows", walk_windows, "sqeuclidean"), ("transformer_ip", transformer_like, "inner_product")]


def held_out_split(X, n_queries=300):
    """(data, queries): ``n_queries`` seeded random rows of ``X`` held out as queries."""
    perm = np.random.default_rng(0).permutation(len(X))
    return np.ascontiguousarray(X[np.sort(perm[n_queries:])]), X[perm[:n_queries]]


def main(argv):
    n = int(argv[1]) if len(argv) > 1 else 20000
    device = argv[2] if len(argv) > 2 else "cpu"
    only = argv[3].split(",") if len(argv) > 3 else None
    for name, gen, metric in SETS + SETS2:
        if only and name not in only:
            continue
        B, Q = held_out_split(gen(n + 300))
        try:
            t = time.perf_counter()
            g = knnkit.knn_graph(B, 10, metric=metric, random_state=0, device=device)
            tg = time.perf_counter() - t
            est = g.stats.get("recall_estimate")
            t = time.perf_counter()
            idx = knnkit.GraphIndex.build(B, metric=metric, random_state=0, device=device)
            tb = time.perf_counter() - t
            r = tie_recall(B, Q, np.asarray(idx.search(Q, 10)[1]), metric)
            r128 = tie_recall(B, Q, np.asarray(idx.search(Q, 10, beam=128)[1]), metric)
            gi = np.asarray(g.indices)
            rows = np.random.default_rng(1).choice(len(B), 300, replace=False)
            gr = tie_recall(B, B[rows], gi[rows], metric, exclude=rows)
            cal = idx.calibration
            cb = dict(zip(cal["beams"], cal["recall"])).get(idx.search_params.beam) if cal else None
            print(f"{name:16s} n={len(B)} graph {gr:.4f} (estimate {est}) {tg:.2f}s | index {r:.4f} (calibrated {cb}) "
                  f"beam 128 {r128:.4f} default beam {idx.search_params.beam} build {tb:.2f}s", flush=True)
        except Exception as e:  # noqa: BLE001 - a failing set is a result
            print(f"{name:16s} ERROR {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main(sys.argv)
