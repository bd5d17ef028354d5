"""One encoder memory per sentence in beam search, for fairseq's own ``transformer`` (exact).

In fairseq's SequenceGenerator the encoder output is expanded to one copy per hypothesis, and at every decoding
step the generator copies it again (``reorder_encoder_out``) and every decoder layer copies its cached
encoder-decoder keys and values (``reorder_incremental_state``): 1 + 2 x layers copies of B x beam x N x C
numbers per step, although the hypotheses of a sentence all read the same memory. Fairseq's BART avoids the copies
with its "beamable" encoder-decoder attention (``MultiheadAttention.set_beam_size``, fairseq commit 806855bf):
the encoder output keeps one row per sentence and the cached keys and values too. Fairseq computes that attention
with ``torch.einsum`` over all hypotheses of a sentence at once, a different matrix product than the one the
expanded memory gets, so scores move in the last bits (about 1e-7 on CPU) and a near tie can flip a hypothesis.

:class:`SharedMemoryAttention` keeps the memory per sentence and multiplies each hypothesis slot of the beam
separately (one ``torch.bmm`` per slot, over sentences x heads), the same product per query row as the stock
attention makes over the expanded memory, so the scores are bit-identical on the CPU (what the tests check).
:func:`share_encoder_memory` switches a loaded stock model over in place: its encoder-decoder attention modules
get this class (same parameters, nothing added), its encoder fairseq's own no-copy ``_reorder_encoder_out`` (as
BART's ``set_beam_size`` does), its decoder the option to leave out the beam attention nothing reads
(:mod:`.beam_attention`, left out in fairseq-generate without --print-alignment). Anything but the generators'
incremental step goes through fairseq's forward unchanged (training, scoring, the full-context pass of
``--print-alignment``).
"""
from typing import Dict, List, Optional

import torch
from fairseq import utils
from fairseq.models.transformer import (
    TransformerDecoder,
    TransformerDecoderBase,
    TransformerEncoder,
    TransformerEncoderBase,
    TransformerModel,
    TransformerModelBase,
)
from fairseq.modules import MultiheadAttention, TransformerDecoderLayer
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from torch import Tensor

from ..modules.beam_attention import add_beam_attention_option

MODELS = (TransformerModel, TransformerModelBase)  # every --arch transformer* preset; not subclasses (the plugin's)
ENCODERS = (TransformerEncoder, TransformerEncoderBase)
DECODERS = (TransformerDecoder, TransformerDecoderBase)
DECODER_LAYERS = (TransformerDecoderLayer, TransformerDecoderLayerBase)


class SharedMemoryAttention(MultiheadAttention):
    """fairseq's MultiheadAttention for encoder-decoder attention; in incremental decoding the memory (and the cached
    keys, values and padding mask, in fairseq's own cache format) has one row per sentence, read by the
    ``hypotheses`` query rows of that sentence (set at the first step from query rows / memory rows)."""

    #: the fixed-shape search leaves its incremental state (the sentence's memory) in the sentence's rows
    #: (search/fixed_shape_search.py); read from this class's own body: a subclass says it again, or is reordered
    fixed_shape_sentence_memory = True
    hypotheses: int = 1

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False):
        if incremental_state is None or not static_kv or attn_mask is not None or before_softmax:
            return super().forward(query, key, value, key_padding_mask=key_padding_mask,
                                   incremental_state=incremental_state, need_weights=need_weights,
                                   static_kv=static_kv, attn_mask=attn_mask, before_softmax=before_softmax,
                                   need_head_weights=need_head_weights)
        tgt_len, bsz, _ = query.size()
        heads, head_dim = self.num_heads, self.head_dim
        k, v, key_padding_mask = self._sentence_memory(key, key_padding_mask, incremental_state, bsz)
        sentences, src_len = k.size(0), k.size(2)
        beam = bsz // sentences
        assert beam * sentences == bsz, (bsz, sentences)
        k = k.view(sentences * heads, src_len, head_dim)
        v = v.view(sentences * heads, src_len, head_dim)

        q = self.q_proj(query)
        q *= self.scaling
        q = q.contiguous().view(tgt_len, bsz * heads, head_dim).transpose(0, 1)
        attn_weights = self._per_slot(q, k.transpose(1, 2), sentences, beam)  # bsz * H x T x S
        attn_weights = self.apply_sparse_mask(attn_weights, tgt_len, src_len, bsz)
        if key_padding_mask is not None:
            attn_weights = attn_weights.view(sentences, beam, heads, tgt_len, src_len).masked_fill(
                key_padding_mask.view(sentences, 1, 1, 1, src_len).to(torch.bool), float("-inf"))
            attn_weights = attn_weights.view(bsz * heads, tgt_len, src_len)
        attn_weights_float = utils.softmax(attn_weights, dim=-1, onnx_trace=self.onnx_trace)
        attn_probs = self.dropout_module(attn_weights_float.type_as(attn_weights))
        attn = self._per_slot(attn_probs, v, sentences, beam)  # bsz * H x T x head_dim
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, self.embed_dim)
        attn = self.out_proj(attn)
        weights: Optional[Tensor] = None
        if need_weights or need_head_weights:
            weights = attn_weights_float.view(bsz, heads, tgt_len, src_len).transpose(1, 0)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return attn, weights

    def _sentence_memory(self, key: Optional[Tensor], key_padding_mask: Optional[Tensor],
                         incremental_state: Dict[str, Dict[str, Optional[Tensor]]], bsz: int):
        """(keys, values, key padding mask) of the memory, one row per sentence (sentences x H x S x head_dim): the
        cached ones, else (the first step) projected from the encoder output ``key`` and cached."""
        heads, head_dim = self.num_heads, self.head_dim
        saved = self._get_input_buffer(incremental_state)
        if "prev_key" in saved:  # cached at the first step: one row per sentence
            k, v = saved["prev_key"], saved["prev_value"]
            assert k is not None and v is not None
            return k, v, saved.get("prev_key_padding_mask")
        assert key is not None, "the first decoding step needs the encoder output"
        src_len, sentences = key.size(0), key.size(1)
        if bsz % sentences:
            raise ValueError(f"shared encoder memory: {bsz} query rows for {sentences} memory rows")
        self.hypotheses = bsz // sentences
        k = self.k_proj(key).contiguous().view(src_len, sentences, heads, head_dim).permute(1, 2, 0, 3)
        v = self.v_proj(key).contiguous().view(src_len, sentences, heads, head_dim).permute(1, 2, 0, 3)
        k, v = k.contiguous(), v.contiguous()
        key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
            key_padding_mask, None, sentences, src_len, static_kv=True)
        saved.update(prev_key=k, prev_value=v, prev_key_padding_mask=key_padding_mask)
        self._set_input_buffer(incremental_state, saved)
        return k, v, key_padding_mask

    def _per_slot(self, a: Tensor, b: Tensor, sentences: int, beam: int) -> Tensor:
        """bmm(a, b) with a: (sentences * beam * H) x T x X over the hypotheses, b: (sentences * H) x X x Y over the
        sentences: one bmm per beam slot, each the product the stock attention makes for those rows."""
        if beam == 1:
            return torch.bmm(a, b)
        heads, t, x, y = self.num_heads, a.size(1), a.size(2), b.size(2)
        rows = a.view(sentences, beam, heads, t, x)
        out = [torch.bmm(rows[:, slot].reshape(sentences * heads, t, x), b).view(sentences, heads, t, y)
               for slot in range(beam)]
        return torch.stack(out, 1).view(sentences * beam * heads, t, y)

    def reorder_incremental_state(self, incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
                                  new_order: Tensor):
        """The cache has one row per sentence: it moves only when sentences leave the batch (new_order lists
        sentence * hypotheses + k for the surviving hypotheses, a sentence's hypotheses together)."""
        buffer = self._get_input_buffer(incremental_state)
        cached = buffer.get("prev_key")
        if cached is None:
            return super().reorder_incremental_state(incremental_state, new_order)
        beam = self.hypotheses
        if cached.size(0) * beam == new_order.numel():
            return incremental_state
        sentence_order = new_order.view(-1, beam)[:, 0] // beam
        for name, value in buffer.items():
            if value is not None:
                buffer[name] = value.index_select(0, sentence_order)
        return self._set_input_buffer(incremental_state, buffer)


def why_not_shareable(model) -> Optional[str]:
    """None if :func:`share_encoder_memory` can switch ``model`` over, else why not (one sentence)."""
    name = type(model).__name__
    encoder, decoder = getattr(model, "encoder", None), getattr(model, "decoder", None)
    if getattr(model, "shares_encoder_memory", False) or hasattr(encoder, "l0drop"):
        return f"the model ({name}) already keeps one encoder memory per sentence; decode it without this switch"
    if type(model) not in MODELS or type(encoder) not in ENCODERS or type(decoder) not in DECODERS:
        return (f"the model ({name}: {type(encoder).__name__}, {type(decoder).__name__}) is not fairseq's own "
                "transformer encoder-decoder")
    if getattr(decoder, "cross_self_attention", False):
        return "the model uses --cross-self-attention (the decoder's self-attention reads the encoder output)"
    layers = list(decoder.layers)
    if any(type(layer) not in DECODER_LAYERS for layer in layers):
        return f"the model's decoder layers are not fairseq's own ({type(layers[0]).__name__})"
    attns = [layer.encoder_attn for layer in layers]
    if all(a is None for a in attns):
        return "the model has no encoder-decoder attention (--no-cross-attention)"
    for a in attns:
        if a is None:
            continue
        if type(a) not in (MultiheadAttention, SharedMemoryAttention):
            return f"its encoder-decoder attention is {type(a).__name__}, not fairseq's MultiheadAttention"
        if a.bias_k is not None or a.add_zero_attn or getattr(a, "use_xformers", False):
            return "its encoder-decoder attention uses bias_kv, zero_attn or xformers"
    return None


def share_encoder_memory(model) -> None:
    """Switch a loaded stock transformer over to one encoder memory per sentence in beam search, in place (weights,
    parameter names and the checkpoint unchanged). Raises ValueError naming why a model cannot be switched."""
    reason = why_not_shareable(model)
    if reason:
        raise ValueError(reason)
    for layer in model.decoder.layers:
        if layer.encoder_attn is not None:
            layer.encoder_attn.__class__ = SharedMemoryAttention  # a subclass adding no parameter or buffer
    # fairseq's own no-copy reorder (what BART's set_beam_size installs): the memory keeps one row per sentence
    model.encoder.reorder_encoder_out = model.encoder._reorder_encoder_out
    # and no beam attention where fairseq-generate reads none (without --print-alignment; beam_attention.py)
    add_beam_attention_option(model.decoder)
    model.shares_encoder_memory = True


def memory_rows(encoder_out: Dict[str, List[Tensor]]) -> int:
    """Rows (sentences or hypotheses) of an encoder output: what a test reads to see that the memory is shared."""
    return encoder_out["encoder_out"][0].size(1)
