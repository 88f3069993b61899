"""Random row reads from mapped host memory by the GPU (issue 16, ``access="mapped"``): the walk's
graph-row kernel (``bang_gather_graph``) reading 20,000 random rows per launch (one batch step of
5,000 queries x W = 4) from host memory of several sizes, page-locked three ways, against device
memory. Asks whether the slow mapped walk at 20M x 96 (10 GB of graph + vectors) is the size of the
mapped range (address translation: 4 KB pages) and whether transparent huge pages change it.

    PYTHONPATH=src python benchmarks/bang_mapped_micro.py --sizes-gb 1,4,12 --out $OUT/mapped_micro.json

Kinds: ``register`` (NumPy memory, cudaHostRegister), ``thp`` (anonymous memory advised
MADV_HUGEPAGE, touched, then registered), ``hostalloc`` (cudaHostAlloc, portable | mapped),
``device`` (cupy.empty: the reference). Rows of 128 B (R = 32 int32 ids: a graph row) and 384 B
(R = 96: a 96-d float32 vector).

Thirty-eighth session: two more kinds that map host memory for the GPU with pages larger than
4 KB on the GPU's side, to ask whether the growth with the range is the GPU's translation of
small pages: ``vmm`` (the driver's virtual memory API, ``cuMemCreate`` of memory located on the
host at the allocation granularity, mapped for the device with ``cuMemMap``) and ``managed``
(``cuMemAllocManaged``, advised to stay on the CPU and to be accessed by the GPU in place)."""

import argparse
import ctypes
import json
import mmap
import os
import time

import numpy as np


def meminfo(key):
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":")[1].strip()
    except OSError:
        return None
    return None


def _driver():
    """The driver library (the library's, with its argument types) and a call that raises on an error."""
    from knnkit.index.bang._search_gpu import _driver as library_driver

    lib = library_driver()

    def call(name, *args):
        rc = getattr(lib, name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name} failed: CUresult {rc}")
    return lib, call


def make_vmm(nbytes, loc_type):
    """Host memory through the virtual memory API: ``(ptr, release, info)``. ``loc_type`` 2 = HOST,
    3 = HOST_NUMA (node 0)."""
    from knnkit.index.bang._search_gpu import _MemLocation as _Loc

    class Prop(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int), ("location", _Loc),
                    ("win32", ctypes.c_void_p), ("flags", ctypes.c_ubyte * 8)]

    class Access(ctypes.Structure):
        _fields_ = [("location", _Loc), ("flags", ctypes.c_int)]

    lib, call = _driver()
    prop = Prop(type=1, handle_types=0, location=_Loc(loc_type, 0))
    gmin, grec = ctypes.c_size_t(), ctypes.c_size_t()
    call("cuMemGetAllocationGranularity", ctypes.byref(gmin), ctypes.byref(prop), 0)
    call("cuMemGetAllocationGranularity", ctypes.byref(grec), ctypes.byref(prop), 1)
    gran = max(grec.value, gmin.value, 2 << 20)
    size = -(-nbytes // gran) * gran
    handle = ctypes.c_ulonglong()
    call("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_ulonglong(0))
    ptr = ctypes.c_ulonglong()
    call("cuMemAddressReserve", ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(gran),
         ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))
    call("cuMemMap", ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), handle, ctypes.c_ulonglong(0))
    host_access = True
    try:
        descs = (Access * 2)(Access(_Loc(1, 0), 3), Access(_Loc(loc_type, 0), 3))
        call("cuMemSetAccess", ptr, ctypes.c_size_t(size), descs, ctypes.c_size_t(2))
    except RuntimeError:
        host_access = False
        descs = (Access * 1)(Access(_Loc(1, 0), 3))
        call("cuMemSetAccess", ptr, ctypes.c_size_t(size), descs, ctypes.c_size_t(1))

    def release():
        call("cuMemUnmap", ptr, ctypes.c_size_t(size))
        call("cuMemAddressFree", ptr, ctypes.c_size_t(size))
        call("cuMemRelease", handle)
    return ptr.value, release, {"granularity_min": gmin.value, "granularity_recommended": grec.value,
                                "host_access": host_access}


def make_managed(nbytes, cp):
    """The library's managed copy (``_search_gpu._managed_copy``: advised to stay on the CPU and be
    read by the GPU in place) of ``nbytes`` bytes of ones: ``(ptr, release, info)``."""
    from knnkit.index.bang import _search_gpu as sg

    _copy, ptr = sg._managed_copy(cp, np.ones((nbytes, 1), np.uint8), cp.cuda.Device().id)
    return ptr, lambda: sg._unmap(cp, [("managed", ptr)]), {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-gb", default="1,4,12")
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--kinds", default="device,register,thp,hostalloc,vmm,vmm_numa,managed")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "mapped_micro.json"))
    a = ap.parse_args()

    import cupy as cp

    from knnkit.index.bang._search_gpu import _kernel

    kern = _kernel("bang_gather_graph")
    rt = cp.cuda.runtime
    res = {"gpu": rt.getDeviceProperties(0)["name"].decode(), "params": dict(vars(a), out=os.path.basename(a.out)),
           "thp_enabled": open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip()
           if os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled") else None, "rows": []}
    rng = np.random.default_rng(0)
    for gb in [float(x) for x in a.sizes_gb.split(",")]:
        nbytes = int(gb * (1 << 30))
        for kind in a.kinds.split(","):
            held = host = buf = m = None
            info = {}
            t = time.perf_counter()
            if kind in ("vmm", "vmm_numa", "managed"):
                try:
                    if kind == "managed":
                        ptr, release, info = make_managed(nbytes, cp)
                    else:
                        ptr, release, info = make_vmm(nbytes, 2 if kind == "vmm" else 3)
                        fill = np.ones(64 << 20, np.uint8)
                        for s0 in range(0, nbytes, fill.nbytes):
                            rt.memcpy(ptr + s0, fill.ctypes.data, min(fill.nbytes, nbytes - s0), 4)
                    held = ("call", release)
                except Exception as e:  # noqa: BLE001 - recorded: the kind is not available here
                    row = {"size_gb": gb, "kind": kind, "error": f"{type(e).__name__}: {e}"}
                    res["rows"].append(row)
                    print(json.dumps(row), flush=True)
                    continue
            elif kind == "device":
                buf = cp.zeros(nbytes // 4, cp.int32)
                ptr = buf.data.ptr
            elif kind == "hostalloc":
                hp = rt.hostAlloc(nbytes, 1 | 2)
                host = np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(hp))
                host[:] = 1
                ptr, held = hp, ("free", hp)
            else:
                if kind == "thp":
                    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                    m.madvise(mmap.MADV_HUGEPAGE)
                    host = np.frombuffer(m, np.uint8)
                else:
                    host = np.empty(nbytes, np.uint8)
                host[:] = 1  # touch: the pages exist before they are pinned
                rt.hostRegister(host.ctypes.data, nbytes, 1 | 2)
                ptr, held = host.ctypes.data, ("unregister", host.ctypes.data)
            t_make = time.perf_counter() - t
            anon_huge = meminfo("AnonHugePages")
            for R in (32, 96):
                n_rows = nbytes // (4 * R)
                cand = cp.asarray(rng.integers(0, n_rows, a.rows).astype(np.int32))
                out = cp.empty(a.rows * R, cp.int32)
                grid = (int(min(-(-a.rows * R // 256), 1 << 16)),)
                args = (cand, np.int64(a.rows), ptr, np.int32(R), out)
                for _ in range(5):
                    kern(grid, (256,), args)
                cp.cuda.Device().synchronize()
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record()
                for _ in range(a.reps):
                    kern(grid, (256,), args)
                e1.record()
                e1.synchronize()
                us = cp.cuda.get_elapsed_time(e0, e1) * 1e3 / a.reps
                row = {"size_gb": gb, "kind": kind, "row_bytes": 4 * R, "us_per_launch": us,
                       "gb_per_s": a.rows * 4 * R / us / 1e3, "make_s": t_make, "anon_huge_pages": anon_huge,
                       **info}
                res["rows"].append(row)
                print(json.dumps(row), flush=True)
            if held is not None and held[0] == "call":
                held[1]()
            elif held is not None:
                (rt.freeHost if held[0] == "free" else rt.hostUnregister)(held[1])
            host = buf = m = None  # noqa: F841 - freed before the next size
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
