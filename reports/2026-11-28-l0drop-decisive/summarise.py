"""The decisive study's summary from its work dirs (OUT/f<fraction>_s<seed>/results.json, written by the recipe's
report step): every from-scratch model against the stock baseline at each budget point, per seed, the relative gap
G = (model - stock) / stock and its mean over seeds, the gap analysis of each pair; summary.json and a plot of G
against the budget, next to this script.

    python summarise.py OUT
"""
import json
import os
import re
import statistics
import sys

from fairseq_sparse.analysis.plotting import line_plot

HERE = os.path.dirname(os.path.abspath(__file__))


def pairs(out):
    """[(fraction, seed, results)] of every work dir with a results.json, in name order."""
    found = []
    for name in sorted(os.listdir(out)):
        m = re.fullmatch(r"f([\d.]+)_s(\d+)", name)
        path = os.path.join(out, name, "results.json")
        if m and os.path.exists(path):
            with open(path) as f:
                found.append((float(m.group(1)), int(m.group(2)), json.load(f)))
    return found


def gap_summary(g):
    """The gap analysis of one pair, the figures the report quotes."""
    return {"sparsity": g["sparsity"], "overall": g["overall"], "by_segment_type": g.get("by_segment_type"),
            "by_length": g["by_length"], "length_ratio": {k: g["brevity"][k]["ratio"] for k in ("method", "control")},
            "bp": {k: g["brevity"][k]["bp"] for k in ("method", "control")},
            "copy_recall": g["copy_recall"], "nll": g["nll"]}


def summarise(out):
    rows, analyses = [], {}
    for fraction, seed, r in pairs(out):
        for model, points in r.get("budget", {}).items():
            if not model.endswith("_scratch"):
                continue
            for p in points:
                rows.append({"fraction": fraction, "seed": seed, "model": model, "updates": p["updates"],
                             "stock": p["control_score"], "score": p["score"], "gap": p["gap"],
                             "relative_gap": round(p["gap"] / p["control_score"], 4) if p["control_score"] else None,
                             "p_value": p["p_value"], "sparsity": p["l0drop_sparsity"]})
        for model, g in r.get("gap_analysis", {}).items():
            analyses[f"f{fraction:g}_s{seed}/{model}"] = gap_summary(g)
    means = {}
    for key in sorted({(x["fraction"], x["model"], x["updates"]) for x in rows}):
        sel = [x for x in rows if (x["fraction"], x["model"], x["updates"]) == key]
        rel = [x["relative_gap"] for x in sel if x["relative_gap"] is not None]
        means[f"f{key[0]:g}/{key[1]}@{key[2]}"] = {
            "seeds": sorted(x["seed"] for x in sel), "stock": round(statistics.mean(x["stock"] for x in sel), 2),
            "score": round(statistics.mean(x["score"] for x in sel), 2),
            "gap": round(statistics.mean(x["gap"] for x in sel), 2),
            "relative_gap": round(statistics.mean(rel), 4) if rel else None}
    return {"rows": rows, "means": means, "gap_analysis": analyses}


def main():
    summary = summarise(sys.argv[1])
    with open(os.path.join(HERE, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    series = {}
    for x in summary["rows"]:
        series.setdefault(f"{x['model']}, {x['fraction']:g} of the pairs, seed {x['seed']}", []).append(x)
    line_plot([(label, [x["updates"] for x in xs], [100 * x["relative_gap"] for x in xs]) for label, xs in series.items()],
              os.path.join(HERE, "relative_gap_vs_updates.png"),
              "trained from scratch beside the stock model, DDTP en-de, 3+3 x 128, CPU",
              "updates (both models)", "relative BLEU gap to stock (%)")
    print("| pairs | model | updates | seed | stock BLEU | model BLEU | gap | relative | p | sparsity |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for x in summary["rows"]:
        print(f"| {x['fraction']:g} | {x['model']} | {x['updates']} | {x['seed']} | {x['stock']:.2f} | {x['score']:.2f} "
              f"| {x['gap']:+.2f} | {x['relative_gap']:+.1%} | {x['p_value']} | {x['sparsity']:.1%} |")
    for key, m in summary["means"].items():
        print(f"mean {key} over seeds {m['seeds']}: {m['stock']} -> {m['score']} ({m['gap']:+}, {m['relative_gap']:+.1%})")


if __name__ == "__main__":
    main()
