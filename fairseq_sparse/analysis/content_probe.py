"""Is a pruned source piece's content still in the encoder memory? A probe that recovers each pruned piece from the
states the decoder still sees (issue 61; the routing account of Zhang, Titov & Sennrich 2021 Sec. 6, where the
encoder's self-attention moves a dropped token's content into the states that stay).

For every pruned real position i of a sentence, the probe attends from a learned query (it knows nothing of the piece)
over the kept states s_j, each with a learned embedding of its offset j - i (clipped to +-``max_offset``), and
classifies the piece from the attention's output:

    a_ij = softmax_j(q . (W_k s_j + r_{j-i})),   P(piece_i) = softmax(W_o sum_j a_ij (W_v s_j + r'_{j-i}))

Trained on the frozen model's memories of some sentences, it is scored on held-out ones (accuracy, NLL in bits).
The same probe reading the kept pieces' *embeddings* instead of the final states is the floor: what the identity
and places of the kept neighbours tell on their own. States above that floor hold content of the pruned pieces.

Sentences in, dicts out: each sentence is (states n x C, kept n bool, pieces n long, embeddings n x C) at its real
positions; :func:`probe_content` trains and scores both probes.
"""
import math
import random
from typing import Dict, Iterable, List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: (final states n x C, kept n, piece ids n, piece embeddings n x C) of one sentence's real positions
Sentence = Tuple[Tensor, Tensor, Tensor, Tensor]


class ContentProbe(nn.Module):
    """One attention read-out from the kept states at the pruned positions (see the module docstring)."""

    def __init__(self, dim: int, vocab: int, max_offset: int = 8, hidden: int = 128):
        super().__init__()
        self.max_offset = max_offset
        self.query = nn.Parameter(torch.zeros(hidden))
        self.key = nn.Linear(dim, hidden)
        self.value = nn.Linear(dim, hidden)
        self.offset_key = nn.Embedding(2 * max_offset + 1, hidden)
        self.offset_value = nn.Embedding(2 * max_offset + 1, hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, states: Tensor, kept: Tensor, pruned: Tensor) -> Tensor:
        """Log-probabilities (P x vocab) of the pieces at the PRUNED positions (B x T bool) from STATES (B x T x C)
        at the KEPT positions (B x T bool); sentences with nothing kept read nothing (a uniform read-out of zeros)."""
        T = states.size(1)
        positions = torch.arange(T, device=states.device)
        offsets = (positions.view(1, T) - positions.view(T, 1)).clamp(-self.max_offset, self.max_offset)
        bins = F.one_hot(offsets + self.max_offset, 2 * self.max_offset + 1).to(states.dtype)  # [i, j, j - i]
        # q . (W_k s_j + r_{j-i}) and sum_j a_ij (W_v s_j + r'_{j-i}), without a B x T x T x H tensor
        scores = (self.key(states) @ self.query).unsqueeze(1) + (self.offset_key.weight @ self.query)[offsets + self.max_offset]
        scores = scores.masked_fill(~kept.unsqueeze(1), float("-inf"))
        attn = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # nothing kept: all -inf -> 0
        read = attn @ self.value(states) + torch.einsum("bij,ijk->bik", attn, bins) @ self.offset_value.weight
        return F.log_softmax(self.out(torch.tanh(read[pruned])), dim=-1)


def _batch(sentences: Sequence[Sentence], use_embeddings: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(inputs B x T x C, kept B x T, pruned B x T, target piece ids P) of SENTENCES, right-padded."""
    T = max(s[0].size(0) for s in sentences)
    C = sentences[0][0].size(1)
    inputs = torch.zeros(len(sentences), T, C)
    kept = torch.zeros(len(sentences), T, dtype=torch.bool)
    real = torch.zeros_like(kept)
    pieces = torch.zeros(len(sentences), T, dtype=torch.long)
    for b, (states, k, p, emb) in enumerate(sentences):
        n = states.size(0)
        inputs[b, :n] = emb if use_embeddings else states
        kept[b, :n], real[b, :n], pieces[b, :n] = k, True, p
    pruned = real & ~kept
    return inputs, kept, pruned, pieces[pruned]


def _batches(sentences: Sequence[Sentence], size: int) -> List[List[Sentence]]:
    with_pruned = [s for s in sentences if bool((~s[1]).any())]
    return [with_pruned[i:i + size] for i in range(0, len(with_pruned), size)]


def train_and_score(train: Sequence[Sentence], test: Sequence[Sentence], vocab: int, use_embeddings: bool,
                    epochs: int = 10, batch_size: int = 32, lr: float = 3e-3, seed: int = 1) -> Dict[str, float]:
    """One probe (on the final states, or on the embeddings: the floor) trained on TRAIN for EPOCHS passes, scored
    on TEST: {pieces, accuracy, nll_bits} of the pruned pieces."""
    torch.manual_seed(seed)
    probe = ContentProbe(train[0][0].size(1), vocab)
    optimiser = torch.optim.Adam(probe.parameters(), lr=lr)
    order = list(train)
    for epoch in range(epochs):
        random.Random(seed + epoch).shuffle(order)
        for batch in _batches(order, batch_size):
            inputs, kept, pruned, target = _batch(batch, use_embeddings)
            loss = F.nll_loss(probe(inputs, kept, pruned), target)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    pieces = correct = 0
    nll = 0.0
    with torch.no_grad():
        for batch in _batches(test, batch_size):
            inputs, kept, pruned, target = _batch(batch, use_embeddings)
            logp = probe(inputs, kept, pruned)
            pieces += target.numel()
            correct += int((logp.argmax(-1) == target).sum())
            nll -= float(logp.gather(1, target.unsqueeze(1)).sum())
    if not pieces:
        raise ValueError("no pruned source pieces among the held-out sentences: nothing to probe")
    return {"pieces": pieces, "accuracy": round(correct / pieces, 4), "nll_bits": round(nll / pieces / math.log(2), 4)}


def memory_sentences(encoder, samples: Iterable[dict], limit: int) -> List[Sentence]:
    """The first LIMIT sentences of SAMPLES as the probe reads them: an L0Drop encoder's output in eval mode as the
    decoder sees it before compression (gated, merged where the model merges; pruned decoding off), whether each
    state is kept (g_hat != 0), the source pieces, and their embeddings."""
    from ..modules.encoder_patterns import encoder_inputs

    out: List[Sentence] = []
    embeddings = encoder.embed_tokens.weight
    with torch.no_grad():
        for sample in samples:
            net = sample["net_input"]
            enc = encoder(net["src_tokens"], **encoder_inputs(encoder, net))
            states, gates = enc["encoder_out"][0].transpose(0, 1).float().cpu(), enc["l0drop_gates"][0].cpu()
            src = net["src_tokens"].cpu()
            for row in range(src.size(0)):
                real = src[row].ne(encoder.padding_idx)
                pieces = src[row][real]
                out.append((states[row][real], gates[row][real] != 0, pieces, embeddings[pieces].float().cpu()))
                if len(out) == limit:
                    return out
    return out


def probe_content(sentences: Sequence[Sentence], vocab: int, held_out: float = 0.2, **train_options) -> Dict:
    """The probe on the final states and its floor on the embeddings, trained on the first 1 - HELD_OUT of
    SENTENCES and scored on the rest: {states, embeddings, gain_bits (floor NLL - states NLL: what the states add)}."""
    if not 0 < held_out < 1:
        raise ValueError(f"held_out must lie in (0, 1), got {held_out}")
    split = int(len(sentences) * (1 - held_out))
    train, test = sentences[:split], sentences[split:]
    if not _batches(train, 1) or not _batches(test, 1):
        raise ValueError("the probe needs pruned source pieces among both its training and its held-out sentences")
    states = train_and_score(train, test, vocab, use_embeddings=False, **train_options)
    floor = train_and_score(train, test, vocab, use_embeddings=True, **train_options)
    return {"states": states, "embeddings": floor, "gain_bits": round(floor["nll_bits"] - states["nll_bits"], 4)}
