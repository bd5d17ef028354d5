"""A beam search whose tensors keep their shapes: the batch x beam rows are never removed (a finished sentence is
masked, not dropped), finished hypotheses go to preallocated tensors instead of Python lists (written without a host
read: a candidate that is not taken goes to a spare slot), and stopping is checked every few steps instead of after
every step. fairseq's SequenceGenerator (fairseq/sequence_generator.py ``_generate``) removes finished sentences from
the batch and reads ``eos_bbsz_idx.numel()`` on the host at every step, which is what a captured (CUDA-graph) step
cannot do; this is its eager, fixed-shape form, the same search (beam search with fairseq's candidate rule, length
penalty, min/max length, unk penalty, n-gram blocking, temperature) for any model SequenceGenerator decodes, and the
same hypotheses and scores (tests/unit/test_fixed_shape_search.py).

Caches: the decoder's self-attention keys and values (fairseq's MultiheadAttention) live in buffers preallocated to
the maximum output length (:class:`StaticCacheSelfAttention`), written in place at each step instead of grown by
concatenation. Since rows never leave, the beams of a sentence stay in its rows, and the encoder-decoder keys and
values, computed once from the sentence's memory, are the same in all of them: they are never reordered (fairseq
copies them, and the encoder output, at every step); only state that is per hypothesis is.

What it does not do yet (said, not imitated): beam reordering without copying the self-attention buffers (a cache
indirection table), one encoder memory row per sentence for models that expand it over the beam, and CUDA-graph
capture (positions and the min/max-length rules would have to come from a step tensor).
"""
import math
from contextlib import contextmanager
from typing import Dict, List, Optional

import torch
from fairseq import utils
from fairseq.modules import MultiheadAttention
from fairseq.search import BeamSearch
from fairseq.sequence_generator import SequenceGenerator
from torch import Tensor

from .models.transformer_l0drop import L0DropTransformerDecoder
from .modules.attention_normalisers import NormalisedAttention
from .modules.count_attention import CountAwareAttention
from .modules.shared_memory import SharedMemoryAttention

#: SequenceGenerator features this search does not implement, each refused before any decoding
UNSUPPORTED = "sampling, diverse beam search, prefix tokens, constraints, --match-source-len, an LM, --print-alignment"

#: encoder-decoder attention whose incremental state is the sentence's memory only (keys, values, padding mask, log
#: counts): the same in every beam of the sentence, so never reordered here. Exact types: a subclass may add state
#: per hypothesis (CoverageAttention does), and is reordered as fairseq reorders it.
STATIC_MEMORY_ATTENTION = (MultiheadAttention, CountAwareAttention, NormalisedAttention, SharedMemoryAttention)
#: decoders whose own incremental state is per sentence (L0Drop's attention map)
SENTENCE_STATE_DECODERS = (L0DropTransformerDecoder,)


class StaticCacheSelfAttention(MultiheadAttention):
    """fairseq's MultiheadAttention as a decoder self-attention whose keys and values, in incremental decoding, sit in
    buffers preallocated to the maximum length (rows x heads x length x head_dim, in the incremental state as
    ``static_key`` / ``static_value``, with ``static_padding`` for a target padding mask) and are written at position
    ``static_step``, instead of fairseq's cache grown by ``torch.cat`` at every step. The same arithmetic as fairseq's
    forward for one query (q, k, v projections, scaling, softmax in fp32, out_proj called as a module, so head gates
    and masks apply); anything else (training, scoring, no buffers) is fairseq's forward unchanged. Set on a model's
    modules by :func:`static_self_attention` for one ``generate`` call only."""

    static_step: int = 0

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False):
        saved = self._get_input_buffer(incremental_state) if incremental_state is not None else {}
        keys, values = saved.get("static_key"), saved.get("static_value")
        if keys is None or values is None or query.size(0) != 1 or attn_mask is not None or before_softmax:
            return super().forward(query, key, value, key_padding_mask=key_padding_mask,
                                   incremental_state=incremental_state, need_weights=need_weights,
                                   static_kv=static_kv, attn_mask=attn_mask, before_softmax=before_softmax,
                                   need_head_weights=need_head_weights)
        rows, heads, head_dim, step = query.size(1), self.num_heads, self.head_dim, self.static_step
        q = self.q_proj(query)
        q *= self.scaling
        keys[:, :, step] = self.k_proj(query).view(rows, heads, head_dim)
        values[:, :, step] = self.v_proj(query).view(rows, heads, head_dim)
        q = q.contiguous().view(rows * heads, 1, head_dim)
        k = keys[:, :, :step + 1].reshape(rows * heads, step + 1, head_dim)  # a view: no copy
        v = values[:, :, :step + 1].reshape(rows * heads, step + 1, head_dim)
        weights = self.apply_sparse_mask(torch.bmm(q, k.transpose(1, 2)), 1, step + 1, rows)
        padding = saved.get("static_padding")
        if key_padding_mask is not None or padding is not None:  # a target pad (fairseq appends its mask)
            if padding is None:
                padding = keys.new_zeros(rows, keys.size(2), dtype=torch.bool)
                saved["static_padding"] = padding
            padding[:, step] = key_padding_mask[:, -1] if key_padding_mask is not None else False
            weights = weights.view(rows, heads, 1, step + 1).masked_fill(
                padding[:, :step + 1].view(rows, 1, 1, step + 1), float("-inf")).view(rows * heads, 1, step + 1)
        probs = self.dropout_module(utils.softmax(weights, dim=-1, onnx_trace=self.onnx_trace).type_as(weights))
        attn = torch.bmm(probs, v).view(rows, heads * head_dim).unsqueeze(0)
        return self.out_proj(attn), None

    def reorder_static(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], order: Tensor):
        """Move the written positions of the buffers (rows first) to the hypotheses' new order, in place."""
        saved = self._get_input_buffer(incremental_state)
        written = self.static_step + 1
        for buffer in (saved.get("static_key"), saved.get("static_value"), saved.get("static_padding")):
            if buffer is not None:
                part = buffer.narrow(2 if buffer.dim() == 4 else 1, 0, written)
                part.copy_(part.index_select(0, order))


@contextmanager
def static_self_attention(models, incremental_states, rows: int, length: int):
    """For one ``generate`` call: every decoder self-attention that is fairseq's plain MultiheadAttention (pruned
    heads and head gates included; not bias_kv, zero_attn or xformers) becomes a :class:`StaticCacheSelfAttention`
    with buffers for ``rows`` hypotheses and ``length`` steps in its model's incremental state; the class is put
    back afterwards. Yields those modules. The buffers are allocated, not zeroed: only written positions are read."""
    swapped: List[MultiheadAttention] = []
    try:
        for model, state in zip(models, incremental_states):
            for layer in getattr(model.decoder, "layers", None) or []:
                attention = getattr(layer, "self_attn", None)
                if (type(attention) is not MultiheadAttention or not attention.self_attention
                        or attention.bias_k is not None or attention.add_zero_attn
                        or getattr(attention, "use_xformers", False)):
                    continue
                weight = attention.k_proj.weight
                shape = (rows, attention.num_heads, length, attention.head_dim)
                attention.__class__ = StaticCacheSelfAttention
                swapped.append(attention)
                attention._set_input_buffer(state, {
                    "static_key": torch.empty(shape, dtype=weight.dtype, device=weight.device),
                    "static_value": torch.empty(shape, dtype=weight.dtype, device=weight.device)})
        yield swapped
    finally:
        for attention in swapped:
            attention.__class__ = MultiheadAttention
            attention.__dict__.pop("static_step", None)


def moves_with_the_beam(module) -> bool:
    """Whether a decoder module's incremental state is per hypothesis, so must follow the beams as they reorder
    (fairseq reorders every module's state; here rows never leave, so per-sentence state stays where it is)."""
    if isinstance(module, SENTENCE_STATE_DECODERS):
        return False
    if type(module) in STATIC_MEMORY_ATTENTION and module.encoder_decoder_attention:
        return False
    return hasattr(module, "reorder_incremental_state")


class FixedShapeSequenceGenerator(SequenceGenerator):
    """fairseq's SequenceGenerator with a fixed-shape ``_generate`` (module docstring). ``stop_every``: the steps
    between two host reads of whether every sentence is finished (finished sentences are frozen meanwhile, so the
    result does not depend on it)."""

    def __init__(self, *args, stop_every: int = 4, **kwargs):
        super().__init__(*args, **kwargs)
        if type(self.search) is not BeamSearch:
            raise ValueError(f"the fixed-shape search is beam search only ({UNSUPPORTED} are not supported)")
        if self.match_source_len or self.lm_model is not None:
            raise ValueError(f"the fixed-shape search does not support {UNSUPPORTED}")
        self.stop_every = max(1, int(stop_every))

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
        encoder_outs = self.model.forward_encoder(sample["net_input"])
        rows = torch.arange(bsz, device=src_tokens.device).repeat_interleave(self.beam_size)
        # the beams of a sentence stay in its rows: the memory is never reordered again
        encoder_outs = self.model.reorder_encoder_out(encoder_outs, rows)
        models = self.model.models if self.model.has_incremental_states() else []
        with static_self_attention(models, incremental_states, rows.numel(), max_len + 1) as static:
            return self._search(sample, encoder_outs, incremental_states, static, bsz, max_len, bos_token)

    def _search(self, sample, encoder_outs, incremental_states, static, bsz: int, max_len: int,
                bos_token: Optional[int]):
        beam, device = self.beam_size, sample["net_input"]["src_tokens"].device
        scores = torch.zeros(bsz * beam, max_len + 1, device=device)
        tokens = torch.full((bsz * beam, max_len + 2), self.pad, dtype=torch.long, device=device)
        tokens[:, 0] = self.eos if bos_token is None else bos_token
        cands_to_ignore = torch.zeros(bsz, beam, dtype=torch.bool, device=device)
        done = torch.zeros(bsz, dtype=torch.bool, device=device)
        # the finished hypotheses: beam slots per sentence, filled in the order fairseq finalises them, and a spare
        # slot (index beam) for the candidates not taken; scores in the model's precision, as fairseq keeps them,
        # once the first step gives it
        fin_tokens = torch.full((bsz, beam + 1, max_len + 1), self.pad, dtype=torch.long, device=device)
        fin_len = torch.zeros(bsz, beam + 1, dtype=torch.long, device=device)
        fin_count = torch.zeros(bsz, dtype=torch.long, device=device)
        fin_pos = fin_score = torch.empty(0)
        cand_size = 2 * beam
        bbsz_offsets = (torch.arange(bsz, device=device) * beam).unsqueeze(1)
        cand_offsets = torch.arange(cand_size, device=device)
        original_batch_idxs = sample["id"] if isinstance(sample.get("id"), Tensor) else torch.arange(bsz)

        for step in range(max_len + 1):
            for attention in static:
                attention.static_step = step
            lprobs, _ = self.model.forward_decoder(tokens[:, :step + 1], encoder_outs, incremental_states,
                                                   self.temperature)
            lprobs.masked_fill_(lprobs != lprobs, -math.inf)
            lprobs[:, self.pad] = -math.inf
            lprobs[:, self.unk] -= self.unk_penalty
            if step >= max_len:
                lprobs[:, :self.eos] = -math.inf
                lprobs[:, self.eos + 1:] = -math.inf
            elif step < self.min_len:
                lprobs[:, self.eos] = -math.inf
            if self.token_indices_to_suppress is not None:
                lprobs[:, self.token_indices_to_suppress] = -math.inf
            scores = scores.type_as(lprobs)
            if step == 0:
                fin_pos = torch.zeros(bsz, beam + 1, max_len + 1, dtype=lprobs.dtype, device=device)
                fin_score = torch.full((bsz, beam + 1), -math.inf, dtype=lprobs.dtype, device=device)
            if self.repeat_ngram_blocker is not None:
                lprobs = self.repeat_ngram_blocker(tokens, lprobs, bsz, beam, step)
            cand_scores, cand_indices, cand_beams = self.search.step(
                step, lprobs.view(bsz, -1, self.vocab_size), scores.view(bsz, beam, -1)[:, :, :step],
                tokens[:, :step + 1], original_batch_idxs)
            cand_bbsz_idx = cand_beams + bbsz_offsets

            # finalise the top-beam candidates that end in EOS, of sentences not finished yet
            eos_mask = cand_indices.eq(self.eos) & cand_scores.ne(-math.inf)
            eos_mask[:, :beam] &= ~cands_to_ignore & ~done.unsqueeze(1)
            self._finalise(step, eos_mask[:, :beam], cand_bbsz_idx[:, :beam], cand_scores[:, :beam], tokens, scores,
                           fin_tokens, fin_pos, fin_score, fin_len, fin_count)
            done |= fin_count.eq(beam)
            if step >= max_len:
                break
            if (step + 1) % self.stop_every == 0 and bool(done.all()):
                break

            # the next beam: the best candidates that do not end in EOS (fairseq's rule, per sentence)
            eos_mask[:, :beam] = cands_to_ignore | eos_mask[:, :beam]
            active_mask = eos_mask.type_as(cand_offsets) * cand_size + cand_offsets[:eos_mask.size(1)]
            new_cands_to_ignore, active_hypos = torch.topk(active_mask, k=beam, dim=1, largest=False)
            cands_to_ignore = new_cands_to_ignore.ge(cand_size)[:, :beam]
            active_bbsz_idx = torch.gather(cand_bbsz_idx, 1, active_hypos).view(-1)
            tokens[:, :step + 1] = tokens[:, :step + 1].index_select(0, active_bbsz_idx)
            tokens.view(bsz, beam, -1)[:, :, step + 1] = torch.gather(cand_indices, 1, active_hypos)
            if step > 0:
                scores[:, :step] = scores[:, :step].index_select(0, active_bbsz_idx)
            scores.view(bsz, beam, -1)[:, :, step] = torch.gather(cand_scores, 1, active_hypos)
            self._reorder_states(incremental_states, active_bbsz_idx)

        return self._hypotheses(fin_tokens, fin_pos, fin_score, fin_len, fin_count)

    def _reorder_states(self, incremental_states, order: Tensor):
        """Each decoder module's per-hypothesis state to the new order (fairseq's ``reorder_incremental_state``,
        less the per-sentence state: :func:`moves_with_the_beam`)."""
        if not self.model.has_incremental_states():
            return
        for model, state in zip(self.model.models, incremental_states):
            for module in model.decoder.modules():
                if isinstance(module, StaticCacheSelfAttention) and "static_key" in module._get_input_buffer(state):
                    module.reorder_static(state, order)
                elif moves_with_the_beam(module):
                    module.reorder_incremental_state(state, order)

    def _finalise(self, step, eos, bbsz_idx, eos_scores, tokens, scores, fin_tokens, fin_pos, fin_score, fin_len,
                  fin_count):
        """fairseq's finalize_hypos with tensors and no host read: each EOS candidate (EOS: bsz x beam) takes the
        sentence's next free slot, in candidate order, while the sentence has fewer than beam finished hypotheses;
        every other candidate is written to the spare slot (index beam), which is never read."""
        bsz, beam = eos.shape
        slot = fin_count.unsqueeze(1) + eos.long().cumsum(1) - 1
        take = eos & slot.lt(beam)
        flat = (torch.arange(bsz, device=eos.device).unsqueeze(1) * (beam + 1)
                + torch.where(take, slot, torch.full_like(slot, beam))).view(-1)
        rows = bbsz_idx.reshape(-1)
        hyp = tokens.index_select(0, rows)[:, 1:step + 2].clone()
        hyp[:, step] = self.eos
        fin_tokens.view(bsz * (beam + 1), -1)[flat, :step + 1] = hyp
        pos = scores.index_select(0, rows)[:, :step + 1].clone()
        pos[:, step] = eos_scores.reshape(-1)
        pos[:, 1:] = pos[:, 1:] - pos[:, :-1]
        fin_pos.view(bsz * (beam + 1), -1)[flat, :step + 1] = pos
        score = eos_scores.reshape(-1)
        fin_score.view(-1)[flat] = score / (step + 1) ** self.len_penalty if self.normalize_scores else score
        fin_len.view(-1)[flat] = step + 1
        fin_count += take.long().sum(1)

    def _hypotheses(self, fin_tokens, fin_pos, fin_score, fin_len, fin_count):
        """SequenceGenerator's output: per sentence its finished hypotheses, best first (sorted as fairseq sorts
        them), each a dict of tokens, score, positional scores and (empty) attention and alignment."""
        out: List[List[Dict[str, Tensor]]] = []
        for s in range(fin_tokens.size(0)):
            n = int(fin_count[s])
            order = torch.sort(torch.tensor([float(x) for x in fin_score[s, :n].tolist()]), descending=True)[1].tolist()
            out.append([{"tokens": fin_tokens[s, i, :int(fin_len[s, i])], "score": fin_score[s, i],
                         "attention": torch.empty(0), "alignment": torch.empty(0),
                         "positional_scores": fin_pos[s, i, :int(fin_len[s, i])]} for i in order])
        return out
