"""FAIRSEQ_SPARSE_PATCHES (fairseq_sparse/patches/, issue 54): the plugin's import-time changes to fairseq and
torch can be switched off, one by one or all, and an unknown name is refused."""
import os
import subprocess
import sys

import pytest

PROBE = """
import torch
from fairseq.data import data_utils
from fairseq.ngram_repeat_block import NGramRepeatBlock
import fairseq_sparse
from fairseq_sparse.patches import last_batch, ngram_block
print(data_utils.batch_by_size is last_batch.batch_by_size,
      NGramRepeatBlock._no_repeat_ngram is ngram_block._no_repeat_ngram,
      'argparse.Namespace' in str(torch.serialization.get_safe_globals()))
"""


@pytest.mark.parametrize("value, made", [(None, "True True True"), ("none", "False False False"),
                                         ("last_batch", "True False False"), ("ngram_block,safe_globals", "False True True")])
def test_each_patch_is_made_only_when_asked(value, made):
    env = {k: v for k, v in os.environ.items() if k != "FAIRSEQ_SPARSE_PATCHES"}
    if value is not None:
        env["FAIRSEQ_SPARSE_PATCHES"] = value
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-3:] == made.split()


def test_an_unknown_patch_is_refused():
    env = dict(os.environ, FAIRSEQ_SPARSE_PATCHES="last_batch,typo")
    done = subprocess.run([sys.executable, "-c", "import fairseq_sparse"], capture_output=True, text=True, env=env)
    assert done.returncode != 0 and "FAIRSEQ_SPARSE_PATCHES=last_batch,typo: unknown typo" in done.stderr


def test_the_plugins_own_reads_allow_fairseq_checkpoints_without_the_patch(tmp_path):
    import argparse

    import torch

    path = tmp_path / "c.pt"
    torch.save({"args": argparse.Namespace(arch="transformer"), "model": {}}, path)
    code = (f"import torch, fairseq_sparse.checkpoint_safety as c; print(c.read_state({str(path)!r})['args'].arch); "
            f"print(torch.load({str(path)!r}, weights_only=True)['args'].arch)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, FAIRSEQ_SPARSE_PATCHES="none"))
    assert done.stdout.split() == ["transformer"] and done.returncode != 0, done.stderr[-2000:]
    assert "Unsupported global" in done.stderr  # without the patch, torch's own loader is torch's (read_state left it so)
    # with it, a read leaves torch's own loader allowing fairseq's classes (torch's safe_globals context manager takes
    # out on exit what it was given, even where it was allowed before: every later fairseq load failed)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert done.returncode == 0 and done.stdout.split() == ["transformer", "transformer"], done.stderr[-2000:]
