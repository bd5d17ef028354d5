#!/usr/bin/env bash
# The dose (issue 61, E2's second half): the freq rule dropping 10% and 25% of the source pieces, merging (mean) at
# 10%, and the whole-word freq rule at 0.5, each from scratch beside the merge study's stock model of the same seed
# (its work dir's data and stock model reused: the recipe's key check confirms the same command line).
#   CORPUS=ddtp/en-de SOURCE=runs/merge OUT=runs/dose reports/2026-12-07-l0drop-dose/run.sh PHASE ...
# PHASE: train (every model of SEEDS side by side), read (the gap analysis and report of each work dir, after every
# training in it has ended: the merge study's seed work dir holds the whole-word model), summary. SEEDS: default
# 1 (seed 2: SEEDS=2 DROPS_ONLY=1 for train and read, SEEDS="1 2" for summary). A phase run again resumes (the recipe reuses what finished and restarts a training from its last checkpoint).
# Reads added during the runs (before any result): attention (the stock model's encoder-decoder attention on the
# states each rate's rule prunes: fairseq-sparse-attention-analysis --gates-from) and probe (the merge study's
# content probe on each dose work dir).
set -euo pipefail
: "${CORPUS:?CORPUS=the en-de corpus folder}" "${SOURCE:?SOURCE=the OUT of the merge study}" "${OUT:?OUT=a folder}"
RECIPE=${RECIPE:-fairseq-sparse-recipe}
SEEDS=${SEEDS:-1}
FRACTION=0.25
UPDATES=850
# the merge study's options (run.sh there): the same baseline command line, so its stock model is reused
common=(-s en -t de --baseline-updates "$UPDATES" --baseline-patience 0 --scratch-budget-points "$UPDATES"
        --validate-interval 5 --threads 1 --quiet --segment-types "$SOURCE/test.segment_types")
work_of() { if [ "$2" = 0.5 ]; then echo "$SOURCE/f${FRACTION}_s$1"; else echo "$OUT/r$2_s$1"; fi; }
recipe() {  # recipe SEED RATE STEPS
  local work data=(--corpus "$CORPUS" --train-fraction "$FRACTION")
  work=$(work_of "$1" "$2")
  if [ "$1" != 1 ]; then data=(--data-bin "$SOURCE/f${FRACTION}_s1/data-bin"); fi
  "$RECIPE" "${data[@]}" --work-dir "$work" --seed "$1" --l0drop-target "$2" "${common[@]}" --steps "$3"
}
copy_stock() {  # copy_stock SEED RATE: the merge study's data and stock model into a work dir of its own (links)
  local from=$SOURCE/f${FRACTION}_s$1 to
  to=$(work_of "$1" "$2")
  [ -d "$to/baseline" ] && return 0
  mkdir -p "$to/results"
  cp -al "$from/baseline" "$to/baseline"
  for d in keys tok data-bin; do [ -d "$from/$d" ] && cp -al "$from/$d" "$to/$d"; done
  cp -l "$from"/results/baseline*.json "$from"/results/nll.baseline@*.json "$to/results/"
}
MODELS=("0.1 pattern_freq_scratch" "0.1 pattern_freq_merge_mean_scratch" "0.25 pattern_freq_scratch"
        "0.5 pattern_freq_words_scratch")
# DROPS_ONLY=1: only the dose curve's drops at 0.1 and 0.25 (seed 2's runs: README.md, "Seed 2")
if [ "${DROPS_ONLY:-0}" = 1 ]; then MODELS=("0.1 pattern_freq_scratch" "0.25 pattern_freq_scratch"); fi
for phase in "$@"; do
  case $phase in
    train)
      pids=()
      for s in $SEEDS; do
        for m in "${MODELS[@]}"; do
          read -r rate model <<< "$m"
          copy_stock "$s" "$rate"
          recipe "$s" "$rate" "$model" & pids+=($!)
        done
      done
      for p in "${pids[@]}"; do wait "$p"; done ;;
    read)
      for s in $SEEDS; do for rate in 0.1 0.25 0.5; do recipe "$s" "$rate" gap_analysis,report; done; done ;;
    attention)
      for s in $SEEDS; do for rate in 0.1 0.25 0.5; do
        dest=$OUT/attention/stock_s${s}_rule$rate
        [ -f "$dest/attention.json" ] && continue
        mkdir -p "$OUT/attention"
        fairseq-sparse-attention-analysis "$SOURCE/f${FRACTION}_s1/data-bin" --gen-subset test --output-dir "$dest" \
          --path "$(ls "$SOURCE/f${FRACTION}_s$s"/baseline/checkpoint_*_$UPDATES.pt | head -1)" \
          --gates-from "$(work_of "$s" "$rate")/pattern_freq_scratch/checkpoint_last.pt" > "$dest.log" 2>&1
      done; done ;;
    probe) OUT=$OUT "$(dirname "$0")/../2026-12-07-l0drop-merge/probe.sh" $(for s in $SEEDS; do echo "r0.1_s$s r0.25_s$s"; done) ;;
    summary) SEEDS=$SEEDS python3 "$(dirname "$0")/summarise.py" "$SOURCE" "$OUT" ;;
    *) echo "unknown phase $phase (train read attention probe summary)" >&2; exit 2 ;;
  esac
done
