"""transformer_head_gates: a fairseq Transformer with per-head L0 gates (paper 001, Voita et al.).

The head-gate options also exist on transformer_l0drop (default: no gates there), so one model can
combine L0Drop and head gates. ``--kept-heads`` gives a model the shapes of a physically pruned one;
``fairseq-sparse-prune-heads`` writes it, plain ``fairseq-generate`` reads it.
"""
import logging
from dataclasses import dataclass, field, fields
from typing import Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerModel,
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
    transformer_wmt_en_de,
)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from ..modules.attention_normalisers import (
    AttentionNormaliserConfig,
    attention_normaliser_defaults,
    check_attention_normaliser_args,
)
from ..modules.decoder_layer import (
    STANDARD_BLOCKS,
    DecoderLayoutConfig,
    SublayerDecoderLayer,
    check_decoder_layout_args,
    decoder_blocks,
    decoder_layout_defaults,
    drop_absent_sublayer_params,
)
from ..modules.hard_concrete import DEFAULT_GAMMA, DEFAULT_ZETA, HardConcrete
from ..modules.head_gates import ATTENTION_TYPES, add_head_gates, apply_kept_heads
from ..modules.sparsity import SparsityModule

logger = logging.getLogger(__name__)

#: Voita et al.'s code (the-story-of-heads, ConcreteGate) uses temperature 0.33; the paper gives none
HEAD_GATES_BETA = 0.33


@dataclass
class HeadGatesConfig(FairseqDataclass):
    head_gates: Optional[str] = field(
        default=None,
        metadata={"help": "comma-separated attention types that get one HardConcrete gate per head: enc (encoder "
                          "self-attention), dec (decoder self-attention), encdec (decoder-encoder attention); '' = "
                          "none. Default: enc,dec,encdec for transformer_head_gates, none for other architectures"},
    )
    head_gates_beta: float = field(
        default=HEAD_GATES_BETA, metadata={"help": "HardConcrete temperature of the head gates (Voita's code: 0.33)"}
    )
    head_gates_gamma: float = field(default=DEFAULT_GAMMA, metadata={"help": "HardConcrete stretch lower limit"})
    head_gates_zeta: float = field(default=DEFAULT_ZETA, metadata={"help": "HardConcrete stretch upper limit"})
    head_gates_init_log_alpha: float = field(
        default=3.0,
        metadata={"help": "initial log alpha of every head gate; 3.0 starts every gate fully open (g_hat = 1), "
                          "so fine-tuning starts from the converged model"},
    )
    head_gates_penalty: ChoiceEnum(["sum", "layer_mean"]) = field(
        default="sum",
        metadata={"help": "L_C over the gated layers: 'sum' of P(g != 0) over all gated heads (paper 001 Eq. 6) or "
                          "'layer_mean' (mean over gated layers of the per-layer sum, as Voita's code does)"},
    )
    freeze_decoder: bool = field(
        default=False,
        metadata={"help": "train only the encoder and the gates: the decoder's own parameters stay fixed (paper "
                          "001 Sec. 6.2); embeddings shared with the encoder still train"},
    )
    kept_heads: Optional[str] = field(
        default=None,
        metadata={"help": "JSON {\"enc\": [[head ids kept in layer 0], ...], \"dec\": ..., \"encdec\": ...}: build "
                          "the model with only these heads (a physically pruned model). Written into checkpoints "
                          "by fairseq-sparse-prune-heads; rarely set by hand"},
    )


def head_gates_defaults(args, default_types=""):
    """Fill in head-gate options missing from args (older checkpoints, other architectures)."""
    for f in fields(HeadGatesConfig):
        if getattr(args, f.name, None) is None:
            setattr(args, f.name, f.default)  # None for head_gates and kept_heads
    if args.head_gates is None:
        args.head_gates = default_types


def default_head_gate_types(args, types: str) -> str:
    """The architecture's default gated attention types, without ``dec`` for a decoder layout without
    self-attention (``--decoder-sublayer-order sem-ifm``): only an explicit ``--head-gates dec`` is refused."""
    try:
        blocks = decoder_blocks(getattr(args, "decoder_sublayer_order", None),
                                bool(getattr(args, "simplified_decoder", False)))
    except ValueError:
        return types  # an unknown order: check_decoder_layout_args reports it
    if "self" in blocks:
        return types
    return ",".join(t for t in types.split(",") if t.strip() and t.strip() != "dec")


def parse_head_gate_types(value):
    types = [t.strip() for t in (value or "").split(",") if t.strip()]
    unknown = [t for t in types if t not in ATTENTION_TYPES]
    if unknown:
        raise ValueError(f"--head-gates: unknown attention type(s) {unknown}; choose from {','.join(ATTENTION_TYPES)}")
    return types


def check_head_gate_args(args):
    """Validate before anything is built (bad input fails before training or decoding starts)."""
    parse_head_gate_types(args.head_gates)
    HardConcrete(args.head_gates_beta, args.head_gates_gamma, args.head_gates_zeta)
    if args.head_gates_penalty not in ("sum", "layer_mean"):
        raise ValueError(f"--head-gates-penalty must be sum or layer_mean, got {args.head_gates_penalty!r}")


def setup_head_gates(model, args):
    """After fairseq built the model: pruned shapes (--kept-heads), gates (--head-gates), freezing."""
    apply_kept_heads(model, args.kept_heads)
    types = parse_head_gate_types(args.head_gates)
    if types:
        gate = HardConcrete(args.head_gates_beta, args.head_gates_gamma, args.head_gates_zeta)
        keys = add_head_gates(model, types, gate, args.head_gates_penalty, args.head_gates_init_log_alpha)
        logger.info("head gates on %d attention layers (%s)", len(keys), ",".join(types))
    if args.freeze_decoder:
        freeze_decoder(model)


def freeze_decoder(model):
    """requires_grad = False for the decoder's own parameters; gates and shared embeddings still train."""
    encoder_params = {id(p) for p in model.encoder.parameters()}
    gate_params = {id(p) for m in model.modules() if isinstance(m, SparsityModule) for p in m.parameters()}
    frozen = 0
    for p in model.decoder.parameters():
        if id(p) not in encoder_params and id(p) not in gate_params:
            p.requires_grad = False
            frozen += p.numel()
    logger.info("--freeze-decoder: %d decoder parameters fixed", frozen)


def fill_missing_sparsity_params(model, state_dict, name):
    """Let fine-tuning start from a checkpoint without our gates (e.g. stock ``transformer``): parameters
    of sparsity modules absent from the checkpoint take their initial values."""
    prefix = f"{name}." if name else ""
    own = model.state_dict()
    sparse_keys = set()
    for mod_name, module in model.named_modules():
        if isinstance(module, SparsityModule):
            sparse_keys.update(f"{mod_name}.{k}" if mod_name else k for k in module.state_dict())
    missing = [k for k in own if k in sparse_keys and prefix + k not in state_dict]
    if missing:
        logger.info("initialising %d gate parameters absent from the checkpoint", len(missing))
        for k in missing:
            state_dict[prefix + k] = own[k].clone()


class SublayerTransformerDecoder(TransformerDecoderBase):
    """fairseq's TransformerDecoderBase built from :class:`SublayerDecoderLayer` (sub-layer order, simplified
    decoder, --encdec-attention-normaliser); models with fairseq's default decoder keep fairseq's own."""

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        layer = SublayerDecoderLayer(cfg, no_encoder_attn)
        if cfg.checkpoint_activations:
            layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
        return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0)


@register_model("transformer_head_gates")
class HeadGatesTransformerModel(TransformerModel):
    """Transformer with one HardConcrete gate per attention head (Voita et al. 2019)."""

    default_head_gates = ",".join(ATTENTION_TYPES)

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        gen_parser_from_dataclass(parser, HeadGatesConfig())
        gen_parser_from_dataclass(parser, AttentionNormaliserConfig())  # paper 002 baselines (default: softmax)
        gen_parser_from_dataclass(parser, DecoderLayoutConfig())  # paper 004 (default: the standard decoder)

    @classmethod
    def build_model(cls, args, task):
        decoder_layout_defaults(args)
        head_gates_defaults(args, default_head_gate_types(args, cls.default_head_gates))
        attention_normaliser_defaults(args)
        check_head_gate_args(args)
        check_attention_normaliser_args(args)
        check_decoder_layout_args(args)
        model = super().build_model(args, task)
        setup_head_gates(model, args)
        log_decoder_layout(model, args)
        return model

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        standard = decoder_blocks(args.decoder_sublayer_order, args.simplified_decoder) == STANDARD_BLOCKS
        if standard and (getattr(args, "encdec_attention_normaliser", None) or "softmax") == "softmax":
            return super().build_decoder(args, tgt_dict, embed_tokens)
        cfg = TransformerConfig.from_namespace(args)
        return SublayerTransformerDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)

    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)
        fill_missing_sparsity_params(self, state_dict, name)
        drop_absent_sublayer_params(self, state_dict, name)


def log_decoder_layout(model, args):
    """Log the decoder's sub-layers and the parameter counts (paper 004 Table 3 compares them)."""
    blocks = decoder_blocks(args.decoder_sublayer_order, args.simplified_decoder)
    total = sum(p.numel() for p in model.parameters())
    decoder = sum(p.numel() for p in model.decoder.parameters())
    logger.info("decoder layers: %s (order %s%s); parameters: %d in all, %d in the decoder (shared embeddings "
                "counted in both)", " -> ".join(blocks), args.decoder_sublayer_order,
                ", simplified IFM" if args.simplified_decoder else "", total, decoder)


def _gated(preset):
    def arch(args):
        decoder_layout_defaults(args)
        head_gates_defaults(args, default_head_gate_types(args, ",".join(ATTENTION_TYPES)))
        attention_normaliser_defaults(args)
        preset(args)

    return arch


register_model_architecture("transformer_head_gates", "transformer_head_gates")(_gated(base_architecture))
register_model_architecture("transformer_head_gates", "transformer_head_gates_iwslt_de_en")(
    _gated(transformer_iwslt_de_en))
register_model_architecture("transformer_head_gates", "transformer_head_gates_wmt_en_de")(
    _gated(transformer_wmt_en_de))
register_model_architecture("transformer_head_gates", "transformer_head_gates_wmt_en_de_big")(
    _gated(transformer_vaswani_wmt_en_de_big))


@register_model("transformer_simplified_decoder")
class SimplifiedDecoderTransformerModel(HeadGatesTransformerModel):
    """Transformer whose decoder layers have no FFN: the information-fusion module is one Add&Norm
    (Yang et al. 2020, paper 004 Sec. 3.3). Head gates, sub-layer orders and attention normalisers
    combine as on transformer_head_gates (no head gates by default)."""

    default_head_gates = ""

    @classmethod
    def build_model(cls, args, task):
        args.simplified_decoder = True
        return super().build_model(args, task)


def _simplified(preset):
    def arch(args):
        head_gates_defaults(args, "")
        attention_normaliser_defaults(args)
        decoder_layout_defaults(args)
        args.simplified_decoder = True  # what the architecture is; --simplified-decoder is implied
        preset(args)

    return arch


register_model_architecture("transformer_simplified_decoder", "transformer_simplified_decoder")(
    _simplified(base_architecture))
register_model_architecture("transformer_simplified_decoder", "transformer_simplified_decoder_iwslt_de_en")(
    _simplified(transformer_iwslt_de_en))
register_model_architecture("transformer_simplified_decoder", "transformer_simplified_decoder_wmt_en_de")(
    _simplified(transformer_wmt_en_de))
register_model_architecture("transformer_simplified_decoder", "transformer_simplified_decoder_wmt_en_de_big")(
    _simplified(transformer_vaswani_wmt_en_de_big))
