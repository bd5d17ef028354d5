"""lab/checkpoint_parts.py: a checkpoint brought back from a device call model-only in fp16, in parts under the
device tool's file limit where it is over it, and put together again exactly."""
import argparse
import os
import sys

import pytest
import torch

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "lab"))
import checkpoint_parts  # noqa: E402

def state():
    g = torch.Generator().manual_seed(0)
    model = {f"layer{i}.weight": torch.randn(256, 256, generator=g) for i in range(6)}  # 256 KiB each in fp32
    model["steps"] = torch.tensor([7])  # not floating point: kept as it is
    return {"model": model, "args": argparse.Namespace(arch="transformer"), "extra_state": {"num_updates": 7},
            "last_optimizer_state": {"state": {0: torch.zeros(3)}}}


def test_fits_whole_or_splits_in_order_and_joins_exactly():
    small = checkpoint_parts.model_only_fp16(state())
    assert "last_optimizer_state" not in small and small["model"]["layer0.weight"].dtype == torch.float16
    assert small["model"]["steps"].dtype == torch.int64
    assert checkpoint_parts.split(small, 2**20) == [small]  # 768 KiB in fp16: one file
    parts = checkpoint_parts.split(small, 300 * 2**10)  # 128 KiB a tensor: two tensors a part
    assert [p["part"] for p in parts] == [1, 2, 3] and {p["parts"] for p in parts} == {3}
    assert all(checkpoint_parts.saved_size(p) <= 300 * 2**10 for p in parts)
    assert [list(p["model"]) for p in parts] == [["layer0.weight", "layer1.weight"], ["layer2.weight", "layer3.weight"],
                                                ["layer4.weight", "layer5.weight", "steps"]]
    joined = checkpoint_parts.join(list(reversed(parts)))  # any order
    assert list(joined["model"]) == list(small["model"]) and joined["extra_state"] == {"num_updates": 7}
    assert all(torch.equal(joined["model"][k], v) for k, v in small["model"].items())
    assert set(joined) == set(small)
    with pytest.raises(ValueError, match="not one checkpoint's parts"):
        checkpoint_parts.join(parts[:2])
    with pytest.raises(ValueError, match="not one checkpoint's parts"):
        checkpoint_parts.join([parts[0], parts[0], parts[2]])
    with pytest.raises(ValueError, match="over the limit of a part"):
        checkpoint_parts.split(small, 64 * 2**10)


def test_parts_of_two_checkpoints_of_one_architecture_are_never_joined():
    """Issue 55: part 1 of one checkpoint with parts 2-3 of another (same names, same shapes) joined into a model
    that decoded a third translation; each part now carries the model's fingerprint."""
    small = checkpoint_parts.model_only_fp16(state())
    other = checkpoint_parts.model_only_fp16(state())
    other["model"]["layer1.weight"] = other["model"]["layer1.weight"] + 1
    mine, theirs = (checkpoint_parts.split(s, 300 * 2**10) for s in (small, other))
    with pytest.raises(ValueError, match="different checkpoints"):
        checkpoint_parts.join([mine[0], theirs[1], theirs[2]])
    assert checkpoint_parts.join(theirs[::-1])["model"]["layer1.weight"].equal(other["model"]["layer1.weight"])
    edited = dict(theirs[0], model_sha1=mine[0]["model_sha1"])  # a part edited to pass: the joined model is checked too
    with pytest.raises(ValueError, match="not the one that was split"):
        checkpoint_parts.join([edited, mine[1], mine[2]])


def command(argv, capsys):
    """(exit status, stdout, stderr) of the script's command line, run in this process."""
    try:
        checkpoint_parts.main(argv)
        status = 0
    except SystemExit as e:
        status = e.code
    out = capsys.readouterr()
    return status, out.out, out.err


def test_command_line_writes_parts_that_join_and_refuses_overwriting(tmp_path, capsys):
    ckpt = tmp_path / "checkpoint_best.pt"
    torch.save(state(), ckpt)
    dest = tmp_path / "back" / "s1_baseline.pt"
    dest.parent.mkdir()
    status, out, _ = command(["split", str(ckpt), str(dest), "--max-mib", "0.3"], capsys)
    parts = out.split()
    assert status == 0 and [os.path.basename(p) for p in parts] == [f"s1_baseline.part{k}of3.pt" for k in (1, 2, 3)]
    status, _, err = command(["split", str(ckpt), str(dest), "--max-mib", "0.3"], capsys)
    assert status == 2 and "exists, not overwritten" in err
    joined = tmp_path / "joined.pt"
    assert command(["join", str(joined), *parts], capsys)[0] == 0
    from fairseq_sparse.checkpoint_safety import read_state

    back = read_state(str(joined))
    assert back["args"].arch == "transformer" and "last_optimizer_state" not in back
    assert torch.equal(back["model"]["layer3.weight"], state()["model"]["layer3.weight"].half())
    status, _, err = command(["join", str(tmp_path / "j2.pt"), parts[0], parts[2]], capsys)
    assert status == 2 and "parts [1, 3] of 3" in err and not (tmp_path / "j2.pt").exists()
    status, _, err = command(["join", parts[0], *parts], capsys)
    assert status == 2 and "DEST is an input" in err
    status, _, err = command(["split", str(ckpt), str(tmp_path / "x.pt"), "--max-mib", "nan"], capsys)
    assert status == 2 and "--max-mib must be > 0" in err
