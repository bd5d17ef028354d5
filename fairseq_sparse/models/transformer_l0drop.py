"""transformer_l0drop: a fairseq Transformer with L0Drop gates on the encoder output (Zhang, Titov & Sennrich 2021).

In eval mode (``--pruned-decoding``, the default) the encoder hands the decoder the compressed memory
of Algorithm 1, so fairseq-generate decodes with N' + 1 instead of N source states and gives the same
hypotheses as the uncompressed gated model. With ``--l0drop-between-layers`` the states dropped inside
the encoder also leave its later layers (``--compact-encoder``, exact as well).
"""
import argparse
import atexit
import functools
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig, TransformerEncoder
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from torch import Tensor

from ..modules.attention_normalisers import COUNT_EXACT
from ..modules.count_attention import CountAwareAttention
from ..modules.decoder_layer import SublayerDecoderLayer
from ..modules.encoder_patterns import PATTERNS, UNTAGGED_INPUT, EncoderOutputPattern
from ..modules.hard_concrete import DEFAULT_BETA, DEFAULT_GAMMA, DEFAULT_ZETA, HardConcrete, check_gate_options
from ..modules.l0drop import (
    DROPPED_AS_CHOICES,
    CompactedEncoder,
    CompressedMemory,
    L0Drop,
    compress,
    decoder_padding_mask,
    expand_attention,
)
from ..modules.options import fill_dataclass_defaults
from .sparse_transformer import SparseTransformerModel, SublayerTransformerDecoder, register_architectures, wrap_layer

logger = logging.getLogger(__name__)


class DecodingStats:
    """Source tokens that fairseq's generators ran through L0Drop encoders in this process, and how many
    were pruned (g_hat = 0): the sparsity rate of Zhang, Titov & Sennrich (2021) Sec. 6. Reported once,
    when the process ends, as a line like fairseq's own end-of-run lines. Only counts are kept (no model
    is held in memory), summed over every model that decoded (a tool that loads several checkpoints)."""

    def __init__(self):
        self.sentences = self.src_tokens = self.pruned = 0
        self.modes = set()
        self.registered = False

    def add(self, gates: Tensor, pad: Tensor, pruned_decoding: bool):
        if not self.registered:
            atexit.register(self.report)
            self.registered = True
        self.sentences += gates.size(0)
        self.src_tokens += int((~pad).sum())
        self.pruned += int(((gates == 0) & ~pad).sum())
        self.modes.add("on" if pruned_decoding else "off")

    def line(self) -> Optional[str]:
        if not self.src_tokens:
            return None
        return (f"L0Drop sparsity rate {100.0 * self.pruned / self.src_tokens:.2f}% ({self.pruned} of "
                f"{self.src_tokens} source tokens pruned, {self.sentences} sentences; pruned decoding "
                f"{'/'.join(sorted(self.modes))})")

    def report(self):
        line = self.line()
        if line is None:
            return
        handlers = logging.getLogger().handlers
        if handlers and not any(getattr(getattr(h, "stream", None), "closed", False) for h in handlers):
            logging.getLogger("fairseq_sparse").info(line)
        else:  # logging already torn down (e.g. fairseq-generate --results-path closed its file)
            print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} | INFO | fairseq_sparse | {line}", file=sys.stderr)


DECODING_STATS = DecodingStats()

#: how the L0 penalties of the gated layers combine under --l0drop-between-layers
LAYER_PENALTY_CHOICES = ("mean", "sum")


@dataclass
class L0DropConfig(FairseqDataclass):
    l0drop_beta: float = field(
        default=DEFAULT_BETA, metadata={"help": "HardConcrete temperature beta (Zhang, Titov & Sennrich 2021: 2/3)"}
    )
    l0drop_gamma: float = field(
        default=DEFAULT_GAMMA, metadata={"help": "HardConcrete stretch lower limit gamma = -eps (Zhang, Titov & Sennrich 2021: -0.1)"}
    )
    l0drop_zeta: float = field(
        default=DEFAULT_ZETA, metadata={"help": "HardConcrete stretch upper limit zeta = 1 + eps (Zhang, Titov & Sennrich 2021: 1.1)"}
    )
    l0drop_init_bias: float = field(
        default=3.0,
        metadata={"help": "initial bias b of log alpha = x.w + b (w starts at 0); 3.0 starts every gate "
                          "fully open (g_hat = 1), so fine-tuning starts from the converged model"},
    )
    l0drop_dropped_as: ChoiceEnum(DROPPED_AS_CHOICES) = field(
        default="zero",
        metadata={"help": "what a dropped encoder state is, in training and decoding alike: 'zero' = a zero "
                          "vector the decoder still attends to (Algorithm 1's counted dummy), 'mask' = removed "
                          "from the encoder-decoder attention"},
    )
    l0drop_between_layers: bool = field(
        default=False,
        metadata={"help": "also put L0Drop between every pair of encoder layers (Zhang, Titov & Sennrich 2021 Sec. 6, 'prune "
                          "encodings earlier'); a state dropped there stays dropped"},
    )
    l0drop_layer_penalty: ChoiceEnum(LAYER_PENALTY_CHOICES) = field(
        default="mean",
        metadata={"help": "with --l0drop-between-layers, how the L gated layers' L0 penalties combine (the paper "
                          "does not say): 'mean' (default) keeps --l0drop-lambda's single-gate meaning (lambda x "
                          "expected share of states kept), so a lambda tuned without the option (Zhang, Titov & "
                          "Sennrich 2021: 0.2-0.3) transfers whatever the depth; 'sum' makes one lambda act about "
                          "L times as strongly"},
    )
    encoder_output_pattern: ChoiceEnum(PATTERNS) = field(
        default="none",
        metadata={"help": "drop encoder outputs by a fixed rule instead of learnt gates (Zhang, Titov & Sennrich 2021 "
                          "Sec. 7): 'pos' function words, punctuation, MD, EX and non-initial subword pieces (tags "
                          "from --task translation_source_tags), 'freq' the most frequent source tokens, 'inv-freq' "
                          "the rarest, 'group' all but every k-th position; decoded through the same compressed "
                          "memory as L0Drop"},
    )
    encoder_output_pattern_top_k: Optional[int] = field(
        default=None, metadata={"help": "freq: drop the K most frequent source tokens (the paper: 100)"})
    encoder_output_pattern_min_rank: Optional[int] = field(
        default=None, metadata={"help": "inv-freq: drop the tokens of frequency rank R and beyond (the paper: 452)"})
    encoder_output_pattern_every: Optional[int] = field(
        default=None, metadata={"help": "group: keep every k-th source position only (the paper: 2)"})
    encoder_output_pattern_rate: Optional[float] = field(
        default=None,
        metadata={"help": "instead of the pattern's own setting: the share of source tokens to drop (freq, "
                          "inv-freq: from the dictionary's counts; group: k = 1 / (1 - rate))"},
    )


PATTERN_SETTINGS = {"freq": "encoder_output_pattern_top_k", "inv-freq": "encoder_output_pattern_min_rank",
                    "group": "encoder_output_pattern_every"}


def check_pattern_args(args):
    """--encoder-output-pattern and its settings: one setting or a rate for the chosen rule, none without."""
    kind = args.encoder_output_pattern
    if kind not in PATTERNS:
        raise ValueError(f"--encoder-output-pattern must be one of {', '.join(PATTERNS)}, got {kind!r}")
    given = [f for f in list(PATTERN_SETTINGS.values()) + ["encoder_output_pattern_rate"]
             if getattr(args, f, None) is not None]
    option = lambda f: "--" + f.replace("_", "-")  # noqa: E731
    if kind in ("none", "pos"):
        if given:
            raise ValueError(f"{option(given[0])} " + ("needs --encoder-output-pattern" if kind == "none" else
                             "does not apply to --encoder-output-pattern pos (its rule is fixed by the tags)"))
        if kind == "none":
            return
    wrong = [f for f in given if f not in (PATTERN_SETTINGS[kind], "encoder_output_pattern_rate")]
    if wrong:
        raise ValueError(f"{option(wrong[0])} does not apply to --encoder-output-pattern {kind}")
    if kind != "pos" and len(given) != 1:
        raise ValueError(f"--encoder-output-pattern {kind} needs exactly one of {option(PATTERN_SETTINGS[kind])} "
                         f"and --encoder-output-pattern-rate")
    rate = args.encoder_output_pattern_rate
    if rate is not None and not (math.isfinite(rate) and 0 <= rate < 1):
        raise ValueError(f"--encoder-output-pattern-rate must lie in [0, 1), got {rate}")
    setting = getattr(args, PATTERN_SETTINGS[kind]) if kind != "pos" else None
    if setting is not None and setting < (0 if kind == "freq" else 1):
        raise ValueError(f"{option(PATTERN_SETTINGS[kind])} must be >= {0 if kind == 'freq' else 1}, got {setting}")
    if args.l0drop_between_layers:
        raise ValueError("--encoder-output-pattern replaces the gates of the encoder output; it does not combine "
                         "with --l0drop-between-layers")
    if (getattr(args, "l0drop_lambda", 0) or 0) > 0 or getattr(args, "l0drop_target_sparsity", None):
        raise ValueError("--encoder-output-pattern drops states by rule: there are no L0Drop gates for "
                         "--l0drop-lambda / --l0drop-target-sparsity to act on")


def parse_bool(value) -> bool:
    """--pruned-decoding / --compact-encoder: True / False (any case), 1 / 0, yes / no. Anything else is
    argparse's one-line error (fairseq's eval_bool evaluates the text as Python: 'foo' ended in a NameError)."""
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {value!r}")


PRUNED_DECODING_HELP = (
    "in eval mode, decode with the compressed memory of Algorithm 1 (exact; default True). Switch off "
    "at generation time with --model-overrides \"{'pruned_decoding': False}\""
)
COMPACT_ENCODER_HELP = (
    "with --l0drop-between-layers and pruned decoding: in fairseq's generators (fairseq-generate, "
    "fairseq-interactive, validation BLEU), states dropped after encoder layer k leave the sequence of layers "
    "k+1.. (shorter self-attention and FFN; exact, see CompactedEncoder; default True). Training keeps every "
    "state. Switch off with --model-overrides \"{'compact_encoder': False}\""
)


class CountAwareEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer with :class:`CountAwareAttention` as self-attention, for the counted dummy of a
    compacted encoder; without log counts it computes what fairseq's layer does (same parameters)."""

    def build_self_attention(self, embed_dim, cfg):
        return CountAwareAttention(embed_dim, cfg.encoder.attention_heads, dropout=cfg.attention_dropout,
                                   self_attention=True, q_noise=self.quant_noise,
                                   qn_block_size=self.quant_noise_block_size,
                                   xformers_att_config=cfg.encoder.xformers_att_config)


class L0DropTransformerEncoder(TransformerEncoder):
    """TransformerEncoder + L0Drop on its output (and optionally after every layer but the last)."""

    __jit_unused_properties__ = ["reads_source_tags"]  # TorchScript compiles properties otherwise

    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(args, dictionary, embed_tokens)
        self.dropped_as = args.l0drop_dropped_as
        self.pruned_decoding = args.pruned_decoding
        self.compact_encoder = args.compact_encoder
        embed_dim = embed_tokens.embedding_dim
        gated_layers = len(self.layers) if args.l0drop_between_layers else 1
        scale = 1.0 / gated_layers if args.l0drop_layer_penalty == "mean" else 1.0

        def make_l0drop(name):
            gate = HardConcrete(args.l0drop_beta, args.l0drop_gamma, args.l0drop_zeta)
            return L0Drop(embed_dim, gate, args.l0drop_init_bias, name=name, penalty_scale=scale)

        self.pattern = None
        if args.encoder_output_pattern != "none":
            # a rule instead of learnt gates (Zhang, Titov & Sennrich 2021 Sec. 7): no L0Drop module to train
            self.pattern = EncoderOutputPattern(
                args.encoder_output_pattern, dictionary.count, dictionary.nspecial, dictionary.eos(),
                top_k=args.encoder_output_pattern_top_k, min_rank=args.encoder_output_pattern_min_rank,
                every=args.encoder_output_pattern_every, rate=args.encoder_output_pattern_rate,
                symbols=dictionary.symbols)
            share = self.pattern.dropped_share(dictionary.count)
            logger.info("encoder output pattern %s%s", self.pattern.extra_repr(), "" if share is None else
                        f": drops {100 * share:.1f}% of the dictionary's counted tokens")
        self.l0drop = make_l0drop("l0drop") if self.pattern is None else None
        self.layer_l0drops = None
        self._python_hooks = []  # their handles (drop_python_hooks)
        if args.l0drop_between_layers:
            n = len(self.layers)
            self.layer_l0drops = torch.nn.ModuleList([make_l0drop(f"l0drop_layer{k + 1}") for k in range(n - 1)])
            for k in range(n):
                # states dropped before a layer are hidden from its self-attention
                self._python_hooks.append(
                    self.layers[k].register_forward_pre_hook(self._hide_dropped_states, with_kwargs=True))
                if k < n - 1:
                    # a partial of a bound method, not a closure: copy.deepcopy (fairseq's --ema,
                    # quantize_dynamic) rebinds it to the copy
                    self._python_hooks.append(
                        self.layers[k].register_forward_hook(functools.partial(self._gate_layer_output, k)))
        self._alive: Optional[Tensor] = None  # states not dropped so far, during one forward pass
        self._pad: Optional[Tensor] = None
        self._compacted: Optional[CompactedEncoder] = None  # the rows of a compacting forward pass
        self._generating = False  # inside forward_torchscript, the generators' entry point

    @property
    def reads_source_tags(self) -> bool:
        """True for the POS pattern: every batch needs ``net_input["src_tags"]``."""
        return self.pattern is not None and self.pattern.kind == "pos"

    def drop_python_hooks(self):
        """Remove the forward hooks of --l0drop-between-layers, which TorchScript cannot compile, before a copy of
        the model is scripted (fairseq-sparse-export): the scripted generators take
        :meth:`forward_compacted_test_time`, which calls the layers itself. The eager :meth:`forward` needs them."""
        for handle in self._python_hooks:
            handle.remove()
        self._python_hooks = []

    def build_encoder_layer(self, args):
        cfg = TransformerConfig.from_namespace(args)
        return wrap_layer(CountAwareEncoderLayer(cfg, return_fc=self.return_fc), cfg)

    # --- L0Drop between layers: forward hooks on fairseq's own encoder layers ---
    def _hide_dropped_states(self, layer, args, kwargs):
        rows = self._compacted
        if rows is not None and rows.memory is not None:  # compacted: the rows' mask, the dummy's log count
            kwargs["encoder_padding_mask"] = rows.memory.padding_mask
            if isinstance(layer.self_attn, CountAwareAttention):  # not a layer whose heads were all pruned
                layer.self_attn.log_count = rows.memory.log_count
            return args, kwargs
        if self._alive is None or self.dropped_as != "mask":
            return None
        gates = self._alive.to(torch.float32)
        kwargs["encoder_padding_mask"] = decoder_padding_mask(gates, self._pad, "mask")
        return args, kwargs

    def _gate_layer_output(self, k, layer, args, output):
        rows = self._compacted
        if rows is not None:
            x, gates = self.layer_l0drops[k](output, rows.live_pad, dropped_before=rows.dropped_before())
            return rows.compact(x, gates, self.dropped_as)
        x, gates = self.layer_l0drops[k](output, self._pad, alive=self._alive)
        self._alive = gates != 0
        return x

    @torch.jit.unused  # Python-side state (hooks, CompactedEncoder); TorchScript takes forward_test_time
    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False, token_embeddings=None,
                src_tags: Optional[Tensor] = None):
        """fairseq's encoder, then the gates; ``src_tags``: tag ids of the source tokens (the POS pattern)."""
        self._pad = src_tokens.eq(self.padding_idx)
        if (self._generating and self.layer_l0drops is not None and self.compact_encoder and self.pruned_decoding
                and not self.training and not return_all_hiddens):
            self._compacted = CompactedEncoder(self._pad)
        try:
            out = super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)
            if self._compacted is not None:
                return self._compacted_output(out)
            if self.pattern is not None:
                gates = self.pattern(src_tokens, self._pad, src_tags)
                x = out["encoder_out"][0] * gates.transpose(0, 1).unsqueeze(-1).to(out["encoder_out"][0].dtype)
                self.pattern.record_rate(gates, self._pad)
            else:
                x, gates = self.l0drop(out["encoder_out"][0], self._pad, alive=self._alive)
        finally:
            self._alive, self._pad, self._compacted = None, None, None
            for layer in self.layers:
                if isinstance(layer.self_attn, CountAwareAttention):
                    layer.self_attn.log_count = None
        pad = out["encoder_padding_mask"][0]
        out["l0drop_gates"] = [gates]
        if self.training or not self.pruned_decoding:
            out["encoder_out"] = [x]
            out["encoder_padding_mask"] = [decoder_padding_mask(gates, pad, self.dropped_as)]
            return out
        return pruned_output(out, compress(x, gates, pad, self.dropped_as), gates)

    def forward_test_time(self, src_tokens: Tensor, src_lengths: Tensor) -> Dict[str, List[Tensor]]:
        """What the generators get in eval mode, in code TorchScript compiles: fairseq's encoder, g_hat (or a
        pattern's gates), and the compressed memory (or, without pruned decoding, the gated one); with
        --l0drop-between-layers the compacted encoder (:meth:`forward_compacted_test_time`). fairseq-sparse-export's
        path; the eager generators take :meth:`forward`, which also records the statistics."""
        if self.layer_l0drops is not None:
            return self.forward_compacted_test_time(src_tokens)
        out = self.forward_scriptable(src_tokens, src_lengths, False, None)
        pad = src_tokens.eq(self.padding_idx)
        x = out["encoder_out"][0]
        pattern = self.pattern
        if pattern is not None:  # a rule (not the POS pattern: no tags reach a scripted model)
            gates = pattern(src_tokens, pad, None)
            x = x * gates.transpose(0, 1).unsqueeze(-1).to(x.dtype)
        else:
            x, gates = self.l0drop.test_time_gates(x, pad)
        if not self.pruned_decoding:
            mask = decoder_padding_mask(gates, pad, self.dropped_as)
            assert mask is not None  # pad is a tensor
            out["encoder_out"], out["encoder_padding_mask"], out["l0drop_gates"] = [x], [mask], [gates]
            return out
        return pruned_output(out, compress(x, gates, pad, self.dropped_as), gates)

    def forward_compacted_test_time(self, src_tokens: Tensor) -> Dict[str, List[Tensor]]:
        """--l0drop-between-layers in eval mode, compacted (:class:`CompactedEncoder`), with fairseq's embedding,
        layers and final LayerNorm called one by one instead of through the forward hooks of :meth:`forward`
        (which TorchScript cannot compile): the same rows, masks and log counts reach every layer."""
        pad = src_tokens.eq(self.padding_idx)
        rows = CompactedEncoder(pad)
        x, _ = self.forward_embedding(src_tokens, None)
        x = (x * (1 - pad.unsqueeze(-1).type_as(x))).transpose(0, 1)
        gated = self.layer_l0drops
        assert gated is not None
        # each layer reads the rows' padding mask and, once compacted, the dummy's log count on its self-attention
        # (what the hooks hand it in forward); TorchScript passes no module to a function, hence the repetition
        # hasattr, not isinstance: TorchScript's isinstance matched only the first compiled shape of
        # CountAwareAttention (see L0DropTransformerDecoder._set_log_count)
        for layer, gate in zip(self.layers, gated):  # every layer but the last, each followed by its gates
            mask, log_count = rows.layer_inputs()
            if hasattr(layer.self_attn, "log_count_for_call"):  # not a layer whose heads were all pruned
                layer.self_attn.log_count = log_count
            x = layer(x, encoder_padding_mask=mask)
            x, gates = gate.test_time_gates(x, rows.live_pad)
            x = rows.compact(x, gates, self.dropped_as)
        last = self.layers[-1]  # not self.layers[-1:]: TorchScript (2.13) takes that slice from the first layer
        mask, log_count = rows.layer_inputs()
        if hasattr(last.self_attn, "log_count_for_call"):
            last.self_attn.log_count = log_count
        x = last(x, encoder_padding_mask=mask)
        for layer in self.layers:
            if hasattr(layer.self_attn, "log_count_for_call"):
                layer.self_attn.log_count = None
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x, gates = self.l0drop.test_time_gates(x, rows.live_pad)
        mem = rows.original_memory(compress(x, gates, rows.live_pad, self.dropped_as, rows.dropped()))
        lengths = src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        out: Dict[str, List[Tensor]] = {"encoder_states": [], "src_lengths": [lengths]}
        return pruned_output(out, mem, rows.original_gates(gates))

    def _compacted_output(self, out):
        """The output gates over the compacted rows, and the memory at the original source positions."""
        rows = self._compacted
        x, gates = self.l0drop(out["encoder_out"][0], rows.live_pad, dropped_before=rows.dropped_before())
        mem = rows.original_memory(compress(x, gates, rows.live_pad, self.dropped_as, rows.dropped()))
        return pruned_output(out, mem, rows.original_gates(gates))

    def forward_torchscript(self, net_input: Dict[str, Tensor]):
        """The entry point of fairseq's generators: the encoder is compacted here (``--compact-encoder``; other
        callers, e.g. the analysis tools, see every layer's states at their original positions); also counts
        the sparsity of decoded sources. Scripted (fairseq-sparse-export): :meth:`forward_test_time`."""
        if torch.jit.is_scripting():
            return self.forward_test_time(net_input["src_tokens"], net_input["src_lengths"])
        return self._forward_for_generator(net_input)

    @torch.jit.unused
    def _forward_for_generator(self, net_input: Dict[str, Tensor]):
        self._generating = True
        try:
            out = super().forward_torchscript(net_input)
        finally:
            self._generating = False
        DECODING_STATS.add(out["l0drop_gates"][0], net_input["src_tokens"].eq(self.padding_idx), self.pruned_decoding)
        return out

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order: Tensor):
        """Nothing is copied: fairseq's generator calls this at every step, but our decoder reads the
        memory only at the first step and caches what it needs per sentence from there (keys and
        values, log counts, the attention map), reordering those caches itself. The memory keeps one
        row per sentence (fairseq's beamable encoder-decoder attention, as BART uses it)."""
        return encoder_out


def pruned_output(out: Dict[str, List[Tensor]], mem: CompressedMemory, gates: Tensor) -> Dict[str, List[Tensor]]:
    """The encoder output that hands the decoder the compressed memory ``mem`` (``out``: fairseq's encoder's)."""
    return {
        "encoder_out": [mem.memory],
        "encoder_padding_mask": [mem.padding_mask],
        "encoder_embedding": [],  # nothing downstream reads it; not carrying it saves copies
        "encoder_states": out["encoder_states"],
        "fc_results": [],
        "src_tokens": [],
        "src_lengths": out["src_lengths"],
        "l0drop_gates": [gates],
        "l0drop_log_count": [mem.log_count],
        "l0drop_kept_index": [mem.kept_index],
        "l0drop_pruned": [mem.pruned],
    }


class CountAwareDecoderLayer(SublayerDecoderLayer):
    """fairseq's decoder layer (in the --decoder-sublayer-order / --simplified-decoder layout) with
    :class:`CountAwareAttention` as encoder-decoder attention for softmax; the other
    --encdec-attention-normaliser choices use NormalisedAttention, also a CountAwareAttention."""

    encdec_softmax_cls = CountAwareAttention


class L0DropTransformerDecoder(SublayerTransformerDecoder):
    """A decoder that reads the compressed memory: count-aware encoder-decoder attention, and attention
    weights mapped back to the original source positions for --print-alignment / --replace-unk."""

    layer_cls = CountAwareDecoderLayer

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
