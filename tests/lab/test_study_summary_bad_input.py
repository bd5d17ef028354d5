"""lab/study_summary.py on a bad pack (issue 55 item 5): a truncated study.tgz, a cut-off results.json, a model
row without its score: one line naming the file, never a raw traceback; a model this version does not know is named
as such."""
import io
import json
import os
import sys
import tarfile

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "lab"))
import study_summary  # noqa: E402


def results(models):
    return {"models": models, "settings": {"seed": 1, "metric": "bleu"}}


def pack(tmp_path, text):
    work = tmp_path / "W1"
    work.mkdir()
    (work / "results.json").write_text(text)
    tgz = tmp_path / "study.tgz"
    with tarfile.open(tgz, "w:gz") as t:
        t.add(work, arcname="W1")
    return tgz


def refusal(argv, capsys):
    with pytest.raises(SystemExit) as e:
        study_summary.main([str(a) for a in argv])
    message = str(e.value) if not isinstance(e.value.code, int) else capsys.readouterr().err
    assert "Traceback" not in message and message.strip().count("\n") <= 1, message
    return message


def test_a_truncated_pack_is_refused_in_one_line(tmp_path, capsys):
    tgz = pack(tmp_path, json.dumps(results({})))
    data = tgz.read_bytes()
    tgz.write_bytes(data[:len(data) // 2])
    assert "is not a readable study.tgz" in refusal([tgz], capsys)


@pytest.mark.parametrize("text, wanted", [
    ('{"models": {"baseline": {"sco', "W1/results.json is not readable JSON"),
    (json.dumps(results({"baseline": {"parameters": 1}})), "W1/results.json lacks 'score'"),
])
def test_a_bad_results_json_is_refused_naming_it(tmp_path, capsys, text, wanted):
    assert wanted in refusal([pack(tmp_path, text)], capsys)


def test_a_model_this_version_does_not_know_is_named_as_such(tmp_path, capsys):
    study_summary.main([str(pack(tmp_path, json.dumps(results({"baseline": {"score": 10.0, "parameters": 1},
                                                                 "mystery": {"score": 9.0, "parameters": 1}}))))])
    out = capsys.readouterr().out
    assert "- mystery: not a model of this version of the recipe" in out
