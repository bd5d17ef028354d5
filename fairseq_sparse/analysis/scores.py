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


def paired_bootstrap(control_hyps, method_hyps, refs, tokenize="13a", samples=1000):
    """sacrebleu's paired bootstrap resampling (Koehn 2004; the Moses script's test, seed 12345 unless
    SACREBLEU_SEED says otherwise) of a method's BLEU against its control's on the same references:
    {"delta": method - control, "p_value", "mean", "ci95": half-width of the method's 95% interval}."""
    import logging

    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # its progress lines are not results
    test = PairedTest([("control", list(control_hyps)), ("method", list(method_hyps))],
                      {"BLEU": BLEU(tokenize=tokenize)}, [list(refs)], test_type="bs", n_samples=samples)
    _, scores = test()
    control, method = scores["BLEU"]
    return {"delta": round(method.score - control.score, 2), "p_value": round(float(method.p_value), 4),
            "mean": round(float(method.mean), 2), "ci95": round(float(method.ci), 2), "samples": samples}
