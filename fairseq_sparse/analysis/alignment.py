"""Word alignments from attention: gold files, AER (Och & Ney 2003), SAER (Zhang, Zhao, Li & Zong 2019),
argmax extraction, cumulative coverage (Yang et al. 2020), and the corpus sums of all three.

Pure functions over Python sets and numpy arrays (no torch, no fairseq), used by
:mod:`fairseq_sparse.analysis.attention` (``fairseq-sparse-attention-analysis``) and the head analysis.

Conventions
-----------
* A *link* is a pair ``(i, j)``: source word ``i``, target word ``j``, 0-based, in this order, as in
  the Pharaoh format that fast_align, GIZA++ post-processing and Moses write (``i-j``).
* Attention matrices are ``[target, source]`` (one row per target token, i.e. per decoder query, one
  column per source token), as fairseq returns them and as Zhang, Zhao, Li & Zong (2019) define ``M_A(i, j)``: "the
  attention weight between the i-th target word and the j-th source word".

Gold alignment files (one line per sentence pair, in the order of the test set; an empty line is a
sentence without links). Two common conventions are read:

1. one file: ``i-j`` is a sure link, ``i?j`` a possible link (e.g. ``0-0 1?2 2-1``), the format of
   the gold files of the lilt/alignment-scripts and awesome-align (those are 1-based: use
   ``index_base=1``);
2. two files, one with the sure links and one with the possible links (``--gold`` and
   ``--gold-possible``), both in ``i-j`` form (``i?j`` is also accepted in either file; in the sure
   file it still means possible). The possible file may hold only the possible-but-not-sure links or
   the whole set P: both give the same result, since P always includes S here.

In every case ``P = S ∪ {possible links}``, i.e. S ⊆ P (Och & Ney 2003).
"""
import math
import re
from typing import Iterable, List, Optional, Sequence, Set, Tuple

import numpy as np

from ..modules.token_tags import word_ids

Link = Tuple[int, int]
LinkSet = Set[Link]

_LINK = re.compile(r"^(\d+)([-?])(\d+)$")


class GoldAlignmentError(ValueError):
    """A gold alignment file that is malformed or does not fit the sentences it should align;
    ``sentence``: the 0-based index of the first bad sentence (None if unknown)."""

    def __init__(self, message: str, sentence: Optional[int] = None):
        super().__init__(message)
        self.sentence = sentence


# ----------------------------------------------------------------------------------------------
# reading gold alignments


def parse_links(line: str, index_base: int = 0, where: str = "") -> Tuple[LinkSet, LinkSet]:
    """Sure and possible links of one Pharaoh line: ``i-j`` sure, ``i?j`` possible.

    Returns ``(sure, possible)`` where ``possible`` holds only the links marked ``?`` (the caller adds
    the sure ones to get P). ``index_base``: 0 (Pharaoh, fast_align) or 1; indices below it are an error.
    """
    sure, possible = set(), set()
    for tok in line.split():
        m = _LINK.match(tok)
        if m is None:
            raise GoldAlignmentError(f"{where}bad link {tok!r}: expected 'i-j' (sure) or 'i?j' (possible)")
        i, j = int(m.group(1)) - index_base, int(m.group(3)) - index_base
        if i < 0 or j < 0:
            raise GoldAlignmentError(f"{where}link {tok!r} has an index below {index_base} (--gold-index-base)")
        (sure if m.group(2) == "-" else possible).add((i, j))
    return sure, possible


def _read_lines(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":  # the final newline ends the last line, it does not start a new one
        lines.pop()
    return [ln.rstrip("\r") for ln in lines]


def read_gold_alignments(path: str, possible_path: Optional[str] = None,
                         index_base: int = 0) -> List[Tuple[LinkSet, LinkSet]]:
    """Read gold alignments; returns one ``(S, P)`` per sentence, with ``S ⊆ P``.

    ``path``: ``i-j`` sure and ``i?j`` possible links; ``possible_path`` (optional): a second file with
    one line per sentence whose links are all possible (``-`` or ``?``). Both files must have the same
    number of lines. See the module docstring for the conventions.
    """
    sure_lines = _read_lines(path)
    gold = []
    for k, line in enumerate(sure_lines):
        s, p = parse_links(line, index_base, f"{path}:{k + 1}: ")
        gold.append((s, s | p))
    if possible_path is not None:
        poss_lines = _read_lines(possible_path)
        if len(poss_lines) != len(sure_lines):
            first = min(len(poss_lines), len(sure_lines))
            raise GoldAlignmentError(
                f"{possible_path} has {len(poss_lines)} lines, {path} has {len(sure_lines)}: sentence {first} "
                f"(line {first + 1}) is in only one of them", first)
        for k, line in enumerate(poss_lines):
            s, p = parse_links(line, index_base, f"{possible_path}:{k + 1}: ")
            gold[k] = (gold[k][0], gold[k][1] | s | p)
    return gold


def check_gold_alignments(gold: Sequence[Tuple[LinkSet, LinkSet]], src_words: Sequence[int],
                          tgt_words: Sequence[int]) -> None:
    """Raise :class:`GoldAlignmentError` naming the first sentence whose gold links do not fit.

    ``src_words[k]`` / ``tgt_words[k]``: number of source / target words of sentence k (EOS excluded,
    subwords merged). The gold must have exactly one line per sentence and every index in range.
    """
    if len(gold) != len(src_words):
        first = min(len(gold), len(src_words))
        raise GoldAlignmentError(
            f"the gold alignment has {len(gold)} sentences, the data has {len(src_words)}: sentence {first} "
            f"(line {first + 1}) is {'missing from the gold file' if len(gold) < len(src_words) else 'extra'}",
            first)
    for k, (s, p) in enumerate(gold):
        for i, j in sorted(s | p):
            if i >= src_words[k] or j >= tgt_words[k]:
                side = "source" if i >= src_words[k] else "target"
                raise GoldAlignmentError(
                    f"gold sentence {k} (line {k + 1}): link {i}-{j} is out of range, the sentence has "
                    f"{src_words[k]} source and {tgt_words[k]} target words (bad {side} index)", k)


def format_links(links: Iterable[Link]) -> str:
    """Pharaoh line ``i-j i-j ...`` (sorted by target, then source word)."""
    return " ".join(f"{i}-{j}" for i, j in sorted(links, key=lambda x: (x[1], x[0])))


# ----------------------------------------------------------------------------------------------
# AER and SAER


def aer_counts(hyp: LinkSet, sure: LinkSet, possible: LinkSet) -> np.ndarray:
    """``[|A∩S|, |A∩P|, |A|, |S|]`` of one sentence (``possible`` = P, which includes S)."""
    possible = possible | sure
    return np.array([len(hyp & sure), len(hyp & possible), len(hyp), len(sure)], dtype=np.float64)


def aer_from_counts(counts) -> float:
    """AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|) from (summed) :func:`aer_counts`; nan if |A| + |S| = 0."""
    a_s, a_p, a, s = (float(x) for x in counts)
    return 1.0 - (a_s + a_p) / (a + s) if a + s > 0 else math.nan


def aer(hyps: Sequence[LinkSet], gold: Sequence[Tuple[LinkSet, LinkSet]]) -> float:
    """Alignment error rate (Och & Ney 2003) over a corpus: the counts are summed over the sentences
    before dividing. ``hyps[k]``: predicted links A of sentence k; ``gold[k]``: (S, P) with S ⊆ P."""
    return _corpus_rate("aer", hyps, gold, "hypotheses")


def _corpus_rate(rate: str, per_sentence: Sequence, gold: Sequence[Tuple[LinkSet, LinkSet]], what: str) -> float:
    """``rate`` ("aer" or "saer") of a corpus through :class:`AlignmentSums` (one layer)."""
    if len(per_sentence) != len(gold):
        raise ValueError(f"{len(per_sentence)} {what} for {len(gold)} gold sentences")
    sums = AlignmentSums(1)
    add = getattr(sums, f"add_{rate}")
    for x, g in zip(per_sentence, gold):
        add(0, x, g)
    return float(getattr(sums, rate)()[0])


def link_matrix(links: Iterable[Link], n_tgt: int, n_src: int) -> np.ndarray:
    """0/1 matrix ``[n_tgt, n_src]`` with 1.0 at ``[j, i]`` for every link (i, j) (M_S, M_P of Zhang, Zhao,
    Li & Zong 2019)."""
    m = np.zeros((n_tgt, n_src))
    for i, j in links:
        m[j, i] = 1.0
    return m


def saer_counts(soft: np.ndarray, sure: LinkSet, possible: LinkSet) -> np.ndarray:
    """``[|M_A×M_S|, |M_A×M_P|, |M_A|, |M_S|]`` of one sentence for :func:`saer`.

    ``soft``: M_A, ``[target words, source words]``: the attention weight between target word j and
    source word i at ``[j, i]``. × is the element-wise product and |M| the sum of M's entries, which
    for 0/1 matrices is the number of links (so SAER of a one-hot M_A equals AER)."""
    soft = np.asarray(soft, dtype=np.float64)
    n_tgt, n_src = soft.shape
    m_s = link_matrix(sure, n_tgt, n_src)
    m_p = link_matrix(possible | sure, n_tgt, n_src)
    return np.array([(soft * m_s).sum(), (soft * m_p).sum(), soft.sum(), m_s.sum()])


def saer(soft: Sequence[np.ndarray], gold: Sequence[Tuple[LinkSet, LinkSet]]) -> float:
    """Soft alignment error rate, Zhang, Zhao, Li & Zong (2019) Eq. (23) (following Tu et al. 2016)::

        SAER = 1 - (|M_A × M_S| + |M_A × M_P|) / (|M_A| + |M_S|)

    M_S, M_P: the sure and possible links of the reference, probability 1.0 (else 0.0); M_A: the
    candidate alignment, M_A(i, j) = the attention weight between the i-th target word and the j-th
    source word; × element-wise product, |M| = sum of the entries. The attention weights are used as
    they are (no renormalisation after the EOS column is dropped). Over a corpus the four sums are
    added over sentences before dividing, as for AER. ``soft[k]``: ``[target words, source words]``.
    """
    return _corpus_rate("saer", soft, gold, "attention matrices")


# ----------------------------------------------------------------------------------------------
# attention -> word-level matrix -> links


def n_words(pieces: Sequence[str], special: Sequence[bool], separator: Optional[str] = "@@") -> int:
    """Number of words of a sentence: its pieces without the special ones (EOS, BOS), subwords merged."""
    return len(set(word_ids([p for p, s in zip(pieces, special) if not s], separator)))


def merge_subwords(attn: np.ndarray, src_word_ids: Sequence[int], tgt_word_ids: Sequence[int]) -> np.ndarray:
    """Token-level attention ``[..., T, S]`` -> word-level ``[..., W_t, W_s]``: the attention *to* a source
    word is the sum over its pieces, the attention *from* a target word the mean over its pieces."""
    attn = np.asarray(attn, dtype=np.float64)
    src_word_ids, tgt_word_ids = np.asarray(src_word_ids, dtype=int), np.asarray(tgt_word_ids, dtype=int)
    if attn.shape[-1] != src_word_ids.size or attn.shape[-2] != tgt_word_ids.size:
        raise ValueError(f"attention of shape {attn.shape} for {tgt_word_ids.size} target and "
                         f"{src_word_ids.size} source pieces")
    n_s = int(src_word_ids.max()) + 1 if src_word_ids.size else 0
    n_t = int(tgt_word_ids.max()) + 1 if tgt_word_ids.size else 0
    to_src = np.zeros((src_word_ids.size, n_s))
    to_src[np.arange(src_word_ids.size), src_word_ids] = 1.0
    from_tgt = np.zeros((n_t, tgt_word_ids.size))
    from_tgt[tgt_word_ids, np.arange(tgt_word_ids.size)] = 1.0
    counts = from_tgt.sum(1, keepdims=True)
    from_tgt = from_tgt / np.where(counts > 0, counts, 1.0)
    return from_tgt @ attn @ to_src


def layer_average(layer_attn: Sequence[Optional[np.ndarray]], layers: Optional[Sequence[int]] = None) -> Optional[np.ndarray]:
    """Head-averaged attention ``[T, S]`` of one layer (``layer_attn[l]``: ``[H, T, S]``), or the mean over
    ``layers`` of the head-averaged layers (heads are averaged within a layer first, so layers with
    fewer heads after pruning weigh the same). Layers whose entry is None (no heads) are skipped;
    None if no layer is left."""
    if layers is None:
        layers = range(len(layer_attn))
    mats = [np.asarray(layer_attn[l], dtype=np.float64).mean(0) for l in layers if layer_attn[l] is not None]
    return np.mean(mats, axis=0) if mats else None


def word_matrix(attn: np.ndarray, src_pieces: Sequence[str], tgt_pieces: Sequence[str],
                src_special: Sequence[bool], tgt_special: Sequence[bool],
                separator: Optional[str] = "@@") -> np.ndarray:
    """Word-level alignment matrix ``[target words, source words]`` from a token-level ``[T, S]`` one:
    the rows/columns of special tokens (EOS, BOS) are dropped (no renormalisation), then the subwords
    are merged (:func:`merge_subwords`). ``*_pieces`` name every token, special ones included."""
    attn = np.asarray(attn, dtype=np.float64)
    src_keep = ~np.asarray(src_special, dtype=bool)
    tgt_keep = ~np.asarray(tgt_special, dtype=bool)
    if attn.shape != (tgt_keep.size, src_keep.size):
        raise ValueError(f"attention of shape {attn.shape} for {tgt_keep.size} target and {src_keep.size} source tokens")
    sub = attn[tgt_keep][:, src_keep]
    src_w = word_ids([p for p, k in zip(src_pieces, src_keep) if k], separator)
    tgt_w = word_ids([p for p, k in zip(tgt_pieces, tgt_keep) if k], separator)
    return merge_subwords(sub, src_w, tgt_w)


def argmax_links(matrix: np.ndarray) -> LinkSet:
    """Hard alignment: each target word (row) is linked to the source word (column) with the largest
    weight (Yang et al. 2020, Sec. 3.2: "selecting the source word with the highest attention weight for each
    target word"); ties go to the first source word. No links when there is no source word."""
    matrix = np.asarray(matrix)
    if matrix.ndim != 2:
        raise ValueError(f"expected a [target, source] matrix, got shape {matrix.shape}")
    if matrix.shape[1] == 0:
        return set()
    return {(int(i), j) for j, i in enumerate(matrix.argmax(1))}


# ----------------------------------------------------------------------------------------------
# cumulative coverage (Yang et al. 2020, Eq. 2)


def covered_source_words(links: Iterable[Link]) -> Set[int]:
    """A_i of Yang et al. (2020): the source words aligned to at least one target word."""
    return {i for i, _ in links}


def cumulative_covered(layer_links: Sequence[Optional[LinkSet]]) -> List[int]:
    """|A_1 ∪ ... ∪ A_i| for i = 1..L of one sentence; ``layer_links[l]``: the links extracted from
    layer l (None = a layer without heads covers nothing)."""
    seen, out = set(), []
    for links in layer_links:
        seen |= covered_source_words(links or ())
        out.append(len(seen))
    return out


def cumulative_coverage(sentence_layer_links: Sequence[Sequence[Optional[LinkSet]]],
                        n_src_words: Sequence[int]) -> np.ndarray:
    """Cumulative coverage ratio C_{<=i} = |A_1 ∪ ... ∪ A_i| / N of Yang et al. (2020) Eq. (2), for every layer i.

    ``sentence_layer_links[k][l]``: the argmax links of sentence k at decoder layer l (bottom first);
    ``n_src_words[k]``: its number of source words. A_i is taken per sentence (a source word is a
    position in its sentence) and N is "the number of total source words": the covered counts and N
    are summed over the corpus before dividing. Returns ``[L]`` (nan if N = 0).
    """
    if len(sentence_layer_links) != len(n_src_words):
        raise ValueError(f"{len(sentence_layer_links)} sentences of links for {len(n_src_words)} lengths")
    n_layers = max((len(x) for x in sentence_layer_links), default=0)
    sums = AlignmentSums(n_layers)
    for links, n in zip(sentence_layer_links, n_src_words):
        sums.add_coverage(list(links) + [None] * (n_layers - len(links)), n)  # a missing layer adds nothing
    return sums.coverage()


class AlignmentSums:
    """Corpus sums per layer (or per combination of layers) behind AER, SAER and coverage: the counts of
    :func:`aer_counts` / :func:`saer_counts` and the covered source words of :func:`cumulative_covered` are
    added over sentences and divided at the end (never a mean of per-sentence rates).
    :func:`aer`, :func:`saer` and :func:`cumulative_coverage` are this class applied to a whole corpus."""

    def __init__(self, n_layers: int):
        self.aer_counts = np.zeros((n_layers, 4))
        self.saer_counts = np.zeros((n_layers, 4))
        self.covered_cumulative = np.zeros(n_layers)  # sum over sentences of |A_1 ∪ ... ∪ A_i|
        self.covered_layer = np.zeros(n_layers)  # sum over sentences of |A_i|
        self.src_words = 0  # N

    def add_aer(self, layer: int, links: LinkSet, gold: Tuple[LinkSet, LinkSet]):
        self.aer_counts[layer] += aer_counts(links, *gold)

    def add_saer(self, layer: int, soft: np.ndarray, gold: Tuple[LinkSet, LinkSet]):
        self.saer_counts[layer] += saer_counts(soft, *gold)

    def add_coverage(self, layer_links: Sequence[Optional[LinkSet]], n_src_words: int):
        """One sentence: ``layer_links[l]`` its links at layer l (None: a layer without heads)."""
        self.covered_cumulative += cumulative_covered(layer_links)
        self.covered_layer += [len(covered_source_words(links or ())) for links in layer_links]
        self.src_words += n_src_words

    def aer(self) -> np.ndarray:
        return np.array([aer_from_counts(c) for c in self.aer_counts])

    def saer(self) -> np.ndarray:
        return np.array([aer_from_counts(c) for c in self.saer_counts])

    def coverage(self) -> np.ndarray:
        """C_{<=i} per layer (nan if N = 0)."""
        return self._per_word(self.covered_cumulative)

    def coverage_layer(self) -> np.ndarray:
        """|A_i| / N per layer: the layer alone (nan if N = 0)."""
        return self._per_word(self.covered_layer)

    def _per_word(self, covered: np.ndarray) -> np.ndarray:
        return covered / self.src_words if self.src_words > 0 else np.full(covered.shape, np.nan)


# ----------------------------------------------------------------------------------------------
# distribution statistics


def entropy(p: np.ndarray, axis: int = -1) -> np.ndarray:
    """Shannon entropy in nats along ``axis`` (0 log 0 = 0); no renormalisation."""
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return terms.sum(axis)
