"""fairseq-sparse-sparsity-curve: one fine-tuning with a schedule of target sparsities, one checkpoint per
target, and the BLEU/sparsity curve over them (Zhang, Titov & Sennrich 2021 Fig. 4; Voita et al. 2019 Fig. 7).

Checks: the token types (closed form), the target each checkpoint was trained at last, the interval
checkpoints of a save dir; end to end, fairseq-train with a schedule writes a checkpoint per target and
the tool measures them (TSV rows, PNGs); bad input is refused clearly, before any output is written.
"""
import os
import subprocess

import pytest
import torch

from conftest import USER_DIR, console, run
from test_cli import ENV, ENV_PARALLEL, L0DROP, train_cmd, with_mixed_gates

import fairseq_sparse  # noqa: F401  (registers the plugin, allowlists fairseq checkpoint classes)
from fairseq_sparse.analysis import sparsity_curve as sc
from fairseq_sparse.analysis import token_types as tt
from fairseq_sparse.cli import sparsity_curve as cli

HOLD, WARMUP = 30, 10
SCHEDULE = L0DROP + ["--l0drop-target-sparsity", "0.3,0.6", "--sparsity-target-hold-updates", str(HOLD),
                     "--sparsity-target-warmup-updates", str(WARMUP), "--save-interval-updates", str(HOLD),
                     "--optimizer", "adam_sparsity"]
STOCK = ["--arch", "transformer", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
EVAL = ["--max-sentences", "20", "--beam", "2", "--no-progress-bar", "--cpu"]
# the synthetic corpus's function words (fairseq_sparse.synthetic_corpus): the0 .. the11
FUNCTION_WORDS = "".join(f"the{i}\n" for i in range(12))


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


# ----------------------------------------------------------------------------------------------
# end to end: fairseq-train with a schedule, then the tool on its save dir


def _train_side_by_side(data_bin, runs, max_update):
    """fairseq-train of each (save dir, options) of ``runs`` at once, one thread each (2 cores)."""
    cmds = [train_cmd(data_bin, save, extra, max_update) for save, extra in runs]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV_PARALLEL)
             for c in cmds]
    for cmd, p in zip(cmds, procs):
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, f"{' '.join(cmd)} failed:\n{stdout[-3000:]}\n{stderr[-3000:]}"


@pytest.fixture(scope="module")
def schedule_run(corpus, tmp_path_factory):
    """transformer_l0drop trained from scratch with targets 0.3 then 0.6, HOLD updates each, and a stock
    transformer trained as many updates (the equal-updates control: a checkpoint without gates)."""
    save, control = str(tmp_path_factory.mktemp("schedule")), str(tmp_path_factory.mktemp("control"))
    _train_side_by_side(corpus["bin"], [(save, SCHEDULE), (control, STOCK)], max_update=2 * HOLD)
    return {"save": save, "control": os.path.join(control, "checkpoint_last.pt")}


def _read_tsv(path):
    header, *lines = open(path).read().splitlines()
    return [dict(zip(header.split("\t"), line.split("\t"))) for line in lines]


def test_schedule_checkpoints_and_curve(corpus, schedule_run, tmp_path):
    save, control = schedule_run["save"], schedule_run["control"]
    ckpts = [os.path.join(save, f"checkpoint_1_{u}.pt") for u in (HOLD, 2 * HOLD)]
    assert all(os.path.isfile(c) for c in ckpts), os.listdir(save)
    (tmp_path / "fw.txt").write_text(FUNCTION_WORDS)
    out = str(tmp_path / "curve")
    proc = run([console("fairseq-sparse-sparsity-curve"), corpus["bin"], "--user-dir", USER_DIR, "--save-dir", save,
                "--baseline", control, "--output-prefix", out, "--function-words", str(tmp_path / "fw.txt")] + EVAL,
               env=ENV)
    rows = _read_tsv(out + ".tsv")
    assert list(rows[0]) == sc.COLUMNS
    assert [r["baseline"] for r in rows] == ["1", "0", "0"]
    assert [r["checkpoint"] for r in rows] == [control] + ckpts
    assert [r["updates"] for r in rows] == [str(2 * HOLD), str(HOLD), str(2 * HOLD)]
    assert [r["target_l0drop"] for r in rows] == ["NA", "0.3", "0.6"]
    assert rows[0]["l0drop_sparsity"] == "NA" and rows[0]["pruned_content"] == "NA"  # a stock transformer
    for r in rows[1:]:
        assert 0 <= float(r["l0drop_sparsity"]) <= 1 and r["head_gates_sparsity"] == "NA"
        assert 0 <= float(r["pruned_function"]) <= 1 and 0 <= float(r["pruned_content"]) <= 1
        assert r["pruned_punct"] == "NA"  # the synthetic corpus has no punctuation
    assert all(0 <= float(r["bleu"]) <= 100 for r in rows)
    for png in (out + ".png", out + "_token_types.png"):
        assert os.path.getsize(png) > 0
    assert f"checkpoint_1_{2 * HOLD}.pt" in proc.stdout and "wrote" in proc.stdout


def test_l0drop_pruning_counts_by_hand(corpus, schedule_run, tmp_path):
    """About half the test set's states pruned (gate biases shifted): the sparsity and the share per token type
    equal a count over the encoder's gates, with the corpus's words the0 .. the11 as function words."""
    from fairseq import checkpoint_utils

    ckpt = with_mixed_gates(os.path.join(schedule_run["save"], f"checkpoint_1_{HOLD}.pt"), corpus["bin"],
                            str(tmp_path / "mixed.pt"))
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([ckpt], arg_overrides={"data": corpus["bin"]})
    encoder, src_dict = models[0].eval().encoder, task.source_dictionary
    task.load_dataset("test")
    ds = task.dataset("test")
    sample = ds.collater([ds[i] for i in range(len(ds))])
    words = frozenset(FUNCTION_WORDS.split())
    got = sc.l0drop_pruning(encoder, [sample], src_dict, None, words)
    with torch.no_grad():
        net = sample["net_input"]
        gates = encoder(net["src_tokens"], net["src_lengths"])["l0drop_gates"][0]
    tokens = sample["net_input"]["src_tokens"]
    real = tokens.ne(src_dict.pad())
    pruned = gates.eq(0) & real
    assert got["tokens"] == int(real.sum()) and got["l0drop"] == pytest.approx(float(pruned.sum() / real.sum()))
    assert 0.2 < got["l0drop"] < 0.8
    function = torch.tensor([[src_dict[t] in words for t in row] for row in tokens.tolist()])
    content = real & ~function & tokens.ne(src_dict.eos())
    assert got["pruned_function"] == pytest.approx(float((pruned & function).sum() / function.sum()))
    assert got["pruned_content"] == pytest.approx(float((pruned & content).sum() / content.sum()))
    assert got["pruned_punct"] is None and encoder.pruned_decoding  # restored after the measurement
    # the same types from part-of-speech tags (one per word), and positions with a word-separating token
    ids = sample["id"].tolist()
    tags = {sid: ["DT" if src_dict[t] in words else "NN" for t in row if t not in (src_dict.pad(), src_dict.eos())]
            for sid, row in zip(ids, tokens.tolist())}
    tagged = sc.l0drop_pruning(encoder, [sample], src_dict, None, frozenset(), tags, char_boundary="the0")
    for t in ("function", "content"):
        assert tagged[f"pruned_{t}"] == pytest.approx(got[f"pruned_{t}"])
    bins = tagged["char_positions"]
    assert sum(b["share_of_pruned"] for b in bins) == pytest.approx(1.0)
    assert 0 < sum(b["chars"] for b in bins) < got["tokens"]


# ----------------------------------------------------------------------------------------------
# bad input: a clear error, exit status 2, nothing written


@pytest.mark.parametrize("case", ["existing_output", "empty_save_dir", "no_gates", "both", "neither", "no_data",
                                  "corrupt", "tags_lines", "tags_without_l0drop"])
def test_bad_input_refused(case, corpus, schedule_run, tmp_path, capsys):
    out, stock = tmp_path / "curve", schedule_run["control"]
    ckpt = os.path.join(schedule_run["save"], f"checkpoint_1_{HOLD}.pt")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "checkpoint_last.pt").write_bytes(open(ckpt, "rb").read())
    (tmp_path / "bad.pt").write_bytes(open(ckpt, "rb").read()[:5000])
    (tmp_path / "curve.tsv").write_text("old\n") if case == "existing_output" else None
    (tmp_path / "test.tags").write_text("NN\n")
    base = ["--output-prefix", str(out)] + EVAL
    argv, expect = {
        "existing_output": ([corpus["bin"], "--checkpoints", ckpt] + base, f"{out}.tsv exists; pass --overwrite"),
        "empty_save_dir": ([corpus["bin"], "--save-dir", str(tmp_path / "empty")] + base,
                           "no checkpoint_<epoch>_<updates>.pt or checkpoint<epoch>.pt in"),
        "no_gates": ([corpus["bin"], "--checkpoints", ckpt, stock] + base,
                     f"{stock} has no L0Drop gates and no head gates"),
        "both": ([corpus["bin"], "--checkpoints", ckpt, "--save-dir", schedule_run["save"]] + base, "not allowed with"),
        "neither": ([corpus["bin"]] + base, "one of the arguments --checkpoints --save-dir is required"),
        "no_data": ([str(tmp_path / "nodata"), "--checkpoints", ckpt] + base, "data directory not found"),
        "corrupt": ([corpus["bin"], "--checkpoints", ckpt, str(tmp_path / "bad.pt")] + base, "truncated or corrupt"),
        "tags_lines": ([corpus["bin"], "--checkpoints", ckpt, "--tags", str(tmp_path / "test.tags")] + base,
                       f"--tags: {tmp_path / 'test.tags'} has 1 lines, the split 60 sentences"),
        "tags_without_l0drop": ([corpus["bin"], "--checkpoints", stock, "--tags", str(tmp_path / "test.tags")] + base,
                                "has no L0Drop gates"),
    }[case]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert expect in capsys.readouterr().err
    written = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("curve"))
    assert written == (["curve.tsv"] if case == "existing_output" else [])
    if case == "existing_output":
        assert (tmp_path / "curve.tsv").read_text() == "old\n"
