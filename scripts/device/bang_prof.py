"""One line per profiled row of a ``bang_bench.py --profile`` result (the device scripts' profile
summaries): path, beam, QPS, CUDA-event spans and synchronised phases in ms, iterations, mean
expansions and the fused walk's shared-memory plan."""
import json
import sys

for r in json.load(open(sys.argv[1]))["rows"]:
    if "gpu_s" in r:
        print(r["path"], r["beam"], round(r["qps"]), {k: round(v * 1e3, 2) for k, v in r["gpu_s"].items()},
              {k: round(v * 1e3, 2) for k, v in r.get("phases", {}).items()}, "iters", r["iterations"],
              "exp", round(r["expansions_mean"], 1), r.get("walk_plan"))
