"""The coverage model on the encoder-decoder attention (Zhang, Zhao, Li & Zong 2019 Sec. V, Eqs. 21-22):
the recurrence by hand, incremental == full-sequence (forced) decoding with beam search, exact pruned
decoding over L0Drop's compressed memory, options, and fairseq-train with --attention-reg entropy.
Here the pure tests; those that train or run console scripts are in tests/e2e/test_coverage_attention_e2e.py."""

import pytest
import torch
from fairseq.modules import MultiheadAttention

import fairseq_sparse  # noqa: F401  (registers the models)
from fairseq_sparse.modules.attention_normalisers import check_attention_normaliser_args
from fairseq_sparse.modules.coverage_attention import CoverageAttention

EMBED, HEADS = 16, 4


def module(seed=0, coverage_dim=3):
    torch.manual_seed(seed)
    mod = CoverageAttention(EMBED, HEADS, kdim=EMBED, vdim=EMBED, encoder_decoder_attention=True,
                            coverage_dim=coverage_dim).eval()
    with torch.no_grad():
        mod.coverage.logit.weight.normal_(0.0, 2.0)  # starts at 0; make the coverage matter
    return mod


def inputs(bsz=3, src=5, tgt=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tgt, bsz, EMBED, generator=g)
    k = torch.randn(src, bsz, EMBED, generator=g)
    pad = torch.zeros(bsz, src, dtype=torch.bool)
    pad[1, :2] = True  # left padding, as fairseq's source side
    return q, k, pad


def test_recurrence_by_hand():
    """Step i: logits + w_h . C_{i-1}, softmax, then C_i = GRU(C_{i-1}, x_i) written out (Eqs. 21-22)."""
    mod = module()
    q, k, pad = inputs()
    out, weights = mod(q, k, k, key_padding_mask=pad, static_kv=True, need_head_weights=True)
    plain = MultiheadAttention(EMBED, HEADS, kdim=EMBED, vdim=EMBED, encoder_decoder_attention=True).eval()
    plain.load_state_dict({n: p for n, p in mod.state_dict().items() if not n.startswith("coverage")})
    logits, _ = plain(q, k, k, key_padding_mask=pad, static_kv=True, before_softmax=True)
    T, B, S = q.size(0), q.size(1), k.size(0)
    logits = logits.view(B, HEADS, T, S)
    C = torch.zeros(B, S, mod.coverage.dim)
    for i in range(T):
        e = logits[:, :, i] + torch.einsum("bsc,hc->bhs", C, mod.coverage.logit.weight)
        a = torch.softmax(e, -1)
        assert torch.allclose(weights[:, :, i].transpose(0, 1), a, atol=1e-6)
        assert (a.masked_select(pad.unsqueeze(1).expand_as(a)) == 0).all()
        x = (a.transpose(1, 2) @ mod.coverage.from_weights.weight.t() + mod.coverage.from_weights.bias
             + (q[i] @ mod.coverage.from_query.weight.t()).unsqueeze(1)
             + k.transpose(0, 1) @ mod.coverage.from_key.weight.t())
        h = C @ mod.coverage.recurrent.weight.t() + mod.coverage.recurrent.bias
        n = mod.coverage.dim
        r = torch.sigmoid(x[..., :n] + h[..., :n])
        z = torch.sigmoid(x[..., n:2 * n] + h[..., n:2 * n])
        new = torch.tanh(x[..., 2 * n:] + r * h[..., 2 * n:])
        C = (1 - z) * new + z * C
    assert C.abs().sum() > 0


def test_zero_coverage_weight_is_plain_attention():
    """w = 0 (the initial value): the attention of the model fine-tuning starts from."""
    mod = module()
    with torch.no_grad():
        mod.coverage.logit.weight.zero_()
    plain = MultiheadAttention(EMBED, HEADS, kdim=EMBED, vdim=EMBED, encoder_decoder_attention=True).eval()
    plain.load_state_dict({n: p for n, p in mod.state_dict().items() if not n.startswith("coverage")})
    q, k, pad = inputs()
    a, wa = mod(q, k, k, key_padding_mask=pad, static_kv=True)
    b, wb = plain(q, k, k, key_padding_mask=pad, static_kv=True)
    assert torch.allclose(a, b, atol=1e-6) and torch.allclose(wa, wb, atol=1e-6)


def test_incremental_equals_full_with_reordering():
    """Step by step with a cached, reordered coverage == one full pass over the reordered batch."""
    mod = module()
    q, k, pad = inputs(tgt=5)
    k, pad = k[:, 1:2].expand(-1, 3, -1), pad[1:2].expand(3, -1)  # three hypotheses of one sentence
    order = torch.tensor([2, 0, 0])  # beams swap and one is duplicated after step 2
    state = {}
    outs = []
    for i in range(q.size(0)):
        if i == 2:
            mod.reorder_incremental_state(state, order)
            q, k, pad = q[:, order], k[:, order], pad[order]
            outs = [o[:, order] for o in outs]
        o, _ = mod(q[i:i + 1], k, k, key_padding_mask=pad, incremental_state=state, static_kv=True)
        outs.append(o)
    # the reference: new row r has old row order[r]'s history, so it is row r of the reordered batch
    full, _ = mod(q, k, k, key_padding_mask=pad, static_kv=True)
    assert torch.allclose(torch.cat(outs), full, atol=1e-5)


@pytest.mark.parametrize("bad, match", [
    (dict(encdec_attention_normaliser="sparsemax"), "softmax attention only"),
    (dict(encdec_coverage_dim=0), "coverage-dim"),
])
def test_bad_options(bad, match):
    from argparse import Namespace

    args = Namespace(encdec_attention_normaliser="softmax", encdec_attention_temperature=1.0,
                     encdec_attention_coverage=True, encdec_coverage_dim=10)
    for k, v in bad.items():
        setattr(args, k, v)
    with pytest.raises(ValueError, match=match):
        check_attention_normaliser_args(args)
