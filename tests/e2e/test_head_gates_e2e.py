"""Head gates and masks on fairseq's MultiheadAttention, and physical head pruning (papers 001, 003).

Unit tests on single attention modules (closed forms, masked == zeroed output columns, pruned ==
masked, a layer without heads == its output bias), then fairseq's SequenceGenerator on a trained
checkpoint: a physically pruned model decodes exactly like the masked/gated one.
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_head_gates.py.
"""
import copy

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.sequence_generator import SequenceGenerator

import fairseq_sparse  # noqa: F401  (registers the models)
from fairseq_sparse.modules.hard_concrete import HardConcrete
from fairseq_sparse.modules.head_gates import add_head_gates, attention_modules, prune_heads, set_head_masks


# ---------------------------------------------------------------------------------------------
# a trained checkpoint under fairseq's SequenceGenerator


@pytest.fixture(scope="module")
def stock(stock_transformer_ckpt, corpus):
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [stock_transformer_ckpt], arg_overrides={"data": corpus["bin"]})
    task.load_dataset("test")
    return models[0].eval(), task


def batch(task, n=10):
    ds = task.dataset("test")
    return ds.collater([ds[i] for i in range(n)])


def generate(model, task, sample, beam):
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=0, max_len_b=20)
    with torch.no_grad():
        return gen.generate([model], sample)


def random_mask(model, seed=0, closed=0.4):
    """Fractional mask values (like gates between 0 and 1) with some heads switched off."""
    g = torch.Generator().manual_seed(seed)
    masks = {}
    for key, m in attention_modules(model).items():
        v = 0.5 + 0.5 * torch.rand(m.num_heads, generator=g)
        v[torch.rand(m.num_heads, generator=g) < closed] = 0.0
        masks[key] = v
    return masks


@pytest.mark.parametrize("beam", [1, 4])
def test_physically_pruned_model_decodes_like_the_masked_one(stock, beam):
    model, task = stock
    masked = copy.deepcopy(model)
    masks = random_mask(masked)
    set_head_masks(masked, masks)
    pruned = copy.deepcopy(model)
    set_head_masks(pruned, masks)
    keep = {k: [h for h, v in enumerate(m.tolist()) if v > 0] for k, m in masks.items()}
    assert sum(map(len, keep.values())) < sum(m.num_heads for m in attention_modules(model).values())
    prune_heads(pruned, keep)
    assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in model.parameters())
    sample = batch(task)
    a, b = generate(masked, task, sample, beam), generate(pruned, task, sample, beam)
    for hyps_a, hyps_b in zip(a, b):
        for x, y in zip(hyps_a, hyps_b):
            assert torch.equal(x["tokens"], y["tokens"])
            assert abs(float(x["score"]) - float(y["score"])) < 1e-4
    # and masking does change the translations of this model (the check above is not vacuous)
    full = generate(model, task, sample, beam)
    assert any(not torch.equal(x[0]["tokens"], y[0]["tokens"]) or abs(float(x[0]["score"]) - float(y[0]["score"])) > 1e-3
               for x, y in zip(full, a))


def test_criterion_weights_the_head_gate_penalty_and_logs_totals_per_type(stock):
    from fairseq import metrics

    from fairseq_sparse.criterions.label_smoothed_cross_entropy_with_sparsity import (
        LabelSmoothedCrossEntropyWithSparsity as Criterion,
    )
    from helpers.criterion import sparsity_criterion

    model, task = stock
    model = copy.deepcopy(model)
    hc = HardConcrete(beta=0.33)
    keys = add_head_gates(model, ["enc", "encdec"], hc)
    log_alphas = {}
    for i, key in enumerate(keys):
        la = torch.tensor([-8.0, -1.0, 0.5, 4.0]).roll(i)
        attention_modules(model)[key].head_gates.log_alpha.data.copy_(la)
        log_alphas[key] = la
    crit = sparsity_criterion(task, False, 0.1, head_gates_lambda=0.2)
    model.train()
    for m in model.modules():  # no dropout: the only randomness left is the gate sample
        if hasattr(m, "p") and isinstance(m.p, float):
            m.p = 0.0
    sample = batch(task)
    torch.manual_seed(3)
    loss, sample_size, log = crit(model, sample)
    p_open = sum(float(hc.prob_open(la).sum()) for la in log_alphas.values())
    assert float(log["sparsity/head_gates_penalty"]) == pytest.approx(p_open, rel=1e-5)
    # the loss is CE (same gate sample: same seed) + lambda * L_C * sample_size
    torch.manual_seed(3)
    ce, _, _ = sparsity_criterion(task, False, 0.1)(model, sample)
    assert float((loss - ce).detach()) == pytest.approx(0.2 * p_open * sample_size, rel=1e-4)
    penalty, _ = crit.compute_sparsity_loss(model)  # the terms were consumed: nothing left to add
    assert float(penalty) == 0.0
    with metrics.aggregate() as agg:
        Criterion.reduce_metrics([log])
    open_enc = sum(int((hc.deterministic(la) > 0).sum()) for k, la in log_alphas.items() if k[0] == "enc")
    assert agg.get_smoothed_values()["heads_open_enc"] == pytest.approx(open_enc)
    exp_encdec = sum(float(hc.prob_open(la).sum()) for k, la in log_alphas.items() if k[0] == "encdec")
    assert agg.get_smoothed_values()["heads_open_expected_encdec"] == pytest.approx(exp_encdec, abs=1e-3)
    # a lambda for head gates on a model without them is a configuration error
    with pytest.raises(ValueError, match="has no head_gates"):
        sparsity_criterion(task, False, 0.1, head_gates_lambda=0.2)(stock[0], sample)
