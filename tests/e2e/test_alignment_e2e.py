"""Word alignment from attention (AER, SAER of Zhang, Zhao, Li & Zong 2019 Eq. 23, argmax extraction, subword
merging, cumulative coverage of Yang et al. 2020 Eq. 2) on hand-made inputs whose answers are computed by hand, and
the fairseq-sparse-attention-analysis console tool end to end (stock transformer with the synthetic corpus's
true word alignment as gold; L0Drop model with the Zhang, Titov & Sennrich 2021
Fig. 1/7/8 analyses).
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_alignment.py."""
import json
import math
import os

import numpy as np
import pytest
import torch

import fairseq_sparse  # noqa: F401  (registers the plugin and fairseq's checkpoint classes)
from conftest import console, run
from fairseq_sparse.analysis import alignment as al
from fairseq_sparse.cli import attention_analysis as aa
from fairseq_sparse.modules.attention_capture import HeadAttentionRecorder
from helpers.analysis import read_tsv, write, write_gold


# ----------------------------------------------------------------------------------------------
# the console tool


def test_console_tool_on_the_stock_transformer(stock_transformer_ckpt, corpus, tmp_path):
    gold, src, tgt = write_gold(corpus, tmp_path)
    out = tmp_path / "out"
    proc = run([console("fairseq-sparse-attention-analysis"), corpus["bin"], "--path", stock_transformer_ckpt,
                "--output-dir", str(out), "--gold", gold, "--batch-size", "16", "--no-progress-bar"],
               console=True)
    for name in ("layers.tsv", "heads.tsv", "attention.json", "alignment.txt", "layers.png",
                 "entropy_heads.png", "max_weight_heads.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert not (out / "l0drop_attention.png").exists()  # a stock transformer has no gates
    layers = read_tsv(out / "layers.tsv")
    assert [r["layer"] for r in layers] == ["0", "1", "align:0,1"]
    result = json.loads((out / "attention.json").read_text())
    n_src = sum(len(s.split()) for s in src)
    assert result["sentences"] == len(src) and result["source_words"] == n_src
    assert result["target_tokens"] == sum(len(t.split()) + 1 for t in tgt)  # + the final EOS
    rows = result["layers"]
    for r in rows:
        assert 0 < r["entropy"] and 0 < r["entropy_heads"] <= r["entropy"] + 1e-9  # concavity of entropy
        assert 0 < r["max_weight"] <= 1 and 0 <= r["aer"] <= 1 and 0 <= r["saer"] <= 1
    # coverage: cumulative, never below the layer alone, and at most the aligned (content) words
    assert rows[0]["coverage"] == pytest.approx(rows[0]["coverage_layer"])
    assert rows[0]["coverage"] <= rows[1]["coverage"] and rows[1]["coverage_layer"] <= rows[1]["coverage"]
    # the hypothesis file re-scored independently gives the tool's combined AER
    gold_sets = al.read_gold_alignments(gold)
    hyps = [al.parse_links(line)[0] for line in (out / "alignment.txt").read_text().splitlines()]
    assert len(hyps) == len(src) and all(len(h) == len(t.split()) for h, t in zip(hyps, tgt))  # one link per word
    assert al.aer(hyps, gold_sets) == pytest.approx(result["align"]["aer"])
    # the trained model aligns far better than chance (a random source word per target word: AER ~ 0.9)
    assert min(r["aer"] for r in rows) < 0.75
    heads = read_tsv(out / "heads.tsv")
    assert [(h["layer"], h["head"]) for h in heads] == [(str(l), str(h)) for l in range(2) for h in range(4)]
    for l in range(2):  # the mean of the per-head entropies is the layer's entropy_heads
        assert np.mean([float(h["entropy"]) for h in heads if h["layer"] == str(l)]) == pytest.approx(
            rows[l]["entropy_heads"], abs=1e-3)
    assert "AER" in proc.stdout and "alignment from layers 0,1" in proc.stdout


def test_capture_is_fairseqs_own_attention(stock_transformer_ckpt, corpus):
    """The per-head weights the tool captures average to what fairseq's decoder returns for
    alignment_layer (its --print-alignment path), and capturing changes no output."""
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([stock_transformer_ckpt],
                                                                    arg_overrides={"data": corpus["bin"]})
    model = models[0].eval()
    task.load_dataset("test")
    ds = task.dataset("test")
    sample = ds.collater([ds[i] for i in range(5)])
    net = sample["net_input"]
    layers = model.decoder.layers
    with torch.no_grad():
        ref = [model(**net, alignment_layer=l, alignment_heads=4) for l in range(len(layers))]
        with HeadAttentionRecorder([layer.encoder_attn for layer in layers]) as rec:
            out, _ = model(**net)
        assert torch.allclose(out, ref[0][0], atol=1e-5)
        for l in range(len(layers)):
            assert rec.weights[l].shape == (4, 5, net["prev_output_tokens"].size(1), net["src_tokens"].size(1))
            torch.testing.assert_close(rec.weights[l].mean(0), ref[l][1]["attn"][0], atol=1e-5, rtol=1e-4)
    assert not any("skip_embed_dim_check" in layer.encoder_attn.__dict__ and layer.encoder_attn.skip_embed_dim_check
                   for layer in layers)  # restored


def test_two_gold_files_and_align_layers(stock_transformer_ckpt, corpus, tmp_path, capsys):
    one, _, _ = write_gold(corpus, tmp_path)
    sure, possible = write_gold(corpus, tmp_path, two_files=True)
    a = aa.main([corpus["bin"], "--path", stock_transformer_ckpt, "--output-dir", str(tmp_path / "a"),
                 "--gold", one, "--align-layers", "last", "--max-sentences", "20", "--no-progress-bar"])
    b = aa.main([corpus["bin"], "--path", stock_transformer_ckpt, "--output-dir", str(tmp_path / "b"),
                 "--gold", sure, "--gold-possible", possible, "--align-layers", "1", "--max-sentences", "20",
                 "--no-progress-bar"])
    for key in ("aer", "saer"):
        assert a["align"][key] == pytest.approx(b["align"][key])
        assert a["layers"][1][key] == pytest.approx(b["layers"][1][key])
        # aligning with the last layer alone is that layer's per-layer row
        assert a["align"][key] == pytest.approx(a["layers"][1][key])
    assert a["sentences"] == 20 and len((tmp_path / "a" / "alignment.txt").read_text().splitlines()) == 20


@pytest.mark.parametrize("case", ["fewer_sentences", "bad_index", "bad_token", "l0drop_without_gates"])
def test_bad_gold_fails_before_any_output(stock_transformer_ckpt, corpus, tmp_path, capsys, case):
    gold, src, _ = write_gold(corpus, tmp_path)
    lines = open(gold).read().splitlines()
    n3 = len(src[3].split())
    if case == "fewer_sentences":
        lines = lines[:-1]
    elif case == "bad_index":
        lines[3] += f" {n3}-0"  # one past the last source word of sentence 3
        lines[7] += " 99-0"
    elif case == "bad_token":
        lines[2] += " 1=2"
    write(gold, lines)
    out = tmp_path / "out"
    extra = ["--l0drop"] if case == "l0drop_without_gates" else []
    with pytest.raises(SystemExit) as exc:
        aa.main([corpus["bin"], "--path", stock_transformer_ckpt, "--output-dir", str(out), "--gold", gold,
                 "--no-progress-bar"] + extra)
    assert exc.value.code != 0
    expected = {
        "fewer_sentences": f"the gold alignment has {len(src) - 1} sentences, the data has {len(src)}: sentence "
                           f"{len(src) - 1} (line {len(src)}) is missing",
        "bad_index": f"gold sentence 3 (line 4): link {n3}-0 is out of range, the sentence has {n3} source",
        "bad_token": "gold.align:3: bad link '1=2'",
        "l0drop_without_gates": "has no L0Drop gates; pass --gates-from",
    }[case]
    err = capsys.readouterr().err
    assert expected in err
    if case == "bad_index":
        assert repr(src[3]) in err  # the offending sentence is shown
    assert not out.exists()


def test_console_tool_on_l0drop(l0drop_ckpt, stock_transformer_ckpt, corpus, tmp_path):
    gold, src, tgt = write_gold(corpus, tmp_path)
    out = tmp_path / "out"
    proc = run([console("fairseq-sparse-attention-analysis"), corpus["bin"], "--path", l0drop_ckpt, "--output-dir", str(out),
                "--gold", gold, "--no-progress-bar", "--example-maps", "2"])
    for name in ("l0drop_attention.png", "l0drop_entropy.png", "l0drop_tokens.tsv", "layers.tsv", "example_0.png",
                 "example_1.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    result = json.loads((out / "attention.json").read_text())
    d = result["l0drop"]
    tokens = read_tsv(out / "l0drop_tokens.tsv")
    assert len(tokens) == d["source_tokens"] == sum(len(s.split()) for s in src)  # EOS excluded
    assert [t["token"] for t in tokens] == [w for s in src for w in s.split()]
    assert d["pruned"] == sum(t["pruned"] == "1" for t in tokens) > 0
    assert all((float(t["gate"]) == 0) == (t["pruned"] == "1") for t in tokens)
    by_sentence = {}
    for t in tokens:
        by_sentence.setdefault(int(t["id"]), []).append(t)
    for sid, toks in by_sentence.items():
        received = np.array([float(t["summed_attention"]) for t in toks])
        pruned = np.array([t["pruned"] == "1" for t in toks])
        # the attention received by a sentence's tokens is at most one unit per target word (the rest is on EOS)
        assert received.sum() <= len(tgt[sid].split()) + 1e-3
        # a pruned state is the zero vector: every pruned token of a sentence gets the same attention
        if pruned.sum() > 1:
            np.testing.assert_allclose(received[pruned], received[pruned][0], rtol=1e-3, atol=1e-4)
        ent = np.array([float(t["encoder_entropy"]) for t in toks])
        assert ((0 <= ent) & (ent <= math.log(len(toks) + 1) + 1e-4)).all()
    for name, sel in (("kept", "0"), ("pruned", "1")):
        vals = [float(t["summed_attention"]) for t in tokens if t["pruned"] == sel]
        assert d["summed_attention"][name]["count"] == len(vals)
        assert d["summed_attention"][name]["mean"] == pytest.approx(np.mean(vals), abs=1e-4)
        assert sum(d["encoder_entropy"][name]["histogram"]) == len(vals)
    assert "L0Drop:" in proc.stdout and "pruned" in proc.stdout

    # the baseline classified by the L0Drop model's gates (Zhang, Titov & Sennrich 2021, Fig. 8): same tokens pruned
    base = aa.main([corpus["bin"], "--path", stock_transformer_ckpt, "--gates-from", l0drop_ckpt,
                    "--output-dir", str(tmp_path / "base"), "--max-sentences", "10", "--no-progress-bar"])
    base_tokens = read_tsv(tmp_path / "base" / "l0drop_tokens.tsv")
    n10 = sum(len(s.split()) for s in src[:10])
    assert base["l0drop"]["source_tokens"] == n10
    assert [t["pruned"] for t in base_tokens] == [t["pruned"] for t in tokens[:n10]]


def test_console_tool_refuses_to_overwrite_without_overwrite(stock_transformer_ckpt, corpus, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "heads.tsv").write_text("an earlier run\n")
    args = [corpus["bin"], "--path", stock_transformer_ckpt, "--output-dir", str(out), "--max-sentences", "5",
            "--no-progress-bar"]
    with pytest.raises(SystemExit) as exc:
        aa.main(args)
    assert exc.value.code == 2
    assert f"--output-dir: {out / 'heads.tsv'} exists; pass --overwrite to replace it" in capsys.readouterr().err
    assert os.listdir(out) == ["heads.tsv"] and (out / "heads.tsv").read_text() == "an earlier run\n"
    # an input in the output directory is never replaced, --overwrite or not
    gold = write(out / "alignment.txt", [""] * 60)
    with pytest.raises(SystemExit):
        aa.main(args + ["--overwrite", "--gold", gold])
    assert "is an input of this command: refusing to write over it" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["alignment.txt", "heads.tsv"]
    aa.main(args + ["--overwrite"])
    assert (out / "heads.tsv").read_text().startswith("layer\thead\tentropy\tmax_weight\n")
    assert len((out / "alignment.txt").read_text().splitlines()) == 5


@pytest.mark.parametrize("option", ["--path", "--gates-from"])
def test_console_tool_truncated_checkpoint_fails_clearly(stock_transformer_ckpt, l0drop_ckpt, corpus, tmp_path,
                                                         capsys, option):
    with open(l0drop_ckpt, "rb") as f:
        data = f.read()
    broken = tmp_path / "broken.pt"
    broken.write_bytes(data[:len(data) // 2])
    path, gates_from = (broken, l0drop_ckpt) if option == "--path" else (stock_transformer_ckpt, broken)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        aa.main([corpus["bin"], "--path", str(path), "--gates-from", str(gates_from), "--output-dir", str(out),
                 "--no-progress-bar"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"fairseq-sparse-attention-analysis: error: {option}: cannot read {broken}: not a complete torch checkpoint" in err
    assert not out.exists()
