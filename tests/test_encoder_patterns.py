"""Rule-based encoder-output patterns (Zhang, Titov & Sennrich 2021, Sec. 7): the gates of each rule against
hand-computed ones, the setting chosen for a rate, and exact pruned decoding of a pattern model."""
import pytest
import torch

from fairseq_sparse.modules.encoder_patterns import EncoderOutputPattern, frequency_ranks, setting_for_rate

# a toy dictionary: 4 specials (bos, pad, eos, unk) then words 4..9 with these counts
COUNTS = [1, 1, 1, 1, 50, 5, 30, 10, 3, 1]
NSPECIAL, PAD, EOS = 4, 1, 2


def gates(kind, tokens, **kw):
    src = torch.tensor(tokens)
    return EncoderOutputPattern(kind, COUNTS, NSPECIAL, EOS, **kw)(src, src.eq(PAD)).tolist()


def test_frequency_ranks_most_frequent_first():
    assert frequency_ranks(COUNTS, NSPECIAL) == [4, 6, 7, 5, 8, 9]


def test_freq_drops_the_top_k_and_keeps_eos_and_zeroes_padding():
    assert gates("freq", [[4, 5, 6, 7, 2, 1]], top_k=2) == [[0, 1, 0, 1, 1, 0]]
    assert gates("freq", [[4, 6, 2]], top_k=0) == [[1, 1, 1]]  # top 0: nothing dropped


def test_inv_freq_drops_ranks_from_min_rank():
    # ranks (1-based): 4 -> 1, 6 -> 2, 7 -> 3, 5 -> 4, 8 -> 5, 9 -> 6; min rank 4 drops 5, 8, 9
    assert gates("inv-freq", [[4, 5, 6, 7, 8, 9, 2]], min_rank=4) == [[1, 0, 1, 1, 0, 0, 1]]


def test_group_keeps_every_kth_real_position_with_left_padding():
    assert gates("group", [[4, 5, 6, 7, 8, 2]], every=2) == [[1, 0, 1, 0, 1, 1]]
    # left padding: positions count from the first real token
    assert gates("group", [[1, 1, 4, 5, 6, 2]], every=2) == [[0, 0, 1, 0, 1, 1]]
    assert gates("group", [[4, 5, 6, 7, 2]], every=3) == [[1, 0, 0, 1, 1]]


def test_setting_for_a_rate():
    total = sum(COUNTS[NSPECIAL:])  # 99
    # freq: top 1 = 50/99 = 0.505, top 2 = 80/99 = 0.808
    assert setting_for_rate("freq", COUNTS, NSPECIAL, 0.5) == 1
    assert setting_for_rate("freq", COUNTS, NSPECIAL, 0.75) == 2
    # inv-freq: ranks >= 4 = (5 + 3 + 1) / 99 = 0.091, >= 3 = 19/99 = 0.19, >= 2 = 49/99 = 0.495
    assert setting_for_rate("inv-freq", COUNTS, NSPECIAL, 0.2) == 3
    assert setting_for_rate("inv-freq", COUNTS, NSPECIAL, 0.45) == 2
    assert setting_for_rate("group", COUNTS, NSPECIAL, 0.5) == 2
    assert setting_for_rate("group", COUNTS, NSPECIAL, 2 / 3) == 3
    p = EncoderOutputPattern("freq", COUNTS, NSPECIAL, EOS, rate=0.5)
    assert p.setting == 1 and p.dropped_share(COUNTS[:]) == pytest.approx(50 / (total + 4))


@pytest.mark.parametrize("kw,message", [({"rate": 1.0}, "[0, 1)"), ({"rate": float("nan")}, "[0, 1)"),
                                        ({}, "give its setting or a rate")])
def test_bad_settings_are_refused(kw, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)")):
        EncoderOutputPattern("freq", COUNTS, NSPECIAL, EOS, **kw)
    with pytest.raises(ValueError, match="unknown encoder output pattern"):
        EncoderOutputPattern("pos-tags", COUNTS, NSPECIAL, EOS, top_k=3)
    with pytest.raises(ValueError, match="takes no rate"):
        EncoderOutputPattern("pos", COUNTS, NSPECIAL, EOS, rate=0.3, symbols=SYMBOLS)


# the toy dictionary's symbols: "new@@" continues into the next piece
SYMBOLS = ["<s>", "<pad>", "</s>", "<unk>", "the", "new@@", "york", ".", "can", "there"]


def test_pos_drops_function_words_punctuation_md_ex_and_later_pieces():
    """Zhang, Titov & Sennrich 2021 Sec. 7: function words (CC IN RP TO UH DT WP), punctuation, MD, EX and BPEO."""
    from fairseq_sparse.analysis.token_types import tag_id

    pattern = EncoderOutputPattern("pos", COUNTS, NSPECIAL, EOS, symbols=SYMBOLS)
    #        pad  there  can  the  new@@  york  york  .   </s>
    src = torch.tensor([[1, 9, 8, 4, 5, 6, 6, 7, 2]])
    tags = torch.tensor([[0] + [tag_id(t) for t in ("EX", "MD", "DT", "NNP", "NNP", "NN", ".")] + [0]])
    assert pattern(src, src.eq(PAD), tags).tolist() == [[0, 0, 0, 0, 1, 0, 1, 0, 1]]
    # an unknown tag and a content tag are kept; "york" after "new@@" is a later piece whatever its tag
    tags = torch.tensor([[0, tag_id("XYZ"), tag_id("VB"), tag_id("JJ"), tag_id("NN"), tag_id("NN"), tag_id("NN"),
                          tag_id("NN"), 0]])
    assert pattern(src, src.eq(PAD), tags).tolist() == [[0, 1, 1, 1, 1, 0, 1, 1, 1]]
    with pytest.raises(ValueError, match="--task translation_source_tags"):
        pattern(src, src.eq(PAD))
    assert "MD" in pattern.extra_repr() and pattern.dropped_share(COUNTS) is None


# ----------------------------------------------------------------------------------------------
# end to end: fine-tuned with a rule, decoded exactly through the compressed memory


@pytest.fixture(scope="module")
def freq_pattern_ckpt(corpus, stock_transformer_ckpt, tmp_path_factory):
    """The stock checkpoint fine-tuned 20 updates with the freq pattern at rate 0.3."""
    from test_cli import train

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
    from test_cli import assert_same_decoding, generate, sparsity_line

    pruned, unpruned = [generate(corpus["bin"], freq_pattern_ckpt, ["--model-overrides", repr(
        dict(overrides, pruned_decoding=p))]) for p in (True, False)]
    assert_same_decoding(pruned, unpruned)
    rate = sparsity_line(pruned)[0]
    assert rate == pytest.approx(100 * expected_rate(corpus, freq_pattern_ckpt, overrides), abs=0.05)
    assert rate > 10


@pytest.mark.parametrize("options,message", [
    ({"encoder_output_pattern_top_k": 5}, "--encoder-output-pattern-top-k needs --encoder-output-pattern"),
    ({"encoder_output_pattern": "group", "encoder_output_pattern_top_k": 5}, "does not apply"),
    ({"encoder_output_pattern": "freq"}, "needs exactly one of"),
    ({"encoder_output_pattern": "freq", "encoder_output_pattern_top_k": 5, "encoder_output_pattern_rate": 0.3},
     "needs exactly one of"),
    ({"encoder_output_pattern": "freq", "encoder_output_pattern_rate": 1.5}, "must lie in [0, 1)"),
    ({"encoder_output_pattern": "group", "encoder_output_pattern_every": 0}, "must be >= 1"),
    ({"encoder_output_pattern": "pos", "encoder_output_pattern_rate": 0.4},
     "does not apply to --encoder-output-pattern pos"),
    ({"encoder_output_pattern": "pos", "encoder_output_pattern_top_k": 4},
     "does not apply to --encoder-output-pattern pos"),
    ({"encoder_output_pattern": "freq", "encoder_output_pattern_top_k": 5, "l0drop_between_layers": True},
     "--l0drop-between-layers"),
    ({"encoder_output_pattern": "freq", "encoder_output_pattern_top_k": 5, "l0drop_target_sparsity": "0.4"},
     "no L0Drop gates"),
])
def test_bad_pattern_options_are_refused(options, message):
    from argparse import Namespace

    from fairseq_sparse.models.transformer_l0drop import check_pattern_args

    args = Namespace(encoder_output_pattern="none", encoder_output_pattern_top_k=None,
                     encoder_output_pattern_min_rank=None, encoder_output_pattern_every=None,
                     encoder_output_pattern_rate=None, l0drop_between_layers=False)
    for k, v in options.items():
        setattr(args, k, v)
    with pytest.raises(ValueError) as e:
        check_pattern_args(args)
    assert message in str(e.value)


def test_pattern_with_a_lambda_fails_before_training(corpus, tmp_path):
    """The refusal reaches the fairseq-train user before anything is written."""
    from test_cli import train

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
    from test_cli import assert_same_decoding, generate, sparsity_line, train

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
    from test_cli import train

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
    proc = run([console("fairseq-sparse-pos-tags"), "--input", str(src), "--output", str(out)], check=False)
    if proc.returncode != 0 and "spacy-model" in proc.stderr:
        pytest.skip("spaCy's English model is not installed")
    lines = out.read_text().split("\n")
    assert lines[0].split()[:2] == ["EX", "VBP"] and len(lines[0].split()) == 8 and lines[0].split()[-1] == "."
    assert lines[1:] == ["", "DT NN", ""]
    again = run([console("fairseq-sparse-pos-tags"), "--input", str(src), "--output", str(out)], check=False)
    assert again.returncode == 2 and "pass --overwrite" in again.stderr
