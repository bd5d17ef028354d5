#!/usr/bin/env bash
# The decisive L0Drop study (issue 52 item 4): the freq rule at 0.5 trained from scratch beside the stock model at
# equal updates (1,700 and 3,400), on all, half and a quarter of the training pairs, two seeds on all of them; then
# learned L0Drop gates from scratch with the pressure held back, and the gap analysis of each pair.
#   CORPUS=ddtp/en-de OUT=runs/decisive reports/2026-11-28-l0drop-decisive/run.sh [PHASE ...]
# PHASE: a (all pairs, seeds 1 and 2), b (halves and quarters, seed 1), d (L0Drop from scratch, seed 1), report.
# Each work dir resumes: a phase run again picks up where it stopped.
set -euo pipefail
: "${CORPUS:?CORPUS=the en-de corpus folder (train/valid/test.{en,de})}" "${OUT:?OUT=a folder for the work dirs}"
RECIPE=${RECIPE:-fairseq-sparse-recipe}
mkdir -p "$OUT"
SEGMENTS="$OUT/test.segment_types"
if [ -f "$CORPUS/test.meta.tsv" ] && [ ! -f "$SEGMENTS" ]; then
  cut -f5 "$CORPUS/test.meta.tsv" > "$SEGMENTS"
fi
common=(-s en -t de --baseline-updates 3400 --baseline-patience 0 --scratch-budget-points 1700,3400
        --validate-interval 5 --threads 1 --quiet)
[ -f "$SEGMENTS" ] && common+=(--segment-types "$SEGMENTS")
recipe() {  # recipe FRACTION SEED STEPS
  local work="$OUT/f$1_s$2" data=(--corpus "$CORPUS" --train-fraction "$1")
  if [ "$2" != 1 ] && [ -d "$OUT/f$1_s1/data-bin" ]; then data=(--data-bin "$OUT/f$1_s1/data-bin"); fi
  "$RECIPE" "${data[@]}" --work-dir "$work" --seed "$2" "${common[@]}" --steps "$3"
}
pair() {  # pair FRACTION SEED: the stock model and the freq rule from scratch, side by side (one thread each)
  recipe "$1" "$2" prepare
  recipe "$1" "$2" baseline & b=$!
  recipe "$1" "$2" pattern_freq_scratch & f=$!
  wait $b; wait $f
  recipe "$1" "$2" gap_analysis,report
}
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(a b d report)
for phase in "${phases[@]}"; do
  case $phase in
    a) pair 1 1; pair 1 2 ;;
    b) pair 0.5 1; pair 0.25 1 ;;
    d) recipe 1 1 l0drop_scratch; recipe 1 1 gap_analysis,report ;;
    report) python3 "$(dirname "$0")/summarise.py" "$OUT" ;;
    *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
done
