"""Smoke test of the benchmark l0drop_decoding.py: a tiny random model at one source length runs through the
timing child, prints its four tables and writes consistent JSON, pruned decoding gives the same
hypotheses as unpruned and the stock model with the shared memory the same as stock, bit for bit; options it cannot honour are refused before anything is built. No timing
assertions. (The peak-memory children are skipped: each is one more process start.)
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_benchmarks_l0drop_decoding.py."""
import importlib
import json
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = "fairseq_sparse.benchmarks.l0drop_decoding"
TINY = ["--layers", "2", "--dim", "64", "--heads", "4", "--ffn", "128", "--vocab", "500"]


def test_l0drop_decoding_benchmark_smoke(tmp_path):
    out_json = tmp_path / "l0.json"
    cmd = [sys.executable, "-m", SCRIPT] + TINY + [
        "--lengths", "40", "--short-len", "4", "--batch-size", "2", "--beam", "2", "--out-len", "5",
        "--repeats", "2", "--threads", "1", "--clock", "cpu", "--sparsity", "0.5", "--no-memory",
        "--json", str(out_json)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    assert "pruned/unpruned" in out and "share_dec" in out and "unpruned/stock" in out, out
    assert "yes (max score diff" in out and "NO (" not in out, out
    assert "shared/stock" in out and "bit for bit" in out, out
    assert "noise:" in out, out

    res = json.loads(out_json.read_text())
    assert res["settings"]["lengths"] == "40" and "_child" not in res["settings"]
    (row,) = res["rows"]
    assert row["length"] == 40 and row["identical_hypotheses"] is True and row["shared_identical"] is True
    assert 0.3 < row["sparsity"] < 0.7  # the gates were calibrated for 50% on other random sources
    for v in ("stock", "shared", "unpruned", "pruned", "short"):
        r = row[v]
        assert r["out_lengths"] == [6] and len(r["times_s"]) == 2 and r["times_s"] == r["cpu_times_s"]
        assert r["sent_per_s"] > 0
    assert row["short"]["length"] == 4 and row["pruned"]["memory_len"] < row["unpruned"]["memory_len"] == 40
    assert row["unpruned"]["encoder_s"] > 0 and row["pruned"]["encoder_s"] is None
    for k in ("speedup_vs_unpruned", "speedup_vs_unpruned_paired", "speedup_vs_stock", "share", "bound_dec",
              "shared_vs_stock", "shared_vs_stock_paired", "unpruned_vs_shared"):
        assert row[k] is not None
    assert set(res["meta"]) >= {"model", "device", "threads", "source", "loadavg_before", "loadavg_after",
                                "elapsed_s"}


def test_l0drop_decoding_benchmark_refuses_a_checkpoint_without_the_method(capsys, monkeypatch,
                                                                         stock_transformer_ckpt, corpus):
    """A stock checkpoint has nothing for pruned decoding to shorten: refused before anything is built."""
    bench = importlib.import_module("fairseq_sparse.benchmarks.l0drop_decoding")
    with pytest.raises(SystemExit) as e:
        bench.parse_args(["--path", stock_transformer_ckpt, "--data", corpus["bin"]])
    assert e.value.code == 2
    assert "no L0Drop gates and no encoder-output pattern" in capsys.readouterr().err
