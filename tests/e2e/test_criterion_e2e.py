"""label_smoothed_cross_entropy_with_sparsity: CE + lambda * L0 * sample_size, lambda warm-up, config
errors, and the logged sparsity statistics (ratios of sums, not means of ratios).
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_criterion.py."""
import contextlib
import math

import pytest
import torch
from fairseq import checkpoint_utils, metrics
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.modules.fairseq_dropout import FairseqDropout

import fairseq_sparse  # noqa: F401
from fairseq_sparse.criterions.label_smoothed_cross_entropy_with_sparsity import (
    LabelSmoothedCrossEntropyWithSparsity as Criterion,
    SparsityConfigError,
)
from helpers.criterion import sparsity_criterion

LAMBDA = 0.3
LN11 = math.log(11.0)


def load(ckpt, data):
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([ckpt], arg_overrides={"data": data})
    task.load_dataset("valid")
    return models[0], task


@pytest.fixture(scope="module")
def l0(l0drop_ckpt, corpus):
    model, task = load(l0drop_ckpt, corpus["bin"])
    model.eval()  # deterministic gates and no dropout: every forward pass is the same function
    # close about a third of the gates (keeping the trained w), so the statistics are not trivial
    x, pad = l0drop_input(model, sample_of(task, range(40)))
    proj = model.encoder.l0drop.log_alpha_proj
    with torch.no_grad():
        xw = (x @ proj.weight.view(-1)).t()[~pad]
        proj.bias.fill_(-LN11 - torch.quantile(xw, 0.3).item())
    return model, task


def l0drop_input(model, sample):
    """The states (T x B x C) and padding mask that the model's L0Drop sees on ``sample``."""
    seen = []
    handle = model.encoder.l0drop.register_forward_pre_hook(lambda m, args: seen.append((args[0], args[1])))
    try:
        with torch.no_grad():
            model(**sample["net_input"])
    finally:
        handle.remove()
    model.encoder.l0drop.pop_sparsity_terms()
    return seen[0]


def sample_of(task, idx):
    ds = task.dataset("valid")
    return ds.collater([ds[i] for i in idx])


def penalty_by_hand(model, sample):
    """(penalty, expected-L0 sum, # g_hat = 0, # real tokens) from the L0Drop input, computed here."""
    x, pad = l0drop_input(model, sample)
    w = model.encoder.l0drop.log_alpha_proj.weight.detach().double().view(-1)
    b = model.encoder.l0drop.log_alpha_proj.bias.detach().double()
    la = (x.double() @ w + b).t()  # B x T
    beta, gamma, zeta = 2 / 3, -0.1, 1.1
    p_open = 1.0 - torch.sigmoid(beta * math.log(-gamma / zeta) - la)
    real = ~pad
    per_sentence = [(p_open[i][real[i]].sum() / real[i].sum()).item() for i in range(la.size(0))]
    pruned = int((la[real] <= -LN11).sum())
    return sum(per_sentence) / len(per_sentence), p_open[real].sum().item(), pruned, int(real.sum())


@contextlib.contextmanager
def training(model):
    """Training mode (penalties are recorded in training only) without dropout, so that the L0Drop input
    is the one penalty_by_hand sees; seed each forward pass alike to sample the same gates."""
    dropouts = [m for m in model.modules() if isinstance(m, FairseqDropout)]
    ps = [m.p for m in dropouts]
    for m in dropouts:
        m.p = 0.0
    model.train()
    try:
        yield model
    finally:
        model.eval()
        for m, p in zip(dropouts, ps):
            m.p = p


def ce_loss(model, task, sample, sentence_avg=False):
    crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg, 0.1)
    with torch.no_grad():
        loss, sample_size, _ = crit(model, sample)
    return loss.item(), sample_size


@pytest.mark.parametrize("sentence_avg", [False, True])
def test_loss_adds_lambda_penalty_sample_size(l0, sentence_avg):
    model, task = l0
    sample = sample_of(task, range(0, 40, 3))
    crit = sparsity_criterion(task, sentence_avg, 0.1, l0drop_lambda=LAMBDA)
    with training(model), torch.no_grad():
        torch.manual_seed(0)
        loss, sample_size, log = crit(model, sample)
        torch.manual_seed(0)
        ce, ce_size = ce_loss(model, task, sample, sentence_avg)
    penalty, expected_l0, pruned, tokens = penalty_by_hand(model, sample)
    expected_size = sample["target"].size(0) if sentence_avg else sample["ntokens"]
    assert sample_size == ce_size == expected_size
    assert 0.0 < penalty < 1.0
    # the penalty is per target token whatever the averaging: under --sentence-avg lambda is not divided by
    # the mean target length (the loss is divided by sample_size = sentences)
    assert loss.item() == pytest.approx(ce + LAMBDA * penalty * sample["ntokens"], rel=1e-5, abs=1e-4)
    assert abs(LAMBDA * penalty * expected_size) > 1e-2  # the check above can tell the penalty apart
    assert log["sparsity/l0drop_penalty"].item() == pytest.approx(penalty, abs=1e-5)
    assert log["sparsity/l0drop_lambda"] == LAMBDA
    assert float(log["sparsity/l0drop_expected_l0:num"]) == pytest.approx(expected_l0, abs=1e-3)
    assert int(log["sparsity/l0drop_expected_l0:den"]) == tokens
    assert int(log["sparsity/l0drop_sparsity:num"]) == pruned
    assert int(log["sparsity/l0drop_sparsity:den"]) == tokens
    assert 0 < pruned < tokens


def test_valid_loss_is_the_cross_entropy(l0):
    """Validation runs in eval mode: no penalty, so an L0Drop model's valid_loss (the default best-checkpoint
    metric) is its CE, like any other model's; the sparsity statistics are still logged."""
    model, task = l0
    sample = sample_of(task, range(0, 40, 3))
    with torch.no_grad():
        loss, _, log = sparsity_criterion(task, False, 0.1, l0drop_lambda=LAMBDA)(model, sample)
    assert loss.item() == pytest.approx(ce_loss(model, task, sample)[0], rel=1e-6)
    assert "sparsity/l0drop_penalty" not in log and "sparsity/l0drop_lambda" not in log
    _, _, pruned, tokens = penalty_by_hand(model, sample)
    assert (int(log["sparsity/l0drop_sparsity:num"]), int(log["sparsity/l0drop_sparsity:den"])) == (pruned, tokens)


def test_penalty_gradient(l0):
    """d(loss)/db differs between lambda and 0 by lambda * ntokens * mean_s(sum_i p_i (1 - p_i) / n_s)."""
    model, task = l0
    sample = sample_of(task, range(1, 30, 4))
    bias = model.encoder.l0drop.log_alpha_proj.bias
    grads = []
    for lam in (LAMBDA, 0.0):
        model.zero_grad()
        with training(model):
            torch.manual_seed(0)
            loss, _, _ = sparsity_criterion(task, False, 0.1, l0drop_lambda=lam)(model, sample)
        loss.backward()
        grads.append(bias.grad.item())
    model.zero_grad()
    x, pad = l0drop_input(model, sample)
    la = (x.double() @ model.encoder.l0drop.log_alpha_proj.weight.detach().double().view(-1) + bias.item()).t()
    p = 1.0 - torch.sigmoid((2 / 3) * math.log(0.1 / 1.1) - la)
    d = p * (1 - p) * (~pad)
    dpen = (d.sum(1) / (~pad).sum(1)).mean().item()
    assert grads[0] - grads[1] == pytest.approx(LAMBDA * sample["ntokens"] * dpen, rel=1e-3)


def test_lambda_warmup_is_linear(l0):
    model, task = l0
    sample = sample_of(task, range(2, 20, 2))
    crit = sparsity_criterion(task, False, 0.1, l0drop_lambda=LAMBDA, sparsity_warmup_updates=100)
    with training(model):
        torch.manual_seed(0)
        ce, size = ce_loss(model, task, sample)
    penalty = penalty_by_hand(model, sample)[0]
    try:
        for updates in (0, 25, 60, 100, 250):
            model.set_num_updates(updates)
            with training(model), torch.no_grad():
                torch.manual_seed(0)
                loss, _, log = crit(model, sample)
            lam = LAMBDA * min(1.0, updates / 100)
            assert log["sparsity/l0drop_lambda"] == pytest.approx(lam)
            assert loss.item() == pytest.approx(ce + lam * penalty * size, rel=1e-5, abs=1e-4)
    finally:
        model.set_num_updates(0)


def test_negative_settings_raise(l0):
    _, task = l0
    with pytest.raises(ValueError, match="lambda"):
        sparsity_criterion(task, False, 0.1, l0drop_lambda=-0.1)
    with pytest.raises(ValueError, match="warmup"):
        sparsity_criterion(task, False, 0.1, l0drop_lambda=0.1, sparsity_warmup_updates=-5)


def test_lambda_without_l0drop_module_raises(stock_transformer_ckpt, corpus):
    model, task = load(stock_transformer_ckpt, corpus["bin"])
    assert type(model).__name__ == "TransformerModel"
    sample = sample_of(task, range(5))
    with pytest.raises(ValueError) as err:
        sparsity_criterion(task, False, 0.1, l0drop_lambda=0.2)(model, sample)
    msg = str(err.value)
    assert "l0drop-lambda" in msg and "(transformer)" in msg and "transformer_l0drop" in msg
    # lambda 0 with a stock model is plain label-smoothed CE
    model.eval()
    with torch.no_grad():
        loss, _, log = sparsity_criterion(task, False, 0.1, l0drop_lambda=0.0)(model, sample)
    assert loss.item() == pytest.approx(ce_loss(model, task, sample)[0], rel=1e-6)
    # no penalty terms; only the attention statistics the criterion always logs (attn_entropy, attn_max)
    assert not any(k.startswith("sparsity/") and not k.startswith("sparsity/attn_") for k in log)
    assert "sparsity/attn_entropy:num" in log


def test_lambda_without_module_raises_before_the_first_batch(stock_transformer_ckpt, corpus):
    """fairseq-train calls task.begin_epoch(epoch, model) before it reads the first batch: the criterion's
    model check runs there, so the error comes before the batch-prefetch thread starts."""
    model, task = load(stock_transformer_ckpt, corpus["bin"])
    crit = sparsity_criterion(task, False, 0.1, head_gates_lambda=0.2)
    with pytest.raises(SparsityConfigError, match="--head-gates-lambda 0.2 is set but the model"):
        task.begin_epoch(1, model)
    ok = sparsity_criterion(task, False, 0.1)
    task.begin_epoch(1, model)  # the latest criterion checks the model; the stock task hook still runs
    assert ok._checked_model and not crit._checked_model


def test_reduce_metrics_from_real_batches(l0):
    model, task = l0
    crit = sparsity_criterion(task, False, 0.1, l0drop_lambda=LAMBDA)
    logs, pruned, tokens = [], 0, 0
    for idx in (range(0, 6), range(6, 30)):
        sample = sample_of(task, idx)
        with torch.no_grad():
            logs.append(crit(model, sample)[2])
        _, _, p, t = penalty_by_hand(model, sample)
        pruned, tokens = pruned + p, tokens + t
    with metrics.aggregate(new_root=True) as agg:
        Criterion.reduce_metrics(logs)
    assert agg.get_smoothed_values()["l0drop_sparsity"] == pytest.approx(pruned / tokens, abs=1e-4)
