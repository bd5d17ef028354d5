"""Encoder-decoder attention over a compressed L0Drop memory (Algorithm 1, steps 2-3)."""
from typing import Optional

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor


class CountAwareAttention(MultiheadAttention):
    """fairseq's MultiheadAttention with two additions for encoder-decoder attention:

    * a per-key additive logit bias ``log_count`` (B x S, set by the decoder before each call):
      softmax over e_i + log c_i equals c_i exp(e_i) / sum_j c_j exp(e_j), the count-aware softmax of
      Algorithm 1. It is cached with the keys in incremental decoding and reordered with them.
    * beam-shared keys only in incremental decoding: ``set_beam_size`` (called by SequenceGenerator)
      makes the key/value cache hold one copy per sentence, as in fairseq's BART; full-sequence
      passes (training, validation, scoring) always have one row per sentence.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log_count: Optional[Tensor] = None
        self.decoding_beam_size = 1
        self._call_bias: Optional[Tensor] = None

    def set_beam_size(self, beam_size):
        self.decoding_beam_size = beam_size

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None, **kwargs):
        self.beam_size = self.decoding_beam_size if incremental_state is not None else 1
        bias = self.log_count
        if incremental_state is not None:
            saved = self._get_input_buffer(incremental_state)
            if "prev_log_count" in saved:
                bias = saved["prev_log_count"]
            elif bias is not None:
                if self.beam_size > 1 and bias.size(0) == query.size(1):
                    bias = bias[:: self.beam_size]  # the keys are reduced the same way
                saved["prev_log_count"] = bias
                self._set_input_buffer(incremental_state, saved)
        self._call_bias = bias
        try:
            return super().forward(query, key, value, key_padding_mask=key_padding_mask,
                                   incremental_state=incremental_state, **kwargs)
        finally:
            self._call_bias = None

    def apply_sparse_mask(self, attn_weights: Tensor, tgt_len: int, src_len: int, bsz: int):
        bias = self._call_bias
        if bias is None:
            return attn_weights
        rows = bias.size(0)  # one per query row, or one per sentence with beam-shared keys
        biased = attn_weights.view(rows, -1, self.num_heads, tgt_len, src_len) + bias.to(
            attn_weights.dtype
        ).view(rows, 1, 1, 1, src_len)
        return biased.view(bsz * self.num_heads, tgt_len, src_len)
