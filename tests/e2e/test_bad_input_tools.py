"""Bad input to the console scripts (issue 22): one clear error before any work, and nothing written.
Tiny models trained for a few updates; the corpus is the session fixture of conftest.py."""
import json
import os
import re

import pytest

from conftest import TINY_MODEL, TRAIN_COMMON, USER_DIR, console, run
from helpers.cli import IN_PROCESS_LOADER

# a model that is only built and loaded, never judged by its quality
FEW = ["--max-tokens", "400", "--log-interval", "1"]


def train(data_bin, save_dir, extra, max_update=2, check=True):
    proc = run([console("fairseq-train"), data_bin, "--user-dir", USER_DIR, "--save-dir", save_dir,
                "--max-update", str(max_update)] + TRAIN_COMMON + FEW + TINY_MODEL + extra, check=check)
    proc.log = proc.stdout + proc.stderr
    return proc


def test_prune_heads_refuses_a_model_that_cannot_be_built(corpus, tmp_path):
    """A coverage model reads every encoder-decoder head: cutting one out wrote a checkpoint that
    fairseq-generate then refused. Now the pruned model is built before anything is written."""
    save = str(tmp_path / "coverage")
    train(corpus["bin"], save, ["--arch", "transformer_head_gates", "--head-gates", "",
                                "--encdec-attention-coverage", "--criterion", "cross_entropy"])
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"encdec": [[0, 1, 1, 1], [1, 1, 1, 1]]}))
    out = tmp_path / "pruned.pt"
    proc = run([console("fairseq-sparse-prune-heads"), "--path", f"{save}/checkpoint_last.pt", "--head-mask",
                str(mask), "--output", str(out)], check=False, console=True)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors == [errors[0]] and "the pruned model cannot be built" in errors[0], proc.stderr[-3000:]
    assert "--encdec-attention-coverage reads every encoder-decoder head" in errors[0]
    assert "Traceback" not in proc.stderr
    assert not out.exists() and not (tmp_path / "pruned.kept_heads.json").exists()
    # the enc / dec heads of the same model still prune (and the result loads)
    mask.write_text(json.dumps({"enc": [[0, 1, 1, 1], [1, 1, 1, 1]]}))
    run([console("fairseq-sparse-prune-heads"), "--path", f"{save}/checkpoint_last.pt", "--head-mask", str(mask),
         "--output", str(out)])
    assert out.exists()


# ------------------------------------------------------------------------------------------------
# the POS pattern: tags travel with binarised splits only


def tag_of(word):
    """The synthetic corpus's words: the0 .. the11 are function words (DT), swap a verb, w17 nouns."""
    return "DT" if word.startswith("the") else ("VB" if word == "swap" else "NN")


UNIVERSAL = {"DT": "DET", "VB": "VERB", "NN": "NOUN"}


def write_tags(corpus, out, tagset=None):
    """{train,valid,test}.tags of the corpus's source side, one tag per word (Penn Treebank, or mapped)."""
    os.makedirs(out, exist_ok=True)
    for split in ("train", "valid", "test"):
        with open(f"{corpus['raw']}/{split}.src") as f:
            lines = [" ".join((tagset or {}).get(tag_of(w), tag_of(w)) for w in line.split())
                     for line in f.read().splitlines()]
        with open(f"{out}/{split}.tags", "w") as f:
            f.write("\n".join(lines) + "\n")
    return str(out)


POS = ["--task", "translation_source_tags", "--arch", "transformer_l0drop", "--encoder-output-pattern", "pos",
       "--criterion", "cross_entropy"]


@pytest.fixture(scope="module")
def pos_model(corpus, tmp_path_factory):
    """(checkpoint, tags dir) of a POS-pattern model trained for 2 updates."""
    root = tmp_path_factory.mktemp("pos")
    tags = write_tags(corpus, str(root / "tags"))
    train(corpus["bin"], str(root / "save"), POS + ["--source-tags-dir", tags])
    return str(root / "save" / "checkpoint_last.pt"), tags


def test_interactive_refuses_a_pos_model_when_loading(corpus, pos_model):
    """Was: the model loaded, then the first sentence failed asking for the --task the user had passed."""
    ckpt, tags = pos_model
    proc = run([console("fairseq-interactive"), corpus["bin"], "--user-dir", USER_DIR, "--path", ckpt, "--task",
                "translation_source_tags", "--source-tags-dir", tags, "--cpu", "--beam", "2"],
               check=False, input="the0 w1 swap\n")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log[-3000:]
    assert "Type the input sentence" not in log, "refused only at the first sentence"
    assert log.strip().splitlines()[-1].startswith("ValueError: --encoder-output-pattern pos reads the part-of-speech")
    assert "raw sentences (fairseq-interactive, the hub interface) carry no tags" in log


def test_hub_refuses_a_pos_model_when_loading(corpus, pos_model):
    from fairseq_sparse.models.transformer_l0drop import L0DropTransformerModel

    ckpt, tags = pos_model
    with pytest.raises(ValueError, match=r"raw sentences \(fairseq-interactive, the hub interface\) carry no tags"):
        L0DropTransformerModel.from_pretrained(os.path.dirname(ckpt), checkpoint_file=os.path.basename(ckpt),
                                               data_name_or_path=corpus["bin"], source_tags_dir=tags)


def test_pos_model_still_decodes_a_tagged_split(corpus, pos_model):
    """fairseq-generate loads the split (with its tags) before it builds the generator: not refused."""
    ckpt, tags = pos_model
    proc = run([console("fairseq-generate"), corpus["bin"], "--user-dir", USER_DIR, "--path", ckpt, "--task",
                "translation_source_tags", "--source-tags-dir", tags, "--cpu", "--beam", "2", "--gen-subset", "valid",
                "--max-tokens", "2000"] + IN_PROCESS_LOADER)
    log = proc.stdout + proc.stderr
    with open(os.path.join(corpus["raw"], "valid.src")) as f:
        sentences = len(f.read().splitlines())
    assert sum(line.startswith("H-") for line in log.splitlines()) == sentences  # every sentence, with its tags
    pruned = re.search(r"L0Drop sparsity rate [\d.]+% \((\d+) of", log)
    assert pruned and int(pruned.group(1)) > 0  # the tags reached the pattern: it dropped the function words


def test_analysis_tools_read_a_pos_models_tags(corpus, pos_model, tmp_path):
    """Issue 55 item 6: the probe, attention-analysis, head-analysis and sparsity-curve tools called the encoder
    without the batch's tags and ended in a traceback saying raw sentences carry none; the tags travel with the
    split they load (the checkpoint's --task translation_source_tags), so each now runs on the model."""
    ckpt, _ = pos_model
    common = ["--no-progress-bar", "--cpu"]
    tools = {
        "fairseq-sparse-probe": ["--output-dir", str(tmp_path / "probe"), "--max-updates", "2", "--max-tokens", "600",
                                 "--probe-ffn-dim", "16"],
        "fairseq-sparse-attention-analysis": ["--output-dir", str(tmp_path / "att"), "--gen-subset", "valid"],
        "fairseq-sparse-head-analysis": ["--output-dir", str(tmp_path / "heads"), "--max-sentences", "10"],
        "fairseq-sparse-sparsity-curve": ["--checkpoints", ckpt, "--output-prefix", str(tmp_path / "curve"),
                                          "--max-sentences", "10", "--beam", "2"],
    }
    for tool, extra in tools.items():
        path = [] if tool.endswith("sparsity-curve") else ["--path", ckpt]
        proc = run([console(tool), corpus["bin"]] + path + extra + common, check=False)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0 and "Traceback" not in log, (tool, log[-3000:])


def test_universal_pos_tags_are_refused_before_training(corpus, tmp_path):
    """Universal POS tags (DET, NOUN, ...) are none of the Penn Treebank tags the POS pattern drops: it dropped
    nothing, silently."""
    tags = write_tags(corpus, str(tmp_path / "upos"), UNIVERSAL)
    save = tmp_path / "save"
    proc = train(corpus["bin"], str(save), POS + ["--source-tags-dir", tags], check=False)
    assert proc.returncode == 1, proc.log[-3000:]
    last = proc.log.strip().splitlines()[-1]
    assert "look like Universal POS tags" in last and "Penn Treebank" in last, last
    assert "Start iterating over samples" not in proc.log
    assert not save.exists() or os.listdir(save) == []


def test_a_full_disk_leaves_no_half_file_and_ends_in_one_line(corpus, tmp_path, monkeypatch):
    """Issue 55 item 4: prune-heads ended in a raw OSError traceback and export in libtorch's C++ abort (its writer
    terminates the process from its destructor), each leaving its .tmp. Now the disk filling up mid-write is one line,
    exit status 2, and nothing of the outputs is left."""
    import errno

    import torch

    import fairseq_sparse.export as export
    from helpers.faults import full_disk_open

    save, stock = str(tmp_path / "gated"), str(tmp_path / "stock")
    train(corpus["bin"], save, ["--arch", "transformer_head_gates", "--head-gates", "enc",
                                "--criterion", "cross_entropy"])
    train(corpus["bin"], stock, ["--arch", "transformer", "--criterion", "cross_entropy"])

    def full_disk(path):
        return OSError(errno.ENOSPC, "No space left on device", path)

    def persistent_save(obj, f):
        f.write(b"half a checkpoint")
        raise full_disk(f.name)

    monkeypatch.setattr(torch, "save", persistent_save)  # prune-heads writes with torch.save
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"enc": [[0, 1, 1, 1], [1, 1, 1, 1]]}))
    out = tmp_path / "pruned.pt"
    proc = run([console("fairseq-sparse-prune-heads"), "--path", f"{save}/checkpoint_last.pt", "--head-mask",
                str(mask), "--output", str(out)], check=False)
    assert proc.returncode == 2 and "No space left on device" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["gated", "mask.json", "stock"]

    monkeypatch.setattr(export, "open", full_disk_open(100), raising=False)
    artefact = tmp_path / "model.ts"
    proc = run([console("fairseq-sparse-export"), "--data", corpus["bin"], "--path", f"{stock}/checkpoint_last.pt",
                "--output", str(artefact)], check=False)
    assert proc.returncode == 2 and "No space left on device" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["gated", "mask.json", "stock"]

    # issue 62 item 1: with --overwrite onto an earlier run's outputs, a full disk deleted them; now they stay
    earlier = {out: b"an earlier checkpoint", tmp_path / "pruned.kept_heads.json": b"{}", artefact: b"an earlier artefact"}
    for path, data in earlier.items():
        path.write_bytes(data)
    proc = run([console("fairseq-sparse-export"), "--data", corpus["bin"], "--path", f"{stock}/checkpoint_last.pt",
                "--output", str(artefact), "--overwrite"], check=False)
    assert proc.returncode == 2 and "left as they were" in proc.stderr and "Traceback" not in proc.stderr
    monkeypatch.undo()
    monkeypatch.setattr(torch, "save", persistent_save)  # prune-heads writes with torch.save
    prune = [console("fairseq-sparse-prune-heads"), "--path", f"{save}/checkpoint_last.pt", "--head-mask", str(mask),
             "--output", str(out), "--overwrite"]
    proc = run(prune, check=False)
    assert proc.returncode == 2 and "No space left on device" in proc.stderr and "Traceback" not in proc.stderr
    monkeypatch.undo()
    from fairseq_sparse.cli import common

    def json_on_a_full_disk(path, obj):  # the checkpoint written, its kept-heads JSON not: neither replaces its own
        raise full_disk(path)

    monkeypatch.setattr(common, "write_json", json_on_a_full_disk)
    proc = run(prune, check=False)
    assert proc.returncode == 2 and "No space left on device" in proc.stderr and "Traceback" not in proc.stderr
    assert {p: p.read_bytes() for p in earlier} == earlier
    assert sorted(os.listdir(tmp_path)) == sorted(["gated", "mask.json", "stock"] + [p.name for p in earlier])
