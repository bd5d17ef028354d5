"""Smoke test of the benchmark l0drop_decoding.py: a tiny random model at one source length runs through the
timing child, prints its four tables and writes consistent JSON, and pruned decoding gives the same
hypotheses as unpruned; options it cannot honour are refused before anything is built. No timing
assertions. (The peak-memory children are skipped: each is one more process start.)
Here the pure tests; those that train or run console scripts are in tests/e2e/test_benchmarks_l0drop_decoding_e2e.py."""
import importlib

import pytest


@pytest.mark.parametrize("args, msg", [
    (["--lengths", "25,x"], "--lengths"),
    (["--lengths", "25,3000"], "--lengths 3000"),
    (["--sparsity", "1.5"], "--sparsity"),
    (["--variants", "pruned,fast"], "--variants"),
    (["--path", "NO.pt", "--data", "."], "checkpoint not found"),
    (["--path", "NO.pt"], "--path and --data go together"),
    (["--device", "cpu", "--fp16"], "--fp16 needs --device cuda"),
    (["--json", "NO/x.json"], "directory does not exist"),
    (["--dim", "60", "--heads", "8"], "not a multiple"),
    (["--repeats", "0"], "--repeats"),
])
def test_l0drop_decoding_benchmark_refuses_bad_options(capsys, monkeypatch, tmp_path, args, msg):
    """Options that cannot be honoured stop the run (argparse's exit 2) before any model is built."""
    bench = importlib.import_module("fairseq_sparse.benchmarks.l0drop_decoding")
    args = [str(tmp_path / a) if a.startswith("NO") else a for a in args]
    with pytest.raises(SystemExit) as e:
        bench.parse_args(args)
    assert e.value.code == 2
    assert msg in capsys.readouterr().err
