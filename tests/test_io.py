"""knnkit.io: every format round-trips, row ranges and memory maps read the right rows,
broken files raise ValueError naming the file and the problem."""

import os

import numpy as np
import pytest

from knnkit import io

FORMAT_DTYPES = {".fvecs": np.float32, ".ivecs": np.int32, ".bvecs": np.uint8, ".fbin": np.float32,
                 ".ibin": np.int32, ".u8bin": np.uint8, ".i8bin": np.int8}


def _random(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    lo, hi = max(info.min, -(2 ** 31)), min(info.max, 2 ** 31 - 1)
    return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)


@pytest.mark.parametrize("ext", sorted(FORMAT_DTYPES))
@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (130, 129)])
def test_roundtrip(tmp_path, rng, ext, shape):
    dtype = FORMAT_DTYPES[ext]
    x = _random(rng, shape, dtype)
    path = tmp_path / f"x{ext}"
    io.write(path, x)
    y = io.read(path)
    assert y.dtype == dtype and y.shape == shape and y.flags.c_contiguous
    assert type(y) is np.ndarray and y.flags.writeable     # in memory, not a view of the file
    np.testing.assert_array_equal(y, x)
    # exact byte layout: header(s) + little-endian payload
    header = 4 * shape[0] if ext.endswith("vecs") else 8
    assert os.path.getsize(path) == header + x.nbytes


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64, np.uint8, np.int8, np.int32])
def test_npy_roundtrip_keeps_dtype(tmp_path, rng, dtype):
    x = _random(rng, (9, 5), dtype)
    io.write(tmp_path / "x.npy", x)
    y = io.read(tmp_path / "x.npy")
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, x)


def test_texmex_layout_matches_reference(tmp_path):
    # what the TEXMEX readers everyone uses expect: int32 d before each row
    x = np.array([[1.5, -2.0], [3.0, 4.25]], np.float32)
    io.write(tmp_path / "a.fvecs", x)
    raw = np.fromfile(tmp_path / "a.fvecs", dtype="<i4").reshape(2, 3)
    assert (raw[:, 0] == 2).all()
    np.testing.assert_array_equal(raw[:, 1:].view("<f4"), x)
    io.write(tmp_path / "a.u8bin", np.arange(6, dtype=np.uint8).reshape(3, 2))
    raw = np.fromfile(tmp_path / "a.u8bin", dtype=np.uint8)
    assert raw[:8].view("<u4").tolist() == [3, 2] and raw[8:].tolist() == list(range(6))


def test_write_casts(tmp_path):
    idx = np.array([[0, 5], [2 ** 31 - 1, 1]], np.int64)
    io.write(tmp_path / "i.ibin", idx)
    assert io.read(tmp_path / "i.ibin").dtype == np.int32
    np.testing.assert_array_equal(io.read(tmp_path / "i.ibin"), idx)
    with pytest.raises(ValueError, match="do not fit"):
        io.write(tmp_path / "j.ibin", idx + 1)
    with pytest.raises(ValueError, match="do not fit"):
        io.write(tmp_path / "k.u8bin", np.array([[256]]))
    with pytest.raises(TypeError, match="cast it explicitly"):
        io.write(tmp_path / "l.bvecs", np.ones((2, 2), np.float32))
    io.write(tmp_path / "m.fvecs", np.eye(3))  # float64 -> float32
    assert io.read(tmp_path / "m.fvecs").dtype == np.float32
    assert not (tmp_path / "j.ibin").exists()
    with pytest.raises(ValueError, match="2-D"):
        io.write(tmp_path / "n.fbin", np.ones(4, np.float32))


@pytest.mark.parametrize("ext", [".fvecs", ".bvecs", ".fbin", ".i8bin", ".npy"])
def test_row_ranges_and_mmap(tmp_path, rng, ext):
    dtype = FORMAT_DTYPES.get(ext, np.float32)
    x = _random(rng, (50, 13), dtype)   # d=13: bvecs rows are 17 bytes, unaligned
    path = tmp_path / f"x{ext}"
    io.write(path, x)
    np.testing.assert_array_equal(io.read(path, rows=7), x[:7])
    np.testing.assert_array_equal(io.read(path, rows=(10, 23)), x[10:23])
    np.testing.assert_array_equal(io.read(path, rows=(49, None)), x[49:])
    np.testing.assert_array_equal(io.read(path, rows=slice(3, 40, 6)), x[3:40:6])
    np.testing.assert_array_equal(io.read(path, rows=np.array([5, 0, 49, 5])), x[[5, 0, 49, 5]])
    assert io.read(path, rows=(20, 20)).shape == (0, 13)
    m = io.read(path, mmap=True, rows=(5, 45))
    assert isinstance(m, np.memmap) or isinstance(getattr(m, "base", None), np.memmap)
    np.testing.assert_array_equal(m, x[5:45])
    with pytest.raises(ValueError, match="outside"):
        io.read(path, rows=(40, 51))
    with pytest.raises(ValueError, match="more than"):
        io.read(path, rows=51)

    with io.open_vectors(path) as f:
        assert f.shape == (50, 13) and len(f) == 50 and f.dtype == dtype
        np.testing.assert_array_equal(f.read_rows(48, 50), x[48:])
        assert type(f.read_rows(0, 50)) is np.ndarray and type(f[3:9]) is np.ndarray
        np.testing.assert_array_equal(f[11], x[11])
        np.testing.assert_array_equal(f[-1, 2:5], x[-1, 2:5])
        np.testing.assert_array_equal(np.asarray(f), x)
        blocks = list(f.iter_chunks(16))
        assert [s for s, _ in blocks] == [0, 16, 32, 48]
        np.testing.assert_array_equal(np.concatenate([b for _, b in blocks]), x)
        with pytest.raises(ValueError):
            f.read_rows(10, 60)


def test_memmap_reads_only_requested_rows_of_a_large_file(tmp_path):
    # a file of 2e5 x 128 float32 (100 MB) opened without reading it: only the rows asked for are touched
    n, d = 200_000, 128
    path = tmp_path / "big.fbin"
    with io.VectorWriter(path) as w:
        for s in range(0, n, 50_000):
            block = np.broadcast_to(np.arange(s, s + 50_000, dtype=np.float32)[:, None], (50_000, d))
            w.append(block)
    f = io.open_vectors(path)
    assert f.shape == (n, d)
    rows = f.read_rows(123_456, 123_460)
    np.testing.assert_array_equal(rows[:, 0], np.arange(123_456, 123_460))
    assert (rows == rows[:, :1]).all()


def test_vector_writer_texmex_and_abort(tmp_path, rng):
    x = _random(rng, (10, 4), np.int32)
    with io.VectorWriter(tmp_path / "g.ivecs") as w:
        w.append(x[:3])
        w.append(x[3:])
        with pytest.raises(ValueError, match="d=5"):
            w.append(np.zeros((1, 5), np.int32))
    np.testing.assert_array_equal(io.read(tmp_path / "g.ivecs"), x)
    with pytest.raises(RuntimeError):
        with io.VectorWriter(tmp_path / "h.fbin") as w:
            w.append(x)
            raise RuntimeError("producer failed")
    assert not (tmp_path / "h.fbin").exists()
    assert os.listdir(tmp_path) == ["g.ivecs"]   # no temporary file left behind


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    path = tmp_path / "x.fbin"
    io.write(path, np.ones((2, 2), np.float32))

    class Exploding:
        # an array-like whose conversion fails after the temporary file would have been opened
        def __array__(self, dtype=None, copy=None):
            return np.array([["a"]])

    with pytest.raises(TypeError):
        io.write(path, Exploding())
    np.testing.assert_array_equal(io.read(path), np.ones((2, 2)))
    with pytest.raises(ZeroDivisionError):
        with io.atomic_write(path) as f:
            f.write(b"partial")
            1 / 0
    np.testing.assert_array_equal(io.read(path), np.ones((2, 2)))
    assert os.listdir(tmp_path) == ["x.fbin"]
    io.write(path, np.zeros((3, 1), np.float32), atomic=False)
    assert io.read(path).shape == (3, 1)


def test_truncated_and_inconsistent_files(tmp_path):
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    for ext in (".fbin", ".fvecs"):
        path = tmp_path / f"t{ext}"
        io.write(path, x)
        raw = path.read_bytes()
        path.write_bytes(raw[:-3])
        with pytest.raises(ValueError, match=r"t\%s.*truncated" % ext):
            io.read(path)
        path.write_bytes(raw[:2])
        with pytest.raises(ValueError, match="truncated"):
            io.open_vectors(path)
    path = tmp_path / "extra.fbin"
    io.write(path, x)
    path.write_bytes(path.read_bytes() + b"\0" * 4)
    with pytest.raises(ValueError, match="trailing"):
        io.read(path)
    # rows of a TEXMEX file with different dimensions: same total size, second header says 5
    path = tmp_path / "mixed.fvecs"
    io.write(path, x)
    raw = bytearray(path.read_bytes())
    raw[28:32] = np.int32(5).tobytes()
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"mixed\.fvecs.*row 1 has d=5"):
        io.read(path)
    # a header that cannot be a dimension
    path.write_bytes(np.int32(-3).tobytes() + b"\0" * 12)
    with pytest.raises(ValueError, match="invalid dimension"):
        io.read(path)
    path = tmp_path / "empty.ivecs"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        io.read(path)
    path = tmp_path / "bad.npy"
    io.write(path, x)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError, match=r"bad\.npy"):
        io.read(path)


def test_inconsistent_rows_in_large_texmex_found_when_read(tmp_path, monkeypatch):
    # above the full-check size only a sample of headers is checked on open; rows read are always checked
    from knnkit._core import vectors

    monkeypatch.setattr(vectors, "_FULL_CHECK_BYTES", 0)
    x = np.ones((5000, 2), np.float32)
    path = tmp_path / "big.fvecs"
    io.write(path, x)
    raw = bytearray(path.read_bytes())
    row = 1234   # not on the 1025-point sample grid of 5000 rows
    raw[row * 12:row * 12 + 4] = np.int32(7).tobytes()
    path.write_bytes(bytes(raw))
    f = io.open_vectors(path)
    assert f.read_rows(0, 1000).shape == (1000, 2)
    with pytest.raises(ValueError, match="row 1234 has d=7"):
        f.read_rows(1000, 2000)
    with pytest.raises(ValueError, match="row 1234"):
        f[[1234]]


def test_unknown_extension_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"x\.txt.*unknown vector file extension"):
        io.read(tmp_path / "x.txt")
    with pytest.raises(ValueError, match="unknown"):
        io.write(tmp_path / "x", np.ones((1, 1)))
    with pytest.raises(ValueError, match="read_hdf5"):
        io.read(tmp_path / "x.hdf5")
    with pytest.raises(FileNotFoundError, match="nothere"):
        io.read(tmp_path / "nothere.fvecs")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        io.write(tmp_path / "nodir" / "x.fbin", np.ones((1, 1), np.float32))


def test_zero_rows_bin(tmp_path):
    io.write(tmp_path / "z.fbin", np.zeros((0, 5), np.float32))
    assert io.read(tmp_path / "z.fbin").shape == (0, 5)
    with pytest.raises(ValueError, match="0 rows"):
        io.write(tmp_path / "z.fvecs", np.zeros((0, 5), np.float32))


def test_write_torch_tensor(tmp_path):
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    io.write(tmp_path / "t.fbin", t)
    np.testing.assert_array_equal(io.read(tmp_path / "t.fbin"), t.numpy())


def test_read_hdf5(tmp_path, rng):
    h5py = pytest.importorskip("h5py")
    train = rng.standard_normal((20, 4)).astype(np.float32)
    test = rng.standard_normal((3, 4)).astype(np.float32)
    nb = rng.integers(0, 20, (3, 5)).astype(np.int32)
    path = tmp_path / "toy-4-angular.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("train", data=train)
        f.create_dataset("test", data=test)
        f.create_dataset("neighbors", data=nb)
        f.create_dataset("distances", data=np.ones((3, 5), np.float64))
        f.attrs["distance"] = "angular"
    d = io.read_hdf5(path)
    np.testing.assert_array_equal(d["train"], train)
    np.testing.assert_array_equal(d["test"], test)
    np.testing.assert_array_equal(d["neighbors"], nb)
    assert d["neighbors"].dtype == np.int64 and d["distances"].dtype == np.float32
    assert d["metric"] == "cosine"
    (tmp_path / "junk.hdf5").write_bytes(b"not hdf5")
    with pytest.raises(ValueError, match="junk"):
        io.read_hdf5(tmp_path / "junk.hdf5")


def test_read_hdf5_without_h5py(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *a, **k):
        if name == "h5py":
            raise ImportError("no h5py")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match="pip install h5py"):
        io.read_hdf5(tmp_path / "x.hdf5")


@pytest.mark.parametrize("ext", [".fvecs", ".bvecs", ".u8bin"])
def test_large_reads_in_blocks(tmp_path, rng, monkeypatch, ext):
    # reads above the progress threshold are copied block by block: same result, all rows checked
    from knnkit._core import vectors

    monkeypatch.setattr(vectors, "_PROGRESS_BYTES", 4096)
    x = _random(rng, (3001, 7), FORMAT_DTYPES[ext])
    io.write(tmp_path / f"x{ext}", x)
    np.testing.assert_array_equal(io.read(tmp_path / f"x{ext}"), x)
    np.testing.assert_array_equal(io.read(tmp_path / f"x{ext}", rows=(17, 2999)), x[17:2999])
