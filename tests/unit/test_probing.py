"""The universal probing decoder of Yang et al. (2020) (fairseq_sparse.analysis.probing, fairseq-sparse-probe).

* the module recorder reads the same representations from fairseq's own decoder layer (hooks) as our
  decoder layer records itself, pre- and post-norm;
* the target probe's mask stops copying: on random sequences a probe whose memory holds the decoder
  inputs learns nothing from it with the mask and copies the next word without it;
* source sequences are rebuilt right-padded from fairseq's left-padded batches;
* modules a checkpoint lacks give a clear error; end to end on the real console script.
Here the pure tests; those that train or run console scripts are in tests/e2e/test_probing_e2e.py.
"""
import math

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from fairseq_sparse.modules.decoder_layer import SublayerDecoderLayer
from fairseq_sparse.analysis.probing import (
    MODULES,
    DecoderModuleRecorder,
    ProbeDecoder,
    check_modules,
    layer_modules,
    source_sequences,
)

D, H, F = 16, 4, 32


def layer_cfg(normalize_before=False, order="tem-sem-ifm", simplified=False):
    cfg = TransformerConfig()
    cfg.decoder.embed_dim = cfg.encoder.embed_dim = D
    cfg.decoder.ffn_embed_dim = F
    cfg.decoder.attention_heads = H
    cfg.decoder.normalize_before = normalize_before
    cfg.dropout = cfg.attention_dropout = 0.0
    cfg.decoder_sublayer_order, cfg.simplified_decoder = order, simplified
    return cfg


@pytest.mark.parametrize("normalize_before", [False, True])
def test_stock_layer_hooks_read_what_our_layer_records(normalize_before):
    torch.manual_seed(0)
    cfg = layer_cfg(normalize_before)
    stock = TransformerDecoderLayerBase(cfg).eval()
    ours = SublayerDecoderLayer(cfg).eval()
    ours.load_state_dict(stock.state_dict())
    x, enc = torch.randn(5, 3, D), torch.randn(7, 3, D)
    mask = torch.triu(torch.full((5, 5), float("-inf")), 1)
    with DecoderModuleRecorder([stock, ours]) as rec:
        out_stock = stock(x, enc, None, self_attn_mask=mask)[0]
        out_ours = ours(x, enc, None, self_attn_mask=mask)[0]
    assert torch.allclose(out_stock, out_ours, atol=1e-6)
    assert sorted(rec.records[0]) == sorted(rec.records[1]) == sorted(MODULES)
    for m in MODULES:
        assert torch.allclose(rec.records[0][m], rec.records[1][m], atol=1e-6), m
    # closed forms of the paper's split (post-norm: C = LN(SA + x), Add-Norm I = LN(S + C))
    r = rec.records[0]
    if not normalize_before:
        assert torch.allclose(r["addnorm1"], stock.encoder_attn_layer_norm(r["sem"] + r["tem"]), atol=1e-5)
        assert torch.allclose(r["ifm"], stock.final_layer_norm(r["ffn"] + r["addnorm1"]), atol=1e-5)
    else:
        assert torch.allclose(r["addnorm1"], r["sem"] + r["tem"], atol=1e-5)
        assert torch.allclose(r["ifm"], r["ffn"] + r["addnorm1"], atol=1e-5)
    # hooks and records are gone afterwards
    assert ours.record is None and not stock._forward_hooks


def test_layer_modules_and_clear_errors():
    simplified = SublayerDecoderLayer(layer_cfg(simplified=True))
    no_tem = SublayerDecoderLayer(layer_cfg(order="sem-ifm"))
    assert layer_modules(simplified) == ["tem", "sem", "ifm", "addnorm1"]
    assert layer_modules(no_tem) == ["sem", "ifm", "addnorm1", "ffn", "addnorm2"]
    assert check_modules([simplified, simplified], None, [0, 1]) == ["tem", "sem", "ifm", "addnorm1"]
    with pytest.raises(ValueError, match="module ffn: decoder layer 0 of ckpt.pt has no FFN"):
        check_modules([simplified], ["ifm", "ffn"], [0], what="ckpt.pt")
    with pytest.raises(ValueError, match="no self-attention"):
        check_modules([no_tem], ["tem"], [0])
    with pytest.raises(ValueError, match="unknown module"):
        check_modules([no_tem], ["foo"], [0])


def test_source_sequences_from_left_padded_batch():
    pad, eos = 1, 2
    src = torch.tensor([[1, 1, 7, 8, 2], [5, 6, 7, 8, 2]])
    prev, target = source_sequences(src, pad, eos)
    assert prev.tolist() == [[2, 7, 8, 1, 1], [2, 5, 6, 7, 8]]
    assert target.tolist() == [[7, 8, 2, 1, 1], [5, 6, 7, 8, 2]]


def _train_copy_probe(causal_memory, steps=150):
    """A probe whose memory at position j is the decoder input at j (what a decoder state has seen):
    with the causal mask it cannot read the next word; without it, it copies it."""
    torch.manual_seed(0)
    d = Dictionary()
    for i in range(12):
        d.add_symbol(f"w{i}")
    vocab = torch.arange(d.nspecial, len(d))
    t_max = 8
    probe = ProbeDecoder(d, memory_dim=len(d) + t_max, embed_dim=32, ffn_dim=64, heads=4, dropout=0.0,
                         causal_memory=causal_memory)
    opt = torch.optim.Adam(probe.parameters(), lr=1e-2)

    def batch(n=32, t=t_max):
        target = vocab[torch.randint(len(vocab), (n, t))]
        target[:, -1] = d.eos()
        prev = torch.cat([torch.full((n, 1), d.eos()), target[:, :-1]], dim=1)
        # memory j: the input word at j and the position j, as a decoder state knows them
        words = torch.nn.functional.one_hot(prev, len(d)).float()
        positions = torch.eye(t_max)[:t].expand(n, t, t_max)
        memory = torch.cat([words, positions], dim=-1).transpose(0, 1)  # T x B x (V + T)
        return memory, prev.eq(d.pad()), prev, target

    for _ in range(steps):
        memory, pad, prev, target = batch()
        loss = probe.nll(memory, pad, prev, target) / target.numel()
        opt.zero_grad()
        loss.backward()
        opt.step()
    probe.eval()
    with torch.no_grad():
        memory, pad, prev, target = batch(256)
        words = target[:, :-1]  # the random words; the final EOS is predictable either way
        logits, _ = probe(prev, encoder_out={"encoder_out": [memory], "encoder_padding_mask": [pad]})
        lp = torch.log_softmax(logits, -1)[:, :-1]
        return float(-lp.gather(-1, words.unsqueeze(-1)).mean()), math.log(len(vocab))


@pytest.mark.parametrize("causal_memory", [True, False])
def test_left_padded_targets_give_finite_gradients(causal_memory):
    """Left-padded targets (--left-pad-target): the leading pad queries of the target probe see only
    masked memory under the causal mask; their loss is excluded and no NaN may reach any parameter."""
    torch.manual_seed(0)
    d = Dictionary()
    for i in range(10):
        d.add_symbol(f"w{i}")
    pad, eos = d.pad(), d.eos()
    probe = ProbeDecoder(d, memory_dim=D, embed_dim=D, ffn_dim=F, heads=H, dropout=0.0,
                         causal_memory=causal_memory)
    rows = [[5, 6, 7, 8, eos], [9, 10, eos]]  # target sentences of lengths 5 and 3
    target = torch.tensor([[pad] * (5 - len(r)) + r for r in rows])  # left-padded, as fairseq collates them
    prev = torch.tensor([[pad] * (5 - len(r)) + [eos] + r[:-1] for r in rows])
    memory_pad = prev.eq(pad)
    memory = torch.randn(5, 2, D)
    loss = probe.nll(memory, memory_pad, prev, target)
    loss.backward()
    assert torch.isfinite(loss)
    for name, p in probe.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    # the padded rows change nothing: the loss of the short sentence alone is the same
    alone = probe.nll(memory[2:, 1:], memory_pad[1:, 2:], prev[1:, 2:], target[1:, 2:])
    full = probe.nll(memory[:, 1:], memory_pad[1:], prev[1:], target[1:])
    assert torch.allclose(alone, full, atol=1e-5)


def test_target_probe_mask_stops_copying_the_translation_history():
    masked, uniform = _train_copy_probe(causal_memory=True)
    unmasked, _ = _train_copy_probe(causal_memory=False)
    assert masked > 0.9 * uniform  # nothing beyond chance: the next word is never visible
    assert unmasked < 0.3 * uniform  # the same probe without the mask copies it
