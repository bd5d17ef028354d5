"""Attention regularisers (paper 002 Sec. III) and attention statistics on encoder-decoder attention.

Closed forms on hand-made distributions (entropy, the weak subgradient of max, per-head vs head-mean),
padding excluded on both sides, the hooks leave the model's outputs unchanged, the criterion's loss is
CE + lambda * R * sample_size with R computed here from the attention modules' own projections, the
logged statistics are ratios of sums, bad options fail early, and a short fairseq-train /
fairseq-generate run.
Here the pure tests; those that train or run console scripts are in tests/e2e/test_attention_regularisers_e2e.py.
"""
import math

import pytest
import torch

import fairseq_sparse  # noqa: F401
from fairseq_sparse.modules.attention_regularisers import AttentionRegulariser, attention_penalty, entropy, layer_sums, max_weight, parse_layers, resolve_layers


# ----------------------------------------------------------------------------------------------
# closed forms on hand-made distributions


def padded_uniform(n_real, n_src, heads=2, tgt=3, garbage=0.0):
    """heads x 1 x tgt x n_src: uniform over the last n_real keys (left-padded source, as fairseq pads
    sources), ``garbage`` on the padded keys; key padding mask 1 x n_src."""
    probs = torch.full((heads, 1, tgt, n_src), garbage)
    probs[..., n_src - n_real:] = 1.0 / n_real
    pad = torch.arange(n_src).unsqueeze(0) < n_src - n_real
    return probs, pad


@pytest.mark.parametrize("n_real", [1, 3, 7])
def test_entropy_of_uniform_over_real_tokens_is_log_n(n_real):
    probs, pad = padded_uniform(n_real, 9, garbage=0.3)  # garbage on padding must not count
    sums = layer_sums(probs, key_padding_mask=pad, kind="entropy")
    assert sums["tokens"].item() == 3
    assert (sums["entropy"] / sums["tokens"]).item() == pytest.approx(math.log(n_real), abs=1e-6)
    assert (sums["penalty"] / sums["tokens"]).item() == pytest.approx(math.log(n_real), abs=1e-6)
    assert (sums["max"] / sums["tokens"]).item() == pytest.approx(1.0 / n_real, abs=1e-6)
    linf = layer_sums(probs, key_padding_mask=pad, kind="linf")
    assert (linf["penalty"] / linf["tokens"]).item() == pytest.approx(-1.0 / n_real, abs=1e-6)


def test_zero_log_zero_is_zero_with_finite_gradient():
    p = torch.tensor([0.0, 1.0, 0.0], requires_grad=True)
    h = entropy(p)
    assert h.item() == 0.0
    h.backward()
    assert torch.isfinite(p.grad).all()
    # and d Ent / d p_j = -(log p_j + 1) where p_j > 0
    q = torch.tensor([0.2, 0.5, 0.3], requires_grad=True)
    entropy(q).backward()
    assert torch.allclose(q.grad, -(torch.log(q.detach()) + 1), atol=1e-6)


def test_linf_gradient_is_the_one_hot_weak_subgradient():
    probs = torch.tensor([[0.1, 0.6, 0.3], [0.45, 0.1, 0.45]], requires_grad=True)  # row 2: a tie
    attention_penalty(probs.view(1, 1, 2, 3), "linf").sum().backward()  # penalty = -max
    g = probs.grad
    assert torch.equal(g[0], torch.tensor([0.0, -1.0, 0.0]))  # Eq. 16: -delta_kj, k the arg-max
    # a tie: the whole gradient on one index of I(alpha) (the weak subgradient), not split
    assert sorted(g[1].tolist()) == [-1.0, 0.0, 0.0] and g[1, 1] == 0.0
    assert max_weight(probs).tolist() == pytest.approx([0.6, 0.45])


def test_each_head_vs_head_mean():
    # two heads, each certain, on different source positions
    probs = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]).view(2, 1, 1, 3)
    assert attention_penalty(probs, "entropy", "each").item() == pytest.approx(0.0, abs=1e-6)
    assert attention_penalty(probs, "entropy", "mean").item() == pytest.approx(math.log(2), abs=1e-6)
    assert attention_penalty(probs, "linf", "each").item() == pytest.approx(-1.0)
    assert attention_penalty(probs, "linf", "mean").item() == pytest.approx(-0.5)
    # the statistics are per head whatever the mode
    sums = layer_sums(probs, kind="entropy", heads="mean")
    assert sums["entropy"].item() == pytest.approx(0.0, abs=1e-6) and sums["max"].item() == pytest.approx(1.0)
    assert sums["penalty"].item() == pytest.approx(math.log(2), abs=1e-6)


def test_padding_values_do_not_matter():
    torch.manual_seed(0)
    H, B, T, S = 2, 3, 4, 5
    probs = torch.softmax(torch.randn(H, B, T, S), -1)
    key_pad = torch.tensor([[True, False, False, False, False], [False] * 5, [True, True, False, False, False]])
    query_real = torch.tensor([[True] * 4, [True, True, False, False], [True, True, True, False]])
    probs = probs.masked_fill(key_pad.view(1, B, 1, S), 0.0)
    probs = probs / probs.sum(-1, keepdim=True)
    changed = probs.clone()
    changed[:, ~query_real] = torch.rand_like(changed[:, ~query_real])  # padded target positions
    changed.masked_fill_(key_pad.view(1, B, 1, S), 0.7)  # padded source positions
    for kind in ("entropy", "linf"):
        for heads in ("each", "mean"):
            a = layer_sums(probs, query_real, key_pad, kind=kind, heads=heads)
            b = layer_sums(changed, query_real, key_pad, kind=kind, heads=heads)
            assert a["tokens"].item() == b["tokens"].item() == 9
            for k in ("penalty", "entropy", "max"):
                assert a[k].item() == pytest.approx(b[k].item(), abs=1e-6), (kind, heads, k)
    # ... and they would matter without the masks (the check above can fail)
    assert layer_sums(probs)["entropy"].item() != pytest.approx(layer_sums(changed)["entropy"].item(), abs=1e-3)


def test_counted_slot_equals_expanded_positions():
    """A compressed-memory slot standing for c pruned states (L0Drop in eval) counts as c positions."""
    full = torch.tensor([0.1, 0.1, 0.1, 0.4, 0.3]).view(1, 1, 1, 5)  # three identical pruned states
    compressed = torch.tensor([0.3, 0.4, 0.3]).view(1, 1, 1, 3)
    log_count = torch.tensor([[math.log(3), 0.0, 0.0]])
    a, b = layer_sums(full), layer_sums(compressed, log_multiplicity=log_count)
    assert b["entropy"].item() == pytest.approx(a["entropy"].item(), abs=1e-6)
    assert b["max"].item() == pytest.approx(0.4)
    tiny_slots = torch.tensor([0.9, 0.06, 0.04]).view(1, 1, 1, 3)  # the dummy's share per state 0.3 < 0.9/3
    assert layer_sums(tiny_slots, log_multiplicity=log_count)["max"].item() == pytest.approx(0.3)


def test_layer_specs():
    assert parse_layers("all") == "all" and parse_layers("last") == "last"
    assert parse_layers("2, 0") == (0, 2)
    assert resolve_layers("last", [0, 1, 2]) == [2] and resolve_layers("all", [0, 1]) == [0, 1]
    for bad in ("", "first", "-1", "0,x"):
        with pytest.raises(ValueError, match="attention-reg-layers"):
            parse_layers(bad)
    with pytest.raises(ValueError, match=r"decoder layers \[5\]"):
        resolve_layers((0, 5), [0, 1])
    with pytest.raises(ValueError, match="attention-reg"):
        AttentionRegulariser("l2")
