"""E2's summary (3+3 against 6+1) from the study's work dirs (OUT/3x3_s<seed>, OUT/6x1_s<seed>): each arm's stock
model and freq rule at its budget point (the merge study's reader: G, chrF, repeated trigrams, NLL, copy recall),
E = G_6+1 - G_3+3 per seed and the decision rule of README.md as committed (2045d0c); results.json next to this
script (DEST), and the markdown table printed. The encoder-depth study (3+3 against 6+3, the same rule) is read
with DEEP 6x3, its DEST that study's folder and NAME its JSON (results_1700.json: its second reading).

    python summarise.py OUT [DEST [DEEP [NAME]]]
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
_spec.loader.exec_module(merge)  # the merge study's reader of a work dir's rows (seed_rows), one implementation

#: the rule (README.md, commit 2045d0c): readable at 0.9x stock's BLEU; E thresholds on the mean and per seed
READABLE, DEPTH_E, SEED_E, NO_DEPTH_E = 0.9, 10.0, 5.0, 5.0
RULE = "pattern_freq_scratch"


def per_seed(found, deep="6x1"):
    """{seed: {stock BLEU of each arm, G of each arm, E, readable}} of every seed with both arms."""
    out = {}
    seeds = set(found.get("3x3_", {})) & set(found.get(f"{deep}_", {}))
    for seed in sorted(seeds):
        a, b = found["3x3_"][seed], found[f"{deep}_"][seed]
        if not all(RULE in r and "stock" in r for r in (a, b)):
            continue
        g33, gdeep = a[RULE]["relative_gap_points"], b[RULE]["relative_gap_points"]
        out[seed] = {"stock_3x3": a["stock"]["score"], f"stock_{deep}": b["stock"]["score"], "G_3x3": g33,
                     f"G_{deep}": gdeep, "E": round(gdeep - g33, 2),
                     "readable": b["stock"]["score"] >= READABLE * a["stock"]["score"]}
    return out


def read_rule(seeds, deep="6x1"):
    """The rule of README.md on the readable seeds (the encoder-depth study's README for deep="6x3": the same rule)."""
    arm = deep.replace("x", "+")
    readable = {s: e for s, e in seeds.items() if e["readable"]}
    if not readable:
        return f"not read: no seed where the {arm} stock model reaches 0.9x the 3+3 one's BLEU"
    if len(seeds) < 2:
        return f"not read: {len(seeds)} seed(s) of the two the rule needs"
    E = statistics.mean(e["E"] for e in readable.values())
    G = statistics.mean(e["G_3x3"] for e in readable.values())
    if E >= DEPTH_E and all(e["E"] >= SEED_E for e in readable.values()):
        verdict = "depth keeps the content (a deeper encoder routes what a 3-layer one does not)"
    elif E <= NO_DEPTH_E:
        verdict = "depth does not hold the loss at this size"
    else:
        verdict = "undecided: a third seed"
    return {"E_mean": round(E, 2), "depth_share": round(E / abs(G), 3) if G else None, "verdict": verdict,
            "seeds_read": sorted(readable)}


def main(out, dest=HERE, deep="6x1", name="results.json"):
    found = {k: v for k, v in merge.seed_rows(out).items() if k in ("3x3_", f"{deep}_")}
    seeds = per_seed(found, deep)
    summary = {"rows": found, "seeds": seeds, "rule": read_rule(seeds, deep)}
    summary["headline"] = {f"{k}_seed{s}": v for s, e in seeds.items() for k, v in e.items() if k != "readable"}
    probes = ["| arm | seed | recovered from the kept states | from the kept embeddings (floor) | the states add (bits) |",
              "|---|---|---|---|---|"]
    for prefix, by_seed in sorted(found.items()):
        for seed, rows in sorted(by_seed.items()):
            p = rows.get(RULE, {}).get("content_probe")
            if p:  # probe.sh of the merge study on this arm's dropping model
                arm = prefix.rstrip("_")
                summary["headline"][f"probe_accuracy_pct_{arm}_seed{seed}"] = round(100 * p["states"]["accuracy"], 1)
                summary["headline"][f"probe_gain_bits_{arm}_seed{seed}"] = round(p["gain_bits"], 2)
                probes.append(f"| {arm} | {seed} | {100 * p['states']['accuracy']:.1f}% | "
                              f"{100 * p['embeddings']['accuracy']:.1f}% | {p['gain_bits']:+.2f} |")
    with open(os.path.join(dest, name), "w") as f:
        json.dump(summary, f, indent=1)
    print(merge.markdown(summary).split("\n\n")[0] + "\n\n" + "\n".join(probes))
    print(json.dumps(seeds, indent=1), summary["rule"] if isinstance(summary["rule"], str) else summary["rule"]["verdict"])
    return summary


if __name__ == "__main__":
    if not 2 <= len(sys.argv) <= 5:
        sys.exit(__doc__)
    if len(sys.argv) > 3 and sys.argv[3] not in ("6x1", "6x3"):
        sys.exit(f"DEEP must be 6x1 or 6x3, not {sys.argv[3]!r}\n{__doc__}")
    if len(sys.argv) > 2 and not os.path.isdir(sys.argv[2]):
        sys.exit(f"DEST {sys.argv[2]!r} is not a folder")
    main(*sys.argv[1:])
