"""CPU NN-Descent before/after in one process, on the calls the index build makes.

For each set, the index build's candidate step (``knnkit.index._build.candidate_graph`` with the
list length the build uses) is run once with ``nndescent`` wrapped, to capture the exact descent it
makes (forest start, K, p, delta, seed). That call is then replayed, alternating, on

* ``base``: ``_cpu.py`` as it is in the git commit ``--base`` (a copy loaded from a temporary
  directory, its relative imports made absolute), and
* ``new``: the working tree's ``knnkit.graph.nndescent._cpu``,

each warm (one untimed run first). Reported per set: descent seconds (every repeat, and the median),
the phase split of every run, whether ids are identical, the sha1 of each graph (its distances' then
its ids' bytes: a change meant to keep the lists must keep it), the largest distance difference, and
recall@10 of both graphs on sampled rows against exact neighbours.

Usage::

    PYTHONPATH=src python benchmarks/nndescent_cpu_ab.py --sets tight_c10000 uniform_d32 sift_like_u8 \
        --out benchmarks/results/cpu/nndescent_ab.jsonl
"""

import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REL = "src/knnkit/graph/nndescent/_cpu.py"

SETS = {
    # name: (maker, index candidate list length K)
    "tight_c10000": (lambda s: s.make_tight_clusters(100_000, 64, 10_000, random_state=0), 96),
    "uniform_d32": (lambda s: s.make_uniform_cube(100_000, 32, random_state=0), 48),
    "sift_like_u8": (lambda s: s.make_sift_like_uint8(100_000, 128, random_state=0), 48),
    "broad_clusters": (lambda s: s.make_broad_clusters(100_000, 64, random_state=0), 48),
}


def git(*args):
    return subprocess.check_output(["git", *args], text=True, cwd=os.path.dirname(HERE)).strip()


def load_base(commit, tmp):
    """The module ``_cpu.py`` of ``commit``, importable outside the package."""
    src = git("show", f"{commit}:{REL}")
    src = src.replace("from ..._core.", "from knnkit._core.")
    path = os.path.join(tmp, "nnd_cpu_base.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("nnd_cpu_base", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["nnd_cpu_base"] = mod
    spec.loader.exec_module(mod)
    return mod


def capture(X, K):
    """The arguments of the descent the index build's candidate step makes on ``X``."""
    from knnkit.graph.nndescent import _cpu
    from knnkit.index._build import candidate_graph

    seen = []
    real = _cpu.nndescent

    def wrapped(Xw, K_, **kw):
        seen.append((Xw, K_, dict(kw)))
        return real(Xw, K_, **kw)

    _cpu.nndescent = wrapped
    try:
        candidate_graph(X, K, "sqeuclidean", random_state=0)
    finally:
        _cpu.nndescent = real
    Xw, K_, kw = seen[0]
    kw.pop("callback", None)  # the stall watch's probe: not part of the descent's cost
    kw.pop("reverse", None)
    return Xw, K_, kw


STEPS = ("_init_lists", "_sample_forward", "_sample_reverse", "_join_block", "_apply_block")


def timed(mod):
    """Wrap the module's Python-level steps with timers (the same for both modules, so the split
    of each is comparable); returns the dict they add their seconds to."""
    acc = {}
    for name in STEPS:
        fn = getattr(mod, name)

        def wrapper(*a, _fn=fn, _name=name, **kw):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **kw)
            finally:
                acc[_name] = acc.get(_name, 0.0) + time.perf_counter() - t0

        setattr(mod, name, wrapper)
    return acc


def exact_rows(X, rows, k):
    """Exact neighbours of X[rows] (self excluded): the CPU NN-Descent benchmark's."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_nn_descent_cpu import exact_rows as exact

    return exact(X, rows, k)


def lists_sha1(I, D):
    """sha1 of a graph: its distances' bytes, then its ids' (C order)."""
    h = hashlib.sha1()
    h.update(np.ascontiguousarray(D).tobytes())
    h.update(np.ascontiguousarray(I).tobytes())
    return h.hexdigest()


def recall_at(I, T):
    k = T.shape[1]
    return float(np.mean([len(set(a[:k].tolist()) & set(b.tolist())) for a, b in zip(I, T)]) / k)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", nargs="+", default=["tight_c10000", "uniform_d32", "sift_like_u8"])
    ap.add_argument("--base", default="HEAD", help="git commit of the 'before' module")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--eval", type=int, default=2000, help="rows whose recall@10 is measured")
    ap.add_argument("--out", default=None, help="append one JSON line per set")
    args = ap.parse_args()

    from knnkit.datasets import suite
    from knnkit.graph.nndescent import _cpu as new

    base_commit = git("rev-parse", args.base)
    with tempfile.TemporaryDirectory() as tmp:
        base = load_base(base_commit, tmp)
        split = {"base": timed(base), "new": timed(new)}
        for name in args.sets:
            make, K = SETS[name]
            X = make(suite)
            X = np.ascontiguousarray(X[0] if isinstance(X, tuple) else X, dtype=np.float32)
            Xw, K_, kw = capture(X, K)
            runs = {"base": [], "new": []}
            out = {}
            for label, mod in (("base", base), ("new", new)):
                out[label] = mod.nndescent_cpu(Xw, K_, **kw)  # warm (compile / cache load)
            steps = {"base": {}, "new": {}}
            for _ in range(args.repeats):
                for label, mod in (("base", base), ("new", new)):
                    split[label].clear()
                    t0 = time.perf_counter()
                    out[label] = mod.nndescent_cpu(Xw, K_, **kw)
                    runs[label].append(round(time.perf_counter() - t0, 3))
                    for k, v in split[label].items():
                        steps[label].setdefault(k.strip("_"), []).append(round(v, 3))
            (Ib, Db, sb), (In, Dn, sn) = out["base"], out["new"]
            rows = np.random.default_rng(1).choice(Xw.shape[0], min(args.eval, Xw.shape[0]), replace=False)
            T = exact_rows(Xw, rows, 10)
            same_ids = bool(np.array_equal(Ib, In))
            fin = np.isfinite(Db) & np.isfinite(Dn)
            rec = {
                "set": name, "n": int(Xw.shape[0]), "d": int(Xw.shape[1]), "K": int(K_),
                "sample": int(kw["sample"]), "delta": float(kw["delta"]), "max_iters": int(kw["max_iters"]),
                "init": kw.get("init_indices") is not None,
                "base_commit": base_commit[:12], "new_tree": git("rev-parse", "HEAD")[:12] + (
                    "+dirty" if git("status", "--porcelain", REL) else ""),
                "base_s": runs["base"], "new_s": runs["new"],
                "base_median_s": float(np.median(runs["base"])), "new_median_s": float(np.median(runs["new"])),
                "speedup_best": round(min(runs["base"]) / min(runs["new"]), 3),
                "speedup_median": round(float(np.median(runs["base"]) / np.median(runs["new"])), 3),
                "iterations": [int(sb["iterations"]), int(sn["iterations"])],
                "updates": [list(map(int, sb["updates"])), list(map(int, sn["updates"]))],
                "ids_identical": same_ids,
                "sha1": [lists_sha1(Ib, Db), lists_sha1(In, Dn)],
                "rows_differing": int((Ib != In).any(axis=1).sum()),
                "max_abs_dist_diff": float(np.abs(Db[fin] - Dn[fin]).max()) if fin.any() else 0.0,
                "recall10": [round(recall_at(Ib[rows], T), 5), round(recall_at(In[rows], T), 5)],
                "steps_s": steps,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            }
            print(json.dumps(rec), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
