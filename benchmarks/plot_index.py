"""Recall-QPS plot of a bench_api_gpu.py --task index result (knnkit per traversal and cuVS CAGRA),
or of a bench_real.py result (one curve per real data set).

    python benchmarks/plot_index.py RESULT.json OUT.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_real(r, dst):
    fig, ax = plt.subplots(figsize=(6, 4))
    for ds in r["results"]:
        rows = ds.get("index_curve", [])
        if rows:
            ax.plot([x["recall_at_10"] for x in rows], [x["qps"] for x in rows], "o-",
                    label=f"{ds['dataset']} ({ds['n']:,} x {ds['d']}, {ds['nq']:,} queries)")
    _finish(fig, ax, f"{r['gpu']}: knnkit GraphIndex on real data (beam sweep)", dst)


def _finish(fig, ax, title, dst):
    ax.set_yscale("log")
    ax.set_xlabel("recall@10")
    ax.set_ylabel("queries per second")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


def main(src, dst):
    r = json.load(open(src))
    if "results" in r:
        return plot_real(r, dst)
    fig, ax = plt.subplots(figsize=(6, 4))
    for trav in sorted({row["traversal"] for row in r["knnkit_curve"]}):
        rows = [x for x in r["knnkit_curve"] if x["traversal"] == trav]
        ax.plot([x["recall"] for x in rows], [x["qps"] for x in rows], "o-", label=f"knnkit GraphIndex ({trav} walk)")
    cu = [x for x in r.get("cuvs_cagra_curve", []) if "search_width" not in x]
    if cu:
        ax.plot([x["recall"] for x in cu], [x["qps"] for x in cu], "s--", label="cuVS CAGRA (degree 64, itopk sweep)")
    _finish(fig, ax, f"{r['gpu']}: {r['params']['n']:,} x {r['params']['d']}, {r['params']['queries']:,} queries, k=10",
            dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
