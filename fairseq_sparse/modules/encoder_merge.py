"""Merge instead of drop: each pruned encoder output folded into a kept one, so the kept states carry the dropped
states' content by construction, at exactly the kept count, compressed memory and decoding cost of dropping.

L0Drop (Zhang, Titov & Sennrich 2021) relies on the encoder's self-attention to route a dropped token's content
into the states that stay (their Sec. 6). Merging does it explicitly, as pooling does in compressed speech
translation (Gaido et al. 2021, CTC compression) and Token Merging does in vision (Bolya et al. 2023):

* groups: every real position i belongs to the nearest kept position at or to its left; positions before a
  sentence's first kept one belong to that first kept one. A kept position and the pruned ones that follow it
  form one group.
* ``mean``: the kept state becomes g_j * mean of its group's states h_i (before gating);
* ``attention``: g_j * sum_i softmax_i(h_i . w) h_i over the group, w learned (starts at 0, i.e. at the mean).

g_j is the kept state's gate (1 for a rule, the HardConcrete gate for learned gates, sampled in training), so
pruned states stay the zero vector (or masked) and Algorithm 1's compressed memory stays exact for the merged
states. In training the groups follow the sampled gates: the assignment is discrete, while the gradient reaches
every merged state, the scorer w and the kept gates' scale. A sentence with nothing kept merges nothing.
"""
from typing import Optional

import torch
from torch import Tensor, nn

MERGE_CHOICES = ("none", "mean", "attention")


def merge_groups(kept: Tensor) -> Tensor:
    """B x T: the kept position each position folds into (nearest kept at or to its left; before the first kept
    one, the first kept one; 0 where a sentence keeps nothing). ``kept``: B x T bool, padding False."""
    positions = torch.arange(kept.size(1), device=kept.device).expand_as(kept)
    left = torch.where(kept, positions, torch.full_like(positions, -1)).cummax(dim=1).values
    first = kept.long().argmax(dim=1, keepdim=True).expand_as(kept)  # 0 where nothing is kept
    return torch.where(left >= 0, left, first)


def merge_states(h: Tensor, gates: Tensor, padding_mask: Optional[Tensor], scores: Optional[Tensor] = None) -> Tensor:
    """The gated, merged states (T x B x C) of states ``h`` (T x B x C, not gated) under ``gates`` (B x T, 0 =
    pruned): row j = g_j * sum over j's group of w_i h_i, with w the softmax of ``scores`` (B x T) within the
    group, or uniform (the mean) without them. Pruned rows are 0 (g_j = 0)."""
    real = torch.ones_like(gates, dtype=torch.bool) if padding_mask is None else ~padding_mask
    kept = real & (gates != 0)
    groups = merge_groups(kept)
    if scores is None:
        weights = real.float()
    else:
        scores = scores.float().masked_fill(~real, -1e30)
        # a stable softmax within each group: its own maximum subtracted
        top = torch.full_like(scores, -1e30).scatter_reduce(1, groups, scores, reduce="amax", include_self=True)
        weights = torch.where(real, (scores - top.gather(1, groups)).exp(), torch.zeros_like(scores))
    totals = torch.zeros_like(weights).scatter_add_(1, groups, weights)
    weights = weights / totals.gather(1, groups).clamp(min=1e-30)
    hb = h.transpose(0, 1)  # B x T x C
    merged = torch.zeros_like(hb).scatter_add_(
        1, groups.unsqueeze(-1).expand_as(hb), hb * weights.unsqueeze(-1).to(hb.dtype))
    return (merged * gates.unsqueeze(-1).to(hb.dtype)).transpose(0, 1)


class EncoderOutputMerge(nn.Module):
    """--encoder-output-merge ``mean`` or ``attention`` (see the module docstring): ``forward(h, gates, pad)``
    returns the gated, merged encoder output that replaces ``h * gates``."""

    def __init__(self, kind: str, embed_dim: int):
        super().__init__()
        if kind not in MERGE_CHOICES or kind == "none":
            raise ValueError(f"--encoder-output-merge must be one of {', '.join(MERGE_CHOICES[1:])}, got {kind!r}")
        self.kind = kind
        self.score: Optional[nn.Linear] = None
        if kind == "attention":
            self.score = nn.Linear(embed_dim, 1, bias=False)
            nn.init.zeros_(self.score.weight)  # starts as the mean

    def forward(self, h: Tensor, gates: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        score = self.score
        scores = None if score is None else score(h).squeeze(-1).transpose(0, 1)
        return merge_states(h, gates, padding_mask, scores)

    def extra_repr(self) -> str:
        return self.kind
