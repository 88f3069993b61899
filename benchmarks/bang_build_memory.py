"""Peak GPU and host memory of a host-placed ``GraphIndex`` build, against the build's own estimate
(``index.bang._engine.build_bytes``, which decides between the in-memory build and the out-of-core
candidate lists). For the GPU machine.

    PYTHONPATH=src python benchmarks/bang_build_memory.py --n 20000000 --d 96 [--budget-mb 130000]
        [--out $OUT/bang_build_memory.json]

The data are ``bang_bench.generate``'s clustered vectors (a memory map under $TMPDIR). A thread
(``_peak_memory.PeakSampler``) samples the device's used memory (``cudaMemGetInfo``) and the
process's resident set every 0.2 s; the peaks are reported above what was in use before the build.
"""

import argparse
import json
import os
import sys
import tempfile
import time


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)

from _peak_memory import PeakSampler  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000_000)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--budget-mb", type=float, default=None, help="memory budget during the build (default: automatic)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bang_build_memory.json"))
    a = ap.parse_args()

    import cupy as cp

    import knnkit
    from bang_bench import generate
    from knnkit.index.bang._engine import _build_budget, build_bytes

    tmp = tempfile.mkdtemp(dir=os.environ.get("TMPDIR"))
    t = time.perf_counter()
    X, _Q = generate(os.path.join(tmp, "base.npy"), a.n, a.d, 16, seed=1)
    gen_s = time.perf_counter() - t
    if a.budget_mb is not None:
        knnkit.set_memory_budget(int(a.budget_mb * 2 ** 20))
    budget = knnkit.get_memory_budget()
    cp.get_default_memory_pool().free_all_blocks()
    build_budget = _build_budget(budget, "gpu")  # what the build plans on (automatic: 0.6 of the free memory)
    free0, total = cp.cuda.runtime.memGetInfo()

    def gpu_used():
        return total - cp.cuda.runtime.memGetInfo()[0]

    t = time.perf_counter()
    with PeakSampler(gpu_used=gpu_used) as peak:
        index = knnkit.GraphIndex.build(X, placement="host", device="gpu", random_state=0)
    build_s = time.perf_counter() - t
    K = int(index._engine.build_params.get("intermediate_degree") or 96)
    estimate = int(build_bytes(a.n, a.d, K))
    res = {"machine": {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "cpus": os.cpu_count()},
           "params": dict(vars(a), out=os.path.relpath(a.out, os.environ.get("OUT", "."))),
           "generate_s": gen_s, "build_s": build_s, "build_phases_s": index.build_timings,
           "budget_bytes": int(budget), "build_budget_bytes": int(build_budget), "free_before_bytes": int(free0),
           "total_bytes": int(total), "estimate_bytes": estimate, "intermediate_degree": K,
           "out_of_core": "candidates_out_of_core" in index.build_timings,
           "peak_gpu_above_base_bytes": int(peak.peak_gpu),
           "peak_rss_above_base_bytes": int(peak.peak_rss), "data_bytes": int(X.nbytes)}
    res["peak_over_estimate"] = res["peak_gpu_above_base_bytes"] / res["estimate_bytes"]
    print(json.dumps(res), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    del index, X
    for name in os.listdir(tmp):
        os.remove(os.path.join(tmp, name))
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
