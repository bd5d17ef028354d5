"""Head gates and masks on fairseq's MultiheadAttention, and physical head pruning (papers 001, 003).

Unit tests on single attention modules (closed forms, masked == zeroed output columns, pruned ==
masked, a layer without heads == its output bias), then fairseq's SequenceGenerator on a trained
checkpoint: a physically pruned model decodes exactly like the masked/gated one.
Here the pure tests; those that train or run console scripts are in tests/e2e/test_head_gates_e2e.py.
"""
import copy
import math

import pytest
import torch
from fairseq.modules import MultiheadAttention

import fairseq_sparse  # noqa: F401  (registers the models)
from fairseq_sparse.modules.hard_concrete import HardConcrete
from fairseq_sparse.modules.head_gates import (
    HeadGates,
    HeadlessAttention,
    add_head_gates,
    apply_kept_heads,
    attention_modules,
    enable_head_scaling,
    gate_values,
    kept_heads_spec,
    masks_from_matrix,
    prune_heads,
    set_head_masks,
)

E, H = 16, 4


def mha(self_attention=True, seed=0, **kw):
    torch.manual_seed(seed)
    m = MultiheadAttention(E, H, self_attention=self_attention, encoder_decoder_attention=not self_attention, **kw)
    with torch.no_grad():  # non-zero biases, so "a pruned head contributes nothing" is a real check
        for p in m.parameters():
            if p.dim() == 1:
                p.normal_()
    return m.eval()


def attend(m, x, **kw):
    with torch.no_grad():
        return m(x, x, x, **kw)[0]


class Holder(torch.nn.Module):
    """The minimal shape of a fairseq encoder-decoder for attention_modules()."""

    def __init__(self, enc=(), dec=(), encdec=()):
        super().__init__()
        self.encoder, self.decoder = torch.nn.Module(), torch.nn.Module()
        self.encoder.layers = torch.nn.ModuleList([self._layer(self_attn=m) for m in enc])
        self.decoder.layers = torch.nn.ModuleList([self._layer(self_attn=s, encoder_attn=c) for s, c in zip(dec, encdec)])

    @staticmethod
    def _layer(**mods):
        layer = torch.nn.Module()
        for k, v in mods.items():
            setattr(layer, k, v)
        return layer


# ---------------------------------------------------------------------------------------------
# HeadGates: the penalty is paper 001's L_C in closed form


def test_head_gates_penalty_and_statistics_closed_form():
    hc = HardConcrete(beta=0.33)
    gates = HeadGates(4, hc, "enc", layers_of_type=2, penalty_scale=0.5)
    with torch.no_grad():
        gates.log_alpha.copy_(torch.tensor([-10.0, 0.0, 1.0, 10.0]))
    gates.train()
    g = gates()
    term = gates.pop_sparsity_terms()[0]
    p_open = [1.0 / (1.0 + math.exp(-(a - 0.33 * math.log(0.1 / 1.1)))) for a in (-10.0, 0.0, 1.0, 10.0)]
    assert term.group == "head_gates"
    assert term.penalty.item() == pytest.approx(0.5 * sum(p_open), rel=1e-6)
    assert ((g >= 0) & (g <= 1)).all()
    num, den = term.stats["heads_open_expected_enc"]
    assert num == pytest.approx(sum(p_open), rel=1e-6) and den == 0.5
    # deterministic gates in eval: g_hat = clamp(sigmoid(a) * 1.2 - 0.1, 0, 1) and no penalty
    gates.eval()
    g = gates()
    expected = [min(1.0, max(0.0, 1.2 / (1.0 + math.exp(-a)) - 0.1)) for a in (-10.0, 0.0, 1.0, 10.0)]
    assert g.tolist() == pytest.approx(expected, abs=1e-6)
    term = gates.pop_sparsity_terms()[0]
    assert term.penalty is None
    assert term.stats["heads_open_enc"][0] == 3  # g_hat(-10) = 0


def test_head_gate_samples_are_resampled_and_differentiable():
    gates = HeadGates(8, HardConcrete(beta=0.33), "dec", init_log_alpha=0.0).train()
    a, b = gates(), gates()
    assert not torch.equal(a, b)
    (a.sum() + gates.pop_sparsity_terms()[0].penalty).backward()
    assert gates.log_alpha.grad is not None and gates.log_alpha.grad.abs().sum() > 0


# ---------------------------------------------------------------------------------------------
# masks (paper 003 Eq. 1) on one attention module


@pytest.mark.parametrize("self_attention", [True, False])
def test_mask_scales_head_outputs_before_out_proj(self_attention):
    m = mha(self_attention)
    x = torch.randn(5, 3, E)
    full = attend(m, x)
    enable_head_scaling(m)
    m.head_mask = torch.ones(H)
    assert torch.allclose(attend(m, x), full, atol=1e-6)  # the slow path computes the same thing
    mask = torch.tensor([1.0, 0.0, 0.5, 1.0])
    m.head_mask = mask
    masked = attend(m, x)
    # the same as scaling the out_proj columns of each head
    ref = copy.deepcopy(m)
    ref.head_mask = None
    with torch.no_grad():
        ref.out_proj.weight.mul_(mask.repeat_interleave(E // H))
    assert torch.allclose(masked, attend(ref, x), atol=1e-6)
    assert not torch.allclose(masked, full, atol=1e-3)


def test_mask_gradient_is_dL_dxi():
    m = mha()
    x = torch.randn(4, 2, E)
    enable_head_scaling(m)
    xi = torch.ones(H, requires_grad=True)
    m.head_mask = xi
    m(x, x, x)[0].sum().backward()
    eps = 1e-3
    for h in range(H):
        up, down = torch.ones(H), torch.ones(H)
        up[h] += eps
        down[h] -= eps
        m.head_mask = up
        f_up = attend(m, x).sum()
        m.head_mask = down
        f_down = attend(m, x).sum()
        assert xi.grad[h].item() == pytest.approx(((f_up - f_down) / (2 * eps)).item(), rel=1e-2, abs=1e-3)


def test_deepcopy_keeps_the_scaling_on_the_copy():
    m = mha()
    enable_head_scaling(m)
    m2 = copy.deepcopy(m)
    m2.head_mask = torch.zeros(H)
    x = torch.randn(3, 2, E)
    assert torch.allclose(attend(m2, x), m2.out_proj.bias.expand(3, 2, E))
    assert not torch.allclose(attend(m, x), attend(m2, x))


def test_set_head_masks_checks_shapes_and_clears():
    model = Holder(enc=[mha(seed=1), mha(seed=2)])
    with pytest.raises(ValueError, match="shape"):
        set_head_masks(model, {("enc", 0): torch.ones(H + 1)})
    with pytest.raises(ValueError, match="no such attention layer"):
        set_head_masks(model, {("dec", 0): torch.ones(H)})
    with pytest.raises(ValueError, match="rows"):
        masks_from_matrix(model, {"enc": [[1, 1, 1, 1]]})
    with pytest.raises(ValueError, match="unknown attention type"):
        masks_from_matrix(model, {"encoder": [[1] * H] * 2})
    set_head_masks(model, {("enc", 1): torch.zeros(H)})
    assert gate_values(model)[("enc", 1)].sum() == 0
    set_head_masks(model, None)
    assert all(v.sum() == H for v in gate_values(model).values())


def test_head_gates_on_missing_attention_type_is_an_error():
    model = Holder(enc=[mha()])
    with pytest.raises(ValueError, match="no encdec attention"):
        add_head_gates(model, ["encdec"], HardConcrete())
    with pytest.raises(ValueError, match="unknown attention type"):
        add_head_gates(model, ["cross"], HardConcrete())


# ---------------------------------------------------------------------------------------------
# physical pruning == masking


@pytest.mark.parametrize("self_attention", [True, False])
def test_pruned_attention_equals_masked(self_attention):
    m = mha(self_attention)
    model = Holder(enc=[m]) if self_attention else Holder(dec=[mha()], encdec=[m])
    key = ("enc", 0) if self_attention else ("encdec", 0)
    x, mem = torch.randn(5, 3, E), torch.randn(7, 3, E)
    set_head_masks(model, {key: torch.tensor([0.7, 0.0, 1.0, 0.0])})
    with torch.no_grad():
        masked = m(x, mem if not self_attention else x, mem if not self_attention else x)[0]
    spec = prune_heads(model, {key: [0, 2]})
    assert spec[key[0]][0] == [0, 2]
    assert m.num_heads == 2 and m.q_proj.weight.shape == (2 * E // H, E) and m.out_proj.weight.shape == (E, E // 2)
    with torch.no_grad():
        pruned = m(x, mem if not self_attention else x, mem if not self_attention else x)[0]
    assert torch.allclose(pruned, masked, atol=1e-6)


def test_pruned_self_attention_equals_masked_in_incremental_decoding():
    m = mha()
    model = Holder(dec=[m], encdec=[None])
    del model.decoder.layers[0].encoder_attn
    set_head_masks(model, {("dec", 0): torch.tensor([0.0, 1.0, 0.25, 1.0])})
    full = copy.deepcopy(m)
    prune_heads(model, {("dec", 0): [1, 2, 3]})
    xs = torch.randn(6, 2, E)
    states = [{}, {}]
    for t in range(xs.size(0)):
        x = xs[t:t + 1]
        with torch.no_grad():
            a = full(x, x, x, incremental_state=states[0])[0]
            b = m(x, x, x, incremental_state=states[1])[0]
        assert torch.allclose(a, b, atol=1e-6)


def test_layer_without_heads_outputs_its_bias():
    m = mha()
    model = Holder(enc=[m, mha(seed=3)])
    with pytest.raises(ValueError, match="every head"):
        prune_heads(model, {("enc", 0): []}, allow_empty_layers=False)
    spec = prune_heads(model, {("enc", 0): []})
    assert isinstance(m, HeadlessAttention) and spec["enc"] == [[], [0, 1, 2, 3]]
    x = torch.randn(4, 2, E)
    out, weights = m(x, x, x)
    assert weights is None and torch.equal(out, m.out_proj.bias.expand(4, 2, E))


def test_kept_heads_spec_rebuilds_the_shapes_and_keeps_original_ids():
    model = Holder(enc=[mha(seed=4), mha(seed=5)])
    prune_heads(model, {("enc", 0): [1, 3]})
    prune_heads(model, {("enc", 0): [1]})  # positions are current: head 3 of the original layer
    spec = kept_heads_spec(model)
    assert spec == {"enc": [[3], [0, 1, 2, 3]]}
    fresh = Holder(enc=[mha(seed=6), mha(seed=7)])
    apply_kept_heads(fresh, spec)
    fresh.load_state_dict(model.state_dict())  # same shapes
    x = torch.randn(3, 2, E)
    for a, b in zip(attention_modules(model).values(), attention_modules(fresh).values()):
        assert torch.allclose(attend(a, x), attend(b, x), atol=1e-6)
    with pytest.raises(ValueError, match="layers"):
        apply_kept_heads(Holder(enc=[mha()]), spec)
    with pytest.raises(ValueError, match="lists heads"):
        apply_kept_heads(Holder(enc=[mha(), mha()]), {"enc": [[0, 9], [1]]})
