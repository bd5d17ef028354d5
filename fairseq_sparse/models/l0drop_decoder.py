"""transformer_l0drop's decoder: count-aware encoder-decoder attention over the compressed memory (Zhang, Titov &
Sennrich 2021, Algorithm 1), attention weights mapped back to the source positions."""
from typing import Dict, List, Optional, Tuple

from torch import Tensor

from ..modules.count_attention import CountAwareAttention
from ..modules.decoder_layer import SublayerDecoderLayer
from ..modules.l0drop import expand_attention
from .sparse_transformer import SublayerTransformerDecoder


class CountAwareDecoderLayer(SublayerDecoderLayer):
    """fairseq's decoder layer (in the --decoder-sublayer-order / --simplified-decoder layout) with
    :class:`CountAwareAttention` as encoder-decoder attention for softmax; the other
    --encdec-attention-normaliser choices use NormalisedAttention, also a CountAwareAttention."""

    encdec_softmax_cls = CountAwareAttention


class L0DropTransformerDecoder(SublayerTransformerDecoder):
    """A decoder that reads the compressed memory: count-aware encoder-decoder attention, and attention
    weights mapped back to the original source positions for --print-alignment / --replace-unk."""

    layer_cls = CountAwareDecoderLayer
    #: its own incremental state (the attention map) is per sentence: the fixed-shape search leaves it in place
    fixed_shape_sentence_state = True

    def extract_features(self, prev_output_tokens: Tensor, encoder_out: Optional[Dict[str, List[Tensor]]] = None,
                         incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                         full_context_alignment: bool = False, alignment_layer: Optional[int] = None,
                         alignment_heads: Optional[int] = None):
        """fairseq's features with the memory's log counts handed to every encoder-decoder attention for this
        call (set again by every call; scriptable)."""
        log_count: Optional[Tensor] = None
        kept_index: Optional[Tensor] = None
        pruned: Optional[Tensor] = None
        if encoder_out is not None and "l0drop_log_count" in encoder_out:
            log_count = encoder_out["l0drop_log_count"][0]
            # cached at the first step, whether or not attention comes back (a headless layer)
            kept_index, pruned = self._attention_map(encoder_out, incremental_state, prev_output_tokens.size(0))
        self._set_log_count(log_count)
        x, extra = self.extract_features_scriptable(prev_output_tokens, encoder_out, incremental_state,
                                                    full_context_alignment,
                                                    self.alignment_layer_of_step(alignment_layer, incremental_state),
                                                    alignment_heads)
        self._set_log_count(None)
        attn = extra["attn"][0]
        if attn is not None and kept_index is not None and pruned is not None:
            rows = attn.size(0) // kept_index.size(0)  # hypotheses per sentence (shared memory)
            if rows > 1:
                kept_index, pruned = kept_index.repeat_interleave(rows, 0), pruned.repeat_interleave(rows, 0)
            expanded: List[Optional[Tensor]] = [expand_attention(attn, kept_index, pruned)]
            extra["attn"] = expanded
        return x, extra

    def _set_log_count(self, log_count: Optional[Tensor]):
        for layer in self.layers:
            # not None, nor a layer whose heads were all pruned. hasattr, not isinstance: under torch.jit.script,
            # isinstance matched only the first compiled shape of CountAwareAttention, so in layers with other head
            # counts the counts were silently left out (the exported model then decoded differently)
            if layer.encoder_attn is not None and hasattr(layer.encoder_attn, "log_count_for_call"):
                layer.encoder_attn.log_count = log_count

    def _attention_map(self, encoder_out: Dict[str, List[Tensor]],
                       incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
                       hypotheses: int) -> Tuple[Tensor, Tensor]:
        """(kept_index, pruned) of the memory, one row per sentence; cached in incremental decoding, with the
        hypotheses per sentence (``hypotheses`` rows at the first step / sentences)."""
        if incremental_state is not None:
            cached = self.get_incremental_state(incremental_state, "l0drop_map")
            if cached is not None:
                kept_index, pruned = cached["kept_index"], cached["pruned"]
                if kept_index is not None and pruned is not None:
                    return kept_index, pruned
        kept_index, pruned = encoder_out["l0drop_kept_index"][0], encoder_out["l0drop_pruned"][0]
        if incremental_state is not None:
            beam = kept_index.new_full((1,), max(1, hypotheses // max(1, kept_index.size(0))))
            state: Dict[str, Optional[Tensor]] = {"kept_index": kept_index, "pruned": pruned, "beam": beam}
            self.set_incremental_state(incremental_state, "l0drop_map", state)
        return kept_index, pruned

    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]],
                                  new_order: Tensor):
        """Keep the cached attention map in step with the generator: new_order lists the surviving
        hypotheses (sentence * beam + k); rows move only when sentences finish."""
        cached = self.get_incremental_state(incremental_state, "l0drop_map")
        if cached is None:
            return
        kept_index, pruned, beam_size = cached["kept_index"], cached["pruned"], cached["beam"]
        if kept_index is None or pruned is None or beam_size is None:
            return
        beam = int(beam_size.item())  # hypotheses per sentence, set at the first step
        if kept_index.size(0) * beam == new_order.size(0):
            return
        sentence_order = new_order.reshape(-1, beam)[:, 0] // beam
        state: Dict[str, Optional[Tensor]] = {"kept_index": kept_index.index_select(0, sentence_order),
                                              "pruned": pruned.index_select(0, sentence_order), "beam": beam_size}
        self.set_incremental_state(incremental_state, "l0drop_map", state)
