"""Merge per-set robustness runs of two code versions (run back to back per set, the same
machine) into one paired JSON + markdown table (issue 11, CPU uniform 960-d follow-up).

    python benchmarks/robustness_pair.py --before $OUT/rb/base_ --after $OUT/rb/new_ \
        --label-before edfb1d5 --label-after h-cpu960 --out benchmarks/results/cpu/robustness_small_2026-11-26_cpu960
"""
import argparse
import glob
import json

from robustness import _fmt as _f  # the suite's own cell format (this script sits beside it)


def _load(prefix):
    out = {}
    for path in sorted(glob.glob(prefix + "*/cpu_*.json")):
        doc = json.load(open(path))
        for s in doc["sets"]:
            out[s["name"]] = (doc, s)
    return out


def _row(s):
    k = s.get("knnkit", {})
    st = k.get("index_build_stats", {})
    cal = st.get("calibration") or {}
    t = k.get("target_0.99") or {}
    cand = st.get("candidates") or {}
    return {
        "build_s": k.get("index_build_s"), "phases": k.get("index_build_phases_s"),
        "candidates": cand.get("method", "nndescent?"), "cand_est": cand.get("recall_estimate"),
        "default_beam": k.get("default_beam"), "rec_default": k.get("recall_default_beam"),
        "rec_default_strict": k.get("recall_default_beam_strict"), "max": k.get("max_recall"),
        "q95": k.get("qps_at_0.95"), "q99": k.get("qps_at_0.99"),
        "cal_last": (cal.get("beams", [None])[-1], cal.get("recall", [None])[-1]), "cal_how": cal.get("held_out", "cut"),
        "t99": (t.get("recall"), t.get("qps"), t.get("exact_scan"), t.get("beam"), t.get("recall_strict")),
        "curve": k.get("curve"), "curve_strict": k.get("curve_strict"), "calibration": cal,
        "graph_degree": k.get("graph_degree"), "n_entry": k.get("n_entry"),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--label-before", default="before")
    ap.add_argument("--label-after", default="after")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    B, A = _load(a.before), _load(a.after)
    names = [n for n in A if n in B]
    doc = {"before": a.label_before, "after": a.label_after, "sets": {}}
    lines = [f"# CPU robustness suite, small scale: {a.label_before} (before) vs {a.label_after} (after)", "",
             "Each set run by both versions back to back on the same shared 2-core machine (index columns only: "
             "`robustness.py --scale small --no-peers --no-graph`), 1,000 queries (siftsmall 100), k = 10. "
             "Recall: ann-benchmarks ties (relative 1e-3 on the distance), as the suite; *strict*: ties within "
             "1e-6 only (the calibration's own rule). Build times are noisy (other sessions shared the machine).", "",
             "| set | n × d | candidates (after) | build s | default beam | recall @ default (strict) | max recall "
             "| QPS@0.95 | QPS@0.99 | calibrated recall at last beam | target 0.99: recall (QPS, how) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        sb, sa = B[n][1], A[n][1]
        rb, ra = _row(sb), _row(sa)
        doc["sets"][n] = {"n": sa["n"], "d": sa["d"], "metric": sa["metric"], "before": rb, "after": ra}

        def pair(key, nd=3):
            return f"{_f(rb[key], nd)} → {_f(ra[key], nd)}"

        def t99(r):
            rec, q, ex, beam, strict = r["t99"]
            if rec is None:
                return "—"
            return f"{_f(rec)} ({_f(q)}, {'exact' if ex else f'beam {beam}'})"

        cand = ra["candidates"] + (f" (est. {ra['cand_est']:.2f})" if ra["cand_est"] is not None else "")
        lines.append("| " + " | ".join([
            n, f"{sa['n']} × {sa['d']}", cand, pair("build_s", 1), pair("default_beam"),
            f"{_f(rb['rec_default'])} ({_f(rb['rec_default_strict'])}) → {_f(ra['rec_default'])} ({_f(ra['rec_default_strict'])})",
            pair("max"), pair("q95"), pair("q99"),
            f"{_f(rb['cal_last'][1])} @ {rb['cal_last'][0]} ({rb['cal_how']}) → "
            f"{_f(ra['cal_last'][1])} @ {ra['cal_last'][0]} ({ra['cal_how']})",
            f"{t99(rb)} → {t99(ra)}"]) + " |")
    lines += ["", "candidates: how the index's candidate lists were made after the change (nndescent; brute below "
              "INDEX_BRUTE_MAX_N or when NN-Descent stalled, with the descent's estimated recall@10). "
              "Curves per beam (recall, QPS and strict recall) and the calibrations are in the JSON."]
    with open(a.out + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
