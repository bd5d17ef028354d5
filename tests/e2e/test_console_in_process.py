"""The in-process console runs (tests/helpers/console.py) read as the real console scripts do: the same exit status
and error for a refusal, the state of this process left as it was, fairseq-train's best checkpoint and the L0Drop
sparsity line as a fresh process gives them."""
import logging
import os
import sys

from conftest import USER_DIR, console, run
from helpers.cli import ENV, generate, sparsity_line, train
from helpers.console import run_in_process


def export_refusal(tmp_path, ckpt):
    out = tmp_path / "model.pt"
    out.write_text("keep me")
    return [console("fairseq-sparse-export"), "--path", ckpt, "--output", str(out)]


def test_a_refusal_reads_as_the_console_scripts(stock_transformer_ckpt, tmp_path):
    cmd = export_refusal(tmp_path, stock_transformer_ckpt)
    here, there = run(cmd, check=False), run(cmd, check=False, console=True)
    assert here.returncode == there.returncode == 2
    assert here.stderr.strip().splitlines()[-1] == there.stderr.strip().splitlines()[-1]
    assert "pass --overwrite" in here.stderr


def test_this_process_is_left_as_it_was(stock_transformer_ckpt, tmp_path):
    root = logging.getLogger()
    before = sys.argv[:], os.getcwd(), dict(os.environ), root.level, root.handlers[:]
    env = dict(ENV, FAIRSEQ_SPARSE_TEST_VARIABLE="1")
    proc = run_in_process(export_refusal(tmp_path, stock_transformer_ckpt), cwd=str(tmp_path), env=env)
    assert proc.returncode == 2
    assert (sys.argv, os.getcwd(), dict(os.environ), root.level, root.handlers) == before


def test_an_error_is_a_traceback_and_status_1(corpus, tmp_path):
    """What the interpreter does with an uncaught error: the traceback on stderr, exit status 1."""
    proc = run_in_process([console("fairseq-generate"), corpus["bin"], "--user-dir", USER_DIR, "--path",
                           str(tmp_path / "missing.pt"), "--cpu"], env=ENV)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr and "missing.pt" in proc.stderr


def test_a_second_training_writes_its_own_best_checkpoint(corpus, tmp_path):
    """fairseq keeps the process's best validation loss (checkpoint_utils.save_checkpoint.best): a worse second run
    in the same process would write no checkpoint_best.pt unless the runner forgets it, as a new process does."""
    from fairseq import checkpoint_utils

    checkpoint_utils.save_checkpoint.best = -1e9  # a best no run can beat: what an earlier, better run leaves
    train(corpus["bin"], str(tmp_path / "save"), ["--arch", "transformer", "--criterion", "cross_entropy"],
          max_update=2)
    assert (tmp_path / "save" / "checkpoint_best.pt").exists()


def test_the_sparsity_line_counts_this_run_only(corpus, l0drop_ckpt):
    first, second = (sparsity_line(generate(corpus["bin"], l0drop_ckpt)) for _ in range(2))
    assert first == second and first[3] == 60
