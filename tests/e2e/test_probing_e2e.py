"""The universal probing decoder of Yang et al. (2020) (fairseq_sparse.analysis.probing, fairseq-sparse-probe).

* the module recorder reads the same representations from fairseq's own decoder layer (hooks) as our
  decoder layer records itself, pre- and post-norm;
* the target probe's mask stops copying: on random sequences a probe whose memory holds the decoder
  inputs learns nothing from it with the mask and copies the next word without it;
* source sequences are rebuilt right-padded from fairseq's left-padded batches;
* modules a checkpoint lacks give a clear error; end to end on the real console script.
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_probing.py.
"""
import json
import os

from conftest import console, refused_in_process, run
from fairseq_sparse.analysis.probing import MODULES


# ----------------------------------------------------------------------------------------------
# end to end: fairseq-sparse-probe


def probe_cmd(data, ckpt, out, extra=()):
    return [console("fairseq-sparse-probe"), data, "--path", ckpt, "--output-dir", out, "--max-updates", "4",
            "--max-tokens", "600", "--no-progress-bar", "--cpu", "--probe-ffn-dim", "64"] + list(extra)


def test_probe_cli_on_stock_transformer(corpus, stock_transformer_ckpt, tmp_path):
    out = str(tmp_path / "probe")
    proc = run(probe_cmd(corpus["bin"], stock_transformer_ckpt, out, ["--valid-subset", "test"]))
    assert "recovery perplexity" in proc.stdout
    with open(os.path.join(out, "probe.json")) as f:
        result = json.load(f)
    rows = {(r["kind"], r["layer"], r["module"]): r for r in result["results"]}
    assert set(rows) == {(k, l, m) for k in ("source", "target") for l in (0, 1) for m in MODULES}
    n_words = len(open(os.path.join(corpus["bin"], "dict.src.txt")).readlines())
    for r in rows.values():
        assert r["tokens"] > 0 and 1.0 < r["ppl"] < 4 * n_words
    assert result["updates"] == 4
    for png in ("probe_modules.png", "probe_ifm.png"):
        assert os.path.getsize(os.path.join(out, png)) > 1000
    # a second run compared with the first: Fig. 10's overlay
    out2 = str(tmp_path / "probe2")
    run(probe_cmd(corpus["bin"], stock_transformer_ckpt, out2,
                  ["--modules", "ifm", "--layers", "1", "--probe", "target", "--valid-subset", "test",
                   "--compare", os.path.join(out, "probe.json")]))
    assert os.path.getsize(os.path.join(out2, "probe_compare.png")) > 1000
    assert not os.path.exists(os.path.join(out2, "probe_ifm.png"))


def test_probe_cli_bad_input(corpus, stock_transformer_ckpt, tmp_path, capsys):
    """Each refused with its reason, exit 2, nothing written (in this process; the console script once)."""
    from fairseq_sparse.cli.probe import main

    out = str(tmp_path / "never")
    for extra, message in [
        (["--modules", "fnn"], "unknown module"),
        (["--probe", "both"], "--probe must name source and/or target"),
        (["--layers", "5"], "layer 5 does not exist, the decoder has 2 layers"),
        (["--valid-subset", "nosuch"], "cannot load subset 'nosuch'"),
        (["--lr", "0"], "--lr must be > 0"),
    ]:
        assert message in refused_in_process(main, probe_cmd(corpus["bin"], stock_transformer_ckpt, out, extra)[1:],
                                             capsys), extra
        assert not os.path.exists(out)
    proc = run(probe_cmd(corpus["bin"], str(tmp_path / "missing.pt"), out), check=False, console=True)
    assert proc.returncode == 2 and "checkpoint not found" in proc.stderr


def test_probe_cli_on_simplified_decoder(corpus, tmp_path):
    from conftest import TINY_MODEL, fairseq_train

    save = str(tmp_path / "simplified")
    fairseq_train(corpus["bin"], save, ["--arch", "transformer_simplified_decoder", "--decoder-sublayer-order",
                                        "sem-tem-ifm"] + TINY_MODEL, max_update=5)
    ckpt = os.path.join(save, "checkpoint_last.pt")
    out = str(tmp_path / "probe")
    proc = run(probe_cmd(corpus["bin"], ckpt, out, ["--modules", "ffn"]), check=False)
    assert proc.returncode == 2 and "module ffn: decoder layer 0" in proc.stderr and "no FFN" in proc.stderr
    assert not os.path.exists(out)
    run(probe_cmd(corpus["bin"], ckpt, out, ["--probe", "source", "--valid-subset", "test"]))
    with open(os.path.join(out, "probe.json")) as f:
        modules = {r["module"] for r in json.load(f)["results"]}
    assert modules == {"tem", "sem", "ifm", "addnorm1"}
    assert os.path.exists(os.path.join(out, "probe_modules.png"))
    assert not os.path.exists(os.path.join(out, "probe_ifm.png"))  # no FFN: no Fig. 8


def test_probe_cli_refuses_existing_outputs_and_truncated_checkpoints(corpus, stock_transformer_ckpt, tmp_path):
    out = tmp_path / "probe"
    out.mkdir()
    (out / "probe.tsv").write_text("an earlier run\n")
    proc = run(probe_cmd(corpus["bin"], stock_transformer_ckpt, str(out), ["--probe", "target", "--modules", "ifm"]),
               check=False)
    assert proc.returncode == 2 and "probe.tsv exists; pass --overwrite" in proc.stderr, proc.stderr[-2000:]
    assert (out / "probe.tsv").read_text() == "an earlier run\n"
    assert sorted(os.listdir(out)) == ["probe.tsv"]
    run(probe_cmd(corpus["bin"], stock_transformer_ckpt, str(out),
                  ["--probe", "target", "--modules", "ifm", "--layers", "1", "--valid-subset", "test", "--overwrite"]))
    assert (out / "probe.tsv").read_text().splitlines()[0] == "kind\tlayer\tmodule\ttokens\tnll\tppl"
    # never over its own input, even with --overwrite
    (out / "probe.json").write_text(json.dumps({"label": "old", "results": []}))
    proc = run(probe_cmd(corpus["bin"], stock_transformer_ckpt, str(out),
                         ["--overwrite", "--compare", str(out / "probe.json")]), check=False)
    assert proc.returncode == 2 and "is an input of this command" in proc.stderr, proc.stderr[-2000:]
    # a truncated checkpoint: a clear error before anything is loaded or written
    truncated = tmp_path / "truncated.pt"
    with open(stock_transformer_ckpt, "rb") as f:
        truncated.write_bytes(f.read()[: os.path.getsize(stock_transformer_ckpt) // 2])
    fresh = str(tmp_path / "never")
    proc = run(probe_cmd(corpus["bin"], str(truncated), fresh), check=False)
    assert proc.returncode == 2 and "cannot read" in proc.stderr and "truncated or corrupt" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not os.path.exists(fresh)


def test_probe_that_diverges_writes_nothing(corpus, stock_transformer_ckpt, tmp_path, capsys):
    """--lr 1e30 trains the probes to a non-finite loss: refused after training, with what to do, and no NaN table
    written (issue 45)."""
    from fairseq_sparse.cli.probe import main

    out = str(tmp_path / "probe")
    argv = probe_cmd(corpus["bin"], stock_transformer_ckpt, out, ["--lr", "1e30", "--modules", "ifm", "--layers", "1",
                                                                  "--valid-subset", "test"])[1:]
    message = refused_in_process(main, argv, capsys)
    assert "the probes diverged (non-finite loss" in message and "lower --lr" in message
    assert not os.path.exists(os.path.join(out, "probe.json")) and not os.path.exists(os.path.join(out, "probe.tsv"))
