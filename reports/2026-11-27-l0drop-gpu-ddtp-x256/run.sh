#!/usr/bin/env bash
# Issue 42, study a (first call): does L0Drop keep its quality when the baseline is strong? One device call:
# 3+3 x 256 stock baselines of two seeds trained side by side on DDTP en-de with --amp for 3.25 minutes each
# (validation BLEU every 500 updates), then from each baseline, side by side, 1,000 updates of the equal-updates
# control, L0Drop at targets 0.5 and 0.3 and the rule-based freq pattern at 0.5 (budget points 500 and 1,000), every
# test sentence decoded (beam 5, fp32), BLEU and paired bootstrap per seed, all packed into $OUT.
#
# Carried: wheelhouse/ (lab/gpu_wheelhouse.sh, without fairseq-fixed's sdist: its cp312 wheel installs) and
# gpu_carry/: en-de/ (the DDTP en-de corpus, docs/recipe.md#real-text-the-ddtp-corpora: {train,valid,test}.{en,de}) and W1/ (that
# corpus after the recipe's prepare step on the CPU: data-bin, truncation.json):
#   fairseq-sparse-recipe --corpus gpu_carry/en-de -s en -t de --work-dir gpu_carry/W1 --steps prepare --device cpu
# Device call: run(carry ["wheelhouse", "gpu_carry"], timeout_s 600): reports/2026-11-27-l0drop-gpu-ddtp-x256/run.sh
# Then, on the CPU: python3 reports/2026-11-27-l0drop-gpu-ddtp-x256/summarise.py FILES_AT/study.tgz
# ARCH (sizes and the baseline's lr), MINUTES (the baselines' wall time), UPDATES and POINTS (the fine-tunings'
# budget and budget points), VALIDATE and FINETUNES (the steps beside the control) change the study; DEVICE=cpu
# AMP= is its plumbing mode here.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 THREADS=2 SECONDS_LEFT=${SECONDS_LEFT:-555} DEVICE=${DEVICE:-cuda}
POINTS=${POINTS:-500,1000}
export BRING_BACK="baseline/checkpoint_best.pt 1:l0drop/checkpoint_last.pt"
ARCH=${ARCH:-"--layers 3 --embed-dim 256 --ffn-dim 1024 --heads 4 --dropout 0.2 --lr 0.0015"}
export RECIPE_ARGS="--corpus gpu_carry/en-de -s en -t de ${AMP---amp} $ARCH --baseline-updates 100000 --baseline-minutes ${MINUTES:-3.25}
  --validate-interval-updates ${VALIDATE:-500} --baseline-patience 3 --finetune-updates ${UPDATES:-1000}
  --budget-points $POINTS --curve-updates ${POINTS%%,*} --l0drop-target 0.5 --l0drop-target-low 0.3"
LOG=${OUT:-/tmp}/study.log
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1; python3 -c 'import torch, platform;
print("torch", torch.__version__, "cuda", torch.version.cuda, "python", platform.python_version())';
  git log -1 --format='commit %h %cd' 2>/dev/null; nproc; } > "$LOG" 2>&1
lab/gpu_study.sh gpu_carry/W "1 2" baseline "${FINETUNES:-control,l0drop,l0drop_low,pattern_freq}" >> "$LOG" 2>&1
tail -40 "$LOG"
