"""examples/recipe.py end to end on a tiny raw corpus the test makes (every step, the report, the resume),
and its input checks (before any work starts)."""
import json
import os
import shutil
import sys

import pytest

from conftest import REPO, run

RECIPE = [sys.executable, os.path.join(REPO, "examples", "recipe.py")]
TINY = ["--layers", "1", "--embed-dim", "32", "--ffn-dim", "64", "--heads", "2", "--bpe-merges", "100",
        "--baseline-updates", "40", "--warmup-updates", "10", "--finetune-updates", "20", "--curve-updates", "10",
        "--curve-targets", "0.3,0.6", "--beam", "2", "--max-tokens", "2000"]


@pytest.fixture(scope="module")
def raw_corpus(tmp_path_factory):
    """The synthetic corpus with language-code suffixes (en/de), as a user's raw corpus folder."""
    from fairseq_sparse.synthetic_corpus import make_corpus

    root = tmp_path_factory.mktemp("recipe_corpus")
    syn = make_corpus(str(root / "syn"), train=500, valid=30, test=25, min_len=2, max_len=10)
    raw = root / "raw"
    raw.mkdir()
    for split in ("train", "valid", "test"):
        shutil.copy(os.path.join(syn, f"{split}.src"), raw / f"{split}.en")
        shutil.copy(os.path.join(syn, f"{split}.tgt"), raw / f"{split}.de")
    return raw


def recipe(corpus, work, extra=(), check=True):
    return run(RECIPE + ["--corpus", str(corpus), "-s", "en", "-t", "de", "--work-dir", str(work)] + TINY + list(extra),
               check=check)


def test_recipe_end_to_end_and_resume(raw_corpus, tmp_path):
    work = tmp_path / "work"
    proc = recipe(raw_corpus, work)
    report = (work / "REPORT.md").read_text()
    results = json.loads((work / "results.json").read_text())
    models = results["models"]
    for name in ("baseline", "control", "l0drop", "control_frozen", "heads_enc", "heads_all"):
        assert f"| {name} |" in report, report
        assert models[name]["sentences"] == 25  # every test sentence decoded
        assert 0.0 <= models[name]["bleu"] <= 100.0
    assert 0.0 <= models["l0drop"]["l0drop_sparsity"] <= 1.0
    assert results["heads"]["heads_enc"]["total"][1] == 6  # 1 layer x 2 heads x 3 attention types
    # one curve point per target, each with the control's BLEU at the same number of updates
    assert [float(p["target_l0drop"]) for p in results["curve"]] == [0.3, 0.6]
    assert all("control_bleu" in p for p in results["curve"])
    assert os.path.exists(work / "curve" / "curve.png")
    # the commands a user would run are in the report
    assert "fairseq-train" in report and "fairseq-generate" in report and "--l0drop-target-sparsity 0.5" in report
    # a re-run skips every finished step and keeps the results
    before = {p: os.path.getmtime(p) for p in (work / "baseline" / "checkpoint_last.pt", work / "results.json")}
    again = recipe(raw_corpus, work)
    assert "baseline: done already" in again.stdout and "l0drop: done already" in again.stdout
    assert os.path.getmtime(work / "baseline" / "checkpoint_last.pt") == before[work / "baseline" / "checkpoint_last.pt"]
    assert json.loads((work / "results.json").read_text())["models"] == models


def _corrupt(raw_corpus, tmp_path, edit):
    bad = tmp_path / "bad"
    shutil.copytree(raw_corpus, bad)
    edit(bad)
    return bad


@pytest.mark.parametrize("edit,message", [
    (lambda d: (d / "valid.de").unlink(), "missing corpus file"),
    (lambda d: (d / "test.de").write_text("one line\n"), "not aligned"),
])
def test_recipe_refuses_bad_corpus_before_work(raw_corpus, tmp_path, edit, message):
    bad = _corrupt(raw_corpus, tmp_path, edit)
    proc = recipe(bad, tmp_path / "work", check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "work" / "tok").exists()


def test_recipe_refuses_unknown_language_code(raw_corpus, tmp_path):
    bad = tmp_path / "xx"
    shutil.copytree(raw_corpus, bad)
    for split in ("train", "valid", "test"):
        os.rename(bad / f"{split}.de", bad / f"{split}.qq")
    proc = run(RECIPE + ["--corpus", str(bad), "-s", "en", "-t", "qq", "--work-dir", str(tmp_path / "w")], check=False)
    assert proc.returncode != 0 and "no Moses tokeniser rules for language code 'qq'" in proc.stderr


def test_recipe_refuses_data_bin_without_dictionaries(tmp_path):
    (tmp_path / "bin").mkdir()
    proc = run(RECIPE + ["--data-bin", str(tmp_path / "bin"), "-s", "en", "-t", "de", "--work-dir",
                         str(tmp_path / "w")], check=False)
    assert proc.returncode != 0 and "lacks dict.en.txt" in proc.stderr
