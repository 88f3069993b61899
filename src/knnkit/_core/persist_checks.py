"""Readers of the first release's files (``KNNKGRPH`` graphs, ``KNNKINDX`` indexes) and the
content validators every reader applies (ids in range, known metric, consistent shapes): the
half of the persistence room that decides whether what was read can be trusted. The container
itself is :mod:`knnkit._core.persist`, which re-exports these names."""

import hashlib
import json
import math
import os
import struct

import numpy as np

from .persist import (_DIGEST, _NUMERIC, INDEX_DTYPES, KNOWN_METRICS, LEGACY_GRAPH_MAGIC, LEGACY_INDEX_MAGIC, _err,
                      _native, _pad,
                      _is_int)  # noqa: F401

__all__ = ["read_legacy_graph", "read_legacy_index", "validate_graph", "validate_index"]


def read_legacy_graph(path, *, verify=True):
    """Read a ``KnnGraph.save`` file of knnkit's first release (magic ``KNNKGRPH``, version 1).

    That layout, little-endian: magic (8 bytes), version (uint32, 1), header length (uint32),
    UTF-8 JSON header (metric, n, k, index_dtype, include_self, stats), indices (n*k int32 or
    int64), distances (n*k float32), BLAKE2b-256 of everything before it (32 bytes).

    Returns
    -------
    meta : dict
        ``metric``, ``n``, ``k``, ``include_self``, ``stats`` (as written; ``index_dtype`` is
        dropped, the array carries it).
    arrays : dict
        ``{"indices": (n, k) int, "distances": (n, k) float32}``, ready for
        :func:`validate_graph`.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 16 + _DIGEST or blob[:8] != LEGACY_GRAPH_MAGIC:
        raise _err(path, "not a knnkit graph file of the first release (bad magic or too short)")
    version, hlen = struct.unpack_from("<II", blob, 8)
    if version != 1:
        raise _err(path, f"unsupported legacy graph file version {version}")
    if verify and hashlib.blake2b(blob[:-_DIGEST], digest_size=_DIGEST).digest() != blob[-_DIGEST:]:
        raise _err(path, "corrupted legacy graph file (BLAKE2b checksum mismatch or truncated)")
    if 16 + hlen + _DIGEST > len(blob):
        raise _err(path, "truncated legacy graph file (header runs past the end)")
    try:
        meta = json.loads(blob[16:16 + hlen].decode("utf-8"))
        n, k = meta["n"], meta["k"]
        code = meta.pop("index_dtype")
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise _err(path, f"corrupted legacy graph file (header: {e})") from None
    if code not in ("int32", "int64") or not (_is_int(n) and _is_int(k) and n >= 0 and k >= 0):
        raise _err(path, f"corrupted legacy graph file (n={n!r}, k={k!r}, index_dtype={code!r})")
    it = np.dtype("<" + ("i4" if code == "int32" else "i8"))
    off = 16 + hlen
    need = off + n * k * (it.itemsize + 4) + _DIGEST
    if len(blob) != need:
        raise _err(path, f"legacy graph file of {len(blob)} bytes, its header describes {need}")
    ind = np.frombuffer(blob, it, n * k, off).reshape(n, k)
    dist = np.frombuffer(blob, "<f4", n * k, off + n * k * it.itemsize).reshape(n, k)
    return meta, {"indices": _native(ind).copy(), "distances": _native(dist).copy()}


def read_legacy_index(path, *, verify=True):
    """Read a ``GraphIndex.save`` file of knnkit's first release (magic ``KNNKINDX``, version 1).

    That layout, little-endian: magic (8 bytes), version (uint32, 1), reserved (uint32),
    header length H (uint64), H bytes of UTF-8 JSON (the index metadata plus "arrays": [{name,
    dtype, shape, offset, nbytes}] with offsets relative to the array section, and
    "data_bytes"), zero padding to 64 bytes, the arrays (each padded to 64 bytes), SHA-256 of
    everything before it (32 bytes).

    Returns
    -------
    meta : dict
        The index metadata (``metric``, ``dtype``, ``n``, ``dim``, ``graph_degree``,
        ``entry_metric``, ``build_params``, ``search_params``, ``nn1_max``, ...).
    arrays : dict
        ``data``, ``graph``, ``entry_centroids``, ``entry_medoids``, ready for
        :func:`validate_index`.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        blob = f.read()
    fixed = struct.Struct("<8sIIQ")
    if len(blob) < fixed.size + _DIGEST or blob[:8] != LEGACY_INDEX_MAGIC:
        raise _err(path, "not a knnkit index file of the first release (bad magic or too short)")
    _magic, version, _res, hlen = fixed.unpack_from(blob)
    if version != 1:
        raise _err(path, f"unsupported legacy index file version {version}")
    if verify and hashlib.sha256(blob[:-_DIGEST]).digest() != blob[-_DIGEST:]:
        raise _err(path, "corrupted legacy index file (SHA-256 checksum mismatch or truncated)")
    if fixed.size + hlen + _DIGEST > len(blob):
        raise _err(path, "truncated legacy index file (header runs past the end)")
    try:
        meta = json.loads(blob[fixed.size:fixed.size + hlen].decode("utf-8"))
        specs = meta.pop("arrays")
        data_bytes = meta.pop("data_bytes")
        if not isinstance(specs, list) or not _is_int(data_bytes):
            raise TypeError("array table")
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise _err(path, f"corrupted legacy index file (header: {e})") from None
    start = fixed.size + hlen + _pad(fixed.size + hlen)
    if start + data_bytes + _DIGEST != len(blob):
        raise _err(path, f"legacy index file of {len(blob)} bytes, its header describes "
                         f"{start + data_bytes + _DIGEST}")
    arrays, pos = {}, 0
    for spec in specs:
        try:
            name, code, shape = spec["name"], spec["dtype"], spec["shape"]
            off, nbytes = spec["offset"], spec["nbytes"]
            ok = (isinstance(name, str) and code in _NUMERIC and isinstance(shape, list)
                  and all(_is_int(s) and s >= 0 for s in shape) and off == pos
                  and nbytes == np.dtype(code).itemsize * math.prod(shape) and pos + nbytes <= data_bytes)
        except (TypeError, KeyError):
            ok = False
        if not ok:
            raise _err(path, f"corrupted legacy index file (array entry {spec!r})")
        a = np.frombuffer(blob, np.dtype(code), math.prod(shape), start + off).reshape(shape)
        arrays[name] = _native(a).copy()
        pos += nbytes + _pad(nbytes)
    if pos != data_bytes:
        raise _err(path, "corrupted legacy index file (array table does not cover the data)")
    return meta, arrays


# ----------------------------------------------------------------------------- content validators

def _need(path, arrays, names, what):
    missing = [n for n in names if n not in arrays]
    if missing:
        raise _err(path, f"invalid {what}: missing array(s) {', '.join(missing)}")


def _meta_int(path, meta, key, expect, what):
    v = meta.get(key)
    if v is not None and (not _is_int(v) or v != expect):
        raise _err(path, f"invalid {what}: meta {key}={v!r} but the arrays say {expect}")


def _check_metric(path, meta, what):
    metric = meta.get("metric")
    if metric not in KNOWN_METRICS:
        raise _err(path, f"invalid {what}: metric {metric!r} is not one of {', '.join(KNOWN_METRICS)}")
    return metric


def _check_ids(path, ids, n, field, what, allow_hole=True):
    if ids.dtype.kind not in "iu":
        raise _err(path, f"invalid {what}: {field} must be integers, got dtype {ids.dtype}")
    if ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        low = -1 if allow_hole else 0
        if lo < low or hi >= n:
            raise _err(path, f"invalid {what}: {field} hold ids in [{lo}, {hi}], allowed [{low}, {n})")


def validate_graph(meta, arrays, path):
    """Check that ``(meta, arrays)`` read from ``path`` form a valid k-NN graph.

    Rules: ``indices`` an integer (n, k) array with ids in [-1, n); ``distances`` float32 of the
    same shape; a ``-1`` slot carries the metric's worst distance (+inf, or -inf for
    ``inner_product`` where larger is nearer); ``metric`` one of :data:`KNOWN_METRICS`; ``n``
    and ``k`` in meta, when present, equal to the shape; ``include_self``, when present, a bool.

    Raises
    ------
    ValueError
        Naming ``path`` and the offending field.
    """
    what = "knnkit graph"
    _need(path, arrays, ("indices", "distances"), what)
    ind, dist = arrays["indices"], arrays["distances"]
    if ind.ndim != 2:
        raise _err(path, f"invalid {what}: indices must be 2-D (n, k), got shape {ind.shape}")
    n, k = ind.shape
    _check_ids(path, ind, n, "indices", what)
    if dist.dtype != np.float32:
        raise _err(path, f"invalid {what}: distances must be float32, got {dist.dtype}")
    if dist.shape != ind.shape:
        raise _err(path, f"invalid {what}: distances shape {dist.shape} != indices shape {ind.shape}")
    metric = _check_metric(path, meta, what)
    _meta_int(path, meta, "n", n, what)
    _meta_int(path, meta, "k", k, what)
    if "include_self" in meta and not isinstance(meta["include_self"], bool):
        raise _err(path, f"invalid {what}: include_self={meta['include_self']!r} is not a bool")
    holes = ind < 0
    if holes.any():
        worst = -np.inf if metric == "inner_product" else np.inf
        if not np.all(dist[holes] == worst):
            raise _err(path, f"invalid {what}: a -1 slot in indices has a distance other than {worst}")


def validate_index(meta, arrays, path):
    """Check that ``(meta, arrays)`` read from ``path`` form a valid GraphIndex.

    Rules: ``data`` 2-D (n, d) of float32, float16, uint8 or int8 (and equal to meta ``dtype``
    when given); ``graph`` int32 (n, R) with ids in [-1, n); ``entry_medoids`` 1-D integer ids
    in [0, n); ``entry_centroids`` float32 (c, d), finite, c equal to the number of medoids;
    ``metric`` one of :data:`KNOWN_METRICS`; meta ``n``, ``dim`` and ``graph_degree``, when
    present, equal to the shapes.

    Raises
    ------
    ValueError
        Naming ``path`` and the offending field.
    """
    what = "knnkit index"
    _need(path, arrays, ("data", "graph", "entry_centroids", "entry_medoids"), what)
    data, graph = arrays["data"], arrays["graph"]
    cent, med = arrays["entry_centroids"], arrays["entry_medoids"]
    if data.ndim != 2:
        raise _err(path, f"invalid {what}: data must be 2-D (n, d), got shape {data.shape}")
    if data.dtype.name not in INDEX_DTYPES:
        raise _err(path, f"invalid {what}: data dtype {data.dtype} is not one of {', '.join(INDEX_DTYPES)}")
    if "dtype" in meta and meta["dtype"] != data.dtype.name:
        raise _err(path, f"invalid {what}: meta dtype={meta['dtype']!r} but data is {data.dtype}")
    n, d = data.shape
    if graph.dtype != np.int32:
        raise _err(path, f"invalid {what}: graph must be int32, got {graph.dtype}")
    if graph.ndim != 2 or graph.shape[0] != n:
        raise _err(path, f"invalid {what}: graph shape {graph.shape}, expected ({n}, R)")
    _check_ids(path, graph, n, "graph", what)
    if med.ndim != 1:
        raise _err(path, f"invalid {what}: entry_medoids must be 1-D, got shape {med.shape}")
    _check_ids(path, med, n, "entry_medoids", what, allow_hole=False)
    if cent.dtype != np.float32:
        raise _err(path, f"invalid {what}: entry_centroids must be float32, got {cent.dtype}")
    if cent.ndim != 2 or cent.shape != (med.shape[0], d):
        raise _err(path, f"invalid {what}: entry_centroids shape {cent.shape}, expected ({med.shape[0]}, {d})")
    if not np.isfinite(cent).all():
        raise _err(path, f"invalid {what}: entry_centroids hold NaN or inf")
    _check_metric(path, meta, what)
    _meta_int(path, meta, "n", n, what)
    _meta_int(path, meta, "dim", d, what)
    _meta_int(path, meta, "graph_degree", graph.shape[1], what)
