"""Corpus-level scores of hypotheses against references: BLEU (sacrebleu) and ROUGE (rouge-score)."""


def corpus_score(metric, hyps, refs, tokenize="13a"):
    """(score, details) of hypotheses against references: ``bleu``: sacrebleu's corpus BLEU (``tokenize``:
    '13a' for detokenised text, 'none' for tokens); ``rouge``: rouge-score's ROUGE-1, -2 and -L F1 averaged
    over the sentences, with Porter stemming (Lin 2004). Its ``rougeL`` is sentence-level ROUGE-L over the
    one-line hypothesis, not ROUGE-1.5.5's summary-level ROUGE-L; the score is ROUGE-L."""
    if metric == "bleu":
        import sacrebleu

        score = round(sacrebleu.corpus_bleu(hyps, [refs], tokenize=tokenize).score, 2)
        return score, {"bleu": score}
    from rouge_score import rouge_scorer

    kinds = ("rouge1", "rouge2", "rougeL")
    scorer = rouge_scorer.RougeScorer(list(kinds), use_stemmer=True)
    sums = dict.fromkeys(kinds, 0.0)
    for h, r in zip(hyps, refs):
        for kind, value in scorer.score(r, h).items():
            sums[kind] += value.fmeasure
    details = {k: round(100 * v / max(len(hyps), 1), 2) for k, v in sums.items()}
    return details["rougeL"], details
