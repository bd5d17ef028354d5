"""Attention regularisers (paper 002 Sec. III) and attention statistics on encoder-decoder attention.

Closed forms on hand-made distributions (entropy, the weak subgradient of max, per-head vs head-mean),
padding excluded on both sides, the hooks leave the model's outputs unchanged, the criterion's loss is
CE + lambda * R * sample_size with R computed here from the attention modules' own projections, the
logged statistics are ratios of sums, bad options fail early, and a short fairseq-train /
fairseq-generate run.
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_attention_regularisers.py.
"""
import argparse
import copy
import math
import os

import pytest
import torch
from fairseq import checkpoint_utils, metrics
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.distributed import ModuleProxyWrapper
from fairseq.modules.fairseq_dropout import FairseqDropout
from fairseq.sequence_generator import SequenceGenerator
from torch import nn

import fairseq_sparse  # noqa: F401
from fairseq_sparse.models.transformer_l0drop import L0DropTransformerModel, transformer_l0drop
from fairseq_sparse.criterions.label_smoothed_cross_entropy_with_sparsity import (
    LabelSmoothedCrossEntropyWithSparsity as Criterion,
    LabelSmoothedCrossEntropyWithSparsityConfig,
    SparsityConfigError,
)
from fairseq_sparse.modules.attention_regularisers import ATTACHED_NAME, AttentionRegulariser, attach_attention_regulariser, find_attention_regularisers
from helpers.criterion import sparsity_criterion

LAMBDA = 0.01  # paper 002's value


# ----------------------------------------------------------------------------------------------
# a real model: the stock transformer of conftest, deterministic in train mode (dropout 0)


@pytest.fixture(scope="module")
def stock(stock_transformer_ckpt, corpus):
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [stock_transformer_ckpt], arg_overrides={"data": corpus["bin"]})
    task.load_dataset("valid")
    model = models[0]
    for m in model.modules():
        if isinstance(m, FairseqDropout):
            m.p = 0.0
    return model, task, cfg


@pytest.fixture
def model_task(stock):
    model, task, _ = stock
    model.train()
    yield model, task
    for reg in find_attention_regularisers(model):
        reg.detach(model)
    assert not find_attention_regularisers(model)
    model.zero_grad()


def sample_of(task, idx):
    ds = task.dataset("valid")
    return ds.collater([ds[i] for i in idx])


def reference_attention(model, sample):
    """[H x B x T x S per decoder layer]: encoder-decoder attention recomputed here from each module's
    inputs and its own projections (independent of the regulariser's hooks)."""
    inputs = {}
    handles = [layer.encoder_attn.register_forward_pre_hook(
        lambda m, a, k, i=i: inputs.__setitem__(i, (k["query"], k["key"], k["key_padding_mask"])), with_kwargs=True)
        for i, layer in enumerate(model.decoder.layers)]
    try:
        model(**sample["net_input"])
    finally:
        for h in handles:
            h.remove()
    out = []
    for i, layer in enumerate(model.decoder.layers):
        mha, (query, key, kpm) = layer.encoder_attn, inputs[i]
        T, B, _ = query.shape
        S, H, d = key.size(0), mha.num_heads, mha.head_dim
        q = (mha.q_proj(query) * mha.scaling).view(T, B, H, d).permute(2, 1, 0, 3)
        k = mha.k_proj(key).view(S, B, H, d).permute(2, 1, 3, 0)
        logits = q @ k
        if kpm is not None:
            logits = logits.masked_fill(kpm.view(1, B, 1, S), float("-inf"))
        out.append(torch.softmax(logits.float(), -1))
    return out


def regulariser_by_hand(probs_per_layer, sample, kind, heads="each", pad=1):
    """mean over layers and real target tokens of -R, sentence by sentence over real positions only."""
    tgt_real = sample["net_input"]["prev_output_tokens"].ne(pad)
    src_real = sample["net_input"]["src_tokens"].ne(pad)
    total, count = 0.0, 0
    for probs in probs_per_layer:
        for b in range(tgt_real.size(0)):
            p = probs[:, b][:, tgt_real[b]][:, :, src_real[b]]  # H x T_b x S_b, all > 0
            if heads == "mean":
                p = p.mean(0, keepdim=True)
            r = -(p * p.log()).sum(-1) if kind == "entropy" else -p.max(-1).values
            total = total + r.mean(0).sum()
            count += int(tgt_real[b].sum())
    return total / count


def ce_loss(model, task, sample):
    with torch.no_grad():
        return LabelSmoothedCrossEntropyCriterion(task, False, 0.1)(model, sample)[0].item()


def test_hooks_leave_outputs_unchanged(model_task):
    model, task = model_task
    sample = sample_of(task, range(8))
    reg = attach_attention_regulariser(model, "entropy")
    assert getattr(model, ATTACHED_NAME) is reg and reg.layers == [0, 1]
    with torch.no_grad():
        plain = model(**sample["net_input"])
        assert not reg.pop_sparsity_terms()  # outside capture the hooks do nothing
        with reg.capture():
            hooked = model(**sample["net_input"])
    assert torch.equal(plain[0], hooked[0])
    assert torch.equal(plain[1]["attn"][0], hooked[1]["attn"][0])  # the alignment layer's head mean
    assert len(reg.pop_sparsity_terms()) == 1
    # called directly: the module returns what the caller asked for
    mha = model.decoder.layers[0].encoder_attn
    q, kv = torch.randn(3, 2, mha.embed_dim), torch.randn(5, 2, mha.embed_dim)
    with torch.no_grad(), reg.capture():
        none = mha(query=q, key=kv, value=kv, static_kv=True, need_weights=False)[1]
        mean = mha(query=q, key=kv, value=kv, static_kv=True)[1]
        per_head = mha(query=q, key=kv, value=kv, static_kv=True, need_head_weights=True)[1]
    assert none is None and mean.shape == (2, 3, 5) and per_head.shape == (mha.num_heads, 2, 3, 5)
    assert torch.allclose(mean, per_head.mean(0))


def test_generation_unaffected(model_task):
    model, task = model_task
    model.eval()
    sample = sample_of(task, range(6))
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=20)
    with torch.no_grad():
        before = gen.generate([model], sample)
        reg = attach_attention_regulariser(model, "linf")
        with reg.capture():  # incremental steps are skipped even while capturing
            during = gen.generate([model], sample)
    assert not reg.pop_sparsity_terms()
    for a, b in zip(before, during):
        assert torch.equal(a[0]["tokens"], b[0]["tokens"]) and torch.allclose(a[0]["score"], b[0]["score"])


@pytest.mark.parametrize("kind,heads", [("entropy", "each"), ("linf", "each"), ("entropy", "mean")])
def test_loss_is_ce_plus_lambda_r_sample_size(model_task, kind, heads):
    model, task = model_task
    sample = sample_of(task, range(0, 30, 3))
    crit = sparsity_criterion(task, False, 0.1, attention_reg=kind, attention_reg_lambda=LAMBDA, attention_reg_heads=heads)
    with torch.no_grad():
        loss, sample_size, log = crit(model, sample)
        r = regulariser_by_hand(reference_attention(model, sample), sample, kind, heads).item()
    ce = ce_loss(model, task, sample)
    assert sample_size == sample["ntokens"] == int(sample["target"].ne(1).sum())
    assert loss.item() == pytest.approx(ce + LAMBDA * r * sample_size, rel=1e-6, abs=1e-4)
    assert abs(LAMBDA * r * sample_size) > 1e-2  # the check above can tell the term apart
    assert log["sparsity/attention_reg_penalty"].item() == pytest.approx(r, rel=1e-5)
    assert log["sparsity/attention_reg_lambda"] == LAMBDA
    assert log["sparsity/attn_entropy:den"] == 2 * sample["ntokens"]  # 2 layers


def test_sentence_avg_weights_the_regulariser_by_target_tokens(model_task):
    """--sentence-avg: sample_size = sentences, the summed CE next to lambda * sum over target tokens of -R
    (Eq. 12), so that fairseq's division by sample_size does not divide lambda by the mean target length."""
    model, task = model_task
    sample = sample_of(task, range(0, 30, 3))
    crit = sparsity_criterion(task, True, 0.1, attention_reg="entropy", attention_reg_lambda=LAMBDA)
    with torch.no_grad():
        loss, sample_size, _ = crit(model, sample)
        r = regulariser_by_hand(reference_attention(model, sample), sample, "entropy").item()
        ce = LabelSmoothedCrossEntropyCriterion(task, True, 0.1)(model, sample)[0].item()
    assert sample_size == sample["target"].size(0) < sample["ntokens"]
    assert loss.item() == pytest.approx(ce + LAMBDA * r * sample["ntokens"], rel=1e-6, abs=1e-4)
    assert abs(LAMBDA * r * (sample["ntokens"] - sample_size)) > 1e-2  # tells tokens from sentences


def test_penalty_gradient(model_task):
    """d loss / d theta with lambda minus without = lambda * ntokens * d R_hand / d theta."""
    model, task = model_task
    sample = sample_of(task, range(1, 40, 4))
    w = model.decoder.layers[0].encoder_attn.q_proj.weight
    grads = []
    for lam in (LAMBDA, 0.0):
        model.zero_grad()
        crit = sparsity_criterion(task, False, 0.1, attention_reg="entropy", attention_reg_lambda=lam)
        crit(model, sample)[0].backward()
        grads.append(w.grad.clone())
    model.zero_grad()
    regulariser_by_hand(reference_attention(model, sample), sample, "entropy").backward()
    expected = LAMBDA * sample["ntokens"] * w.grad
    assert expected.abs().max() > 1e-4
    assert torch.allclose(grads[0] - grads[1], expected, rtol=1e-3, atol=1e-6)


def test_eval_reports_statistics_only(model_task):
    model, task = model_task
    model.eval()
    sample = sample_of(task, range(10))
    crit = sparsity_criterion(task, False, 0.1, attention_reg="entropy", attention_reg_lambda=LAMBDA,
                     attention_reg_layers="last")
    with torch.no_grad():
        loss, _, log = crit(model, sample)
        probs = reference_attention(model, sample)
    assert loss.item() == pytest.approx(ce_loss(model, task, sample), rel=1e-6)
    assert "sparsity/attention_reg_penalty" not in log
    ent = regulariser_by_hand(probs[-1:], sample, "entropy").item()
    mx = -regulariser_by_hand(probs[-1:], sample, "linf").item()
    assert log["sparsity/attn_entropy:num"] / log["sparsity/attn_entropy:den"] == pytest.approx(ent, rel=1e-5)
    assert log["sparsity/attn_max:num"] / log["sparsity/attn_max:den"] == pytest.approx(mx, rel=1e-5)


def test_statistics_reduce_to_ratio_of_sums(model_task):
    model, task = model_task
    model.eval()
    crit = sparsity_criterion(task, False, 0.1)  # --attention-reg none: statistics all the same
    logs, ent_sum, tokens = [], 0.0, 0
    for idx in (range(0, 3), range(3, 30)):
        sample = sample_of(task, idx)
        with torch.no_grad():
            logs.append(crit(model, sample)[2])
            ent_sum += regulariser_by_hand(reference_attention(model, sample), sample, "entropy").item() * sample["ntokens"]
        tokens += sample["ntokens"]
    assert not any("penalty" in k for log in logs for k in log)
    with metrics.aggregate(new_root=True) as agg:
        Criterion.reduce_metrics(logs)
    vals = agg.get_smoothed_values()
    assert vals["attn_entropy"] == pytest.approx(ent_sum / tokens, abs=1e-4)
    assert 0 < vals["attn_max"] <= 1 and "loss" in vals


def test_wrapped_model(model_task):
    """The trainer hands criterions the distributed wrapper; the regulariser goes on the model inside."""
    model, task = model_task

    class FakeDDP(nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args, **kwargs):
            return self.module(*args, **kwargs)

    wrapped = ModuleProxyWrapper(FakeDDP(model))
    sample = sample_of(task, range(5))
    crit = sparsity_criterion(task, False, 0.1, attention_reg="linf", attention_reg_lambda=LAMBDA)
    with torch.no_grad():
        loss, size, log = crit(wrapped, sample)
        r = regulariser_by_hand(reference_attention(model, sample), sample, "linf").item()
    assert isinstance(model._modules.get(ATTACHED_NAME), AttentionRegulariser)
    assert loss.item() == pytest.approx(ce_loss(model, task, sample) + LAMBDA * r * size, rel=1e-6, abs=1e-4)


def test_l0drop_compressed_memory_statistics_match_uncompressed(stock):
    """In eval, an L0Drop model attends over a compressed memory; statistics must be those over the
    real source positions, i.e. the same as with --pruned-decoding False."""
    stock_model, task, cfg = stock
    args = copy.deepcopy(cfg.model)
    args.arch = "transformer_l0drop"
    transformer_l0drop(args)
    model = L0DropTransformerModel.build_model(args, task)
    model.load_state_dict(stock_model.state_dict(), strict=False)  # + gates at their initial values
    model.eval()
    sample = sample_of(task, range(20))
    seen = []
    handle = model.encoder.l0drop.register_forward_pre_hook(lambda m, a: seen.append((a[0], a[1])))
    with torch.no_grad():
        model.encoder(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"])
    handle.remove()
    model.encoder.l0drop.pop_sparsity_terms()
    x, pad = seen[0]  # the states L0Drop gates, T x B x C
    proj = model.encoder.l0drop.log_alpha_proj
    torch.manual_seed(0)
    with torch.no_grad():  # close about half of the gates (g_hat = 0 iff log alpha <= -ln 11)
        proj.weight.normal_()
        xw = (x @ proj.weight.view(-1)).t()[~pad]
        proj.bias.fill_(-math.log(11) - torch.quantile(xw, 0.5).item())
    crit = sparsity_criterion(task, False, 0.1, attention_reg_layers="all")
    stats = {}
    for pruned in (True, False):
        model.encoder.pruned_decoding = pruned
        with torch.no_grad():
            log = crit(model, sample)[2]
        stats[pruned] = {k: log[f"sparsity/{k}:num"] / log[f"sparsity/{k}:den"] for k in ("attn_entropy", "attn_max")}
        frac = log["sparsity/l0drop_sparsity:num"] / log["sparsity/l0drop_sparsity:den"]
    assert 0.2 < frac < 0.8
    for k in ("attn_entropy", "attn_max"):
        assert stats[True][k] == pytest.approx(stats[False][k], rel=1e-4), k


# ----------------------------------------------------------------------------------------------
# options


def test_bad_options(model_task):
    model, task = model_task
    with pytest.raises(ValueError, match="--attention-reg-lambda must be >= 0"):
        sparsity_criterion(task, False, 0.1, attention_reg="entropy", attention_reg_lambda=-0.01)
    with pytest.raises(ValueError, match="--attention-reg is 'none'"):
        sparsity_criterion(task, False, 0.1, attention_reg_lambda=0.01)
    with pytest.raises(ValueError, match="attention-reg-layers"):
        sparsity_criterion(task, False, 0.1, attention_reg="entropy", attention_reg_layers="top")
    crit = sparsity_criterion(task, False, 0.1, attention_reg="entropy", attention_reg_lambda=0.01, attention_reg_layers="0,3")
    with pytest.raises(SparsityConfigError, match=r"decoder layers \[3\]"):
        crit(model, sample_of(task, range(2)))
    parser = argparse.ArgumentParser()
    gen_parser_from_dataclass(parser, LabelSmoothedCrossEntropyWithSparsityConfig())
    args = parser.parse_args(["--attention-reg", "linf", "--attention-reg-heads", "mean"])
    assert (args.attention_reg, args.attention_reg_heads, args.attention_reg_layers) == ("linf", "mean", "all")
    assert args.attention_reg_lambda == 0.0
    for bad in (["--attention-reg", "l1"], ["--attention-reg-heads", "max"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


# ----------------------------------------------------------------------------------------------
# the console scripts


def test_train_with_entropy_regulariser_then_generate(corpus, stock_transformer_ckpt, tmp_path):
    from helpers.cli import generate, log_records, train

    save = str(tmp_path / "ckpt")
    proc = train(corpus["bin"], save, [
        "--arch", "transformer", "--criterion", "label_smoothed_cross_entropy_with_sparsity", "--label-smoothing",
        "0.1", "--attention-reg", "entropy", "--attention-reg-lambda", "0.01", "--log-interval", "1",
        "--finetune-from-model", stock_transformer_ckpt], max_update=5)
    records = log_records(proc.log)
    assert len(records) == 5, proc.log[-3000:]
    for r in records:
        assert float(r["attention_reg_lambda"]) == 0.01
        assert 0 < float(r["attn_entropy"]) < math.log(13) and 0 < float(r["attn_max"]) <= 1
        assert float(r["attention_reg_penalty"]) == pytest.approx(float(r["attn_entropy"]), abs=1e-3)
    valid = log_records(proc.log, "valid")
    assert valid and "valid_attn_entropy" in valid[0] and "valid_attention_reg_penalty" not in valid[0]
    out = generate(corpus["bin"], os.path.join(save, "checkpoint_last.pt"), ["--print-alignment"])
    assert "Generate test with beam=4: BLEU4" in out.stdout + out.stderr
    assert sum(line.startswith("A-") for line in out.stdout.splitlines()) == 60


def test_lambda_without_regulariser_rejected_before_training(corpus, tmp_path):
    from helpers.cli import log_records, train

    proc = train(corpus["bin"], str(tmp_path), [
        "--arch", "transformer", "--criterion", "label_smoothed_cross_entropy_with_sparsity", "--label-smoothing",
        "0.1", "--attention-reg-lambda", "0.01"], check=False)
    assert proc.returncode != 0
    assert "--attention-reg-lambda 0.01 is set but --attention-reg is 'none'" in proc.log, proc.log[-3000:]
    assert not log_records(proc.log) and os.listdir(tmp_path) == []
