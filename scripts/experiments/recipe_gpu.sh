#!/usr/bin/env bash
# fairseq-sparse-recipe on one GPU: one work dir per seed, and the steps of each phase side by side. Every argument
# after the seeds is a phase, a comma list of steps; in a phase every (seed, step) pair is its own recipe process
# (the recipe lets steps after the baseline run as parallel processes over one work dir), all at once, and a phase
# starts when the one before it has ended. Then the report step, per seed. A re-run resumes: the recipe skips
# finished steps and a fine-tuning goes on from its checkpoint_last.
#
#   RECIPE_ARGS="--corpus DIR -s en -t de --finetune-updates 2000 ..." \
#       scripts/experiments/recipe_gpu.sh WORK_PREFIX "1 2" baseline,simplified control,composed
#
# WORK_PREFIX<seed> is each seed's work dir. Where WORK_PREFIX<first seed> holds a prepared data-bin (the prepare
# step run beforehand, e.g. on a CPU machine), the other seeds' dirs start from a copy of it (data-bin, tok,
# truncation.json) instead of preparing again. SECONDS_LEFT: the whole script's wall-clock budget (default: none):
# every recipe process is stopped when it runs out, the packing still runs, and a stopped fine-tuning resumes from
# its last checkpoint in the next call. THREADS: --threads of each process (default 2). DEVICE=cpu: a plumbing
# check on a CPU. Each process's output: WORK/recipe_gpu.STEP.out. Where $OUT is set (the device tool's), the work
# dirs without their checkpoints (nor data-bin and tok) are packed into $OUT/recipe_gpu.tgz after every phase and
# after the report, and BRING_BACK (checkpoints relative to a work dir, e.g. "control/checkpoint_last.pt
# composed/pruned.pt") is copied there at the end without its optimiser state, as $OUT/s<seed>_<dir>_<file> (for the
# speed benchmarks on the CPU; the device tool brings back at most 16 MiB a file: 3+3 x 128 with an 8k vocabulary
# is 18 MB).
set -uo pipefail
cd "$(dirname "$0")/../.."
[[ $# -ge 3 ]] || { echo "usage: recipe_gpu.sh WORK_PREFIX SEEDS PHASE [PHASE ...]  (RECIPE_ARGS: the recipe's options)"; exit 2; }
PREFIX=$1 SEEDS=$2; shift 2
[[ -n "${RECIPE_ARGS:-}" ]] || { echo "recipe_gpu.sh: RECIPE_ARGS must hold the recipe's options (--corpus or --data-bin ...)"; exit 2; }
for seed in $SEEDS; do [[ "$seed" =~ ^[0-9]+$ ]] || { echo "recipe_gpu.sh: seed '$seed' is not a whole number"; exit 2; }; done
[[ -z "${SECONDS_LEFT:-}" || "$SECONDS_LEFT" =~ ^[1-9][0-9]*$ ]] \
    || { echo "recipe_gpu.sh: SECONDS_LEFT must be whole seconds > 0, got '$SECONDS_LEFT'"; exit 2; }
for phase in "$@"; do
    [[ "$phase" =~ ^[a-z_0-9]+(,[a-z_0-9]+)*$ ]] || { echo "recipe_gpu.sh: phase '$phase' is not a comma list of steps"; exit 2; }
done
RECIPE=$(dirname "$(command -v python3)")/fairseq-sparse-recipe
[[ -x "${VENV:-}/bin/fairseq-sparse-recipe" ]] && RECIPE=$VENV/bin/fairseq-sparse-recipe
first=${SEEDS%% *}
# the recipe's own checks of every option, step and input (unknown steps, bad ranges, a missing corpus) before any work
# shellcheck disable=SC2086
"$(dirname "$RECIPE")/python" -c 'import sys; from fairseq_sparse.recipe.main import checked; checked(sys.argv[1:])' \
    $RECIPE_ARGS --device "${DEVICE:-cuda}" --work-dir "$PREFIX$first" --steps "$(IFS=,; echo "$*"),report" || exit 2
for seed in $SEEDS; do
    W=$PREFIX$seed
    if [[ ! -d "$W/data-bin" && -d "$PREFIX$first/data-bin" ]]; then
        mkdir -p "$W" && cp -r "$PREFIX$first"/{data-bin,tok,truncation.json} "$W"/
    fi
done

recipe() {  # SEED STEPS
    local W=$PREFIX$1 limit=()
    mkdir -p "$W"
    if [[ -n "${SECONDS_LEFT:-}" ]]; then
        (( SECONDS < SECONDS_LEFT )) || { echo "  seed $1, $2: no time left"; return; }
        limit=(timeout $((SECONDS_LEFT - SECONDS)))
    fi
    # shellcheck disable=SC2086
    "${limit[@]}" "$RECIPE" $RECIPE_ARGS --device "${DEVICE:-cuda}" --seed "$1" --work-dir "$W" \
        --steps "$2" --quiet --threads "${THREADS:-2}" >> "$W/recipe_gpu.${2//,/+}.out" 2>&1
    echo "  seed $1, $2: exit $? ($(date +%T))"
}

pack() {
    [[ -n "${OUT:-}" ]] || return 0
    local dirs=(); for seed in $SEEDS; do dirs+=("$PREFIX$seed"); done
    tar -czf "$OUT/recipe_gpu.tgz" --exclude='*.pt' --exclude=data-bin --exclude=tok "${dirs[@]}"
}

bring_back() {  # model-only copies: fairseq reads a checkpoint without its optimiser state
    [[ -n "${OUT:-}" && -n "${BRING_BACK:-}" ]] || return 0
    for seed in $SEEDS; do
        for ckpt in $BRING_BACK; do
            python3 - "$PREFIX$seed/$ckpt" "$OUT/s${seed}_${ckpt//\//_}" <<'EOF_PY' || echo "  bring back $PREFIX$seed/$ckpt: failed"
import sys, torch
state = torch.load(sys.argv[1], map_location="cpu", weights_only=False)
state.pop("last_optimizer_state", None)
torch.save(state, sys.argv[2])
EOF_PY
        done
    done
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
