"""One NN-Descent shared by several GPUs (knnkit.dask.knn_graph(partition="descent")): the merge of
the devices' graph copies against a NumPy reference, the shared descent with ranks as threads on
one GPU (ThreadPeer), and the Dask schedule on two GPUs (one worker process each, NCCL)."""

import threading

import numpy as np
import pytest

import knnkit
from knnkit.datasets import make_clustered
from knnkit.evaluate import recall

pytestmark = pytest.mark.gpu

def _merge_reference(ai, ad, bi, bd, K, nseg):
    """Per (row, segment): the L nearest distinct ids of both copies by (distance, id); a's entry
    for an id in both, NEW only when both are."""
    oi, od = ai.copy(), ad.copy()
    for u in range(ai.shape[0]):
        for s in range(nseg):
            beg, end = s * K // nseg, (s + 1) * K // nseg
            a = [(float(ad[u, j]), int(ai[u, j]) & 0x7FFFFFFF, bool(int(ai[u, j]) & 0x80000000)) for j in range(beg, end)]
            ids = {v: i for i, (_d, v, _n) in enumerate(a)}
            b = []
            for j in range(beg, end):
                v, nw = int(bi[u, j]) & 0x7FFFFFFF, bool(int(bi[u, j]) & 0x80000000)
                if v in ids:
                    if not nw:
                        d0, v0, _ = a[ids[v]]
                        a[ids[v]] = (d0, v0, False)
                else:
                    b.append((float(bd[u, j]), v, nw))
            union = sorted(a + b, key=lambda t: (t[0], t[1]))[:end - beg]
            for j, (d, v, nw) in enumerate(union):
                oi[u, beg + j] = np.array([v | (0x80000000 if nw else 0)], dtype=np.uint32).view(np.int32)[0]
                od[u, beg + j] = d
    return oi, od


def _copies(rng, n, K, nseg):
    """Two copies of segmented lists that share part of their entries (as after one iteration's
    joins on two devices), each segment sorted by (distance, id), ids of its residue class."""
    ai = np.empty((n, K), np.int32)
    bi = np.empty((n, K), np.int32)
    ad = np.empty((n, K), np.float32)
    bd = np.empty((n, K), np.float32)
    for u in range(n):
        for s in range(nseg):
            beg, end = s * K // nseg, (s + 1) * K // nseg
            L = end - beg
            pool = rng.choice(np.arange(s, 4000, nseg), 2 * L, replace=False)
            dist = rng.random(2 * L).astype(np.float32)
            dist[rng.random(2 * L) < 0.1] = 0.5  # ties, broken by id
            flags = rng.random(2 * L) < 0.3
            for ids_out, d_out, pick in ((ai, ad, rng.choice(2 * L, L, replace=False)),
                                         (bi, bd, rng.choice(2 * L, L, replace=False))):
                order = sorted(pick, key=lambda j: (dist[j], pool[j]))
                for j, p in enumerate(order):
                    ids_out[u, beg + j] = np.array([pool[p] | (0x80000000 if flags[p] else 0)],
                                                   dtype=np.uint32).view(np.int32)[0]
                    d_out[u, beg + j] = dist[p]
    return ai, ad, bi, bd


@pytest.mark.parametrize("K, nseg", [(48, 2), (10, 1), (96, 3)])
def test_merge_of_copies_equals_reference(K, nseg):
    import cupy as cp

    from knnkit.graph.nndescent._gpu import _merge_kernel

    rng = np.random.default_rng(K)
    n = 300
    ai, ad, bi, bd = _copies(rng, n, K, nseg)
    ri, rd = _merge_reference(ai, ad, bi, bd, K, nseg)
    k = _merge_kernel()
    gi, gd = cp.asarray(ai), cp.asarray(ad)
    out_i, out_d = cp.empty_like(gi), cp.empty_like(gd)
    warps = n * nseg
    k((-(-warps * 32 // 256),), (256,), (gi, gd, cp.asarray(bi), cp.asarray(bd), out_i, out_d, np.int64(n),
                                         np.int32(K), np.int32(nseg), np.uint64(0)))
    assert (out_i.get() == ri).all()
    assert (out_d.get() == rd).all()
    # in place (out = b), as the shared descent's rank 1 merges
    gb_i, gb_d = cp.asarray(bi), cp.asarray(bd)
    k((-(-warps * 32 // 256),), (256,), (gi, gd, gb_i, gb_d, gb_i, gb_d, np.int64(n), np.int32(K), np.int32(nseg),
                                         np.uint64(0)))
    assert (gb_i.get() == ri).all() and (gb_d.get() == rd).all()
    # some rows only (packed as the sparse exchange packs them), merged in place into a's rows
    from knnkit.graph.nndescent._gpu import _row_kernels

    pack, unpack = _row_kernels()
    sel = cp.asarray(np.sort(rng.choice(n, n // 3, replace=False)).astype(np.int32))
    m = int(sel.size)
    buf = cp.empty(m * (2 * K + 1), cp.int32)
    grid = (-(-m * 32 // 256),)
    pack(grid, (256,), (cp.asarray(bi), cp.asarray(bd), np.int64(0), sel, np.int64(m), np.int32(K), buf))
    assert (buf[:m] == sel).all()
    part_i, part_d = buf[m:m + m * K].reshape(m, K), buf[m + m * K:].reshape(m, K).view(cp.float32)
    assert (part_i.get() == bi[sel.get()]).all() and (part_d.get() == bd[sel.get()]).all()
    own_i, own_d = cp.asarray(ai), cp.asarray(ad)
    k((-(-m * nseg * 32 // 256),), (256,), (own_i, own_d, part_i, part_d, own_i, own_d, np.int64(m), np.int32(K),
                                            np.int32(nseg), sel))
    want_i, want_d = ai.copy(), ad.copy()
    want_i[sel.get()], want_d[sel.get()] = ri[sel.get()], rd[sel.get()]
    assert (own_i.get() == want_i).all() and (own_d.get() == want_d).all()
    back_i, back_d = cp.zeros((n, K), cp.int32), cp.zeros((n, K), cp.float32)
    unpack(grid, (256,), (buf, np.int64(m), np.int32(K), np.int64(0), back_i, back_d))
    assert (back_i[sel].get() == bi[sel.get()]).all() and (back_d[sel].get() == bd[sel.get()]).all()


def _exact(X, k):
    _, T = knnkit.knn(X, k=k, device="cpu")
    return T


@pytest.mark.parametrize("ranks,exchange", [(2, "sparse"), (3, "sparse"), (2, "whole"), (3, "whole"),
                                            (2, "sparse_all_rows"), (2, "sparse_no_overlap"),
                                            (3, "whole_no_overlap")])
def test_shared_descent_in_threads_reaches_the_single_device_recall(ranks, exchange, monkeypatch):
    """Ranks as threads on one GPU: every rank returns its rows, they stop together, and the
    joined lists reach the recall of the single-device descent; with the changed rows only
    (``sparse``), with whole shares, and with the sparse path sending every row; the owners'
    rows shared beside the next sampling (default) or at the end of each iteration."""
    import cupy as cp

    from knnkit._core.comm import ThreadPeer
    from knnkit.graph.nndescent import _gpu
    from knnkit.graph.nndescent._gpu import nndescent_gpu

    if exchange == "sparse_all_rows":
        monkeypatch.setattr(_gpu, "SPARSE_EXCHANGE_BELOW", 0.0)
    overlap = not exchange.endswith("_no_overlap")
    exchange = exchange.removesuffix("_no_overlap")

    n, k = 20011, 10
    X = np.asarray(make_clustered(n, 24, n_clusters=60, random_state=3, device="cpu"), dtype=np.float32)
    T = _exact(X, k)
    Xd = cp.asarray(X)
    kw = dict(sample=16, max_iters=30, delta=0.001, metric="l2", seed=5)
    I1, _D1, st1 = nndescent_gpu(Xd, 32, **kw)
    r_single = recall(I1.get()[:, :k], T)
    cuts = np.linspace(0, n, ranks + 1).astype(int)
    peers = ThreadPeer.group([(int(cuts[r]), int(cuts[r + 1])) for r in range(ranks)])
    out = [None] * ranks
    errors = []

    def run(r):
        try:
            out[r] = nndescent_gpu(Xd, 32, peer=peers[r], sparse_exchange=exchange != "whole",
                                   overlap_share=overlap, **kw)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)
            peers[r]._x.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert len({o[2]["iterations"] for o in out}) == 1
    assert all(o[2]["overlap_share"] is overlap for o in out)
    I = np.concatenate([o[0].get() for o in out])
    D = np.concatenate([o[1].get() for o in out])
    assert I.shape == (n, 32) and (I >= 0).all() and (I != np.arange(n)[:, None]).all()
    assert (np.diff(D, axis=1) >= 0).all()
    r_shared = recall(I[:, :k], T)
    assert r_shared >= r_single - 0.005 and r_shared >= 0.97, (r_shared, r_single)
    moved = out[0][2].get("rows_moved")
    if exchange == "whole":
        assert moved is None
    else:
        assert len(moved) == out[0][2]["iterations"] and all(o[2]["rows_moved"] == moved for o in out)
        sent = [m[0] for m in moved]
        if exchange == "sparse":  # the last iterations change few rows: few travel
            assert sent[-1] < 0.5 * n and sent[-1] < sent[0], moved
        else:
            assert all(m == (ranks - 1) * n for m in sent), moved


def _two_gpus():
    import cupy as cp

    return cp.cuda.runtime.getDeviceCount() >= 2


def _gpu_cluster(w):
    """One worker process per GPU, each seeing only its own (what dask_cuda.LocalCUDACluster does)."""
    from distributed import Nanny, Scheduler, SpecCluster

    spec = {f"gpu{g}": {"cls": Nanny, "options": {"nthreads": 1, "memory_limit": 0,
                                                  "env": {"CUDA_VISIBLE_DEVICES": str(g), "NCCL_NVLS_ENABLE": "0"}}}
            for g in range(w)}
    return SpecCluster(scheduler={"cls": Scheduler, "options": {"dashboard_address": None}}, workers=spec)


def test_dask_descent_on_two_gpus():
    distributed = pytest.importorskip("distributed")
    da = pytest.importorskip("dask.array")
    if not _two_gpus():
        pytest.skip("needs two GPUs")
    import knnkit.dask

    n, k = 300_007, 10
    X = np.asarray(make_clustered(n, 32, n_clusters=300, random_state=1, device="cpu"), dtype=np.float32)
    rows = np.random.default_rng(0).choice(n, 2000, replace=False)
    _, T = knnkit.knn(X, X[rows], k=k + 1, device="gpu")
    T = np.asarray(T.get() if hasattr(T, "get") else T)[:, 1:]
    g0 = knnkit.knn_graph(X, k=k, device="gpu", random_state=0)
    r0 = recall(np.asarray(g0.indices.get() if hasattr(g0.indices, "get") else g0.indices)[rows], T)
    with _gpu_cluster(2) as cluster, distributed.Client(cluster) as c:
        c.wait_for_workers(2)
        g = knnkit.dask.knn_graph(X, k=k, client=c, partition="descent", random_state=0)
        assert g.stats.method == "dask-descent" and g.stats.extra["ranks"] == 2
        I = np.asarray(g.indices)
        assert I.shape == (n, k) and (I >= 0).all() and (I < n).all()
        assert (I != np.arange(n)[:, None]).all()
        assert (np.diff(np.asarray(g.distances), axis=1) >= 0).all()
        r = recall(I[rows], T)
        assert r >= r0 - 0.005 and r >= 0.98, (r, r0)
        # blocks left on the workers (auto picks the shared descent above DESCENT_MIN_N points)
        dX = c.persist(da.from_array(X, chunks=(100_000, 32)))
        h = knnkit.dask.knn_graph(dX, k=k, client=c, random_state=0, partition="descent")
        assert h.stats.method == "dask-descent" and h.is_dask
        Ih = np.asarray(h.indices.compute())
        assert recall(Ih[rows], T) >= r0 - 0.005
        with pytest.raises(ValueError, match="partition='descent'"):
            knnkit.dask.knn_graph(X, k=k, client=c, partition="descent", metric="inner_product")
