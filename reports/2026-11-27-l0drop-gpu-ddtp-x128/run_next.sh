#!/usr/bin/env bash
# Issue 42, study a, x128, the next call: from the baselines this study's first call brought back (fp16, model only;
# no baseline training in this call), both seeds side by side, 1,600 updates of the equal-updates control and of
# L0Drop at 0.5, budget points 800 (the first call's budget, now on every test sentence) and 1,600; every test
# sentence decoded, BLEU and paired bootstrap per seed; the four fine-tuned models brought back (fp16) so that a later
# call can train them on. The control trained on from the baseline is the baseline's own convergence check.
#
# Before the call, on the CPU (the baselines brought back by the first call, the prepared data-bin it used):
#   mkdir -p gpu_carry/x128 && cp BROUGHT_BACK/s[12]_baseline_checkpoint_best.pt gpu_carry/x128/
# Device call (about 54 MB carried):
#   run(carry ["wheelhouse", "gpu_carry/W1", "gpu_carry/x128"], timeout_s 600):
#       reports/2026-11-27-l0drop-gpu-ddtp-x128/run_next.sh
# At once if it was cut off (the machine stays warm 30 s; nothing carried, its work dirs resume), else after.sh:
#   run(timeout_s = what is left): SECONDS_LEFT=<that - 20> reports/2026-11-27-l0drop-gpu-ddtp-x128/run_next.sh
# Planned time: install 50 s, the baselines linked and decoded 20 s, L0Drop's 1,600 updates at about 6.5 updates/s
# (four runs side by side) 250 s, then its decodings (final, full memory, the 800-update point) and the report about
# 150 s: about 470 s of the 555 it allows itself. DEVICE=cpu AMP= UPDATES=4 POINTS=2,4 is its plumbing mode.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 THREADS=2 SECONDS_LEFT=${SECONDS_LEFT:-555} DEVICE=${DEVICE:-cuda}
UPDATES=${UPDATES:-1600}
export BRING_BACK="control/checkpoint_last.pt l0drop/checkpoint_last.pt"
export RECIPE_ARGS="--data-bin gpu_carry/W1/data-bin -s en -t de ${AMP---amp}
  --baseline-checkpoint gpu_carry/x128/s{seed}_baseline_checkpoint_best.pt
  --layers 3 --embed-dim 128 --ffn-dim 512 --heads 4 --dropout 0.1
  --finetune-updates $UPDATES --budget-points ${POINTS:-800,$UPDATES} --l0drop-target 0.5"
LOG=${OUT:-/tmp}/study.log
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1; python3 -c 'import torch, platform;
print("torch", torch.__version__, "cuda", torch.version.cuda, "python", platform.python_version())';
  git log -1 --format='commit %h %cd' 2>/dev/null; nproc; } >> "$LOG" 2>&1
lab/gpu_study.sh gpu_carry/C "1 2" baseline control,l0drop >> "$LOG" 2>&1
tail -30 "$LOG"
