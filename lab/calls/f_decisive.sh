#!/usr/bin/env bash
# Issue 52, the decisive study, larger: the freq rule at 0.5 trained from scratch beside the stock model (no
# fine-tuning anywhere) at equal updates, on all, half and a quarter of DDTP en-de's training pairs (one shuffle;
# BPE and dictionary of all of them; valid and test whole), two seeds on all of them: eight trainings side by side,
# UPDATES updates each (no wall-clock bound, no early stop: equal updates), a checkpoint at each of POINTS; every test
# sentence decoded at each point (beam 5, fp32, the fixed-shape search), paired bootstrap, and the gap analysis of
# each pair (by segment type, by source length, brevity, copied words by pruned or kept, train-sample and valid NLL).
# The CPU study (reports/2026-11-28-l0drop-decisive) ran the same grid at 3+3 x 128 and 4k-token batches.
#
# Before, on the CPU (the three data-bins, about 8 MB, and the segment types; nothing else is read):
#   for f in 1 0.5 0.25; do fairseq-sparse-recipe --corpus DDTP/en-de -s en -t de --train-fraction $f \
#       --work-dir gpu_carry/DEC_f$f --steps prepare --device cpu --quiet; rm -r gpu_carry/DEC_f$f/tok; done
#   cut -f5 DDTP/en-de/test.meta.tsv > gpu_carry/test.segment_types
# What comes back: study.tgz (every work dir's results.json, REPORT.md, logs and gap analysis, no checkpoint) and
# study.log. Afterwards, here: tar xzf study.tgz; python reports/2026-11-28-l0drop-decisive/summarise.py gpu_carry.
# The call, what it carries, returns and plans, its resume and fallback: the #@ lines (lab/preflight.py).
#@ run wheelhouse gpu_carry/DEC_f1/data-bin gpu_carry/DEC_f0.5/data-bin gpu_carry/DEC_f0.25/data-bin gpu_carry/test.segment_types -- lab/calls/f_decisive.sh
#@ carry wheelhouse 32
#@ carry gpu_carry/DEC_f1/data-bin 4.3
#@ carry gpu_carry/DEC_f0.5/data-bin 2.4
#@ carry gpu_carry/DEC_f0.25/data-bin 1.4
#@ carry gpu_carry/test.segment_types 0.01
#@ input gpu_carry/DEC_f1/data-bin/dict.en.txt
#@ input gpu_carry/DEC_f0.5/data-bin/dict.en.txt
#@ input gpu_carry/DEC_f0.25/data-bin/dict.en.txt
#@ input gpu_carry/test.segment_types
#@ returns study.tgz 4
#@ returns study.log 0.1
#@ plan install 80 48 s on an H200 from the wheelhouse's fairseq wheel (2026-11-27), the venv beside it
#@ plan checks 20 the recipe's checks of four runs, one process each
#@ plan train 240 eight x256 trainings side by side, 1,200 updates at about 5 updates/s each (six to eight runs side by side: 4.85-6.8 updates/s, 2026-11-27)
#@ plan decode 90 a 1,001-sentence decoding took 13-70 s under six runs side by side (fairseq's search, 2026-11-27); two points each
#@ plan gap_analysis 30 gates, train-sample and valid NLL of each pair (fairseq-validate, 2,000 sentences)
#@ resume SECONDS_LEFT=<what is left - 20> lab/calls/f_decisive.sh
#@ fallback SEARCH=fairseq SECONDS_LEFT=<what is left - 20> lab/calls/f_decisive.sh
source "$(dirname "$0")/common.sh"
export BRING_BACK=${BRING_BACK-}
SEGMENTS=$CARRY/test.segment_types  # it and the data-bins: checked before the install (#@ input)
export RECIPE_ARGS="--data-bin $CARRY/DEC_f{tag}/data-bin -s en -t de $AMP --search $SEARCH
  --layers 3 --embed-dim ${WIDTH:-256} --ffn-dim $((4 * ${WIDTH:-256})) --heads ${HEADS:-4}
  --baseline-updates ${UPDATES:-1200} --baseline-patience 0 --scratch-budget-points ${POINTS:-600,1200}
  --validate-interval-updates ${VALIDATE:-600} --segment-types $SEGMENTS"
study "$CARRY/DEC_f" "${RUNS:-1@1 2@1 1@0.5 1@0.25}" baseline,pattern_freq_scratch gap_analysis
