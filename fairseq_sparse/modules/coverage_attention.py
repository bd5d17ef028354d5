"""Encoder-decoder attention with a coverage model: the NMT+Coverage baseline of Zhang, Zhao, Li & Zong 2019
(Sec. V, Eqs. 21-22), after Tu et al.'s (2016) neural coverage.

Every source position j of a sentence carries a coverage vector C_j (``--encdec-coverage-dim`` numbers,
C_0 = 0). At target step i the attention logits of each head h get a coverage term (Eq. 21; the Transformer's
dot-product logits take the place of the paper's additive ones):

    e_hij = q_hi . k_hj / sqrt(d) + w_h . C_{i-1,j}

and after the softmax the coverage is updated by a GRU (Eq. 22, "f(.) a nonlinear activation function"; Tu
et al.'s neural coverage):

    C_ij = GRU(C_{i-1,j}, x_ij),   x_ij = [alpha_1ij .. alpha_Hij] A + z_i Z + h_j U

with z_i the decoder state (the attention's query) and h_j the encoder state (its key). w starts at 0, so
fine-tuning a converged model starts from that model. Each decoder layer has its own coverage.

Coverage makes target steps depend on each other, so a full-sequence pass (training, scoring) loops over the
target positions; incremental decoding caches C (and h_j U) per hypothesis and reorders them with the beams.
Over L0Drop's compressed memory (:class:`CountAwareAttention`) the counted dummy of c pruned states tracks
the coverage of one of them: its weight is divided by c before the update, so pruned decoding stays exact.
"""
from typing import Dict, Optional

import torch
from torch import Tensor, nn

from .count_attention import CountAwareAttention

#: Tu et al. 2016 use 10-dimensional neural coverage
DEFAULT_COVERAGE_DIM = 10


class Coverage(nn.Module):
    """The coverage model of one attention layer: the logit term of Eq. 21 and the GRU update of Eq. 22 (module
    docstring). Its parameters take their initial values when a checkpoint without them is loaded."""

    def __init__(self, heads: int, query_dim: int, key_dim: int, dim: int = DEFAULT_COVERAGE_DIM):
        super().__init__()
        if dim < 1:
            raise ValueError(f"coverage dimension must be >= 1, got {dim}")
        self.dim = dim
        gates = 3 * dim  # GRU: reset, update, new (PyTorch's order)
        self.from_weights = nn.Linear(heads, gates)  # A (and the GRU's input bias)
        self.from_query = nn.Linear(query_dim, gates, bias=False)  # Z
        self.from_key = nn.Linear(key_dim, gates, bias=False)  # U
        self.recurrent = nn.Linear(dim, gates)  # the GRU's hidden-to-hidden map
        self.logit = nn.Linear(dim, heads, bias=False)  # w_h, Eq. 21
        nn.init.zeros_(self.logit.weight)

    def extra_repr(self):
        return f"dim={self.dim}"

    def logit_bias(self, coverage: Tensor) -> Tensor:
        """Eq. 21's term w_h . C_j: [B, S, dc] -> [B, H, S]."""
        return self.logit(coverage).transpose(1, 2)

    def update(self, coverage: Tensor, weights: Tensor, query_part: Tensor, key_part: Tensor) -> Tensor:
        """Eq. 22, one target step: C [B, S, dc], weights [B, H, S], query part z_i Z [B, 3dc], key part h_j U
        [B, S, 3dc]."""
        x = self.from_weights(weights.transpose(1, 2)) + query_part.unsqueeze(1) + key_part
        x_r, x_z, x_n = x.chunk(3, dim=-1)
        h_r, h_z, h_n = self.recurrent(coverage).chunk(3, dim=-1)
        reset = torch.sigmoid(x_r + h_r)
        update = torch.sigmoid(x_z + h_z)
        new = torch.tanh(x_n + reset * h_n)
        return (1 - update) * new + update * coverage


class CoverageAttention(CountAwareAttention):
    """fairseq's encoder-decoder MultiheadAttention with a coverage model (see the module docstring)."""

    def __init__(self, *args, coverage_dim: int = DEFAULT_COVERAGE_DIM, **kwargs):
        super().__init__(*args, **kwargs)
        self.coverage = Coverage(self.num_heads, self.embed_dim, self.kdim, coverage_dim)

    def _coverage_state(self, incremental_state) -> Dict[str, Optional[Tensor]]:
        state = self.get_incremental_state(incremental_state, "coverage_state")
        return state if state is not None else {}

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        incremental_state = super().reorder_incremental_state(incremental_state, new_order)
        state = self._coverage_state(incremental_state)
        if state:  # one row per hypothesis, whatever fairseq does with the (shared) key cache
            state = {k: v.index_select(0, new_order) for k, v in state.items()}
            incremental_state = self.set_incremental_state(incremental_state, "coverage_state", state)
        return incremental_state

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None, need_weights=True,
                static_kv=False, attn_mask=None, before_softmax=False, need_head_weights=False):
        if before_softmax:
            raise NotImplementedError("coverage attention computes its weights itself (before_softmax)")
        tgt_len, bsz, _ = query.size()
        log_count = self.log_count_for_call(query, key, incremental_state)
        logits, v = self.forward_with_log_count(log_count, query, key, value, key_padding_mask=key_padding_mask,
                                                incremental_state=incremental_state, need_weights=False,
                                                static_kv=True, attn_mask=attn_mask, before_softmax=True)
        src_len = logits.size(-1)
        logits = logits.view(bsz, self.num_heads, tgt_len, src_len)
        state = self._coverage_state(incremental_state) if incremental_state is not None else {}
        if "coverage" in state:
            coverage, key_part = state["coverage"], state["key_part"]
        else:  # first step, or a full-sequence pass: key is the encoder output [S, kv_bsz, d]
            key_part = self.coverage.from_key(key.transpose(0, 1))
            key_part = key_part.repeat_interleave(bsz // key_part.size(0), dim=0)
            coverage = key_part.new_zeros(bsz, src_len, self.coverage.dim)
        # a counted dummy stands for c pruned states: its weight / c is the weight of each of them
        per_state = None
        if log_count is not None:  # log c >= 0; -inf (an absent state, weight 0) counts as 1
            per_state = torch.exp(-log_count.float()).clamp(max=1.0)
            per_state = per_state.repeat_interleave(bsz // per_state.size(0), dim=0).unsqueeze(1)
        query_part = self.coverage.from_query(query)  # [T, B, 3dc]
        steps = []
        for i in range(tgt_len):
            bias = self.coverage.logit_bias(coverage)
            weights = torch.softmax(logits[:, :, i].float() + bias.float(), dim=-1)  # source pads: -inf
            steps.append(weights)
            counted = weights if per_state is None else weights * per_state
            coverage = self.coverage.update(coverage, counted.type_as(coverage), query_part[i], key_part)
        if incremental_state is not None:
            self.set_incremental_state(incremental_state, "coverage_state",
                                       {"coverage": coverage, "key_part": key_part})
        weights = torch.stack(steps, dim=2).view(bsz * self.num_heads, tgt_len, src_len)
        return self.attend(weights, v, tgt_len, bsz, need_weights, need_head_weights)
