"""The ``gap_analysis`` step: where each source-pruning model (L0Drop, the rule-based patterns, and their *_scratch
forms) loses against its control at equal updates, from decodings and forward passes only (no training): the gap
by segment type (--segment-types), by source length and by the share of reference words copied from the source,
brevity, chrF, repeated trigrams, the recall of reference words copied verbatim from
the source split by whether the model pruned their pieces, and train against valid NLL of both models
(under-fitting or generalisation). One JSON per model in WORK/gap_analysis/, and a section of the report."""
import csv
import os
import re
import shutil

from . import commands
from .budget import checkpoints_by_updates
from .methods import BY_NAME, METHODS, Method
from .workdir import checkpoint_identity, load_json, save_json
from ..analysis import gap


def analysed(a, wd, finished):
    """The finished models that prune source states (an L0Drop architecture) and have a control."""
    return [m for m in METHODS if m.name in finished and m.arch == "transformer_l0drop" and m.control
            and "--head-gates" not in m.flags(a)]


def control_decoding(dec, m: Method):
    """(key, checkpoint) of M's control at M's updates: the baseline's checkpoint at them for a model trained from
    scratch (decoded from --scratch-budget-points' checkpoints), the control's own decoding for a fine-tuning."""
    control = BY_NAME[m.control]
    if m.start is None:
        updates = checkpoint_identity(dec.wd.path(m.name, "checkpoint_last.pt"))["updates"]
        theirs = checkpoints_by_updates(dec.wd, control.name)
        if updates not in theirs:
            return None
        return dec.at_updates(control, updates, theirs)
    return control.name, dec.checkpoint(control)


def gates(a, wd, data, name, checkpoint):
    """{sentence id: (pieces, pruned flags)} of the test split under CHECKPOINT (fairseq-sparse-l0drop-gates)."""
    out = f"gap_analysis/{name}.gates.tsv"
    cmd = [commands.tool("fairseq-sparse-l0drop-gates"), data, "--user-dir", commands.USER_DIR, "--path", checkpoint,
           "--gen-subset", "test", "--gates-output", out, "--overwrite", "--batch-size", str(a.batch_size)] + (
        commands.task_flags(name) + commands.lang_flags(a) + commands.cpu_flag(a) + commands.position_flags(a))
    wd.produced(out, [checkpoint], lambda: wd.run("gap_analysis", cmd, f"gates.{name}.log"), [wd.shown(cmd)])
    by_id = {}
    with open(wd.path(out), encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            pieces, pruned = by_id.setdefault(int(row["id"]), ([], []))
            pieces.append(row["token"])
            pruned.append(row["pruned"] == "1")
    return by_id


#: training pairs (a seeded random sample) on which gap_analysis measures how well a model fits its training data
TRAIN_SAMPLE = 1000


def train_sample_bin(a, wd, data):
    """WORK/gap_analysis/nll-bin: the data-bin's dictionaries and valid split (links) and a split train_sample of
    TRAIN_SAMPLE training pairs drawn at random (seed 1), binarised as fairseq stores them."""
    import random

    from fairseq.data import Dictionary, data_utils, indexed_dataset

    out, pair = wd.path("gap_analysis", "nll-bin"), f"{a.source_lang}-{a.target_lang}"
    if os.path.isdir(out):
        return out
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name in os.listdir(data):
        if name.startswith("dict.") or name.startswith("valid."):
            os.symlink(os.path.join(os.path.abspath(data), name), os.path.join(tmp, name))
    for lang in (a.source_lang, a.target_lang):
        d = Dictionary.load(os.path.join(data, f"dict.{lang}.txt"))
        train = data_utils.load_indexed_dataset(os.path.join(data, f"train.{pair}.{lang}"), d)
        ids = sorted(random.Random(1).sample(range(len(train)), min(TRAIN_SAMPLE, len(train))))
        prefix = os.path.join(tmp, f"train_sample.{pair}.{lang}")
        builder = indexed_dataset.make_builder(prefix + ".bin", impl="mmap", vocab_size=len(d))
        for i in ids:
            builder.add_item(train[i])
        builder.finalize(prefix + ".idx")
    os.replace(tmp, out)
    return out


def nll(a, wd, data, key, checkpoint):
    """{subset: loss and NLL per target token (base 2)} of CHECKPOINT on a random sample of the training pairs and on
    the valid split (fairseq-validate, teacher forced, dropout off): a model that fits its training data as well as
    its control but generalises worse differs on valid only; one that under-fits differs on both."""
    def compute():
        sample_bin = train_sample_bin(a, wd, data)
        cmd = ([commands.tool("fairseq-validate"), sample_bin, "--user-dir", commands.USER_DIR, "--path", checkpoint,
                "--valid-subset", "train_sample,valid", "--max-tokens", str(a.max_tokens), "--num-workers", "0"]
               + commands.task_flags(key.split("@")[0]) + commands.lang_flags(a) + commands.cpu_flag(a)
               + commands.position_flags(a) + ["--skip-invalid-size-inputs-valid-test"])
        out = wd.run("gap_analysis", cmd, f"validate.{key}.log")
        found = {}
        for subset in ("train_sample", "valid"):
            m = re.search(rf"valid on '{subset}' subset \| loss ([\d.]+) \| nll_loss ([\d.]+)", out)
            if m is None:
                raise RuntimeError(f"fairseq-validate printed no loss for {subset} (log validate.{key}.log)")
            found[subset] = {"loss": float(m.group(1)), "nll_loss": float(m.group(2))}
        return found
    return wd.cached(f"nll.{key}", [checkpoint], compute, {"max_tokens": a.max_tokens, "train_sample": TRAIN_SAMPLE})


def segment_types(a, n):
    """One label per test sentence from --segment-types (a trailing number dropped: para0, para1 -> para), or
    None without it."""
    if not a.segment_types:
        return None
    with open(a.segment_types, encoding="utf-8") as f:
        labels = [re.sub(r"\d+$", "", line.strip().split("\t")[-1]) for line in f if line.strip()]
    if len(labels) != n:
        raise ValueError(f"--segment-types {a.segment_types}: {len(labels)} labels for {n} test sentences")
    return labels


def analyse(a, dec, m: Method):
    """One model's analysis against its control (None where the control has no decoding at M's updates)."""
    pair = control_decoding(dec, m)
    if pair is None:
        return None
    return {"model": m.name, **compare(a, dec, (m.name, dec.checkpoint(m)), pair)}


def compare(a, dec, mine, theirs):
    """The analysis of the source-pruning model MINE against THEIRS, each (key, checkpoint relative to WORK): both
    decoded on the test split (cached), the pruned pieces of MINE's gates, the NLL of both."""
    wd, tokenize = dec.wd, "13a" if a.tokenizer == "moses" else "none"
    ours, other = dec.generate(*mine), dec.generate(*theirs)
    refs, hyps, ctrl = ours["references"], [h for h, _ in ours["hypotheses"]], [h for h, _ in other["hypotheses"]]
    os.makedirs(wd.path("gap_analysis"), exist_ok=True)
    by_id = gates(a, wd, dec.data, *mine)
    ids = sorted(by_id)
    if len(ids) != len(refs):
        raise ValueError(f"{mine[0]}: {len(ids)} sentences with gates, {len(refs)} decoded")
    sep = "@@" if a.bpe_merges else ""
    sources = [gap.source_words(by_id[i][0][:-1], by_id[i][1][:-1], sep) for i in ids]  # </s> left out
    lengths = [gap.length_bucket(len(by_id[i][0]) - 1) for i in ids]
    types = segment_types(a, len(refs))
    return {"control": theirs[0], "checkpoint": mine[1], "control_checkpoint": theirs[1],
            "overall": gap.by_group(["all"] * len(refs), ctrl, hyps, refs, tokenize)["all"],
            "brevity": {"method": gap.brevity(hyps, refs, tokenize), "control": gap.brevity(ctrl, refs, tokenize)},
            "by_length": gap.by_group(lengths, ctrl, hyps, refs, tokenize),
            "by_segment_type": gap.by_group(types, ctrl, hyps, refs, tokenize) if types else None,
            "by_copy_share": gap.by_group([gap.copy_share_bucket(w, r) for w, r in zip(sources, refs)], ctrl, hyps,
                                          refs, tokenize),
            "chrf": {"method": gap.chrf(hyps, refs), "control": gap.chrf(ctrl, refs)},
            "repeated_trigrams": {"method": gap.repeated_ngrams(hyps), "control": gap.repeated_ngrams(ctrl)},
            "copy_recall": {"method": gap.copy_recall(sources, refs, hyps),
                            "control": gap.copy_recall(sources, refs, ctrl)},
            # the source's pieces pruned, end-of-sentence left out (no rule or gate prunes it); fairseq-generate's
            # printed rate counts it among the states, so it reads a little lower
            "sparsity": round(sum(sum(by_id[i][1][:-1]) for i in ids) / sum(len(by_id[i][1]) - 1 for i in ids), 4),
            "nll": {"method": nll(a, wd, dec.data, *mine), "control": nll(a, wd, dec.data, *theirs)}}


def gap_analysis(a, dec, finished):
    """Every analysed model's result, in WORK/gap_analysis/NAME.json (the step) or read back (the report)."""
    out = {}
    for m in analysed(a, dec.wd, finished):
        r = analyse(a, dec, m)
        if r is not None:
            save_json(dec.wd.path("gap_analysis", f"{m.name}.json"), r)
            out[m.name] = r
    return out


def kept_results(wd):
    """The gap analyses a gap_analysis step left in WORK/gap_analysis/ ({} where none)."""
    folder = wd.path("gap_analysis")
    if not os.path.isdir(folder):
        return {}
    return {f[:-len(".json")]: load_json(os.path.join(folder, f)) for f in sorted(os.listdir(folder))
            if f.endswith(".json")}
