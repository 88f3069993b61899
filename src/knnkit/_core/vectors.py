"""TEXMEX (``.fvecs/.ivecs/.bvecs``), big-ann (``.fbin/.ibin/.u8bin/.i8bin``) and ``.npy``
vector files: whole-file and row-range reads, memory-mapped access, atomic writes."""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import IO, Any, Iterator

import numpy as np

from .backend import inspect_array, as_host
from .config import progress
from .types import ArrayLike, HostArray, PathLike

__all__ = ["FORMATS", "format_of", "read", "write", "open_vectors", "VectorFile", "VectorWriter",
           "atomic_write"]

# extension -> (layout, element dtype). Everything on disk is little-endian.
FORMATS = {
    ".fvecs": ("vecs", np.dtype("<f4")),
    ".ivecs": ("vecs", np.dtype("<i4")),
    ".bvecs": ("vecs", np.dtype("u1")),
    ".fbin": ("bin", np.dtype("<f4")),
    ".ibin": ("bin", np.dtype("<i4")),
    ".u8bin": ("bin", np.dtype("u1")),
    ".i8bin": ("bin", np.dtype("i1")),
    ".npy": ("npy", None),
}
_HDF5 = (".hdf5", ".h5")

# Below this size every per-row header of a TEXMEX file is checked when it is opened;
# above it only a sample is (checking all would read the whole file), and the rows a
# read returns are checked as they are read.
_FULL_CHECK_BYTES = 256 << 20
_WRITE_CHUNK_ROWS = 1 << 16
_PROGRESS_BYTES = 256 << 20     # reads larger than this are copied in blocks under a progress bar


def format_of(path: PathLike) -> tuple[str, str, Any]:
    """``(extension, layout, dtype)`` of ``path``; ValueError for an unknown extension.

    ``layout`` is ``"vecs"``, ``"bin"`` or ``"npy"``; ``dtype`` is None for ``.npy``.
    """
    ext = os.path.splitext(os.fspath(path))[1].lower()
    if ext in FORMATS:
        return (ext,) + FORMATS[ext]
    if ext in _HDF5:
        raise ValueError(f"{path}: HDF5 files hold several arrays; read them with knnkit.io.read_hdf5")
    known = ", ".join(FORMATS)
    raise ValueError(f"{path}: unknown vector file extension {ext or '(none)'!r}; expected one of {known}")


# --------------------------------------------------------------------------- reading


class VectorFile:
    """A vector file opened for memory-mapped, row-range access (see :func:`open_vectors`).

    Attributes
    ----------
    path : str
    shape : tuple
        ``(n, d)`` (any shape for ``.npy``).
    dtype : numpy.dtype
    array : numpy.ndarray
        Zero-copy memory-mapped view of the vectors. For TEXMEX files it is a strided view that
        skips the per-row headers (not C-contiguous).
    """

    def __init__(self, path: PathLike) -> None:
        self.path = os.fspath(path)
        self.extension, self.layout, dtype = format_of(self.path)
        try:
            size = os.path.getsize(self.path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path}: no such file") from None
        self._headers = None
        if self.layout == "npy":
            self.array = self._open_npy()
        elif self.layout == "bin":
            self.array = self._open_bin(dtype, size)
        else:
            self.array = self._open_vecs(dtype, size)
        self.shape = tuple(self.array.shape)
        self.dtype = self.array.dtype

    # -- opening

    def _error(self, problem):
        return ValueError(f"{self.path}: {problem}")

    def _open_npy(self):
        try:
            return np.load(self.path, mmap_mode="r", allow_pickle=False)
        except ValueError as e:
            raise self._error(f"not a readable .npy file or truncated ({e})") from None

    def _open_bin(self, dtype, size):
        if size < 8:
            raise self._error(f"truncated: {size} bytes, shorter than the 8-byte (n, d) header")
        n, d = (int(v) for v in np.fromfile(self.path, dtype="<u4", count=2))
        expected = 8 + n * d * dtype.itemsize
        if size != expected:
            what = "truncated" if size < expected else "has trailing bytes"
            raise self._error(f"{what}: header says n={n}, d={d} ({dtype.name}), which needs {expected} "
                              f"bytes, but the file has {size} bytes")
        if n * d == 0:
            return np.empty((n, d), dtype)
        return np.memmap(self.path, dtype=dtype, mode="r", offset=8, shape=(n, d))

    def _open_vecs(self, dtype, size):
        if size == 0:
            raise self._error("empty file (a TEXMEX file with no rows has no dimension)")
        if size < 4:
            raise self._error(f"truncated: {size} bytes, shorter than the 4-byte dimension header")
        d = int(np.fromfile(self.path, dtype="<i4", count=1)[0])
        if d <= 0:
            raise self._error(f"invalid dimension {d} in the first row header (corrupt file or wrong format)")
        row_bytes = 4 + d * dtype.itemsize
        if size % row_bytes:
            raise self._error(f"truncated or inconsistent: {size} bytes is not a multiple of the row size "
                              f"{row_bytes} (4-byte header + {d} x {dtype.name}) given by the first row's d={d}")
        n = size // row_bytes
        self._d = d
        rec = np.memmap(self.path, dtype=np.dtype([("d", "<i4"), ("v", dtype, (d,))]), mode="r", shape=(n,))
        self._headers = rec["d"]
        # checking every header reads the whole file; only do so while that is cheap
        if size <= _FULL_CHECK_BYTES:
            self._check_headers(0, n)
        else:
            sample = np.unique(np.linspace(0, n - 1, 1025).astype(np.int64))
            self._check_headers_at(sample)
        return rec["v"]

    # -- header checks (TEXMEX)

    def _check_headers_at(self, rows):
        h = np.asarray(self._headers[rows])
        bad = np.flatnonzero(h != self._d)
        if bad.size:
            i = int(rows[bad[0]])
            raise self._error(f"inconsistent row dimensions: row {i} has d={int(h[bad[0]])} but row 0 has "
                              f"d={self._d} (every row of a TEXMEX file must have the same d)")

    def _check_headers(self, start, stop):
        if self._headers is None or stop <= start:
            return
        h = np.asarray(self._headers[start:stop])
        bad = np.flatnonzero(h != self._d)
        if bad.size:
            i = start + int(bad[0])
            raise self._error(f"inconsistent row dimensions: row {i} has d={int(h[bad[0]])} but row 0 has "
                              f"d={self._d} (every row of a TEXMEX file must have the same d)")

    # -- access

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        return f"VectorFile({self.path!r}, shape={self.shape}, dtype={self.dtype.name})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Drop the memory map (views already handed out stay valid until they are freed)."""
        self.array = None
        self._headers = None

    def _check_open(self):
        if self.array is None:
            raise ValueError(f"{self.path}: file is closed")

    def read_rows(self, start: int = 0, stop: int | None = None) -> HostArray:
        """Rows ``start:stop`` as a new C-contiguous array in memory."""
        self._check_open()
        n = self.shape[0]
        stop = n if stop is None else stop
        if not (isinstance(start, (int, np.integer)) and isinstance(stop, (int, np.integer))):
            raise TypeError("start and stop must be integers")
        if not 0 <= start <= stop <= n:
            raise ValueError(f"{self.path}: row range [{start}, {stop}) is outside the file's {n} rows")
        self._check_headers(start, stop)
        src = self.array[start:stop]
        if src.nbytes <= _PROGRESS_BYTES:
            return np.array(src, order="C")    # always a copy: the result must not depend on the file
        # a large read from disk: copy in blocks under a progress bar (shown after ~2 s)
        out = np.empty(src.shape, src.dtype)
        step = max(1, _PROGRESS_BYTES // 8 // max(1, src[:1].nbytes))
        with progress(total=src.nbytes, desc=f"reading {os.path.basename(self.path)}", unit="B",
                      unit_scale=True) as bar:
            for s in range(0, len(src), step):
                out[s:s + step] = src[s:s + step]
                bar.update(out[s:s + step].nbytes)
        return out

    def iter_chunks(self, rows: int) -> Iterator[tuple[int, HostArray]]:
        """Yield ``(start, block)`` pairs covering the file in blocks of ``rows`` rows."""
        rows = int(rows)
        if rows < 1:
            raise ValueError("rows per chunk must be >= 1")
        for start in range(0, len(self), rows):
            yield start, self.read_rows(start, min(start + rows, len(self)))

    def __getitem__(self, key):
        """Numpy indexing that returns an in-memory copy (row ranges are header-checked)."""
        self._check_open()
        rowkey = key[0] if isinstance(key, tuple) and key else key
        if self._headers is not None:
            if isinstance(rowkey, slice):
                start, stop, step = rowkey.indices(self.shape[0])
                if step > 0:
                    self._check_headers(start, stop)
                else:
                    self._check_headers(stop + 1, start + 1)
            elif rowkey is not Ellipsis:
                self._check_headers_at(self._row_numbers(rowkey))
        out = self.array[key]
        return np.array(out) if isinstance(out, np.ndarray) else out

    def _row_numbers(self, rowkey):
        # without materialising arange(n): files may have billions of rows
        idx = np.asarray(rowkey)
        if idx.dtype == bool:
            return np.flatnonzero(idx)
        if idx.dtype.kind not in "iu":
            raise IndexError(f"unsupported row index {rowkey!r}")
        idx = np.atleast_1d(idx).astype(np.int64).ravel()
        n = self.shape[0]
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"{self.path}: row index out of range for the file's {n} rows")
        return np.where(idx < 0, idx + n, idx)

    def __array__(self, dtype=None, copy=None):
        a = self[:]
        return a if dtype is None else a.astype(dtype)


def open_vectors(path: PathLike) -> VectorFile:
    """Open a vector file for memory-mapped access without reading it.

    The returned :class:`VectorFile` has ``.shape``, ``.dtype``, ``len()``, ``read_rows(start, stop)``,
    ``iter_chunks(rows)`` and numpy indexing (``f[1000:2000]``, ``f[[3, 7]]``), each returning an in-memory
    copy, and ``.array``, the zero-copy memory map. Only the pages touched are read, so files larger
    than RAM can be processed a block at a time. The size and header of the file are checked on
    opening (ValueError naming the file and the problem).

    Parameters
    ----------
    path : str or os.PathLike
        A ``.fvecs``, ``.ivecs``, ``.bvecs``, ``.fbin``, ``.ibin``, ``.u8bin``, ``.i8bin`` or ``.npy`` file.

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> from knnkit import io
    >>> path = os.path.join(tempfile.mkdtemp(), "x.u8bin")
    >>> io.write(path, np.arange(20, dtype=np.uint8).reshape(5, 4))
    >>> f = io.open_vectors(path)
    >>> len(f), f.dtype.name, f.read_rows(3, 5).tolist()
    (5, 'uint8', [[12, 13, 14, 15], [16, 17, 18, 19]])
    """
    return VectorFile(path)


def _row_key(rows, n, path):
    """Turn ``read``'s ``rows`` argument into a numpy index over the first axis."""
    if rows is None:
        return slice(None)
    if isinstance(rows, slice):
        return rows
    if isinstance(rows, (int, np.integer)) and not isinstance(rows, bool):
        if not 0 <= rows <= n:
            raise ValueError(f"{path}: rows={rows} asks for more than the file's {n} rows")
        return slice(0, int(rows))
    if isinstance(rows, tuple) and len(rows) == 2:
        start, stop = rows
        stop = n if stop is None else stop
        if not 0 <= start <= stop <= n:
            raise ValueError(f"{path}: row range [{start}, {stop}) is outside the file's {n} rows")
        return slice(int(start), int(stop))
    idx = np.asarray(rows)
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        raise TypeError("rows must be None, a row count, a (start, stop) pair, a slice or a 1-D integer array")
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise ValueError(f"{path}: row index out of range for the file's {n} rows")
    return idx


def read(path: PathLike, *, rows: Any = None, mmap: bool = False) -> HostArray:
    """Read a vector file, choosing the format by extension.

    Parameters
    ----------
    path : str or os.PathLike
        ``.fvecs``, ``.ivecs``, ``.bvecs`` (TEXMEX), ``.fbin``, ``.ibin``, ``.u8bin``, ``.i8bin`` (big-ann) or ``.npy``.
    rows : None, int, (start, stop), slice or 1-D integer array, optional
        Which rows to read: all (None), the first ``rows``, a half-open range, a slice, or given row numbers.
    mmap : bool
        Return a read-only memory-mapped view instead of reading into memory (TEXMEX files give a
        strided, non-contiguous view; integer-array ``rows`` always copy).

    Returns
    -------
    numpy.ndarray
        ``(n, d)`` array of the format's dtype (float32, int32, uint8, int8; ``.npy``: as stored).

    Raises
    ------
    ValueError
        Unknown extension, truncated file, size not matching the header, rows of different dimensions.

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> from knnkit import io
    >>> path = os.path.join(tempfile.mkdtemp(), "gt.ivecs")
    >>> io.write(path, np.array([[3, 1], [0, 2], [5, 4]]))
    >>> io.read(path, rows=2)
    array([[3, 1],
           [0, 2]], dtype=int32)
    """
    f = VectorFile(path)
    if f.ndim == 0:   # a scalar .npy
        if rows is not None:
            raise ValueError(f"{f.path}: holds a scalar, it has no rows")
        return f.array if mmap else np.array(f.array)
    key = _row_key(rows, f.shape[0], f.path)
    if mmap and isinstance(key, slice):
        return f.array[key]
    if isinstance(key, slice) and key.step in (None, 1):
        start, stop, _ = key.indices(f.shape[0])
        return f.read_rows(start, max(start, stop))
    return f[key]


# --------------------------------------------------------------------------- writing


@contextlib.contextmanager
def atomic_write(path: PathLike, mode: str = "wb", *, fsync: bool = False) -> Iterator[IO[Any]]:
    """Open a temporary file next to ``path`` and rename it to ``path`` when the block succeeds.

    On an exception the temporary file is removed and ``path`` is untouched, so readers never see a
    half-written file (``os.replace`` is atomic on POSIX and Windows). ``fsync=True`` also flushes the
    data to disk before the rename, for durability across power loss.

    Examples
    --------
    >>> import os, tempfile
    >>> from knnkit.io import atomic_write
    >>> path = os.path.join(tempfile.mkdtemp(), "out.bin")
    >>> with atomic_write(path) as f:
    ...     _ = f.write(b"abc")
    >>> open(path, "rb").read()
    b'abc'
    """
    path = os.fspath(path)
    head, tail = os.path.split(os.path.abspath(path))
    if not os.path.isdir(head):
        raise FileNotFoundError(f"{path}: folder {head} does not exist")
    tmp = os.path.join(head, f".{tail}.{uuid.uuid4().hex[:12]}.tmp")
    # builtin open honours the umask, unlike tempfile's 0600 files
    f = open(tmp, "x" + mode.replace("w", "").replace("x", ""))
    try:
        yield f
        f.flush()
        if fsync:
            os.fsync(f.fileno())
        f.close()
        os.replace(tmp, path)
    except BaseException:
        f.close()
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def _cast(a, dtype, path):
    """``a`` converted to the file format's ``dtype``, refusing lossy integer conversions."""
    if a.dtype == dtype:
        return a
    if dtype.kind == "f":
        if a.dtype.kind not in "fiub":
            raise TypeError(f"{path}: cannot write dtype {a.dtype} as {dtype.name}")
        return a.astype(dtype)
    if a.dtype.kind not in "iub":
        raise TypeError(f"{path}: the format stores {dtype.name}; got {a.dtype} data (cast it explicitly, "
                        f"e.g. array.astype(np.{dtype.name}), or use a float format)")
    if a.size:
        info = np.iinfo(dtype)
        lo, hi = int(a.min()), int(a.max())
        if lo < info.min or hi > info.max:
            raise ValueError(f"{path}: values in [{lo}, {hi}] do not fit the format's {dtype.name}")
    return a.astype(dtype)


def _host_matrix(array, path, need_2d):
    a, _ = inspect_array(array)
    a = as_host(a)
    if need_2d and a.ndim != 2:
        raise ValueError(f"{path}: expected a 2-D (n, d) array, got shape {tuple(a.shape)}")
    return a


def _vecs_block(block, dtype):
    rec = np.empty(block.shape[0], np.dtype([("d", "<i4"), ("v", dtype, (block.shape[1],))]))
    rec["d"] = block.shape[1]
    rec["v"] = block
    return rec


def _write_rows(f, layout, a):
    if layout == "bin":
        if a.size:
            np.ascontiguousarray(a).tofile(f)
        return
    for s in range(0, a.shape[0], _WRITE_CHUNK_ROWS):
        _vecs_block(a[s:s + _WRITE_CHUNK_ROWS], a.dtype).tofile(f)


def write(path: PathLike, array: ArrayLike, *, atomic: bool = True) -> None:
    """Write an array to a vector file whose format is chosen by the extension.

    Parameters
    ----------
    path : str or os.PathLike
        ``.fvecs``, ``.ivecs``, ``.bvecs``, ``.fbin``, ``.ibin``, ``.u8bin``, ``.i8bin`` or ``.npy``.
    array : array-like
        2-D ``(n, d)`` array (numpy, cupy or torch; any shape for ``.npy``). It is converted to the
        format's dtype: integers and floats to float32; integers to an integer format only when every
        value fits (so int64 indices become int32 for ``.ivecs``/``.ibin``); floats to an integer format
        raise TypeError.
    atomic : bool
        Write to a temporary file in the same folder and rename it into place (default).

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> from knnkit import io
    >>> path = os.path.join(tempfile.mkdtemp(), "x.fbin")
    >>> io.write(path, np.eye(3))
    >>> io.read(path).dtype
    dtype('float32')
    """
    path = os.fspath(path)
    _ext, layout, dtype = format_of(path)
    a = _host_matrix(array, path, need_2d=layout != "npy")
    if layout != "npy":
        a = _cast(a, dtype, path)
        n, d = a.shape
        if layout == "vecs" and n == 0:
            raise ValueError(f"{path}: a TEXMEX file cannot hold 0 rows (its dimension would be lost)")
        if layout == "vecs" and d == 0:
            raise ValueError(f"{path}: cannot write vectors of dimension 0")
        if layout == "bin" and (n >= 2 ** 32 or d >= 2 ** 32):
            raise ValueError(f"{path}: shape {a.shape} does not fit the uint32 header")
    opener = atomic_write(path) if atomic else open(path, "wb")
    with opener as f:
        if layout == "npy":
            np.save(f, a, allow_pickle=False)
            return
        if layout == "bin":
            np.array([n, d], "<u4").tofile(f)
        _write_rows(f, layout, a)


class VectorWriter:
    """Write a ``.fbin/.ibin/.u8bin/.i8bin`` or TEXMEX file a block of rows at a time.

    For files too big to hold in memory: rows are appended as they are produced; the big-ann
    header's row count is filled in on :meth:`close`. With ``atomic=True`` (default) the file appears
    under its final name only after a successful close; leaving the ``with`` block through an exception
    discards it.

    Parameters
    ----------
    path : str or os.PathLike
    d : int, optional
        Row dimension; taken from the first block when omitted.
    atomic : bool

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> from knnkit import io
    >>> path = os.path.join(tempfile.mkdtemp(), "big.fbin")
    >>> with io.VectorWriter(path) as w:
    ...     for i in range(3):
    ...         w.append(np.full((2, 4), i))
    >>> io.read(path)[:, 0].tolist()
    [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    """

    def __init__(self, path: PathLike, *, d: int | None = None, atomic: bool = True) -> None:
        self.path = os.fspath(path)
        _ext, self.layout, self.dtype = format_of(self.path)
        if self.layout == "npy":
            raise ValueError(f"{self.path}: VectorWriter writes .fbin/.ibin/.u8bin/.i8bin or TEXMEX files; "
                             f"use knnkit.io.write for .npy")
        self.d = None if d is None else int(d)
        self.n = 0
        self._ctx = atomic_write(self.path) if atomic else None
        self._f = self._ctx.__enter__() if atomic else open(self.path, "wb")
        if self.layout == "bin":
            np.zeros(2, "<u4").tofile(self._f)   # placeholder header, rewritten on close

    def append(self, rows: ArrayLike) -> None:
        """Append a ``(m, d)`` block of rows (numpy, cupy or torch)."""
        if self._f is None:
            raise ValueError(f"{self.path}: writer is closed")
        a = _cast(_host_matrix(rows, self.path, need_2d=True), self.dtype, self.path)
        if self.d is None:
            self.d = a.shape[1]
        if a.shape[1] != self.d:
            raise ValueError(f"{self.path}: block has d={a.shape[1]}, file has d={self.d}")
        _write_rows(self._f, self.layout, a)
        self.n += a.shape[0]

    def close(self) -> None:
        """Finish the header and move the file into place."""
        if self._f is None:
            return
        if self.layout == "vecs" and self.n == 0:
            self.abort()
            raise ValueError(f"{self.path}: no rows were appended (a TEXMEX file cannot hold 0 rows)")
        if self.layout == "bin":
            if self.n >= 2 ** 32:
                self.abort()
                raise ValueError(f"{self.path}: {self.n} rows do not fit the uint32 header")
            self._f.seek(0)
            np.array([self.n, self.d or 0], "<u4").tofile(self._f)
            self._f.seek(0, os.SEEK_END)
        f, self._f = self._f, None
        if self._ctx is not None:
            self._ctx.__exit__(None, None, None)
        else:
            f.close()

    def abort(self) -> None:
        """Discard what was written (the final path is left untouched when atomic)."""
        if self._f is None:
            return
        f, self._f = self._f, None
        if self._ctx is not None:
            err = RuntimeError("aborted")
            self._ctx.__exit__(RuntimeError, err, None)   # removes the temporary file
        else:
            f.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
