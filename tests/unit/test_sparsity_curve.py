"""fairseq-sparse-sparsity-curve: one fine-tuning with a schedule of target sparsities, one checkpoint per
target, and the BLEU/sparsity curve over them (Zhang, Titov & Sennrich 2021 Fig. 4; Voita et al. 2019 Fig. 7).

Checks: the token types (closed form), the target each checkpoint was trained at last, the interval
checkpoints of a save dir; end to end, fairseq-train with a schedule writes a checkpoint per target and
the tool measures them (TSV rows, PNGs); bad input is refused clearly, before any output is written.
Here the pure tests; those that train or run console scripts are in tests/e2e/test_sparsity_curve_e2e.py.
"""
import os

import pytest
import torch

import fairseq_sparse  # noqa: F401  (registers the plugin, allowlists fairseq checkpoint classes)
from fairseq_sparse.analysis import sparsity_curve as sc
from fairseq_sparse.analysis import token_types as tt


# ----------------------------------------------------------------------------------------------
# token types and targets, in closed form


def test_token_types_join_pieces_into_words():
    pieces = ["The", "new@@", "york", "Times", ",", "&quot;", "wasn", "n't", "--", "€", "d@@", "og", ".", "2.0"]
    # a word of several pieces: bpeh for its first piece, bpeo for the others (Zhang, Titov & Sennrich 2021 Sec. 6)
    assert tt.piece_types(pieces, "@@") == [
        "function", "bpeh", "bpeo", "content", "punct", "punct", "content", "function", "punct", "punct",
        "bpeh", "bpeo", "punct", "other"]
    assert tt.piece_types(pieces[:3], "@@", subwords=False) == ["function", "content", "content"]
    # without the marker every piece is a word: "d@@" and "og" are content words each
    assert tt.piece_types(["to@@", "day"], None) == ["content", "content"]
    assert tt.piece_types(["to@@", "day"], "@@", subwords=False) == ["content", "content"]  # no function word
    assert tt.piece_types(["\u2581of", "\u2581the"], None) == ["function", "function"]  # sentencepiece mark


def test_tag_groups_and_tags_per_word_or_piece():
    """Footnote 9: function CC IN RP TO UH DT WP; content MD JJ* NN* RB* VB*; punctuation; the rest other."""
    assert [tt.tag_type(t) for t in ("CC", "IN", "RP", "TO", "UH", "DT", "WP")] == ["function"] * 7
    assert [tt.tag_type(t) for t in ("MD", "JJR", "NNPS", "RBS", "VBZ")] == ["content"] * 5
    assert [tt.tag_type(t) for t in (".", ",", "``", "-LRB-", "HYPH")] == ["punct"] * 5
    assert [tt.tag_type(t) for t in ("CD", "EX", "FW", "SYM", "PRP", "WDT")] == ["other"] * 6
    pieces = ["There", "are", "new@@", "york", "3", "."]
    per_word = ["EX", "VBP", "NNP", "CD", "."]
    assert tt.piece_types(pieces, "@@", tags=per_word) == ["other", "content", "bpeh", "bpeo", "other", "punct"]
    per_piece = ["EX", "VBP", "NNP", "XX", "CD", "."]  # a word's first piece's tag counts
    assert tt.piece_types(pieces, "@@", tags=per_piece, subwords=False) == [
        "other", "content", "content", "content", "other", "punct"]
    with pytest.raises(ValueError, match="4 tags for 5 words"):
        tt.piece_types(pieces, "@@", tags=per_word[:4])


def test_read_tags_checks_lines_and_counts(tmp_path):
    sentences = [["a", "new@@", "york"], ["b", "."]]
    good = tmp_path / "good.tags"
    good.write_text("DT NNP\nNN . \n")  # per word, then per piece
    assert tt.read_tags(str(good), sentences, "@@") == [["DT", "NNP"], ["NN", "."]]
    (tmp_path / "short.tags").write_text("DT NNP\n")
    with pytest.raises(ValueError, match="short.tags has 1 lines, the split 2 sentences"):
        tt.read_tags(str(tmp_path / "short.tags"), sentences, "@@")
    (tmp_path / "count.tags").write_text("DT NNP\nNN . X\n")
    with pytest.raises(ValueError, match="count.tags line 2: 3 tags for a sentence of 2 words"):
        tt.read_tags(str(tmp_path / "count.tags"), sentences, "@@")


def test_char_positions_in_words():
    """Fig. 6: 0 at a word's first character, 1 at its last; boundaries and one-character words have none."""
    chars = list("ab_c_def") + ["_"]
    assert tt.char_positions(chars, "_") == [0.0, 1.0, None, None, None, 0.0, 0.5, 1.0, None]
    counts = tt.PrunedPositions(bins=2)
    counts.add(tt.char_positions(chars, "_"), [True, False, True, True, False, False, True, True, True])
    rows = counts.rows()
    assert [(r["chars"], r["pruned"]) for r in rows] == [(2, 1), (3, 2)]  # 0.5 falls in the second bin
    assert [r["share_pruned"] for r in rows] == [0.5, pytest.approx(2 / 3)]
    assert [r["share_of_pruned"] for r in rows] == [pytest.approx(1 / 3), pytest.approx(2 / 3)]
    # the word-boundary symbols (Sec. 6: the share of space symbols pruned), counted apart from the bins
    flags = [True, False, True, True, False, False, True, True, True]
    found = tt.pruned_by_position([(0, list(zip(chars, flags)))], "_", bins=2)
    assert found.boundary() == {"chars": 3, "pruned": 2, "share_pruned": pytest.approx(2 / 3)}
    assert [(r["chars"], r["pruned"]) for r in found.rows()] == [(2, 1), (3, 2)]
    assert tt.PrunedPositions().boundary() == {"chars": 0, "pruned": 0, "share_pruned": None}


    assert [tt.is_punctuation(w) for w in ("", "a.", "...", "«", "1")] == [False, False, True, True, False]
    assert [tt.continuation_marker(v) for v in (None, "@@ ", "subword_nmt", "sentencepiece")] == [None, "@@", "@@", None]
    assert {"the", "of", "and", "is", "not", "n't", "she"} <= tt.ENGLISH_FUNCTION_WORDS
    assert 140 <= len(tt.ENGLISH_FUNCTION_WORDS) <= 200


def test_pruned_share_per_type_and_word_list_file(tmp_path):
    counts = tt.PrunedByType()
    counts.add(["punct", "function", "function", "content"], [True, True, False, False])
    counts.add(["content"], [True])
    assert counts.shares() == {"punct": 1.0, "function": 0.5, "content": 0.5, "other": None, "bpeh": None,
                               "bpeo": None}
    assert set(tt.PrunedByType().shares().values()) == {None}
    path = tmp_path / "fw.txt"
    path.write_text("# German\nDer\n\ndie\n")
    assert tt.read_function_words(str(path)) == {"der", "die"}
    assert tt.word_type("Die", tt.read_function_words(str(path))) == "function"
    (tmp_path / "empty.txt").write_text("\n# nothing\n")
    with pytest.raises(ValueError, match="holds no word"):
        tt.read_function_words(str(tmp_path / "empty.txt"))


@pytest.mark.parametrize("criterion,updates,expected", [
    # the checkpoint at k x hold was trained last at target k (forward of update n sees n - 1)
    (dict(l0drop_target_sparsity="0.3,0.6", sparsity_target_hold_updates=30, sparsity_target_warmup_updates=10),
     30, {"l0drop": 0.3}),
    (dict(l0drop_target_sparsity="0.3,0.6", sparsity_target_hold_updates=30, sparsity_target_warmup_updates=10),
     60, {"l0drop": 0.6}),
    (dict(l0drop_target_sparsity="0.3,0.6", sparsity_target_hold_updates=30, sparsity_target_warmup_updates=10),
     35, {"l0drop": 0.3 + 0.4 * 0.3}),  # 4 updates into the 10-update ramp from 0.3 to 0.6
    (dict(l0drop_target_sparsity="0.3,0.6", sparsity_target_hold_updates=30, sparsity_target_warmup_updates=10),
     500, {"l0drop": 0.6}),  # the last target holds on
    (dict(head_gates_target_sparsity="enc=0.2:0.4,encdec=0.1", sparsity_target_hold_updates=300,
          sparsity_target_warmup_updates=200), 600, {"head_gates_enc": 0.4, "head_gates_encdec": 0.1}),
    (dict(l0drop_target_sparsity=0.5), 101, {"l0drop": 0.25}),  # one target: the default 200-update ramp
    (dict(l0drop_target_sparsity=None, head_gates_target_sparsity=None), 300, {}),
    (dict(l0drop_target_sparsity="0.3,0.6", sparsity_target_hold_updates=30), None, {}),
])
def test_target_of_checkpoint(criterion, updates, expected):
    got = sc.checkpoint_targets(criterion, updates)
    assert got == pytest.approx(expected)


def test_saved_checkpoints_stage_ends_and_missing_stage_ends(tmp_path):
    for name in ("checkpoint_2_120.pt", "checkpoint_1_60.pt", "checkpoint_last.pt", "checkpoint3.pt",
                 "checkpoint_best.pt", "checkpoint_1_30.pt.tmp"):
        (tmp_path / name).write_text("")
    assert sorted(os.path.basename(p) for p in sc.saved_checkpoints(str(tmp_path))) == [
        "checkpoint3.pt", "checkpoint_1_60.pt", "checkpoint_2_120.pt"]
    # an epoch checkpoint that ends a target (180) is a stage end; one in the middle of a target (150) is not
    saved = [dict(path=p, updates=u, hold=60, stages=3) for p, u in (("b", 120), ("e", 150), ("a", 60), ("c", 180))]
    assert [i["path"] for i in sc.stage_ends(saved)] == ["a", "b", "c"]
    infos = [dict(updates=u, hold=60, stages=3) for u in (60, 180)]
    assert sc.missing_stage_ends(infos) == [120]
    assert sc.missing_stage_ends([dict(updates=60, hold=0, stages=1)]) == []


def _gated_model(closed):
    """Two encoder and two decoder layers of 4 heads, gated on enc and encdec; ``closed``: {(type, layer): heads
    whose gate is shut (log alpha -10: g_hat = 0)}, the others open (log alpha 10)."""
    from types import SimpleNamespace

    from fairseq.modules import MultiheadAttention

    from fairseq_sparse.modules.hard_concrete import HardConcrete
    from fairseq_sparse.modules.head_gates import add_head_gates, attention_modules

    def layer(*names):
        m = torch.nn.Module()
        for name in names:
            setattr(m, name, MultiheadAttention(8, 4, encoder_decoder_attention=name == "encoder_attn"))
        return m

    model = torch.nn.Module()
    model.encoder = SimpleNamespace(layers=[layer("self_attn") for _ in range(2)])
    model.decoder = SimpleNamespace(layers=[layer("self_attn", "encoder_attn") for _ in range(2)])
    add_head_gates(model, ["enc", "encdec"], HardConcrete())
    for key, mha in attention_modules(model).items():
        if getattr(mha, "head_gates", None) is not None:
            mha.head_gates.log_alpha.data = torch.tensor([-10.0 if h in closed.get(key, ()) else 10.0 for h in range(4)])
    return model


def test_head_gate_sparsity_and_point_labels():
    model = _gated_model({("enc", 0): [0, 1], ("enc", 1): [3], ("encdec", 1): [0, 1, 2, 3]})
    assert sc.head_gate_sparsity(model) == pytest.approx(
        {"head_gates": 7 / 16, "head_gates_enc": 3 / 8, "head_gates_encdec": 4 / 8})  # dec: no gates, no key
    assert sc.head_gate_sparsity(_gated_model({})) == {"head_gates": 0.0, "head_gates_enc": 0.0,
                                                       "head_gates_encdec": 0.0}
    info = {"path": "c.pt", "updates": 600, "targets": {"head_gates_enc": 0.4, "head_gates_encdec": 0.1}}
    row = sc.curve_row(info, 20.0, sc.head_gate_sparsity(model))
    assert sc.curve_axis([row]) == "head_gates" and sc.point_label(row, "head_gates") == "enc 0.4, encdec 0.1"
    assert sc.curve_points([row], "head_gates") == [(7 / 16, 20.0, "enc 0.4, encdec 0.1")]
    assert row["l0drop_sparsity"] is None and row["pruned_function"] is None and row["target_l0drop"] is None
