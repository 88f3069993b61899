"""Do two GPU processes on one host slow each other's index search? (issue 17: per query block the
Dask search took 28-39 ms on each of 2 GPU workers against 19-23 ms on one, with no transfers.)

    PYTHONPATH=src python benchmarks/two_gpu_contention.py [--n 2000000] [--blocks 20] > out.json

No Dask: the same work as one ShardedIndex replica per GPU. Each process (``CUDA_VISIBLE_DEVICES``
set to its GPU) builds a GraphIndex of ``make_clustered(n, 96, n_clusters=1000)`` and searches
``--blocks`` blocks of 50k host (numpy) queries at beams 32 / 64 / 128, results back to the host,
as a Dask task does. Phases: ``alone`` (GPU 0 only), then ``pair`` (GPUs 0 and 1 at once; the
processes start their searches at one barrier). Per block: wall seconds and the process's CPU
seconds (host work); also with device-resident (cupy) queries, where no host copy happens.
Output: one JSON document on stdout.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(args):
    sys.path.insert(0, os.path.join(HERE, "..", "src"))
    import cupy as cp
    import numpy as np

    import knnkit
    from knnkit.datasets import make_clustered

    X, Q = make_clustered(args.n, 96, n_queries=args.blocks * 50_000, n_clusters=1000, random_state=0, device="gpu")
    idx = knnkit.GraphIndex.build(X, random_state=0)
    Qh = cp.asnumpy(Q)
    for beam in (32, 64, 128):  # compile / warm every beam's kernels
        idx.search(Qh[:50_000], 10, beam=beam)
    cp.cuda.Device().synchronize()
    # barrier: wait for the go file
    open(args.ready, "w").close()
    while not os.path.exists(args.go):
        time.sleep(0.01)
    rows = []
    for beam in (32, 64, 128):
        for kind in ("host", "device"):
            walls, cpus = [], []
            for b in range(args.blocks):
                q = Qh[b * 50_000:(b + 1) * 50_000] if kind == "host" else Q[b * 50_000:(b + 1) * 50_000]
                t, c = time.perf_counter(), time.process_time()
                d, i = idx.search(q, 10, beam=beam)
                if kind == "device":
                    cp.cuda.Device().synchronize()
                walls.append(time.perf_counter() - t)
                cpus.append(time.process_time() - c)
            rows.append({"beam": beam, "queries": kind, "block_wall_ms": round(1e3 * float(np.median(walls)), 2),
                         "block_cpu_ms": round(1e3 * float(np.median(cpus)), 2),
                         "total_s": round(float(np.sum(walls)), 3)})
    print(json.dumps({"gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "rows": rows}), flush=True)


def run_phase(gpus, args, tag):
    ready = [f"/tmp/contention_{tag}_{g}.ready" for g in gpus]
    go = f"/tmp/contention_{tag}.go"
    for p in ready + [go]:
        if os.path.exists(p):
            os.remove(p)
    procs = []
    for g, r in zip(gpus, ready):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(g))
        procs.append(subprocess.Popen([sys.executable, __file__, "--child", "--n", str(args.n), "--blocks",
                                       str(args.blocks), "--ready", r, "--go", go], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    while not all(os.path.exists(r) for r in ready):
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.05)
    open(go, "w").close()
    return [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--ready")
    ap.add_argument("--go")
    args = ap.parse_args()
    if args.child:
        return child(args)
    out = {"n": args.n, "d": 96, "blocks": args.blocks, "block_queries": 50_000, "cpus": os.cpu_count(),
           "alone": run_phase([0], args, "alone"), "pair": run_phase([0, 1], args, "pair")}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
