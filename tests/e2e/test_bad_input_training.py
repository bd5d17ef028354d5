"""fairseq-train on bad sparsity options: refused before the first training step, exit status 1, a clear
message, and nothing in --save-dir (no crash.pt, no checkpoint).

NaN and inf pass every comparison-based range check (nan < 0 is False), so they used to start training
and fail at step 1 with fairseq's "gradients are Nan/Inf", leaving crash.pt behind; a lambda for a
module the model lacks was found at the first step, after which the process died with "terminate called
without an active exception" (exit 134: fairseq's batch-prefetch thread was still alive)."""
import os
import sys

import pytest

from conftest import TINY_MODEL, TRAIN_COMMON, USER_DIR, console, run

CRITERION = ["--criterion", "label_smoothed_cross_entropy_with_sparsity", "--label-smoothing", "0.1"]
L0DROP = ["--arch", "transformer_l0drop"] + CRITERION
HEAD_GATES = ["--arch", "transformer_head_gates"] + CRITERION

CASES = {
    # name: (arguments, message)
    "l0drop_lambda_nan": (L0DROP + ["--l0drop-lambda", "nan"], "--l0drop-lambda must be a finite number, got nan"),
    "head_gates_lambda_inf": (HEAD_GATES + ["--head-gates-lambda", "inf"],
                              "--head-gates-lambda must be a finite number, got inf"),
    "attention_reg_lambda_nan": (["--arch", "transformer"] + CRITERION + ["--attention-reg", "entropy",
                                 "--attention-reg-lambda", "nan"],
                                 "--attention-reg-lambda must be a finite number, got nan"),
    "l0drop_beta_nan": (L0DROP + ["--l0drop-lambda", "0.3", "--l0drop-beta", "nan"],
                        "HardConcrete beta must be a finite number > 0, got nan"),
    "l0drop_zeta_inf": (L0DROP + ["--l0drop-zeta", "inf"], "HardConcrete gamma and zeta must be finite"),
    "l0drop_init_bias_nan": (L0DROP + ["--l0drop-lambda", "0.3", "--l0drop-init-bias", "nan"],
                             "--l0drop-init-bias must be a finite number, got nan"),
    "head_gates_beta_nan": (HEAD_GATES + ["--head-gates-beta", "nan"],
                            "HardConcrete beta must be a finite number > 0, got nan"),
    "head_gates_init_log_alpha_inf": (HEAD_GATES + ["--head-gates-init-log-alpha=-inf"],
                                      "--head-gates-init-log-alpha must be a finite number, got -inf"),
    # lambdas for modules the model lacks: found before the first batch, not in the first step
    "l0drop_lambda_on_transformer": (["--arch", "transformer"] + CRITERION + ["--l0drop-lambda", "0.3"],
                                     "--l0drop-lambda 0.3 is set but the model (transformer) has no l0drop module"),
    # a target with the user's plain adam: the gates would move at the model's --lr (issue 23: 0.00% pruned)
    "target_with_plain_adam": (L0DROP + ["--l0drop-target-sparsity", "0.5"],
                               "--l0drop-target-sparsity with --optimizer adam: the gates and multipliers would move"),
    "head_gates_lambda_on_l0drop": (L0DROP + ["--head-gates-lambda", "0.1"],
                                    "--head-gates-lambda 0.1 is set but the model (transformer_l0drop) has no "
                                    "head_gates module"),
}


#: run through the console script (exit status, no "terminate called" from fairseq's prefetch thread): the cases
#: found before the first batch; the others' check runs where the model or criterion is built, so they run in this
#: process (a fairseq-train start costs about 4.5 s of CPU time)
CONSOLE = ("l0drop_lambda_on_transformer", "head_gates_lambda_on_l0drop", "target_with_plain_adam")


def train_argv(corpus, save, args):
    return [corpus["bin"], "--user-dir", USER_DIR, "--save-dir", str(save), "--max-update", "3"] + TRAIN_COMMON \
        + TINY_MODEL + args


@pytest.mark.parametrize("case", sorted(set(CASES) - set(CONSOLE)))
def test_refused_in_process_before_training(case, corpus, tmp_path, monkeypatch, caplog):
    """fairseq-train's own entry point in this process: the bad value raises before the first training step."""
    from fairseq_cli import train

    args, message = CASES[case]
    save = tmp_path / "save"
    monkeypatch.setattr(sys, "argv", ["fairseq-train"] + train_argv(corpus, save, args))
    with pytest.raises(ValueError) as refused:
        train.cli_main()
    assert message in str(refused.value)
    assert "Start iterating over samples" not in caplog.text, "training started before the error"
    assert not save.exists() or os.listdir(save) == [], os.listdir(save)


@pytest.mark.parametrize("case", CONSOLE)
def test_refused_before_training_with_status_1(case, corpus, tmp_path):
    args, message = CASES[case]
    save = tmp_path / "save"
    proc = run([console("fairseq-train")] + train_argv(corpus, save, args), check=False, console=True)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log[-3000:]
    assert message in log, log[-3000:]
    assert "terminate called" not in log
    assert "Start iterating over samples" not in log, "training started before the error"
    assert not save.exists() or os.listdir(save) == [], os.listdir(save)
