"""A NumPy stand-in for CuPy and the kernels of ``index/connect.cu``, so the CPU tests can run the
GPU connectivity path (``_connect_gpu.py`` and the ``GPU_KERNELS`` branches of ``_connect.py``)
end to end: launches, level batches, the level cap, dtype conversions, the fast path of
``repair_connectivity`` and its fallback to the host repair.

"Device" arrays are a NumPy subclass (``FakeArray``, with ``.get()``); ``cupy.<name>`` is NumPy's
function with its array results viewed as ``FakeArray``; ``asarray`` of a host array copies, as a
host-to-device copy does. Each kernel is emulated thread by thread from its source, the threads in
a shuffled order (the hooking and the frontier pushes must not depend on it): the per-thread
logic mirrors the ``CN_HD`` functions of ``connect.cu`` line by line. What this cannot check:
CUDA itself (launch limits, races, warp votes): the GPU tests do, and
``test_connect_kernels_host.py`` runs the ``.cu`` file's own per-thread functions on the host.

Use: ``install(monkeypatch)`` returns the fake module; ``dev(a)`` makes a "device" array.
"""

import sys
import types

import numpy as np

from _fake_device_array import FakeArray, _h, dev  # noqa: F401 (dev: used by the tests)


def _wrap(fn):
    def f(*a, **kw):
        out = fn(*a, **kw)
        return out.view(FakeArray) if isinstance(out, np.ndarray) and not isinstance(out, FakeArray) else out
    return f


class _Device:
    id = 0
    attributes = {"MultiProcessorCount": 2}

    def __init__(self, i=0):
        pass

    def synchronize(self):
        pass


class FakeCupy(types.ModuleType):
    """``cupy``: NumPy's names, array results as FakeArray."""

    def __init__(self):
        super().__init__("cupy")
        self.ndarray = FakeArray
        self.cuda = types.SimpleNamespace(Device=_Device)
        self.asarray = lambda a, dtype=None: (a if isinstance(a, FakeArray) and dtype in (None, a.dtype)
                                              else np.array(a, dtype=dtype).view(FakeArray))
        self.launches = []
        # CuPy's sorts are stable (radix sorts); NumPy's default is not
        self.argsort = lambda a, axis=-1: np.argsort(np.asarray(a), axis=axis, kind="stable").view(FakeArray)

    def __getattr__(self, name):
        obj = getattr(np, name)
        if callable(obj) and not isinstance(obj, type):
            return _wrap(obj)
        return obj


# ---------------------------------------------------------------------------------- kernels
# (the per-thread bodies of connect.cu; ``rng`` shuffles the threads)
def _find(parent, x):
    curr = parent[x]
    if curr != x:
        prev = x
        while True:
            nxt = parent[curr]
            if not curr > nxt:
                break
            parent[prev] = nxt
            prev, curr = curr, nxt
    return curr


def _cas(parent, i, expected, desired):
    old = parent[i]
    if old == expected:
        parent[i] = desired
    return old


def _hook_pair(parent, a, b):
    ra, rb = _find(parent, a), _find(parent, b)
    while ra != rb:
        if ra < rb:
            ret = _cas(parent, rb, rb, ra)
            if ret == rb:
                break
            rb = ret
        else:
            ret = _cas(parent, ra, ra, rb)
            if ret == ra:
                break
            ra = ret


def _visit(bits, n, v):
    if v < 0 or v >= n:
        return False
    m = np.uint32(1 << (v & 31))
    if bits[v >> 5] & m:
        return False
    old = bits[v >> 5]
    bits[v >> 5] = old | m
    return not (old & m)


class Kernels:
    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.calls = []

    def cc_init(self, g, n, R, parent):
        n, R = int(n), int(R)
        g = g.reshape(n, R)
        for v in self.rng.permutation(n):
            lanes = [v] * 32   # cn_init_part per lane (slots lane, lane + 32, ...), then a min
            for lane in range(32):
                for j in range(lane, R, 32):
                    u = int(g[v, j])
                    if 0 <= u < n and u < lanes[lane]:
                        lanes[lane] = u
            parent[v] = min(lanes)

    def cc_hook(self, g, n, R, parent):
        n, R = int(n), int(R)
        flat = g.reshape(-1)
        for e in self.rng.permutation(n * R):
            u, v = int(flat[e]), int(e // R)
            if u < 0 or u >= n or u == v:
                continue
            _hook_pair(parent, v, u)

    def cc_flatten(self, n, parent):
        for v in self.rng.permutation(int(n)):
            r = v
            while r > parent[r]:
                r = parent[r]
            if r != parent[v]:
                parent[v] = r

    def bfs_seed(self, src, m, n, bits, frontier, counts):
        for i in self.rng.permutation(int(m)):
            v = int(src[i])
            if _visit(bits, int(n), v):
                frontier[counts[0]] = v
                counts[0] += 1

    def bfs_expand(self, g, n, R, bits, counts, level, frontier, nxt):
        n, R, level = int(n), int(R), int(level)
        flat = g.reshape(-1)
        total = int(counts[level]) * R
        for e in self.rng.permutation(total):
            u = int(frontier[e // R])
            v = int(flat[u * R + e % R])
            if _visit(bits, n, v):
                nxt[counts[level + 1]] = v
                counts[level + 1] += 1

    def edge_sqdist(self, X, n, d, g, R, out):
        n, d, R = int(n), int(d), int(R)
        g = g.reshape(n, R)
        valid = (g >= 0) & (g < n)
        nb = X[np.where(valid, g, 0)]
        s = np.zeros((n, R), np.float32)
        for k in range(d):  # sequential in k, every step rounded to float32 (NumPy has no FMA here)
            t = (nb[:, :, k] - X[:, None, k]).astype(np.float32)
            s = (s + (t * t).astype(np.float32)).astype(np.float32)
        out.reshape(n, R)[...] = np.where(valid, s, np.float32(np.nan))

    def short_graph(self, g, dist, near, n, R, factor, short, n_long):
        n, R = int(n), int(R)
        flat, dflat, sflat = g.reshape(-1), dist.reshape(-1), short.reshape(-1)
        for e in self.rng.permutation(n * R):
            v = int(flat[e])
            lng = False
            if 0 <= v < n:
                nu, nv = near[e // R], near[v]
                scale = nu if nu > nv else nv
                lng = bool(dflat[e] > np.float32(factor) * scale and nu > 0 and nv > 0)
            sflat[e] = -1 if lng else flat[e]
            n_long[0] += np.uint64(lng)

    def __call__(self, name):
        fn = getattr(self, name)

        def launch(grid, block, args, shared_mem=0):
            self.calls.append(name)
            fn(*[_h(a) for a in args])
        return launch


def install(monkeypatch, seed=0):
    """Route ``_connect_gpu`` and the cupy branches of ``_connect`` / ``_engine._connect`` to the
    fake. Returns ``(fake cupy module, Kernels)``."""
    from knnkit.index import _connect, _connect_gpu, _engine

    cp = FakeCupy()
    kernels = Kernels(seed)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    # cupyx.scipy.sparse for the component sums (a sparse one-hot times X): SciPy's, results "on
    # the device"
    sparse = types.ModuleType("cupyx.scipy.sparse")

    class _Csr:
        def __init__(self, m):
            self.m = m

        def tocsr(self):
            return _Csr(self.m.tocsr())

        def __matmul__(self, other):
            return np.asarray(self.m @ np.asarray(other)).view(FakeArray)

    def coo_matrix(arg, shape=None):
        import scipy.sparse as ssp

        vals, (rows, cols) = arg
        return _Csr(ssp.coo_matrix((np.asarray(vals), (np.asarray(rows), np.asarray(cols))), shape=shape))

    sparse.coo_matrix = coo_matrix
    cupyx = types.ModuleType("cupyx")
    cupyx_scipy = types.ModuleType("cupyx.scipy")
    cupyx.scipy, cupyx_scipy.sparse = cupyx_scipy, sparse
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    monkeypatch.setitem(sys.modules, "cupyx.scipy", cupyx_scipy)
    monkeypatch.setitem(sys.modules, "cupyx.scipy.sparse", sparse)
    monkeypatch.setattr(_connect_gpu, "_cp", lambda: cp)
    monkeypatch.setattr(_connect_gpu, "_kernel", kernels)
    monkeypatch.setattr(_connect_gpu, "_sm_count", lambda: 2)
    monkeypatch.setattr(_connect, "_xp_of", lambda a: cp if isinstance(a, FakeArray) else np)
    monkeypatch.setattr(_connect, "_to_host", lambda a: np.array(a) if isinstance(a, FakeArray) else a)
    monkeypatch.setattr(_engine, "get_array_module", lambda a: cp if isinstance(a, FakeArray) else np)
    monkeypatch.setattr(_engine, "as_host", lambda a: np.array(a) if isinstance(a, FakeArray) else a)
    return cp, kernels
