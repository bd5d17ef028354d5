"""Coarse token types of source words, for "which encodings does L0Drop prune first?" (Zhang, Titov &
Sennrich 2021, Sec. 6 and Fig. 5: punctuation and function words are pruned before content words).

Three types, decided per *word* (subword pieces joined) and given to each of its pieces:

* ``punct``: every character is Unicode punctuation or a symbol (categories P* and S*), after undoing
  Moses' HTML escapes (``&quot;`` -> ``"``);
* ``function``: the lower-cased word is in a closed-class word list (built in: :data:`ENGLISH_FUNCTION_WORDS`;
  other source languages bring their own list, one word per line);
* ``content``: everything else.

A first, coarse cut; part-of-speech types as in the paper's Fig. 5 come later.
"""
import html
import unicodedata
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence

from .alignment import word_ids

PUNCT, FUNCTION, CONTENT = "punct", "function", "content"
TOKEN_TYPES = (PUNCT, FUNCTION, CONTENT)

#: English closed-class words, lower-cased: determiners, pronouns, prepositions, conjunctions,
#: auxiliaries and modals, particles and the clitics of Moses-tokenised text ('s, n't)
ENGLISH_FUNCTION_WORDS: FrozenSet[str] = frozenset("""
a an the this that these those some any no every each either neither all both few many much more most
several such other another enough
i me my mine myself you your yours yourself yourselves he him his himself she her hers herself it its itself
we us our ours ourselves they them their theirs themselves who whom whose which what whatever whoever
someone anyone everyone something anything everything nothing one
about above across after against along among around as at before behind below beneath beside between
beyond by despite down during except for from in inside into like near of off on onto out outside over
past since through throughout till to toward towards under underneath until up upon via with within without
and but or nor so yet because although though while whereas if unless whether than once when whenever
where wherever why how
be am is are was were been being have has had having do does did will would shall should can could may
might must ought
not n't 's 're 've 'll 'd 'm there here then just also very too only even
""".split())


def read_function_words(path: str) -> FrozenSet[str]:
    """The lower-cased words of ``path`` (one per line; blank lines and lines starting with # skipped).
    ValueError naming the file if it cannot be read or holds no word."""
    try:
        with open(path, encoding="utf-8") as f:
            words = frozenset(w.strip().lower() for w in f if w.strip() and not w.lstrip().startswith("#"))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read function words from {path}: {e}") from None
    if not words:
        raise ValueError(f"function word list {path} holds no word")
    return words


def is_punctuation(word: str) -> bool:
    """Every character (at least one) is Unicode punctuation (P*) or a symbol (S*)."""
    return bool(word) and all(unicodedata.category(c)[0] in "PS" for c in word)


def word_type(word: str, function_words: Iterable[str] = ENGLISH_FUNCTION_WORDS) -> str:
    """``punct``, ``function`` or ``content`` of one (joined, tokenised) word."""
    word = html.unescape(word)
    if is_punctuation(word):
        return PUNCT
    return FUNCTION if word.lower() in function_words else CONTENT


def continuation_marker(remove_bpe: Optional[str]) -> Optional[str]:
    """The subword continuation marker of a ``--remove-bpe`` value ('@@ ' or 'subword_nmt': '@@'); None
    (every piece a word of its own) for no BPE and for other schemes."""
    if remove_bpe == "subword_nmt":
        return "@@"
    if remove_bpe and remove_bpe.endswith(" ") and remove_bpe.strip():
        return remove_bpe.strip()
    return None


def piece_types(pieces: Sequence[str], separator: Optional[str],
                function_words: Iterable[str] = ENGLISH_FUNCTION_WORDS) -> List[str]:
    """The type of each subword piece: that of its word (pieces ending with ``separator`` joined to the next,
    as :func:`fairseq_sparse.analysis.alignment.word_ids`; sentencepiece's word-start mark dropped)."""
    ids = word_ids(pieces, separator)
    words: Dict[int, str] = {}
    for w, p in zip(ids, pieces):
        piece = p[: -len(separator)] if separator and p.endswith(separator) else p
        words[w] = words.get(w, "") + piece.replace("\u2581", "")
    types = {w: word_type(text, function_words) for w, text in words.items()}
    return [types[w] for w in ids]


class PrunedByType:
    """Counts of source pieces and of pruned ones (g_hat = 0) per token type."""

    def __init__(self):
        self.count = {t: 0 for t in TOKEN_TYPES}
        self.pruned = {t: 0 for t in TOKEN_TYPES}

    def add(self, types: Sequence[str], pruned: Sequence[bool]):
        for t, p in zip(types, pruned):
            self.count[t] += 1
            self.pruned[t] += int(bool(p))

    def shares(self) -> Dict[str, Optional[float]]:
        """{type: share of its pieces pruned} (None for a type with no piece)."""
        return {t: self.pruned[t] / self.count[t] if self.count[t] else None for t in TOKEN_TYPES}
