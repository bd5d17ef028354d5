"""label_smoothed_cross_entropy_with_sparsity: CE + lambda * L0 * sample_size, lambda warm-up, config
errors, and the logged sparsity statistics (ratios of sums, not means of ratios).
Here the pure tests; those that train or run console scripts are in tests/e2e/test_criterion_e2e.py."""
import math

import pytest
import torch
from fairseq import metrics
from fairseq.criterions import CRITERION_REGISTRY

import fairseq_sparse  # noqa: F401
from fairseq_sparse.criterions.label_smoothed_cross_entropy_with_sparsity import LabelSmoothedCrossEntropyWithSparsity as Criterion
from helpers.criterion import sparsity_criterion


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("group", ["l0drop", "head_gates", "attention_reg"])
def test_non_finite_lambda_raises(group, value):
    extra = {"attention_reg": "entropy"} if group == "attention_reg" else {}
    with pytest.raises(ValueError, match=f"--{group.replace('_', '-')}-lambda must be a finite number, got"):
        sparsity_criterion(None, False, 0.1, **{f"{group}_lambda": value}, **extra)


def test_registered():
    assert CRITERION_REGISTRY["label_smoothed_cross_entropy_with_sparsity"] is Criterion


def base_log(**extra):
    log = {"loss": 10.0, "nll_loss": 8.0, "ntokens": 10, "nsentences": 2, "sample_size": 10}
    log.update(extra)
    return log


def test_reduce_metrics_logs_ratios_of_sums():
    logs = [
        base_log(**{"sparsity/l0drop_sparsity:num": 1, "sparsity/l0drop_sparsity:den": 10,
                    "sparsity/l0drop_expected_l0:num": 9.0, "sparsity/l0drop_expected_l0:den": 10,
                    "sparsity/l0drop_penalty": torch.tensor(0.9), "sparsity/l0drop_lambda": 0.3}),
        base_log(**{"sparsity/l0drop_sparsity:num": 30, "sparsity/l0drop_sparsity:den": 40,
                    "sparsity/l0drop_expected_l0:num": 12.0, "sparsity/l0drop_expected_l0:den": 40,
                    "sparsity/l0drop_penalty": torch.tensor(0.3), "sparsity/l0drop_lambda": 0.3}),
    ]
    with metrics.aggregate(new_root=True) as agg:
        Criterion.reduce_metrics(logs)
    vals = agg.get_smoothed_values()
    assert vals["l0drop_sparsity"] == pytest.approx(31 / 50, abs=1e-4)  # not (0.1 + 0.75) / 2
    assert vals["l0drop_expected_l0"] == pytest.approx(21 / 50, abs=1e-4)
    assert vals["l0drop_penalty"] == pytest.approx(0.6, abs=1e-4)
    assert vals["l0drop_lambda"] == pytest.approx(0.3, abs=1e-4)
    assert not any(k.endswith(":num") or k.endswith(":den") for k in vals)
    assert "loss" in vals and "nll_loss" in vals
    # two log calls into one meter (e.g. successive updates) still give the ratio of sums
    with metrics.aggregate(new_root=True) as agg:
        Criterion.reduce_metrics(logs[:1])
        Criterion.reduce_metrics(logs[1:])
    assert agg.get_smoothed_values()["l0drop_sparsity"] == pytest.approx(31 / 50, abs=1e-4)
    assert Criterion.logging_outputs_can_be_summed()
