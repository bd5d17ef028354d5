#!/usr/bin/env bash
# The demo command: create or reuse .venv, then run examples/demo.py: a synthetic corpus, a stock transformer
# and the simplified decoder, L0Drop, head gates, an attention regulariser and head importance pruning, each
# against an equal-updates control, the speed benchmarks, and one report (demo_out/REPORT.md).
# scripts/demo.sh --full: larger runs (demo_out_full/); --work-dir DIR, --seed N (a new work dir per seed).
# A re-run resumes where it stopped. Scores are deterministic (one thread, pinned AVX2 kernels:
# reports/2026-11-24-demo-determinism/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
exec .venv/bin/python examples/demo.py "$@"
