#!/usr/bin/env bash
# Issue 61 (E1 and E2 at x256): does merging the pruned encoder outputs into kept ones keep what dropping loses,
# and does a deeper encoder route the dropped content itself? On all of DDTP en-de's training pairs, 3+3 x 256 or
# 6+1 x 256 (ARM=3x3, the default, or ARM=6x1: about the same cost, Kasai et al. 2021), both pre-norm, from scratch
# at equal updates: the stock model, the freq rule at 0.5 dropping, merging by the mean and merging by attention
# (reports/2026-12-07-l0drop-merge, whose CPU runs are 3+3 x 128 post-norm on a quarter of the pairs), seeds 1 and 2:
# eight trainings side by side, UPDATES updates each (no early stop), a checkpoint at each of POINTS; every test
# sentence decoded (beam 5, fp32, the fixed-shape search), paired bootstrap, the gap analysis of each pair.
#
# Before, on the CPU (the data-bin of all the pairs, about 4 MB, and the segment types; nothing else is read):
#   fairseq-sparse-recipe --corpus DDTP/en-de -s en -t de --work-dir gpu_carry/DEC_f1 --steps prepare --device cpu \
#       --quiet && rm -r gpu_carry/DEC_f1/tok
#   cut -f5 DDTP/en-de/test.meta.tsv > gpu_carry/test.segment_types
# What comes back: study.tgz (every work dir's results.json, REPORT.md, logs and gap analysis, no checkpoint) and
# study.log. Afterwards, here: tar xzf study.tgz; python3 reports/2026-12-07-l0drop-merge/summarise.py gpu_carry.
# The call, what it carries, returns and plans, its resume and fallback: the #@ lines (lab/preflight.py).
#@ run wheelhouse gpu_carry/DEC_f1/data-bin gpu_carry/test.segment_types -- lab/calls/h_merge_layers.sh
#@ carry wheelhouse 32
#@ carry gpu_carry/DEC_f1/data-bin 4.3
#@ carry gpu_carry/test.segment_types 0.01
#@ input gpu_carry/DEC_f1/data-bin/dict.en.txt
#@ input gpu_carry/test.segment_types
#@ returns study.tgz 3
#@ returns study.log 0.1
#@ plan install 80 48 s on an H200 from the wheelhouse's fairseq wheel (2026-11-27), the venv beside it
#@ plan checks 20 the recipe's checks of eight runs, one process each
#@ plan train 240 eight x256 trainings side by side, 1,200 updates at about 5 updates/s each (six to eight runs side by side: 4.85-6.8 updates/s, 2026-11-27)
#@ plan decode 90 a 1,001-sentence decoding took 13-70 s under six runs side by side (fairseq's search, 2026-11-27); two points each
#@ plan gap_analysis 30 gates, train-sample and valid NLL of each pair (fairseq-validate, 2,000 sentences)
#@ resume SECONDS_LEFT=<what is left - 20> lab/calls/h_merge_layers.sh
#@ fallback SEARCH=fairseq SECONDS_LEFT=<what is left - 20> lab/calls/h_merge_layers.sh
source "$(dirname "$0")/common.sh"
export BRING_BACK=${BRING_BACK-}
ARM=${ARM:-3x3}
case $ARM in
    3x3) DEPTH="--encoder-layers 3 --decoder-layers 3" ;;
    6x1) DEPTH="--encoder-layers 6 --decoder-layers 1" ;;
    *) echo "h_merge_layers.sh: ARM must be 3x3 or 6x1, got '$ARM'"; exit 2 ;;
esac
export RECIPE_ARGS="--data-bin $CARRY/DEC_f1/data-bin -s en -t de $AMP --search $SEARCH
  $DEPTH --pre-norm --embed-dim ${WIDTH:-256} --ffn-dim $((4 * ${WIDTH:-256})) --heads ${HEADS:-4}
  --baseline-updates ${UPDATES:-1200} --baseline-patience 0 --scratch-budget-points ${POINTS:-600,1200}
  --validate-interval-updates ${VALIDATE:-600} --segment-types $CARRY/test.segment_types"
study "$CARRY/MRG_${ARM}_s" "${SEEDS:-1 2}" \
    baseline,pattern_freq_scratch,pattern_freq_merge_mean_scratch,pattern_freq_merge_attention_scratch gap_analysis
