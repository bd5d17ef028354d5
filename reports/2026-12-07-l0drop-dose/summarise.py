"""The dose study's summary: the freq rule's relative gap G against the share p of source states it prunes (0.1 and
0.25 from OUT/r<rate>_s<seed>, 0.5 from the merge study's SOURCE/f0.25_s<seed>), merging at 0.1, the whole-word rule
at 0.5, each against its seed's stock model at update 850, and the decision rule of README.md as committed (48e74b4);
results.json and the plot of G against p next to this script, the table printed.

    SEEDS="1 2" python summarise.py SOURCE OUT [DEST]      (SEEDS: default 1; with two, rule 1 on their mean too)
"""
import importlib.util
import json
import os
import statistics
import sys

from fairseq_sparse.analysis.plotting import line_plot
from fairseq_sparse.analysis.scores import paired_bootstrap

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "merge_summary", os.path.join(HERE, "..", "2026-12-07-l0drop-merge", "summarise.py"))
merge = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(merge)  # the merge study's reader of a work dir's rows (seed_rows, decoding, markdown)
merge.NAMES["pattern_freq_words_scratch"] = "freq rule, whole words, drop"

#: the rule (README.md, commit 48e74b4): front-loaded at twice the line and 10 points; the proportional band; merge and
#: whole-word thresholds
FRONT_FACTOR, FRONT_POINTS, BAND, KEEPS, KEEPS_NOT = 2.0, -10.0, 2.7, 6.0, 3.0
DROP, MERGE, WORDS = "pattern_freq_scratch", "pattern_freq_merge_mean_scratch", "pattern_freq_words_scratch"


def points(source, out, seed):
    """{(model, rate): row} of one seed: the dose work dirs' models and the merge study's at 0.5."""
    found, read = {}, {folder: merge.seed_rows(folder) for folder in (source, out)}  # each work dir read once
    for folder, prefix, rate in ((out, "r0.1_", 0.1), (out, "r0.25_", 0.25), (source, "f0.25_", 0.5)):
        rows = read[folder].get(prefix, {}).get(seed, {})
        for model in (DROP, MERGE, WORDS):
            if model in rows and (model != MERGE or rate == 0.1):
                found[(model, rate)] = dict(rows[model], work=os.path.join(folder, f"{prefix}s{seed}"))
        if "stock" in rows:
            found[("stock", rate)] = rows["stock"]
    return found


def curve(drops, p):
    """The dose curve at P: piecewise linear through (0, 0) and the measured drops [(p, G)] (the last segment
    extended past the largest p)."""
    pts = [(0.0, 0.0)] + sorted(drops)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if p <= x1 or (x1, y1) == pts[-1]:
            return y0 + (y1 - y0) * (p - x0) / (x1 - x0)
    return None


def against(a, b):
    """Paired bootstrap of B against A on the same test sentences ('identical' where the outputs are)."""
    da, db = (merge.decoding(r["work"], r["model"]) for r in (a, b))
    if da is None or db is None:
        return None
    return "identical" if da["hypotheses"] == db["hypotheses"] else paired_bootstrap(
        da["hypotheses"], db["hypotheses"], da["references"])


def dose_shape(p1, g1, p5, g5):
    """Rule 1 on the drops at 0.1 (share P1, gap G1) and 0.5 (P5, G5): the 0.1 point against the line through the
    0.5 point."""
    line = g5 * p1 / p5
    shape = ("front-loaded" if g1 <= FRONT_FACTOR * line and g1 <= FRONT_POINTS else
             "proportional" if g1 >= line - BAND else "undecided: seed 2")
    return {"G_0.1": g1, "p_0.1": p1, "line_at_p_0.1": round(line, 2),
            "cost_per_point_ratio": round((g1 / p1) / (g5 / p5), 2), "verdict": shape}


def mean_dose(seeds):
    """Rule 1 on the seeds' mean shares and gaps (README.md, seed 2's rule), or None with fewer than two seeds."""
    points = [(r["points"][f"{DROP}@0.1"], r["points"][f"{DROP}@0.5"]) for r in seeds.values()
              if f"{DROP}@0.1" in r["points"] and f"{DROP}@0.5" in r["points"]]
    if len(points) < 2:
        return None
    means = [round(statistics.mean(p[at][k] for p in points), 4) for at in (0, 1)
             for k in ("source_states_pruned", "relative_gap_points")]
    return dict(dose_shape(*means), seeds=len(points))


def read_rules(found):
    """The three rules of README.md on one seed's points (each 'not read' where a point is missing)."""
    g = {k: (r["source_states_pruned"], r["relative_gap_points"]) for k, r in found.items() if k[0] != "stock"}
    out = {}
    if (DROP, 0.1) in g and (DROP, 0.5) in g:
        out["dose"] = dose_shape(*g[(DROP, 0.1)], *g[(DROP, 0.5)])
    if (DROP, 0.1) in g and (MERGE, 0.1) in g:
        m = round(g[(MERGE, 0.1)][1] - g[(DROP, 0.1)][1], 2)
        out["merge_at_0.1"] = {"M": m, "merge_vs_drop": against(found[(DROP, 0.1)], found[(MERGE, 0.1)]), "verdict":
                               "merging keeps what those states do" if m >= KEEPS and m >= abs(g[(DROP, 0.1)][1]) / 2
                               else "it does not" if m <= KEEPS_NOT else "undecided: seed 2"}
    drops = [v for k, v in g.items() if k[0] == DROP]
    if (WORDS, 0.5) in g and len(drops) == 3:
        pw, gw = g[(WORDS, 0.5)]
        at = curve(drops, pw)
        w = round(gw - at, 2)
        out["whole_words"] = {"p_w": pw, "G_w": gw, "curve_at_p_w": round(at, 2), "W": w, "verdict":
                              "split words hold a share of the loss" if w >= KEEPS else
                              "they do not" if w <= KEEPS_NOT else "undecided: seed 2"}
    return out


def attention(out, seed):
    """{rate: the stock model's summed encoder-decoder attention per source piece (mean over the test pieces), on the
    pieces the rule at that rate prunes and on those it keeps} (run.sh attention)."""
    found = {}
    for rate in (0.1, 0.25, 0.5):
        path = os.path.join(out, "attention", f"stock_s{seed}_rule{rate}", "attention.json")
        if os.path.exists(path):
            with open(path) as f:
                a = json.load(f)["l0drop"]
            found[rate] = {"pruned_share": round(a["sparsity"], 4), **{
                f"summed_attention_{k}": round(a["summed_attention"][k]["mean"], 3) for k in ("kept", "pruned")}}
    return found


def probes(found):
    """{model@rate: the content probe's accuracy from the kept states and from the kept embeddings (%), the gain in
    bits} of every point with one (probe.sh of the merge study)."""
    return {f"{m}@{r}": {"states_pct": round(100 * p["states"]["accuracy"], 1),
                         "embeddings_pct": round(100 * p["embeddings"]["accuracy"], 1),
                         "gain_bits": round(p["gain_bits"], 2)}
            for (m, r), row in found.items() for p in [row.get("content_probe")] if p}


def main(source, out, dest=HERE, seeds=(1,)):
    summary = {"seeds": {}}
    for seed in seeds:
        found = points(source, out, seed)
        summary["seeds"][seed] = {"points": {f"{m}@{r}": {k: v for k, v in row.items() if k != "work"}
                                             for (m, r), row in found.items()}, "rules": read_rules(found),
                                  "stock_attention": attention(out, seed), "content_probe": probes(found)}
        drop = sorted((r["source_states_pruned"] * 100, r["relative_gap_points"]) for (m, _), r in found.items()
                      if m == DROP)
        others = [(merge.NAMES[m], [100 * r["source_states_pruned"]], [r["relative_gap_points"]])
                  for (m, _), r in found.items() if m in (MERGE, WORDS)]
        line_plot([("freq rule, drop", [0] + [p for p, _ in drop], [0] + [y for _, y in drop])] + others,
                  os.path.join(dest, f"relative_gap_by_share_pruned_seed{seed}.png"),
                  f"the dose (3+3 x 128, quarter of DDTP en-de, 850 updates, seed {seed})",
                  "source states pruned (%)", "relative gap to stock (points)")
        tables = [merge.markdown({"rows": {f"rate {rate}, ": {seed: {m: r for (m, x), r in found.items() if x == rate}}}})
                  .split("\n\n")[0] for rate in (0.1, 0.25, 0.5)]
        print(f"seed {seed}:\n" + "\n".join([tables[0]] + [t.split("\n", 2)[2] for t in tables[1:] if t.count("\n") > 1]))
        print(json.dumps({k: summary["seeds"][seed][k] for k in ("rules", "stock_attention", "content_probe")},
                         indent=1, default=str))
    over_seeds = mean_dose(summary["seeds"])
    if over_seeds:
        summary["dose_over_seeds"] = over_seeds
        print("rule 1 on the seeds' mean:", summary["dose_over_seeds"])
    with open(os.path.join(dest, "results.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    main(*sys.argv[1:], seeds=tuple(int(s) for s in os.environ.get("SEEDS", "1").split()))
