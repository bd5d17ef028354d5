"""fairseq-sparse-sparsity-curve: one fine-tuning with a schedule of target sparsities, one checkpoint per
target, and the BLEU/sparsity curve over them (Zhang, Titov & Sennrich 2021 Fig. 4; Voita et al. 2019 Fig. 7).

Checks: the token types (closed form), the target each checkpoint was trained at last, the interval
checkpoints of a save dir; end to end, fairseq-train with a schedule writes a checkpoint per target and
the tool measures them (TSV rows, PNGs); bad input is refused clearly, before any output is written.
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_sparsity_curve.py.
"""
import os
import shutil
import subprocess

import pytest
import torch

from conftest import USER_DIR, console, run
from helpers.cli import ENV, L0DROP, train_cmd, with_mixed_gates

import fairseq_sparse  # noqa: F401  (registers the plugin, allowlists fairseq checkpoint classes)
from fairseq_sparse.analysis import sparsity_curve as sc
from fairseq_sparse.cli import sparsity_curve as cli

HOLD, WARMUP = 30, 10
SCHEDULE = L0DROP + ["--l0drop-target-sparsity", "0.3,0.6", "--sparsity-target-hold-updates", str(HOLD),
                     "--sparsity-target-warmup-updates", str(WARMUP), "--save-interval-updates", str(HOLD),
                     "--optimizer", "adam_sparsity"]
STOCK = ["--arch", "transformer", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
EVAL = ["--max-sentences", "20", "--beam", "2", "--no-progress-bar", "--cpu"]
# the synthetic corpus's function words (fairseq_sparse.synthetic_corpus): the0 .. the11
FUNCTION_WORDS = "".join(f"the{i}\n" for i in range(12))


# ----------------------------------------------------------------------------------------------
# end to end: fairseq-train with a schedule, then the tool on its save dir


def _train_side_by_side(data_bin, runs, max_update):
    """fairseq-train of each (save dir, options) of ``runs`` at once, one thread each (2 cores)."""
    cmds = [train_cmd(data_bin, save, extra, max_update) for save, extra in runs]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
             for c in cmds]
    for cmd, p in zip(cmds, procs):
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, f"{' '.join(cmd)} failed:\n{stdout[-3000:]}\n{stderr[-3000:]}"


@pytest.fixture(scope="module")
def schedule_run(corpus, tmp_path_factory):
    """transformer_l0drop trained from scratch with targets 0.3 then 0.6, HOLD updates each, and a stock
    transformer trained as many updates (the equal-updates control: a checkpoint without gates)."""
    save, control = str(tmp_path_factory.mktemp("schedule")), str(tmp_path_factory.mktemp("control"))
    _train_side_by_side(corpus["bin"], [(save, SCHEDULE), (control, STOCK)], max_update=2 * HOLD)
    return {"save": save, "control": os.path.join(control, "checkpoint_last.pt")}


def _read_tsv(path):
    header, *lines = open(path).read().splitlines()
    return [dict(zip(header.split("\t"), line.split("\t"))) for line in lines]


def test_schedule_checkpoints_and_curve(corpus, schedule_run, tmp_path):
    save, control = schedule_run["save"], schedule_run["control"]
    ckpts = [os.path.join(save, f"checkpoint_1_{u}.pt") for u in (HOLD, 2 * HOLD)]
    assert all(os.path.isfile(c) for c in ckpts), os.listdir(save)
    (tmp_path / "fw.txt").write_text(FUNCTION_WORDS)
    out = str(tmp_path / "curve")
    proc = run([console("fairseq-sparse-sparsity-curve"), corpus["bin"], "--user-dir", USER_DIR, "--save-dir", save,
                "--baseline", control, "--output-prefix", out, "--function-words", str(tmp_path / "fw.txt")] + EVAL,
               env=ENV, console=True)
    rows = _read_tsv(out + ".tsv")
    assert list(rows[0]) == sc.COLUMNS
    assert [r["baseline"] for r in rows] == ["1", "0", "0"]
    assert [r["checkpoint"] for r in rows] == [control] + ckpts
    assert [r["updates"] for r in rows] == [str(2 * HOLD), str(HOLD), str(2 * HOLD)]
    assert [r["target_l0drop"] for r in rows] == ["NA", "0.3", "0.6"]
    assert rows[0]["l0drop_sparsity"] == "NA" and rows[0]["pruned_content"] == "NA"  # a stock transformer
    for r in rows[1:]:
        assert 0 <= float(r["l0drop_sparsity"]) <= 1 and r["head_gates_sparsity"] == "NA"
        assert 0 <= float(r["pruned_function"]) <= 1 and 0 <= float(r["pruned_content"]) <= 1
        assert r["pruned_punct"] == "NA"  # the synthetic corpus has no punctuation
    assert all(0 <= float(r["bleu"]) <= 100 for r in rows)
    for png in (out + ".png", out + "_token_types.png"):
        assert os.path.getsize(png) > 0
    assert f"checkpoint_1_{2 * HOLD}.pt" in proc.stdout and "wrote" in proc.stdout


def test_l0drop_pruning_counts_by_hand(corpus, schedule_run, tmp_path):
    """About half the test set's states pruned (gate biases shifted): the sparsity and the share per token type
    equal a count over the encoder's gates, with the corpus's words the0 .. the11 as function words."""
    from fairseq import checkpoint_utils

    ckpt = with_mixed_gates(os.path.join(schedule_run["save"], f"checkpoint_1_{HOLD}.pt"), corpus["bin"],
                            str(tmp_path / "mixed.pt"))
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([ckpt], arg_overrides={"data": corpus["bin"]})
    encoder, src_dict = models[0].eval().encoder, task.source_dictionary
    task.load_dataset("test")
    ds = task.dataset("test")
    sample = ds.collater([ds[i] for i in range(len(ds))])
    words = frozenset(FUNCTION_WORDS.split())
    got = sc.l0drop_pruning(encoder, [sample], src_dict, None, words)
    with torch.no_grad():
        net = sample["net_input"]
        gates = encoder(net["src_tokens"], net["src_lengths"])["l0drop_gates"][0]
    tokens = sample["net_input"]["src_tokens"]
    real = tokens.ne(src_dict.pad())
    pruned = gates.eq(0) & real
    assert got["tokens"] == int(real.sum()) and got["l0drop"] == pytest.approx(float(pruned.sum() / real.sum()))
    assert 0.2 < got["l0drop"] < 0.8
    function = torch.tensor([[src_dict[t] in words for t in row] for row in tokens.tolist()])
    content = real & ~function & tokens.ne(src_dict.eos())
    assert got["pruned_function"] == pytest.approx(float((pruned & function).sum() / function.sum()))
    assert got["pruned_content"] == pytest.approx(float((pruned & content).sum() / content.sum()))
    assert got["pruned_punct"] is None and encoder.pruned_decoding  # restored after the measurement
    # the same types from part-of-speech tags (one per word), and positions with a word-separating token
    ids = sample["id"].tolist()
    tags = {sid: ["DT" if src_dict[t] in words else "NN" for t in row if t not in (src_dict.pad(), src_dict.eos())]
            for sid, row in zip(ids, tokens.tolist())}
    tagged = sc.l0drop_pruning(encoder, [sample], src_dict, None, frozenset(), tags, char_boundary="the0")
    for t in ("function", "content"):
        assert tagged[f"pruned_{t}"] == pytest.approx(got[f"pruned_{t}"])
    bins = tagged["char_positions"]
    assert sum(b["share_of_pruned"] for b in bins) == pytest.approx(1.0)
    assert 0 < sum(b["chars"] for b in bins) < got["tokens"]


# ----------------------------------------------------------------------------------------------
# bad input: a clear error, exit status 2, nothing written


@pytest.mark.parametrize("case", ["existing_output", "empty_save_dir", "no_gates", "both", "neither", "no_data",
                                  "corrupt", "tags_lines", "tags_without_l0drop", "other_dictionary"])
def test_bad_input_refused(case, corpus, schedule_run, tmp_path, capsys):
    out, stock = tmp_path / "curve", schedule_run["control"]
    ckpt = os.path.join(schedule_run["save"], f"checkpoint_1_{HOLD}.pt")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "checkpoint_last.pt").write_bytes(open(ckpt, "rb").read())
    (tmp_path / "bad.pt").write_bytes(open(ckpt, "rb").read()[:5000])
    (tmp_path / "curve.tsv").write_text("old\n") if case == "existing_output" else None
    (tmp_path / "test.tags").write_text("NN\n")
    shuffled = tmp_path / "shuffled"  # issue 62 item 3: the data's dictionary of the same size, other words in order
    shutil.copytree(corpus["bin"], shuffled)
    for name in os.listdir(shuffled):
        if name.startswith("dict."):
            lines = (shuffled / name).read_text().splitlines()
            (shuffled / name).write_text("\n".join(lines[1:] + lines[:1]) + "\n")
    base = ["--output-prefix", str(out)] + EVAL
    argv, expect = {
        "existing_output": ([corpus["bin"], "--checkpoints", ckpt] + base, f"{out}.tsv exists; pass --overwrite"),
        "empty_save_dir": ([corpus["bin"], "--save-dir", str(tmp_path / "empty")] + base,
                           "no checkpoint_<epoch>_<updates>.pt or checkpoint<epoch>.pt in"),
        "no_gates": ([corpus["bin"], "--checkpoints", ckpt, stock] + base,
                     f"{stock} has no L0Drop gates and no head gates"),
        "both": ([corpus["bin"], "--checkpoints", ckpt, "--save-dir", schedule_run["save"]] + base, "not allowed with"),
        "neither": ([corpus["bin"]] + base, "one of the arguments --checkpoints --save-dir is required"),
        "no_data": ([str(tmp_path / "nodata"), "--checkpoints", ckpt] + base, "data directory not found"),
        "corrupt": ([corpus["bin"], "--checkpoints", ckpt, str(tmp_path / "bad.pt")] + base, "truncated or corrupt"),
        "tags_lines": ([corpus["bin"], "--checkpoints", ckpt, "--tags", str(tmp_path / "test.tags")] + base,
                       f"--tags: {tmp_path / 'test.tags'} has 1 lines, the split 60 sentences"),
        "tags_without_l0drop": ([corpus["bin"], "--checkpoints", stock, "--tags", str(tmp_path / "test.tags")] + base,
                                "has no L0Drop gates"),
        "other_dictionary": ([str(shuffled), "--checkpoints", ckpt, "--baseline", stock] + base,
                             f"whose symbols differ from those of {shuffled}"),
    }[case]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert expect in capsys.readouterr().err
    written = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("curve"))
    assert written == (["curve.tsv"] if case == "existing_output" else [])
    if case == "existing_output":
        assert (tmp_path / "curve.tsv").read_text() == "old\n"
