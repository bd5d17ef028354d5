#!/usr/bin/env bash
# The decisive L0Drop study (issue 52 item 4): the freq rule at 0.5 trained from scratch beside the stock model at
# equal updates, then the gap analysis of each pair.
#   CORPUS=ddtp/en-de OUT=runs/decisive [UPDATES=1700 POINTS=850,1700] reports/2026-11-28-l0drop-decisive/run.sh [PHASE ...]
# PHASE: s1, s2 (all pairs, seed 1 or 2), half, quarter (1/2 and 1/4 of the pairs, seed 1), l0drop (learned gates
# from scratch, pressure held back, seed SEED, default 1), gates (the stock model beside MODELS, default the freq rule
# and learned gates at --l0drop-target 0.5 and --l0drop-target-low 0.3 from scratch, on FRACTION of the pairs,
# default a quarter, seed SEED), protocol (the freq rule at 0.5 fine-tuned FT_UPDATES (default 600) from
# seed 1's baseline at the end of s1, beside its control, under the continued and the fresh protocol), protocol_l0drop
# (the same with learned gates at 0.5, seed SEED, PROTOCOLS, from FRACTION's stock model), lr (the fresh
# protocol at each of LRS, default 1.5e-4 and 1e-3, from seed SEED's stock model, default 1), summary. START: the
# stock checkpoint the fine-tunings start from (default checkpoint_last.pt of OUT/f1_sSEED/baseline). Each work dir resumes: a phase run again picks up where it
# stopped, and UPDATES raised later (with POINTS extended) continues the same runs (inverse-sqrt does not depend on
# the budget). EXTRA: more recipe options for every run (another model size: with an OUT of its own).
set -euo pipefail
: "${CORPUS:?CORPUS=the en-de corpus folder (train/valid/test.{en,de})}" "${OUT:?OUT=a folder for the work dirs}"
RECIPE=${RECIPE:-fairseq-sparse-recipe}
mkdir -p "$OUT"
SEGMENTS="$OUT/test.segment_types"
if [ -f "$CORPUS/test.meta.tsv" ] && [ ! -f "$SEGMENTS" ]; then
  cut -f5 "$CORPUS/test.meta.tsv" > "$SEGMENTS"
fi
common=(-s en -t de --baseline-updates "${UPDATES:-1700}" --baseline-patience 0 --scratch-budget-points "${POINTS:-850,1700}"
        --validate-interval 5 --threads 1 --quiet)
segments=()
[ -f "$SEGMENTS" ] && segments=(--segment-types "$SEGMENTS")
common+=("${segments[@]}")
read -r -a extra <<< "${EXTRA:-}"  # more recipe options for every run, e.g. EXTRA="--layers 6" (use another OUT)
common+=(${extra[@]+"${extra[@]}"})
recipe() {  # recipe FRACTION SEED STEPS
  local work="$OUT/f$1_s$2" data=(--corpus "$CORPUS" --train-fraction "$1")
  if [ "$2" != 1 ] && [ -d "$OUT/f$1_s1/data-bin" ]; then data=(--data-bin "$OUT/f$1_s1/data-bin"); fi
  "$RECIPE" "${data[@]}" --work-dir "$work" --seed "$2" "${common[@]}" --steps "$3"
}
pair() {  # pair FRACTION SEED [MODEL ...]: the stock model and each model from scratch (default: the freq rule),
          # side by side (one thread each)
  local fraction=$1 seed=$2 pids=() m
  shift 2
  recipe "$fraction" "$seed" prepare
  for m in baseline "${@:-pattern_freq_scratch}"; do recipe "$fraction" "$seed" "$m" & pids+=($!); done
  for m in "${pids[@]}"; do wait "$m"; done
  recipe "$fraction" "$seed" gap_analysis,report
}
finetune() {  # finetune PROTOCOL SEED STEPS [LR]: fine-tunings from the seed's stock model at its last update (all
              # the pairs; FRACTION: the stock model of that share of them, its work dir named _f<FRACTION>)
  local f=${FRACTION:-1} work lr=()
  local at="_f$f"
  [ "$f" = 1 ] && at=""
  work="$OUT/ft_$1${at}_s$2"
  if [ -n "${4:-}" ]; then work="$OUT/ft_$1_lr$4${at}_s$2"; lr=(--finetune-lr "$4"); fi
  local data="$OUT/f${f}_s$2/data-bin"
  [ -d "$data" ] || data="$OUT/f${f}_s1/data-bin"  # a second seed of a fraction reads seed 1's
  "$RECIPE" --data-bin "$data" --baseline-checkpoint "$OUT/f${f}_s$2/baseline/${START:-checkpoint_last.pt}" \
    --work-dir "$work" --seed "$2" -s en -t de --finetune-protocol "$1" --finetune-updates "${FT_UPDATES:-600}" \
    --validate-interval 5 --threads 1 --quiet "${segments[@]}" "${lr[@]}" --steps "$3"
}
protocol() {  # protocol SEED [METHOD]: METHOD (default the freq rule) and control side by side under each of PROTOCOLS
  for proto in ${PROTOCOLS:-continue fresh}; do
    finetune $proto "$1" baseline
    finetune $proto "$1" control & c=$!
    finetune $proto "$1" "${2:-pattern_freq}" & f=$!
    wait $c; wait $f
    finetune $proto "$1" gap_analysis,report
  done
}
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(s1 s2 summary)
for phase in "${phases[@]}"; do
  case $phase in
    s1) pair 1 1 ;;
    s2) pair 1 2 ;;
    half) pair 0.5 1 ;;
    quarter) pair 0.25 1 ;;
    l0drop) recipe 1 "${SEED:-1}" l0drop_scratch; recipe 1 "${SEED:-1}" gap_analysis,report ;;
    gates) pair "${FRACTION:-0.25}" "${SEED:-1}" ${MODELS:-pattern_freq_scratch l0drop_scratch l0drop_low_scratch} ;;
    lr) for lr in ${LRS:-1.5e-4 1e-3}; do  # the fresh protocol's learning rate, method and control alike
          finetune fresh "${SEED:-1}" baseline "$lr"
          finetune fresh "${SEED:-1}" control "$lr" & c=$!
          finetune fresh "${SEED:-1}" pattern_freq "$lr" & f=$!
          wait $c; wait $f
          finetune fresh "${SEED:-1}" gap_analysis,report "$lr"
        done ;;
    protocol) protocol 1 ;;
    protocol_l0drop) protocol "${SEED:-1}" l0drop ;;  # learned gates at --l0drop-target (0.5) against the control
    summary) python3 "$(dirname "$0")/summarise.py" "$OUT" ;;
    *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
done
