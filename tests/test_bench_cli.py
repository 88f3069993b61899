"""``knnkit bench``: end to end on tiny npy and ann-benchmarks HDF5 files, JSON and PNG checked."""

import json

import numpy as np
import pytest

from knnkit import bench, cli, io


def _brute_ids(x, q, k):
    d2 = ((q[:, None, :].astype(np.float64) - x[None].astype(np.float64)) ** 2).sum(-1)
    return np.argsort(d2, axis=1, kind="stable")[:, :k]


def _check_json(path, methods, k, n, nq):
    out = json.loads(path.read_text())
    assert out["meta"]["k"] == k and out["meta"]["n"] == n and out["meta"]["n_queries"] == nq
    got = {r["method"] for r in out["results"]}
    assert got == set(methods)
    for r in out["results"]:
        assert 0.0 <= r["recall"] <= 1.0
        assert r["build_s"] >= 0
    exact = [r for r in out["results"] if r["method"] == "exact"]
    assert len(exact) == 1 and exact[0]["recall"] == 1.0 and exact[0]["qps"] > 0
    return out


def test_bench_npy_held_out_queries(tmp_path, rng, capsys):
    x = rng.standard_normal((600, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    rc = cli.main(["-q", "bench", str(tmp_path / "x.npy"), "--methods", "exact,index", "--k", "5", "--beams", "5,40",
                   "--n-queries", "30", "--device", "cpu", "--out", str(tmp_path / "b"), "--no-plot"])
    assert rc == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "30 rows held out" in text and "recall@k" in text
    out = _check_json(tmp_path / "b" / "bench.json", ["exact", "index"], 5, 570, 30)
    index_rows = [r for r in out["results"] if r["method"] == "index"]
    assert [r["value"] for r in index_rows] == [5, 40]
    assert index_rows[-1]["recall"] >= 0.9          # a 600-point index at beam 40 finds nearly everything
    assert not (tmp_path / "b" / "bench.png").exists()


def test_bench_hdf5_with_groundtruth_and_plot(tmp_path, rng, capsys):
    h5py = pytest.importorskip("h5py")
    pytest.importorskip("matplotlib")
    x = rng.standard_normal((500, 6)).astype(np.float32)
    q = rng.standard_normal((25, 6)).astype(np.float32)
    true = _brute_ids(x, q, 10)
    with h5py.File(tmp_path / "t.hdf5", "w") as f:
        f.create_dataset("train", data=x)
        f.create_dataset("test", data=q)
        f.create_dataset("neighbors", data=true.astype(np.int32))
        f.attrs["distance"] = "euclidean"
    rc = cli.main(["-q", "bench", str(tmp_path / "t.hdf5"), "--methods", "exact,hnswlib,graph", "--k", "10",
                   "--beams", "10,50", "--device", "cpu", "--out", str(tmp_path / "b")])
    assert rc == 0, capsys.readouterr().err
    methods = ["exact", "graph"] + (["hnswlib"] if _importable("hnswlib") else [])
    out = _check_json(tmp_path / "b" / "bench.json", methods, 10, 500, 25)
    assert out["meta"]["metric"] == "euclidean" and out["meta"]["groundtruth"] == "given"
    png = (tmp_path / "b" / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def _importable(name):
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def test_bench_given_groundtruth_and_bad_arguments(tmp_path, rng):
    x = rng.standard_normal((300, 4)).astype(np.float32)
    q = rng.standard_normal((12, 4)).astype(np.float32)
    true = _brute_ids(x, q, 5)
    out = bench.run_bench(x, q, k=5, methods=["exact"], groundtruth=true, device="cpu")
    assert out["results"][0]["recall"] == 1.0 and out["meta"]["groundtruth"] == "given"
    with pytest.raises(ValueError, match="ids up to"):
        bench.run_bench(x, q, k=5, methods="exact", groundtruth=true + 300, device="cpu")
    with pytest.raises(ValueError, match="groundtruth"):
        bench.run_bench(x, q, k=5, methods="exact", groundtruth=true[:, :3], device="cpu")
    with pytest.raises(ValueError, match="methods"):
        bench.run_bench(x, q, k=5, methods="exact,annoy", device="cpu")
    with pytest.raises(ValueError, match="k"):
        bench.run_bench(x, q, k=0, methods="exact", device="cpu")


def test_bench_recall_counts_ties():
    # four points at the same distance from the query: any two of them are a correct 2-NN answer
    x = np.array([[1, 0], [0, 1], [-1, 0], [0, -1], [5, 5]], dtype=np.float32)
    q = np.zeros((1, 2), dtype=np.float32)
    true = np.array([[0, 1]])
    scores = bench._scores(x, q, true, "sqeuclidean")
    assert bench._recall(x, q, np.array([[3, 2]]), true, 2, "sqeuclidean", scores) == 1.0
    assert bench._recall(x, q, np.array([[3, 4]]), true, 2, "sqeuclidean", scores) == 0.5


def test_peer_skipped_with_note(tmp_path, rng, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_hnswlib(name, *a, **kw):
        if name == "hnswlib":
            raise ImportError("No module named 'hnswlib'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_hnswlib)
    notes = []
    x = rng.standard_normal((200, 4)).astype(np.float32)
    out = bench.run_bench(x[10:], x[:10], k=3, methods="exact,hnswlib", device="cpu", log=notes.append)
    assert "hnswlib" in out["skipped"] and any("hnswlib skipped" in n for n in notes)
    assert [r["method"] for r in out["results"]] == ["exact"]


def test_load_bench_data_errors(tmp_path, rng):
    x = rng.standard_normal((100, 3)).astype(np.float32)
    io.write(tmp_path / "x.fbin", x)
    io.write(tmp_path / "q.fbin", x[:5, :2])
    with pytest.raises(ValueError, match="dimension"):
        bench.load_bench_data(str(tmp_path / "x.fbin"), str(tmp_path / "q.fbin"))
    io.write(tmp_path / "gt.ivecs", np.zeros((4, 3), dtype=np.int32))
    with pytest.raises(ValueError, match="needs --queries"):
        bench.load_bench_data(str(tmp_path / "x.fbin"), groundtruth=str(tmp_path / "gt.ivecs"))
    io.write(tmp_path / "q2.fbin", x[:5])
    with pytest.raises(ValueError, match="rows for 5 queries"):
        bench.load_bench_data(str(tmp_path / "x.fbin"), str(tmp_path / "q2.fbin"), str(tmp_path / "gt.ivecs"))
    d = bench.load_bench_data(str(tmp_path / "x.fbin"), n_queries=1000, random_state=3)
    # held-out queries are at most a tenth, removed from the data, and together they are the file's rows
    assert d["held_out"] == 10 and d["data"].shape == (90, 3)
    both = np.concatenate([d["data"], d["queries"]])
    assert sorted(map(tuple, both.tolist())) == sorted(map(tuple, x.tolist()))


def test_plot_without_matplotlib_names_the_extra(monkeypatch, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_mpl(name, *a, **kw):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    with pytest.raises(ImportError, match=r"knnkit\[plot\]"):
        bench.plot_bench({"results": [], "meta": {}}, str(tmp_path / "x.png"))
