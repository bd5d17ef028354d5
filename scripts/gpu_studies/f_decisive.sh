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
# Device call (the wheelhouse without fairseq's sdist, about 40 MB carried in all):
#   run(carry ["wheelhouse", "gpu_carry/DEC_f1", "gpu_carry/DEC_f0.5", "gpu_carry/DEC_f0.25",
#              "gpu_carry/test.segment_types"], timeout_s 600): scripts/gpu_studies/f_decisive.sh
# Cut off: at once, on the warm machine, SECONDS_LEFT=<what is left - 20> scripts/gpu_studies/f_decisive.sh (the
# work dirs resume). What comes back: study.tgz (every work dir's results.json, REPORT.md, logs and gap analysis,
# no checkpoint) and study.log. Afterwards, here: tar xzf study.tgz; python reports/2026-11-28-l0drop-decisive/
# summarise.py gpu_carry (the same summary as the CPU study's).
# Planned (H200, from study a's rates): install 50-80 s, the checks 20 s, eight x256 trainings side by side at about
# 5 updates/s each, 1,200 updates: 240 s, decodings and gap analyses side by side 60-90 s: about 420 s of the 555.
source "$(dirname "$0")/common.sh"
export BRING_BACK=${BRING_BACK-}
SEGMENTS=$CARRY/test.segment_types
[[ -f "$SEGMENTS" ]] || { echo "f_decisive.sh: $SEGMENTS is missing: make it before the call (see the head of this script)"; exit 2; }
export RECIPE_ARGS="--data-bin $CARRY/DEC_f{tag}/data-bin -s en -t de $AMP --search $SEARCH
  --layers 3 --embed-dim ${WIDTH:-256} --ffn-dim $((4 * ${WIDTH:-256})) --heads ${HEADS:-4}
  --baseline-updates ${UPDATES:-1200} --baseline-patience 0 --scratch-budget-points ${POINTS:-600,1200}
  --validate-interval-updates ${VALIDATE:-600} --segment-types $SEGMENTS"
study "$CARRY/DEC_f" "${RUNS:-1@1 2@1 1@0.5 1@0.25}" baseline,pattern_freq_scratch gap_analysis
