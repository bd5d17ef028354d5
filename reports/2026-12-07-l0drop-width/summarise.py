"""The width study's summary: each seed's stock model and freq rule at 0.5 at x256 (OUT/x256_s<seed>) against the
same seed's at x128 (the merge study's SOURCE/f0.25_s<seed>), through the merge study's reader of a work dir's rows
(G, chrF, repeated trigrams, NLL, copy recall); Delta = G_256 - G_128 per seed and the decision rule of README.md as
committed (2638ab1); results.json next to this script, the table printed.

    python summarise.py SOURCE OUT [DEST]
"""
import importlib.util
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "merge_summary", os.path.join(HERE, "..", "2026-12-07-l0drop-merge", "summarise.py"))
merge = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(merge)  # the merge study's reader of a work dir's rows (seed_rows, markdown)

#: the rule (README.md, commit 2638ab1): readable at 0.9x the x128 stock's BLEU; Delta thresholds on the mean and per seed
READABLE, WIDTH_D, SEED_D, NO_WIDTH_D = 0.9, 10.0, 5.0, 5.0
RULE = "pattern_freq_scratch"


def per_seed(narrow, wide, label="x256"):
    """{seed: {stock BLEU and G at x128 and at LABEL (the other shape), Delta, readable}} of every seed with both."""
    out = {}
    for seed in sorted(set(narrow) & set(wide)):
        a, b = narrow[seed], wide[seed]
        if not all(RULE in r and "stock" in r for r in (a, b)):
            continue
        g128, g = a[RULE]["relative_gap_points"], b[RULE]["relative_gap_points"]
        out[seed] = {"stock_x128": a["stock"]["score"], f"stock_{label}": b["stock"]["score"], "G_x128": g128,
                     f"G_{label}": g, "Delta": round(g - g128, 2), f"p_drop_vs_stock_{label}": b[RULE].get("p_value"),
                     f"pruned_{label}": b[RULE].get("source_states_pruned"),
                     "readable": b["stock"]["score"] >= READABLE * a["stock"]["score"]}
    return out


def read_rule(seeds, factor="width", label="x256"):
    """The rule of README.md on the readable seeds (FACTOR: what the other shape LABEL changes)."""
    readable = {s: e for s, e in seeds.items() if e["readable"]}
    if not readable:
        return f"not read: no seed where the {label} stock model reaches 0.9x the x128 one's BLEU"
    if len(seeds) < 2:
        return f"not read: {len(seeds)} seed(s) of the two the rule needs"
    delta = statistics.mean(e["Delta"] for e in readable.values())
    g = statistics.mean(e["G_x128"] for e in readable.values())
    if delta >= WIDTH_D and all(e["Delta"] >= SEED_D for e in readable.values()):
        verdict = f"{factor} holds a share of the loss"
    elif delta <= NO_WIDTH_D:
        verdict = f"{factor} does not hold the loss at this size"
    else:
        verdict = "undecided: a third seed"
    return {"Delta_mean": round(delta, 2), f"{factor}_share": round(delta / abs(g), 3) if g else None, "verdict": verdict,
            "seeds_read": sorted(readable)}


def main(source, out, dest=HERE, label="x256", factor="width"):
    """The summary of the work dirs OUT/<LABEL>_s<seed> against the merge study's x128 ones (the heads study calls it
    with its own LABEL, FACTOR and DEST)."""
    narrow, wide = merge.seed_rows(source).get("f0.25_", {}), merge.seed_rows(out).get(f"{label}_", {})
    seeds = per_seed(narrow, wide, label)
    summary = {"rows": {"x128 (merge study), ": {s: {m: narrow[s][m] for m in ("stock", RULE) if m in narrow[s]}
                                                 for s in seeds},
                        f"{label}, ": wide},
               "seeds": seeds, "rule": read_rule(seeds, factor, label)}
    with open(os.path.join(dest, "results.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(merge.markdown(summary).split("\n\n")[0])
    print(json.dumps(seeds, indent=1), summary["rule"] if isinstance(summary["rule"], str) else summary["rule"])
    return summary


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    main(*sys.argv[1:])
