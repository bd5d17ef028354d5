#!/usr/bin/env bash
# Drop against merge (issue 61, E1): on a quarter of the DDTP en-de pairs, 3+3 x 128 (post-norm, as the decisive
# study), 850 updates from scratch, the stock model beside the freq rule at 0.5 dropping and merging (mean,
# attention), side by side (one thread each); then learned gates at 0.5 dropping against merging (mean) beside the
# same stock model; then the recipe's gap analysis and report of the work dir.
#   CORPUS=ddtp/en-de OUT=runs/merge reports/2026-12-07-l0drop-merge/run.sh PHASE ...
# PHASE: rule1 / rule2 (the freq rule's three models and the stock model, seed 1 / 2), gates1 / gates2 (learned
# gates dropping and merging, seed 1 / 2, beside that seed's stock model), rest (after rule1: rule2, gates1 and
# gates2 side by side, with the reads), summary. A phase run again resumes its
# work dir (the recipe reuses what finished). EXTRA: more recipe options for every run (with an OUT of its own).
set -euo pipefail
: "${CORPUS:?CORPUS=the en-de corpus folder (train/valid/test.{en,de})}" "${OUT:?OUT=a folder for the work dirs}"
RECIPE=${RECIPE:-fairseq-sparse-recipe}
FRACTION=${FRACTION:-0.25}
UPDATES=${UPDATES:-850}
mkdir -p "$OUT"
common=(-s en -t de --baseline-updates "$UPDATES" --baseline-patience 0 --scratch-budget-points "$UPDATES"
        --validate-interval 5 --threads 1 --quiet)
if [ -f "$CORPUS/test.meta.tsv" ]; then
  [ -f "$OUT/test.segment_types" ] || cut -f5 "$CORPUS/test.meta.tsv" > "$OUT/test.segment_types"
  common+=(--segment-types "$OUT/test.segment_types")
fi
read -r -a extra <<< "${EXTRA:-}"
common+=(${extra[@]+"${extra[@]}"})
recipe() {  # recipe SEED STEPS: seed 2 reads seed 1's data (the same pairs, BPE and dictionary)
  local data=(--corpus "$CORPUS" --train-fraction "$FRACTION")
  if [ "$1" != 1 ] && [ -d "$OUT/f${FRACTION}_s1/data-bin" ]; then data=(--data-bin "$OUT/f${FRACTION}_s1/data-bin"); fi
  "$RECIPE" "${data[@]}" --work-dir "$OUT/f${FRACTION}_s$1" --seed "$1" "${common[@]}" --steps "$2"
}
side_by_side() {  # side_by_side SEED MODEL ...: each model in its own process, then the gap analysis and report
  local seed=$1 pids=() m
  shift
  recipe "$seed" prepare
  for m in "$@"; do recipe "$seed" "$m" & pids+=($!); done
  for m in "${pids[@]}"; do wait "$m"; done
  recipe "$seed" gap_analysis,report
}
RULE=(baseline pattern_freq_scratch pattern_freq_merge_mean_scratch pattern_freq_merge_attention_scratch)
GATES=(l0drop_scratch l0drop_merge_mean_scratch)
for phase in "$@"; do
  case $phase in
    rule1|rule2) side_by_side "${phase#rule}" "${RULE[@]}" ;;
    gates1|gates2) side_by_side "${phase#gates}" baseline "${GATES[@]}" ;;
    rest) # seed 1's read beside seed 2's rule models and both seeds' learned gates (7 trainings side by side; the
          # attention merge, secondary, on seed 1 only: the CPU's budget), then the reads of both seeds
      recipe 2 prepare
      pids=()
      for m in "${RULE[@]:0:3}"; do recipe 2 "$m" & pids+=($!); done
      for s in 1 2; do for m in "${GATES[@]}"; do recipe "$s" "$m" & pids+=($!); done; done
      recipe 1 gap_analysis,report
      for m in "${pids[@]}"; do wait "$m"; done
      recipe 2 gap_analysis,report
      recipe 1 gap_analysis,report ;;
    summary) python3 "$(dirname "$0")/summarise.py" "$OUT" ;;
    *) echo "unknown phase $phase (rule1 rule2 gates1 gates2 rest summary)" >&2; exit 2 ;;
  esac
done
