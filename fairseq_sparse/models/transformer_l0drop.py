"""transformer_l0drop: a fairseq Transformer with L0Drop gates on the encoder output (Zhang, Titov & Sennrich 2021).

In eval mode (``--pruned-decoding``, the default) the encoder hands the decoder the compressed memory
of Algorithm 1, so fairseq-generate decodes with N' + 1 instead of N source states and gives the same
hypotheses as the uncompressed gated model. With ``--l0drop-between-layers`` the states dropped inside
the encoder also leave its later layers (``--compact-encoder``, exact as well).

Split along fairseq's own seams (fairseq/models/transformer/): the options in ``l0drop_config.py``, the encoder in
``l0drop_encoder.py``, the decoder in ``l0drop_decoder.py``, the model and its architectures here.
"""
import logging
from typing import Optional

import torch
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model
from torch import Tensor

from ..modules.attention_normalisers import COUNT_EXACT
from ..modules.encoder_patterns import UNTAGGED_INPUT
from ..modules.hard_concrete import check_gate_options
from ..modules.l0drop import DROPPED_AS_CHOICES
from ..modules.options import fill_dataclass_defaults
from .l0drop_config import (
    COMPACT_ENCODER_HELP,
    LAYER_PENALTY_CHOICES,
    PRUNED_DECODING_HELP,
    L0DropConfig,
    check_merge_args,
    check_pattern_args,
    parse_bool,
)
from .l0drop_decoder import L0DropTransformerDecoder
from .l0drop_encoder import L0DropTransformerEncoder
from .sparse_transformer import SparseTransformerModel, register_architectures

logger = logging.getLogger(__name__)


@register_model("transformer_l0drop")
class L0DropTransformerModel(SparseTransformerModel):
    """Transformer with L0Drop on the encoder outputs (Zhang, Titov & Sennrich 2021)."""

    decoder_cls = L0DropTransformerDecoder

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        gen_parser_from_dataclass(parser, L0DropConfig())
        parser.add_argument("--pruned-decoding", type=parse_bool, default=True, metavar="BOOL", help=PRUNED_DECODING_HELP)
        parser.add_argument("--compact-encoder", type=parse_bool, default=True, metavar="BOOL", help=COMPACT_ENCODER_HELP)

    @classmethod
    def fill_defaults(cls, args):
        fill_dataclass_defaults(args, L0DropConfig)
        for flag in ("pruned_decoding", "compact_encoder"):
            if not hasattr(args, flag):
                setattr(args, flag, True)
        super().fill_defaults(args)

    @classmethod
    def check_args(cls, args):
        if args.l0drop_dropped_as not in DROPPED_AS_CHOICES:
            raise ValueError(f"--l0drop-dropped-as must be one of {DROPPED_AS_CHOICES}, got {args.l0drop_dropped_as!r}")
        if args.l0drop_layer_penalty not in LAYER_PENALTY_CHOICES:
            raise ValueError(f"--l0drop-layer-penalty must be one of {LAYER_PENALTY_CHOICES}, "
                             f"got {args.l0drop_layer_penalty!r}")
        check_gate_options("--l0drop", args.l0drop_beta, args.l0drop_gamma, args.l0drop_zeta, "init-bias",
                           args.l0drop_init_bias)
        check_pattern_args(args)
        check_merge_args(args)
        if args.l0drop_between_layers and args.encoder_layers < 2:
            raise ValueError(f"--l0drop-between-layers gates the states between encoder layers, but --encoder-layers "
                             f"{args.encoder_layers} has no such place; use 2 or more encoder layers or drop the option")
        super().check_args(args)
        if (args.encdec_attention_normaliser not in COUNT_EXACT and args.l0drop_dropped_as == "zero"
                and args.pruned_decoding):
            raise ValueError(
                f"--encdec-attention-normaliser {args.encdec_attention_normaliser} is not exact with pruned "
                "decoding of states dropped as zero vectors (c pruned states != one dummy with logit + log c); "
                "use --l0drop-dropped-as mask, or switch pruned decoding off (--pruned-decoding False in "
                "training; --model-overrides \"{'pruned_decoding': False}\" in fairseq-generate)")

    @classmethod
    def build_model(cls, args, task):
        if getattr(args, "encoder_output_pattern", None) == "pos" and not getattr(task, "carries_source_tags", False):
            raise ValueError("--encoder-output-pattern pos reads part-of-speech tags that travel with the data: train "
                             "and decode with --task translation_source_tags (see --source-tags-dir)")
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return L0DropTransformerEncoder(args, src_dict, embed_tokens)

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", **kwargs):
        """fairseq's hub interface, refused when loaded for a POS-pattern model: raw sentences carry no tags."""
        hub = super().from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path, **kwargs)
        if any(getattr(m.encoder, "reads_source_tags", False) for m in hub.models):
            raise ValueError(UNTAGGED_INPUT)
        return hub

    @torch.jit.unused  # the encoder's forward is Python-only; fairseq's generators call encoder and decoder
    def forward(self, src_tokens, src_lengths, prev_output_tokens, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer: Optional[int] = None,
                alignment_heads: Optional[int] = None, src_tags: Optional[Tensor] = None):
        """fairseq's TransformerModel.forward, with the source tags (``net_input["src_tags"]`` of the task
        translation_source_tags) passed to the encoder."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens,
                                   src_tags=src_tags)
        return self.decoder(prev_output_tokens, encoder_out=encoder_out, features_only=features_only,
                            alignment_layer=alignment_layer, alignment_heads=alignment_heads,
                            src_lengths=src_lengths, return_all_hiddens=return_all_hiddens)

    def upgrade_state_dict_named(self, state_dict, name):
        """A pattern model has no L0Drop gates: those of an L0Drop checkpoint are left out (logged)."""
        super().upgrade_state_dict_named(state_dict, name)
        if self.encoder.pattern is not None:
            prefix = f"{name}.encoder.l0drop." if name else "encoder.l0drop."
            unused = [k for k in state_dict if k.startswith(prefix)]
            if unused:
                logger.info("encoder output pattern: the checkpoint's %d L0Drop gate parameters are not used",
                            len(unused))
                for k in unused:
                    del state_dict[k]


ARCHITECTURES = register_architectures("transformer_l0drop", L0DropTransformerModel)
transformer_l0drop = ARCHITECTURES["transformer_l0drop"]
