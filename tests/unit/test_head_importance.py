"""Head importance, ablation and pruning curves (paper 003, Michel et al. 2019): the library
(fairseq_sparse.analysis.head_importance) on a real loaded checkpoint, and the console tool fairseq-sparse-head-importance.

Checks: dL/dxi_h from autograd equals a central finite difference (batch and per-sentence masks); the
per-sentence estimate is independent of the batch size; per-layer l2 normalisation; masking none
leaves the model as it is and masking a head changes it; the pruning order and 10% step counts; the
console script end to end (files, curve at 0% = the unmasked model's BLEU, a usable written mask);
and clear errors without output files on bad input.
Here the pure tests; those that train or run console scripts are in tests/e2e/test_head_importance_e2e.py.
"""
import json
import re

import pytest
import torch

import fairseq_sparse  # noqa: F401  (registers the plugin, allowlists fairseq checkpoint classes)
from fairseq_sparse.analysis import head_importance as hi
from fairseq_sparse.modules.head_gates import check_head_mask, masks_to_matrix, read_head_mask, write_head_mask


# ----------------------------------------------------------------------------------------------
# (d) pruning order and step counts (pure functions)


IMP = {("enc", 0): torch.tensor([0.50, 0.10, 0.90, 0.30]), ("enc", 1): torch.tensor([0.20, 0.80, 0.05, 0.60]),
       ("dec", 0): torch.tensor([0.70, 0.40, 0.15, 0.95]), ("encdec", 0): torch.tensor([0.35, 0.25, 0.85, 0.45])}


def test_pruning_order_and_ten_percent_steps():
    order = hi.pruning_order(IMP)
    vals = [float(IMP[k][h]) for k, h in order]
    assert vals == sorted(vals) and len(order) == 16
    assert order[:3] == [(("enc", 1), 2), (("enc", 0), 1), (("dec", 0), 2)]
    assert hi.prune_levels(0.1) == pytest.approx([i / 10 for i in range(11)])
    assert hi.prune_levels(0.3) == pytest.approx([0, 0.3, 0.6, 0.9, 1.0])
    # 10% steps of 16 heads: round(1.6)=2, round(3.2)=3, round(4.8)=5, ... ; of 12 heads: 1, 2, 4, 5, 6, ...
    assert [hi.heads_to_prune(f, 16) for f in hi.prune_levels(0.1)] == [0, 2, 3, 5, 6, 8, 10, 11, 13, 14, 16]
    assert [hi.heads_to_prune(f, 12) for f in hi.prune_levels(0.1)] == [0, 1, 2, 4, 5, 6, 7, 8, 10, 11, 12]

    sched = hi.pruning_schedule(IMP, 0.1)
    previous = set()
    for entry in sched:
        pruned = set(entry["pruned"])
        assert len(pruned) == entry["n_target"] and previous <= pruned  # nested, right counts
        kept = [float(IMP[k][h]) for k in IMP for h in range(4) if (k, h) not in pruned]
        assert all(float(IMP[k][h]) <= min(kept, default=9) for k, h in pruned)  # least important first
        zeros = {(k, h) for k, m in entry["masks"].items() for h in range(4) if m[h] == 0}
        assert zeros == pruned
        previous = pruned

    # one attention type alone: 10% steps of its own 4 heads, other types untouched
    sched = hi.pruning_schedule(IMP, 0.1, types=["encdec"])
    assert [e["n_target"] for e in sched] == [0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4]
    assert [h for _, h in sched[5]["pruned"]] == [1, 0]
    assert all(m.tolist() == [1.0] * 4 for k, m in sched[-1]["masks"].items() if k[0] != "encdec")

    # a layer may not lose all heads with min_heads_per_layer=1: unreachable levels flagged
    sched1 = hi.pruning_schedule(IMP, 0.1, min_heads_per_layer=1)
    assert [e["reachable"] for e in sched1] == [True] * 8 + [False] * 3  # 12 of 16 heads can go
    assert all(int((m > 0).sum()) >= 1 for e in sched1 if e["reachable"] for m in e["masks"].values())
    with pytest.raises(ValueError, match="at least 1 head"):
        hi.select_pruned(IMP, 13, min_heads_per_layer=1)
    # ... and a layer's last head is skipped in the order, the next least important head taken instead
    two = {("enc", 0): torch.tensor([0.1, 0.2]), ("enc", 1): torch.tensor([0.5, 0.6])}
    assert hi.select_pruned(two, 2) == ([(("enc", 0), 0), (("enc", 0), 1)], [])
    assert hi.select_pruned(two, 2, min_heads_per_layer=1) == ([(("enc", 0), 0), (("enc", 1), 0)], [(("enc", 0), 1)])
    # mask JSON round trip
    layout = {k: 4 for k in IMP}
    masks = hi.pruning_schedule(IMP, 0.1)[2]["masks"]  # 3 heads: enc 1/2, enc 0/1, dec 0/2
    matrix = masks_to_matrix(masks, layout)
    assert matrix == {"enc": [[1, 0, 1, 1], [1, 1, 0, 1]], "dec": [[1, 1, 0, 1]], "encdec": [[1, 1, 1, 1]]}
    back = check_head_mask(json.loads(json.dumps(matrix)), layout)
    assert all(torch.equal(back[k], masks[k]) for k in layout)
    with pytest.raises(ValueError, match="unknown attention type"):
        check_head_mask({"cross": [[1, 1, 1, 1]]}, layout)


# ----------------------------------------------------------------------------------------------
# (g) one head mask format: values in [0, 1], finite, right shapes; outputs never replaced silently

LAYOUT = {("enc", 0): 2, ("enc", 1): 2, ("dec", 0): 2, ("encdec", 0): 2}


@pytest.mark.parametrize("row, bad", [([2, -1], "2"), ([1, -1], "-1"), ([float("nan"), 1], "nan"),
                                      ([float("inf"), 1], "inf"), ([True, 1], "True"), (["1", 1], "'1'")])
def test_head_mask_values_must_be_numbers_in_unit_interval(row, bad, tmp_path):
    matrix = {"enc": [[1, 1], row]}
    with pytest.raises(ValueError, match=rf"enc layer 1 has the value {bad}.*number in \[0, 1\]"):
        check_head_mask(matrix, LAYOUT)
    path = tmp_path / "mask.json"
    path.write_text(json.dumps(matrix))  # NaN and Infinity as JSON extensions, as Python writes them
    with pytest.raises(ValueError, match=re.escape(f"{path}: head mask for enc layer 1 has the value {bad}")):
        read_head_mask(str(path))
    with pytest.raises(ValueError, match="number in"):
        write_head_mask(str(tmp_path / "out.json"), matrix)
    assert not (tmp_path / "out.json").exists()


def test_head_mask_malformed_files_give_value_errors(tmp_path):
    cases = {"missing.json": (None, "no such file"), "bad.json": ("{enc: [[1, 1]]", "not valid JSON"),
             "list.json": ("[[1, 1]]", "must be a JSON object"), "type.json": ('{"cross": [[1, 1]]}', "unknown attention type"),
             "rows.json": ('{"enc": 1}', "list of rows"), "row.json": ('{"enc": [1, 1]}', "enc layer 0 must be a list"),
             "value.json": ('{"enc": [[1, null]]}', "has the value None")}
    for name, (text, expect) in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=expect) as e:
            read_head_mask(str(tmp_path / name))
        assert str(tmp_path / name) in str(e.value)
    for matrix, expect in [({"enc": [1, 1]}, "must be a list"), ({"enc": [[1, 1]]}, "1 rows, the model has 2"),
                           ({"enc": [[1, 1], [1, 1, 1]]}, "has 3 values, the layer has 2 heads"), ([1], "JSON object")]:
        with pytest.raises(ValueError, match=expect):
            check_head_mask(matrix, LAYOUT)
    # a good mask: written, read back and checked; omitted types are all ones, fractions stay
    matrix = {"enc": [[1, 0], [0.5, 1]], "encdec": [[0, 0]]}
    write_head_mask(str(tmp_path / "good.json"), matrix)
    masks = check_head_mask(read_head_mask(str(tmp_path / "good.json")), LAYOUT)
    assert {k: v.tolist() for k, v in masks.items()} == {("enc", 0): [1.0, 0.0], ("enc", 1): [0.5, 1.0],
                                                         ("dec", 0): [1.0, 1.0], ("encdec", 0): [0.0, 0.0]}
    assert masks_to_matrix(masks, LAYOUT) == {"enc": [[1, 0], [0.5, 1]], "dec": [[1, 1]], "encdec": [[0, 0]]}


# ----------------------------------------------------------------------------------------------
# one BLEU and one paired bootstrap (analysis.scores) for the recipe and the head tools alike

REFS = ["the cat sat on the mat", "a dog ran in the park today", "it rained all day long", "we went home early",
        "the house is very old", "she reads a book", "they play football on sunday", "my brother likes tea"]
CONTROL = ["the cat sat on a mat", "a dog ran in the park", "it rained all day", "we went home early",
           "the house is old", "she reads the book", "they play football on sunday", "my brother likes the tea"]
WORSE = ["cat mat", "dog park", "rain day", "went home", "house old", "reads book", "play sunday", "brother tea"]
CLOSE = CONTROL[:7] + ["my brother likes tea"]


def test_the_head_tools_score_bleu_and_test_it_with_the_recipes_scorer():
    import sacrebleu
    from sacrebleu.significance import PairedTest

    from fairseq_sparse.analysis.scores import bleu, corpus_score, paired_bootstrap, paired_bootstraps

    assert not hasattr(hi, "paired_bootstrap")  # no second implementation beside the scores module's
    for tokenize in ("13a", "none"):
        exact = sacrebleu.corpus_bleu(CONTROL, [REFS], tokenize=tokenize).score
        assert bleu(CONTROL, REFS, tokenize) == exact and corpus_score("bleu", CONTROL, REFS, tokenize)[0] == round(exact, 2)
    # the head tools' former test: every system in one sacrebleu PairedTest against the baseline, p unrounded
    named = [("baseline", CONTROL), ("system0", WORSE), ("system1", CLOSE)]
    _, former = PairedTest(named, {"BLEU": sacrebleu.BLEU(tokenize="none")}, [REFS], test_type="bs", n_samples=200)()
    tests = paired_bootstraps(CONTROL, [WORSE, CLOSE], REFS, "none", 200)
    assert [t["p_value"] for t in tests] == [float(r.p_value) for r in former["BLEU"][1:]]
    assert tests[0]["p_value"] < 0.05 < tests[1]["p_value"] and paired_bootstraps(CONTROL, [], REFS) == []
    # each method is tested as if alone: the recipe's rounded single test is the same test
    for method, test in zip((WORSE, CLOSE), tests):
        alone = paired_bootstrap(CONTROL, method, REFS, "none", 200)
        assert alone == {"delta": round(test["delta"], 2), "p_value": round(test["p_value"], 4),
                         "mean": round(test["mean"], 2), "ci95": round(test["ci95"], 2), "samples": 200}
        assert alone["delta"] == round(bleu(method, REFS, "none") - bleu(CONTROL, REFS, "none"), 2)
