"""Decoder state of fixed shape for a beam search that keeps its rows (fairseq_sparse/search/fixed_shape_search.py).

fairseq's MultiheadAttention keeps a decoder self-attention's keys and values in a cache that grows by ``torch.cat``
at every step, and fairseq's decoder embeds the step's position from the length of the target prefix it is given:
both change shapes at every step, which a CUDA graph cannot replay. Here:

* :class:`StaticCacheSelfAttention`: the keys and values sit in buffers preallocated to the maximum length (rows x
  heads x length x head_dim) and are written at the step's position, a tensor (``index_copy_``); the attention
  reads the first ``static_length`` positions, those after the step masked. Same arithmetic as fairseq's forward for
  one query (projections, scaling, fp32 softmax, out_proj called as a module, so head gates and masks apply).
* :func:`step_positions`: the decoder's positional embedding of the step tensor, for a decoder given only the
  step's token (fairseq's own rule: position = padding_idx + 1 + step, learned or sinusoidal).

Both are switched on for one ``generate`` call and put back afterwards (:func:`static_self_attention`,
:func:`step_positions`); training, scoring and fairseq's own generators see fairseq's modules unchanged.
"""
from contextlib import contextmanager
from typing import Dict, List, Optional

import torch
from fairseq import utils
from fairseq.modules import LearnedPositionalEmbedding, MultiheadAttention, SinusoidalPositionalEmbedding
from torch import Tensor


class StaticCacheSelfAttention(MultiheadAttention):
    """fairseq's MultiheadAttention as a decoder self-attention with preallocated keys and values (module docstring):
    in the incremental state ``static_key`` / ``static_value`` (rows x heads x capacity x head_dim), ``static_padding``
    (rows x capacity, target pads) and ``static_positions`` (0 .. capacity - 1); it writes position ``static_step``
    (a one-element long tensor) and attends over the first ``static_length`` positions. Without those buffers
    (training, scoring) it is fairseq's forward."""

    static_step: Optional[Tensor] = None
    static_length: int = 0
    static_beam: int = 0  # > 0: beam reorder by an ancestry table, no copy (:meth:`_indirect`)

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False):
        saved = self._get_input_buffer(incremental_state) if incremental_state is not None else {}
        keys, values = saved.get("static_key"), saved.get("static_value")
        step = self.static_step
        if keys is None or values is None or step is None or query.size(0) != 1 or attn_mask is not None \
                or before_softmax:
            return super().forward(query, key, value, key_padding_mask=key_padding_mask,
                                   incremental_state=incremental_state, need_weights=need_weights,
                                   static_kv=static_kv, attn_mask=attn_mask, before_softmax=before_softmax,
                                   need_head_weights=need_head_weights)
        padding, positions = saved["static_padding"], saved["static_positions"]
        rows, heads, head_dim, length = query.size(1), self.num_heads, self.head_dim, self.static_length
        q = self.q_proj(query)
        q *= self.scaling
        if self.static_beam:
            return self._indirect(query, q, saved, step, key_padding_mask)
        keys.index_copy_(2, step, self.k_proj(query).view(rows, heads, 1, head_dim))
        values.index_copy_(2, step, self.v_proj(query).view(rows, heads, 1, head_dim))
        if key_padding_mask is not None:  # fairseq appends the step's mask to the earlier ones
            padding.index_copy_(1, step, key_padding_mask[:, -1:].to(torch.bool))
        q = q.contiguous().view(rows * heads, 1, head_dim)
        k = keys[:, :, :length].reshape(rows * heads, length, head_dim)  # a view of the buffer, no copy
        v = values[:, :, :length].reshape(rows * heads, length, head_dim)
        weights = self.apply_sparse_mask(torch.bmm(q, k.transpose(1, 2)), 1, length, rows)
        hidden = padding[:, :length] | positions[:length].gt(step).unsqueeze(0)  # pads, and positions not written
        weights = weights.view(rows, heads, 1, length).masked_fill(hidden.view(rows, 1, 1, length), float("-inf"))
        weights = weights.view(rows * heads, 1, length)
        probs = self.dropout_module(utils.softmax(weights, dim=-1, onnx_trace=self.onnx_trace).type_as(weights))
        attn = torch.bmm(probs, v).view(rows, heads * head_dim).unsqueeze(0)
        return self.out_proj(attn), None

    def _indirect(self, query: Tensor, q: Tensor, saved: Dict[str, Optional[Tensor]], step: Tensor,
                  key_padding_mask: Optional[Tensor]):
        """One step with the keys and values where they were written: buffer row (sentence, slot) holds what that
        row computed at each step, never moved, and ``static_ancestry`` (rows x capacity) names the slot of its
        sentence holding each position of a hypothesis (a reorder copies that table, not the buffers). Each query
        attends over all ``beam`` slots x capacity positions of its sentence (one matrix product per sentence and
        head, the buffers laid out sentences x heads x slots x capacity x head_dim), every position not of its own
        history masked: fairseq's attention over the hypothesis' own keys, beam times the products and none of
        the copies (the cache indirection of TensorRT-LLM's beam search, in dense products)."""
        keys, values, padding = saved["static_key"], saved["static_value"], saved["static_padding"]
        ancestry, slots, positions = saved["static_ancestry"], saved["static_slot"], saved["static_positions"]
        assert keys is not None and values is not None and padding is not None and ancestry is not None
        assert slots is not None and positions is not None
        sentences, heads, beam, capacity, head_dim = keys.shape
        rows = sentences * beam
        by_sentence = (sentences, beam, heads, head_dim)
        keys.index_copy_(3, step, self.k_proj(query).view(by_sentence).transpose(1, 2).unsqueeze(3))
        values.index_copy_(3, step, self.v_proj(query).view(by_sentence).transpose(1, 2).unsqueeze(3))
        ancestry.index_copy_(1, step, slots.unsqueeze(1))  # the step's position is the row's own
        if key_padding_mask is not None:  # written by the row that computed the position, as the keys
            padding.index_copy_(1, step, key_padding_mask[:, -1:].to(torch.bool))
        q = q.view(by_sentence).transpose(1, 2).reshape(sentences * heads, beam, head_dim)
        weights = torch.bmm(q, keys.view(sentences * heads, beam * capacity, head_dim).transpose(1, 2))
        own = ancestry.view(sentences, beam, 1, capacity) == slots[:beam].view(1, 1, beam, 1)
        seen = ~padding.view(sentences, 1, beam, capacity) & positions.le(step).view(1, 1, 1, capacity)
        hidden = ~(own & seen).view(sentences, 1, beam, beam * capacity)
        weights = weights.view(sentences, heads, beam, beam * capacity).masked_fill(hidden, float("-inf"))
        weights = weights.view(sentences * heads, beam, beam * capacity)
        probs = self.dropout_module(utils.softmax(weights, dim=-1, onnx_trace=self.onnx_trace).type_as(weights))
        attn = torch.bmm(probs, values.view(sentences * heads, beam * capacity, head_dim))
        return self.out_proj(attn.view(sentences, heads, beam, head_dim).transpose(1, 2).reshape(1, rows, -1)), None

    def reorder_static(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], order: Tensor):
        """The first ``static_length`` positions of the buffers to the hypotheses' new order, in place (with
        ``static_beam``: the ancestry table only, the buffers stay where they are)."""
        saved = self._get_input_buffer(incremental_state)
        if self.static_beam:
            ancestry = saved["static_ancestry"]
            ancestry.copy_(ancestry.index_select(0, order))
            return
        for name, dim in (("static_key", 2), ("static_value", 2), ("static_padding", 1)):
            part = saved[name].narrow(dim, 0, self.static_length)
            part.copy_(part.index_select(0, order))


def cacheable(attention) -> bool:
    """Whether a decoder self-attention can keep its keys and values in :class:`StaticCacheSelfAttention`'s buffers:
    fairseq's plain MultiheadAttention (pruned heads, head gates and masks included), no bias_kv, zero_attn or
    xformers."""
    return (type(attention) is MultiheadAttention and attention.self_attention and attention.bias_k is None
            and not attention.add_zero_attn and not getattr(attention, "use_xformers", False))


@contextmanager
def static_self_attention(decoders, incremental_states, rows: int, capacity: int, zeroed: bool = True,
                          beam: int = 0):
    """For one ``generate`` call: each cacheable decoder self-attention (:func:`cacheable`) becomes a
    :class:`StaticCacheSelfAttention` with buffers for ``rows`` hypotheses and ``capacity`` steps in its decoder's
    incremental state; its class is put back afterwards. Yields those modules. ``zeroed`` False: keys and values are
    allocated, not zeroed, for steps that read only the positions written (a step over the whole buffers reads all:
    a weight of 0 times a NaN left in memory is NaN). ``beam`` > 0: beams reorder through an ancestry table
    (:meth:`StaticCacheSelfAttention._indirect`; every step reads the whole buffers, so they are zeroed)."""
    swapped: List[MultiheadAttention] = []
    try:
        for decoder, state in zip(decoders, incremental_states):
            for layer in getattr(decoder, "layers", None) or []:
                attention = getattr(layer, "self_attn", None)
                if not cacheable(attention):
                    continue
                weight = attention.k_proj.weight
                shape = (rows, attention.num_heads, capacity, attention.head_dim)
                new = torch.zeros if zeroed or beam else torch.empty
                indirect = {}
                if beam:
                    shape = (rows // beam, attention.num_heads, beam, capacity, attention.head_dim)
                    slots = torch.arange(rows, device=weight.device) % beam
                    indirect = {"static_slot": slots, "static_ancestry": slots.unsqueeze(1).repeat(1, capacity)}
                attention.__class__ = StaticCacheSelfAttention
                attention.static_beam = beam
                swapped.append(attention)
                attention._set_input_buffer(state, {
                    "static_key": new(shape, dtype=weight.dtype, device=weight.device),
                    "static_value": new(shape, dtype=weight.dtype, device=weight.device),
                    "static_padding": torch.zeros(rows, capacity, dtype=torch.bool, device=weight.device),
                    "static_positions": torch.arange(capacity, device=weight.device), **indirect})
        yield swapped
    finally:
        for attention in swapped:
            attention.__class__ = MultiheadAttention
            for name in ("static_step", "static_length", "static_beam"):
                attention.__dict__.pop(name, None)


def why_no_step_positions(decoder, capacity: int) -> Optional[str]:
    """None if :func:`step_positions` can embed this decoder's positions of ``capacity`` steps from a step tensor,
    else why not."""
    positions = getattr(decoder, "embed_positions", "absent")
    if positions is None:
        return None
    if type(positions) is SinusoidalPositionalEmbedding:
        table = positions.weights
    elif type(positions) is LearnedPositionalEmbedding and positions.padding_idx is not None \
            and positions.max_norm is None:
        table = positions.weight
    else:
        return f"its positional embedding ({type(positions).__name__}) is not fairseq's learned or sinusoidal one"
    if positions.padding_idx + capacity >= table.size(0):
        return f"its positional embedding has {table.size(0)} rows, fewer than {capacity} steps need"
    return None


@contextmanager
def step_positions(decoders, capacity: int):
    """For one ``generate`` call: each decoder's positional embedding gives the position of its ``static_step`` (a
    one-element long tensor the search sets before each step; the step's token is at position padding_idx + 1 +
    step, as fairseq's incremental rule puts it) for whatever target it is given. Yields the modules changed.
    Refused (ValueError) where :func:`why_no_step_positions` says why."""
    changed = []
    try:
        for decoder in decoders:
            reason = why_no_step_positions(decoder, capacity)
            if reason:
                raise ValueError(reason)
            module = decoder.embed_positions
            if module is None:
                continue

            def forward(input, incremental_state=None, timestep=None, positions=None, module=module):
                table = module.weights if isinstance(module, SinusoidalPositionalEmbedding) else module.weight
                row = table.index_select(0, module.static_step + (module.padding_idx + 1))
                return row.view(1, 1, -1).expand(input.size(0), 1, -1)

            module.forward = forward
            changed.append(module)
        yield changed
    finally:
        for module in changed:
            del module.forward
            module.__dict__.pop("static_step", None)
            module.__dict__.pop("static_length", None)
