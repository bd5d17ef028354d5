#!/usr/bin/env bash
# Layer allocation at equal cost (issue 61, E2): does a deeper encoder route the content of the dropped source states
# into the ones that stay? 3+3 against 6+1 x 128 (about the same cost, Kasai et al. 2021), both pre-norm, on a quarter
# of the DDTP en-de pairs, 850 updates from scratch: the stock model and the freq rule at 0.5 dropping, each arm with
# its own stock model (equal updates, batches, optimiser and schedule), seeds 1 and 2, every training side by side
# (one thread each); then the recipe's gap analysis and report of each work dir.
#   CORPUS=ddtp/en-de OUT=runs/layers reports/2026-12-07-l0drop-layers/run.sh train summary
# DATA_BIN: a data-bin to read instead of preparing one from CORPUS (the merge study's quarter: the same pairs, BPE
# and dictionary). A phase run again resumes its work dirs (the recipe reuses what finished).
set -euo pipefail
: "${OUT:?OUT=a folder for the work dirs}"
RECIPE=${RECIPE:-fairseq-sparse-recipe}
FRACTION=${FRACTION:-0.25}
UPDATES=${UPDATES:-850}
SEEDS=${SEEDS:-1 2}
ARMS=${ARMS:-3x3 6x1}  # the encoder-depth study: ARMS=6x3 beside this study's 3x3 work dirs
mkdir -p "$OUT"
common=(-s en -t de --pre-norm --baseline-updates "$UPDATES" --baseline-patience 0 --scratch-budget-points "$UPDATES"
        --validate-interval 5 --threads 1 --quiet)
if [ -n "${CORPUS:-}" ] && [ -f "$CORPUS/test.meta.tsv" ]; then
  [ -f "$OUT/test.segment_types" ] || cut -f5 "$CORPUS/test.meta.tsv" > "$OUT/test.segment_types"
fi
[ -f "$OUT/test.segment_types" ] && common+=(--segment-types "$OUT/test.segment_types")
depth() { case $1 in 3x3) echo "--encoder-layers 3 --decoder-layers 3" ;; 6x1) echo "--encoder-layers 6 --decoder-layers 1" ;;
  6x3) echo "--encoder-layers 6 --decoder-layers 3" ;; *) echo "unknown arm $1" >&2; exit 2 ;; esac; }
for arm in $ARMS; do depth "$arm" > /dev/null; done  # an unknown arm is refused before any work
recipe() {  # recipe ARM SEED STEPS: every work dir after the first reads the first one's data-bin
  local data
  if [ -n "${DATA_BIN:-}" ]; then data=(--data-bin "$DATA_BIN")
  elif [ -d "$OUT/3x3_s1/data-bin" ]; then data=(--data-bin "$OUT/3x3_s1/data-bin")
  else data=(--corpus "${CORPUS:?CORPUS or DATA_BIN}" --train-fraction "$FRACTION"); fi
  # shellcheck disable=SC2046
  "$RECIPE" "${data[@]}" --work-dir "$OUT/$1_s$2" --seed "$2" "${common[@]}" $(depth "$1") --steps "$3"
}
for phase in "$@"; do
  case $phase in
    train)
      pids=()
      for s in $SEEDS; do for arm in $ARMS; do recipe "$arm" "$s" prepare; done; done
      for s in $SEEDS; do for arm in $ARMS; do for m in baseline pattern_freq_scratch; do
        recipe "$arm" "$s" "$m" & pids+=($!); done; done; done
      for p in "${pids[@]}"; do wait "$p"; done
      for s in $SEEDS; do for arm in $ARMS; do recipe "$arm" "$s" gap_analysis,report; done; done ;;
    summary) python3 "$(dirname "$0")/summarise.py" "$OUT" ;;
    *) echo "unknown phase $phase (train summary)" >&2; exit 2 ;;
  esac
done
