"""Encoder-decoder attention normalisers (paper 002 Sec. IV baselines): closed forms, -inf masking,
NormalisedAttention vs fairseq's MultiheadAttention, incremental == full decoding, fairseq's
SequenceGenerator (beam 4) on models loaded from the shared fixtures, exact L0Drop pruned decoding
with temperature, and the option checks.
Here the pure tests; those that train or run console scripts are in tests/e2e/test_attention_normalisers_e2e.py."""
import math

import pytest
import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention

import fairseq_sparse  # noqa: F401  (registers the models)
from fairseq_sparse.modules.attention_normalisers import (
    NORMALISERS,
    NormalisedAttention,
    entmax15,
    gumbel_softmax,
    normalise,
    softmax_t,
    sparsemax,
)
from helpers.normalisers import EMBED, HEADS

NEG = float("-inf")
NON_SOFTMAX = [n for n in NORMALISERS if n != "softmax"]


# --- the normaliser functions -------------------------------------------------------------------

def test_sparsemax_closed_form():
    # z sorted: 1.2, 0.5, 0.2, -0.1; support k = 2 (1 + 2*0.5 > 1.7, 1 + 3*0.2 < 1.9);
    # tau = (1.2 + 0.5 - 1) / 2 = 0.35 -> p = (0.5 - 0.35, 0, 0, 1.2 - 0.35)
    z = torch.tensor([0.5, 0.2, -0.1, 1.2])
    expected = torch.tensor([0.15, 0.0, 0.0, 0.85])
    assert torch.allclose(sparsemax(z), expected, atol=1e-6)
    # with a masked key and a temperature: sparsemax(z / T) over the real keys, exact 0 for the mask
    zm = torch.tensor([0.5, NEG, 0.2, -0.1, 1.2])
    out = sparsemax(zm * 0.5, temperature=0.5)
    assert torch.allclose(out, torch.tensor([0.15, 0.0, 0.0, 0.0, 0.85]), atol=1e-6)
    assert out[1].item() == 0.0
    # uniform logits: uniform weights; one dominant logit: one-hot
    assert torch.allclose(sparsemax(torch.zeros(4)), torch.full((4,), 0.25))
    assert sparsemax(torch.tensor([5.0, 0.0, 0.0])).tolist() == [1.0, 0.0, 0.0]


def test_entmax15_sums_to_one_and_is_sparse():
    z = torch.tensor([[3.0, 0.0, -2.0, 1.0, 2.5], [0.1, 0.0, 0.2, -0.1, 0.05]])
    p = entmax15(z)
    assert torch.allclose(p.sum(-1), torch.ones(2), atol=1e-6)
    assert (p >= 0).all()
    assert (p[0] == 0).sum() >= 2  # -2 and 0 are far below the threshold
    assert (p[1] > 0).all()  # close logits: dense
    # closed form p_j = (z_j / 2 - tau)^2 on the support: sqrt(p_j) - z_j / 2 is the same for all j
    for row, zr in zip(p, z):
        s = row > 0
        t = zr[s] / 2 - row[s].sqrt()
        assert torch.allclose(t, t[0].expand_as(t), atol=1e-5)
        assert (zr[~s] / 2 <= t[0] + 1e-6).all()  # off-support logits are below the threshold
    # entmax-1.5 lies between softmax (dense) and sparsemax (sparser)
    assert (sparsemax(z[0]) == 0).sum() >= (p[0] == 0).sum()


def test_temperature_limits():
    z = torch.randn(5, 7, generator=torch.Generator().manual_seed(0)) * 3
    assert torch.allclose(softmax_t(z, 1.0), torch.softmax(z, -1), atol=1e-7)
    assert torch.allclose(softmax_t(z, 0.5), torch.softmax(2 * z, -1), atol=1e-6)
    assert torch.allclose(softmax_t(z, 1e6), torch.full_like(z, 1 / 7), atol=1e-5)  # T -> inf: uniform
    hard = softmax_t(z, 1e-3)  # T -> 0: one-hot on the argmax
    assert torch.allclose(hard, F.one_hot(z.argmax(-1), 7).float(), atol=1e-5)
    # temperature sharpens: entropy decreases with T
    ent = [-(softmax_t(z, t) * softmax_t(z, t).clamp_min(1e-30).log()).sum(-1).mean() for t in (2.0, 1.0, 0.5)]
    assert ent[0] > ent[1] > ent[2]


def test_gumbel_noise_only_in_training():
    z = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    assert torch.equal(gumbel_softmax(z, 0.7, training=False), softmax_t(z, 0.7))
    a = gumbel_softmax(z, 0.7, training=True, generator=torch.Generator().manual_seed(2))
    b = gumbel_softmax(z, 0.7, training=True, generator=torch.Generator().manual_seed(3))
    assert not torch.allclose(a, b)
    assert torch.allclose(a.sum(-1), torch.ones(4), atol=1e-6)
    # the noise is Gumbel(0, 1): softmax((z + g) / T) with T -> 0 samples argmax(z + g), which is
    # distributed as softmax(z) (the Gumbel-max trick)
    z1 = torch.tensor([1.0, 0.0, -1.0])
    gen = torch.Generator().manual_seed(4)
    draws = torch.stack([gumbel_softmax(z1, 1e-4, training=True, generator=gen).argmax() for _ in range(3000)])
    freq = torch.bincount(draws, minlength=3).float() / 3000
    assert torch.allclose(freq, torch.softmax(z1, -1), atol=0.04)


@pytest.mark.parametrize("name", NORMALISERS)
def test_masked_keys_get_exact_zeros_and_no_nan(name):
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(6, 9, generator=g) * 4).requires_grad_()
    mask = torch.rand(6, 9, generator=g) < 0.4
    mask[2] = True  # a row with every key masked
    mask[3] = False
    mask[4, 1:] = True  # one real key
    mask[4, 0] = False
    logits = x.masked_fill(mask, NEG)
    w = normalise(name, logits, 0.8, training=True)
    assert not torch.isnan(w).any()
    assert (w[mask] == 0).all()
    assert (w[2] == 0).all()  # all-masked row: zero weights, not NaN
    rows = [0, 1, 3, 4, 5]
    assert torch.allclose(w[rows].sum(-1), torch.ones(len(rows)), atol=1e-5)
    assert w[4, 0].item() == pytest.approx(1.0)
    (w * torch.randn(w.shape, generator=g)).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert (x.grad[mask] == 0).all()


# --- NormalisedAttention as a module ----------------------------------------------------------------


def attention_pair(normaliser, temperature=1.0, seed=0):
    torch.manual_seed(seed)
    ref = MultiheadAttention(EMBED, HEADS, dropout=0.0, encoder_decoder_attention=True)
    mod = NormalisedAttention(EMBED, HEADS, dropout=0.0, encoder_decoder_attention=True,
                              normaliser=normaliser, temperature=temperature)
    mod.load_state_dict(ref.state_dict())
    return ref.eval(), mod.eval()


def attention_inputs(tgt=5, src=7, bsz=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tgt, bsz, EMBED, generator=g)
    k = torch.randn(src, bsz, EMBED, generator=g)
    pad = torch.zeros(bsz, src, dtype=torch.bool)
    pad[1, :3] = True  # left padding, as fairseq's source batches have
    pad[2, :6] = True
    return q, k, pad


def test_softmax_equals_fairseq_exactly():
    ref, mod = attention_pair("softmax")
    q, k, pad = attention_inputs()
    for head_weights in (False, True):
        a = ref(q, k, k, key_padding_mask=pad, static_kv=True, need_head_weights=head_weights)
        b = mod(q, k, k, key_padding_mask=pad, static_kv=True, need_head_weights=head_weights)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("temperature", [1.0, 0.4, 3.0])
def test_temperature_equals_fairseq_with_scaled_queries(temperature):
    """softmax(e / T) == fairseq's softmax attention with W_q, b_q divided by T; T = 1 == softmax."""
    ref, mod = attention_pair("temperature", temperature)
    with torch.no_grad():
        ref.q_proj.weight.div_(temperature)
        ref.q_proj.bias.div_(temperature)
    q, k, pad = attention_inputs()
    a = ref(q, k, k, key_padding_mask=pad, static_kv=True, need_head_weights=True)
    b = mod(q, k, k, key_padding_mask=pad, static_kv=True, need_head_weights=True)
    assert torch.allclose(a[0], b[0], atol=1e-5) and torch.allclose(a[1], b[1], atol=1e-6)
    assert b[1].shape == (HEADS, 3, 5, 7)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_sparse_attention_output_matches_weights(name):
    """out = out_proj(concat_h alpha_h V_h), alpha from the normaliser; padding gets exactly 0."""
    ref, mod = attention_pair(name, 0.5)
    q, k, pad = attention_inputs()
    out, w = mod(q, k, k, key_padding_mask=pad, static_kv=True, need_head_weights=True)
    assert (w.permute(1, 0, 2, 3)[pad.unsqueeze(1).unsqueeze(2).expand(3, HEADS, 5, 7)] == 0).all()
    assert (w == 0).any(), "a sparse normaliser should zero some real keys"
    logits, v = ref(q, k, k, key_padding_mask=pad, static_kv=True, before_softmax=True)
    alpha = normalise(name, logits, 0.5)
    expect = ref.out_proj(torch.bmm(alpha, v).transpose(0, 1).reshape(5, 3, EMBED))
    assert torch.allclose(out, expect, atol=1e-6)
    # the head-averaged weights fairseq returns by default
    _, w_avg = mod(q, k, k, key_padding_mask=pad, static_kv=True)
    assert torch.allclose(w_avg, w.mean(0))


@pytest.mark.parametrize("name", NORMALISERS)
def test_incremental_equals_full(name):
    _, mod = attention_pair(name, 0.6)
    q, k, pad = attention_inputs()
    full, wfull = mod(q, k, k, key_padding_mask=pad, static_kv=True)
    state = {}
    steps = []
    for t in range(q.size(0)):
        out, w = mod(q[t:t + 1], k, k, key_padding_mask=pad, incremental_state=state, static_kv=True)
        steps.append((out, w))
    assert torch.allclose(torch.cat([s[0] for s in steps]), full, atol=1e-6)
    assert torch.allclose(torch.cat([s[1] for s in steps], dim=1), wfull, atol=1e-6)


def test_count_bias_added_after_temperature():
    """With L0Drop's counted dummy: softmax(e / T + log c) == softmax over the c copies of the state."""
    torch.manual_seed(3)
    mod = NormalisedAttention(EMBED, HEADS, dropout=0.0, encoder_decoder_attention=True,
                              normaliser="temperature", temperature=0.3).eval()
    q = torch.randn(5, 1, EMBED)
    k_kept = torch.randn(3, 1, EMBED)
    dummy = torch.zeros(1, 1, EMBED)
    expanded = torch.cat([dummy, dummy, dummy, dummy, k_kept])  # 4 pruned (zero) states
    full, wfull = mod(q, expanded, expanded, static_kv=True)
    mem = torch.cat([dummy, k_kept])
    mod.log_count = torch.tensor([[math.log(4.0), 0.0, 0.0, 0.0]])
    comp, wcomp = mod(q, mem, mem, static_kv=True)
    mod.log_count = None
    assert torch.allclose(full, comp, atol=1e-5)
    assert torch.allclose(wfull[..., :4].sum(-1), wcomp[..., 0], atol=1e-6)


def test_gumbel_attention_scales_noise_by_temperature():
    """Eq. 18 in training: softmax((e + g) / T), the noise divided by T as the logits are (was softmax(e/T + g))."""
    torch.manual_seed(0)
    T = 0.25
    attn = NormalisedAttention(EMBED, HEADS, encoder_decoder_attention=True, normaliser="gumbel", temperature=T)
    attn.train()
    query, memory = torch.randn(3, 2, EMBED), torch.randn(5, 2, EMBED)
    with torch.no_grad():
        logits_over_t, _ = attn(query, memory, memory, static_kv=True, before_softmax=True)  # e / T
        torch.manual_seed(11)
        _, weights = attn(query, memory, memory, static_kv=True, need_head_weights=True)
        torch.manual_seed(11)  # the same draw as inside the layer
        u = torch.rand(logits_over_t.shape)
        g = -torch.log(-torch.log(u.clamp(1e-10, 1.0 - 1e-7)))
    expected = F.softmax((logits_over_t * T + g) / T, dim=-1).view(2, HEADS, 3, 5).transpose(1, 0)
    assert torch.allclose(weights, expected, atol=1e-5)
