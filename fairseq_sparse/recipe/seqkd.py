"""Sequence-level knowledge distillation (Kim & Rush 2016 Sec. 3.2): the baseline's beam search output on the
training sources becomes the training target of every fine-tuning (``--seq-kd``). The decoding runs in
shards, each kept once written, so an interrupted run goes on where it stopped."""
import os
import re
import shutil

from . import commands
from .decoding import generate_lines
from .options import SPLITS

SEQKD_BEAM = 5


def seqkd_data(wd):
    return wd.path("data-bin-seqkd")


def decode_shard(a, wd, data, shard):
    """seqkd/shard<i>.tsv: id, source and the teacher's hypothesis (BPE pieces) of every training sentence of
    shard i (fairseq-generate's batches i, i + N, ...)."""
    out = wd.run("distill_data", commands.generate_train_shard(a, data, SEQKD_BEAM, shard, a.seq_kd_shards),
                 f"seqkd.shard{shard}.log")
    lines = generate_lines(out)
    sources = {i: f[0] if f else "" for i, f in lines["S"].items()}
    hyps = {i: f[1] if len(f) > 1 else "" for i, f in lines["H"].items()}
    path = wd.path("seqkd", f"shard{shard}.tsv")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(f"{i}\t{sources[i]}\t{hyps[i]}\n" for i in sorted(hyps))
    os.replace(path + ".tmp", path)


def distill_data(a, wd, data):
    """WORK/data-bin-seqkd: the training split with the baseline's beam-5 translations as targets (the data-bin's
    own dictionaries), valid and test as they are. Shards and data are made again only when the baseline changed; the
    shards of another --seq-kd-shards and the .tmp of a shard write cut off are removed (issue 62)."""
    os.makedirs(wd.path("seqkd"), exist_ok=True)
    shards = [wd.shown(commands.generate_train_shard(a, data, SEQKD_BEAM, shard, a.seq_kd_shards))
              for shard in range(a.seq_kd_shards)]
    for shard, cmd in enumerate(shards):  # each shard keyed by its command (the shard count and decoding settings)
        wd.produced(f"seqkd/shard{shard}.tsv", ["baseline/checkpoint_best.pt"], lambda: decode_shard(a, wd, data, shard),
                    [cmd])
    wd.produced("data-bin-seqkd", ["baseline/checkpoint_best.pt"], lambda: binarise(a, wd, data), shards)
    files, stamps = stale_shards(a, wd)
    for path in files + stamps:
        os.remove(path)
    if files:
        print(f"  distill_data: removed {len(files)} files of another --seq-kd-shards or of a write cut off: "
              f"{', '.join(os.path.relpath(p, wd.work) for p in files)}")


#: the names the recipe gives the shards it decodes (seqkd/shard<i>.tsv) and the files it writes them through
SHARD_FILE = re.compile(r"shard(0|[1-9][0-9]*)\.tsv(\.tmp)?")
SHARD_STAMP = re.compile(r"seqkd_shard(0|[1-9][0-9]*)\.tsv\.inputs\.json")


def stale_shards(a, wd):
    """(files, stamps): what WORK/seqkd holds of the shards this configuration (--seq-kd-shards N) does not read,
    shard<k>.tsv for k >= N (decoded by a run with more shards) and every shard's .tmp (a write cut off); and the
    recipe's records (WORK/results) of the shards k >= N. Only the names the recipe gives them, regular files, and
    none given as an input of the run (a path among the recipe's options) whatever its name: nothing of the user's."""
    inputs = [os.path.realpath(v) for k, v in sorted(vars(a).items())
              if k != "work_dir" and isinstance(v, str) and v and os.path.exists(v)]

    def ours(path):
        real = os.path.realpath(path)
        return (os.path.isfile(path) and not os.path.islink(path)
                and not any(real == p or real.startswith(p + os.sep) for p in inputs))

    def names(folder, pattern):
        if not os.path.isdir(folder):
            return []
        return [(m, os.path.join(folder, m.group(0))) for m in map(pattern.fullmatch, sorted(os.listdir(folder))) if m]

    files = [p for m, p in names(wd.path("seqkd"), SHARD_FILE)
             if (m.group(2) or int(m.group(1)) >= a.seq_kd_shards) and ours(p)]
    stamps = [p for m, p in names(wd.path("results"), SHARD_STAMP) if int(m.group(1)) >= a.seq_kd_shards and ours(p)]
    return files, stamps


def binarise(a, wd, data):
    """The shards' sources and hypotheses, in sentence order, binarised with the data-bin's dictionaries."""
    rows = []
    for shard in range(a.seq_kd_shards):
        with open(wd.path("seqkd", f"shard{shard}.tsv"), encoding="utf-8") as f:
            rows += [line.rstrip("\n").split("\t") for line in f]
    rows.sort(key=lambda r: int(r[0]))
    for column, lang in ((1, a.source_lang), (2, a.target_lang)):
        with open(wd.path("seqkd", f"train.{lang}"), "w", encoding="utf-8") as f:
            f.writelines(r[column] + "\n" for r in rows)
    print(f"  distill_data: {len(rows)} training sentences translated by the baseline (beam {SEQKD_BEAM})")
    tmp = seqkd_data(wd) + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    wd.run("distill_data", [commands.tool("fairseq-preprocess")] + commands.lang_flags(a) + [
        "--trainpref", "seqkd/train", "--destdir", os.path.basename(tmp), "--workers", "2",
        "--srcdict", os.path.join(data, f"dict.{a.source_lang}.txt"),
        "--tgtdict", os.path.join(data, f"dict.{a.target_lang}.txt")], "seqkd.preprocess.log")
    for split in SPLITS[1:]:  # valid and test: the references, unchanged
        for lang in (a.source_lang, a.target_lang):
            for ext in ("bin", "idx"):
                name = f"{split}.{a.source_lang}-{a.target_lang}.{lang}.{ext}"
                shutil.copy(os.path.join(data, name), os.path.join(tmp, name))
    shutil.rmtree(seqkd_data(wd), ignore_errors=True)
    os.replace(tmp, seqkd_data(wd))
