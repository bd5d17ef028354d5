"""fairseq-sparse-recipe: its console script and its module (how the demo runs it), the tiny settings and a run
of it (the raw corpus it reads: the raw_corpus fixture of conftest.py)."""
import os
import random
import sys

from conftest import REPO, console, run


RECIPE = [console("fairseq-sparse-recipe")]
MODULE = [sys.executable, "-m", "fairseq_sparse.recipe.main"]  # the same command, as examples/demo.py runs it
TINY = ["--layers", "2", "--embed-dim", "32", "--ffn-dim", "64", "--heads", "2", "--bpe-merges", "100",
        "--baseline-updates", "40", "--warmup-updates", "10", "--finetune-updates", "20", "--curve-updates", "10",
        "--curve-targets", "0.3,0.6", "--beam", "2", "--max-tokens", "2000", "--baseline-patience", "0"]


def recipe(corpus, work, extra=(), check=True, langs=("en", "de")):
    return run(RECIPE + ["--corpus", str(corpus), "-s", langs[0], "-t", langs[1], "--work-dir", str(work)] + TINY
               + list(extra), check=check)


WORDS = ("the", "cat", "dog", "sat", "on", "mat", "a", "big", "small", "house", "river", "green", "tree", "runs",
         "quickly", "under", "bridge", "old", "man", "sees", "bird", "flies", "over", "hill", "child", "reads", "book")


def document(rng, words):
    """Sentences of 4-9 words; its summary: the first sentence's first four words."""
    sentences, n = [], 0
    while n < words:
        k = rng.randint(4, 9)
        sentences.append(" ".join(rng.choice(WORDS) for _ in range(k)).capitalize() + ".")
        n += k
    return " ".join(sentences), " ".join(sentences[0].rstrip(".").split()[:4]) + "."


def bart_corpus(root):
    """A tiny English summarisation corpus in fairseq's BART layout ({split}.source/.target) under ROOT."""
    rng = random.Random(0)
    sizes = {"train": 160, "valid": 12, "test": 10}
    for split, n in sizes.items():
        # short documents and long ones (60-90 words: more than 40 tokens after Moses and BPE)
        pairs = [document(rng, rng.randint(60, 90) if i % 3 == 0 else rng.randint(5, 15)) for i in range(n)]
        (root / f"{split}.source").write_text("".join(d + "\n" for d, _ in pairs))
        (root / f"{split}.target").write_text("".join(s + "\n" for _, s in pairs))
    return root
