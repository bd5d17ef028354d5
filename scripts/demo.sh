#!/usr/bin/env bash
# The demo command: create or reuse .venv, then train, prune and decode offline:
# examples/l0drop_demo.py (L0Drop), examples/head_pruning_demo.py (head importance, gates, physical pruning)
# and examples/simplified_decoder_demo.py (simplified decoder, probing, per-layer AER), all in demo_out/ (demo_out_quick/ with --quick), sharing the corpus and the converged transformer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
work=demo_out
for arg in "$@"; do [ "$arg" = "--quick" ] && work=demo_out_quick; done
.venv/bin/python examples/l0drop_demo.py --work-dir "$work" "$@"
.venv/bin/python examples/head_pruning_demo.py --work-dir "$work" "$@"
.venv/bin/python examples/simplified_decoder_demo.py --work-dir "$work" "$@"
