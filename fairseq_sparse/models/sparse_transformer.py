"""The base of every registered model of ours: the options all of them share and their plumbing.

Every model (transformer_head_gates, transformer_simplified_decoder, transformer_l0drop) is a
:class:`SparseTransformerModel` and builds in one order: fill defaults (:meth:`fill_defaults`, also run
by the architecture presets), check (:meth:`check_args`: bad input fails before training or decoding
starts), build (fairseq's ``TransformerModel.build_model`` with our ``build_decoder``), set up
(:meth:`set_up`: pruned head shapes, head gates, freezing, logging). Shared options:

- head gates (Voita et al. 2019): one HardConcrete gate per head of the chosen attention types,
  ``--kept-heads`` for physically pruned shapes, ``--freeze-decoder``;
- the encoder-decoder attention normaliser (Zhang, Zhao, Li & Zong 2019 baselines);
- the decoder layout: sub-layer order and simplified decoder (Yang et al. 2020).

A checkpoint without our parameters (e.g. stock ``transformer``) loads: missing gate parameters take
their initial values, parameters of sub-layers a layout lacks are dropped (``upgrade_state_dict_named``).
"""
import json
import logging
from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model_architecture
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
from ..modules.beam_attention import BeamAttentionOption
from ..modules.coverage_attention import Coverage
from ..modules.decoder_layer import (
    STANDARD_BLOCKS,
    DecoderLayoutConfig,
    SublayerDecoderLayer,
    check_decoder_layout_args,
    decoder_blocks,
    decoder_layout_defaults,
    drop_absent_sublayer_params,
)
from ..modules.encoder_merge import EncoderOutputMerge
from ..modules.hard_concrete import DEFAULT_GAMMA, DEFAULT_ZETA, HardConcrete, check_gate_options
from ..modules.head_gates import ATTENTION_TYPES, add_head_gates, apply_kept_heads
from ..modules.options import fill_dataclass_defaults
from ..modules.sparsity import SparsityModule

logger = logging.getLogger(__name__)

#: Voita et al.'s code (the-story-of-heads, ConcreteGate) uses temperature 0.33; the paper gives none
HEAD_GATES_BETA = 0.33

#: fairseq's transformer size presets, by the suffix our architecture names add to the model name
SIZE_PRESETS = {
    "": base_architecture,
    "_iwslt_de_en": transformer_iwslt_de_en,
    "_wmt_en_de": transformer_wmt_en_de,
    "_wmt_en_de_big": transformer_vaswani_wmt_en_de_big,
}


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
        metadata={"help": "L_C over the gated layers: 'sum' of P(g != 0) over all gated heads (Voita et al. 2019 "
                          "Eq. 6) or 'layer_mean' (mean over gated layers of the per-layer sum, as Voita's code does)"},
    )
    freeze_decoder: bool = field(
        default=False,
        metadata={"help": "train only the encoder and the gates: the decoder's own parameters stay fixed (Voita "
                          "et al. 2019 Sec. 6.2); embeddings shared with the encoder still train"},
    )
    kept_heads: Optional[str] = field(
        default=None,
        metadata={"help": "JSON {\"enc\": [[head ids kept in layer 0], ...], \"dec\": ..., \"encdec\": ...}: build "
                          "the model with only these heads (a physically pruned model). Written into checkpoints "
                          "by fairseq-sparse-prune-heads; rarely set by hand"},
    )


def head_gates_defaults(args, default_types=""):
    """Fill in head-gate options missing from args (older checkpoints, other architectures)."""
    fill_dataclass_defaults(args, HeadGatesConfig, head_gates=default_types)


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
    kept = args.kept_heads
    if getattr(args, "encdec_attention_coverage", False) and kept:
        try:
            kept = json.loads(kept) if isinstance(kept, str) else kept
        except ValueError:
            kept = {}  # apply_kept_heads names the JSON error
        if any(len(layer) < args.decoder_attention_heads for layer in kept.get("encdec", [])):
            raise ValueError("--encdec-attention-coverage reads every encoder-decoder head: physically pruned "
                             "encoder-decoder heads (--kept-heads) are not supported with it; prune enc / dec heads only")
    check_gate_options("--head-gates", args.head_gates_beta, args.head_gates_gamma, args.head_gates_zeta,
                       "init-log-alpha", args.head_gates_init_log_alpha)
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
    of sparsity modules, coverage models and output merges absent from the checkpoint take their initial values."""
    prefix = f"{name}." if name else ""
    own = model.state_dict()
    sparse_keys = set()
    for mod_name, module in model.named_modules():
        if isinstance(module, (SparsityModule, Coverage, EncoderOutputMerge)):
            sparse_keys.update(f"{mod_name}.{k}" if mod_name else k for k in module.state_dict())
    missing = [k for k in own if k in sparse_keys and prefix + k not in state_dict]
    if missing:
        logger.info("initialising %d gate parameters absent from the checkpoint", len(missing))
        for k in missing:
            state_dict[prefix + k] = own[k].clone()


def log_decoder_layout(model, args):
    """Log the decoder's sub-layers and the parameter counts (Yang et al. 2020 Table 3 compares them)."""
    blocks = decoder_blocks(args.decoder_sublayer_order, args.simplified_decoder)
    total = sum(p.numel() for p in model.parameters())
    decoder = sum(p.numel() for p in model.decoder.parameters())
    logger.info("decoder layers: %s (order %s%s); parameters: %d in all, %d in the decoder (shared embeddings "
                "counted in both)", " -> ".join(blocks), args.decoder_sublayer_order,
                ", simplified IFM" if args.simplified_decoder else "", total, decoder)


def wrap_layer(layer, cfg):
    """What fairseq does to each encoder or decoder layer it builds: activation checkpointing and FSDP wrapping."""
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0)


class SublayerTransformerDecoder(BeamAttentionOption, TransformerDecoderBase):
    """fairseq's TransformerDecoderBase built from :class:`SublayerDecoderLayer` (sub-layer order, simplified
    decoder, --encdec-attention-normaliser); models with fairseq's default decoder keep fairseq's own. Without
    --print-alignment it returns no beam attention, which nothing reads (:mod:`..modules.beam_attention`)."""

    layer_cls = SublayerDecoderLayer

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(self.layer_cls(cfg, no_encoder_attn), cfg)


class SparseTransformerModel(TransformerModel):
    """fairseq's TransformerModel with the options every model of ours shares (see the module docstring)."""

    #: attention types with head gates unless --head-gates says otherwise
    default_head_gates = ""
    #: True: the architecture is the simplified decoder (--simplified-decoder is implied)
    simplified_decoder = False
    #: the decoder class; None: fairseq's own decoder for the standard layout with softmax attention
    #: without coverage,
    #: :class:`SublayerTransformerDecoder` otherwise
    decoder_cls = None

    @classmethod
    def add_args(cls, parser):
        TransformerModel.add_args(parser)
        gen_parser_from_dataclass(parser, HeadGatesConfig())
        gen_parser_from_dataclass(parser, AttentionNormaliserConfig())  # default: softmax
        gen_parser_from_dataclass(parser, DecoderLayoutConfig())  # default: the standard decoder

    @classmethod
    def fill_defaults(cls, args):
        """Options missing from args (older checkpoints, architecture presets) take their defaults."""
        if cls.simplified_decoder:
            args.simplified_decoder = True
        decoder_layout_defaults(args)
        head_gates_defaults(args, default_head_gate_types(args, cls.default_head_gates))
        attention_normaliser_defaults(args)

    @classmethod
    def check_args(cls, args):
        """Refuse bad options before anything is built."""
        check_head_gate_args(args)
        check_attention_normaliser_args(args)
        check_decoder_layout_args(args)

    @classmethod
    def build_model(cls, args, task):
        cls.fill_defaults(args)
        cls.check_args(args)
        model = super().build_model(args, task)
        model.set_up(args)
        return model

    def set_up(self, args):
        """After fairseq built the model: pruned head shapes, head gates, freezing; log the decoder layout."""
        setup_head_gates(self, args)
        log_decoder_layout(self, args)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        decoder_cls = cls.decoder_cls
        if decoder_cls is None:
            standard = decoder_blocks(args.decoder_sublayer_order, args.simplified_decoder) == STANDARD_BLOCKS
            softmax = (getattr(args, "encdec_attention_normaliser", None) or "softmax") == "softmax"
            if standard and softmax and not getattr(args, "encdec_attention_coverage", False):
                return super().build_decoder(args, tgt_dict, embed_tokens)
            decoder_cls = SublayerTransformerDecoder
        cfg = TransformerConfig.from_namespace(args)
        return decoder_cls(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)

    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)
        fill_missing_sparsity_params(self, state_dict, name)
        drop_absent_sublayer_params(self, state_dict, name)


def register_architectures(model_name: str, model_cls):
    """Register ``<model_name>`` and ``<model_name>_{iwslt_de_en,wmt_en_de,wmt_en_de_big}`` (fairseq's
    transformer sizes) with the model's defaults filled first. Returns {architecture name: function}."""
    archs = {}
    for suffix, preset in SIZE_PRESETS.items():
        def arch(args, preset=preset):
            model_cls.fill_defaults(args)
            preset(args)

        name = model_name + suffix
        arch.__name__ = name
        archs[name] = register_model_architecture(model_name, name)(arch)
    return archs
