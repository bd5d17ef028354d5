"""End to end with the real console scripts: the simplified decoder and the sub-layer orders of paper 004.

fairseq-train --arch transformer_simplified_decoder from scratch and fine-tuned from a stock
checkpoint, plain fairseq-generate, fairseq-sparse-prune-heads on a simplified model with head gates
(the export decodes the same hypotheses), fairseq-sparse-attention-analysis (per-layer AER, cumulative
coverage) on simplified and sem-tem-ifm checkpoints, and bad layout options refused before training
with the save directory left as it was.
"""
import json
import os
import shutil

import pytest
import torch
from fairseq import checkpoint_utils

import fairseq_sparse  # noqa: F401
from conftest import console, run
from fairseq_sparse.cli.prune_heads import save_state
from helpers.analysis import read_tsv, write_gold
from helpers.cli import ENV, N_TEST, SIMPLIFIED, file_fingerprint, generate, log_records, parse_generate, train
from helpers.head_gates import assert_same_hypotheses, prune, with_mixed_gates

FFN_KEYS = (".fc1.", ".fc2.", ".final_layer_norm.")


def decoder_ffn_keys(state):
    return [k for k in state["model"] if k.startswith("decoder.layers.") and any(m in k for m in FFN_KEYS)]


@pytest.fixture(scope="module")
def simplified_gated_ckpt(corpus, stock_transformer_ckpt, tmp_path_factory):
    """transformer_simplified_decoder with head gates on every attention type, fine-tuned briefly from
    the stock checkpoint (its decoder FFN weights are left out)."""
    save = str(tmp_path_factory.mktemp("simplified_gated"))
    proc = train(corpus["bin"], save, [
        "--arch", "transformer_simplified_decoder", "--criterion", "label_smoothed_cross_entropy_with_sparsity",
        "--label-smoothing", "0.1", "--head-gates", "enc,dec,encdec", "--head-gates-lambda", "0.05",
        "--finetune-from-model", stock_transformer_ckpt], max_update=8)
    proc.ckpt = os.path.join(save, "checkpoint_last.pt")
    return proc


def test_train_from_scratch_and_generate(corpus, tmp_path):
    proc = train(corpus["bin"], str(tmp_path), SIMPLIFIED, max_update=8)
    assert "decoder layers: self -> cross (order tem-sem-ifm, simplified IFM)" in proc.log
    ckpt = str(tmp_path / "checkpoint_last.pt")
    state = checkpoint_utils.load_checkpoint_to_cpu(ckpt)
    assert log_records(proc.log) and state["optimizer_history"][-1]["num_updates"] == 8
    args = state["cfg"]["model"]
    assert args.arch == "transformer_simplified_decoder" and args.simplified_decoder is True
    assert args.decoder_sublayer_order == "tem-sem-ifm"
    assert decoder_ffn_keys(state) == [] and any(".fc1." in k for k in state["model"] if k.startswith("encoder."))
    assert any(".self_attn." in k for k in state["model"] if k.startswith("decoder."))
    hyps = parse_generate(generate(corpus["bin"], ckpt).stdout)["H"]
    assert sorted(hyps) == list(range(N_TEST))


def test_finetune_from_stock_loads_the_shared_weights(simplified_gated_ckpt, stock_transformer_ckpt):
    log = simplified_gated_ckpt.log
    # 2 layers x (fc1, fc2, final_layer_norm) x (weight, bias) left out, with a warning
    assert "the checkpoint has 12 decoder sub-layer parameters this decoder layout does not" in log, log[-3000:]
    assert "heads_open_dec" in log and "head_gates_penalty" in log
    stock = checkpoint_utils.load_checkpoint_to_cpu(stock_transformer_ckpt)["model"]
    tuned = checkpoint_utils.load_checkpoint_to_cpu(simplified_gated_ckpt.ckpt)
    assert tuned["cfg"]["model"].simplified_decoder is True and decoder_ffn_keys(tuned) == []
    # 8 updates in warm-up (lr <= 1.6e-4): the weights are still the stock ones, not a fresh init
    shared = [k for k in stock if k in tuned["model"]]
    assert len(shared) == len(stock) - 12
    for k in shared:
        assert torch.allclose(stock[k].float(), tuned["model"][k].float(), atol=2e-3), k
    assert any(not torch.equal(stock[k], tuned["model"][k]) for k in shared)  # and they did train


def test_prune_heads_of_a_simplified_model_decodes_the_same(corpus, simplified_gated_ckpt, tmp_path):
    mixed = with_mixed_gates(simplified_gated_ckpt.ckpt, str(tmp_path / "mixed.pt"))
    out = str(tmp_path / "pruned.pt")
    proc = prune(mixed, out)
    assert "kept 18 of 24 heads" in proc.stdout  # one closed gate in each of the 6 gated layers
    state = checkpoint_utils.load_checkpoint_to_cpu(out)
    args = state["cfg"]["model"]
    assert args.arch == "transformer_simplified_decoder" and args.simplified_decoder is True
    spec = json.loads(args.kept_heads)
    assert sorted(spec) == ["dec", "enc", "encdec"] and all(len(ids) == 3 for t in spec for ids in spec[t])
    assert decoder_ffn_keys(state) == [] and not any("head_gates" in k for k in state["model"])
    assert_same_hypotheses(generate(corpus["bin"], mixed), generate(corpus["bin"], out))


def sem_tem_ifm_ckpt(stock_ckpt, path):
    """The stock checkpoint's weights as transformer_head_gates --decoder-sublayer-order sem-tem-ifm (the
    same parameter set, encoder attention first in every decoder layer)."""
    state = checkpoint_utils.load_checkpoint_to_cpu(stock_ckpt)
    args = state["cfg"]["model"]
    args.arch = args._name = "transformer_head_gates"
    args.head_gates, args.decoder_sublayer_order = "", "sem-tem-ifm"
    save_state(state, path)
    return path


def attention_tool(data, ckpt, gold, out):
    return run([console("fairseq-sparse-attention-analysis"), data, "--path", ckpt, "--output-dir", str(out), "--gold", gold,
                "--batch-size", "32", "--no-progress-bar", "--cpu"], env=ENV)


@pytest.mark.parametrize("layout", ["simplified", "sem-tem-ifm"])
def test_attention_tool_reports_aer_and_coverage_per_layer(layout, corpus, simplified_gated_ckpt,
                                                           stock_transformer_ckpt, tmp_path):
    ckpt = simplified_gated_ckpt.ckpt if layout == "simplified" else \
        sem_tem_ifm_ckpt(stock_transformer_ckpt, str(tmp_path / "sem_tem_ifm.pt"))
    gold, src, _ = write_gold(corpus, tmp_path)
    out = tmp_path / "out"
    proc = attention_tool(corpus["bin"], ckpt, gold, out)
    assert "AER" in proc.stdout
    layers = read_tsv(out / "layers.tsv")
    assert [r["layer"] for r in layers] == ["0", "1", "align:0,1"]
    result = json.loads((out / "attention.json").read_text())
    assert result["sentences"] == len(src)
    rows = result["layers"]
    for r in rows:
        assert r["heads"] == 4
        assert 0 <= r["aer"] <= 1 and 0 <= r["saer"] <= 1 and 0 < r["coverage_layer"] <= r["coverage"] <= 1
    assert rows[0]["coverage"] == pytest.approx(rows[0]["coverage_layer"]) and rows[0]["coverage"] <= rows[1]["coverage"]
    assert 0 <= result["align"]["aer"] <= 1


BAD_LAYOUT = {
    # name: (arguments, message, argparse error)
    "unknown_order": (["--arch", "transformer_head_gates", "--decoder-sublayer-order", "foo"],
                      "--decoder-sublayer-order: invalid choice: 'foo' (choose from 'tem-sem-ifm', 'sem-tem-ifm', "
                      "'sem-ifm')", True),
    "dec_gates_without_self_attention": (["--arch", "transformer_head_gates", "--head-gates", "dec",
                                          "--decoder-sublayer-order", "sem-ifm"],
                                         "--head-gates dec: --decoder-sublayer-order sem-ifm has no decoder "
                                         "self-attention to gate", False),
    # --scale-attn is a transformer_lm option: translation models do not have it
    "scale_attn": (["--arch", "transformer_simplified_decoder", "--simplified-decoder", "--scale-attn"],
                   "unrecognized arguments: --scale-attn", True),
    "cross_self_attention": (["--arch", "transformer_simplified_decoder", "--cross-self-attention"],
                             "--cross-self-attention only work with the standard decoder layout", False),
}


@pytest.mark.parametrize("case", sorted(BAD_LAYOUT))
def test_bad_layout_fails_before_training_and_keeps_the_checkpoint(case, corpus, stock_transformer_ckpt, tmp_path):
    args, message, by_argparse = BAD_LAYOUT[case]
    last = tmp_path / "checkpoint_last.pt"
    shutil.copy2(stock_transformer_ckpt, last)
    before = file_fingerprint(last)
    proc = train(corpus["bin"], str(tmp_path), args + ["--criterion", "label_smoothed_cross_entropy_with_sparsity",
                                                       "--label-smoothing", "0.1"], check=False)
    assert (proc.returncode == 2) if by_argparse else (proc.returncode != 0)
    assert message in (proc.stderr if by_argparse else proc.log), proc.log[-3000:]
    assert not log_records(proc.log), "training started before the error"
    assert file_fingerprint(last) == before, "checkpoint_last.pt was modified"
    assert os.listdir(tmp_path) == ["checkpoint_last.pt"], os.listdir(tmp_path)
