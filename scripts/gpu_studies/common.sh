# Sourced by the prepared study calls of this folder (docs/gpu.md, "One device call, one study"): the settings every
# call shares and `study`, which writes the machine and the software into the call's log, runs scripts/gpu_study.sh
# and prints the log's end. CARRY: the folder the call carries (default gpu_carry); SECONDS_LEFT: the call's budget
# (default 555 of the 600 a command may run); DEVICE=cpu AMP= is the plumbing mode; CHECK_ONLY=1 only checks the
# options and inputs (the test suite does, for every study here).
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
export PYTHONUNBUFFERED=1 THREADS=${THREADS:-2} SECONDS_LEFT=${SECONDS_LEFT:-555} DEVICE=${DEVICE:-cuda}
CARRY=${CARRY:-gpu_carry}
AMP=${AMP---amp}
# every decoding with the fixed-shape search (fairseq's hypotheses in fp32, its steps in CUDA graphs: about 6x
# fairseq's search on an H200, where the decodings were what cut the earlier studies' calls short); on the CPU it is
# fairseq's own search. SEARCH=fairseq for fairseq's everywhere.
SEARCH=${SEARCH:-fixed_shape}

study() {  # WORK_PREFIX SEEDS PHASE...  (EXTRA_ARGS: more recipe options, e.g. a shorter output for a rehearsal)
    local log=${OUT:-/tmp}/study.log
    RECIPE_ARGS="$RECIPE_ARGS ${EXTRA_ARGS:-}"
    if [[ -z "${CHECK_ONLY:-}" ]]; then
        { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1; python3 -c 'import torch, platform
print("torch", torch.__version__, "cuda", torch.version.cuda, "python", platform.python_version())'
          git log -1 --format='commit %h %cd' 2>/dev/null; nproc; echo "study $0 $*"; } >> "$log" 2>&1
        scripts/gpu_study.sh "$@" >> "$log" 2>&1
        local status=$?
        tail -30 "$log"
        return $status
    fi
    scripts/gpu_study.sh "$@"
}
