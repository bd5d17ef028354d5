#!/usr/bin/env bash
# The prepared device calls of issue 42's studies c, d and e (lab/calls/) run on the CPU in their plumbing
# mode on the real corpora, one seed, tiny budgets: the whole call as the GPU would run it (phases side by side, every
# test sentence or document decoded, the report, the pack, the checkpoints brought back in parts), then collect.py.
# The data prepared as each script's head says, in gpu_carry/ (W1, sum_mixed, en-de and CH1). Needs the project's
# .venv; about 30 minutes on 2 cores. REHEARSAL: the folder for what the calls bring back (default: a new temporary
# one), refused where it exists already.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${REHEARSAL:-$(mktemp -u -d)}
[[ -e "$R" ]] && { echo "rehearse.sh: $R exists, not overwritten"; exit 2; }
export DEVICE=cpu AMP= VENV=.venv SEEDS=1 UPDATES=10 SECONDS_LEFT=3600 THREADS=1
mkdir -p "$R/rehearsal_c" "$R/rehearsal_d" "$R/rehearsal_e"
OUT=$R/rehearsal_d CORPUS=mixed MINUTES=1.5 lab/calls/d_summarisation.sh > "$R/rehearsal_d.out" 2>&1
OUT=$R/rehearsal_c MINUTES=1 lab/calls/c_heads_composed.sh > "$R/rehearsal_c.out" 2>&1
# e: outputs capped at 40 characters (a 36-update character model decodes to its 2 x source + 10 cap: 704 of 1,001
# sentences in 15 minutes on one thread), in a carry folder of its own (a work dir's baseline is kept with its
# validation's decoding settings, so the capped run cannot reuse an uncapped baseline: refused)
mkdir -p "$R/carry_e/CH1" && ln -s "$PWD/gpu_carry/en-de" "$R/carry_e/en-de" && cp -r gpu_carry/CH1/data-bin "$R/carry_e/CH1/"
OUT=$R/rehearsal_e CARRY=$R/carry_e MINUTES=1 EXTRA_ARGS="--max-len-a 0 --max-len-b 40" \
    lab/calls/e_char_level.sh > "$R/rehearsal_e.out" 2>&1
.venv/bin/python reports/2026-11-28-gpu-study-calls-cpu-rehearsal/collect.py "$R/rehearsal_c" "$R/rehearsal_d" "$R/rehearsal_e"
echo "rehearsal: $R"
