"""The CPU calibration's stop rule, A/B in one process (issue 11, CPU build time): past the fixed
beams it tries larger ones only while the default is unsettled or the walk still beats the exact
scan of the same rows; the old rule went on to 2048 while below 0.995.

    PYTHONPATH=src python benchmarks/calibration_stop_cpu.py uniform_d960,uniform_d128 OUT.json

Per set (robustness suite, "small" scale): builds alternated old / new twice (old = the stop
disabled by ``EXACT_FASTER = inf`` during the build), recording build and calibration seconds,
the calibrated beams, ``stopped_at``, the default beam and its recall on the suite's queries, and
``search(target_recall=0.99)``'s recall and time.
"""

import json
import os
import sys
import time

import knnkit
from knnkit.datasets.suite import robustness_sets
from knnkit.evaluate import recall
from knnkit.index import _calibrate


def main():
    names, out_path = sys.argv[1], sys.argv[2]
    rows = []
    for name in names.split(","):
        (_, X, Q, metric), = robustness_sets("small", names=[name], real=False)
        gt_d, gt_i = knnkit.knn(X, Q, k=10, metric=metric, device="cpu")
        for ef in (float("inf"), 1.0, float("inf"), 1.0):
            _calibrate.EXACT_FASTER = ef
            t = time.perf_counter()
            idx = knnkit.GraphIndex.build(X, metric=metric, device="cpu", random_state=0)
            bt = time.perf_counter() - t
            _calibrate.EXACT_FASTER = 1.0
            c = idx.calibration
            D, I = idx.search(Q, 10)
            t = time.perf_counter()
            D2, I2 = idx.search(Q, 10, target_recall=0.99)
            t99 = time.perf_counter() - t
            row = dict(set=name, rule="old (no time stop)" if ef == float("inf") else "stop when slower than the scan",
                       build_s=round(bt, 2), calibration_s=round(idx.build_timings.get("calibration", 0), 2),
                       beams=c["beams"], stopped_at=c.get("stopped_at"), default_beam=idx.search_params.beam,
                       recall_default=round(recall(I, gt_i, found_distances=D, true_distances=gt_d), 4),
                       target99_recall=round(recall(I2, gt_i, found_distances=D2, true_distances=gt_d), 4),
                       target99_s=round(t99, 3), reaches99=idx.reaches(0.99))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    with open(out_path, "w") as f:
        json.dump(dict(benchmark="calibration_time_stop_cpu", cpu_count=os.cpu_count(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
