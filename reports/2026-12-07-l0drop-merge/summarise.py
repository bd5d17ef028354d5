"""E1's summary (drop against merge) from the study's work dirs: every model against its seed's stock model at equal
updates (the recipe's budget point: G = relative gap, p), each merge against its drop on the same test sentences
(paired bootstrap, or "identical"), the decision rule of README.md applied as it was committed (8f3c0ca), chrF and
repeated trigrams, the gap analysis figures; results.json and a plot of G against the share pruned, next to this
script. Work dirs: OUT/<prefix>s<seed> with a results.json (f0.25_s1: the CPU runs; MRG_3x3_s1: the GPU call's).

    python summarise.py OUT [DEST]     # DEST: where results.json and the plot go (default: next to this script)
"""
import glob
import json
import os
import re
import statistics
import sys

from fairseq_sparse.analysis import gap
from fairseq_sparse.analysis.plotting import line_plot
from fairseq_sparse.analysis.scores import paired_bootstrap
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lab"))
from studies import budget_rows, read_results  # noqa: E402  (lab/studies.py)

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = re.compile(r"(.*?)s(\d+)")
#: (name, dropping model, merging model, primary): the contrasts the rule reads
CONTRASTS = [("freq rule, mean merge", "pattern_freq_scratch", "pattern_freq_merge_mean_scratch", True),
             ("freq rule, attention merge", "pattern_freq_scratch", "pattern_freq_merge_attention_scratch", False),
             ("learned gates, mean merge", "l0drop_scratch", "l0drop_merge_mean_scratch", False)]
#: the rule (README.md, commit 8f3c0ca): mean D, R, each seed's D and p; the reading threshold; equal kept counts
ROUTE_D, ROUTE_R, SEED_D, SEED_P, READING_D, KEPT_POINTS = 10.0, 0.5, 5.0, 0.05, 5.0, 3.0


def decoding(work, model):
    """The test decoding of MODEL's last checkpoint with pruned decoding as trained (WORK/results/*.json): the
    hypotheses and references, or None."""
    for path in sorted(glob.glob(os.path.join(work, "results", "*.json"))):
        with open(path) as f:
            kept = json.load(f)
        made = kept.get("produced_by", {})
        result = kept.get("result")
        if not isinstance(result, dict) or "hypotheses" not in result:
            continue
        if list(made.get("checkpoints", {})) == [f"{model}/checkpoint_last.pt"] and "pruned_decoding" not in json.dumps(
                made.get("settings")):
            return {"hypotheses": [h for h, _ in result["hypotheses"]], "references": result["references"]}
    return None


def stock_row(work, last):
    """The stock model at the models' budget point (WORK/results/baseline@UPDATES.json): its score, chrF and repeated
    trigrams, or None."""
    updates = {row["updates"] for row in last.values()}
    for u in sorted(updates, reverse=True):
        path = os.path.join(work, "results", f"baseline@{u}.json")
        if os.path.exists(path):
            with open(path) as f:
                result = json.load(f)["result"]
            hyps = [h for h, _ in result["hypotheses"]]
            return {"updates": u, "score": result["score"], "chrf": gap.chrf(hyps, result["references"]),
                    "repeated_trigrams": gap.repeated_ngrams(hyps)}
    return None


def seed_rows(out):
    """{prefix: {seed: {model: row}}} of every work dir: the budget row at its last point, chrF and repeated
    trigrams of its decoding, the gap analysis's NLL and copy recall."""
    found = {}
    for name in sorted(os.listdir(out)):
        m = WORK.fullmatch(name)
        results = read_results(os.path.join(out, name)) if m else None
        if results is None:
            continue
        work, rows = os.path.join(out, name), {}
        last = {}
        for row in budget_rows(results):
            if row["updates"] >= last.get(row["model"], {}).get("updates", -1):
                last[row["model"]] = row
        for model, row in last.items():
            row = dict(row, relative_gap_points=round(100 * row["relative_gap"], 2) if row["relative_gap"] is not None
                       else None)
            dec = decoding(work, model)
            if dec is not None:
                row.update(chrf=gap.chrf(dec["hypotheses"], dec["references"]),
                           repeated_trigrams=gap.repeated_ngrams(dec["hypotheses"]))
            analysis = os.path.join(work, "gap_analysis", f"{model}.json")
            if os.path.exists(analysis):
                with open(analysis) as f:
                    g = json.load(f)
                row.update(nll={k: {s: v[s]["nll_loss"] for s in ("train_sample", "valid")} for k, v in g["nll"].items()},
                           copy_recall={k: {s: c["recall"] for s, c in v.items()} for k, v in g["copy_recall"].items()},
                           length_ratio={k: v["ratio"] for k, v in g["brevity"].items()})
            probe = os.path.join(work, "probe", f"{model}.json")  # probe.sh: the content probe of this model
            if os.path.exists(probe):
                with open(probe) as f:
                    row["content_probe"] = json.load(f)
            rows[model] = row
        stock = stock_row(work, last)
        if stock:
            rows["stock"] = stock
        found.setdefault(m.group(1), {})[int(m.group(2))] = rows
    return found


def contrast(out, prefix, seeds, drop, merge):
    """Per seed: G of each, D = G_merge - G_drop, their pruned shares, merge against drop on the same sentences."""
    per_seed = {}
    for seed, rows in sorted(seeds.items()):
        if drop not in rows or merge not in rows:
            continue
        d, g = rows[drop], rows[merge]
        entry = {"G_drop": d["relative_gap_points"], "G_merge": g["relative_gap_points"],
                 "D": round(g["relative_gap_points"] - d["relative_gap_points"], 2),
                 "pruned_drop": d.get("source_states_pruned"), "pruned_merge": g.get("source_states_pruned")}
        work = os.path.join(out, f"{prefix}s{seed}")
        a, b = decoding(work, drop), decoding(work, merge)
        if a is not None and b is not None:
            if a["hypotheses"] == b["hypotheses"]:
                entry["merge_vs_drop"] = "identical"
            else:
                entry["merge_vs_drop"] = paired_bootstrap(a["hypotheses"], b["hypotheses"], a["references"])
        per_seed[seed] = entry
    return per_seed


def read_rule(per_seed, primary):
    """The rule of README.md on PER_SEED: 'merge is the route', 'the loss is in reading the slots', 'undecided', or
    why it is not read."""
    if len(per_seed) < 2:
        return f"not read: {len(per_seed)} seed(s) of the two the rule needs"
    shares = [(e["pruned_drop"], e["pruned_merge"]) for e in per_seed.values()]
    if not primary and any(a is None or b is None or abs(a - b) * 100 > KEPT_POINTS for a, b in shares):
        return "not read: the merging and dropping models prune shares more than 3 points apart"
    D = statistics.mean(e["D"] for e in per_seed.values())
    G = statistics.mean(e["G_drop"] for e in per_seed.values())
    R = D / abs(G) if G else None
    each = all(e["D"] >= SEED_D and isinstance(e.get("merge_vs_drop"), dict)
               and e["merge_vs_drop"]["p_value"] < SEED_P and e["merge_vs_drop"]["delta"] > 0 for e in per_seed.values())
    if R is not None and R >= ROUTE_R and D >= ROUTE_D and each:
        verdict = "merge is the route (the encoder does not route at this size)"
    elif D <= READING_D:
        verdict = "the loss is in reading the slots (merging does not recover it)"
    else:
        verdict = "undecided: a third seed"
    return {"D_mean": round(D, 2), "G_drop_mean": round(G, 2), "R": None if R is None else round(R, 3), "verdict": verdict}


def headline(summary, prefix="f0.25_"):
    """The figures README and the status table quote: per contrast of the CPU runs (PREFIX), the mean relative gaps
    of dropping and merging, D, the seeds; the content probe's gain per model (seed 1)."""
    out = {}
    for name, key in (("freq rule, mean merge", "mean"), ("freq rule, attention merge", "attention"),
                      ("learned gates, mean merge", "gates_mean")):
        c = summary["contrasts"].get(prefix + name)
        if not c:
            continue
        seeds = c["seeds"].values()
        out[f"seeds_{key}"] = len(c["seeds"])
        out[f"relative_gap_pct_drop_{key}"] = round(statistics.mean(e["G_drop"] for e in seeds), 1)
        out[f"relative_gap_pct_merge_{key}"] = round(statistics.mean(e["G_merge"] for e in seeds), 1)
        out[f"D_points_{key}"] = round(statistics.mean(e["D"] for e in seeds), 1)
        out[f"pruned_pct_{key}"] = round(100 * statistics.mean(e["pruned_merge"] for e in seeds), 1)
    for model, row in summary["rows"].get(prefix, {}).get(1, {}).items():
        if "content_probe" in row:
            out[f"probe_gain_bits_{model}"] = row["content_probe"]["gain_bits"]
            out[f"probe_accuracy_pct_{model}"] = round(100 * row["content_probe"]["states"]["accuracy"], 1)
    return out


NAMES = {"stock": "stock", "pattern_freq_scratch": "freq rule, drop", "pattern_freq_merge_mean_scratch":
         "freq rule, merge (mean)", "pattern_freq_merge_attention_scratch": "freq rule, merge (attention)",
         "l0drop_scratch": "learned gates, drop", "l0drop_merge_mean_scratch": "learned gates, merge (mean)"}


def markdown(summary):
    """The report's tables: every model per seed, and the content probe (printed; README.md quotes them)."""
    lines = ["| work dir | seed | model | BLEU | G (points) | pruned | chrF | repeated trigrams | length ratio | "
             "NLL train / valid | copied words split kept/pruned, recalled |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    probes = ["| seed | model | recovered from the kept states | bits | from the kept embeddings (floor) | bits | "
              "the states add (bits) |", "|---|---|---|---|---|---|---|"]
    for prefix, seeds in summary["rows"].items():
        for seed, rows in sorted(seeds.items()):
            for model in NAMES:
                r = rows.get(model)
                if r is None:
                    continue
                side, source = "method", r
                if model == "stock":  # its NLL and copy recall: the gap analyses' control (the same checkpoint), the
                    # recall on the words the first model of NAMES with a gap analysis split (the freq rule's)
                    side, source = "control", next((rows[x] for x in NAMES if rows.get(x, {}).get("nll")), {})
                nll = source.get("nll", {}).get(side)
                copy = source.get("copy_recall", {}).get(side)
                lines.append(
                    f"| {prefix}s{seed} | {seed} | {NAMES[model]} | {r['score']:.2f} | "
                    + (f"{r['relative_gap_points']:+.1f}" if r.get("relative_gap_points") is not None else "") + " | "
                    + (f"{100 * r['source_states_pruned']:.1f}%" if r.get("source_states_pruned") is not None else "")
                    + f" | {r.get('chrf', '')} | " + (f"{100 * r['repeated_trigrams']:.1f}%" if r.get("repeated_trigrams")
                                                      is not None else "")
                    + " | " + (f"{r['length_ratio']['method']:.3f}" if r.get("length_ratio") else "")
                    + " | " + (f"{nll['train_sample']:.3f} / {nll['valid']:.3f}" if nll else "")
                    + " | " + (f"{100 * copy['partly']:.1f}%" if copy and copy.get("partly") is not None else "")
                    + " |")
                p = r.get("content_probe")
                if p:
                    probes.append(f"| {seed} | {NAMES[model]} | {100 * p['states']['accuracy']:.1f}% | "
                                  f"{p['states']['nll_bits']:.2f} | {100 * p['embeddings']['accuracy']:.1f}% | "
                                  f"{p['embeddings']['nll_bits']:.2f} | {p['gain_bits']:+.2f} |")
    return "\n".join(lines + [""] + probes)


def main(out, dest=HERE):
    found = seed_rows(out)
    summary = {"work_dirs": {p: sorted(s) for p, s in found.items()}, "rows": found, "contrasts": {}}
    for prefix, seeds in found.items():
        for name, drop, merge, primary in CONTRASTS:
            per_seed = contrast(out, prefix, seeds, drop, merge)
            if per_seed:
                summary["contrasts"][f"{prefix}{name}"] = {"drop": drop, "merge": merge, "primary": primary,
                                                            "seeds": per_seed, "rule": read_rule(per_seed, primary)}
        series = {}
        for seed, rows in sorted(seeds.items()):
            for model, row in rows.items():
                if row.get("relative_gap_points") is not None:
                    series.setdefault(NAMES.get(model, model), []).append((seed, row["relative_gap_points"]))
        if series:  # every model keeps the same states (the rule's): the seeds, not the share pruned, on the x axis
            line_plot([(m, [x for x, _ in p], [y for _, y in p]) for m, p in sorted(series.items())],
                      os.path.join(dest, f"relative_gap_by_seed_{prefix.rstrip('_') or 'all'}.png"),
                      f"drop against merge ({prefix.rstrip('_')}), 50% of the source states pruned",
                      "seed", "relative gap to stock (points)")
    summary["headline"] = headline(summary)
    with open(os.path.join(dest, "results.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(markdown(summary))
    for name, c in summary["contrasts"].items():
        print(name, json.dumps({s: {k: e[k] for k in ("G_drop", "G_merge", "D")} for s, e in c["seeds"].items()}),
              c["rule"] if isinstance(c["rule"], str) else c["rule"]["verdict"], sep="\n  ")
    return summary


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*sys.argv[1:])
