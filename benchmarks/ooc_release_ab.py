"""Time of an out-of-core k-NN graph build (CPU) in one source tree, to compare two trees run
alternately: did keeping idle shards' running lists on disk (read back when a step needs them)
cost time? 60k x 16 clustered, k = 16, 8 shards of 7,500; the JIT is warmed on a 2-shard build first.

    python benchmarks/ooc_release_ab.py <path of a tree's src folder>
"""

import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(sys.argv[1]))

import numpy as np  # noqa: E402

import knnkit  # noqa: E402
from knnkit.graph._out_of_core import build_out_of_core  # noqa: E402


def main():
    knnkit.set_progress(False)
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(60000, 16)) + rng.integers(0, 30, size=(60000, 1))).astype(np.float32)
    d = tempfile.mkdtemp(prefix="knnkit-ooc-ab-")
    try:
        knnkit.io.write(os.path.join(d, "x.npy"), X)
        build_out_of_core(os.path.join(d, "x.npy"), 16, workdir=os.path.join(d, "w0"), shard_size=30000,
                          device="cpu", random_state=0, return_graph=True)
        t = time.perf_counter()
        r = build_out_of_core(os.path.join(d, "x.npy"), 16, workdir=os.path.join(d, "w"), shard_size=7500,
                              device="cpu", random_state=0, return_graph=True)
        print(f"seconds {time.perf_counter() - t:.2f} shards {r[3]['n_shards']}")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
