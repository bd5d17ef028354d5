#!/usr/bin/env bash
# The demo command: create or reuse .venv, then train, prune and decode offline (examples/l0drop_demo.py).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
exec .venv/bin/python examples/l0drop_demo.py --work-dir demo_out "$@"
