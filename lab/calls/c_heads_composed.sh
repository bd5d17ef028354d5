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
# composed model against stock (fairseq_sparse/benchmarks/composed.py) and the analyses.
#
# Before, on the CPU: gpu_carry/W1, the prepared DDTP en-de data-bin (reports/2026-11-27-l0drop-gpu-ddtp-x256/run.sh
# says how; only its data-bin is carried). Afterwards: python3 lab/checkpoint_parts.py join ... for the brought-back
# parts; summarise into a report. The call, what it carries, returns and plans: the #@ lines (lab/preflight.py).
#@ run wheelhouse gpu_carry/W1/data-bin -- lab/calls/c_heads_composed.sh
#@ carry wheelhouse 32
#@ carry gpu_carry/W1/data-bin 4.3
#@ input gpu_carry/W1/data-bin/dict.en.txt
#@ returns study.tgz 3
#@ returns study.log 0.1
#@ returns s1_control_checkpoint_last.part1of2.pt 15.5
#@ returns s1_control_checkpoint_last.part2of2.pt 7.2
#@ returns s1_composed_pruned.part1of2.pt 15.5
#@ returns s1_composed_pruned.part2of2.pt 4.1
#@ plan install 50 48 s on an H200 from the wheelhouse's fairseq wheel (2026-11-27)
#@ plan phase1 230 a baseline bounded by --baseline-minutes M takes about 1.22 M of wall time (2026-11-27)
#@ plan phase2 150 four fine-tunings side by side, 800 updates at about 6 updates/s (2026-11-27)
#@ plan decode 90 under six runs side by side a 1,001-sentence decoding took over 70 s (2026-11-27)
#@ plan report 20 the report step per seed (the CPU rehearsal: 11 s, 2026-11-28)
#@ resume SECONDS_LEFT=<what is left - 20> lab/calls/c_heads_composed.sh
#@ fallback SEARCH=fairseq SECONDS_LEFT=<what is left - 20> lab/calls/c_heads_composed.sh
source "$(dirname "$0")/common.sh"
export BRING_BACK=${BRING_BACK-"control/checkpoint_last.pt composed/pruned.pt"}
export RECIPE_ARGS="--data-bin $CARRY/W1/data-bin -s en -t de $AMP --search $SEARCH
  --layers 3 --embed-dim 256 --ffn-dim 1024 --heads 4 --dropout 0.2 --lr 0.0015
  --baseline-updates 100000 --baseline-minutes ${MINUTES:-3} --validate-interval-updates ${VALIDATE:-500}
  --baseline-patience 3 --finetune-updates ${UPDATES:-800} ${POINTS:+--budget-points $POINTS}"
study "$CARRY/HC" "${SEEDS:-1}" baseline,simplified control,heads_all,simplified_control,composed
