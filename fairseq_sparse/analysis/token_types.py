"""Token types of source pieces, for "which encodings does L0Drop prune first?" (Zhang, Titov & Sennrich
2021, Sec. 6, Fig. 5: punctuation and function words before content words, other subword pieces before
the first piece of a word) and, for character-level sources, where inside a word the pruned characters
sit (their Fig. 6).

Six types, the paper's (Sec. 6 and footnote 9). A word split into several subword pieces gives ``bpeh``
to its first piece and ``bpeo`` to the others, whatever the word is. A word of one piece gets the type of
the word:

* with part-of-speech tags (Penn Treebank, one per word or per piece; :func:`read_tags`), the paper's
  groups (:func:`tag_type`): ``function`` CC IN RP TO UH DT WP, ``content`` MD JJ* NN* RB* VB*,
  ``punct`` the punctuation tags, ``other`` every other tag (CD, EX, FW, SYM, PRP, ...);
* without tags, a fallback from the word itself (:func:`word_type`): ``punct`` if every character is
  Unicode punctuation or a symbol (after undoing Moses' HTML escapes), ``function`` if the lower-cased word
  is in a closed-class word list (built in: :data:`ENGLISH_FUNCTION_WORDS`; other languages bring their own),
  ``other`` if it has digits and no letter (numbers), ``content`` otherwise. The fallback's function words
  are a list, not the tagger's decision: pronouns count as function words there, as ``other`` with tags.
"""
import html
import unicodedata
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

# the tag tables and tags files are the core's (the POS pattern reads them); tt.read_tags etc. as before
from ..modules.token_tags import (  # noqa: F401
    CONTENT, FUNCTION, OTHER, PUNCT, read_tags, tag_id, tag_type, word_tags, words_of,
)

BPEH, BPEO = "bpeh", "bpeo"
TOKEN_TYPES = (PUNCT, FUNCTION, CONTENT, OTHER, BPEH, BPEO)
TYPE_NAMES = {PUNCT: "punctuation", FUNCTION: "function words", CONTENT: "content words", OTHER: "other words",
              BPEH: "first pieces of split words (BPEH)", BPEO: "other pieces of split words (BPEO)"}

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
    """The type of one (joined, tokenised) word without tags: ``punct``, ``function``, ``other`` (digits, no
    letter) or ``content`` (see the module docstring)."""
    word = html.unescape(word)
    if is_punctuation(word):
        return PUNCT
    if word.lower() in function_words:
        return FUNCTION
    if any(c.isdigit() for c in word) and not any(c.isalpha() for c in word):
        return OTHER
    return CONTENT


def continuation_marker(remove_bpe: Optional[str]) -> Optional[str]:
    """The subword continuation marker of a ``--remove-bpe`` value ('@@ ' or 'subword_nmt': '@@'); None
    (every piece a word of its own) for no BPE and for other schemes."""
    if remove_bpe == "subword_nmt":
        return "@@"
    if remove_bpe and remove_bpe.endswith(" ") and remove_bpe.strip():
        return remove_bpe.strip()
    return None


def piece_types(pieces: Sequence[str], separator: Optional[str],
                function_words: Iterable[str] = ENGLISH_FUNCTION_WORDS, tags: Optional[Sequence[str]] = None,
                subwords: bool = True) -> List[str]:
    """The type of each piece (module docstring): ``bpeh`` / ``bpeo`` for the pieces of a word split in
    several (unless ``subwords`` is False), else the word's type, from ``tags`` (one per word or one per
    piece, where a word's first piece's tag counts) when given, else from the word itself."""
    if tags is not None:
        ids, per_word = word_tags(pieces, tags, separator)
        types = [tag_type(t) for t in per_word]
    else:
        ids, words = words_of(pieces, separator)
        types = [word_type(text, function_words) for text in words]
    out = [types[w] for w in ids]
    if subwords:
        size = {w: ids.count(w) for w in set(ids)}
        out = [t if size[w] == 1 else (BPEH if k == 0 or ids[k - 1] != w else BPEO)
               for k, (w, t) in enumerate(zip(ids, out))]
    return out


def char_positions(chars: Sequence[str], boundary: str) -> List[Optional[float]]:
    """Relative position inside its word of each character of a character-level source, 0 at the word's first
    and 1 at its last character (Zhang, Titov & Sennrich 2021, Fig. 6); None for ``boundary`` (the space
    symbol) and for words of one character."""
    out: List[Optional[float]] = []
    word: List[int] = []

    def close():
        for i, k in enumerate(word):
            out[k] = i / (len(word) - 1) if len(word) > 1 else None
        word.clear()

    for k, c in enumerate(chars):
        out.append(None)
        if c == boundary:
            close()
        else:
            word.append(k)
    close()
    return out


class PrunedPositions:
    """Pruned characters by relative position inside their word, in ``bins`` equal bins of [0, 1] (Fig. 6), and
    the word-boundary symbols pruned (Sec. 6: 89.2% of the space symbols' encodings on WMT14)."""

    def __init__(self, bins: int = 10):
        self.bins = bins
        self.count = [0] * bins
        self.pruned = [0] * bins
        self.boundaries = 0
        self.boundaries_pruned = 0

    def add(self, positions: Sequence[Optional[float]], pruned: Sequence[bool]):
        for x, p in zip(positions, pruned):
            if x is None:
                continue
            b = min(int(x * self.bins), self.bins - 1)
            self.count[b] += 1
            self.pruned[b] += int(bool(p))

    def rows(self) -> List[dict]:
        """Per bin: its range, characters, pruned ones, the share of the bin pruned and the bin's share of all
        pruned characters (the distribution Fig. 6 draws)."""
        total = sum(self.pruned)
        return [{"from": b / self.bins, "to": (b + 1) / self.bins, "chars": self.count[b], "pruned": self.pruned[b],
                 "share_pruned": self.pruned[b] / self.count[b] if self.count[b] else None,
                 "share_of_pruned": self.pruned[b] / total if total else None} for b in range(self.bins)]

    def boundary(self) -> dict:
        """The word-boundary symbols: how many, how many pruned, the share pruned (None without any)."""
        n, k = self.boundaries, self.boundaries_pruned
        return {"chars": n, "pruned": k, "share_pruned": k / n if n else None}


def pruned_by_position(sentences: Iterable[Tuple[object, Sequence[Tuple[str, bool]]]], boundary: str,
                       bins: int = 10) -> "PrunedPositions":
    """:class:`PrunedPositions` of character-level sentences [(id, [(character, pruned)])], the space symbol
    ``boundary`` between words (Fig. 6)."""
    positions = PrunedPositions(bins)
    for _, pieces in sentences:
        positions.add(char_positions([t for t, _ in pieces], boundary), [p for _, p in pieces])
        flags = [p for t, p in pieces if t == boundary]
        positions.boundaries += len(flags)
        positions.boundaries_pruned += sum(map(bool, flags))
    return positions


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


def pruned_by_type(sentences: Iterable[Tuple[int, Sequence[Tuple[str, bool]]]], separator: Optional[str],
                   function_words=ENGLISH_FUNCTION_WORDS, tags=None) -> "PrunedByType":
    """Pieces and pruned pieces per token type over ``sentences`` ((sentence id, [(piece, pruned), ...]) without
    special tokens; types by :func:`piece_types`, from ``tags`` {sentence id: tags} when given)."""
    by_type = PrunedByType()
    for sid, pieces in sentences:
        types = piece_types([p for p, _ in pieces], separator, function_words, None if tags is None else tags[sid])
        by_type.add(types, [pruned for _, pruned in pieces])
    return by_type
