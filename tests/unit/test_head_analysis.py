"""Head analyses of Voita et al. (2019, Sec. 4-5): metrics on hand-made attention matrices
whose answers are computed by hand, the pruned-model path, and the console tool end to end.
Here the pure tests; those that train or run console scripts are in tests/e2e/test_head_analysis_e2e.py."""
import json
import os
import types

import numpy as np
import pytest

import fairseq_sparse  # noqa: F401  (registers the plugin and fairseq's checkpoint classes)
from fairseq_sparse.analysis import alignment
from fairseq_sparse.analysis import heads as ha
from fairseq_sparse.analysis.plotting import head_heatmap
from helpers.analysis import SETTINGS


def attention_with_argmax(argmax, n_keys, peak=0.6):
    """[len(argmax), n_keys] rows with ``peak`` on the given key and the rest spread evenly."""
    rows = np.full((len(argmax), n_keys), (1 - peak) / (n_keys - 1))
    rows[np.arange(len(argmax)), argmax] = peak
    return rows


# ----------------------------------------------------------------------------------------------
# confidence (Sec. 4)


def test_confidence_excludes_eos_as_query_and_key():
    # tokens a, b, EOS; head 0's largest weight of query b is on EOS, head 1's of query a too
    attn = np.array([
        [[0.5, 0.1, 0.4], [0.2, 0.3, 0.5], [0.9, 0.05, 0.05]],
        [[0.1, 0.2, 0.7], [0.8, 0.1, 0.1], [0.05, 0.05, 0.9]],
    ])
    real = np.array([True, True, False])
    conf = ha.confidence(attn, real, real)
    # head 0: (0.5 + 0.3) / 2; head 1: (0.2 + 0.8) / 2 (with EOS it would be (0.7 + 0.8) / 2)
    np.testing.assert_allclose(conf, [0.4, 0.5])
    values, index = ha.max_attention(attn, real)
    np.testing.assert_array_equal(index[:, :2], [[0, 1], [1, 0]])


def test_confidence_on_a_padded_batch():
    # two sentences, the second left-padded by one: [pad, c, EOS]; heads first: [H=1, B=2, T=3, S=3]
    attn = np.zeros((1, 2, 3, 3))
    attn[0, 0] = [[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.3, 0.3, 0.4]]
    attn[0, 1] = [[0.0, 0.5, 0.5], [0.0, 0.2, 0.8], [0.0, 0.5, 0.5]]
    real = np.array([[True, True, False], [False, True, False]])
    # queries: 0.6, 0.7 (sentence 1), 0.2 (sentence 2: its only key besides EOS)
    np.testing.assert_allclose(ha.confidence(attn, real, real), [(0.6 + 0.7 + 0.2) / 3])
    np.testing.assert_array_equal(ha.relative_position_of_max(attn, real, real), [[0, 0, 0]])


# ----------------------------------------------------------------------------------------------
# positional heads (Sec. 5.1)


def previous_token_head(n_real):
    """A perfect previous-token head on n_real tokens + EOS; the first token attends to itself (0.15)."""
    n = n_real + 1
    attn = np.zeros((1, n, n))
    attn[0, 0, 0], attn[0, 0, -1] = 0.15, 0.85
    for i in range(1, n_real):
        attn[0, i, i - 1], attn[0, i, -1] = 0.9, 0.1
    attn[0, -1] = 1.0 / n
    real = np.arange(n) < n_real
    return attn, real


def test_previous_token_head_is_positional():
    attn, real = previous_token_head(11)
    rel = ha.relative_position_of_max(attn, real, real)
    np.testing.assert_array_equal(rel, [[0] + [-1] * 10])
    pos, share, positional = ha.positional_head(rel[0], 0.9)
    assert (pos, positional) == (-1, True)
    assert share == pytest.approx(10 / 11)
    np.testing.assert_allclose(ha.confidence(attn, real, real), [(10 * 0.9 + 0.15) / 11])
    # the first token has no previous one: on 9 tokens the head reaches only 8 / 9 < 0.9
    attn9, real9 = previous_token_head(9)
    pos, share, positional = ha.positional_head(ha.relative_position_of_max(attn9, real9, real9)[0], 0.9)
    assert (pos, share, positional) == (-1, pytest.approx(8 / 9), False)


def test_scattered_head_is_not_positional():
    # query i looks at key 3i mod 4: relative positions 0, +2, 0, -2
    argmax = [0, 3, 2, 1]
    attn = np.zeros((1, 5, 5))
    attn[0, :4] = attention_with_argmax(argmax, 5)
    attn[0, 4] = 0.2
    real = np.arange(5) < 4
    rel = ha.relative_position_of_max(attn, real, real)
    np.testing.assert_array_equal(rel, [[0, 2, 0, -2]])
    assert ha.positional_head(rel[0], 0.9) == (0, 0.5, False)
    assert ha.positional_head({-1: 3, 1: 3, 2: 1}, 0.4) == (-1, 3 / 7, True)  # tie: nearest 0, then smaller


# ----------------------------------------------------------------------------------------------
# subword merging


def test_word_ids_from_pieces():
    pieces = ["new@@", "york", "is", "bi@@", "g@@", "gest"]
    assert alignment.word_ids(pieces, "@@") == [0, 0, 1, 2, 2, 2]
    assert alignment.word_ids(pieces, None) == [0, 1, 2, 3, 4, 5]
    assert alignment.word_ids(["a@@"], "@@") == [0]


def test_merge_subword_attention_sums_keys_and_averages_queries():
    # pieces p0 p1 (one word), p2 (a word), EOS (its own word)
    attn = np.array([
        [0.1, 0.2, 0.3, 0.4],
        [0.3, 0.3, 0.2, 0.2],
        [0.5, 0.1, 0.1, 0.3],
        [0.25, 0.25, 0.25, 0.25],
    ])
    merged = ha.merge_subword_attention(attn[None], [0, 0, 1, 2])
    # keys summed: p0 -> [0.3, 0.3, 0.4], p1 -> [0.6, 0.2, 0.2]; query word 0 = their mean
    np.testing.assert_allclose(merged[0], [[0.45, 0.25, 0.3], [0.6, 0.1, 0.3], [0.5, 0.25, 0.25]])
    np.testing.assert_allclose(merged.sum(-1), 1.0)


# ----------------------------------------------------------------------------------------------
# rare words (Sec. 5.3)


def test_rare_word_accuracy_on_a_handmade_sentence():
    # "the cat the zyzzyva sat": counts 1000, 50, 1000, 2, 40 -> rarest zyzzyva, two least {zyzzyva, sat}
    rarest, two = ha.rare_word_targets([1000, 50, 1000, 2, 40])
    np.testing.assert_array_equal(rarest, [0, 0, 0, 1, 0])
    np.testing.assert_array_equal(two, [0, 0, 0, 1, 1])
    argmax = np.array([[3, 3, 4, 3, 1], [0, 0, 0, 0, 0]])
    queries = np.ones(5, dtype=bool)
    np.testing.assert_allclose(ha.rare_word_accuracy(argmax, queries, rarest), [3 / 5, 0])
    np.testing.assert_allclose(ha.rare_word_accuracy(argmax, queries, two), [4 / 5, 0])
    np.testing.assert_array_equal(ha.frequency_ranks(np.array([5, 100, 5, 7, 0])), [2, 0, 2, 1, 4])


def test_rare_words_at_word_level_through_analyse_sentence():
    # pieces the | zy@@ zz@@ yva | sat | EOS; piece counts 1000, 30, 5, 200, 40
    pieces = ["the", "zy@@", "zz@@", "yva", "sat", "</s>"]
    counts = np.array([1000, 30, 5, 200, 40, 0], dtype=float)
    ranks = np.array([0, 3, 4, 1, 2, 5])  # ranks among the vocabulary's counts
    special = np.array([False] * 5 + [True])
    attn = np.zeros((3, 6, 6))
    attn[0, :, 1:4] = 0.25       # all on zyzzyva's pieces (and 0.25 on EOS)
    attn[0, :, 5] = 0.25
    attn[1, :] = [0.4, 0.15, 0.15, 0.15, 0.15, 0.0]  # token-level max on "the", word-level on zyzzyva (0.45)
    attn[2, :] = [0.4, 0.0, 0.0, 0.0, 0.6, 0.0]      # on sat: second least frequent word
    # word frequency = rarest piece (zz@@: 5, rank 4); K = 4 keeps the sentence, K = 5 drops it
    for k, used in ((4, 1), (5, 0)):
        stats = ha.HeadStatistics([3], [])
        ha.analyse_sentence(stats, [attn], pieces, special, counts, ranks, "@@", k)
        assert stats.rare_sentences == used
    np.testing.assert_allclose(stats.conf_sum[0] / stats.conf_n, [0.25, 0.4, 0.6])
    stats = ha.HeadStatistics([3], [])
    ha.analyse_sentence(stats, [attn], pieces, special, counts, ranks, "@@", 4)
    np.testing.assert_allclose(stats.rare_sum[0], [1.0, 1.0, 0.0])
    np.testing.assert_allclose(stats.rare2_sum[0], [1.0, 1.0, 1.0])
    assert stats.rare_chance == pytest.approx(1 / 3) and stats.rare2_chance == pytest.approx(2 / 3)


# ----------------------------------------------------------------------------------------------
# syntactic heads (Sec. 5.2)

CONLLU = """# text = The big old dog barked loudly
1\tThe\tthe\tDET\t_\t_\t4\tdet\t_\t_
2\tbig\tbig\tADJ\t_\t_\t4\tamod\t_\t_
3\told\told\tADJ\t_\t_\t4\tamod\t_\t_
4\tdog\tdog\tNOUN\t_\t_\t5\tnsubj\t_\t_
5\tbarked\tbark\tVERB\t_\t_\t0\troot\t_\t_
6\tloudly\tloudly\tADV\t_\t_\t5\tadvmod\t_\t_

1\tShe\tshe\tPRON\t_\t_\t2\tnsubj\t_\t_
2-3\tate\t_\t_\t_\t_\t_\t_\t_\t_
2\tate\teat\tVERB\t_\t_\t0\troot\t_\t_
3\tred\tred\tADJ\t_\t_\t4\tamod\t_\t_
4\tapples\tapple\tNOUN\t_\t_\t2\tdobj\t_\t_
4.1\tgot\tget\tVERB\t_\t_\t_\t_\t_\t_
5\tquickly\tquickly\tADV\t_\t_\t2\tadvmod\t_\t_

1\tDogs\tdog\tNOUN\t_\t_\t3\tnsubj\t_\t_
2\toften\toften\tADV\t_\t_\t3\tadvmod\t_\t_
3\tbark\tbark\tVERB\t_\t_\t0\troot\t_\t_
"""


@pytest.fixture
def parses(tmp_path):
    path = tmp_path / "tiny.conllu"
    path.write_text(CONLLU)
    return ha.read_conllu(str(path))


def test_read_conllu_and_relation_instances(parses):
    assert [len(s) for s in parses] == [6, 5, 3]  # "2-3" and "4.1" skipped
    assert parses[1][3] == ("apples", 2, "dobj")
    s1, s2, s3 = parses
    assert ha.relation_instances(s1, "amod", "d2h") == [(1, (3,)), (2, (3,))]
    assert ha.relation_instances(s1, "amod", "h2d") == [(3, (1, 2))]
    assert ha.relation_instances(s2, "obj", "h2d") == [(1, (3,))]  # dobj counts as obj
    assert ha.relation_instances(s3, "nsubj", "d2h") == [(0, (2,))]
    assert ha.relation_instances(s1, "obj", "d2h") == []


def test_relative_position_baseline(parses):
    def inst(rel, d):
        return [i for s in parses for i in ha.relation_instances(s, rel, d)]
    assert ha.relative_position_baseline(inst("amod", "d2h")) == (1, pytest.approx(2 / 3), 3)  # +2, +1, +1
    assert ha.relative_position_baseline(inst("amod", "h2d")) == (-1, 1.0, 2)  # {-2, -1}, {-1}
    assert ha.relative_position_baseline(inst("nsubj", "d2h")) == (1, pytest.approx(2 / 3), 3)  # +1, +1, +2
    # advmod d2h: -1, -3, +1 (a tie: the offset nearest 0, then the smaller one)
    assert ha.relative_position_baseline(inst("advmod", "d2h")) == (-1, pytest.approx(1 / 3), 3)
    assert ha.relative_position_baseline([]) == (None, pytest.approx(float("nan"), nan_ok=True), 0)


def test_syntactic_accuracy_and_syntactic_heads(parses):
    s1 = parses[0]
    argmax = np.array([[1, 3, 3, 2, 3, 4],    # big, old -> dog; dog -> old; loudly -> barked
                       [0, 0, 1, 2, 3, 4]])   # previous word
    correct, n = ha.syntactic_accuracy(argmax, ha.relation_instances(s1, "amod", "d2h"))
    assert n == 2 and correct.tolist() == [2, 0]
    correct, n = ha.syntactic_accuracy(argmax, ha.relation_instances(s1, "amod", "h2d"))
    assert n == 1 and correct.tolist() == [1, 1]  # old is one of dog's two amod dependents

    # the same through the accumulation: 6 words + EOS, word level = token level (no BPE)
    attn = np.stack([np.vstack([attention_with_argmax(a, 7), np.full(7, 1 / 7)]) for a in argmax])
    keys = [(r, d) for r in ha.RELATIONS for d in ha.DIRECTIONS]
    stats = ha.HeadStatistics([2], keys)
    special = np.array([False] * 6 + [True])
    ha.analyse_sentence(stats, [attn], [w for w, _, _ in s1] + ["</s>"], special, np.ones(7), np.zeros(7, int),
                        None, 10 ** 9, parse=s1)
    res = ha.summarise(stats, [[0, 1]], **vars(SETTINGS))
    base = res["baselines"]
    assert base["amod_d2h"] == {"offset": 1, "accuracy": 0.5, "instances": 2}  # +2, +1: tie -> +1
    assert base["amod_h2d"]["accuracy"] == 1.0 and base["nsubj_d2h"]["accuracy"] == 1.0
    h0, h1 = res["heads"]
    assert (h0["amod_d2h"], h1["amod_d2h"]) == (1.0, 0.0)
    assert (h0["amod_h2d"], h1["amod_h2d"]) == (1.0, 1.0)
    assert (h0["nsubj_d2h"], h0["advmod_d2h"]) == (0.0, 1.0)
    assert h0["syntactic"] == ["amod_d2h"]  # 1.0 >= 0.5 + 0.1; amod_h2d is not above its 1.0 baseline
    assert h1["syntactic"] == []
    # head 1: relative positions 0, -1 x 5 -> 5/6 < 0.9
    assert (h1["top_relative_position"], h1["positional"]) == (-1, False)
    assert h1["top_relative_position_share"] == pytest.approx(5 / 6)


# ----------------------------------------------------------------------------------------------
# matrices, labels, plots


def test_heads_matrix_and_labels(tmp_path):
    m = ha.heads_matrix([[0.5, 0.7], None, [0.1, 0.2, 0.3, 0.4]], [[1, 3], [], [0, 1, 2, 3]], 4)
    np.testing.assert_array_equal(np.isnan(m), [[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    assert m[0, 3] == 0.7 and m[2, 2] == 0.3

    def layer(n, **kw):
        return types.SimpleNamespace(self_attn=types.SimpleNamespace(num_heads=n, **kw))
    model = types.SimpleNamespace(encoder=types.SimpleNamespace(layers=[layer(2), layer(0), layer(4), layer(1, head_ids=[5])]))
    cfg = types.SimpleNamespace(kept_heads=json.dumps({"enc": [[3, 1], [], [0, 1, 2, 3], [2]], "dec": []}))
    assert ha.layer_head_labels(model, cfg) == [[1, 3], [], [0, 1, 2, 3], [5]]  # head_ids win over kept_heads
    assert ha.layer_head_labels(model, None) == [[0, 1], [], [0, 1, 2, 3], [5]]
    out = head_heatmap(m, str(tmp_path / "m.png"), "t", "v")
    assert os.path.getsize(out) > 1000
    with pytest.raises(ValueError):
        head_heatmap(np.zeros(3), str(tmp_path / "bad.png"), "t", "v")
