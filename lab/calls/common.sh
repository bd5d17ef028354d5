# Sourced by the prepared study calls of this folder (lab/README.md): the settings every
# call shares and `study`, which writes the machine and the software into the call's log, runs lab/gpu_study.sh
# and prints the log's end. CARRY: the folder the call carries (default gpu_carry); SECONDS_LEFT: the call's budget
# (default 555 of the 600 a command may run); DEVICE=cpu AMP= is the plumbing mode; CHECK_ONLY=1 only checks the
# options and inputs (the test suite does, for every study here). The #@ lines of each call: lab/preflight.py.
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
    # the carried inputs, before the install (a call without them would spend its install and stop)
    python3 lab/preflight.py --inputs "$0" || return 2
    if [[ -z "${CHECK_ONLY:-}" ]]; then
        { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1; python3 -c 'import torch, platform
print("torch", torch.__version__, "cuda", torch.version.cuda, "python", platform.python_version())'
          git log -1 --format='commit %h %cd' 2>/dev/null; nproc; echo "study $0 $*"; } >> "$log" 2>&1
        lab/gpu_study.sh "$@" >> "$log" 2>&1
        local status=$?
        if (( status != 0 )); then  # what to run next, at once, on the warm machine (the script's #@ lines)
            sed -n 's/^#@ resume /next, if it was cut off: /p; s/^#@ fallback /next, if the fixed-shape search failed: /p' "$0" >> "$log"
        fi
        tail -30 "$log"
        return $status
    fi
    lab/gpu_study.sh "$@"
}
