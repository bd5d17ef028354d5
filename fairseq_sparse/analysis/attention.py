"""Encoder-decoder attention statistics of a translation model, per decoder layer and head, and the
L0Drop analyses of Zhang, Titov & Sennrich (2021), Figs. 1, 7 and 8.

A teacher-forced pass (the reference targets as decoder input) is recorded with
:class:`~fairseq_sparse.modules.attention_capture.HeadAttentionRecorder`; :func:`analyse_samples` runs it over
batches and hands every sentence to :func:`analyse_sentence`, which adds it to an :class:`AttentionStats`;
:func:`summarise` turns the corpus sums into the result dict of ``fairseq-sparse-attention-analysis``.

Per decoder layer, on the attention of every reference target token (final EOS included) over all source
positions (EOS included):

* entropy (nats) of the head-averaged distribution, and the mean of the per-head entropies;
* the largest weight (head-averaged, and per head);
* with gold alignments, AER (Och & Ney 2003) and SAER (Zhang, Zhao, Li & Zong 2019, Eq. 23) of the argmax
  word alignment of the head-averaged attention, and cumulative coverage (Yang et al. 2020, Eq. 2): the
  sums of :class:`fairseq_sparse.analysis.alignment.AlignmentSums`.

L0Drop (source tokens, EOS excluded, kept: g_hat != 0, pruned: g_hat = 0): the attention each source token
receives, averaged over the heads and layers and summed over the target words (Figs. 1/7; the final EOS row
excluded), and the entropy of its row of the last encoder self-attention layer (Fig. 8).

The gate of every source token and the sparsity per token type (Zhang, Titov & Sennrich 2021, Sec. 6), for
``fairseq-sparse-l0drop-gates``: :func:`source_token_gates`, :func:`token_sparsity`.
"""
import math
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from . import alignment as al
from ..modules.encoder_patterns import encoder_inputs

#: Zhang, Titov & Sennrich (2021) Figs. 1 and 7 report the share of source words receiving less than this
LOW_ATTENTION = 0.6


def encdec_head_ids(model) -> List[List[int]]:
    """Original head ids of each decoder layer's encoder-decoder attention ([] for a headless layer)."""
    from fairseq_sparse.modules.head_gates import HeadlessAttention, head_ids

    out = []
    for layer in model.decoder.layers:
        mha = getattr(layer, "encoder_attn", None)
        out.append([] if mha is None or isinstance(mha, HeadlessAttention) else head_ids(mha))
    return out


def special_tokens(tokens: Sequence[int], dictionary) -> np.ndarray:
    """Which of ``tokens`` are EOS, BOS or padding (no word of the sentence)."""
    specials = {dictionary.eos(), dictionary.bos(), dictionary.pad()}
    return np.array([t in specials for t in tokens], dtype=bool)


def sentence_words(tokens: Sequence[int], dictionary, separator: Optional[str]) -> int:
    """Number of words of a binarised sentence (special tokens dropped, subwords merged)."""
    tokens = list(tokens)
    return al.n_words([dictionary[t] for t in tokens], special_tokens(tokens, dictionary), separator)


# ----------------------------------------------------------------------------------------------
# the corpus accumulator


class AttentionStats:
    """Sums over the corpus, per decoder layer; ``n_heads[l]`` heads in layer l (0: no heads). Alignment
    sums (AER, SAER, coverage) per layer in ``align``, of the ``--align-layers`` combination in ``combined``."""

    def __init__(self, n_heads: Sequence[int], with_gold: bool, l0drop: bool, examples: int = 0):
        self.n_heads = list(n_heads)
        L = len(self.n_heads)
        self.layers = L
        self.sentences = 0
        self.tgt_tokens = np.zeros(L)
        self.ent_sum = np.zeros(L)
        self.ent_heads_sum = np.zeros(L)
        self.max_sum = np.zeros(L)
        self.head_ent_sum = [np.zeros(h) for h in self.n_heads]
        self.head_max_sum = [np.zeros(h) for h in self.n_heads]
        self.with_gold = with_gold
        self.align = al.AlignmentSums(L)
        self.combined = al.AlignmentSums(1)
        self.hyp_lines = {}  # sentence id -> Pharaoh line of the --align-layers alignment
        self.l0drop = l0drop
        self.tokens = []  # (sentence id, position, token, gate, summed attention, encoder entropy)
        self.n_examples = examples
        self.examples = {}  # sentence id < examples -> one attention map (see analyse_sentence)

    def add_distribution(self, l: int, attn: np.ndarray):
        """Entropy and largest weight of layer l's ``[H, T, S]`` attention of one sentence."""
        self.tgt_tokens[l] += attn.shape[1]
        mean = attn.mean(0)
        self.ent_sum[l] += al.entropy(mean).sum()
        self.max_sum[l] += mean.max(-1).sum()
        h_ent = al.entropy(attn).sum(-1)  # [H]
        self.head_ent_sum[l] += h_ent
        self.ent_heads_sum[l] += h_ent.mean()
        self.head_max_sum[l] += attn.max(-1).sum(-1)


def analyse_sentence(stats: AttentionStats, sid: int, layer_attn: Sequence[Optional[np.ndarray]],
                     src_pieces: Sequence[str], tgt_pieces: Sequence[str], src_special: np.ndarray,
                     tgt_special: np.ndarray, separator: Optional[str], align_layers: Sequence[int],
                     gold=None, gates: Optional[np.ndarray] = None, enc_attn: Optional[np.ndarray] = None):
    """Add one sentence. ``layer_attn[l]``: [H, T, S] over its T target tokens (final EOS included)
    and S source tokens (EOS included), None for a layer without heads; ``gold``: (S, P) or None;
    ``gates``: [S] L0Drop gates; ``enc_attn``: [H, S, S] last encoder self-attention."""

    def links_of(attn):  # argmax word alignment of a [T, S] matrix, and the word-level matrix
        m = al.word_matrix(attn, src_pieces, tgt_pieces, src_special, tgt_special, separator)
        return al.argmax_links(m), m

    stats.sentences += 1
    layer_links = []
    for l, attn in enumerate(layer_attn):
        links = None
        if attn is not None:
            stats.add_distribution(l, attn)
            links, m = links_of(attn.mean(0))
            if gold is not None:
                stats.align.add_aer(l, links, gold)
                stats.align.add_saer(l, m, gold)
        layer_links.append(links)
    stats.align.add_coverage(layer_links, al.n_words(src_pieces, src_special, separator))

    comb = al.layer_average(layer_attn, align_layers)
    stats.hyp_lines[sid] = ""
    if comb is not None:
        links, m = links_of(comb)
        stats.hyp_lines[sid] = al.format_links(links)
        if gold is not None:
            stats.combined.add_aer(0, links, gold)
            stats.combined.add_saer(0, m, gold)
    if gates is not None:
        _add_l0drop_tokens(stats, sid, layer_attn, src_pieces, src_special, tgt_special, gates, enc_attn)
    if sid < stats.n_examples:
        average = al.layer_average(layer_attn)
        if average is not None:
            stats.examples[sid] = {"source": list(src_pieces), "target": list(tgt_pieces), "attention": average,
                                   "pruned": None if gates is None else np.asarray(gates) == 0}


def _add_l0drop_tokens(stats, sid, layer_attn, src_pieces, src_special, tgt_special, gates, enc_attn):
    """Zhang, Titov & Sennrich (2021) Figs. 1/7/8: per source token (EOS excluded) its gate, the attention it
    receives (mean over heads and layers, summed over the target words but the final EOS) and the entropy
    of its head-averaged row of the last encoder self-attention layer."""
    all_layers = al.layer_average(layer_attn)  # [T, S]
    keep_rows = ~np.asarray(tgt_special, dtype=bool)
    received = all_layers[keep_rows].sum(0) if all_layers is not None else np.full(len(src_pieces), np.nan)
    ent = al.entropy(enc_attn.mean(0)) if enc_attn is not None else np.full(len(src_pieces), np.nan)
    for pos, piece in enumerate(src_pieces):
        if not src_special[pos]:
            stats.tokens.append((sid, pos, piece, float(gates[pos]), float(received[pos]), float(ent[pos])))


# ----------------------------------------------------------------------------------------------
# the teacher-forced pass


def analyse_batch(stats: AttentionStats, sample, dec_weights, enc_weights, gates, src_dict, tgt_dict,
                  separator: Optional[str], align_layers: Sequence[int], gold=None, head_labels=None):
    """Add every sentence of a fairseq ``sample`` from the recorder's outputs: ``dec_weights[l]`` the
    encoder-decoder attention of decoder layer l, [H, B, T, S] (None: no heads), ``enc_weights`` the last
    encoder self-attention [H, B, S, S] or None, ``gates`` [B, S] L0Drop gates or None; ``gold``: the
    (S, P) of every sentence id, or None."""
    dec_weights = [None if w is None else np.asarray(w) for w in dec_weights]
    for l, w in enumerate(dec_weights):
        if head_labels is not None and w is not None and w.shape[0] != len(head_labels[l]):
            raise RuntimeError(f"decoder layer {l} returned {w.shape[0]} heads, expected {len(head_labels[l])}")
    enc_weights = None if enc_weights is None else np.asarray(enc_weights)
    src, tgt = sample["net_input"]["src_tokens"].cpu(), sample["target"].cpu()
    for row, sid in enumerate(sample["id"].tolist()):
        s_pos = src[row].ne(src_dict.pad()).nonzero().flatten().numpy()
        t_pos = tgt[row].ne(tgt_dict.pad()).nonzero().flatten().numpy()
        s_tok, t_tok = src[row, s_pos].tolist(), tgt[row, t_pos].tolist()
        analyse_sentence(
            stats, sid, [None if w is None else w[:, row][:, t_pos][:, :, s_pos] for w in dec_weights],
            [src_dict[t] for t in s_tok], [tgt_dict[t] for t in t_tok],
            special_tokens(s_tok, src_dict), special_tokens(t_tok, tgt_dict), separator, align_layers,
            gold=None if gold is None else gold[sid], gates=None if gates is None else gates[row, s_pos],
            enc_attn=None if enc_weights is None else enc_weights[:, row][:, s_pos][:, :, s_pos])


def analyse_samples(model, samples, stats: AttentionStats, src_dict, tgt_dict, separator: Optional[str],
                    align_layers: Sequence[int], gold=None, gate_encoder=None, head_labels=None) -> AttentionStats:
    """Teacher-forced pass of ``model`` over ``samples`` (fairseq samples on the model's device), recording
    every decoder layer's encoder-decoder attention per head and, when ``stats.l0drop``, the last encoder
    self-attention and the gates of ``gate_encoder`` (the model's own encoder if it is the same)."""
    from fairseq_sparse.modules.attention_capture import HeadAttentionRecorder

    n_layers = len(model.decoder.layers)
    dec_modules = [getattr(layer, "encoder_attn", None) for layer in model.decoder.layers]
    enc_last = model.encoder.layers[-1].self_attn if stats.l0drop else None
    with torch.no_grad(), HeadAttentionRecorder(dec_modules + [enc_last]) as rec:
        for sample in samples:
            net = sample["net_input"]
            rec.reset()
            enc_out = model.encoder(net["src_tokens"], **encoder_inputs(model.encoder, net))
            model.decoder(net["prev_output_tokens"], encoder_out=enc_out, src_lengths=net["src_lengths"])
            gates = None
            if stats.l0drop:
                gates = l0drop_gates(enc_out if gate_encoder is model.encoder else gate_encoder(
                    net["src_tokens"], **encoder_inputs(gate_encoder, net))).numpy()
            analyse_batch(stats, sample, rec.weights[:n_layers], rec.weights[n_layers], gates, src_dict, tgt_dict,
                          separator, align_layers, gold, head_labels)
    return stats


def l0drop_gates(encoder_out: dict) -> torch.Tensor:
    """g_hat of every source position, [B, S] float on the CPU, from an L0Drop encoder's output
    (Zhang, Titov & Sennrich 2021, Eq. 13; 0: the state is pruned)."""
    return encoder_out["l0drop_gates"][0].float().cpu()


def source_token_gates(encoder, samples: Iterable[dict], dictionary) -> Iterator[Tuple[int, int, str, float]]:
    """(sentence id, position, token, g_hat) of every source token of ``samples`` (padding excluded, EOS
    included; position counts the sentence's tokens from 0), in the order of the samples."""
    with torch.no_grad():
        for sample in samples:
            net = sample["net_input"]
            gates = l0drop_gates(encoder(net["src_tokens"], **encoder_inputs(encoder, net)))
            src = net["src_tokens"].cpu()
            for row, sid in enumerate(sample["id"].tolist()):
                real = src[row].ne(dictionary.pad()).nonzero().flatten().tolist()
                for pos, t in enumerate(real):
                    yield sid, pos, dictionary[src[row, t]], float(gates[row, t])


def token_sparsity(token_gates: Iterable[Sequence]) -> List[Tuple[str, int, int, float]]:
    """(token, count, pruned count, share pruned) per token type, most frequent first (ties: first seen
    first): how often each word's encoding is pruned (Zhang, Titov & Sennrich 2021, Sec. 6). ``token_gates``:
    rows starting (sentence id, position, token, g_hat), as :func:`source_token_gates` gives them."""
    counts = {}
    for _, _, token, g, *_ in token_gates:
        n = counts.setdefault(token, [0, 0])
        n[0] += 1
        n[1] += int(g == 0)
    return [(token, n, p, p / n) for token, (n, p) in sorted(counts.items(), key=lambda kv: -kv[1][0])]


# ----------------------------------------------------------------------------------------------
# results


def _ratio(num, den) -> float:
    return float(num / den) if den else math.nan


def summarise(stats: AttentionStats, head_labels, align_layers, bins: int = 30) -> dict:
    """The result dict: per layer, per head, the ``--align-layers`` combination and, with L0Drop,
    :func:`l0drop_summary`."""
    aer, saer = stats.align.aer(), stats.align.saer()
    coverage, coverage_layer = stats.align.coverage(), stats.align.coverage_layer()
    layers = []
    for l in range(stats.layers):
        has = stats.n_heads[l] > 0 and stats.tgt_tokens[l] > 0
        n = stats.tgt_tokens[l]
        gold = stats.with_gold and has
        layers.append({
            "layer": l, "heads": stats.n_heads[l],
            "entropy": _ratio(stats.ent_sum[l], n) if has else math.nan,
            "entropy_heads": _ratio(stats.ent_heads_sum[l], n) if has else math.nan,
            "max_weight": _ratio(stats.max_sum[l], n) if has else math.nan,
            "aer": float(aer[l]) if gold else math.nan, "saer": float(saer[l]) if gold else math.nan,
            "coverage": float(coverage[l]), "coverage_layer": float(coverage_layer[l]),
        })
    heads = [{"layer": l, "head": h, "entropy": _ratio(stats.head_ent_sum[l][k], stats.tgt_tokens[l]),
              "max_weight": _ratio(stats.head_max_sum[l][k], stats.tgt_tokens[l])}
             for l in range(stats.layers) for k, h in enumerate(head_labels[l])]
    combined = {
        "layers": list(align_layers),
        "aer": float(stats.combined.aer()[0]) if stats.with_gold else math.nan,
        "saer": float(stats.combined.saer()[0]) if stats.with_gold else math.nan,
    }
    result = {"layers": layers, "heads": heads, "align": combined, "sentences": stats.sentences,
              "target_tokens": int(stats.tgt_tokens.max()) if stats.layers else 0,
              "source_words": stats.align.src_words}
    if stats.l0drop:
        result["l0drop"] = l0drop_summary(stats.tokens, bins)
    return result


def head_matrix(heads: Sequence[dict], key: str, n_layers: int) -> np.ndarray:
    """[layers x heads] array of ``key`` from the per-head rows of :func:`summarise` (nan: no such head)."""
    n_cols = max([h["head"] + 1 for h in heads] + [1])
    mat = np.full((n_layers, n_cols), np.nan)
    for h in heads:
        mat[h["layer"], h["head"]] = h[key]
    return mat


def _distribution(values: np.ndarray, edges: np.ndarray, low: Optional[float] = None) -> dict:
    values = values[np.isfinite(values)]
    out = {"count": int(values.size),
           "mean": float(values.mean()) if values.size else math.nan,
           "median": float(np.median(values)) if values.size else math.nan,
           "histogram": np.histogram(values, bins=edges)[0].tolist()}
    if low is not None:
        out[f"share_below_{low}"] = float((values < low).mean()) if values.size else math.nan
    return out


def token_columns(tokens) -> dict:
    """The L0Drop token tuples of :class:`AttentionStats` as arrays: gate, pruned, summed_attention,
    encoder_entropy."""
    gates = np.array([t[3] for t in tokens], dtype=float)
    return {"gate": gates, "pruned": gates == 0, "summed_attention": np.array([t[4] for t in tokens], dtype=float),
            "encoder_entropy": np.array([t[5] for t in tokens], dtype=float)}


def l0drop_summary(tokens, bins: int = 30) -> dict:
    """Zhang, Titov & Sennrich (2021) Figs. 1/7 (summed attention per source token: histograms of all, kept
    and pruned tokens, mean, median, share below :data:`LOW_ATTENTION`) and Fig. 8 (encoder entropy)."""
    cols = token_columns(tokens)
    gates, received, ent, pruned = cols["gate"], cols["summed_attention"], cols["encoder_entropy"], cols["pruned"]
    hi = float(np.nanmax(received)) if received.size and np.isfinite(received).any() else 1.0
    att_edges = np.linspace(0.0, max(hi, LOW_ATTENTION) * 1.0001, bins + 1)
    ehi = float(np.nanmax(ent)) if ent.size and np.isfinite(ent).any() else 1.0
    ent_edges = np.linspace(0.0, max(ehi, 1e-6) * 1.0001, bins + 1)
    return {
        "source_tokens": int(gates.size), "pruned": int(pruned.sum()), "kept": int((~pruned).sum()),
        "sparsity": _ratio(pruned.sum(), gates.size),
        "summed_attention": {
            "bin_edges": att_edges.tolist(),
            "all": _distribution(received, att_edges, LOW_ATTENTION),
            "kept": _distribution(received[~pruned], att_edges, LOW_ATTENTION),
            "pruned": _distribution(received[pruned], att_edges, LOW_ATTENTION),
        },
        "encoder_entropy": {
            "bin_edges": ent_edges.tolist(),
            "all": _distribution(ent, ent_edges),
            "kept": _distribution(ent[~pruned], ent_edges),
            "pruned": _distribution(ent[pruned], ent_edges),
        },
    }
