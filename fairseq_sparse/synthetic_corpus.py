"""A small synthetic parallel corpus for offline demos and tests (no download).

The source language mixes content words (``w17``) with function words (``the3``) that carry no
information about the target; the target is the content words translated word by word (``w17 ->
T17``), with adjacent content pairs swapped after a marker word, so attention must move. A model that
drops the encodings of function words loses nothing, which is what L0Drop should find (Zhang, Titov & Sennrich 2021,
Sec. 6: function words and punctuation get pruned first).

    python -m fairseq_sparse.synthetic_corpus OUT_DIR [--train 20000 --valid 300 --test 300]
        [--min-len 4 --max-len 20] [--long-test 400]    # also test-long.{src,tgt} of ~400 source tokens
"""
import argparse
import os
import random

N_CONTENT = 300
N_FUNCTION = 12
SWAP = "swap"


def make_pair(rng: random.Random, n_content: int, function_rate: float = 0.5, vocabulary: int = N_CONTENT):
    """One (source, target) pair with ``n_content`` content words drawn from ``vocabulary`` of them."""
    src, tgt = [], []
    i = 0
    while i < n_content:
        while rng.random() < function_rate:
            src.append(f"the{rng.randrange(N_FUNCTION)}")
        if i + 1 < n_content and rng.random() < 0.15:
            a, b = rng.randrange(vocabulary), rng.randrange(vocabulary)
            src += [SWAP, f"w{a}", f"w{b}"]
            tgt += [f"T{b}", f"T{a}"]
            i += 2
        else:
            a = rng.randrange(vocabulary)
            src.append(f"w{a}")
            tgt.append(f"T{a}")
            i += 1
    return " ".join(src), " ".join(tgt)


def write_split(path_prefix, pairs):
    with open(path_prefix + ".src", "w") as fs, open(path_prefix + ".tgt", "w") as ft:
        for s, t in pairs:
            fs.write(s + "\n")
            ft.write(t + "\n")


def gold_alignment(src_line, tgt_line):
    """The true word alignment of a sentence pair: content word wN translates to TN in order, except after
    the marker ``swap`` whose two content words come out swapped; function words are unaligned. Returns
    (sure, possible) 0-based (source, target) links: sure for content words, the marker a possible link
    of both swapped words."""
    src, tgt = src_line.split(), tgt_line.split()
    sure, possible, i, j = [], [], 0, 0
    while i < len(src):
        if src[i] == "swap":
            sure += [(i + 2, j), (i + 1, j + 1)]
            possible += [(i, j), (i, j + 1)]
            i, j = i + 3, j + 2
        elif src[i].startswith("w"):
            sure.append((i, j))
            i, j = i + 1, j + 1
        else:
            i += 1
    if j != len(tgt) or any("T" + src[a][1:] != tgt[b] for a, b in sure):
        raise ValueError(f"not a pair of this corpus: {src_line!r} -> {tgt_line!r}")
    return sure, possible


def pharaoh(sure, possible):
    """One line of a Pharaoh gold file: 'i-j' sure links and 'i?j' possible links."""
    return " ".join([f"{a}-{b}" for a, b in sure] + [f"{a}?{b}" for a, b in possible])


def make_corpus(out_dir, train=20000, valid=300, test=300, min_len=4, max_len=20, long_test=0, seed=1,
                vocabulary=N_CONTENT):
    """Writes {train,valid,test}.{src,tgt} (and test-long.* with ~``long_test`` source tokens), and the gold
    word alignments of valid and test as {valid,test}.align (Pharaoh format, for
    fairseq-sparse-attention-analysis); ``vocabulary``: the number of content words (fewer are learnt in fewer updates)."""
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(seed)
    for split, n in (("train", train), ("valid", valid), ("test", test)):
        pairs = [make_pair(rng, rng.randint(min_len, max_len), vocabulary=vocabulary) for _ in range(n)]
        write_split(os.path.join(out_dir, split), pairs)
        if split != "train":
            with open(os.path.join(out_dir, split + ".align"), "w") as f:
                for s, t in pairs:
                    f.write(pharaoh(*gold_alignment(s, t)) + "\n")
    if long_test:
        # about 1.6 source tokens per content word at function_rate 0.5 (+ swap markers)
        write_split(os.path.join(out_dir, "test-long"),
                    [make_pair(rng, int(long_test / 1.75), vocabulary=vocabulary) for _ in range(test)])
    return out_dir


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--train", type=int, default=20000)
    p.add_argument("--valid", type=int, default=300)
    p.add_argument("--test", type=int, default=300)
    p.add_argument("--min-len", type=int, default=4, help="fewest content words per sentence")
    p.add_argument("--max-len", type=int, default=20, help="most content words per sentence")
    p.add_argument("--long-test", type=int, default=0, help="also write test-long.* with about this many source tokens")
    p.add_argument("--vocabulary", type=int, default=N_CONTENT, help="number of content words")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--overwrite", action="store_true", help="replace the corpus files OUT_DIR holds already")
    a = p.parse_args()
    present = sorted(f for f in (os.listdir(a.out_dir) if os.path.isdir(a.out_dir) else [])
                     if f.split(".")[0] in ("train", "valid", "test", "test-long"))
    if present and not a.overwrite:
        p.error(f"{a.out_dir} holds a corpus already ({', '.join(present[:4])}{', ...' if len(present) > 4 else ''}): "
                "pass --overwrite to replace it, or another folder")
    make_corpus(a.out_dir, a.train, a.valid, a.test, a.min_len, a.max_len, a.long_test, a.seed, a.vocabulary)


if __name__ == "__main__":
    main()
