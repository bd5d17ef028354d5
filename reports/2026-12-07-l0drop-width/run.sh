#!/usr/bin/env bash
# Width (issue 61): at 3+3 x 256 (FFN 1024, 4 heads), otherwise the merge study's setting, does dropping half the
# source states by the freq rule lose less of stock's BLEU than at x 128? The stock model and the freq rule at 0.5
# from scratch, seeds 1 and 2, four trainings side by side (one thread each), then each work dir's gap analysis and
# report. Both seeds read the merge study's seed-1 data (the same pairs, BPE, dictionary and test set as its x128 runs).
#   SOURCE=runs/merge OUT=runs/width reports/2026-12-07-l0drop-width/run.sh PHASE ...
# PHASE: train, read (after train), summary. A phase run again resumes (the recipe reuses what finished and restarts
# a training from its last checkpoint). NAME and SHAPE (default x256 and its options) let another shape's study run
# the same grid (the heads study: NAME=h8 SHAPE='--embed-dim 128 --ffn-dim 512 --heads 8').
set -euo pipefail
: "${SOURCE:?SOURCE=the OUT of the merge study}" "${OUT:?OUT=a folder for the work dirs}"
RECIPE=${RECIPE:-fairseq-sparse-recipe}
SEEDS=${SEEDS:-1 2}
UPDATES=850
NAME=${NAME:-x256}
read -r -a SHAPE <<< "${SHAPE:---embed-dim 256 --ffn-dim 1024 --heads 4}"
mkdir -p "$OUT"
common=(--data-bin "$SOURCE/f0.25_s1/data-bin" -s en -t de "${SHAPE[@]}"
        --baseline-updates "$UPDATES" --baseline-patience 0 --scratch-budget-points "$UPDATES"
        --validate-interval 5 --threads 1 --quiet --segment-types "$SOURCE/test.segment_types")
recipe() { "$RECIPE" --work-dir "$OUT/${NAME}_s$1" --seed "$1" "${common[@]}" --steps "$2"; }  # recipe SEED STEPS
for phase in "$@"; do
  case $phase in
    train)
      for s in $SEEDS; do recipe "$s" prepare; done
      pids=()
      for s in $SEEDS; do for m in baseline pattern_freq_scratch; do recipe "$s" "$m" & pids+=($!); done; done
      for p in "${pids[@]}"; do wait "$p"; done ;;
    read) for s in $SEEDS; do recipe "$s" gap_analysis,report; done ;;
    summary) python3 "$(dirname "$0")/summarise.py" "$SOURCE" "$OUT" ;;
    *) echo "unknown phase $phase (train read summary)" >&2; exit 2 ;;
  esac
done
