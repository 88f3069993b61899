"""The out-of-core build's work folder: the manifest (with the input's fingerprint), the list
files (one knnkit container per shard graph or running list, kind ``"checkpoint"``), checksums,
atomic writes, full-disk errors and the removal of stray files. See :mod:`._out_of_core`."""

import errno
import hashlib
import json
import os
import re

import numpy as np

from .._core.config import logger
from .._core.persist import read_container, write_container

#: Extension of a list file (ids + distances of one shard graph or running list).
LIST_EXT = ".knnc"

MANIFEST = "manifest.json"
# 2: the fingerprint holds the modification time and sampled blocks; 3: lists in knnkit containers
_VERSION = 3
_OWNED = re.compile(r"^(base_\d+|run_\d+_v\d+)\.knnc$|^knn_(indices\.ibin|distances\.fbin)$|"
                    r"^\..*\.tmp$|^manifest\.json\.tmp.*$")


# ----------------------------------------------------------------------------- small I/O helpers

def _io():
    from .._core import vectors

    return vectors


def _checksum(path, bufsize=1 << 22):
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while True:
            b = f.read(bufsize)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def _write_manifest(workdir, manifest):
    tmp = os.path.join(workdir, f"{MANIFEST}.tmp{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(workdir, MANIFEST))
    except BaseException as e:
        _remove(tmp)  # the old manifest stays in place, whole
        err = _disk_full(e, os.path.join(workdir, MANIFEST))
        if err is e:
            raise
        raise err from e


# sampled blocks of the input hashed by the fingerprint (plus the first and last block): a
# rewrite that keeps the path, size and shape but changes the content is caught without reading
# the whole file (a 100 GB input would take minutes to hash on every resume)
_FP_BLOCKS = 64
_FP_BLOCK_BYTES = 64 << 10


def _blocks_hash(path, size):
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if size <= (_FP_BLOCKS + 2) * _FP_BLOCK_BYTES:  # small file: all of it is cheaper than seeking
            starts = [0]
            length = size
        else:
            last = size - _FP_BLOCK_BYTES
            starts = sorted({0, last, *np.linspace(0, last, _FP_BLOCKS + 2).astype(np.int64)[1:-1].tolist()})
            length = _FP_BLOCK_BYTES
        for s in starts:
            f.seek(int(s))
            h.update(f.read(length))
    return h.hexdigest()


def _fingerprint(vf, path):
    """Identity of the input: path, size, modification time, shape, dtype, a hash of 33 spread-out
    rows and a hash of sampled byte blocks of the file."""
    n = vf.shape[0]
    rows = np.unique(np.linspace(0, n - 1, 33).astype(np.int64)) if n else np.zeros(0, np.int64)
    h = hashlib.blake2b(digest_size=16)
    for r in rows:
        h.update(np.ascontiguousarray(vf.read_rows(int(r), int(r) + 1)).tobytes())
    st = os.stat(path)
    return {"path": os.path.realpath(os.fspath(path)), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "shape": [int(s) for s in vf.shape], "dtype": str(vf.dtype), "rows_hash": h.hexdigest(),
            "blocks_hash": _blocks_hash(path, st.st_size)}


_FP_WHAT = {"path": "path", "size": "file size", "mtime_ns": "modification time", "shape": "shape",
            "dtype": "dtype", "rows_hash": "content (sampled rows)", "blocks_hash": "content (sampled blocks)"}


def _fingerprint_changes(old, new):
    """Names of what differs between the manifest's fingerprint and the input's, for the message."""
    if not isinstance(old, dict):
        return ["fingerprint missing"]
    return [_FP_WHAT.get(key, key) for key in new if old.get(key) != new[key]]


def _disk_full(e, path):
    """An OSError saying plainly that the disk is full (ENOSPC / EDQUOT), naming the path;
    other OSErrors unchanged."""
    if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
        why = "disk quota exceeded" if e.errno == getattr(errno, "EDQUOT", None) else "no space left on device"
        return OSError(e.errno, f"disk full ({why}) while writing {path}; free space in "
                                f"{os.path.dirname(os.path.abspath(path))} and rerun with the same work "
                                f"folder to resume")
    return e


_FULL_ERRNOS = {errno.ENOSPC} | ({errno.EDQUOT} if hasattr(errno, "EDQUOT") else set())


def _read_manifest(mpath):
    """The manifest as a dict, its structure checked: a ValueError naming the file rather than a
    KeyError/AttributeError deep inside the build when it was edited or written by something else."""
    def bad(why):
        return ValueError(f"{mpath}: malformed manifest ({why}); delete the work folder to start over")

    try:
        with open(mpath) as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{mpath}: unreadable manifest ({e}); delete the work folder to start over") from e
    if not isinstance(m, dict):
        raise bad(f"a JSON {type(m).__name__}, not an object")
    kinds = {"version": int, "fingerprint": dict, "params": dict, "seed": int, "bounds": list, "done": dict,
             "running": dict}
    for key, kind in kinds.items():
        if key not in m:
            raise bad(f"no {key!r} entry")
        if not isinstance(m[key], kind) or isinstance(m[key], bool):
            raise bad(f"{key!r} is a {type(m[key]).__name__}, not a {kind.__name__}")
    if m["version"] != _VERSION:
        raise bad(f"version {m['version']}, made by another knnkit release (this one writes version {_VERSION})")
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in m["bounds"]) or \
            sorted(m["bounds"]) != m["bounds"] or len(m["bounds"]) < 2:
        raise bad("'bounds' is not an increasing list of row numbers")
    for step, v in m["done"].items():
        if not isinstance(v, dict) or not isinstance(v.get("files"), dict) or \
                not all(isinstance(c, str) for c in v["files"].values()):
            raise bad(f"step {step!r} has no 'files' table of checksums")
    for shard, v in m["running"].items():
        if not (isinstance(v, dict) and isinstance(v.get("stem"), str) and re.fullmatch(r"run_\d+_v\d+", v["stem"])
                and isinstance(v.get("files"), dict)
                and set(v["files"]) == {v["stem"] + LIST_EXT}):
            raise bad(f"running list of shard {shard!r} is not a stem with its list file")
    return m


class _Store:
    """Files of one work folder: written atomically, checksummed, verified on read.

    A file this process wrote (or already verified) is not hashed again while its size and
    modification time are unchanged: re-hashing every shard graph at every merge cost more than
    the merge itself."""

    def __init__(self, workdir, manifest):
        self.dir = workdir
        self.m = manifest
        self._verified = {}  # name -> (checksum, size, mtime_ns)

    def path(self, name):
        return os.path.join(self.dir, name)

    def _remember(self, name, checksum):
        st = os.stat(self.path(name))
        self._verified[name] = (checksum, st.st_size, st.st_mtime_ns)

    def write_pair(self, stem, ind, dist):
        """One list file (ids and distances) in the knnkit container, atomic; its checksum."""
        name = stem + LIST_EXT
        try:
            write_container(self.path(name), "checkpoint", {"stem": stem},
                            {"indices": np.ascontiguousarray(ind, np.int32),
                             "distances": np.ascontiguousarray(dist, np.float32)})
            checksum = _checksum(self.path(name))
            self._remember(name, checksum)
        except BaseException as e:
            # the file is listed nowhere yet: leave nothing behind
            _remove(self.path(name))
            self._verified.pop(name, None)
            err = _disk_full(e, self.path(name))
            if err is e:
                raise
            raise err from e
        return {name: checksum}

    def verify(self, name, checksum):
        p = self.path(name)
        if not os.path.exists(p):
            raise ValueError(f"{p}: listed in the manifest but missing; delete the work folder to start over")
        st = os.stat(p)
        if self._verified.get(name) == (checksum, st.st_size, st.st_mtime_ns):
            return
        if _checksum(p) != checksum:
            raise ValueError(f"{p}: checksum mismatch with the manifest (file changed or corrupted); "
                             f"delete the work folder to start over")
        self._remember(name, checksum)

    def read_pair(self, stem, checksums):
        name = stem + LIST_EXT
        self.verify(name, checksums[name])  # the manifest's checksum: the container's is then redundant
        _meta, arrays = read_container(self.path(name), kind="checkpoint", verify=False)
        return arrays["indices"], arrays["distances"]


def _remove(p):
    try:
        os.remove(p)
    except FileNotFoundError:
        pass


def _cleanup(workdir, manifest):
    """Remove files of ours that the manifest does not list (half-written or superseded)."""
    keep = {MANIFEST}
    for step, v in manifest["done"].items():
        keep.update(f for f in v["files"] if not f.startswith("run_"))
    for v in manifest["running"].values():
        keep.update(v["files"])
    for name in os.listdir(workdir):
        if name not in keep and _OWNED.match(name):
            logger.debug("removing stray file %s", name)
            _remove(os.path.join(workdir, name))
