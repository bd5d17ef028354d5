"""Word alignment from attention (AER, SAER of Zhang, Zhao, Li & Zong 2019 Eq. 23, argmax extraction, subword
merging, cumulative coverage of Yang et al. 2020 Eq. 2) on hand-made inputs whose answers are computed by hand, and
the fairseq-sparse-attention-analysis console tool end to end (stock transformer with the synthetic corpus's
true word alignment as gold; L0Drop model with the Zhang, Titov & Sennrich 2021
Fig. 1/7/8 analyses).
Here the pure tests; those that train or run console scripts are in tests/e2e/test_alignment_e2e.py."""
import math

import numpy as np
import pytest

import fairseq_sparse  # noqa: F401  (registers the plugin and fairseq's checkpoint classes)
from fairseq_sparse.analysis import alignment as al
from fairseq_sparse.analysis import attention as att
from fairseq_sparse.cli import common
from helpers.analysis import write


# ----------------------------------------------------------------------------------------------
# gold files


def test_one_file_convention_sure_dash_possible_question_mark(tmp_path):
    gold = al.read_gold_alignments(write(tmp_path / "g", ["0-0 1?2 2-1", "", "3?0"]))
    assert gold[0] == ({(0, 0), (2, 1)}, {(0, 0), (2, 1), (1, 2)})  # P includes S
    assert gold[1] == (set(), set())  # an empty line: a sentence without links
    assert gold[2] == (set(), {(3, 0)})
    # 1-based files (lilt/alignment-scripts, awesome-align gold)
    one = al.read_gold_alignments(write(tmp_path / "g1", ["1-1 2?3 3-2", "", "4?1"]), index_base=1)
    assert one == gold
    with pytest.raises(al.GoldAlignmentError, match=r"g0:1: link '0-1' has an index below 1"):
        al.read_gold_alignments(write(tmp_path / "g0", ["0-1"]), index_base=1)
    with pytest.raises(al.GoldAlignmentError, match=r"bad:2: bad link '1:2'"):
        al.read_gold_alignments(write(tmp_path / "bad", ["0-0", "0-1 1:2"]))


def test_two_file_convention_gives_the_same_sets(tmp_path):
    sure = write(tmp_path / "sure", ["0-0 2-1", "", "1-1"])
    only_possible = write(tmp_path / "possible", ["1-2", "0-0", ""])
    whole_p = write(tmp_path / "p_all", ["0-0 2-1 1-2", "0?0", "1-1"])  # P given in full, '?' accepted too
    a = al.read_gold_alignments(sure, only_possible)
    b = al.read_gold_alignments(sure, whole_p)
    assert a == b == [({(0, 0), (2, 1)}, {(0, 0), (2, 1), (1, 2)}), (set(), {(0, 0)}), ({(1, 1)}, {(1, 1)})]
    short = write(tmp_path / "short", ["1-2", "0-0"])
    with pytest.raises(al.GoldAlignmentError, match=r"has 2 lines, .* has 3: sentence 2 \(line 3\)") as e:
        al.read_gold_alignments(sure, short)
    assert e.value.sentence == 2


def test_check_gold_names_the_first_bad_sentence():
    gold = [({(0, 0)}, {(0, 0)}), ({(1, 1)}, {(1, 1), (2, 0)}), ({(5, 0)}, {(5, 0)})]
    al.check_gold_alignments(gold, [2, 3, 6], [1, 2, 1])  # fits
    with pytest.raises(al.GoldAlignmentError, match=r"has 3 sentences, the data has 4: sentence 3 \(line 4\) is "
                                                    r"missing") as e:
        al.check_gold_alignments(gold, [2, 3, 6, 1], [1, 2, 1, 1])
    assert e.value.sentence == 3
    with pytest.raises(al.GoldAlignmentError, match="sentence 2 .line 3. is extra"):
        al.check_gold_alignments(gold, [2, 3], [1, 2])
    # sentence 1's possible link 2-0 needs 3 source words; sentence 2 is bad too, 1 is named
    with pytest.raises(al.GoldAlignmentError, match=r"gold sentence 1 \(line 2\): link 2-0 is out of range, the "
                                                    r"sentence has 2 source and 2 target words \(bad source") as e:
        al.check_gold_alignments(gold, [2, 2, 5], [1, 2, 1])
    assert e.value.sentence == 1
    with pytest.raises(al.GoldAlignmentError, match=r"sentence 0 .*bad target"):
        al.check_gold_alignments(gold, [2, 3, 6], [0, 2, 1])


# ----------------------------------------------------------------------------------------------
# AER and SAER


def test_aer_by_hand_and_summed_over_the_corpus():
    # sentence 1: S = {0-0, 1-1}, P = S + {2-1}; A = {0-0, 2-1, 2-2}
    #   |A∩S| = 1 (0-0), |A∩P| = 2 (0-0, 2-1), |A| = 3, |S| = 2 -> AER = 1 - (1 + 2) / (3 + 2) = 0.4
    s1, p1, a1 = {(0, 0), (1, 1)}, {(0, 0), (1, 1), (2, 1)}, {(0, 0), (2, 1), (2, 2)}
    assert al.aer([a1], [(s1, p1)]) == pytest.approx(0.4)
    np.testing.assert_array_equal(al.aer_counts(a1, s1, p1), [1, 2, 3, 2])
    # sentence 2: S = P = {0-0}, A = {1-0}: counts 0, 0, 1, 1 (AER 1.0)
    # corpus: 1 - (1 + 2 + 0 + 0) / (3 + 2 + 1 + 1) = 4/7 (not the mean of 0.4 and 1.0, 0.7)
    assert al.aer([a1, {(1, 0)}], [(s1, p1), ({(0, 0)}, {(0, 0)})]) == pytest.approx(4 / 7)
    # the possible set passed without the sure links: P = S ∪ P all the same
    assert al.aer([a1], [(s1, {(2, 1)})]) == pytest.approx(0.4)
    assert al.aer([{(0, 0), (1, 1)}], [(s1, s1)]) == 0.0
    assert math.isnan(al.aer([set()], [(set(), set())]))


def test_saer_zhang_et_al_2019_eq_23_by_hand():
    # M_A: 2 target words x 3 source words (row j = target word j); S = {0-0}; P = S + {1-1, 2-1}
    m = np.array([[0.7, 0.2, 0.1],
                  [0.1, 0.6, 0.3]])
    s, p = {(0, 0)}, {(0, 0), (1, 1), (2, 1)}
    # |M_A x M_S| = M[0,0] = 0.7; |M_A x M_P| = M[0,0] + M[1,1] + M[1,2] = 0.7 + 0.6 + 0.3 = 1.6
    # |M_A| = 2.0; |M_S| = 1 -> SAER = 1 - (0.7 + 1.6) / (2.0 + 1) = 1 - 2.3 / 3 = 0.23333
    assert al.saer([m], [(s, p)]) == pytest.approx(1 - 2.3 / 3)
    np.testing.assert_allclose(al.saer_counts(m, s, p), [0.7, 1.6, 2.0, 1.0])
    # the EOS column dropped without renormalising: row [0.5, 0.3] (+ 0.2 on EOS), S = P = {0-0}
    # -> 1 - (0.5 + 0.5) / (0.8 + 1) = 1 - 1 / 1.8
    assert al.saer([np.array([[0.5, 0.3]])], [({(0, 0)}, {(0, 0)})]) == pytest.approx(1 - 1 / 1.8)
    # one-hot M_A (the argmax alignment) -> SAER = AER; the argmax links of m are {0-0, 1-1}:
    # |A∩S| = 1, |A∩P| = 2, |A| = 2, |S| = 1 -> 1 - 3/3 = 0
    hard = np.eye(3)[m.argmax(1)]
    assert al.saer([hard], [(s, p)]) == pytest.approx(al.aer([al.argmax_links(m)], [(s, p)])) == pytest.approx(0.0)
    with pytest.raises(ValueError):
        al.saer([m, m], [(s, p)])


# ----------------------------------------------------------------------------------------------
# extraction: EOS dropped, subwords merged, argmax


def test_word_ids_and_merging_subwords():
    assert al.word_ids(["new@@", "york", "is", "big@@", "g@@", "er"]) == [0, 0, 1, 2, 2, 2]
    assert al.word_ids(["a@@", "b"], separator=None) == [0, 1]
    # target pieces New@@ York | ist, source pieces new@@ york | is
    attn = np.array([[0.5, 0.3, 0.2],   # New@@
                     [0.1, 0.5, 0.4],   # York
                     [0.2, 0.2, 0.6]])  # ist
    # to a source word: sum over its pieces -> rows [0.8, 0.2], [0.6, 0.4], [0.4, 0.6]
    # from a target word: mean over its pieces -> New York = ([0.8, 0.2] + [0.6, 0.4]) / 2 = [0.7, 0.3]
    merged = al.merge_subwords(attn, [0, 0, 1], [0, 0, 1])
    np.testing.assert_allclose(merged, [[0.7, 0.3], [0.4, 0.6]])
    np.testing.assert_allclose(merged.sum(1), 1.0)  # rows still sum to 1
    assert al.argmax_links(merged) == {(0, 0), (1, 1)}
    # batched: leading dims are kept
    np.testing.assert_allclose(al.merge_subwords(np.stack([attn, attn]), [0, 0, 1], [0, 0, 1])[1], merged)


def test_word_matrix_drops_eos_rows_and_columns_before_argmax():
    # target T1 T2 </s>, source a@@ b c </s>; target T1's largest weight is on the source EOS
    attn = np.array([[0.20, 0.05, 0.15, 0.60],
                     [0.10, 0.10, 0.50, 0.30],
                     [0.25, 0.25, 0.25, 0.25]])
    m = al.word_matrix(attn, ["a@@", "b", "c", "</s>"], ["T1", "T2", "</s>"],
                       [False, False, False, True], [False, False, True])
    # source words: a@@b = pieces 0+1, c; rows of T1, T2 only; no renormalisation
    np.testing.assert_allclose(m, [[0.25, 0.15], [0.20, 0.50]])
    assert al.argmax_links(m) == {(0, 0), (1, 1)}
    assert al.argmax_links(attn) == {(3, 0), (2, 1), (0, 2)}  # with EOS kept, T1 would link to </s>
    assert al.argmax_links(np.zeros((2, 0))) == set()
    assert al.format_links({(1, 1), (0, 0), (2, 0)}) == "0-0 2-0 1-1"


def test_layer_average_averages_heads_within_each_layer_first():
    # layer 0: two heads, layer 1: one head (physically pruned), layer 2: no heads
    l0 = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])  # head mean [0.5, 0.5]
    l1 = np.array([[[0.9, 0.1]]])
    np.testing.assert_allclose(al.layer_average([l0, l1, None]), [[0.7, 0.3]])  # (0.5 + 0.9) / 2
    np.testing.assert_allclose(al.layer_average([l0, l1, None], [1]), [[0.9, 0.1]])
    assert al.layer_average([l0, l1, None], [2]) is None


# ----------------------------------------------------------------------------------------------
# cumulative coverage (Yang et al. 2020, Eq. 2) and entropy


def test_cumulative_coverage_by_hand():
    # sentence 1, N = 4 source words, three layers:
    #   A_1 = {0}; A_2 = {1, 2}; A_3 = {0, 3} -> |A_1| = 1, |A_1 ∪ A_2| = 3, |A_1 ∪ A_2 ∪ A_3| = 4
    # sentence 2, N = 2: A_1 = {1}, A_2 = {1}, layer 3 has no heads -> 1, 1, 1
    # corpus: (1 + 1) / 6, (3 + 1) / 6, (4 + 1) / 6 (the per-sentence mean would give 0.375 at layer 1)
    s1 = [{(0, 0), (0, 1)}, {(1, 0), (2, 1)}, {(0, 0), (3, 1)}]
    s2 = [{(1, 0)}, {(1, 0)}, None]
    assert al.cumulative_covered(s1) == [1, 3, 4]
    assert al.cumulative_covered(s2) == [1, 1, 1]
    np.testing.assert_allclose(al.cumulative_coverage([s1, s2], [4, 2]), [2 / 6, 4 / 6, 5 / 6])
    assert np.isnan(al.cumulative_coverage([[set()]], [0])).all()


def test_alignment_sums_per_layer_add_over_sentences_before_dividing():
    """The corpus sums the attention tool accumulates: per layer, as aer / saer / cumulative_coverage give
    them over the whole corpus."""
    s1 = [{(0, 0), (0, 1)}, {(1, 0), (2, 1)}, {(0, 0), (3, 1)}]
    s2 = [{(1, 0)}, {(1, 0)}, None]
    gold = [({(0, 0)}, {(0, 0), (1, 1)}), ({(1, 0)}, {(1, 0)})]
    soft = [np.array([[0.7, 0.3, 0.0, 0.0], [0.2, 0.8, 0.0, 0.0]]), np.array([[0.4, 0.6]])]
    sums = al.AlignmentSums(3)
    for links, n, g, m in zip((s1, s2), (4, 2), gold, soft):
        sums.add_coverage(links, n)
        for l, layer_links in enumerate(links):
            if layer_links is not None:
                sums.add_aer(l, layer_links, g)
                sums.add_saer(l, m, g)
    np.testing.assert_allclose(sums.coverage(), al.cumulative_coverage([s1, s2], [4, 2]))
    np.testing.assert_allclose(sums.coverage_layer(), [2 / 6, 3 / 6, 2 / 6])  # |A_i| alone: 1+1, 2+1, 2+0
    for l in range(2):
        assert sums.aer()[l] == pytest.approx(al.aer([s1[l], s2[l]], gold))
        assert sums.saer()[l] == pytest.approx(al.saer(soft, gold))
    assert sums.aer()[2] == pytest.approx(al.aer([s1[2]], gold[:1]))  # sentence 2 has no heads there
    assert np.isnan(al.AlignmentSums(2).coverage()).all()


def test_entropy_in_nats():
    np.testing.assert_allclose(al.entropy(np.array([[0.25] * 4, [1.0, 0, 0, 0]])), [math.log(4), 0.0])
    np.testing.assert_allclose(al.entropy(np.array([0.5, 0.5, 0.0])), math.log(2))


def test_parse_layers():
    assert common.parse_layers("all", 3) == [0, 1, 2]
    assert common.parse_layers("last", 3) == [2]
    assert common.parse_layers("2,0,-1", 3) == [0, 2]
    with pytest.raises(ValueError, match="layer 3 does not exist"):
        common.parse_layers("3", 3)
    with pytest.raises(ValueError, match="not a layer index"):
        common.parse_layers("top", 3)


def test_example_maps_keep_the_first_sentences_with_their_pruned_tokens():
    """--example-maps N: sentences 0..N-1 keep their head- and layer-averaged map and which sources are pruned."""
    rng = np.random.default_rng(0)
    stats = att.AttentionStats([2, 2], with_gold=False, l0drop=True, examples=1)
    src, tgt = ["a", "b", "c", "</s>"], ["x", "y", "</s>"]
    for sid in (0, 1):
        layers = [rng.dirichlet(np.ones(4), size=(2, 3)) for _ in range(2)]  # [H, T, S] per layer
        gates = np.array([0.0, 0.7, 0.0, 1.0])
        att.analyse_sentence(stats, sid, layers, src, tgt, np.array([0, 0, 0, 1], bool), np.array([0, 0, 1], bool),
                             None, [0, 1], gates=gates, enc_attn=rng.dirichlet(np.ones(4), size=(2, 4)))
        if sid == 0:
            expected = (layers[0].mean(0) + layers[1].mean(0)) / 2
    assert list(stats.examples) == [0]
    ex = stats.examples[0]
    np.testing.assert_allclose(ex["attention"], expected)
    assert ex["pruned"].tolist() == [True, False, True, False] and ex["source"] == src and ex["target"] == tgt


def test_example_attention_map_of_a_long_sentence_stays_a_readable_size(tmp_path):
    """A character-level sentence of 600 source and 700 target tokens: the figure is capped (it was 194 x 212
    inches, 17 GB for three), every k-th token labelled, pruned labels still red; a short one keeps every label."""
    import matplotlib.image as mpimg

    from fairseq_sparse.analysis import plotting

    rng = np.random.default_rng(0)
    pruned = np.arange(600) % 3 == 0
    long = {"source": [chr(97 + i % 26) for i in range(600)], "target": ["x"] * 700,
            "attention": rng.random((700, 600)), "pruned": pruned}
    path = plotting.plot_attention_example(long, str(tmp_path / "long.png"), "long")
    h, w = mpimg.imread(path).shape[:2]
    assert max(h, w) <= plotting.MAX_EXAMPLE_INCHES * 110 + 1
    short = {"source": ["a", "b", "c"], "target": ["x", "y"], "attention": rng.random((2, 3)),
             "pruned": np.array([True, False, False])}
    h, w = mpimg.imread(plotting.plot_attention_example(short, str(tmp_path / "short.png"), "short")).shape[:2]
    assert (w, h) == (440, 330)  # 4 x 3 inches at 110 dpi: small sentences as before
