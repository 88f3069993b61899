"""Random row reads from mapped host memory by the GPU (issue 16, ``access="mapped"``): the walk's
graph-row kernel (``bang_gather_graph``) reading 20,000 random rows per launch (one batch step of
5,000 queries x W = 4) from host memory of several sizes, page-locked three ways, against device
memory. Asks whether the slow mapped walk at 20M x 96 (10 GB of graph + vectors) is the size of the
mapped range (address translation: 4 KB pages) and whether transparent huge pages change it.

    PYTHONPATH=src python benchmarks/bang_mapped_micro.py --sizes-gb 1,4,12 --out $OUT/mapped_micro.json

Kinds: ``register`` (NumPy memory, cudaHostRegister), ``thp`` (anonymous memory advised
MADV_HUGEPAGE, touched, then registered), ``hostalloc`` (cudaHostAlloc, portable | mapped),
``device`` (cupy.empty: the reference). Rows of 128 B (R = 32 int32 ids: a graph row) and 384 B
(R = 96: a 96-d float32 vector)."""

import argparse
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-gb", default="1,4,12")
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--kinds", default="device,register,thp,hostalloc")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "mapped_micro.json"))
    a = ap.parse_args()

    import ctypes

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
            t = time.perf_counter()
            if kind == "device":
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
                       "gb_per_s": a.rows * 4 * R / us / 1e3, "make_s": t_make, "anon_huge_pages": anon_huge}
                res["rows"].append(row)
                print(json.dumps(row), flush=True)
            if held is not None:
                (rt.freeHost if held[0] == "free" else rt.hostUnregister)(held[1])
            host = buf = m = None  # noqa: F841 - freed before the next size
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
