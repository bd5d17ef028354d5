"""Encoder-decoder attention over a compressed L0Drop memory (Algorithm 1, steps 2-3)."""
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor

from .scripting import parent_method


class CountAwareAttention(MultiheadAttention):
    """fairseq's MultiheadAttention, for encoder-decoder attention (and the self-attention of a compacted
    L0Drop encoder), with two additions:

    * a per-key additive logit bias ``log_count`` (B x S, set by the decoder before each call):
      softmax over e_i + log c_i equals c_i exp(e_i) / sum_j c_j exp(e_j), the count-aware softmax of
      Algorithm 1. In incremental decoding it is cached and reordered with the keys.
    * a memory shared by the hypotheses of a sentence in incremental decoding: the encoder does not
      expand its output over the beam (see ``L0DropTransformerEncoder.reorder_encoder_out``), so at the
      first step query rows / memory rows = hypotheses per sentence becomes fairseq's ``beam_size``
      and the key/value cache holds one copy per sentence (fairseq's beamable attention, as in BART).
      Full-sequence passes (training, validation, scoring) have one row per sentence.
    """

    #: the fixed-shape search leaves its incremental state (the sentence's memory) in the sentence's rows
    #: (search/fixed_shape_search.py); read from this class's own body: a subclass says it again, or is reordered
    fixed_shape_sentence_memory = True
    log_count: Optional[Tensor]  # declared for TorchScript (the decoder sets it before each call)
    _call_bias: Optional[Tensor]
    #: fairseq's MultiheadAttention.forward, unchanged, callable from TorchScript (modules/scripting.py)
    _fairseq_forward = parent_method(MultiheadAttention.forward, "_fairseq_forward", {"MultiheadAttention": {
        "_append_prev_key_padding_mask": MultiheadAttention._append_prev_key_padding_mask}})

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log_count = None
        self._call_bias = None

    def log_count_for_call(self, query: Tensor, key: Optional[Tensor],
                           incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]]) -> Optional[Tensor]:
        """The log counts of this call's keys (cached at the first decoding step); sets ``beam_size``."""
        bias = self.log_count
        if incremental_state is None:
            self.beam_size = 1
            return bias
        saved = self._get_input_buffer(incremental_state)
        if "prev_key" not in saved and key is not None:  # first decoding step
            self.beam_size = max(1, query.size(1) // key.size(1))
            if bias is not None:
                saved["prev_log_count"] = bias
                self._set_input_buffer(incremental_state, saved)
        return saved.get("prev_log_count")

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        log_count = self.log_count_for_call(query, key, incremental_state)
        return self.forward_with_log_count(log_count, query, key, value, key_padding_mask, incremental_state,
                                           need_weights, static_kv, attn_mask, before_softmax, need_head_weights)

    def forward_with_log_count(self, log_count: Optional[Tensor], query: Tensor, key: Optional[Tensor],
                               value: Optional[Tensor], key_padding_mask: Optional[Tensor] = None,
                               incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                               need_weights: bool = True, static_kv: bool = False,
                               attn_mask: Optional[Tensor] = None, before_softmax: bool = False,
                               need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """fairseq's forward with ``log_count`` (from :meth:`log_count_for_call`) added to the logits. The bias
        of the call is set before fairseq's forward and cleared after it (set again by every call, so an
        exception inside cannot leave a stale one behind for the next)."""
        if log_count is not None and self.self_attention:  # the compacted encoder (weights are not returned)
            return self.counted_self_attention(query, key_padding_mask, log_count, attn_mask), None
        self._call_bias = log_count  # encoder-decoder attention: fairseq's slow path, apply_sparse_mask adds it
        out = self._fairseq_forward(query, key, value, key_padding_mask, incremental_state, need_weights,
                                    static_kv, attn_mask, before_softmax, need_head_weights)
        self._call_bias = None
        return out

    def counted_self_attention(self, x: Tensor, key_padding_mask: Optional[Tensor], log_count: Tensor,
                               attn_mask: Optional[Tensor] = None) -> Tensor:
        """Self-attention over x (T x B x C) with log counts on the keys, through torch's fused
        scaled_dot_product_attention (the per-key bias is a broadcast mask, so nothing B x H x T x T is built
        beyond what the kernel needs): the compacted L0Drop encoder's layers, at the cost of fairseq's fast
        path. ``attn_mask``: fairseq's additive T x S float mask, if any."""
        T, B, _ = x.shape
        bias = log_count.to(x.dtype)
        if key_padding_mask is not None:
            bias = bias.masked_fill(key_padding_mask.to(torch.bool), float("-inf"))
        bias = bias[:, None, None, :] if attn_mask is None else bias[:, None, None, :] + attn_mask.to(x.dtype)
        q = self.q_proj(x).view(T, B, self.num_heads, self.head_dim).permute(1, 2, 0, 3)
        k = self.k_proj(x).view(T, B, self.num_heads, self.head_dim).permute(1, 2, 0, 3)
        v = self.v_proj(x).view(T, B, self.num_heads, self.head_dim).permute(1, 2, 0, 3)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                             dropout_p=self.dropout_module.p if self.training else 0.0)
        return self.out_proj(out.permute(2, 0, 1, 3).reshape(T, B, self.num_heads * self.head_dim))

    def apply_sparse_mask(self, attn_weights: Tensor, tgt_len: int, src_len: int, bsz: int):
        bias = self._call_bias
        if bias is None:
            return attn_weights
        rows = bias.size(0)  # one per query row, or one per sentence with a shared memory
        biased = attn_weights.view(rows, -1, self.num_heads, tgt_len, src_len) + bias.to(
            attn_weights.dtype
        ).view(rows, 1, 1, 1, src_len)
        return biased.view(bsz * self.num_heads, tgt_len, src_len)

    def attend(self, weights: Tensor, v: Tensor, tgt_len: int, bsz: int, need_weights: bool,
               need_head_weights: bool):
        """The rest of fairseq's attention for weights computed here ([bsz * H, T, S], float32) from the
        logits of ``forward(..., before_softmax=True)``: dropout, weighted values (over a memory shared
        by a sentence's hypotheses too), output projection; weights returned as fairseq does."""
        src_len = weights.size(-1)
        probs = self.dropout_module(weights.type_as(v))
        kv_bsz = v.size(0) // self.num_heads
        if self.encoder_decoder_attention and bsz != kv_bsz:  # memory shared by a sentence's hypotheses
            attn = torch.einsum(
                "bxhts,bhsd->bxhtd",
                probs.view((kv_bsz, -1, self.num_heads) + probs.size()[1:]),
                v.view((kv_bsz, self.num_heads) + v.size()[1:]),
            )
            attn = attn.reshape((-1,) + attn.size()[-2:])
        else:
            attn = torch.bmm(probs, v)
        assert list(attn.size()) == [bsz * self.num_heads, tgt_len, self.head_dim]
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, self.num_heads * self.head_dim)
        attn = self.out_proj(attn)
        attn_weights: Optional[Tensor] = None
        if need_weights or need_head_weights:
            attn_weights = weights.view(bsz, self.num_heads, tgt_len, src_len).transpose(1, 0)
            if not need_head_weights:
                attn_weights = attn_weights.mean(dim=0)
        return attn, attn_weights
