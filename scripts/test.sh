#!/usr/bin/env bash
# The test command: create or reuse .venv (scripts/setup_env.sh), then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
exec .venv/bin/python -m pytest -q tests "$@"
