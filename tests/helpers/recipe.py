"""fairseq-sparse-recipe: its console script, the former entry point examples/recipe.py, the tiny settings and a run
of it (the raw corpus it reads: the raw_corpus fixture of conftest.py)."""
import os
import sys

from conftest import REPO, console, run


RECIPE = [console("fairseq-sparse-recipe")]
SHIM = [sys.executable, os.path.join(REPO, "examples", "recipe.py")]  # the former entry point, kept working
TINY = ["--layers", "2", "--embed-dim", "32", "--ffn-dim", "64", "--heads", "2", "--bpe-merges", "100",
        "--baseline-updates", "40", "--warmup-updates", "10", "--finetune-updates", "20", "--curve-updates", "10",
        "--curve-targets", "0.3,0.6", "--beam", "2", "--max-tokens", "2000", "--baseline-patience", "0"]


def recipe(corpus, work, extra=(), check=True, langs=("en", "de")):
    return run(RECIPE + ["--corpus", str(corpus), "-s", langs[0], "-t", langs[1], "--work-dir", str(work)] + TINY
               + list(extra), check=check)
