"""--no-repeat-ngram-size with the plugin loaded (fairseq_sparse/patches/ngram_block.py): fairseq's CUDA kernel's rule in
tensors, where fairseq's own Python path, handed the whole token buffer, blocked nothing (fairseq issues 4709, 5206)."""
import itertools

import pytest
import torch
from fairseq.ngram_repeat_block import NGramRepeatBlock

from fairseq_sparse.patches.ngram_block import FAIRSEQ_NO_REPEAT_NGRAM, block_repeated_ngrams

PAD = 1


def blocked(tokens, step, n, vocab=10):
    lprobs = torch.zeros(tokens.size(0), vocab)
    block_repeated_ngrams(tokens, lprobs, torch.tensor([step]), n)
    return [sorted(torch.nonzero(row.isinf()).view(-1).tolist()) for row in lprobs]


def test_the_rule_by_hand():
    t = torch.tensor([[2, 5, 6, 5, 6, PAD, PAD, PAD]])  # position 0: the first token fed (EOS as BOS)
    assert blocked(t, 3, 2) == [[6]]  # ... 5: the bigram (5, 6) was seen, so 6 may not follow
    assert blocked(t, 3, 3) == [[]]  # ... 6 5: no earlier (6, 5)
    assert blocked(t, 4, 3) == [[5]]  # ... 5 6: (5, 6) at positions 1-2 was followed by 5
    assert blocked(t, 4, 2) == [[5]]  # ... 6: (6, 5) seen
    assert blocked(t, 1, 3) == [[]]  # fewer than n tokens: nothing to repeat
    assert blocked(t, 2, 1) == [[2, 5, 6]]  # n = 1: every token so far, the first one too (the kernel's rule)
    assert blocked(t, 4, 0) == [[]] and blocked(t[:, :2], 1, 3) == [[]]  # off; a buffer shorter than n


def test_equals_fairseqs_python_path_given_the_hypotheses_up_to_the_step():
    """Handed the buffer up to the step, fairseq's Python path applies its kernel's rule; handed the whole buffer, as
    SequenceGenerator hands it, it blocked nothing. Ours, handed the whole buffer, blocks what the rule says."""
    g = torch.Generator().manual_seed(0)
    rows, length, vocab = 12, 14, 9
    tokens = torch.randint(4, 8, (rows, length), generator=g)  # four symbols: many repeats
    tokens[:, 0] = 2
    fairseq = NGramRepeatBlock(2, use_extension=False)
    # (n = 1: the Python path's "last n - 1 tokens", tokens[-0:], is the whole list, so it blocks nothing even so; the
    # kernel, and this plugin, block every token so far: test_the_rule_by_hand)
    for n, step in itertools.product((2, 3, 4), range(length - 2)):
        fairseq.no_repeat_ngram_size = n
        buffer = tokens.clone()
        buffer[:, step + 1:] = PAD
        lprobs = torch.randn(rows, vocab, generator=g)
        want = FAIRSEQ_NO_REPEAT_NGRAM(fairseq, buffer[:, :step + 1], lprobs.clone(), rows, 1, step)
        got = block_repeated_ngrams(buffer, lprobs.clone(), torch.tensor([step]), n)
        assert torch.equal(got, want), (n, step)
        if n == 2 and step == 8:
            assert want.isinf().any()  # the case blocks something
            untouched = FAIRSEQ_NO_REPEAT_NGRAM(fairseq, buffer, lprobs.clone(), rows, 1, step)
            assert torch.equal(untouched, lprobs)  # fairseq's path as SequenceGenerator calls it: nothing blocked
    # the plugin's NGramRepeatBlock, as SequenceGenerator calls it (the whole buffer)
    fairseq.no_repeat_ngram_size = 2
    lprobs = torch.randn(rows, vocab, generator=g)
    want = block_repeated_ngrams(tokens, lprobs.clone(), torch.tensor([8]), 2)
    assert torch.equal(fairseq(tokens, lprobs.clone(), rows, 1, 8), want)
    scripted = torch.jit.script(NGramRepeatBlock(2, use_extension=False))  # the TorchScript export's path
    assert torch.equal(scripted(tokens, lprobs.clone(), rows, 1, 8), want)


@pytest.mark.parametrize("n", [0, 2, 3])
def test_fairseqs_beam_search_on_the_cpu_repeats_no_ngram(n):
    from fairseq.sequence_generator import SequenceGenerator

    from helpers.models import build_l0drop_model, mixed_length_batch

    model, _ = build_l0drop_model("--l0drop-init-bias", "3")
    model.eval()
    src, lengths = mixed_length_batch()

    class Dict:  # what SequenceGenerator reads of the target dictionary
        def __init__(self):
            self.symbols = [str(i) for i in range(24)]

        def pad(self): return 1

        def unk(self): return 3

        def eos(self): return 2

        def bos(self): return 0

        def __len__(self): return 24

    gen = SequenceGenerator([model], Dict(), beam_size=4, max_len_b=30, min_len=30, no_repeat_ngram_size=n)
    with torch.no_grad():
        hyps = [h["tokens"].tolist() for sentence in gen.generate([model], {"net_input": {
            "src_tokens": src, "src_lengths": lengths}}) for h in sentence]
    size = n or 2
    repeats = sum(len(h) - size + 1 - len({tuple(h[i:i + size]) for i in range(len(h) - size + 1)}) for h in hyps)
    if n:
        assert repeats == 0  # (the EOS at the end is forced at max length; min_len keeps it from coming earlier)
    else:
        assert repeats > 0  # a random model repeats: the test could fail without the blocker
