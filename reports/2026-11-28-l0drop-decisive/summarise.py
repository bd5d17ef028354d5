"""The decisive study's summary from its work dirs (OUT/f<fraction>_s<seed>/results.json, written by the recipe's
report step): every from-scratch model against the stock baseline at each budget point, per seed, the relative gap
G = (model - stock) / stock and its mean over seeds, the gap analysis of each pair; the protocol arm's fine-tunings
(OUT/ft_<protocol>_s<seed>/results.json: the freq rule against its control under each protocol); results.json and a
plot of G against the budget, next to this script. Rows of DEST's earlier results.json whose work dirs are not in
OUT (runs of an earlier machine, whose work dirs are gone) are kept as they were, marked "kept".

    python summarise.py OUT [DEST]     # DEST: where results.json and the plot go (default: next to this script)
"""
import glob
import json
import math
import os
import re
import statistics
import sys

from fairseq_sparse.analysis.plotting import line_plot
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lab"))
from studies import budget_rows, means as studies_means  # noqa: E402  (lab/studies.py)

HERE = os.path.dirname(os.path.abspath(__file__))


#: the (fraction, model, updates) points README and the status table quote, by their headline names
HEADLINE_POINTS = {(0.25, "pattern_freq_scratch", 850): "quarter_850", (0.5, "pattern_freq_scratch", 850): "half_850",
                   (0.25, "pattern_freq_scratch", 2000): "quarter_2000",
                   (0.25, "l0drop_scratch", 850): "l0drop_scratch_quarter_850",
                   (0.25, "l0drop_low_scratch", 850): "l0drop_low_scratch_quarter_850",
                   (0.25, "pattern_freq_scratch_layers6", 850): "quarter_850_layers6"}
#: the models of the quality-against-pruning plot, as its legend names them (in the order of their share pruned)
PRUNED_PLOT = {"l0drop_low_scratch": "learned 0.3", "l0drop_scratch": "learned 0.5", "pattern_freq_scratch": "freq rule"}
#: a pair's work dir: f0.25_s1, or the device call's DEC_f0.25_s1; a suffix (f0.25_s1_l0drop): more models of it
#: (the fine-tunings' ft_<protocol>_..._s<seed> are not pairs)
PAIR = re.compile(r"(?:[A-Za-z]+_)?f([\d.]+)_s(\d+)(?:_[a-z0-9]+)?")
#: a work dir's suffix that names another model size (f0.25_s1_layers6: 6+6 layers): its models' names carry it
SIZE_SUFFIX = re.compile(r"_((?:layers|dim)\d+)$")


def pairs(out):
    """[(fraction, seed, results, points, size)] of every work dir (OUT/f1_s1, or the device call's
    gpu_carry/DEC_f1_s1; a suffix such as f0.25_s1_l0drop: a work dir of more models of that pair, its baseline the
    pair's at their budget; f0.25_s1_layers6: the pair at another model size, SIZE) with a results.json (the recipe's
    report: finished runs) or a point_UPDATES.json (evaluate_point.py: a budget point of runs that have not
    finished), in name order."""
    found = []
    for name in sorted(os.listdir(out)):
        m = PAIR.fullmatch(name)
        if not m or not os.path.isdir(os.path.join(out, name)):
            continue
        path, points = os.path.join(out, name, "results.json"), []
        for point in sorted(glob.glob(os.path.join(out, name, "point_*.json"))):
            with open(point) as f:
                points.append(json.load(f))
        results = None
        if os.path.exists(path):
            with open(path) as f:
                results = json.load(f)
        if results or points:
            size = SIZE_SUFFIX.search(name)
            found.append((float(m.group(1)), int(m.group(2)), results or {}, points, size.group(1) if size else None))
    return found


def brevity_share(overall, bp):
    """The part of the log BLEU ratio (model against stock) that is the brevity penalty's (BLEU = BP x the
    precisions' geometric mean): 0 where the lengths cost nothing, negative where the model's length helps it."""
    if overall["method"] > 0 and overall["control"] > 0 and overall["method"] != overall["control"]:
        return round(math.log(bp["method"] / bp["control"]) / math.log(overall["method"] / overall["control"]), 2)
    return None


def gap_summary(g):
    """The gap analysis of one pair, the figures the report quotes."""
    bp = {k: g["brevity"][k]["bp"] for k in ("method", "control")}
    return {"sparsity": g["sparsity"], "overall": g["overall"], "by_segment_type": g.get("by_segment_type"),
            "by_length": g["by_length"], "length_ratio": {k: g["brevity"][k]["ratio"] for k in ("method", "control")},
            "bp": bp, "brevity_share": brevity_share(g["overall"], bp), "copy_recall": g["copy_recall"],
            "nll": g["nll"]}


def protocol_rows(out):
    """The protocol arm: per fine-tuning work dir (ft_<protocol>[_f<fraction>]_s<seed>), the freq rule (or, where it
    has none, learned gates) against its equal-updates control."""
    rows = []
    for name in sorted(os.listdir(out)):
        m = re.fullmatch(r"ft_([a-z]+(?:_lr[\d.e-]+)?)(?:_f([\d.]+))?_s(\d+)", name)
        path = os.path.join(out, name, "results.json")
        if not m or not os.path.exists(path):
            continue
        with open(path) as f:
            r = json.load(f)
        models, sig = r.get("models", {}), r.get("significance", {})
        method = next((x for x in ("pattern_freq", "l0drop") if x in models), None)
        if "control" not in models or method is None:
            continue
        control, score = models["control"]["score"], models[method]["score"]
        rows.append({"protocol": m.group(1), "seed": int(m.group(3)), "model": method,
                     "fraction": float(m.group(2) or 1), "start": models["baseline"]["score"],
                     "updates": r["settings"]["finetune_updates"],
                     "lr": r["settings"]["finetune_lr"] if m.group(1).startswith("fresh") else "the baseline's, continued",
                     "control": control, "score": score, "gap": round(score - control, 2),
                     "relative_gap": round((score - control) / control, 4),
                     "p_value": sig.get(method, {}).get("p_value"),
                     "sparsity": models[method].get("l0drop_sparsity"),
                     "gap_analysis": gap_summary(r["gap_analysis"][method]) if method in r.get(
                         "gap_analysis", {}) else None})
    return rows


def keep_earlier(rows, analyses, protocol, earlier):
    """Add the rows of an earlier summary whose point (fraction, seed, model, updates) this one lacks (a work dir gone
    with its machine, or a budget point a later run of the same work dir no longer lists), its gap analyses (a key
    without "@UPDATES", from before they carried one, is of that run's last point) and its fine-tunings."""
    have = {(x["fraction"], x["seed"], x["model"], x["updates"]) for x in rows}
    old = [x for x in earlier.get("rows", []) if (x["fraction"], x["seed"], x["model"], x["updates"]) not in have]
    rows += [{**x, "kept": True} for x in old]
    last = {}
    for x in earlier.get("rows", []):
        key = f"f{x['fraction']:g}_s{x['seed']}/{x['model']}"
        last[key] = max(last.get(key, 0), x["updates"])
    for key, g in earlier.get("gap_analysis", {}).items():
        if g.get("overall") and g.get("bp") and "brevity_share" not in g:  # summarised before it was
            g = {**g, "brevity_share": brevity_share(g["overall"], g["bp"])}
        analyses.setdefault(key if "@" in key or key not in last else f"{key}@{last[key]}", g)
    key = lambda x: (x["protocol"], x["seed"], x.get("model", "pattern_freq"), x.get("fraction", 1.0))  # noqa: E731
    have = {key(x) for x in protocol}
    protocol += [{**x, "kept": True} for x in earlier.get("protocol", []) if key(x) not in have]


#: the budgets of the four points the passes test's rule (README, 2026-11-28) was written on: 850 and 1,700 updates
REGISTERED_UPDATES = 1700
TRAIN_PAIRS = 27427  # DDTP en-de's training split; --train-fraction F keeps round(F x 27,427) of them


def updates_per_epoch(out):
    """{fraction: updates in one pass over its training pairs}, read off a baseline's fairseq-train log (the end of
    its first epoch); the batches of a fraction do not depend on the seed."""
    found = {}
    for name in sorted(os.listdir(out)):
        m = PAIR.fullmatch(name)
        log = os.path.join(out, name, "logs", "baseline.log")
        if m and not SIZE_SUFFIX.search(name) and os.path.exists(log) and float(m.group(1)) not in found:
            with open(log) as f:
                first = re.search(r'"epoch": 1, .*?"train_num_updates": "(\d+)"', f.read())
            if first:
                found[float(m.group(1))] = int(first.group(1))
    return found


def line_fit(points, target):
    """Least squares y = a + b log2(x) through (x, y) points; where y rises with x (b > 0), the x at which the line
    reaches ``target``: an extrapolation, said as one."""
    xs, ys = [math.log2(x) for x, _ in points], [y for _, y in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    residual = math.sqrt(sum((y - a - b * x) ** 2 for x, y in zip(xs, ys)) / (len(xs) - 2))
    return {"intercept": round(a, 4), "slope_per_doubling": round(b, 4), "residual_sd": round(residual, 4),
            "x_at_target": round(2 ** ((target - a) / b), 1) if b > 0 else None, "target": target}


def size_and_passes_fit(points, target):
    """Least squares y = a + b log2(passes) + c log2(pairs) through every (pairs, passes, y) point: c is the
    change of the gap per doubling of the training pairs at equal passes over them (what the data axis at equal
    updates mixes with the passes). Where c > 0, the pairs at which the gap would reach ``target`` at the most
    passes measured (an extrapolation, said as one); None where c <= 0 (more pairs do not close the gap)."""
    import numpy as np

    x = np.array([[1.0, math.log2(p), math.log2(n)] for n, p, _ in points])
    y = np.array([g for _, _, g in points])
    (a, b, c), *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = math.sqrt(float(((y - x @ np.array([a, b, c])) ** 2).sum()) / (len(points) - 3))
    most = max(p for _, p, _ in points)
    pairs = round(2 ** ((target - a - b * math.log2(most)) / c)) if c > 0 else None
    return {"intercept": round(float(a), 4), "per_doubling_passes": round(float(b), 4),
            "per_doubling_pairs": round(float(c), 4), "residual_sd": round(residual, 4), "points": len(points),
            "pairs_at_target": pairs, "at_passes": most, "target": target}


def line_at(line, x):
    """The value of a :func:`line_fit` line at x."""
    return line["intercept"] + line["slope_per_doubling"] * math.log2(x)


def data_axis(means, per_epoch, target=-0.02, registered_line=None):
    """The relative gap of the freq rule from scratch (mean over seeds) at every (fraction, budget) point, with the
    training-set size and the passes over it (updates / updates per epoch), and two least-squares lines: against
    log2(pairs) at 850 updates (the data axis at equal updates), and against log2(passes) over every point."""
    points = []
    for key, m in means.items():
        found = re.fullmatch(r"f([\d.]+)/pattern_freq_scratch@(\d+)", key)
        if found and m["relative_gap"] is not None:
            fraction, updates = float(found.group(1)), int(found.group(2))
            epoch = per_epoch.get(fraction)
            points.append({"pairs": round(fraction * TRAIN_PAIRS), "updates": updates, "seeds": m["seeds"],
                           "passes": round(updates / epoch, 2) if epoch else None, "relative_gap": m["relative_gap"]})
    points.sort(key=lambda p: (p["updates"], p["pairs"]))
    axis = {"points": points, "updates_per_epoch": {f"{k:g}": v for k, v in sorted(per_epoch.items())}}
    at_850 = [(p["pairs"], p["relative_gap"]) for p in points if p["updates"] == 850]
    if len(at_850) >= 3:
        axis["fit_pairs_at_850"] = line_fit(at_850, target)
    passes = [(p["passes"], p["relative_gap"]) for p in points if p["passes"]]
    if len(passes) >= 3:
        axis["fit_passes"] = line_fit(passes, target)
    sized = [(p["pairs"], p["passes"], p["relative_gap"]) for p in points if p["passes"]]
    if len(sized) >= 5 and len({n for n, _, _ in sized}) >= 2:
        axis["fit_size_and_passes"] = size_and_passes_fit(sized, target)
    # the passes test's rule was written on the line through the points of at most REGISTERED_UPDATES updates; each
    # later point is read against what that line predicted for it
    # (REGISTERED_LINE: that line as an earlier summary wrote it, kept: later seeds of its points do not move it)
    registered = [(p["passes"], p["relative_gap"]) for p in points if p["passes"] and p["updates"] <= REGISTERED_UPDATES]
    if registered_line or len(registered) >= 3:
        line = axis["fit_passes_registered"] = registered_line or line_fit(registered, target)
        axis["predictions"] = [{**p, "predicted": round(line_at(line, p["passes"]), 4)}
                               for p in points if p["passes"] and p["updates"] > REGISTERED_UPDATES]
    return axis


def summarise(out, earlier=None):
    rows, analyses = [], {}
    for fraction, seed, r, points, size in pairs(out):
        for x in budget_rows(r):
            if x["model"].endswith("_scratch"):
                model = f"{x['model']}_{size}" if size else x["model"]
                rows.append({"fraction": fraction, "seed": seed, "model": model, "updates": x["updates"],
                             "stock": x["control_score"], "score": x["score"], "gap": x["gap"],
                             "relative_gap": x["relative_gap"], "p_value": x["p_value"],
                             "sparsity": x.get("source_states_pruned")})
        for model, g in r.get("gap_analysis", {}).items():  # at the control's checkpoint's update count
            updates = re.search(r"_(\d+)\.pt$", g.get("control_checkpoint", ""))
            updates = int(updates.group(1)) if updates else max(p["updates"] for p in r["budget"][model])
            analyses[f"f{fraction:g}_s{seed}/{model}{'_' + size if size else ''}@{updates}"] = gap_summary(g)
        done = {(x["model"], x["updates"]) for x in rows if (x["fraction"], x["seed"]) == (fraction, seed)}
        for p in points:
            if ("pattern_freq_scratch", p["updates"]) in done:
                continue
            rows.append({"fraction": fraction, "seed": seed, "model": "pattern_freq_scratch", "updates": p["updates"],
                         "stock": p["stock"], "score": p["freq"], "gap": p["gap"], "relative_gap": p["relative_gap"],
                         "p_value": p["p_value"], "sparsity": p["sparsity"], "from": "evaluate_point.py"})
            analyses[f"f{fraction:g}_s{seed}/pattern_freq_scratch@{p['updates']}"] = {
                k: p[k] for k in ("sparsity", "brevity", "by_segment_type", "by_length", "copy_recall", "nll")}
    protocol = protocol_rows(out)
    keep_earlier(rows, analyses, protocol, earlier or {})
    rows.sort(key=lambda x: (-x["fraction"], x["seed"], x["model"], x["updates"]))
    means = {f"f{f:g}/{model}@{u}": m for (f, model, u), m in
             studies_means(rows, ("fraction", "model", "updates"), ("stock", "score", "gap", "relative_gap")).items()}
    headline = {}
    for key, m in means.items():  # all the pairs, the freq rule: what README's status table reads
        found = re.fullmatch(r"f1/pattern_freq_scratch@(\d+)", key)
        if found:
            u = found.group(1)
            rel = m["relative_gap"]
            headline.update({f"relative_gap_pct_{u}": None if rel is None else round(100 * rel, 1), f"gap_{u}": m["gap"],
                             f"stock_bleu_{u}": m["stock"], f"seeds_{u}": len(m["seeds"])})
    for x in protocol:  # the freq rule on all the pairs: protocol_<name>_...; else the model and share in the key
        other = "" if (x.get("model", "pattern_freq"), x.get("fraction", 1.0)) == ("pattern_freq", 1.0) else \
            f"{x['model']}_f{x['fraction']:g}_"
        headline[f"protocol_{x['protocol']}_{other}relative_gap_pct"] = round(100 * x["relative_gap"], 1)
    per_epoch = {float(k): v for k, v in (earlier or {}).get("data_axis", {}).get("updates_per_epoch", {}).items()}
    axis = data_axis(means, {**per_epoch, **updates_per_epoch(out)},
                     registered_line=(earlier or {}).get("data_axis", {}).get("fit_passes_registered"))
    for (fraction, model, updates), name in HEADLINE_POINTS.items():
        m = means.get(f"f{fraction:g}/{model}@{updates}")
        if m and m["relative_gap"] is not None:
            headline[f"relative_gap_pct_{name}"] = round(100 * m["relative_gap"], 1)
            headline[f"seeds_{name}"] = len(m["seeds"])
            headline[f"relative_gap_pct_{name}_per_seed"] = [
                round(100 * x["relative_gap"], 1) for x in rows
                if (x["fraction"], x["model"], x["updates"]) == (fraction, model, updates)]
    for model in ("l0drop_scratch", "l0drop_low_scratch"):  # learned gates: the share they prune, mean of seeds
        pruned = [x["sparsity"] for x in rows if (x["fraction"], x["model"], x["updates"]) == (0.25, model, 850)]
        if pruned:
            headline[f"pruned_pct_{model}_quarter_850"] = round(100 * statistics.mean(pruned), 1)
    for p in axis.get("predictions", []):
        headline[f"predicted_pct_{p['pairs']}_{p['updates']}"] = round(100 * p["predicted"], 1)
        headline[f"passes_{p['pairs']}_{p['updates']}"] = p["passes"]
    fit = axis.get("fit_size_and_passes")
    if fit:
        headline["fit_size_and_passes_pct_per_doubling_pairs"] = round(100 * fit["per_doubling_pairs"], 1)
        headline["fit_size_and_passes_pct_per_doubling_passes"] = round(100 * fit["per_doubling_passes"], 1)
        headline["fit_size_and_passes_pairs_at_minus_2pct"] = fit["pairs_at_target"]
    for name, fit in (("pairs_at_850", axis.get("fit_pairs_at_850")), ("passes", axis.get("fit_passes"))):
        if fit:
            headline[f"fit_{name}_slope_pct_per_doubling"] = round(100 * fit["slope_per_doubling"], 1)
            headline[f"fit_{name}_at_minus_2pct"] = fit["x_at_target"]
    return {"rows": rows, "means": means, "headline": headline, "gap_analysis": analyses, "protocol": protocol,
            "data_axis": axis}


def main():
    dest = sys.argv[2] if len(sys.argv) > 2 else HERE
    earlier = {}
    if os.path.exists(os.path.join(dest, "results.json")):
        with open(os.path.join(dest, "results.json")) as f:
            earlier = json.load(f)
    summary = summarise(sys.argv[1], earlier)
    with open(os.path.join(dest, "results.json"), "w") as f:
        json.dump(summary, f, indent=1)
    series = {}
    for x in summary["rows"]:
        series.setdefault(f"{x['model']}, {x['fraction']:g} of the pairs, seed {x['seed']}", []).append(x)
    pct = lambda r: None if r is None else 100 * r  # noqa: E731  (no stock BLEU: no relative gap)
    line_plot([(label, [x["updates"] for x in xs], [pct(x["relative_gap"]) for x in xs]) for label, xs in series.items()],
              os.path.join(dest, "relative_gap_vs_updates.png"),
              "trained from scratch beside the stock model, DDTP en-de, 3+3 x 128, CPU",
              "updates (both models)", "relative BLEU gap to stock (%)")
    axis = summary["data_axis"]
    by_pairs = {}
    for p in sorted(axis["points"], key=lambda p: p["passes"] or 0):
        by_pairs.setdefault(p["pairs"], []).append(p)
    series = [(f"{n:,} pairs: freq rule at 0.5 from scratch (mean of seeds)", [p["passes"] for p in ps],
               [pct(p["relative_gap"]) for p in ps]) for n, ps in sorted(by_pairs.items()) if ps[0]["passes"]]
    line = axis.get("fit_passes_registered")
    if line:  # drawn from 3 to the most passes measured, at quarter-doublings
        top = max(p["passes"] for p in axis["points"] if p["passes"])
        xs = [2 ** (k / 4) for k in range(int(4 * math.log2(3)), int(4 * math.log2(top)) + 2)]
        series.append(("the rule's line (points of at most 1,700 updates)", xs,
                       [pct(line_at(line, x)) for x in xs]))
    line_plot(series, os.path.join(dest, "relative_gap_vs_passes.png"),
              "DDTP en-de, freq rule at 0.5 from scratch vs stock, 3+3 x 128, CPU",
              "passes over the training pairs (epochs)", "relative BLEU gap to stock (%)")
    by_seed = {}  # quality against the share pruned: a quarter of the pairs, 850 updates, each model of a seed
    for x in summary["rows"]:
        if (x["fraction"], x["updates"]) == (0.25, 850) and x["model"] in PRUNED_PLOT and x["sparsity"] is not None:
            by_seed.setdefault(x["seed"], []).append((100 * x["sparsity"], pct(x["relative_gap"]), x["model"]))
    line_plot([(f"seed {seed}: " + ", ".join(PRUNED_PLOT[m] for _, _, m in sorted(pts)), [p for p, _, _ in sorted(pts)],
                [g for _, g, _ in sorted(pts)]) for seed, pts in sorted(by_seed.items())],
              os.path.join(dest, "relative_gap_vs_pruned.png"),
              "a quarter of DDTP en-de, 850 updates from scratch, 3+3 x 128, CPU",
              "source states pruned on test (%)", "relative BLEU gap to stock (%)")
    for p in axis["points"]:
        print(f"data axis: {p['pairs']} pairs, {p['updates']} updates, {p['passes']} passes, seeds {p['seeds']}: "
              f"{pct(p['relative_gap']):.1f}%")
    for name in ("fit_pairs_at_850", "fit_passes", "fit_passes_registered", "fit_size_and_passes"):
        if name in axis:
            print(f"{name}: {axis[name]}")
    for p in axis.get("predictions", []):
        print(f"passes test: {p['pairs']} pairs, {p['updates']} updates ({p['passes']} passes): predicted "
              f"{pct(p['predicted']):.1f}%, measured {pct(p['relative_gap']):.1f}%")
    print("| pairs | model | updates | seed | stock BLEU | model BLEU | gap | relative | p | sparsity |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for x in summary["rows"]:
        print(f"| {x['fraction']:g} | {x['model']} | {x['updates']} | {x['seed']} | {x['stock']:.2f} | {x['score']:.2f} "
              f"| {x['gap']:+.2f} | {pct(x['relative_gap']):.1f}% | {x['p_value']} | {x['sparsity']:.1%} |")
    for x in summary["protocol"]:
        print(f"fine-tuned, {x.get('model', 'pattern_freq')} on {x.get('fraction', 1.0):g} of the pairs, {x['protocol']} protocol, seed {x['seed']}, {x['updates']} updates from {x['start']:.2f}: "
              f"control {x['control']:.2f}, model {x['score']:.2f} ({x['gap']:+.2f}, {pct(x['relative_gap']):.1f}%, "
              f"p {x['p_value']})")
    for key, m in summary["means"].items():
        print(f"mean {key} over seeds {m['seeds']}: {m['stock']} -> {m['score']} ({m['gap']:+}, {pct(m['relative_gap']):.1f}%)")


if __name__ == "__main__":
    main()
