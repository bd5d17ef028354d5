"""fairseq-sparse-export: the TorchScript file translates, in a process where fairseq and the plugin cannot be
imported, to the same hypotheses as fairseq-generate (scores to 1e-4 bits) for every architecture it exports:
a stock transformer, a physically head-pruned checkpoint, the simplified decoder, L0Drop, a merged L0Drop model
and the composed model; --int8 gives the same
hypotheses as the eager int8 model. Checkpoints: the session's stock transformer (conftest.py), pruned by
fairseq-sparse-prune-heads, and the simplified decoder and the composed model fine-tuned from it here."""
import json
import math
import os
import sys

import pytest

from conftest import TINY_MODEL, USER_DIR, console, fairseq_train, refused_in_process, run
from helpers.cli import IN_PROCESS_LOADER

GEN = ["--beam", "4", "--max-len-b", "30"]

#: run in a fresh interpreter where fairseq and the plugin cannot be imported: torch alone
STANDALONE = r"""
import json, sys
sys.modules.update({"fairseq": None, "fairseq_cli": None, "fairseq_sparse": None})
import torch
path, src = sys.argv[1], sys.argv[2]
m = torch.jit.load(path)
lines = open(src, encoding="utf-8").read().splitlines()
hyps = m.translate([m.encode(line) for line in lines])
print(json.dumps([[m.decode(h[0]["tokens"]), float(h[0]["score"])] for h in hyps]))
"""


def export(ckpt, out, *extra, check=True):
    return run([console("fairseq-sparse-export"), "--path", ckpt, "--output", str(out)] + GEN + list(extra),
               check=check)


def fairseq_generate(ckpt, data):
    """{sentence id: (hypothesis, score in natural log)} of fairseq-generate on the test split."""
    proc = run([console("fairseq-generate"), data, "--user-dir", USER_DIR, "--path", ckpt, "--gen-subset", "test",
                "--cpu", "--max-tokens", "2000"] + IN_PROCESS_LOADER + GEN)
    hyps = {}
    for line in proc.stdout.splitlines():
        if line.startswith("H-"):
            head, score, text = line.split("\t")
            hyps[int(head[2:])] = (text, float(score) * math.log(2))  # fairseq-generate prints base 2
    return hyps


def standalone(ts, src):
    proc = run([sys.executable, "-c", STANDALONE, str(ts), src])
    return json.loads(proc.stdout)


def assert_same_as_fairseq_generate(ckpt, corpus, tmp_path, name, *extra):
    ts = tmp_path / f"{name}.ts.pt"
    export(ckpt, ts, *extra)
    want = fairseq_generate(ckpt, corpus["bin"])
    got = standalone(ts, os.path.join(corpus["raw"], "test.src"))
    assert len(got) == len(want) == 60
    for i, (text, score) in enumerate(got):
        assert text == want[i][0], f"sentence {i}: exported {text!r} vs fairseq-generate {want[i][0]!r}"
        assert abs(score - want[i][1]) < 1e-4 * math.log(2), (i, score, want[i][1])
    return ts


@pytest.fixture(scope="module")
def pruned_ckpt(stock_transformer_ckpt, tmp_path_factory):
    """The stock checkpoint with 5 of 24 heads cut out (fairseq-sparse-prune-heads --head-mask)."""
    out = tmp_path_factory.mktemp("pruned")
    mask = out / "mask.json"
    mask.write_text(json.dumps({"enc": [[1, 0, 1, 1], [1, 1, 1, 0]], "dec": [[1, 1, 0, 1], [1, 1, 1, 1]],
                                "encdec": [[0, 1, 1, 1], [1, 1, 0, 1]]}))
    run([console("fairseq-sparse-prune-heads"), "--path", stock_transformer_ckpt, "--head-mask", str(mask),
         "--output", str(out / "pruned.pt")])
    return str(out / "pruned.pt")


@pytest.fixture(scope="module")
def simplified_ckpt(corpus, stock_transformer_ckpt, tmp_path_factory):
    """The simplified decoder fine-tuned briefly from the session's stock checkpoint (the decoder's FFNs left out)."""
    save = str(tmp_path_factory.mktemp("simplified"))
    fairseq_train(corpus["bin"], save, ["--arch", "transformer_simplified_decoder", "--criterion",
                                        "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                                        "--finetune-from-model", stock_transformer_ckpt] + TINY_MODEL, max_update=30)
    return os.path.join(save, "checkpoint_last.pt")


@pytest.fixture(scope="module")
def composed_ckpt(corpus, stock_transformer_ckpt, tmp_path_factory):
    """The composed model (simplified decoder, L0Drop between the encoder layers and on the output, head gates)
    fine-tuned briefly from the stock checkpoint, its L0Drop gates shifted to prune about half of the test
    states at each gate (helpers.cli.with_mixed_gates), its heads then cut out by a mask that leaves one encoder
    layer and one encoder-decoder attention without any head."""
    from helpers.cli import with_mixed_gates

    save = tmp_path_factory.mktemp("composed")
    fairseq_train(corpus["bin"], str(save), [
        "--arch", "transformer_l0drop", "--criterion", "label_smoothed_cross_entropy_with_sparsity",
        "--label-smoothing", "0.1", "--simplified-decoder", "--l0drop-between-layers", "--head-gates", "enc,dec,encdec",
        "--l0drop-lambda", "0.3", "--head-gates-lambda", "0.05", "--finetune-from-model", stock_transformer_ckpt,
    ] + TINY_MODEL, max_update=30)
    mixed = with_mixed_gates(str(save / "checkpoint_last.pt"), corpus["bin"], str(save / "mixed.pt"))
    mask = save / "mask.json"
    mask.write_text(json.dumps({"enc": [[0, 0, 0, 0], [1, 0, 1, 1]], "dec": [[1, 1, 0, 1], [1, 1, 1, 1]],
                                "encdec": [[0, 1, 1, 1], [0, 0, 0, 0]]}))
    run([console("fairseq-sparse-prune-heads"), "--path", mixed, "--head-mask", str(mask),
         "--output", str(save / "pruned.pt")])
    return str(save / "pruned.pt")


def test_stock_transformer_exports_to_fairseq_generates_hypotheses(stock_transformer_ckpt, corpus, tmp_path):
    ts = assert_same_as_fairseq_generate(stock_transformer_ckpt, corpus, tmp_path, "stock")
    from fairseq_sparse.export import read_metadata

    meta = read_metadata(str(ts))
    assert meta["arch"] == "transformer" and meta["generation"]["beam"] == 4 and not meta["int8"]
    assert meta["attention"]


def assert_no_attention(ts, corpus):
    """The file's hypotheses carry an empty attention tensor (exported with --no-attention)."""
    import torch

    from fairseq_sparse.export import read_metadata

    assert read_metadata(str(ts))["attention"] is False
    m = torch.jit.load(str(ts))
    line = open(os.path.join(corpus["raw"], "test.src"), encoding="utf-8").readline()
    assert m.translate([m.encode(line)])[0][0]["attention"].numel() == 0


def test_head_pruned_checkpoint_exports_to_fairseq_generates_hypotheses(pruned_ckpt, corpus, tmp_path):
    """Exported without beam attention (fairseq's own decoder given the switch): fairseq-generate's hypotheses."""
    ts = assert_same_as_fairseq_generate(pruned_ckpt, corpus, tmp_path, "pruned", "--no-attention")
    assert_no_attention(ts, corpus)


def test_simplified_decoder_exports_to_fairseq_generates_hypotheses(simplified_ckpt, corpus, tmp_path):
    assert_same_as_fairseq_generate(simplified_ckpt, corpus, tmp_path, "simplified")


def test_l0drop_exports_to_fairseq_generates_hypotheses_with_the_compressed_memory(l0drop_ckpt, corpus, tmp_path):
    """transformer_l0drop (gates on the encoder output, about half the states pruned): the file decodes the
    compressed memory of Algorithm 1 (N' + 1 rows, not N) and gives fairseq-generate's hypotheses."""
    import torch

    ts = assert_same_as_fairseq_generate(l0drop_ckpt, corpus, tmp_path, "l0drop")
    m = torch.jit.load(str(ts))
    lines = open(os.path.join(corpus["raw"], "test.src"), encoding="utf-8").read().splitlines()
    ids = [m.encode(line) for line in lines]
    width = max(len(s) for s in ids)
    tokens = torch.full((len(ids), width), m.pad, dtype=torch.long)
    for i, s in enumerate(ids):
        tokens[i, width - len(s):] = s
    encoder = getattr(m.generator.model.models, "0").encoder  # a scripted ModuleList has no [i]
    out = encoder.forward_torchscript(
        {"src_tokens": tokens, "src_lengths": torch.tensor([len(s) for s in ids])})
    gates = out["l0drop_gates"][0]
    kept = int(((gates != 0) & tokens.ne(m.pad)).sum(1).max())
    assert 0 < kept < width - 1  # about half the states gone, in the file too
    assert out["encoder_out"][0].size(0) == kept + 1  # the kept states of the longest row and the counted dummy


def test_composed_model_exports_to_fairseq_generates_hypotheses(composed_ckpt, corpus, tmp_path):
    """The compacted encoder (L0Drop between layers) with a headless layer, the simplified decoder, pruned heads;
    exported without beam attention."""
    ts = assert_same_as_fairseq_generate(composed_ckpt, corpus, tmp_path, "composed", "--no-attention")
    assert_no_attention(ts, corpus)


def test_a_merged_model_exports_to_fairseq_generates_hypotheses(corpus, stock_transformer_ckpt, tmp_path):
    """--encoder-output-merge attention with learned L0Drop gates (shifted to prune about half the states): the merged,
    compressed memory in TorchScript."""
    from helpers.cli import with_mixed_gates

    save = tmp_path / "merged"
    fairseq_train(corpus["bin"], str(save), [
        "--arch", "transformer_l0drop", "--criterion", "label_smoothed_cross_entropy_with_sparsity",
        "--label-smoothing", "0.1", "--encoder-output-merge", "attention", "--l0drop-lambda", "0.3", "--finetune-from-model", stock_transformer_ckpt] + TINY_MODEL, max_update=20)
    mixed = with_mixed_gates(str(save / "checkpoint_last.pt"), corpus["bin"], str(save / "mixed.pt"))
    assert_same_as_fairseq_generate(mixed, corpus, tmp_path, "merged")


@pytest.mark.parametrize("checkpoint", ["pruned_ckpt", "l0drop_ckpt"])
def test_int8_export_equals_the_eager_int8_model(checkpoint, corpus, tmp_path, request):
    """--int8: every Linear quantised (dynamic; L0Drop's gates stay float32); the file's hypotheses are those of
    the eager quantised model, which needs the fast-path switch (fairseq's fast path reads a quantised Linear's
    .bias as a tensor). Scores are not compared: activations are quantised per call, so float differences of
    1e-7 between the eager and the scripted kernels can move a rounding step."""
    ckpt = request.getfixturevalue(checkpoint)
    import torch
    from fairseq.sequence_generator import SequenceGenerator

    from fairseq_sparse.cli import common
    from fairseq_sparse.export import quantise_int8

    ts = tmp_path / "int8.ts.pt"
    export(ckpt, ts, "--int8")
    got = standalone(ts, os.path.join(corpus["raw"], "test.src"))
    model, _, task = common.load_checkpoint(ckpt, corpus["bin"])
    model = quantise_int8(model.eval())
    assert any(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in model.modules())
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=4, max_len_b=30)
    src = task.source_dictionary
    lines = open(os.path.join(corpus["raw"], "test.src"), encoding="utf-8").read().splitlines()
    ids = [src.encode_line(line, add_if_not_exist=False).long() for line in lines]
    width = max(len(s) for s in ids)
    tokens = torch.full((len(ids), width), src.pad(), dtype=torch.long)
    for i, s in enumerate(ids):
        tokens[i, width - len(s):] = s
    with torch.no_grad():
        hyps = gen({"net_input": {"src_tokens": tokens, "src_lengths": torch.tensor([len(s) for s in ids])}})
    want = [task.target_dictionary.string(h[0]["tokens"]) for h in hyps]
    assert [text for text, _ in got] == want


def test_refused_before_any_work(stock_transformer_ckpt, tmp_path, capsys):
    """A missing checkpoint, an existing output without --overwrite, the input as output (even with
    --overwrite), a missing output folder, a bad option: one error line, exit 2, nothing written (in this process;
    the console script once)."""
    from fairseq_sparse.cli.export import main

    out = tmp_path / "x.ts.pt"
    cases = [
        (["--path", str(tmp_path / "missing.pt"), "--output", str(out)], "checkpoint not found"),
        (["--path", stock_transformer_ckpt, "--output", stock_transformer_ckpt, "--overwrite"],
         "is an input of this command"),
        (["--path", stock_transformer_ckpt, "--output", str(tmp_path / "no" / "dir.pt")], "directory does not exist"),
        (["--path", stock_transformer_ckpt, "--output", str(out), "--beam", "0"], "--beam must be >= 1"),
        (["--path", stock_transformer_ckpt, "--output", str(out), "--min-len", "500", "--max-len-a", "0",
          "--max-len-b", "20"], "--min-len 500 is longer than the longest output --max-len-b 20"),
    ]
    for argv, message in cases:
        assert message in refused_in_process(main, argv, capsys), argv
        assert not out.exists()
    out.write_text("keep me")
    proc = run([console("fairseq-sparse-export"), "--path", stock_transformer_ckpt, "--output", str(out)], check=False,
               console=True)
    assert proc.returncode == 2 and "pass --overwrite" in proc.stderr and "Traceback" not in proc.stderr
    assert out.read_text() == "keep me"
