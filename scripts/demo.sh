#!/usr/bin/env bash
# The demo command: create or reuse .venv, then run examples/demo.py: a synthetic corpus, a stock transformer
# and the simplified decoder, L0Drop, head gates, an attention regulariser and head importance pruning, each
# against an equal-updates control, the speed benchmarks, and one report (demo_out/REPORT.md).
# scripts/demo.sh --full: larger runs (demo_out_full/). A re-run resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
exec .venv/bin/python examples/demo.py "$@"
