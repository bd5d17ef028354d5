"""Encoder-decoder attention normalisers (paper 002 Sec. IV baselines): closed forms, -inf masking,
NormalisedAttention vs fairseq's MultiheadAttention, incremental == full decoding, fairseq's
SequenceGenerator (beam 4) on models loaded from the shared fixtures, exact L0Drop pruned decoding
with temperature, and the option checks.
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_attention_normalisers.py."""
import copy
import math

import pytest
import torch
from fairseq import options
from fairseq.modules import MultiheadAttention

import fairseq_sparse  # noqa: F401  (registers the models)
from fairseq_sparse.modules.attention_normalisers import NORMALISERS, NormalisedAttention
from fairseq_sparse.models.transformer_head_gates import HeadGatesTransformerModel
from fairseq_sparse.modules.count_attention import CountAwareAttention
from helpers.checkpoints import load
from helpers.models import rescore
from helpers.normalisers import EMBED, HEADS, batch, generate


# --- in models: SequenceGenerator, pruned decoding, options ------------------------------------------


def normalised_model(ckpt, corpus, name, temperature=1.0):
    """The stock checkpoint's weights in ``transformer_head_gates --head-gates ''`` with a normaliser
    (checkpoint_utils' arg_overrides cannot switch the model class: cfg.model._name wins)."""
    stock, cfg, task = load(ckpt, corpus["bin"])
    args = copy.deepcopy(cfg.model)
    args.arch = args._name = "transformer_head_gates"
    args.head_gates = ""
    args.encdec_attention_normaliser = name
    args.encdec_attention_temperature = temperature
    model = HeadGatesTransformerModel.build_model(args, task)
    model.load_state_dict(stock.state_dict())
    return model.eval(), cfg, task


@pytest.mark.parametrize("name", NORMALISERS)
def test_beam_search_with_each_normaliser(stock_transformer_ckpt, corpus, name):
    """Beam 4 with fairseq's SequenceGenerator (incremental decoding, beam reordering) gives hypotheses
    whose step scores equal a full-sequence pass over them: the cache and the reordering are right."""
    model, cfg, task = normalised_model(stock_transformer_ckpt, corpus, name, 0.7 if name != "softmax" else 1.0)
    layer_attn = model.decoder.layers[0].encoder_attn
    if name == "softmax":
        assert type(layer_attn) is MultiheadAttention  # default models are fairseq's own
    else:
        assert isinstance(layer_attn, NormalisedAttention) and layer_attn.normaliser == name
    sample = batch(task)
    hypos = generate(model, task, sample)
    assert len(hypos) == sample["nsentences"]
    for hyps in hypos:
        assert len(hyps) == 4
        for h in hyps:
            assert torch.isfinite(h["positional_scores"]).all()
            att = h["attention"]
            assert not torch.isnan(att).any()
            assert torch.allclose(att.sum(0), torch.ones(att.size(1)), atol=1e-4)
    for full, inc in rescore(model, sample, hypos, task.target_dictionary.eos()):
        assert torch.allclose(full, inc, atol=1e-4), (full - inc).abs().max()
    if name in ("sparsemax", "entmax15"):
        assert any((h["attention"] == 0).any() for hyps in hypos for h in hyps)


def test_temperature_one_equals_stock(stock_transformer_ckpt, corpus):
    stock, _, task = load(stock_transformer_ckpt, corpus["bin"])
    model, _, _ = normalised_model(stock_transformer_ckpt, corpus, "temperature", 1.0)
    sample = batch(task)
    a, b = generate(stock, task, sample), generate(model, task, sample)
    for ha, hb in zip(a, b):
        for x, y in zip(ha, hb):
            assert x["tokens"].tolist() == y["tokens"].tolist()
            assert torch.allclose(x["positional_scores"], y["positional_scores"], atol=1e-4)


def pruned_equals_unpruned(model, task, sample, beam=4):
    enc = model.encoder
    # deterministic mixed gates: drop the states with the smallest x.w (about 40%)
    enc.pruned_decoding = False
    seen = []
    handle = enc.l0drop.register_forward_pre_hook(lambda mod, args: seen.append((args[0], args[1])))
    with torch.no_grad():
        enc(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"])
    handle.remove()
    x, pad = seen[0]
    w = enc.l0drop.log_alpha_proj.weight
    with torch.no_grad():
        if w.abs().max() == 0:
            w.copy_(torch.randn(w.shape, generator=torch.Generator().manual_seed(0)))
        vals = (x @ w.view(-1)).t()[~pad].sort().values
        thr = (vals[int(0.4 * len(vals))] + vals[int(0.4 * len(vals)) + 1]) / 2
        scale = 10.0 / (vals[-1] - thr).clamp_min(1e-3)
        w.mul_(scale)
        enc.l0drop.log_alpha_proj.bias.fill_(float(-scale * thr) - math.log(11.0))
        gates = enc(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"])["l0drop_gates"][0]
    real = ~sample["net_input"]["src_tokens"].eq(enc.padding_idx)
    n_pruned = int(((gates == 0) & real).sum())
    assert 0 < n_pruned < int(real.sum())
    full = generate(model, task, sample, beam)
    enc.pruned_decoding = True
    with torch.no_grad():
        mem = enc(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"])["encoder_out"][0]
    assert mem.size(0) < sample["net_input"]["src_tokens"].size(1)  # really a shorter memory
    pruned = generate(model, task, sample, beam)
    for ha, hb in zip(pruned, full):
        for x_, y_ in zip(ha, hb):
            assert x_["tokens"].tolist() == y_["tokens"].tolist()
            assert torch.allclose(x_["positional_scores"], y_["positional_scores"], atol=1e-4)
            assert torch.allclose(x_["attention"], y_["attention"], atol=1e-5)


@pytest.mark.parametrize("name,dropped_as", [("temperature", "zero"), ("gumbel", "zero"),
                                             ("sparsemax", "mask"), ("entmax15", "mask")])
def test_l0drop_pruned_decoding_exact(l0drop_ckpt, corpus, name, dropped_as):
    model, _, task = load(l0drop_ckpt, corpus["bin"], encdec_attention_normaliser=name,
                          encdec_attention_temperature=0.5, l0drop_dropped_as=dropped_as)
    assert isinstance(model.decoder.layers[0].encoder_attn, NormalisedAttention)
    assert model.encoder.dropped_as == dropped_as
    pruned_equals_unpruned(model, task, batch(task))


def test_l0drop_softmax_default_unchanged(l0drop_ckpt, corpus):
    model, _, _ = load(l0drop_ckpt, corpus["bin"])
    assert type(model.decoder.layers[0].encoder_attn) is CountAwareAttention


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_inexact_combination_is_refused(l0drop_ckpt, corpus, name):
    with pytest.raises(ValueError, match="l0drop-dropped-as mask"):
        load(l0drop_ckpt, corpus["bin"], encdec_attention_normaliser=name)
    model, _, _ = load(l0drop_ckpt, corpus["bin"], encdec_attention_normaliser=name, pruned_decoding=False)
    assert not model.encoder.pruned_decoding


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_bad_temperature_is_refused(stock_transformer_ckpt, corpus, temperature):
    with pytest.raises(ValueError, match="temperature"):
        normalised_model(stock_transformer_ckpt, corpus, "temperature", temperature)
    with pytest.raises(ValueError):
        NormalisedAttention(EMBED, HEADS, encoder_decoder_attention=True, normaliser="gumbel", temperature=temperature)


def test_command_line_options(corpus):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        corpus["bin"], "--user-dir", fairseq_sparse.__path__[0], "--arch", "transformer_head_gates",
        "--head-gates", "", "--encdec-attention-normaliser", "entmax15", "--encdec-attention-temperature", "0.5"])
    assert args.encdec_attention_normaliser == "entmax15" and args.encdec_attention_temperature == 0.5
    args = options.parse_args_and_arch(options.get_training_parser(), [
        corpus["bin"], "--user-dir", fairseq_sparse.__path__[0], "--arch", "transformer_l0drop_iwslt_de_en"])
    assert args.encdec_attention_normaliser == "softmax" and args.encdec_attention_temperature == 1.0
    with pytest.raises(SystemExit):
        options.parse_args_and_arch(options.get_training_parser(), [
            corpus["bin"], "--user-dir", fairseq_sparse.__path__[0], "--arch", "transformer_l0drop",
            "--encdec-attention-normaliser", "nope"])


def test_training_step_gumbel_is_stochastic(stock_transformer_ckpt, corpus):
    """In training mode gumbel draws noise (two passes differ), gradients are finite; eval is deterministic."""
    model, _, task = normalised_model(stock_transformer_ckpt, corpus, "gumbel", 0.5)
    model = copy.deepcopy(model)
    sample = batch(task, 4)
    ni = sample["net_input"]
    model.train()
    for m in model.modules():  # only the Gumbel noise should make two passes differ
        if hasattr(m, "p") and isinstance(getattr(m, "p"), float):
            m.p = 0.0
    a = model(**ni)[0]
    b = model(**ni)[0]
    assert not torch.allclose(a, b)
    a.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(**ni)[0], model(**ni)[0])
