"""The recipe's routes to a sparse model that issue 52 compares, end to end on the tiny corpus: methods trained from
scratch beside the baseline at equal updates (--scratch-budget-points), on a share of the training pairs
(--train-fraction), and the gap analysis of each pair (fine-tunings that continue the baseline's optimisation,
--finetune-protocol continue: test_recipe_variants.py, from its shared baseline)."""
import json
import os

from helpers.recipe import recipe


def results(work):
    with open(os.path.join(work, "results.json")) as f:
        return json.load(f)


def test_methods_from_scratch_beside_the_baseline_and_their_gap_analysis(raw_corpus, tmp_path):
    work = tmp_path / "work"
    types = tmp_path / "types"
    types.write_text("".join("synopsis\n" if i % 3 == 0 else f"para{i % 2}\n" for i in range(25)))
    recipe(raw_corpus, work, ["--steps", "prepare,baseline,pattern_freq_scratch,l0drop_scratch,gap_analysis,report",
                              "--scratch-budget-points", "20,40", "--train-fraction", "0.5", "--segment-types",
                              str(types), "--scratch-pressure-start", "20", "--scratch-pressure-ramp", "10",
                              "--threads", "1"])
    with open(work / "tok" / "train.bpe.share.en") as f:
        assert len(f.readlines()) == 250  # half of the 500 training pairs
    with open(work / "data-bin" / "dict.en.txt") as f, open(work / "tok" / "dict.en.txt") as g:
        assert f.read() == g.read()  # the dictionary of all the pairs
    r = results(work)
    for name in ("pattern_freq_scratch", "l0drop_scratch"):
        points = r["budget"][name]
        assert [p["updates"] for p in points] == [20, 40] and {p["control"] for p in points} == {"baseline"}
        assert r["stopped"][name]["updates"] == 40
    assert r["budget"]["pattern_freq_scratch"][0]["l0drop_sparsity"] > 0
    log = (work / "logs" / "l0drop_scratch.log").read_text()
    assert "--sparsity-start-update 20" in (work / "commands" / "l0drop_scratch.sh").read_text()
    assert '"sparsity/l0drop_lambda"' in log or "l0drop" in log
    gap = r["gap_analysis"]
    assert set(gap) == {"pattern_freq_scratch", "l0drop_scratch"}
    freq = gap["pattern_freq_scratch"]
    assert freq["control"] == "baseline@40" and 0 < freq["sparsity"] < 1
    assert set(freq["by_segment_type"]) == {"synopsis", "para"}
    assert sum(g["sentences"] for g in freq["by_length"].values()) == 25
    assert freq["copy_recall"]["method"]["all"]["words"] == freq["copy_recall"]["control"]["all"]["words"]  # (none here)
    assert set(freq["nll"]["method"]) == {"train_sample", "valid"}
    report = (work / "REPORT.md").read_text()
    assert "## Where the source-pruning models lose (gap_analysis)" in report and "| synopsis |" in report
