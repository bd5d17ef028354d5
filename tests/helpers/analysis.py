"""The analysis tools' tests: head-analysis thresholds, gold alignment files (one written by hand, one from the
synthetic corpus's true alignment) and the tools' TSV output."""
import csv
import os
import types


SETTINGS = types.SimpleNamespace(positional_threshold=0.9, syntactic_margin=0.10, rare_threshold=0.5, rare_margin=0.10)


def write(path, lines):
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    return str(path)


def synthetic_gold(src_line, tgt_line):
    from fairseq_sparse.synthetic_corpus import gold_alignment

    return gold_alignment(src_line, tgt_line)


def write_gold(corpus, directory, two_files=False):
    with open(os.path.join(corpus["raw"], "test.src")) as f:
        src = f.read().splitlines()
    with open(os.path.join(corpus["raw"], "test.tgt")) as f:
        tgt = f.read().splitlines()
    golds = [synthetic_gold(s, t) for s, t in zip(src, tgt)]
    if two_files:
        return (write(os.path.join(directory, "sure.align"), [" ".join(f"{a}-{b}" for a, b in s) for s, _ in golds]),
                write(os.path.join(directory, "possible.align"), [" ".join(f"{a}-{b}" for a, b in p) for _, p in golds]))
    return write(os.path.join(directory, "gold.align"),
                 [" ".join([f"{a}-{b}" for a, b in s] + [f"{a}?{b}" for a, b in p]) for s, p in golds]), src, tgt


def read_tsv(path):
    with open(path) as f:
        return list(csv.DictReader(f, delimiter="\t"))
