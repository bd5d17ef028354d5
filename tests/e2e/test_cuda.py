"""The CUDA path with the real console scripts: fairseq-train a few updates with ``--amp`` (transformer_l0drop
with a target, head gates, the simplified decoder, the composed model), plain ``--fp16`` with adam_sparsity
refused by the plugin before any update, then fairseq-generate on CUDA: pruned decoding, physically pruned
heads and the composed model (compacted encoder, pruned memory, heads cut out) give the hypotheses of the
same gated model decoded with the full memory.

Every test here is marked ``cuda``: skipped, with the reason, where torch sees no CUDA device (conftest.py).
The in-process CUDA checks are the ``[cuda]`` cases of test_generation_exactness.py and test_l0drop.py.
"""
import os

import pytest

from conftest import USER_DIR, console, run
from helpers.cli import (ENV, L0DROP, SIMPLIFIED, assert_same_decoding, generate_cmd, log_records, sparsity_line,
                         train_cmd)
from helpers.cli import with_mixed_gates as with_mixed_l0drop_gates
from helpers.head_gates import HEAD_GATES, assert_same_hypotheses, prune, with_mixed_gates
from helpers.optim import GATE_GROUP_LOG

pytestmark = pytest.mark.cuda

ON_CUDA = "CUDA enviroments for all"  # fairseq's trainer prints it (its spelling) when it trains on CUDA
ADAM_SPARSITY = ["--optimizer", "adam_sparsity", "--sparsity-lr", "0.05"]
TARGETS = ["--sparsity-target-warmup-updates", "5"]
#: name -> fairseq-train options of each model trained with --amp (all but the simplified decoder fine-tune the stock
#: checkpoint with adam_sparsity and a target sparsity)
MODELS = {
    "l0drop_target": L0DROP + ["--l0drop-target-sparsity", "0.5"] + TARGETS + ADAM_SPARSITY,
    "head_gates": HEAD_GATES + ["--head-gates", "enc,dec,encdec", "--head-gates-target-sparsity", "0.5"]
    + TARGETS + ADAM_SPARSITY,
    "simplified": SIMPLIFIED,
    "composed": L0DROP + ["--l0drop-between-layers", "--simplified-decoder", "--head-gates", "enc,dec,encdec",
                          "--l0drop-target-sparsity", "0.5", "--head-gates-target-sparsity", "0.5"]
    + TARGETS + ADAM_SPARSITY,
}
UPDATES = 20


def on_cuda(cmd):
    """A command line of the CPU tests without fairseq's --cpu: fairseq's own device selection, CUDA here."""
    return [c for c in cmd if c != "--cpu"]


def cuda_train(data_bin, save_dir, extra, max_update=UPDATES, check=True):
    proc = run(on_cuda(train_cmd(data_bin, str(save_dir), extra, max_update)), check=check, env=ENV, console=True)
    proc.log = proc.stdout + proc.stderr
    return proc


def cuda_generate(data_bin, ckpt, extra=()):
    return run(on_cuda(generate_cmd(data_bin, ckpt, extra)), env=ENV, console=True)


def full_memory(data_bin, ckpt):
    """fairseq-generate on CUDA with pruned decoding off: every source state in the memory."""
    return cuda_generate(data_bin, ckpt, ["--model-overrides", "{'pruned_decoding': False}"])


@pytest.fixture(scope="module")
def amp_trained(corpus, stock_transformer_ckpt, tmp_path_factory):
    """name -> the fairseq-train run (``.ckpt``: its checkpoint_last.pt) of each of MODELS, --amp on CUDA."""
    runs = {}
    for name, flags in MODELS.items():
        save = tmp_path_factory.mktemp(f"amp_{name}")
        start = [] if name == "simplified" else ["--finetune-from-model", stock_transformer_ckpt]
        runs[name] = cuda_train(corpus["bin"], save, flags + start + ["--amp"])
        runs[name].ckpt = str(save / "checkpoint_last.pt")
    return runs


@pytest.mark.parametrize("name", sorted(MODELS))
def test_amp_training_runs_on_cuda(amp_trained, name):
    proc = amp_trained[name]
    assert ON_CUDA in proc.log, proc.log[-3000:]
    records = log_records(proc.log)
    assert records and all(float(r["loss"]) == float(r["loss"]) for r in records)  # no NaN
    assert os.path.exists(proc.ckpt)
    if name != "simplified":
        assert GATE_GROUP_LOG.search(proc.log), proc.log[-3000:]  # adam_sparsity kept its gate group under AMP


# plain --fp16: the optimiser's refusal; --bf16 (fairseq 0.12: TPU only) the criterion's, before the trainer
@pytest.mark.parametrize("precision, message", [
    (["--fp16"], "--optimizer adam_sparsity does not work with plain --fp16/--bf16"),
    (["--bf16"], "--bf16 in fairseq 0.12 trains on a TPU")])
def test_plain_fp16_with_adam_sparsity_refused_before_any_update(corpus, stock_transformer_ckpt, tmp_path, precision,
                                                                  message):
    proc = cuda_train(corpus["bin"], tmp_path, MODELS["l0drop_target"] + precision
                      + ["--finetune-from-model", stock_transformer_ckpt], check=False)
    assert proc.returncode != 0
    assert message in proc.log, proc.log[-3000:]
    assert not log_records(proc.log) and not os.listdir(tmp_path)


def test_memory_efficient_fp16_trains_with_adam_sparsity(corpus, stock_transformer_ckpt, tmp_path):
    proc = cuda_train(corpus["bin"], tmp_path, MODELS["l0drop_target"] + ["--fp16", "--memory-efficient-fp16",
                                                                          "--finetune-from-model", stock_transformer_ckpt])
    assert ON_CUDA in proc.log and log_records(proc.log)


def test_pruned_decoding_is_exact_on_cuda(corpus, amp_trained, tmp_path):
    mixed = with_mixed_l0drop_gates(amp_trained["l0drop_target"].ckpt, corpus["bin"], str(tmp_path / "mixed.pt"))
    pruned = cuda_generate(corpus["bin"], mixed)
    assert_same_decoding(pruned, full_memory(corpus["bin"], mixed))
    assert 0 < sparsity_line(pruned)[0] < 100


def test_pruned_heads_decode_like_the_masked_model_on_cuda(corpus, amp_trained, tmp_path):
    mixed = with_mixed_gates(amp_trained["head_gates"].ckpt, str(tmp_path / "mixed.pt"))
    out = str(tmp_path / "pruned.pt")
    assert "kept 18 of 24 heads" in prune(mixed, out).stdout
    assert_same_hypotheses(cuda_generate(corpus["bin"], mixed), cuda_generate(corpus["bin"], out))


def test_composed_model_decodes_exactly_on_cuda(corpus, amp_trained, tmp_path):
    """Heads cut out, the encoder compacted between layers and the memory pruned, on CUDA: the hypotheses of
    the gated model with every state kept."""
    ckpt = with_mixed_gates(amp_trained["composed"].ckpt, str(tmp_path / "mixed_heads.pt"))
    ckpt = with_mixed_l0drop_gates(ckpt, corpus["bin"], str(tmp_path / "mixed.pt"))
    composed = str(tmp_path / "composed.pt")
    assert "kept 18 of 24 heads" in prune(ckpt, composed).stdout
    decoded = cuda_generate(corpus["bin"], composed)
    assert_same_hypotheses(decoded, full_memory(corpus["bin"], ckpt))
    assert 0 < sparsity_line(decoded)[0] < 100


def test_tools_run_on_cuda(corpus, amp_trained, tmp_path):
    """A tool with --device cuda (its own loop: model and batches on the GPU) and one on fairseq's parser."""
    ckpt = amp_trained["l0drop_target"].ckpt
    run([console("fairseq-sparse-attention-analysis"), corpus["bin"], "--path", ckpt, "--gen-subset", "test",
         "--output-dir", str(tmp_path / "att"), "--device", "cuda", "--no-progress-bar"], env=ENV, console=True)
    assert os.path.exists(tmp_path / "att")
    gates = tmp_path / "gates.tsv"
    run([console("fairseq-sparse-l0drop-gates"), corpus["bin"], "--user-dir", USER_DIR, "--path", ckpt,
         "--gen-subset", "test", "--gates-output", str(gates), "--batch-size", "16"], env=ENV, console=True)
    assert gates.exists()
