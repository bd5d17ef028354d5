"""fairseq-sparse-recipe end to end on a tiny raw corpus the test makes: every step, the report, the resume (other
inputs, options and the input checks: test_recipe_variants.py)."""
import json
import os
import re
import subprocess

from helpers.recipe import RECIPE, TINY, recipe


def test_recipe_end_to_end_and_resume(raw_corpus, tmp_path):
    work = tmp_path / "work"
    # every step but the variants of a code path another step runs (control_frozen, heads_enc: heads_all with
    # other options; pattern_freq, pattern_inv_freq: pattern_group with another rule, see test_encoder_patterns)
    gold = ["--gold-alignments", str(raw_corpus / "test.align"), "--threads", "1", "--budget-points", "10,20"]
    recipe(raw_corpus, work, gold + ["--steps", "prepare,baseline"])
    # the fine-tunings as two processes at once, as the demo runs them (each evaluation in its own cache file)
    lanes = ["simplified,control,l0drop,curve,composed", "pattern_group,heads_all,attention_reg,importance"]
    procs = [subprocess.Popen(RECIPE + ["--corpus", str(raw_corpus), "-s", "en", "-t", "de", "--work-dir", str(work)]
                              + TINY + gold + ["--steps", lane], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for lane in lanes]
    for p in procs:
        out, _ = p.communicate(timeout=900)
        assert p.returncode == 0, out[-3000:]
    recipe(raw_corpus, work, gold + ["--steps", "report"])
    report = (work / "REPORT.md").read_text()
    results = json.loads((work / "results.json").read_text())
    models = results["models"]
    for name in ("baseline", "simplified", "control", "l0drop", "pattern_group", "heads_all", "attention_reg",
                 "importance"):
        assert f"| {name} |" in report, report
        assert models[name]["sentences"] == 25  # every test sentence decoded
        assert 0.0 <= models[name]["bleu"] <= 100.0
    assert 0.0 <= models["l0drop"]["l0drop_sparsity"] <= 1.0
    # the group rule at the L0Drop target (0.5) keeps every 2nd position (and EOS)
    assert 0.3 < models["pattern_group"]["l0drop_sparsity"] < 0.5
    assert results["heads"]["heads_all"]["total"][1] == 12  # 2 layers x 2 heads x 3 attention types
    # importance: half of the 4 encoder heads cut out of the baseline, so fewer parameters
    assert results["heads"]["importance"]["total"] == [10, 12]
    assert models["importance"]["parameters"] < models["baseline"]["parameters"]
    assert models["simplified"]["parameters"] < models["baseline"]["parameters"]  # no decoder FFN
    # pruned decoding is exact: the same hypotheses as the full memory
    assert results["l0drop_exact"]["identical"] and results["l0drop_exact"]["sentences"] == 25
    # the composed model (simplified decoder + L0Drop between layers + head gates, heads cut out), also decoded
    # with the full memory (its exactness is tested on a model fine-tuned from a converged one in
    # test_head_gates_cli: this one has 20 updates, and its near-tied beams could flip by float noise alone)
    assert results["composed_exact"]["sentences"] == 25 and results["composed_exact"]["max_score_difference"] >= 0
    assert sorted(results["composed_layer_sparsity"]) == ["l0drop", "l0drop_layer1"]  # one gate between 2 layers
    assert "| composed |" in report and "composed: share of source states pruned" in report
    types = results["attention"]["l0drop"]["token_types"]
    assert sum(v["tokens"] for v in types.values()) == sum(
        len(l.split()) for l in (work / "tok" / "test.bpe.en").read_text().splitlines())
    for name in ("control", "attention_reg"):
        assert 0 <= results["attention"][name]["aer"] <= 1 and results["attention"][name]["entropy"] >= 0
    for png in ("importance/curve/curve.png", "importance/scores/importance_enc.png", "l0drop/attention/example_0.png"):
        assert (work / png).is_file() and f"]({png})" in report, png
    # one curve point per target, each with the control's BLEU at the same number of updates
    assert [float(p["target_l0drop"]) for p in results["curve"]] == [0.3, 0.6]
    assert all("control_score" in p for p in results["curve"])
    assert os.path.exists(work / "curve" / "curve.png")
    # the gap against the budget: each fine-tuning and its control at 10 and 20 updates (heads cut out where gated)
    for name in ("l0drop", "heads_all", "attention_reg", "composed"):
        assert [p["updates"] for p in results["budget"][name]] == [10, 20], results["budget"].get(name)
        assert all(p["control"] == "control" for p in results["budget"][name])
    assert results["budget"]["composed"][-1]["score"] == models["composed"]["score"]  # its heads cut out alike
    assert results["budget"]["l0drop"][-1]["score"] == models["l0drop"]["score"]  # the last point is the model
    logs = work / "logs"  # ... decoded once: the last checkpoint not decoded (nor head-pruned) again; the curve aside
    assert (logs / "generate.l0drop@10.log").is_file() and (logs / "generate.control@10.log").is_file()
    second_decoding = r"generate\.(?!curve@)\w+@20\.log|prune\.\w+\.checkpoint_\d+_20\.pt\.log"
    assert not [p.name for p in logs.iterdir() if re.fullmatch(second_decoding, p.name)]
    # the share of heads cut out at each point where gated heads are, as the final pruned model has it
    kept, total = results["heads"]["heads_all"]["total"]
    assert results["budget"]["heads_all"][-1]["heads_closed"] == round(1 - kept / total, 4)
    assert all(p["heads_closed"] is None for p in results["budget"]["l0drop"])
    assert (work / "budget" / "gap.png").is_file() and "](budget/gap.png)" in report
    assert "p = " in report and set(results["significance"]) >= {"l0drop", "heads_all", "control"}
    # the commands a user would run are in the report
    assert "fairseq-train" in report and "fairseq-generate" in report and "--l0drop-target-sparsity 0.5" in report
    # a re-run skips every finished step and keeps the results
    before = {p: os.path.getmtime(p) for p in (work / "baseline" / "checkpoint_last.pt", work / "results.json")}
    again = recipe(raw_corpus, work, gold + ["--steps", ",".join(["prepare", "baseline"] + lanes + ["report"])])
    assert "baseline: done already" in again.stdout and "l0drop: done already" in again.stdout
    assert os.path.getmtime(work / "baseline" / "checkpoint_last.pt") == before[work / "baseline" / "checkpoint_last.pt"]
    assert json.loads((work / "results.json").read_text())["models"] == models
