#!/usr/bin/env bash
# The quality-at-sparsity study of issue 23 on any corpus folder ({train,valid,test}.{SRC,TGT}): a converged
# baseline (fairseq's --patience, at most BASELINE_UPDATES), then L0Drop, head gates in all three types and their
# equal-updates control, each with checkpoints at the budget points, without and with word-level distillation
# from the baseline (the control gets the same teacher), for each seed. Resumable: re-run the same command; every
# finished step is skipped, an interrupted fairseq-train resumes from its checkpoint_last.pt.
#
#   reports/2026-11-24-l0drop-gap-pilot-kd/quality_budget.sh CORPUS SRC TGT OUT [SEEDS]      e.g. ... ddtp/en-de en de runs/ddtp "1 2"
#
# Each OUT/<distill>_seed<S>/REPORT.md holds the gap-against-budget table (budget/gap.png) with sacrebleu's paired
# bootstrap. Sizes and budgets: the variables below (environment overrides them).
set -euo pipefail
trap 'kill $(jobs -p) 2>/dev/null' EXIT
cd "$(dirname "$0")/../.."
CORPUS=$1 SRC=$2 TGT=$3 OUT=$4 SEEDS=${5:-"1 2"}
BASELINE_UPDATES=${BASELINE_UPDATES:-12000}
FINETUNE_UPDATES=${FINETUNE_UPDATES:-6000}
BUDGET_POINTS=${BUDGET_POINTS:-600,2000,6000}
BASELINE_PATIENCE=${BASELINE_PATIENCE:-8}
STEPS=${STEPS:-control,l0drop,heads_all}
DISTILL_WEIGHTS=${DISTILL_WEIGHTS:-"0 0.5"}
EXTRA=${EXTRA:-}
BASELINE_EXTRA=${BASELINE_EXTRA:-} FINETUNE_EXTRA=${FINETUNE_EXTRA:-}
PARALLEL=${PARALLEL:-0}  # 1: the runs with and without distillation side by side (give each --threads 1)
scripts/setup_env.sh
for seed in $SEEDS; do
  base="$OUT/seed$seed"
  # the baseline is shared by the runs with and without distillation (the same start for every comparison)
  .venv/bin/fairseq-sparse-recipe --corpus "$CORPUS" -s "$SRC" -t "$TGT" --work-dir "$base" --seed "$seed" \
    --steps prepare,baseline --baseline-updates "$BASELINE_UPDATES" --baseline-patience "$BASELINE_PATIENCE" $EXTRA $BASELINE_EXTRA
  for distill in $DISTILL_WEIGHTS; do
    work="$OUT/kd${distill}_seed$seed"
    mkdir -p "$work"
    for d in data-bin tok baseline; do [ -e "$work/$d" ] || ln -s "$(realpath "$base/$d")" "$work/$d"; done
    .venv/bin/fairseq-sparse-recipe --corpus "$CORPUS" -s "$SRC" -t "$TGT" --work-dir "$work" --seed "$seed" \
      --steps "$STEPS,report" --baseline-updates "$BASELINE_UPDATES" --baseline-patience "$BASELINE_PATIENCE" \
      --finetune-updates "$FINETUNE_UPDATES" --curve-updates "$FINETUNE_UPDATES" --budget-points "$BUDGET_POINTS" \
      --distill-weight "$distill" $EXTRA $FINETUNE_EXTRA > "$work.log" 2>&1 &
    [ "$PARALLEL" = 1 ] || wait $!
  done
  wait
done
