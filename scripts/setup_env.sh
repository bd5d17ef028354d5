#!/usr/bin/env bash
# Create or reuse the project's virtual environment (.venv) and install everything into it.
# Safe to re-run: a stamp file records the requirements that were installed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.fairseq_sparse_installed"
want=$(cat requirements.txt setup.py scripts/setup_env.sh | sha1sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
# (this machine's pip config names local index folders that may be absent: drop those warnings)
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
pip install --upgrade 'pip<26' wheel setuptools
# torch first, the CPU build on local disk; any other torch would pull a CUDA build. An exact pin for a
# reproducible environment; setup.py itself only asks for torch>=2.6.
pip install torch==2.13.0
pip install cython numpy
pip install -r requirements.txt
# fairseq: fairseq-fixed, a third-party packaging of fairseq that builds on Python 3.11
# (docs/install-and-environment.md). --no-deps keeps torchaudio (and another torch)
# out; --no-build-isolation builds its extensions against the torch installed above.
if ! "$VENV/bin/python" -c "import fairseq" 2>/dev/null; then
  pip install --no-deps --no-build-isolation fairseq-fixed==0.12.3.1
fi
pip install --no-deps -e .
echo "$want" > "$stamp"
