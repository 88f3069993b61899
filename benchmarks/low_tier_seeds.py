"""The CPU low tier's calibrated curve over seeds (issue 11: which denser step to take first).

Builds the low tier's graph (graph_degree 32, intermediate_degree 48, alpha 1.1: what the automatic
parameters give LID < 28 on the CPU) of one robustness set for each seed and prints its calibrated
recall@10 by beam with the two quantities ``GraphIndex._denser`` decides from: the gain from beam 32
to 64 over the miss at 32 (``p32``) and the miss at beam 16 (``miss16``); ``p16`` is the gain from
16 to 64 over the miss at 16. One JSON line per seed.

    python benchmarks/low_tier_seeds.py sift_like_u8 1,2,3,4,5
"""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import knnkit  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402


def main():
    name, seeds = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
    (_nm, X, _Q, metric), = robustness_sets("small", names=[name], real=True)
    knnkit.GraphIndex.build(X[:3000], metric=metric, device="cpu")  # compile
    for seed in seeds:
        t = time.perf_counter()
        index = knnkit.GraphIndex.build(X, metric=metric, device="cpu", graph_degree=32, intermediate_degree=48,
                                        alpha=1.1, random_state=seed)
        cur = dict(zip(index.calibration["beams"], index.calibration["recall"]))
        print(json.dumps({"set": name, "seed": seed, "build_s": round(time.perf_counter() - t, 1),
                          "p32": round((cur[64] - cur[32]) / (1 - cur[32]), 3),
                          "p16": round((cur[64] - cur[16]) / (1 - cur[16]), 3),
                          "miss16": round(1 - cur[16], 4), "curve": cur}), flush=True)


if __name__ == "__main__":
    main()
