"""Where a sparse model loses against its control, from test decodings alone (no training): the BLEU gap by segment
type, by source length and by the share of reference words copied from the source, brevity, chrF, repeated n-grams,
and the recall of reference words copied verbatim from the source, split by whether the model pruned their source
pieces. Lists in, dicts out; the recipe's ``gap_analysis`` step feeds it."""
from collections import Counter
from typing import Dict, List, Optional, Sequence

from .scores import bleu_metric

#: source lengths (pieces, end of sentence excluded) where one bucket ends: short, medium, long, longer
LENGTH_EDGES = (10, 20, 40)


def length_bucket(n: int, edges: Sequence[int] = LENGTH_EDGES) -> str:
    """'1-10', '11-20', '21-40', '41+' for the default edges."""
    low = 1
    for edge in edges:
        if n <= edge:
            return f"{low}-{edge}"
        low = edge + 1
    return f"{low}+"


def brevity(hyps: Sequence[str], refs: Sequence[str], tokenize: str = "13a") -> Dict[str, float]:
    """sacrebleu's corpus BLEU with its length ratio (hypothesis / reference length) and brevity penalty BP."""
    s = bleu_metric(tokenize).corpus_score(list(hyps), [list(refs)])
    return {"bleu": round(s.score, 2), "ratio": round(s.sys_len / max(s.ref_len, 1), 4), "bp": round(s.bp, 4),
            "sys_len": s.sys_len, "ref_len": s.ref_len}


def by_group(groups: Sequence[str], control: Sequence[str], method: Sequence[str], refs: Sequence[str],
             tokenize: str = "13a") -> Dict[str, Dict[str, float]]:
    """{group: {sentences, control, method, gap, relative_gap, control_ratio, method_ratio}}: corpus BLEU of each
    system on the sentences of each group (a label per test sentence), in the order groups first appear."""
    out = {}
    for g in dict.fromkeys(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        c = brevity([control[i] for i in idx], [refs[i] for i in idx], tokenize)
        m = brevity([method[i] for i in idx], [refs[i] for i in idx], tokenize)
        out[g] = {"sentences": len(idx), "control": c["bleu"], "method": m["bleu"],
                  "gap": round(m["bleu"] - c["bleu"], 2),
                  "relative_gap": round((m["bleu"] - c["bleu"]) / c["bleu"], 4) if c["bleu"] else None,
                  "control_ratio": c["ratio"], "method_ratio": m["ratio"]}
    return out


def source_words(pieces: Sequence[str], pruned: Optional[Sequence[bool]] = None, separator: str = "@@"):
    """[(word, state)] of a BPE-split source: pieces ending in SEPARATOR joined to the next; state 'kept' (no piece
    pruned), 'pruned' (every piece) or 'partly', or None without PRUNED."""
    words, current, flags = [], "", []
    for i, p in enumerate(pieces):
        cont = bool(separator) and p.endswith(separator)
        current += p[:-len(separator)] if cont else p
        flags.append(bool(pruned[i]) if pruned is not None else False)
        if not cont:
            state = None if pruned is None else ("pruned" if all(flags) else "partly" if any(flags) else "kept")
            words.append((current, state))
            current, flags = "", []
    if current:
        words.append((current, None if pruned is None else ("pruned" if all(flags) else "partly" if any(flags) else "kept")))
    return words


def copy_recall(sources: Sequence[Sequence[tuple]], refs: Sequence[str], hyps: Sequence[str],
                tokenize=None) -> Dict[str, Dict[str, float]]:
    """Recall of reference words that appear verbatim in the source (package names, versions, code), clipped
    counts per sentence: {state: {words, recalled, recall}} for 'all' and, where SOURCES carry states (see
    :func:`source_words`), for the words whose source pieces were 'kept', 'partly' or 'pruned'. A reference word
    found in several source places takes the state of its first. TOKENIZE splits the detokenised text (default:
    sacrebleu's 13a)."""
    tokenize = _tokenizer(tokenize)
    totals: Dict[str, List[int]] = {"all": [0, 0]}
    for words, ref, hyp in zip(sources, refs, hyps):
        state_of = {}
        for w, state in words:
            state_of.setdefault(w, state)
        hyp_counts = Counter(tokenize(hyp))
        for w, n in Counter(tokenize(ref)).items():
            if w not in state_of:
                continue
            got = min(n, hyp_counts.get(w, 0))
            for key in ("all",) + ((state_of[w],) if state_of[w] else ()):
                t = totals.setdefault(key, [0, 0])
                t[0] += n
                t[1] += got
    return {k: {"words": t[0], "recalled": t[1], "recall": round(t[1] / t[0], 4) if t[0] else None}
            for k, t in sorted(totals.items(), key=lambda kv: kv[0] != "all")}


def _tokenizer(tokenize):
    """TOKENIZE, or sacrebleu's 13a tokenisation as a function from text to words."""
    if tokenize is not None:
        return tokenize
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    t13a = Tokenizer13a()
    return lambda s: t13a(s).split()


def chrf(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """sacrebleu's corpus chrF (character 6-grams, beta 2; Popovic 2015): less harsh than BLEU on a word split or
    inflected differently."""
    from sacrebleu.metrics import CHRF

    return round(CHRF().corpus_score(list(hyps), [list(refs)]).score, 2)


def repeated_ngrams(hyps: Sequence[str], n: int = 3, tokenize=None) -> Optional[float]:
    """The share of the hypotheses' word n-grams that repeat an earlier n-gram of the same hypothesis (a decoder
    looping on what it has written), pooled over the corpus; None where no hypothesis has n words."""
    tokenize = _tokenizer(tokenize)
    total = repeated = 0
    for hyp in hyps:
        words, seen = tokenize(hyp), set()
        for i in range(len(words) - n + 1):
            gram = tuple(words[i:i + n])
            repeated += gram in seen
            seen.add(gram)
            total += 1
    return round(repeated / total, 4) if total else None


#: shares of a reference's words copied verbatim from its source where one bucket ends
COPY_EDGES = (0.0, 0.25)


def copy_share_bucket(words: Sequence[tuple], ref: str, tokenize=None, edges: Sequence[float] = COPY_EDGES) -> str:
    """The bucket of the share of REF's words found verbatim among the source WORDS (:func:`source_words`): 'none',
    'up to 25%', 'over 25%' for the default edges."""
    tokens = _tokenizer(tokenize)(ref)
    source = {w for w, _ in words}
    share = sum(t in source for t in tokens) / len(tokens) if tokens else 0.0
    if share <= edges[0]:
        return "none"
    for edge in edges[1:]:
        if share <= edge:
            return f"up to {edge:.0%}"
    return f"over {edges[-1]:.0%}"
