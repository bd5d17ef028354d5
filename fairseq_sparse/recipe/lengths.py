"""Long inputs: sources cut to ``--truncate-source`` tokens while the corpus is prepared (counted per split),
the models' positions read from the prepared data, and the rule that nothing is dropped or skipped: every limit
a pair could exceed (positions, --max-tokens, a brought baseline's positions) is checked before work, and every
decoding of the test split is checked to hold a hypothesis for each of its documents."""
import os
import shutil

from .options import DEFAULT_POSITIONS, SPLITS, fail
from .workdir import load_json, save_json

TRUNCATION = "truncation.json"


def cut_file(source, out, n):
    """Count the documents of the text file SOURCE longer than N tokens (fairseq's whitespace split) and, with
    OUT, write each cut to its first N tokens there. {documents, truncated, longest, tokens_cut}; N 0: no cut."""
    stats = {"documents": 0, "truncated": 0, "longest": 0, "tokens_cut": 0}
    g = open(out + ".tmp", "w", encoding="utf-8") if out else None
    with open(source, encoding="utf-8") as f:
        for line in f:
            tokens = line.split()
            stats["documents"] += 1
            stats["longest"] = max(stats["longest"], len(tokens))
            if n and len(tokens) > n:
                stats["truncated"] += 1
                stats["tokens_cut"] += len(tokens) - n
            if g:
                g.write(" ".join(tokens[:n] if n else tokens) + "\n")
    if g:
        g.close()
        os.replace(out + ".tmp", out)
    return stats


def truncate_sources(a, wd, prefix):
    """WORK/truncation.json: per split, the source documents, how many were cut to --truncate-source tokens
    (after tokenisation and BPE), the longest before, the tokens cut. With truncation, tok/SPLIT.trunc.{SRC,TGT}
    (the targets as they are) are what is binarised: the new prefixes; without, PREFIX as it is."""
    n, counts = a.truncate_source, {}
    for split in SPLITS:
        source = wd.path(f"{prefix[split]}.{a.source_lang}")
        out = wd.path("tok", f"{split}.trunc") if n else None
        counts[split] = cut_file(source, out and f"{out}.{a.source_lang}", n)
        if n:
            shutil.copyfile(wd.path(f"{prefix[split]}.{a.target_lang}"), f"{out}.{a.target_lang}")
    if n:
        first = prefix["train"]
        shown = ("CORPUS/SPLIT" if os.path.isabs(first) else
                 os.path.join(os.path.dirname(first), "SPLIT" + os.path.basename(first)[len("train"):]))
        wd.record("prepare", f"awk -v n={n} '{{NF = NF > n ? n : NF}} 1' < {shown}.{a.source_lang} "
                             f"> tok/SPLIT.trunc.{a.source_lang}   # counts: truncation.json")
    save_json(wd.path(TRUNCATION), {"tokens": n, "splits": counts})
    return {split: f"tok/{split}.trunc" for split in SPLITS} if n else prefix


def data_lengths(a, data, splits=SPLITS):
    """{split: {sentences, source, target, pair}}: the split's size and its longest source, target and pair
    (max of the two, what --max-tokens bounds) in the data-bin, in tokens with EOS, as fairseq counts them."""
    import numpy as np
    from fairseq.data import data_utils

    out = {}
    for split in splits:
        sizes = []
        for lang in (a.source_lang, a.target_lang):
            prefix = os.path.join(data, f"{split}.{a.source_lang}-{a.target_lang}.{lang}")
            dataset = data_utils.load_indexed_dataset(prefix, None)
            if dataset is None:
                fail(f"data-bin {data} lacks {os.path.basename(prefix)}.idx/.bin")
            sizes.append(np.array(dataset.sizes, dtype=np.int64))  # a copy: the mmap closes with the dataset
        src, tgt = sizes
        if len(src) != len(tgt):
            fail(f"data-bin {data}: the {split} split has {len(src)} sources but {len(tgt)} targets")
        out[split] = {"sentences": len(src), "source": _longest(src), "target": _longest(tgt),
                      "pair": _longest(np.maximum(src, tgt))}
    return out


def _longest(sizes):
    return int(sizes.max()) if len(sizes) else 0


def positions(truncate, lengths):
    """(max source positions, max target positions): --truncate-source + 1 (EOS), or the longest source; the
    longest target; never below fairseq's default 1024 but where truncation sets them."""
    source = max(s["source"] for s in lengths.values())
    target = max(s["target"] for s in lengths.values())
    return (truncate + 1 if truncate else max(DEFAULT_POSITIONS, source)), max(DEFAULT_POSITIONS, target)


def fit(a, wd, data):
    """Set a.max_source_positions and a.max_target_positions from the prepared data, and refuse before work
    whatever would make fairseq drop a pair or stop on (or skip) a test document. Returns what the report states."""
    lengths = data_lengths(a, data)
    batches = -(-lengths["train"]["sentences"] // a.batch_size)  # at least this many: each holds <= --batch-size
    if a.seq_kd and a.seq_kd_shards > batches:  # a shard without a batch would end the decoding in an error
        fail(f"--seq-kd-shards {a.seq_kd_shards} is more than the training split's {batches} decoding batches "
             f"({lengths['train']['sentences']} sentences, --batch-size {a.batch_size}): use at most {batches}")
    a.max_source_positions, a.max_target_positions = positions(a.truncate_source, lengths)
    limits = {"source": a.max_source_positions, "target": a.max_target_positions}
    decoded = dict(limits)  # the test split: also what a brought baseline (decoded as it is) can hold
    if a.baseline_checkpoint:
        from ..checkpoint_safety import model_options, read_state

        options = model_options(read_state(a.baseline_checkpoint))
        decoded = {side: min(limit, options.get(f"max_{side}_positions") or DEFAULT_POSITIONS)
                   for side, limit in limits.items()}
    for split, s in lengths.items():
        for side, limit in (decoded if split == "test" else limits).items():
            if s[side] > limit:
                fail(f"the longest {split} {side} has {s[side]} tokens (with EOS), more than the {limit} positions "
                     f"of the {'brought baseline' if limit < limits[side] else 'models'}: fairseq would "
                     f"{'stop on' if split == 'test' else 'drop'} it; cut the sources (--truncate-source)")
        if split != "test" and s["pair"] > a.max_tokens:
            fail(f"the longest {split} pair has {s['pair']} tokens, more than --max-tokens {a.max_tokens} (one "
                 "batch): raise --max-tokens or cut the sources (--truncate-source)")
    _check_speed_lengths(a)
    return {"truncation": load_json(wd.path(TRUNCATION)), "positions": [a.max_source_positions, a.max_target_positions],
            "longest": {split: {k: s[k] for k in ("source", "target")} for split, s in lengths.items()}}


def _check_speed_lengths(a):
    """The speed step decodes the l0drop checkpoint on inputs of --speed-lengths tokens: they must fit its positions."""
    longest = max(int(n) for n in a.speed_lengths.split(","))
    if "speed" in a.steps.split(",") and longest >= a.max_source_positions:
        fail(f"--speed-lengths {a.speed_lengths}: the models hold {a.max_source_positions - 1} source tokens and EOS "
             f"({'--truncate-source' if a.truncate_source else 'the longest source'}): give lengths up to "
             f"{a.max_source_positions - 1}")


def check_decoded(a, data, key, lines):
    """Every test document has a hypothesis in fairseq-generate's output LINES (decoding.generate_lines)."""
    expected = data_lengths(a, data, ("test",))["test"]["sentences"]
    decoded = sorted(lines["D"])
    if decoded != list(range(expected)):
        fail(f"{key}: fairseq-generate decoded {len(decoded)} of the {expected} test documents (log: "
             f"WORK/logs/generate.{key}.log); every test document must be decoded")
