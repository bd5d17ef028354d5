"""The x128 study's results.json and plot from what its one device call brought back (study.tgz: each seed's work dir
without checkpoints). The call's time ran out while the fine-tunings' test decodings were being written, so no
decoding was cached; what there is: each decoding's fairseq-generate log, cut off (its D- lines: Moses-detokenised
hypotheses, by sentence id). Every system of a seed is scored on the sentences that all of its decodings reached
(sacrebleu 13a; the references are the baseline's cached ones), each method paired with its equal-updates control
(sacrebleu's paired bootstrap, 1,000 resamples). The pruned share is the fine-tuning's last training line's
test-time sparsity (train_l0drop_test_time_sparsity; the freq pattern's train_l0drop_sparsity: the decodings did not
reach their sparsity line).

    python3 reports/2026-11-27-l0drop-gpu-ddtp-x128/summarise.py STUDY_TGZ [CPU_DECODE_LOG]

CPU_DECODE_LOG: fairseq-generate's log of seed 1's brought-back L0Drop checkpoint (fp16 weights) decoded on the CPU,
every test sentence: its BLEU on the whole test set, its agreement with the GPU's decoding where both exist, and its
gap to the control on the 994 sentences the control's decoding reached.
"""
import json
import logging
import os
import re
import statistics
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from fairseq_sparse.analysis.plotting import pyplot  # noqa: E402
from fairseq_sparse.analysis.scores import bleu, paired_test  # noqa: E402
from fairseq_sparse.recipe.analyses import valid_curve  # noqa: E402
from fairseq_sparse.recipe.workdir import WorkDir  # noqa: E402

METHODS = {"l0drop": "L0Drop, target 0.5", "pattern_freq": "freq pattern, rate 0.5 (no gates)"}
SEEDS = (1, 2)
UPDATES = 800


def decoded(log):
    """{sentence id: detokenised hypothesis} of a fairseq-generate log, as far as it was written."""
    out = {}
    with open(log, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"D-(\d+)\t[^\t]*\t(.*)$", line.rstrip("\n"))
            if m:
                out[int(m.group(1))] = m.group(2)
    return out


def last_train_line(work, name):
    """The last `train` JSON line of NAME's fairseq-train log (the end-of-epoch statistics)."""
    lines = [ln for ln in open(os.path.join(work, "logs", f"{name}.log"), encoding="utf-8") if "| train |" in ln]
    return json.loads(lines[-1].split("| train |", 1)[1])


def seed_results(work):
    wd = WorkDir(work)
    base = json.load(open(os.path.join(work, "results", "baseline.json")))["result"]
    refs = base["references"]
    runs = {name: decoded(os.path.join(work, "logs", f"generate.{name}.log")) for name in ["control", *METHODS]}
    ids = sorted(set.intersection(*(set(d) for d in runs.values())))
    ref = [refs[i] for i in ids]
    control = [runs["control"][i] for i in ids]
    baseline = [base["hypotheses"][i][0] for i in ids]
    out = {"baseline": {"bleu_all": base["score"], "bleu_common": round(bleu(baseline, ref), 2),
                        "stopped": json.load(open(os.path.join(work, "baseline", "stopped.json"))),
                        "valid_curve": [list(v) for v in valid_curve(wd, "baseline")], "parameters": base["parameters"]},
           "decoded": {name: len(d) for name, d in runs.items()}, "common_sentences": len(ids),
           "control": {"bleu_common": round(bleu(control, ref), 2),
                       "valid_curve": [list(v) for v in valid_curve(wd, "control")]},
           "timing": {n: json.load(open(os.path.join(work, n, "timing.json"))) for n in ["baseline", "control", *METHODS]},
           "methods": {}}
    out["control"]["gain_over_baseline_common"] = round(out["control"]["bleu_common"] - out["baseline"]["bleu_common"], 2)
    for name in METHODS:
        hyps = [runs[name][i] for i in ids]
        score = round(bleu(hyps, ref), 2)
        train = last_train_line(work, name)
        out["methods"][name] = {"bleu_common": score, "gap": round(score - out["control"]["bleu_common"], 2),
                                "p_value": paired_test("bleu", control, hyps, ref, "13a").get("p_value"),
                                "pruned": float(train.get("train_l0drop_test_time_sparsity",
                                                          train.get("train_l0drop_sparsity", "nan"))),
                                "valid_curve": [list(v) for v in valid_curve(wd, name)]}
    return out, runs, refs


def cpu_check(log, runs, refs):
    """Seed 1's L0Drop checkpoint (fp16 weights) decoded on the CPU: against the GPU's fp32 decoding of it where both
    exist, and paired with the control's GPU decoding on every sentence the control reached."""
    cpu = decoded(log)
    both = sorted(set(cpu) & set(runs["l0drop"]))
    ids = sorted(set(cpu) & set(runs["control"]))
    ref, control, hyps = [refs[i] for i in ids], [runs["control"][i] for i in ids], [cpu[i] for i in ids]
    sparsity = re.search(r"L0Drop sparsity rate ([0-9.]+)%", open(log, encoding="utf-8").read())
    mine, theirs = bleu(hyps, ref), bleu(control, ref)
    return {"sentences": len(cpu), "bleu_all": round(bleu([cpu[i] for i in sorted(cpu)], [refs[i] for i in sorted(cpu)]), 2),
            "pruned_pct": float(sparsity.group(1)) if sparsity else None,
            "same_as_gpu": f"{sum(cpu[i] == runs['l0drop'][i] for i in both)} of {len(both)}",
            "against_control": {"sentences": len(ids), "bleu": round(mine, 2), "control": round(theirs, 2),
                                "gap": round(mine - theirs, 2),
                                "p_value": paired_test("bleu", control, hyps, ref, "13a").get("p_value")}}


def summary(seeds):
    mean = {name: {"gap": round(statistics.mean(s["methods"][name]["gap"] for s in seeds.values()), 2),
                   "pruned": round(statistics.mean(s["methods"][name]["pruned"] for s in seeds.values()), 4)}
            for name in METHODS}
    return {f"mean_gap_after_{UPDATES}_updates_common_sentences": mean,
            "baseline_bleu": round(statistics.mean(s["baseline"]["bleu_all"] for s in seeds.values()), 2),
            "control_gain_common": round(statistics.mean(s["control"]["gain_over_baseline_common"]
                                                         for s in seeds.values()), 2)}


def plot_against_baseline(results, path):
    """The L0Drop (0.5) gap against the baseline's BLEU: this study's seeds beside the x256 study's and the earlier
    points (the x256 report's earlier_points.json and results.json)."""
    x256 = os.path.join(os.path.dirname(HERE), "2026-11-27-l0drop-gpu-ddtp-x256")
    earlier = json.load(open(os.path.join(x256, "earlier_points.json")))
    big = json.load(open(os.path.join(x256, "results.json")))["seeds"]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for p in earlier:
        ax.scatter(p["baseline_bleu"], p["gap"], marker="o", color="grey")
        ax.annotate(f"{p['label']} ({p['updates']} upd.)", (p["baseline_bleu"], p["gap"]), fontsize=7,
                    xytext=(4, -3), textcoords="offset points")
    for label, color, pts in (
            ("x256 GPU, 2 seeds (1,000 upd.)", "tab:red",
             [(s["baseline"]["bleu"], s["methods"]["l0drop"]["final"]["gap"]) for s in big.values()]),
            (f"x128 GPU, 2 seeds ({UPDATES} upd., partial test set)", "tab:blue",
             [(s["baseline"]["bleu_all"], s["methods"]["l0drop"]["gap"]) for s in results["seeds"].values()])):
        ax.scatter([x for x, _ in pts], [y for _, y in pts], marker="s", color=color, label=label)
    ax.axhline(-0.5, color="tab:green", linestyle="--", linewidth=1)
    ax.set_xlabel("baseline test BLEU (DDTP en-de, beam 5)")
    ax.set_ylabel("L0Drop 0.5 - control (BLEU)")
    ax.set_title("L0Drop at 50%: the gap against the baseline's strength")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(tgz, cpu_log=None):
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(tgz) as t:
            t.extractall(tmp, filter="data")
        seeds, first = {}, None
        for s in SEEDS:
            seeds[s], runs, refs = seed_results(os.path.join(tmp, "gpu_carry", f"W{s}"))
            first = first or (runs, refs)
    results = {"seeds": seeds, "summary": summary(seeds)}
    if cpu_log:
        results["seed1_l0drop_on_cpu"] = cpu_check(cpu_log, *first)
    with open(os.path.join(HERE, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    plot_against_baseline(results, os.path.join(HERE, "gap_vs_baseline.png"))
    print(json.dumps({k: v for k, v in results.items() if k != "seeds"}, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
