#!/usr/bin/env bash
# Does the target sparsity hold on small data? The test suite's setting at full size: a 4,000-pair synthetic
# corpus, a stock 2+2 x 64 transformer (400 updates), then L0Drop with only --l0drop-target-sparsity 0.5 and the
# plugin's optimiser for 400 updates, at two batch sizes (--max-tokens 3000 and 600: few and many updates per
# epoch). Prints the g_hat share of the valid and test source states pruned (eval mode, every sentence).
#
#   reports/2026-11-25-controller-small-data/target_small_data.sh OUT [SEEDS]        about 5 minutes per seed on one core
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=$1 SEEDS=${2:-1}
PY=.venv/bin/python BIN=.venv/bin
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1  # one core per run
TINY="--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 64 --decoder-embed-dim 64 --encoder-ffn-embed-dim 128
      --decoder-ffn-embed-dim 128 --encoder-attention-heads 4 --decoder-attention-heads 4 --share-all-embeddings
      --dropout 0.1"
COMMON="--optimizer adam --lr 2e-3 --lr-scheduler inverse_sqrt --warmup-updates 100 --log-interval 50
        --no-epoch-checkpoints --cpu --no-progress-bar --num-workers 0 --user-dir fairseq_sparse"
mkdir -p "$OUT"
[ -d "$OUT/bin" ] || {
  $PY -c "from fairseq_sparse.synthetic_corpus import make_corpus as m; m('$OUT/raw', train=4000, valid=100, test=60, min_len=2, max_len=12)"
  $BIN/fairseq-preprocess --source-lang src --target-lang tgt --trainpref "$OUT/raw/train" --validpref "$OUT/raw/valid" \
    --testpref "$OUT/raw/test" --destdir "$OUT/bin" --joined-dictionary --workers 1 > "$OUT/preprocess.log"
}
for seed in $SEEDS; do
  stock="$OUT/stock_seed$seed"
  [ -f "$stock/checkpoint_last.pt" ] || $BIN/fairseq-train "$OUT/bin" --arch transformer $TINY $COMMON --seed "$seed" \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 3000 --max-update 400 \
    --save-dir "$stock" > "$stock.log" 2>&1
  for tokens in 3000 600; do
    run="$OUT/l0drop_seed${seed}_tokens$tokens"
    [ -f "$run/checkpoint_last.pt" ] || $BIN/fairseq-train "$OUT/bin" --arch transformer_l0drop $TINY $COMMON \
      --seed "$seed" --criterion label_smoothed_cross_entropy_with_sparsity --label-smoothing 0.1 \
      --l0drop-target-sparsity 0.5 --optimizer adam_sparsity --lr 5e-4 --warmup-updates 1 --max-tokens "$tokens" \
      --finetune-from-model "$stock/checkpoint_last.pt" --max-update 400 --save-dir "$run" > "$run.log" 2>&1
    for split in valid test; do
      share=$($BIN/fairseq-generate "$OUT/bin" --user-dir fairseq_sparse --path "$run/checkpoint_last.pt" \
        --gen-subset "$split" --beam 1 --batch-size 64 --cpu 2>&1 | grep -o "L0Drop sparsity rate [0-9.]*% ([0-9]* of [0-9]*" | tail -1)
      echo "seed $seed --max-tokens $tokens $split: $share"
    done
  done
done
