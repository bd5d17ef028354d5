"""``--optimizer adam_sparsity``: the sparsity-control parameters (HardConcrete gates, Lagrange multipliers)
in their own Adam param group with their own fixed learning rate and no weight decay.

Unit tests of the groups, the lr scheduler and the state dict, then the real fairseq-train console
script: train, resume from checkpoint_last.pt, --reset-optimizer, a checkpoint trained with plain adam,
the fp16 variants (plain --fp16 refused before training; --memory-efficient-fp16 and --amp keep the groups).
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_gate_optimiser.py.
"""
import hashlib
import json
import os
import shutil

import pytest
import torch

import fairseq_sparse  # noqa: F401  (registers the optimiser; allowlists checkpoint classes)
from conftest import TRAIN_COMMON, TINY_MODEL, USER_DIR, console, run
from fairseq_sparse.optim.adam_sparsity import GROUP_FLAG, FairseqAdamSparsity
from helpers.optim import GATE_GROUP_LOG, SPARSITY_LR, WD, by_id


# ----------------------------------------------------------------------------------------------
# the real fairseq-train

FAST = ["--max-tokens", "400", "--log-interval", "2", "--log-format", "json"]
GATED = ["--arch", "transformer_l0drop", "--head-gates", "enc,dec,encdec",
         "--criterion", "label_smoothed_cross_entropy_with_sparsity", "--label-smoothing", "0.1",
         "--l0drop-lambda", "0.3", "--head-gates-lambda", "0.05"]
ADAM_SPARSITY = ["--optimizer", "adam_sparsity", "--sparsity-lr", str(SPARSITY_LR), "--weight-decay", str(WD)]
N_CONTROL = 2 + 6  # L0Drop's w and b, one log alpha per gated attention module (2 layers x 3 types)


def train(data_bin, save_dir, extra, max_update, check=True):
    # fairseq's own --optimizer adam comes first in TRAIN_COMMON; a later --optimizer wins
    cmd = ([console("fairseq-train"), data_bin, "--user-dir", USER_DIR, "--save-dir", str(save_dir),
            "--max-update", str(max_update)] + TRAIN_COMMON + FAST + TINY_MODEL + GATED + extra)
    proc = run(cmd, check=check)
    proc.log = proc.stdout + proc.stderr
    return proc


def train_records(log):
    out = []
    for line in log.splitlines():
        i = line.find("{")
        if "| train_inner |" in line and i >= 0:
            out.append(json.loads(line[i:]))
    return out


def load(path):
    return torch.load(path, map_location="cpu")


def groups_of(ckpt):
    return ckpt["last_optimizer_state"]["param_groups"]


def control_state(ckpt):
    """{param index: Adam state} of the sparsity-control group."""
    state = ckpt["last_optimizer_state"]["state"]
    return {i: state[i] for i in groups_of(ckpt)[1]["params"]}


def fingerprint(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest(), os.stat(path).st_mtime_ns


def assert_groups(ckpt, n_control=N_CONTROL):
    main, control = groups_of(ckpt)
    assert (control[GROUP_FLAG], control["lr"], control["weight_decay"]) == (True, SPARSITY_LR, 0.0), control
    assert main["weight_decay"] == WD and GROUP_FLAG not in main
    assert len(control["params"]) == n_control


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """A gated model trained 8 updates with adam_sparsity (checkpoint_last.pt in a directory of its own)."""
    save = tmp_path_factory.mktemp("adam_sparsity")
    proc = train(corpus["bin"], save, ADAM_SPARSITY, max_update=8)
    assert "parameters in 8 tensors at --sparsity-lr 0.05" in proc.log, proc.log[-3000:]
    assert GATE_GROUP_LOG.search(proc.log)
    return save / "checkpoint_last.pt"


def test_train_writes_both_groups(trained):
    ckpt = load(trained)
    assert_groups(ckpt)
    assert all(s["step"] == 8 for s in control_state(ckpt).values())


def test_resume_restores_both_groups(corpus, trained, tmp_path):
    # in process: fairseq's Trainer loads the checkpoint exactly as fairseq-train does
    from fairseq import checkpoint_utils, tasks
    from fairseq.trainer import Trainer

    saved = load(trained)
    cfg = checkpoint_utils.load_checkpoint_to_cpu(str(trained))["cfg"]
    task = tasks.setup_task(cfg.task)
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    trainer.load_checkpoint(str(trained))
    opt = trainer.optimizer
    assert isinstance(opt, FairseqAdamSparsity)
    saved_state = saved["last_optimizer_state"]["state"]
    params = [p for g in opt.param_groups for p in g["params"]]
    assert len(params) == len(saved_state)
    for i, p in enumerate(params):
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.optimizer.state[p][key], saved_state[i][key]), (i, key)
    gate = trainer.get_model().encoder.l0drop.log_alpha_proj.bias
    assert id(gate) in by_id(opt.param_groups[1]["params"])
    assert opt.param_groups[1]["lr"] == SPARSITY_LR and opt.param_groups[1]["weight_decay"] == 0.0

    # on the console: resume from checkpoint_last.pt, 2 more updates; the gates' Adam state carries on
    save = tmp_path / "resume"
    save.mkdir()
    shutil.copy2(trained, save / "checkpoint_last.pt")
    proc = train(corpus["bin"], save, ADAM_SPARSITY, max_update=10)
    assert "@ 8 updates" in proc.log, proc.log[-3000:]
    resumed = load(save / "checkpoint_last.pt")
    assert_groups(resumed)
    before, after = control_state(saved), control_state(resumed)
    assert all(s["step"] == 10 for s in after.values())
    # exp_avg after 2 more updates: beta1^2 * the saved one + (1 - beta1) * (new gradients), so it still
    # carries the saved moment (a reset optimiser's would not)
    bias = [i for i, s in before.items() if s["exp_avg"].numel() == 1][0]  # L0Drop's b
    assert not torch.equal(after[bias]["exp_avg"], before[bias]["exp_avg"])


def test_reset_optimizer(corpus, trained, tmp_path):
    shutil.copy2(trained, tmp_path / "checkpoint_last.pt")
    proc = train(corpus["bin"], tmp_path, ADAM_SPARSITY + ["--reset-optimizer"], max_update=3)
    assert "Loaded checkpoint" in proc.log, proc.log[-3000:]
    ckpt = load(tmp_path / "checkpoint_last.pt")
    assert_groups(ckpt)
    # a fresh optimiser: the update count and the Adam steps start again from 0
    assert ckpt["optimizer_history"][-1]["num_updates"] == 3
    assert all(s["step"] == 3 for s in control_state(ckpt).values())


def test_plain_adam_checkpoint_fine_tunes_with_adam_sparsity(corpus, tmp_path):
    """A checkpoint trained with --optimizer adam (before this optimiser existed): fairseq refuses to load
    another optimiser's state and names --reset-optimizer; with it the run goes on with the two groups."""
    train(corpus["bin"], tmp_path, [], max_update=4)  # TRAIN_COMMON's plain adam
    last = tmp_path / "checkpoint_last.pt"
    assert len(groups_of(load(last))) == 1
    before = fingerprint(last)
    proc = train(corpus["bin"], tmp_path, ADAM_SPARSITY, max_update=8, check=False)
    assert proc.returncode != 0
    assert "Optimizer does not match; please reset the optimizer (--reset-optimizer)" in proc.log, proc.log[-3000:]
    assert not train_records(proc.log) and fingerprint(last) == before
    proc = train(corpus["bin"], tmp_path, ADAM_SPARSITY + ["--reset-optimizer"], max_update=3)
    assert train_records(proc.log)
    assert_groups(load(last))


@pytest.mark.parametrize("precision", [["--fp16", "--memory-efficient-fp16"], ["--amp"]])
def test_memory_efficient_fp16_and_amp_keep_the_groups(corpus, tmp_path, precision):
    train(corpus["bin"], tmp_path, ADAM_SPARSITY + precision, max_update=3)
    ckpt = load(tmp_path / "checkpoint_last.pt")
    assert_groups(ckpt)
    assert all(s["step"] == 3 for s in control_state(ckpt).values())


# plain --fp16 on a machine without CUDA stops in fairseq's own FP16Optimizer ("Torch not compiled with
# CUDA enabled") before any optimiser is built; --fp16-no-flatten-grads takes the same wrapper (fp32 copies
# of every parameter) without CUDA, so it shows the refusal on CPU too
FP16_CASES = [["--fp16", "--fp16-no-flatten-grads"]] + ([["--fp16"]] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("precision", FP16_CASES)
def test_plain_fp16_refused_before_training(corpus, trained, tmp_path, precision):
    last = tmp_path / "checkpoint_last.pt"
    shutil.copy2(trained, last)
    before = fingerprint(last)
    proc = train(corpus["bin"], tmp_path, ADAM_SPARSITY + precision, max_update=10, check=False)
    assert proc.returncode != 0
    assert "--optimizer adam_sparsity does not work with plain --fp16/--bf16" in proc.log, proc.log[-3000:]
    assert "--memory-efficient-fp16" in proc.log
    assert not train_records(proc.log), "training started before the error"
    assert fingerprint(last) == before and os.listdir(tmp_path) == ["checkpoint_last.pt"]
