#!/usr/bin/env bash
# Issue 42, study c: head gates in all three attention types (Voita et al. 2019), the simplified decoder (Yang et al.
# 2020, decoder layers without FFN) and the composed model, each beside its equal-updates control, from GPU-trained
# 3+3 x 256 models on DDTP en-de (the size whose baselines were strongest in study a). One seed a call (SEEDS,
# default 1; the next call SEEDS=2): eight runs side by side did not fit one call in study a.
#   phase 1, side by side: the stock baseline and the simplified decoder from scratch, the same wall-clock bound
#            (MINUTES of training, validation every 500 updates, patience 3);
#   phase 2, side by side, UPDATES updates each from those: control (the baseline fine-tuned, no method), heads_all
#            (head gates in all three types, target 0.5, closed heads cut out), simplified_control (the simplified
#            decoder fine-tuned, no method) and composed (the simplified decoder with L0Drop between layers, target
#            0.1, and head gates in all three types, target 0.5, closed heads cut out);
# then every test sentence decoded (beam 5, fp32), BLEU, paired bootstrap against each control, the report; the
# control's and the composed model's checkpoints brought back (fp16, in parts) for the CPU speed benchmark of the
# composed model against stock (benchmarks/composed.py) and the analyses.
#
# Before, on the CPU: gpu_carry/W1, the prepared DDTP en-de data-bin (reports/2026-11-27-l0drop-gpu-ddtp-x256/run.sh
# says how). Device call (about 37 MB carried):
#   run(carry ["wheelhouse", "gpu_carry/W1"], timeout_s 600): scripts/gpu_studies/c_heads_composed.sh
# Cut off: at once, on the warm machine, SECONDS_LEFT=<what is left - 20> scripts/gpu_studies/c_heads_composed.sh
# (nothing carried; the work dirs resume). Planned: install 50 s, phase 1 about 230 s (1.22 x MINUTES), phase 2
# about 150 s of training (four runs at ~6 updates/s) and 90 s of decoding, the report 20 s: about 540 s.
# Afterwards: python3 scripts/checkpoint_parts.py join ... for the brought-back parts; summarise into a report.
source "$(dirname "$0")/common.sh"
export BRING_BACK=${BRING_BACK-"control/checkpoint_last.pt composed/pruned.pt"}
export RECIPE_ARGS="--data-bin $CARRY/W1/data-bin -s en -t de $AMP --search $SEARCH
  --layers 3 --embed-dim 256 --ffn-dim 1024 --heads 4 --dropout 0.2 --lr 0.0015
  --baseline-updates 100000 --baseline-minutes ${MINUTES:-3} --validate-interval-updates ${VALIDATE:-500}
  --baseline-patience 3 --finetune-updates ${UPDATES:-800} ${POINTS:+--budget-points $POINTS}"
study "$CARRY/HC" "${SEEDS:-1}" baseline,simplified control,heads_all,simplified_control,composed
