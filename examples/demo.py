"""The offline demo (``scripts/demo.sh``): every method family of the five papers on one synthetic corpus, in
minutes on a 2-core CPU, through the recipe (``fairseq-sparse-recipe``: the same steps and report as on a real corpus).

    scripts/demo.sh            # = .venv/bin/python examples/demo.py            -> demo_out/REPORT.md
    scripts/demo.sh --full     # larger corpus, model and budgets, every step   -> demo_out_full/REPORT.md

1. a synthetic corpus (``fairseq_sparse.synthetic_corpus``: content words translate word by word, function
   words carry nothing, a marker swaps the next two words), binarised by fairseq-preprocess;
2. a stock transformer and the simplified decoder (Yang et al. 2020), trained side by side;
3. from that one baseline: L0Drop (target 0.4: about the share of function words) and one run through
   the targets 0.2 / 0.4 / 0.6, head gates in all attention types (target 0.25), the minimum-entropy
   attention regulariser, each against an equal-updates control; head importance and physical head
   pruning (no training);
4. the speed benchmarks on the trained models' shapes (L0Drop on 25- and 400-token inputs against the
   unpruned and the stock model, pruned heads, the simplified decoder), each side by side in one run;
5. one report: the table, the commands and the plots.

Two recipe processes run at once (one torch thread each), so the two cores are used by two jobs rather
than one job's threads; each prints fairseq-train's progress lines with its step's name.

Deterministic: the corpus has a fixed seed, every fairseq-train the recipe's --seed (--seed N here, default 1;
give each seed its own --work-dir), every child runs on one thread (OMP_NUM_THREADS, MKL_NUM_THREADS) with a
fixed PYTHONHASHSEED, and every step but the speed benchmarks on torch's, MKL's and oneDNN's AVX2 kernels (on
an AVX-512 CPU torch would otherwise pick kernels that round differently). A fresh run prints the same scores,
sparsities and parameter counts; the speed numbers depend on the machine and its load.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

#: recipe options of both sizes
COMMON = {"heads": 4, "max-tokens": 4096, "validate-interval": 4, "finetune-lr": "1e-3", "l0drop-target": 0.4,
          "heads-target": 0.25, "curve-targets": "0.2,0.4,0.6", "beam": 4, "speed-repeats": 5}
#: (options of make_corpus, recipe options) of the default demo and of --full
SIZES = {
    "demo": (dict(train=20000, valid=300, test=300, min_len=3, max_len=15, vocabulary=100),
             {"layers": 2, "embed-dim": 64, "ffn-dim": 256, "dropout": 0, "lr": "5e-3", "warmup-updates": 100,
              "baseline-updates": 1000, "finetune-updates": 300, "target-warmup-updates": 80, "curve-updates": 100,
              "importance-sentences": 100}),
    "full": (dict(train=30000, valid=300, test=300, min_len=3, max_len=15),
             {"layers": 2, "embed-dim": 128, "ffn-dim": 512, "dropout": 0.1, "lr": "5e-3", "warmup-updates": 200,
              "baseline-updates": 1500, "finetune-updates": 450, "target-warmup-updates": 150, "curve-updates": 150,
              "importance-sentences": 300}),
}
#: the phases, each a list of lanes (steps run one after the other in one process) that run at once
PHASES = {
    "demo": [("train the baseline and the simplified decoder side by side", [["baseline"], ["simplified"]]),
             ("fine-tune each method and its equal-updates control; head importance",
              [["control", "l0drop", "curve"], ["heads_all", "attention_reg", "importance"]]),
             ("speed benchmarks (one at a time)", [["speed"]]),
             ("report", [["report"]])],
    "full": [("train the baseline and the simplified decoder side by side", [["baseline"], ["simplified"]]),
             ("fine-tune each method and its equal-updates control; head importance",
              [["control", "l0drop", "curve"], ["control_frozen", "heads_enc", "heads_all", "attention_reg",
                                                 "importance"]]),
             ("speed benchmarks (one at a time)", [["speed"]]),
             ("report", [["report"]])],
}


def make_corpus(raw, corpus_options):
    """The synthetic corpus in RAW (reused when there), its gold test alignment, and the function words of its
    source language (the12 markers and the swap marker) for the token types."""
    from fairseq_sparse.synthetic_corpus import N_FUNCTION, SWAP, make_corpus as write

    if not os.path.exists(os.path.join(raw, "test.tgt")):
        write(raw + ".tmp", **corpus_options)
        os.replace(raw + ".tmp", raw)
    words = os.path.join(raw, "function_words.txt")
    if not os.path.exists(words):
        with open(words, "w") as f:
            f.write("\n".join([f"the{i}" for i in range(N_FUNCTION)] + [SWAP]) + "\n")
    return os.path.join(raw, "test.align"), words


#: the environment of every recipe process and its children: one thread, fixed hashing, output unbuffered
ONE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1"}
#: and for every step that trains or scores (not the speed benchmarks): the same CPU kernels on any x86-64
#: machine with AVX2. torch picks its kernels by the CPU's vector units (AVX512 and AVX2 kernels round
#: differently), so without these the scores are reproducible on one machine but not across machines.
SAME_KERNELS_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def run_phase(title, lanes, recipe_cmd, timed=False):
    """Run each lane's steps in its own recipe process, all lanes at once; stop on the first failure. TIMED: the
    speed benchmarks, which run on the machine's own kernels."""
    start = time.time()
    print(f"\n=== {title}: {' | '.join(','.join(lane) for lane in lanes)}", flush=True)
    env = {**os.environ, **ONE_THREAD_ENV, **({} if timed else SAME_KERNELS_ENV)}
    procs = [subprocess.Popen(recipe_cmd + ["--steps", ",".join(lane)], env=env) for lane in lanes]
    codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit(f"demo: a step failed (exit {max(codes)}); see the log named above. A re-run resumes.")
    print(f"=== {title}: {time.time() - start:.0f}s", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--full", action="store_true", help="the larger runs: 30k pairs of 300 content words, 2+2 layers "
                   "of width 128, 1500 + 450 updates, also control_frozen and heads_enc (see README for its time)")
    p.add_argument("--work-dir", help="default: demo_out (demo_out_full with --full); a re-run resumes")
    p.add_argument("--seed", type=int, default=1, help="seed of every training (the corpus is fixed); use a new "
                   "--work-dir per seed")
    a, extra = p.parse_known_args(argv)
    size = "full" if a.full else "demo"
    work = os.path.abspath(a.work_dir or ("demo_out_full" if a.full else "demo_out"))
    corpus_options, sized = SIZES[size]
    recipe_options = [x for name, value in {**COMMON, **sized}.items() for x in (f"--{name}", str(value))]
    start = time.time()
    print(f"=== corpus: synthetic, {corpus_options['train']} training pairs (fairseq_sparse/synthetic_corpus.py)",
          flush=True)
    raw = os.path.join(work, "corpus")
    os.makedirs(work, exist_ok=True)
    gold, function_words = make_corpus(raw, corpus_options)
    recipe_cmd = [sys.executable, "-m", "fairseq_sparse.recipe.main", "--corpus", raw, "-s", "src", "-t", "tgt",
                  "--work-dir", work, "--tokenizer", "none", "--bpe-merges", "0", "--threads", "1",
                  "--gold-alignments", gold, "--function-words", function_words, "--seed", str(a.seed)] \
        + recipe_options + extra
    run_phase("prepare (fairseq-preprocess)", [["prepare"]], recipe_cmd)
    for title, lanes in PHASES[size]:
        run_phase(title, lanes, recipe_cmd, timed=lanes == [["speed"]])
    print(f"\ndemo: {time.time() - start:.0f}s in all; report, plots and commands in {work}/REPORT.md")


if __name__ == "__main__":
    main()
