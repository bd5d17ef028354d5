"""Offline head-pruning demo (papers 001 and 003), on the corpus and transformer of the L0Drop demo.

    scripts/demo.sh            # runs examples/l0drop_demo.py, then this, in demo_out/

1. head importance I_h of the converged transformer and the pruning curve (paper 003 Sec. 4);
2. the 50% least important heads cut out of the weights (fairseq-sparse-prune-heads), decoded with
   plain fairseq-generate: BLEU, parameters and speed against the full model;
3. head confidence and positional heads of the converged model (paper 001 Sec. 4-5).

Head-gate fine-tuning (paper 001 Sec. 6) is not part of the demo: on this CPU budget (1000 updates) the
gates did not close without hurting the model (see README); the tests cover its mechanics.

Every step is a console script, so the printed commands are what a user would run.
"""
import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from l0drop_demo import BIN, generate, prepare_data, sh, train_base  # noqa: E402


def console(name):
    return os.path.join(BIN, name)


def tool_args(ckpt, sentences):
    return ["--path", ckpt, "--cpu", "--no-progress-bar", "--beam", "4", "--max-sentences", str(sentences)]


def evaluate_bleu(data, ckpt, sentences, extra=()):
    out = sh([console("fairseq-sparse-head-importance"), "evaluate", data] + tool_args(ckpt, sentences) + list(extra))
    return float(re.search(r"^BLEU ([\d.]+) on", out, re.M).group(1))


def heads_kept(out):
    m = re.search(r"kept (\d+) of (\d+) heads; parameters (\d+) -> (\d+)", out)
    return tuple(int(x) for x in m.groups())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default="demo_out")
    p.add_argument("--train-sentences", type=int, default=20000)
    p.add_argument("--pretrain-updates", type=int, default=1500, help="updates of the stock transformer (if not there)")
    p.add_argument("--prune-fraction", type=float, default=0.5, help="share of heads removed by importance")
    p.add_argument("--prune-types", nargs="+", default=["enc"], choices=["all", "enc", "dec", "encdec"],
                   help="attention types pruned by importance (default enc: paper 001 and 003 find encoder "
                        "self-attention the most prunable, encoder-decoder attention the least)")
    p.add_argument("--eval-sentences", type=int, default=150, help="sentences of the BLEU evaluations of the curve")
    p.add_argument("--quick", action="store_true", help="a much smaller run to check the pipeline")
    a = p.parse_args()
    if a.quick:
        a.train_sentences, a.pretrain_updates, a.eval_sentences = 4000, 300, 40
    t0 = time.time()
    work = os.path.abspath(a.work_dir)
    heads = os.path.join(work, "heads")
    os.makedirs(heads, exist_ok=True)
    data = prepare_data(work, a.train_sentences)
    base_ckpt = train_base(work, data, a.pretrain_updates)

    print(f"== H1. head importance and the pruning curve (paper 003), mask of the {a.prune_fraction:.0%} least "
          f"important {'/'.join(a.prune_types)} heads")
    mask = os.path.join(heads, "mask.json")
    common = tool_args(base_ckpt, a.eval_sentences)
    sh([console("fairseq-sparse-head-importance"), "importance", data] + common + [
        "--output-dir", os.path.join(heads, "importance"), "--write-mask", mask,
        "--prune-fraction", str(a.prune_fraction), "--overwrite", "--mask-types"] + a.prune_types, os.path.join(heads, "importance.log"))
    curve_log = sh([console("fairseq-sparse-head-importance"), "prune-curve", data] + common + [
        "--output-dir", os.path.join(heads, "curve"), "--overwrite", "--modes", "all", "enc", "dec", "encdec"],
        os.path.join(heads, "curve.log"))

    print("== H2. cut those heads out of the weights; decode with plain fairseq-generate")
    pruned_ckpt = os.path.join(heads, "importance_pruned.pt")
    out = sh([console("fairseq-sparse-prune-heads"), "--path", base_ckpt, "--head-mask", mask, "--output", pruned_ckpt,
              "--overwrite"])
    kept, total, params_full, params_pruned = heads_kept(out)
    full = generate(data, base_ckpt, "test", log=os.path.join(heads, "gen_full.txt"))
    pruned = generate(data, pruned_ckpt, "test", log=os.path.join(heads, "gen_importance_pruned.txt"))
    # the same again, so the speed comparison is not one run against one run on a busy machine
    full2 = generate(data, base_ckpt, "test")
    pruned2 = generate(data, pruned_ckpt, "test")
    # masked model (in-process mask) and exported model score the same on the same sentences
    masked_bleu = evaluate_bleu(data, base_ckpt, a.eval_sentences, ["--head-mask", mask])
    pruned_subset_bleu = evaluate_bleu(data, pruned_ckpt, a.eval_sentences)

    print("== H3. head confidence and functions of the converged model (paper 001)")
    sh([console("fairseq-sparse-head-analysis"), data, "--path", base_ckpt, "--output-dir",
        os.path.join(heads, "analysis"), "--max-sentences", "300", "--rare-min-rank", "20", "--overwrite"],
       os.path.join(heads, "analysis.log"))

    print("\n================ head pruning demo results ================")
    print(f"{'model':44s} {'heads':>7s} {'params':>8s} {'BLEU':>6s} {'sent/s':>7s}")
    print(f"{'transformer (all heads)':44s} {total:>7d} {params_full:>8d} {full['bleu']:6.2f} "
          f"{max(full['sent_per_s'], full2['sent_per_s']):7.1f}")
    label = f"importance-pruned {a.prune_fraction:.0%} of {'/'.join(a.prune_types)}, cut out"
    print(f"{label:44s} {kept:>7d} {params_pruned:>8d} "
          f"{pruned['bleu']:6.2f} {max(pruned['sent_per_s'], pruned2['sent_per_s']):7.1f}")
    print(f"masked (fairseq-sparse-head-importance evaluate) and physically pruned BLEU on the curve's sentences: "
          f"{masked_bleu:.2f} / {pruned_subset_bleu:.2f}")
    curve = [line for line in curve_log.splitlines() if "%:" in line and " | " not in line][:12]
    if curve:
        print("pruning curve (BLEU on the first %d test sentences, see heads/curve/):" % a.eval_sentences)
        for line in curve:
            print("  " + line.strip())
    print("speed: tiny model, so decoding is dominated by fixed per-step costs; benchmarks/head_pruning.py "
          "measures transformer-base sizes")
    print(f"outputs (TSV, JSON, PNG) in {heads}; took {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
