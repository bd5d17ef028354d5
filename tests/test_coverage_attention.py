"""The coverage model on the encoder-decoder attention (Zhang, Zhao, Li & Zong 2019 Sec. V, Eqs. 21-22):
the recurrence by hand, incremental == full-sequence (forced) decoding with beam search, exact pruned
decoding over L0Drop's compressed memory, options, and fairseq-train with --attention-reg entropy."""
import copy
import math

import pytest
import torch
from fairseq.modules import MultiheadAttention

import fairseq_sparse  # noqa: F401  (registers the models)
from conftest import TINY_MODEL, USER_DIR, console, fairseq_train, run
from fairseq_sparse.models.transformer_head_gates import HeadGatesTransformerModel
from fairseq_sparse.analysis.sparsity_curve import read_state
from fairseq_sparse.models.transformer_l0drop import L0DropTransformerModel
from fairseq_sparse.modules.attention_normalisers import check_attention_normaliser_args
from fairseq_sparse.modules.coverage_attention import CoverageAttention
from test_attention_normalisers import batch, generate, load, rescore
from test_generation_exactness import drop_fraction, pruned_vs_unpruned, sparsity

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


def coverage_model(ckpt, corpus, arch="transformer_head_gates", seed=0):
    """The stock checkpoint's weights in ``arch`` with --encdec-attention-coverage and random coverage weights
    (w != 0, so the coverage changes the attention)."""
    stock, cfg, task = load(ckpt, corpus["bin"])
    args = copy.deepcopy(cfg.model)
    args.arch = args._name = arch
    args.head_gates = ""
    args.encdec_attention_coverage = True
    args.encdec_coverage_dim = 4
    cls = HeadGatesTransformerModel if arch == "transformer_head_gates" else L0DropTransformerModel
    model = cls.build_model(args, task)
    missing, unexpected = model.load_state_dict(stock.state_dict(), strict=False)
    assert not unexpected and all("coverage" in k or "l0drop" in k for k in missing)
    torch.manual_seed(seed)
    with torch.no_grad():
        for layer in model.decoder.layers:
            assert isinstance(layer.encoder_attn, CoverageAttention)
            layer.encoder_attn.coverage.logit.weight.normal_(0.0, 2.0)
            layer.encoder_attn.coverage.from_weights.weight.normal_(0.0, 1.0)
    return model.eval(), task


@pytest.mark.parametrize("arch", ["transformer_head_gates", "transformer_l0drop"])
def test_beam_search_equals_forced_decoding(stock_transformer_ckpt, corpus, arch):
    """Beam 4 in fairseq's SequenceGenerator (incremental, cached coverage reordered with the beams; the
    L0Drop model shares one memory per sentence) scores each hypothesis as a full-sequence pass does."""
    model, task = coverage_model(stock_transformer_ckpt, corpus, arch)
    sample = batch(task)
    hypos = generate(model, task, sample, beam=4)
    assert len({len(h[0]["tokens"]) for h in hypos}) > 1  # sentences finish at different steps
    eos = task.target_dictionary.eos()
    for forced, step in rescore(model, sample, hypos, eos):
        assert torch.allclose(forced, step, atol=1e-4), (forced - step).abs().max()
    # and the coverage does change the translation model
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.encoder_attn.coverage.logit.weight.zero_()
    assert any(not torch.allclose(forced, step, atol=1e-3) for forced, step in rescore(model, sample, hypos, eos))


@pytest.mark.parametrize("dropped_as", ["zero", "mask"])
def test_pruned_decoding_with_coverage_is_exact(stock_transformer_ckpt, corpus, dropped_as):
    """Over the compressed memory, the counted dummy tracks one pruned state's coverage: same hypotheses."""
    model, task = coverage_model(stock_transformer_ckpt, corpus, "transformer_l0drop")
    sample = batch(task, 12)
    drop_fraction(model, model.encoder.l0drop, sample, 0.4)
    assert 0.2 < sparsity(model, sample) < 0.6
    for beam in (1, 4):
        pruned_vs_unpruned(model, task, sample, beam, dropped_as)


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


def test_train_with_entropy_and_generate(corpus, stock_transformer_ckpt, tmp_path):
    """NMT+Cov+Ent: fairseq-train fine-tunes a stock checkpoint with coverage and the entropy regulariser
    (the penalty and the entropy are logged); fairseq-generate decodes every test sentence."""
    save = str(tmp_path / "cov")
    proc = fairseq_train(corpus["bin"], save, [
        "--arch", "transformer_head_gates", "--head-gates", "", "--encdec-attention-coverage",
        "--criterion", "label_smoothed_cross_entropy_with_sparsity", "--label-smoothing", "0.1",
        "--attention-reg", "entropy", "--attention-reg-lambda", "0.1",
        "--finetune-from-model", stock_transformer_ckpt, "--log-format", "json", "--log-interval", "5",
    ] + TINY_MODEL, max_update=10)
    log = proc.stdout + proc.stderr
    assert "attn_entropy" in log
    ckpt = read_state(f"{save}/checkpoint_last.pt")  # torch's safe loader (the plugin allowlists fairseq's classes)
    w = ckpt["model"]["decoder.layers.0.encoder_attn.coverage.logit.weight"]
    assert w.abs().sum() > 0  # the coverage weight moved away from 0
    out = run([console("fairseq-generate"), corpus["bin"], "--user-dir", USER_DIR, "--path",
               f"{save}/checkpoint_last.pt", "--beam", "4", "--batch-size", "16", "--cpu", "--gen-subset",
               "test"]).stdout
    assert sum(line.startswith("H-") for line in out.splitlines()) == 60
    assert not math.isnan(float(out.strip().splitlines()[-1].split("BLEU4 = ")[1].split(",")[0]))
