"""The universal probing scheme of Yang et al. (2020), Sec. 3.1, Fig. 2, Eq. 1, and its training loop.

A frozen translation model is run teacher-forced; every decoder module's representation
H = (h_1 .. h_M) (one vector per target position) is read, and a one-layer Transformer decoder (the
*probe*) is trained to recover a word sequence x from H by forced decoding:

    PPL(x | H) = sum_n -log P(x_n | x_<n, H)                                       (Eq. 1)

reported per token (nll, and perplexity exp(nll)) on held-out data: the lower, the more of x the
representation holds. x is the source sentence (an auto-encoder over the decoder's states) or the
target sentence. For the target, the probe's encoder-decoder attention may not look at the states of
the translation history that have already seen the word to recover: h_j was computed from the target
words y_1..y_j, so the probe predicting y_n attends only to h_j with j < n (``causal memory``);
y_n itself is never an input to a state the probe reads.

Modules per decoder layer (:mod:`fairseq_sparse.modules.decoder_layer` has the definitions):
``tem``, ``sem``, ``ifm`` (Fig. 3), and inside the IFM ``addnorm1``, ``ffn``, ``addnorm2`` (Fig. 8).
Our decoder layers record them themselves; fairseq's own ``TransformerDecoderLayerBase`` (stock
``transformer`` checkpoints) is read with forward hooks at the same points.

Training and evaluation (:func:`probe_model`): all probes train together on the same batches of the
frozen model (disjoint parameters, one Adam step on the sum of their per-token losses) for at most
``max_updates`` updates / ``max_epochs`` passes, then report the per-token NLL and perplexity of each
on held-out batches.
"""
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.data import data_utils
from fairseq.models.transformer import Embedding, TransformerConfig, TransformerDecoderBase
from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from torch import Tensor, nn

from ..modules.decoder_layer import SublayerDecoderLayer
from ..modules.encoder_patterns import encoder_inputs

#: the modules of a decoder layer that can be probed (Yang et al. 2020, Figs. 3 and 8)
MODULES = ("tem", "sem", "ifm", "addnorm1", "ffn", "addnorm2")
MODULE_LABELS = {"tem": "TEM", "sem": "SEM", "ifm": "IFM", "addnorm1": "Add-Norm I", "ffn": "FFN",
                 "addnorm2": "Add-Norm II"}
PROBE_KINDS = ("source", "target")


def layer_modules(layer: nn.Module) -> List[str]:
    """The probe-able modules a decoder layer has (a simplified layer has no FFN / Add-Norm II, a
    sem-ifm layer no TEM)."""
    has = {
        "tem": getattr(layer, "self_attn", None) is not None,
        "sem": getattr(layer, "encoder_attn", None) is not None,
        "ifm": True,
        "addnorm1": getattr(layer, "encoder_attn", None) is not None,
        "ffn": getattr(layer, "fc1", None) is not None,
        "addnorm2": getattr(layer, "fc1", None) is not None,
    }
    return [m for m in MODULES if has[m]]


class DecoderModuleRecorder:
    """Context manager: after a decoder forward pass, ``records[i][module]`` is layer i's representation
    (T x B x C) of each module. Works on our :class:`SublayerDecoderLayer` (it records itself) and on
    fairseq's ``TransformerDecoderLayerBase`` (forward hooks at the same points: post-norm TEM and
    Add-Norm I are the outputs of ``self_attn_layer_norm`` / ``encoder_attn_layer_norm``; pre-norm they
    are the residual sums, i.e. the inputs of ``encoder_attn_layer_norm`` / ``final_layer_norm``)."""

    def __init__(self, layers: Sequence[nn.Module]):
        self.layers = list(layers)
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, TransformerDecoderLayerBase):
                raise ValueError(f"decoder layer {i} is a {type(layer).__name__}, not a fairseq transformer decoder "
                                 "layer: cannot read its modules")
        self.records: List[Dict[str, Tensor]] = [{} for _ in self.layers]
        self._handles = []

    def __enter__(self):
        for i, layer in enumerate(self.layers):
            rec = self.records[i]
            if isinstance(layer, SublayerDecoderLayer):
                layer.record = rec
                continue
            self._hook_stock_layer(layer, rec)
        return self

    def _hook_stock_layer(self, layer, rec):
        def output_of(name, index=None):
            def hook(module, args, output):
                rec[name] = output if index is None else output[index]
            return hook

        def input_of(name):
            def hook(module, args):
                rec[name] = args[0]
            return hook

        def layer_output(module, args, output):
            rec["ifm"] = rec["addnorm2"] = output[0]  # a stock layer ends with its FFN block

        hooks = [(layer, layer_output, False), (layer.encoder_attn, output_of("sem", 0), False),
                 (layer.fc2, output_of("ffn"), False)]
        if layer.normalize_before:
            hooks += [(layer.encoder_attn_layer_norm, input_of("tem"), True),
                      (layer.final_layer_norm, input_of("addnorm1"), True)]
        else:
            hooks += [(layer.self_attn_layer_norm, output_of("tem"), False),
                      (layer.encoder_attn_layer_norm, output_of("addnorm1"), False)]
        for module, hook, pre in hooks:
            if module is not None:
                register = module.register_forward_pre_hook if pre else module.register_forward_hook
                self._handles.append(register(hook))

    def reset(self):
        for rec in self.records:
            rec.clear()

    def __exit__(self, *exc):
        for layer in self.layers:
            if isinstance(layer, SublayerDecoderLayer):
                layer.record = None
        for h in self._handles:
            h.remove()
        self._handles = []
        return False


class CausalMemoryAttention(MultiheadAttention):
    """Encoder-decoder attention of the target probe: query i attends to memory positions j <= i only
    (memory and queries are both target positions; see the module docstring). Full-sequence passes only.

    The memory padding is applied here per query, together with the causal mask: with left-padded
    targets a leading pad query sees only padded memory, and a softmax over nothing but -inf would give
    NaN, which the backward pass spreads (0 * NaN) to every probe parameter although that query's loss is
    excluded. Such a query attends to the whole memory instead: finite, and never counted."""

    _memory_pad: Optional[Tensor] = None

    def forward(self, query, key, value, key_padding_mask=None, **kwargs):
        self._memory_pad = key_padding_mask
        try:
            return super().forward(query, key, value, key_padding_mask=None, **kwargs)
        finally:
            self._memory_pad = None

    def apply_sparse_mask(self, attn_weights: Tensor, tgt_len: int, src_len: int, bsz: int):
        hidden = torch.ones(1, tgt_len, src_len, dtype=torch.bool, device=attn_weights.device).triu(1)
        if self._memory_pad is not None:
            hidden = hidden | self._memory_pad.bool().unsqueeze(1)  # B x T x S
        hidden = hidden & ~hidden.all(dim=-1, keepdim=True)  # a query that would see nothing sees all
        weights = attn_weights.view(-1, self.num_heads, tgt_len, src_len)
        return weights.masked_fill(hidden.unsqueeze(1), float("-inf")).view_as(attn_weights)


class _ProbeLayer(TransformerDecoderLayerBase):
    def __init__(self, cfg, causal_memory: bool):
        self.causal_memory = causal_memory
        super().__init__(cfg)

    def build_encoder_attention(self, embed_dim, cfg):
        cls = CausalMemoryAttention if self.causal_memory else MultiheadAttention
        return cls(embed_dim, cfg.decoder.attention_heads, kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim,
                   dropout=cfg.attention_dropout, encoder_decoder_attention=True)


class ProbeDecoder(TransformerDecoderBase):
    """The probing model of Fig. 2: a one-layer fairseq Transformer decoder that reads a module's
    representation (``Input 1``, as its encoder output) and forced-decodes the word sequence (``Input 2``)."""

    def __init__(self, dictionary, memory_dim: int, embed_dim: int, ffn_dim: int, heads: int, dropout: float,
                 causal_memory: bool, max_positions: int = 4096):
        cfg = TransformerConfig()
        cfg.decoder.layers = 1
        cfg.decoder.embed_dim = cfg.decoder.input_dim = cfg.decoder.output_dim = embed_dim
        cfg.decoder.ffn_embed_dim = ffn_dim
        cfg.decoder.attention_heads = heads
        cfg.encoder.embed_dim = memory_dim
        cfg.dropout = cfg.attention_dropout = dropout
        cfg.share_decoder_input_output_embed = True
        cfg.max_target_positions = max_positions
        self._causal_memory = causal_memory
        embed = Embedding(len(dictionary), embed_dim, dictionary.pad())
        super().__init__(cfg, dictionary, embed, no_encoder_attn=False)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _ProbeLayer(cfg, self._causal_memory)

    def nll(self, memory: Tensor, memory_pad: Tensor, prev_tokens: Tensor, target: Tensor) -> Tensor:
        """Summed negative log-likelihood (nats) of ``target`` given the memory (T x B x C) (Eq. 1). The
        memory at padded positions is zeroed: it is never read, and a frozen decoder may leave anything there."""
        memory = memory.masked_fill(memory_pad.t().unsqueeze(-1), 0.0)
        enc = {"encoder_out": [memory], "encoder_padding_mask": [memory_pad]}
        logits, _ = self(prev_tokens, encoder_out=enc)
        lprobs = F.log_softmax(logits.float(), dim=-1)
        return F.nll_loss(lprobs.view(-1, lprobs.size(-1)), target.reshape(-1), ignore_index=self.padding_idx,
                          reduction="sum")


def source_sequences(src_tokens: Tensor, pad: int, eos: int):
    """(prev_tokens, target) to recover the source: the source sentence (with its EOS) right-padded, and
    the same shifted right with EOS in front (fairseq's decoder-input convention)."""
    rows = [row[row.ne(pad)] for row in src_tokens]
    prev = data_utils.collate_tokens(rows, pad, eos, left_pad=False, move_eos_to_beginning=True)
    target = data_utils.collate_tokens(rows, pad, eos, left_pad=False)
    return prev, target


class ProbeSet(nn.Module):
    """One :class:`ProbeDecoder` per (kind, layer, module); trained together on the same batches (their
    parameters are disjoint, so the summed loss trains each as if alone)."""

    def __init__(self, keys, dictionaries, memory_dim: int, embed_dim: int, ffn_dim: int, heads: int, dropout: float):
        super().__init__()
        self.keys = list(keys)
        self.probes = nn.ModuleDict({
            self.name(k): ProbeDecoder(dictionaries[k[0]], memory_dim, embed_dim, ffn_dim, heads, dropout,
                                       causal_memory=k[0] == "target")
            for k in self.keys
        })

    @staticmethod
    def name(key):
        kind, layer, module = key
        return f"{kind}_{layer}_{module}"

    def losses(self, records: List[Dict[str, Tensor]], memory_pad: Tensor, sequences) -> Dict[tuple, Tensor]:
        """Summed NLL per probe; ``sequences[kind]`` = (prev_tokens, target)."""
        out = {}
        for key in self.keys:
            kind, layer, module = key
            prev, target = sequences[kind]
            out[key] = self.probes[self.name(key)].nll(records[layer][module].detach(), memory_pad, prev, target)
        return out


def check_modules(layers: Sequence[nn.Module], wanted: Optional[Sequence[str]], layer_ids: Sequence[int],
                  what: str = "the checkpoint") -> List[str]:
    """The modules to probe: ``wanted`` (each must exist in every chosen layer, else a clear error) or,
    when None, every module all chosen layers have."""
    have = [set(layer_modules(layers[i])) for i in layer_ids]
    common = [m for m in MODULES if all(m in h for h in have)]
    if wanted is None:
        return common
    for m in wanted:
        if m not in MODULES:
            raise ValueError(f"unknown module {m!r}; choose from {', '.join(MODULES)}")
        for i, h in zip(layer_ids, have):
            if m not in h:
                why = {"tem": "no self-attention (sub-layer order sem-ifm)",
                       "ffn": "no FFN (simplified decoder)", "addnorm2": "no FFN (simplified decoder)",
                       "sem": "no encoder-decoder attention", "addnorm1": "no encoder-decoder attention"}[m]
                raise ValueError(f"module {m}: decoder layer {i} of {what} has {why}; it has {', '.join(sorted(h))}")
    return list(wanted)


@contextmanager
def frozen(model: nn.Module):
    """The translation model in eval mode without gradients, restored afterwards."""
    was_training = model.training
    flags = [p.requires_grad for p in model.parameters()]
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, f in zip(model.parameters(), flags):
            p.requires_grad_(f)
        model.train(was_training)


# ------------------------------------------------------------------------------------------------
# training and evaluation (Yang et al. 2020, Sec. 3.1)


@dataclass
class ProbeSettings:
    """Sizes of the probes and their training schedule."""
    embed_dim: int
    ffn_dim: int
    heads: int
    dropout: float = 0.1
    lr: float = 1e-3
    max_updates: int = 2000
    max_epochs: int = 1
    log_interval: int = 100


def build_probes(kinds: Sequence[str], layer_ids: Sequence[int], modules: Sequence[str], dictionaries,
                 memory_dim: int, settings: ProbeSettings) -> ProbeSet:
    """One probe per (kind, layer, module); ``dictionaries[kind]`` is the vocabulary it recovers."""
    keys = [(k, l, m) for k in kinds for l in layer_ids for m in modules]
    return ProbeSet(keys, dictionaries, memory_dim=memory_dim, embed_dim=settings.embed_dim,
                    ffn_dim=settings.ffn_dim, heads=settings.heads, dropout=settings.dropout)


def forward_sequences(model, sample, recorder: DecoderModuleRecorder, kinds: Sequence[str], dictionaries):
    """Teacher-forced pass of the frozen model over ``sample``: (memory padding mask, {kind: (prev_tokens,
    target)}); the module representations are in ``recorder.records``."""
    net = sample["net_input"]
    recorder.reset()
    with torch.no_grad():
        enc = model.encoder(net["src_tokens"], **encoder_inputs(model.encoder, net))
        model.decoder(net["prev_output_tokens"], encoder_out=enc, src_lengths=net["src_lengths"])
    memory_pad = net["prev_output_tokens"].eq(dictionaries["target"].pad())
    seqs = {}
    if "source" in kinds:
        seqs["source"] = source_sequences(net["src_tokens"], dictionaries["source"].pad(),
                                          dictionaries["source"].eos())
    if "target" in kinds:
        seqs["target"] = (net["prev_output_tokens"], sample["target"])
    return memory_pad, seqs


def _probe_batches(model, probes: ProbeSet, recorder, samples: Iterable, dictionaries):
    """(samples moved to the probes' device, per-probe summed NLL, target tokens per kind) of each sample."""
    device = next(probes.parameters()).device
    kinds = sorted({key[0] for key in probes.keys})
    for sample in samples:
        if not sample:
            continue
        sample = utils.apply_to_sample(lambda t: t.to(device), sample)
        memory_pad, seqs = forward_sequences(model, sample, recorder, kinds, dictionaries)
        ntok = {k: int(t.ne(dictionaries[k].pad()).sum()) for k, (_, t) in seqs.items()}
        yield probes.losses(recorder.records, memory_pad, seqs), ntok


def train_probes(model, probes: ProbeSet, recorder, epochs: Callable[[int], Iterable], dictionaries,
                 settings: ProbeSettings) -> int:
    """Adam on the summed per-token losses of all probes; returns the number of updates. ``epochs(e)``
    gives the training samples of epoch ``e`` (1-based); when it has a ``log`` method (a fairseq progress
    bar), the mean NLL is logged there every ``settings.log_interval`` updates."""
    optimizer = torch.optim.Adam(probes.parameters(), lr=settings.lr)
    updates = 0
    probes.train()
    for epoch in range(1, settings.max_epochs + 1):
        itr = epochs(epoch)
        for losses, ntok in _probe_batches(model, probes, recorder, itr, dictionaries):
            loss = sum(v / ntok[key[0]] for key, v in losses.items())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            updates += 1
            if updates % settings.log_interval == 0 and hasattr(itr, "log"):
                itr.log({"mean_nll": round(loss.item() / len(probes.keys), 4)}, tag="train", step=updates)
            if updates >= settings.max_updates:
                return updates
    return updates


def evaluate_probes(model, probes: ProbeSet, recorder, samples: Iterable, dictionaries) -> List[dict]:
    """Per probe: {kind, layer, module, tokens, nll (nats per token), ppl = exp(nll)} on ``samples`` (Eq. 1)."""
    probes.eval()
    nll = {k: 0.0 for k in probes.keys}
    tokens = {k: 0 for k in probes.keys}
    with torch.no_grad():
        for losses, ntok in _probe_batches(model, probes, recorder, samples, dictionaries):
            for key, v in losses.items():
                nll[key] += float(v)
                tokens[key] += ntok[key[0]]
    results = []
    for key in probes.keys:
        per_token = nll[key] / max(tokens[key], 1)
        kind, layer, module = key
        results.append({"kind": kind, "layer": layer, "module": module, "tokens": tokens[key], "nll": per_token,
                        "ppl": math.exp(per_token)})
    return results


def probe_model(model, probes: ProbeSet, recorder: DecoderModuleRecorder, train_epochs: Callable[[int], Iterable],
                valid_samples: Callable[[], Iterable], dictionaries, settings: ProbeSettings) -> dict:
    """Train the probes on the frozen ``model`` (:func:`train_probes`), then evaluate them on the samples
    ``valid_samples()`` gives (:func:`evaluate_probes`): {updates, train_seconds, results}."""
    t0 = time.time()
    with frozen(model), recorder:
        updates = train_probes(model, probes, recorder, train_epochs, dictionaries, settings)
        train_seconds = time.time() - t0
        results = evaluate_probes(model, probes, recorder, valid_samples(), dictionaries)
    return {"updates": updates, "train_seconds": train_seconds, "results": results}
