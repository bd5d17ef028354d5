"""Offline head-pruning demo (papers 001 and 003), on the corpus and transformer of the L0Drop demo.

    scripts/demo.sh            # runs examples/l0drop_demo.py, then this, in demo_out/

1. head importance I_h of the converged transformer and the pruning curve (paper 003 Sec. 4);
2. the 50% least important heads cut out of the weights (fairseq-sparse-prune-heads), decoded with
   plain fairseq-generate: BLEU, parameters and speed against the full model;
3. fine-tuning with L0 head gates (paper 001 Sec. 6), export of the heads whose gate closed;
4. head confidence and positional heads of the converged model (paper 001 Sec. 4-5).

Every step is a console script, so the printed commands are what a user would run.
"""
import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from l0drop_demo import BIN, MODEL, TRAIN, USER_DIR, generate, prepare_data, same_hypotheses, sh, train_base  # noqa: E402


def console(name):
    return os.path.join(BIN, name)


def heads_kept(out):
    m = re.search(r"kept (\d+) of (\d+) heads; parameters (\d+) -> (\d+)", out)
    return tuple(int(x) for x in m.groups())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default="demo_out")
    p.add_argument("--train-sentences", type=int, default=20000)
    p.add_argument("--pretrain-updates", type=int, default=1500, help="updates of the stock transformer (if not there)")
    p.add_argument("--gate-updates", type=int, default=1000, help="updates of head-gate fine-tuning")
    p.add_argument("--head-gates-lambda", type=float, default=0.05)
    p.add_argument("--prune-fraction", type=float, default=0.5, help="share of heads removed by importance")
    p.add_argument("--eval-sentences", type=int, default=150, help="sentences of the BLEU evaluations of the curve")
    p.add_argument("--quick", action="store_true", help="a much smaller run to check the pipeline")
    a = p.parse_args()
    if a.quick:
        a.train_sentences, a.pretrain_updates, a.gate_updates, a.eval_sentences = 4000, 300, 150, 40
    t0 = time.time()
    work = os.path.abspath(a.work_dir)
    heads = os.path.join(work, "heads")
    os.makedirs(heads, exist_ok=True)
    data = prepare_data(work, a.train_sentences)
    base_ckpt = train_base(work, data, a.pretrain_updates)

    print(f"== H1. head importance and the pruning curve (paper 003), mask of the {a.prune_fraction:.0%} least important")
    mask = os.path.join(heads, "mask.json")
    common = ["--path", base_ckpt, "--cpu", "--no-progress-bar", "--beam", "4", "--max-sentences", str(a.eval_sentences)]
    sh([console("fairseq-sparse-heads"), "importance", data] + common + [
        "--output-dir", os.path.join(heads, "importance"), "--write-mask", mask,
        "--prune-fraction", str(a.prune_fraction)], os.path.join(heads, "importance.log"))
    curve_log = sh([console("fairseq-sparse-heads"), "prune-curve", data] + common + [
        "--output-dir", os.path.join(heads, "curve"), "--modes", "all", "enc", "dec", "encdec"],
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

    print(f"== H3. fine-tune with head gates, lambda {a.head_gates_lambda} (paper 001 Sec. 6), export closed heads")
    gate_dir = os.path.join(heads, "gates")
    log = sh([console("fairseq-train"), data, "--user-dir", USER_DIR, "--arch", "transformer_head_gates",
              "--criterion", "label_smoothed_cross_entropy_with_sparsity", "--label-smoothing", "0.1",
              "--head-gates-lambda", str(a.head_gates_lambda), "--finetune-from-model", base_ckpt,
              # gates start half open and take larger steps than a converged model's weights need: a short
              # fine-tuning (the paper's runs are far longer) has to move log alpha by about 3 to close a gate
              "--head-gates-init-log-alpha", "0", "--save-dir", gate_dir, "--max-update", str(a.gate_updates)]
             + MODEL + [x for x in TRAIN] + ["--lr-scheduler", "fixed", "--lr", "5e-3"],
             os.path.join(heads, "train_gates.log"))
    valid = [line for line in log.splitlines() if "| valid |" in line]
    if valid:
        print("   last validation:", valid[-1].split("| valid |")[1].strip())
    gate_ckpt = os.path.join(gate_dir, "checkpoint_last.pt")
    gate_pruned_ckpt = os.path.join(heads, "gates_pruned.pt")
    out = sh([console("fairseq-sparse-prune-heads"), "--path", gate_ckpt, "--output", gate_pruned_ckpt, "--overwrite"])
    g_kept, g_total, _, g_params = heads_kept(out)
    per_type = re.findall(r"^\s+(enc|dec|encdec)\s+heads per layer: (\[.*\])$", out, re.M)
    gated = generate(data, gate_ckpt, "test", log=os.path.join(heads, "gen_gated.txt"))
    gated_pruned = generate(data, gate_pruned_ckpt, "test", log=os.path.join(heads, "gen_gated_pruned.txt"))

    print("== H4. head confidence and functions of the converged model (paper 001)")
    sh([console("fairseq-sparse-head-analysis"), data, "--path", base_ckpt, "--output-dir",
        os.path.join(heads, "analysis"), "--max-sentences", "300", "--rare-min-rank", "20"],
       os.path.join(heads, "analysis.log"))

    print("\n================ head pruning demo results ================")
    print(f"{'model':44s} {'heads':>7s} {'params':>8s} {'BLEU':>6s} {'sent/s':>7s}")
    print(f"{'transformer (all heads)':44s} {total:>7d} {params_full:>8d} {full['bleu']:6.2f} "
          f"{max(full['sent_per_s'], full2['sent_per_s']):7.1f}")
    print(f"{f'importance-pruned {a.prune_fraction:.0%}, physically removed':44s} {kept:>7d} {params_pruned:>8d} "
          f"{pruned['bleu']:6.2f} {max(pruned['sent_per_s'], pruned2['sent_per_s']):7.1f}")
    print(f"{'head gates fine-tuned (gated model)':44s} {g_total:>7d} {'':>8s} {gated['bleu']:6.2f} "
          f"{gated['sent_per_s']:7.1f}")
    print(f"{'head gates, closed heads removed':44s} {g_kept:>7d} {g_params:>8d} {gated_pruned['bleu']:6.2f} "
          f"{gated_pruned['sent_per_s']:7.1f}")
    print("heads kept per layer after gate training: " + ", ".join(f"{t} {v}" for t, v in per_type))
    print(f"gated and exported models give identical hypotheses: {same_hypotheses(gated, gated_pruned)}")
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
