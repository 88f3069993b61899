"""The one file container for everything knnkit saves (graphs, indexes, checkpoints).

Layout (version 1). The fixed fields are in the byte order given by the byte-order marker,
which is the writer's native order; every array carries its own byte order in its dtype::

    offset 0    8 bytes  magic b"KNNKIT\\x00\\x01"
    offset 8    uint32   format version (1)
    offset 12   uint32   byte-order marker 0x01020304 (reads 04 03 02 01 little-endian,
                         01 02 03 04 big-endian)
    offset 16   16 bytes kind, ASCII [a-z0-9_-], NUL-padded ("graph", "index", "checkpoint", ...)
    offset 32   uint64   header length H
    offset 40   H bytes  header, UTF-8 JSON:
                         {"meta": {...}, "arrays": [{"name", "dtype", "shape", "offset",
                         "nbytes"}, ...]}
                         ``dtype`` is a numpy type string with an explicit byte order ("<f4",
                         ">i8", "|u1"); ``offset`` is absolute in the file
    ...                  zero padding to a 64-byte boundary
    arrays               raw C-order bytes, each starting on a 64-byte boundary (so that each can
                         be memory-mapped aligned), in the order of the header, zero padding
                         between them and after the last one up to a 64-byte boundary
    end - 32   32 bytes  BLAKE2b-256 of every byte before it

The reader accepts only the layout the writer produces: every offset must be exactly where the
writer would have put it and the file must end right after the checksum. A header that
disagrees with the file is therefore refused before any array is allocated, even with
``verify=False``; the checksum then catches what a consistent-looking header cannot (flipped
bits in the data or in the header text).

Writes are atomic: the file is written under a temporary name in the destination folder and
renamed over ``path`` only when complete; on any failure the temporary file is removed and an
existing ``path`` is left as it was.

This module also reads the two formats of knnkit's first release (``KNNKGRPH`` graphs and
``KNNKINDX`` indexes) and holds the content validators that each kind's loader runs on what it
read, whatever the format.
"""

import contextlib
import errno
import hashlib
import json
import math
import os
import struct
import sys
import uuid

import numpy as np

__all__ = [
    "MAGIC", "FORMAT_VERSION", "ALIGN", "KNOWN_METRICS", "INDEX_DTYPES",
    "write_container", "read_container", "sniff", "container_kind", "jsonable",
]

MAGIC = b"KNNKIT\x00\x01"
FORMAT_VERSION = 1
ALIGN = 64
KNOWN_METRICS = ("sqeuclidean", "euclidean", "inner_product", "cosine", "manhattan")
#: Vector storage dtypes a GraphIndex accepts (as in ``_core.validation.SUPPORTED_DTYPES``).
INDEX_DTYPES = ("float32", "float16", "uint8", "int8")

LEGACY_GRAPH_MAGIC = b"KNNKGRPH"
LEGACY_INDEX_MAGIC = b"KNNKINDX"

_BOM = 0x01020304
_KIND_LEN = 16
_FIXED_LEN = 40          # magic, version, marker, kind, header length
_DIGEST = 32
_BLOCK = 1 << 22         # bytes per write / hash step: bounds temporary copies of huge arrays
_MAX_NDIM = 32           # numpy's own limit is 64; a bigger claim is a corrupted header
_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}

# dtype strings a file may name: numeric types whose size is the same on every platform. An
# allow-list rather than np.dtype(untrusted string) because numpy parses far more than numbers
# (object, structured and string types), none of which a raw byte dump can represent.
_NUMERIC = {"|b1", "|i1", "|u1"}
for _order in "<>":
    for _code in ("i2", "i4", "i8", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"):
        _NUMERIC.add(_order + _code)
del _order, _code


def _pad(n):
    return (-n) % ALIGN


def _err(path, what):
    return ValueError(f"{os.fspath(path)}: {what}")


# ----------------------------------------------------------------------------- writing

def jsonable(obj):
    """``obj`` with numpy scalars, arrays and tuples turned into plain JSON types.

    Non-finite floats are kept (Python's ``json`` writes and reads them as ``NaN``/``Infinity``);
    anything else unknown becomes its ``str`` so that saving build statistics never fails.

    Examples
    --------
    >>> jsonable({"a": np.int64(3), "b": (np.float32(0.5), None)})
    {'a': 3, 'b': [0.5, None]}
    """
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, (int, float, str)) or obj is None:
        return obj
    return str(obj)


def _check_kind(kind):
    if not isinstance(kind, str) or not 1 <= len(kind) <= _KIND_LEN or \
            any(c not in "abcdefghijklmnopqrstuvwxyz0123456789_-" for c in kind):
        raise ValueError(f"kind must be 1 to {_KIND_LEN} characters of [a-z0-9_-], got {kind!r}")
    return kind.encode("ascii").ljust(_KIND_LEN, b"\0")


def _prepare(arrays, byteorder):
    """(name, C-contiguous array in the byte order to write, dtype string) for every array."""
    out = []
    for name, a in arrays.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"array names must be non-empty strings, got {name!r}")
        a = np.asarray(a)
        if byteorder in "<>" and a.dtype.itemsize > 1 and a.dtype.byteorder != "|":
            a = a.astype(a.dtype.newbyteorder(byteorder), copy=False)
        if not a.flags.c_contiguous:
            a = a.copy(order="C")  # not np.ascontiguousarray: it turns 0-d arrays into 1-d
        code = a.dtype.str
        if code not in _NUMERIC:
            raise TypeError(f"array {name!r}: dtype {a.dtype} cannot be saved (numeric dtypes only: "
                            f"bool, int8..64, uint8..64, float16/32/64, complex64/128)")
        out.append((name, a, code))
    return out


def _layout(specs_in, start):
    """Offsets for arrays of the given byte lengths, starting at ``start`` (64-aligned)."""
    offsets, pos = [], start
    for nbytes in specs_in:
        offsets.append(pos)
        pos += nbytes + _pad(nbytes)
    return offsets, pos


def _build_header(kind_b, meta, prepared, bo):
    """Fixed fields + JSON header bytes, and the array offsets. The JSON names the offsets, which
    depend on the JSON's own length: lay out, and repeat while the padded length changes (twice
    at most in practice, since only the digits of the offsets vary)."""
    meta = jsonable(meta)
    if not isinstance(meta, dict):
        raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
    start = None
    for _ in range(8):
        guess = start if start is not None else _FIXED_LEN + ALIGN
        offsets, end = _layout([a.nbytes for _n, a, _c in prepared], guess)
        header = {"meta": meta, "arrays": [
            {"name": name, "dtype": code, "shape": [int(s) for s in a.shape], "offset": off,
             "nbytes": int(a.nbytes)} for (name, a, code), off in zip(prepared, offsets)]}
        hb = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
        real = _FIXED_LEN + len(hb) + _pad(_FIXED_LEN + len(hb))
        if real == guess:
            fixed = (MAGIC + struct.pack(bo + "II", FORMAT_VERSION, _BOM) + kind_b +
                     struct.pack(bo + "Q", len(hb)))
            return fixed + hb + b"\0" * _pad(_FIXED_LEN + len(hb)), end
        start = real
    raise RuntimeError("container header layout did not settle")  # pragma: no cover


def _fsync_dir(folder):
    # the rename is only durable once the folder's entry is on disk; not possible on Windows
    if not hasattr(os, "O_DIRECTORY"):
        return
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_container(path, kind, meta, arrays, *, fsync=False, byteorder="="):
    """Write ``meta`` and ``arrays`` to ``path`` as a knnkit container, atomically.

    Parameters
    ----------
    path : str or os.PathLike
        Destination; its folder must exist. An existing file is replaced only once the new
        one is complete.
    kind : str
        What the file holds ("graph", "index", "checkpoint", ...): 1 to 16 characters of
        ``[a-z0-9_-]``. :func:`read_container` can insist on it.
    meta : dict
        JSON-able metadata (numpy scalars, arrays and tuples are converted by :func:`jsonable`).
    arrays : dict of str to ndarray
        Host arrays of numeric dtypes (bool, signed/unsigned integers, float16/32/64,
        complex64/128), any shape; written in C order in the order of the dict. Device arrays
        must be copied to the host by the caller.
    fsync : bool
        Flush the file and its folder entry to disk before returning (durability across a
        power loss; costs a disk flush).
    byteorder : {"=", "<", ">"}
        "=": fixed fields in this machine's order, each array in its own dtype's order.
        "<" / ">": fixed fields and every multi-byte array in that order (to produce a file as
        another machine would; readers convert back to native).

    Raises
    ------
    OSError
        With ``errno`` ENOSPC or EDQUOT and a message naming ``path`` when the disk or quota is
        full; any other I/O error as raised. Nothing is left behind in either case.
    TypeError, ValueError
        For a non-numeric array, a bad kind or array name, or meta that is not a dict.

    Examples
    --------
    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "x.knnkit")
    >>> write_container(p, "demo", {"note": "hi"}, {"a": np.arange(3, dtype=np.int32)})
    >>> meta, arrays = read_container(p, kind="demo")
    >>> meta, arrays["a"]
    ({'note': 'hi'}, array([0, 1, 2], dtype=int32))
    """
    if byteorder not in ("=", "<", ">"):
        raise ValueError(f"byteorder must be '=', '<' or '>', got {byteorder!r}")
    if os.path.isdir(os.fspath(path)):  # the atomic rename would fail late, naming the temporary file
        raise IsADirectoryError(errno.EISDIR, f"{os.fspath(path)} is a folder; give a file path inside it "
                                f"(e.g. {os.path.join(os.fspath(path), 'index.knnkit')})", os.fspath(path))
    bo = ("<" if sys.byteorder == "little" else ">") if byteorder == "=" else byteorder
    kind_b = _check_kind(kind)
    prepared = _prepare(arrays, byteorder)
    head_bytes, end = _build_header(kind_b, meta, prepared, bo)

    path = os.fspath(path)
    folder, tail = os.path.split(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(errno.ENOENT, f"{path}: folder {folder} does not exist", path)
    # same folder, so that os.replace is a rename within one file system (atomic); a leading dot
    # and the .tmp suffix keep it out of listings and match the out-of-core cleanup pattern
    tmp = os.path.join(folder, f".{tail}.{uuid.uuid4().hex[:12]}.tmp")
    h = hashlib.blake2b(digest_size=_DIGEST)
    f = None
    try:
        f = open(tmp, "xb")

        def put(b):
            h.update(b)
            f.write(b)

        put(head_bytes)
        for _name, a, _code in prepared:
            if a.nbytes:
                flat = memoryview(a.reshape(-1).view(np.uint8))
                for s in range(0, len(flat), _BLOCK):
                    put(flat[s:s + _BLOCK])
            put(b"\0" * _pad(a.nbytes))
        f.write(h.digest())
        f.flush()
        if fsync:
            os.fsync(f.fileno())
        f.close()
        os.replace(tmp, path)
    except BaseException as e:
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()  # may itself fail on a full disk (buffered bytes); the file goes anyway
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(e, OSError) and e.errno in _DISK_FULL:
            need = end + _DIGEST
            raise OSError(e.errno, f"{path}: the disk is full (or the quota exhausted) while writing a "
                                   f"{need}-byte knnkit {kind} file; nothing was written", path) from e
        raise
    if fsync:
        _fsync_dir(folder)


# ----------------------------------------------------------------------------- reading

def sniff(path):
    """Which knnkit format ``path`` is in, by its first 8 bytes.

    Returns
    -------
    "container", "legacy-graph", "legacy-index" or None
        None for anything else, including files shorter than 8 bytes.
    """
    with open(path, "rb") as f:
        magic = f.read(8)
    return {MAGIC: "container", LEGACY_GRAPH_MAGIC: "legacy-graph",
            LEGACY_INDEX_MAGIC: "legacy-index"}.get(magic)


def container_kind(path):
    """The ``kind`` field of a knnkit container (``"graph"``, ``"index"``, ...), read from its
    fixed header without reading the arrays; ``ValueError`` for anything that is not one."""
    with open(path, "rb") as f:
        fixed = f.read(_FIXED_LEN)
    size = os.path.getsize(path)
    if len(fixed) < _FIXED_LEN:
        raise _err(path, f"truncated knnkit container ({size} bytes)")
    return _parse_fixed(path, fixed, size)[2]


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_fixed(path, fixed, size):
    """(byte order, version, kind, header length) from the first 40 bytes; checks the sizes."""
    if fixed[:8] != MAGIC:
        raise _err(path, f"not a knnkit container (magic {fixed[:8]!r})")
    marker = fixed[12:16]
    if marker == struct.pack("<I", _BOM):
        bo = "<"
    elif marker == struct.pack(">I", _BOM):
        bo = ">"
    else:
        raise _err(path, f"corrupted knnkit container (byte-order marker {marker.hex()})")
    (version,) = struct.unpack(bo + "I", fixed[8:12])
    if version > FORMAT_VERSION:
        raise _err(path, f"written by a newer knnkit (container format version {version}); this knnkit "
                         f"reads versions up to {FORMAT_VERSION}: upgrade knnkit to read it")
    if version < 1:
        raise _err(path, f"corrupted knnkit container (format version {version})")
    kb = fixed[16:32]
    kind = kb.rstrip(b"\0")
    try:
        kind = kind.decode("ascii")
        _check_kind(kind)
        ok = kb == kind.encode("ascii").ljust(_KIND_LEN, b"\0")
    except (UnicodeDecodeError, ValueError):
        ok = False
    if not ok:
        raise _err(path, f"corrupted knnkit container (kind field {kb!r})")
    (hlen,) = struct.unpack(bo + "Q", fixed[32:40])
    if _FIXED_LEN + hlen + _DIGEST > size:
        raise _err(path, f"truncated knnkit container ({size} bytes; its header alone claims {hlen})")
    return bo, version, kind, hlen


def _parse_header(path, hb, hlen, size):
    """meta and the validated array table [(name, dtype, shape, offset, nbytes)] of the JSON."""
    try:
        header = json.loads(hb.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _err(path, f"corrupted knnkit container (unreadable header: {e})") from None
    if not isinstance(header, dict) or set(header) != {"meta", "arrays"} or \
            not isinstance(header["meta"], dict) or not isinstance(header["arrays"], list):
        raise _err(path, "corrupted knnkit container (header is not {'meta': {...}, 'arrays': [...]})")
    pos = _FIXED_LEN + hlen + _pad(_FIXED_LEN + hlen)
    table, names = [], set()
    for i, spec in enumerate(header["arrays"]):
        where = f"array #{i}"
        if not isinstance(spec, dict) or set(spec) != {"name", "dtype", "shape", "offset", "nbytes"}:
            raise _err(path, f"corrupted knnkit container ({where}: entry {spec!r} is malformed)")
        name = spec["name"]
        if not isinstance(name, str) or not name or name in names:
            raise _err(path, f"corrupted knnkit container ({where}: bad or repeated name {name!r})")
        names.add(name)
        where = f"array {name!r}"
        code = spec["dtype"]
        if code not in _NUMERIC:
            raise _err(path, f"corrupted knnkit container ({where}: dtype {code!r} is not a numeric "
                             f"dtype with explicit byte order)")
        dt = np.dtype(code)
        shape = spec["shape"]
        if not isinstance(shape, list) or len(shape) > _MAX_NDIM or \
                not all(_is_int(s) and s >= 0 for s in shape):
            raise _err(path, f"corrupted knnkit container ({where}: bad shape {shape!r})")
        off, nbytes = spec["offset"], spec["nbytes"]
        if not _is_int(off) or not _is_int(nbytes):
            raise _err(path, f"corrupted knnkit container ({where}: offset/nbytes not integers)")
        if nbytes != dt.itemsize * math.prod(shape):
            raise _err(path, f"corrupted knnkit container ({where}: shape {shape} of {code} needs "
                             f"{dt.itemsize * math.prod(shape)} bytes, header says {nbytes})")
        if off != pos:
            raise _err(path, f"corrupted knnkit container ({where}: offset {off}, expected {pos})")
        if off + nbytes + _DIGEST > size:
            raise _err(path, f"truncated knnkit container ({where} ends at byte {off + nbytes}, "
                             f"the file has {size})")
        table.append((name, dt, tuple(shape), off, nbytes))
        pos = off + nbytes + _pad(nbytes)
    if pos + _DIGEST != size:
        kind = "truncated" if pos + _DIGEST > size else "corrupted"
        raise _err(path, f"{kind} knnkit container ({size} bytes, the header describes {pos + _DIGEST})")
    return header["meta"], table


def _native(a):
    # non-native data (a file from a machine of the other byte order) is converted once here,
    # so that callers and GPU kernels only ever see native arrays
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


def read_container(path, *, kind=None, mmap=False, verify=True):
    """Read a file written by :func:`write_container`.

    Parameters
    ----------
    path : str or os.PathLike
    kind : str, optional
        Refuse the file unless it was written with this kind.
    mmap : bool
        Return read-only ``np.memmap`` views of the file instead of reading the arrays into
        memory. Arrays stored in the other byte order cannot be viewed natively and are read
        and converted (in memory) instead; empty arrays are plain read-only arrays.
    verify : bool
        Check the BLAKE2b-256 checksum (one sequential pass over the file; with ``mmap=True``
        the file is streamed in blocks, never held in memory). The structure checks run either
        way.

    Returns
    -------
    meta : dict
    arrays : dict of str to ndarray
        In the order they were written, native byte order.

    Raises
    ------
    ValueError
        Naming the file, for a wrong magic, a newer format version, a wrong kind, truncation,
        a checksum mismatch, or a header that disagrees with itself or with the file size
        (offsets out of place, shapes that do not match the byte lengths, unknown or
        non-numeric dtypes).
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        magic = f.read(8)
        if magic != MAGIC[:len(magic)] or (size >= 8 and magic != MAGIC):
            raise _err(path, f"not a knnkit container (magic {magic!r})")
        if size < _FIXED_LEN + _DIGEST:
            raise _err(path, f"truncated knnkit container ({size} bytes)")
        f.seek(0)
        h = hashlib.blake2b(digest_size=_DIGEST)
        fixed = f.read(_FIXED_LEN)
        _bo, _version, got_kind, hlen = _parse_fixed(path, fixed, size)
        if kind is not None and got_kind != kind:
            raise _err(path, f"holds a knnkit {got_kind!r}, not a {kind!r}")
        hb = f.read(hlen)
        meta, table = _parse_header(path, hb, hlen, size)
        h.update(fixed)
        h.update(hb)
        arrays = {}
        if mmap:
            if verify:
                remaining = size - _FIXED_LEN - hlen - _DIGEST
                while remaining:
                    b = f.read(min(_BLOCK, remaining))
                    if not b:
                        raise _err(path, "truncated knnkit container (file shrank while reading)")
                    h.update(b)
                    remaining -= len(b)
                if f.read(_DIGEST) != h.digest():
                    raise _err(path, "corrupted knnkit container (BLAKE2b checksum mismatch)")
            whole = None
            for name, dt, shape, off, nbytes in table:
                if nbytes == 0 or not dt.isnative:
                    f.seek(off)
                    a = _native(np.frombuffer(f.read(nbytes), dt).reshape(shape)).copy() \
                        if nbytes else np.empty(shape, dt.newbyteorder("="))
                    a.flags.writeable = False
                else:
                    if whole is None:
                        # one mapping of the whole file; each array is a view of it, 64-byte
                        # aligned because the file's start is page-aligned
                        whole = np.memmap(path, dtype=np.uint8, mode="r", shape=(size,))
                    a = whole[off:off + nbytes].view(dt).reshape(shape)
                arrays[name] = a
            return meta, arrays
        for name, dt, shape, off, nbytes in table:
            pad = f.read(off - f.tell()) if off > f.tell() else b""
            h.update(pad)
            a = np.empty(math.prod(shape), dtype=dt)
            if nbytes:
                mv = memoryview(a.view(np.uint8))
                got = f.readinto(mv)
                if got != nbytes:
                    raise _err(path, "truncated knnkit container (file shrank while reading)")
                h.update(mv)
            arrays[name] = a.reshape(shape)
        h.update(f.read(size - _DIGEST - f.tell()))
        digest = f.read(_DIGEST)
    if verify and digest != h.digest():
        raise _err(path, "corrupted knnkit container (BLAKE2b checksum mismatch)")
    return meta, {name: _native(a) for name, a in arrays.items()}


# ----------------------------------------------------------------------------- legacy formats

