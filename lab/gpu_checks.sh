#!/usr/bin/env bash
# Every GPU check in one command, on a GPU machine with no network (lab/README.md; the device tool's notes):
#   1. install: into the machine's own Python environment where python3 is a venv (the device tool's machines:
#      their torch lives in one, which a nested venv's --system-site-packages would not see), else into a venv
#      over python3 (--system-site-packages); the wheels and sdists of wheelhouse/ (lab/gpu_wheelhouse.sh, run
#      where there is network), fairseq-fixed compiled from its sdist against that torch (--no-build-isolation;
#      CUDA_HOME unset, so not its CUDA kernels, which nothing here uses), this package (--no-deps); skipped when
#      the environment has fairseq-train and fairseq-sparse-recipe
#   2. tests: the cuda-marked tests of both tiers (pytest -m cuda -rs), or of the test paths in $TESTS
#   3. bench: the GPU benchmarks, fp16, transformer-base sizes: batch 1 and 64, source lengths 25/400/1000, beam 4;
#      first the fixed-shape search against fairseq's (fixed_bN: fp16, N 1, 64 or 256; fixed_fp32_b64: fp32)
# and writes one report folder, gpu_report/ (or $GPU_REPORT): device.json (GPU, torch, CUDA, Python, commit, date),
# pip.txt, pytest.txt (one line per test), bench/*.json and bench/*.txt, gpu_checks.log, summary.txt. Where $OUT is
# set (the device tool's, which brings back at most 8 files), the folder is /tmp/gpu_report and after every stage it
# is packed into $OUT/report.tgz, with $OUT/summary.txt beside it.
# Time limits per stage, in seconds (a stage past its limit is stopped and the next one runs; the report is packed
# either way): LIMIT_INSTALL, LIMIT_TESTS, LIMIT_BENCH (default: none). A device call that fits 15 minutes:
#   LIMIT_INSTALL=200 LIMIT_TESTS=300 LIMIT_BENCH=80 lab/gpu_checks.sh
#
#   lab/gpu_checks.sh [STAGE ...]     # stages: install tests bench (default: all three, in this order)
#   QUICK=1 lab/gpu_checks.sh bench   # the benchmarks with fewer repeats and lengths (a first look)
#   REPEATS=2 FIXED_LENGTHS=1000,2000 BENCH=fixed_b64 lab/gpu_checks.sh bench   # rounds; the fixed-shape rows' lengths
#   BENCH="l0drop_b64 composed_b64" lab/gpu_checks.sh bench   # only these runs (names as in bench/)
#   TESTS="tests/e2e/test_cuda.py::test_tools_run_on_cuda" lab/gpu_checks.sh tests   # paths or single tests
#   TRAINED_DATA=DATA_BIN TRAINED_CKPT=CKPT TRAINED_ARGS="-s en -t de --remove-bpe --tokenizer moses" \
#       BENCH=fixed_trained lab/gpu_checks.sh bench
#       # fairseq-generate with and without the fixed-shape search on a trained checkpoint (fp32, fp16), run first
# The fixed-shape search's device call is lab/calls/g_search_benchmark.sh.
# The bench stage resumes: a run whose bench/NAME.json exists is skipped (a second call on a warm machine
# goes on where the first one's time ran out). The fixed-shape benchmark writes bench/NAME.json.partial after each
# measurement, so a run stopped by its stage's limit still brings back what it measured.
set -uo pipefail
cd "$(dirname "$0")/.."
# bad limits or benchmark names stop the script before any work
for var in LIMIT_INSTALL LIMIT_TESTS LIMIT_BENCH; do
    [[ -z "${!var:-}" || "${!var}" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_checks.sh: $var must be whole seconds > 0, got '${!var}'"; exit 2; }
done
for name in ${BENCH:-}; do
    [[ "$name" =~ ^((l0drop|composed)_b(1|64)|fixed_b(1|64|256)|fixed_fp32_b64|fixed_trained|(heads|simplified)_len[0-9]+)$ ]] \
        || { echo "gpu_checks.sh: BENCH names no run '$name' (l0drop_bN, composed_bN with N 1 or 64; fixed_bN with N 1, 64 or 256; fixed_fp32_b64; fixed_trained (with TRAINED_CKPT, TRAINED_DATA); heads_lenL, simplified_lenL)"; exit 2; }
done
for path in ${TESTS:-}; do  # a path, or a test of one (path::name)
    [[ -e "${path%%::*}" ]] || { echo "gpu_checks.sh: TESTS names no test path '$path'"; exit 2; }
done
[[ -z "${REPEATS:-}" || "$REPEATS" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_checks.sh: REPEATS must be a whole number > 0, got '$REPEATS'"; exit 2; }
[[ -z "${FIXED_LENGTHS:-}" || "$FIXED_LENGTHS" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] \
    || { echo "gpu_checks.sh: FIXED_LENGTHS must be a comma list of source lengths, got '$FIXED_LENGTHS'"; exit 2; }
DEFAULT_REPORT=gpu_report
[[ -n "${OUT:-}" ]] && DEFAULT_REPORT=/tmp/gpu_report
REPORT=$(mkdir -p "${GPU_REPORT:-$DEFAULT_REPORT}" && cd "${GPU_REPORT:-$DEFAULT_REPORT}" && pwd)
# GPU_VENV: where to install; default: python3's own environment where it is a venv, else a new venv in /tmp
OWN_VENV=$(python3 -c 'import sys; print(sys.prefix if sys.prefix != sys.base_prefix else "")')
VENV=${GPU_VENV:-${OWN_VENV:-/tmp/fairseq-sparse-gpu-venv}}
WHEELHOUSE=${WHEELHOUSE:-wheelhouse}
PY="$VENV/bin/python"
export REPORT VENV WHEELHOUSE PY  # for a stage run under its time limit (run_stage: a new bash)
STAGES=("$@")
[[ ${#STAGES[@]} -gt 0 ]] || STAGES=(install tests bench)
exec > >(tee -a "$REPORT/gpu_checks.log") 2>&1

note() { echo "$*" | tee -a "$REPORT/summary.txt"; }

make_venv() {
    # the machine's torch and the rest of its packages stay visible; console scripts land in $VENV/bin, where
    # the tests look for them (next to sys.executable)
    python3 -m venv --system-site-packages "$VENV" || python3 -m venv --system-site-packages --without-pip "$VENV"
    [[ -x "$VENV/bin/pip" ]] || { echo "no pip in $VENV: python3 -m ensurepip is missing"; return 1; }
}

venv_works() {
    # the console scripts too: run from the repository, "import fairseq_sparse" works without the install
    [[ -x "$PY" && -x "$VENV/bin/fairseq-train" && -x "$VENV/bin/fairseq-sparse-recipe" ]] \
        && "$PY" -c "import fairseq, fairseq_sparse, torch" 2>/dev/null
}

install() {
    if venv_works; then note "install: $VENV works already; skipped"; return 0; fi
    [[ -d "$WHEELHOUSE" ]] || { note "install: no $WHEELHOUSE/ (run lab/gpu_wheelhouse.sh, carry it)"; return 1; }
    [[ -x "$PY" ]] || make_venv || return 1
    local pip=("$PY" -m pip install --no-index --find-links "$WHEELHOUSE")
    "${pip[@]}" setuptools wheel || return 1
    # every wheel and sdist but fairseq's, by name: pip resolves them against what the machine has
    local names
    names=$(ls "$WHEELHOUSE" | grep -v '^fairseq' | sed -E 's/(-|_)[0-9].*$//' | sort -u)
    "${pip[@]}" --no-build-isolation $names || return 1
    # without CUDA_HOME fairseq's setup.py leaves out its CUDA kernels (NAT's edit distance, n-gram blocking,
    # alignment training), which nothing here uses. (Built one after another: setup.py build_ext -j with torch's
    # ninja builder raced on the device, 2026-11-26, and failed to link.)
    # PyPI's cp312 manylinux wheel where the wheelhouse has it (about a second; its Cython extensions load under
    # numpy 2, and its torch C++ extensions, built against another torch, are never imported here), else the sdist
    local wheel
    wheel=$(ls "$WHEELHOUSE"/fairseq_fixed-*-cp312-*.whl 2>/dev/null | head -1)
    if [[ -n "$wheel" ]] && "${pip[@]}" --no-deps "$wheel" \
            && "$PY" -c "import fairseq.data.data_utils_fast, fairseq.data.token_block_utils_fast"; then
        note "install: fairseq-fixed from $(basename "$wheel")"
    else
        local src=/tmp/fairseq-fixed-src
        rm -rf "$src" && mkdir -p "$src" && tar -xzf "$WHEELHOUSE"/fairseq_fixed-*.tar.gz -C "$src" --strip-components=1
        env -u CUDA_HOME MAX_JOBS=${MAX_JOBS:-16} "${pip[@]}" --no-deps --no-build-isolation "$src" || return 1
    fi
    # --use-pep517: else setuptools 81 runs "setup.py develop", which calls pip again with build isolation (offline: fails)
    "${pip[@]}" --no-deps --no-build-isolation --use-pep517 -e . || return 1
    "$PY" -m pip check > "$REPORT/pip.txt" 2>&1 || note "install: pip check reports missing dependencies ($REPORT/pip.txt)"
    "$PY" -m pip list >> "$REPORT/pip.txt" 2>&1
    venv_works && note "install: done"
}

device_facts() {
    "$PY" - "$REPORT/device.json" <<'EOF'
import datetime, json, platform, subprocess, sys
import torch
facts = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "python": platform.python_version(),
         "torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
         "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
         "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()}
json.dump(facts, open(sys.argv[1], "w"), indent=1)
print(facts)
EOF
}

tests() {
    # -v: one line per test as it ends, so a stage stopped by its limit still says which passed
    "$PY" -m pytest -v -rs -m cuda -p no:cacheprovider ${TESTS:-tests/unit tests/e2e} --junitxml "$REPORT/pytest.xml" \
        2>&1 | tee "$REPORT/pytest.txt"
    note "tests: $(tail -1 "$REPORT/pytest.txt")"
}

bench_one() {
    # NAME SCRIPT ARGS...: one benchmark run, its table in bench/NAME.txt and its JSON in bench/NAME.json;
    # skipped where that JSON exists already, or where $BENCH is set and does not name it
    local name=$1 script=$2; shift 2
    [[ -z "${BENCH:-}" || " $BENCH " == *" $name "* ]] || return 0
    [[ -s "$REPORT/bench/$name.json" ]] && { echo "bench $name: done already"; return 0; }
    echo "bench $name ($(date +%T))"
    local precision=--fp16
    [[ "$name" == *_fp32_* ]] && precision=
    "$PY" -m "fairseq_sparse.benchmarks.${script%.py}" --device cuda $precision --json "$REPORT/bench/$name.json" "$@" \
        > "$REPORT/bench/$name.txt" 2>&1
    note "bench $name: exit $? ($script $*)"
}

bench() {
    mkdir -p "$REPORT/bench"
    local lengths=25,400,1000 repeats=3
    [[ -n "${QUICK:-}" ]] && lengths=25,400 repeats=1
    repeats=${REPEATS:-$repeats}
    # first the fixed-shape search through fairseq-generate on a trained checkpoint, fp32 and fp16: time, identical
    # hypotheses, BLEU (issue 53: the rows that say whether it is safe to use come first)
    if [[ -n "${TRAINED_CKPT:-}" ]]; then
        bench_one fixed_trained fixed_shape_checkpoint.py "$TRAINED_DATA" --path "$TRAINED_CKPT" \
            --generate-args "${TRAINED_ARGS:-}" --rounds "$repeats"
    fi
    # the fixed-shape search (CUDA graphs) against fairseq's SequenceGenerator, stock and L0Drop (issue 43)
    local fixed_lengths=$lengths  # and 2,000 source tokens (issue 43's lengths), but in a quick look
    [[ -n "${QUICK:-}" ]] || fixed_lengths=$lengths,2000
    fixed_lengths=${FIXED_LENGTHS:-$fixed_lengths}
    for batch in 64 1 256; do
        bench_one "fixed_b$batch" fixed_shape_search.py --batch-sizes $batch --lengths $fixed_lengths --beam 4 \
            --repeats $repeats
    done
    bench_one fixed_fp32_b64 fixed_shape_search.py --batch-sizes 64 --lengths $lengths --beam 4 --repeats $repeats
    # batch 64 first: where the bytes model says pruning the memory pays (and issue 25's goal is measured)
    for batch in 64 1; do
        bench_one "l0drop_b$batch" l0drop_decoding.py --lengths $lengths --batch-size $batch --beam 4 --repeats $repeats
        bench_one "composed_b$batch" composed.py --size base --lengths $lengths --batch-size $batch --beam 4 \
            --repeats $repeats
    done
    for len in ${lengths//,/ }; do
        bench_one "heads_len$len" head_pruning.py --batch-sizes 1,64 --src-len "$len" --beam 4 --repeats $repeats
        bench_one "simplified_len$len" simplified_decoder.py --no-bleu --batch-size 64 --src-len "$len" --beam 4 \
            --repeats $repeats
    done
}

pack() {
    # the report into $OUT (the device tool's folder), as one archive
    [[ -n "${OUT:-}" && "$(cd "$OUT" && pwd)" != "$REPORT" ]] || return 0
    cp "$REPORT/summary.txt" "$OUT/" 2>/dev/null
    tar -czf "$OUT/report.tgz" -C "$REPORT" .
}

run_stage() {
    # STAGE: its function, under its LIMIT_<STAGE> seconds if set (a subshell, so the limit stops all of it)
    local stage=$1 limit_var="LIMIT_${1^^}"
    local limit=${!limit_var:-}
    if [[ -n "$limit" ]]; then
        timeout "$limit" bash -c "set -uo pipefail; $(declare -f); $stage" || { local rc=$?; note "$stage: exit $rc$( ((rc == 124)) && echo " (stopped at its limit, $limit s)")"; return $rc; }
    else
        "$stage"
    fi
}

for stage in "${STAGES[@]}"; do
    echo "== $stage ($(date +%T))"
    case $stage in
        install) run_stage install || { note "install failed: see $REPORT/gpu_checks.log"; pack; exit 1; } ;;
        tests) device_facts; run_stage tests ;;
        bench) device_facts; run_stage bench ;;
        *) echo "unknown stage $stage (install, tests, bench)"; exit 2 ;;
    esac
    pack
done
note "report: $REPORT"
pack
