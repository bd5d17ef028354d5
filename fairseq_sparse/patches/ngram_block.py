"""Make ``--no-repeat-ngram-size`` block repeated n-grams where fairseq runs it without its CUDA extension.

fairseq's SequenceGenerator hands ``NGramRepeatBlock`` the whole token buffer (batch x beam rows, the maximum length
+ 2 columns, padding after the step), and the blocker's Python path, used on the CPU and wherever fairseq's
``ngram_repeat_block_cuda`` extension is not built, takes the n-gram to check from the end of that buffer: padding,
which no earlier n-gram matches, so nothing is ever blocked (fairseq-fixed 0.12, as fairseq's main branch;
facebookresearch/fairseq issues 4709 and 5206). The CUDA kernel reads the buffer up to the step and blocks.
Importing the plugin gives the Python path the kernel's rule, in tensors: no host read, so the fixed-shape search
runs it inside a CUDA graph too. The kernel, where it is built, is left as it is.
"""
import math

import torch
from fairseq.ngram_repeat_block import NGramRepeatBlock
from torch import Tensor

from .switch import enabled


def block_repeated_ngrams(tokens: Tensor, lprobs: Tensor, step: Tensor, n: int) -> Tensor:
    """Set to -inf, in place, each row's log-probability of every token that would repeat an n-gram of the row.

    ``tokens``: rows x length, the hypotheses so far at positions 0 .. ``step`` (position 0 the first token fed,
    anything after the step ignored); ``lprobs``: rows x vocabulary, the next position's (``step`` + 1);
    ``step``: a one-element tensor (read on the device only). fairseq's rule (its CUDA kernel's): the last n - 1
    tokens, at positions step - n + 2 .. step, are compared with the n - 1 tokens at every j < step - n + 2, and
    where they are equal the token at j + n - 1 is blocked. Returns ``lprobs``."""
    if n < 1 or tokens.size(1) < n:
        return lprobs
    step = step.reshape(1)
    windows = tokens.unfold(1, n, 1)  # rows x (length - n + 1) x n: windows[:, j] = tokens[:, j:j + n]
    last = tokens.index_select(1, (step - n + 2 + torch.arange(n - 1, device=tokens.device)).clamp(min=0))
    match = (windows[:, :, :n - 1] == last.unsqueeze(1)).all(dim=2)
    match &= torch.arange(windows.size(1), device=tokens.device).lt(step - n + 2)
    hits = torch.zeros(lprobs.shape, dtype=torch.int32, device=lprobs.device)
    hits.scatter_add_(1, windows[:, :, n - 1], match.to(torch.int32))
    return lprobs.masked_fill_(hits > 0, -math.inf)


def _no_repeat_ngram(self, tokens, lprobs, bsz: int, beam_size: int, step: int):
    """``NGramRepeatBlock._no_repeat_ngram`` with fairseq's CUDA kernel's rule (:func:`block_repeated_ngrams`)."""
    return block_repeated_ngrams(tokens, lprobs, torch.tensor([step], device=tokens.device),
                                 self.no_repeat_ngram_size)


#: fairseq's own Python path, kept for the tests (given the hypotheses up to the step it applies the kernel's rule)
FAIRSEQ_NO_REPEAT_NGRAM = NGramRepeatBlock._no_repeat_ngram
if enabled("ngram_block"):
    NGramRepeatBlock._no_repeat_ngram = _no_repeat_ngram
