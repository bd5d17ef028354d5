"""fairseq-sparse-recipe on other inputs and options (a tokenised corpus without BPE, a data-bin, sequence-level
distillation, character level, a fine-tuning that continues the baseline's optimisation), its results keyed by the checkpoints that produced them, and its input checks
(before any work starts); the whole recipe end to end is test_recipe.py (a file of its own, so that pytest-xdist's
--dist loadfile runs the two files in different processes)."""
import json
import os
import re
import shutil
import subprocess

import pytest

from conftest import refused_in_process, run
from fairseq_sparse.checkpoint_safety import read_state
from helpers.recipe import MODULE, RECIPE, TINY, recipe


def test_recipe_on_a_tokenised_corpus_without_bpe(raw_corpus, tmp_path):
    """--tokenizer none --bpe-merges 0: the corpus files are binarised as they are (any suffix, no Moses rules
    needed), and BLEU is computed on the tokens."""
    syn = tmp_path / "syn"
    syn.mkdir()
    for split in ("train", "valid", "test"):
        shutil.copy(raw_corpus / f"{split}.en", syn / f"{split}.src")
        shutil.copy(raw_corpus / f"{split}.de", syn / f"{split}.tgt")
    work = tmp_path / "work"
    recipe(syn, work, ["--tokenizer", "none", "--bpe-merges", "0", "--steps", "prepare,baseline,report",
                       "--baseline-patience", "1"], langs=("src", "tgt"))
    # fairseq's --patience bounds the baseline; where and why it stopped is recorded and reported
    stopped = json.loads((work / "baseline" / "stopped.json").read_text())
    assert stopped["updates"] <= 40 and ("--baseline-patience" in stopped["reason"]) == stopped["early_stop"]
    assert f"- baseline: stopped after {stopped['updates']} updates" in (work / "REPORT.md").read_text()
    assert not (work / "tok" / "bpe.codes").exists()
    words = {l.split()[0] for l in (work / "data-bin" / "dict.src.txt").read_text().splitlines()
             if not l.startswith("madeupword")}  # fairseq pads the dictionary to a multiple of 8
    assert words == {w for l in (syn / "train.src").read_text().splitlines() for w in l.split()} | {
        w for l in (syn / "train.tgt").read_text().splitlines() for w in l.split()}
    results = json.loads((work / "results.json").read_text())
    assert list(results["models"]) == ["baseline"] and results["models"]["baseline"]["sentences"] == 25
    # a user brings their own converged baseline (the same data-bin): linked, not trained; the control starts there
    ckpt, mine = str(work / "baseline" / "checkpoint_best.pt"), tmp_path / "mine"
    brought = ["--data-bin", str(work / "data-bin"), "-s", "src", "-t", "tgt", "--tokenizer", "none", "--bpe-merges",
               "0", "--baseline-checkpoint", ckpt]
    bad = run(RECIPE + brought + ["--work-dir", str(mine)] + TINY + ["--embed-dim", "64", "--bpe-merges", "0"],
              check=False)
    assert bad.returncode != 0 and "has other sizes than the recipe's options: encoder_embed_dim 32" in bad.stderr
    assert not mine.exists()
    run(RECIPE + brought + ["--work-dir", str(mine)] + TINY + ["--bpe-merges", "0", "--steps", "baseline,control,report"])
    assert os.path.realpath(mine / "baseline" / "checkpoint_last.pt") == os.path.realpath(ckpt)
    assert "--finetune-from-model baseline/checkpoint_best.pt" in (mine / "commands" / "control.sh").read_text()
    assert not (mine / "commands" / "baseline.sh").exists()  # nothing trained
    assert "(--baseline-checkpoint)" in (mine / "REPORT.md").read_text()


def recipe_refusal(corpus, work, extra, capsys) -> str:
    """The recipe's main() in this process on bad input (through the console script: the language-code test)."""
    from fairseq_sparse.recipe.main import main

    argv = ["--corpus", str(corpus), "-s", "en", "-t", "de", "--work-dir", str(work)] + TINY + list(extra)
    return refused_in_process(main, argv, capsys, status=None)


def _corrupt(raw_corpus, tmp_path, edit):
    bad = tmp_path / "bad"
    shutil.copytree(raw_corpus, bad)
    edit(bad)
    return bad


@pytest.fixture(scope="module")
def baseline_work(raw_corpus, tmp_path_factory):
    """A work dir with the steps prepare and baseline done (TINY, one thread), for the tests that go on from there
    to copy."""
    work = tmp_path_factory.mktemp("baseline_work") / "work"
    recipe(raw_corpus, work, ["--steps", "prepare,baseline", "--threads", "1"])
    return work


def copy_of(work, tmp_path):
    return shutil.copytree(work, tmp_path / "work", symlinks=True)


def test_sequence_level_distillation_data(raw_corpus, baseline_work, tmp_path):
    """distill_data: the baseline's beam-5 translations of every training sentence, decoded in shards (an
    interrupted run keeps the shards done), binarised with the data-bin's dictionaries; --seq-kd fine-tunes on it."""
    work = copy_of(baseline_work, tmp_path)
    recipe(raw_corpus, work, ["--steps", "distill_data,control", "--seq-kd", "--seq-kd-shards", "3", "--threads", "1"])
    sources = (work / "seqkd" / "train.en").read_text().splitlines()
    assert sources == (work / "tok" / "train.bpe.en").read_text().splitlines()  # every sentence, in order
    assert len((work / "seqkd" / "train.de").read_text().splitlines()) == len(sources)
    assert (work / "data-bin-seqkd" / "train.en-de.de.bin").is_file() and (work / "data-bin-seqkd" / "dict.de.txt").is_file()
    control = (work / "commands" / "control.sh").read_text()
    assert "fairseq-train data-bin-seqkd" in control and "--gen-subset train" in (work / "commands" / "distill_data.sh").read_text()
    before = os.path.getmtime(work / "seqkd" / "shard0.tsv")
    recipe(raw_corpus, work, ["--steps", "distill_data", "--seq-kd", "--seq-kd-shards", "3"])
    assert os.path.getmtime(work / "seqkd" / "shard0.tsv") == before  # kept: the baseline did not change


def test_more_seq_kd_shards_than_decoding_batches_is_refused_before_work(raw_corpus, baseline_work, tmp_path, capsys):
    """500 training sentences in batches of 64 are at least 8 decoding batches: 9 shards would leave one empty
    (fairseq-generate then ended in a ZeroDivisionError after the other shards' work; issue 45)."""
    work = copy_of(baseline_work, tmp_path)
    message = recipe_refusal(raw_corpus, work, ["--seq-kd", "--seq-kd-shards", "9", "--steps", "distill_data"], capsys)
    assert "--seq-kd-shards 9 is more than the training split's 8 decoding batches" in message
    assert not (work / "seqkd").exists()


@pytest.mark.parametrize("edit,message", [
    (lambda d: (d / "valid.de").unlink(), "missing corpus file"),
    (lambda d: (d / "test.de").write_text("one line\n"), "not aligned"),
])
def test_recipe_refuses_bad_corpus_before_work(raw_corpus, tmp_path, edit, message, capsys):
    bad = _corrupt(raw_corpus, tmp_path, edit)
    assert message in recipe_refusal(bad, tmp_path / "work", [], capsys)
    assert not (tmp_path / "work" / "tok").exists()


def test_recipe_refuses_unknown_language_code(raw_corpus, tmp_path):
    bad = tmp_path / "xx"
    shutil.copytree(raw_corpus, bad)
    for split in ("train", "valid", "test"):
        os.rename(bad / f"{split}.de", bad / f"{split}.qq")
    proc = run(RECIPE + ["--corpus", str(bad), "-s", "en", "-t", "qq", "--work-dir", str(tmp_path / "w")], check=False,
               console=True)  # the recipe's console script once
    assert proc.returncode != 0 and "no Moses tokeniser rules for language code 'qq'" in proc.stderr


def test_recipe_refuses_data_bin_without_dictionaries(tmp_path, capsys):
    from fairseq_sparse.recipe.main import main

    (tmp_path / "bin").mkdir()
    argv = ["--data-bin", str(tmp_path / "bin"), "-s", "en", "-t", "de", "--work-dir", str(tmp_path / "w")]
    assert "lacks dict.en.txt" in refused_in_process(main, argv, capsys, status=None)


def test_corpus_score_bleu_and_rouge():
    """--metric: sacrebleu's BLEU, or ROUGE-1/2/L F1 (rouge-score, stemmed, ROUGE-L summary-level) averaged over
    documents (tests/unit/test_rouge.py tests the ROUGE scorer itself)."""
    from fairseq_sparse.analysis.scores import corpus_score as score

    refs = ["the cat sat on the mat", "a dog barked"]
    assert score("bleu", refs, refs)[0] == 100.0
    same = score("rouge", refs, refs)
    assert same[0] == 100.0 and [same[1][k] for k in ("rouge1", "rouge2", "rougeLsum")] == [100.0] * 3
    assert score("rouge", ["zebra", "quokka"], refs)[0] == 0.0
    # one sentence right, one with 2 of 3 words (stemmed: barks = barked): ROUGE-1 F1 = (1 + 2/3) / 2
    r = score("rouge", [refs[0], "a dog barks loudly"], refs)[1]
    assert r["rouge1"] == pytest.approx(100 * (1 + (2 * 1.0 * 0.75) / (1.0 + 0.75)) / 2, abs=0.01)


def test_results_follow_the_checkpoint_that_produced_them(raw_corpus, baseline_work, tmp_path):
    """A re-run with a larger --finetune-updates trains the control on; its score and hypotheses are decoded
    again from the new checkpoint, not taken from the cache of the old one (issue 22)."""
    work = copy_of(baseline_work, tmp_path)
    assert "baseline: done already" in recipe(raw_corpus, work, ["--steps", "prepare,baseline,control,report",
                                                                 "--threads", "1"]).stdout
    first = json.loads((work / "results" / "control.json").read_text())["produced_by"]
    assert first["checkpoints"]["control/checkpoint_last.pt"]["updates"] == 20
    proc = run(MODULE + ["--corpus", str(raw_corpus), "-s", "en", "-t", "de", "--work-dir", str(work)] + TINY
               + ["--finetune-updates", "30", "--steps", "control,report", "--threads", "1"])
    assert "fairseq-generate" in proc.stdout  # decoded again
    again = json.loads((work / "results" / "control.json").read_text())["produced_by"]
    assert again["checkpoints"]["control/checkpoint_last.pt"]["updates"] == 30
    assert again["checkpoints"]["control/checkpoint_last.pt"]["sha1"] != first["checkpoints"]["control/checkpoint_last.pt"]["sha1"]
    results = json.loads((work / "results.json").read_text())
    assert results["settings"]["finetune_updates"] == 30 and "control" in results["models"]
    # the baseline did not change: its cached result is kept
    assert "generate.baseline" not in proc.stdout


@pytest.mark.parametrize("extra,message", [
    (["--finetune-updates", "30"], "--curve-updates x the number of --curve-targets (10 x 2) must equal"),
    (["--importance-types", "enc,bogus"], "--importance-types"),
    (["--composed-head-gates", "dec,all"], "--composed-head-gates: a comma list of enc, dec, encdec"),
    (["--l0drop-target", "1.0"], "--l0drop-target must lie in [0, 1)"),
    (["--composed-l0drop-target", "nan"], "--composed-l0drop-target must lie in [0, 1)"),
    (["--attention-reg-lambda", "nan"], "--attention-reg-lambda must be a positive number"),
    (["--steps", "baseline,nonsense"], "unknown step 'nonsense'"),
    (["--layers", "1", "--steps", "composed"], "step composed gates the states between encoder layers"),
    (["--gold-alignments", "/nonexistent/test.align"], "no such file"),
    (["--distill-temperature", "2"], "--distill-temperature is the temperature of the distillation term: it needs"),
    (["--seq-kd-shards", "3"], "--seq-kd-shards splits the decoding of --seq-kd's data: it needs --seq-kd"),
])
def test_recipe_refuses_bad_options_before_work(raw_corpus, tmp_path, extra, message, capsys):
    assert message in recipe_refusal(raw_corpus, tmp_path / "work", extra, capsys)
    assert not (tmp_path / "work").exists()


def test_pattern_pos_from_a_data_bin_needs_tags(tmp_path, capsys):
    """The POS pattern tags the prepared source text; from a data-bin the recipe asks for the tags files."""
    from fairseq_sparse.recipe.main import main

    (tmp_path / "bin").mkdir()
    argv = ["--data-bin", str(tmp_path / "bin"), "-s", "en", "-t", "de", "--work-dir", str(tmp_path / "work"),
            "--steps", "pattern_pos"]
    assert f"write {tmp_path / 'work'}/tags/train.tags" in refused_in_process(main, argv, capsys, status=None)
    assert not (tmp_path / "work").exists()


def test_recipe_at_character_level(raw_corpus, tmp_path):
    """--char-level (Zhang, Titov & Sennrich 2021 Sec. 6): the corpus split into characters with the word-boundary
    symbol, no BPE learnt, the hypotheses joined back into words before BLEU, and the characters L0Drop prunes
    reported by their position inside the word (Fig. 6)."""
    from fairseq_sparse.recipe.options import CHAR_BOUNDARY

    work = tmp_path / "work"
    tiny = [x for x in TINY if x not in ("--bpe-merges", "100")] + ["--baseline-updates", "10", "--finetune-updates",
                                                                    "10", "--curve-updates", "5"]
    run(RECIPE + ["--corpus", str(raw_corpus), "-s", "en", "-t", "de", "--work-dir", str(work), "--char-level",
                  "--steps", "prepare,baseline,l0drop,report"] + tiny)
    assert not (work / "tok" / "bpe.codes").exists()
    symbols = {l.split()[0] for l in (work / "data-bin" / "dict.en.txt").read_text().splitlines()}
    assert CHAR_BOUNDARY in symbols and max(len(s) for s in symbols if not s.startswith("madeupword")) == 1
    results = json.loads((work / "results.json").read_text())
    assert results["models"]["l0drop"]["sentences"] == 25
    decoded = json.loads((work / "results" / "l0drop.json").read_text())["result"]["hypotheses"]
    assert len(decoded) == 25 and not any(CHAR_BOUNDARY in str(h) for h in decoded)  # joined back into words
    chars = results["attention"]["l0drop"]["char_positions"]
    assert sum(r["chars"] for r in chars) > 0
    report = (work / "REPORT.md").read_text()
    assert "character level" in report and "by their relative position inside the word" in report


def test_a_model_made_with_other_options_or_more_updates_is_refused_not_reused(raw_corpus, baseline_work, tmp_path):
    """Every trained model is keyed by its command line (but its budget) and start checkpoint, the data by the
    corpus and its preparation options: a re-run that changes one is refused with the option named, before any
    work, and nothing is written or reused under the new label (issue 45)."""
    work = copy_of(baseline_work, tmp_path)
    recipe(raw_corpus, work, ["--steps", "control", "--threads", "1"])
    before = {p: os.path.getmtime(p) for p in work.rglob("*") if p.is_file()}
    for extra, message in (
            (["--finetune-updates", "10", "--curve-updates", "5", "--steps", "control"],
             "control in .* has 20 updates, more than this run's --finetune-updates 10"),
            (["--finetune-lr", "0.001", "--steps", "control,report"], r"--lr 0.0005 \(this run: 0.001\)"),
            (["--finetune-lr", "0.001", "--steps", "report"], r"control in .* was made with --lr 0.0005"),
            (["--bpe-merges", "50", "--steps", "baseline"], r"the data in .* was made with --bpe-merges 100 \(this run: 50\)"),
            (["--seed", "3", "--steps", "baseline"], r"baseline in .* was made with --seed 1 \(this run: 3\)")):
        proc = recipe(raw_corpus, work, extra + ["--threads", "1"], check=False)
        assert proc.returncode != 0 and re.search(message, proc.stderr), (extra, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr
    after = {p: os.path.getmtime(p) for p in work.rglob("*") if p.is_file()}
    assert after == before  # nothing written, nothing remade
    # the corpus's content is part of the data's key too
    changed = _corrupt(raw_corpus, tmp_path, lambda d: (d / "train.de").write_text(
        "x" + (d / "train.de").read_text()))
    proc = recipe(changed, work, ["--steps", "control", "--threads", "1"], check=False)
    assert proc.returncode != 0 and "train.de " in proc.stderr and "was made with" in proc.stderr


def test_sigterm_stops_the_training_and_releases_the_lock(raw_corpus, baseline_work, tmp_path):
    """SIGTERM to the recipe stops the fairseq-train it runs (no training left alone in the save dir) and
    releases the step's lock; a second run of the same step meanwhile is refused; the re-run keeps the stopped
    run's log (issue 45)."""
    import signal
    import time

    work = copy_of(baseline_work, tmp_path)
    argv = RECIPE + ["--corpus", str(raw_corpus), "-s", "en", "-t", "de", "--work-dir", str(work)] + TINY
    proc = subprocess.Popen(argv + ["--finetune-updates", "100000", "--curve-updates", "50000", "--steps", "control",
                                    "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = work / "logs" / "control.log"
    deadline = time.time() + 120
    while time.time() < deadline and "train_inner" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.5)
    assert (work / "locks" / "control.lock").read_text().split()[0] == str(proc.pid)
    second = run(argv + ["--finetune-updates", "100000", "--curve-updates", "50000", "--steps", "control"],
                 check=False)
    assert second.returncode != 0 and f"another recipe run (pid {proc.pid}) holds" in second.stderr
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "stopped by signal SIGTERM" in out, out[-2000:]
    time.sleep(1)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not [line for line in ps.splitlines() if "fairseq-train" in line and str(work) in line]
    assert not (work / "locks" / "control.lock").exists()
    # a re-run with a smaller budget is refused (the stopped run saved checkpoints past it); trained again from the
    # start, as the refusal says, it keeps the stopped run's log beside its own
    stopped_log = log.read_text()
    refused = recipe(raw_corpus, work, ["--steps", "control", "--threads", "1"], check=False)
    assert refused.returncode != 0 and "more than this run's --finetune-updates 20" in refused.stderr
    shutil.rmtree(work / "control")
    recipe(raw_corpus, work, ["--steps", "control", "--threads", "1"])
    assert (work / "logs" / "control.log.1").read_text() == stopped_log and log.read_text() != stopped_log

    # SIGKILL cannot be caught: the training goes on, holding the lock it inherited, and a re-run is refused
    # (naming it) instead of training beside it in control/ (issue 55); once it has gone, the lock is taken over
    proc = subprocess.Popen(argv + ["--finetune-updates", "100000", "--curve-updates", "50000", "--steps", "control",
                                    "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lock = work / "locks" / "control.lock"
    deadline = time.time() + 120
    # its fairseq-train started (its pid beside the run's in the lock file; the earlier log moved aside), then trains
    while time.time() < deadline and len(lock.read_text().split() if lock.exists() else []) < 2:
        time.sleep(0.2)
    while time.time() < deadline and "train_inner" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.5)
    child = int(lock.read_text().split()[1])
    proc.kill()
    proc.communicate(timeout=60)
    try:
        again = run(argv + ["--finetune-updates", "100000", "--curve-updates", "50000", "--steps", "control"],
                    check=False)
        assert again.returncode != 0 and f"a command of a recipe run that was killed (pid {child};" in again.stderr
        assert "Traceback" not in again.stderr
    finally:
        os.kill(child, signal.SIGKILL)
        time.sleep(1)  # a killed process's descriptors, and so its lock, are gone once it has died
    from fairseq_sparse.recipe.workdir import StepLock, WorkDir

    with StepLock(WorkDir(str(work)), ["control"]):
        pass
    assert not (work / "locks" / "control.lock").exists()


def test_decodings_with_the_fixed_shape_search_give_fairseqs_hypotheses(raw_corpus, baseline_work, tmp_path):
    """--search fixed_shape: every decoding runs through --task translation_fixed_shape, keyed apart from fairseq's
    search (so the baseline is decoded again), with the same hypotheses and score as fairseq's."""
    work = copy_of(baseline_work, tmp_path)
    before = json.loads((work / "results" / "baseline.json").read_text())
    recipe(raw_corpus, work, ["--steps", "baseline", "--search", "fixed_shape", "--threads", "1"])
    after = json.loads((work / "results" / "baseline.json").read_text())
    assert after["produced_by"]["settings"]["search"] == "fixed_shape" and "search" not in before["produced_by"]["settings"]
    assert "--task translation_fixed_shape" in (work / "commands" / "report.sh").read_text()
    assert [h for h, _ in after["result"]["hypotheses"]] == [h for h, _ in before["result"]["hypotheses"]]
    assert after["result"]["score"] == before["result"]["score"]
    assert max(abs(a - b) for (_, a), (_, b) in zip(after["result"]["hypotheses"], before["result"]["hypotheses"])) < 1e-4


def test_a_continued_fine_tuning_keeps_the_baselines_adam_and_rate(raw_corpus, baseline_work, tmp_path, monkeypatch):
    work = copy_of(baseline_work, tmp_path)
    recipe(raw_corpus, work, ["--steps", "control,l0drop", "--finetune-protocol", "continue", "--threads", "1"])
    start = read_state(str(work / "baseline" / "checkpoint_continue.pt"))
    assert start["optimizer_history"][-1]["num_updates"] == 0
    for name in ("control", "l0drop"):
        state = read_state(str(work / name / "checkpoint_last.pt"))
        assert state["optimizer_history"][-1]["num_updates"] == 20
        steps = {float(s["step"]) for s in state["last_optimizer_state"]["state"].values() if "step" in s}
        assert 60.0 in steps  # the baseline's 40 Adam steps go on: 40 + 20 (the gates' new state: 20)
        cmd = (work / "commands" / f"{name}.sh").read_text()
        assert "--lr-scheduler inverse_sqrt_continued" in cmd and "--lr-offset-updates 40" in cmd
    # issue 62 items 2 and 8: a refused continued start (here, a full disk) ends in one line and leaves control/ as it
    # was (it left control/key.json, so the corrected re-run was refused as if control had trained)
    import torch

    shutil.rmtree(work / "control")
    os.remove(work / "baseline" / "checkpoint_continue.pt")

    def full_disk(obj, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"half")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0\nmore")

    monkeypatch.setattr(torch, "save", full_disk)
    proc = recipe(raw_corpus, work, ["--steps", "control", "--finetune-protocol", "continue", "--threads", "1"],
                  check=False)
    assert proc.returncode != 0 and "cannot write baseline/checkpoint_continue.pt" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (work / "control").exists()
    assert [f for f in os.listdir(work / "baseline") if ".tmp" in f or "continue" in f] == []
    monkeypatch.undo()
    recipe(raw_corpus, work, ["--steps", "control", "--finetune-protocol", "continue", "--threads", "1"])
    assert read_state(str(work / "control" / "checkpoint_last.pt"))["optimizer_history"][-1]["num_updates"] == 20
