"""fairseq-sparse-recipe end to end on a tiny raw corpus the test makes: every step, the report, the resume (other
inputs, options and the input checks: test_recipe_variants.py). One recipe run (the module's fixture) and one test
per thing it must have produced."""
import json
import os
import re
import subprocess
from types import SimpleNamespace

import pytest

from helpers.recipe import RECIPE, TINY, recipe

#: the fine-tunings as two processes at once, as the demo runs them (each evaluation in its own cache file)
LANES = ["simplified,control,l0drop,curve,composed", "pattern_group,heads_all,attention_reg,importance"]


@pytest.fixture(scope="module")
def run(raw_corpus, tmp_path_factory):
    """Every step but the variants of a code path another step runs (control_frozen, heads_enc: heads_all with other
    options; pattern_freq, pattern_inv_freq: pattern_group with another rule, see test_encoder_patterns), then the
    report: the work dir, its results.json and REPORT.md, and the options every run of it takes."""
    work = tmp_path_factory.mktemp("recipe") / "work"
    gold = ["--gold-alignments", str(raw_corpus / "test.align"), "--threads", "1", "--budget-points", "10,20"]
    recipe(raw_corpus, work, gold + ["--steps", "prepare,baseline"])
    procs = [subprocess.Popen(RECIPE + ["--corpus", str(raw_corpus), "-s", "en", "-t", "de", "--work-dir", str(work)]
                              + TINY + gold + ["--steps", lane], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for lane in LANES]
    for p in procs:
        out, _ = p.communicate(timeout=900)
        assert p.returncode == 0, out[-3000:]
    recipe(raw_corpus, work, gold + ["--steps", "report"])
    results = json.loads((work / "results.json").read_text())
    return SimpleNamespace(work=work, results=results, models=results["models"], gold=gold,
                           report=(work / "REPORT.md").read_text())


def test_every_model_is_trained_decoded_and_reported(run):
    for name in ("baseline", "simplified", "control", "l0drop", "pattern_group", "heads_all", "attention_reg",
                 "importance"):
        assert f"| {name} |" in run.report, run.report
        assert run.models[name]["sentences"] == 25  # every test sentence decoded
        assert 0.0 <= run.models[name]["bleu"] <= 100.0
    assert 0.0 <= run.models["l0drop"]["l0drop_sparsity"] <= 1.0
    # the group rule at the L0Drop target (0.5) keeps every 2nd position (and EOS)
    assert 0.3 < run.models["pattern_group"]["l0drop_sparsity"] < 0.5
    assert run.models["simplified"]["parameters"] < run.models["baseline"]["parameters"]  # no decoder FFN


def test_heads_are_counted_and_importance_cuts_half_the_encoder_heads(run):
    assert run.results["heads"]["heads_all"]["total"][1] == 12  # 2 layers x 2 heads x 3 attention types
    assert run.results["heads"]["importance"]["total"] == [10, 12]  # half of the 4 encoder heads cut out
    assert run.models["importance"]["parameters"] < run.models["baseline"]["parameters"]


def test_pruned_decoding_is_exact_and_the_composed_model_is_decoded_both_ways(run):
    r = run.results
    assert r["l0drop_exact"]["identical"] and r["l0drop_exact"]["sentences"] == 25
    # the composed model (simplified decoder + L0Drop between layers + head gates, heads cut out), also decoded
    # with the full memory (its exactness is tested on a model fine-tuned from a converged one in
    # test_head_gates_cli: this one has 20 updates, and its near-tied beams could flip by float noise alone)
    # (at most one such flip), and where the outputs agree their scores agree to float noise
    e = r["composed_exact"]
    assert e["sentences"] == 25 and len(e["differ"]) <= 1 and e["max_score_difference"] < 1e-4, e
    assert sorted(r["composed_layer_sparsity"]) == ["l0drop", "l0drop_layer1"]  # one gate between 2 layers
    assert "| composed |" in run.report and "composed: share of source states pruned" in run.report


def test_attention_is_analysed_by_token_type_and_against_gold_alignments(run):
    types = run.results["attention"]["l0drop"]["token_types"]
    assert sum(v["tokens"] for v in types.values()) == sum(
        len(line.split()) for line in (run.work / "tok" / "test.bpe.en").read_text().splitlines())
    attention = run.results["attention"]
    assert all(0 <= attention[name]["aer"] <= 1 for name in ("control", "attention_reg")), attention
    # the minimum-entropy regulariser sharpens the cross-attention against its equal-updates control (a
    # deterministic run: one thread, seed 1): lower entropy, a larger top weight
    assert attention["attention_reg"]["entropy"] < attention["control"]["entropy"], attention
    assert attention["attention_reg"]["max_weight"] > attention["control"]["max_weight"], attention
    for png in ("importance/curve/curve.png", "importance/scores/importance_enc.png", "l0drop/attention/example_0.png"):
        assert (run.work / png).is_file() and f"]({png})" in run.report, png


def test_the_curve_has_a_point_per_target_each_beside_its_control(run):
    assert [float(p["target_l0drop"]) for p in run.results["curve"]] == [0.3, 0.6]
    assert all("control_score" in p for p in run.results["curve"])
    assert os.path.exists(run.work / "curve" / "curve.png")


def test_each_budget_point_is_decoded_once_beside_its_control(run):
    budget = run.results["budget"]
    for name in ("l0drop", "heads_all", "attention_reg", "composed"):  # heads cut out where gated
        assert [p["updates"] for p in budget[name]] == [10, 20], budget.get(name)
        assert all(p["control"] == "control" for p in budget[name])
    assert budget["composed"][-1]["score"] == run.models["composed"]["score"]  # its heads cut out alike
    assert budget["l0drop"][-1]["score"] == run.models["l0drop"]["score"]  # the last point is the model ...
    logs = run.work / "logs"  # ... decoded once: the last checkpoint not decoded (nor head-pruned) again
    assert (logs / "generate.l0drop@10.log").is_file() and (logs / "generate.control@10.log").is_file()
    second_decoding = r"generate\.(?!curve@)\w+@20\.log|prune\.\w+\.checkpoint_\d+_20\.pt\.log"
    assert not [p.name for p in logs.iterdir() if re.fullmatch(second_decoding, p.name)]
    # the share of heads cut out at each point where gated heads are, as the final pruned model has it
    kept, total = run.results["heads"]["heads_all"]["total"]
    assert budget["heads_all"][-1]["heads_closed"] == round(1 - kept / total, 4)
    assert all(p["heads_closed"] is None for p in budget["l0drop"])
    assert (run.work / "budget" / "gap.png").is_file() and "](budget/gap.png)" in run.report


def test_the_report_has_significance_and_the_commands_to_run(run):
    assert "p = " in run.report and set(run.results["significance"]) >= {"l0drop", "heads_all", "control"}
    assert "fairseq-train" in run.report and "fairseq-generate" in run.report
    assert "--l0drop-target-sparsity 0.5" in run.report


def test_a_rerun_skips_every_finished_step_and_keeps_the_results(run, raw_corpus):
    work = run.work
    before = {p: os.path.getmtime(p) for p in (work / "baseline" / "checkpoint_last.pt", work / "results.json")}
    again = recipe(raw_corpus, work, run.gold + ["--steps", ",".join(["prepare", "baseline"] + LANES + ["report"])])
    assert "baseline: done already" in again.stdout and "l0drop: done already" in again.stdout
    assert os.path.getmtime(work / "baseline" / "checkpoint_last.pt") == before[work / "baseline" / "checkpoint_last.pt"]
    assert json.loads((work / "results.json").read_text())["models"] == run.models
