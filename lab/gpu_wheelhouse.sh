#!/usr/bin/env bash
# Download, here (with network), what a GPU machine with no network lacks to run this project (docs/gpu.md,
# the device tool's notes: Python 3.12 with torch, numpy, sacrebleu, pytest, matplotlib, regex, cython and
# scikit-learn preinstalled) into wheelhouse/ (ignored by git; carried to the device with carry: ["wheelhouse"]):
# wheels for CPython 3.12 manylinux x86_64 (fairseq-fixed's too), and the sdists of what has no such wheel (compiled
# there by lab/gpu_checks.sh). Prints the folder's size (it must stay under 64 MiB
# with everything else carried).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-wheelhouse}
PIP=(.venv/bin/python -m pip)
[[ -x .venv/bin/python ]] || PIP=(python3 -m pip)

# the dependencies of fairseq and of this package, with theirs (fairseq-fixed is installed with --no-deps)
WHEELS=(hydra-core==1.3.2 omegaconf==2.3.0 bitarray sacremoses subword-nmt entmax tensorboardX
        absl-py nltk defusedxml mock six protobuf click joblib tqdm PyYAML portalocker tabulate colorama lxml
        packaging cffi pycparser setuptools wheel)
# no cp312 manylinux wheel on PyPI: the source, built there with --no-build-isolation
SDISTS=(antlr4-python3-runtime==4.9.3 rouge-score==0.1.2)

mkdir -p "$DEST"
"${PIP[@]}" download --no-deps -d "$DEST" --python-version 3.12 --implementation cp --only-binary=:all: \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 "${WHEELS[@]}"
# fairseq-fixed's cp312 manylinux wheel (installed in a second there); its 10 MiB sdist only where the wheel is
# missing (with it the wheelhouse is 41 MiB, over what the calls declare: 32)
"${PIP[@]}" download --no-deps -d "$DEST" --python-version 3.12 --implementation cp --only-binary=:all: \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    fairseq-fixed==0.12.3.1 || { echo "no cp312 wheel of fairseq-fixed: its sdist, built there"; SDISTS+=(fairseq-fixed==0.12.3.1); }
for spec in "${SDISTS[@]}"; do
    # --no-build-isolation: pip reads the sdist's metadata with this environment's setuptools, cython, numpy
    # and torch instead of building its build dependencies from source
    "${PIP[@]}" download --no-deps --no-build-isolation --no-binary="${spec%%==*}" -d "$DEST" "$spec"
done
echo "$(ls "$DEST" | wc -l) files in $DEST: $(du -sh "$DEST" | cut -f1)"
