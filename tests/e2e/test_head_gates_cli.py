"""End to end: head-gate fine-tuning with fairseq-train, export with fairseq-sparse-prune-heads, decoding
of the exported (physically smaller) checkpoint with plain fairseq-generate."""
import json
import os

import pytest
import torch
from fairseq import checkpoint_utils

import fairseq_sparse  # noqa: F401
from conftest import refused_in_process
from helpers.cli import L0DROP, generate, parse_generate, sparsity_line, train
from helpers.cli import with_mixed_gates as with_mixed_l0drop_gates
from helpers.head_gates import HEAD_GATES, assert_same_hypotheses, prune, with_mixed_gates


@pytest.fixture(scope="module")
def gated_ckpt(corpus, stock_transformer_ckpt, tmp_path_factory):
    """transformer_head_gates fine-tuned briefly from the stock checkpoint (paper 001's recipe)."""
    save = str(tmp_path_factory.mktemp("head_gates"))
    proc = train(corpus["bin"], save, HEAD_GATES + [
        "--finetune-from-model", stock_transformer_ckpt, "--head-gates-lambda", "0.05"], max_update=20)
    assert "heads_open_encdec" in proc.log and "head_gates_penalty" in proc.log
    return os.path.join(save, "checkpoint_last.pt")


def test_finetune_with_frozen_decoder_trains_only_encoder_and_gates(corpus, stock_transformer_ckpt, tmp_path):
    proc = train(corpus["bin"], str(tmp_path), HEAD_GATES + [
        "--finetune-from-model", stock_transformer_ckpt, "--head-gates", "enc", "--freeze-decoder",
        "--head-gates-lambda", "0.05", "--head-gates-init-log-alpha", "1.0"], max_update=10)
    stats = [json.loads(line[line.index("{"):]) for line in proc.log.splitlines() if '"heads_open_expected_enc"' in line]
    assert stats and "heads_open_expected_dec" not in stats[-1]
    assert 0 < float(stats[-1]["heads_open_expected_enc"]) <= 8  # 2 layers x 4 heads
    before = checkpoint_utils.load_checkpoint_to_cpu(stock_transformer_ckpt)["model"]
    after = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "checkpoint_last.pt"))["model"]
    shared = "decoder.embed_tokens.weight"  # shared with the encoder (--share-all-embeddings): trains
    dec = [k for k in before if k.startswith("decoder.") and k != shared and "output_projection" not in k]
    assert dec and all(torch.equal(before[k], after[k]) for k in dec)
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("encoder.layers"))
    gates = [k for k in after if k.endswith("head_gates.log_alpha")]
    assert len(gates) == 2 and all(k.startswith("encoder.") for k in gates)
    assert all(not torch.equal(after[k], torch.full((4,), 1.0)) for k in gates)


def test_exported_gated_model_decodes_like_the_gated_one(corpus, gated_ckpt, tmp_path):
    mixed = with_mixed_gates(gated_ckpt, str(tmp_path / "mixed.pt"))
    out = str(tmp_path / "pruned.pt")
    proc = prune(mixed, out)
    assert "kept 18 of 24 heads" in proc.stdout  # one closed gate per layer
    state = checkpoint_utils.load_checkpoint_to_cpu(out)
    spec = json.loads(state["cfg"]["model"].kept_heads)
    assert sorted(spec) == ["dec", "enc", "encdec"] and all(len(ids) == 3 for t in spec for ids in spec[t])
    assert not any("head_gates" in k for k in state["model"])
    n_gated = sum(v.numel() for v in checkpoint_utils.load_checkpoint_to_cpu(mixed)["model"].values())
    assert sum(v.numel() for v in state["model"].values()) < n_gated
    assert_same_hypotheses(generate(corpus["bin"], mixed), generate(corpus["bin"], out))


def test_stock_checkpoint_exports_with_a_head_mask(corpus, stock_transformer_ckpt, tmp_path):
    mask = {"enc": [[1, 0, 1, 1], [0, 0, 0, 0]], "encdec": [[1, 1, 0.5, 0], [1, 1, 1, 1]]}
    (tmp_path / "mask.json").write_text(json.dumps(mask))
    out = str(tmp_path / "pruned.pt")
    proc = prune(stock_transformer_ckpt, out, ["--head-mask", str(tmp_path / "mask.json")])
    assert "kept 18 of 24 heads" in proc.stdout
    cfg = checkpoint_utils.load_checkpoint_to_cpu(out)["cfg"]["model"]
    assert cfg.arch == "transformer_head_gates" and cfg.head_gates == ""
    assert json.loads(cfg.kept_heads)["enc"] == [[0, 2, 3], []]
    hyps = parse_generate(generate(corpus["bin"], out).stdout)["H"]
    assert len(hyps) == 60
    # --min-heads-per-layer forbids the empty layer, and nothing is written
    proc = prune(stock_transformer_ckpt, str(tmp_path / "other.pt"),
                 ["--head-mask", str(tmp_path / "mask.json"), "--min-heads-per-layer", "1"], check=False)
    assert proc.returncode != 0 and "fewer than --min-heads-per-layer" in proc.stderr
    assert not (tmp_path / "other.pt").exists()


def test_composed_model_trains_exports_and_decodes_exactly(corpus, stock_transformer_ckpt, tmp_path):
    """The composed model: L0Drop on the encoder output and between its layers, head gates in all three
    attention types and the simplified decoder (no decoder FFN), from one fairseq-train run and the
    head export; plain fairseq-generate of the exported checkpoint (heads physically removed, encoder
    compacted, pruned memory) gives the hypotheses of the gated model decoded with the full memory."""
    proc = train(corpus["bin"], str(tmp_path), L0DROP + [
        "--finetune-from-model", stock_transformer_ckpt, "--l0drop-between-layers", "--simplified-decoder",
        "--head-gates", "enc,dec,encdec", "--l0drop-lambda", "0.3", "--head-gates-lambda", "0.05",
        "--l0drop-init-bias", "0"], max_update=10)
    for key in ("l0drop_sparsity", "l0drop_layer1_sparsity", "heads_open_enc", "heads_open_dec", "heads_open_encdec"):
        assert key in proc.log, key
    ckpt = with_mixed_gates(str(tmp_path / "checkpoint_last.pt"), str(tmp_path / "mixed_heads.pt"))
    ckpt = with_mixed_l0drop_gates(ckpt, corpus["bin"], str(tmp_path / "mixed.pt"))
    composed = str(tmp_path / "composed.pt")
    assert "kept 18 of 24 heads" in prune(ckpt, composed).stdout
    state = checkpoint_utils.load_checkpoint_to_cpu(composed)
    cfg = state["cfg"]["model"]
    assert cfg.arch == "transformer_l0drop" and cfg.simplified_decoder and cfg.l0drop_between_layers
    assert "encoder.layer_l0drops.0.log_alpha_proj.weight" in state["model"]
    assert not any(k.startswith("decoder.") and ".fc1." in k for k in state["model"])
    assert all(len(ids) == 3 for t, layers in json.loads(cfg.kept_heads).items() for ids in layers)
    full_memory = generate(corpus["bin"], ckpt, ["--model-overrides", "{'pruned_decoding': False}"])
    decoded = generate(corpus["bin"], composed)
    assert_same_hypotheses(decoded, full_memory)
    assert 20 < sparsity_line(decoded)[0] < 100


@pytest.mark.parametrize("case", ["negative_lambda", "lambda_without_gates", "unknown_type"])
def test_bad_head_gate_options_fail_before_training(case, corpus, tmp_path):
    extra = {
        "negative_lambda": HEAD_GATES + ["--head-gates-lambda", "-0.1"],
        "lambda_without_gates": L0DROP + ["--head-gates-lambda", "0.1"],
        "unknown_type": HEAD_GATES + ["--head-gates", "enc,cross"],
    }[case]
    proc = train(corpus["bin"], str(tmp_path), extra + ["--data-buffer-size", "0"], max_update=5, check=False)
    assert proc.returncode != 0
    expected = {"negative_lambda": "--head-gates-lambda must be >= 0", "lambda_without_gates": "has no head_gates",
                "unknown_type": "unknown attention type"}[case]
    assert expected in proc.log
    assert not any(name.endswith(".pt") for name in os.listdir(tmp_path))


def prune_in_process(argv, capsys):
    """fairseq-sparse-prune-heads' main() in this process on bad input; its stderr."""
    from fairseq_sparse.cli.prune_heads import main

    return refused_in_process(main, argv, capsys)


def test_prune_heads_bad_input(stock_transformer_ckpt, tmp_path, capsys):
    out = tmp_path / "out.pt"
    base = ["--path", stock_transformer_ckpt, "--output", str(out)]
    assert "no head gates" in prune_in_process(base, capsys)  # no gates, no mask
    assert not out.exists()
    (tmp_path / "bad.json").write_text(json.dumps({"enc": [[1, 1, 1], [1, 1, 1]]}))
    assert "shape" in prune_in_process(base + ["--head-mask", str(tmp_path / "bad.json")], capsys)
    (tmp_path / "types.json").write_text(json.dumps({"encoder": [[1, 1, 1, 1]] * 2}))
    assert "unknown attention type" in prune_in_process(base + ["--head-mask", str(tmp_path / "types.json")], capsys)
    assert "no such file" in prune_in_process(base + ["--head-mask", str(tmp_path / "none.json")], capsys)
    assert "checkpoint not found" in prune_in_process(["--path", str(tmp_path / "x.pt"), "--output", str(out)], capsys)
    assert not out.exists()
    out.write_text("keep me")
    assert "exists" in prune_in_process(base + ["--head-mask", str(tmp_path / "bad.json")], capsys)
    assert out.read_text() == "keep me"


@pytest.mark.parametrize("mask", [{"enc": [[2, -1, 1, 1], [1, 1, 1, 1]]}, {"enc": [[float("nan"), 1, 1, 1], [1, 1, 1, 1]]},
                                  {"encdec": [[1, 1, 1, 1], [1, "x", 1, 1]]}, {"enc": [[1, 1, 1, 1], 7]},
                                  {"dec": [[1, 1, 1, 1], None]}])
def test_prune_heads_and_heads_evaluate_refuse_bad_masks_alike(mask, corpus, stock_transformer_ckpt, tmp_path, capsys):
    """[[2, -1]] was exported as "kept 5 of 6" (one head removed, one doubled) while the heads tool called it
    "0 heads masked"; NaN passed one reader; malformed rows crashed prune-heads with a TypeError."""
    from fairseq_sparse.cli.head_importance import main as heads_main

    path = tmp_path / "mask.json"
    path.write_text(json.dumps(mask))
    out = tmp_path / "out.pt"
    err = prune_in_process(["--path", stock_transformer_ckpt, "--output", str(out), "--head-mask", str(path)], capsys)
    assert not out.exists()
    with pytest.raises(SystemExit) as e:
        heads_main(["evaluate", corpus["bin"], "--path", stock_transformer_ckpt, "--head-mask", str(path)])
    assert e.value.code == 2
    heads_err = capsys.readouterr().err
    message = err.split("error: ", 1)[1]
    assert message.startswith(f"--head-mask: head mask {path}: head mask for ")
    assert "number in [0, 1]" in message or "must be a list" in message
    assert heads_err.split("error: ", 1)[1] == message  # one validator, one message


def test_prune_heads_never_replaces_its_input(stock_transformer_ckpt, tmp_path, capsys):
    ckpt = tmp_path / "checkpoint_last.pt"
    ckpt.write_bytes(open(stock_transformer_ckpt, "rb").read())
    before = ckpt.read_bytes()
    (tmp_path / "mask.json").write_text(json.dumps({"enc": [[1, 0, 1, 1], [1, 1, 1, 1]]}))
    mask = ["--head-mask", str(tmp_path / "mask.json")]
    for output in (str(ckpt), os.path.join(str(tmp_path), ".", "checkpoint_last.pt")):
        err = prune_in_process(["--path", str(ckpt), "--output", output, "--overwrite"] + mask, capsys)
        assert "is an input of this command" in err
    assert ckpt.read_bytes() == before
    # the kept-heads JSON next to --output is an output too: refused unless --overwrite
    (tmp_path / "pruned.kept_heads.json").write_text("old")
    out = tmp_path / "pruned.pt"
    assert "pruned.kept_heads.json exists" in prune_in_process(["--path", str(ckpt), "--output", str(out)] + mask, capsys)
    assert not out.exists() and (tmp_path / "pruned.kept_heads.json").read_text() == "old"
    proc = prune(str(ckpt), str(out), mask + ["--overwrite"])
    assert "kept 23 of 24 heads" in proc.stdout
    assert json.loads((tmp_path / "pruned.kept_heads.json").read_text())["enc"] == [[0, 2, 3], [0, 1, 2, 3]]


def test_prune_heads_truncated_checkpoint_is_a_clear_error(stock_transformer_ckpt, tmp_path, capsys):
    data = open(stock_transformer_ckpt, "rb").read()
    broken = tmp_path / "broken.pt"
    broken.write_bytes(data[: len(data) // 3])
    err = prune_in_process(["--path", str(broken), "--output", str(tmp_path / "out.pt")], capsys)
    assert f"cannot read {broken}" in err and "truncated or corrupt" in err and "Traceback" not in err
    assert not (tmp_path / "out.pt").exists()
