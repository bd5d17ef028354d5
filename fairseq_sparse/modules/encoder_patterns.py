"""Rule-based sparsity patterns on the encoder outputs (Zhang, Titov & Sennrich 2021, Sec. 7 and Table 2).

Instead of learnt L0Drop gates, a fixed rule says which source states the decoder never sees; the model is
fine-tuned with the rule and decodes through the same compressed memory (Algorithm 1). Gates are 0 (dropped)
or 1 (kept); padding is 0 and EOS is always kept.

* ``pos``: drop the states of function words, punctuation, MD and EX and of every subword piece but a word's
  first (BPEO) (the paper's "easy-to-prune types", 46.4% of the WMT14 En-De source side). The tags travel
  with the data: the task ``translation_source_tags`` gives the encoder one tag id per source piece
  (``src_tags``; :func:`.token_tags.tag_id`), pieces continue a word when the
  previous one ends with the BPE marker;
* ``freq``: drop the ``top_k`` most frequent source tokens (the paper: the top 100 words, 46.3% of the
  WMT14 En-De source tokens);
* ``inv-freq``: drop the tokens whose frequency rank is ``min_rank`` or beyond (the paper: ranks from 452,
  ~40% of the tokens), the rare ones;
* ``group``: keep only every ``every``-th position (the paper: the odd positions, ``every`` 2, 50%).

``whole_words`` (freq, inv-freq): a piece is dropped only when every piece of its word is (no word split between
kept and dropped pieces); the share dropped is then below the rate's, which counts pieces.

Frequencies and ranks come from the counts of the fairseq dictionary (``dict.<src>.txt``; with
``--joined-dictionary`` they count both sides of the training data). A ``rate`` instead of ``top_k`` /
``min_rank`` / ``every`` picks the setting whose dropped share of the counted tokens is closest to it.
"""
import math
from typing import Optional, Sequence

import torch
from torch import Tensor

from .sparsity import SparsityModule, SparsityTerm
from .token_tags import FUNCTION, PENN_TAGS, PUNCT, tag_id, tag_type

PATTERNS = ("none", "pos", "freq", "inv-freq", "group")
#: subword-nmt's continuation marker: a piece ending with it continues into the next (the POS pattern's BPEO)
BPE_MARKER = "@@"
#: why a POS-pattern model cannot read raw sentences (fairseq-interactive, the hub interface)
UNTAGGED_INPUT = ("--encoder-output-pattern pos reads the part-of-speech tags of a binarised split ({split}.tags of "
                  "--task translation_source_tags); raw sentences (fairseq-interactive, the hub interface) carry no "
                  "tags: decode a split with fairseq-generate DATA --task translation_source_tags --gen-subset SPLIT")
#: the POS pattern's dropped tags (Zhang, Titov & Sennrich 2021 Sec. 7: function words, punctuation, MD, EX)
POS_DROPPED_TAGS = tuple(t for t in PENN_TAGS if tag_type(t) in (FUNCTION, PUNCT) or t in ("MD", "EX"))


def encoder_inputs(encoder, net_input) -> dict:
    """The keyword inputs of ``encoder`` for a fairseq batch's ``net_input`` besides src_tokens: src_lengths, and
    the source tags of --task translation_source_tags for an encoder that reads them (the POS pattern)."""
    extra = {"src_lengths": net_input["src_lengths"]}
    if getattr(encoder, "reads_source_tags", False) and net_input.get("src_tags") is not None:
        extra["src_tags"] = net_input["src_tags"]
    return extra


def frequency_ranks(counts: Sequence[int], nspecial: int) -> list:
    """The ids of the dictionary's non-special symbols, most frequent first (ties by id)."""
    ids = range(nspecial, len(counts))
    return sorted(ids, key=lambda i: (-counts[i], i))


def setting_for_rate(kind: str, counts: Sequence[int], nspecial: int, rate: float) -> int:
    """``top_k`` (freq), ``min_rank`` (inv-freq) or ``every`` (group) whose dropped share is closest to RATE:
    for freq / inv-freq the share of the counted tokens, for group 1 - 1/every."""
    if kind == "group":
        return max(1, round(1.0 / (1.0 - rate))) if rate < 1 else 1
    ranked = [counts[i] for i in frequency_ranks(counts, nspecial)]
    total = float(sum(ranked)) or 1.0
    best, best_gap, covered = 0, rate, 0.0
    for k, c in enumerate(ranked, start=1):  # share of the k most frequent tokens
        covered += c
        share = covered / total if kind == "freq" else 1.0 - (covered - c) / total  # inv-freq: ranks >= k
        gap = abs(share - rate)
        if gap < best_gap:
            best, best_gap = k, gap
    if kind == "freq":
        return best
    return best if best else len(ranked) + 1  # inv-freq: the first dropped rank (1-based); beyond all: none


class EncoderOutputPattern(SparsityModule):
    """Gates (B x T, 0 or 1) of a rule-based pattern; see the module docstring. It has no penalty; it reports
    its sparsity rate under L0Drop's name (``l0drop_sparsity``), so logs read the same."""

    penalty_group = "l0drop"

    def __init__(self, kind: str, counts: Sequence[int], nspecial: int, eos: int, top_k: Optional[int] = None,
                 min_rank: Optional[int] = None, every: Optional[int] = None, rate: Optional[float] = None,
                 symbols: Optional[Sequence[str]] = None, bpe_marker: str = BPE_MARKER, whole_words: bool = False):
        super().__init__()
        if kind not in PATTERNS or kind == "none":
            raise ValueError(f"unknown encoder output pattern {kind!r}; one of {', '.join(PATTERNS[1:])}")
        if rate is not None and not (math.isfinite(rate) and 0 <= rate < 1):
            raise ValueError(f"--encoder-output-pattern-rate must lie in [0, 1), got {rate}")
        if whole_words and (kind not in ("freq", "inv-freq") or symbols is None):
            raise ValueError("whole words apply to the freq and inv-freq patterns and need the dictionary's symbols")
        self.kind, self.eos, self.whole_words = kind, eos, whole_words
        self.untagged_input = UNTAGGED_INPUT  # an attribute: TorchScript reads no global string
        # every kind holds every table (empty where unused) so that forward compiles under TorchScript
        # (fairseq-sparse-export); not saved in checkpoints
        for name in ("continues", "dropped_tags", "dropped"):
            self.register_buffer(name, torch.zeros(0, dtype=torch.bool), persistent=False)
        if kind == "pos":
            if symbols is None or rate is not None:
                raise ValueError("the POS pattern needs the dictionary's symbols and takes no rate")
            self.setting = 0
            self.register_buffer("continues", torch.tensor([s.endswith(bpe_marker) for s in symbols]),
                                 persistent=False)
            dropped_tags = torch.zeros(len(PENN_TAGS) + 2, dtype=torch.bool)
            dropped_tags[torch.tensor([tag_id(t) for t in POS_DROPPED_TAGS])] = True
            self.register_buffer("dropped_tags", dropped_tags, persistent=False)
            return
        setting = {"freq": top_k, "inv-freq": min_rank, "group": every}[kind]
        if rate is not None:
            setting = setting_for_rate(kind, counts, nspecial, rate)
        if setting is None or setting < (0 if kind == "freq" else 1):
            raise ValueError(f"encoder output pattern {kind}: give its setting or a rate")
        self.setting = int(setting)
        dropped = torch.zeros(len(counts), dtype=torch.bool)
        if kind != "group":
            ranked = frequency_ranks(counts, nspecial)
            chosen = ranked[:self.setting] if kind == "freq" else ranked[self.setting - 1:]
            dropped[torch.as_tensor(chosen, dtype=torch.long)] = True
        self.register_buffer("dropped", dropped, persistent=False)
        if whole_words:
            self.register_buffer("continues", torch.tensor([s.endswith(bpe_marker) for s in symbols]),
                                 persistent=False)

    def dropped_share(self, counts: Sequence[int]) -> Optional[float]:
        """The share of the counted tokens this pattern drops (freq, inv-freq), 1 - 1/every (group), None (pos:
        it depends on the tags)."""
        if self.kind == "pos":
            return None
        if self.kind == "group":
            return 1.0 - 1.0 / self.setting
        total = float(sum(counts)) or 1.0
        return float(sum(c for c, d in zip(counts, self.dropped.tolist()) if d)) / total

    def forward(self, src_tokens: Tensor, padding_mask: Optional[Tensor], src_tags: Optional[Tensor] = None) -> Tensor:
        """Gates for ``src_tokens`` (B x T); ``padding_mask`` True at padding (left or right); ``src_tags`` (B x T
        tag ids) for the POS pattern."""
        real = torch.ones_like(src_tokens, dtype=torch.bool) if padding_mask is None else ~padding_mask
        if self.kind == "pos":
            if src_tags is None or src_tags.shape != src_tokens.shape:
                raise ValueError(self.untagged_input)
            tags = src_tags.clamp(0, self.dropped_tags.numel() - 1)
            keep = ~(self.dropped_tags.to(src_tokens.device)[tags] | self.later_pieces(src_tokens))
        elif self.kind == "group":
            position = real.long().cumsum(1) - 1  # 0-based position among the real tokens (left padding too)
            keep = position.remainder(self.setting) == 0
        else:
            keep = ~self.dropped.to(src_tokens.device)[src_tokens]
            if self.whole_words:  # a piece goes only with its whole word: kept where any piece of its word is kept
                word = (~self.later_pieces(src_tokens)).long().cumsum(1) - 1  # 0-based word index of every piece
                kept_words = torch.zeros_like(word).scatter_reduce(1, word, (keep & real).long(), reduce="amax",
                                                                   include_self=True)
                keep = kept_words.gather(1, word) > 0
        keep = (keep | src_tokens.eq(self.eos)) & real
        return keep.float()

    def later_pieces(self, src_tokens: Tensor) -> Tensor:
        """B x T: whether each piece continues a word (the previous piece ends with the BPE marker)."""
        continues = self.continues.to(src_tokens.device)[src_tokens]
        later = torch.zeros_like(continues)
        later[:, 1:] = continues[:, :-1]
        return later

    def record_rate(self, gates: Tensor, padding_mask: Optional[Tensor]):
        """Report the share of real source tokens dropped (a statistic for the logs; no penalty)."""
        real = torch.ones_like(gates, dtype=torch.bool) if padding_mask is None else ~padding_mask
        tokens = real.sum().detach()
        self.record(SparsityTerm(group=self.penalty_group, penalty=None,
                                 stats={"l0drop_sparsity": ((real & (gates == 0)).sum().detach(), tokens)}))

    def extra_repr(self) -> str:
        if self.kind == "pos":
            return "pos, drops " + " ".join(POS_DROPPED_TAGS) + " and non-initial subword pieces"
        name = {"freq": "top_k", "inv-freq": "min_rank", "group": "every"}[self.kind]
        return f"{self.kind}, {name}={self.setting}" + (", whole words" if self.whole_words else "")
