"""The copy-share study's reading: for each freq-at-0.5 pair the recipe's gap analysis wrote
(WORK/gap_analysis/pattern_freq_scratch.json), the relative gap on all test sentences (G_all), on those whose
reference copies at most a quarter of its words from the source (G_low), and the share of the loss the copying holds,
S = (G_all - G_low) / G_all; then the decision rule of README.md as committed. RUNS holds the studies' work dirs
(layers/, depth/, depth1700/, width/, heads/, merge/); the table is printed and results.json written to DEST.

    python summarise.py RUNS DEST
"""
import json
import os
import sys

#: (study folder, work dir, what the pair is): the pairs the rule reads, then the exploratory ones
READ = [("layers", "3x3_s1", "3+3 pre-norm, 850"), ("layers", "3x3_s2", "3+3 pre-norm, 850"),
        ("layers", "6x1_s1", "6+1 pre-norm, 850"), ("layers", "6x1_s2", "6+1 pre-norm, 850"),
        ("depth", "6x3_s1", "6+3 pre-norm, 850"), ("depth", "6x3_s2", "6+3 pre-norm, 850"),
        ("depth1700", "3x3_s1", "3+3 pre-norm, 1,700"), ("depth1700", "6x3_s1", "6+3 pre-norm, 1,700"),
        ("depth1700", "3x3_s2", "3+3 pre-norm, 1,700"), ("depth1700", "6x3_s2", "6+3 pre-norm, 1,700"),
        ("width", "x256_s1", "3+3 x256 post-norm, 850"), ("width", "x256_s2", "3+3 x256 post-norm, 850"),
        ("heads", "h8_s1", "3+3, 8 heads, 850"), ("heads", "h8_s2", "3+3, 8 heads, 850")]
EXPLORATORY = [("merge", "f0.25_s1", "3+3 post-norm, 850"), ("merge", "f0.25_s2", "3+3 post-norm, 850")]
LOW = "up to 25%"


def pair(runs, study, work, what):
    """One pair's row, or None where its gap analysis is missing or (1,700) not yet at update 1,700."""
    path = os.path.join(runs, study, work, "gap_analysis", "pattern_freq_scratch.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        r = json.load(f)
    if "1,700" in what and "_1700" not in r["control_checkpoint"]:
        return None
    g_all, g_low = 100 * r["overall"]["relative_gap"], 100 * r["by_copy_share"][LOW]["relative_gap"]
    buckets = {k: round(100 * v["relative_gap"], 1) for k, v in r["by_copy_share"].items()}
    lengths = {k: round(100 * v["relative_gap"], 1) for k, v in r["by_length"].items()}
    return {"pair": f"{study}/{work}", "what": what, "stock": r["overall"]["control"], "drop": r["overall"]["method"],
            "G_all": round(g_all, 1), "G_low": buckets[LOW], "G_over": buckets["over 25%"], "G_none": buckets["none"],
            "S": round(100 * (g_all - g_low) / g_all, 1),
            "sentences": {k: v["sentences"] for k, v in r["by_copy_share"].items()}, "G_by_length": lengths}


def verdict(rows):
    """The rule of README.md: mean S >= 30 and S > 0 on at least three in four pairs, <= 10, or undecided."""
    mean_s = sum(r["S"] for r in rows) / len(rows)
    positive = sum(r["S"] > 0 for r in rows)
    if mean_s >= 30 and 4 * positive >= 3 * len(rows):
        word = "the copying holds a share of the loss"
    elif mean_s <= 10:
        word = "the copying does not hold the loss"
    else:
        word = "undecided"
    return {"pairs": len(rows), "mean_S": round(mean_s, 1), "pairs_S_positive": positive,
            "mean_G_all": round(sum(r["G_all"] for r in rows) / len(rows), 1),
            "mean_G_low": round(sum(r["G_low"] for r in rows) / len(rows), 1), "verdict": word}


def main(runs, dest):
    if not os.path.isdir(dest):
        sys.exit(f"summarise.py: DEST {dest} is not a folder")
    read = [r for r in (pair(runs, *p) for p in READ) if r]
    if not read:
        sys.exit(f"summarise.py: no pair's gap analysis under {runs}")
    explored = [r for r in (pair(runs, *p) for p in EXPLORATORY) if r]
    print("| pair | model | stock | drop | G all | G up to 25% copied | S | G over 25% | G none |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in read + explored:
        tag = " (exploratory)" if r in explored else ""
        print(f"| {r['pair']}{tag} | {r['what']} | {r['stock']} | {r['drop']} | {r['G_all']} | {r['G_low']} | "
              f"{r['S']}% | {r['G_over']} | {r['G_none']} |")
    out = {"rule": verdict(read), "read": read, "exploratory": explored}
    print(json.dumps(out["rule"]))
    with open(os.path.join(dest, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
