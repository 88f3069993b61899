"""The host step of the GPU walk (``_search_cpu.gather_walk``) over the same graph and vectors held
three ways: anonymous memory with transparent huge pages asked for (``madvise(MADV_HUGEPAGE)``),
anonymous memory with 4 KiB pages (``MADV_NOHUGEPAGE``), and a read-only memory map of a ``.npy``
file in the page cache (what a loaded index or a user's ``np.load(mmap_mode="r")`` gives).

Why: every gathered row is a random access; with 4 KiB pages each one also misses the TLB, so
the placement of the same bytes may change the host step's cost (predicted: the file map and the
4 KiB anonymous memory alike, huge pages faster by the page walks saved).

    PYTHONPATH=src python benchmarks/bang_pages_micro.py [--n 3000000] [--d 96] [--R 32] [--nb 5000]
        [--width 4] [--reps 100] [--out $OUT/bang_pages_micro.json]

Same candidates as ``bang_gather_micro.py`` (half from 100k hot nodes, half uniform), alternated
in one process; reports median / p10 / p90 seconds per call and the kernel's AnonHugePages.
"""

import argparse
import json
import mmap
import os
import sys
import tempfile
import time

import numba
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from knnkit.index.bang._search_cpu import gather_walk  # noqa: E402

sys.path.insert(0, HERE)
from bang_gather_micro import synthetic_walk  # noqa: E402


def anonymous(a, huge):
    """A copy of ``a`` in an anonymous mapping advised for (or against) huge pages, touched."""
    nbytes = a.nbytes
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE" if huge else "MADV_NOHUGEPAGE", None)
    if advice is not None:
        m.madvise(advice)
    out = np.frombuffer(m, dtype=a.dtype, count=a.size).reshape(a.shape)
    out[...] = a
    return out, m


def anon_huge_kb():
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3_000_000)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--R", type=int, default=32)
    ap.add_argument("--nb", type=int, default=5000)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--dir", default=None, help="folder of the .npy files (default: a temporary one)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bang_pages_micro.json"))
    a = ap.parse_args()
    graph, data, cands = synthetic_walk(a.n, a.d, a.R, a.nb, a.width)
    nbw = a.nb * a.width
    tmp = tempfile.mkdtemp(prefix="knnkit-pages-", dir=a.dir)
    gpath, dpath = os.path.join(tmp, "graph.npy"), os.path.join(tmp, "data.npy")
    np.save(gpath, graph)
    np.save(dpath, data)
    huge_before = anon_huge_kb()
    g_huge, m1 = anonymous(graph, True)
    d_huge, m2 = anonymous(data, True)
    huge_after = anon_huge_kb()
    g_small, m3 = anonymous(graph, False)
    d_small, m4 = anonymous(data, False)
    g_file, d_file = np.load(gpath, mmap_mode="r"), np.load(dpath, mmap_mode="r")
    g_file[:].sum(), d_file[:, 0].sum()  # in the page cache
    del graph, data
    places = {"anon_huge": (g_huge, d_huge), "anon_4k": (g_small, d_small), "file_map": (g_file, d_file)}
    nbr = np.empty((nbw, a.R), np.int32)
    vec = np.empty((nbw, a.d), np.float32)
    dst = np.empty(nbw, np.int32)
    off = np.empty(a.nb + 1, np.int32)
    slots = 1 << 20
    outs = {}
    for name, (g, d) in places.items():  # compile (one type signature each) and the same answers
        count = np.zeros(a.nb, np.int32)
        gather_walk(g, d, cands[0], a.width, slots, count, nbr, vec, dst, True, off)
        outs[name] = (nbr.copy(), vec.copy(), dst.copy(), count.copy())
    ref = outs["anon_huge"]
    same = all(np.array_equal(x, y) for o in outs.values() for x, y in zip(o, ref))
    times = {k: [] for k in places}
    order = list(places.items())
    for r in range(a.reps):
        for name, (g, d) in (order if r % 2 == 0 else order[::-1]):
            count = np.zeros(a.nb, np.int32)
            t = time.perf_counter()
            gather_walk(g, d, cands[r % len(cands)], a.width, slots, count, nbr, vec, dst, True, off)
            times[name].append(time.perf_counter() - t)
    res = {"params": dict(vars(a), out=os.path.basename(a.out), dir=None), "threads": numba.get_num_threads(),
           "threading_layer": numba.threading_layer(), "same_results": bool(same),
           "anon_huge_kb_before_after": [huge_before, huge_after],
           "median_s": {k: float(np.median(v)) for k, v in times.items()},
           "p10_s": {k: float(np.percentile(v, 10)) for k, v in times.items()},
           "p90_s": {k: float(np.percentile(v, 90)) for k, v in times.items()}}
    print(json.dumps(res), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    del places, g_file, d_file, g_huge, d_huge, g_small, d_small, outs, ref
    for p in (gpath, dpath):
        os.remove(p)
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
