"""Pruned decoding is exact: fairseq's SequenceGenerator with the compressed memory of Algorithm 1
gives the same hypotheses, scores and (source-position) attention as the uncompressed gated model,
and, with every gate open, as a stock fairseq ``transformer`` with the same weights.

Everything runs in-process on the ``l0drop_ckpt`` fixture (fine-tuned with the real fairseq-train); the
pruned-decoding tests on the CPU and, marked ``cuda``, on a GPU.
"""
import copy
import warnings

import pytest
import torch
from fairseq import utils
from fairseq.models.transformer import TransformerModel

import fairseq_sparse  # noqa: F401  (registers the model)
from conftest import DEVICES
from helpers.checkpoints import (assert_same_hypos, drop_fraction, gates_of, generate, load, mixed_batch,
                                 pruned_vs_unpruned, sparsity)


@pytest.fixture(scope="module")
def loaded(l0drop_ckpt, corpus):
    return load(l0drop_ckpt, corpus["bin"])


@pytest.fixture
def model(loaded):
    return copy.deepcopy(loaded[0])


@pytest.fixture(scope="module")
def task(loaded):
    return loaded[2]


def tiny_sources_batch(task):
    """A batch with a one-token source (EOS only), a one-word source, and longer sentences."""
    ds = task.dataset("test")
    eos = task.source_dictionary.eos()
    word = task.source_dictionary.index("w5")
    assert word != task.source_dictionary.unk()
    items = [ds[0], ds[1], ds[2]]
    items.append({"id": 3, "source": torch.tensor([eos]), "target": ds[3]["target"]})
    items.append({"id": 4, "source": torch.tensor([word, eos]), "target": ds[4]["target"]})
    return ds.collater(items)


def set_gate(l0drop, weight=None, bias=None):
    with torch.no_grad():
        if weight is not None:
            l0drop.log_alpha_proj.weight.fill_(weight)
        if bias is not None:
            l0drop.log_alpha_proj.bias.fill_(bias)


def make_mixed(model, sample):
    """Gates that prune some but not all states of the batch: the trained checkpoint's own if they do;
    otherwise (documented fallback, with a warning) the output gate's w is rescaled and its bias set
    so that 40% of the batch's states are pruned deterministically. The short fixture fine-tuning
    (200 updates) could in principle close none of them exactly."""
    s = sparsity(model, sample)
    if not 0.0 < s < 1.0:
        warnings.warn(f"l0drop_ckpt prunes {s:.0%} of the test batch; pruning 40% with a set gate bias instead")
        drop_fraction(model, model.encoder.l0drop, sample, 0.4)
        s = sparsity(model, sample)
    assert 0.0 < s < 1.0
    return s


def test_checkpoint_gates_are_mixed(model, task):
    """The trained checkpoint itself (fine-tuned with lambda 1.0) prunes some but not all states of the
    batch, so the exactness tests run on trained gates, not on the fallback."""
    sample = mixed_batch(task)
    gates, pad = gates_of(model, sample)
    assert (gates[~pad] < 1).any()
    assert 0.0 < sparsity(model, sample) < 1.0
    s = make_mixed(model, sample)
    assert 0.0 < sparsity(model, sample) == s < 1.0


def on_device(model, sample, device):
    """The model and the sample on ``device``."""
    return model.to(device), utils.apply_to_sample(lambda t: t.to(device), sample)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dropped_as", ["zero", "mask"])
@pytest.mark.parametrize("beam", [1, 4])
def test_pruned_decoding_is_exact(model, task, beam, dropped_as, device):
    model, sample = on_device(model, mixed_batch(task), device)
    make_mixed(model, sample)
    pruned, full = pruned_vs_unpruned(model, task, sample, beam, dropped_as)
    assert all(len(h) == beam for h in pruned)
    # the batch has sentences finishing at different steps
    assert len({len(h[0]["tokens"]) for h in full}) > 1
    # attention rows are distributions over the original source positions, zero on padding
    pad = sample["net_input"]["src_tokens"].eq(model.encoder.padding_idx)
    for i, hyps in enumerate(pruned):
        attn = hyps[0]["attention"]  # src_len x tgt_len
        assert torch.allclose(attn.sum(0), torch.ones(attn.size(1), device=attn.device), atol=1e-5)
        assert (attn[pad[i]] == 0).all()


@pytest.mark.parametrize("dropped_as", ["zero", "mask"])
@pytest.mark.parametrize("case", ["nothing_pruned", "everything_pruned"])
def test_extreme_gates(model, task, case, dropped_as):
    sample = mixed_batch(task)
    set_gate(model.encoder.l0drop, weight=0.0, bias=20.0 if case == "nothing_pruned" else -20.0)
    s = sparsity(model, sample)
    assert s == (0.0 if case == "nothing_pruned" else 1.0)
    for beam in (1, 4):
        pruned_vs_unpruned(model, task, sample, beam, dropped_as)
    if case == "everything_pruned":
        # only the dummy remains in the memory
        model.encoder.dropped_as = dropped_as
        with torch.no_grad():
            out = model.encoder(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"])
        assert out["encoder_out"][0].shape[0] == 1 and (out["encoder_out"][0] == 0).all()


@pytest.mark.parametrize("dropped_as", ["zero", "mask"])
def test_one_token_sources(model, task, dropped_as):
    sample = tiny_sources_batch(task)
    assert sorted(sample["net_input"]["src_lengths"].tolist())[:2] == [1, 2]
    drop_fraction(model, model.encoder.l0drop, sample, 0.4)
    gates, pad = gates_of(model, sample)
    assert ((gates == 0) & ~pad).any() and ((gates != 0) & ~pad).any()
    for beam in (1, 4):
        pruned_vs_unpruned(model, task, sample, beam, dropped_as)
    # the EOS-only source dropped, then kept
    row = sample["net_input"]["src_lengths"].tolist().index(1)
    for bias in (-20.0, 20.0):
        set_gate(model.encoder.l0drop, weight=0.0, bias=bias)
        pruned_vs_unpruned(model, task, sample, 4, dropped_as)
        g, _ = gates_of(model, sample)
        assert g[row, -1].item() == (0.0 if bias < 0 else 1.0)


def stock_copy(model, cfg, task):
    """A stock fairseq TransformerModel with the same weights (the L0Drop parameters left out)."""
    args = copy.deepcopy(cfg.model)
    args.arch = "transformer"
    stock = TransformerModel.build_model(args, task)
    assert type(stock) is TransformerModel
    state = {k: v for k, v in model.state_dict().items() if "l0drop" not in k}
    stock.load_state_dict(state, strict=True)
    return stock.eval()


@pytest.mark.parametrize("beam", [1, 4])
def test_open_gates_equal_stock_transformer(loaded, model, task, beam):
    """With every gate fully open our model is a stock transformer: same hypotheses and scores, which
    checks the shared-memory beam search (no encoder reordering) against fairseq's own."""
    cfg = loaded[1]
    set_gate(model.encoder.l0drop, weight=0.0, bias=20.0)
    stock = stock_copy(model, cfg, task)
    for sample in (mixed_batch(task), tiny_sources_batch(task)):
        ref = generate(stock, task, sample, beam)
        assert len({len(h[0]["tokens"]) for h in ref}) > 1  # sentences finish at different steps
        for pruned in (True, False):
            model.encoder.pruned_decoding = pruned
            assert_same_hypos(generate(model, task, sample, beam), ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dropped_as", ["zero", "mask"])
def test_between_layers_pruned_decoding_is_exact(l0drop_ckpt, corpus, dropped_as, device):
    """--l0drop-between-layers: states dropped after layer 1 stay dropped; pruned decoding agrees."""
    model, cfg, task = load(l0drop_ckpt, corpus["bin"], l0drop_between_layers=True)
    model, sample = on_device(model, mixed_batch(task), device)
    enc = model.encoder
    assert enc.layer_l0drops is not None and len(enc.layer_l0drops) == len(enc.layers) - 1
    enc.dropped_as = dropped_as
    drop_fraction(model, enc.layer_l0drops[0], sample, 0.3, seed=1)
    # capture which states the between-layer gate dropped
    seen = []
    handle = enc.layer_l0drops[0].register_forward_hook(lambda mod, args, out: seen.append(out[1]))
    gates, pad = gates_of(model, sample)
    handle.remove()
    layer_dropped = (seen[-1] == 0) & ~pad
    assert layer_dropped.any() and (~layer_dropped & ~pad).any()
    assert (gates[layer_dropped] == 0).all()  # dropped earlier -> dropped at the output
    # the output gates drop some more states
    drop_fraction(model, enc.l0drop, sample, 0.2, seed=2)
    gates, pad = gates_of(model, sample)
    assert ((gates == 0) & ~pad & ~layer_dropped).any() and ((gates != 0) & ~pad).any()
    for beam in (1, 4):
        pruned_vs_unpruned(model, task, sample, beam, dropped_as)


def test_headless_first_encoder_attention_decodes_exactly(model, task):
    """An exported model whose first encoder-decoder attention lost every head (the composed DDTP model did):
    the attention map the decoder caches per sentence still follows the beam (it once read the hypotheses
    per sentence from that layer, found 1, and reordered by hypothesis: an index error)."""
    from fairseq_sparse.modules.head_gates import HeadlessAttention, prune_heads

    prune_heads(model, {("encdec", 0): []})
    assert isinstance(model.decoder.layers[0].encoder_attn, HeadlessAttention)
    sample = mixed_batch(task)
    make_mixed(model, sample)
    pruned, _ = pruned_vs_unpruned(model, task, sample, 4, "zero")
    assert len({len(h[0]["tokens"]) for h in pruned}) > 1  # sentences finished at different steps


@pytest.mark.parametrize("pruned_decoding", [True, False])
def test_beam_attention_off_changes_no_hypothesis(model, task, pruned_decoding):
    """Without --print-alignment, fairseq's prepare_for_inference_ (need_attn False) switches the decoder's
    beam attention off: SequenceGenerator keeps no attention buffer, and every token and score stays the same,
    bit for bit. With need_attn True (what --print-alignment passes) the attention comes back."""
    sample = mixed_batch(task)
    make_mixed(model, sample)
    model.encoder.pruned_decoding = pruned_decoding
    with_attention = generate(model, task, sample, 4)
    model.make_generation_fast_(need_attn=False)
    assert model.decoder.beam_attention is False
    without = generate(model, task, sample, 4)
    for hyps_a, hyps_b in zip(with_attention, without):
        for ha, hb in zip(hyps_a, hyps_b):
            assert ha["tokens"].tolist() == hb["tokens"].tolist()
            assert float(ha["score"]) == float(hb["score"])
            assert torch.equal(ha["positional_scores"], hb["positional_scores"])
            assert ha["attention"].numel() > 0 and hb["attention"].numel() == 0  # no buffer kept
    model.decoder.make_generation_fast_(need_attn="hard")
    assert_same_hypos(generate(model, task, sample, 4), with_attention)
