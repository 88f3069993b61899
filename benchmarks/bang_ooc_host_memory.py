"""Peak host memory (resident set) of the out-of-core candidate lists that a host-placed
``GraphIndex`` builds when its graph does not fit the GPU budget
(``graph._out_of_core.build_out_of_core`` with k = K, as ``index.bang._engine`` calls it), against
the lists' own size n x K x 8 bytes. CPU (the GPU path's host side holds the same lists).

    PYTHONPATH=src python benchmarks/bang_ooc_host_memory.py [--n 600000] [--d 96] [--K 64]
        [--shards 3] [--out benchmarks/results/cpu/bang_ooc_host_memory_<date>.json]

``_peak_memory.PeakSampler`` samples the resident set every 0.2 s; the peak is above what the
process held before.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from knnkit.datasets.synthetic import make_clustered  # noqa: E402
from knnkit.graph._out_of_core import build_out_of_core  # noqa: E402

sys.path.insert(0, HERE)
from _peak_memory import PeakSampler  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=600_000)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--K", type=int, default=64)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cpu",
                                                  f"bang_ooc_host_memory_{time.strftime('%Y-%m-%d')}.json"))
    a = ap.parse_args()
    X = np.asarray(make_clustered(a.n, a.d, random_state=0, device="cpu"), dtype=np.float32)
    tmp = tempfile.mkdtemp(prefix="knnkit-ooc-mem-")
    try:
        path = os.path.join(tmp, "data.npy")
        np.save(path, X)
        del X
        t = time.time()
        with PeakSampler() as sampler:
            res = build_out_of_core(path, a.K, workdir=os.path.join(tmp, "work"), shard_size=-(-a.n // a.shards),
                                    device="cpu", random_state=0, return_graph=True)
            _I = np.asarray(res[1], dtype=np.int64)  # as the host-placed build takes them
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    peak, trace = sampler.peak_rss, sampler.trace
    lists = a.n * a.K * 8
    step = max(1, len(trace) // 40)
    out = {"params": dict(vars(a), out=os.path.basename(a.out)), "seconds": round(time.time() - t, 1),
           "peak_rss_bytes": int(peak), "lists_bytes": lists, "data_bytes": a.n * a.d * 4,
           "peak_over_lists": peak / lists, "phase_s": res[3]["phase_s"],
           "trace_s_gb": [(t_, round(v / 1e9, 3)) for t_, v in trace[::step]]}
    print(json.dumps(out), flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
