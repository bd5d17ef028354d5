"""Smoke test of the benchmark head_pruning.py: its tiniest run completes, prints the tables, and the
pruned models decode exactly like the full model with the same heads masked. No timing assertions.
Here the pure tests; those that train or run console scripts are in tests/e2e/test_benchmarks_head_pruning_e2e.py."""


def test_head_pruning_benchmark_checks_the_mask_first(tmp_path, capsys, monkeypatch):
    """--from-mask goes through the head-gates module's validator before any model is built: values in
    [0, 1], finite, one row per layer and one value per head of the model --size describes."""
    import importlib

    import pytest
    bench = importlib.import_module("fairseq_sparse.benchmarks.head_pruning")
    mask = tmp_path / "mask.json"
    for matrix, msg in (('{"enc": [[2, -1, 1, 1], [1, 1, 1, 1]]}', "[0, 1]"),
                        ('{"enc": [[1, NaN, 1, 1], [1, 1, 1, 1]]}', "[0, 1]"),
                        ('{"enc": [[1, 0, 1, 1]]}', "1 rows"),
                        ('{"enc": [[1, 0, 1], [1, 1, 1, 1]]}', "3 values"),
                        ('{"self": [[1, 0, 1, 1], [1, 1, 1, 1]]}', "unknown attention type")):
        mask.write_text(matrix)
        with pytest.raises(SystemExit) as e:
            bench.parse_args(["--size", "tiny", "--from-mask", str(mask)])
        assert e.value.code == 2
        err = capsys.readouterr().err.split("error:")[-1]
        assert "--from-mask" in err and msg in err, err
    mask.write_text('{"enc": [[1, 0, 1, 0.5], [0, 0, 0, 0]], "encdec": [[1, 1, 1, 1], [1, 0, 0, 0]]}')
    args = bench.parse_args(["--size", "tiny", "--from-mask", str(mask)])
    assert args._mask_keep[("enc", 0)] == [0, 2, 3] and args._mask_keep[("enc", 1)] == []
    assert args._mask_keep[("dec", 1)] == [0, 1, 2, 3] and args._mask_keep[("encdec", 1)] == [0]
