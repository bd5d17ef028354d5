#!/usr/bin/env bash
# Issue 42, study e: character-level translation with L0Drop (Zhang, Titov & Sennrich 2021, Table 1's "Char" row and
# Fig. 6) from GPU-trained models: DDTP en-de split into characters (the recipe's --char-level), stock 3+3 x 256
# baselines of two seeds side by side for MINUTES of training each, then, side by side, UPDATES updates of the
# equal-updates control and of L0Drop at target 0.5 from each; every test sentence decoded (beam 5, fp32, longest
# output 2 x the source + 10 characters), BLEU on the words joined back, paired bootstrap, the pruned characters by
# their position inside the word (the attention analysis); seed 1's L0Drop and control checkpoints brought back
# (fp16) for the CPU benchmark of pruned decoding against the same model unpruned (the paper's 1.20x).
# The CPU study (reports/2026-11-26-char-level-ddtp) had a 4-BLEU baseline after 53 minutes: this is its strong one.
#
# Before, on the CPU (no tok/ carried: only the pattern_pos step reads it):
#   fairseq-sparse-recipe --corpus gpu_carry/en-de -s en -t de --char-level --work-dir gpu_carry/CH1 --steps prepare --device cpu
# The call, what it carries, returns and plans: the #@ lines (lab/preflight.py).
#@ run wheelhouse gpu_carry/en-de gpu_carry/CH1/data-bin -- lab/calls/e_char_level.sh
#@ carry wheelhouse 32
#@ carry gpu_carry/en-de 9.2
#@ carry gpu_carry/CH1/data-bin 15.3
#@ input gpu_carry/en-de/train.en
#@ input gpu_carry/CH1/data-bin/dict.en.txt
#@ returns study.tgz 3
#@ returns study.log 0.1
#@ returns s1_l0drop_checkpoint_last.pt 10.8
#@ returns s1_control_checkpoint_last.pt 10.8
#@ plan install 50 48 s on an H200 from the wheelhouse's fairseq wheel (2026-11-27)
#@ plan phase1 260 a baseline bounded by --baseline-minutes M takes about 1.22 M of wall time (2026-11-27)
#@ plan phase2 120 four fine-tunings side by side, 800 updates at about 6-7 updates/s (2026-11-27)
#@ plan decode 100 character-level outputs are about five times as many steps as BPE ones
#@ resume SECONDS_LEFT=<what is left - 20> lab/calls/e_char_level.sh
#@ fallback SEARCH=fairseq SECONDS_LEFT=<what is left - 20> lab/calls/e_char_level.sh
source "$(dirname "$0")/common.sh"
export BRING_BACK=${BRING_BACK-"1:l0drop/checkpoint_last.pt 1:control/checkpoint_last.pt"}
export RECIPE_ARGS="--corpus $CARRY/en-de -s en -t de --char-level $AMP --search $SEARCH
  --layers 3 --embed-dim 256 --ffn-dim 1024 --heads 4 --dropout 0.2 --lr 0.0015
  --baseline-updates 100000 --baseline-minutes ${MINUTES:-3.5} --validate-interval-updates ${VALIDATE:-500}
  --baseline-patience 3 --finetune-updates ${UPDATES:-800} ${POINTS:+--budget-points $POINTS} --l0drop-target 0.5"
study "$CARRY/CH" "${SEEDS:-1 2}" baseline control,l0drop
