"""The content probe (fairseq_sparse/analysis/content_probe.py): its read-out against the formula written out, and
on synthetic memories whose kept states do or do not hold the pruned pieces, the probe above or at its floor."""
import torch

from fairseq_sparse.analysis.content_probe import ContentProbe, probe_content


def test_the_read_out_is_the_formula_written_out():
    torch.manual_seed(0)
    probe = ContentProbe(dim=6, vocab=11, max_offset=2, hidden=5)
    for p in probe.parameters():
        torch.nn.init.normal_(p)
    states = torch.randn(1, 5, 6)
    kept = torch.tensor([[True, False, True, False, True]])
    pruned = ~kept
    got = probe(states, kept, pruned)
    want = []
    for i in (1, 3):
        js = [0, 2, 4]
        off = [max(-2, min(2, j - i)) + 2 for j in js]
        keys = torch.stack([probe.key(states[0, j]) + probe.offset_key.weight[o] for j, o in zip(js, off)])
        values = torch.stack([probe.value(states[0, j]) + probe.offset_value.weight[o] for j, o in zip(js, off)])
        a = torch.softmax(keys @ probe.query, 0)
        want.append(torch.log_softmax(probe.out(torch.tanh(a @ values)), -1))
    torch.testing.assert_close(got, torch.stack(want), atol=1e-5, rtol=1e-5)


def synthetic(carry: bool, n=240, vocab=12, dim=16, seed=0):
    """Sentences of 6 pieces, every second pruned; each kept state is its piece's embedding or (CARRY) the embedding
    of the pruned piece after it: a memory that routed the pruned content into its left neighbour."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab, dim, generator=g)
    out = []
    for _ in range(n):
        pieces = torch.randint(0, vocab, (6,), generator=g)
        kept = torch.tensor([True, False] * 3)
        emb = table[pieces]
        states = emb.clone()
        if carry:
            states[kept] = emb[~kept]
        out.append((states, kept, pieces, emb))
    return out


def test_the_probe_finds_routed_content_and_not_absent_content():
    routed = probe_content(synthetic(carry=True), vocab=12, epochs=30, batch_size=16, lr=1e-2)
    assert routed["states"]["accuracy"] > 0.8 and routed["gain_bits"] > 1.5
    absent = probe_content(synthetic(carry=False), vocab=12, epochs=30, batch_size=16, lr=1e-2)
    assert absent["states"]["accuracy"] < 0.3 and abs(absent["gain_bits"]) < 0.3  # pieces drawn at random: chance


def test_nothing_pruned_is_refused():
    sentences = [(s, torch.ones_like(k), p, e) for s, k, p, e in synthetic(carry=True, n=10)]
    try:
        probe_content(sentences, vocab=12)
    except ValueError as e:
        assert "pruned source pieces" in str(e)
    else:
        raise AssertionError("a probe with nothing to recover ran")
