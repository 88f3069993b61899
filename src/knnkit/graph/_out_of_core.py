"""Out-of-memory k-NN graph construction by shards and pairwise merges
(Wang, Zhao & Zeng, section 5, "the large-scale dataset is partitioned into multiple shards").

Plan, for ``s`` shards of a memory-mapped vector file:

1. ``graph_i``: a k-NN graph of every shard on its own (NN-Descent or brute force), saved to the
   work folder (local ids) together with the shard's *running* list (its current top-k over
   everything merged so far, global ids).
2. ``merge_i_j`` for every pair ``i < j``, once: GGM merges the two shard graphs; the rows of
   each shard are merged into its running list (dedupe, keep the k nearest). After all pairs,
   each running list holds the top-k over the whole file (section 5: "each of which retains the
   top-k neighbours from the whole dataset").
3. ``final``: running lists are concatenated into ``knn_indices.ibin`` (int32, global ids) and
   ``knn_distances.fbin`` (float32, user metric).

Only the shards of the current step and the next (prefetched) are in memory: their vectors,
shard graphs and running lists. A running list of another shard is dropped once its latest
version is on disk and read back when a step needs it, so the host holds a few shards' state,
not n x k entries (at 40M x 96, k = 64 in 3 shards, keeping every list in memory was killed by
the host's out-of-memory killer). Disk I/O overlaps the compute: one background thread reads the
next step's vectors, shard graphs and running lists, another writes the finished step's files
and then commits it to the manifest, while the next step already runs (a step that needs a file
not yet committed waits for it). The writer is at most one step behind: a step waits for the
commit before the previous one, which bounds the arrays waiting to be written.
On the GPU, shards are sized so that one merge (two shards) fits the memory budget, and the
device memory pool is released after every step.

Resuming: ``manifest.json`` in the work folder records every completed step with the BLAKE2b
checksum of each file it produced; it is replaced atomically (tmp + ``os.replace``) only after
the step's files are fully written (themselves written to a temporary name and renamed). A rerun
with the same work folder skips completed steps, verifies checksums of what it reads, and never
reads a file the manifest does not list, so a half-written file from a killed run is ignored
(and removed). A work folder made for another dataset or other parameters is refused.
"""

import concurrent.futures
import functools
import os
import time

import numpy as np

from .._core.config import logger, progress, get_memory_budget, verbose_logging
from .._core.metrics import finalize_distances, to_internal
from .._core.prepare import prepare
from .._core.random import seed_from
from .._core.validation import check_k
from .._core.backend import as_host, resolve_device
from . import GRAPH_METRICS, build_lists, choose_method
from ._checkpoint import (LIST_EXT, MANIFEST, _OWNED, _VERSION, _Store, _checksum, _cleanup, _disk_full, _fingerprint,
                          _fingerprint_changes, _io, _read_manifest, _remove, _write_manifest)
from ._merge import ggm_merge, merge_lists
from .nndescent import NNDescentParams, default_parameters, sample_for

__all__ = ["build_out_of_core"]

#: Outputs up to this many bytes are loaded and returned as a KnnGraph; above, a dict of paths.
RETURN_GRAPH_MAX_BYTES = 2 << 30


def _default_shard_size(n, d, K, p, kind, memory_budget):
    if memory_budget is None:
        if kind == "gpu":
            memory_budget = get_memory_budget()
        else:
            try:
                memory_budget = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
            except (ValueError, OSError, AttributeError):
                memory_budget = 2 << 30
    # per point in memory: prepared vector, list state (ids, distances, flags), samples, running
    # list. A merge holds two shards on the device; on the CPU the prefetcher holds a third in the
    # same memory, on the GPU it sits in host memory and does not count against the GPU budget.
    # The number of merges grows as the square of the shard count, so shards are made as large
    # as the budget allows (a 10M x 96 run with 3x smaller shards needed 6,106 steps).
    if kind == "gpu":
        # GNND on the device: float32 vectors, ids + distances (8K), the initial lists (4K), the
        # sorted output (8K), NEW/OLD sample slots (2 x maxs ints), counters and locks
        maxs = 32 if 2 * p <= 32 else 64
        per_row = 4 * d + 20 * K + 8 * maxs + 32
        held = 2
    else:
        per_row = 4 * d + 12 * K + 16 * p + 64
        held = 3
    return max(1, int(memory_budget) // (held * per_row)), int(memory_budget)


def internal_list_length(n, k, kind, n_neighbors_internal=None):
    """``(K, p)``: the list length and samples of every shard graph and merge of an out-of-core
    build of ``n`` points with ``k`` neighbours on ``kind`` ('cpu' / 'gpu'). Every graph built
    here (a shard, or the union of two) has at most ~1M points: list length and samples as for that
    size, not for n (longer lists would only shrink the shards)."""
    K, p, _it = default_parameters(k, min(n, 1_000_000), device=kind)
    if n_neighbors_internal is not None:
        K = int(n_neighbors_internal)
        p = sample_for(K, kind, min(n, 1_000_000))
    return K, p


def out_of_core_disk_bytes(n, k, K, shard_size):
    """Bytes the work folder of an out-of-core build holds at its peak, the final step: every
    shard's own graph (``K`` ids and distances a point, 8 bytes each), every running list (``k``
    each), the two output files (``k`` each), and the new running lists of the two steps the writer
    may hold before it removes their previous versions. A merge's files are written whole, so a
    run that meets a full disk stops with an error after hours; the build checks this first."""
    n, k, K, shard_size = int(n), int(k), int(K), int(shard_size)
    return 8 * n * (K + 2 * k) + 4 * 8 * min(n, shard_size) * k + (1 << 20)


def _owned_bytes(workdir):
    """Bytes of the build's own files already in ``workdir`` (a resumed build has written them)."""
    total = 0
    for name in os.listdir(workdir):
        if _OWNED.match(name) or name == MANIFEST:
            try:
                total += os.path.getsize(os.path.join(workdir, name))
            except OSError:
                pass
    return total


def check_disk(workdir, need, what, advice="give a work folder on a larger disk"):
    """Refuse (OSError ENOSPC, with the numbers) when the file system of ``workdir`` has less free
    space than ``need`` bytes more than what is written there already."""
    import errno
    import shutil

    free = shutil.disk_usage(workdir).free
    more = int(need) - _owned_bytes(workdir)
    if more > free:
        raise OSError(errno.ENOSPC,
                      f"{what} needs ~{need / 1e9:.1f} GB of disk in {workdir} ({max(more, 0) / 1e9:.1f} GB more than "
                      f"it holds now) and {free / 1e9:.1f} GB are free; {advice}, free space, or build fewer "
                      f"points or shorter lists (k)")


# ----------------------------------------------------------------------------- entry point

def build_out_of_core(path, k=10, *, workdir, shard_size=None, memory_budget=None, metric="sqeuclidean",
                      device="auto", random_state=None, n_neighbors_internal=None, return_graph="auto",
                      verbose=False, _fault_hook=None):
    """Engine of :func:`knnkit.knn_graph_out_of_core`: shards, per-shard graphs, pairwise GGM merges.

    The parameters are the public function's (documented there, where they are validated).
    Returns ``("graph", I, D, stats)`` (global ids, user metric) or ``("paths", paths)`` with the
    paths of ``knn_indices.ibin`` / ``knn_distances.fbin`` / ``manifest.json``.
    """
    if verbose:
        verbose_logging()
    hook = _fault_hook or (lambda name: None)
    io = _io()
    path = os.fspath(path)
    try:
        vf = io.open_vectors(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read vectors from {path}: {e}") from e
    if len(vf.shape) != 2:
        raise ValueError(f"{path}: expected a 2-D (n, d) array, got shape {vf.shape}")
    n, d = (int(s) for s in vf.shape)
    if n == 0 or d == 0:
        raise ValueError(f"{path}: the file holds no vectors (shape {vf.shape})")
    if n >= 2 ** 31:
        raise ValueError(f"{path}: {n} points exceed the int32 ids of the out-of-core output")
    k = check_k(k, n, self_excluded=True)
    kind, _ = resolve_device(device, None)
    K, p = internal_list_length(n, k, kind, n_neighbors_internal)
    if K < k:
        raise ValueError(f"n_neighbors_internal={K} must be >= k={k}")
    budget = None
    if shard_size is None:
        shard_size, budget = _default_shard_size(n, d, K, p, kind, memory_budget)
    shard_size = int(shard_size)
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    n_shards = max(1, -(-n // shard_size))
    bounds = np.linspace(0, n, n_shards + 1).round().astype(np.int64)  # equal shards
    smallest = int(np.diff(bounds).min())
    if smallest <= k:
        raise ValueError(f"shards of {smallest} points cannot hold k={k} neighbours of their own; "
                         f"use a larger shard_size (or memory_budget) or a smaller k")
    workdir = os.fspath(workdir)
    os.makedirs(workdir, exist_ok=True)

    fp = _fingerprint(vf, path)
    params = {"k": k, "K": K, "metric": metric, "shard_size": shard_size, "n_shards": n_shards}
    mpath = os.path.join(workdir, MANIFEST)
    manifest = None
    if os.path.exists(mpath):
        manifest = _read_manifest(mpath)
        changed = _fingerprint_changes(manifest["fingerprint"], fp)
        if changed:
            was = manifest["fingerprint"]
            raise ValueError(f"work folder {workdir} belongs to another dataset or to an earlier version of "
                             f"this file: the input {path} differs from the one the work folder was made for "
                             f"({was.get('path')}, shape {was.get('shape')}) in its {', '.join(changed)}; "
                             f"use an empty folder (or delete this one) to build from the new input")
        if manifest.get("params") != params:
            raise ValueError(f"work folder {workdir} was made with other parameters {manifest.get('params')} "
                             f"(now {params}); use another folder or the same parameters")
        if manifest["bounds"] != bounds.tolist():
            raise ValueError(f"{mpath}: malformed manifest (shard bounds {manifest['bounds'][:4]}... do not "
                             f"split {n} rows into {n_shards} shards); delete the work folder to start over")
        if random_state is not None and manifest["seed"] != seed_from(random_state):
            raise ValueError(f"work folder {workdir} was made with another random_state")
        logger.info("resuming out-of-core build in %s: %d steps done", workdir, len(manifest["done"]))
    else:
        manifest = {"version": _VERSION, "fingerprint": fp, "params": params,
                    "seed": seed_from(random_state), "bounds": bounds.tolist(), "done": {}, "running": {},
                    "created": time.time()}
        _write_manifest(workdir, manifest)
    _cleanup(workdir, manifest)
    if "final" not in manifest["done"]:
        check_disk(workdir, out_of_core_disk_bytes(n, k, K, shard_size),
                   f"the out-of-core k-NN graph of {n} points (k={k}, lists of {K} in {n_shards} shards)")
    store = _Store(workdir, manifest)
    seed = int(manifest["seed"])
    bounds = np.asarray(manifest["bounds"], np.int64)

    steps = [f"graph_{i}" for i in range(n_shards)]
    steps += [f"merge_{i}_{j}" for i in range(n_shards) for j in range(i + 1, n_shards)]
    steps.append("final")

    def load_shard(i):
        x = np.ascontiguousarray(vf.read_rows(int(bounds[i]), int(bounds[i + 1])))
        if x.dtype == np.float64:
            x = x.astype(np.float32)
        return x

    def shards_of(step):
        parts = step.split("_")
        return [] if step == "final" else [int(v) for v in parts[1:]]

    state = _State(store, n_shards, metric, hook)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="knnkit-prefetch")
    writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="knnkit-writer")
    cache = {}

    def get(i):
        if i not in cache:
            cache[i] = pool.submit(load_shard, i)
        return cache[i].result()

    todo = [s for s in steps if s not in manifest["done"]]
    t_start = time.perf_counter()
    bar = progress(total=len(steps), desc="out-of-core k-NN graph", unit="step")
    bar.update(len(steps) - len(todo))
    pending = state.pending  # commits not finished yet (futures), oldest first
    try:
        for t, step in enumerate(todo):
            need = shards_of(step)
            # keep only what this step needs, then prefetch the next step's new shard in the background
            for i in list(cache):
                if i not in need:
                    del cache[i]
            nxt = shards_of(todo[t + 1]) if t + 1 < len(todo) else []
            state.keep_bases(need)
            # the writer at most one step behind, then every committed running list that neither
            # this step nor the next reads leaves memory
            while len(pending) > 1:
                pending.pop(0).result()
            state.release_running(set(need) | set(nxt))
            t0 = time.perf_counter()
            for i in need:
                get(i)
            for i in nxt:
                if i not in cache:
                    cache[i] = pool.submit(load_shard, i)
                if todo[t + 1].startswith("merge_"):
                    state.prefetch_base(i, pool)
                    state.prefetch_running(i, pool)
            hook(f"{step}:start")
            t1 = time.perf_counter()
            if step == "final":
                state.wait_commits()  # every running list on disk and in the manifest first
                files, running = _step_final(store, n_shards, state), {}
                writes = []
            elif step.startswith("graph_"):
                writes, running = _step_graph(state, need[0], get(need[0]), bounds, k, K, metric, device, seed)
            else:
                writes, running = _step_merge(state, need[0], need[1], get(need[0]), get(need[1]), bounds, k, K,
                                              metric, device, seed)
            if kind == "gpu":  # hand cached blocks back: the budget bounds what the process holds
                _free_device_pool()
            times = {"load_s": t1 - t0, "compute_s": time.perf_counter() - t1, **state.detail,
                     "rss_bytes": _resident_bytes()}
            state.detail = {}
            # results are written (and committed to the manifest) by a background thread while the
            # next step computes; the in-memory running lists are what the next steps read
            for f in [f for f in pending if f.done()]:
                f.result()  # re-raises a failed commit here, in the caller's thread
                pending.remove(f)
            job = functools.partial(_commit, state, step, writes, running, times, files if step == "final" else None)
            pending.append(writer.submit(job))
            if step == "final":
                pending.pop().result()
            bar.update(1)
            if verbose:
                logger.info("out-of-core %s: load %.2f s, compute %.2f s", step, times["load_s"], times["compute_s"])
        for f in pending:
            f.result()
    finally:
        bar.close()
        writer.shutdown(wait=True, cancel_futures=True)
        pool.shutdown(wait=True, cancel_futures=True)
    out_i = os.path.join(workdir, "knn_indices.ibin")
    out_d = os.path.join(workdir, "knn_distances.fbin")
    paths = {"indices": out_i, "distances": out_d, "manifest": mpath}
    if return_graph == "auto":
        return_graph = n * k * 8 <= RETURN_GRAPH_MAX_BYTES
    if not return_graph:
        return ("paths", paths)
    for name, cs in manifest["done"]["final"]["files"].items():
        store.verify(name, cs)
    I = io.read(out_i)
    D = io.read(out_d)
    stats = {"method": "out_of_core", "n_shards": n_shards, "shard_size": shard_size, "K": K, "seed": seed,
             "memory_budget": budget, "paths": paths, "running_lists_held_max": state.held_max,
             "phase_s": {s: v["time_s"] for s, v in manifest["done"].items()},
             "time_s_this_run": time.perf_counter() - t_start}
    return ("graph", I, D, stats)


# ----------------------------------------------------------------------------- steps

class _State:
    """What the steps share: the store, the shard graphs and running lists held in memory.

    Running lists live in memory from the moment a step computes them (the next step may read
    them before the writer thread has put them on disk) until they are committed and no step
    near reads them (:meth:`release_running`); after that, or after a restart, they are read back
    from the files the manifest lists."""

    def __init__(self, store, n_shards, metric, hook):
        self.store = store
        self.metric = metric
        self.hook = hook
        self.running = {}  # shard -> (ids, user distances), latest version, while a step needs it
        self.stems = {}  # shard -> stem of the version in self.running
        self.running_reads = {}  # shard -> future of a background read of its running list
        self.held_max = 0  # most running lists held in memory at once (the stats report it)
        self.bases = {}    # shard -> (ids, user distances) of the shard's own graph (local ids)
        self.base_reads = {}  # shard -> future of a background read of its graph
        self.versions = {}  # shard -> version number of its latest running list
        self.failed = False  # a commit raised: later steps must not be committed
        self.detail = {}  # timings of the step just computed, recorded in the manifest
        self.pending = []  # futures of commits still running in the writer thread

    def wait_commits(self):
        while self.pending:
            self.pending[0].result()
            self.pending.pop(0)

    def keep_bases(self, need):
        for i in list(self.bases):
            if i not in need:
                del self.bases[i]
        for i in list(self.base_reads):
            if i not in need:
                del self.base_reads[i]

    def _read_base(self, i, files):
        I, D = self.store.read_pair(f"base_{i}", files)
        return np.asarray(I), np.asarray(D, dtype=np.float32)

    def prefetch_base(self, i, pool):
        """Read shard i's graph in the background for the next step (when its step is committed)."""
        done = self.store.m["done"].get(f"graph_{i}")
        if i not in self.bases and i not in self.base_reads and done is not None:
            self.base_reads[i] = pool.submit(self._read_base, i, done["files"])

    def base(self, i):
        if i not in self.bases:
            if f"graph_{i}" not in self.store.m["done"]:
                self.wait_commits()  # its graph step is computed but its files are still being written
            fut = self.base_reads.pop(i, None)
            self.bases[i] = (fut.result() if fut is not None else
                             self._read_base(i, self.store.m["done"][f"graph_{i}"]["files"]))
        return self.bases[i]

    def _committed_stem(self, i):
        r = self.store.m["running"].get(str(i))
        return None if r is None else r["stem"]

    def _read_running(self, i):
        r = self.store.m["running"][str(i)]
        return r["stem"], self.store.read_pair(r["stem"], r["files"])

    def release_running(self, keep):
        """Drop the running lists of shards not in ``keep`` whose version in memory is the one
        committed to disk (a later step reads it back); a list still waiting for the writer stays."""
        for i in list(self.running):
            if i not in keep and self.stems.get(i) == self._committed_stem(i):
                del self.running[i]
        for i in list(self.running_reads):
            if i not in keep:
                del self.running_reads[i]

    def prefetch_running(self, i, pool):
        """Read shard i's running list in the background for the next step (it is on disk when it
        is not in memory: only committed lists are dropped)."""
        if i not in self.running and i not in self.running_reads and self._committed_stem(i) is not None:
            self.running_reads[i] = pool.submit(self._read_running, i)

    def running_list(self, i, keep=True):
        """Shard i's latest running list; ``keep=False`` reads it without holding it afterwards."""
        if i in self.running:
            return self.running[i]
        pre = self.running_reads.pop(i, None)
        stem, lists = pre.result() if pre is not None else self._read_running(i)
        if keep:
            self.set_running(i, stem, lists)
        return lists

    def set_running(self, i, stem, lists):
        self.running[i] = lists
        self.stems[i] = stem
        self.held_max = max(self.held_max, len(self.running))

    def next_stem(self, i):
        """Name of the next version of shard i's running list (versions count up per shard)."""
        ver = self.versions.get(i)
        if ver is None:
            r = self.store.m["running"].get(str(i))
            ver = -1 if r is None else int(r["stem"].rsplit("_v", 1)[1])
        self.versions[i] = ver + 1
        return f"run_{i}_v{ver + 1}"


def _commit(state, step, writes, running, times, files):
    """Writer thread: write a step's files, then record the step in the manifest (atomically),
    then drop the running lists it superseded. Runs the steps' commits in order; after a failed
    one (a kill, a full disk) nothing later is committed, so the manifest never skips a step."""
    if state.failed:
        raise RuntimeError(f"{step}: not committed, an earlier step failed")
    try:
        _commit_step(state, step, writes, running, times, files)
    except BaseException:
        state.failed = True
        raise


def _commit_step(state, step, writes, running, times, files):
    store, manifest, hook = state.store, state.store.m, state.hook
    t0 = time.perf_counter()
    if files is None:
        files = {}
        for stem, (ind, dist) in writes:
            files.update(store.write_pair(stem, ind, dist))
    hook(f"{step}:written")
    run_entries = {i: {"stem": stem, "files": {stem + LIST_EXT: files[stem + LIST_EXT]}}
                   for i, stem in running.items()}
    old = {i: manifest["running"].get(str(i)) for i in run_entries}
    manifest["running"].update({str(i): v for i, v in run_entries.items()})
    manifest["done"][step] = {"files": files, "time_s": times["load_s"] + times["compute_s"],
                              **times, "write_s": time.perf_counter() - t0}
    _write_manifest(store.dir, manifest)
    hook(f"{step}:done")
    for i, prev in old.items():  # superseded running lists
        if prev and prev["stem"] != run_entries[i]["stem"]:
            for name in prev["files"]:
                _remove(os.path.join(store.dir, name))


def _step_graph(state, i, X, bounds, k, K, metric, device, seed):
    ni = X.shape[0]
    P = prepare(X, metric=metric, device=device, metrics=GRAPH_METRICS)
    method = choose_method("auto", ni, P.device, metric)
    # shard graphs as before the recall target existed: the pairwise merges set the final quality
    params = NNDescentParams(target_recall=None) if method.name == "nndescent" else None
    I, D, _st = build_lists(P.X, min(K, ni - 1), metric=metric, method=method, params=params,
                            seed=seed + 7919 * i + 1)
    if metric != "manhattan" or P.scale != 1.0:
        D = finalize_distances(D, metric, P.scale)
    I = np.ascontiguousarray(as_host(I), np.int32)
    D = np.ascontiguousarray(as_host(D), np.float32)
    state.bases[i] = (I, D)
    stem = state.next_stem(i)
    RI = np.where(I[:, :k] >= 0, I[:, :k] + np.int32(bounds[i]), -1).astype(np.int32)
    RD = np.ascontiguousarray(D[:, :k])
    state.set_running(i, stem, (RI, RD))
    return [(f"base_{i}", (I, D)), (stem, (RI, RD))], {i: stem}


def _step_merge(state, i, j, Xi, Xj, bounds, k, K, metric, device, seed):
    Ii, Di = state.base(i)
    Ij, Dj = state.base(j)
    ni = Xi.shape[0]
    n = ni + Xj.shape[0]
    kk = min(k, n - 1)
    # the shards were checked for NaN / Inf when their graphs were built (graph_i steps)
    t_merge = time.perf_counter()
    Pi = prepare(Xi, metric=metric, device=device, metrics=GRAPH_METRICS, check_finite=False)
    Pj = prepare(Xj, metric=metric, device=device, metrics=GRAPH_METRICS, check_finite=False)
    params = NNDescentParams(n_neighbors_internal=K, refine_hubs=False).resolve(k=kk, n=n, device=Pi.device,
                                                                               metric=metric)
    scale = min(Pi.scale, Pj.scale)
    I, D, st, _X = ggm_merge(Pi.raw, Pj.raw, Ii, Di, Ij, Dj, kk, metric=metric, params=params,
                             seed=seed + 104729 * (i * 65536 + j) + 3, scale=scale)
    del _X
    if metric != "manhattan" or scale != 1.0:
        D = finalize_distances(D, metric, scale)
    st["phase_s"]["total"] = time.perf_counter() - t_merge
    t0 = time.perf_counter()
    state.detail = {"descent_s": st["phase_s"]["descent"], "iterations": st["iterations"],
                    "merge_graphs_s": st["phase_s"]["total"],
                    **{f"merge_{key}_s": v for key, v in st["phase_s"].items() if key not in ("descent", "total")}}
    if st["device"] == "gpu":
        # the merged lists are still on the device: update the running lists there (on the host
        # this cost 135 ms a step at 10M x 96, a fifth of a merge step)
        import cupy as xp

        from ._merge import merge_candidates_gpu

        def merge(RI, RD, ids, dists):
            return merge_candidates_gpu(xp, (xp.asarray(RI), ids), (to_internal(xp.asarray(RD), metric), dists), k)
        to_host = xp.asnumpy
    else:
        xp = np
        I = np.asarray(I).astype(np.int64)

        def merge(RI, RD, ids, dists):
            return merge_lists(RI, to_internal(RD, metric), ids, dists, k)
        to_host = np.asarray
    glob = xp.where(I < 0, -1, xp.where(I < ni, I + int(bounds[i]), I - ni + int(bounds[j]))).astype(np.int32)
    writes, running = [], {}
    for s, rows in ((i, slice(0, ni)), (j, slice(ni, None))):
        RI, RD = state.running_list(s)
        MI, MD = merge(RI, RD, glob[rows], to_internal(D[rows], metric))
        if metric != "manhattan":
            MD = finalize_distances(MD, metric)
        stem = state.next_stem(s)
        state.set_running(s, stem, (to_host(MI), to_host(MD)))
        writes.append((stem, state.running[s]))
        running[s] = stem
    state.detail["running_lists_s"] = time.perf_counter() - t0
    return writes, running


def _step_final(store, n_shards, state):
    io = _io()
    files = {}
    try:
        for name, col in (("knn_indices.ibin", 0), ("knn_distances.fbin", 1)):
            files[name] = None
            with io.VectorWriter(store.path(name)) as w:
                for i in range(n_shards):  # one shard's list in memory at a time
                    w.append(state.running_list(i, keep=False)[col])
            files[name] = _checksum(store.path(name))
    except BaseException as e:
        for done in files:  # the outputs appear together or not at all
            _remove(store.path(done))
        err = _disk_full(e, store.path(name))
        if err is e:
            raise
        raise err from e
    return files


def _resident_bytes():
    """The process's resident set now (the manifest records it after every step: the host memory
    this path holds), or None where ``/proc`` cannot tell."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _free_device_pool():
    from .._core.backend import cupy_or_none

    cp = cupy_or_none()
    if cp is not None:
        cp.get_default_memory_pool().free_all_blocks()
