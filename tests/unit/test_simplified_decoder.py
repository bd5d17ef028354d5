"""Decoder sub-layer orders and the simplified decoder (paper 004, Yang et al. 2020).

Unit tests of :class:`SublayerDecoderLayer` against fairseq's own decoder layer and against the closed
forms of paper 004 Sec. 2.2 / 3.3 (module representations recorded with ``layer.record``), parameter
counts (Table 3), incremental beam search == a full teacher-forced pass for every layout, and exact
L0Drop pruned decoding with the new layouts. The console-script tests are in
test_simplified_decoder_cli.py.
Here the pure tests; those that train or run console scripts are in tests/e2e/test_simplified_decoder_e2e.py.
"""

import pytest
import torch
import torch.nn.functional as Fn
from fairseq import options
from fairseq.data import Dictionary, data_utils
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks.translation import TranslationConfig, TranslationTask

import fairseq_sparse  # noqa: F401  (registers the models)
from conftest import USER_DIR
from fairseq_sparse.modules.decoder_layer import (
    SUBLAYER_ORDERS,
    SublayerDecoderLayer,
    check_decoder_layout_args,
    decoder_blocks,
)
from helpers.models import rescore

D, F, H = 16, 32, 4  # model width, FFN width, heads of the unit-test layers
T, B, S = 5, 3, 6  # target length, batch, source length
ORDERS = sorted(SUBLAYER_ORDERS)


# ----------------------------------------------------------------------------------------------
# one layer: fairseq's forward and the closed forms


def layer_cfg(order="tem-sem-ifm", simplified=False, pre_norm=False):
    cfg = TransformerConfig()
    cfg.encoder.embed_dim = D
    cfg.decoder.embed_dim, cfg.decoder.ffn_embed_dim, cfg.decoder.attention_heads = D, F, H
    cfg.decoder.normalize_before = pre_norm
    cfg.decoder_sublayer_order = order
    cfg.simplified_decoder = simplified
    return cfg


def randomise(module, seed=0):
    """Random weights everywhere, LayerNorm gains around 1 with random biases: the three LayerNorms
    differ, so using the wrong one (or the wrong order) changes the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.3 * noise if "layer_norm.weight" in name else 0.3 * noise)
    return module.eval()


def inputs(seed=1):
    """x [T, B, D] (right-padded targets), encoder output [S, B, D] (left-padded sources), the causal
    mask and both padding masks."""
    g = torch.Generator().manual_seed(seed)
    x, enc = torch.randn(T, B, D, generator=g), torch.randn(S, B, D, generator=g)
    enc_pad = torch.zeros(B, S, dtype=torch.bool)
    for b, n in enumerate([S, 4, 2]):
        enc_pad[b, :S - n] = True
    self_pad = torch.zeros(B, T, dtype=torch.bool)
    for b, n in enumerate([T, 3, 4]):
        self_pad[b, n:] = True
    causal = torch.triu(torch.full((T, T), float("-inf")), 1)
    return dict(x=x, enc=enc, enc_pad=enc_pad, self_pad=self_pad, causal=causal)


def attention_by_hand(mha, query, key, key_padding_mask, attn_mask=None):
    """Concat_h softmax(Q_h K_h^T / sqrt(d_h) + mask) V_h, W^O: [tgt, B, D]."""
    tq, bsz, _ = query.shape
    hd = mha.head_dim
    q = mha.q_proj(query).view(tq, bsz, mha.num_heads, hd) * hd ** -0.5
    k = mha.k_proj(key).view(key.size(0), bsz, mha.num_heads, hd)
    v = mha.v_proj(key).view(key.size(0), bsz, mha.num_heads, hd)
    scores = torch.einsum("tbhd,sbhd->bhts", q, k)
    if attn_mask is not None:
        scores = scores + attn_mask
    scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    out = torch.einsum("bhts,sbhd->tbhd", scores.softmax(-1), v).reshape(tq, bsz, mha.num_heads * hd)
    return mha.out_proj(out)


def by_hand(layer, i):
    """The sub-layer operations of paper 004 from the layer's own modules."""
    SA = lambda h: attention_by_hand(layer.self_attn, h, h, i["self_pad"], i["causal"])  # noqa: E731
    EA = lambda h: attention_by_hand(layer.encoder_attn, h, i["enc"], i["enc_pad"])  # noqa: E731
    FFN = lambda h: layer.fc2(Fn.relu(layer.fc1(h)))  # noqa: E731
    return SA, EA, FFN, layer.self_attn_layer_norm, layer.encoder_attn_layer_norm, layer.final_layer_norm


def run_layer(layer, i, need_attn=False):
    with torch.no_grad():
        return layer(i["x"], i["enc"], i["enc_pad"], self_attn_mask=i["causal"], self_attn_padding_mask=i["self_pad"],
                     need_attn=need_attn)


def close(a, b, tol=1e-5, msg=None, rtol=0.0):
    torch.testing.assert_close(a, b, rtol=rtol, atol=tol, msg=msg)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_standard_blocks_equal_fairseqs_own_forward(pre_norm):
    """The block loop (forced by setting ``record``) computes what fairseq's TransformerDecoderLayerBase
    computes with the same weights, attention weights included; its recorded ``ifm`` is the output."""
    cfg = layer_cfg(pre_norm=pre_norm)
    layer = randomise(SublayerDecoderLayer(cfg))
    ref = TransformerDecoderLayerBase(cfg).eval()
    ref.load_state_dict(layer.state_dict(), strict=True)
    i = inputs()
    want, want_attn, _ = run_layer(ref, i, need_attn=True)
    close(run_layer(layer, i)[0], want, 0)  # without recording: fairseq's own forward
    layer.record = {}
    out, attn, _ = run_layer(layer, i, need_attn=True)
    close(out, want)
    close(attn, want_attn)
    assert set(layer.record) == {"tem", "sem", "addnorm1", "ffn", "addnorm2", "ifm"}
    assert layer.record["ifm"] is out
    assert torch.isfinite(out).all() and not torch.allclose(out, i["x"], atol=0.1)


def test_standard_post_norm_records_paper_004_modules():
    """C = LN1(SA(x) + x), S = EA(C), A1 = LN2(S + C), F = fc2(relu(fc1(A1))), A2 = LN3(F + A1)."""
    layer = randomise(SublayerDecoderLayer(layer_cfg()))
    i = inputs()
    layer.record = {}
    out, _, _ = run_layer(layer, i)
    SA, EA, FFN, LN1, LN2, LN3 = by_hand(layer, i)
    with torch.no_grad():
        x = i["x"]
        C = LN1(SA(x) + x)
        S_ = EA(C)
        A1 = LN2(S_ + C)
        F_ = FFN(A1)
        A2 = LN3(F_ + A1)
    rec = layer.record
    assert set(rec) == {"tem", "sem", "addnorm1", "ffn", "addnorm2", "ifm"}
    for name, value in dict(tem=C, sem=S_, addnorm1=A1, ffn=F_, addnorm2=A2, ifm=A2).items():
        close(rec[name], value, msg=name)
    close(out, A2)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_simplified_layer_is_one_add_norm_after_the_encoder_attention(pre_norm):
    """Post-norm: out = LN2(EA(C) + C), C = LN1(SA(x) + x). Pre-norm: C = x + SA(LN1(x)), out = C +
    EA(LN2(C)). No FFN modules, nothing FFN-like recorded."""
    layer = randomise(SublayerDecoderLayer(layer_cfg(simplified=True, pre_norm=pre_norm)))
    assert layer.blocks == ("self", "cross")
    assert layer.fc1 is None and layer.fc2 is None and layer.final_layer_norm is None
    assert not any(k.startswith(("fc1", "fc2", "final_layer_norm")) for k in layer.state_dict())
    i = inputs()
    layer.record = {}
    out, _, _ = run_layer(layer, i)
    SA, EA, _, LN1, LN2, _ = by_hand(layer, i)
    with torch.no_grad():
        x = i["x"]
        if pre_norm:
            C = x + SA(LN1(x))
            S_ = EA(LN2(C))
            want = C + S_
        else:
            C = LN1(SA(x) + x)
            S_ = EA(C)
            want = LN2(S_ + C)
    close(out, want)
    rec = layer.record
    assert set(rec) == {"tem", "sem", "addnorm1", "ifm"}
    close(rec["tem"], C)
    close(rec["sem"], S_)
    close(rec["addnorm1"], want)
    assert rec["ifm"] is out
    # without recording: the same output
    layer.record = None
    close(run_layer(layer, i)[0], want)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_sem_tem_ifm_closed_form(pre_norm):
    """Post-norm: x1 = LN2(EA(x) + x), x2 = LN1(SA(x1) + x1), out = LN3(FFN(x2) + x2) (pre-norm: the
    LayerNorms move onto the sub-layer inputs)."""
    layer = randomise(SublayerDecoderLayer(layer_cfg("sem-tem-ifm", pre_norm=pre_norm)))
    assert layer.blocks == ("cross", "self", "ffn")
    i = inputs()
    layer.record = {}
    out, attn, _ = run_layer(layer, i, need_attn=True)
    SA, EA, FFN, LN1, LN2, LN3 = by_hand(layer, i)
    with torch.no_grad():
        x = i["x"]
        if pre_norm:
            x1 = x + EA(LN2(x))
            x2 = x1 + SA(LN1(x1))
            want = x2 + FFN(LN3(x2))
        else:
            x1 = LN2(EA(x) + x)
            x2 = LN1(SA(x1) + x1)
            want = LN3(FFN(x2) + x2)
    close(out, want)
    assert attn.shape == (B, T, S) and torch.allclose(attn.sum(-1), torch.ones(B, T), atol=1e-5)
    assert (attn[i["enc_pad"].unsqueeze(1).expand(B, T, S)] == 0).all()
    rec = layer.record
    close(rec["tem"], x2)
    close(rec["addnorm1"], x2)  # the last attention block's Add&Norm starts the IFM
    close(rec["addnorm2"], want)
    # the standard order with the same weights computes something else: the order matters
    std = SublayerDecoderLayer(layer_cfg(pre_norm=pre_norm)).eval()
    std.load_state_dict(layer.state_dict())
    assert not torch.allclose(run_layer(std, i)[0], want, atol=1e-3)


def test_sem_ifm_has_no_self_attention():
    """out = LN3(FFN(A) + A), A = LN2(EA(x) + x); self_attn and its LayerNorm are not built."""
    layer = randomise(SublayerDecoderLayer(layer_cfg("sem-ifm")))
    assert layer.blocks == ("cross", "ffn") and layer.self_attn is None and layer.self_attn_layer_norm is None
    assert not any(k.startswith("self_attn") for k in layer.state_dict())
    i = inputs()
    layer.record = {}
    out, _, _ = run_layer(layer, i)
    _, EA, FFN, _, LN2, LN3 = by_hand(layer, i)
    with torch.no_grad():
        A = LN2(EA(i["x"]) + i["x"])
        want = LN3(FFN(A) + A)
    close(out, want)
    assert "tem" not in layer.record
    close(layer.record["addnorm1"], A)
    # sem-ifm + simplified: one encoder-attention block, nothing else
    simple = randomise(SublayerDecoderLayer(layer_cfg("sem-ifm", simplified=True)))
    assert simple.blocks == ("cross",) and sum(p.numel() for p in simple.parameters()) == 4 * D * D + 4 * D + 2 * D
    _, EA, _, _, LN2, _ = by_hand(simple, i)
    with torch.no_grad():
        close(run_layer(simple, i)[0], LN2(EA(i["x"]) + i["x"]))


def test_unknown_order_and_standard_only_options_are_refused():
    with pytest.raises(ValueError, match="unknown order 'foo'; choose from tem-sem-ifm, sem-tem-ifm, sem-ifm"):
        decoder_blocks("foo")
    with pytest.raises(ValueError, match="unknown order"):
        SublayerDecoderLayer(layer_cfg("foo"))
    assert decoder_blocks(None) == ("self", "cross", "ffn")
    ns = lambda **kw: argparse_namespace(**kw)  # noqa: E731
    check_decoder_layout_args(ns(scale_attn=True))  # the standard layout: fairseq's forward implements it
    with pytest.raises(ValueError, match="--scale-attn only work with the standard decoder layout"):
        check_decoder_layout_args(ns(simplified_decoder=True, scale_attn=True))
    with pytest.raises(ValueError, match="--cross-self-attention"):
        check_decoder_layout_args(ns(decoder_sublayer_order="sem-tem-ifm", cross_self_attention=True))
    with pytest.raises(ValueError, match="no decoder self-attention to gate"):
        check_decoder_layout_args(ns(decoder_sublayer_order="sem-ifm", head_gates="enc, dec"))
    check_decoder_layout_args(ns(decoder_sublayer_order="sem-ifm", head_gates="enc,encdec"))
    with pytest.raises(ValueError, match="--no-cross-attention"):
        check_decoder_layout_args(ns(simplified_decoder=True, no_cross_attention=True))


def argparse_namespace(**kw):
    import argparse

    base = dict(decoder_sublayer_order="tem-sem-ifm", simplified_decoder=False, head_gates="")
    base.update(kw)
    return argparse.Namespace(**base)


# ----------------------------------------------------------------------------------------------
# whole models built through fairseq's registry (no data files)


def dictionary(n=20):
    d = Dictionary()
    for k in range(n):
        d.add_symbol(f"w{k}")
    d.finalize(padding_factor=1)
    return d


DICT = dictionary()
SMALL = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
         "--encoder-ffn-embed-dim", "48", "--decoder-ffn-embed-dim", "48", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "4", "--share-all-embeddings"]


def build(arch, *extra, dictionary=DICT, seed=0):
    """A model of ``arch`` as fairseq-train builds it (parser, architecture preset, task.build_model)."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["unused-data-dir", "--user-dir", USER_DIR, "--task", "translation",
                                                "--arch", arch] + list(extra))
    task = TranslationTask(TranslationConfig(), dictionary, dictionary)
    torch.manual_seed(seed)
    return task.build_model(args).eval(), args, task


def n_params(module):
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def test_simplified_decoder_drops_exactly_the_ffn_parameters():
    stock, _, _ = build("transformer", *SMALL)
    simple, args, _ = build("transformer_simplified_decoder", *SMALL)
    assert args.simplified_decoder is True and args.decoder_sublayer_order == "tem-sem-ifm" and args.head_gates == ""
    d, f, L = 32, 48, 2
    per_layer = 2 * d * f + f + d + 2 * d  # fc1 (d x f + f), fc2 (f x d + d), final_layer_norm (2d)
    assert n_params(stock) - n_params(simple) == L * per_layer
    for layer in simple.decoder.layers:
        assert type(layer) is SublayerDecoderLayer
        assert layer.fc1 is None and layer.fc2 is None and layer.final_layer_norm is None
        assert layer.self_attn is not None and layer.encoder_attn is not None
    assert not any(".fc1." in k or ".fc2." in k or "final_layer_norm" in k
                   for k in simple.state_dict() if k.startswith("decoder."))
    assert any(".fc1." in k for k in simple.state_dict() if k.startswith("encoder."))  # the encoder keeps its FFN
    # sem-ifm also lacks the decoder self-attention and its LayerNorm
    sem, _, _ = build("transformer_head_gates", *SMALL, "--head-gates", "", "--decoder-sublayer-order", "sem-ifm")
    assert n_params(stock) - n_params(sem) == L * (4 * d * d + 4 * d + 2 * d)
    assert all(layer.self_attn is None and layer.self_attn_layer_norm is None for layer in sem.decoder.layers)
    sem_simple, _, _ = build("transformer_simplified_decoder", *SMALL, "--decoder-sublayer-order", "sem-ifm")
    assert n_params(stock) - n_params(sem_simple) == L * (per_layer + 4 * d * d + 4 * d + 2 * d)
    # sem-tem-ifm only reorders: the stock parameter set, key for key
    swapped, _, _ = build("transformer_head_gates", *SMALL, "--head-gates", "", "--decoder-sublayer-order",
                          "sem-tem-ifm")
    assert {k: v.shape for k, v in swapped.state_dict().items()} == {k: v.shape for k, v in stock.state_dict().items()}


def test_default_head_gates_follow_the_layout():
    """transformer_head_gates gates every attention type by default; without decoder self-attention
    (sem-ifm) the default leaves 'dec' out instead of refusing a gate type the user did not ask for."""
    model, args, _ = build("transformer_head_gates", *SMALL, "--decoder-sublayer-order", "sem-ifm")
    assert args.head_gates == "enc,encdec"
    gated = [name for name, m in model.named_modules() if getattr(m, "head_gates", None) is not None]
    assert sorted(gated) == ["decoder.layers.0.encoder_attn", "decoder.layers.1.encoder_attn",
                             "encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]
    _, args, _ = build("transformer_head_gates", *SMALL, "--decoder-sublayer-order", "sem-tem-ifm")
    assert args.head_gates == "enc,dec,encdec"
    with pytest.raises(ValueError, match="no decoder self-attention to gate"):
        build("transformer_head_gates", *SMALL, "--decoder-sublayer-order", "sem-ifm", "--head-gates", "enc,dec")


def test_transformer_base_decoder_parameters_as_in_paper_004_table_3():
    """Base decoder: self-attention 6.3M, encoder attention 6.3M, FFN 12.6M (LayerNorms included); the
    simplified decoder has exactly the FFN's parameters fewer."""
    stock, _, _ = build("transformer")
    simple, _, _ = build("transformer_simplified_decoder")
    layers = stock.decoder.layers
    assert len(layers) == 6 and layers[0].embed_dim == 512 and layers[0].fc1.out_features == 2048
    ffn = sum(n_params(m) for layer in layers for m in (layer.fc1, layer.fc2, layer.final_layer_norm))
    self_attn = sum(n_params(layer.self_attn) + n_params(layer.self_attn_layer_norm) for layer in layers)
    enc_attn = sum(n_params(layer.encoder_attn) + n_params(layer.encoder_attn_layer_norm) for layer in layers)
    assert ffn == 6 * (2 * 512 * 2048 + 2048 + 512 + 2 * 512) == 12_604_416
    assert round(ffn / 1e6, 1) == 12.6 and round(self_attn / 1e6, 1) == 6.3 and round(enc_attn / 1e6, 1) == 6.3
    assert n_params(stock) - n_params(simple) == ffn
    assert n_params(stock.decoder) - n_params(simple.decoder) == ffn


def sources(seed=0, lengths=(7, 3, 5, 1)):
    """A left-padded batch of random sources (one EOS-only source among them)."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.cat([torch.randint(DICT.nspecial, len(DICT), (n - 1,), generator=g), torch.tensor([DICT.eos()])])
            for n in lengths]
    src = data_utils.collate_tokens(rows, DICT.pad(), DICT.eos(), left_pad=True)
    return {"net_input": {"src_tokens": src, "src_lengths": torch.tensor(lengths)}, "nsentences": len(rows)}


def beam_search(model, sample, beam=4, max_len_b=8):
    gen = SequenceGenerator([model], DICT, beam_size=beam, max_len_a=0, max_len_b=max_len_b)
    with torch.no_grad():
        return gen.generate([model], sample)


def sharpen(model, seed=0, eos_scale=1.0):
    """Random LayerNorm gains and biases (fairseq initialises 1 and 0), larger output logits and a
    larger EOS embedding, so that every sub-layer matters and beam search meets EOS at different steps."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.3 * torch.randn(p.shape, generator=g))
        model.decoder.embed_tokens.weight.mul_(3.0)
        model.decoder.embed_tokens.weight[DICT.eos()].mul_(eos_scale)
    return model


def model_with_varied_lengths(extra, sample):
    """A random model of the layout whose beam search returns hypotheses of different lengths (the first
    of a few seeded settings that does): finished hypotheses leave the beam at different steps."""
    for seed in range(3):
        for eos_scale in (4.0, 3.0, 6.0, 8.0):
            model, args, _ = build("transformer_head_gates", *SMALL, *extra, seed=seed)
            sharpen(model, seed, eos_scale)
            hypos = beam_search(model, sample)
            if len({len(h["tokens"]) for hyps in hypos for h in hyps}) > 1:
                return model, hypos
    raise AssertionError(f"no seeded model with {extra} ends its hypotheses at different steps")


@pytest.mark.parametrize("simplified", [False, True], ids=["full", "simplified"])
@pytest.mark.parametrize("pre_norm", [False, True], ids=["post", "pre"])
@pytest.mark.parametrize("order", ORDERS)
def test_incremental_beam_search_equals_full_forward(order, pre_norm, simplified):
    """fairseq's SequenceGenerator (incremental decoding, beam 4, hypotheses reordered and finishing at
    different steps): every hypothesis's step scores and score equal a teacher-forced full pass."""
    extra = ["--head-gates", "", "--decoder-sublayer-order", order] + (["--simplified-decoder"] if simplified else [])
    if pre_norm:
        extra += ["--encoder-normalize-before", "--decoder-normalize-before"]
    sample = sources()
    model, hypos = model_with_varied_lengths(extra, sample)
    layer = model.decoder.layers[0]
    assert layer.normalize_before == pre_norm
    want_blocks = decoder_blocks(order, simplified)
    if want_blocks != ("self", "cross", "ffn"):
        assert isinstance(layer, SublayerDecoderLayer) and layer.blocks == want_blocks
    assert [len(h) for h in hypos] == [4] * 4
    n = 0
    for full, inc in rescore(model, sample, hypos, DICT.eos()):
        close(inc, full, rtol=1e-6)  # float32 log-probabilities of -30 and below
        n += 1
    assert n == 16
    for hyps in hypos:
        for h in hyps:
            assert h["score"].item() == pytest.approx(h["positional_scores"].sum().item() / len(h["tokens"]), abs=1e-5)
