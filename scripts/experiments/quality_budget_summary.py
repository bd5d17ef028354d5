#!/usr/bin/env python3
"""One table and one plot over the work dirs of scripts/experiments/quality_budget.sh: every method's gap to its
equal-updates control at each budget point, without and with distillation, per seed (each work dir's
results.json, as its REPORT.md shows it), and the mean over seeds.

    .venv/bin/python scripts/experiments/quality_budget_summary.py OUT      # writes OUT/SUMMARY.md, OUT/gap.png
"""
import glob
import json
import logging
import os
import re
import statistics
import sys

from fairseq_sparse.analysis.plotting import line_plot

RUN = re.compile(r"kd(?P<distill>[\d.]+)_seed(?P<seed>\d+)$")


def runs(out):
    """[(distill weight, seed, results)] of every finished work dir under OUT (a results.json with a budget)."""
    found = []
    for work in sorted(glob.glob(os.path.join(out, "kd*_seed*"))):
        m, path = RUN.search(work), os.path.join(work, "results.json")
        if m and os.path.isfile(path):
            with open(path) as f:
                results = json.load(f)
            if results.get("budget"):
                found.append((float(m["distill"]), int(m["seed"]), results))
    return found


def budget_points(found):
    """(method, distill weight, seed, budget point) of every run's budget table."""
    for distill, seed, results in found:
        for method, points in results["budget"].items():
            for p in points:
                yield method, distill, seed, p


def rows(found):
    """Markdown rows: method, distillation, updates, then per seed control / method / gap (p) / sparsity."""
    table = {}
    for method, distill, seed, p in budget_points(found):
        table.setdefault((method, distill, p["updates"]), {})[seed] = p
    lines = []
    for (method, distill, updates), by_seed in sorted(table.items()):
        cells = [f"{p['control_score']:.2f} / {p['score']:.2f} / {p['gap']:+.2f} (p = {p['p_value']}) / "
                 + (f"{100 * p['l0drop_sparsity']:.1f}%" if p.get("l0drop_sparsity") is not None else "-")
                 + f" (seed {seed})" for seed, p in sorted(by_seed.items())]
        mean = statistics.mean(p["gap"] for p in by_seed.values())
        lines.append(f"| {method} | {distill:g} | {updates} | {'<br>'.join(cells)} | {mean:+.2f} |")
    return lines


def series(found):
    """(label, updates, mean gap over seeds) per method and distillation weight, for the plot."""
    gaps = {}
    for method, distill, _, p in budget_points(found):
        gaps.setdefault((method, distill), {}).setdefault(p["updates"], []).append(p["gap"])
    return [(f"{method}, KD {distill:g}" if distill else f"{method}, no KD", sorted(by_u),
             [statistics.mean(by_u[u]) for u in sorted(by_u)]) for (method, distill), by_u in sorted(gaps.items())]


def main(out):
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    found = runs(out)
    if not found:
        sys.exit(f"quality_budget_summary: no finished work dir (kd*_seed*/results.json with a budget) in {out}")
    header = ["| method | KD weight | updates | control / method BLEU / gap (paired bootstrap p) / sparsity, per seed "
              "| mean gap |", "|---|---|---|---|---|"]
    with open(os.path.join(out, "SUMMARY.md"), "w") as f:
        f.write("\n".join(header + rows(found)) + "\n")
    line_plot(series(found), os.path.join(out, "gap.png"), "BLEU gap to the equal-updates control",
              "fine-tuning updates", "BLEU (method - control)")
    print(open(os.path.join(out, "SUMMARY.md")).read())


if __name__ == "__main__":
    main(sys.argv[1])
