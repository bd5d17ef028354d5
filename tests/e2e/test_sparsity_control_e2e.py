"""The target-sparsity controller (CoFi-style Lagrangian): target schedule, the multipliers' ascent,
reaching and holding a target on a small gated problem, and the criterion's options and checks.
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_sparsity_control.py."""

import fairseq_sparse  # noqa: F401



def test_fairseq_train_reaches_targets(corpus, stock_transformer_ckpt, tmp_path):
    """fairseq-train from a converged stock checkpoint with the targets set (and the plugin's optimiser; the
    targets ramped up over 100 updates instead of the default 200, to keep the test short): the g_hat sparsity
    on valid ends near the targets for L0Drop states and encoder heads alike."""
    from conftest import TINY_MODEL, fairseq_train
    from helpers.cli import log_records

    proc = fairseq_train(corpus["bin"], str(tmp_path / "save"), [
        "--arch", "transformer_l0drop", "--head-gates", "enc", "--criterion",
        "label_smoothed_cross_entropy_with_sparsity", "--label-smoothing", "0.1",
        "--l0drop-target-sparsity", "0.5", "--head-gates-target-sparsity", "0.5",
        "--optimizer", "adam_sparsity", "--lr", "5e-4", "--warmup-updates", "1",
        "--sparsity-target-warmup-updates", "100", "--finetune-from-model", stock_transformer_ckpt,
        "--log-format", "json", "--validate-interval-updates", "50", "--validate-interval", "1000", "--save-interval", "1000",
    ] + TINY_MODEL, max_update=250)
    log = proc.stdout + proc.stderr
    valid = log_records(log, "valid")
    assert valid, log[-3000:]
    last = valid[-1]
    assert abs(float(last["valid_l0drop_sparsity"]) - 0.5) <= 0.1, [r.get("valid_l0drop_sparsity") for r in valid]
    # 8 encoder heads: 4 closed, one head either way is 12.5 points
    assert abs(float(last["valid_head_gates_sparsity"]) - 0.5) <= 0.125 + 1e-6, last
    train = log_records(log, "train_inner")
    assert {"l0drop_target", "l0drop_lambda1", "l0drop_lambda2", "head_gates_target"} <= set(train[-1]), train[-1]
