"""A beam search whose tensors keep their shapes, so that a CUDA graph can replay its step.

fairseq's SequenceGenerator (fairseq/sequence_generator.py ``_generate``) removes finished sentences from the batch,
keeps finished hypotheses in Python lists and reads ``eos_bbsz_idx.numel()`` on the host at every step; on a GPU that
host work is the step. This search is the same beam search (fairseq's candidate rule, length penalty, min/max length,
unk penalty, n-gram blocking, temperature) for any model SequenceGenerator decodes, with the same hypotheses and
scores (tests/unit/test_fixed_shape_search.py), written so that a step has no host read and fixed shapes:

* the batch x beam rows are never removed: a finished sentence is masked, its rows frozen; whether every sentence is
  finished is read every ``stop_every`` steps;
* finished hypotheses go to preallocated tensors, a candidate that is not taken to a spare slot;
* the decoder self-attention keys and values sit in buffers preallocated to the maximum length
  (``search/static_cache.py``); the beams of a sentence stay in its rows, so the encoder output, the
  encoder-decoder keys and values and all other per-sentence state are never reordered (fairseq copies them at every
  step); only per-hypothesis state is;
* every step-dependent quantity (the position written, the positional embedding, the min/max-length rules, the length
  penalty) comes from a step tensor.

Two forms of one step (:meth:`FixedShapeSequenceGenerator._step`): ``prefix`` gives the decoder the target prefix and
reads the buffers up to the step (shapes grow with the step: the eager form), ``fixed`` gives it the step's token and
reads the whole buffers, masked after the step (the same shapes at every step). On CUDA the fixed form is captured in a
CUDA graph once per shape (:class:`StepGraphs`) and replayed. The default, ``auto``, uses the graphs where they can
run and fairseq's own search elsewhere (on the CPU; models whose state a graph cannot replay: state per hypothesis
that is replaced rather than updated in place, such as coverage attention), the reason logged once (n-gram blocking
runs inside the captured step: ``patches/ngram_block.py``): without the graph a step of fixed shape only costs more, since it
keeps computing the rows of finished sentences that fairseq's search drops (0.78x fairseq-generate on the CPU, a trained checkpoint:
docs/fixed-shape-search.md#speed).
"""
import functools
import hashlib
import inspect
import logging
import math
from collections import OrderedDict
from contextlib import ExitStack, contextmanager
from typing import Dict, List, Optional, Tuple

import fairseq
import torch
from fairseq.models import FairseqIncrementalDecoder
from fairseq.modules import MultiheadAttention
from fairseq.search import BeamSearch
from fairseq.sequence_generator import SequenceGenerator
from torch import Tensor

from ..modules.head_gates import HeadlessAttention
from .shared_memory import SharedMemoryAttention, TransformerEncoderBase
from ..patches.ngram_block import block_repeated_ngrams
from .static_cache import StaticCacheSelfAttention, cacheable, static_self_attention, step_positions, \
    why_no_step_positions

logger = logging.getLogger(__name__)

#: SequenceGenerator features this search does not implement, each refused before any decoding
UNSUPPORTED = ("sampling, diverse beam search, prefix tokens, constraints, --match-source-len, an LM, --print-alignment, "
               "--retain-dropout")
#: the forms of a step (module docstring); "auto": fixed and captured where CUDA graphs can replay it, else
#: fairseq's own search
STEP_FORMS = ("auto", "prefix", "fixed")
#: how the self-attention keys and values follow the beams in steps of fixed shape: copied to the new order (as
#: fairseq does), or left where they were written and read through an ancestry table (StaticCacheSelfAttention)
BEAM_REORDERS = ("copy", "indirect")
#: the fairseq whose beam search this one copies (fairseq-fixed's release), and the SHA-256 of the source of its
#: ``SequenceGenerator._generate`` there
FAIRSEQ_VERSION = "0.12.3.1"
FAIRSEQ_GENERATE_SHA256 = "6e998be71a44f7677f3de54a6d892bb11d1e65e23b548de6ce4d732a4ff401db"


@functools.lru_cache(maxsize=None)
def installed_generate_sha256() -> Optional[str]:
    """SHA-256 of the source of the installed fairseq's ``SequenceGenerator._generate``; None where it cannot be
    read (no source files installed)."""
    try:
        return hashlib.sha256(inspect.getsource(SequenceGenerator._generate).encode()).hexdigest()
    except (OSError, TypeError):
        return None


def check_fairseq():
    """ValueError naming the versions unless the installed fairseq's beam search is the one this search copies (its
    source hash; its version where the source cannot be read)."""
    found = installed_generate_sha256()
    if found == FAIRSEQ_GENERATE_SHA256 or (found is None and fairseq.__version__ == FAIRSEQ_VERSION):
        return
    raise ValueError(f"the fixed-shape search copies the beam search (SequenceGenerator._generate) of fairseq "
                     f"{FAIRSEQ_VERSION}; the installed fairseq {fairseq.__version__} has another one, so its "
                     f"hypotheses could differ from fairseq's: install fairseq-fixed=={FAIRSEQ_VERSION}, or decode "
                     "with --task translation")


def keeps_sentence_memory(attention) -> bool:
    """Whether an encoder-decoder attention's incremental state is the sentence's memory only (keys, values, padding
    mask, log counts): the same in every beam of the sentence, so never reordered here. fairseq's MultiheadAttention,
    and a class that says so in its own body (``fixed_shape_sentence_memory = True``): a subclass may add state per
    hypothesis (CoverageAttention does), and is reordered as fairseq reorders it unless it says so itself."""
    cls = type(attention)
    return attention.encoder_decoder_attention and (
        cls is MultiheadAttention or vars(cls).get("fixed_shape_sentence_memory", False))


def moves_with_the_beam(module) -> bool:
    """Whether a decoder module has incremental state per hypothesis, which must follow the beams as they reorder
    (fairseq reorders every module's state; here rows never leave, so per-sentence state stays where it is, and a
    module with no state, a headless layer or a decoder with fairseq's no-op, is left out). A module whose class (or
    a base) sets ``fixed_shape_sentence_state = True`` keeps none per hypothesis (L0Drop's decoder, a headless
    layer)."""
    if getattr(module, "fixed_shape_sentence_state", False):
        return False
    if isinstance(module, MultiheadAttention):
        return not keeps_sentence_memory(module)
    reorder = getattr(type(module), "reorder_incremental_state", None)
    return reorder is not None and reorder is not FairseqIncrementalDecoder.reorder_incremental_state


def why_not_one_memory_row(model) -> Optional[str]:
    """None if the search can give this model's decoder one encoder memory row per sentence, read by all its beams
    (:class:`SharedMemoryAttention`: the encoder-decoder keys and values computed once per sentence), where the model
    expands its memory over the beam (fairseq's encoder); else why not. L0Drop keeps one row already."""
    encoder, decoder = model.encoder, model.decoder
    if type(encoder).reorder_encoder_out is not TransformerEncoderBase.reorder_encoder_out:
        return f"its encoder ({type(encoder).__name__}) reorders its output itself"
    if getattr(decoder, "cross_self_attention", False):
        return "--cross-self-attention reads the memory in the self-attention"
    attentions = [getattr(layer, "encoder_attn", None) for layer in getattr(decoder, "layers", None) or []]
    if not any(type(a) is MultiheadAttention for a in attentions):
        return "it has no fairseq MultiheadAttention over the memory"
    for a in attentions:
        if a is not None and not isinstance(a, HeadlessAttention) and (
                type(a) is not MultiheadAttention or a.bias_k is not None or a.add_zero_attn
                or getattr(a, "use_xformers", False)):
            return f"its encoder-decoder attention ({type(a).__name__}) reads one memory row per hypothesis"
    return None


@contextmanager
def one_memory_row(models, allowed: bool = True):
    """For one ``generate`` call: the encoder-decoder attention of each model :func:`why_not_one_memory_row` allows
    becomes a :class:`SharedMemoryAttention` (same parameters; its class is put back afterwards). Yields, per model,
    whether its memory keeps one row per sentence (then it is not expanded over the beam). ``allowed`` False: none
    (models without incremental state)."""
    swapped = []
    try:
        shared = []
        for model in models:
            shared.append(allowed and why_not_one_memory_row(model) is None)
            if shared[-1]:
                for layer in model.decoder.layers:
                    if type(layer.encoder_attn) is MultiheadAttention:
                        layer.encoder_attn.__class__ = SharedMemoryAttention
                        swapped.append(layer.encoder_attn)
        yield shared
    finally:
        for attention in swapped:
            attention.__class__ = MultiheadAttention
            attention.__dict__.pop("hypotheses", None)


def padded_to_bucket(net_input, bucket: int, pad: int):
    """``net_input`` with the sources padded to a multiple of ``bucket`` tokens, on the side the batch is padded
    (fairseq's translation task pads on the left by default). The padded positions are masked, so the hypotheses are
    the same (to float rounding). Inputs other than the sources and their lengths are left alone, and so is then the
    batch."""
    src = net_input["src_tokens"]
    extra = int(-src.size(1) % bucket)
    if extra == 0 or set(net_input) - {"src_tokens", "src_lengths", "prev_output_tokens"}:
        return net_input
    padding = src.new_full((src.size(0), extra), pad)
    right = bool(src[:, -1].eq(pad).any()) and not bool(src[:, 0].eq(pad).any())
    return dict(net_input, src_tokens=torch.cat([src, padding] if right else [padding, src], dim=1))


#: the fields of L0Drop's compressed memory that run along its length T' (the memory itself is T' x B x C), and what
#: a padded position holds: masked, so it gets no attention weight whatever its count
MEMORY_FIELDS = {"encoder_padding_mask": True, "l0drop_log_count": 0.0, "l0drop_kept_index": 0}


def memory_padded_to_bucket(out, bucket: int):
    """An encoder output whose memory has one row per sentence and a length of its own (L0Drop's compressed memory:
    1 + the most states a sentence keeps) padded to a multiple of ``bucket`` rows, masked, so that batches of nearby
    kept lengths share a graph; the hypotheses are the same (to float rounding). Any other output as it is."""
    if not all(out.get(k) for k in ("encoder_out", *MEMORY_FIELDS)):
        return out
    memory = out["encoder_out"][0]
    extra = int(-memory.size(0) % bucket)
    if extra == 0:
        return out
    padded = dict(out, encoder_out=[torch.cat([memory, memory.new_zeros(extra, *memory.shape[1:])])])
    for name, value in MEMORY_FIELDS.items():
        field = out[name][0]
        padded[name] = [torch.cat([field, field.new_full((field.size(0), extra), value)], dim=1)]
    return padded


def beam_encoder_outs(models, encoder_outs, rows: Tensor, shared, bucket: Optional[int]):
    """The models' encoder outputs as the steps read them: expanded to the beam's ``rows`` (each row's sentence) but
    where the memory keeps one row per sentence (``shared``, per model), and padded to a multiple of ``bucket`` rows
    where given (:func:`memory_padded_to_bucket`). The beams of a sentence stay in its rows: the memory is never
    reordered after this (and where it is shared by the beams of a sentence, not expanded either)."""
    if encoder_outs is None:
        return None
    encoder_outs = [out if one else model.encoder.reorder_encoder_out(out, rows)
                    for model, out, one in zip(models, encoder_outs, shared)]
    if bucket is not None:
        encoder_outs = [memory_padded_to_bucket(out, bucket) for out in encoder_outs]
    return encoder_outs


class Beams:
    """The tensors of one batch's search, allocated once (a replayed step updates them in place): the step, the
    hypotheses' tokens and scores, and the finished hypotheses (``beam`` slots per sentence and a spare one)."""

    def __init__(self, bsz: int, beam: int, max_len: int, first_token: int, pad: int, eos: int, vocab: int, device):
        rows = bsz * beam
        self.bsz, self.beam, self.max_len = bsz, beam, max_len
        self.step = torch.zeros(1, dtype=torch.long, device=device)
        self.tokens = torch.full((rows, max_len + 2), pad, dtype=torch.long, device=device)
        self.tokens[:, 0] = first_token
        self.scores = torch.zeros(rows, max_len + 1, device=device)
        self.cumulative = torch.zeros(rows, device=device)
        self.ignore = torch.zeros(bsz, beam, dtype=torch.bool, device=device)
        self.done = torch.zeros(bsz, dtype=torch.bool, device=device)
        self.fin_tokens = torch.full((bsz, beam + 1, max_len + 1), pad, dtype=torch.long, device=device)
        self.fin_pos = torch.zeros(bsz, beam + 1, max_len + 1, device=device)
        self.fin_score = torch.full((bsz, beam + 1), -math.inf, device=device)
        self.fin_len = torch.zeros(bsz, beam + 1, dtype=torch.long, device=device)
        self.fin_count = torch.zeros(bsz, dtype=torch.long, device=device)
        self.offsets = (torch.arange(bsz, device=device) * beam).unsqueeze(1)
        self.slot_offsets = (torch.arange(bsz, device=device) * (beam + 1)).unsqueeze(1)
        self.cand_offsets = torch.arange(2 * beam, device=device)
        self.not_eos = torch.arange(vocab, device=device).ne(eos)  # the columns the last step closes

    def scores_as(self, lprobs: Tensor):
        """Scores in the precision of the model's log-probabilities (fairseq's ``scores.type_as(lprobs)``)."""
        for name in ("scores", "cumulative", "fin_pos", "fin_score"):
            setattr(self, name, getattr(self, name).type_as(lprobs))

    def hypotheses(self):
        """SequenceGenerator's output: per sentence its finished hypotheses, best first (sorted as fairseq sorts
        them), each a dict of tokens, score, positional scores and (empty) attention and alignment, copied out of
        the buffers: a captured graph's buffers are the next batch's of the same shape (the hub's ``translate`` and
        fairseq-interactive decode several batches before they read any)."""
        out: List[List[Dict[str, Tensor]]] = []
        fin_count, fin_len, fin_score = self.fin_count.tolist(), self.fin_len.tolist(), self.fin_score.tolist()
        for s in range(self.bsz):
            n = fin_count[s]
            order = torch.sort(torch.tensor([float(x) for x in fin_score[s][:n]]), descending=True)[1].tolist()
            out.append([{"tokens": self.fin_tokens[s, i, :fin_len[s][i]].clone(), "score": self.fin_score[s, i].clone(),
                         "attention": torch.empty(0), "alignment": torch.empty(0),
                         "positional_scores": self.fin_pos[s, i, :fin_len[s][i]].clone()} for i in order])
        return out

    def finalise(self, length: int, eos, bbsz_idx, eos_scores, eos_token: int, normalize_scores: bool,
                 len_penalty: float):
        """fairseq's finalize_hypos with tensors and no host read: each EOS candidate (EOS: bsz x beam) takes the
        sentence's next free slot, in candidate order, while the sentence has fewer than beam finished hypotheses;
        every other candidate is written to the spare slot (index beam), which is never read. Positions after the
        step are written too (whatever the buffers hold there) and cut by the hypothesis' length."""
        beam = eos.size(1)
        slot = self.fin_count.unsqueeze(1) + eos.long().cumsum(1) - 1
        take = eos & slot.lt(beam)
        flat = (self.slot_offsets + torch.where(take, slot, torch.full_like(slot, beam))).view(-1)
        rows, score = bbsz_idx.reshape(-1), eos_scores.reshape(-1)
        at_step = self.step.expand(rows.numel(), 1)
        hyp = self.tokens.index_select(0, rows)[:, 1:length + 1]
        hyp.scatter_(1, at_step, eos_token)
        self.fin_tokens.view(-1, self.fin_tokens.size(2))[flat, :length] = hyp
        pos = self.scores.index_select(0, rows)[:, :length]
        pos.scatter_(1, at_step, score.view(-1, 1))
        pos[:, 1:] = pos[:, 1:] - pos[:, :-1]
        self.fin_pos.view(-1, self.fin_pos.size(2))[flat, :length] = pos
        if normalize_scores:  # fairseq divides by the Python float (step + 1) ** lenpen: in float32 for fp16
            score = (score.float() / (self.step + 1).double().pow(len_penalty).float()).to(score.dtype)
        self.fin_score.view(-1)[flat] = score
        self.fin_len.view(-1)[flat] = (self.step + 1).expand(flat.numel())
        self.fin_count += take.long().sum(1)


class Run:
    """What the steps of one ``generate`` call read and update: the beams, the encoder outputs, the decoders'
    incremental states, the modules that read the step tensor (self-attention with buffers, step positions), and the
    form of the step. A step reads only these (and the models' parameters), so a CUDA graph captured on one run
    replays another once that run's tensors are copied in."""

    def __init__(self, beams: Beams, encoder_outs, incremental_states, static, fixed: bool, movers):
        self.beams, self.encoder_outs, self.incremental_states = beams, encoder_outs, incremental_states
        self.static, self.fixed = static, fixed
        self.movers = movers  #: per decoder, its modules with state per hypothesis (:func:`moves_with_the_beam`)
        self.graph = None  # the CUDA graph that steps this run, once found or captured

    def length(self, step: int) -> int:
        """Positions a step reads: up to the step (prefix form) or all (fixed form)."""
        return self.beams.max_len + 1 if self.fixed else step + 1

    def reorder_states(self, order: Tensor):
        """Each decoder module's per-hypothesis state to the new order (fairseq's ``reorder_incremental_state``,
        less the per-sentence state: :func:`moves_with_the_beam`)."""
        for modules, state in zip(self.movers, self.incremental_states):
            for module in modules:
                if isinstance(module, StaticCacheSelfAttention):
                    module.reorder_static(state, order)
                else:
                    module.reorder_incremental_state(state, order)

    def tensors(self):
        """(name, tensor) of everything a step reads or writes, in a fixed order (what a graph is keyed by and what
        a new batch copies into a captured one)."""
        out = []

        def walk(name, obj):
            if isinstance(obj, Tensor):
                out.append((name, obj))
            elif isinstance(obj, dict):
                for k in sorted(obj):
                    walk(f"{name}.{k}", obj[k])
            elif isinstance(obj, (list, tuple)):
                for i, x in enumerate(obj):
                    walk(f"{name}.{i}", x)

        walk("beams", vars(self.beams))
        walk("encoder", self.encoder_outs)
        walk("state", self.incremental_states)
        return out


class StepGraphs:
    """The fixed-form step captured in CUDA graphs, one per shape (the names, shapes and types of everything it
    reads), at most ``size`` kept (the least recently used dropped), all in one memory pool. The first step of a
    shape runs for real (the warm-up a capture needs) and is then captured; a later batch of a captured shape copies
    its tensors into the captured ones and replays. A graph holds the model's parameters by address: parameters
    updated in place are read anew, replaced ones are not (build a new generator then)."""

    #: the device whose runs are captured
    device_type = "cuda"

    def __init__(self, size: int = 4):
        self.size, self.graphs, self.pool = size, OrderedDict(), None

    def step(self, generator, run: Run):
        """Step ``run`` by replaying its graph: found (or captured) at the first call of a run, which copies the
        run's tensors into the captured ones when another batch's run was captured."""
        if run.graph is None:
            key = tuple((name, tuple(t.shape), t.dtype) for name, t in run.tensors())
            if key not in self.graphs:
                self.graphs[key] = self._capture(generator, run)
                while len(self.graphs) > self.size:
                    self.graphs.popitem(last=False)
                run.graph = self.graphs[key][0]
                return  # the warm-up was this step
            self.graphs.move_to_end(key)
            graph, captured = self.graphs[key]
            for (_, mine), (_, theirs) in zip(captured.tensors(), run.tensors()):
                mine.copy_(theirs)
            run.beams, run.encoder_outs, run.incremental_states = (captured.beams, captured.encoder_outs,
                                                                   captured.incremental_states)
            run.graph = graph
        run.graph.replay()

    def _capture(self, generator, run: Run):
        """(graph, run) with this run's step captured, after running it for real (the warm-up)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            generator._step(run, 1)  # this step, for real: the warm-up
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            generator._step(run, 1)  # recorded, not run
        self.pool = graph.pool()
        return graph, run


@contextmanager
def decoder_flag(decoders, name: str, value):
    """Set a decoder attribute for one ``generate`` call. ``cross_self_attention`` True makes fairseq's decoder build
    the target padding mask without reading ``.any()`` on the host (the mask is all False for the tokens of a beam
    search; the layers have their own flag)."""
    old = [getattr(d, name) for d in decoders]
    try:
        for d in decoders:
            setattr(d, name, value)
        yield
    finally:
        for d, v in zip(decoders, old):
            setattr(d, name, v)


def check_settings(stop_every: int, step_form: str, max_graphs: int, source_bucket: int, beam_reorder: str = "copy",
                   ngram_blocker=None):
    """ValueError naming the flag of the first setting out of range (``ngram_blocker``: fairseq's, or None)."""
    if getattr(ngram_blocker, "no_repeat_ngram_size", 0) == 1:
        raise ValueError("--no-repeat-ngram-size 1 blocks every token already in a hypothesis, the end-of-sentence "
                         "symbol that starts it too, so none could end (fairseq's own search fails on it): use 2 "
                         "or more, or 0")
    if step_form not in STEP_FORMS:
        raise ValueError(f"step form {step_form!r}: choose from {', '.join(STEP_FORMS)}")
    if beam_reorder not in BEAM_REORDERS:
        raise ValueError(f"beam reorder {beam_reorder!r}: choose from {', '.join(BEAM_REORDERS)}")
    if beam_reorder == "indirect" and step_form == "prefix":
        raise ValueError("--fixed-shape-beam-reorder indirect reads whole buffers: it needs steps of fixed shape "
                         "(--fixed-shape-step-form fixed or auto), not prefix")
    for name, value, low in (("stop_every", stop_every, 1), ("max_graphs", max_graphs, 0),
                             ("source_bucket", source_bucket, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name} (--fixed-shape-{name.replace('_', '-')}) must be a whole number >= {low}, "
                             f"got {value!r}")


def why_not_fixed(decoders, movers, capacity: int, token_indices_to_suppress) -> Optional[str]:
    """None if the fixed form of the step (and a CUDA graph of it) can run these decoders (``movers``: each one's
    modules with state per hypothesis), else why not."""
    if not decoders:
        return "the model keeps no incremental state"
    if token_indices_to_suppress is not None:
        return "the symbols to strip are a host tensor"
    for decoder, modules in zip(decoders, movers):
        if not hasattr(decoder, "cross_self_attention"):
            return f"its decoder ({type(decoder).__name__}) is not fairseq's transformer decoder"
        reason = why_no_step_positions(decoder, capacity)
        if reason:
            return reason
        for module in modules:  # a cacheable self-attention's buffers are updated in place
            if not cacheable(module):
                return f"{type(module).__name__} keeps state per hypothesis that a step replaces"
    return None


class FixedShapeSequenceGenerator(SequenceGenerator):
    """fairseq's SequenceGenerator with a fixed-shape ``_generate`` (module docstring). ``stop_every``: the steps
    between two host reads of whether every sentence is finished (finished sentences are frozen meanwhile, so the
    result does not depend on it). ``step_form``: one of :data:`STEP_FORMS`. ``max_graphs``: CUDA graphs kept.
    ``source_bucket``: where steps are captured, sources (and L0Drop's compressed memories) are padded to a multiple
    of this many tokens, so that batches of nearby lengths share a graph (:func:`padded_to_bucket`,
    :func:`memory_padded_to_bucket`). ``beam_reorder``: one of :data:`BEAM_REORDERS`.

    It copies the beam search of one fairseq, whose private ``SequenceGenerator._generate`` it overrides
    (:data:`FAIRSEQ_VERSION`, and that method's source: :data:`FAIRSEQ_GENERATE_SHA256`). Built with another fairseq,
    it refuses with a ValueError naming both versions (``--task translation_fixed_shape``: one line), rather than
    decode other hypotheses than fairseq's without a word."""

    def __init__(self, *args, stop_every: int = 4, step_form: str = "auto", max_graphs: int = 4,
                 source_bucket: int = 16, beam_reorder: str = "copy", **kwargs):
        check_fairseq()
        super().__init__(*args, **kwargs)
        if type(self.search) is not BeamSearch:
            raise ValueError(f"the fixed-shape search is beam search only ({UNSUPPORTED} are not supported)")
        if self.match_source_len or self.lm_model is not None:
            raise ValueError(f"the fixed-shape search does not support {UNSUPPORTED}")
        check_settings(stop_every, step_form, max_graphs, source_bucket, beam_reorder, self.repeat_ngram_blocker)
        self.stop_every, self.step_form, self.source_bucket = stop_every, step_form, source_bucket
        self.beam_reorder = beam_reorder
        self.graphs = StepGraphs(max_graphs) if max_graphs > 0 else None
        self._told = set()
        # per decoder, its modules with state per hypothesis (:func:`moves_with_the_beam`): the models are fixed
        self.movers = [[m for m in model.decoder.modules() if moves_with_the_beam(m)]
                       for model in self.model.models] if self.model.has_incremental_states() else []

    def _form(self, decoders, capacity: int, device) -> Optional[Tuple[bool, bool]]:
        """(fixed form?, captured?) for this call; None where ``auto`` has no CUDA graph to replay: fairseq's own
        search then, faster without one (module docstring); the reason is logged once."""
        if self.step_form == "prefix":
            return False, False
        reason = why_not_fixed(decoders, self.movers, capacity, self.token_indices_to_suppress)
        captured = self.graphs is not None and device.type == self.graphs.device_type
        if self.step_form == "fixed":
            if reason is not None:
                raise ValueError(f"the fixed-shape search cannot give this model steps of fixed shape: {reason}")
            return True, captured
        if reason is None and captured:
            return True, True
        reason = reason or (f"no CUDA graph on {device.type}" if device.type != "cuda" else "CUDA graphs are off")
        if reason not in self._told:
            self._told.add(reason)
            logger.info("fixed-shape search: fairseq's own search, faster without a CUDA graph (%s)", reason)
        return None

    @torch.no_grad()
    def _generate(self, sample: Dict[str, Dict[str, Tensor]], prefix_tokens: Optional[Tensor] = None,
                  constraints: Optional[Tensor] = None, bos_token: Optional[int] = None):
        if prefix_tokens is not None or constraints is not None:
            raise ValueError(f"the fixed-shape search does not support {UNSUPPORTED}")
        incremental_states = torch.jit.annotate(
            List[Dict[str, Dict[str, Optional[Tensor]]]],
            [torch.jit.annotate(Dict[str, Dict[str, Optional[Tensor]]], {}) for _ in range(self.model.models_size)])
        src_tokens = sample["net_input"]["src_tokens"]
        bsz, src_len = src_tokens.size()[:2]
        max_len = min(int(self.max_len_a * src_len + self.max_len_b), self.max_len - 1)
        assert self.min_len <= max_len, "min_len cannot be larger than max_len, please adjust these!"
        decoders = [m.decoder for m in self.model.models] if self.model.has_incremental_states() else []
        form = self._form(decoders, max_len + 1, src_tokens.device)
        if form is None:
            return super()._generate(sample, prefix_tokens, constraints, bos_token)
        fixed, captured = form
        rows = torch.arange(bsz, device=src_tokens.device).repeat_interleave(self.beam_size)
        beams = Beams(bsz, self.beam_size, max_len, self.eos if bos_token is None else bos_token, self.pad, self.eos,
                      self.vocab_size, src_tokens.device)
        with ExitStack() as stack:
            shared = stack.enter_context(one_memory_row(self.model.models, bool(decoders)))
            # batches of nearby lengths share a graph; the maximum output length stays that of the batch as given
            net_input = (padded_to_bucket(sample["net_input"], self.source_bucket, self.pad) if captured
                         else sample["net_input"])
            encoder_outs = beam_encoder_outs(self.model.models, self.model.forward_encoder(net_input), rows, shared,
                                             self.source_bucket if captured else None)
            indirect = fixed and self.beam_reorder == "indirect"  # the buffers stay, an ancestry table moves
            static = stack.enter_context(static_self_attention(decoders, incremental_states, rows.numel(), max_len + 1,
                                                               zeroed=fixed, beam=self.beam_size if indirect else 0))
            if fixed:
                static = static + stack.enter_context(step_positions(decoders, max_len + 1))
                stack.enter_context(decoder_flag(decoders, "cross_self_attention", True))
            run = Run(beams, encoder_outs, incremental_states, static, fixed, self.movers)
            failure = self._steps(run, max_len, captured)
            if failure is None:
                return run.beams.hypotheses()
        logger.warning("fixed-shape search: a CUDA graph could not be captured or replayed (%s: %s); this generator "
                       "decodes without CUDA graphs from now on", type(failure).__name__, failure)
        self.graphs = None
        return self._generate(sample, prefix_tokens, constraints, bos_token)

    def _steps(self, run: Run, max_len: int, captured: bool) -> Optional[Exception]:
        """Step ``run`` until every sentence is finished (read every ``stop_every`` steps) or ``max_len + 1`` steps,
        replaying CUDA graphs after the first step where ``captured``; what a capture or replay raised, else None."""
        for step in range(max_len + 1):
            if captured and step > 0:
                try:
                    self.graphs.step(self, run)
                except Exception as e:  # noqa: BLE001  (whatever a capture raises: the batch is decoded anew)
                    return e
            else:
                self._step(run, step)
            if (step + 1) % self.stop_every == 0 and bool(run.beams.done.all()):
                break
        return None

    def _step(self, run: Run, step: int):
        """One beam step at ``run.beams.step``, every step-dependent quantity from that tensor, every update in place
        (fairseq's ``_generate`` loop body, less the removal of finished sentences). ``step``: the same step on the
        host, read only for the first step's rule and the prefix form's length."""
        b, beam = run.beams, self.beam_size
        length = run.length(step)
        for module in run.static:
            module.static_step, module.static_length = b.step, length
        tokens_in = b.tokens.gather(1, b.step.expand(b.tokens.size(0), 1)) if run.fixed else b.tokens[:, :length]
        lprobs, _ = self.model.forward_decoder(tokens_in, run.encoder_outs, run.incremental_states, self.temperature)
        lprobs.masked_fill_(lprobs != lprobs, -math.inf)
        lprobs[:, self.pad] = -math.inf
        lprobs[:, self.unk] -= self.unk_penalty
        last = b.step.ge(b.max_len)  # only EOS at the last step; no EOS before min_len
        lprobs.masked_fill_(last & b.not_eos, -math.inf)
        lprobs[:, self.eos].masked_fill_(~last & b.step.lt(self.min_len), -math.inf)
        if self.token_indices_to_suppress is not None:
            lprobs[:, self.token_indices_to_suppress] = -math.inf
        if step == 0:
            b.scores_as(lprobs)
        if self.repeat_ngram_blocker is not None:  # fairseq's kernel's rule, the step read on the device
            block_repeated_ngrams(b.tokens, lprobs, b.step, self.repeat_ngram_blocker.no_repeat_ngram_size)
        cand_scores, cand_indices, cand_beams = self.search.step(
            0 if step == 0 else 1, lprobs.view(b.bsz, -1, self.vocab_size), b.cumulative.view(b.bsz, beam, 1))
        cand_bbsz_idx = cand_beams + b.offsets

        # finalise the top-beam candidates that end in EOS, of sentences not finished yet
        eos_mask = cand_indices.eq(self.eos) & cand_scores.ne(-math.inf)
        eos_mask[:, :beam] &= ~b.ignore & ~b.done.unsqueeze(1)
        self._finalise(b, length, eos_mask[:, :beam], cand_bbsz_idx[:, :beam], cand_scores[:, :beam])
        b.done |= b.fin_count.eq(beam)

        # the next beam: the best candidates that do not end in EOS (fairseq's rule, per sentence)
        eos_mask[:, :beam] = b.ignore | eos_mask[:, :beam]
        active_mask = eos_mask.type_as(b.cand_offsets) * b.cand_offsets.numel() + b.cand_offsets[:eos_mask.size(1)]
        new_ignore, active_hypos = torch.topk(active_mask, k=beam, dim=1, largest=False)
        b.ignore.copy_(new_ignore.ge(b.cand_offsets.numel())[:, :beam])
        active = torch.gather(cand_bbsz_idx, 1, active_hypos).view(-1)
        at_step = b.step.expand(active.numel(), 1)
        b.tokens[:, :length] = b.tokens[:, :length].index_select(0, active)
        b.tokens.scatter_(1, at_step + 1, torch.gather(cand_indices, 1, active_hypos).view(-1, 1))
        b.scores[:, :length] = b.scores[:, :length].index_select(0, active)
        b.cumulative.copy_(torch.gather(cand_scores, 1, active_hypos).view(-1))
        b.scores.scatter_(1, at_step, b.cumulative.view(-1, 1))
        run.reorder_states(active)
        b.step += 1

    def _finalise(self, b: Beams, length: int, eos, bbsz_idx, eos_scores):
        """:meth:`Beams.finalise` with this generator's end-of-sentence symbol and length penalty."""
        b.finalise(length, eos, bbsz_idx, eos_scores, self.eos, self.normalize_scores, self.len_penalty)
