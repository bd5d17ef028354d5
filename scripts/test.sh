#!/usr/bin/env bash
# The test command: create or reuse .venv (scripts/setup_env.sh), then run the test tiers: tests/unit
# (pure tensors and in-process models, under 3 minutes), tests/e2e (console scripts and training) and tests/lab
# (lab/, the machinery of the borrowed GPU runs, in its CPU plumbing mode).
# `scripts/test.sh --fast` runs tests/unit only; other arguments pass through to pytest. -rs: every skip's
# reason in the summary (the cuda-marked tests skip where torch sees no CUDA device). Both tiers run in
# TEST_WORKERS pytest-xdist processes (default: one per CPU core; 1 runs them in this process), a test file per
# worker (--dist loadfile), so each module-scoped fixture is built once; --fast runs in one process by default
# (each worker's start-up, importing torch and fairseq, costs more than the unit tier gains).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
tiers=(tests/unit tests/e2e tests/lab)
default_workers=auto
args=()
for a in "$@"; do
    if [[ "$a" == "--fast" ]]; then tiers=(tests/unit); default_workers=1; else args+=("$a"); fi
done
workers=${TEST_WORKERS:-$default_workers}
xdist=()
# --no-loadscope-reorder: files in the order tests/conftest.py gives them (the costliest first)
if [[ "$workers" != 1 ]]; then xdist=(-n "$workers" --dist loadfile --no-loadscope-reorder); fi
exec .venv/bin/python -m pytest -q -rs ${xdist[@]+"${xdist[@]}"} "${tiers[@]}" ${args[@]+"${args[@]}"}
