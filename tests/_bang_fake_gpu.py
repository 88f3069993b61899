"""A NumPy stand-in for the CuPy calls of the BANG GPU driver (``index/bang/_search_gpu.py``), so
the CPU tests can run its host loop end to end: batches, pinned buffers, copies, the stash of
re-rank rows, the fallback, the cached workspace, the legacy path.

Arrays are NumPy arrays of a subclass with ``.data.ptr`` (copies are ``ctypes.memmove`` between
real host buffers); streams and events run everything at once, in queue order; the kernels of
``bang.cu`` are emulated query by query from their source (``bang_distances``, ``bang_merge``,
``bang_tables``, ``bang_stash``, ``bang_rerank_exact``; ``bang_walk`` as their steps in a loop), PQ
sums in subspace order as the CPU twin adds them, so the
emulated GPU walk and the CPU twin agree exactly. What this cannot check: CUDA itself (launch
limits, races between streams, the kernels' real code): the GPU tests do.

Use: ``install(monkeypatch)`` returns the fake module; ``dev(a)`` makes a "device" array."""

import ctypes
import sys
import types

import numpy as np

from _fake_device_array import FakeArray, _h, dev  # noqa: F401 (dev: used by the tests)

from knnkit._core.metrics import prepare_vectors
from knnkit.index.bang._pq import _tables_cpu, round_bf16
from knnkit.index.bang._search_cpu import _bloom_contains, _bloom_insert, exact_distances




class _Stream:
    ptr = 0

    def __init__(self, non_blocking=False):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass


class _Event:
    done = True

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


class _Device:
    id = 0
    attributes = {"MaxSharedMemoryPerBlockOptin": 232448}

    def __init__(self, i=0):
        pass

    def synchronize(self):
        pass


def _memcpy(dst, src, size, kind, stream):
    ctypes.memmove(dst, src, size)


def _key_less(da, ia, db, ib):
    return da < db or (da == db and (int(ia) & 0xFFFFFFFF) < (int(ib) & 0xFFFFFFFF))


def _pq(codes, T, q, node):
    acc = np.float32(0)
    for j in range(codes.shape[1]):
        acc = np.float32(acc + T[q, j, codes[node, j]])
    return acc


class _Kernel:
    def __init__(self, fn):
        self.fn = fn
        self.attributes = {"shared_size_bytes": 0}
        self.max_dynamic_shared_size_bytes = 0

    def __call__(self, grid, block, args, shared_mem=0):
        self.fn(*[_h(a) for a in args])


def _bloom_step_py(words, wmask, row):
    """bang.cu's visited test of one step: distinct ids not in the filter before the step, in
    first-occurrence order, then marked."""
    fresh, seen = [], set()
    for node in row:
        node = int(node)
        if node >= 0 and node not in seen and not _bloom_contains(words, 0, wmask, node):
            seen.add(node)
            fresh.append(node)
    for node in fresh:
        _bloom_insert(words, 0, wmask, node)
    return fresh


def _distances(nbrs, width, codes, m, T, ksub, bf16, use_smem, vec_load, bloom, bloom_words, hash_slots, wl_ids, wl_d,
               wl_x, L,
               new_ids, new_d, new_x, n_new, new_cap, select, W, cand, log_ids, log_d, n_exp, max_iters, GS, nq):
    width, L, W, max_iters, nq = int(width), int(L), int(W), int(max_iters), int(nq)
    assert bool(bf16) == (T.dtype == np.uint16), "the kernel's bf16 flag must name the tables' dtype"
    if bf16:  # bfloat16 bits: the upper half of a float32
        T = (T.astype(np.uint32) << np.uint32(16)).view(np.float32)
    wmask = int(bloom_words) - 1
    for q in range(nq):
        row = nbrs[q, :width]
        cnt = 0
        if (row >= 0).any():
            worst_i = int(wl_ids[q, L - 1])
            worst_d = wl_d[q, L - 1] if worst_i >= 0 else np.float32(np.inf)
            assert int(hash_slots) >= 2 * width
            for node in _bloom_step_py(bloom[q], wmask, row):
                d = _pq(codes, T, q, node)
                if _key_less(d, node, worst_d, worst_i):
                    new_ids[q, cnt], new_d[q, cnt], new_x[q, cnt] = node, d, 0
                    cnt += 1
        n_new[q] = cnt
        if not select:
            continue
        opos = [i for i in range(L) if wl_ids[q, i] >= 0 and not wl_x[q, i]][:W]
        oless = [sum(_key_less(new_d[q, t], new_ids[q, t], wl_d[q, p], wl_ids[q, p]) for t in range(cnt)) for p in opos]
        nidx, nless = [None] * W, [None] * W
        for t in range(cnt):
            r = sum(_key_less(new_d[q, u], new_ids[q, u], new_d[q, t], new_ids[q, t]) for u in range(cnt))
            if r < W:
                nidx[r] = t
                nless[r] = sum(_key_less(wl_d[q, i], wl_ids[q, i], new_d[q, t], new_ids[q, t]) for i in range(L))
        nnew = min(cnt, W)
        ne = int(n_exp[q])
        io = inn = c = 0
        while c < W and ne < max_iters and (io < len(opos) or inn < nnew):
            if io >= len(opos):
                take_old = False
            elif inn >= nnew:
                take_old = True
            else:
                p, t = opos[io], nidx[inn]
                take_old = _key_less(wl_d[q, p], wl_ids[q, p], new_d[q, t], new_ids[q, t])
            if take_old:
                p = opos[io]
                if p + oless[io] >= L:
                    break
                node, d = wl_ids[q, p], wl_d[q, p]
                wl_x[q, p] = 1
                io += 1
            else:
                t = nidx[inn]
                if inn + nless[inn] >= L:
                    break
                node, d = new_ids[q, t], new_d[q, t]
                new_x[q, t] = 1
                inn += 1
            log_ids[q, ne], log_d[q, ne] = node, d
            cand[q, c] = node
            ne += 1
            c += 1
        n_exp[q] = ne
        cand[q, c:] = -1


def _merge(wl_ids, wl_d, wl_x, L, new_ids, new_d, new_x, n_new, new_cap, select, W, cand, log_ids, log_d, n_exp,
           max_iters, nq):
    L, W, max_iters = int(L), int(W), int(max_iters)
    for q in range(int(nq)):
        cnt = int(n_new[q])
        if cnt > 0:
            old = [(wl_d[q, i], int(wl_ids[q, i]), int(wl_x[q, i]), 0, i) for i in range(L)]
            new = [(new_d[q, t], int(new_ids[q, t]), int(new_x[q, t]), 1, t) for t in range(cnt)]

            def key(e):  # list entries before new ones among equal keys (only empty slots tie)
                return (float(e[0]), e[1] & 0xFFFFFFFF, e[3], e[4])

            merged = sorted(old + new, key=key)[:L]
            for i, e in enumerate(merged):
                wl_d[q, i], wl_ids[q, i], wl_x[q, i] = e[0], e[1], e[2]
        if not select:
            continue
        ne = int(n_exp[q])
        c = 0
        for p in [i for i in range(L) if wl_ids[q, i] >= 0 and not wl_x[q, i]][:W]:
            if ne >= max_iters:
                break
            wl_x[q, p] = 1
            log_ids[q, ne], log_d[q, ne] = wl_ids[q, p], wl_d[q, p]
            cand[q, c] = wl_ids[q, p]
            ne += 1
            c += 1
        n_exp[q] = ne
        cand[q, c:] = -1


def _tables(dots, qn, cn, T, nq, m, ksub, ip, bf16):
    dots = dots.reshape(int(m), int(nq), int(ksub))
    if ip:
        t = -dots
    else:
        t = np.maximum(qn.reshape(int(m), int(nq))[:, :, None] - 2.0 * dots + cn[:, None, :], 0.0)
    t = t.transpose(1, 0, 2).astype(np.float32)
    if bf16:
        u = t.view(np.uint32)
        T[...] = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    else:
        T[...] = t


def _stash(rows, dst, nrows, row_bytes, word, slots):
    n = int(nrows)
    raw_rows = rows.reshape(-1).view(np.uint8).reshape(rows.shape[0], -1)
    raw_slots = slots.reshape(-1).view(np.uint8).reshape(slots.shape[0], -1)
    for r in range(n):
        if dst[r] >= 0:
            raw_slots[dst[r]] = raw_rows[r]


def order_keys(vals, cols):
    """``bang_order_key`` of ``bang.cu`` in NumPy: orderable float bits << 32 | column (uint64)."""
    v = np.array(vals, dtype=np.float32)
    v[v == 0] = np.float32(0.0)  # -0 -> +0
    v[np.isnan(v)] = np.frombuffer(np.uint32(0x7FC00000).tobytes(), np.float32)[0]
    u = v.view(np.uint32)
    u = np.where(u & np.uint32(0x80000000), ~u, u | np.uint32(0x80000000)).astype(np.uint64)
    return (u << np.uint64(32)) | np.asarray(cols, np.uint64)


def _sorted_cols(vals):
    """Columns of ``vals`` in the order of their sorted 64-bit keys (the kernels' bitonic sort of
    distinct keys gives the sorted order)."""
    return (np.sort(order_keys(vals, np.arange(len(vals)))) & np.uint64(0xFFFFFFFF)).astype(np.int64)


def _rerank_rows(log_ids, log_d, ld, C, Cp, rr, src, from_slots, S, row_bytes, word, cand, pos, rows, missing,
                 n_missing):
    """``bang_rerank_rows``: plan (rr best of the first C log entries), rows from the slots or the
    device vectors (bytes), missing mask and count."""
    ld, C, rr, S, row_bytes = int(ld), int(C), int(rr), int(S), int(row_bytes)
    lid, ldd = log_ids.reshape(-1), log_d.reshape(-1)
    raw_src = src.reshape(-1).view(np.uint8) if row_bytes else None
    raw_rows = rows.reshape(-1).view(np.uint8) if row_bytes else None
    for q in range(cand.shape[0]):
        order = _sorted_cols(ldd[q * ld:q * ld + C])
        for j in range(rr):
            p = int(order[j]) if j < C else C
            node = int(lid[q * ld + p]) if j < C else -1
            cand[q, j], pos[q, j] = node, p
            miss = bool(from_slots) and node >= 0 and p >= S
            missing[q, j] = miss
            n_missing[0] += int(miss)
            if row_bytes:
                ok = node >= 0 and (not from_slots or p < S)
                at = (q * S + p) if from_slots else node
                dst = (q * rr + j) * row_bytes
                raw_rows[dst:dst + row_bytes] = raw_src[at * row_bytes:(at + 1) * row_bytes] if ok else 0


def _rerank_select(dist, cand, c, Cp, k, D, I):
    """``bang_rerank_select``: the k best of each row by exact distance (+inf where cand is -1)."""
    c, k = int(c), int(k)
    for q in range(D.shape[0]):
        v = np.where(cand[q] >= 0, dist[q], np.float32(np.inf)).astype(np.float32)
        order = _sorted_cols(v)
        for j in range(k):
            if j < c:
                D[q, j] = v[order[j]]
                I[q, j] = cand[q, order[j]] if np.isfinite(v[order[j]]) else -1
            else:
                D[q, j], I[q, j] = np.inf, -1


def _gather_graph(cand, nrows, graph, R, nbrs):
    nrows, R = int(nrows), int(R)
    c = cand.reshape(-1)[:nrows]
    out = nbrs.reshape(-1)[:nrows * R].reshape(nrows, R)
    out[...] = np.where((c >= 0)[:, None], graph[np.maximum(c, 0)], -1)


def _walk_table(Qs, C, q, ip, bf16):
    """``bang_walk``'s table of query ``q`` made in its block (``build_table``): ``bang_tables_direct``'s
    values, as ``_pq.tables_into`` makes them on the CPU (float32, or bfloat16 bits)."""
    t = np.empty((1, C.shape[0], C.shape[1]), np.float32)
    _tables_cpu(np.asarray(Qs[q:q + 1]), np.asarray(C), bool(ip), t)
    if bf16:
        return (round_bf16(t).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    return t


def _walk(graph, R, seeds, s, codes, m, T, ksub, bf16, use_smem, stage, bloom, bloom_words, bloom_smem, hslots, L, W,
          max_iters, log_ids, log_d, n_exp, steps, GS, nq, Qs, C, dsub, ip, build_table):
    """``bang_walk``: per query, the steps of the step kernels (distances without prefetch, merge
    with the choice, the candidates' graph rows) until no candidate is left; with ``build_table``
    the query's table made first from ``Qs`` and ``C``."""
    R, s, L, W, max_iters, nq = int(R), int(s), int(L), int(W), int(max_iters), int(nq)
    cap = max(W * R, s)
    assert int(hslots) >= 2 * cap
    if build_table:
        assert use_smem and Qs.shape[1:] == (C.shape[0], int(dsub)) and C.shape[1] == int(ksub)
    for q in range(nq):
        log_ids[q], log_d[q] = -1, np.inf  # the block starts its log (no fill before the walk)
        Tq = _walk_table(Qs, C, q, ip, bf16) if build_table else T[q:q + 1]
        words = np.zeros((1, int(bloom_words)), np.uint32) if bloom_smem else bloom[q:q + 1]
        words[...] = 0  # (the block zeroes its filter wherever it lives)
        wl_ids, wl_d = np.full((1, L), -1, np.int32), np.full((1, L), np.inf, np.float32)
        wl_x = np.zeros((1, L), np.uint8)
        new_ids, new_d, new_x = np.empty((1, cap), np.int32), np.empty((1, cap), np.float32), np.zeros((1, cap), np.uint8)
        n_new, cand, ne = np.zeros(1, np.int32), np.full((1, W), -1, np.int32), np.zeros(1, np.int32)
        nbrs = np.full((1, cap), -1, np.int32)
        nbrs[0, :s] = seeds[q]
        width, step = s, 0
        while True:
            _distances(nbrs, width, codes, m, Tq, ksub, bf16, use_smem, 1, words, bloom_words, hslots, wl_ids,
                       wl_d, wl_x, L, new_ids, new_d, new_x, n_new, cap, 0, W, cand, log_ids[q:q + 1],
                       log_d[q:q + 1], ne, max_iters, GS, 1)
            _merge(wl_ids, wl_d, wl_x, L, new_ids, new_d, new_x, n_new, cap, 1, W, cand, log_ids[q:q + 1],
                   log_d[q:q + 1], ne, max_iters, 1)
            step += 1
            c = cand[0][cand[0] >= 0]
            if c.size == 0:
                break
            rows = graph[c].reshape(-1)
            width = rows.size
            nbrs[0, :width] = rows
        n_exp[q], steps[q] = ne[0], step


def _rerank_exact(Qp, d, cand, c, src, by_id, dtype, row_bytes, scale, cosine, ip, dist, nq):
    """``bang_rerank_exact``: the candidates' rows (by id, or by position q * c + j), prepared
    and their exact distances as the CuPy path computes them (``prepare_vectors``,
    ``exact_distances``), +inf where the candidate is -1."""
    d, c, nq = int(d), int(c), int(nq)
    X = np.asarray(src).reshape(-1, d)
    assert X.dtype == [np.float32, np.float16, np.uint8, np.int8][int(dtype)] and int(row_bytes) == d * X.itemsize
    cd = np.asarray(cand)[:nq]
    at = np.maximum(cd, 0) if by_id else np.arange(nq * c).reshape(nq, c)
    rows = np.where((cd >= 0).reshape(-1)[:, None], X[at.reshape(-1)], 0).astype(X.dtype)
    Xc = prepare_vectors(rows, "cosine" if cosine else "sqeuclidean", float(scale)).reshape(nq, c, d)
    got = exact_distances(np.asarray(Qp)[:nq], Xc, "ip" if (ip or cosine) else "l2")
    dist[:nq] = np.where(cd >= 0, got, np.float32(np.inf))


def _live(cand, nrows, out):
    out[0] = int((cand.reshape(-1)[:int(nrows)] >= 0).sum())


KERNELS = {"bang_distances": _distances, "bang_gather_graph": _gather_graph, "bang_live": _live, "bang_walk": _walk,
           "bang_merge": _merge, "bang_tables": _tables, "bang_stash": _stash,
           "bang_rerank_rows": _rerank_rows, "bang_rerank_select": _rerank_select, "bang_rerank_exact": _rerank_exact}


class FakeOutOfMemory(Exception):
    """The fake's ``cupy.cuda.memory.OutOfMemoryError``."""


def _fake_module():
    cp = types.ModuleType("cupy")
    for name in ("int32", "int64", "uint8", "uint16", "uint32", "float32", "float64", "bool_", "inf", "take_along_axis",
                 "concatenate", "where", "maximum", "minimum", "nonzero", "matmul", "einsum", "isfinite"):
        setattr(cp, name, getattr(np, name))
    cp.ndarray = FakeArray

    def wrap(fn):
        def f(*a, **kw):
            out = fn(*a, **kw)
            return out.view(FakeArray) if isinstance(out, np.ndarray) else out
        return f

    cp.empty = wrap(np.empty)
    cp.zeros = wrap(np.zeros)
    cp.full = wrap(np.full)
    cp.arange = wrap(np.arange)
    cp.ascontiguousarray = wrap(np.ascontiguousarray)
    cp.asarray = dev
    cp.argsort = wrap(lambda a, axis=-1: np.argsort(a, axis=axis, kind="stable"))  # CuPy sorts stably
    cp.asnumpy = lambda a, stream=None: np.array(a)
    cp.cuda = types.SimpleNamespace(Stream=_Stream, Event=_Event, Device=_Device,
                                    get_current_stream=lambda: _Stream(),
                                    get_elapsed_time=lambda a, b: 0.0,
                                    runtime=types.SimpleNamespace(memcpyAsync=_memcpy),
                                    memory=types.SimpleNamespace(OutOfMemoryError=FakeOutOfMemory))
    cp.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)
    return cp


def install(monkeypatch):
    """Route ``_search_gpu``'s CuPy use to the fake: ``import cupy`` inside it, pinned buffers,
    kernels. Returns the fake module."""
    from knnkit.index.bang import _search_gpu as sg

    cp = _fake_module()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(sg, "_pinned", lambda shape, dtype: np.empty(shape, dtype))
    kernels = {name: _Kernel(fn) for name, fn in KERNELS.items()}
    monkeypatch.setattr(sg, "_kernel", lambda name: kernels[name])
    monkeypatch.setattr(sg, "_smem_fit", {})
    monkeypatch.setattr(sg, "_walk_fit", {})
    # mapped host memory (access="mapped"): "device" views over the same host memory, nothing registered
    monkeypatch.setattr(sg, "_map_arrays",
                        lambda cp_, arrays, memory="pinned": (tuple(a.view(FakeArray) for a in arrays), []))
    return cp
