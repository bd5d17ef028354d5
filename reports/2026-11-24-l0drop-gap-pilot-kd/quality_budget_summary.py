#!/usr/bin/env python3
"""One table and one plot over the work dirs of quality_budget.sh (this folder): every method's gap to its
equal-updates control at each budget point, without and with distillation, per seed (each work dir's
results.json, as its REPORT.md shows it), and the mean over seeds.

    .venv/bin/python reports/2026-11-24-l0drop-gap-pilot-kd/quality_budget_summary.py OUT
    # writes OUT/SUMMARY.md, OUT/gap.png

or over any recipe work dirs, each under a label (e.g. variants of one method against one control; the seed is
each run's --seed):

    .venv/bin/python reports/2026-11-24-l0drop-gap-pilot-kd/quality_budget_summary.py OUT zero=WORK1 mask=WORK2 ...
"""
import glob
import logging
import os
import re
import sys

logging.getLogger("matplotlib").setLevel(logging.WARNING)  # before matplotlib is imported: its font cache logs
from fairseq_sparse.analysis.plotting import line_plot  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lab"))
from studies import StudyError, budget_rows, means, read_results  # noqa: E402  (lab/studies.py)

RUN = re.compile(r"kd(?P<distill>[\d.]+)_seed(?P<seed>\d+)$")


def budget_results(work):
    """A work dir's results.json if it has a budget table, else None."""
    try:
        results = read_results(work)
    except StudyError as e:
        sys.exit(f"quality_budget_summary: cannot read {e}")
    return results if results and results.get("budget") else None


def runs(out, labelled=()):
    """[(label, seed, results)] of every finished work dir (a results.json with a budget): the ``LABEL=DIR`` of
    ``labelled``, or else quality_budget.sh's kd<W>_seed<S> dirs under OUT (label: the distillation weight)."""
    found = []
    for item in labelled:
        label, _, work = item.partition("=")
        if not (label and work):
            sys.exit(f"quality_budget_summary: {item!r} is not LABEL=WORK_DIR")
        results = budget_results(work)
        if results is None:
            sys.exit(f"quality_budget_summary: {work} has no results.json with a budget table (run its report)")
        found.append((label, int(results["settings"]["seed"]), results))
    for work in [] if labelled else sorted(glob.glob(os.path.join(out, "kd*_seed*"))):
        m, results = RUN.search(work), budget_results(work)
        if m and results:
            found.append((f"KD {float(m['distill']):g}", int(m["seed"]), results))
    return found


def budget_points(found):
    """Every budget point of every run (studies.budget_rows), with its run's label and seed."""
    return [{**p, "label": label, "seed": seed} for label, seed, results in found for p in budget_rows(results)]


def sparsity(point):
    """The share of source states pruned, or of heads closed, at a budget point ("-" where neither)."""
    if point.get("source_states_pruned") is not None:
        return f"{100 * point['source_states_pruned']:.1f}% of the states"
    if point.get("heads_closed") is not None:
        return f"{100 * point['heads_closed']:.1f}% of the heads"
    return "-"


def rows(found):
    """Markdown rows: method, label, updates, then per seed control / method / gap (p) / sparsity."""
    points = budget_points(found)
    lines = []
    for (method, label, updates), mean in means(points, ("model", "label", "updates"), ("gap",)).items():
        cells = [f"{p['control_score']:.2f} / {p['score']:.2f} / {p['gap']:+.2f} (p = {p['p_value']}) / "
                 f"{sparsity(p)} (seed {p['seed']})"
                 for p in sorted((p for p in points if (p["model"], p["label"], p["updates"]) == (method, label, updates)),
                                 key=lambda p: p["seed"])]
        lines.append(f"| {method} | {label} | {updates} | {'<br>'.join(cells)} | {mean['gap']:+.2f} |")
    return lines


def series(found):
    """(label, updates, mean gap over seeds) per method and run label, for the plot."""
    gaps = {}
    for (method, label, updates), mean in means(budget_points(found), ("model", "label", "updates"), ("gap",)).items():
        gaps.setdefault((method, label), []).append((updates, mean["gap"]))
    return [(f"{method}, {label}", [u for u, _ in pts], [g for _, g in pts]) for (method, label), pts in gaps.items()]


def main(out, labelled=()):
    found = runs(out, labelled)
    if not found:
        sys.exit(f"quality_budget_summary: no finished work dir (kd*_seed*/results.json with a budget) in {out}")
    os.makedirs(out, exist_ok=True)
    header = ["| method | run | updates | control / method BLEU / gap (paired bootstrap p) / sparsity, per seed "
              "| mean gap |", "|---|---|---|---|---|"]
    with open(os.path.join(out, "SUMMARY.md"), "w") as f:
        f.write("\n".join(header + rows(found)) + "\n")
    line_plot(series(found), os.path.join(out, "gap.png"), "BLEU gap to the equal-updates control",
              "fine-tuning updates", "BLEU (method - control)")
    print(open(os.path.join(out, "SUMMARY.md")).read())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
