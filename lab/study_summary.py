#!/usr/bin/env python3
"""One study's summary over its seeds, from what a device call brought back: the study.tgz of lab/gpu_study.sh
(or a folder) holding one recipe work dir per seed, each with the report step's results.json. Per seed, every model
against its equal-updates control (score, gap, the paired bootstrap's p, sparsity, updates/s), the baseline's
"converged" evidence (the control's gain over the fine-tuning budget, the last validations) and, for summarisation,
the lead baseline and the distinct outputs; then each model's mean gap over the seeds. Writes JSON and prints a
Markdown table for the study's report.

    python3 lab/study_summary.py study.tgz --json reports/DATE-NAME/results.json
"""
import argparse
import json
import os
import statistics
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fairseq_sparse.recipe.methods import BY_NAME  # noqa: E402
from studies import StudyError, against_controls, results_by_seed  # noqa: E402  (lab/studies.py, beside this file)


def summarise(folder):
    """{seed: every model against its control, the baseline's "converged" evidence, the lead baseline, what
    stopped the baseline} of every recipe work dir under FOLDER, and each model's mean gap over the seeds."""
    try:
        found = results_by_seed(folder)
    except StudyError as e:
        raise SystemExit(f"study_summary: {e}")
    seeds = {}
    for seed, run in found.items():
        results = run["results"]
        try:
            seeds[seed] = {"work": run["work"], "metric": results["settings"]["metric"],
                           "models": against_controls(results), "converged": results.get("converged", {}),
                           "lead": results.get("lead"), "stopped": results.get("stopped", {}).get("baseline")}
        except (KeyError, TypeError) as e:
            raise SystemExit(f"study_summary: {os.path.join(run['work'], 'results.json')} lacks {e} where the "
                             "recipe's report writes it (another version, or edited)")
    if not seeds:
        raise SystemExit(f"study_summary: no recipe results.json under {folder}")
    mean = {}
    for name in dict.fromkeys(n for s in seeds.values() for n in s["models"]):
        gaps = [s["models"][name]["gap"] for s in seeds.values() if "gap" in s["models"].get(name, {})]
        if gaps:
            mean[name] = {"gap": round(statistics.mean(gaps), 2), "seeds": len(gaps),
                          "p_values": [s["models"][name].get("p_value") for s in seeds.values() if name in s["models"]]}
    return {"seeds": seeds, "mean": mean}


def markdown(summary):
    seeds = sorted(summary["seeds"])
    metric = "BLEU" if summary["seeds"][seeds[0]]["metric"] == "bleu" else "ROUGE-L"
    lines = [f"| model | against | {' | '.join(f'seed {s}: {metric} / gap (p)' for s in seeds)} | mean gap | pruned |",
             "|---|---|" + "---|" * len(seeds) + "---|---|"]
    for name, mean in [(n, summary["mean"].get(n)) for n in summary["seeds"][seeds[0]]["models"]]:
        cells = []
        for s in seeds:
            r = summary["seeds"][s]["models"].get(name)
            if r is None:
                cells.append("")
            elif "gap" in r:
                p = "" if r.get("p_value") is None else f" ({r['p_value']:.3f})"
                cells.append(f"{r['score']:.2f} / {r['gap']:+.2f}{p}")
            else:
                cells.append(f"{r['score']:.2f}")
        first = summary["seeds"][seeds[0]]["models"][name]
        pruned = first.get("source_states_pruned", first.get("heads_closed"))
        lines.append(f"| {name} | {first.get('control', '')} | {' | '.join(cells)} | "
                     f"{'' if mean is None else format(mean['gap'], '+.2f')} | "
                     f"{'' if pruned is None else format(pruned, '.1%')} |")
    for s in seeds:
        c, lead = summary["seeds"][s]["converged"], summary["seeds"][s]["lead"]
        if c:
            lines.append(f"- seed {s}: the control gains {c['control_gain']:+.2f} over {c['finetune_updates']} updates "
                         f"(converged where it gains at most 0.5); the baseline's last validations (updates, loss): "
                         + ", ".join(f"{u} {loss:.3f}" for u, loss, _ in c.get("baseline_valid_curve", [])))
        if lead:
            distinct = ", ".join(f"{n} {r['distinct_outputs']:.0%}" for n, r in summary["seeds"][s]["models"].items()
                                 if "distinct_outputs" in r)
            lines.append(f"- seed {s}: lead baseline {lead['score']:.2f}; the baseline against it: p = "
                         f"{lead['baseline_against_lead']['p_value']:.3f}; distinct outputs per document: {distinct}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study", help="the study.tgz a device call brought back, or a folder of work dirs")
    ap.add_argument("--json", help="write the summary here (refused where the file exists)")
    a = ap.parse_args(argv)
    if not os.path.exists(a.study):
        ap.error(f"no such file or folder: {a.study}")
    if a.json and os.path.exists(a.json):
        ap.error(f"--json {a.json} exists, not overwritten")
    with tempfile.TemporaryDirectory() as tmp:
        folder = a.study
        if os.path.isfile(a.study):
            try:
                with tarfile.open(a.study) as t:
                    t.extractall(tmp, filter="data")
            except (tarfile.TarError, EOFError, OSError) as e:  # a truncated gzip ends in EOFError
                ap.error(f"{a.study} is not a readable study.tgz ({type(e).__name__})")
            folder = tmp
        summary = summarise(folder)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(markdown(summary))
    for name in summary["seeds"][min(summary["seeds"])]["models"]:
        print(f"- {name}: {BY_NAME[name].summary if name in BY_NAME else 'not a model of this version of the recipe'}")


if __name__ == "__main__":
    main()
