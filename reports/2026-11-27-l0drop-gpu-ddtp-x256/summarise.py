"""The study's results.json and plots from what the device calls brought back (study.tgz: each seed's work dir without
checkpoints): every decoding the recipe cached (WORK/results/*.json: hypotheses, references, score, pruned share),
the runs' timing.json and stopped.json, and the baseline's validations. Paired bootstrap (sacrebleu, 1,000
resamples) of each method against its equal-updates control of the same seed.

    python3 reports/2026-11-27-l0drop-gpu-ddtp-x256/summarise.py STUDY_TGZ
"""
import json
import logging
import os
import statistics
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from fairseq_sparse.analysis.plotting import pyplot  # noqa: E402
from fairseq_sparse.analysis.scores import paired_test  # noqa: E402
from fairseq_sparse.recipe.analyses import valid_curve  # noqa: E402
from fairseq_sparse.recipe.decoding import same_hypotheses  # noqa: E402
from fairseq_sparse.recipe.workdir import WorkDir  # noqa: E402

METHODS = {"l0drop": "L0Drop, target 0.5", "l0drop_low": "L0Drop, target 0.3",
           "pattern_freq": "freq pattern, rate 0.5 (no gates)"}
SEEDS = (1, 2)


def cached(work, key):
    path = os.path.join(work, "results", f"{key}.json")
    return json.load(open(path))["result"] if os.path.exists(path) else None


def valid_curve(work):
    """The baseline's validations: the recipe's own reading of its fairseq-train log."""
    return [list(v) for v in valid_curve(WorkDir(work), "baseline")]


def compare(control, row):
    test = paired_test("bleu", [h for h, _ in control["hypotheses"]], [h for h, _ in row["hypotheses"]],
                       row["references"], "13a")
    return {"score": row["score"], "control": control["score"], "gap": round(row["score"] - control["score"], 2),
            "p_value": test.get("p_value"), "pruned": row["l0drop_sparsity"]}


def seed_results(work):
    base, control = cached(work, "baseline"), cached(work, "control")
    timing = {n: json.load(open(os.path.join(work, n, "timing.json")))
              for n in ["baseline", "control", *METHODS] if os.path.exists(os.path.join(work, n, "timing.json"))}
    out = {"baseline": {"bleu": base["score"], "stopped": json.load(open(os.path.join(work, "baseline", "stopped.json"))),
                        "valid_curve": valid_curve(work), "parameters": base["parameters"]},
           "control": {"bleu": control["score"], "gain_over_baseline": round(control["score"] - base["score"], 2),
                       "bleu_at_500": (cached(work, "control@500") or {}).get("score")},
           "timing": timing, "methods": {}}
    for name in METHODS:
        row = cached(work, name)
        if row is None:
            continue
        m = {"final": compare(control, row), "parameters": row["parameters"]}
        full = cached(work, f"{name}@full-memory")
        if full is not None:
            m["pruned_vs_full_memory"] = {k: v for k, v in same_hypotheses(row, full).items() if k != "differ"}
        early, early_control = cached(work, f"{name}@500"), cached(work, "control@500")
        if early is not None and early_control is not None:
            m["at_500"] = compare(early_control, early)
        out["methods"][name] = m
    return out


def summary(seeds):
    mean = {}
    for name in METHODS:
        gaps = [s["methods"][name]["final"]["gap"] for s in seeds.values() if name in s["methods"]]
        if gaps:
            mean[name] = {"gap": round(statistics.mean(gaps), 2), "seeds": len(gaps),
                          "pruned": round(statistics.mean(s["methods"][name]["final"]["pruned"] for s in seeds.values()), 4)}
    return {"mean_gap_after_1000_updates": mean,
            "baseline_bleu": round(statistics.mean(s["baseline"]["bleu"] for s in seeds.values()), 2),
            "control_gain": round(statistics.mean(s["control"]["gain_over_baseline"] for s in seeds.values()), 2)}


def plot_against_baseline(results, earlier, path):
    """The L0Drop (target 0.5) gap to its equal-updates control against the baseline's test BLEU: this study's seeds
    and the earlier studies' points (earlier_points.json: where each was measured)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for p in earlier:
        ax.scatter(p["baseline_bleu"], p["gap"], marker="o", color="grey")
        ax.annotate(f"{p['label']} ({p['updates']} upd.)", (p["baseline_bleu"], p["gap"]), fontsize=7,
                    xytext=(4, -3), textcoords="offset points")
    points = [(s["baseline"]["bleu"], s["methods"]["l0drop"]["final"]["gap"]) for s in results["seeds"].values()]
    ax.scatter([x for x, _ in points], [y for _, y in points], marker="s", color="tab:red")
    ax.annotate(f"x256 GPU --amp, seeds {', '.join(map(str, results['seeds']))} (1000 upd.)", points[0], fontsize=7,
                xytext=(-150, 8), textcoords="offset points", color="tab:red")
    ax.axhline(-0.5, color="tab:green", linestyle="--", linewidth=1)
    ax.text(12.2, -0.3, "goal: within 0.5 BLEU", fontsize=7, color="tab:green")
    ax.set_xlabel("baseline test BLEU (DDTP en-de, beam 5)")
    ax.set_ylabel("L0Drop 0.5 - control (BLEU)")
    ax.set_title("L0Drop at 50%: the gap against the baseline's strength")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_by_share(results, path):
    """Each method's gap against the share of source states it prunes (both seeds)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for name, label in METHODS.items():
        pts = [(s["methods"][name]["final"]["pruned"], s["methods"][name]["final"]["gap"])
               for s in results["seeds"].values() if name in s["methods"]]
        ax.scatter([x * 100 for x, _ in pts], [y for _, y in pts], label=label)
    ax.axhline(-0.5, color="tab:green", linestyle="--", linewidth=1)
    ax.set_xlabel("source states pruned (test set, %)")
    ax.set_ylabel("BLEU gap to the equal-updates control")
    ax.set_title("3+3 x 256 GPU baselines, 1,000 updates, seeds 1-2")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(tgz):
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(tgz) as t:
            t.extractall(tmp, filter="data")
        seeds = {s: seed_results(os.path.join(tmp, "gpu_carry", f"W{s}")) for s in SEEDS}
    results = {"seeds": seeds, "summary": summary(seeds)}
    with open(os.path.join(HERE, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    earlier = json.load(open(os.path.join(HERE, "earlier_points.json")))
    plot_against_baseline(results, earlier, os.path.join(HERE, "gap_vs_baseline.png"))
    plot_by_share(results, os.path.join(HERE, "gap_vs_share.png"))
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
