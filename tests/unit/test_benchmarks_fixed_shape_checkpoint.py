"""fairseq_sparse/benchmarks/fixed_shape_checkpoint.py without fairseq-generate (its runs stand in): each decoding
prints its line when it ends, and every round reaches --json as it ends, so a run cut short keeps what it measured
(issue 62: the trained-checkpoint row wrote nothing until all its decodings ended)."""
import json

import pytest

from fairseq_sparse.benchmarks import fixed_shape_checkpoint as bench


def test_a_run_cut_short_keeps_its_measured_rounds(tmp_path, monkeypatch, capsys):
    (tmp_path / "bin").mkdir()
    (tmp_path / "ckpt.pt").write_bytes(b"x")
    calls = []

    def run_once(cmd):
        calls.append(cmd)
        if len(calls) > 2:  # the second round's first decoding: the machine's time ran out
            raise SystemExit("killed")
        fixed = "translation_fixed_shape" in cmd
        return 2.0, 1.0 if fixed else 1.5, {0: "a b", 1: "c"}, {0: "a b", 1: "c d" if fixed else "c"}, {0: "a b", 1: "c"}

    monkeypatch.setattr(bench, "run_once", run_once)
    out = tmp_path / "out.json"
    with pytest.raises(SystemExit):
        bench.main([str(tmp_path / "bin"), "--path", str(tmp_path / "ckpt.pt"), "--rounds", "2", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "round 1 of 2: fp32 fairseq: generate 1.50 s" in printed
    assert "round 1 of 2: fp32 fixed_shape: generate 1.00 s" in printed
    kept = json.loads(out.read_text())
    assert kept["partial"] == "1 of 2 rounds" and kept["sentences"] == 2
    rows = {r["search"]: r for r in kept["results"]}
    assert rows["fixed_shape"]["speedup_generate"] == 1.5 and rows["fixed_shape"]["identical_to_fairseq_fp32"] == 1.0
    assert rows["fairseq"]["rounds"] == [[2.0, 1.5]]
