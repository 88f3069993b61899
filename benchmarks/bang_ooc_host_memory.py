"""Peak host memory (resident set) of the out-of-core candidate lists that a host-placed
``GraphIndex`` builds when its graph does not fit the GPU budget, against the lists' own size
n x K x 8 bytes. ``--via engine`` (default) runs what the build runs,
``index.bang._engine._out_of_core_candidates`` (the lists by ``build_out_of_core`` with k = K, then
the ids the build takes), with a budget that makes ``--shards`` shards; ``--via graph`` calls
``graph._out_of_core.build_out_of_core`` itself with ``return_graph=True`` (ids and distances);
``--via build`` the whole ``GraphIndex.build(placement="host")`` under that budget (the host's
prune, reverse edges, connectivity and PQ after the lists) and a search of 1,000 rows.

    PYTHONPATH=src python benchmarks/bang_ooc_host_memory.py [--n 600000] [--d 96] [--K 64]
        [--shards 3] [--device cpu|gpu] [--via engine|graph|build] [--host-gb G]
        [--out benchmarks/results/cpu/bang_ooc_host_memory_<date>.json]

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
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--via", default="engine", choices=["engine", "graph", "build"])
    ap.add_argument("--host-gb", type=float, default=None,
                    help="engine/build: the host memory the shard sizing sees (default what /proc says)")
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
        held = planned = None
        # every step's time and resident set, from the work folder's manifest before the engine
        # removes it
        import knnkit.graph._out_of_core as ooc

        steps, real = {}, ooc.build_out_of_core

        def recorded(*args, **kw):
            res = real(*args, **kw)
            if res[0] == "paths":
                with open(res[1]["manifest"]) as f:
                    steps.update(json.load(f)["done"])
            return res
        ooc.build_out_of_core = recorded
        with PeakSampler() as sampler:
            if a.via == "graph":
                res = build_out_of_core(path, a.K, workdir=os.path.join(tmp, "work"),
                                        shard_size=-(-a.n // a.shards), device=a.device, random_state=0,
                                        return_graph=True)
                phase_s, held = res[3]["phase_s"], res[3].get("running_lists_held_max")
                _I = np.asarray(res[1], dtype=np.int64)  # as the host-placed build takes them
            else:
                from knnkit.graph._out_of_core import _default_shard_size
                from knnkit.index.bang._engine import _out_of_core_candidates

                # the budget whose default shard is n / shards (the engine then clamps it)
                shard = -(-a.n // a.shards)
                lo, hi = 1 << 20, 1 << 46
                while lo < hi:
                    mid = (lo + hi) // 2
                    if _default_shard_size(a.n, a.d, a.K, 16, a.device, mid)[0] >= shard:
                        hi = mid
                    else:
                        lo = mid + 1
                Xm = np.load(path, mmap_mode="r")
                import knnkit.index.bang._engine as eng

                if a.host_gb is not None:
                    eng._host_available_bytes = lambda: int(a.host_gb * 1e9)
                if hasattr(eng, "_out_of_core_shard"):  # trees before the host's shard sizing: None
                    plan = eng._out_of_core_shard(a.n, a.d, a.K, lo, a.device)
                    planned = {"shard": plan, "host_bytes_model": eng.out_of_core_host_bytes(a.n, a.d, a.K, plan)}
                if a.via == "engine":
                    _I, _ = _out_of_core_candidates(Xm, "sqeuclidean", a.K, lo, a.device, 0,
                                                    **({"shard": planned["shard"]} if planned else {}))
                    phase_s = None
                else:
                    import knnkit

                    knnkit.set_memory_budget(lo)
                    index = knnkit.GraphIndex.build(Xm, placement="host", device=a.device, random_state=0,
                                                    intermediate_degree=a.K)
                    phase_s = {k: round(float(v), 2) for k, v in index.build_timings.items()
                               if isinstance(v, (int, float))}
                    _d, ids = index.search(np.ascontiguousarray(Xm[:1000]), k=10)
                    phase_s["self_found"] = float(np.mean(np.asarray(ids)[:, 0] == np.arange(1000)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    peak, trace = sampler.peak_rss, sampler.trace
    lists = a.n * a.K * 8
    step = max(1, len(trace) // 40)
    out = {"params": dict(vars(a), out=os.path.basename(a.out)), "seconds": round(time.time() - t, 1),
           "peak_rss_bytes": int(peak), "lists_bytes": lists, "data_bytes": a.n * a.d * 4,
           "peak_over_lists": peak / lists, "phase_s": phase_s, "running_lists_held_max": held, "planned": planned,
           "steps": {k: {"time_s": round(v.get("time_s", 0.0), 2),
                         "rss_gb": None if v.get("rss_bytes") is None else round(v["rss_bytes"] / 1e9, 3)}
                     for k, v in steps.items()},
           "trace_s_gb": [(t_, round(v / 1e9, 3)) for t_, v in trace[::step]]}
    print(json.dumps(out), flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
