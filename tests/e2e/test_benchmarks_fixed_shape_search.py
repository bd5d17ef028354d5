"""Smoke test of the benchmark fixed_shape_search.py on a tiny random model: it runs both searches on both models,
prints the table, writes consistent JSON and exits 0 only with the same hypotheses. No timing assertions."""
import json
import os
import subprocess
import sys

from conftest import REPO

SCRIPT = "fairseq_sparse.benchmarks.fixed_shape_search"


def test_fixed_shape_search_benchmark_smoke(tmp_path):
    out_json = tmp_path / "fs.json"
    cmd = [sys.executable, "-m", SCRIPT, "--layers", "1", "--dim", "32", "--heads", "2", "--ffn", "64", "--vocab", "60",
           "--batch-sizes", "1,3", "--lengths", "12", "--out-len", "6", "--repeats", "2", "--threads", "1",
           "--clock", "cpu", "--json", str(out_json)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "fixed-shape search against fairseq's SequenceGenerator" in proc.stdout and "noise:" in proc.stdout
    res = json.loads(out_json.read_text())
    assert [(r["model"], r["batch"], r["length"]) for r in res["results"]] == [
        (m, b, 12) for m in ("stock", "l0drop", "l0drop_full") for b in (1, 3)]
    # the same L0Drop weights decoded over the pruned and the full memory, timed under each search
    assert [(r["batch"], r["length"], sorted(r["speedup"])) for r in res["pruned_vs_unpruned"]] == [
        (b, 12, ["fairseq", "fixed_indirect", "fixed_shape"]) for b in (1, 3)]
    assert "L0Drop pruned against the same model unpruned, batch 3, 12 tokens" in proc.stdout
    assert not os.path.exists(str(out_json) + ".partial")  # written after each measurement, removed at the end
    for r in res["results"]:
        # the eager form is timed apart on CUDA only; the ancestry table's steps run eagerly here
        assert set(r["searches"]) == {"fairseq", "fixed_shape", "fixed_indirect"}
        for x in r["searches"].values():
            assert x["same_hypotheses"] and x["ms_per_step"] > 0 and len(x["times"]["times_s"]) == 2
        assert r["searches"]["fairseq"]["speedup_paired"] == 1.0


CHECKPOINT_SCRIPT = "fairseq_sparse.benchmarks.fixed_shape_checkpoint"


def test_fixed_shape_checkpoint_benchmark_on_a_trained_checkpoint(corpus, stock_transformer_ckpt, tmp_path):
    """fairseq_sparse/benchmarks/fixed_shape_checkpoint.py: both searches through fairseq-generate on a trained checkpoint, fp32 on
    the CPU: the same hypotheses, the same BLEU, a generation time each; --fp16 on the CPU refused before any run."""
    out_json = tmp_path / "ckpt.json"
    # the search's own eager steps (its default on the CPU is fairseq's search)
    cmd = [sys.executable, "-m", CHECKPOINT_SCRIPT, corpus["bin"], "--path", stock_transformer_ckpt, "--rounds", "1",
           "--beam", "4", "--batch-size", "16", "--fixed-shape-args", "--fixed-shape-step-form prefix",
           "--json", str(out_json)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["search"]: r for r in json.loads(out_json.read_text())["results"]}
    assert set(rows) == {"fairseq", "fixed_shape"} and {r["precision"] for r in rows.values()} == {"fp32"}
    assert rows["fixed_shape"]["identical_to_fairseq_fp32"] == 1.0 == rows["fairseq"]["identical_to_fairseq_fp32"]
    assert rows["fixed_shape"]["bleu"] == rows["fairseq"]["bleu"] > 0
    assert rows["fixed_shape"]["generate_s"] > 0 and rows["fairseq"]["speedup_generate"] == 1.0
    refused = subprocess.run(cmd[:-2] + ["--fp16"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert refused.returncode == 2 and "--fp16 needs --device cuda" in refused.stderr
    kept = open(stock_transformer_ckpt, "rb").read()
    over = subprocess.run(cmd[:-1] + [stock_transformer_ckpt], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert over.returncode == 2 and "--json" in over.stderr and open(stock_transformer_ckpt, "rb").read() == kept
