"""What encoder self-attention heads do (Voita et al. 2019, Sec. 4-5): confidence, positional, rare-word
and syntactic heads, measured on the per-head attention weights of a fairseq encoder.

All metrics use real tokens only: padding and EOS (and BOS, if the task prepends one) are excluded both
as queries and as keys ("we exclude EOS on the grounds that it is not a real token"). Per head (layer,
head id; head ids are the original ones for physically pruned models):

* confidence (Sec. 4): mean over query tokens of the maximum attention weight;
* positional (Sec. 5.1): the distribution of the relative position (argmax key - query) of the maximum,
  at token (subword) level; positional if one relative position takes at least a threshold (0.9) of
  the maxima;
* rare words (Sec. 5.3): word level (subwords merged, see below). Among the sentences with at least
  :data:`RARE_MIN_WORDS` words whose least frequent word is not among the K most frequent tokens, the
  fraction of query words whose maximum points at the sentence's least frequent word (all occurrences
  of the minimum count count), averaged over sentences; also "one of the two least frequent". A word's
  frequency is that of its rarest piece. A head is "rare" if its two-least accuracy reaches a threshold
  (0.5) and beats the chance level of a uniformly random maximum by a margin (0.10);
* syntactic (Sec. 5.2, given dependency parses): nsubj, obj (dobj in older UD), amod, advmod (UD
  subtypes such as nsubj:pass count as their base relation), in both directions: ``h2d`` (the head
  word's maximum points at a dependent of that relation) and ``d2h`` (the dependent's maximum points at
  its head word). One instance per query word: per dependent for d2h, per head word for h2d (correct if
  the maximum is any of its dependents of that relation). Baseline: always predicting the most frequent
  relative position of the relation/direction on the same data. Syntactic if accuracy >= baseline + a
  margin (0.10).

Subword merging (word level, Clark et al. 2019): a word is a run of pieces ending with the BPE separator
plus the piece that ends it; attention *to* a word is the sum over its pieces, the attention *from* a
word the mean over its pieces (:mod:`fairseq_sparse.analysis.alignment`). Without BPE every token is a
word.
"""
import collections
import json
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from . import alignment
from ..modules.attention_capture import HeadAttentionRecorder
from ..modules.encoder_patterns import encoder_inputs

#: Voita et al. (2019) Sec. 5.2's relations (dobj is called obj since UD v2)
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
    Voita et al. (2019) Sec. 4 / 5: the maximum is taken "excluding EOS", i.e. EOS is never a candidate
    key. Queries without any valid key get max -inf and index 0.
    """
    key_mask = np.expand_dims(np.asarray(key_mask, dtype=bool), -2)
    masked = np.where(key_mask, attn, -np.inf)
    return masked.max(-1), masked.argmax(-1)


def confidence(attn: np.ndarray, query_mask: np.ndarray, key_mask: np.ndarray) -> np.ndarray:
    """Confidence of each head (Voita et al. 2019, Sec. 4): mean over the valid queries of the maximum
    weight.

    ``attn``: [H, ..., T, S] (heads first); ``query_mask``: [..., T]; ``key_mask``: [..., S]; EOS and
    padding must be False in both masks. Returns [H] (nan if no valid query).
    """
    values, _ = max_attention(attn, key_mask)
    q = np.broadcast_to(np.asarray(query_mask, dtype=bool), values.shape[1:])
    if not q.any():
        return np.full(attn.shape[0], np.nan)
    return values[:, q].mean(-1)


def relative_position_of_max(attn: np.ndarray, query_mask: np.ndarray, key_mask: np.ndarray) -> np.ndarray:
    """Relative position (argmax key index - query index) of each valid query's maximum (Voita et al.
    2019, Sec. 5.1).

    ``attn``: [H, ..., T, S] with query i and key i the same token (self-attention); masks as in
    :func:`confidence`. Returns an int array [H, N] over the N valid queries, in order.
    """
    _, idx = max_attention(attn, key_mask)
    rel = idx - np.arange(idx.shape[-1])
    q = np.broadcast_to(np.asarray(query_mask, dtype=bool), idx.shape[1:])
    return rel[:, q]


def _most_frequent(counts) -> int:
    """The key with the largest count; ties go to the one nearest 0, then the smaller one."""
    return min(counts, key=lambda r: (-counts[r], abs(r), r))


def positional_head(counts, threshold: float = 0.9) -> Tuple[Optional[int], float, bool]:
    """Is a head positional (Voita et al. 2019, Sec. 5.1)? ``counts``: {relative position: count} of its
    maxima (or a 1-D array of relative positions). Returns (most frequent position, its share, share >=
    threshold); ties go to the position nearest 0, then the smaller one."""
    if not isinstance(counts, dict):
        counts = collections.Counter(int(r) for r in np.asarray(counts).ravel())
    total = sum(counts.values())
    if total == 0:
        return None, float("nan"), False
    pos = _most_frequent(counts)
    share = counts[pos] / total
    return int(pos), share, bool(share >= threshold)


def merge_subword_attention(attn: np.ndarray, word_ids: Sequence[int]) -> np.ndarray:
    """Word-to-word self-attention from subword attention (Clark et al. 2019, used for Voita et al. 2019
    Sec. 5.2/5.3 at word level): the weight *to* a word is the sum over its key pieces, the weight *from*
    a word the mean over its query pieces, so every row still sums to 1. ``attn``: [..., T, T] over
    pieces; the same word ids for queries and keys (:func:`alignment.merge_subwords`)."""
    return alignment.merge_subwords(attn, word_ids, word_ids)


def frequency_ranks(counts: np.ndarray) -> np.ndarray:
    """Rank of each symbol by frequency: the number of symbols with a strictly larger count (0 = the
    most frequent). "Not in the top-K most frequent tokens" (Voita et al. 2019, Sec. 5.3) is rank >= K."""
    counts = np.asarray(counts)
    desc = -np.sort(-counts)
    return np.searchsorted(-desc, -counts, side="left")


def token_counts(sentences: Iterable[torch.Tensor], vocab_size: int) -> np.ndarray:
    """How often each dictionary symbol occurs in ``sentences`` (token-id tensors, e.g. the binarised
    train source): the word frequencies of Voita et al. (2019) Sec. 5.3."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for tokens in sentences:
        counts += np.bincount(tokens.numpy(), minlength=vocab_size)
    return counts


def rare_word_targets(word_counts: Sequence[float]) -> Tuple[np.ndarray, np.ndarray]:
    """The least frequent word(s) of a sentence and the two least frequent (Voita et al. 2019, Sec. 5.3).

    ``word_counts``: training frequency of each word of the sentence. Returns boolean masks: the words
    with the minimum count (every occurrence; ties all count), and the words whose count is at most the
    second smallest count (with multiplicity)."""
    c = np.asarray(word_counts, dtype=float)
    order = np.sort(c)
    rarest = c <= order[0]
    two = c <= order[min(1, len(c) - 1)]
    return rarest, two


def rare_word_accuracy(argmax: np.ndarray, query_mask: np.ndarray, target_mask: np.ndarray) -> np.ndarray:
    """Per head, the fraction of valid queries whose maximum points at a target (Voita et al. 2019,
    Sec. 5.3: "how often the head's maximum points at the least frequent token").

    ``argmax``: [H, Q] key index of each query's maximum (EOS already excluded); ``query_mask``: [Q];
    ``target_mask``: [K] over keys. Returns [H] (nan if no valid query)."""
    query_mask = np.asarray(query_mask, dtype=bool)
    if not query_mask.any():
        return np.full(argmax.shape[0], np.nan)
    hits = np.asarray(target_mask, dtype=bool)[argmax]
    return hits[:, query_mask].mean(-1)


# ----------------------------------------------------------------------------------------------
# dependency parses (Sec. 5.2)


def _conllu_word(cols: List[str], where: str, expected_id: int) -> Optional[Tuple[str, int, str]]:
    """(form, head, deprel) of one CoNLL-U word line, None for a multiword token or an empty node;
    ValueError if malformed."""
    if len(cols) != 10:
        raise ValueError(f"{where}: a CoNLL-U word line has 10 tab-separated columns, got {len(cols)}")
    if "-" in cols[0] or "." in cols[0]:
        return None
    try:
        wid, head = int(cols[0]), int(cols[6])
    except ValueError:
        raise ValueError(f"{where}: bad ID or HEAD column: {cols[0]!r}, {cols[6]!r}") from None
    if wid != expected_id:
        raise ValueError(f"{where}: word id {wid}, expected {expected_id}")
    return cols[1], head, cols[7]


def read_conllu(path: str) -> List[List[Tuple[str, int, str]]]:
    """Sentences of a CoNLL-U file as lists of (form, head, deprel); head 0 is the root, word i has id
    i + 1. Multiword-token lines (ids like 3-4) and empty nodes (3.1) are skipped; comments too.
    The one validator of CoNLL-U input: raises ValueError (with file and line) on anything malformed."""
    sentences, cur = [], []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text: {e}") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            if cur:
                sentences.append(cur)
                cur = []
            continue
        if line.startswith("#"):
            continue
        word = _conllu_word(line.split("\t"), f"{path}:{lineno}", len(cur) + 1)
        if word is not None:
            cur.append(word)
    if cur:
        sentences.append(cur)
    for k, sent in enumerate(sentences):
        for i, (_, head, _) in enumerate(sent):
            if not 0 <= head <= len(sent):
                raise ValueError(f"{path}: sentence {k} word {i + 1} has head {head}, the sentence has {len(sent)} words")
    return sentences


def check_parses(parses, sentences: Sequence[Sequence[str]], separator: Optional[str]):
    """ValueError naming the first sentence whose parse has another number of words than the sentence
    (``sentences[i]``: its subword pieces, specials removed) after merging ``separator`` subwords."""
    for i, (parse, pieces) in enumerate(zip(parses, sentences)):
        n_words = len(set(alignment.word_ids(pieces, separator)))
        if n_words != len(parse):
            raise ValueError(
                f"sentence {i} (line {i + 1} of the source) has {len(parse)} words, the source sentence has "
                f"{n_words} after merging '{separator or ''}' subwords: source {' '.join(pieces)[:200]!r} vs "
                f"CoNLL-U {' '.join(w for w, _, _ in parse)[:200]!r}")


def base_relation(deprel: str) -> str:
    """UD relation without subtype, older names mapped to UD v2 (dobj -> obj)."""
    rel = deprel.split(":")[0].lower()
    return RELATION_ALIASES.get(rel, rel)


def relation_instances(sentence, relation: str, direction: str) -> List[Tuple[int, Tuple[int, ...]]]:
    """Instances of a dependency relation in one direction (Voita et al. 2019, Sec. 5.2), 0-based word
    indices: (query word, words its maximum should point at). ``d2h``: one per dependent, target its
    head; ``h2d``: one per head word, targets its dependents of that relation."""
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
    (Voita et al. 2019, Sec. 5.2's accuracy, before dividing by the count). ``argmax``: [H, W]
    word-level key index of each query word's maximum. Returns (correct [H], number of instances)."""
    correct = np.zeros(argmax.shape[0], dtype=np.int64)
    for q, targets in instances:
        correct += np.isin(argmax[:, q], targets)
    return correct, len(instances)


def relative_position_baseline(instances) -> Tuple[Optional[int], float, int]:
    """Voita et al. (2019) Sec. 5.2's baseline: always predict the most frequent relative position
    (target - query) of the relation. ``instances``: (query, targets) pairs from any number of
    sentences. Returns (offset, accuracy, number of instances); ties go to the offset nearest 0."""
    counts = collections.Counter()
    for q, targets in instances:
        counts.update({t - q for t in targets})
    if not counts:
        return None, float("nan"), 0
    best = _most_frequent(counts)
    return int(best), counts[best] / len(instances), len(instances)


# ----------------------------------------------------------------------------------------------
# heads of a (possibly physically pruned) encoder, layers x heads matrices


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


def head_columns(labels: Sequence[Sequence[int]], original_heads: Optional[int] = None) -> int:
    """Columns of the layers x heads matrices: the model's original heads per layer, or more if a head
    id says so."""
    return max([original_heads or 0] + [max(x) + 1 for x in labels if x])


def special_ids(dictionary) -> set:
    """EOS, BOS and padding: never real tokens (Voita et al. 2019 exclude EOS)."""
    return {dictionary.eos(), dictionary.bos(), dictionary.pad()}


# ----------------------------------------------------------------------------------------------
# the analysis


class HeadStatistics:
    """Accumulates the per-head statistics of one encoder over sentences (sums and counts; the means
    are taken in :func:`summarise`). ``n_heads``: heads of each layer; ``relation_keys``: (relation,
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


def _rare_targets(stats: HeadStatistics, words, real_idx, n_words, n_all_words, piece_counts, piece_ranks,
                  rare_min_rank):
    """(rarest, two least frequent) word masks over all ``n_all_words`` words (specials False), or None
    if the sentence does not count for Sec. 5.3; counts the sentence and its chance levels in ``stats``.
    A word's frequency is that of its rarest piece."""
    if n_words < RARE_MIN_WORDS:
        return None
    wcount = np.full(n_words, np.inf)
    wrank = np.zeros(n_words, dtype=np.int64)
    for i, w in zip(real_idx, words):
        wcount[w] = min(wcount[w], piece_counts[i])
        wrank[w] = max(wrank[w], piece_ranks[i])
    rarest, two = rare_word_targets(wcount)
    if wrank[rarest].max() < rare_min_rank:
        return None
    stats.rare_sentences += 1
    stats.rare_chance += rarest.mean()
    stats.rare2_chance += two.mean()
    pad = np.zeros(n_all_words - n_words, dtype=bool)
    return np.concatenate([rarest, pad]), np.concatenate([two, pad])


def analyse_sentence(stats: HeadStatistics, layer_attn: Sequence[Optional[np.ndarray]], pieces: Sequence[str],
                     special: np.ndarray, piece_counts: np.ndarray, piece_ranks: np.ndarray, separator: Optional[str],
                     rare_min_rank: int, parse=None):
    """Add one sentence: ``layer_attn[l]`` [H_l, n, n] over its n real tokens (None: no heads);
    ``special`` marks EOS/BOS among them; ``pieces``/``piece_counts``/``piece_ranks`` per token."""
    real = ~special
    real_idx = np.nonzero(real)[0]
    words = alignment.word_ids([pieces[i] for i in real_idx], separator)
    n_words = (words[-1] + 1) if words else 0
    word_ids = np.empty(len(pieces), dtype=int)
    word_ids[real_idx] = words
    word_ids[special] = n_words + np.arange(int(special.sum()))  # each special symbol its own "word"
    word_real = np.arange(int(word_ids.max()) + 1 if len(pieces) else 0) < n_words
    rare_targets = _rare_targets(stats, words, real_idx, n_words, len(word_real), piece_counts, piece_ranks,
                                 rare_min_rank)
    instances = {}
    if parse is not None:
        for key in stats.relation_keys:
            instances[key] = relation_instances(parse, *key)
            stats.syn_instances[key].extend(instances[key])

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
        _, wmax = max_attention(merge_subword_attention(attn, word_ids), word_real)
        if rare_targets is not None:
            stats.rare_sum[layer] += rare_word_accuracy(wmax, word_real, rare_targets[0])
            stats.rare2_sum[layer] += rare_word_accuracy(wmax, word_real, rare_targets[1])
        for key, inst in instances.items():
            stats.syn_correct[key][layer] += syntactic_accuracy(wmax, inst)[0]


def _mean(total, n):
    return total / n if n else float("nan")


def _head_row(stats: HeadStatistics, layer: int, k: int, head_id: int, baselines: dict, rare2_chance: float,
              positional_threshold: float, syntactic_margin: float, rare_threshold: float, rare_margin: float):
    """The results of head ``k`` (id ``head_id``) of ``layer``; see :func:`summarise`."""
    counts = stats.rel_counts[layer][k]
    pos, share, is_pos = positional_head(counts, positional_threshold)
    total = sum(counts.values())
    row = {
        "layer": layer, "head": head_id, "position": k,
        "confidence": _mean(stats.conf_sum[layer][k], stats.conf_n),
        "top_relative_position": pos, "top_relative_position_share": share, "positional": is_pos,
        "relative_positions": {str(r): c / total for r, c in counts.most_common(5)} if total else {},
        "rare_acc": _mean(stats.rare_sum[layer][k], stats.rare_sentences),
        "rare2_acc": _mean(stats.rare2_sum[layer][k], stats.rare_sentences),
    }
    row["rare"] = bool(stats.rare_sentences and row["rare2_acc"] >= rare_threshold
                       and row["rare2_acc"] >= rare2_chance + rare_margin)
    row["syntactic"] = []
    for key in stats.relation_keys:
        name = f"{key[0]}_{key[1]}"
        n = len(stats.syn_instances[key])
        row[name] = _mean(stats.syn_correct[key][layer][k], n)
        if n and row[name] >= baselines[name]["accuracy"] + syntactic_margin:
            row["syntactic"].append(name)
    return row


def summarise(stats: HeadStatistics, labels: Sequence[Sequence[int]], positional_threshold: float = 0.9,
              syntactic_margin: float = 0.10, rare_threshold: float = 0.5, rare_margin: float = 0.10) -> dict:
    """Per-head results (one dict per existing head, ``labels[l][k]``: original id of layer l's k-th head),
    per-relation baselines and the rare-word chance levels (Voita et al. 2019, Sec. 4-5). A head is
    positional if one relative position takes ``positional_threshold`` of its maxima; rare if its
    two-least accuracy is >= ``rare_threshold`` and >= chance + ``rare_margin``; syntactic for a
    relation if its accuracy is >= the baseline + ``syntactic_margin``."""
    baselines = {}
    for key in stats.relation_keys:
        off, acc, n = relative_position_baseline(stats.syn_instances[key])
        baselines[f"{key[0]}_{key[1]}"] = {"offset": off, "accuracy": acc, "instances": n}
    rare_chance = _mean(stats.rare_chance, stats.rare_sentences)
    rare2_chance = _mean(stats.rare2_chance, stats.rare_sentences)
    heads = [_head_row(stats, layer, k, labels[layer][k], baselines, rare2_chance, positional_threshold,
                       syntactic_margin, rare_threshold, rare_margin)
             for layer in range(stats.layers) for k in range(stats.n_heads[layer])]
    return {
        "heads": heads, "baselines": baselines,
        "rare": {"sentences": stats.rare_sentences, "chance_rarest": rare_chance, "chance_two_least": rare2_chance},
    }


def analyse_dataset(model, samples: Iterable[dict], src_dict, counts: np.ndarray, separator: Optional[str] = "@@",
                    rare_min_rank: int = 500, parses=None,
                    labels: Optional[List[List[int]]] = None) -> HeadStatistics:
    """Run ``model``'s encoder over fairseq ``samples`` (collated batches of a LanguagePairDataset, on the
    model's device) and accumulate the statistics of every encoder self-attention head (Voita et al.
    2019, Sec. 4-5). ``counts``: training frequency of each dictionary symbol; ``parses``: read_conllu()
    of the whole dataset (indexed by sentence id) or None; ``labels``: :func:`layer_head_labels`."""
    encoder = model.encoder
    if labels is None:
        labels = layer_head_labels(model, None)
    n_heads = [len(x) for x in labels]
    relation_keys = [(r, d) for r in RELATIONS for d in DIRECTIONS] if parses is not None else []
    stats = HeadStatistics(n_heads, relation_keys)
    specials = special_ids(src_dict)
    counts = np.asarray(counts, dtype=np.float64).copy()
    counts[list(specials)] = 0
    ranks = frequency_ranks(counts)
    pad = src_dict.pad()
    with torch.no_grad(), EncoderAttentionRecorder(encoder.layers) as rec:
        for sample in samples:
            src = sample["net_input"]["src_tokens"]
            rec.reset()
            encoder(src, **encoder_inputs(encoder, sample["net_input"]))
            weights = [None if w is None else w.numpy() for w in rec.weights]  # the recorder's are on the CPU
            for layer, w in enumerate(weights):
                if w is not None and w.shape[0] != n_heads[layer]:
                    raise RuntimeError(f"encoder layer {layer} returned {w.shape[0]} heads, expected {n_heads[layer]}")
            for row, (sid, toks) in enumerate(zip(sample["id"].tolist(), src.tolist())):
                real_pos = np.array([p for p, t in enumerate(toks) if t != pad], dtype=int)
                toks = [toks[p] for p in real_pos]
                special = np.array([t in specials for t in toks], dtype=bool)
                layer_attn = [None if w is None else w[:, row][:, real_pos][:, :, real_pos] for w in weights]
                analyse_sentence(stats, layer_attn, [src_dict[t] for t in toks], special, counts[toks], ranks[toks],
                                 separator, rare_min_rank, parses[sid] if parses is not None else None)
    return stats


def function_tags(head: dict) -> List[str]:
    """Short names of a head's functions (a row of :func:`summarise`): ``p-1`` (positional, offset),
    ``rare``, ``amod>`` (syntactic head -> dependent), ``amod<`` (dependent -> head)."""
    tags = [f"p{head['top_relative_position']:+d}"] if head["positional"] else []
    if head["rare"]:
        tags.append("rare")
    for name in head["syntactic"]:
        rel, direction = name.rsplit("_", 1)
        tags.append(f"{rel}{'>' if direction == 'h2d' else '<'}")
    return tags


def function_matrices(heads: Sequence[dict], labels: Sequence[Sequence[int]], n_cols: int):
    """(confidence, number of functions, cell text) as layers x ``n_cols`` matrices for the figures;
    nan where a head does not exist. Cell text: up to three :func:`function_tags`."""
    n_layers = len(labels)
    conf = heads_matrix([[h["confidence"] for h in heads if h["layer"] == l] for l in range(n_layers)], labels, n_cols)
    n_func = np.full((n_layers, n_cols), np.nan)
    text = [["" for _ in range(n_cols)] for _ in range(n_layers)]
    for h in heads:
        tags = function_tags(h)
        n_func[h["layer"], h["head"]] = len(tags)
        text[h["layer"]][h["head"]] = "\n".join(tags[:3]) + ("\n..." if len(tags) > 3 else "")
    return conf, n_func, text
