"""Recall-QPS plot of ``bang_bench.py`` results (issue 16): one curve per knnkit search path (the
best and worst timed call of each beam, as a band, the median as the line) and one per cuVS IVF-PQ
+ refine run (``before`` / ``after`` knnkit's rows), from one or more result files of the same
process each (one panel per file: ratios are read within a panel, never across).

    python benchmarks/plot_bang.py OUT.png RESULT.json [RESULT.json ...]
"""

import collections
import json
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

#: what each ``--paths`` entry of the bench means, for the legend
PATH_NAMES = {
    "new-onecall": ("host gather, one call", "tab:blue"),
    "new-onecall-mapped": ("mapped (managed), one call", "tab:orange"),
    "new-onecall-mapped-pinned": ("mapped (page-locked), one call", "tab:purple"),
    "new": ("host gather, under the budget", "tab:green"),
    "new-mapped": ("mapped (managed), under the budget", "tab:red"),
    # s41: the re-rank on its batch's stream (the kept behaviour) where new-mapped had a priority stream
    "new-mapped-rrsame": ("mapped, under the budget, re-rank on the batch's stream", "tab:gray"),
    # the mapped walk by steps (one launch per kernel per step; before the fused bang_walk)
    "new-onecall-mapped-steps": ("mapped by steps, one call", "tab:olive"),
    "new-mapped-steps": ("mapped by steps, under the budget", "tab:brown"),
    # the fused walk loading tables made before it (before the blocks made their own)
    "new-onecall-mapped-loadtab": ("mapped, tables loaded, one call", "tab:pink"),
    "new-mapped-loadtab": ("mapped, tables loaded, under the budget", "tab:gray"),
    "new-mapped-coldpool": ("mapped, under the budget, pool emptied before the timed call", "tab:cyan"),
    # the thirty-ninth session's whole path, measured as it measured (pool emptied)
    "new-onecall-mapped-loadtab-rowsfirst-einsum-coldpool": ("the s39 path (tables loaded, rows buffered, einsum)",
                                                             "tab:olive"),
}


def curves(rows):
    """``{path: [(recall, low, median, high)]}`` of knnkit's timed rows (``--busy`` rows left out)
    and ``{when: [(recall, qps)]}`` of IVF-PQ's, each sorted by recall."""
    knn = collections.defaultdict(lambda: collections.defaultdict(list))
    recall = {}
    peer = collections.defaultdict(list)
    for r in rows:
        if r.get("method") == "knnkit-host" and "busy" not in r:
            knn[r["path"]][r["beam"]].append(r["qps"])
            recall[(r["path"], r["beam"])] = r["recall"]
        elif str(r.get("method", "")).startswith("cuvs-ivfpq"):
            peer[r.get("when", "after")].append((r["recall"], r["qps"]))
    out = {}
    for path, by_beam in knn.items():
        pts = []
        for beam, q in by_beam.items():
            pts.append((recall[(path, beam)], min(q), statistics.median(q), max(q)))
        out[path] = sorted(pts)
    return out, {w: sorted(v) for w, v in peer.items()}


def panel(ax, res, title):
    knn, peer = curves(res["rows"])
    for path, pts in knn.items():
        x = [p[0] for p in pts]
        name, color = PATH_NAMES.get(path, (path, None))
        line, = ax.plot(x, [p[2] for p in pts], "o-", label=name, color=color)
        ax.fill_between(x, [p[1] for p in pts], [p[3] for p in pts], color=line.get_color(), alpha=0.2)
    for when, pts in peer.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "s--", color="black" if when == "after" else "gray",
                label=f"cuVS IVF-PQ + refine ({when} knnkit)")
    ax.axvline(0.90, color="red", lw=0.8, alpha=0.5)
    ax.set_xlabel("recall@10")
    ax.set_ylabel("queries per second")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def main(dst, srcs):
    fig, axes = plt.subplots(1, len(srcs), figsize=(6 * len(srcs), 4.5), squeeze=False)
    for ax, src in zip(axes[0], srcs):
        res = json.load(open(src))
        p = res["params"]
        mem = res.get("memory", {})
        title = (f"{res['machine']['gpu']}: {p['n'] / 1e6:g}M x {p['d']} {p['data']}, {p['queries']:,} queries, "
                 f"W = {p['widths']}\nbudget {mem.get('budget_bytes', 0) / 1e9:.2f} GB "
                 f"(1/{p['budget_ratio']:g} of graph + vectors), {src.split('/')[-2]}")
        panel(ax, res, title)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2:])
