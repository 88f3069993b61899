"""``HostIndex``: the engine of a :class:`knnkit.GraphIndex` with ``placement="host"`` (BANG).

What lives where: the search graph (n, R) int32 and the full-precision vectors stay in host memory
(numpy arrays or memory maps); the GPU holds only the PQ codes (n, m) uint8, the codebook and, per
query batch, the distance tables and the work lists. Same method names as
:class:`knnkit.index.SearchGraph` (``search``, ``to_arrays``, ``from_arrays``, ``n``, ``dim``, ...),
so the facade dispatches on the placement only.
"""

import time

import numpy as np

from ..._core.backend import as_host, cupy_or_none, get_array_module
from ..._core.config import get_memory_budget, logger
from ..._core.config import host_available_bytes as _host_available_bytes
from ..._core.metrics import internal_metric, prepare_vectors
from ..._core.params import check_int
from .._engine import SearchGraph, host_bytes
from .._entry import EntryPoints
from ._pq import choose_m, encode, pq_tables, train_opq, train_pq, use_opq, TRAIN_SAMPLE
from ._search_cpu import rerank_cpu, search_pq_cpu, top_logged

__all__ = ["HostIndex", "host_bytes", "build_bytes", "out_of_core_host_bytes", "BANG_SEARCH_KEYS"]

#: the SearchParams fields only the host path reads
BANG_SEARCH_KEYS = ("rerank", "prefetch", "pipeline_batch", "search_width")
#: largest search width (the GPU kernels' shared scratch: BANG_MAX_W in bang.cu)
MAX_SEARCH_WIDTH = 64
ENCODE_BATCH = 1 << 18  # rows prepared and encoded per step (streamed from host memory or a memory map)


#: Out-of-core candidate graphs of host-placed indexes: shards of at least MIN_SHARD points and at
#: most MAX_SHARDS shards (the merges grow as the square of the shard count)
MIN_SHARD = 2048
MAX_SHARDS = 64


def build_bytes(n, d, K):
    """Bytes of GPU memory an in-memory graph build of n x d points with K-long candidate lists
    needs, roughly: float32 vectors, candidate ids and distances, and the same again in working
    copies (sorts, pruning, reverse edges)."""
    return int(n) * (int(d) * 4 + int(K) * 8) * 2


#: Host memory of the out-of-core path of a host-placed build, in units of ``4 d + 8 K`` bytes (one
#: point's float32 vector and one K-long list of ids and distances): per point of the data (the
#: final ids, the data file's pages, the host's prune and repair after the lists) and per point of
#: one shard (the vectors, shard graphs and running lists of the two shards a merge reads and of
#: the next step's, prefetched, and the lists the writer has not committed yet), plus a fixed part
#: (the GPU runtime and libraries). Fitted to the peak resident sets measured on the GPU path
#: (H200 host, `benchmarks/bang_ooc_host_memory.py`, `results/h200-2026-12-01-s36/`): 6M x 96,
#: K = 64 in 3 shards 21.5 GB, in 6 shards 14.2 GB; 4M x 48, K = 32 in 4 shards 7.7 GB: 0.81 per
#: data point, 8.2 per shard point, 2.6 GB fixed. Rounded up; checked against 3M x 96 in shards
#: sized for 10 GB (8.1 GB) and the whole 2M x 96 build in 4 shards (7.8 GB, model 9.0 GB). At
#: 40M x 96 in 3 shards the model says ~150 GB: the 125 GB host that tried was killed.
OUT_OF_CORE_HOST_PER_POINT = 1.0
OUT_OF_CORE_HOST_PER_SHARD_POINT = 9.0
OUT_OF_CORE_HOST_FIXED = 3 << 30
#: The in-memory build's measured peak GPU memory over :func:`build_bytes`, the CuPy pool's cached
#: blocks included (H200, K = 64: 20M x 96 54.1 GB against 35.8 GB, 1.51x,
#: `benchmarks/results/h200-2026-12-01-s35/build_memory/`; 50M x 96 142.7 GB against 89.6 GB, 1.59x,
#: `results/h200-2026-12-01-s37/build_50m_auto/`): what the advice of :func:`_out_of_core_shard` asks for
IN_MEMORY_PEAK_OVER_ESTIMATE = 1.6


#: The share of the free GPU memory that the in-memory build's measured peak may take when the
#: memory budget is automatic (see :func:`_build_budget`): the 50M x 96 build peaked at 95.5 % of
#: the free memory (142.7 of 149.5 GB) and finished
BUILD_FREE_FRACTION = 0.96


def _build_budget(budget, device):
    """GPU memory the graph build plans on. An explicit budget (``set_memory_budget(nbytes)``) is
    the user's word. The automatic one (a fraction of the free memory, 0.5 by default) is meant for
    routines that share the device; the build runs alone, and its in-memory path is both faster
    and the only one that does not need the out-of-core path's host memory, so it is taken while its
    measured peak (:data:`IN_MEMORY_PEAK_OVER_ESTIMATE` x :func:`build_bytes`) fits
    :data:`BUILD_FREE_FRACTION` of the free memory (0.6 of it). Under the automatic half, 40M x 96 went
    out of core; in GPU memory it built in 212 s (H200, thirty-fifth session), and 50M x 96 in 265 s
    under this budget (89.7 GB planned of 149.5 GB free; thirty-seventh session)."""
    from ..._core import config

    if device != "gpu" or config._globals["memory_budget"] is not None:
        return budget
    cp = cupy_or_none()
    if cp is None:
        return budget
    try:
        free = int(cp.cuda.runtime.memGetInfo()[0]) + int(cp.get_default_memory_pool().free_bytes())
    except Exception:  # noqa: BLE001 (no device answer: the budget as it is)
        return budget
    return max(int(budget), int(BUILD_FREE_FRACTION * free / IN_MEMORY_PEAK_OVER_ESTIMATE))


def out_of_core_host_bytes(n, d, K, shard):
    """Host memory the out-of-core candidate lists of ``n`` points of ``d`` dimensions with ``K``
    neighbours need in shards of ``shard`` points (:data:`OUT_OF_CORE_HOST_PER_POINT`,
    :data:`OUT_OF_CORE_HOST_PER_SHARD_POINT`, :data:`OUT_OF_CORE_HOST_FIXED`)."""
    unit = 4 * int(d) + 8 * int(K)
    return int(OUT_OF_CORE_HOST_FIXED
               + unit * (OUT_OF_CORE_HOST_PER_POINT * int(n) + OUT_OF_CORE_HOST_PER_SHARD_POINT * int(shard)))


def _smallest_shard(n, K):
    """The fewest points a shard may have: MIN_SHARD, room for K neighbours of its own, and at
    most MAX_SHARDS shards (the merges grow as the square of the shard count)."""
    return min(int(n), max(MIN_SHARD, 4 * (int(K) + 1), -(-int(n) // MAX_SHARDS)))


def _budget_shard(n, d, K, budget, device):
    """Shard size of the out-of-core lists under the GPU ``budget``: as large as the budget allows
    (two shards per merge), never below :func:`_smallest_shard`."""
    from ...graph._out_of_core import _default_shard_size, internal_list_length

    kind = "gpu" if device == "gpu" else "cpu"
    # the shard graphs and merges work on their own, longer lists (192 entries for K = 64 on the
    # GPU): sized with K, the shards took ~2.5x the budget
    K_lists, p = internal_list_length(n, K, kind)
    shard, _ = _default_shard_size(n, d, K_lists, p, kind, int(budget))
    return min(int(n), max(shard, _smallest_shard(n, K)))


def _size(nbytes):
    """Bytes for a message: GB, or MB below 1 GB."""
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


def _out_of_core_shard(n, d, K, budget, device):
    """Shard size of an out-of-core candidate build: the GPU budget's, made smaller when the host's
    available memory cannot hold that many points' state (:func:`out_of_core_host_bytes`). Refuses,
    before hours of work, a build the host cannot hold even in the smallest shards (the process
    would be killed by the operating system, not stopped with an error)."""
    shard = _budget_shard(n, d, K, budget, device)
    avail = _host_available_bytes()
    if avail is None or out_of_core_host_bytes(n, d, K, shard) <= avail:
        return shard
    unit = 4 * int(d) + 8 * int(K)
    fit = int(((avail - OUT_OF_CORE_HOST_FIXED) / unit - OUT_OF_CORE_HOST_PER_POINT * int(n))
              / OUT_OF_CORE_HOST_PER_SHARD_POINT)
    smallest = _smallest_shard(n, K)
    if fit >= smallest:
        logger.info("GraphIndex: out-of-core shards of %d points (the GPU budget allows %d): the host has %s "
                    "available", fit, shard, _size(avail))
        return fit
    need = out_of_core_host_bytes(n, d, K, smallest)
    estimate = build_bytes(n, d, K)
    gpu_need = int(estimate * IN_MEMORY_PEAK_OVER_ESTIMATE)
    hint = ""
    cp = cupy_or_none() if device == "gpu" else None
    if cp is not None:
        try:
            total = int(cp.cuda.runtime.memGetInfo()[1])
        except Exception:  # noqa: BLE001 (no device answer: no GPU hint)
            total = 0
        if gpu_need <= 0.9 * total:
            hint = (f" The graph can be built in GPU memory instead (~{_size(gpu_need)} of "
                    f"{_size(total)}): raise the budget for the build, e.g. "
                    f"knnkit.set_memory_budget({int(gpu_need * 1.1)}), then set the search budget.")
    raise MemoryError(
        f"GraphIndex(placement='host'): the graph build of {n} x {d} points needs ~{_size(estimate)} "
        f"by its estimate, more than the memory budget ({_size(budget)}), so its candidate lists (K={K}) "
        f"would be built out of core; even in the smallest shards ({smallest} points) that needs "
        f"~{_size(need)} of host memory and {_size(avail)} are available.{hint} Otherwise use a host with "
        f"more memory, a smaller intermediate_degree, or fewer points.")


def _whole_vector_file(a):
    """The path of the vector file ``a`` maps whole (an ``np.memmap`` from ``np.load(mmap_mode=...)``
    or ``knnkit.io.read(path, mmap=True)``: ``.npy``, ``.fbin``, ``.u8bin``, ``.i8bin``, ``.fvecs``,
    ``.bvecs``), so the out-of-core build reads it in place instead of a temporary copy of the data;
    None for anything else (a slice, another shape, an in-memory array)."""
    fname = getattr(a, "filename", None)
    if not isinstance(a, np.memmap) or not fname:
        return None
    from ..._core.vectors import open_vectors

    try:
        vf = open_vectors(str(fname))
        if tuple(vf.shape) != tuple(a.shape) or vf.dtype != a.dtype or a.shape[0] == 0:
            return None
        # the same rows at three places: a map of the same file at another offset is not the file
        for r in sorted({0, a.shape[0] // 2, a.shape[0] - 1}):
            if not np.array_equal(vf.read_rows(r, r + 1)[0], np.asarray(a[r])):
                return None
    except (OSError, ValueError):
        return None
    return str(fname)


def _out_of_core_candidates(a, metric, K, budget, device, random_state, shard=None):
    """Candidate lists ``(ids (n, K) int64, None)`` of host data ``a`` by
    :func:`knnkit.graph._out_of_core.build_out_of_core` under ``budget`` bytes, in shards of
    ``shard`` points (default :func:`_budget_shard`; never below :func:`_smallest_shard`, so that the
    pairwise merges, shards^2 / 2 of them, do not explode): ``a`` is used in place when it is a memory map
    of a whole vector file (:func:`_whole_vector_file`), else written to a temporary ``.npy``
    (removed afterwards, as is the work folder)."""
    import os
    import shutil
    import tempfile

    from ...graph._out_of_core import build_out_of_core, check_disk, internal_list_length, out_of_core_disk_bytes

    n = int(a.shape[0])
    K = int(min(K, n - 1))
    if shard is None:
        shard = _budget_shard(n, int(a.shape[1]), K, budget, device)
    shard = min(n, max(int(shard), _smallest_shard(n, K)))
    tmp = tempfile.mkdtemp(prefix="knnkit-host-build-")
    try:
        path = _whole_vector_file(a)
        # the lists' files (and the data's copy) must fit the disk: refused now, not when a
        # merge's files meet a full disk (50M x 96 did after 4 minutes on a 64 GB disk)
        K_lists, _p = internal_list_length(n, K, "gpu" if device == "gpu" else "cpu")
        need = out_of_core_disk_bytes(n, K, K_lists, shard)
        what = f"GraphIndex(placement='host'): the out-of-core candidate lists of {n} x {a.shape[1]} points " \
               f"(K={K}, lists of {K_lists} in shards of {shard})"
        advice = "set TMPDIR to a folder on a larger disk"
        if path is None:  # the data is copied next to the lists first
            need += n * int(a.shape[1]) * a.dtype.itemsize
            what += " and a copy of the data"
            advice += ", pass the data as a memory map of its file (read in place)"
        check_disk(tmp, need, what, advice=advice + ", raise the memory budget for the build so that it runs in GPU memory")
        if path is None:
            path = os.path.join(tmp, "data.npy")
            out = np.lib.format.open_memmap(path, mode="w+", dtype=a.dtype, shape=a.shape)
            step = max(1, (64 << 20) // max(1, a.shape[1] * a.dtype.itemsize))
            for s in range(0, n, step):
                out[s:s + step] = a[s:s + step]
            out.flush()
            del out
        logger.info("GraphIndex: host placement, candidate graph (K=%d) built out of core under %d bytes", K, budget)
        seed = int(random_state) if isinstance(random_state, (int, np.integer)) else None
        res = build_out_of_core(path, K, workdir=os.path.join(tmp, "work"), shard_size=shard,
                                memory_budget=max(int(budget), 1 << 20), metric=metric, device=device,
                                random_state=seed, return_graph=False)
        if res[0] != "paths":
            raise RuntimeError("the out-of-core candidate graph returned arrays, not paths")
        # only the ids, read from the file's memory map straight into the int64 array the build
        # takes (its distances are recomputed there in the internal metric): one copy of n x K
        from ..._core.vectors import read as read_vectors

        return read_vectors(res[1]["indices"], mmap=True).astype(np.int64), None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _graph_in_gpu_memory(a, metric, bp, random_state, scale):
    """The search graph of host data ``a`` built in GPU memory: ``(graph, entry, timings)`` on the host."""
    cp = cupy_or_none()
    eng = None
    try:
        eng = SearchGraph.build(cp.asarray(a), metric, bp, random_state, scale=scale, top_tier=False)
        out = cp.asnumpy(eng._graph), eng._entry.to(np), dict(eng.build_timings)
    finally:
        del eng
        cp.get_default_memory_pool().free_all_blocks()
    return out


def _resolve_params(a, metric, bp, random_state, scale, device, budget=0):
    """On the GPU, fill the automatic graph parameters (``bp`` in place) before the build decides
    between GPU memory and the out-of-core lists, as the in-memory GPU build would choose them
    (the GPU's tiers, no top tier): the same sampled rows' intrinsic dimension, measured chunk by
    chunk on the device (:func:`knnkit.graph._estimate.estimate_intrinsic_dim_rows`). Without this the
    decision and the out-of-core lists took 96 candidates where the build takes 64 at low intrinsic
    dimension (50M x 96 went out of core with 1.5x the lists' disk). Returns its seconds."""
    from ...graph._estimate import estimate_intrinsic_dim_rows
    from .._engine import _resolve_auto_params

    if device != "gpu" or (bp["graph_degree"] is not None and bp["alpha"] is not None):
        return 0.0
    t0 = time.perf_counter()
    chunk = _LID_CHUNK_BYTES if not budget else min(_LID_CHUNK_BYTES, max(1 << 24, int(budget) // 4))
    lids = estimate_intrinsic_dim_rows(a, metric, scale, random_state=random_state, scales=(5, 20), device="gpu",
                                       chunk_bytes=chunk)
    _resolve_auto_params(None, bp, random_state, top_tier=False, lids=lids, device="gpu")
    logger.info("GraphIndex: host placement, graph degree %d, candidates %d, alpha %s (intrinsic dimension %s)",
                bp["graph_degree"], bp["intermediate_degree"], bp["alpha"], bp.get("intrinsic_dim"))
    return time.perf_counter() - t0


#: Bytes of float32 rows of host data searched at once by the intrinsic-dimension estimate of a GPU
#: build (at most a quarter of the memory budget)
_LID_CHUNK_BYTES = 1 << 30


def _build_graph(a, metric, bp, random_state, scale, device, budget):
    """The search graph of a host-placed index: ``(graph, entry, timings)`` on the host.

    In GPU (or host) memory when :func:`build_bytes` fits the build's budget
    (:func:`_build_budget`), else from candidate lists built out of core (shards and pairwise GGM
    merges, :func:`_out_of_core_candidates`) with the rest of the build on the host. The automatic
    build budget lets the in-memory build try above the shared budget, on a peak measured at 20M;
    if the GPU then runs out of memory where the shared budget would have gone out of core, the
    build goes out of core under the shared budget (logged), as it did before."""
    t0 = time.perf_counter()
    n, d = int(a.shape[0]), int(a.shape[1])
    resolve_s = _resolve_params(a, metric, bp, random_state, scale, device, budget)
    K = int(bp.get("intermediate_degree") or 96)
    need = build_bytes(n, d, K)
    build_budget = _build_budget(budget, device) if budget else budget
    if device == "gpu" and not (build_budget and need > build_budget):
        fell_back = None
        try:
            graph, entry, timings = _graph_in_gpu_memory(a, metric, bp, random_state, scale)
            timings["prepare_auto"] = timings.get("prepare_auto", 0.0) + resolve_s
            return graph, entry, timings
        except MemoryError as e:
            if not (budget and need > budget):
                raise
            fell_back = str(e)
        # (out of the except block: the error's frames, which hold device arrays, are gone)
        cupy_or_none().get_default_memory_pool().free_all_blocks()
        logger.warning("GraphIndex: the in-memory graph build of %d x %d points ran out of GPU memory (%s); "
                       "building its candidate lists out of core under the memory budget (%d bytes)",
                       n, d, fell_back, budget)
        build_budget = budget
    if build_budget and need > build_budget:
        # the budget bounds the GPU's memory only; the host must hold the shards' state
        shard = _out_of_core_shard(n, d, K, build_budget, device)
        cand = _out_of_core_candidates(a, metric, K, build_budget, device, random_state, shard=shard)
        timings_oc = time.perf_counter() - t0
        eng = SearchGraph.build(a, metric, bp, random_state, scale=scale, candidates=cand, top_tier=False)
        timings = dict(eng.build_timings)
        timings["candidates_out_of_core"] = timings_oc - resolve_s
        timings["prepare_auto"] = timings.get("prepare_auto", 0.0) + resolve_s
        return np.asarray(eng._graph), eng._entry, timings
    eng = SearchGraph.build(a, metric, bp, random_state, scale=scale, top_tier=False)
    return np.asarray(eng._graph), eng._entry, dict(eng.build_timings)


class HostIndex:
    """Search graph and vectors in host memory, PQ codes on the GPU (BANG section 3).

    Attributes
    ----------
    placement : str
        Always ``"host"``.
    pq_bytes : int
        Code bytes per vector (PQ subspaces ``m``).
    device : {"cpu", "gpu"}
        Where searches run by default (the codes are copied to the GPU on first GPU search).
    """

    placement = "host"

    def __init__(self, data, graph, entry, codebook, codes, *, metric, build_params, device="cpu", nn1_max=None,
                 scale=1.0, rotation=None, center=None, pq_metric=None):
        self.metric = metric
        self._imetric = internal_metric(metric)
        # The PQ walk scores cosine data (unit vectors) by squared L2, which ranks them as the inner
        # product does. Scored by inner product, a code's error e enters as q.e, first order in the
        # data's spread, while two neighbours' scores differ at second order when the vectors share a
        # main direction (1 - cos small): walk recall 0.03 at beam 32 on 24-d data with a common
        # direction and cosine similarities ~0.9999, 0.58 at ~0.99, against 0.99-1.0 by squared L2.
        # Inner product on rows of one norm is scored so too (the build checks every row's norm).
        if pq_metric not in (None, "l2", "ip"):
            raise ValueError(f"invalid knnkit host-placement index: PQ metric {pq_metric!r}")
        self.pq_metric = pq_metric or ("l2" if metric == "cosine" else self._imetric)
        self._data = data
        self._graph = graph
        self._entry = entry
        self._codebook = np.ascontiguousarray(codebook, dtype=np.float32)
        self._codes = codes
        # OPQ's rotation of the padded space (None: plain PQ); queries are rotated before their tables
        self._rotation = None if rotation is None else np.ascontiguousarray(rotation, dtype=np.float32)
        # the PQ is trained on and encodes the prepared vectors minus this mean (None: not centred,
        # indexes saved before it); see pq_queries
        self._center = None if center is None else np.ascontiguousarray(center, dtype=np.float32)
        self.build_params = dict(build_params)
        self.device = device
        self.scale = float(scale)
        self.nn1_max = float("inf") if nn1_max is None else float(nn1_max)
        self._gpu = None  # (codes, codebook, entry) on the GPU, made on first GPU search
        self._gpu_extra = {}  # more GPU copies made on demand: PQ centroid norms, the vectors (re-rank)
        self._bang_ws = None  # the GPU search's per-call buffers, kept for the next call (_search_gpu)
        self._bang_upload = None  # pinned chunks of the GPU search's host re-rank gather
        self._bang_mapped = None  # graph and vectors mapped for the GPU (access="mapped")
        self._held_out = False  # rows cut out of the graph for a measurement (hold_out): no mapped copy then

    # ------------------------------------------------------------------ properties
    n = property(lambda self: int(self._data.shape[0]))
    dim = property(lambda self: int(self._data.shape[1]))
    dtype = property(lambda self: np.dtype(self._data.dtype))
    graph_degree = property(lambda self: int(self._graph.shape[1]))
    pq_bytes = property(lambda self: int(self._codebook.shape[0]))

    @property
    def graph(self):
        """The search graph, int32 (n, R), ``-1`` in unused slots (the host array itself, read it only)."""
        return np.asarray(self._graph)

    @property
    def data(self):
        """The indexed vectors in their storage dtype (host array or memory map)."""
        return self._data

    @property
    def codes(self):
        """PQ codes (n, m) uint8 (host)."""
        return self._codes

    @property
    def entry_points(self):
        return np.array(as_host(self._entry.medoids), copy=True)

    def __len__(self):
        return self.n

    def describe(self):
        """A short text for ``repr``."""
        return f"placement='host', compression='{self.compression}', pq_bytes={self.pq_bytes}"

    compression = property(lambda self: "pq" if self._rotation is None else "opq")

    def pq_queries(self, Q):
        """Prepared queries as the PQ tables take them. Data far from the origin (a common offset
        large against the spread: coordinates, timestamps, all-positive features) made the tables'
        expansion |q|^2 - 2 q.c + |c|^2 cancel in float32 (one coordinate shifted by 1e6 on unit
        spread: walk recall 0.68, its build check 0.39-0.56), and the k-means and encoding with it.
        So the PQ works on the vectors minus the training sample's mean: l2 distances do not
        change; for inner products the queries stay as they are, which shifts each query's PQ
        scores by the constant q.mean (its ranking unchanged)."""
        if self._center is None or self.pq_metric == "ip":
            return Q
        xp = get_array_module(Q)
        c = self._center if xp is np else self._gpu_cache("pq_center", lambda: xp.asarray(self._center))
        return Q - c

    def rotation_on_device(self):
        """OPQ's rotation as a GPU array (kept by the index), or None for plain PQ."""
        if self._rotation is None:
            return None
        cp = cupy_or_none()
        return self._gpu_cache("opq_rotation", lambda: cp.asarray(self._rotation))

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, a, metric, bp, random_state, *, device, scale=1.0, pq_bytes=None, budget=0, compression=None):
        """Build on validated host data ``a`` (storage dtype; a memory map is read in batches
        for PQ). The graph is built by :meth:`SearchGraph.build` on ``device`` (the data is copied
        there for the build only), then kept on the host; PQ is trained on a sample and every
        point encoded in streamed batches on ``device``."""
        t0 = time.perf_counter()
        graph, entry, timings = _build_graph(a, metric, bp, random_state, scale, device, budget)
        if not isinstance(entry, EntryPoints):
            raise ValueError("placement='host' supports entry='kmeans' only")
        timings["graph_total"] = time.perf_counter() - t0
        n, d = a.shape
        m = choose_m(n, d, pq_bytes=pq_bytes, budget=budget if device == "gpu" else 0)
        t1 = time.perf_counter()
        seed = int(random_state) if isinstance(random_state, (int, np.integer)) else 0
        rows = np.sort(np.random.default_rng([seed & 0xFFFFFFFF, 0x5A]).choice(n, min(n, TRAIN_SAMPLE),
                                                                             replace=False))
        sample = prepare_vectors(np.asarray(a[rows]), metric, scale)
        center = sample.mean(axis=0, dtype=np.float64).astype(np.float32)  # see pq_queries
        sample = sample - center
        opq = use_opq(compression, d, m)
        xp = cupy_or_none() if device == "gpu" else np
        if opq:
            rotation, codebook = train_opq(xp.asarray(sample), m, random_state=seed)
            rotation, codebook = as_host(rotation), as_host(codebook)
        else:
            rotation, codebook = None, as_host(train_pq(xp.asarray(sample), m, random_state=seed))
        timings["pq_train"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        norms = []
        codes = encode_all(a, codebook, metric, scale, device, rotation=rotation, center=center, norms=norms)
        timings["pq_encode"] = time.perf_counter() - t2
        bp = dict(bp, placement="host", compression="opq" if opq else "pq", pq_bytes=int(m))
        logger.info("GraphIndex: host placement, PQ %d bytes/vector; build phases (s): %s", m,
                    {k: round(v, 3) for k, v in timings.items()})
        nn1 = None
        # inner product on rows of one norm (the user normalised them): scored as cosine is
        pq_metric = "l2" if metric == "cosine" or (metric == "inner_product" and equal_norms(*norms)) else None
        engine = cls(a, graph, entry, codebook, codes, metric=metric, build_params=bp, device=device, nn1_max=nn1,
                     scale=scale, rotation=rotation, center=center, pq_metric=pq_metric)
        engine.build_timings = timings
        return engine

    # ------------------------------------------------------------------ search
    def _device_arrays(self):
        if self._gpu is None:
            cp = cupy_or_none()
            if cp is None:
                raise RuntimeError("GPU search asked for but no CUDA GPU is usable")
            self._gpu = (cp.asarray(np.asarray(self._codes)), cp.asarray(self._codebook), self._entry.to(cp))
        return self._gpu

    def _gpu_cache(self, name, make):
        """A GPU array kept by the index, made by ``make()`` on first use."""
        a = self._gpu_extra.get(name)
        if a is None:
            a = self._gpu_extra[name] = make()
        return a

    def _rerank_data_gpu(self):
        """The vectors on the GPU (storage dtype, copied once in 64 MB pieces) when they and the PQ
        codes fit half the memory budget, so the GPU search re-ranks from device memory; else None
        (the re-rank rows come from host memory). A copy already held counts towards the budget
        when the budget is automatic (a fraction of the free memory, which the copy itself lowers);
        a copy that no longer fits an explicitly set budget is dropped."""
        from ..._core import config

        cp = cupy_or_none()
        nbytes = self.n * self.dim * self.dtype.itemsize
        have = self._gpu_extra.get("data")
        budget = get_memory_budget()
        if have is not None and config._globals["memory_budget"] is None:
            budget += have.nbytes
        if self.n * self.pq_bytes + nbytes > budget // 2:
            if have is not None:
                del self._gpu_extra["data"]
            return None
        if have is None:
            t = time.perf_counter()
            have = cp.empty((self.n, self.dim), self.dtype)
            step = max(1, (64 << 20) // max(1, self.dim * self.dtype.itemsize))
            for s in range(0, self.n, step):
                have[s:s + step] = cp.asarray(np.asarray(self._data[s:s + step]))
            self._gpu_extra["data"] = have
            logger.info("GraphIndex (host placement): %d vectors (%.1f MB) copied to the GPU for the re-rank in "
                        "%.2f s (they fit half the memory budget)", self.n, nbytes / 1e6, time.perf_counter() - t)
        return have

    def release_gpu_buffers(self):
        """Give back the GPU memory the GPU search keeps between calls (per-call buffers, pinned
        host buffers, the vectors' device copy); the next GPU search makes them again. The PQ codes
        stay, and so does the mapping of the host graph and vectors of ``access="mapped"`` (it holds
        no GPU memory; it goes with the index). A mapping in managed memory is a copy of graph and
        vectors in host memory, the size of both."""
        self._bang_ws = None
        self._bang_upload = None
        self._gpu_extra.pop("data", None)

    def kth_distances(self, rows, k, *, device, chunk=None, exclude=None, copies=False):
        """Exact INTERNAL distance (float64) from each data row ``rows[j]`` to its ``k``-th nearest
        OTHER row (one copy of itself left out), streamed over the stored vectors in chunks on
        ``device``: the reference of the build's recall check of host indexes. ``exclude``: row ids
        that are never answers (then nothing else is left out: the k-th nearest of the rest).
        ``copies`` (squared L2): also return, per row, whether its nearest answer is an exact copy
        (distance 0 up to the float64 expansion's rounding).
        ``chunk``: stored rows per step; default from a quarter of the memory budget (float64
        distances and rows: ``8 (len(rows) + d)`` bytes per stored row, twice over), at most 2^18."""
        if chunk is None:
            per_row = 16 * (len(rows) + int(self._data.shape[1]) + 2 * k)
            budget = get_memory_budget()
            chunk = int(min(1 << 18, max(1024, (budget // 4 if budget else 1 << 28) // per_row)))
        cp = cupy_or_none() if device == "gpu" else None
        xp = cp if cp is not None else np
        im = internal_metric(self.metric)
        Q = xp.asarray(prepare_vectors(np.asarray(self._data[np.asarray(rows)]), self.metric, self.scale),
                       dtype=xp.float64)
        qn = (Q * Q).sum(axis=1)
        ex = None if exclude is None else np.unique(np.asarray(exclude, np.int64))
        want = k if ex is not None else k + 1
        best = xp.full((Q.shape[0], 0), np.inf)
        for c0 in range(0, self.n, chunk):
            C = xp.asarray(prepare_vectors(np.asarray(self._data[c0:c0 + chunk]), self.metric, self.scale),
                           dtype=xp.float64)
            G = Q @ C.T
            D = -G if im == "ip" else xp.maximum(qn[:, None] + (C * C).sum(axis=1)[None, :] - 2.0 * G, 0.0)
            if ex is not None:
                cols = ex[(ex >= c0) & (ex < c0 + C.shape[0])] - c0
                if cols.size:
                    D[:, xp.asarray(cols)] = np.inf
            D = xp.concatenate([best, D], axis=1)
            kk = min(want, D.shape[1])
            best = xp.partition(D, kk - 1, axis=1)[:, :kk] if D.shape[1] > kk else D
        best = xp.sort(best, axis=1)
        if not copies:
            return as_host(best[:, want - 1])
        # a copy's float64 distance is |x|^2 + |x|^2 - 2 x.x, exact but for the sums' rounding
        first = best[:, want - k]
        return as_host(best[:, want - 1]), as_host(first <= 64 * 2.0 ** -52 * Q.shape[1] * qn)

    def hold_out(self, rows):
        """Cut ``rows`` out of the graph for a measurement (their lists and every link into them;
        an entry medoid among them is replaced by its first out-neighbour not held out) and return
        a function that restores the graph and entries exactly. Searches in between never reach or
        return those rows, so they can be queries whose answers are the other points (the build's
        recall check; the device calibration does the same with its held-out rows)."""
        from .._calibrate import _live_entry, cut_rows

        rows = np.unique(np.asarray(rows, np.int64))
        G = self._graph
        if not getattr(G, "flags", None) or not G.flags.writeable:
            self._graph = G = np.array(G)  # a read-only memory map: cut a copy (kept afterwards)
        hidden = np.zeros(self.n, dtype=bool)
        hidden[rows] = True
        entry, gpu = self._entry, self._gpu
        self._entry = _live_entry(entry, G, rows)
        self._gpu = None  # (the device entry points are made again from the live ones)
        self._held_out = True
        restore_graph = cut_rows(G, rows, hidden)

        def restore():
            restore_graph()
            self._entry, self._gpu = entry, gpu
            self._held_out = False

        return restore

    def search(self, q, k, *, beam, tau=None, max_iters, n_seeds, device, batch_size=None, traversal=None,
               rerank=None, prefetch=True, pipeline_batch=None, search_width=4):
        """Search validated queries ``q``; INTERNAL distances and int64 ids (numpy or cupy by
        ``device``). ``beam`` is the work-list size L; ``rerank`` (default L) the number of
        expanded nodes re-ranked exactly (``k``: only the k PQ-best get exact distances);
        ``search_width`` (1 <= W <= 64) the work-list entries expanded together per iteration (at most L
        can be unexpanded, so W is capped at L without changing results); ``tau`` and
        ``traversal`` do not apply here (the walk stops when its work list is all expanded).
        GPU: the per-call buffers stay with the index for the next call (``release_gpu_buffers``);
        the vectors go to the GPU for the re-rank when they fit half the memory budget."""
        L = int(beam)
        width = min(check_int(4 if search_width is None else search_width, "search_width", minimum=1,
                              maximum=MAX_SEARCH_WIDTH), L)
        max_iters = max(int(max_iters), k)
        rr = max(k, min(int(rerank) if rerank else L, max_iters))
        nq = q.shape[0]
        bs = int(batch_size) if batch_size else max(1, nq)
        if device == "gpu":
            from ._search_gpu import search_host_gpu

            cp = cupy_or_none()
            codes, codebook, entry = self._device_arrays()
            qd = prepare_vectors(cp.asarray(q), self.metric, self.scale)
            parts = [search_host_gpu(self, qd[s:s + bs], k, codes=codes, codebook=codebook, entry=entry, L=L,
                                     max_iters=max_iters, n_seeds=n_seeds, rerank=rr, prefetch=bool(prefetch),
                                     pipeline_batch=pipeline_batch, width=width)
                     for s in range(0, nq, bs)]
            if len(parts) == 1:
                return parts[0]
            return cp.concatenate([p[0] for p in parts]), cp.concatenate([p[1] for p in parts])
        qh = prepare_vectors(np.ascontiguousarray(as_host(q)), self.metric, self.scale)
        D = np.empty((nq, k), np.float32)
        I = np.empty((nq, k), np.int64)
        for s in range(0, nq, bs):
            qb = qh[s:s + bs]
            T = pq_tables(self.pq_queries(qb), self._codebook, self.pq_metric, self._rotation)
            seeds = self._entry.seeds_for(qb, n_seeds)
            log_ids, log_d, _n = search_pq_cpu(self._graph, self._codes, T, seeds, L=L, max_iters=max_iters,
                                               width=width)
            cand = top_logged(log_ids, log_d, rr)
            D[s:s + bs], I[s:s + bs] = rerank_cpu(self._data, qb, cand, k, metric=self._imetric,
                                                  user_metric=self.metric, scale=self.scale)
        return D, I

    # deletes (``GraphIndex.delete``) are not implemented for host placement: refused, never ignored
    deleted = None
    consolidated = True
    n_deleted = 0

    def mark_deleted(self, ids):
        raise ValueError("delete is not supported on a placement='host' index yet; rebuild without the points")

    def compact(self):
        return {}

    def extend(self, a, **_kw):
        raise ValueError("extend is not supported for placement='host' indexes (rebuild with the new points)")

    # ------------------------------------------------------------------ persistence
    def to_arrays(self):
        """``(meta, arrays)`` for the container file (host arrays; memory maps are streamed)."""
        meta = {"metric": self.metric, "dtype": self.dtype.name, "n": self.n, "dim": self.dim,
                "graph_degree": self.graph_degree, "build_params": self.build_params,
                "entry_metric": self._entry.metric, "scale": self.scale, "placement": "host",
                "compression": self.compression, "pq_bytes": self.pq_bytes, "pq_metric": self.pq_metric,
                "nn1_max": self.nn1_max if np.isfinite(self.nn1_max) else None}
        arrays = {
            "data": np.asarray(self._data),
            "graph": np.asarray(self._graph, dtype=np.int32),
            "entry_centroids": as_host(self._entry.centroids).astype(np.float32, copy=False),
            "entry_medoids": as_host(self._entry.medoids).astype(np.int32, copy=False),
            "pq_codebook": self._codebook,
            "pq_codes": np.asarray(self._codes),
        }
        if self._rotation is not None:
            arrays["pq_rotation"] = self._rotation
        if self._center is not None:
            arrays["pq_center"] = self._center
        return meta, arrays

    @classmethod
    def from_arrays(cls, meta, arrays, device, dev_id=None):
        """The engine of a loaded file: the arrays are kept as given (memory maps stay maps)."""
        cb, codes = arrays.get("pq_codebook"), arrays.get("pq_codes")
        n = arrays["data"].shape[0]
        if cb is None or codes is None or cb.ndim != 3 or cb.dtype != np.float32 or codes.dtype != np.uint8 \
                or codes.shape != (n, cb.shape[0]) or cb.shape[1] > 256:
            raise ValueError("invalid knnkit host-placement index: PQ codebook/codes missing or of the wrong shape")
        if cb.shape[0] * cb.shape[2] < arrays["data"].shape[1]:
            raise ValueError("invalid knnkit host-placement index: PQ codebook narrower than the data")
        if int(np.asarray(codes).max(initial=0)) >= cb.shape[1]:
            raise ValueError("invalid knnkit host-placement index: PQ code out of range")
        rotation = arrays.get("pq_rotation")
        dp = cb.shape[0] * cb.shape[2]
        if rotation is not None and (rotation.shape != (dp, dp) or rotation.dtype != np.float32):
            raise ValueError(f"invalid knnkit host-placement index: OPQ rotation of shape {rotation.shape}, "
                             f"expected ({dp}, {dp}) float32")
        if (meta.get("compression") == "opq") != (rotation is not None):
            raise ValueError("invalid knnkit host-placement index: compression and OPQ rotation disagree")
        center = arrays.get("pq_center")  # absent in files saved before the PQ was centred
        if center is not None and (center.shape != (arrays["data"].shape[1],) or center.dtype != np.float32):
            raise ValueError(f"invalid knnkit host-placement index: PQ centre of shape {center.shape}, "
                             f"expected ({arrays['data'].shape[1]},) float32")
        metric = meta["metric"]
        entry = EntryPoints(np.asarray(arrays["entry_centroids"]), np.asarray(arrays["entry_medoids"]),
                            meta.get("entry_metric", internal_metric(metric)))
        return cls(arrays["data"], arrays["graph"], entry, cb, codes, metric=metric,
                   build_params=meta.get("build_params", {}), device=device, nn1_max=meta.get("nn1_max"),
                   scale=meta.get("scale", 1.0), rotation=None if rotation is None else np.asarray(rotation),
                   center=None if center is None else np.asarray(center), pq_metric=meta.get("pq_metric"))


def encode_all(a, codebook, metric, scale, device, rotation=None, center=None, norms=None):
    """PQ codes of every row of ``a`` (host array or memory map), prepared, minus ``center`` (the
    PQ's mean, see :meth:`HostIndex.pq_queries`) and encoded in batches of :data:`ENCODE_BATCH`
    rows on ``device`` (``rotation``: OPQ's); host uint8 (n, m). ``norms``: a list that receives
    the smallest and the largest norm of the prepared rows (see :func:`equal_norms`)."""
    n = a.shape[0]
    out = np.empty((n, codebook.shape[0]), np.uint8)
    lo, hi = np.inf, 0.0

    def norm_range(xp, Xb, lo, hi):
        if norms is None:
            return lo, hi
        nb = xp.sqrt(xp.sum(Xb.astype(xp.float64) ** 2, axis=1))
        return min(lo, float(nb.min())), max(hi, float(nb.max()))

    if device == "gpu":
        cp = cupy_or_none()
        cb = cp.asarray(codebook)
        rot = None if rotation is None else cp.asarray(rotation)
        cd = None if center is None else cp.asarray(center)
        for s in range(0, n, ENCODE_BATCH):
            Xb = prepare_vectors(cp.asarray(np.asarray(a[s:s + ENCODE_BATCH])), metric, scale)
            lo, hi = norm_range(cp, Xb, lo, hi)
            out[s:s + ENCODE_BATCH] = cp.asnumpy(encode(Xb if cd is None else Xb - cd, cb, rotation=rot))
    else:
        for s in range(0, n, ENCODE_BATCH):
            Xb = prepare_vectors(np.asarray(a[s:s + ENCODE_BATCH]), metric, scale)
            lo, hi = norm_range(np, Xb, lo, hi)
            out[s:s + ENCODE_BATCH] = encode(Xb if center is None else Xb - center, codebook, rotation=rotation)
    if norms is not None:
        norms[:] = [lo, hi]
    return out


#: Rows whose norms differ by at most this fraction count as of one norm (float32 normalisation
#: leaves ~1e-7): their inner product ranks as their squared L2 (see HostIndex.pq_metric).
EQUAL_NORMS_RTOL = 1e-4


def equal_norms(lo, hi):
    return bool(np.isfinite(lo) and hi > 0 and hi - lo <= EQUAL_NORMS_RTOL * hi)
