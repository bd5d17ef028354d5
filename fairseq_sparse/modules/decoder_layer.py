"""Decoder layers with a choice of sub-layer order and the simplified decoder (Yang et al. 2020).

Yang et al. 2020 Sec. 2.2 splits a decoder layer by function:

* TEM (target exploitation): self-attention and its Add&Norm, C = LN(SelfAtt(L) + L)
* SEM (source exploitation): the encoder-decoder attention alone, S = Att(C, K_enc, V_enc)
* IFM (information fusion): the rest: Add-Norm I = LN(S + C), FFN, Add-Norm II = LN(FFN(.) + .)

A layer here is a sequence of residual *blocks* (fairseq's own sub-layers, each with its dropout,
residual and LayerNorm; pre- or post-norm as ``--decoder-normalize-before`` says):

=================  ==========================  ===========================================
order              blocks                      Yang et al. 2020
=================  ==========================  ===========================================
``tem-sem-ifm``    self, cross, ffn            the standard decoder (Fig. 1)
``sem-tem-ifm``    cross, self, ffn            TEM and SEM swapped (Table 1)
``sem-ifm``        cross, ffn                  no self-attention (Table 1)
=================  ==========================  ===========================================

The *simplified decoder* (Sec. 3.3, Fig. 9b) drops the FFN block: the IFM is the one Add&Norm that
ends the last attention block, with no FFN and no second Add&Norm (and no FFN parameters).
The standard layout runs fairseq's own ``TransformerDecoderLayerBase.forward`` unchanged.

Every layer can record its module representations for the probing tool (``record = {}`` before a
forward pass): ``tem`` (self-attention block output), ``sem`` (encoder-attention output, before its
residual), ``addnorm1`` (output of the last attention block, the IFM's first Add&Norm), ``ffn`` (FFN
output, before its residual), ``addnorm2`` (FFN block output) and ``ifm`` (the layer output).
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from torch import Tensor
from torch.jit import Final

from .attention_normalisers import build_encdec_attention
from .options import fill_dataclass_defaults
from .scripting import parent_method

#: sub-layer order (Yang et al.'s (2020) names) -> residual blocks of a layer
SUBLAYER_ORDERS: Dict[str, Tuple[str, ...]] = {
    "tem-sem-ifm": ("self", "cross", "ffn"),
    "sem-tem-ifm": ("cross", "self", "ffn"),
    "sem-ifm": ("cross", "ffn"),
}
STANDARD_ORDER = "tem-sem-ifm"
STANDARD_BLOCKS = SUBLAYER_ORDERS[STANDARD_ORDER]

#: fairseq decoder-layer options that only the standard layout implements (fairseq's own forward)
_STANDARD_ONLY = ("cross_self_attention", "scale_attn", "scale_heads", "scale_fc", "scale_resids")


@dataclass
class DecoderLayoutConfig(FairseqDataclass):
    decoder_sublayer_order: ChoiceEnum(list(SUBLAYER_ORDERS)) = field(
        default=STANDARD_ORDER,
        metadata={"help": "order of the decoder sub-layers (Yang et al. 2020 Table 1): tem-sem-ifm (standard: "
                          "self-attention, encoder attention, FFN), sem-tem-ifm (encoder attention first), "
                          "sem-ifm (no self-attention)"},
    )
    simplified_decoder: bool = field(
        default=False,
        metadata={"help": "Yang et al.'s (2020) simplified decoder: the information-fusion module is one Add&Norm "
                          "(no FFN, no second Add&Norm, no FFN parameters) in every decoder layer. Default on "
                          "for transformer_simplified_decoder"},
    )


def decoder_layout_defaults(args, simplified: bool = False):
    """Fill in layout options missing from args (older checkpoints, architecture presets)."""
    fill_dataclass_defaults(args, DecoderLayoutConfig, simplified_decoder=simplified)


def decoder_blocks(order: Optional[str] = None, simplified: bool = False) -> Tuple[str, ...]:
    """The residual blocks of a decoder layer with this sub-layer order (see the module docstring)."""
    order = order or STANDARD_ORDER
    if order not in SUBLAYER_ORDERS:
        raise ValueError(f"--decoder-sublayer-order: unknown order {order!r}; choose from "
                         f"{', '.join(SUBLAYER_ORDERS)}")
    blocks = SUBLAYER_ORDERS[order]
    return tuple(b for b in blocks if b != "ffn") if simplified else blocks


def check_decoder_layout_args(args):
    """Validate before anything is built (bad input fails before training or decoding starts)."""
    blocks = decoder_blocks(getattr(args, "decoder_sublayer_order", None), bool(getattr(args, "simplified_decoder", False)))
    if blocks == STANDARD_BLOCKS:
        return
    used = [f"--{o.replace('_', '-')}" for o in _STANDARD_ONLY if getattr(args, o, False)]
    if used:
        raise ValueError(f"{' '.join(used)} only work with the standard decoder layout (--decoder-sublayer-order "
                         "tem-sem-ifm without --simplified-decoder)")
    if getattr(args, "no_cross_attention", False):
        raise ValueError("--decoder-sublayer-order / --simplified-decoder need the encoder-decoder attention "
                         "(SEM); they cannot be combined with --no-cross-attention")
    if "self" not in blocks and "dec" in [t.strip() for t in (getattr(args, "head_gates", None) or "").split(",")]:
        raise ValueError(f"--head-gates dec: --decoder-sublayer-order {args.decoder_sublayer_order} has no decoder "
                         "self-attention to gate")


class SublayerDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer with the sub-layer order and simplified IFM of ``cfg`` (plugin options
    ``decoder_sublayer_order``, ``simplified_decoder``) and ``encdec_softmax_cls`` as its encoder-decoder
    attention for softmax (other ``--encdec-attention-normaliser`` choices: :class:`NormalisedAttention`).

    Missing modules are not built: no ``fc1``/``fc2``/``final_layer_norm`` in a simplified layer, no
    ``self_attn``/``self_attn_layer_norm`` without TEM (attributes are None).

    Scriptable (``torch.jit.script``, fairseq-sparse-export): the standard layout calls fairseq's own forward
    under the name ``_fairseq_forward`` (TorchScript compiles no ``super()`` call), and ``standard`` is a
    TorchScript constant, so a layout without some sub-layers never compiles fairseq's forward (which reads
    them); the block loop reads each optional sub-layer through a local None check."""

    encdec_softmax_cls = MultiheadAttention
    #: fairseq's TransformerDecoderLayerBase.forward, unchanged, callable from TorchScript (modules/scripting.py)
    _fairseq_forward = parent_method(TransformerDecoderLayerBase.forward, "_fairseq_forward")
    standard: Final[bool]
    record: Optional[Dict[str, Tensor]]

    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        self.blocks = decoder_blocks(getattr(cfg, "decoder_sublayer_order", None),
                                     bool(getattr(cfg, "simplified_decoder", False)))
        super().__init__(cfg, no_encoder_attn, add_bias_kv, add_zero_attn)
        self.standard = self.blocks == STANDARD_BLOCKS
        self.block_list: List[str] = list(self.blocks)
        if "ffn" not in self.blocks:
            self.final_layer_norm = None
        if "self" not in self.blocks:  # fairseq's constructor reads self_attn.num_heads: built, then dropped
            self.self_attn = None
            self.self_attn_layer_norm = None
        self.record = None

    def build_fc1(self, input_dim, output_dim, q_noise, qn_block_size):
        return super().build_fc1(input_dim, output_dim, q_noise, qn_block_size) if "ffn" in self.blocks else None

    def build_fc2(self, input_dim, output_dim, q_noise, qn_block_size):
        return super().build_fc2(input_dim, output_dim, q_noise, qn_block_size) if "ffn" in self.blocks else None

    def build_encoder_attention(self, embed_dim, cfg):
        return build_encdec_attention(embed_dim, cfg, self.quant_noise, self.quant_noise_block_size,
                                      softmax_cls=self.encdec_softmax_cls)

    def extra_repr(self):
        return f"blocks={','.join(self.blocks)}, normalize_before={self.normalize_before}"

    def forward(self, x, encoder_out: Optional[Tensor] = None, encoder_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                prev_self_attn_state: Optional[List[Tensor]] = None, prev_attn_state: Optional[List[Tensor]] = None,
                self_attn_mask: Optional[Tensor] = None, self_attn_padding_mask: Optional[Tensor] = None,
                need_attn: bool = False,
                need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor], Optional[List[Optional[Tensor]]]]:
        if self.standard:
            if self.record is None:
                return self._fairseq_forward(x, encoder_out, encoder_padding_mask, incremental_state,
                                             prev_self_attn_state, prev_attn_state, self_attn_mask,
                                             self_attn_padding_mask, need_attn, need_head_weights)
        self._check_block_forward(prev_self_attn_state, prev_attn_state)
        if encoder_out is None:
            raise ValueError("these decoder layer blocks need the encoder output")
        need_attn = need_attn or need_head_weights
        attn: Optional[Tensor] = None
        rec = self.record
        n_blocks = len(self.block_list)
        for i in range(n_blocks):
            block = self.block_list[i]
            residual = x
            h = self._block_norm(block, x) if self.normalize_before else x
            if block == "self":
                h = self._self_attention(h, incremental_state, self_attn_mask, self_attn_padding_mask)
            elif block == "cross":
                h, attn = self._encoder_attention(h, encoder_out, encoder_padding_mask, incremental_state, need_attn,
                                                  need_head_weights)
                if rec is not None:
                    rec["sem"] = h
            else:
                h = self._ffn(h)
                if rec is not None:
                    rec["ffn"] = h
            x = self.residual_connection(self.dropout_module(h), residual)
            if not self.normalize_before:
                x = self._block_norm(block, x)
            if rec is not None:
                self._record_block(rec, i, x)
        if rec is not None:
            rec["ifm"] = x
        return x, attn, None

    def _check_block_forward(self, prev_self_attn_state: Optional[List[Tensor]],
                             prev_attn_state: Optional[List[Tensor]]):
        """NotImplementedError for what only fairseq's own decoder layer forward implements."""
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise NotImplementedError("prev_*_attn_state (ONNX export) needs the standard decoder layout")
        if (self.cross_self_attention or self.attn_ln is not None or self.c_attn is not None
                or self.ffn_layernorm is not None or self.w_resid is not None):
            raise NotImplementedError("cross_self_attention, scale_attn, scale_heads, scale_fc, scale_resids need "
                                      "fairseq's own decoder layer forward (the standard layout, nothing recorded)")

    def _record_block(self, rec: Dict[str, Tensor], i: int, x: Tensor):
        """Record the output ``x`` of block ``i`` for the probing tool: ``tem``, ``addnorm1``, ``addnorm2``."""
        block = self.block_list[i]
        if block == "self":
            rec["tem"] = x
        if block == "ffn":
            rec["addnorm2"] = x
        elif i + 1 == len(self.block_list) or self.block_list[i + 1] == "ffn":
            rec["addnorm1"] = x  # the last attention block's Add&Norm starts the IFM

    def _block_norm(self, block: str, x: Tensor) -> Tensor:
        """The LayerNorm of a block (before it with pre-norm, after its residual with post-norm)."""
        if block == "self":
            norm = self.self_attn_layer_norm
            if norm is None:
                raise ValueError("this layout has no self-attention")
            return norm(x)
        if block == "cross":
            norm = self.encoder_attn_layer_norm
            if norm is None:
                raise ValueError("this layer has no encoder-decoder attention")
            return norm(x)
        norm = self.final_layer_norm
        if norm is None:
            raise ValueError("this layout has no FFN")
        return norm(x)

    def _self_attention(self, h: Tensor, incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
                        self_attn_mask: Optional[Tensor], self_attn_padding_mask: Optional[Tensor]) -> Tensor:
        attention = self.self_attn
        if attention is None:
            raise ValueError("this layout has no self-attention")
        h, _ = attention(query=h, key=h, value=h, key_padding_mask=self_attn_padding_mask,
                         incremental_state=incremental_state, need_weights=False, attn_mask=self_attn_mask)
        return h

    def _encoder_attention(self, h: Tensor, encoder_out: Tensor, encoder_padding_mask: Optional[Tensor],
                           incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]], need_attn: bool,
                           need_head_weights: bool) -> Tuple[Tensor, Optional[Tensor]]:
        attention = self.encoder_attn
        if attention is None:
            raise ValueError("this layer has no encoder-decoder attention")
        return attention(query=h, key=encoder_out, value=encoder_out, key_padding_mask=encoder_padding_mask,
                         incremental_state=incremental_state, static_kv=True,
                         need_weights=need_attn or (not self.training and self.need_attn),
                         need_head_weights=need_head_weights)

    def _ffn(self, h: Tensor) -> Tensor:
        fc1 = self.fc1
        fc2 = self.fc2
        if fc1 is None or fc2 is None:
            raise ValueError("this layout has no FFN")
        return fc2(self.activation_dropout_module(self.activation_fn(fc1(h))))


def drop_absent_sublayer_params(model, state_dict, name):
    """Let a layout without some sub-layers (simplified decoder, sem-ifm) start from a checkpoint that has
    them (e.g. ``--finetune-from-model`` a standard transformer): their weights are left out, with a log."""
    import logging

    prefix = f"{name}." if name else ""
    own = model.state_dict()
    absent = [k for k in state_dict if k.startswith(prefix + "decoder.layers.") and k[len(prefix):] not in own
              and any(f".{m}." in k for m in ("fc1", "fc2", "final_layer_norm", "self_attn", "self_attn_layer_norm"))]
    if absent:
        logging.getLogger(__name__).warning(
            "the checkpoint has %d decoder sub-layer parameters this decoder layout does not (e.g. %s): left out",
            len(absent), absent[0])
        for k in absent:
            del state_dict[k]
