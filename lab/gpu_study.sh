#!/usr/bin/env bash
# One device call, one complete study (lab/README.md, the device tool's notes): install offline where the recipe is missing
# (lab/gpu_checks.sh install: the wheels carried in wheelhouse/), then fairseq-sparse-recipe with one work dir
# per seed and the steps of each phase side by side, then the report step per seed, everything packed into $OUT
# after every phase. Every argument after the seeds is a phase, a comma list of steps; in a phase every (seed,
# step) pair is its own recipe process (the recipe lets steps after the baseline run as parallel processes over one
# work dir), all at once, and a phase starts when the one before it has ended. A re-run resumes: the recipe skips
# finished steps and a fine-tuning goes on from its checkpoint_last.
#
#   RECIPE_ARGS="--corpus DIR -s en -t de --amp --baseline-minutes 3 ..." \
#       lab/gpu_study.sh WORK_PREFIX "1 2" baseline control,l0drop
#
# WORK_PREFIX<seed> is each seed's work dir; {seed} in RECIPE_ARGS is replaced by each seed. A run may also be
# SEED@TAG (TAG: letters, digits, '.', '_', '-'), for several work dirs of one seed, e.g. one per data-bin: its work dir
# is WORK_PREFIX<TAG>_s<SEED> and {tag} in RECIPE_ARGS is replaced by TAG. A run may also be
# SEED@TAG (TAG: letters, digits, '.', '_', '-'), for several work dirs of one seed, e.g. one per data-bin: its work dir
# is WORK_PREFIX<TAG>_s<SEED> and {tag} in RECIPE_ARGS is replaced by TAG (e.g. each seed's own
# baseline brought back by an earlier call: --baseline-checkpoint gpu_carry/s{seed}_baseline_checkpoint_best.pt). Where WORK_PREFIX<first seed> holds a prepared data-bin (the prepare
# step run beforehand, e.g. on a CPU machine), the other seeds' dirs start from a copy of it (data-bin, tok,
# truncation.json) instead of preparing again. SECONDS_LEFT: the whole script's wall-clock budget, install
# included (default: none): every recipe process is stopped when it runs out, the packing still runs, and a stopped
# fine-tuning resumes from its last checkpoint in the next call. THREADS: --threads of each process (default 2).
# DEVICE=cpu: the plumbing mode on a CPU (the test suite runs it on tiny data; no install). CHECK_ONLY=1: the
# recipe's checks of the options, steps and inputs only, nothing run. VENV: the environment
# whose fairseq-sparse-recipe runs (default: python3's). Each process's output:
# WORK/study.STEP.out. Where $OUT is set (the device tool's), the work dirs without their checkpoints (nor
# data-bin and tok), and the install's report (WORK_PREFIXinstall_report), are packed into $OUT/study.tgz as each
# run ends, after every phase and after the report (nothing else of the install lands in $OUT), and BRING_BACK
# (checkpoints relative to a work dir, each seed's, or SEED:PATH for one seed's: e.g. "baseline/checkpoint_best.pt
# 1:l0drop/checkpoint_last.pt") is copied
# there at the end as model-only fp16 checkpoints, $OUT/s<seed>_<dir>_<file> (the device tool brings back at most
# 8 files of 16 MiB: one over BRING_BACK_MIB, default 15.5, comes as parts s<seed>_<dir>_<name>.partKofN.pt, which
# `lab/checkpoint_parts.py join` puts together; 3+3 x 256 with an 8k vocabulary is 23.6 MB in fp16, two parts),
# for the CPU's benchmarks and analyses, or to carry back to a later GPU run; a checkpoint that would make $OUT hold
# more than BRING_BACK_FILES files (default 8, what comes back) is left out, with a line saying so.
set -uo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 3 ]] || { echo "usage: gpu_study.sh WORK_PREFIX SEEDS PHASE [PHASE ...]  (RECIPE_ARGS: the recipe's options)"; exit 2; }
PREFIX=$1 SEEDS=$2; shift 2
[[ -n "${RECIPE_ARGS:-}" ]] || { echo "gpu_study.sh: RECIPE_ARGS must hold the recipe's options (--corpus or --data-bin ...)"; exit 2; }
for seed in $SEEDS; do [[ "$seed" =~ ^[0-9]+(@[A-Za-z0-9._-]+)?$ ]] || { echo "gpu_study.sh: seed '$seed' is not a whole number (or SEED@TAG)"; exit 2; }; done
[[ -n "${SEEDS// /}" ]] || { echo "gpu_study.sh: no seed given"; exit 2; }
[[ $(tr ' ' '\n' <<< "$SEEDS" | grep -c .) == $(tr ' ' '\n' <<< "$SEEDS" | grep . | sort -u | wc -l) ]] \
    || { echo "gpu_study.sh: a run is given twice in '$SEEDS' (two processes would train into one work dir)"; exit 2; }
dir_of() { if [[ "$1" == *@* ]]; then echo "$PREFIX${1#*@}_s${1%%@*}"; else echo "$PREFIX$1"; fi; }  # a run's work dir
args_of() { local a=${RECIPE_ARGS//\{seed\}/${1%%@*}}; [[ "$1" == *@* ]] && a=${a//\{tag\}/${1#*@}}; echo "$a"; }
[[ -z "${SECONDS_LEFT:-}" || "$SECONDS_LEFT" =~ ^[1-9][0-9]*$ ]] \
    || { echo "gpu_study.sh: SECONDS_LEFT must be whole seconds > 0, got '$SECONDS_LEFT'"; exit 2; }
[[ "${BRING_BACK_FILES:-8}" =~ ^[1-9][0-9]*$ && "${BRING_BACK_MIB:-15.5}" =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] \
    && awk "BEGIN { exit !(${BRING_BACK_MIB:-15.5} > 0) }" \
    || { echo "gpu_study.sh: BRING_BACK_FILES must be a whole number > 0 and BRING_BACK_MIB a number of MiB > 0"; exit 2; }
[[ "${THREADS:-2}" =~ ^[0-9]+$ ]] || { echo "gpu_study.sh: THREADS must be a whole number (torch threads a process), got '$THREADS'"; exit 2; }
for phase in "$@"; do
    [[ "$phase" =~ ^[a-z_0-9]+(,[a-z_0-9]+)*$ ]] || { echo "gpu_study.sh: phase '$phase' is not a comma list of steps"; exit 2; }
done
RECIPE=$(dirname "$(command -v python3)")/fairseq-sparse-recipe
[[ -x "${VENV:-}/bin/fairseq-sparse-recipe" ]] && RECIPE=$VENV/bin/fairseq-sparse-recipe
if [[ ! -x "$RECIPE" && "${DEVICE:-cuda}" != cpu ]]; then
    echo "install ($(date +%T))"
    # its report goes into the study's pack, not into $OUT: the files that come back are the study's
    OUT= GPU_REPORT="${PREFIX}install_report" lab/gpu_checks.sh install \
        || { echo "gpu_study.sh: the install failed"; [[ -n "${OUT:-}" ]] && tar -czf "$OUT/install_report.tgz" \
             "${PREFIX}install_report"; exit 1; }
    RECIPE=$(dirname "$(command -v python3)")/fairseq-sparse-recipe
fi
first=${SEEDS%% *}
# the recipe's own checks of every option, step and input (unknown steps, bad ranges, a missing corpus) before any work:
# the first seed's, and every tagged run's (each may read its own data)
for seed in $SEEDS; do
    [[ "$seed" == "$first" || "$seed" == *@* ]] || continue
    # shellcheck disable=SC2046
    "$(dirname "$RECIPE")/python" -c 'import sys; from fairseq_sparse.recipe.main import checked; checked(sys.argv[1:])' \
        $(args_of "$seed") --device "${DEVICE:-cuda}" --work-dir "$(dir_of "$seed")" --steps "$(IFS=,; echo "$*"),report" || exit 2
done
# steps after prepare need the prepared data: a --data-bin, a phase that prepares it, or the first run's work dir with it
if [[ ",$(IFS=,; echo "$*")," != *,prepare,* && " $RECIPE_ARGS " != *" --data-bin "* && ! -d "$(dir_of "$first")/data-bin" ]]; then
    echo "gpu_study.sh: no phase prepares the data and $(dir_of "$first")/data-bin does not exist: add the phase prepare, carry the prepared work dir, or give --data-bin"
    exit 2
fi
# a step fine-tuned from another step's model needs that model when its phase starts (a phase's steps run side by side):
# made in an earlier phase, held by the run's work dir already (carried, or an earlier call's on the warm machine), or,
# the baseline, given by --baseline-checkpoint; the report at the end compares every model with the baseline.
# start_of: the recipe's METHODS (tests/lab/test_gpu_study_script.py checks them against each other)
start_of() { case $1 in composed|simplified_control) echo simplified;; prepare|baseline|simplified|*_scratch|speed|gap_analysis) ;; *) echo baseline;; esac; }
earlier=" "  # the steps of the phases before the one looked at
for phase in "$@" report; do
    for step in ${phase//,/ }; do
        start=$(start_of "$step")
        [[ -z "$start" || "$earlier" == *" $start "* ]] && continue
        for seed in $SEEDS; do
            [[ -f "$(dir_of "$seed")/$start/checkpoint_best.pt" ]] && continue
            [[ "$start" == baseline && " $(args_of "$seed") " =~ \ --baseline-checkpoint[\ =] ]] && continue
            what="step $step starts from the $start model, which no earlier phase trains"
            [[ "$step" == report ]] && what="the report compares with the baseline model, which no phase trains"
            how="put $start in a phase before it, or carry $start/ in the work dir"
            [[ "$start" == baseline ]] && how="put baseline in a phase before it, carry baseline/ in the work dir, or give --baseline-checkpoint in RECIPE_ARGS"
            echo "gpu_study.sh: $what and $(dir_of "$seed")/$start/checkpoint_best.pt does not hold: $how"
            exit 2
        done
    done
    earlier+="${phase//,/ } "
done
[[ -z "${CHECK_ONLY:-}" ]] || { echo "gpu_study.sh: options, steps and inputs checked (CHECK_ONLY: nothing run)"; exit 0; }
FAILED=$(mktemp)  # a line per step that did not end with exit 0: the call's own exit status says so
LOCK="${TMPDIR:-/tmp}/gpu_study.$$.pack.lock"  # the packs' lock, outside $OUT
trap 'rm -f "$FAILED" "$LOCK" "${TMPDIR:-/tmp}/gpu_study.$$.tgz"' EXIT
for seed in $SEEDS; do
    [[ "$seed" == *@* ]] && continue  # a tagged run reads the data its own RECIPE_ARGS name
    W=$(dir_of "$seed") F=$(dir_of "$first")
    if [[ ! -d "$W/data-bin" && -d "$F/data-bin" ]]; then
        mkdir -p "$W"
        for f in data-bin tok truncation.json; do [[ -e "$F/$f" ]] && cp -r "$F/$f" "$W"/; done
    fi
done

recipe() {  # SEED STEPS
    local W limit=()
    W=$(dir_of "$1")
    mkdir -p "$W"
    if [[ -n "${SECONDS_LEFT:-}" ]]; then
        (( SECONDS < SECONDS_LEFT )) || { echo "  seed $1, $2: no time left"; echo "$1 $2 not run" >> "$FAILED"; return; }
        limit=(timeout $((SECONDS_LEFT - SECONDS)))
    fi
    # shellcheck disable=SC2086
    "${limit[@]}" "$RECIPE" $(args_of "$1") --device "${DEVICE:-cuda}" --seed "${1%%@*}" --work-dir "$W" \
        --steps "$2" --quiet --threads "${THREADS:-2}" >> "$W/study.${2//,/+}.out" 2>&1
    local status=$?
    echo "  seed $1, $2: exit $status ($(date +%T))"
    (( status == 0 )) || echo "$1 $2 exit $status" >> "$FAILED"
    pack  # as each run ends: a call cut off still brings back every run that finished
}

pack() {  # the runs side by side pack one at a time (a lock outside $OUT), each pack replacing the last whole
    [[ -n "${OUT:-}" ]] || return 0
    local dirs=(); for seed in $SEEDS; do [[ -d "$(dir_of "$seed")" ]] && dirs+=("$(dir_of "$seed")"); done
    [[ -d "${PREFIX}install_report" ]] && dirs+=("${PREFIX}install_report")
    (( ${#dirs[@]} )) || return 0
    (
        flock 9
        tar -czf "${TMPDIR:-/tmp}/gpu_study.$$.tgz" --exclude='*.pt' --exclude=data-bin --exclude=tok "${dirs[@]}" \
            && mv "${TMPDIR:-/tmp}/gpu_study.$$.tgz" "$OUT/study.tgz"
    ) 9> "$LOCK"
}

bring_back() {  # model-only fp16 copies, in parts where one is over 16 MiB, as long as the 8 files that come back hold them
    [[ -n "${OUT:-}" && -n "${BRING_BACK:-}" ]] || return 0
    local entry seed ckpt tmp files W
    tmp=$(mktemp -d)
    for entry in $BRING_BACK; do
        for seed in $SEEDS; do
            ckpt=$entry
            if [[ "$entry" == *:* ]]; then [[ "${entry%%:*}" == "$seed" ]] || continue; ckpt=${entry#*:}; fi
            W=$(dir_of "$seed")
            [[ -f "$W/$ckpt" ]] || { echo "  bring back $W/$ckpt: none"; continue; }
            "$(dirname "$RECIPE")/python" lab/checkpoint_parts.py split "$W/$ckpt" \
                "$tmp/s${seed//@/_}_${ckpt//\//_}" --max-mib "${BRING_BACK_MIB:-15.5}" > /dev/null \
                || { echo "  bring back $W/$ckpt: failed"; rm -f "$tmp"/*; continue; }
            files=$(( $(find "$OUT" -maxdepth 1 -type f | wc -l) + $(find "$tmp" -type f | wc -l) ))
            if (( files > ${BRING_BACK_FILES:-8} )); then
                echo "  bring back $W/$ckpt: left out ($files files would be more than the ${BRING_BACK_FILES:-8} that come back)"
                rm -f "$tmp"/*
            else
                mv "$tmp"/* "$OUT"/
            fi
        done
    done
    rmdir "$tmp"
}

for phase in "$@"; do
    echo "phase $phase ($(date +%T))"
    for seed in $SEEDS; do
        for step in ${phase//,/ }; do recipe "$seed" "$step" & done
    done
    wait
    pack
done
echo "report ($(date +%T))"
for seed in $SEEDS; do recipe "$seed" report & done
wait
pack
bring_back
echo "done ($(date +%T))"
if [[ -s "$FAILED" ]]; then
    echo "gpu_study.sh: $(wc -l < "$FAILED") step(s) did not end with exit 0 (a stopped run resumes in the next call): $(tr '\n' ';' < "$FAILED")"
    exit 1
fi
