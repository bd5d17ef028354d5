"""Offline L0Drop demo: make a corpus, train a Transformer, fine-tune it with L0Drop (paper 000's
recipe), decode with and without pruned decoding, and print quality, sparsity and speed.

    scripts/demo.sh            # = .venv/bin/python examples/l0drop_demo.py --work-dir demo_out

Everything goes through the real console scripts (fairseq-preprocess, fairseq-train,
fairseq-generate, fairseq-sparse-l0drop-gates), so the commands it prints are the commands a user would run.
"""
import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
USER_DIR = os.path.join(REPO, "fairseq_sparse")
BIN = os.path.dirname(sys.executable)

MODEL = [
    "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "128", "--decoder-embed-dim", "128",
    "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--share-all-embeddings",
    "--dropout", "0.1",
]
TRAIN = [
    "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt",
    "--warmup-updates", "200", "--max-tokens", "4096", "--cpu", "--seed", "1", "--no-epoch-checkpoints",
    "--log-interval", "100", "--no-progress-bar", "--num-workers", "0",
]


def sh(cmd, log=None):
    print("$ " + " ".join(cmd if len(" ".join(cmd)) < 400 else cmd[:12] + ["..."]), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if log:
        with open(log, "w") as f:
            f.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr


def generate(data, ckpt, subset, extra=(), log=None):
    out = sh([os.path.join(BIN, "fairseq-generate"), data, "--user-dir", USER_DIR, "--path", ckpt,
              "--gen-subset", subset, "--beam", "4", "--batch-size", "32", "--cpu", "--remove-bpe",
              "--required-batch-size-multiple", "1"] + list(extra), log)
    bleu = re.search(r"BLEU4 = ([\d.]+)", out)
    speed = re.search(r"Translated \d+ sentences .* in ([\d.]+)s \(([\d.]+) sentences/s", out)
    sparsity = re.search(r"L0Drop sparsity rate ([\d.]+)%", out)
    # (id, tokens) of every hypothesis, and its score
    hyps = dict((f[0], (f[2], float(f[1]))) for f in (l.split("\t") for l in out.splitlines() if l.startswith("H-")))
    return {
        "bleu": float(bleu.group(1)) if bleu else None,
        "seconds": float(speed.group(1)), "sent_per_s": float(speed.group(2)),
        "sparsity": float(sparsity.group(1)) / 100 if sparsity else None,
        "hyps": hyps,
    }


def prepare_data(work, train_sentences, long_length=400):
    """The synthetic corpus, binarised (reused when it is already there); returns the data-bin dir."""
    print("== 1. corpus (synthetic, offline) and fairseq-preprocess")
    from fairseq_sparse.synthetic_corpus import make_corpus

    raw, data = os.path.join(work, "raw"), os.path.join(work, "data-bin")
    if not os.path.exists(os.path.join(data, "dict.src.txt")):
        make_corpus(raw, train=train_sentences, valid=300, test=300, long_test=long_length)
        sh([os.path.join(BIN, "fairseq-preprocess"), "--source-lang", "src", "--target-lang", "tgt",
            "--trainpref", f"{raw}/train", "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test,{raw}/test-long",
            "--destdir", data, "--joined-dictionary", "--workers", "2"], os.path.join(work, "preprocess.log"))
    return data


def train_base(work, data, updates):
    """The stock fairseq transformer (the converged model of both papers' recipes); reused if trained."""
    print("== 2. a stock fairseq transformer (the converged model)")
    base_dir = os.path.join(work, "transformer")
    ckpt = os.path.join(base_dir, "checkpoint_last.pt")
    if os.path.exists(ckpt):
        print(f"   reusing {ckpt}")
        return ckpt
    sh([os.path.join(BIN, "fairseq-train"), data, "--user-dir", USER_DIR, "--arch", "transformer",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--save-dir", base_dir,
        "--max-update", str(updates)] + MODEL + TRAIN, os.path.join(work, "train_transformer.log"))
    return ckpt


def same_hypotheses(x, y):
    """'yes (max score difference ...)' if two generate() results have the same hypotheses."""
    tokens_equal = {k: v[0] for k, v in x["hyps"].items()} == {k: v[0] for k, v in y["hyps"].items()}
    score_diff = max((abs(v[1] - y["hyps"][k][1]) for k, v in x["hyps"].items() if k in y["hyps"]), default=0.0)
    return f"{'yes' if tokens_equal else 'NO'} (max score difference {score_diff:.1e})"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default="demo_out")
    p.add_argument("--train-sentences", type=int, default=20000)
    p.add_argument("--pretrain-updates", type=int, default=1500, help="updates of the stock transformer")
    p.add_argument("--finetune-updates", type=int, default=600, help="updates of L0Drop fine-tuning")
    p.add_argument("--l0drop-lambda", type=float, default=0.3)
    p.add_argument("--long-length", type=int, default=400, help="source length of the long test set")
    p.add_argument("--quick", action="store_true", help="a much smaller run (about 2 minutes) to check the pipeline")
    a = p.parse_args()
    if a.quick:
        a.train_sentences, a.pretrain_updates, a.finetune_updates = 4000, 300, 150
    t0 = time.time()
    work = os.path.abspath(a.work_dir)
    os.makedirs(work, exist_ok=True)

    data = prepare_data(work, a.train_sentences, a.long_length)
    base_ckpt = train_base(work, data, a.pretrain_updates)

    print(f"== 3. fine-tune with L0Drop, lambda {a.l0drop_lambda} (paper 000 Sec. 6)")
    l0_dir = os.path.join(work, "l0drop")
    log = sh([os.path.join(BIN, "fairseq-train"), data, "--user-dir", USER_DIR, "--arch", "transformer_l0drop",
              "--criterion", "label_smoothed_cross_entropy_with_sparsity", "--label-smoothing", "0.1",
              "--l0drop-lambda", str(a.l0drop_lambda), "--finetune-from-model", base_ckpt, "--save-dir", l0_dir,
              "--max-update", str(a.finetune_updates)] + MODEL + TRAIN, os.path.join(work, "train_l0drop.log"))
    l0_ckpt = os.path.join(l0_dir, "checkpoint_last.pt")
    valid = [l for l in log.splitlines() if "| valid |" in l]
    if valid:
        print("   last validation:", valid[-1].split("| valid |")[1].strip())

    print(f"== 3b. the baseline trained for the same {a.finetune_updates} more updates, without L0Drop")
    cont_dir = os.path.join(work, "transformer_continued")
    sh([os.path.join(BIN, "fairseq-train"), data, "--user-dir", USER_DIR, "--arch", "transformer",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--finetune-from-model", base_ckpt,
        "--save-dir", cont_dir, "--max-update", str(a.finetune_updates)] + MODEL + TRAIN,
       os.path.join(work, "train_transformer_continued.log"))
    base_ckpt = os.path.join(cont_dir, "checkpoint_last.pt")

    print("== 4. decode the test set (beam 4)")
    base = generate(data, base_ckpt, "test", log=os.path.join(work, "gen_transformer.txt"))
    pruned = generate(data, l0_ckpt, "test", log=os.path.join(work, "gen_l0drop_pruned.txt"))
    full = generate(data, l0_ckpt, "test", ["--model-overrides", "{'pruned_decoding': False}"],
                    os.path.join(work, "gen_l0drop_unpruned.txt"))
    print(f"== 5. decode {a.long_length}-token inputs")
    long_pruned = generate(data, l0_ckpt, "test1", log=os.path.join(work, "gen_long_pruned.txt"))
    long_full = generate(data, l0_ckpt, "test1", ["--model-overrides", "{'pruned_decoding': False}"],
                         os.path.join(work, "gen_long_unpruned.txt"))
    long_base = generate(data, base_ckpt, "test1", log=os.path.join(work, "gen_long_transformer.txt"))

    print("== 6. which source tokens were dropped (fairseq-sparse-l0drop-gates)")
    gates_out = sh([os.path.join(BIN, "fairseq-sparse-l0drop-gates"), data, "--user-dir", USER_DIR, "--path", l0_ckpt,
                    "--gen-subset", "test", "--gates-output", os.path.join(work, "gates.tsv"),
                    "--token-summary", os.path.join(work, "gates_by_token.tsv"), "--cpu", "--batch-size", "64", "--overwrite"])
    kinds = {"function words (the*)": [0, 0], "content words (w*)": [0, 0], "swap marker": [0, 0], "</s>": [0, 0]}
    with open(os.path.join(work, "gates_by_token.tsv")) as f:
        next(f)
        for line in f:
            tok, n, pr, _ = line.rstrip("\n").split("\t")
            kind = ("function words (the*)" if tok.startswith("the") else "content words (w*)" if tok.startswith("w")
                    else "swap marker" if tok == "swap" else "</s>" if tok == "</s>" else None)
            if kind:
                kinds[kind][0] += int(n)
                kinds[kind][1] += int(pr)

    print("\n================ L0Drop demo results ================")
    print(f"{'model':38s} {'BLEU':>6s} {'sparsity':>9s} {'sent/s':>8s}")
    print(f"{'transformer (same number of updates)':38s} {base['bleu']:6.2f} {'0.0%':>9s} {base['sent_per_s']:8.1f}")
    print(f"{'transformer_l0drop, pruned decoding':38s} {pruned['bleu']:6.2f} {100 * pruned['sparsity']:8.1f}% {pruned['sent_per_s']:8.1f}")
    print(f"{'transformer_l0drop, full memory':38s} {full['bleu']:6.2f} {100 * full['sparsity']:8.1f}% {full['sent_per_s']:8.1f}")
    print(f"pruned and full-memory decoding give identical hypotheses: {same_hypotheses(pruned, full)} on test, "
          f"{same_hypotheses(long_pruned, long_full)} on {a.long_length}-token inputs")
    print(f"BLEU change from L0Drop: {pruned['bleu'] - base['bleu']:+.2f}")
    print(f"{a.long_length}-token inputs: sparsity {100 * long_pruned['sparsity']:.1f}%, decoding "
          f"{long_full['seconds']:.2f}s -> {long_pruned['seconds']:.2f}s, speed ratio pruned/unpruned "
          f"{long_full['seconds'] / long_pruned['seconds']:.2f}x, pruned/stock transformer "
          f"{long_base['seconds'] / long_pruned['seconds']:.2f}x (tiny model: the decoder's fixed cost dominates; "
          f"see benchmarks/ for transformer-base sizes)")
    print("sparsity by token type (test set):")
    for kind, (n, pr) in kinds.items():
        if n:
            print(f"  {kind:24s} {100 * pr / n:5.1f}% of {n}")
    print(f"outputs in {work}; took {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
