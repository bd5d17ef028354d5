"""Confidence and function of the encoder self-attention heads (paper 001, Voita et al. 2019, Sec. 4-5).

    fairseq-sparse-head-analysis DATA --path CKPT --output-dir DIR [--gen-subset test]
        [--max-sentences N] [--batch-size 32] [--conllu FILE] [--bpe-separator @@]
        [--rare-min-rank 500] [--positional-threshold 0.9] [--syntactic-margin 0.10]

Works on any fairseq encoder-decoder transformer checkpoint (stock ``transformer`` or this plugin's
models, physically pruned ones included). The per-head attention weights of every encoder
self-attention layer are captured with forward hooks (fairseq's slow attention path is forced with
``skip_embed_dim_check``, which changes nothing else; PyTorch's fast path only returns the average
over heads). All metrics use real tokens only: padding and EOS (and BOS, if the task prepends one) are
excluded both as queries and as keys ("we exclude EOS on the grounds that it is not a real token").

Per head (layer, head id; head ids are the original ones for physically pruned models):

* confidence (Sec. 4): mean over query tokens of the maximum attention weight;
* positional (Sec. 5.1): the distribution of the relative position (argmax key - query) of the
  maximum, at token (subword) level; positional if one relative position takes at least
  ``--positional-threshold`` (0.9) of the maxima;
* rare words (Sec. 5.3): word level (subwords merged, see below). Among the sentences with at least
  3 words whose least frequent word is not among the ``--rare-min-rank`` most frequent tokens, the
  fraction of query words whose maximum points at the sentence's least frequent word (all occurrences
  of the minimum count count), averaged over sentences; also "one of the two least frequent". A word's
  frequency is that of its rarest piece. Frequencies are the source dictionary's counts, which
  fairseq-preprocess fills from the training split (with ``--joined-dictionary`` they are source +
  target counts); ``--frequencies train`` counts the binarised source side of the train split instead.
  A head is marked "rare" if its two-least accuracy is >= ``--rare-threshold`` (0.5) and beats the
  chance level of a uniformly random maximum by ``--rare-margin`` (0.10);
* syntactic (Sec. 5.2, with ``--conllu``): nsubj, obj (dobj in older UD), amod, advmod (UD subtypes
  such as nsubj:pass count as their base relation), in both directions: ``h2d`` (the head word's
  maximum points at a dependent of that relation) and ``d2h`` (the dependent's maximum points at its
  head word). One instance per query word: per dependent for d2h, per head word for h2d (correct if the
  maximum is any of its dependents of that relation). Baseline: always predicting the most frequent
  relative position of the relation/direction on the same data. Syntactic if accuracy >= baseline +
  ``--syntactic-margin`` (0.10).

Subword merging (word level, Clark et al. 2019): a word is a run of pieces ending with
``--bpe-separator`` plus the piece that ends it; attention *to* a word is the sum over its pieces, the
attention *from* a word the mean over its pieces. Without BPE every token is a word.

Outputs in ``--output-dir``: heads.tsv, heads.json (with baselines and distributions), confidence.png
and function.png (layers x heads maps); a summary table goes to stdout.
"""
import argparse
import collections
import json
import logging
import math
import os
import sys
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import alignment
from . import common
from ..modules.attention_capture import HeadAttentionRecorder

logger = logging.getLogger("fairseq_sparse.head_analysis")

#: paper 001 Sec. 5.2's relations (dobj is called obj since UD v2)
RELATIONS = ("nsubj", "obj", "amod", "advmod")
RELATION_ALIASES = {"dobj": "obj", "nsubjpass": "nsubj"}
#: h2d: the head word attends to its dependent; d2h: the dependent attends to its head word
DIRECTIONS = ("h2d", "d2h")
#: sentences need this many words for the rare-word statistics (else "rarest" is (nearly) trivial)
RARE_MIN_WORDS = 3


# ----------------------------------------------------------------------------------------------
# metrics: pure functions over numpy arrays


def max_attention(attn: np.ndarray, key_mask: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Maximum attention weight and its key index, over the keys where ``key_mask`` is True.

    ``attn``: [..., T, S]; ``key_mask``: [..., S] (broadcast against ``attn``'s leading dims).
    Paper 001 Sec. 4 / 5: the maximum is taken "excluding EOS", i.e. EOS is never a candidate key.
    Queries without any valid key get max -inf and index 0.
    """
    key_mask = np.expand_dims(np.asarray(key_mask, dtype=bool), -2)
    masked = np.where(key_mask, attn, -np.inf)
    return masked.max(-1), masked.argmax(-1)


def confidence(attn: np.ndarray, query_mask: np.ndarray, key_mask: np.ndarray) -> np.ndarray:
    """Confidence of each head (paper 001 Sec. 4): mean over the valid queries of the maximum weight.

    ``attn``: [H, ..., T, S] (heads first); ``query_mask``: [..., T]; ``key_mask``: [..., S]; EOS and
    padding must be False in both masks. Returns [H] (nan if no valid query).
    """
    values, _ = max_attention(attn, key_mask)
    q = np.broadcast_to(np.asarray(query_mask, dtype=bool), values.shape[1:])
    if not q.any():
        return np.full(attn.shape[0], np.nan)
    return values[:, q].mean(-1)


def relative_position_of_max(attn: np.ndarray, query_mask: np.ndarray, key_mask: np.ndarray) -> np.ndarray:
    """Relative position (argmax key index - query index) of each valid query's maximum (Sec. 5.1).

    ``attn``: [H, ..., T, S] with query i and key i the same token (self-attention); masks as in
    :func:`confidence`. Returns an int array [H, N] over the N valid queries, in order.
    """
    _, idx = max_attention(attn, key_mask)
    rel = idx - np.arange(idx.shape[-1])
    q = np.broadcast_to(np.asarray(query_mask, dtype=bool), idx.shape[1:])
    return rel[:, q]


def positional_head(counts, threshold: float = 0.9) -> Tuple[Optional[int], float, bool]:
    """Is a head positional (paper 001 Sec. 5.1)? ``counts``: {relative position: count} of its maxima
    (or a 1-D array of relative positions). Returns (most frequent position, its share, share >=
    threshold); ties go to the position nearest 0, then the smaller one."""
    if not isinstance(counts, dict):
        counts = collections.Counter(int(r) for r in np.asarray(counts).ravel())
    total = sum(counts.values())
    if total == 0:
        return None, float("nan"), False
    pos = min(counts, key=lambda r: (-counts[r], abs(r), r))
    share = counts[pos] / total
    return int(pos), share, bool(share >= threshold)


#: subword merging is alignment.py's (the same convention as fairseq-sparse-attention)
word_ids_from_pieces = alignment.word_ids


def merge_subword_attention(attn: np.ndarray, word_ids: Sequence[int]) -> np.ndarray:
    """Word-to-word attention from subword attention (Clark et al. 2019, used for paper 001 Sec. 5.2/5.3
    at word level): the weight *to* a word is the sum over its key pieces, the weight *from* a word
    the mean over its query pieces, so every row still sums to 1. ``attn``: [..., T, T] over pieces."""
    return alignment.merge_subwords(attn, word_ids, word_ids)


def frequency_ranks(counts: np.ndarray) -> np.ndarray:
    """Rank of each symbol by frequency: the number of symbols with a strictly larger count (0 = the
    most frequent). "Not in the top-K most frequent tokens" (paper 001 Sec. 5.3) is rank >= K."""
    counts = np.asarray(counts)
    desc = -np.sort(-counts)
    return np.searchsorted(-desc, -counts, side="left")


def rare_word_targets(word_counts: Sequence[float]) -> Tuple[np.ndarray, np.ndarray]:
    """The least frequent word(s) of a sentence and the two least frequent (paper 001 Sec. 5.3).

    ``word_counts``: training frequency of each word of the sentence. Returns boolean masks: the words
    with the minimum count (every occurrence; ties all count), and the words whose count is at most the
    second smallest count (with multiplicity)."""
    c = np.asarray(word_counts, dtype=float)
    order = np.sort(c)
    rarest = c <= order[0]
    two = c <= order[min(1, len(c) - 1)]
    return rarest, two


def rare_word_accuracy(argmax: np.ndarray, query_mask: np.ndarray, target_mask: np.ndarray) -> np.ndarray:
    """Per head, the fraction of valid queries whose maximum points at a target (paper 001 Sec. 5.3:
    "how often the head's maximum points at the least frequent token").

    ``argmax``: [H, Q] key index of each query's maximum (EOS already excluded); ``query_mask``: [Q];
    ``target_mask``: [K] over keys. Returns [H] (nan if no valid query)."""
    query_mask = np.asarray(query_mask, dtype=bool)
    if not query_mask.any():
        return np.full(argmax.shape[0], np.nan)
    hits = np.asarray(target_mask, dtype=bool)[argmax]
    return hits[:, query_mask].mean(-1)


def read_conllu(path: str) -> List[List[Tuple[str, int, str]]]:
    """Sentences of a CoNLL-U file as lists of (form, head, deprel); head 0 is the root, word i has id
    i + 1. Multiword-token lines (ids like 3-4) and empty nodes (3.1) are skipped; comments too."""
    sentences, cur = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                if cur:
                    sentences.append(cur)
                    cur = []
                continue
            if line.startswith("#"):
                continue
            cols = line.split("\t")
            if len(cols) != 10:
                raise ValueError(f"{path}:{lineno}: a CoNLL-U word line has 10 tab-separated columns, got {len(cols)}")
            if "-" in cols[0] or "." in cols[0]:
                continue
            try:
                wid, head = int(cols[0]), int(cols[6])
            except ValueError:
                raise ValueError(f"{path}:{lineno}: bad ID or HEAD column: {cols[0]!r}, {cols[6]!r}") from None
            if wid != len(cur) + 1:
                raise ValueError(f"{path}:{lineno}: word id {wid}, expected {len(cur) + 1}")
            cur.append((cols[1], head, cols[7]))
    if cur:
        sentences.append(cur)
    for k, sent in enumerate(sentences):
        for i, (_, head, _) in enumerate(sent):
            if not 0 <= head <= len(sent):
                raise ValueError(f"{path}: sentence {k} word {i + 1} has head {head}, the sentence has {len(sent)} words")
    return sentences


def base_relation(deprel: str) -> str:
    """UD relation without subtype, older names mapped to UD v2 (dobj -> obj)."""
    rel = deprel.split(":")[0].lower()
    return RELATION_ALIASES.get(rel, rel)


def relation_instances(sentence, relation: str, direction: str) -> List[Tuple[int, Tuple[int, ...]]]:
    """Instances of a dependency relation in one direction (paper 001 Sec. 5.2), 0-based word indices:
    (query word, words its maximum should point at). ``d2h``: one per dependent, target its head;
    ``h2d``: one per head word, targets its dependents of that relation."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    arcs = [(head - 1, i) for i, (_, head, rel) in enumerate(sentence) if head > 0 and base_relation(rel) == relation]
    if direction == "d2h":
        return [(d, (h,)) for h, d in arcs]
    deps = collections.defaultdict(list)
    for h, d in arcs:
        deps[h].append(d)
    return [(h, tuple(sorted(ds))) for h, ds in sorted(deps.items())]


def syntactic_accuracy(argmax: np.ndarray, instances) -> Tuple[np.ndarray, int]:
    """Per head, how many instances have the query word's maximum (EOS excluded) on a target word
    (paper 001 Sec. 5.2's accuracy, before dividing by the count). ``argmax``: [H, W] word-level key
    index of each query word's maximum. Returns (correct [H], number of instances)."""
    correct = np.zeros(argmax.shape[0], dtype=np.int64)
    for q, targets in instances:
        correct += np.isin(argmax[:, q], targets)
    return correct, len(instances)


def relative_position_baseline(instances) -> Tuple[Optional[int], float, int]:
    """Paper 001 Sec. 5.2's baseline: always predict the most frequent relative position (target -
    query) of the relation. ``instances``: (query, targets) pairs from any number of sentences.
    Returns (offset, accuracy, number of instances); ties go to the offset nearest 0."""
    counts = collections.Counter()
    for q, targets in instances:
        counts.update({t - q for t in targets})
    if not counts:
        return None, float("nan"), 0
    best = min(counts, key=lambda r: (-counts[r], abs(r), r))
    return int(best), counts[best] / len(instances), len(instances)


def heads_matrix(per_layer: Sequence[Optional[Sequence[float]]], labels: Sequence[Sequence[int]], n_cols: int) -> np.ndarray:
    """[layers x n_cols] matrix: layer l's value for head ``labels[l][k]`` at column labels[l][k];
    nan where a layer has no such head (physically pruned, or a layer without heads: None)."""
    out = np.full((len(per_layer), n_cols), np.nan)
    for layer, (values, ids) in enumerate(zip(per_layer, labels)):
        if values is None:
            continue
        for v, h in zip(values, ids):
            out[layer, h] = v
    return out


# ----------------------------------------------------------------------------------------------
# capturing the encoder's per-head attention


class EncoderAttentionRecorder(HeadAttentionRecorder):
    """:class:`HeadAttentionRecorder` of the encoder's self-attention: ``weights[i]`` is layer i's."""

    def __init__(self, layers):
        super().__init__([layer.self_attn for layer in layers])


def layer_head_labels(model, cfg_model) -> List[List[int]]:
    """Original head ids of each encoder layer's heads: ``head_ids`` of a physically pruned attention
    module, else the model args' ``kept_heads`` JSON ({"enc": [[ids], ...]}), else positions."""
    layers = model.encoder.layers
    kept = getattr(cfg_model, "kept_heads", None) if cfg_model is not None else None
    if isinstance(kept, str) and kept:
        kept = json.loads(kept)
    enc_kept = kept.get("enc") if isinstance(kept, dict) else None
    labels = []
    for i, layer in enumerate(layers):
        mha = layer.self_attn
        n = int(getattr(mha, "num_heads", 0))
        ids = getattr(mha, "head_ids", None)
        if ids is None and enc_kept is not None and i < len(enc_kept):
            ids = sorted(enc_kept[i])
        if ids is None or len(ids) != n:
            ids = list(range(n))
        labels.append([int(h) for h in ids])
    return labels


# ----------------------------------------------------------------------------------------------
# the analysis


class HeadStatistics:
    """Accumulates the per-head statistics of one encoder over sentences (sums and counts; the means
    are taken in :func:`summarize`). ``n_heads``: heads of each layer; ``relation_keys``: (relation,
    direction) pairs to score (empty without parses)."""

    def __init__(self, n_heads: Sequence[int], relation_keys: Sequence[Tuple[str, str]]):
        self.n_heads = list(n_heads)
        self.layers = len(self.n_heads)
        self.conf_sum = [np.zeros(h) for h in self.n_heads]
        self.conf_n = 0
        self.rel_counts = [[collections.Counter() for _ in range(h)] for h in self.n_heads]
        self.rare_sum = [np.zeros(h) for h in self.n_heads]
        self.rare2_sum = [np.zeros(h) for h in self.n_heads]
        self.rare_sentences = 0
        self.rare_chance = 0.0
        self.rare2_chance = 0.0
        self.relation_keys = list(relation_keys)
        self.syn_correct = {k: [np.zeros(h, dtype=np.int64) for h in self.n_heads] for k in self.relation_keys}
        self.syn_instances = {k: [] for k in self.relation_keys}
        self.sentences = 0


def analyse_sentence(stats: HeadStatistics, layer_attn: Sequence[Optional[np.ndarray]], pieces: Sequence[str],
                     special: np.ndarray, piece_counts: np.ndarray, piece_ranks: np.ndarray, separator: Optional[str],
                     rare_min_rank: int, parse=None):
    """Add one sentence: ``layer_attn[l]`` [H_l, n, n] over its n real tokens (None: no heads);
    ``special`` marks EOS/BOS among them; ``pieces``/``piece_counts``/``piece_ranks`` per token."""
    real = ~special
    real_idx = np.nonzero(real)[0]
    words = word_ids_from_pieces([pieces[i] for i in real_idx], separator)
    n_words = (words[-1] + 1) if words else 0
    word_ids = np.empty(len(pieces), dtype=int)
    word_ids[real_idx] = words
    word_ids[special] = n_words + np.arange(int(special.sum()))  # each special symbol its own "word"
    word_real = np.arange(int(word_ids.max()) + 1 if len(pieces) else 0) < n_words

    # rare words: frequency of a word = that of its rarest piece
    rare_targets = None
    if n_words >= RARE_MIN_WORDS:
        wcount = np.full(n_words, np.inf)
        wrank = np.zeros(n_words, dtype=np.int64)
        for i, w in zip(real_idx, words):
            wcount[w] = min(wcount[w], piece_counts[i])
            wrank[w] = max(wrank[w], piece_ranks[i])
        rarest, two = rare_word_targets(wcount)
        if wrank[rarest].max() >= rare_min_rank:
            pad = np.zeros(len(word_real) - n_words, dtype=bool)
            rare_targets = (np.concatenate([rarest, pad]), np.concatenate([two, pad]))
            stats.rare_sentences += 1
            stats.rare_chance += rarest.mean()
            stats.rare2_chance += two.mean()

    instances = {}
    if parse is not None:
        for rel, direction in stats.relation_keys:
            inst = relation_instances(parse, rel, direction)
            instances[(rel, direction)] = inst
            stats.syn_instances[(rel, direction)].extend(inst)

    if real.any():
        stats.conf_n += int(real.sum())
    stats.sentences += 1
    for layer, attn in enumerate(layer_attn):
        if attn is None or not real.any():
            continue
        stats.conf_sum[layer] += confidence(attn, real, real) * real.sum()
        rel = relative_position_of_max(attn, real, real)
        for h in range(attn.shape[0]):
            stats.rel_counts[layer][h].update(rel[h].tolist())
        if rare_targets is None and not instances:
            continue
        wattn = merge_subword_attention(attn, word_ids)
        _, wmax = max_attention(wattn, word_real)
        if rare_targets is not None:
            stats.rare_sum[layer] += rare_word_accuracy(wmax, word_real, rare_targets[0])
            stats.rare2_sum[layer] += rare_word_accuracy(wmax, word_real, rare_targets[1])
        for key, inst in instances.items():
            correct, _ = syntactic_accuracy(wmax, inst)
            stats.syn_correct[key][layer] += correct


def summarize(stats: HeadStatistics, labels, n_cols, args) -> dict:
    """Per-head results (one dict per existing head) and per-relation baselines."""
    baselines = {}
    for key in stats.relation_keys:
        off, acc, n = relative_position_baseline(stats.syn_instances[key])
        baselines[f"{key[0]}_{key[1]}"] = {"offset": off, "accuracy": acc, "instances": n}
    rare_chance = stats.rare_chance / stats.rare_sentences if stats.rare_sentences else float("nan")
    rare2_chance = stats.rare2_chance / stats.rare_sentences if stats.rare_sentences else float("nan")
    heads = []
    for layer in range(stats.layers):
        for k in range(stats.n_heads[layer]):
            pos, share, is_pos = positional_head(stats.rel_counts[layer][k], args.positional_threshold)
            total = sum(stats.rel_counts[layer][k].values())
            dist = {str(r): c / total for r, c in stats.rel_counts[layer][k].most_common(5)} if total else {}
            row = {
                "layer": layer, "head": labels[layer][k], "position": k,
                "confidence": stats.conf_sum[layer][k] / stats.conf_n if stats.conf_n else float("nan"),
                "top_relative_position": pos, "top_relative_position_share": share, "positional": is_pos,
                "relative_positions": dist,
                "rare_acc": stats.rare_sum[layer][k] / stats.rare_sentences if stats.rare_sentences else float("nan"),
                "rare2_acc": stats.rare2_sum[layer][k] / stats.rare_sentences if stats.rare_sentences else float("nan"),
            }
            row["rare"] = bool(stats.rare_sentences and row["rare2_acc"] >= args.rare_threshold
                               and row["rare2_acc"] >= rare2_chance + args.rare_margin)
            syntactic = []
            for key in stats.relation_keys:
                name = f"{key[0]}_{key[1]}"
                n = len(stats.syn_instances[key])
                acc = stats.syn_correct[key][layer][k] / n if n else float("nan")
                row[name] = acc
                base = baselines[name]["accuracy"]
                if n and acc >= base + args.syntactic_margin:
                    syntactic.append(name)
            row["syntactic"] = syntactic
            heads.append(row)
    return {
        "heads": heads, "baselines": baselines,
        "rare": {"sentences": stats.rare_sentences, "chance_rarest": rare_chance, "chance_two_least": rare2_chance},
    }


# ----------------------------------------------------------------------------------------------
# console tool


def get_parser():
    p = argparse.ArgumentParser(
        prog="fairseq-sparse-head-analysis", description=__doc__.split("\n\n")[0],
        epilog="See the module docstring (python -m fairseq_sparse.cli.head_analysis) for the definitions.")
    p.add_argument("data", metavar="DATA", help="fairseq data-bin directory (dictionaries and the subset)")
    p.add_argument("--path", required=True, metavar="CKPT", help="fairseq transformer checkpoint")
    p.add_argument("--user-dir", default=None, help="extra fairseq plugin to import (fairseq_sparse is always imported)")
    p.add_argument("--gen-subset", default="test", help="data split to analyse (default: test)")
    p.add_argument("--max-sentences", type=int, default=None, metavar="N", help="only the first N sentences of the subset")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--source-lang", default=None)
    p.add_argument("--target-lang", default=None)
    p.add_argument("--output-dir", required=True, metavar="DIR", help="heads.tsv, heads.json and the PNGs go here")
    p.add_argument("--conllu", default=None, metavar="FILE",
                   help="dependency parses of the subset's source sentences, one sentence per source line, in order")
    p.add_argument("--bpe-separator", default="@@", help="subword continuation marker ('' = no BPE)")
    p.add_argument("--frequencies", choices=("dictionary", "train"), default="dictionary",
                   help="token frequencies for the rare-word head: the source dictionary's counts (from the train "
                        "split by fairseq-preprocess) or a count of the binarised train source")
    p.add_argument("--rare-min-rank", type=int, default=500,
                   help="use sentences whose rarest token is not among the K most frequent (paper: 500)")
    p.add_argument("--rare-threshold", type=float, default=0.5,
                   help="mark a head 'rare' if its maximum hits one of the two least frequent words this often")
    p.add_argument("--rare-margin", type=float, default=0.10, help="... and this much more often than chance")
    p.add_argument("--positional-threshold", type=float, default=0.9)
    p.add_argument("--syntactic-margin", type=float, default=0.10)
    p.add_argument("--no-progress-bar", action="store_true")
    p.add_argument("--log-format", default=None, choices=("json", "none", "simple", "tqdm"))
    p.add_argument("--log-interval", type=int, default=100)
    return p


def _fail(msg):
    print(f"fairseq-sparse-head-analysis: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _special_ids(src_dict):
    return {src_dict.eos(), src_dict.bos(), src_dict.pad()}


def _train_counts(task, cfg, src_dict):
    task.load_dataset("train", task_cfg=cfg.task)
    src = task.dataset("train").src
    counts = np.zeros(len(src_dict), dtype=np.int64)
    for i in range(len(src)):
        counts += np.bincount(src[i].numpy(), minlength=len(src_dict))
    return counts


def analyse_dataset(model, dataset, src_dict, ids: Sequence[int], counts: np.ndarray, separator: Optional[str] = "@@",
                    rare_min_rank: int = 500, parses=None, batch_size: int = 32, progress=None,
                    labels: Optional[List[List[int]]] = None) -> HeadStatistics:
    """Run ``model``'s encoder over the sentences ``ids`` of a LanguagePairDataset and accumulate the
    statistics of every encoder self-attention head. ``counts``: training frequency of each dictionary
    symbol; ``parses``: read_conllu() of the whole dataset (indexed by sentence id) or None;
    ``progress``: wraps the list of batches (e.g. a fairseq progress bar)."""
    encoder = model.encoder
    if labels is None:
        labels = layer_head_labels(model, None)
    n_heads = [len(x) for x in labels]
    relation_keys = [(r, d) for r in RELATIONS for d in DIRECTIONS] if parses is not None else []
    stats = HeadStatistics(n_heads, relation_keys)
    specials = _special_ids(src_dict)
    counts = np.asarray(counts, dtype=np.float64).copy()
    for sym in specials:
        counts[sym] = 0
    ranks = frequency_ranks(counts)
    ids = sorted(ids, key=lambda i: -int(dataset.src_sizes[i]))  # similar lengths together: less padding
    batches = [ids[k:k + batch_size] for k in range(0, len(ids), batch_size)]
    pad = src_dict.pad()
    with torch.no_grad(), EncoderAttentionRecorder(encoder.layers) as rec:
        for batch_ids in (progress(batches) if progress is not None else batches):
            sample = dataset.collater([dataset[i] for i in batch_ids])
            src = sample["net_input"]["src_tokens"]
            rec.reset()
            encoder(src, src_lengths=sample["net_input"]["src_lengths"])
            weights = [None if w is None else w.numpy() for w in rec.weights]
            for layer, w in enumerate(weights):
                if w is not None and w.shape[0] != n_heads[layer]:
                    raise RuntimeError(f"encoder layer {layer} returned {w.shape[0]} heads, expected {n_heads[layer]}")
            for row, sid in enumerate(sample["id"].tolist()):
                toks = src[row].tolist()
                real_pos = np.array([p for p, t in enumerate(toks) if t != pad], dtype=int)
                toks = [toks[p] for p in real_pos]
                special = np.array([t in specials for t in toks], dtype=bool)
                layer_attn = [None if w is None else w[:, row][:, real_pos][:, :, real_pos] for w in weights]
                analyse_sentence(stats, layer_attn, [src_dict[t] for t in toks], special, counts[toks], ranks[toks],
                                 separator, rare_min_rank, parses[sid] if parses is not None else None)
    return stats


def main(argv=None):
    args = get_parser().parse_args(argv)
    # validate everything that can be validated before loading anything
    if not os.path.isfile(args.path):
        _fail(f"checkpoint not found: {args.path}")
    if not os.path.isdir(args.data):
        _fail(f"data directory not found: {args.data}")
    if args.conllu is not None and not os.path.isfile(args.conllu):
        _fail(f"--conllu file not found: {args.conllu}")
    if args.max_sentences is not None and args.max_sentences < 1:
        _fail("--max-sentences must be >= 1")
    if args.batch_size < 1:
        _fail("--batch-size must be >= 1")
    if not 0 < args.positional_threshold <= 1:
        _fail("--positional-threshold must be in (0, 1]")
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        _fail(f"--output-dir exists and is not a directory: {args.output_dir}")
    parses = None
    if args.conllu is not None:
        try:
            parses = read_conllu(args.conllu)
        except (ValueError, UnicodeDecodeError) as e:
            _fail(f"cannot read --conllu: {e}")

    from fairseq import utils
    from fairseq.logging import progress_bar

    common.import_plugins(args.user_dir)
    try:
        model, cfg, task = common.load_checkpoint(args.path, args.data, args.source_lang, args.target_lang)
    except ValueError as e:
        _fail(str(e))
    model = model.cpu().eval()
    encoder = getattr(model, "encoder", None)
    if encoder is None or not hasattr(encoder, "layers") or not all(hasattr(x, "self_attn") for x in encoder.layers):
        _fail(f"{args.path}: {type(model).__name__} has no fairseq transformer encoder layers")
    try:
        task.load_dataset(args.gen_subset, task_cfg=cfg.task)
    except Exception as e:
        _fail(f"cannot load subset '{args.gen_subset}' from {args.data}: {type(e).__name__}: {e}")
    dataset = task.dataset(args.gen_subset)
    src_dict = task.source_dictionary
    n_total = len(dataset)
    n_use = n_total if args.max_sentences is None else min(args.max_sentences, n_total)
    specials = _special_ids(src_dict)
    separator = args.bpe_separator or None

    if parses is not None:  # every sentence of the subset must match its parse, before any work
        if len(parses) != n_total:
            _fail(f"--conllu has {len(parses)} sentences, subset '{args.gen_subset}' has {n_total}")
        for i in range(n_total):
            pieces = [src_dict[t] for t in dataset.src[i].tolist() if t not in specials]
            n_words = len(set(word_ids_from_pieces(pieces, separator)))
            if n_words != len(parses[i]):
                _fail(f"--conllu sentence {i} (line {i + 1} of the source) has {len(parses[i])} words, the source "
                      f"sentence has {n_words} after merging '{args.bpe_separator}' subwords: "
                      f"source {' '.join(pieces)[:200]!r} vs CoNLL-U {' '.join(w for w, _, _ in parses[i])[:200]!r}")

    # token frequencies for the rare-word head (paper 001 Sec. 5.3)
    if args.frequencies == "train":
        counts = _train_counts(task, cfg, src_dict)
    else:
        counts = np.array(src_dict.count, dtype=np.int64)

    labels = layer_head_labels(model, getattr(cfg, "model", None))
    orig = getattr(getattr(cfg, "model", None), "encoder_attention_heads", None) or 0
    n_cols = max([orig] + [max(x) + 1 for x in labels if x])

    max_src = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    max_src = max_src[0] if isinstance(max_src, tuple) else max_src
    ids = list(range(n_use))
    if max_src is not None:
        too_long = {i for i in ids if dataset.src_sizes[i] > max_src}
        if too_long:
            logger.warning(f"skipping {len(too_long)} sentences longer than the model's {max_src} positions")
            ids = [i for i in ids if i not in too_long]

    os.makedirs(args.output_dir, exist_ok=True)
    logger.info(f"analysing {len(ids)} sentences of '{args.gen_subset}' ({n_total} in all), "
                f"{len(labels)} encoder layers, heads per layer {[len(x) for x in labels]}")

    def progress(batches):
        return progress_bar.progress_bar(batches, log_format=args.log_format, log_interval=args.log_interval,
                                         prefix=f"head analysis on '{args.gen_subset}'",
                                         default_log_format="none" if args.no_progress_bar else "tqdm")

    stats = analyse_dataset(model, dataset, src_dict, ids, counts, separator=separator,
                            rare_min_rank=args.rare_min_rank, parses=parses, batch_size=args.batch_size,
                            progress=progress, labels=labels)
    result = summarize(stats, labels, n_cols, args)
    result.update({
        "checkpoint": os.path.abspath(args.path), "data": os.path.abspath(args.data), "subset": args.gen_subset,
        "sentences": stats.sentences, "head_columns": n_cols, "head_ids": labels,
        "settings": {"positional_threshold": args.positional_threshold, "syntactic_margin": args.syntactic_margin,
                     "rare_min_rank": args.rare_min_rank, "rare_threshold": args.rare_threshold,
                     "rare_margin": args.rare_margin, "frequencies": args.frequencies,
                     "bpe_separator": args.bpe_separator, "conllu": args.conllu},
    })
    write_outputs(result, labels, n_cols, args.output_dir)
    print_summary(result)
    return result


def _fmt(v):
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4f}"
    return str(v)


def _jsonable(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return _jsonable(x.item())
    return x


def _short(name):
    rel, direction = name.rsplit("_", 1)
    return f"{rel}{'>' if direction == 'h2d' else '<'}"


def write_outputs(result, labels, n_cols, out_dir):
    from fairseq_sparse.analysis.plotting import head_heatmap

    heads = result["heads"]
    rel_cols = list(result["baselines"])
    cols = ["layer", "head", "confidence", "top_relative_position", "top_relative_position_share", "positional",
            "rare_acc", "rare2_acc", "rare"] + rel_cols + (["syntactic"] if rel_cols else [])
    with open(os.path.join(out_dir, "heads.tsv"), "w") as f:
        f.write("\t".join(cols) + "\n")
        for h in heads:
            f.write("\t".join(",".join(h[c]) if c == "syntactic" else _fmt(h[c]) for c in cols) + "\n")
    with open(os.path.join(out_dir, "heads.json"), "w") as f:
        json.dump(_jsonable(result), f, indent=1)

    n_layers = len(labels)
    conf = heads_matrix([[h["confidence"] for h in heads if h["layer"] == l] for l in range(n_layers)], labels, n_cols)
    head_heatmap(conf, os.path.join(out_dir, "confidence.png"), "Encoder self-attention: confidence (paper 001 Sec. 4)",
                 "mean max attention weight (EOS excluded)", vmin=0.0, vmax=1.0)
    n_func = np.full((n_layers, n_cols), np.nan)
    text = [["" for _ in range(n_cols)] for _ in range(n_layers)]
    for h in heads:
        tags = []
        if h["positional"]:
            tags.append(f"p{h['top_relative_position']:+d}")
        if h["rare"]:
            tags.append("rare")
        tags += [_short(s) for s in h["syntactic"]]
        n_func[h["layer"], h["head"]] = len(tags)
        text[h["layer"]][h["head"]] = "\n".join(tags[:3]) + ("\n..." if len(tags) > 3 else "")
    head_heatmap(n_func, os.path.join(out_dir, "function.png"),
                 "Function of encoder heads (p: positional, rare, rel> head->dep, rel< dep->head)",
                 "number of functions", cell_text=text, vmin=0.0, vmax=max(3.0, float(np.nanmax(n_func)) if heads else 3.0),
                 cmap="Greens")


def print_summary(result):
    rel_cols = list(result["baselines"])
    print(f"Encoder self-attention heads of {result['checkpoint']} on '{result['subset']}' "
          f"({result['sentences']} sentences; rare-word statistics on {result['rare']['sentences']})")
    print(f"{'layer':>5} {'head':>4} {'conf':>6} {'pos (share)':>13} {'rare':>6} {'rare2':>6}  functions")
    for h in result["heads"]:
        pos = "-" if h["top_relative_position"] is None else f"{h['top_relative_position']:+d} ({h['top_relative_position_share']:.2f})"
        funcs = (["positional"] if h["positional"] else []) + (["rare"] if h["rare"] else []) + h["syntactic"]
        print(f"{h['layer']:>5} {h['head']:>4} {_fmt(h['confidence']):>6.6} {pos:>13} {_fmt(h['rare_acc']):>6.6} "
              f"{_fmt(h['rare2_acc']):>6.6}  {', '.join(funcs) or '-'}")
    if rel_cols:
        print("syntactic baselines (most frequent relative position): " + ", ".join(
            f"{k} {_fmt(v['accuracy'])}@{v['offset']} (n={v['instances']})" for k, v in result["baselines"].items()))


def cli_main():
    common.setup_logging()
    main()


if __name__ == "__main__":
    cli_main()
