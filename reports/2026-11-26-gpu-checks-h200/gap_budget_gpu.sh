#!/usr/bin/env bash
# Issue 23's gap against budget past what the CPU reaches in a session: from one baseline checkpoint, L0Drop with a
# target and its equal-updates control, for each seed, all side by side on one GPU for TRAIN_SECONDS of wall time
# (or MAX_UPDATE updates), checkpoints every SAVE_EVERY updates; then fairseq-generate (beam 5) on the test set at
# every budget that all runs reached. The training flags are the recipe's (fairseq-sparse-recipe's
# commands/control.sh and commands/l0drop.sh, 3+3 x 128 by default: ARCH_ARGS) without --cpu. Summary, paired
# bootstrap: reports/2026-11-26-gpu-checks-h200/gap_budget_summary.py OUT.
#
#   reports/2026-11-26-gpu-checks-h200/gap_budget_gpu.sh DATA_BIN BASELINE_PT OUT [SEEDS]    (DATA_BIN: fairseq-preprocess's folder)
#
# Re-running skips a run whose training log says it finished and a decoding that exists.
set -uo pipefail
cd "$(dirname "$0")/../.."
[[ $# -ge 3 ]] || { echo "usage: gap_budget_gpu.sh DATA_BIN BASELINE_PT OUT [SEEDS]"; exit 2; }
DATA=$(realpath "$1") BASE=$(realpath "$2") OUT=$3 SEEDS=${4:-"1 2"}
SRC=${SRC:-en} TGT=${TGT:-de} TARGET=${TARGET:-0.5} MAX_UPDATE=${MAX_UPDATE:-20000} SAVE_EVERY=${SAVE_EVERY:-600}
TRAIN_SECONDS=${TRAIN_SECONDS:-240} DEVICE_FLAG=${DEVICE_FLAG:-}   # DEVICE_FLAG=--cpu: a plumbing check on a CPU
# bad input stops the script before any work (the criterion refuses a target outside [0, 1) itself)
[[ -f "$DATA/dict.$SRC.txt" && -f "$DATA/dict.$TGT.txt" ]] || { echo "gap_budget_gpu.sh: $DATA has no dict.$SRC.txt / dict.$TGT.txt"; exit 2; }
[[ -f "$BASE" ]] || { echo "gap_budget_gpu.sh: no baseline checkpoint $BASE"; exit 2; }
for var in MAX_UPDATE SAVE_EVERY TRAIN_SECONDS; do
    [[ "${!var}" =~ ^[1-9][0-9]*$ ]] || { echo "gap_budget_gpu.sh: $var must be a whole number > 0, got '${!var}'"; exit 2; }
done
for seed in $SEEDS; do [[ "$seed" =~ ^[0-9]+$ ]] || { echo "gap_budget_gpu.sh: seed '$seed' is not a whole number"; exit 2; }; done
ARCH_ARGS=${ARCH_ARGS:-"--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 128 --decoder-embed-dim 128
  --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 --encoder-attention-heads 4 --decoder-attention-heads 4
  --share-all-embeddings"}
BIN=$(dirname "$(command -v python3)")
[[ -x "${VENV:-}/bin/fairseq-train" ]] && BIN=$VENV/bin
mkdir -p "$OUT/gen"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

train() {  # NAME SEED ARCH ARGS...
    local name=$1 seed=$2 arch=$3; shift 3
    grep -qs "done training" "$OUT/$name.log" && return 0
    timeout "$TRAIN_SECONDS" "$BIN/fairseq-train" "$DATA" --user-dir fairseq_sparse --task translation \
        --source-lang "$SRC" --target-lang "$TGT" --arch "$arch" $ARCH_ARGS --dropout 0.1 \
        --criterion label_smoothed_cross_entropy_with_sparsity --label-smoothing 0.1 --optimizer adam_sparsity \
        --sparsity-lr 0.05 --adam-betas '(0.9, 0.98)' --lr 0.0005 --lr-scheduler fixed --max-update "$MAX_UPDATE" \
        --finetune-from-model "$BASE" --save-dir "$OUT/$name" --save-interval-updates "$SAVE_EVERY" \
        --keep-interval-updates -1 --no-epoch-checkpoints --max-tokens 4096 --seed "$seed" $DEVICE_FLAG \
        --num-workers 0 --skip-invalid-size-inputs-valid-test --max-source-positions 1024 \
        --max-target-positions 1024 --required-batch-size-multiple 1 --log-format json --log-interval 50 "$@" \
        >> "$OUT/$name.log" 2>&1
}

runs=()
for seed in $SEEDS; do
    train "control_s$seed" "$seed" transformer_head_gates --head-gates '' &
    train "l0drop_s$seed" "$seed" transformer_l0drop --l0drop-target-sparsity "$TARGET" \
        --sparsity-target-warmup-updates 200 &
    runs+=("control_s$seed" "l0drop_s$seed")
done
wait
# the budgets every run reached (checkpoint_E_U.pt)
budgets=$(for r in "${runs[@]}"; do ls "$OUT/$r" | sed -nE 's/^checkpoint_[0-9]+_([0-9]+)\.pt$/\1/p' | sort -un; done \
          | sort -n | uniq -c | awk -v n=${#runs[@]} '$1 == n {print $2}')
echo "budgets reached by all ${#runs[@]} runs: $budgets"
for u in $budgets; do
    for r in "${runs[@]}"; do
        out="$OUT/gen/$r@$u.txt"
        [[ -s "$out" ]] && grep -q "^Generate test" "$out" && continue
        "$BIN/fairseq-generate" "$DATA" --user-dir fairseq_sparse --path "$(ls "$OUT/$r"/checkpoint_*_"$u".pt)" \
            --gen-subset test --task translation --source-lang "$SRC" --target-lang "$TGT" --beam 5 --batch-size 64 \
            --required-batch-size-multiple 1 $DEVICE_FLAG --lenpen 1.0 --min-len 1 --max-len-a 0.0 --max-len-b 200 \
            --no-repeat-ngram-size 0 --max-source-positions 1024 --max-target-positions 1024 --remove-bpe \
            --tokenizer moses > "$out" 2> "$out.err" &
    done
    wait
done
echo "decodings: $(ls "$OUT/gen" | grep -c 'txt$')"
