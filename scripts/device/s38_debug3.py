"""Thirty-eighth session: is the first managed copy of a process wrong as the GPU reads it? One
variant per process (argv[1]); prints what the GPU reads against what the host wrote."""
import ctypes
import sys

import numpy as np
import cupy as cp

from knnkit.index.bang import _search_gpu as sg

kind = sys.argv[1]
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 6000
a = np.random.default_rng(1).integers(0, 1 << 30, (rows, 32)).astype(np.int32)
cp.zeros(1).sum()  # CuPy initialised, as in a search
dev = cp.cuda.Device().id
lib = sg._driver()


def alloc(n):
    ptr = ctypes.c_ulonglong()
    assert lib.cuMemAllocManaged(ctypes.byref(ptr), n, 1) == 0
    return ptr.value


def advise(ptr, n):
    for advice, where in ((3, sg._MemLocation(2, 0)), (5, sg._MemLocation(1, dev))):
        assert lib.cuMemAdvise_v2(ptr, n, advice, where) == 0


def view(ptr, n):
    return np.ctypeslib.as_array((ctypes.c_ubyte * n).from_address(ptr)).view(np.int32).reshape(a.shape)


def gpu_read(ptr):
    v = cp.ndarray(a.shape, cp.int32, cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(ptr, a.nbytes, None, dev), 0))
    return cp.asnumpy(v), cp.asnumpy(v.copy())  # the copy engine, and a kernel


if kind == "dummy_first":
    p0 = alloc(1 << 21)
    advise(p0, 1 << 21)
    np.ctypeslib.as_array((ctypes.c_ubyte * (1 << 21)).from_address(p0))[...] = 7
ptr = alloc(a.nbytes)
if kind in ("current", "dummy_first", "sync_after", "prefetch_after"):
    advise(ptr, a.nbytes)
    view(ptr, a.nbytes)[...] = a
elif kind == "write_then_advise":
    view(ptr, a.nbytes)[...] = a
    advise(ptr, a.nbytes)
elif kind == "memcpy":
    advise(ptr, a.nbytes)
    cp.cuda.runtime.memcpy(ptr, a.ctypes.data, a.nbytes, 4)
elif kind == "plain":  # managed, no advice at all
    view(ptr, a.nbytes)[...] = a
if kind == "sync_after":
    cp.cuda.Device().synchronize()
if kind == "prefetch_after":
    fn = lib.cuMemPrefetchAsync_v2
    fn.argtypes = [ctypes.c_ulonglong, ctypes.c_size_t, sg._MemLocation, ctypes.c_uint, ctypes.c_void_p]
    print("prefetch rc", fn(ptr, a.nbytes, sg._MemLocation(2, 0), 0, None))
    cp.cuda.Device().synchronize()
host_ok = np.array_equal(view(ptr, a.nbytes), a)
r1, r2 = gpu_read(ptr)
bad = np.nonzero((r1 != a).any(1))[0]
print(kind, rows, "host view ok", host_ok, "gpu copy-engine ok", np.array_equal(r1, a), "gpu kernel ok",
      np.array_equal(r2, a), "bad rows", len(bad), bad[:5], "zeros in bad", int((r1[bad] == 0).sum()) if len(bad) else 0,
      "first bad row", r1[bad[0], :4] if len(bad) else "", "want", a[bad[0], :4] if len(bad) else "", flush=True)
# read again after a second
import time  # noqa: E402
time.sleep(1)
r3, _ = gpu_read(ptr)
print("   again after 1 s ok", np.array_equal(r3, a), flush=True)
