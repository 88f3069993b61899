"""The GraphIndex file format (version 1), self-describing and checked on load.

Layout (little-endian)::

    offset 0   8 bytes   magic b"KNNKINDX"
    offset 8   uint32    format version (1)
    offset 12  uint32    reserved (0)
    offset 16  uint64    header length H in bytes
    offset 24  H bytes   header, UTF-8 JSON: {"arrays": [{"name", "dtype", "shape", "offset",
                         "nbytes"}, ...], "data_bytes": ..., plus the index's metadata}
    ...        padding to a 64-byte boundary, then the arrays, each at its header "offset"
               (relative to the start of the array section) and 64-byte aligned, raw C order
    end-32     32 bytes  SHA-256 of every byte before it

The checksum makes truncated or corrupted files fail with a ValueError instead of returning a
silently wrong index; arrays are written raw, so a round trip is bit-exact.
"""

import hashlib
import json
import os
import struct

import numpy as np

__all__ = ["MAGIC", "VERSION", "write_index_file", "read_index_file"]

MAGIC = b"KNNKINDX"
VERSION = 1
_ALIGN = 64
_FIXED = struct.Struct("<8sIIQ")


def _pad(n):
    return (-n) % _ALIGN


def write_index_file(path, meta, arrays):
    """Write ``meta`` (JSON-able dict) and ``arrays`` (dict name -> numpy array) to ``path``."""
    specs = []
    off = 0
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        specs.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "offset": off,
                      "nbytes": int(a.nbytes)})
        off += a.nbytes + _pad(a.nbytes)
    header = dict(meta)
    header["arrays"] = specs
    header["data_bytes"] = off
    hb = json.dumps(header, sort_keys=True).encode("utf-8")
    h = hashlib.sha256()
    tmp = os.fspath(path) + ".tmp"
    with open(tmp, "wb") as f:
        def put(b):
            h.update(b)
            f.write(b)

        put(_FIXED.pack(MAGIC, VERSION, 0, len(hb)))
        put(hb)
        put(b"\0" * _pad(_FIXED.size + len(hb)))
        for name, a in arrays.items():
            a = np.ascontiguousarray(a)
            put(memoryview(a.reshape(-1).view(np.uint8)) if a.size else b"")
            put(b"\0" * _pad(a.nbytes))
        f.write(h.digest())
    os.replace(tmp, path)


def _read_exact(f, nbytes, path, h):
    b = f.read(nbytes)
    if len(b) != nbytes:
        raise ValueError(f"{path}: truncated knnkit index file")
    h.update(b)
    return b


def read_index_file(path, verify=True):
    """Read a file written by :func:`write_index_file`; return ``(meta, arrays)``.

    One sequential pass: each array is read straight into its own buffer while the SHA-256 is
    updated, so peak memory is the index itself. Raises ValueError for a wrong magic, an unknown
    version, a truncated file or a checksum mismatch.
    """
    size = os.path.getsize(path)
    if size < _FIXED.size + 32:
        raise ValueError(f"{path}: truncated knnkit index file ({size} bytes)")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        magic, version, _res, hlen = _FIXED.unpack(_read_exact(f, _FIXED.size, path, h))
        if magic != MAGIC:
            raise ValueError(f"{path}: not a knnkit GraphIndex file (magic {magic!r})")
        if version != VERSION:
            raise ValueError(f"{path}: unsupported GraphIndex format version {version} "
                             f"(this knnkit reads version {VERSION})")
        if _FIXED.size + hlen + 32 > size:
            raise ValueError(f"{path}: truncated knnkit index file (header runs past the end)")
        try:
            header = json.loads(_read_exact(f, hlen, path, h).decode("utf-8"))
            specs = header.pop("arrays")
            data_bytes = int(header.pop("data_bytes"))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: corrupted knnkit index file (unreadable header: {e})") from None
        data_start = _FIXED.size + hlen + _pad(_FIXED.size + hlen)
        expected = data_start + data_bytes + 32
        if size < expected:
            raise ValueError(f"{path}: truncated knnkit index file ({size} bytes, expected {expected})")
        if size > expected:
            raise ValueError(f"{path}: corrupted knnkit index file ({size - expected} unexpected "
                             f"trailing bytes)")
        _read_exact(f, _pad(_FIXED.size + hlen), path, h)
        arrays = {}
        pos = 0
        for spec in specs:
            try:
                dt = np.dtype(spec["dtype"])
                shape = tuple(int(s) for s in spec["shape"])
                count = int(np.prod(shape, dtype=np.int64))
                nbytes = int(spec["nbytes"])
                ok = int(spec["offset"]) == pos and nbytes == dt.itemsize * count and \
                    pos + nbytes <= data_bytes
            except (TypeError, ValueError, KeyError):
                ok = False
            if not ok:
                raise ValueError(f"{path}: corrupted knnkit index file (array {spec.get('name')!r})")
            a = np.empty(count, dtype=dt)
            if nbytes:
                mv = memoryview(a.view(np.uint8))
                if f.readinto(mv) != nbytes:
                    raise ValueError(f"{path}: truncated knnkit index file")
                h.update(mv)
            _read_exact(f, _pad(nbytes), path, h)
            pos += nbytes + _pad(nbytes)
            arrays[spec["name"]] = a.reshape(shape)
        if pos != data_bytes:
            raise ValueError(f"{path}: corrupted knnkit index file (array table)")
        digest = f.read(32)
    if verify and digest != h.digest():
        raise ValueError(f"{path}: corrupted knnkit index file (SHA-256 checksum mismatch)")
    return header, arrays
