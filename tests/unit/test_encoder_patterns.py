"""Rule-based encoder-output patterns (Zhang, Titov & Sennrich 2021, Sec. 7): the gates of each rule against
hand-computed ones, the setting chosen for a rate, and exact pruned decoding of a pattern model.
Here the pure tests; those that train or run console scripts are in tests/e2e/test_encoder_patterns_e2e.py."""
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
    ({"encoder_output_pattern": "group", "encoder_output_pattern_every": 2, "encoder_output_pattern_whole_words": True},
     "applies to the freq and inv-freq patterns, not group"),
    ({"encoder_output_pattern_whole_words": True}, "needs --encoder-output-pattern freq or inv-freq"),
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


def test_whole_words_drop_a_piece_only_with_its_whole_word():
    """--encoder-output-pattern-whole-words: "new@@ york" is dropped only when both pieces are among the dropped."""
    pattern = EncoderOutputPattern("freq", COUNTS, NSPECIAL, EOS, top_k=2, symbols=SYMBOLS, whole_words=True)
    # top 2 by count: the (4) and york (6); new@@ (5) is not dropped, so "new@@ york" keeps both pieces
    #        pad  the  new@@  york  the  york  </s>
    src = torch.tensor([[1, 4, 5, 6, 4, 6, 2]])
    assert pattern(src, src.eq(PAD)).tolist() == [[0, 0, 1, 1, 0, 0, 1]]
    piecewise = EncoderOutputPattern("freq", COUNTS, NSPECIAL, EOS, top_k=2, symbols=SYMBOLS)
    assert piecewise(src, src.eq(PAD)).tolist() == [[0, 0, 1, 0, 0, 0, 1]]
    both = EncoderOutputPattern("freq", COUNTS, NSPECIAL, EOS, top_k=4, symbols=SYMBOLS, whole_words=True)
    assert both(src, src.eq(PAD)).tolist() == [[0, 0, 0, 0, 0, 0, 1]]  # new@@ is 4th: the whole word goes
    with pytest.raises(ValueError, match="whole words apply to the freq and inv-freq"):
        EncoderOutputPattern("group", COUNTS, NSPECIAL, EOS, every=2, symbols=SYMBOLS, whole_words=True)
