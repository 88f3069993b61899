"""GPU host-placement search (BANG sections 3.2, 4.3, 4.6, 4.9): the graph stays in host memory.

Each iteration of a query batch: the GPU's chosen candidate ids (W per query, the search width)
go to pinned host memory (D2H), host threads gather the candidates' neighbour rows from the host
graph (``_search_cpu.gather_walk``, Numba) into a pinned buffer, the rows go back (H2D, async), and
``bang_distances`` / ``bang_merge`` (``bang.cu``) compute the PQ distances of the W*R neighbours,
filter visited nodes and merge into the work lists. With prefetch (4.6) ``bang_distances`` already
picks the next W candidates and their copy to the host is queued before the merge, so the host
gathers while the GPU merges; without, the merge kernel picks them. Pipelining: the queries are
split into batches, each with its own CUDA stream, buffers, event and kernel arguments; the host
serves whichever batch's candidates have arrived (round-robin when none has), so one batch's gather
overlaps the other batches' kernels and copies.

Re-ranking (4.9), three ways (``last_stats()["rerank_mode"]``):

* ``"device"``: the vectors fit half the memory budget (with the codes), so the index keeps a copy
  on the GPU (made on first use) and the re-rank gathers its rows there;
* ``"stash"`` (BANG 3.2.3): the host gathers each candidate's full vector together with its
  neighbour row during the walk (in the time it otherwise waits for the GPU), the rows travel with
  the iteration and ``bang_stash`` files them by log position; when the walk ends the re-rank rows
  are already on the GPU. Log positions past the slot count (rare: ``stash_slots``) are gathered
  after the walk;
* ``"host"`` (re-rank short against the walk, ``2 * rerank < L``): after the walk, gathered on the
  host into two pinned chunks that alternate with their copies.

A call's own work before the walks is done once for all its batches on the caller's stream
(``_setup``): the queries centred, one seed selection (cuBLAS GEMM and one kernel, or "direct"
where the GEMM's products would cost a call: ``queries_per_call``), the result arrays the re-ranks
write in place; the fused walk starts its own log and filter. Per-call buffers (device and pinned)
are kept by the index (``HostIndex._bang_ws``) and reused by
the next call of the same shape; the PQ tables are one kernel per batch (``bang_tables_direct``:
each entry summed in one pass and stored as bfloat16, the values the CPU twin computes; see
``_pq.TABLE_BITS`` / ``_pq.TABLE_METHOD``). ``configure(legacy=True)`` runs the v2 path (commit
edfb1d5) for comparison: per-call allocations, the tables made apart and handed in as float32,
the 4-byte table fill and the host re-rank into pageable memory after the walk. All paths give the
same ids and distances.

Timers (``last_stats``): host seconds waiting for candidates, gathering rows, queueing copies and
launches, finishing batches, and in total; iterations of the longest batch; counters of launches,
copies, bytes and host synchronisations. ``configure(profile=True)``: also ``phases`` (device
synchronised at the phase boundaries) and ``gpu_s`` (CUDA events around every copy and kernel,
summed per operation over all batches: stream time, so it includes queueing behind the other
batch's work).
"""

import ctypes
import os
import threading
import time

import numpy as np

from ..._core.config import host_available_bytes, logger
from ..._core.cuda import get_kernel, kernel_path
from ..._core.metrics import prepare_vectors
from .._search_gpu import _pow2ceil, seed_block_queries
from ._pq import _padded, pq_tables, table_bits, table_bytes, table_method, tables_into
from ._search_cpu import (_gather_rows, bits_view, bloom_words_for, exact_distances, exact_topk, gather_rows,
                          gather_walk, walk_expansions)

__all__ = ["search_host_gpu", "last_stats", "configure", "stash_slots", "rerank_plan", "rows_from_slots",
           "rows_from_device", "call_bytes_per_query", "MAX_WIDTH"]

_KERNEL = kernel_path(__file__, "bang.cu")
_NT = 128  # threads per block of the walk kernels
_EW = 256  # threads per block of the elementwise kernels (tables, stash)
_SMEM_STATIC = 48 * 1024
_SMEM_MAX = 200 * 1024  # opt-in dynamic shared memory we allow ourselves (H100/H200: 227 KB)
_H2D, _D2H = 1, 2  # cudaMemcpyKind
MAX_WIDTH = 64  # BANG_MAX_W of bang.cu (shared scratch of the candidate selection)
UPLOAD_CHUNK_BYTES = 16 << 20  # "host" re-rank: rows gathered per pinned chunk
_stats = {}
_smem_fit = {}  # (device, table bytes) -> tables in shared memory (the opt-in, once set, stays)
_NO_ROWS = np.zeros((1, 1), np.float32)  # stand-ins for gather_walk's vector arguments without stash
_NO_DST = np.zeros(1, np.int32)


def _env_flag(name):
    return os.environ.get(name, "").strip() not in ("", "0", "false", "no")


_cfg = {"profile": _env_flag("KNNKIT_BANG_PROFILE"), "legacy": _env_flag("KNNKIT_BANG_LEGACY"),
        "rerank_mode": os.environ.get("KNNKIT_BANG_RERANK") or None,
        "access": os.environ.get("KNNKIT_BANG_ACCESS", "auto").strip() or "auto",
        "mapped_chunk": int(os.environ.get("KNNKIT_BANG_MAPPED_CHUNK", "4")),
        "mapped_memory": os.environ.get("KNNKIT_BANG_MAPPED_MEMORY", "auto").strip() or "auto",
        "fused_walk": os.environ.get("KNNKIT_BANG_FUSED_WALK", "1").strip() not in ("0", "false", "no"),
        "walk_tables": os.environ.get("KNNKIT_BANG_WALK_TABLES", "1").strip() not in ("0", "false", "no"),
        "rerank_kernels": os.environ.get("KNNKIT_BANG_RERANK_KERNELS", "1").strip() not in ("0", "false", "no")}
#: widest row the re-rank kernels sort in shared memory (8 bytes a key: 32 KiB); a plan over more
#: logged expansions, or a re-rank of more candidates, takes the CuPy path
RERANK_KERNEL_MAX_COLS = 4096
_UNSET = object()


ACCESS_MODES = ("auto", "mapped", "gather")
MAPPED_MEMORY_KINDS = ("auto", "managed", "pinned")


def configure(*, profile=None, legacy=None, rerank_mode=_UNSET, rerank_kernels=None, access=None, mapped_chunk=None,
              mapped_memory=None, fused_walk=None, walk_tables=None):
    """Process-wide switches of the GPU search; returns the previous settings (a dict, which can be
    passed back as ``configure(**old)``).

    profile : bool
        Per-phase timing in ``last_stats()``: ``phases`` (seconds, the device synchronised at every
        phase boundary) and ``gpu_s`` (CUDA events around every copy and kernel). For measuring
        only: it adds synchronisations. Environment: ``KNNKIT_BANG_PROFILE=1``.
    legacy : bool
        The v2 search path (before the per-call work was cut), for before/after measurements.
        Same results. Environment: ``KNNKIT_BANG_LEGACY=1``.
    rerank_mode : {None, "stash", "host"}
        Where the re-rank rows come from when the vectors are not on the GPU: None chooses
        ("stash" when ``2 * rerank >= L``, else "host"); for measuring one against the other.
        Environment: ``KNNKIT_BANG_RERANK``.
    rerank_kernels : bool
        A finished batch's re-rank through the ``bang_rerank_rows`` (plan), ``bang_rerank_exact``
        (exact distances, rows read by id from the device copy or the mapped host vectors: no
        row buffer) and ``bang_rerank_select`` kernels (default), or through ~35 CuPy calls
        (argsort, take_along_axis, masks, the rows gathered and prepared, einsum). Same ids; the
        distances may differ in the last bit (another order of the sums). For measuring.
        Environment: ``KNNKIT_BANG_RERANK_KERNELS=0``.
    access : {"auto", "mapped", "gather"}
        How a walk step reaches the host graph. "gather" (BANG 4.3 / 4.6): the candidates go to the
        host, host threads gather their rows, the rows come back. "mapped": the graph and vectors
        are mapped into the GPU's address space once per index (``mapped_memory``) and the
        kernels read the rows over PCIe themselves (``bang_walk``, or ``bang_gather_graph`` by
        steps: ``fused_walk``): no host round trip per step, and the re-rank reads its rows the
        same way. Same results. "auto" (default): mapped
        when graph and vectors take at most :data:`MAPPED_MAX_HOST_FRACTION` of the host's memory
        and, in managed memory (a copy), at most :data:`MAPPED_MANAGED_AVAILABLE_FRACTION` of its
        available memory, or, in page-locked memory, at most :data:`MAPPED_MAX_BYTES` (the GPU's
        random reads of page-locked memory slow down as the mapped range grows: at 10 GB the host
        gather is faster). Mapped managed memory against the host gather, one call, H200, x 96:
        1.1-1.4x at 3M, 1.3-1.6x at 20M, 1.3-2.4x at 40M.
        Either falls back to "gather" (logged) when the memory cannot be mapped. Environment:
        ``KNNKIT_BANG_ACCESS``.
    mapped_memory : {"auto", "managed", "pinned"}
        Which memory "mapped" reads. "managed": a copy of the graph and vectors, made once per
        index, in CUDA managed memory advised to stay in host memory (preferred location: the
        CPU) and to be read by the GPU in place (accessed by: the device), which the driver maps
        for the GPU in large pages: the GPU's random row reads keep their speed at any size
        (H200: 20,000 random 128-byte rows in 54-60 us from 0.25 to 24 GB). While rows are held
        out of the graph for a measurement (``HostIndex.hold_out``) the walk gathers instead: the
        copy would not see the cut. "pinned": the arrays page-locked in place
        (``cudaHostRegister``), or copied into page-locked memory when they are a view of a
        larger array; the GPU's reads of it slow down with the range (74 us from 0.25 GB, 400 us
        from 12 GB). "auto" (default): managed where the device has concurrent managed access,
        else pinned; managed falls back to pinned (logged) when it cannot be made.
        Environment: ``KNNKIT_BANG_MAPPED_MEMORY``.
    fused_walk : bool
        "mapped": the whole walk of a batch in one launch of ``bang_walk`` (default): one block per
        query loops over its steps with its PQ table, work list and (where it fits) Bloom filter
        in shared memory, so the table is loaded once per query instead of once per step, a
        finished query frees its block, and the host queues one kernel per batch. False: one
        launch per kernel per step (``bang_gather_graph`` -> ``bang_distances`` -> ``bang_merge``,
        in chunks of ``mapped_chunk``). Same results bit for bit. Environment:
        ``KNNKIT_BANG_FUSED_WALK=0``.
    walk_tables : bool
        The fused walk with its table in shared memory: each block makes its query's PQ table
        itself (default), from the padded query and the codebook, with the table kernel's
        arithmetic (same bits), so no per-query table is written to GPU memory and read back (24
        KB a query at 48-byte codes: the largest part of a bounded call's state) and no table
        kernel runs before the walk. False: the tables made by ``bang_tables_direct`` first. Same
        results bit for bit. Environment: ``KNNKIT_BANG_WALK_TABLES=0``.
    mapped_chunk : int
        "mapped" without ``fused_walk``: walk steps queued between two looks of the host at whether
        a batch has finished (one chunk is always queued ahead, so up to two chunks of steps run
        past the end, each a few microseconds of empty kernels). Environment:
        ``KNNKIT_BANG_MAPPED_CHUNK``.
    """
    old = dict(_cfg)
    if profile is not None:
        _cfg["profile"] = bool(profile)
    if legacy is not None:
        _cfg["legacy"] = bool(legacy)
    if rerank_mode is not _UNSET:
        if rerank_mode not in (None, "stash", "host"):
            raise ValueError(f"rerank_mode must be None, 'stash' or 'host', got {rerank_mode!r}")
        _cfg["rerank_mode"] = rerank_mode
    if rerank_kernels is not None:
        _cfg["rerank_kernels"] = bool(rerank_kernels)
    if access is not None:
        if access not in ACCESS_MODES:
            raise ValueError(f"access must be one of {ACCESS_MODES}, got {access!r}")
        _cfg["access"] = access
    if mapped_memory is not None:
        if mapped_memory not in MAPPED_MEMORY_KINDS:
            raise ValueError(f"mapped_memory must be one of {MAPPED_MEMORY_KINDS}, got {mapped_memory!r}")
        _cfg["mapped_memory"] = mapped_memory
    if fused_walk is not None:
        if not isinstance(fused_walk, (bool, np.bool_)):
            raise ValueError(f"fused_walk must be True or False, got {fused_walk!r}")
        _cfg["fused_walk"] = bool(fused_walk)
    if walk_tables is not None:
        if not isinstance(walk_tables, (bool, np.bool_)):
            raise ValueError(f"walk_tables must be True or False, got {walk_tables!r}")
        _cfg["walk_tables"] = bool(walk_tables)
    if mapped_chunk is not None:
        if isinstance(mapped_chunk, bool) or not isinstance(mapped_chunk, (int, np.integer)) or mapped_chunk < 1:
            raise ValueError(f"mapped_chunk must be an int >= 1, got {mapped_chunk!r}")
        _cfg["mapped_chunk"] = int(mapped_chunk)
    return old


class _Lazy:
    """A statistic read from the device when :func:`last_stats` asks: the batches' arrays it reads
    (``batches``: ``(batch, generation)`` pairs) still hold the call's values unless a later call
    bound them again, which makes it None."""

    def __init__(self, batches, read):
        self.batches, self.read = batches, read

    def value(self):
        if any(b.generation != g for b, g in self.batches):
            return None
        return self.read()

    def __repr__(self):
        return "<read on last_stats()>"


def last_stats():
    """Timers and counters of the last GPU host-placement search (a copy). ``iterations`` and
    ``expansions_mean`` are read from the device here: None once a later call reused the buffers
    they were counted in."""
    out = {k: (v.value() if isinstance(v, _Lazy) else v) for k, v in _stats.items()}
    for key in ("phases", "gpu_s"):
        if key in out:
            out[key] = dict(out[key])
    return out


def _kernel(name):
    return get_kernel(_KERNEL, name)


def _pinned(shape, dtype):
    import cupyx

    return cupyx.empty_pinned(shape, dtype=dtype)


# ------------------------------------------------------------------------------ mapped host memory
_REGISTER_FLAGS = (1 | 2 | 8, 1 | 2)  # portable | mapped | read-only (the GPU only reads); then without read-only
_ALLOC_FLAGS = 1 | 2  # cudaHostAlloc: portable | mapped
_ATTR_HOST_POINTER_FOR_REGISTERED = 91  # cudaDevAttrCanUseHostPointerForRegisteredMem
#: access="auto" maps the graph and vectors only when they take at most this share of the host's
#: physical memory (mapped memory, page-locked or managed, is not paged out; past it the host
#: gather stays)
MAPPED_MAX_HOST_FRACTION = 0.5
#: ... and, in managed memory (a copy), only when they take at most this share of the host's
#: available memory (the copy doubles their footprint; a forced access="mapped" allows 0.9)
MAPPED_MANAGED_AVAILABLE_FRACTION = 0.5
#: ... and, in page-locked memory, at most these bytes together. The GPU's random row reads from
#: page-locked host memory slow down as the mapped range grows (H200, 20,000 random 128-byte rows
#: per launch: 74 us from 0.25 GB, 136-154 us from 1 GB, 324-330 us from 4 GB, 398-400 us from
#: 12 GB, transparent huge pages or not; `bang_mapped_micro.py`), while managed memory keeps
#: 54-60 us from 0.25 to 24 GB (thirty-eighth session). Mapped page-locked access against the host
#: gather, one call, x 96 float32: 1.33-1.78x at 1M (0.5 GB), 0.96-1.25x at 3M (1.5 GB),
#: 0.71-0.86x at 6M (3.1 GB), 0.44-0.71x at 20M (10 GB): "auto" maps page-locked memory below the
#: crossover (~1.9 GB on that log-size line) only
MAPPED_MAX_BYTES = int(1.75 * (1 << 30))


def _whole(a):
    """Whether no NumPy array that ``a`` views reaches past ``a``'s own bytes. Registration pins
    exactly ``a``'s bytes, and a copy from host memory that is partly registered and partly not
    fails in CUDA ("invalid argument"): a larger array around ``a`` (a slice of the user's array)
    would then fail in the user's own ``cupy.asarray``."""
    lo, hi = a.ctypes.data, a.ctypes.data + a.nbytes
    b = a.base
    while isinstance(b, np.ndarray):
        if b.ctypes.data < lo or b.ctypes.data + b.nbytes > hi:
            return False
        b = b.base
    return True


def _copy_rows(out, a):
    """``a`` copied into ``out`` 64 MiB of rows at a time (``a`` may be a memory map); ``out``."""
    step = max(1, (64 << 20) // max(1, a.nbytes // max(1, a.shape[0])))
    for s in range(0, a.shape[0], step):
        out[s:s + step] = a[s:s + step]
    return out


def _pinned_copy(cp, a):
    """``(copy, ptr)``: ``a`` copied (in chunks: ``a`` may be a memory map) into new page-locked,
    mapped host memory of our own (``cudaHostAlloc``), freed by :func:`_unmap`."""
    ptr = cp.cuda.runtime.hostAlloc(max(1, a.nbytes), _ALLOC_FLAGS)
    try:
        out = np.ctypeslib.as_array((ctypes.c_ubyte * max(1, a.nbytes)).from_address(ptr))[:a.nbytes]
        out = _copy_rows(out.view(a.dtype).reshape(a.shape), a)
    except BaseException:
        cp.cuda.runtime.freeHost(ptr)
        raise
    return out, ptr


class _MemLocation(ctypes.Structure):  # CUmemLocation
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


_LOC_DEVICE, _LOC_HOST = 1, 2  # CUmemLocationType
_ADVISE_PREFERRED_LOCATION, _ADVISE_ACCESSED_BY = 3, 5  # CUmem_advise
_ATTACH_GLOBAL = 1  # CU_MEM_ATTACH_GLOBAL
_ATTR_CONCURRENT_MANAGED = 89  # cudaDevAttrConcurrentManagedAccess
_libcuda = []


def _driver():
    """The CUDA driver library (through ctypes: CuPy's runtime module does not wrap the advice
    with a memory location that CUDA 13 requires)."""
    if not _libcuda:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuMemAllocManaged.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t, ctypes.c_uint]
        lib.cuMemAdvise_v2.argtypes = [ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_int, _MemLocation]
        lib.cuMemFree_v2.argtypes = [ctypes.c_ulonglong]
        _libcuda.append(lib)
    return _libcuda[0]


def _managed_supported(cp, dev):
    """Whether the device reads managed memory in place while the host may touch it (Linux, Pascal
    and later; not on Windows or under some virtualisation)."""
    try:
        return cp.cuda.runtime.deviceGetAttribute(_ATTR_CONCURRENT_MANAGED, dev) == 1
    except Exception:  # noqa: BLE001 - an old runtime without the attribute: not supported
        return False


def _managed_copy(cp, a, dev):
    """``(copy, ptr)``: ``a`` copied (in chunks: ``a`` may be a memory map) into CUDA managed memory
    advised to stay in host memory and to be read in place by device ``dev``, freed by
    :func:`_unmap`. The driver maps such memory for the GPU in large pages, so the GPU's random
    reads do not slow down with its size as they do in registered memory."""
    cp.cuda.runtime.memGetInfo()  # the device's primary context is current for the driver calls
    lib = _driver()
    nbytes = max(1, a.nbytes)
    ptr = ctypes.c_ulonglong()
    rc = lib.cuMemAllocManaged(ctypes.byref(ptr), nbytes, _ATTACH_GLOBAL)
    if rc != 0:
        raise RuntimeError(f"cuMemAllocManaged of {nbytes} bytes failed (CUresult {rc})")
    try:
        for advice, where in ((_ADVISE_PREFERRED_LOCATION, _MemLocation(_LOC_HOST, 0)),
                              (_ADVISE_ACCESSED_BY, _MemLocation(_LOC_DEVICE, dev))):
            rc = lib.cuMemAdvise_v2(ptr.value, nbytes, advice, where)
            if rc != 0:
                raise RuntimeError(f"cuMemAdvise (advice {advice}) failed (CUresult {rc})")
        out = np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(ptr.value))[:a.nbytes]
        out = _copy_rows(out.view(a.dtype).reshape(a.shape), a)  # first touched by the host: host pages
    except BaseException:
        lib.cuMemFree_v2(ptr.value)
        raise
    return out, ptr.value


def _mapped_memory_kind(cp, dev):
    """The memory "mapped" access reads: ``configure(mapped_memory=)``, "auto" resolved."""
    want = _cfg["mapped_memory"]
    if want == "auto":
        return "managed" if _managed_supported(cp, dev) else "pinned"
    return want


def _map_arrays(cp, arrays, memory="pinned"):
    """Map host ``arrays`` for the GPU. ``memory`` "managed": each is copied into managed memory
    (:func:`_managed_copy`); when that fails (logged) or ``memory`` is "pinned", each is
    registered in place (``cudaHostRegister``, exactly its bytes) when :func:`_whole`, else (or
    when the registration is refused) copied into page-locked memory of our own. ``(views,
    held)``: device arrays over that memory (the host pointers: the device must be able to use
    them, UVA) and what :func:`_unmap` gives back."""
    rt = cp.cuda.runtime
    dev = cp.cuda.Device().id

    def check_registered():  # before page-locked memory is mapped: first, or when managed falls back
        if rt.deviceGetAttribute(_ATTR_HOST_POINTER_FOR_REGISTERED, dev) != 1:
            raise RuntimeError("the device cannot use host pointers of registered memory")

    if memory != "managed":
        check_registered()
    held, views = [], []
    try:
        for a in arrays:
            src = None
            if memory == "managed" and a.nbytes:
                try:
                    src, ptr = _managed_copy(cp, a, dev)
                    held.append(("managed", ptr))
                except Exception as e:  # noqa: BLE001 - page-locked memory serves as well, slower past ~2 GB
                    logger.info("GraphIndex (host placement): managed memory unavailable (%s: %s); page-locked "
                                "memory is mapped instead", type(e).__name__, e)
                    memory = "pinned"
                    check_registered()
            if src is None and _whole(a) and a.nbytes:
                for flags in _REGISTER_FLAGS:
                    try:
                        rt.hostRegister(a.ctypes.data, a.nbytes, flags)
                        held.append(("registered", a.ctypes.data))
                        src = a
                        break
                    except rt.CUDARuntimeError:
                        pass
            if src is None:
                src, ptr = _pinned_copy(cp, a)
                held.append(("allocated", ptr))
                logger.info("GraphIndex (host placement): %.2f GB copied into page-locked memory for mapped access "
                            "(%s)", a.nbytes / 1e9, "a view of a larger array" if not _whole(a) else "not registrable")
            views.append(cp.ndarray(a.shape, a.dtype, cp.cuda.MemoryPointer(
                cp.cuda.UnownedMemory(src.ctypes.data, max(1, src.nbytes), src, dev), 0)))
    except BaseException:
        _unmap(cp, held)
        raise
    return tuple(views), held


def _unmap(cp, held):
    for kind, ptr in held:
        try:
            if kind == "registered":
                cp.cuda.runtime.hostUnregister(ptr)
            elif kind == "managed":
                _driver().cuMemFree_v2(ptr)
            else:
                cp.cuda.runtime.freeHost(ptr)
        except Exception:  # noqa: BLE001 - at exit the context may be gone; nothing to give back then
            pass


def _host_available_bytes():
    """The host's available memory (``MemAvailable``), or its physical memory where that is not
    known."""
    avail = host_available_bytes()
    return _host_memory_bytes() if avail is None else avail


def _host_memory_bytes():
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def _access_wanted():
    return "gather" if _cfg["legacy"] else _cfg["access"]


_map_lock = threading.Lock()


def host_mapped(engine):
    """``(graph, data)`` as device arrays over mapped host memory (a copy in managed memory kept on
    the host, or the index's own arrays registered in place, or a page-locked copy:
    ``configure(mapped_memory=)``), made once per index and kept while it lives; ``None`` when the
    access is "gather", while rows are held out of the graph, when "auto" finds them past its limits
    (:data:`MAPPED_MAX_HOST_FRACTION`, :data:`MAPPED_MANAGED_AVAILABLE_FRACTION`,
    :data:`MAPPED_MAX_BYTES`), or when mapping fails (logged once): then the walk gathers on the
    host (BANG 4.3 / 4.6)."""
    access = _access_wanted()
    if access == "gather" or getattr(engine, "_held_out", False):
        return None  # (held out: the graph is cut in place, which a managed copy would not see)
    with _map_lock:  # two searches on one index map it once
        return _host_mapped(engine, access)


def _host_mapped(engine, access):
    import weakref

    import cupy as cp

    graph, data = np.asarray(engine._graph), np.asarray(engine._data)
    dev = cp.cuda.Device().id
    want = _mapped_memory_kind(cp, dev)
    # decided once per index, arrays, device and memory asked for: the host's available memory,
    # which the managed copy itself lowers, is read only when a mapping is made
    key = (graph.ctypes.data, graph.nbytes, data.ctypes.data, data.nbytes, dev, want)
    got = getattr(engine, "_bang_mapped", None)
    if got is not None and got["key"] == key and (got["views"] is not None or got["forced"] or access == "auto"):
        return got["views"]
    if got is not None and got["held"]:
        got["finalizer"]()  # the index's arrays or the memory asked for changed: the old mapping goes
    entry = {"key": key, "views": None, "held": [], "finalizer": None, "seconds": 0.0, "forced": access == "mapped",
             "memory": None}
    engine._bang_mapped = entry
    total = graph.nbytes + data.nbytes
    memory = want
    room = 0.9 if access == "mapped" else MAPPED_MANAGED_AVAILABLE_FRACTION
    if memory == "managed" and total > room * _host_available_bytes():
        memory = "pinned"  # no room for the copy: the arrays are page-locked in place
    limit = MAPPED_MAX_HOST_FRACTION * _host_memory_bytes()
    if memory == "pinned":
        limit = min(limit, MAPPED_MAX_BYTES)
    if access == "auto" and total > limit:
        logger.info("GraphIndex (host placement): graph and vectors (%.2f GB) exceed %.2f GB for mapped %s memory "
                    "(%.0f%% of the host's memory%s); host threads gather the rows", total / 1e9, limit / 1e9,
                    memory, 100 * MAPPED_MAX_HOST_FRACTION,
                    f", at most {MAPPED_MAX_BYTES / 1e9:.2f} GB" if memory == "pinned" else "")
        return None
    try:
        if graph.dtype != np.int32 or not (graph.flags.c_contiguous and data.flags.c_contiguous):
            raise ValueError("graph or vectors not contiguous int32 / rows")
        t = time.perf_counter()
        views, held = _map_arrays(cp, [graph, data], memory=memory)
        used = "managed" if held and all(kind == "managed" for kind, _ in held) else "pinned"
        entry.update(views=views, held=held, seconds=time.perf_counter() - t, memory=used,
                     finalizer=weakref.finalize(engine, _unmap, cp, held))
        logger.info("GraphIndex (host placement): %.2f GB of graph and vectors mapped for the GPU (%s memory) in "
                    "%.2f s", total / 1e9, used, entry["seconds"])
    except Exception as e:  # noqa: BLE001 - any failure means: gather on the host, as BANG does
        logger.info("GraphIndex (host placement): mapped access unavailable (%s: %s); host threads gather the "
                    "rows", type(e).__name__, e)
    return entry["views"]


def stash_slots(L, W, rerank, max_iters):
    """Re-rank slots per query of the "stash" mode: log positions ``< slots`` have their vector
    gathered during the walk: :func:`~._search_cpu.walk_expansions` of the larger of ``rerank``
    and ``L`` (at most ``max_iters``); a position past it is gathered after the walk."""
    return int(min(max_iters, walk_expansions(max(rerank, L), W)))


# ------------------------------------------------------------------------------ re-rank helpers
# numpy or cupy (``xp``): the CPU tests check them against the legacy host gather


def rerank_plan(xp, log_ids, log_d, rerank, C):
    """``(cand, pos)``: the ``rerank`` best logged nodes of each query by PQ distance (ids, -1
    padded, int32) and their log positions, from the first ``C`` log columns only. Every column
    from C on is empty (id -1, distance inf) when C >= the largest expansion count, so with a
    stable sort this is exactly ``argsort(log_d)[:, :rerank]`` over the whole log (v2), on
    C (~L + W) columns instead of max_iters (8 L)."""
    nb = log_ids.shape[0]
    C = int(max(1, min(int(C), log_ids.shape[1])))
    if xp is np:
        order = np.argsort(log_d[:, :C], axis=1, kind="stable")[:, :rerank]
    else:
        order = xp.argsort(log_d[:, :C], axis=1)[:, :rerank]  # CuPy sorts stably (Thrust)
    cand = xp.take_along_axis(log_ids[:, :C], order, axis=1)
    if order.shape[1] < rerank:  # fewer columns than the re-rank: the rest is empty, as in v2
        pad = rerank - order.shape[1]
        cand = xp.concatenate([cand, xp.full((nb, pad), -1, cand.dtype)], axis=1)
        order = xp.concatenate([order, xp.full((nb, pad), C, order.dtype)], axis=1)
    return xp.ascontiguousarray(cand), order


def rerank_kernels_apply(log_d, C, rr):
    """Whether :func:`rerank_rows_gpu` / :func:`rerank_select_gpu` take this re-rank (else CuPy)."""
    return (_cfg["rerank_kernels"] and 1 <= C <= RERANK_KERNEL_MAX_COLS and 1 <= rr <= RERANK_KERNEL_MAX_COLS
            and log_d.strides[1] == 4 and log_d.strides[0] % 4 == 0)


def rerank_rows_gpu(cp, log_ids, log_d, C, rr, src=None, S=0, from_slots=False):
    """One kernel for :func:`rerank_plan` and :func:`rows_from_slots` (``from_slots``: ``src`` the
    stash slots) or :func:`rows_from_device` (``src`` the device copy of the vectors); ``src=None``:
    the plan only. Returns ``(cand, pos, rows, missing, n_missing)`` with the same values as those
    (``rows`` None without ``src``; ``missing`` all False unless from the slots; ``n_missing`` a
    1-element device array), queued on the current stream with no host wait."""
    nb = log_ids.shape[0]
    C, rr = int(C), int(rr)
    Cp = _pow2ceil(C)
    cand = cp.empty((nb, rr), dtype=cp.int32)
    pos = cp.empty((nb, rr), dtype=cp.int64)
    missing = cp.empty((nb, rr), dtype=cp.bool_)
    n_missing = cp.zeros(1, dtype=cp.int32)
    rows, row_bytes = None, 0
    if src is not None:
        rows = cp.empty((nb * rr, src.shape[1]), dtype=src.dtype)
        row_bytes = src.shape[1] * src.dtype.itemsize
    word = 16 if row_bytes % 16 == 0 else (4 if row_bytes % 4 == 0 else 1)
    if nb:
        _kernel("bang_rerank_rows")((int(nb),), (int(min(256, max(32, Cp // 2))),),
                                    (log_ids, log_d, np.int64(log_d.strides[0] // 4), np.int32(C), np.int32(Cp),
                                     np.int32(rr), cand if src is None else src, np.int32(bool(from_slots)),
                                     np.int32(S), np.int32(row_bytes), np.int32(word), cand, pos,
                                     cand if rows is None else rows, missing, n_missing), shared_mem=8 * Cp)
    return cand, pos, rows, missing, n_missing


def rerank_select_gpu(cp, dist, cand, k, out=None):
    """The selection of :func:`exact_topk` after its distances, in one kernel: ``(D, I)`` (nq, k)
    float32 / int64, the k best of each row of ``dist`` (+inf where ``cand`` is -1; ties by column),
    id -1 where the distance is not finite, +inf / -1 past ``c`` columns. ``out``: ``(D, I)``
    written in place (contiguous, of those shapes and dtypes)."""
    nq, c = cand.shape
    dist = cp.ascontiguousarray(dist, dtype=cp.float32)
    cand = cp.ascontiguousarray(cand, dtype=cp.int32)
    if out is None:
        D = cp.empty((nq, int(k)), dtype=cp.float32)
        I = cp.empty((nq, int(k)), dtype=cp.int64)
    else:
        D, I = out
        if D.shape != (nq, int(k)) or I.shape != (nq, int(k)) or D.dtype != cp.float32 or I.dtype != cp.int64 \
                or not (D.flags.c_contiguous and I.flags.c_contiguous):
            raise ValueError("rerank_select_gpu: out must be contiguous float32 and int64 arrays of shape (nq, k)")
    if nq:
        Cp = _pow2ceil(c)
        _kernel("bang_rerank_select")((int(nq),), (int(min(256, max(32, Cp // 2))),),
                                      (dist, cand, np.int32(c), np.int32(Cp), np.int32(k), D, I), shared_mem=8 * Cp)
    return D, I


def rows_from_device(xp, X, cand):
    """Rows ``X[cand]`` (flattened, storage dtype) with zero rows for -1: what v2's host gather
    (``gather_rows(..., fill=0)``) returned, from a device copy of the vectors."""
    flat = cand.reshape(-1)
    rows = X[xp.maximum(flat, 0)]
    return xp.where((flat >= 0)[:, None], rows, 0).astype(X.dtype, copy=False)


def rows_from_slots(xp, slots, S, cand, pos):
    """``(rows, missing)``: the re-rank rows (flattened, storage dtype, zero rows for -1) from the
    stash ``slots`` ((nb * S, d): row ``q * S + p`` = vector of query q's p-th expansion), and the
    (nb, rerank) mask of candidates whose log position is ``>= S`` (not stashed: their rows are
    zero here and must be gathered)."""
    nb = cand.shape[0]
    ok = (cand >= 0) & (pos < S)
    idx = xp.arange(nb, dtype=xp.int64)[:, None] * S + xp.minimum(pos, S - 1)
    rows = slots[idx.reshape(-1)]
    rows = xp.where(ok.reshape(-1)[:, None], rows, 0).astype(slots.dtype, copy=False)
    return rows, (cand >= 0) & (pos >= S)


# ------------------------------------------------------------------------------ profiling
class _Prof:
    """CUDA event spans per named operation (profile on only), summed over batches at the end."""

    def __init__(self, cp, on):
        self.cp, self.on, self.spans = cp, bool(on), []

    def ev(self, stream):
        e = self.cp.cuda.Event()
        e.record(stream)
        return e

    def sums(self):
        out = {}
        for name, a, b in self.spans:
            out[name] = out.get(name, 0.0) + self.cp.cuda.get_elapsed_time(a, b) / 1e3
        return out


_OFF = _Prof(None, False)


# ------------------------------------------------------------------------------ one query batch
class _Batch:
    """One pipelined query batch: its stream, device buffers, pinned host buffers (all for up to
    ``cap`` queries; kept by the index across calls) and, per call (:meth:`bind`), views of the
    first ``nq`` rows and the kernel arguments (an iteration only launches, it allocates nothing)."""

    def __init__(self, cp, cap, *, L, R, W, max_iters, s, m, ksub, S=0, d=0, vdtype=None, own=True, tbits=32,
                 plan=None, walk_tables=False, dsub=0):
        self.cp = cp
        self.cap, self.L, self.R, self.W, self.max_iters, self.s = cap, L, R, W, max_iters, s
        self.m, self.ksub, self.S, self.d = m, ksub, S, d
        # plan: the fused walk's (:func:`_walk_plan`), which needs none of the step kernels' per-query
        # state (work list, new entries, candidates, neighbour rows) nor, with its filter in shared
        # memory, a filter array; walk_tables: its blocks make their tables from the padded queries
        # (dsub floats per subspace), so there is no table array either
        self.plan, self.walk_tables, self.dsub = plan, bool(walk_tables), dsub
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.event = cp.cuda.Event(disable_timing=True)
        self.bloom_words = bloom_words_for(max_iters, R, s, L=L, W=W)
        self.new_cap = max(W * R, s)
        e = cp.empty
        steps = plan is None
        with self.stream:
            self._wl_ids = e((cap, L), cp.int32) if steps else None
            self._wl_d = e((cap, L), cp.float32) if steps else None
            self._wl_x = e((cap, L), cp.uint8) if steps else None
            self._bloom = e((cap, self.bloom_words), cp.uint32) if steps or not plan[2] else None
            self._new_ids = e((cap, self.new_cap), cp.int32) if steps else None
            self._new_d = e((cap, self.new_cap), cp.float32) if steps else None
            self._new_x = e((cap, self.new_cap), cp.uint8) if steps else None
            self._n_new = e(cap, cp.int32)  # (the fused walk: its step counts)
            self._cand = e((cap, W), cp.int32) if steps else None
            self._log_ids = e((cap, max_iters), cp.int32)
            self._log_d = e((cap, max_iters), cp.float32)
            self._n_exp = e(cap, cp.int32)
            self._nbr_dev = e((cap, W * R), cp.int32) if steps else None
            # own: tables written in place each call (legacy: made per call and handed in), as
            # bfloat16 bits (uint16) when tbits == 16 (_pq.TABLE_BITS), else float32; the seeds and
            # the walk's padded queries are the call's (:func:`_setup`: one selection for all batches)
            self.tdtype = np.dtype(np.uint16 if tbits == 16 else np.float32) if own else None
            self._T = e((cap, m, ksub), self.tdtype) if own and not self.walk_tables else None
            if S:
                self._slots = e((cap * S, d), vdtype)
                self._vec_dev = e((cap * W, d), vdtype)
                self._dst_dev = e(cap * W, cp.int32)
        # the host's view of the W candidates of each query, the W rows it gathers for them, and
        # (stash) two alternating pinned buffers of candidate vectors and their slots
        # mapped access: how many candidate slots are live, twice (a chunk of steps writes one while
        # the host reads the other), and the events of their copies to the host
        self._live_dev = cp.zeros(2, cp.int32)
        self._live_host = _pinned(2, np.int32)
        self.live_events = [cp.cuda.Event(disable_timing=True) for _ in range(2)]
        self._cand_host = _pinned((cap, W), np.int32) if steps else None
        self._nbr_host = _pinned((cap, W * R), np.int32) if steps else None
        self._off = np.empty(cap + 1, np.int32)
        if S:
            self._vec_host = [_pinned((cap * W, d), vdtype) for _ in range(2)]
            self._dst_host = [_pinned(cap * W, np.int32) for _ in range(2)]
            self.row_bytes = d * np.dtype(vdtype).itemsize
            self.word = 16 if self.row_bytes % 16 == 0 else (4 if self.row_bytes % 4 == 0 else 1)
        self.k_dist, self.k_merge = _kernel("bang_distances"), _kernel("bang_merge")
        self.k_stash = _kernel("bang_stash") if S else None
        self.k_gather, self.k_live = _kernel("bang_gather_graph"), _kernel("bang_live")
        self.k_walk = _kernel("bang_walk")
        self.smem_merge = 17 * self.new_cap + 9 * L
        _merge_smem_opt_in(self.k_merge, self.smem_merge)
        # per-query arrays only (batch_bytes_per_query); the two live-count words are left out
        self.nbytes = int(sum(a.nbytes for a in vars(self).values() if isinstance(a, cp.ndarray)
                              and a is not self._live_dev))
        self.prof = _OFF
        self.generation = 0

    def bind(self, nq, codes, *, seeds, T=None, Qs=None, use_smem, GS, prefetch, vec_load, prof=_OFF, graph_dev=None,
             codebook=None, ip=False):
        """Views of the first ``nq`` rows for this call, the work state reset on the stream (after
        the tables already queued there; the fused walk resets its own), kernel arguments.
        ``seeds``: this batch's rows of the call's seeds; ``T``: its tables when made elsewhere
        (legacy), else this batch's own buffer; ``Qs``: its rows of the call's padded queries, which
        the fused walk's blocks make their tables from (``walk_tables``, with ``codebook`` / ``ip``).
        ``graph_dev``: the mapped host graph (``access="mapped"``: the kernels read its rows)."""
        cp = self.cp
        i32 = np.int32
        L, W, R, m, ksub, max_iters = self.L, self.W, self.R, self.m, self.ksub, self.max_iters
        self.nq, self.prefetch, self.prof = nq, prefetch, prof
        self.generation += 1  # (a statistic of an earlier call read from these arrays is stale: _Lazy)
        self.out = None  # this batch's rows of the call's results, where the re-rank writes them (_setup)
        self.seeds = cp.ascontiguousarray(seeds, dtype=cp.int32)
        if self.seeds.shape != (nq, self.s):
            raise RuntimeError(f"seeds of shape {self.seeds.shape}, expected {(nq, self.s)}")
        self.log_ids, self.log_d = self._log_ids[:nq], self._log_d[:nq]
        self.n_new, self.n_exp = self._n_new[:nq], self._n_exp[:nq]
        self.bloom = self._bloom[:nq] if self._bloom is not None else None
        self.mapped = graph_dev is not None
        # the fused walk (mapped only, planned by _setup): one launch per batch, its list and
        # scratch in shared memory
        self.fused = self.plan is not None
        if self.fused and not self.mapped:
            raise RuntimeError("a fused-walk batch needs the mapped graph")
        self.done = False
        self.iters = 0
        self.n_launch = self.n_copy = self.h2d_bytes = self.d2h_bytes = 0
        self.count = np.zeros(nq, np.int32)  # expansions logged per query, as the host saw them
        with self.stream:
            if prof.on:
                self._tick()
            if not self.fused:  # the fused walk starts its filter, log, list, scratch and counts itself
                self.bloom.fill(0)
                self.log_ids.fill(-1)
                self.log_d.fill(np.inf)
                self._wl_ids[:nq].fill(-1)
                self._wl_d[:nq].fill(np.inf)
                self._wl_x[:nq].fill(0)
                self._new_x[:nq].fill(0)
                self.n_new.fill(0)
                self._cand[:nq].fill(-1)
                self.n_exp.fill(0)
            if prof.on:
                self._tick("reset")
        if self.fused:
            t_smem, stage, b_smem, self.smem_walk = self.plan
            if self.walk_tables and (Qs is None or Qs.shape != (nq, m, self.dsub) or not Qs.flags.c_contiguous):
                raise RuntimeError(f"the fused walk's padded queries: expected a contiguous {(nq, m, self.dsub)} array")
            self.T = Qs if self.walk_tables else self._T[:nq]
            bf16 = self.tdtype.itemsize == 2
            self.walk_plan = dict(table_smem=t_smem, codes_staged=stage, bloom_smem=b_smem, shared_bytes=self.smem_walk,
                                  table_in_walk=self.walk_tables)
            C = codebook if self.walk_tables else self.log_d  # (unread without walk_tables)
            bloom = self.log_ids if self.bloom is None else self.bloom  # (unread with the filter in shared memory)
            self.grid, self.block = (nq,), (_NT,)
            # steps per query into n_new
            self.args_walk = (graph_dev, i32(R), self.seeds, i32(self.s), codes, i32(m), self.T, i32(ksub),
                              i32(1 if bf16 else 0), i32(1 if t_smem else 0), i32(1 if stage else 0), bloom,
                              i32(self.bloom_words), i32(1 if b_smem else 0), i32(hash_slots(self.new_cap)), i32(L),
                              i32(W), i32(max_iters), self.log_ids, self.log_d, self.n_exp, self.n_new, i32(GS),
                              i32(nq), self.T, C, i32(self.dsub), i32(1 if ip else 0), i32(1 if self.walk_tables else 0))
            return
        self.walk_plan = None
        self.T = self._T[:nq] if T is None else T
        self.wl_ids, self.wl_d, self.wl_x = self._wl_ids[:nq], self._wl_d[:nq], self._wl_x[:nq]
        self.new_ids, self.new_d, self.new_x = self._new_ids[:nq], self._new_d[:nq], self._new_x[:nq]
        self.cand = self._cand[:nq]
        self.nbr_dev = self._nbr_dev[:nq]
        bf16 = self.T.dtype.itemsize == 2  # legacy hands in float32 tables (rounded values)
        self.cand_host, self.nbr_host = self._cand_host[:nq], self._nbr_host[:nq]
        self.cand_flat = self.cand_host.reshape(nq * W)
        self.nbr_rows = self.nbr_host.reshape(nq * W, R)
        self.off = self._off[:nq + 1]
        if self.S:
            self.slots = self._slots[:nq * self.S]
            self.vec_host = [v[:nq * W] for v in self._vec_host]
            self.dst_host = [v[:nq * W] for v in self._dst_host]
            self.turn = 0
        tab = m * ksub * self.T.dtype.itemsize if use_smem else 0
        self.smem_dist = tab + step_shared_bytes(W * R)
        self.smem_seed = tab + step_shared_bytes(self.s)

        def dist_args(nbrs, width):
            return (nbrs, i32(width), codes, i32(m), self.T, i32(ksub), i32(1 if bf16 else 0), i32(1 if use_smem else 0),
                    i32(1 if vec_load else 0), self.bloom, i32(self.bloom_words), i32(hash_slots(width)), self.wl_ids,
                    self.wl_d, self.wl_x,
                    i32(L), self.new_ids, self.new_d, self.new_x, self.n_new, i32(self.new_cap),
                    i32(1 if prefetch else 0), i32(W), self.cand, self.log_ids, self.log_d, self.n_exp,
                    i32(max_iters), i32(GS), i32(nq))

        self.args_seed = dist_args(self.seeds, self.s)  # iteration 0: the seeds are the rows
        self.args_dist = dist_args(self.nbr_dev, W * R)
        self.args_merge = (self.wl_ids, self.wl_d, self.wl_x, i32(L), self.new_ids, self.new_d, self.new_x,
                           self.n_new, i32(self.new_cap), i32(0 if prefetch else 1), i32(W), self.cand,
                           self.log_ids, self.log_d, self.n_exp, i32(max_iters), i32(nq))
        self.grid, self.block = (nq,), (_NT,)
        self.cand_args = (self.cand_host.ctypes.data, self.cand.data.ptr, nq * W * 4, _D2H)
        if self.mapped:
            total = nq * W * R
            self.gather_grid = (int(max(1, min(-(-total // _EW), 1 << 16))),)
            self.args_gather = (self.cand, np.int64(nq * W), graph_dev, i32(R), self.nbr_dev)
            self.live_slot = 0
            self.pending = []
        self.nbr_args = (self.nbr_dev.data.ptr, self.nbr_host.ctypes.data, nq * W * R * 4, _H2D)

    def step_mapped(self, first=False):
        """Queue one iteration of the mapped walk: the candidates' graph rows read from the mapped
        host graph by the GPU (``bang_gather_graph``), distances, merge. Nothing goes to the host."""
        p = self.prof.on
        with self.stream:
            if p:
                self._tick()
            if not first:
                self.k_gather(self.gather_grid, (_EW,), self.args_gather)
                self.n_launch += 1
                if p:
                    self._tick("gather_graph")
            self.k_dist(self.grid, self.block, self.args_seed if first else self.args_dist,
                        shared_mem=self.smem_seed if first else self.smem_dist)
            if p:
                self._tick("distances")
            self.k_merge(self.grid, self.block, self.args_merge, shared_mem=self.smem_merge)
            if p:
                self._tick("merge")
            self.n_launch += 2
        self.iters += 1

    def walk_fused(self):
        """Queue the whole walk of this batch: one ``bang_walk`` launch (one block per query)."""
        p = self.prof.on
        with self.stream:
            if p:
                self._tick()
            self.k_walk(self.grid, self.block, self.args_walk, shared_mem=self.smem_walk)
            if p:
                self._tick("walk")
        self.n_launch += 1

    def queue_chunk(self, steps):
        """``steps`` mapped iterations, then the count of live candidate slots to pinned host memory
        (one of two slots, in turn) and its event; the host looks at it in :func:`_run_mapped`."""
        for _ in range(steps):
            self.step_mapped()
        slot = self.live_slot
        with self.stream:
            self.k_live((1,), (1024,), (self.cand, np.int32(self.nq * self.W), self._live_dev[slot:]))
            self.cp.cuda.runtime.memcpyAsync(self._live_host[slot:].ctypes.data, self._live_dev[slot:].data.ptr, 4,
                                             _D2H, self.stream.ptr)
            self.live_events[slot].record(self.stream)
        self.n_launch += 1
        self.n_copy += 1
        self.d2h_bytes += 4
        self.pending.append(slot)
        self.live_slot ^= 1

    def _tick(self, name=None):
        """Profile: an event on this stream; the span since the previous tick is ``name``."""
        e = self.prof.ev(self.stream)
        if name is not None:
            self.prof.spans.append((name, self._t, e))
        self._t = e

    def step(self, first=False, n_kept=0):
        """Queue one iteration on this batch's stream: rows H2D, distances, candidate copy and
        merge, then (stash) the ``n_kept`` candidate vectors the host gathered with the rows. With
        prefetch (4.6) the candidates are chosen by the distance kernel and leave before the merge;
        without, the merge kernel chooses them and the copy follows it. The event marks the
        candidates' arrival in ``cand_host``; the vectors go last, off the path to the next
        candidates (their pinned buffer alternates: the one being refilled was copied before the
        event the host waited for)."""
        memcpy, sp = self.cp.cuda.runtime.memcpyAsync, self.stream.ptr
        p = self.prof.on
        with self.stream:
            if p:
                self._tick()
            if not first:
                memcpy(*self.nbr_args, sp)
                self.h2d_bytes += self.nbr_args[2]
                if p:
                    self._tick("h2d_nbr")
            self.k_dist(self.grid, self.block, self.args_seed if first else self.args_dist,
                        shared_mem=self.smem_seed if first else self.smem_dist)
            if p:
                self._tick("distances")
            if self.prefetch:
                memcpy(*self.cand_args, sp)
                self.event.record(self.stream)
                if p:
                    self._tick("d2h_cand")
                self.k_merge(self.grid, self.block, self.args_merge, shared_mem=self.smem_merge)
                if p:
                    self._tick("merge")
            else:
                self.k_merge(self.grid, self.block, self.args_merge, shared_mem=self.smem_merge)
                if p:
                    self._tick("merge")
                memcpy(*self.cand_args, sp)
                self.event.record(self.stream)
                if p:
                    self._tick("d2h_cand")
            self.n_launch += 2
            self.n_copy += 1 if first else 2
            self.d2h_bytes += self.cand_args[2]
            if n_kept:
                t = self.turn
                vb = n_kept * self.row_bytes
                memcpy(self._vec_dev.data.ptr, self.vec_host[t].ctypes.data, vb, _H2D, sp)
                memcpy(self._dst_dev.data.ptr, self.dst_host[t].ctypes.data, n_kept * 4, _H2D, sp)
                if p:
                    self._tick("h2d_vec")
                words = n_kept * (self.row_bytes // self.word)
                self.k_stash((int(min(-(-words // _EW), 1 << 16)),), (_EW,),
                             (self._vec_dev, self._dst_dev, np.int32(n_kept), np.int32(self.row_bytes),
                              np.int32(self.word), self._slots))
                if p:
                    self._tick("stash")
                self.turn ^= 1
                self.n_launch += 1
                self.n_copy += 2
                self.h2d_bytes += vb + n_kept * 4
        self.iters += 1


def step_shared_bytes(width):
    """Dynamic shared memory ``bang_distances`` needs beside the table for a step of ``width``
    neighbour ids: the de-duplication set (:func:`hash_slots` ints) and one fresh flag per id."""
    return 4 * hash_slots(width) + -(-int(width) // 16) * 16


#: the fused walk keeps a query's Bloom filter in its block's shared memory while the block's whole
#: dynamic shared memory stays within this (three blocks per SM of 227 KB); past it the filter
#: lives in global memory (L2), as in the step kernels. Beam 32, R = 32, m = 48: ~43 KB with it.
WALK_BLOOM_SMEM_MAX = 64 * 1024
#: ... and stages a step's fresh code rows in shared memory while it stays within this
WALK_STAGE_SMEM_MAX = 96 * 1024
_walk_fit = {}


def walk_shared_bytes(*, L, W, R, s, m, tbytes, stage, bloom_words):
    """Dynamic shared memory of ``bang_walk``, in its layout's order: the PQ table (``tbytes``, 0
    when it is read from global memory; 16-aligned), a step's code rows (``stage``: ``m`` bytes
    each of ``max(W R, s)``; 16-aligned), the Bloom filter (``bloom_words`` 32-bit words, 0 when
    global), the work list and the merge's output (16 bytes per slot), the step's ids, new and
    sorted entries and fresh ids (24 bytes each of ``max(W R, s)``), the de-duplication set and
    the two flag rows of the list."""
    cap = max(int(W) * int(R), int(s))
    return (-(-int(tbytes) // 16) * 16 + (-(-cap * int(m) // 16) * 16 if stage else 0) + 4 * int(bloom_words)
            + 16 * int(L) + 24 * cap + 4 * hash_slots(cap) + 2 * int(L))


def _walk_plan(*, L, W, R, s, m, tbytes, bloom_words, use_smem):
    """``(table in shared memory, code rows staged, filter in shared memory, dynamic bytes)`` of
    ``bang_walk`` for these sizes, or None when its list and scratch alone exceed the device's
    shared memory per block (the step kernels walk then). Raises the kernel's opt-in limit to what
    the launch asks."""
    import cupy as cp

    key = (cp.cuda.Device().id, int(L), int(W), int(R), int(s), int(m), int(tbytes), int(bloom_words),
           bool(use_smem))
    if key in _walk_fit:
        return _walk_fit[key]
    kern = _kernel("bang_walk")
    static = int(kern.attributes.get("shared_size_bytes", 0))
    optin = min(_SMEM_MAX, int(cp.cuda.Device().attributes.get("MaxSharedMemoryPerBlockOptin", _SMEM_STATIC)))
    size = dict(L=L, W=W, R=R, s=s, m=m)
    plan = None
    if walk_shared_bytes(**size, tbytes=0, stage=False, bloom_words=0) + static <= optin:
        t = int(tbytes) if use_smem and walk_shared_bytes(**size, tbytes=tbytes, stage=False, bloom_words=0) \
            + static <= optin else 0
        stage = walk_shared_bytes(**size, tbytes=t, stage=True, bloom_words=0) + static \
            <= min(optin, WALK_STAGE_SMEM_MAX)
        b = int(bloom_words) if walk_shared_bytes(**size, tbytes=t, stage=stage, bloom_words=bloom_words) \
            + static <= min(optin, WALK_BLOOM_SMEM_MAX) else 0
        need = walk_shared_bytes(**size, tbytes=t, stage=stage, bloom_words=b)
        if need + static > _SMEM_STATIC and kern.max_dynamic_shared_size_bytes < need:
            kern.max_dynamic_shared_size_bytes = need
        plan = (t > 0, stage, b > 0, need)
    _walk_fit[key] = plan
    return plan


def fused_plan(*, L, R, W, max_iters, s, m, ksub, use_smem, mapped, tbits=None):
    """``(plan, walk_tables)`` of a call: the fused walk's :func:`_walk_plan` (None: the walk goes by
    steps: not mapped, ``configure(fused_walk=False)``, or its list and scratch do not fit shared
    memory), and whether its blocks make their PQ tables themselves (table in shared memory,
    ``_pq.TABLE_METHOD`` "direct", ``configure(walk_tables=True)``)."""
    if not mapped or not _cfg["fused_walk"]:
        return None, False
    tbits = table_bits() if tbits is None else int(tbits)
    plan = _walk_plan(L=L, W=W, R=R, s=s, m=m, tbytes=m * ksub * tbits // 8,
                      bloom_words=bloom_words_for(max_iters, R, s, L=L, W=W), use_smem=use_smem)
    return plan, bool(plan is not None and plan[0] and table_method() == "direct" and _cfg["walk_tables"])


def _tables_in_shared(m, ksub, W, R, n_seeds, bits=None):
    """Whether a query's table goes to the step kernels' shared memory (:func:`_table_fits_shared`)
    beside a step's own (the wider of a step and the seeds); ``bits``: the tables' (legacy: 32)."""
    extra = max(step_shared_bytes(W * R), step_shared_bytes(max(1, int(n_seeds))))
    return _table_fits_shared(table_bytes(m, ksub, bits), extra)


def hash_slots(width):
    """Slots of ``bang_distances``' set of a step's ids: a power of two >= 2x the ids."""
    return _pow2ceil(2 * max(1, int(width)))


def _table_fits_shared(tbytes, extra=0):
    """Whether one query's PQ table (``tbytes``) goes to shared memory beside ``extra`` bytes of the
    step's own (:func:`step_shared_bytes`); raises the kernel's dynamic shared-memory limit to
    what the launch will ask. The kernel's own static shared variables count against the same
    per-block limit: a table of exactly 48 KB needs the opt-in too (a launch with 48 KB of dynamic
    memory and a few static bytes is refused by the driver as an invalid argument). Decided once
    per device and sizes (the device attribute query alone walks ~100 driver attributes)."""
    import cupy as cp

    key = (cp.cuda.Device().id, int(tbytes), int(extra))
    hit = _smem_fit.get(key)
    if hit is not None:
        return hit
    kern = _kernel("bang_distances")
    static = int(kern.attributes.get("shared_size_bytes", 0))
    optin = int(cp.cuda.Device().attributes.get("MaxSharedMemoryPerBlockOptin", _SMEM_STATIC))
    fits = not (tbytes > _SMEM_MAX or tbytes + extra + static > optin)
    need = (tbytes if fits else 0) + extra
    if need + static > optin:
        raise ValueError(f"search_width x graph degree too large for the distance kernel's shared memory "
                         f"({extra} bytes); lower search_width")
    if need + static > _SMEM_STATIC and kern.max_dynamic_shared_size_bytes < need:
        kern.max_dynamic_shared_size_bytes = need
    _smem_fit[key] = fits
    return fits


def _merge_smem_opt_in(kern, nbytes):
    """``bang_merge`` keeps W*R new entries (17 B each) and the list (9 B per slot) in shared
    memory: past 48 KB (W*R beyond ~2500, e.g. W = 64 with R = 64) the launch needs the opt-in."""
    import cupy as cp

    if nbytes + int(kern.attributes.get("shared_size_bytes", 0)) <= _SMEM_STATIC:
        return
    optin = int(cp.cuda.Device().attributes.get("MaxSharedMemoryPerBlockOptin", _SMEM_STATIC))
    if nbytes + int(kern.attributes.get("shared_size_bytes", 0)) > optin:
        raise ValueError(f"search_width x graph degree too large for the merge's shared memory ({nbytes} bytes); "
                         f"lower search_width")
    if kern.max_dynamic_shared_size_bytes < nbytes:
        kern.max_dynamic_shared_size_bytes = nbytes


def _group_size(m):
    for gs in (1, 2, 4, 8, 16):
        if m <= 4 * gs:
            return gs
    return 32


def _tables_into(cp, Qb, codebook, cn, metric, out, rotation=None):
    """PQ tables of prepared queries ``Qb`` into ``out`` (nb, m, ksub), on the current stream: the
    direct kernel of :func:`_pq.tables_into` (``_pq.TABLE_METHOD == "direct"``, the default), or the
    batched GEMM of :func:`_pq.pq_tables` (same call, same dot products), then ``bang_tables``
    (the rest of that expression in one pass, bit for bit; into a uint16 ``out`` as bfloat16 bits,
    the values of ``pq_tables(bits=16)``). ``rotation``: OPQ's (device array)."""
    if table_method() == "direct":  # one pass, no GEMM (_pq.tables_into); cn unused
        tables_into(Qb, codebook, metric, out, rotation)
        return
    nb = Qb.shape[0]
    m, ksub = codebook.shape[0], codebook.shape[1]
    Qs = _padded(cp.ascontiguousarray(Qb, dtype=cp.float32), m, rotation).transpose(1, 0, 2)  # (m, nb, dsub)
    dots = cp.ascontiguousarray(cp.matmul(Qs, codebook.transpose(0, 2, 1)))  # (m, nb, ksub)
    ip = metric == "ip"
    qn = dots if ip else cp.ascontiguousarray((Qs * Qs).sum(axis=2))  # (m, nb); unused for ip
    total = nb * m * ksub
    _kernel("bang_tables")((int(min(-(-total // _EW), 1 << 20)),), (_EW,),
                           (dots, qn, cn, out, np.int32(nb), np.int32(m), np.int32(ksub), np.int32(1 if ip else 0),
                            np.int32(1 if out.dtype.itemsize == 2 else 0)))


_ws_lock = threading.Lock()


def _workspace(engine, cp, sizes, shape):
    """The index's cached batches when they fit this call (same shape parameters, as many batches,
    each large enough), else new ones (the old ones released first), marked busy until
    :func:`_release` (a concurrent call on the same index gets batches of its own, not kept).
    ``(batches, reused)``."""
    key = (cp.cuda.Device().id,) + tuple(sorted(shape.items()))
    with _ws_lock:
        ws = getattr(engine, "_bang_ws", None)
        if ws is not None and ws["busy"]:
            return [_Batch(cp, nb, own=True, **shape) for nb in sizes], False
        if ws is not None and ws["key"] == key and len(ws["batches"]) >= len(sizes) \
                and all(b.cap >= nb for b, nb in zip(ws["batches"], sizes)):
            ws["busy"] = True
            return ws["batches"][:len(sizes)], True
        engine._bang_ws = None
        batches = [_Batch(cp, nb, own=True, **shape) for nb in sizes]
        engine._bang_ws = {"key": key, "batches": batches, "busy": True}
        return batches, False


def _release(engine, batches):
    """End of a call: the index's cached batches are free for the next one."""
    with _ws_lock:
        ws = getattr(engine, "_bang_ws", None)
        if ws is not None and batches and ws["batches"][0] is batches[0]:
            ws["busy"] = False


#: storage dtypes ``bang_rerank_exact`` widens itself (its ``dtype`` codes)
_ROW_DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(np.uint8): 2, np.dtype(np.int8): 3}
#: For measurements only (the bench's ``-rowsfirst`` / ``-einsum``): "device" / "mapped" re-rank
#: rows copied into a buffer by ``bang_rerank_rows`` first (as before the fortieth session) instead
#: of read by id where they are; the exact distances by CuPy's einsum on prepared rows (the
#: thirty-ninth session's) instead of ``bang_rerank_exact``.
RERANK_ROWS_FIRST = False
RERANK_EINSUM = False
#: widest vectors ``bang_rerank_exact`` takes: it keeps the query in shared memory (4 d bytes) within
#: the 48 KB a launch gets without opting in; wider ones take the rows-and-einsum path
RERANK_EXACT_MAX_DIM = 12 * 1024


def rerank_exact_gpu(cp, Qp, src, cand, *, by_id, metric, scale):
    """``bang_rerank_exact``: exact internal distances (nq, c) float32 of prepared queries ``Qp``
    to their candidates ``cand`` (nq, c; +inf where -1), the rows read from ``src`` (storage dtype)
    by id (``by_id``: the vectors, on the device or mapped) or by position (a row buffer, row q * c
    + j), prepared in the kernel as :func:`prepare_vectors` prepares them (``metric``: the user's;
    ``scale``: the index's), on the current stream."""
    nq, c = cand.shape
    d = int(src.shape[1])
    if d > RERANK_EXACT_MAX_DIM:
        raise ValueError(f"bang_rerank_exact takes vectors of at most {RERANK_EXACT_MAX_DIM} dimensions, got {d}")
    Qp = cp.ascontiguousarray(Qp, dtype=cp.float32)
    cand = cp.ascontiguousarray(cand, dtype=cp.int32)
    dist = cp.empty((nq, c), dtype=cp.float32)
    if nq:
        _kernel("bang_rerank_exact")((int(nq),), (256,),
                                     (Qp, np.int32(d), cand, np.int32(c), src, np.int32(1 if by_id else 0),
                                      np.int32(_ROW_DTYPES[np.dtype(src.dtype)]), np.int32(d * src.dtype.itemsize),
                                      np.float64(scale), np.int32(1 if metric == "cosine" else 0),
                                      np.int32(1 if metric == "inner_product" else 0), dist, np.int32(nq)),
                                     shared_mem=4 * d)
    return dist


def _exact(engine, Qb, src, cand, k, by_id=False, out=None):
    """Exact top-k of the re-rank candidates ``cand``: where the kernels apply,
    :func:`rerank_exact_gpu` (rows read from ``src``: by id from the vectors with ``by_id``, else
    a row buffer, row q * c + j) and :func:`rerank_select_gpu` (into ``out`` when given); else as
    v2: the rows (gathered by id if need be), prepared, reshaped, ``exact_topk`` (new arrays)."""
    import cupy as cp

    c = cand.shape[1]
    kernels = _cfg["rerank_kernels"] and 1 <= c <= RERANK_KERNEL_MAX_COLS
    if kernels and not RERANK_EINSUM and np.dtype(src.dtype) in _ROW_DTYPES and src.shape[1] <= RERANK_EXACT_MAX_DIM:
        dist = rerank_exact_gpu(cp, Qb, src, cand, by_id=by_id, metric=engine.metric, scale=engine.scale)
        return rerank_select_gpu(cp, dist, cand, k, out=out)
    rows = rows_from_device(cp, src, cand) if by_id else src
    Xc = prepare_vectors(rows, engine.metric, engine.scale).reshape(cand.shape[0], c, -1)
    if kernels:
        return rerank_select_gpu(cp, exact_distances(Qb, Xc, engine._imetric), cand, k)
    return exact_topk(Qb, Xc, cand, k, engine._imetric)


def _upload_rows(cp, data, ids, out, stream, bufs, events):
    """``out[i] = data[ids[i]]`` (zero rows for -1; ``out`` a flat device array of rows): host
    gathers into two pinned chunks in turn, each copied asynchronously on ``stream`` while the next
    one is gathered. Returns the bytes copied."""
    n = int(ids.shape[0])
    rb = data.shape[1] * data.dtype.itemsize
    chunk = bufs[0].shape[0]
    for i, s in enumerate(range(0, n, chunk)):
        buf, ev = bufs[i % 2], events[i % 2]
        ev.synchronize()  # the copy that last read this buffer (this call's or an earlier batch's)
        e = min(n, s + chunk)
        _gather_rows(bits_view(data), ids[s:e], bits_view(buf[:e - s]), 0)
        cp.cuda.runtime.memcpyAsync(out.data.ptr + s * rb, buf.ctypes.data, (e - s) * rb, _H2D, stream.ptr)
        ev.record(stream)
    return n * rb


def _upload_buffers(engine, cp, data):
    """Two pinned chunks (and their events) for :func:`_upload_rows`, kept by the index."""
    ub = getattr(engine, "_bang_upload", None)
    rb = data.shape[1] * data.dtype.itemsize
    rows = max(1, UPLOAD_CHUNK_BYTES // max(1, rb))
    if ub is None or ub[0][0].shape != (rows, data.shape[1]) or ub[0][0].dtype != data.dtype:
        ub = ([_pinned((rows, data.shape[1]), data.dtype) for _ in range(2)],
              [cp.cuda.Event(disable_timing=True) for _ in range(2)])
        engine._bang_upload = ub
    return ub


# ------------------------------------------------------------------------------ the search
def batch_bytes_per_query(*, L, R, W, max_iters, s, m, ksub, S=0, d=0, itemsize=0, tbits=None, plan=None,
                          walk_tables=False, dsub=0):
    """GPU bytes one query takes in a :class:`_Batch` (its arrays, per query row; ``S``, ``d``,
    ``itemsize``: the stash's slots and rows, 0 without a stash; ``plan`` / ``walk_tables``: the
    fused walk's, from :func:`fused_plan`, which leave out the step kernels' state, the filter
    when it is in shared memory and the table when the blocks make it)."""
    bw = bloom_words_for(max_iters, R, s, L=L, W=W)
    nc = max(W * R, s)
    tbits = table_bits() if tbits is None else int(tbits)
    b = 8 * max_iters + 4 + 4  # log, expansions, steps (n_new)
    if plan is None:
        b += 9 * L + 4 * bw + 9 * nc + 4 * W + 4 * W * R + m * ksub * tbits // 8
    else:
        b += 0 if plan[2] else 4 * bw
        b += 0 if walk_tables else m * ksub * tbits // 8
    if S:
        b += (S + W) * d * itemsize + 4 * W
    return int(b)


def call_bytes_per_query(*, s, d, m, dsub, n_entry, walk_tables, seed_gemm=True):
    """GPU bytes one query takes in a call's own arrays (:func:`_setup`): its centred query, its
    padded copy for the walk's tables (``walk_tables``; counted even where it is a view), its
    ``s`` seeds and, with ``seed_gemm``, its row of the seed selection's GEMM (``n_entry``
    centroids; the "direct" selection has none)."""
    return int(4 * d + (4 * m * int(dsub) if walk_tables else 0) + 4 * max(1, int(s))
               + (4 * int(n_entry) if seed_gemm else 0))


def rerank_bytes_per_query(*, rerank, d, itemsize, mode):
    """GPU bytes of one query's re-rank: plan (ids, log positions, flags), exact distances and the
    k <= rerank results, plus a row buffer where one is needed ("stash" / "host", or the CuPy path:
    rows and their prepared float32 copy)."""
    b = rerank * (4 + 8 + 1 + 4 + 12)
    kernels = _cfg["rerank_kernels"] and 1 <= rerank <= RERANK_KERNEL_MAX_COLS
    if not kernels or RERANK_EINSUM or d > RERANK_EXACT_MAX_DIM:  # the rows and their prepared copy
        b += rerank * d * (itemsize + 4)
    elif mode in ("stash", "host"):
        b += rerank * d * itemsize
    return int(b)


#: The fewest queries a budget-bounded call walks at once (when even these exceed the budget's
#: room, the call goes ahead with them and logs it): the walk's per-call and per-step costs are per
#: batch, so small calls cost throughput. H200, 3M x 96, budget 1/8 of graph + vectors (the
#: codes take 3/4 of it): calls of ~470 queries read 84k QPS at recall 0.91 against 743-752k for
#: one call of 10k. 4096 queries (two batches of 2048) hold ~0.25 GB of state at beam 32, 48-byte
#: codes, with the host gather (~60 KB a query), 14 MB with the fused mapped walk (~3.4 KB):
#: bounded, whatever the number of queries.
MIN_CALL_QUERIES = 4096


#: the fewest queries a block of the "direct" seed selection must serve (it reads every centroid
#: row once per block: ``select_seeds_gpu`` fits as many queries' distance rows in 48 KB of shared
#: memory as it can, up to 8) for a call to select "direct" to save a call. H200, 10k queries,
#: d = 96: 1732 centroids (4 queries a block) 593-617 us against 173-193 us by GEMM, +0.4 ms, below
#: what a call's fixed costs come to; 4096 centroids (2 a block) 3.4 ms against 0.37-0.42 ms, more
#: (seeds_host_micro.py, benchmarks/results/h200-2026-12-01-s41)
SEED_DIRECT_MIN_BLOCK_QUERIES = 4


def queries_per_call(engine, *, codes, codebook, L, R, W, max_iters, s, rerank, d, itemsize, nq=None):
    """``(queries, seed_method)``: how many queries one walk takes so that its batches (two
    pipelined halves), the call's arrays, the re-rank's and the resident codes fit the memory
    budget (:func:`knnkit.set_memory_budget`; the automatic budget is a fraction of the free
    memory, which already leaves out the resident arrays, and the index's idle cached batches are
    reusable room), and how the call selects its seeds: by cuBLAS GEMM ("auto"; its (nq, c)
    products are counted), or "direct" (no products in memory) where that takes ``nq`` queries in
    fewer calls and its blocks serve at least :data:`SEED_DIRECT_MIN_BLOCK_QUERIES` queries each.
    ``(None, "auto")``: no bound (no budget)."""
    from ..._core import config

    budget = config.get_memory_budget()
    if not budget:
        return None, "auto"
    xdev = engine._rerank_data_gpu()  # (made here if it fits: the room below leaves it out)
    # no stash when the vectors are on the GPU, or mapped (the re-rank reads them there)
    mapped = host_mapped(engine) is not None
    S = 0 if xdev is not None or mapped else stash_slots(L, W, rerank, max_iters)
    m, ksub = int(codes.shape[1]), int(codebook.shape[1])
    s = max(1, int(s))
    plan, walk_tables = fused_plan(L=L, R=R, W=W, max_iters=max_iters, s=s, m=m, ksub=ksub, mapped=mapped,
                                   use_smem=_tables_in_shared(m, ksub, W, R, s))
    per = batch_bytes_per_query(L=L, R=R, W=W, max_iters=max_iters, s=s, m=m, ksub=ksub, S=S, d=d,
                                itemsize=itemsize, plan=plan, walk_tables=walk_tables, dsub=int(codebook.shape[2]))
    mode = "device" if xdev is not None or mapped else ("stash" if S else "host")
    per += rerank_bytes_per_query(rerank=rerank, d=d, itemsize=itemsize, mode=mode)
    n_entry = len(engine._entry)
    call = dict(s=s, d=d, m=m, dsub=int(codebook.shape[2]), n_entry=n_entry, walk_tables=walk_tables)
    per_gemm = per + call_bytes_per_query(**call, seed_gemm=True)
    per += call_bytes_per_query(**call, seed_gemm=False)
    if config._globals["memory_budget"] is not None:
        room = budget - int(codes.nbytes) - int(codebook.nbytes) - (0 if xdev is None else int(xdev.nbytes))
    else:
        ws = getattr(engine, "_bang_ws", None)
        room = budget + (sum(b.nbytes for b in ws["batches"]) if ws is not None and not ws["busy"] else 0)
    fit, method = room // per_gemm, "auto"
    direct_cheap = seed_block_queries(n_entry, d, direct=True) >= SEED_DIRECT_MIN_BLOCK_QUERIES
    if nq is not None and nq * per_gemm > room and direct_cheap:
        # the GEMM's products cost a call: "direct" has none, at more GPU time per query
        fit_direct = room // per

        def calls(f):
            return -(-nq // max(f, MIN_CALL_QUERIES))

        if calls(fit_direct) < calls(fit):
            fit, method = fit_direct, "direct"
    if fit < MIN_CALL_QUERIES:
        logger.info("GraphIndex (host placement): %d bytes of the memory budget left beside the codes hold %d "
                    "queries' search state; walking %d at a time", max(0, room), max(0, fit), MIN_CALL_QUERIES)
        fit = MIN_CALL_QUERIES
    return int(fit), method


def search_host_gpu(engine, Q, k, *, codes, codebook, entry, L, max_iters, n_seeds, rerank, prefetch,
                    pipeline_batch=None, width=1, legacy=None, profile=None):
    """Search prepared cupy queries ``Q`` over a :class:`HostIndex` (host graph, GPU ``codes``);
    INTERNAL distances (nq, k) float32 and int64 ids, cupy. ``width``: the search width W (work-list
    entries expanded per query per iteration, <= :data:`MAX_WIDTH`). ``legacy`` / ``profile``:
    this call's :func:`configure` switches (None: the process-wide ones).

    The queries are walked in consecutive calls of at most :func:`queries_per_call` (each with its
    pipelined batches) so that the search state stays within the memory budget; ``last_stats()``
    then describes the last of them, with ``calls`` their number. A CUDA out-of-memory gives back
    the kept buffers and walks again with half as many queries per call, down to one query, then
    raises MemoryError."""
    import cupy as cp

    W = int(width)
    if not 1 <= W <= MAX_WIDTH:
        raise ValueError(f"search_width must be in [1, {MAX_WIDTH}] on the GPU, got {W}")
    nq = Q.shape[0]
    data = engine._data
    cap, seed_method = queries_per_call(engine, codes=codes, codebook=codebook, L=L, R=int(engine._graph.shape[1]),
                                        W=W, max_iters=max_iters, s=n_seeds, rerank=int(rerank), d=int(data.shape[1]),
                                        itemsize=np.dtype(data.dtype).itemsize, nq=nq)
    from ..._core.cuda import OutOfMemory, retry_on_oom

    def walk(step):
        try:
            return [_search_call(engine, Q[s0:s0 + step], k, codes=codes, codebook=codebook, entry=entry, L=L,
                                 max_iters=max_iters, n_seeds=n_seeds, rerank=rerank, prefetch=prefetch,
                                 pipeline_batch=pipeline_batch, W=W, legacy=legacy, profile=profile,
                                 seed_method=seed_method)
                    for s0 in range(0, max(nq, 1), step)]
        except OutOfMemory():
            # the buffers kept between calls hold device memory the pool cannot free; the retry
            # (half as many queries per call) makes smaller ones
            engine.release_gpu_buffers()
            raise

    step = nq if cap is None or nq <= cap else cap
    parts = retry_on_oom(walk, max(step, 1), what="the host-placed search",
                         hint="lower the beam or search_width, search fewer queries per call")
    _stats["calls"] = len(parts)
    if len(parts) == 1:
        return parts[0]
    return cp.concatenate([p[0] for p in parts]), cp.concatenate([p[1] for p in parts])


def _search_call(engine, Q, k, *, codes, codebook, entry, L, max_iters, n_seeds, rerank, prefetch, pipeline_batch,
                 W, legacy, profile, seed_method="auto"):
    """One walk of all of ``Q`` (the body of :func:`search_host_gpu`; ``seed_method``: from
    :func:`queries_per_call`)."""
    import cupy as cp

    legacy = _cfg["legacy"] if legacy is None else bool(legacy)
    profile = _cfg["profile"] if profile is None else bool(profile)
    prof = _Prof(cp, profile)
    phases = {}
    if profile:
        cp.cuda.Device().synchronize()  # earlier work stays out of this call's phases
    t_start = time.perf_counter()
    nq = Q.shape[0]
    graph = np.asarray(engine._graph)
    data = np.asarray(engine._data)
    R = graph.shape[1]
    m = codes.shape[1]
    ksub = codebook.shape[1]
    use_smem = _tables_in_shared(m, ksub, W, R, n_seeds, 32 if legacy else None)  # legacy: float32 tables
    GS = _group_size(m)
    pb = int(pipeline_batch) if pipeline_batch else max(1, -(-nq // 2))
    starts = list(range(0, nq, pb))
    sizes = [min(pb, nq - s) for s in starts]
    rr = int(rerank)
    Xdev, S = None, 0
    graph_dev = None
    if not legacy:
        mapped = host_mapped(engine)
        if mapped is not None:
            graph_dev = mapped[0]
    if legacy:
        mode = "legacy"
    else:
        Xdev = engine._rerank_data_gpu()
        want = _cfg["rerank_mode"] or ("stash" if 2 * rr >= L else "host")
        if Xdev is not None:
            mode = "device"
        elif graph_dev is not None:  # the re-rank reads the mapped vectors too
            mode, Xdev = "mapped", mapped[1]
        elif want == "stash" and max(sizes) * stash_slots(L, W, rr, max_iters) < 2 ** 31:
            mode, S = "stash", stash_slots(L, W, rr, max_iters)
        else:
            mode = "host"
    n_sync = 0
    held = ()
    common = dict(codes=codes, codebook=codebook, entry=entry, L=L, R=R, W=W, max_iters=max_iters, n_seeds=n_seeds,
                  m=m, ksub=ksub, use_smem=use_smem, GS=GS, prefetch=prefetch, prof=prof)
    if legacy:
        batches, reused = _setup_legacy(engine, cp, Q, starts, sizes, **common), False
        n_sync += 1
    else:
        if graph_dev is not None:
            common["prefetch"] = False  # nothing leaves early: the merge chooses (same results)
        batches, reused, held = _setup(engine, cp, Q, k, starts, sizes, S=S, data=data, graph_dev=graph_dev,
                                       seed_method=seed_method, **common)
    try:
        return _run(engine, cp, Q, k, batches, starts, t_start=t_start, reused=reused, legacy=legacy, mode=mode, S=S,
                    Xdev=Xdev, graph=graph, data=data, W=W, rr=rr, use_smem=use_smem, prof=prof, phases=phases,
                    n_sync=n_sync, mapped=graph_dev is not None, seed_method="legacy" if legacy else seed_method,
                    results=held[-2:] if held else None)
    except BaseException:
        # the call's seeds and queries (held) go back to the pool only once no queued kernel reads them
        try:
            cp.cuda.Device().synchronize()
        except Exception:  # (a device already in error: the original exception says more)
            pass
        raise
    finally:
        del held  # (_run ended with a wait for the device, or the except above did)
        for b in batches:  # the events of this call's profile go with it
            b.prof = _OFF
        if not legacy:
            _release(engine, batches)


def _run(engine, cp, Q, k, batches, starts, *, t_start, reused, legacy, mode, S, Xdev, graph, data, W, rr, use_smem,
         prof, phases, n_sync, mapped=False, seed_method="auto", results=None):
    """The walk of every batch (host loop), then the re-rank; stats into ``_stats``. ``results``: the
    call's ``(D, I)`` whose rows the batches' re-ranks write (``_setup``), returned when all did."""
    profile = prof.on
    if profile:
        cp.cuda.Device().synchronize()
        phases["setup"] = time.perf_counter() - t_start
    t_setup = time.perf_counter() - t_start
    fused = mapped and all(b.fused for b in batches)
    for s0, b in zip(starts, batches):  # iteration 0: the seeds are the first "neighbour list"
        b.q0 = s0
        if fused:
            b.walk_fused()  # the whole walk
        elif mapped:
            b.step_mapped(first=True)
        else:
            b.step(first=True)
    t_wait = t_gather = t_launch = t_finish = 0.0
    n_polled = 0
    gathered = 0  # host rows gathered during the walk (graph rows, vector rows)
    gathered_vec = 0
    stash = mode == "stash"
    data_bits = bits_view(data)  # float16 rows travel as their bits (Numba has no float16)
    active = [] if mapped else list(batches)
    t_loop = time.perf_counter()
    if fused:  # each batch's re-rank queued behind its walk: no host wait until the results
        t0 = time.perf_counter()
        for b in batches:
            b.done = True
            _finish(engine, cp, b, Q[b.q0:b.q0 + b.nq], k, rr, mode, Xdev, prof)
        t_finish = time.perf_counter() - t0
    elif mapped:
        t_wait, t_launch, t_finish, n_sync = _walk_mapped(engine, cp, Q, k, batches, rr, mode, Xdev, prof, n_sync)
    while active:
        # serve a batch whose candidates have arrived, else wait for the one served longest ago
        # (round-robin when all are busy): one batch's gather overlaps the others' GPU work
        t0 = time.perf_counter()
        pick = 0
        for j, b in enumerate(active):
            if b.event.done:
                pick = j
                n_polled += j > 0
                break
        b = active.pop(pick)
        b.event.synchronize()
        n_sync += 1
        t1 = time.perf_counter()
        t_wait += t1 - t0
        n_kept = 0
        if legacy:
            if b.cand_flat.max() < 0:  # no query of the batch has a candidate left
                b.done = True
                continue
            # the candidates' rows; -1 rows for finished queries (the kernel skips those queries)
            _gather_rows(graph, b.cand_flat, b.nbr_rows, -1)
            gathered += b.cand_flat.shape[0]
        else:
            t = b.turn if stash else 0
            n_valid, n_kept = gather_walk(graph, data_bits if stash else _NO_ROWS, b.cand_flat, W, S, b.count,
                                          b.nbr_rows, bits_view(b.vec_host[t]) if stash else _NO_ROWS,
                                          b.dst_host[t] if stash else _NO_DST, stash, b.off)
            if n_valid == 0:  # walk over: queue this batch's re-rank behind it on its stream
                b.done = True
                t2 = time.perf_counter()
                t_gather += t2 - t1
                _finish(engine, cp, b, Q[b.q0:b.q0 + b.nq], k, rr, mode, Xdev, prof)
                t_finish += time.perf_counter() - t2
                continue
            gathered += int(n_valid)
            gathered_vec += int(n_kept)
        t2 = time.perf_counter()
        t_gather += t2 - t1
        b.step(n_kept=n_kept)
        t_launch += time.perf_counter() - t2
        active.append(b)
    t_loop_end = time.perf_counter()
    if profile:
        cp.cuda.Device().synchronize()
        phases["walk"] = time.perf_counter() - t_loop
    t_rr = time.perf_counter()
    fallback_rows = 0
    host_rr_bytes = 0
    D_parts, I_parts = [], []
    if legacy:
        D_parts, I_parts, host_rr_bytes = _rerank_legacy(engine, cp, batches, Q, k, rr, profile, phases)
        n_sync += len(batches)
    else:
        for s0, b in zip(starts, batches):
            d, i, extra = _collect(engine, cp, b, Q[s0:s0 + b.nq], k, rr, mode, data, prof)
            fallback_rows += extra[0]
            host_rr_bytes += extra[1]
            n_sync += extra[2]
            D_parts.append(d)
            I_parts.append(i)
            b.rr_cand = b.rr_pos = b.rr_rows = b.rr_missing = b.rr_nmiss = b.rr_result = None
    cp.cuda.Device().synchronize()
    n_sync += 1
    t_end = time.perf_counter()
    # every batch's re-rank wrote its rows of the call's results in place (else: concatenated below)
    in_place = all(b.out is not None and d is b.out[0] and i is b.out[1] for b, d, i in zip(batches, D_parts, I_parts))
    for b in batches:  # (the cached batches keep no reference to what the caller gets)
        b.out = None
    if profile:
        phases["rerank"] = t_end - t_rr
        phases["total"] = t_end - t_start
    # expansions and steps are counted on the device: read when last_stats() asks (a reduction and
    # a host wait each, four a call, were ~0.3 ms of a 6 ms call), from the batches' own arrays
    lazy = [(b, b.generation) for b in batches]
    if legacy or mapped:
        exp_mean = _Lazy(lazy, lambda: float(np.mean([float(b.n_exp.mean()) for b in batches])))
    else:
        exp_mean = float(np.mean([float(b.count.mean()) for b in batches]))
    _stats.clear()
    _stats.update(total_s=t_end - t_start, walk_s=t_loop_end - t_start, setup_s=t_setup, loop_s=t_loop_end - t_loop,
                  rerank_s=t_end - t_rr, host_wait_s=t_wait, host_gather_s=t_gather, host_launch_s=t_launch,
                  host_finish_s=t_finish, batches=len(batches), fused_walk=fused,
                  walk_plan=batches[0].walk_plan if fused else None,
                  iterations=(_Lazy(lazy, lambda: max(int(b.n_new.max()) for b in batches)) if fused
                              else max(b.iters for b in batches)),
                  table_in_smem=bool(use_smem), search_width=W, out_of_turn=n_polled, expansions_mean=exp_mean,
                  legacy=legacy, access="mapped" if mapped else "gather", rerank_mode=mode, stash_slots=S,
                  mapped_memory=engine._bang_mapped["memory"] if mapped else None,
                  rerank_fallback_rows=fallback_rows,
                  workspace_reused=reused, workspace_bytes=int(sum(b.nbytes for b in batches)),
                  launches=int(sum(b.n_launch for b in batches)), copies=int(sum(b.n_copy for b in batches)),
                  h2d_bytes=int(sum(b.h2d_bytes for b in batches)) + host_rr_bytes,
                  d2h_bytes=int(sum(b.d2h_bytes for b in batches)),
                  host_gather_rows=gathered, host_gather_vec_rows=gathered_vec, host_syncs=n_sync,
                  results_in_place=in_place, seed_method=seed_method)
    if profile:
        _stats["phases"] = phases
        _stats["gpu_s"] = prof.sums()
    logger.debug("BANG GPU search: %s", _stats)
    if len(D_parts) == 1:
        return D_parts[0], I_parts[0]
    if in_place:
        return results
    return cp.concatenate(D_parts), cp.concatenate(I_parts)


def _walk_mapped(engine, cp, Q, k, batches, rr, mode, Xdev, prof, n_sync):
    """The walk loop of ``access="mapped"``: the host only queues. Each batch always has two chunks
    of steps queued (:meth:`_Batch.queue_chunk`); the host waits for the older chunk's count of
    live candidates (round-robin over the batches), and a batch whose count is 0 is over: its
    re-rank is queued behind the chunk still queued (whose steps find no candidate and return at
    once). Returns the host's ``(wait, launch, finish)`` seconds and the synchronisation count."""
    K = int(_cfg["mapped_chunk"])
    t_wait = t_launch = t_finish = 0.0
    t0 = time.perf_counter()
    for b in batches:
        b.queue_chunk(K - 1)  # the seed step of _run was the first
        b.queue_chunk(K)
    t_launch += time.perf_counter() - t0
    active = list(batches)
    while active:
        b = active.pop(0)
        t0 = time.perf_counter()
        slot = b.pending.pop(0)
        b.live_events[slot].synchronize()
        n_sync += 1
        live = int(b._live_host[slot])
        t1 = time.perf_counter()
        t_wait += t1 - t0
        # every live query logs at least one expansion per step, at most max_iters: a batch still
        # live after max_iters + 1 steps would be a fault of the kernels, not a long walk
        if live == 0 or b.iters > b.max_iters + 2 * K + 1:
            if live:
                logger.warning("BANG mapped walk: %d candidates still live after %d steps; stopped", live, b.iters)
            b.done = True
            _finish(engine, cp, b, Q[b.q0:b.q0 + b.nq], k, rr, mode, Xdev, prof)
            t_finish += time.perf_counter() - t1
            continue
        b.queue_chunk(K)
        t_launch += time.perf_counter() - t1
        active.append(b)
    return t_wait, t_launch, t_finish, n_sync


def _setup_legacy(engine, cp, Q, starts, sizes, *, codes, codebook, entry, L, R, W, max_iters, n_seeds, m, ksub,
                  use_smem, GS, prefetch, prof):
    """v2's setup: per batch the tables (CuPy expression) and seeds on the current stream, buffers
    allocated for this call only, then one wait for the current stream."""
    cur = cp.cuda.get_current_stream()
    batches = []
    for s0, nb in zip(starts, sizes):
        Qb = Q[s0:s0 + nb]
        e0 = prof.ev(cur) if prof.on else None
        T = pq_tables(engine.pq_queries(Qb), codebook, engine.pq_metric, engine.rotation_on_device())
        e1 = prof.ev(cur) if prof.on else None
        seeds = entry.seeds_for(Qb, n_seeds)
        if prof.on:
            prof.spans += [("tables", e0, e1), ("seeds", e1, prof.ev(cur))]
        b = _Batch(cp, nb, L=L, R=R, W=W, max_iters=max_iters, s=int(seeds.shape[1]), m=m, ksub=ksub, own=False)
        b.bind(nb, codes, T=T, seeds=seeds, use_smem=use_smem, GS=GS, prefetch=prefetch, vec_load=False, prof=prof)
        batches.append(b)
    cur.synchronize()  # tables and seeds made on the current stream
    return batches


def _setup(engine, cp, Q, k, starts, sizes, *, S, data, codes, codebook, entry, L, R, W, max_iters, n_seeds, m, ksub,
           use_smem, GS, prefetch, prof, graph_dev=None, seed_method="auto"):
    """The index's cached batches (or new ones), bound to this call. The call's seeds (one GEMM and
    one selection for every batch) and, for the fused walk's tables, its padded queries are made on
    the caller's stream; each batch's stream waits for them, then makes its tables there (unless
    the walk's blocks make them) and resets its state: no host wait. ``(batches, reused, held)``:
    ``held``, the call's arrays the batches read, kept until the call's end."""
    s = max(1, int(n_seeds))
    plan, walk_tables = fused_plan(L=L, R=R, W=W, max_iters=max_iters, s=s, m=m, ksub=ksub, use_smem=use_smem,
                                   mapped=graph_dev is not None)
    shape = dict(L=L, R=R, W=W, max_iters=max_iters, s=s, m=m, ksub=ksub, S=S, tbits=table_bits(),
                 d=data.shape[1] if S else 0, vdtype=data.dtype.str if S else None, plan=plan,
                 walk_tables=walk_tables, dsub=int(codebook.shape[2]) if walk_tables else 0)
    batches, reused = _workspace(engine, cp, sizes, shape)
    try:
        cn = engine._gpu_cache("pq_cnorms", lambda: (codebook * codebook).sum(axis=2))
        C = cp.ascontiguousarray(codebook, dtype=cp.float32) if walk_tables else None
        rotation = engine.rotation_on_device()
        cur = cp.cuda.get_current_stream()
        if prof.on:
            e0 = prof.ev(cur)
        Qc = engine.pq_queries(Q)  # (centred: one subtraction for the call)
        # the walk's blocks make their tables from these (bang_tables_direct's input); a view of Qc
        # when the subspaces cover d exactly and there is no rotation
        Qs = cp.ascontiguousarray(_padded(cp.ascontiguousarray(Qc, dtype=cp.float32), m, rotation)) if walk_tables \
            else None
        if prof.on:
            e1 = prof.ev(cur)
        seeds = entry.seeds_for(Q, n_seeds, gpu_method=seed_method)
        if prof.on:
            prof.spans += [("tables", e0, e1), ("seeds", e1, prof.ev(cur))]
        # the call's results: each batch's re-rank writes its rows (no concatenation after)
        D = cp.empty((Q.shape[0], int(k)), dtype=cp.float32)
        I = cp.empty((Q.shape[0], int(k)), dtype=cp.int64)
        ready = cp.cuda.Event(disable_timing=True)
        ready.record(cur)  # the queries, the call's arrays (and whatever the caller queued) first
        for s0, nb, b in zip(starts, sizes, batches):
            b.stream.wait_event(ready)
            b.prof = prof
            if not walk_tables:
                with b.stream:
                    if prof.on:
                        b._tick()
                    _tables_into(cp, Qc[s0:s0 + nb], codebook, cn, engine.pq_metric, b._T[:nb], rotation)
                    if prof.on:
                        b._tick("tables")
            b.bind(nb, codes, seeds=seeds[s0:s0 + nb], Qs=None if Qs is None else Qs[s0:s0 + nb], use_smem=use_smem,
                   GS=GS, prefetch=prefetch, vec_load=True, prof=prof, graph_dev=graph_dev, codebook=C,
                   ip=engine.pq_metric == "ip")
            b.out = (D[s0:s0 + nb], I[s0:s0 + nb])
    except BaseException:
        _release(engine, batches)
        raise
    return batches, reused, (Qc, Qs, seeds, D, I)


def _rerank_legacy(engine, cp, batches, Q, k, rerank, profile, phases):
    """v2's re-rank, after every batch's walk, one batch after the other: sort the whole log, copy
    the candidates to the host, gather their rows into new pageable memory, copy them in, exact
    top k (on the current stream). Profile: its four steps in ``phases`` (device synchronised)."""
    D_parts, I_parts = [], []
    host_bytes = 0
    s = 0
    sub = {"rerank_select": 0.0, "rerank_host_gather": 0.0, "rerank_h2d": 0.0, "rerank_exact": 0.0}
    for b in batches:  # 4.9: exact distances of the best logged candidates
        ta = time.perf_counter()
        with b.stream:
            order = cp.argsort(b.log_d, axis=1)[:, :rerank]
            cand = cp.take_along_axis(b.log_ids, order, axis=1)
            cand_h = _pinned(cand.shape, np.int32)
            cand.get(out=cand_h)
        tb = time.perf_counter()
        rows = gather_rows(engine._data, cand_h)
        tc = time.perf_counter()
        Xd = cp.asarray(rows)
        if profile:
            cp.cuda.Device().synchronize()
        td = time.perf_counter()
        Xc = prepare_vectors(Xd, engine.metric, engine.scale).reshape(cand.shape[0], cand.shape[1], -1)
        d, i = exact_topk(Q[s:s + b.nq], Xc, cand, k, engine._imetric)
        if profile:
            cp.cuda.Device().synchronize()
        te = time.perf_counter()
        for key, v in zip(sub, (tb - ta, tc - tb, td - tc, te - td)):
            sub[key] += v
        host_bytes += rows.nbytes
        s += b.nq
        D_parts.append(d)
        I_parts.append(i)
    if profile:
        phases.update(sub)
    return D_parts, I_parts, host_bytes


def _finish(engine, cp, b, Qb, k, rr, mode, Xdev, prof):
    """A batch's walk is over: queue its re-rank on its stream (no host wait), so it runs while
    the other batches still walk. "device" / "stash": rows, exact distances, top k; a stash miss
    (log position past the slots) is counted on the device and repaired in :func:`_collect`.
    "host": the candidates only (the host gathers their rows in :func:`_collect`)."""
    with b.stream:
        if prof.on:
            b._tick()
        # every query logged at most W per step; the fused walk's steps are not seen by the host, so
        # its plan covers every log slot (slots past a walk are empty and sort last: the same plan)
        C = b.max_iters if b.fused else min(b.max_iters, b.W * b.iters)
        stash = mode == "stash"
        rows_first = RERANK_ROWS_FIRST and mode in ("device", "mapped")
        if rerank_kernels_apply(b.log_d, C, rr):  # the plan (and the stash's rows) in one kernel
            src = b.slots if stash else (Xdev if rows_first else None)
            cand, pos, rows, missing, nmiss = rerank_rows_gpu(cp, b.log_ids, b.log_d, C, rr, src, b.S,
                                                              from_slots=stash)
            nmiss = nmiss[0]
        else:  # CuPy: the plan, then the rows
            cand, pos = rerank_plan(cp, b.log_ids, b.log_d, rr, C)
            rows = missing = nmiss = None
            if stash:
                rows, missing = rows_from_slots(cp, b.slots, b.S, cand, pos)
                nmiss = missing.sum()
        b.rr_cand, b.rr_pos = cand, pos
        if prof.on:
            b._tick("rerank_rows")
        if mode == "host":
            b.rr_rows = b.rr_missing = b.rr_result = None
            return
        b.rr_rows = rows
        b.rr_missing = missing if stash else None
        if stash:
            b.rr_nmiss = nmiss
        if rows is not None:  # the stash's rows (or, measuring, the rows copied first)
            b.rr_result = _exact(engine, Qb, rows, cand, k, out=None if stash else b.out)
        else:  # "device" / "mapped": rows read by id where they are (no row buffer)
            b.rr_result = _exact(engine, Qb, Xdev, cand, k, by_id=True, out=b.out)
        if prof.on:
            b._tick("rerank_exact")


def _collect(engine, cp, b, Qb, k, rr, mode, data, prof):
    """The re-ranked ``(D, I, (fallback rows, host bytes copied, host syncs))`` of a finished batch."""
    if mode in ("device", "mapped"):
        d, i = b.rr_result
        return d, i, (0, 0, 0)
    if mode == "stash":
        with b.stream:
            nmiss = int(b.rr_nmiss)  # on this stream: waits for the batch's queued work
        if not nmiss:
            d, i = b.rr_result
            return d, i, (0, 0, 1)
        with b.stream:  # positions past the slots: their rows from the host, then the top k again
            if prof.on:
                b._tick()
            where = cp.nonzero(b.rr_missing.reshape(-1))[0]
            ids = cp.asnumpy(b.rr_cand.reshape(-1)[where])
            got = gather_rows(data, ids)
            b.rr_rows[where] = cp.asarray(got)
            d, i = _exact(engine, Qb, b.rr_rows, b.rr_cand, k)
            if prof.on:
                b._tick("rerank_fallback")
        return d, i, (nmiss, got.nbytes, 2)
    # "host": gather after the walk, two pinned chunks alternating with their copies
    with b.stream:
        ids = cp.asnumpy(b.rr_cand.reshape(-1))
        if prof.on:
            b._tick()
        rows = cp.empty((ids.shape[0], data.shape[1]), data.dtype)
        bufs, events = _upload_buffers(engine, cp, data)
        nbytes = _upload_rows(cp, data, ids, rows, b.stream, bufs, events)
        if prof.on:
            b._tick("rerank_upload")
        d, i = _exact(engine, Qb, rows, b.rr_cand, k)
        if prof.on:
            b._tick("rerank_exact")
    return d, i, (0, nbytes, 1)
