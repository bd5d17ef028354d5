"""transformer_l0drop's encoder: L0Drop gates on the encoder output (and between its layers), the compressed memory
of Algorithm 1 handed to the decoder in eval mode (Zhang, Titov & Sennrich 2021), the compacted encoder, and the
sparsity rate of what fairseq's generators decoded (Sec. 6)."""
import atexit
import contextlib
import logging
import sys
import time
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.models.transformer import TransformerConfig, TransformerEncoder
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from torch import Tensor

from ..modules.count_attention import CountAwareAttention
from ..modules.encoder_merge import EncoderOutputMerge
from ..modules.encoder_patterns import EncoderOutputPattern
from ..modules.hard_concrete import HardConcrete
from ..modules.l0drop import CompactedEncoder, CompressedMemory, L0Drop, compress, decoder_padding_mask
from .sparse_transformer import wrap_layer

logger = logging.getLogger(__name__)


class DecodingStats:
    """Source tokens that fairseq's generators ran through L0Drop encoders in this process, and how many
    were pruned (g_hat = 0): the sparsity rate of Zhang, Titov & Sennrich (2021) Sec. 6. Reported once,
    when the process ends, as a line like fairseq's own end-of-run lines. Only counts are kept (no model
    is held in memory), summed over every model that decoded (a tool that loads several checkpoints);
    :meth:`counting` counts one block of a longer process apart (the hub's ``generate`` in a program)."""

    def __init__(self, at_exit: bool = True):
        self.sentences = self.src_tokens = self.pruned = 0
        self.modes = set()
        self.registered = not at_exit
        self.blocks: List["DecodingStats"] = []

    def add(self, gates: Tensor, pad: Tensor, pruned_decoding: bool):
        if not self.registered:
            atexit.register(self.report)
            self.registered = True
        sentences, tokens, pruned = gates.size(0), int((~pad).sum()), int(((gates == 0) & ~pad).sum())
        for stats in [self] + self.blocks:
            stats.sentences += sentences
            stats.src_tokens += tokens
            stats.pruned += pruned
            stats.modes.add("on" if pruned_decoding else "off")

    @contextlib.contextmanager
    def counting(self):
        """Count what is decoded inside the block apart, e.g. one call of the hub's ``generate``::

            with DECODING_STATS.counting() as stats:
                model.translate(sentences)
            print(stats.line())      # that block's sparsity rate; the process's line at exit still counts it

        Yields a new DecodingStats (``sentences``, ``src_tokens``, ``pruned``, :meth:`line`) reported nowhere."""
        block = DecodingStats(at_exit=False)
        self.blocks.append(block)
        try:
            yield block
        finally:
            self.blocks.remove(block)

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
        embed_dim, n = embed_tokens.embedding_dim, len(self.layers)
        self.pattern = output_pattern(args, dictionary)
        self.l0drop = make_l0drop(args, embed_dim, "l0drop", n) if self.pattern is None else None
        self.merge = output_merge(args, embed_dim)
        self.layer_l0drops = torch.nn.ModuleList([make_l0drop(args, embed_dim, f"l0drop_layer{k + 1}", n)
                                                  for k in range(n - 1)]) if args.l0drop_between_layers else None
        self._generating = False  # inside forward_torchscript, the generators' entry point

    @property
    def reads_source_tags(self) -> bool:
        """True for the POS pattern: every batch needs ``net_input["src_tags"]``."""
        return self.pattern is not None and self.pattern.kind == "pos"

    def build_encoder_layer(self, args):
        cfg = TransformerConfig.from_namespace(args)
        return wrap_layer(CountAwareEncoderLayer(cfg, return_fc=self.return_fc), cfg)

    @torch.jit.unused  # the gates' sampling and statistics; TorchScript takes forward_test_time
    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False, token_embeddings=None,
                src_tags: Optional[Tensor] = None):
        """fairseq's encoder, then the gates; ``src_tags``: tag ids of the source tokens (the POS pattern)."""
        if self.layer_l0drops is not None:
            return self._forward_gated_layers(src_tokens, return_all_hiddens, token_embeddings)
        out = super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)
        pad, h = out["encoder_padding_mask"][0], out["encoder_out"][0]
        if self.pattern is not None:
            gates = self.pattern(src_tokens, pad, src_tags)
            x = h * gates.transpose(0, 1).unsqueeze(-1).to(h.dtype)
            self.pattern.record_rate(gates, pad)
        else:
            x, gates = self.l0drop(h, pad, alive=None)
        if self.merge is not None:  # pruned states folded into kept ones (--encoder-output-merge)
            x = self.merge(h, gates, pad)
        return gated_output(out, x, gates, self.dropped_as, self.training or not self.pruned_decoding)

    @torch.jit.unused
    def _forward_gated_layers(self, src_tokens, return_all_hiddens: bool, token_embeddings):
        """--l0drop-between-layers, eager: compacted (:class:`CompactedEncoder`) for fairseq's generators with
        --compact-encoder and pruned decoding; other callers see every layer's states at their original positions."""
        pad = src_tokens.eq(self.padding_idx)
        rows = CompactedEncoder(pad) if (self._generating and self.compact_encoder and self.pruned_decoding
                                         and not self.training and not return_all_hiddens) else None
        try:
            h, embedding, alive, states = self.forward_layers(src_tokens, token_embeddings, return_all_hiddens, rows)
        finally:
            self.clear_log_counts()
        lengths = source_lengths(src_tokens, self.padding_idx)
        if rows is not None:
            x, gates = self.l0drop(h, rows.live_pad, dropped_before=rows.dropped_before())
            return compacted_output(rows, x, gates, self.dropped_as, lengths)
        x, gates = self.l0drop(h, pad, alive=alive)
        out = fairseq_encoder_out(h, pad, embedding, states, len(self.layers) if return_all_hiddens else 0, lengths)
        return gated_output(out, x, gates, self.dropped_as, self.training or not self.pruned_decoding)

    def forward_layers(self, src_tokens: Tensor, token_embeddings: Optional[Tensor], return_all_hiddens: bool,
                       rows: Optional[CompactedEncoder], test_time: bool = False
                       ) -> Tuple[Tensor, Tensor, Optional[Tensor], List[Tensor]]:
        """--l0drop-between-layers, eager and scripted: fairseq's embedding, encoder layers and final LayerNorm (as its
        forward_scriptable), L0Drop after every layer but the last (its forward, or ``test_time`` its g_hat only).
        Dropped states stay in place (zeros, or masked from later self-attention), or leave the ``rows`` of a compacted
        encoder. Returns (states before the output gates, the embedding, the alive states if not compacted, hiddens)."""
        pad = src_tokens.eq(self.padding_idx)
        has_pads = bool(pad.any())
        x, embedding = self.forward_embedding(src_tokens, token_embeddings)
        x = (x * (1 - pad.unsqueeze(-1).type_as(x))).transpose(0, 1)
        states: List[Tensor] = [x] if return_all_hiddens else []
        alive: Optional[Tensor] = None
        gated = self.layer_l0drops
        assert gated is not None
        # log counts: hasattr, not isinstance (and not a layer whose heads were all pruned), see the L0Drop decoder's
        for layer, gate in zip(self.layers, gated):  # every layer but the last, each followed by its gates
            mask, log_count = layer_inputs(pad, has_pads, alive, rows, self.dropped_as)
            if hasattr(layer.self_attn, "log_count_for_call"):
                layer.self_attn.log_count = log_count
            x = layer(x, encoder_padding_mask=mask)
            if test_time or torch.jit.is_scripting():  # the gates' forward does not script
                assert rows is not None  # the test-time encoder always compacts
                x, gates = gate.test_time_gates(x, rows.live_pad)
            elif rows is None:
                x, gates = gate(x, pad, alive=alive)
                alive = gates != 0
            else:
                x, gates = gate(x, rows.live_pad, dropped_before=rows.dropped_before())
            if rows is not None:
                x = rows.compact(x, gates, self.dropped_as)
            if return_all_hiddens:
                states.append(x)
        last = self.layers[-1]  # not self.layers[-1:]: TorchScript (2.13) takes that slice from the first layer
        mask, log_count = layer_inputs(pad, has_pads, alive, rows, self.dropped_as)
        if hasattr(last.self_attn, "log_count_for_call"):
            last.self_attn.log_count = log_count
        x = last(x, encoder_padding_mask=mask)
        if return_all_hiddens:
            states.append(x)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return x, embedding, alive, states

    def clear_log_counts(self):
        for layer in self.layers:
            if hasattr(layer.self_attn, "log_count_for_call"):
                layer.self_attn.log_count = None

    def forward_test_time(self, src_tokens: Tensor, src_lengths: Tensor) -> Dict[str, List[Tensor]]:
        """What the generators get in eval mode, in code TorchScript compiles (fairseq-sparse-export): g_hat (or a
        pattern's gates), merged states, the compressed memory (or the gated one); between layers compacted."""
        pad = src_tokens.eq(self.padding_idx)
        l0drop = self.l0drop
        if self.layer_l0drops is not None:
            assert l0drop is not None  # no pattern between layers
            rows = CompactedEncoder(pad)
            x = self.forward_layers(src_tokens, None, False, rows, test_time=True)[0]
            self.clear_log_counts()
            x, gates = l0drop.test_time_gates(x, rows.live_pad)
            return compacted_output(rows, x, gates, self.dropped_as, source_lengths(src_tokens, self.padding_idx))
        out = self.forward_scriptable(src_tokens, src_lengths, False, None)
        h = out["encoder_out"][0]
        pattern = self.pattern
        if pattern is not None:  # a rule (not the POS pattern: no tags reach a scripted model)
            gates = pattern(src_tokens, pad, None)
            x = h * gates.transpose(0, 1).unsqueeze(-1).to(h.dtype)
        else:
            assert l0drop is not None
            x, gates = l0drop.test_time_gates(h, pad)
        merge = self.merge
        if merge is not None:
            x = merge(h, gates, pad)
        return gated_output(out, x, gates, self.dropped_as, not self.pruned_decoding)

    def forward_torchscript(self, net_input: Dict[str, Tensor]):
        """The entry point of fairseq's generators, where the encoder is compacted (``--compact-encoder``) and the
        sparsity of decoded sources counted. Scripted (fairseq-sparse-export): :meth:`forward_test_time`."""
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
        """Nothing is copied: our decoder reads the memory at the first step only and reorders its own caches."""
        return encoder_out


def make_l0drop(args, embed_dim: int, name: str, layers: int) -> L0Drop:
    """An L0Drop module of the options, its penalty averaged over the gated layers under --l0drop-layer-penalty mean
    (``layers``: the encoder's)."""
    gated_layers = layers if args.l0drop_between_layers else 1
    scale = 1.0 / gated_layers if args.l0drop_layer_penalty == "mean" else 1.0
    gate = HardConcrete(args.l0drop_beta, args.l0drop_gamma, args.l0drop_zeta)
    return L0Drop(embed_dim, gate, args.l0drop_init_bias, name=name, penalty_scale=scale)


def gated_output(out: Dict[str, List[Tensor]], x: Tensor, gates: Tensor, dropped_as: str,
                 in_place: bool) -> Dict[str, List[Tensor]]:
    """``out`` (fairseq's encoder's) with the gated states ``x``: in place, or the compressed memory."""
    pad = out["encoder_padding_mask"][0]
    if in_place:
        mask = decoder_padding_mask(gates, pad, dropped_as)
        assert mask is not None  # pad is a tensor
        out["encoder_out"], out["encoder_padding_mask"], out["l0drop_gates"] = [x], [mask], [gates]
        return out
    return pruned_output(out, compress(x, gates, pad, dropped_as), gates)


def layer_inputs(pad: Tensor, has_pads: bool, alive: Optional[Tensor], rows: Optional[CompactedEncoder],
                 dropped_as: str) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """(padding mask, log counts) of an encoder layer's self-attention between L0Drop gates: the compacted rows'
    once a gate dropped states, the states dropped so far hidden (``mask``), else fairseq's (None without padding)."""
    if rows is not None and rows.memory is not None:
        mask, log_count = rows.layer_inputs()
        return mask, log_count
    if alive is not None and dropped_as == "mask":
        return decoder_padding_mask(alive.to(torch.float32), pad, "mask"), None
    return (pad if has_pads else None), None


def fairseq_encoder_out(h: Tensor, pad: Tensor, embedding: Tensor, states: List[Tensor], fc_results: int,
                        lengths: Tensor):
    """The output of fairseq's encoder (TransformerEncoderBase.forward_scriptable); ``fc_results``: how many Nones."""
    return {"encoder_out": [h], "encoder_padding_mask": [pad], "encoder_embedding": [embedding],
            "encoder_states": states, "fc_results": [None] * fc_results, "src_tokens": [], "src_lengths": [lengths]}


def source_lengths(src_tokens: Tensor, padding_idx: int) -> Tensor:
    """fairseq's encoder's ``src_lengths`` output: B x 1, int32."""
    return src_tokens.ne(padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()


def compacted_output(rows: CompactedEncoder, x: Tensor, gates: Tensor, dropped_as: str,
                     lengths: Tensor) -> Dict[str, List[Tensor]]:
    """The encoder output of a compacted encoder: the output gates over the rows, the memory at the original
    source positions."""
    mem = rows.original_memory(compress(x, gates, rows.live_pad, dropped_as, rows.dropped()))
    out: Dict[str, List[Tensor]] = {"encoder_states": [], "src_lengths": [lengths]}
    return pruned_output(out, mem, rows.original_gates(gates))


def output_pattern(args, dictionary) -> Optional[EncoderOutputPattern]:
    """--encoder-output-pattern: a rule instead of learnt gates (Zhang, Titov & Sennrich 2021 Sec. 7), no L0Drop
    module to train; None for "none"."""
    if args.encoder_output_pattern == "none":
        return None
    pattern = EncoderOutputPattern(
        args.encoder_output_pattern, dictionary.count, dictionary.nspecial, dictionary.eos(),
        top_k=args.encoder_output_pattern_top_k, min_rank=args.encoder_output_pattern_min_rank,
        every=args.encoder_output_pattern_every, rate=args.encoder_output_pattern_rate, symbols=dictionary.symbols,
        whole_words=getattr(args, "encoder_output_pattern_whole_words", False))
    share = pattern.dropped_share(dictionary.count)
    logger.info("encoder output pattern %s%s", pattern.extra_repr(), "" if share is None else
                f": drops {'at most ' if pattern.whole_words else ''}{100 * share:.1f}% of the dictionary's counted tokens")
    return pattern


def output_merge(args, embed_dim: int) -> Optional[EncoderOutputMerge]:
    """--encoder-output-merge: pruned states folded into kept ones; None for "none"."""
    kind = getattr(args, "encoder_output_merge", "none")
    return None if kind == "none" else EncoderOutputMerge(kind, embed_dim)


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
