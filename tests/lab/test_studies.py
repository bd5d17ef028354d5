"""lab/studies.py: the one reader of recipe results.json files over seeds (lab/study_summary.py and
the report scripts)."""
import json
import os
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "lab"))
import studies  # noqa: E402


def results(seed, budget=None, models=None):
    return {"settings": {"seed": seed, "metric": "bleu"}, "budget": budget or {},
            "models": models or {"baseline": {"score": 10.0, "parameters": 5}}}


def point(updates, control, score, **pruned):
    return {"updates": updates, "control": "baseline", "control_score": control, "score": score,
            "gap": round(score - control, 2), "p_value": 0.01, "l0drop_sparsity": None, "heads_closed": None, **pruned}


def write(folder, data):
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(data) if isinstance(data, dict) else data)


def test_budget_rows_give_the_relative_gap_and_what_is_pruned():
    r = results(1, {"pattern_freq_scratch": [point(850, 8.0, 6.0, l0drop_sparsity=0.5), point(1700, 0.0, 1.0)],
                    "heads_all_scratch": [point(850, 8.0, 7.0, heads_closed=0.25)]})
    rows = studies.budget_rows(r)
    freq = [x for x in rows if x["model"] == "pattern_freq_scratch"]
    assert freq[0]["relative_gap"] == -0.25 and freq[0]["source_states_pruned"] == 0.5
    assert freq[1]["relative_gap"] is None  # a control that scored 0 has no relative gap
    heads = [x for x in rows if x["model"] == "heads_all_scratch"]
    assert heads[0]["heads_closed"] == 0.25 and "source_states_pruned" not in heads[0]
    assert [x["model"] for x in studies.budget_rows(r, ["heads_all_scratch"])] == ["heads_all_scratch"]


def test_means_group_by_their_key_and_leave_out_missing_values():
    rows = [{"seed": 2, "model": "m", "updates": 850, "gap": -2.0, "relative_gap": None},
            {"seed": 1, "model": "m", "updates": 850, "gap": -1.0, "relative_gap": -0.123456},
            {"seed": 1, "model": "m", "updates": 1700, "gap": -0.5, "relative_gap": None}]
    out = studies.means(rows, ("model", "updates"), ("gap", "relative_gap"))
    assert list(out) == [("m", 850), ("m", 1700)]
    assert out[("m", 850)] == {"seeds": [1, 2], "gap": -1.5, "relative_gap": -0.1235}
    assert out[("m", 1700)]["relative_gap"] is None


def test_against_controls_pairs_each_model_with_its_control():
    r = results(1, models={"baseline": {"score": 10.0, "parameters": 5}, "control": {"score": 12.0, "parameters": 5},
                           "l0drop": {"score": 9.5, "parameters": 6, "l0drop_sparsity": 0.48}})
    r["significance"] = {"l0drop": {"p_value": 0.002}}
    rows = studies.against_controls(r)
    assert rows["l0drop"]["control"] == "control" and rows["l0drop"]["gap"] == -2.5
    assert rows["l0drop"]["p_value"] == 0.002 and rows["l0drop"]["source_states_pruned"] == 0.48
    assert "gap" not in rows["baseline"]


def test_results_by_seed_reads_every_work_dir_and_refuses_two_of_one_seed(tmp_path):
    write(tmp_path / "a" / "W1", results(1))
    write(tmp_path / "a" / "W2", results(2))
    write(tmp_path / "a" / "other", {"not": "a recipe report"})
    found = studies.results_by_seed(str(tmp_path / "a"))
    assert sorted(found) == [1, 2] and found[2]["work"] == "W2"
    write(tmp_path / "a" / "W1b", results(1))
    with pytest.raises(studies.StudyError, match="two work dirs of seed 1"):
        studies.results_by_seed(str(tmp_path / "a"))


def test_a_cut_off_results_json_is_named(tmp_path):
    write(tmp_path / "W1", '{"models": {"baseline": {"sco')
    with pytest.raises(studies.StudyError, match="W1/results.json is not readable JSON"):
        studies.results_by_seed(str(tmp_path))
    assert studies.read_results(str(tmp_path / "none")) is None
