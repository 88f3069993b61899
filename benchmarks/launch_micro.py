"""Host cost of one kernel launch: a CuPy ``RawKernel`` call against one ``cuLaunchKernel`` from an
argument block packed once (``Packed`` below; the thirty-fifth session's ``PreparedLaunch``, reverted
with the walk change that used it: ``results/h200-2026-12-01-s35/zc_pl/zc_pl.patch``), for an empty
kernel of 30 arguments (as many as the BANG walk's distance step) and of 5; plus the other calls of a
walk step (a 4-byte ``memcpyAsync``, an event record, entering and leaving ``with stream:``). Alternated
in one process; medians of the per-call host time over ``--reps`` calls of each, the device synchronised
between rounds.

    PYTHONPATH=src python benchmarks/launch_micro.py [--reps 2000] [--out $OUT/launch_micro.json]
"""

import argparse
import json
import os
import time

import numpy as np



class Packed:
    """A launch of ``kernel`` (a CuPy RawKernel) with ``args`` (CuPy arrays, NumPy int32 scalars)
    packed once into the driver's argument block."""

    def __init__(self, kernel, grid, block, args):
        import ctypes

        from cupy.cuda import driver

        self.values = [ctypes.c_void_p(a.data.ptr) if hasattr(a, "data") and not isinstance(a, np.generic)
                       else ctypes.c_int32(int(a)) for a in args]
        self.block_ = (ctypes.c_void_p * len(self.values))(*[ctypes.addressof(v) for v in self.values])
        self.ptr = ctypes.addressof(self.block_)
        self.fn = int(kernel.kernel.ptr)
        self.grid, self.block, self.launch = grid, block, driver.launchKernel

    def __call__(self, stream):
        self.launch(self.fn, self.grid[0], 1, 1, self.block[0], 1, 1, 0, stream.ptr, self.ptr, 0)

SRC = r"""
extern "C" __global__ void k30(%s) { if (threadIdx.x == 1023 && blockIdx.x == 1 << 30) ((int*)p0)[0] = 0; }
extern "C" __global__ void k5(const int* p0, int a1, int a2, const float* p3, int a4) {
    if (threadIdx.x == 1023 && blockIdx.x == 1 << 30) ((int*)p0)[0] = a1 + a2 + a4 + (int)p3[0]; }
"""


def main():
    import cupy as cp

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "launch_micro.json"))
    a = ap.parse_args()
    params = []
    for i in range(30):
        params.append(f"const int* p{i}" if i % 2 == 0 else f"int a{i}")
    mod = cp.RawModule(code=SRC % ", ".join(params))
    k30, k5 = mod.get_function("k30"), mod.get_function("k5")
    buf = cp.zeros(1024, cp.int32)
    fbuf = cp.zeros(16, cp.float32)
    args30 = tuple(buf if i % 2 == 0 else np.int32(i) for i in range(30))
    args5 = (buf, np.int32(1), np.int32(2), fbuf, np.int32(4))
    stream = cp.cuda.Stream(non_blocking=True)
    ev = cp.cuda.Event(disable_timing=True)
    pin = cp.cuda.alloc_pinned_memory(64)
    p30 = Packed(k30, (64,), (128,), args30)
    p5 = Packed(k5, (64,), (128,), args5)

    def raw30():
        with stream:
            k30((64,), (128,), args30)

    def raw5():
        with stream:
            k5((64,), (128,), args5)

    def prep30():
        p30(stream)

    def prep5():
        p5(stream)

    def memcpy():
        cp.cuda.runtime.memcpyAsync(pin.ptr, buf.data.ptr, 4, 2, stream.ptr)

    def record():
        ev.record(stream)

    def ctx():
        with stream:
            pass

    cases = {"rawkernel_30": raw30, "prepared_30": prep30, "rawkernel_5": raw5, "prepared_5": prep5,
             "memcpy_async_4B": memcpy, "event_record": record, "with_stream": ctx}
    for f in cases.values():  # compile, warm
        for _ in range(50):
            f()
    stream.synchronize()
    per = {k: [] for k in cases}
    order = list(cases.items())
    for r in range(a.rounds):
        for name, f in (order if r % 2 == 0 else order[::-1]):
            t = time.perf_counter()
            for _ in range(a.reps):
                f()
            per[name].append((time.perf_counter() - t) / a.reps)
            stream.synchronize()
    res = {"params": dict(vars(a), out=os.path.basename(a.out)), "cupy": cp.__version__,
           "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "median_us": {k: float(np.median(v) * 1e6) for k, v in per.items()},
           "min_us": {k: float(np.min(v) * 1e6) for k, v in per.items()}}
    print(json.dumps(res), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
