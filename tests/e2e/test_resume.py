"""A target-sparsity run killed after a checkpoint and resumed is the uninterrupted run, bit for bit: weights,
gates, the controller's multipliers and the iterator (reports/2026-11-24-resume-exactness/README.md). fairseq
itself departs when the checkpoint lies in a later epoch than the first, unless --update-epoch-batch-itr True (the
report says why)."""
import os
import shutil

import torch

from conftest import TINY_MODEL, TRAIN_COMMON, USER_DIR, console, run

TARGET = ["--arch", "transformer_l0drop", "--criterion", "label_smoothed_cross_entropy_with_sparsity",
          "--label-smoothing", "0.1", "--l0drop-init-bias", "0", "--l0drop-target-sparsity", "0.3",
          "--sparsity-target-warmup-updates", "10", "--optimizer", "adam_sparsity", "--sparsity-lr", "0.05",
          "--max-tokens", "4000", "--update-epoch-batch-itr", "True", "--disable-validation"]


def train(data, save, max_update, extra=()):
    run([console("fairseq-train"), data, "--user-dir", USER_DIR, "--save-dir", save, "--max-update",
         str(max_update)] + TRAIN_COMMON + TINY_MODEL + TARGET + list(extra))


def test_resumed_target_run_is_the_uninterrupted_run(corpus, tmp_path):
    full, resumed = str(tmp_path / "full"), str(tmp_path / "resumed")
    train(corpus["bin"], full, 24, ["--save-interval-updates", "20"])
    saved = [f for f in os.listdir(full) if f.endswith("_20.pt")]
    assert saved == ["checkpoint_2_20.pt"], os.listdir(full)  # in the second epoch
    os.makedirs(resumed)
    shutil.copy(os.path.join(full, saved[0]), os.path.join(resumed, "checkpoint_last.pt"))  # killed here
    train(corpus["bin"], resumed, 24)
    a, b = (torch.load(os.path.join(d, "checkpoint_last.pt"), weights_only=True) for d in (full, resumed))
    assert a["extra_state"]["train_iterator"] == b["extra_state"]["train_iterator"]
    for part in ("model", "criterion"):
        assert a[part].keys() == b[part].keys()
        for k in a[part]:
            assert torch.equal(a[part][k], b[part][k]), (part, k)
