"""Head analyses of Voita et al. (2019, Sec. 4-5): metrics on hand-made attention matrices
whose answers are computed by hand, the pruned-model path, and the console tool end to end.
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_head_analysis.py."""
import csv
import json
import os

import numpy as np
import pytest
import torch
from torch import nn

import fairseq_sparse  # noqa: F401  (registers the plugin and fairseq's checkpoint classes)
from conftest import console, run
from fairseq_sparse.analysis import heads as ha
from fairseq_sparse.cli import head_analysis as cli
from helpers.analysis import SETTINGS


# ----------------------------------------------------------------------------------------------
# on a real checkpoint


def load_stock(ckpt, data_bin):
    from fairseq import checkpoint_utils
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([ckpt], arg_overrides={"data": data_bin})
    task.load_dataset("test", task_cfg=cfg.task)
    return models[0].eval(), task


class NoHeads(nn.Module):
    """An attention layer with all heads pruned: no weights."""
    num_heads = 0

    def forward(self, query, key=None, value=None, **kwargs):
        return torch.zeros_like(query), None


def keep_heads(mha, keep):
    """Physically keep only the heads ``keep`` (q/k/v rows, out_proj columns), original ids in head_ids."""
    rows = torch.cat([torch.arange(h * mha.head_dim, (h + 1) * mha.head_dim) for h in keep])
    with torch.no_grad():
        for proj in (mha.q_proj, mha.k_proj, mha.v_proj):
            proj.weight = nn.Parameter(proj.weight[rows].clone())
            proj.bias = nn.Parameter(proj.bias[rows].clone())
        mha.out_proj.weight = nn.Parameter(mha.out_proj.weight[:, rows].clone())
    mha.num_heads, mha.embed_dim, mha.head_ids = len(keep), mha.head_dim * len(keep), list(keep)


def test_capture_matches_manual_attention_and_pruned_layers(stock_transformer_ckpt, corpus):
    model, task = load_stock(stock_transformer_ckpt, corpus["bin"])
    ds, d = task.dataset("test"), task.source_dictionary
    enc = model.encoder
    sample = ds.collater([ds[i] for i in range(6)])
    src, pad = sample["net_input"]["src_tokens"], sample["net_input"]["src_tokens"].eq(d.pad())
    with torch.no_grad():
        ref = enc(src, src_lengths=sample["net_input"]["src_lengths"], return_all_hiddens=True)
        with ha.EncoderAttentionRecorder(enc.layers) as rec:
            out = enc(src, src_lengths=sample["net_input"]["src_lengths"], return_all_hiddens=True)
        assert torch.allclose(ref["encoder_out"][0], out["encoder_out"][0], atol=1e-6)  # the slow path changes nothing
        assert [layer.self_attn.skip_embed_dim_check for layer in enc.layers] == [False, False]  # restored
        for i, layer in enumerate(enc.layers):  # softmax(q k^T / sqrt(d)) per head, recomputed by hand
            a, x = layer.self_attn, out["encoder_states"][i]
            if layer.normalize_before:
                x = layer.self_attn_layer_norm(x)
            T, B, _ = x.shape
            q = (a.q_proj(x) * a.scaling).view(T, B, a.num_heads, a.head_dim).permute(2, 1, 0, 3)
            k = a.k_proj(x).view(T, B, a.num_heads, a.head_dim).permute(2, 1, 0, 3)
            w = (q @ k.transpose(-1, -2)).masked_fill(pad[None, :, None, :], float("-inf")).softmax(-1)
            assert rec.weights[i].shape == (4, 6, T, T)
            torch.testing.assert_close(rec.weights[i], w, atol=1e-5, rtol=1e-4)

    counts = np.array(d.count)
    full = ha.analyse_dataset(model, [ds.collater([ds[i] for i in range(12)])], d, counts, rare_min_rank=13)
    keep_heads(enc.layers[0].self_attn, [1, 3])
    enc.layers[1].self_attn = NoHeads()
    labels = ha.layer_head_labels(model, None)
    assert labels == [[1, 3], []]
    pruned = ha.analyse_dataset(model, [ds.collater([ds[i] for i in range(12)])], d, counts, rare_min_rank=13,
                                labels=labels)
    res = ha.summarise(pruned, labels, **vars(SETTINGS))
    assert [(h["layer"], h["head"]) for h in res["heads"]] == [(0, 1), (0, 3)]
    # layer 0's attention does not depend on the other heads: heads 1 and 3 keep their statistics
    np.testing.assert_allclose(pruned.conf_sum[0], full.conf_sum[0][[1, 3]], rtol=1e-6)
    np.testing.assert_allclose(pruned.rare_sum[0], full.rare_sum[0][[1, 3]], rtol=1e-6)
    m = ha.heads_matrix([[h["confidence"] for h in res["heads"]], None], labels, 4)
    np.testing.assert_array_equal(np.isnan(m), [[1, 0, 1, 0], [1, 1, 1, 1]])


def write_chain_conllu(src_lines, path, extra_word_in=None, drop_last=False):
    """Each word's head is the previous word (amod); the first word is the root."""
    if drop_last:
        src_lines = src_lines[:-1]
    with open(path, "w") as f:
        for k, line in enumerate(src_lines):
            words = line.split() + (["extra"] if k == extra_word_in else [])
            for i, w in enumerate(words, 1):
                f.write(f"{i}\t{w}\t_\t_\t_\t_\t{i - 1}\t{'amod' if i > 1 else 'root'}\t_\t_\n")
            f.write("\n")


def test_console_tool_end_to_end(stock_transformer_ckpt, corpus, tmp_path):
    with open(os.path.join(corpus["raw"], "test.src")) as f:
        src_lines = [line.strip() for line in f]
    conllu = str(tmp_path / "test.conllu")
    write_chain_conllu(src_lines, conllu)
    out = tmp_path / "out"
    proc = run([console("fairseq-sparse-head-analysis"), corpus["bin"], "--path", stock_transformer_ckpt,
                "--output-dir", str(out), "--max-sentences", "20", "--batch-size", "8", "--conllu", conllu,
                "--rare-min-rank", "13", "--no-progress-bar"], console=True)
    for name in ("heads.tsv", "heads.json", "confidence.png", "function.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    with open(out / "heads.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert len(rows) == 2 * 4
    assert [(int(r["layer"]), int(r["head"])) for r in rows] == [(l, h) for l in range(2) for h in range(4)]
    value_cols = ["confidence", "top_relative_position_share", "rare_acc", "rare2_acc"] + [
        f"{r}_{d}" for r in ha.RELATIONS for d in ha.DIRECTIONS if r == "amod"]
    for r in rows:
        for c in value_cols:
            assert 0.0 <= float(r[c]) <= 1.0, (c, r[c])
        assert float(r["rare_acc"]) <= float(r["rare2_acc"])
        assert r["nsubj_d2h"] == "nan"  # no nsubj in this CoNLL-U
    result = json.loads((out / "heads.json").read_text())
    assert result["sentences"] == 20
    # every amod arc joins adjacent words: the baseline predicts it perfectly
    assert result["baselines"]["amod_d2h"] == {"offset": -1, "accuracy": 1.0,
                                                "instances": sum(len(s.split()) - 1 for s in src_lines[:20])}
    # ranks 0-12 are the 12 function words and "swap": every sentence's rarest word is a content word
    assert result["rare"]["sentences"] == sum(len(s.split()) >= 3 for s in src_lines[:20])
    assert "layer head" in proc.stdout and "syntactic baselines" in proc.stdout  # the summary table


def test_console_tool_rejects_conllu_mismatch(stock_transformer_ckpt, corpus, tmp_path):
    with open(os.path.join(corpus["raw"], "test.src")) as f:
        src_lines = [line.strip() for line in f]
    conllu = str(tmp_path / "test.conllu")
    write_chain_conllu(src_lines, conllu, extra_word_in=3)
    out = tmp_path / "out"
    proc = run([console("fairseq-sparse-head-analysis"), corpus["bin"], "--path", stock_transformer_ckpt,
                "--output-dir", str(out), "--conllu", conllu, "--no-progress-bar"], check=False)
    assert proc.returncode != 0
    n3 = len(src_lines[3].split())
    assert f"--conllu sentence 3 (line 4 of the source) has {n3 + 1} words, the source sentence has {n3}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("case", ["fewer_sentences", "no_checkpoint", "no_data", "bad_conllu"])
def test_bad_input_fails_before_any_output(stock_transformer_ckpt, corpus, tmp_path, capsys, case):
    with open(os.path.join(corpus["raw"], "test.src")) as f:
        src_lines = [line.strip() for line in f]
    conllu = str(tmp_path / "test.conllu")
    write_chain_conllu(src_lines, conllu, drop_last=case == "fewer_sentences")
    if case == "bad_conllu":
        with open(conllu, "a") as f:
            f.write("1\tonly\tthree\tcolumns\n")
    ckpt = str(tmp_path / "missing.pt") if case == "no_checkpoint" else stock_transformer_ckpt
    data = str(tmp_path / "missing-bin") if case == "no_data" else corpus["bin"]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        cli.main([data, "--path", ckpt, "--output-dir", str(out), "--conllu", conllu, "--no-progress-bar"])
    assert exc.value.code != 0
    expected = {
        "fewer_sentences": f"--conllu has {len(src_lines) - 1} sentences, subset 'test' has {len(src_lines)}",
        "no_checkpoint": "checkpoint not found",
        "no_data": "data directory not found",
        "bad_conllu": "a CoNLL-U word line has 10 tab-separated columns, got 4",
    }[case]
    assert expected in capsys.readouterr().err
    assert not out.exists()


def output_state(out):
    """{name: (bytes, mtime)} of the files in ``out``."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(out.iterdir())}


def test_console_tool_cpu_and_refuses_to_overwrite(stock_transformer_ckpt, corpus, tmp_path, capsys):
    out = tmp_path / "out"
    cmd = [corpus["bin"], "--path", stock_transformer_ckpt, "--output-dir", str(out), "--max-sentences", "8",
           "--rare-min-rank", "13", "--no-progress-bar", "--cpu"]
    cli.main(cmd)  # --cpu: the same device choice as the other tools
    before = output_state(out)
    assert sorted(before) == sorted(cli.OUTPUTS)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main(cmd)
    assert exc.value.code != 0
    assert "exists; pass --overwrite to replace it" in capsys.readouterr().err
    assert output_state(out) == before  # untouched
    result = cli.main(cmd + ["--overwrite"])
    assert result["sentences"] == 8
    assert sorted(output_state(out)) == sorted(before)


def test_truncated_checkpoint_fails_before_any_output(stock_transformer_ckpt, corpus, tmp_path, capsys):
    with open(stock_transformer_ckpt, "rb") as f:
        data = f.read()
    broken = tmp_path / "broken.pt"
    broken.write_bytes(data[:len(data) // 2])
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        cli.main([corpus["bin"], "--path", str(broken), "--output-dir", str(out), "--no-progress-bar"])
    assert exc.value.code != 0
    err = capsys.readouterr().err
    assert f"--path: cannot read {broken}: not a complete torch checkpoint (truncated or corrupt?)" in err
    assert "Traceback" not in err
    assert not out.exists()
