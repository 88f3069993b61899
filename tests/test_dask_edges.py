"""knnkit.dask edge cases found by fuzzing (CPU workers): inputs where the distributed answer
used to differ from the single process without an error, or fail unclearly."""

import warnings

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")

import knnkit  # noqa: E402
import knnkit.dask  # noqa: E402


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as c:
        yield c


@pytest.mark.parametrize("scale", [1e30, 1e-30])
@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean", "inner_product"])
def test_knn_merge_ranks_data_at_a_scale(client, metric, scale):
    """Data beyond 2^50 (or below 2^-50) is searched at a power-of-two scale; its float32 user
    distances overflow (inf) or underflow (0), and the merge across partitions ranked such ties
    by id: wrong neighbours (euclidean: unsorted finite distances). Equal to one process now."""
    rng = np.random.default_rng(1)
    X = rng.random((600, 5)) * scale
    Q = rng.random((20, 5)) * scale
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # inf distances (ids exact)
        d0, i0 = knnkit.knn(X, Q, k=5, metric=metric, device="cpu")
        d, i = knnkit.dask.knn(X, Q, k=5, metric=metric, client=client, device="cpu", n_parts=3)
        assert (i == i0).all() and np.array_equal(d, d0) and d.dtype == np.float32
        d1, i1 = knnkit.dask.knn(X, Q, k=5, metric=metric, client=client, device="cpu", n_parts=1, compute=False)
        assert d1.dtype == d1.compute().dtype == np.float32 and (i1.compute() == i0).all()
        d0, i0 = knnkit.knn(X, k=4, metric=metric, device="cpu")
        d, i = knnkit.dask.knn(da.from_array(X, chunks=(170, 5)), k=4, metric=metric, client=client, device="cpu")
        d, i = d.compute(), i.compute()
    assert d.dtype == np.float32 and (i == i0).all() and np.array_equal(d, d0)


def _recall(g, X, k, metric="sqeuclidean"):
    from knnkit.evaluate import recall

    _, T = knnkit.knn(X, k=k, metric=metric, device="cpu")
    return recall(g.indices, T)


@pytest.mark.parametrize("partition, second_stage", [("rows", "graph"), ("rows", "search"), ("tree", "search")])
def test_knn_graph_data_at_a_scale(client, partition, second_stage):
    """1e30-scale data: each partition ran at its own scale and the merges compared float32
    distances that overflow (recall 0.75, unsorted lists). One scale for the whole data now."""
    from knnkit.datasets import make_clustered

    X = np.asarray(make_clustered(2500, 8, random_state=3), dtype=np.float64) * 1e30
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        g = knnkit.dask.knn_graph(X, k=8, metric="euclidean", client=client, device="cpu", partition=partition,
                                  second_stage=second_stage, n_parts=2, recall_estimate=False)
        assert _recall(g, X, 8, "euclidean") >= 0.99
        assert (np.diff(g.distances, axis=1) >= 0).all() and np.isfinite(g.distances).all()
        d0, _ = knnkit.knn(X, k=8, metric="euclidean", device="cpu")
        np.testing.assert_allclose(g.distances[:, 0], d0[:, 0], rtol=1e-5)
        gl = knnkit.dask.knn_graph(da.from_array(X, chunks=1250), k=8, metric="euclidean", client=client,
                                   device="cpu", partition=partition, second_stage=second_stage, n_parts=2,
                                   recall_estimate=False).compute()
    assert (gl.indices == g.indices).all() and (gl.distances == g.distances).all()


@pytest.mark.parametrize("second_stage", ["graph", "search"])
def test_knn_graph_rows_k_above_a_partition(client, second_stage):
    """Row partitions of k points or fewer: the lists came back with n_part - 1 columns instead of
    k (shape (60, 29) for k=59), or a dask result whose blocks disagreed with its chunks."""
    from knnkit.datasets import make_clustered

    X = np.asarray(make_clustered(2005, 6, random_state=1), dtype=np.float32)
    g = knnkit.dask.knn_graph(X[:60], k=59, client=client, device="cpu", partition="rows", second_stage=second_stage)
    assert g.indices.shape == (60, 59) and (g.indices >= 0).all() and _recall(g, X[:60], 59) == 1.0
    g = knnkit.dask.knn_graph(X[:100], k=40, client=client, device="cpu", partition="rows", n_parts=4,
                              second_stage=second_stage)
    assert g.indices.shape == (100, 40) and (g.indices >= 0).all() and _recall(g, X[:100], 40) >= 0.99
    g = knnkit.dask.knn_graph(da.from_array(X, chunks=1000), k=10, client=client, device="cpu", partition="rows",
                              second_stage=second_stage)  # a last chunk of 5 rows
    gc = g.compute()
    assert gc.indices.shape == (2005, 10) and (gc.indices >= 0).all() and _recall(gc, X, 10) >= 0.99


def test_knn_graph_tree_default_leaves_fit_k(client):
    """The tree's default leaf count (one per worker) refused a small data set with a large k,
    naming an n_parts the caller had not given; it is capped at n // (k + 1) now."""
    X = np.random.default_rng(0).random((60, 4), dtype=np.float32)
    g = knnkit.dask.knn_graph(X, k=40, client=client, device="cpu", partition="tree")
    assert g.indices.shape == (60, 40) and _recall(g, X, 40) == 1.0
    with pytest.raises(ValueError, match="n_parts=2"):
        knnkit.dask.knn_graph(X, k=40, client=client, device="cpu", partition="tree", n_parts=2)


def test_knn_graph_random_state_validated(client):
    """random_state is validated as knnkit.knn_graph does (int() took "7" and truncated 1.5)."""
    X = np.random.default_rng(0).random((300, 4), dtype=np.float32)
    with pytest.raises(TypeError, match="random_state"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", random_state=1.5)
    with pytest.raises(TypeError, match="random_state"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", random_state="7")
    with pytest.raises(ValueError, match="random_state"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", random_state=-1)
    a = knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", random_state=np.int64(3), n_parts=2)
    b = knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", random_state=3, n_parts=2)
    assert (a.indices == b.indices).all()
    assert knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", random_state=None).shape == (300, 5)


# --------------------------------------------------------------------------- ShardedIndex
@pytest.fixture(scope="module")
def sharded(client):
    from knnkit.datasets.suite import make_tight_clusters

    X, Q = make_tight_clusters(3000, 12, 30, n_queries=60, random_state=4)
    return X, Q, knnkit.dask.ShardedIndex.build(X, shards=3, client=client, device="cpu", random_state=0)


def _copy_index(src, dst, edit=None):
    import json
    import shutil

    shutil.copytree(src, dst)
    if edit is not None:
        man = json.loads((dst / "manifest.json").read_text())
        edit(man)
        (dst / "manifest.json").write_text(json.dumps(man))
    return dst


def test_sharded_load_refuses_edited_or_incomplete_manifests(client, sharded, tmp_path):
    """A manifest with a shard dropped, offsets moved, two entries on one file, a file outside the
    directory, no shards or bad replicas loaded a partial or shifted index without a word (or
    failed with a KeyError / AttributeError); each is refused with a ValueError now."""
    import json

    X, Q, ix = sharded
    ix.save(tmp_path / "ix")
    SI = knnkit.dask.ShardedIndex
    assert (SI.load(tmp_path / "ix", client=client, device="cpu").search(Q, k=5)[1] == ix.search(Q, k=5)[1]).all()

    def shift(m):
        for s in m["shards"]:
            s["offset"] += 7

    def same_file(m):
        m["shards"][0].update(file=m["shards"][1]["file"], sha256=m["shards"][1]["sha256"])

    edits = {"drop_last": lambda m: m["shards"].pop(), "drop_first": lambda m: m["shards"].pop(0), "shift": shift,
             "same_file": same_file, "n": lambda m: m.update(n=5),
             "escape": lambda m: m["shards"][0].update(file="../ix/" + m["shards"][0]["file"]),
             "empty": lambda m: m.update(shards=[]), "no_sha": lambda m: m["shards"][0].pop("sha256"),
             "replicas0": lambda m: m.update(replicas=0), "replicas_str": lambda m: m.update(replicas="x")}
    for name, edit in edits.items():
        # the edits that also fix the checksum (an old manifest has none): the structure checks
        for fix in (False, True):
            def both(m, edit=edit, fix=fix):
                edit(m)
                if fix:
                    m.pop("checksum", None)
            d = _copy_index(tmp_path / "ix", tmp_path / f"{name}{int(fix)}", both)
            with pytest.raises(ValueError, match="manifest.json"):
                SI.load(d, client=client, device="cpu")
    def swap(m):  # a consistent-looking manifest (equal shard sizes): only its checksum tells
        a, b = m["shards"][0], m["shards"][1]
        a["file"], b["file"], a["sha256"], b["sha256"] = b["file"], a["file"], b["sha256"], a["sha256"]

    with pytest.raises(ValueError, match="checksum"):
        SI.load(_copy_index(tmp_path / "ix", tmp_path / "swap", swap), client=client, device="cpu")
    d = _copy_index(tmp_path / "ix", tmp_path / "garbage")
    (d / "manifest.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        SI.load(d, client=client, device="cpu")
    (d / "manifest.json").write_text("[]")
    with pytest.raises(ValueError, match="not a knnkit sharded index"):
        SI.load(d, client=client, device="cpu")
    d = _copy_index(tmp_path / "ix", tmp_path / "removed")
    (d / "shard_00001.knnkit").unlink()
    with pytest.raises(ValueError, match="shard_00001.knnkit .*missing"):
        SI.load(d, client=client, device="cpu")
    # a manifest of before the checksum still loads
    d = _copy_index(tmp_path / "ix", tmp_path / "old", lambda m: m.pop("checksum"))
    assert (SI.load(d, client=client, device="cpu").search(Q, k=5)[1] == ix.search(Q, k=5)[1]).all()
    assert "checksum" in json.loads((tmp_path / "ix" / "manifest.json").read_text())


def test_sharded_search_validates_keywords_and_filter(client, sharded):
    """Search keywords are checked before any task (a typo failed on a worker as a RuntimeError);
    a boolean mask of the index's points is cut per shard (each shard read the whole-index mask
    as its own); other filter forms are refused."""
    X, Q, ix = sharded
    with pytest.raises(TypeError, match="bogus"):
        ix.search(Q, k=5, bogus=1)
    with pytest.raises(ValueError, match="filter"):
        ix.search(Q, k=5, filter=np.arange(100))
    with pytest.raises(ValueError, match="NaN"):
        ix.search(np.full_like(Q, np.nan), k=5)
    mask = np.zeros(3000, bool)
    mask[::7] = True
    d, i = ix.search(Q, k=5, filter=mask)
    d0, i0 = knnkit.knn(X[mask], Q, k=5, device="cpu")
    assert mask[i].all() and (i == np.flatnonzero(mask)[i0]).mean() >= 0.98


@pytest.mark.parametrize("metric", ["sqeuclidean", "inner_product"])
def test_sharded_search_data_at_a_scale(client, metric):
    """Shards of 1e30-scale data: their float32 distances are inf, and the merge ranked them by
    id (recall 0.32); the found pairs' float64 distances rank the merge now."""
    from knnkit.datasets.suite import make_tight_clusters
    from knnkit.evaluate import recall

    X, Q = make_tight_clusters(2000, 8, 20, n_queries=40, random_state=2)
    X, Q = X.astype(np.float64) * 1e30, Q.astype(np.float64) * 1e30
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _, T = knnkit.knn(X, Q, k=5, metric=metric, device="cpu")
        ix = knnkit.dask.ShardedIndex.build(X, shards=2, metric=metric, client=client, device="cpu")
        d, i = ix.search(Q, k=5)
    assert d.dtype == np.float32 and recall(i, T) >= 0.95


def test_dask_backed_graph_after_its_client_closed_says_so():
    """The lists of a compute=False graph are futures of its client: computing them after the client
    closed is a clear RuntimeError, not dask's bare "Missing dependency"."""
    import knnkit.dask
    from distributed import Client, LocalCluster

    X = np.random.default_rng(0).random((3000, 8), dtype=np.float32)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False) as cluster, Client(cluster) as c:
        g = knnkit.dask.knn_graph(X, k=5, client=c, device="cpu", compute=False)
    with pytest.raises(RuntimeError, match="client that is closed"):
        g.compute()
    # with another client open (as in a test session), dask reports a cancelled future instead
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False) as cluster, Client(cluster):
        with pytest.raises(RuntimeError, match="client that is closed"):
            g.compute()


def test_sharded_index_replicates_a_lost_copy_again(client, caplog):
    """A shard whose replica disappeared (here: cut to one copy by hand) is copied again before a
    search, so that query blocks are spread over both holders instead of all going to the one left
    (2 x H100: every block searched on one worker, at one worker's speed)."""
    rng = np.random.default_rng(5)
    X = rng.random((3000, 8), dtype=np.float32)
    ix = knnkit.dask.ShardedIndex.build(X, replicas=2, client=client, device="cpu", random_state=0)
    assert [len(h) for h in ix._holders()] == [2]
    client.replicate(ix._futures, n=1)  # one copy dropped
    assert len(client.who_has(ix._futures)[ix._futures[0].key]) == 1
    with caplog.at_level("WARNING", logger="knnkit"):
        d, i = ix.search(X[:50], k=5)
    assert "replicating again" in caplog.text
    assert [len(h) for h in ix._holders()] == [2]
    assert (i[:, 0] == np.arange(50)).all()
    # where the call asked each block to be searched: one entry per block, a holder per shard
    holders = set(ix._holders()[0])
    d, i = ix.search(X[:50], k=5, query_block=10)
    assert len(ix.last_placement) == 5
    assert all(len(p["searched_on"]) == 1 and p["searched_on"][0] in holders for p in ix.last_placement)
    assert {p["searched_on"][0] for p in ix.last_placement} == holders  # both replicas used


def test_knn_graph_descent_is_refused_clearly_where_it_cannot_run(client):
    """partition='descent' (one NN-Descent shared by GPU workers over NCCL): refused with the reason
    on CPU workers, for device='cpu', for metrics without its kernels and with GGM's options;
    'auto' on CPU workers keeps the tree (the same lists as partition='tree')."""
    X = np.random.default_rng(2).random((3000, 6), dtype=np.float32)
    with pytest.raises(ValueError, match="partition='descent' runs on GPU workers"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", partition="descent")
    with pytest.raises(ValueError, match="partition='descent' serves the metrics"):
        knnkit.dask.knn_graph(X, k=5, client=client, partition="descent", metric="manhattan")
    with pytest.raises(ValueError, match="n_neighbors_internal"):
        knnkit.dask.knn_graph(X, k=5, client=client, partition="descent", n_neighbors_internal=20)
    with pytest.raises(ValueError, match="cannot run here: 11 points are too few for 2 workers"):
        knnkit.dask.knn_graph(X[:11], k=5, client=client, partition="descent")
    if not knnkit.gpu_available():
        with pytest.raises(ValueError, match="cannot run here: .*no GPU"):
            knnkit.dask.knn_graph(X, k=5, client=client, partition="descent")
    g = knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", random_state=3)
    t = knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", random_state=3, partition="tree")
    assert g.stats.method == t.stats.method == "dask-tree" and (g.indices == t.indices).all()


_FAKE = {}


def _fake_ready(need_bytes, key=None):
    return "" if key is None else ("", key in _FAKE.setdefault("kept", set()))


def _fake_nccl_id():
    return b"fake-id"


def _fake_descent_lists(uid, key, rank, data_bounds, join_bounds, spans, d, dtype, k, metric, seed, rows, *blocks):
    """The shared descent's task with exact lists in place of the GPU descent: every rank has all
    the data (here: the test's array, as the real ranks after their broadcasts) and answers for its
    join rows in the descent's numbering."""
    X = _FAKE["X"]
    _FAKE.setdefault("kept", set()).add(key)
    _FAKE.setdefault("uids", []).append(uid)
    a, b = data_bounds[rank]
    assert sum(blk.shape[0] for blk in blocks) == b - a
    order = np.concatenate([np.arange(o, o + c) for sp in spans for o, c in sp])
    lo, hi = join_bounds[rank]
    mine = order[lo:hi]
    d2 = ((X[mine, None, :].astype(np.float64) - X[None, :, :]) ** 2).sum(-1)
    d2[np.arange(hi - lo), mine] = np.inf
    I = np.argsort(d2, axis=1, kind="stable")[:, :k]
    D = np.take_along_axis(d2, I, axis=1).astype(np.float32)
    hits = None if rows is None else (int(np.isin(rows, mine).sum()) * k, int(np.isin(rows, mine).sum()) * k)
    st = {"iterations": 1, "updates": [0], "K": k, "sample": 1, "task_s": 0.0, "phase_ms": None,
          "recall_hits": hits}
    return I.astype(np.int32), D, st


def _stand_in(monkeypatch, X, descent, **fake):
    """knnkit.dask's shared descent with its GPU tasks replaced (``descent``: the task; the
    communicator checks and id faked), from 1,000 points; ``fake``: more entries of _FAKE."""
    import knnkit.dask._api as api

    _FAKE.clear()
    _FAKE.update(X=X, **fake)
    monkeypatch.setattr(api, "gpu_peer_ready", _fake_ready)
    monkeypatch.setattr(api, "nccl_id", _fake_nccl_id)
    monkeypatch.setattr(api, "descent_lists", descent)
    monkeypatch.setattr(api, "DESCENT_MIN_N", 1000)
    return api


@pytest.mark.parametrize("chunks", [(1000, 700, 1300, 1001), (4001,)])
@pytest.mark.parametrize("compute", [True, False])
def test_knn_graph_descent_orchestration_with_a_stand_in_engine(client, monkeypatch, chunks, compute):
    """The shared descent's plumbing on CPU workers, its GPU task replaced by exact lists: rows of
    uneven blocks (all on one worker, or spread) cut into the ranks' equal shares and put back in
    row order, on the workers or gathered; the recall estimate summed from the ranks; the
    communicator made once, then reused."""
    X = np.random.default_rng(5).random((sum(chunks), 4), dtype=np.float32)
    _stand_in(monkeypatch, X, _fake_descent_lists)
    dX = client.persist(da.from_array(X, chunks=(chunks, 4)))
    distributed.wait(dX)
    _, T = knnkit.knn(X, k=6, device="cpu")
    for _ in range(2):
        g = knnkit.dask.knn_graph(dX, k=6, client=client, partition="descent", compute=compute)
        assert g.stats.method == "dask-descent" and g.stats.extra["ranks"] == 2
        assert g.stats.extra["rank_rows"] == [2000, 2001] and g.stats.extra["recall_estimate"] == 1.0
        I = np.asarray(g.indices.compute() if g.is_dask else g.indices)
        assert (I == T).all()
    assert _FAKE["uids"][:2] == [b"fake-id"] * 2 and _FAKE["uids"][2:] == [None, None]
    h = knnkit.dask.knn_graph(dX, k=6, client=client)  # auto: the shared descent where it can run
    assert h.stats.method == "dask-descent"


def _spoiled_descent_lists(*args):
    """The stand-in descent with every list shifted by one rank (a stalled descent's poor lists)."""
    I, D, st = _fake_descent_lists(*args)
    st["recall_hits"] = (0, max(1, st["recall_hits"][1]))
    return np.roll(I, 1, axis=0), D, st


def test_knn_graph_auto_descent_gives_way_to_the_tree_when_its_estimate_is_low(client, monkeypatch, caplog):
    """'auto' chose the shared descent and its recall estimate ends low (data on which NN-Descent
    stalls): the tree schedule builds the graph instead, stats say so; an explicit
    partition='descent' keeps its lists with a warning."""
    import logging

    X = np.random.default_rng(6).random((3001, 4), dtype=np.float32)
    _stand_in(monkeypatch, X, _spoiled_descent_lists)
    t = knnkit.dask.knn_graph(X, k=5, client=client, device="auto", partition="tree", random_state=1)
    with caplog.at_level(logging.WARNING, logger="knnkit"):
        g = knnkit.dask.knn_graph(X, k=5, client=client, random_state=1)
    assert g.stats.method == "dask-tree" and g.stats.extra["descent_fallback"]["recall_estimate"] == 0.0
    assert (g.indices == t.indices).all() and "instead" in caplog.text
    with caplog.at_level(logging.WARNING, logger="knnkit"):
        h = knnkit.dask.knn_graph(X, k=5, client=client, partition="descent")
    assert h.stats.method == "dask-descent" and "stalls" in caplog.text


def _fake_abort(key):
    _FAKE["abort"].set()
    return True


def _hanging_descent_lists(uid, key, rank, *args):
    """Rank 0 fails at once (when asked to) and the others wait, as NCCL would, until aborted."""
    import time as _time

    if rank == 0 and _FAKE.get("fail"):
        raise ValueError("rank 0 ran out of something")
    t0 = _time.time()
    while not _FAKE["abort"].is_set() and _time.time() - t0 < 60:
        _time.sleep(0.02)
    raise RuntimeError("communicator aborted")


@pytest.mark.parametrize("what", ["fails", "is lost"])
def test_knn_graph_descent_stops_every_rank_when_one_fails_or_is_lost(monkeypatch, what):
    """A rank that fails, or whose worker dies, would leave the others waiting in NCCL: they are
    aborted and the call raises, naming the rank, instead of hanging or returning part of a graph."""
    import threading

    X = np.random.default_rng(7).random((2400, 4), dtype=np.float32)
    api = _stand_in(monkeypatch, X, _hanging_descent_lists, abort=threading.Event(), fail=what == "fails")
    monkeypatch.setattr(api, "abort_descent", _fake_abort)
    monkeypatch.setattr(api, "DESCENT_WATCH_S", 0.2)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as c:
        if what == "is lost":
            name = sorted(cluster.workers)[0]
            threading.Timer(1.0, lambda: cluster.sync(cluster.workers[name].close)).start()
            match = r"rank \d of 2\) was lost"
        else:
            match = r"rank 0 .* failed; the other ranks were stopped"
        with pytest.raises(RuntimeError, match=match):
            knnkit.dask.knn_graph(X, k=5, client=c, partition="descent")
        assert _FAKE["abort"].is_set()


def _out_of_range_descent_lists(*args):
    """Every rank finds, after the shared descent, lists float32 cannot rank (as
    ``refuse_underflow`` does on the GPUs on data spanning more than ~1e19)."""
    from knnkit.dask._tasks import DataRangeError

    raise DataRangeError("knnkit.dask.knn_graph: 3 rows have neighbours closer than float32 resolves")


def test_knn_graph_descent_refuses_data_float32_cannot_rank_as_a_value_error(client, monkeypatch):
    """Rows whose neighbours float32 cannot tell apart are refused by the shared descent as by the
    other schedules: a ValueError saying why, not a 'rank failed' RuntimeError, and no graph."""
    X = np.random.default_rng(8).random((2400, 4), dtype=np.float32)
    _stand_in(monkeypatch, X, _out_of_range_descent_lists)
    with pytest.raises(ValueError, match="closer than float32 resolves"):
        knnkit.dask.knn_graph(X, k=5, client=client, partition="descent")


def test_refuse_underflow_finds_rows_float32_cannot_rank():
    """The check itself (shared by the partition graphs and the shared descent): distinct rows at
    1e-30 beside rows near 1 have squared distances that underflow float32."""
    from knnkit._core.prepare import prepare
    from knnkit.dask._tasks import DataRangeError, refuse_underflow
    from knnkit.graph import GRAPH_METRICS

    rng = np.random.default_rng(9)
    X = np.concatenate([rng.random((50, 3)), 1e-30 * rng.random((50, 3))]).astype(np.float32)
    P = prepare(X, metric="sqeuclidean", device="cpu", metrics=GRAPH_METRICS)
    d2 = ((P.X[:, None, :].astype(np.float64) - P.X[None]) ** 2).sum(-1)
    np.fill_diagonal(d2, np.inf)
    I = np.argsort(d2, axis=1)[:, :4].astype(np.int32)
    D = np.take_along_axis(d2, I, axis=1).astype(np.float32)
    with pytest.raises(DataRangeError, match="closer than float32 resolves"):
        refuse_underflow(D, I, P, "rows")
    refuse_underflow(D[:50], I[:50], P, "rows")  # rows near 1: nothing to refuse


def _counted_descent_lists(*args):
    _FAKE["calls"] = _FAKE.get("calls", 0) + 1
    return _fake_descent_lists(*args)


def test_knn_graph_auto_skips_the_shared_descent_on_data_of_high_intrinsic_dimension(client, monkeypatch):
    """As knnkit.knn_graph gives its stall verdict before NN-Descent, 'auto' measures the local
    intrinsic dimension (sampled rows' exact neighbours, distributed) and on data where the descent
    would stall (LID >= STALL_LID) builds with the tree schedule without running the descent;
    low-dimensional data still gets the shared descent."""
    from knnkit.graph import STALL_LID

    X = np.random.default_rng(10).random((2400, 256), dtype=np.float32)  # LID ~78
    _stand_in(monkeypatch, X, _counted_descent_lists)
    g = knnkit.dask.knn_graph(X, k=5, client=client, random_state=3)
    fb = g.stats.extra["descent_fallback"]
    assert g.stats.method == "dask-tree" and fb["before_descent"] and fb["intrinsic_dim"] >= STALL_LID
    assert _FAKE.get("calls", 0) == 0
    t = knnkit.dask.knn_graph(X, k=5, client=client, partition="tree", random_state=3)
    assert (g.indices == t.indices).all()
    Y = np.random.default_rng(11).random((2400, 4), dtype=np.float32)  # LID ~4
    _stand_in(monkeypatch, Y, _counted_descent_lists)
    h = knnkit.dask.knn_graph(Y, k=5, client=client, random_state=3)
    assert h.stats.method == "dask-descent" and _FAKE["calls"] == 2 and "descent_fallback" not in h.stats.extra
