"""Smoke test of the benchmark composed.py: tiny random models of every variant at one source length run through
the timing child, the compacted encoder and pruned memory give the hypotheses of the same checkpoint decoded
in full, the report and JSON are consistent; options it cannot honour are refused before anything is built.
No timing assertions.
Here the pure tests; those that train or run console scripts are in tests/e2e/test_benchmarks_composed_e2e.py."""
import importlib
import importlib.util

import pytest

from fairseq_sparse.benchmarks import composed_measure, composed_report


@pytest.mark.parametrize("args, msg", [
    (["--sparsity", "1.0"], "--sparsity 1.0: must lie in [0, 1)"),
    (["--sparsity", "nan"], "--sparsity nan: must lie in [0, 1)"),
    (["--heads-pruned", "-0.1"], "--heads-pruned -0.1"),
    (["--size", "tiny", "--sparsity", "0.3", "--layer-sparsity", "0.5"], "must not exceed --sparsity"),
    (["--size", "tiny", "--layer-sparsity", "0.1,0.2"], "2 values for 1 gates"),
    (["--size", "tiny", "--layer-sparsity", "paper"], "6 encoder layers"),
    (["--layer-sparsity", "0.3,0.2"], "must not decrease"),
    (["--lengths", "25,3000"], "--lengths 3000"),
    (["--variants", "layers,composed"], "keep it in the list"),
    (["--variants", "stock,fast"], "--variants"),
    (["--json", "NO/x.json"], "directory does not exist"),
    (["--bandwidth-gbs", "0"], "--bandwidth-gbs 0.0: must be a positive number"),
    (["--peak-tflops", "nan"], "--peak-tflops nan: must be a positive number"),
])
def test_composed_benchmark_refuses_bad_options(capsys, monkeypatch, tmp_path, args, msg):
    """Options that cannot be honoured stop the run (argparse's exit 2) before any model is built."""
    bench = importlib.import_module("fairseq_sparse.benchmarks.composed")
    args = [str(tmp_path / a) if a.startswith("NO") else a for a in args]
    with pytest.raises(SystemExit) as e:
        bench.parse_args(args)
    assert e.value.code == 2
    assert msg in capsys.readouterr().err


def test_composed_benchmark_ctranslate2_asked_for_but_missing(capsys, monkeypatch):
    """CTranslate2 named in --variants but not installed: a clear error; left to the default, a note."""
    bench = importlib.import_module("fairseq_sparse.benchmarks.composed")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ctranslate2" else real(name, *a))
    with pytest.raises(SystemExit) as e:
        bench.parse_args(["--variants", "stock,ct2_int8"])
    assert e.value.code == 2 and "ctranslate2 is not installed" in capsys.readouterr().err
    args = bench.parse_args([])
    assert "ct2_int8" not in args._variants and "composed" in args._variants
    assert "the CTranslate2 variants are left out" in capsys.readouterr().out


def test_composed_benchmark_bytes_model_fp16_and_shared_memory(monkeypatch):
    """The bytes-per-step prediction composed.py prints: under --fp16 (2 bytes per element, what a CUDA run
    gets) every term but the float32 log-probs halves; a shared memory reads the keys and values once per
    sentence. Rates given or measured (CPU)."""
    bench = importlib.import_module("fairseq_sparse.benchmarks.composed")
    args = bench.parse_args(["--size", "tiny", "--variants", "stock", "--batch-size", "3", "--beam", "4",
                             "--out-len", "9"])
    shape = {"dim": 64, "head_dim": 16, "vocab": 500, "enc_heads": [4, 4], "enc_ffn": [128, 128],
             "dec_heads": [4, 4], "cross_heads": [4, 4], "dec_ffn": [128, 128], "tied_output": True,
             "dec_final_norm": False, "enc_final_norm": False}
    r = {"shape": shape, "enc_rows": [40, 40], "memory_len": 40, "shared_memory": False}
    rates = {"bandwidth_gbs": 10.0, "peak_tflops": 0.1}
    fp32 = composed_report.traffic_prediction(args, r, rates)
    args.fp16 = True
    fp16 = composed_report.traffic_prediction(args, r, rates)
    for kind in ("reads", "copies"):
        a, b = fp32[kind]["step_bytes"], fp16[kind]["step_bytes"]
        assert set(a) == {"weights", "cross_kv", "self_kv", "logits"} | ({"copies"} if kind == "copies" else set())
        for term in set(a) - {"logits"}:
            assert b[term] == pytest.approx(a[term] / 2), (kind, term)
        assert b["logits"] > a["logits"] / 2
    shared = composed_report.traffic_prediction(args, dict(r, shared_memory=True), rates)["reads"]["step_bytes"]
    assert shared["cross_kv"] == pytest.approx(fp16["reads"]["step_bytes"]["cross_kv"] / 4)
    assert composed_report.traffic_prediction(args, {"out_lengths": [9]}, rates) is None  # CTranslate2: no shape

    spec = {"device": "cpu", "fp16": False, "bandwidth_gbs": None, "peak_tflops": None}
    measured = composed_measure.device_rates(spec, "cpu")
    assert measured["bandwidth_gbs"] > 0 and measured["peak_tflops"] > 0
    assert measured["bandwidth_source"] == measured["peak_source"] == "measured"
    given = composed_measure.device_rates(dict(spec, bandwidth_gbs=3350.0, peak_tflops=989.0), "cpu")
    assert given == {"bandwidth_gbs": 3350.0, "bandwidth_source": "--bandwidth-gbs", "peak_tflops": 989.0,
                     "peak_source": "--peak-tflops"}
