"""Part-of-speech tags of source pieces, as the POS pattern (:mod:`.encoder_patterns`) and the task
``translation_source_tags`` read them: the Penn Treebank tag table and its ids, the tag groups of Zhang, Titov &
Sennrich (2021, footnote 9), words of subword pieces and ``{split}.tags`` files. The token types of the
analyses (:mod:`fairseq_sparse.analysis.token_types`) build on these."""
from typing import Dict, List, Optional, Sequence, Tuple

PUNCT, FUNCTION, CONTENT, OTHER = "punct", "function", "content", "other"

#: Zhang, Titov & Sennrich 2021, footnote 9 (Penn Treebank tags; JJ, NN, RB, VB with their variants)
FUNCTION_TAGS = frozenset("CC IN RP TO UH DT WP".split())
CONTENT_TAG_PREFIXES = ("MD", "JJ", "NN", "RB", "VB")
#: Penn Treebank punctuation tags (and spaCy's HYPH, NFP)
PUNCT_TAGS = frozenset([".", ",", ":", "``", "''", "-LRB-", "-RRB-", "(", ")", "#", "$", "HYPH", "NFP"])
#: the Penn Treebank tags (and spaCy's additions) that tag ids number: a tag's id is its index + 2 (0: no tag,
#: for EOS and padding; 1: a tag not in this list)
PENN_TAGS = tuple("CC CD DT EX FW IN JJ JJR JJS LS MD NN NNS NNP NNPS PDT POS PRP PRP$ RB RBR RBS RP SYM TO UH VB "
                  "VBD VBG VBN VBP VBZ WDT WP WP$ WRB . , : `` '' -LRB- -RRB- ( ) # $ HYPH NFP ADD AFX XX _SP".split())
NO_TAG, UNKNOWN_TAG = 0, 1
#: fairseq's unknown word: a source piece the dictionary lacks
UNK_PIECE = "<unk>"
#: Universal POS tags (Universal Dependencies; spaCy's ``pos_``) that are no Penn Treebank tag: a tags file
#: made mostly of these was written with the wrong tag set (the tag groups would find no function word)
UNIVERSAL_ONLY_TAGS = frozenset("ADJ ADP ADV AUX CCONJ DET INTJ NOUN NUM PART PRON PROPN PUNCT SCONJ VERB X".split())
_TAG_IDS = {t: k + 2 for k, t in enumerate(PENN_TAGS)}


def tag_id(tag: str) -> int:
    """The id of a tag (:data:`PENN_TAGS`; :data:`UNKNOWN_TAG` for any other)."""
    return _TAG_IDS.get(tag, UNKNOWN_TAG)


def tag_type(tag: str) -> str:
    """The type of a word with this Penn Treebank tag (Zhang, Titov & Sennrich 2021, footnote 9)."""
    if tag in FUNCTION_TAGS:
        return FUNCTION
    if tag.startswith(CONTENT_TAG_PREFIXES):
        return CONTENT
    if tag in PUNCT_TAGS:
        return PUNCT
    return OTHER


def word_ids(pieces: Sequence[str], separator: Optional[str] = "@@") -> List[int]:
    """Word index of each subword piece: pieces ending with ``separator`` are joined to the next piece
    (subword-nmt BPE: ``new@@ york`` -> one word). ``separator`` None/'' : every piece is a word."""
    ids, w, cont = [], -1, False
    for p in pieces:
        if not cont:
            w += 1
        ids.append(w)
        cont = bool(separator) and p.endswith(separator)
    return ids


def words_of(pieces: Sequence[str], separator: Optional[str]) -> Tuple[List[int], List[str]]:
    """(word index of each piece, text of each word): pieces ending with ``separator`` joined to the next, as
    :func:`word_ids`; sentencepiece's word-start mark dropped."""
    ids = word_ids(pieces, separator)
    words: List[str] = [""] * (ids[-1] + 1 if ids else 0)
    for w, p in zip(ids, pieces):
        piece = p[: -len(separator)] if separator and p.endswith(separator) else p
        words[w] += piece.replace("\u2581", "")
    return ids, words


def word_tags(pieces: Sequence[str], tags: Sequence[str], separator: Optional[str]) -> Tuple[List[int], List[str]]:
    """(word index of each piece, one tag per word) from ``tags`` given one per word or one per piece (a word's
    first piece's tag counts); ValueError if their number fits neither."""
    ids, words = words_of(pieces, separator)
    if len(tags) == len(pieces) and len(tags) != len(words):
        first: Dict[int, str] = {}
        for w, t in zip(ids, tags):
            first.setdefault(w, t)
        tags = [first[w] for w in range(len(words))]
    if len(tags) != len(words):
        raise ValueError(f"{len(tags)} tags for {len(words)} words ({len(pieces)} pieces)")
    return ids, list(tags)


def piece_tag_ids(pieces: Sequence[str], tags: Sequence[str], separator: Optional[str]) -> List[int]:
    """The :func:`tag_id` of each piece: its word's tag (``tags`` one per word or one per piece)."""
    ids, per_word = word_tags(pieces, tags, separator)
    return [tag_id(per_word[w]) for w in ids]


def _unknown_joined(pieces: Sequence[str], n_words: int, separator: Optional[str]) -> Optional[List[str]]:
    """``pieces`` of ``n_words`` words where ``<unk>`` pieces (a BPE piece the dictionary lacks: its continuation
    marker is lost in the ids) are read as continuations, the first ones as many as needed; None if none fits."""
    unknown = [i for i, p in enumerate(pieces[:-1]) if p == UNK_PIECE]
    extra = len(words_of(pieces, separator)[1]) - n_words
    if not separator or not 0 < extra <= len(unknown):
        return None
    joined = set(unknown[:extra])
    return [p + separator if i in joined else p for i, p in enumerate(pieces)]


def read_tags(path: str, sentences: Sequence[Sequence[str]], separator: Optional[str]) -> List[List[str]]:
    """The part-of-speech tags of ``path``: one line per sentence of ``sentences`` (the split's source pieces,
    specials excluded), whitespace-separated tags, one per word (pieces joined at ``separator``) or one per
    piece. A sentence whose words the ``<unk>`` pieces leave uncertain gets one tag per piece (its word's). ValueError
    naming the file and the first line that does not match."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read tags from {path}: {e}") from None
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != len(sentences):
        raise ValueError(f"{path} has {len(lines)} lines, the split {len(sentences)} sentences")
    tags = []
    for n, (line, pieces) in enumerate(zip(lines, sentences), start=1):
        row = line.split()
        n_words = len(words_of(pieces, separator)[1])
        joined = None if len(row) in (n_words, len(pieces)) else _unknown_joined(pieces, len(row), separator)
        if joined is not None:
            row = [row[w] for w in word_ids(joined, separator)]
        elif len(row) not in (n_words, len(pieces)):
            raise ValueError(f"{path} line {n}: {len(row)} tags for a sentence of {n_words} words "
                             f"({len(pieces)} pieces)")
        tags.append(row)
    check_penn_tags(path, tags)
    return tags


def check_penn_tags(path: str, tags: Sequence[Sequence[str]]):
    """ValueError if most tags of ``path`` are Universal POS tags: they are none of the Penn Treebank tags that
    the POS pattern drops and the token types group, so both would silently find nothing."""
    n = sum(len(row) for row in tags)
    universal = sum(t in UNIVERSAL_ONLY_TAGS for row in tags for t in row)
    if n and universal > n / 2:
        raise ValueError(f"{path}: the tags look like Universal POS tags (DET, NOUN, ...: {universal} of {n}), not Penn "
                         "Treebank tags (DT, NN, ...); write Penn Treebank tags (fairseq-sparse-pos-tags writes "
                         "spaCy's tag_, not pos_)")
