"""Smoke test of benchmarks/composed.py: tiny random models of every variant at one source length run through
the timing child, the compacted encoder and pruned memory give the hypotheses of the same checkpoint decoded
in full, the report and JSON are consistent; options it cannot honour are refused before anything is built.
No timing assertions.
Here the pure tests; those that train or run console scripts are in tests/e2e/test_benchmarks_composed_e2e.py."""
import importlib
import importlib.util
import os

import pytest

from conftest import REPO


@pytest.mark.parametrize("args, msg", [
    (["--sparsity", "1.0"], "--sparsity 1.0: must lie in [0, 1)"),
    (["--sparsity", "nan"], "--sparsity nan: must lie in [0, 1)"),
    (["--heads-pruned", "-0.1"], "--heads-pruned -0.1"),
    (["--size", "tiny", "--sparsity", "0.3", "--layer-sparsity", "0.5"], "must not exceed --sparsity"),
    (["--size", "tiny", "--layer-sparsity", "0.1,0.2"], "2 values for 1 gates"),
    (["--size", "tiny", "--layer-sparsity", "paper"], "6 encoder layers"),
    (["--layer-sparsity", "0.3,0.2"], "must not decrease"),
    (["--lengths", "25,2000"], "--lengths 2000"),
    (["--variants", "layers,composed"], "keep it in the list"),
    (["--variants", "stock,fast"], "--variants"),
    (["--json", "NO/x.json"], "directory does not exist"),
])
def test_composed_benchmark_refuses_bad_options(capsys, monkeypatch, tmp_path, args, msg):
    """Options that cannot be honoured stop the run (argparse's exit 2) before any model is built."""
    monkeypatch.syspath_prepend(os.path.join(REPO, "benchmarks"))
    bench = importlib.import_module("composed")
    args = [str(tmp_path / a) if a.startswith("NO") else a for a in args]
    with pytest.raises(SystemExit) as e:
        bench.parse_args(args)
    assert e.value.code == 2
    assert msg in capsys.readouterr().err


def test_composed_benchmark_ctranslate2_asked_for_but_missing(capsys, monkeypatch):
    """CTranslate2 named in --variants but not installed: a clear error; left to the default, a note."""
    monkeypatch.syspath_prepend(os.path.join(REPO, "benchmarks"))
    bench = importlib.import_module("composed")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ctranslate2" else real(name, *a))
    with pytest.raises(SystemExit) as e:
        bench.parse_args(["--variants", "stock,ct2_int8"])
    assert e.value.code == 2 and "ctranslate2 is not installed" in capsys.readouterr().err
    args = bench.parse_args([])
    assert "ct2_int8" not in args._variants and "composed" in args._variants
    assert "the CTranslate2 variants are left out" in capsys.readouterr().out
