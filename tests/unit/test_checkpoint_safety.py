"""torch's safe loader after the plugin allowlists fairseq's checkpoint classes (the console-script
tests of tests/e2e/test_cli.py need it to load checkpoints)."""

import numpy as np
import pytest
import torch

import fairseq_sparse  # noqa: F401  (allowlists fairseq's checkpoint classes in this process too)


class NotAllowlisted:
    pass


def test_safe_loader_still_refuses_other_classes(tmp_path):
    """The plugin allowlists fairseq's classes, it does not switch the safe loader off."""
    for payload in (NotAllowlisted(), np.array(["text"], dtype=object)):
        path = str(tmp_path / "other.pt")
        torch.save({"model": {}, "extra": payload}, path)
        with pytest.raises(Exception, match="(?i)weights only load failed"):
            torch.load(path, weights_only=True)


def test_an_unreadable_checkpoint_is_named_in_one_line(tmp_path):
    """A checkpoint truncated by a full disk is named, with what to do (torch's own error names no file)."""
    import torch

    from fairseq_sparse.checkpoint_safety import UnreadableCheckpoint, read_state

    path = tmp_path / "checkpoint_last.pt"
    torch.save({"model": {"w": torch.zeros(1000)}}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(UnreadableCheckpoint) as e:
        read_state(str(path))
    assert str(path) in str(e.value) and "truncated" in str(e.value) and "\n" not in str(e.value)
