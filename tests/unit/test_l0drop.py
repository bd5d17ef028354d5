"""L0Drop module math: the per-sentence normalised expected-L0 penalty, the sparsity statistics, the
gates in training and eval mode, and Algorithm 1's compressed memory against attention over the full
gated sequence (computed with fairseq's own MultiheadAttention, not with our code)."""
import copy
import math

import pytest
import torch
from fairseq.modules import MultiheadAttention

from conftest import DEVICES
from fairseq_sparse.modules.count_attention import CountAwareAttention
from fairseq_sparse.modules.hard_concrete import HardConcrete
from fairseq_sparse.modules.l0drop import L0Drop, compress, expand_attention
from fairseq_sparse.modules.sparsity import collect_sparsity_terms
from helpers.models import build_l0drop_model, mixed_length_batch

LN11 = math.log(11.0)
C = 16


def sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


def p_open_by_hand(a, beta=2 / 3, gamma=-0.1, zeta=1.1):
    # P(g != 0) = 1 - P(s <= -gamma/(zeta-gamma)), s = sigmoid((L + a)/beta), L logistic
    t = -gamma / (zeta - gamma)
    return 1.0 - sigmoid(beta * math.log(t / (1 - t)) - a)


def make_l0drop(seed=0, bias=0.0, scale=1.0):
    torch.manual_seed(seed)
    m = L0Drop(C, HardConcrete())
    with torch.no_grad():
        m.log_alpha_proj.weight.normal_(0, scale)
        m.log_alpha_proj.bias.fill_(bias)
    return m


def batch(seed=0, lengths=(7, 3, 5, 1), T=None):
    """x: T x B x C, padding_mask B x T (right padding), list of real lengths."""
    g = torch.Generator().manual_seed(seed)
    T = T or max(lengths)
    x = torch.randn(T, len(lengths), C, generator=g)
    pad = torch.arange(T).unsqueeze(0) >= torch.tensor(lengths).unsqueeze(1)
    return x, pad, list(lengths)


def log_alphas_by_hand(m, x):
    w = m.log_alpha_proj.weight.detach().double().view(-1)
    b = float(m.log_alpha_proj.bias.detach())
    return [[float(x[t, i].double() @ w) + b for t in range(x.size(0))] for i in range(x.size(1))]


def test_penalty_is_per_sentence_normalised_expected_l0():
    m = make_l0drop(bias=0.5)
    m.train()
    x, pad, lengths = batch()
    la = log_alphas_by_hand(m, x)
    per_sentence = [sum(p_open_by_hand(a) for a in la[i][:n]) / n for i, n in enumerate(lengths)]
    expected = sum(per_sentence) / len(per_sentence)
    m(x, pad)
    (term,) = m.pop_sparsity_terms()
    assert term.group == "l0drop"
    assert term.penalty.item() == pytest.approx(expected, abs=1e-5)
    # not the token-level mean (differs with unequal lengths)
    token_mean = sum(p_open_by_hand(a) for i, n in enumerate(lengths) for a in la[i][:n]) / sum(lengths)
    assert abs(expected - token_mean) > 1e-3
    # stats: expected L0 and sparsity per real token; sparsity counts g_hat = 0 (log alpha <= -ln 11)
    num, den = term.stats["l0drop_expected_l0"]
    assert float(den) == sum(lengths)
    assert float(num) == pytest.approx(token_mean * sum(lengths), abs=1e-4)
    pruned = sum(1 for i, n in enumerate(lengths) for a in la[i][:n] if a <= -LN11)
    num, den = term.stats["l0drop_sparsity"]
    assert (int(num), int(den)) == (pruned, sum(lengths))
    # collected once
    assert m.pop_sparsity_terms() == []


@pytest.mark.parametrize("training", [True, False])
def test_padding_does_not_count(training):
    m = make_l0drop(bias=-1.0, scale=2.0)
    x, pad, lengths = batch(seed=1)
    m.train(training)
    m(x, pad)
    (ref,) = m.pop_sparsity_terms()
    x2 = x.clone()
    x2[pad.t()] = 100.0  # padded states with huge log alphas
    y, gates = m(x2, pad)
    (term,) = m.pop_sparsity_terms()
    if training:  # the penalty is a function of log alpha only: the same despite sampled gates
        assert term.penalty.item() == pytest.approx(ref.penalty.item(), abs=1e-6)
    for k in ref.stats:
        assert [float(v) for v in term.stats[k]] == pytest.approx([float(v) for v in ref.stats[k]])
    assert (gates[pad] == 0).all()
    assert (y[pad.t()] == 0).all()


def test_eval_records_statistics_but_no_penalty():
    """Validation runs in eval mode: a penalty there would make valid_loss CE + lambda L0 for L0Drop models
    only (and the best-checkpoint metric with it); head gates and attention regularisers report none."""
    m = make_l0drop(bias=-LN11, scale=1.0).eval()
    x, pad, lengths = batch(seed=2)
    m(x, pad)
    (term,) = m.pop_sparsity_terms()
    assert term.penalty is None
    assert float(term.sparsity["l0drop"].units) == sum(lengths) > 0
    assert 0 < int(term.sparsity["l0drop"].closed) < sum(lengths)
    assert float(term.stats["l0drop_expected_l0"][0]) > 0


def test_sparsity_stat_mixed_and_eval_gates_deterministic():
    # choose the bias so that about half of the states fall below -ln 11
    m = make_l0drop(bias=-LN11, scale=1.0)
    m.eval()
    x, pad, lengths = batch(seed=2, lengths=(9, 4, 6, 2, 1))
    la = log_alphas_by_hand(m, x)
    y, gates = m(x, pad)
    (term,) = m.pop_sparsity_terms()
    expected_gates = torch.zeros_like(gates)
    for i, n in enumerate(lengths):
        for t in range(n):
            expected_gates[i, t] = min(1.0, max(0.0, 1.2 * sigmoid(la[i][t]) - 0.1))
    assert torch.allclose(gates, expected_gates, atol=1e-6)
    zeros = sum(1 for i, n in enumerate(lengths) for a in la[i][:n] if a <= -LN11)
    assert 0 < zeros < sum(lengths)
    assert int(term.stats["l0drop_sparsity"][0]) == zeros
    assert int((gates[~pad] == 0).sum()) == zeros
    # output = g * x, and repeated eval calls give the same gates
    assert torch.allclose(y, x * gates.t().unsqueeze(-1), atol=1e-7)
    y2, gates2 = m(x, pad)
    assert torch.equal(gates, gates2) and torch.equal(y, y2)


def test_train_gates_are_sampled():
    m = make_l0drop(bias=0.0, scale=0.5)
    m.train()
    x, pad, lengths = batch(seed=3, lengths=(12, 12, 8))
    torch.manual_seed(5)
    _, g1 = m(x, pad)
    (t1,) = m.pop_sparsity_terms()
    _, g2 = m(x, pad)
    (t2,) = m.pop_sparsity_terms()
    assert not torch.equal(g1, g2)
    assert ((g1 >= 0) & (g1 <= 1)).all() and (g1[pad] == 0).all()
    assert (g1[~pad] == 0).any() and ((g1[~pad] > 0) & (g1[~pad] < 1)).any()
    # the penalty is a function of log alpha only, and the sparsity stat uses g_hat, not the samples
    assert t1.penalty.item() == pytest.approx(t2.penalty.item(), abs=1e-7)
    assert int(t1.stats["l0drop_sparsity"][0]) == int(t2.stats["l0drop_sparsity"][0])
    la = log_alphas_by_hand(m, x)
    assert int(t1.stats["l0drop_sparsity"][0]) == sum(
        1 for i, n in enumerate(lengths) for a in la[i][:n] if a <= -LN11)
    # the penalty has gradients to w and b
    t1.penalty.backward()
    assert m.log_alpha_proj.bias.grad.abs().item() > 0


def test_alive_states_stay_dropped():
    m = make_l0drop(bias=20.0, scale=0.0)  # every gate fully open on its own
    m.eval()
    x, pad, lengths = batch(seed=4)
    alive = torch.rand(pad.shape, generator=torch.Generator().manual_seed(0)) > 0.4
    _, gates = m(x, pad, alive=alive)
    assert torch.equal(gates, (alive & ~pad).float())


# --- Algorithm 1: the compressed memory against the full gated sequence ---

HEADS = 4


def attention_pair(seed=0):
    torch.manual_seed(seed)
    ref = MultiheadAttention(C, HEADS, kdim=C, vdim=C, encoder_decoder_attention=True)
    ours = CountAwareAttention(C, HEADS, kdim=C, vdim=C, encoder_decoder_attention=True)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.5)  # non-zero biases matter: a zero state's key and value are b_k, b_v
    ours.load_state_dict(ref.state_dict())
    return ref.eval(), ours.eval()


def full_mask_by_hand(gates, pad, dropped_as):
    """Key padding mask of the uncompressed gated memory, written independently of the package."""
    if dropped_as == "zero":
        return pad.clone()
    mask = pad.clone()
    for i in range(gates.size(0)):
        real = ~pad[i]
        dropped = real & (gates[i] == 0)
        if dropped.sum() < real.sum():  # a row with everything dropped attends to its zero states
            mask[i] |= dropped
    return mask


def gate_case(name, seed=0):
    g = torch.Generator().manual_seed(seed)
    if name == "one_token":
        lengths = (1, 1, 4)
    elif name == "no_padding":
        lengths = (6, 6, 6)
    else:
        lengths = (8, 3, 6, 1, 5)
    T = max(lengths)
    B = len(lengths)
    x = torch.randn(T, B, C, generator=g)
    pad = torch.arange(T).unsqueeze(0) >= torch.tensor(lengths).unsqueeze(1)
    if name == "left_padding":
        pad = pad.flip(1)
    u = torch.rand(B, T, generator=g)
    gates = torch.where(u < 0.45, torch.zeros_like(u), 0.2 + 0.8 * torch.rand(B, T, generator=g))
    if name == "nothing_pruned":
        gates = 0.2 + 0.8 * u
    elif name == "everything_pruned":
        gates = torch.zeros_like(u)
    elif name == "one_token":
        gates[0, 0], gates[1, 0] = 0.0, 0.7  # one dropped, one kept single-token source
    elif name in ("mixed", "left_padding"):
        gates[0] = 0.0  # one sentence with every state dropped
        gates[2, :] = 0.5 + 0.5 * u[2]  # and one with nothing dropped
    gates = gates * (~pad)
    return x * gates.t().unsqueeze(-1), gates, pad


CASES = ["mixed", "left_padding", "nothing_pruned", "everything_pruned", "one_token", "no_padding"]


@pytest.mark.parametrize("dropped_as", ["zero", "mask"])
@pytest.mark.parametrize("case", CASES)
def test_compressed_attention_equals_full_attention(case, dropped_as):
    ref, ours = attention_pair()
    x, gates, pad = gate_case(case)
    B = x.size(1)
    query = torch.randn(5, B, C, generator=torch.Generator().manual_seed(9))
    ref_out, ref_attn = ref(query, x, x, key_padding_mask=full_mask_by_hand(gates, pad, dropped_as), static_kv=True)
    assert torch.isfinite(ref_out).all()

    mem = compress(x, gates, pad, dropped_as)
    n_kept = ((gates != 0) & ~pad).sum(1)
    assert mem.memory.size(0) == 1 + int(n_kept.max())
    assert (mem.memory[0] == 0).all()
    ours.log_count = mem.log_count
    out, attn = ours(query, mem.memory, mem.memory, key_padding_mask=mem.padding_mask, static_kv=True)
    ours.log_count = None
    assert torch.allclose(out, ref_out, atol=1e-5), (out - ref_out).abs().max()
    full = expand_attention(attn, mem.kept_index, mem.pruned)
    assert full.shape == ref_attn.shape
    assert torch.allclose(full, ref_attn, atol=1e-6), (full - ref_attn).abs().max()
    assert torch.allclose(full.sum(-1), torch.ones(B, 5), atol=1e-5)


@pytest.mark.parametrize("dropped_as", ["zero", "mask"])
def test_compressed_memory_layout(dropped_as):
    x, gates, pad = gate_case("left_padding")
    mem = compress(x, gates, pad, dropped_as)
    for i in range(x.size(1)):
        kept = [t for t in range(x.size(0)) if not pad[i, t] and gates[i, t] != 0]
        dropped = [t for t in range(x.size(0)) if not pad[i, t] and gates[i, t] == 0]
        n = len(kept)
        # kept states in original order, then padding
        assert mem.kept_index[i, 1:1 + n].tolist() == kept
        assert torch.equal(mem.memory[1:1 + n, i], x[kept, i])
        assert mem.padding_mask[i, 1:1 + n].tolist() == [False] * n
        assert all(mem.padding_mask[i, 1 + n:].tolist())
        assert mem.pruned[i].nonzero().view(-1).tolist() == dropped
        if dropped_as == "zero":
            count = len(dropped)
        else:
            count = 1 if n == 0 else 0
        assert bool(mem.padding_mask[i, 0]) == (count == 0)
        if count:
            assert mem.log_count[i, 0].item() == pytest.approx(math.log(count))
        assert (mem.log_count[i, 1:] == 0).all()


def test_expand_attention_by_hand():
    # sentence 0: source of 5, positions 1 and 3 kept, 0, 2, 4 pruned; sentence 1: 0..2 kept, nothing pruned
    attn = torch.tensor([[[0.3, 0.5, 0.2, 0.0]], [[0.0, 0.1, 0.6, 0.3]]])
    kept_index = torch.tensor([[0, 1, 3, 0], [0, 0, 1, 2]])
    pruned = torch.tensor([[True, False, True, False, True], [False, False, False, False, False]])
    full = expand_attention(attn, kept_index, pruned)
    assert torch.allclose(full[0, 0], torch.tensor([0.1, 0.5, 0.1, 0.2, 0.1]))
    assert torch.allclose(full[1, 0], torch.tensor([0.1, 0.6, 0.3, 0.0, 0.0]))


@pytest.mark.parametrize("dropped_as", ["zero", "mask"])
def test_incremental_shared_memory_with_reorder(dropped_as):
    """Decoding: one memory row per sentence for beam hypotheses, cached keys/values and log counts,
    reordered when sentences finish; equals fairseq attention over the beam-expanded full memory."""
    beam = 3
    ref, ours = attention_pair(seed=1)
    x, gates, pad = gate_case("mixed", seed=2)
    B = x.size(1)
    full_mask = full_mask_by_hand(gates, pad, dropped_as)
    mem = compress(x, gates, pad, dropped_as)
    ours.set_beam_size(beam)
    inc = {}
    g = torch.Generator().manual_seed(3)
    q1 = torch.randn(1, B * beam, C, generator=g)
    ours.log_count = mem.log_count
    out1, attn1 = ours(q1, mem.memory, mem.memory, key_padding_mask=mem.padding_mask, incremental_state=inc,
                       static_kv=True)
    ours.log_count = None
    xe = x.repeat_interleave(beam, 1)
    ref1, ref_attn1 = ref(q1, xe, xe, key_padding_mask=full_mask.repeat_interleave(beam, 0), static_kv=True)
    assert torch.allclose(out1, ref1, atol=1e-5)
    rows = mem.kept_index.repeat_interleave(beam, 0), mem.pruned.repeat_interleave(beam, 0)
    assert torch.allclose(expand_attention(attn1, *rows), ref_attn1, atol=1e-6)

    # sentences 1 and 3 finish; the others' hypotheses are permuted within their beams
    survivors = [0, 2, 4]
    new_order = torch.tensor([s * beam + k for s in survivors for k in (2, 0, 1)])
    ours.reorder_incremental_state(inc, new_order)
    q2 = torch.randn(1, len(survivors) * beam, C, generator=g)
    # the decoder passes the stale memory again; the cache must win
    out2, _ = ours(q2, mem.memory, mem.memory, key_padding_mask=mem.padding_mask, incremental_state=inc,
                   static_kv=True)
    xs = x[:, survivors].repeat_interleave(beam, 1)
    ref2, _ = ref(q2, xs, xs, key_padding_mask=full_mask[survivors].repeat_interleave(beam, 0), static_kv=True)
    assert torch.allclose(out2, ref2, atol=1e-5)


# --- --l0drop-between-layers: how the gated layers' penalties combine ---


def l0drop_penalties(model, seed=0):
    """{module name: recorded penalty} of one training forward pass on a fixed batch."""

    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 24, (3, 6), generator=g)
    model.train()
    torch.manual_seed(seed)
    model(src, torch.full((3,), 6), torch.randint(4, 24, (3, 5), generator=g))
    names = [m.name for m in model.modules() if isinstance(m, L0Drop)]
    terms = [t for t in collect_sparsity_terms(model) if t.group == "l0drop"]
    return dict(zip(names, (t.penalty.item() for t in terms)))


def test_between_layers_penalty_is_the_layer_mean_by_default():
    """Summed, the 3 gated layers' penalties make one lambda act about 3 times as strongly as the
    single gate's; the default averages them, so lambda keeps its single-gate meaning."""
    mean_model, args = build_l0drop_model("--l0drop-between-layers")
    assert args.l0drop_layer_penalty == "mean"
    sum_model, _ = build_l0drop_model("--l0drop-between-layers", "--l0drop-layer-penalty", "sum")
    mean, summed = l0drop_penalties(mean_model), l0drop_penalties(sum_model)
    assert sorted(mean) == sorted(summed) == ["l0drop", "l0drop_layer1", "l0drop_layer2"]
    for name in summed:
        assert 0.1 < summed[name] < 1.0  # b = 0: half-open gates, a per-sentence share of states
        assert mean[name] == pytest.approx(summed[name] / 3, rel=1e-6)
    # w = 0, b = 0, no padding: the first gated layer's unscaled penalty is P(g != 0) at log alpha 0, the
    # single gate's penalty (not scaled by either choice)
    assert summed["l0drop_layer1"] == pytest.approx(p_open_by_hand(0.0), rel=1e-5)
    single, _ = build_l0drop_model()
    assert l0drop_penalties(single) == pytest.approx({"l0drop": p_open_by_hand(0.0)}, rel=1e-5)


def test_layer_penalty_option_filled_in_and_checked():
    from fairseq_sparse.models.transformer_l0drop import L0DropTransformerModel

    _, args = build_l0drop_model()
    del args.l0drop_layer_penalty  # a checkpoint written before the option
    L0DropTransformerModel.fill_defaults(args)
    assert args.l0drop_layer_penalty == "mean"
    L0DropTransformerModel.check_args(args)
    for name, value, message in (("l0drop_layer_penalty", "max", "--l0drop-layer-penalty must be one of"),
                                 ("l0drop_init_bias", math.nan, "--l0drop-init-bias must be a finite number"),
                                 ("l0drop_beta", math.inf, "--l0drop-beta, --l0drop-gamma, --l0drop-zeta")):
        bad = copy.copy(args)
        setattr(bad, name, value)
        with pytest.raises(ValueError, match=message):
            L0DropTransformerModel.check_args(bad)


# --- --l0drop-between-layers in evaluation: the compacted encoder equals the gated one ---


def encoder_rows_seen(model, src, lengths):
    """The encoder output and the number of rows each encoder layer ran over."""
    rows, hooks = [], [layer.register_forward_pre_hook(lambda m, args: rows.append(args[0].size(0)))
                       for layer in model.encoder.layers]
    try:
        with torch.no_grad():  # the entry point of fairseq's generators, where the encoder is compacted
            out = model.encoder.forward_torchscript({"src_tokens": src, "src_lengths": lengths})
    finally:
        for h in hooks:
            h.remove()
    stats = {k: v for t in collect_sparsity_terms(model) for k, v in t.stats.items()}
    return out, rows, {k: (int(n), int(d)) for k, (n, d) in stats.items() if k.endswith("sparsity")}


def gated_between_layers_model(*extra):
    """An eval-mode transformer_l0drop with gates between the encoder layers, each gate a random direction with
    bias -3 (a quarter to a half of the states close at each gate); and the generator, to draw more from."""
    model, _ = build_l0drop_model("--l0drop-between-layers", *extra)
    model.eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for gate in list(model.encoder.layer_l0drops) + [model.encoder.l0drop]:
            gate.log_alpha_proj.weight.copy_(torch.randn(gate.log_alpha_proj.weight.shape, generator=g))
            gate.log_alpha_proj.bias.fill_(-3.0)
    return model, g


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dropped_as", ["zero", "mask"])
@pytest.mark.parametrize("normalize_before", [False, True])
def test_compacted_encoder_equals_the_gated_one(dropped_as, normalize_before, device):
    """Zhang, Titov & Sennrich (2021) Sec. 6 made physical: states dropped after layer k leave layers k+1..;
    the memory, its counts, the gates at the original positions, the sparsity statistics and the decoder's
    output equal those of the uncompacted gated encoder (3 layers: two compactions compose)."""
    model, g = gated_between_layers_model("--l0drop-dropped-as", dropped_as,
                                          *(["--encoder-normalize-before"] if normalize_before else []))
    src, lengths = mixed_length_batch()
    prev = torch.randint(4, 24, (src.size(0), 5), generator=g)
    model, src, lengths, prev = model.to(device), src.to(device), lengths.to(device), prev.to(device)
    out, rows, stats = encoder_rows_seen(model, src, lengths)
    with torch.no_grad():
        dec = model.decoder(prev, encoder_out=out)[0]
    model.encoder.compact_encoder = False
    ref, ref_rows, ref_stats = encoder_rows_seen(model, src, lengths)
    with torch.no_grad():
        ref_dec = model.decoder(prev, encoder_out=ref)[0]
    assert ref_rows == [12, 12, 12] and rows[0] == 12 and rows[2] < rows[1] < 12  # really compacted, twice
    assert stats == ref_stats and stats["l0drop_layer1_sparsity"][0] > 0
    gates = out["l0drop_gates"][0]
    assert torch.allclose(gates, ref["l0drop_gates"][0], atol=1e-6)
    assert 0 < int((gates == 0).sum() - (src == 1).sum()) < int(lengths.sum())  # some kept, some dropped
    for key in ("encoder_padding_mask", "l0drop_kept_index", "l0drop_pruned"):
        assert torch.equal(out[key][0], ref[key][0]), key
    for key in ("encoder_out", "l0drop_log_count"):
        assert torch.allclose(out[key][0], ref[key][0], atol=1e-5), key
    assert torch.allclose(dec, ref_dec, atol=1e-5)


def test_a_deep_copy_gates_and_compacts_with_its_own_modules():
    """copy.deepcopy (fairseq's --ema, torch's quantize_dynamic) of an encoder with between-layer gates: the
    copy's layer hooks read the copy's gates and compaction state, not the original's."""
    import copy

    model, _ = gated_between_layers_model()
    src, lengths = mixed_length_batch()
    twin = copy.deepcopy(model)
    out, rows, _ = encoder_rows_seen(model, src, lengths)
    twin_out, twin_rows, _ = encoder_rows_seen(twin, src, lengths)
    assert twin_rows == rows and rows[2] < rows[1] < 12  # the copy compacts as the original does
    assert torch.allclose(twin_out["encoder_out"][0], out["encoder_out"][0], atol=1e-6)
    with torch.no_grad():
        twin.encoder.layer_l0drops[0].log_alpha_proj.bias.fill_(20.0)  # the copy's first gate opens
    _, twin_rows, _ = encoder_rows_seen(twin, src, lengths)
    assert twin_rows[1] == 12 and encoder_rows_seen(model, src, lengths)[1] == rows  # the original keeps its own


def test_an_open_gate_adds_no_row():
    """A between-layer gate that closes nothing (trained models keep early layers whole) leaves the rows
    alone: no dummy row is added; a later gate that closes states still compacts, exactly."""
    model, _ = build_l0drop_model("--l0drop-between-layers")
    model.eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.encoder.layer_l0drops[0].log_alpha_proj.bias.fill_(20.0)  # w = 0: every state kept
        gate = model.encoder.layer_l0drops[1].log_alpha_proj
        gate.weight.copy_(torch.randn(gate.weight.shape, generator=g))
        gate.bias.fill_(-6.0)
    src, lengths = mixed_length_batch()
    out, rows, stats = encoder_rows_seen(model, src, lengths)
    model.encoder.compact_encoder = False
    ref, _, ref_stats = encoder_rows_seen(model, src, lengths)
    assert rows[0] == rows[1] == 12 and rows[2] < 12 and stats == ref_stats
    assert torch.allclose(out["encoder_out"][0], ref["encoder_out"][0], atol=1e-5)
    assert torch.equal(out["l0drop_kept_index"][0], ref["l0drop_kept_index"][0])


def test_compacted_encoder_counts_the_dummy_in_self_attention():
    """Without the dummy's log count in the later layers' self-attention, 'zero' would not be exact:
    the check above fails if the count is dropped (guards the test against passing by accident)."""
    model, _ = build_l0drop_model("--l0drop-between-layers")
    model.eval()
    with torch.no_grad():
        w = model.encoder.layer_l0drops[0].log_alpha_proj.weight
        w.copy_(torch.randn(w.shape, generator=torch.Generator().manual_seed(0)))
    src, lengths = mixed_length_batch()
    out, _, _ = encoder_rows_seen(model, src, lengths)
    model.encoder.compact_encoder = False
    ref, _, _ = encoder_rows_seen(model, src, lengths)
    assert torch.allclose(out["encoder_out"][0], ref["encoder_out"][0], atol=1e-5)
    original = CountAwareAttention.forward_with_log_count

    def forget_the_counts(self, log_count, *args, **kwargs):
        return original(self, None if log_count is None else torch.zeros_like(log_count), *args, **kwargs)

    CountAwareAttention.forward_with_log_count = forget_the_counts
    try:
        model.encoder.compact_encoder = True
        broken, _, _ = encoder_rows_seen(model, src, lengths)
    finally:
        CountAwareAttention.forward_with_log_count = original
    assert not torch.allclose(broken["encoder_out"][0], ref["encoder_out"][0], atol=1e-3)


def test_int8_keeps_the_gates_float32_and_prunes_the_same_states():
    """fairseq_sparse.export.quantise_int8 (fairseq-sparse-export --int8, fairseq_sparse/benchmarks/composed.py's *_int8):
    every Linear int8 but the L0Drop gates' projections; on this batch the int8 model closes the float model's
    states (its gates read the int8 layers' outputs, so states near a closing point could flip)."""
    from torch import nn

    from fairseq_sparse.export import quantise_int8

    model, _ = gated_between_layers_model()
    src, lengths = mixed_length_batch()
    out, rows, _ = encoder_rows_seen(model, src, lengths)
    int8 = quantise_int8(model)
    gates = [gate.log_alpha_proj for gate in list(int8.encoder.layer_l0drops) + [int8.encoder.l0drop]]
    assert all(type(p) is nn.Linear for p in gates)  # float32, not quantised
    assert type(int8.encoder.layers[0].fc1) is not nn.Linear and type(int8.decoder.layers[0].fc1) is not nn.Linear
    int8_out, int8_rows, _ = encoder_rows_seen(int8, src, lengths)
    assert int8_rows == rows
    assert torch.equal(int8_out["l0drop_gates"][0] == 0, out["l0drop_gates"][0] == 0)


def test_a_block_of_decoding_is_counted_apart_and_in_the_process_line():
    """DECODING_STATS.counting(): one block's sparsity rate (the hub's generate in a program), the process's
    counts (its line at exit) still holding it; decodings outside the block are not in it."""
    from fairseq_sparse.models.l0drop_encoder import DECODING_STATS

    model, _ = build_l0drop_model()
    model.eval()
    with torch.no_grad():  # log alpha = x.w: some gates closed, some open
        model.encoder.l0drop.log_alpha_proj.weight.normal_(0, 3.0, generator=torch.Generator().manual_seed(0))
    src, lengths = mixed_length_batch()
    before = (DECODING_STATS.sentences, DECODING_STATS.src_tokens, DECODING_STATS.pruned)
    with torch.no_grad():
        with DECODING_STATS.counting() as block:
            out = model.encoder.forward_torchscript({"src_tokens": src, "src_lengths": lengths})
        model.encoder.forward_torchscript({"src_tokens": src, "src_lengths": lengths})  # after the block
    gates = out["l0drop_gates"][0]
    pruned = int(((gates == 0) & src.ne(1)).sum())
    assert (block.sentences, block.src_tokens, block.pruned) == (6, int(lengths.sum()), pruned)
    assert 0 < pruned < int(lengths.sum())  # gates half open: some states pruned, not all
    assert block.line().startswith(f"L0Drop sparsity rate {100 * pruned / int(lengths.sum()):.2f}% ")
    assert (DECODING_STATS.sentences, DECODING_STATS.src_tokens, DECODING_STATS.pruned) == (
        before[0] + 12, before[1] + 2 * int(lengths.sum()), before[2] + 2 * pruned)
    assert DECODING_STATS.blocks == [] and not block.blocks
