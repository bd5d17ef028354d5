"""A beam search whose tensors keep their shapes: the batch x beam rows are never removed (a finished sentence is
masked, not dropped), finished hypotheses go to preallocated tensors instead of Python lists, and stopping is
checked every few steps instead of after every step. fairseq's SequenceGenerator (fairseq/sequence_generator.py
``_generate``) removes finished sentences from the batch and reads ``eos_bbsz_idx.numel()`` on the host at every
step, which is what a captured (CUDA-graph) step cannot do; this is its eager, fixed-shape form, the same search
(beam search with fairseq's candidate rule, length penalty, min/max length, unk penalty, n-gram blocking,
temperature) for any model SequenceGenerator decodes, and the same hypotheses and scores (tests/unit/
test_fixed_shape_search.py).

What it does not do yet (said, not imitated): preallocated self-attention caches and beam reordering without
copying them (the decoder's own incremental state is used, as fairseq-generate does), and CUDA-graph capture.
"""
import math
from typing import Dict, List, Optional

import torch
from fairseq.search import BeamSearch
from fairseq.sequence_generator import SequenceGenerator
from torch import Tensor

#: SequenceGenerator features this search does not implement, each refused before any decoding
UNSUPPORTED = "sampling, diverse beam search, prefix tokens, constraints, --match-source-len, an LM, --print-alignment"


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
        beam, device = self.beam_size, src_tokens.device
        max_len = min(int(self.max_len_a * src_len + self.max_len_b), self.max_len - 1)
        assert self.min_len <= max_len, "min_len cannot be larger than max_len, please adjust these!"

        encoder_outs = self.model.forward_encoder(sample["net_input"])
        rows = torch.arange(bsz, device=device).repeat_interleave(beam)
        encoder_outs = self.model.reorder_encoder_out(encoder_outs, rows)

        scores = torch.zeros(bsz * beam, max_len + 1, device=device)
        tokens = torch.full((bsz * beam, max_len + 2), self.pad, dtype=torch.long, device=device)
        tokens[:, 0] = self.eos if bos_token is None else bos_token
        cands_to_ignore = torch.zeros(bsz, beam, dtype=torch.bool, device=device)
        done = torch.zeros(bsz, dtype=torch.bool, device=device)
        # the finished hypotheses: beam slots per sentence, filled in the order fairseq finalises them (their scores
        # in the model's precision, as fairseq keeps them, once the first step gives it)
        fin_tokens = torch.full((bsz, beam, max_len + 1), self.pad, dtype=torch.long, device=device)
        fin_len = torch.zeros(bsz, beam, dtype=torch.long, device=device)
        fin_count = torch.zeros(bsz, dtype=torch.long, device=device)
        fin_pos = fin_score = torch.empty(0)
        cand_size = 2 * beam
        bbsz_offsets = (torch.arange(bsz, device=device) * beam).unsqueeze(1)
        cand_offsets = torch.arange(cand_size, device=device)
        original_batch_idxs = sample["id"] if isinstance(sample.get("id"), Tensor) else torch.arange(bsz)
        reorder_state: Optional[Tensor] = None

        for step in range(max_len + 1):
            if reorder_state is not None:
                self.model.reorder_incremental_state(incremental_states, reorder_state)
                encoder_outs = self.model.reorder_encoder_out(encoder_outs, reorder_state)
            lprobs, _ = self.model.forward_decoder(tokens[:, :step + 1], encoder_outs, incremental_states,
                                                   self.temperature)
            lprobs[lprobs != lprobs] = -math.inf
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
                fin_pos = torch.zeros(bsz, beam, max_len + 1, dtype=lprobs.dtype, device=device)
                fin_score = torch.full((bsz, beam), -math.inf, dtype=lprobs.dtype, device=device)
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
            reorder_state = active_bbsz_idx

        return self._hypotheses(fin_tokens, fin_pos, fin_score, fin_len, fin_count)

    def _finalise(self, step, eos, bbsz_idx, eos_scores, tokens, scores, fin_tokens, fin_pos, fin_score, fin_len,
                  fin_count):
        """fairseq's finalize_hypos with tensors: each EOS candidate (EOS: bsz x beam) takes the sentence's next free
        slot, in candidate order, while the sentence has fewer than beam finished hypotheses."""
        beam = eos.size(1)
        slot = fin_count.unsqueeze(1) + eos.long().cumsum(1) - 1
        take = eos & slot.lt(beam)
        sent, cand = take.nonzero(as_tuple=True)  # eager; a captured step would scatter into a spare slot instead
        rows, slots = bbsz_idx[sent, cand], slot[sent, cand]
        hyp = tokens.index_select(0, rows)[:, 1:step + 2].clone()
        hyp[:, step] = self.eos
        fin_tokens[sent, slots, :step + 1] = hyp
        pos = scores.index_select(0, rows)[:, :step + 1].clone()
        pos[:, step] = eos_scores[sent, cand]
        pos[:, 1:] = pos[:, 1:] - pos[:, :-1]
        fin_pos[sent, slots, :step + 1] = pos
        score = eos_scores[sent, cand]
        fin_score[sent, slots] = score / (step + 1) ** self.len_penalty if self.normalize_scores else score
        fin_len[sent, slots] = step + 1
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
