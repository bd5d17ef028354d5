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
