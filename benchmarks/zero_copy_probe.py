"""How fast can a GPU kernel read random rows of host memory directly (zero copy)? (issue 16)

BANG (seed 003, sections 3.2-4.6) keeps the graph in host memory and has CPU threads gather each
iteration's neighbour lists, which travel to the GPU over PCIe: a host round trip per iteration.
The alternative this probe measures: the kernel reads the rows itself from pinned, mapped host
memory (``cudaHostAlloc``: under unified addressing the host pointer is valid on the device), so a
walk needs no round trip at all. What bounds that is the rate of small random PCIe reads.

For rows of 128 B (graph degree 32, int32) and 384 B (96 float32: the re-rank vectors), it times a
kernel in which each warp reads ``rows_per_warp`` random rows (16-byte loads, a row spread over
lanes) from (a) device memory and (b) mapped host memory, at several grid sizes, and reports rows/s
and GB/s. Nothing else runs on the GPU meanwhile.

    PYTHONPATH=src python benchmarks/zero_copy_probe.py --out $OUT/zero_copy_probe.json
"""

import argparse
import json
import os
import time

import numpy as np

_SRC = r"""
extern "C" __global__ void read_rows(const int4* __restrict__ base, const long long* __restrict__ ids,
                                     long long n_ids, int row_vec4, int rows_per_warp, int* __restrict__ sink) {
    // one warp reads rows_per_warp rows; a row of row_vec4 16-byte words is spread over the lanes
    const int lane = threadIdx.x & 31;
    const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    int acc = 0;
    for (int r = 0; r < rows_per_warp; ++r) {
        long long j = warp * rows_per_warp + r;
        if (j >= n_ids) break;
        long long row = ids[j];
        for (int w = lane; w < row_vec4; w += 32) {
            int4 v = base[row * row_vec4 + w];
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    if (acc == 0x7fffffff) sink[0] = acc;  // keeps the loads alive
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20_000_000, help="rows in the table")
    ap.add_argument("--reads", type=int, default=4_000_000, help="random rows read per timed launch")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "zero_copy_probe.json"))
    args = ap.parse_args()
    import cupy as cp

    mod = cp.RawModule(code=_SRC, options=("-std=c++17",))
    kern = mod.get_function("read_rows")
    sink = cp.zeros(1, cp.int32)
    rng = np.random.default_rng(0)
    out = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": args.rows,
           "reads": args.reads, "results": []}
    for row_bytes in (128, 384):
        nbytes = args.rows * row_bytes
        t0 = time.perf_counter()
        pinned = cp.cuda.alloc_pinned_memory(nbytes)
        host = np.frombuffer(pinned, dtype=np.uint8, count=nbytes)
        host[:] = 1  # touch every page
        alloc_s = time.perf_counter() - t0
        dev = cp.asarray(host)
        host_ptr = pinned.ptr
        ids = cp.asarray(rng.integers(0, args.rows, args.reads, dtype=np.int64))
        vec4 = row_bytes // 16
        for where, ptr in (("device", dev.data.ptr), ("host_mapped", host_ptr)):
            for rows_per_warp in (1, 4):
                for blocks_per_sm in (2, 8, 32):
                    n_sm = cp.cuda.Device().attributes["MultiProcessorCount"]
                    block = 256
                    warps_needed = (args.reads + rows_per_warp - 1) // rows_per_warp
                    grid = min(n_sm * blocks_per_sm, (warps_needed * 32 + block - 1) // block)
                    # a fixed grid: each launch covers grid * 8 warps * rows_per_warp rows; loop over them
                    per_launch = grid * (block // 32) * rows_per_warp
                    launches = (args.reads + per_launch - 1) // per_launch

                    def go():
                        for s in range(launches):
                            off = s * per_launch
                            kern((grid,), (block,), (cp.uint64(ptr), ids[off:off + per_launch],
                                                     np.int64(min(per_launch, args.reads - off)), np.int32(vec4),
                                                     np.int32(rows_per_warp), sink))

                    go()
                    cp.cuda.Device().synchronize()
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record()
                    go()
                    e1.record()
                    e1.synchronize()
                    s = cp.cuda.get_elapsed_time(e0, e1) / 1e3
                    rec = {"row_bytes": row_bytes, "where": where, "rows_per_warp": rows_per_warp,
                           "blocks_per_sm": blocks_per_sm, "launches": launches, "seconds": s,
                           "mrows_per_s": args.reads / s / 1e6, "gb_per_s": args.reads * row_bytes / s / 1e9,
                           "pinned_alloc_s": alloc_s}
                    print(json.dumps(rec), flush=True)
                    out["results"].append(rec)
        del dev, host, pinned
        cp.get_default_memory_pool().free_all_blocks()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
