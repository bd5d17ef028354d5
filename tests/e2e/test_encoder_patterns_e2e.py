"""Rule-based encoder-output patterns (Zhang, Titov & Sennrich 2021, Sec. 7): the gates of each rule against
hand-computed ones, the setting chosen for a rate, and exact pruned decoding of a pattern model.
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_encoder_patterns.py."""
import pytest


# ----------------------------------------------------------------------------------------------
# end to end: fine-tuned with a rule, decoded exactly through the compressed memory


@pytest.fixture(scope="module")
def freq_pattern_ckpt(corpus, stock_transformer_ckpt, tmp_path_factory):
    """The stock checkpoint fine-tuned 20 updates with the freq pattern at rate 0.3."""
    from helpers.cli import train

    save = str(tmp_path_factory.mktemp("pattern"))
    proc = train(corpus["bin"], save, ["--arch", "transformer_l0drop", "--encoder-output-pattern", "freq",
                                       "--encoder-output-pattern-rate", "0.3", "--finetune-from-model",
                                       stock_transformer_ckpt], max_update=20)
    assert "encoder output pattern freq, top_k=" in proc.log
    return save + "/checkpoint_last.pt"


def expected_rate(corpus, ckpt, overrides=None):
    """The share of the test split's real source tokens (EOS included) the checkpoint's pattern drops."""
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([ckpt], arg_overrides=dict(
        data=corpus["bin"], **overrides))
    task.load_dataset("test")
    src = task.dataset("test").src
    pattern = models[0].encoder.pattern
    dropped = tokens = 0
    for i in range(len(src)):
        tokens_i = src[i].unsqueeze(0)
        g = pattern(tokens_i, None)
        dropped += int((g == 0).sum())
        tokens += tokens_i.numel()
    return dropped / tokens


@pytest.mark.parametrize("overrides", [{}, {"encoder_output_pattern": "group", "encoder_output_pattern_rate": None,
                                            "encoder_output_pattern_every": 2}])
def test_pattern_model_decodes_exactly_and_prints_its_rate(corpus, freq_pattern_ckpt, overrides):
    """Pruned == unpruned decoding (beam 4) of a pattern model, also with another rule set at decoding time;
    the printed sparsity rate is the rule's share of the test sources."""
    from helpers.cli import assert_same_decoding, generate, sparsity_line

    pruned, unpruned = [generate(corpus["bin"], freq_pattern_ckpt, ["--model-overrides", repr(
        dict(overrides, pruned_decoding=p))]) for p in (True, False)]
    assert_same_decoding(pruned, unpruned)
    rate = sparsity_line(pruned)[0]
    assert rate == pytest.approx(100 * expected_rate(corpus, freq_pattern_ckpt, overrides), abs=0.05)
    assert rate > 10


def test_pattern_with_a_lambda_fails_before_training(corpus, tmp_path):
    """The refusal reaches the fairseq-train user before anything is written."""
    from helpers.cli import train

    proc = train(corpus["bin"], str(tmp_path / "x"), [
        "--arch", "transformer_l0drop", "--encoder-output-pattern", "freq", "--encoder-output-pattern-top-k", "5",
        "--criterion", "label_smoothed_cross_entropy_with_sparsity", "--l0drop-lambda", "0.3"], check=False)
    assert proc.returncode != 0 and "no L0Drop gates" in proc.log, proc.log[-2000:]
    assert not (tmp_path / "x" / "checkpoint_last.pt").exists()


# ----------------------------------------------------------------------------------------------
# the POS pattern end to end: tags carried by the task translation_source_tags


def tag_of(word):
    """The synthetic corpus's words: the0 .. the11 are function words (DT), swap a verb, w17 nouns."""
    return "DT" if word.startswith("the") else ("VB" if word == "swap" else "NN")


@pytest.fixture(scope="module")
def tags_dir(corpus, tmp_path_factory):
    """{train,valid,test}.tags of the corpus (one per word), written from its raw text."""
    out = tmp_path_factory.mktemp("tags")
    for split in ("train", "valid", "test"):
        with open(f"{corpus['raw']}/{split}.src") as f:
            lines = [" ".join(tag_of(w) for w in line.split()) for line in f.read().splitlines()]
        (out / f"{split}.tags").write_text("\n".join(lines) + "\n")
    return str(out)


def test_pos_pattern_trains_and_decodes_exactly(corpus, stock_transformer_ckpt, tags_dir, tmp_path):
    """fairseq-train and fairseq-generate with --task translation_source_tags: the function words (and nothing
    else) are dropped, the printed rate is their share, and pruned == unpruned decoding (beam 4)."""
    from helpers.cli import assert_same_decoding, generate, sparsity_line, train

    task = ["--task", "translation_source_tags", "--source-tags-dir", tags_dir]
    save = str(tmp_path / "pos")
    proc = train(corpus["bin"], save, task + ["--arch", "transformer_l0drop", "--encoder-output-pattern", "pos",
                                              "--finetune-from-model", stock_transformer_ckpt], max_update=20)
    assert "encoder output pattern pos, drops" in proc.log
    ckpt = save + "/checkpoint_last.pt"
    pruned, unpruned = [generate(corpus["bin"], ckpt, task + ["--model-overrides", repr({"pruned_decoding": p})])
                        for p in (True, False)]
    assert_same_decoding(pruned, unpruned)
    with open(f"{corpus['raw']}/test.src") as f:
        lines = f.read().splitlines()
    words = [w for line in lines for w in line.split()]
    function = sum(w.startswith("the") for w in words)
    rate, dropped, tokens, _, _ = sparsity_line(pruned)
    assert (dropped, tokens) == (function, len(words) + len(lines))  # EOS kept
    assert rate > 10


def test_pos_pattern_needs_the_task_and_matching_tags(corpus, tags_dir, tmp_path):
    """A clear error before training: the POS pattern without the task, the task without tags for a split, a
    tags file with a wrong number of tags on a line."""
    from helpers.cli import train

    proc = train(corpus["bin"], str(tmp_path / "a"), ["--arch", "transformer_l0drop", "--encoder-output-pattern",
                                                      "pos"], check=False)
    assert proc.returncode != 0 and "--task translation_source_tags" in proc.log, proc.log[-2000:]
    task = ["--task", "translation_source_tags", "--arch", "transformer_l0drop", "--encoder-output-pattern", "pos"]
    proc = train(corpus["bin"], str(tmp_path / "b"), task + ["--source-tags-dir", str(tmp_path)], check=False)
    assert proc.returncode != 0 and f"no tags file {tmp_path}/" in proc.log, proc.log[-2000:]
    bad = tmp_path / "bad"
    bad.mkdir()
    for split in ("train", "valid", "test"):
        lines = open(f"{tags_dir}/{split}.tags").read().splitlines()
        if split == "valid":
            lines[6] += " NN"
        (bad / f"{split}.tags").write_text("\n".join(lines) + "\n")
    proc = train(corpus["bin"], str(tmp_path / "c"), task + ["--source-tags-dir", str(bad)], check=False)
    assert proc.returncode != 0 and f"{bad}/valid.tags line 7:" in proc.log, proc.log[-2000:]
    assert not any((tmp_path / d / "checkpoint_last.pt").exists() for d in "abc")


def test_pos_tags_tool_tags_words_not_pieces(tmp_path):
    """fairseq-sparse-pos-tags (spaCy, an optional extra): one tag per word, BPE pieces joined, empty lines
    kept, the output never overwritten silently."""
    pytest.importorskip("spacy")
    from conftest import console, run

    src = tmp_path / "test.bpe.en"
    src.write_text("There are new@@ york prices of 3 packages .\n\nthe cat\n")
    out = tmp_path / "test.tags"
    proc = run([console("fairseq-sparse-pos-tags"), "--input", str(src), "--output", str(out)], check=False,
               console=True)
    if proc.returncode != 0 and "spacy-model" in proc.stderr:
        pytest.skip("spaCy's English model is not installed")
    lines = out.read_text().split("\n")
    assert lines[0].split()[:2] == ["EX", "VBP"] and len(lines[0].split()) == 8 and lines[0].split()[-1] == "."
    assert lines[1:] == ["", "DT NN", ""]
    again = run([console("fairseq-sparse-pos-tags"), "--input", str(src), "--output", str(out)], check=False)
    assert again.returncode == 2 and "pass --overwrite" in again.stderr


# ----------------------------------------------------------------------------------------------
# merging instead of dropping (--encoder-output-merge): trained, decoded exactly, exported, probed


@pytest.fixture(scope="module")
def merged_ckpt(corpus, stock_transformer_ckpt, tmp_path_factory):
    """The stock checkpoint fine-tuned 20 updates with the freq rule at rate 0.3, pruned states merged (attention)."""
    from helpers.cli import train

    save = str(tmp_path_factory.mktemp("merged"))
    proc = train(corpus["bin"], save, ["--arch", "transformer_l0drop", "--encoder-output-pattern", "freq",
                                       "--encoder-output-pattern-rate", "0.3", "--encoder-output-merge", "attention",
                                       "--finetune-from-model", stock_transformer_ckpt], max_update=20)
    assert "(merge): EncoderOutputMerge(" in proc.log and "initialising 1 gate parameters absent" in proc.log
    return save + "/checkpoint_last.pt"


def test_a_merged_model_decodes_exactly(corpus, merged_ckpt):
    """(Its TorchScript export: tests/e2e/test_export_e2e.py.)"""
    from helpers.cli import assert_same_decoding, generate, sparsity_line

    pruned, unpruned = [generate(corpus["bin"], merged_ckpt, ["--model-overrides", repr({"pruned_decoding": p})])
                        for p in (True, False)]
    assert_same_decoding(pruned, unpruned)
    assert sparsity_line(pruned)[0] > 10


def test_the_content_probe_writes_the_states_against_their_floor(corpus, merged_ckpt, tmp_path):
    import json

    from conftest import USER_DIR, console, run
    from helpers.cli import ENV

    out, probe = tmp_path / "gates.tsv", tmp_path / "probe.json"
    cmd = [console("fairseq-sparse-l0drop-gates"), corpus["bin"], "--user-dir", USER_DIR, "--path", merged_ckpt,
           "--gen-subset", "valid", "--gates-output", str(out), "--cpu", "--batch-size", "16",
           "--content-probe", str(probe), "--content-probe-sentences", "100"]
    proc = run(cmd, env=ENV)
    result = json.loads(probe.read_text())
    assert result["sentences"] == 100 and result["states"]["pieces"] > 10
    assert result["gain_bits"] == pytest.approx(result["embeddings"]["nll_bits"] - result["states"]["nll_bits"], abs=1e-3)
    assert "content probe: pruned pieces recovered from the kept states" in proc.stdout
    proc = run(cmd + ["--content-probe", str(out)], env=ENV, check=False)  # an output named twice
    assert proc.returncode == 2 and "must name different files" in proc.stderr and "Traceback" not in proc.stderr
