"""fairseq-train with --distill-teacher: the KD and CE losses logged apart in training and validation, every
architecture's penalties beside it, 2-process training and resume; a bad teacher refused before training."""
import os
import shutil
import subprocess

import pytest
import torch

from conftest import TINY_MODEL, TRAIN_COMMON, USER_DIR, console, fairseq_train, run

SPARSITY = ["--criterion", "label_smoothed_cross_entropy_with_sparsity", "--label-smoothing", "0.1"]


def _logged(proc, tag, key):
    """Values of KEY on fairseq-train's TAG lines (train, valid, ...), simple log format."""
    out = proc.stdout + proc.stderr
    return [line for line in out.splitlines() if f"| {tag} |" in line and f" {key} " in line]


@pytest.mark.parametrize("arch,extra", [
    ("transformer", []),
    ("transformer_l0drop", ["--l0drop-lambda", "0.3"]),
    ("transformer_head_gates", ["--head-gates", "enc,dec,encdec", "--head-gates-lambda", "0.01"]),
])
def test_distilled_fine_tuning_logs_kd_and_ce(corpus, stock_transformer_ckpt, tmp_path, arch, extra):
    save = str(tmp_path / "save")
    proc = fairseq_train(corpus["bin"], save, ["--arch", arch] + SPARSITY + extra + TINY_MODEL + [
        "--finetune-from-model", stock_transformer_ckpt, "--distill-teacher", stock_transformer_ckpt,
        "--distill-weight", "0.5", "--distill-temperature", "2", "--log-interval", "5"], max_update=10)
    assert _logged(proc, "train", "kd_loss") and _logged(proc, "train", "ce_loss")
    valid = _logged(proc, "valid", "kd_loss")
    assert valid and " ce_loss " in valid[-1]
    # the teacher is neither trained nor saved: the checkpoint holds the student's parameters only
    state = torch.load(os.path.join(save, "checkpoint_last.pt"), map_location="cpu", weights_only=True)
    assert not any(k.startswith("teacher") for k in state["model"]) and not state.get("criterion", {})


def test_distillation_resumes(corpus, stock_transformer_ckpt, tmp_path):
    save = str(tmp_path / "save")
    common = ["--arch", "transformer_l0drop"] + SPARSITY + TINY_MODEL + [
        "--l0drop-lambda", "0.3", "--distill-teacher", stock_transformer_ckpt, "--log-interval", "5"]
    fairseq_train(corpus["bin"], save, common + ["--finetune-from-model", stock_transformer_ckpt], max_update=5)
    resumed = fairseq_train(corpus["bin"], save, common, max_update=10)
    assert "Loaded checkpoint" in resumed.stdout + resumed.stderr and _logged(resumed, "train", "kd_loss")


def test_distillation_in_two_processes(corpus, stock_transformer_ckpt, tmp_path):
    """One process per rank (gloo on CPU): each rank loads its own teacher; the runs finish and log KD."""
    from helpers.cli import ENV, free_port, train_cmd

    port, save = free_port(), str(tmp_path / "two")
    procs = [subprocess.Popen(train_cmd(corpus["bin"], save, [
        "--arch", "transformer_l0drop"] + SPARSITY + ["--l0drop-lambda", "0.3", "--distill-teacher",
        stock_transformer_ckpt, "--finetune-from-model", stock_transformer_ckpt, "--distributed-world-size", "2",
        "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp", "--distributed-rank", str(rank),
        "--distributed-no-spawn", "--distributed-init-method", f"tcp://127.0.0.1:{port}"], max_update=10),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV) for rank in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {rank}:\n{out[-3000:]}"
    assert "distributed init (rank 1)" in outs[1] and "kd_loss" in outs[0]


def _teacher_with_other_dictionary(src, dst):
    state = torch.load(src, map_location="cpu", weights_only=True)
    for key in [k for k in state["model"] if k.endswith("embed_tokens.weight") or k.endswith("output_projection.weight")]:
        state["model"][key] = state["model"][key][:-8]
    torch.save(state, dst)


@pytest.mark.parametrize("case", ["missing", "corrupt", "corrupt_member", "other_dictionary", "weight"])
def test_bad_teacher_refused_before_training(corpus, stock_transformer_ckpt, tmp_path, case):
    """A bad teacher: one line naming it (a corrupt tensor ended in torch's own error, naming no file), no training."""
    teacher = str(tmp_path / "teacher.pt")
    extra, message = [], {
        "missing": "no such file", "corrupt": "is not a readable fairseq checkpoint",
        "corrupt_member": f"error: --distill-teacher {teacher} is not a readable fairseq checkpoint (its member",
        "other_dictionary": "the teacher must use the data's dictionaries",
        "weight": "--distill-weight must lie in [0, 1], got 2.0"}[case]
    if case == "corrupt":
        with open(stock_transformer_ckpt, "rb") as f:
            (tmp_path / "teacher.pt").write_bytes(f.read()[:5000])
    elif case == "corrupt_member":  # one tensor's local header overwritten: torch maps the file, fails reading it
        with open(stock_transformer_ckpt, "rb") as f:
            archive = bytearray(f.read())
        headers = [i for i in range(len(archive)) if archive[i:i + 4] == b"PK\x03\x04"]
        archive[headers[len(headers) // 2]:headers[len(headers) // 2] + 4] = b"XXXX"
        (tmp_path / "teacher.pt").write_bytes(bytes(archive))
    elif case == "other_dictionary":
        _teacher_with_other_dictionary(stock_transformer_ckpt, teacher)
    elif case == "weight":
        shutil.copy(stock_transformer_ckpt, teacher)
        extra = ["--distill-weight", "2"]
    save = tmp_path / "save"
    proc = run([console("fairseq-train"), corpus["bin"], "--user-dir", USER_DIR, "--save-dir", str(save),
                "--max-update", "3", "--arch", "transformer"] + SPARSITY + TRAIN_COMMON + TINY_MODEL
               + ["--distill-teacher", teacher] + extra, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1 and message in log, log[-3000:]
    assert "Start iterating over samples" not in log
    if case != "weight":  # a teacher refused in one line
        assert "Traceback" not in log and log.strip().splitlines()[-1].startswith("error: --distill-teacher"), log[-3000:]
    assert not save.exists() or os.listdir(save) == []
