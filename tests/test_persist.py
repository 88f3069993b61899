"""The one file container (``knnkit._core.persist``): round trips, atomicity, refusal of every
damaged file, byte order, content validators and the first-release formats."""

import builtins
import errno
import json
import os
import struct

import numpy as np
import pytest

from knnkit._core import persist as P
from knnkit._core import persist_checks as PC

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

ALL_DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
              np.float16, np.float32, np.float64, np.complex64, np.complex128]


def _sample(dtype, shape, rng):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def _assert_same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    # bit-for-bit (NaN payloads and -0.0 included)
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def _graph_arrays(n=6, k=3):
    ind = np.array([[(i + j + 1) % n for j in range(k)] for i in range(n)], np.int32)
    dist = np.tile(np.arange(1, k + 1, dtype=np.float32), (n, 1))
    return {"metric": "sqeuclidean", "n": n, "k": k, "include_self": False}, {"indices": ind, "distances": dist}


def _index_arrays(n=10, d=4, r=3, c=2):
    rng = np.random.default_rng(1)
    meta = {"metric": "euclidean", "dtype": "float32", "n": n, "dim": d, "graph_degree": r}
    arrays = {"data": rng.random((n, d), dtype=np.float32),
              "graph": np.array([[(i + j + 1) % n for j in range(r)] for i in range(n)], np.int32),
              "entry_centroids": rng.random((c, d), dtype=np.float32),
              "entry_medoids": np.arange(c, dtype=np.int32)}
    return meta, arrays


# ----------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("mmap", [False, True])
def test_round_trip_every_dtype(tmp_path, rng, mmap):
    arrays = {np.dtype(t).name: _sample(t, (7, 3), rng) for t in ALL_DTYPES}
    arrays["scalar"] = np.array(2.5)
    arrays["empty"] = np.zeros((0, 5), np.float32)
    arrays["fortran"] = np.asfortranarray(rng.random((4, 5)))
    arrays["strided"] = np.arange(20, dtype=np.int64)[::3]
    arrays["cube"] = rng.random((2, 3, 4), dtype=np.float32)
    meta = {"metric": "cosine", "nested": {"a": [1, 2.5, None, True]}, "np": np.int64(7), "inf": float("inf")}
    p = tmp_path / "all.knnkit"
    P.write_container(p, "test", meta, arrays, fsync=True)
    got_meta, got = P.read_container(p, kind="test", mmap=mmap)
    assert got_meta == {**meta, "np": 7}
    assert list(got) == list(arrays)
    for name, a in arrays.items():
        _assert_same(got[name], a)
        assert got[name].dtype.isnative
    assert os.listdir(tmp_path) == ["all.knnkit"]


def test_mmap_views_are_read_only_memmaps_and_aligned(tmp_path, rng):
    arrays = {"a": rng.random((100, 3), dtype=np.float32), "b": np.arange(17, dtype=np.int8),
              "c": rng.integers(0, 9, (5, 5))}
    p = tmp_path / "m.knnkit"
    P.write_container(p, "test", {}, arrays)
    _, got = P.read_container(p, mmap=True)
    for name, a in got.items():
        assert isinstance(a, np.memmap)
        assert not a.flags.writeable
        assert a.ctypes.data % P.ALIGN == 0
        _assert_same(a, arrays[name])
        with pytest.raises(ValueError):
            a[(0,) * a.ndim] = 1
    with open(p, "rb") as f:
        blob = f.read()
    header_len = struct.unpack_from("=Q", blob, 32)[0]
    for spec in json.loads(blob[40:40 + header_len])["arrays"]:
        assert spec["offset"] % P.ALIGN == 0


def test_unknown_kind_and_bad_inputs(tmp_path):
    p = tmp_path / "k.knnkit"
    P.write_container(p, "graph", {}, {"a": np.zeros(3)})
    with pytest.raises(ValueError, match=r"k\.knnkit.*'graph', not a 'index'"):
        P.read_container(p, kind="index")
    for kind in ("", "Graph", "a" * 17, "é"):
        with pytest.raises(ValueError, match="kind"):
            P.write_container(tmp_path / "x", kind, {}, {})
    with pytest.raises(TypeError, match="dtype"):
        P.write_container(tmp_path / "x", "t", {}, {"o": np.array([object()])})
    with pytest.raises(TypeError, match="dtype"):
        P.write_container(tmp_path / "x", "t", {}, {"s": np.array(["abc"])})
    with pytest.raises(IsADirectoryError, match="is a folder; give a file path"):
        P.write_container(tmp_path, "t", {}, {"a": np.zeros(3)})  # the path of a folder: refused first
    assert sorted(os.listdir(tmp_path)) == ["k.knnkit"]


def test_sniff(tmp_path):
    p = tmp_path / "c"
    P.write_container(p, "t", {}, {})
    assert P.sniff(p) == "container"
    assert P.sniff(os.path.join(FIXTURES, "graph_v1.knng")) == "legacy-graph"
    assert P.sniff(os.path.join(FIXTURES, "index_v1.knnk")) == "legacy-index"
    (tmp_path / "other").write_bytes(b"hello world")
    assert P.sniff(tmp_path / "other") is None
    (tmp_path / "short").write_bytes(b"KNN")
    assert P.sniff(tmp_path / "short") is None


# ----------------------------------------------------------------------------- atomicity

@pytest.mark.parametrize("code", [errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)])
@pytest.mark.parametrize("existing", [False, True])
def test_full_disk_leaves_nothing(tmp_path, monkeypatch, code, existing):
    p = tmp_path / "g.knnkit"
    if existing:
        P.write_container(p, "graph", {"v": "old"}, {"a": np.arange(4)})
    real_open = builtins.open
    writes = []

    class FullDisk:
        """A file object whose third write fails as a full disk does."""

        def __init__(self, f):
            self._f = f

        def write(self, b):
            writes.append(len(b))
            if len(writes) == 3:
                raise OSError(code, os.strerror(code))
            return self._f.write(b)

        def __getattr__(self, name):
            return getattr(self._f, name)

    def fake_open(file, mode="r", *a, **kw):
        f = real_open(file, mode, *a, **kw)
        return FullDisk(f) if "x" in mode else f

    monkeypatch.setattr(builtins, "open", fake_open)
    with pytest.raises(OSError, match="disk is full") as ei:
        P.write_container(p, "graph", {"v": "new"}, {"a": np.arange(100000), "b": np.ones(10)})
    monkeypatch.undo()
    assert ei.value.errno == code
    assert str(p) in str(ei.value)
    assert os.listdir(tmp_path) == (["g.knnkit"] if existing else [])
    if existing:
        assert P.read_container(p)[0] == {"v": "old"}


def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    def boom(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        P.write_container(tmp_path / "x", "t", {}, {"a": np.arange(10)})
    assert os.listdir(tmp_path) == []


def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError):
        P.write_container(tmp_path / "nope" / "x", "t", {}, {})


# ----------------------------------------------------------------------------- damaged files

@pytest.fixture
def small_file(tmp_path):
    p = tmp_path / "small.knnkit"
    P.write_container(p, "graph", {"m": 1}, {"ids": np.arange(6, dtype=np.int32).reshape(2, 3),
                                             "d": np.array([0.5, 1.5], np.float32)})
    return p


def test_every_truncation_refused(small_file, tmp_path):
    blob = small_file.read_bytes()
    q = tmp_path / "cut"
    for n in range(len(blob)):
        q.write_bytes(blob[:n])
        for mmap in (False, True):
            with pytest.raises(ValueError, match="cut"):
                P.read_container(q, mmap=mmap)
    # extra bytes at the end are refused too
    q.write_bytes(blob + b"\0")
    with pytest.raises(ValueError, match="corrupted"):
        P.read_container(q)


def test_every_byte_flip_refused(small_file, tmp_path):
    blob = bytearray(small_file.read_bytes())
    q = tmp_path / "flip"
    for i in range(len(blob)):
        for mask in (0x01, 0x80):
            bad = bytearray(blob)
            bad[i] ^= mask
            q.write_bytes(bytes(bad))
            with pytest.raises(ValueError, match="flip"):
                P.read_container(q, mmap=bool(i % 2))


def test_newer_version_refused(small_file):
    blob = bytearray(small_file.read_bytes())
    bo = "<" if blob[12:16] == struct.pack("<I", 0x01020304) else ">"
    blob[8:12] = struct.pack(bo + "I", P.FORMAT_VERSION + 1)
    small_file.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match=r"newer knnkit.*version 2"):
        P.read_container(small_file, verify=False)


def _rewrite_header(path, edit):
    """Rewrite the JSON header of a container with ``edit(header)`` and a valid checksum, so that
    only the structure checks can refuse it (a header that lies but is not corrupted)."""
    import hashlib

    blob = path.read_bytes()
    (hlen,) = struct.unpack_from("=Q", blob, 32)
    header = json.loads(blob[40:40 + hlen])
    edit(header)
    hb = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    # spaces (valid JSON) up to the end of the header's padding keep every array where it was
    region = hlen + (-(40 + hlen)) % 64
    assert len(hb) <= region
    hb = hb.ljust(region)
    body = blob[:32] + struct.pack("=Q", region) + hb + blob[40 + region:-32]
    path.write_bytes(body + hashlib.blake2b(body, digest_size=32).digest())


@pytest.mark.parametrize("edit, match", [
    (lambda h: h["arrays"][1].update(offset=h["arrays"][1]["offset"] + 64), "offset"),
    (lambda h: h["arrays"][1].update(offset=10 ** 9), "offset"),
    (lambda h: h["arrays"][0].update(shape=[3, 3]), "needs"),
    (lambda h: h["arrays"][0].update(shape=[2, -3]), "shape"),
    (lambda h: h["arrays"][0].update(shape=[2, 3.0]), "shape"),
    (lambda h: h["arrays"][0].update(dtype="|O"), "dtype"),
    (lambda h: h["arrays"][0].update(dtype="<U1"), "dtype"),
    (lambda h: h["arrays"][0].update(dtype="float32"), "dtype"),
    (lambda h: h["arrays"][0].update(dtype="<f5"), "dtype"),
    (lambda h: h["arrays"][0].update(nbytes=True), "integers"),
    (lambda h: h["arrays"][1].update(name="ids"), "name"),
    (lambda h: h["arrays"].pop(), "describes"),
    (lambda h: h.update(extra=1), "header"),
])
def test_header_that_lies_refused(small_file, edit, match):
    _rewrite_header(small_file, edit)
    for verify in (True, False):
        with pytest.raises(ValueError, match=match):
            P.read_container(small_file, verify=verify)


# ----------------------------------------------------------------------------- byte order

@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("mmap", [False, True])
def test_other_byte_order_read_back_equal(tmp_path, rng, order, mmap):
    arrays = {np.dtype(t).name: _sample(t, (5, 2), rng) for t in ALL_DTYPES}
    p = tmp_path / "be.knnkit"
    P.write_container(p, "test", {"x": 1}, arrays, byteorder=order)
    blob = p.read_bytes()
    assert blob[12:16] == struct.pack(order + "I", 0x01020304)
    (hlen,) = struct.unpack_from(order + "Q", blob, 32)
    specs = json.loads(blob[40:40 + hlen])["arrays"]
    assert all(s["dtype"][0] in (order, "|") for s in specs)
    meta, got = P.read_container(p, mmap=mmap)
    assert meta == {"x": 1}
    for name, a in arrays.items():
        assert got[name].dtype.isnative
        np.testing.assert_array_equal(got[name], a)


def test_explicit_big_endian_array(tmp_path):
    a = np.arange(12, dtype=">f8").reshape(3, 4)
    P.write_container(tmp_path / "x", "t", {}, {"a": a})
    _, got = P.read_container(tmp_path / "x")
    assert got["a"].dtype == np.float64 and got["a"].dtype.isnative
    np.testing.assert_array_equal(got["a"], a)


# ----------------------------------------------------------------------------- validators

def test_validate_graph_accepts_good_and_holes():
    meta, arrays = _graph_arrays()
    PC.validate_graph(meta, arrays, "g")
    arrays["indices"][0, 2] = -1
    arrays["distances"][0, 2] = np.inf
    PC.validate_graph(meta, arrays, "g")
    ip = dict(meta, metric="inner_product")
    arrays["distances"][0, 2] = -np.inf
    PC.validate_graph(ip, arrays, "g")


def _g(edit):
    meta, arrays = _graph_arrays()
    edit(meta, arrays)
    return meta, arrays


@pytest.mark.parametrize("meta_arrays, match", [
    (_g(lambda m, a: a["indices"].__setitem__((1, 1), -2)), "indices"),
    (_g(lambda m, a: a["indices"].__setitem__((1, 1), 6)), "indices"),
    (_g(lambda m, a: a["indices"].__setitem__((1, 1), -1)), "-1 slot"),
    (_g(lambda m, a: a.update(indices=a["indices"].astype(np.float32))), "integers"),
    (_g(lambda m, a: a.update(distances=a["distances"].astype(np.float64))), "float32"),
    (_g(lambda m, a: a.update(distances=a["distances"][:, :2].copy())), "shape"),
    (_g(lambda m, a: a.update(indices=a["indices"].reshape(-1))), "2-D"),
    (_g(lambda m, a: m.update(metric="foo")), "metric 'foo'"),
    (_g(lambda m, a: m.pop("metric")), "metric None"),
    (_g(lambda m, a: m.update(n=7)), "n=7"),
    (_g(lambda m, a: m.update(k=2)), "k=2"),
    (_g(lambda m, a: m.update(k="3")), "k='3'"),
    (_g(lambda m, a: m.update(include_self="no")), "include_self"),
    (_g(lambda m, a: a.pop("distances")), "missing"),
])
def test_validate_graph_refuses(meta_arrays, match):
    with pytest.raises(ValueError, match=r"^the/file\.knng: .*" + match):
        PC.validate_graph(*meta_arrays, "the/file.knng")


def _i(edit):
    meta, arrays = _index_arrays()
    edit(meta, arrays)
    return meta, arrays


def test_validate_index_accepts_good():
    PC.validate_index(*_index_arrays(), "i")
    meta, arrays = _index_arrays()
    for dt in ("float16", "uint8", "int8"):
        arrays["data"] = arrays["data"].astype(dt)
        PC.validate_index(dict(meta, dtype=dt), arrays, "i")
    arrays["graph"][3, 1] = -1
    PC.validate_index(dict(meta, dtype="int8"), arrays, "i")


@pytest.mark.parametrize("meta_arrays, match", [
    (_i(lambda m, a: a["graph"].__setitem__((2, 0), 10)), "graph hold"),
    (_i(lambda m, a: a["graph"].__setitem__((2, 0), -2)), "graph hold"),
    (_i(lambda m, a: a.update(graph=a["graph"].astype(np.int64))), "graph must be int32"),
    (_i(lambda m, a: a.update(graph=a["graph"].astype(np.float32))), "graph must be int32"),
    (_i(lambda m, a: a.update(graph=a["graph"][:5])), "graph shape"),
    (_i(lambda m, a: a.update(data=a["data"].astype(np.float64))), "data dtype"),
    (_i(lambda m, a: a.update(data=a["data"].reshape(-1))), "2-D"),
    (_i(lambda m, a: m.update(dtype="float16")), "meta dtype"),
    (_i(lambda m, a: a["entry_medoids"].__setitem__(0, 10)), "entry_medoids"),
    (_i(lambda m, a: a["entry_medoids"].__setitem__(0, -1)), "entry_medoids"),
    (_i(lambda m, a: a.update(entry_medoids=a["entry_medoids"].astype(np.float32))), "entry_medoids"),
    (_i(lambda m, a: a["entry_centroids"].__setitem__((0, 0), np.nan)), "NaN"),
    (_i(lambda m, a: a.update(entry_centroids=a["entry_centroids"][:, :3].copy())), "entry_centroids shape"),
    (_i(lambda m, a: a.update(entry_centroids=a["entry_centroids"].astype(np.float64))), "float32"),
    (_i(lambda m, a: m.update(metric="foo")), "metric 'foo'"),
    (_i(lambda m, a: m.update(dim=5)), "dim=5"),
    (_i(lambda m, a: m.update(n=11)), "n=11"),
    (_i(lambda m, a: m.update(graph_degree=4)), "graph_degree=4"),
    (_i(lambda m, a: a.pop("graph")), "missing"),
])
def test_validate_index_refuses(meta_arrays, match):
    with pytest.raises(ValueError, match=r"^idx\.knnk: .*" + match):
        PC.validate_index(*meta_arrays, "idx.knnk")


def test_validators_on_a_container_round_trip(tmp_path):
    for kind, (meta, arrays), check in (("graph", _graph_arrays(), PC.validate_graph),
                                         ("index", _index_arrays(), PC.validate_index)):
        p = tmp_path / kind
        P.write_container(p, kind, meta, arrays)
        for mmap in (False, True):
            m, a = P.read_container(p, kind=kind, mmap=mmap)
            check(m, a, p)


# ----------------------------------------------------------------------------- first-release files

def test_legacy_graph_fixture():
    path = os.path.join(FIXTURES, "graph_v1.knng")
    meta, arrays = PC.read_legacy_graph(path)
    expected = np.load(os.path.join(FIXTURES, "graph_v1_expected.npz"))
    _assert_same(arrays["indices"], expected["indices"])
    _assert_same(arrays["distances"], expected["distances"])
    assert meta["metric"] == str(expected["metric"]) and meta["k"] == int(expected["k"]) and meta["n"] == 200
    PC.validate_graph(meta, arrays, path)


def test_legacy_index_fixture():
    path = os.path.join(FIXTURES, "index_v1.knnk")
    meta, arrays = PC.read_legacy_index(path)
    expected = np.load(os.path.join(FIXTURES, "index_v1_expected.npz"))
    for name in ("data", "graph", "entry_centroids", "entry_medoids"):
        _assert_same(arrays[name], expected[name])
    np.testing.assert_array_equal(arrays["data"], np.load(os.path.join(FIXTURES, "fixture_data.npy")))
    assert meta["metric"] == str(expected["metric"]) and meta["n"] == 200
    PC.validate_index(meta, arrays, path)


@pytest.mark.parametrize("name, reader", [("graph_v1.knng", PC.read_legacy_graph),
                                          ("index_v1.knnk", PC.read_legacy_index)])
def test_legacy_damage_refused(tmp_path, name, reader):
    blob = open(os.path.join(FIXTURES, name), "rb").read()
    q = tmp_path / name
    step = max(1, len(blob) // 97)  # a spread of positions keeps this fast on the 8-14 KB files
    for n in list(range(0, len(blob), step)) + [len(blob) - 1]:
        q.write_bytes(blob[:n])
        with pytest.raises(ValueError, match=name):
            reader(q)
    for i in list(range(0, len(blob), step)) + [len(blob) - 1]:
        bad = bytearray(blob)
        bad[i] ^= 0x10
        q.write_bytes(bytes(bad))
        with pytest.raises(ValueError, match=name):
            reader(q)
    with pytest.raises(ValueError, match="not a knnkit"):
        (PC.read_legacy_index if reader is PC.read_legacy_graph else PC.read_legacy_graph)(
            os.path.join(FIXTURES, name))
