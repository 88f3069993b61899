"""One line per row of a ``bang_bench.py`` log (the device scripts' summaries): knnkit's rows with
access, mapped memory, walk and re-rank times, calls and the device's free memory; ``--busy``
rows with the kernels' share; peers' rows as they are. Lines that are not one JSON object each
(the bench's closing multi-line summary) are skipped."""
import json
import sys

for line in open(sys.argv[1]):
    if '{"' in line and not line.startswith("{"):  # a row printed behind a progress bar's last line
        line = line[line.index('{"'):]
    if not line.startswith("{"):
        continue
    try:
        r = json.loads(line)
    except json.JSONDecodeError:
        continue
    if "busy" in r:
        print("  busy", r["busy"], r["beam"], "pb", r.get("pipeline_batches"), "kernel_frac", round(r["kernel_frac"], 3), "busy_frac",
              round(r["busy_frac"], 3))
    elif r.get("method") == "knnkit-host":
        print(r["path"], "L", r["beam"], "pb", r.get("pipeline_batches"), round(r["recall"], 4), round(r["qps"]), r.get("access"), r.get("mapped_memory"),
              "walk_ms", round(1e3 * r["walk_s"], 2), "rerank_ms", round(1e3 * r["rerank_s"], 2), "calls",
              r.get("calls"), "free_gb", round(r.get("gpu_free_bytes", 0) / 1e9, 2))
    elif "method" in r:
        print(r["method"], {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k != "method"})
