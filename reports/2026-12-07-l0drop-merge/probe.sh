#!/usr/bin/env bash
# The content probe (fairseq-sparse-l0drop-gates --content-probe) on every source-pruning model of the study's work
# dirs: how much of each pruned source piece the states the decoder still sees hold, against the floor of the kept
# pieces' embeddings, on the first N (default 3000) training pairs (80% to train the probe, 20% to score it).
#   OUT=runs/merge [N=3000] [DATA_BIN=...] reports/2026-12-07-l0drop-merge/probe.sh [WORK_DIR_NAME ...]
# (default: every *s<seed> dir; DATA_BIN: the data-bin of work dirs made with --data-bin, e.g. the layers study's)
# Writes WORK/probe/MODEL.json (kept where it exists); summarise.py reads them.
set -euo pipefail
: "${OUT:?OUT=the folder of the study work dirs}"
TOOL=${TOOL:-fairseq-sparse-l0drop-gates}
USER_DIR=$(python3 -c "import fairseq_sparse, os; print(os.path.dirname(fairseq_sparse.__file__))")
names=("$@")
[ ${#names[@]} -eq 0 ] && names=($(cd "$OUT" && ls -d *s[0-9]* 2>/dev/null))
for name in "${names[@]}"; do
  work="$OUT/$name" data="${DATA_BIN:-$OUT/$name/data-bin}"
  [ -d "$data" ] || data="$OUT/${name%s*}s1/data-bin"  # a second seed reads the first seed's data
  mkdir -p "$work/probe"
  for model in pattern_freq_scratch pattern_freq_merge_mean_scratch pattern_freq_merge_attention_scratch \
               l0drop_scratch l0drop_merge_mean_scratch; do
    ckpt="$work/$model/checkpoint_last.pt"
    [ -f "$ckpt" ] && [ -f "$work/$model/timing.json" ] || continue  # a finished run only
    [ -f "$work/probe/$model.json" ] && continue
    "$TOOL" "$data" --user-dir "$USER_DIR" \
      --path "$ckpt" --gen-subset train --cpu --batch-size 64 --gates-output "$work/probe/$model.gates.tsv" \
      --content-probe "$work/probe/$model.json" --content-probe-sentences "${N:-3000}" -s en -t de --overwrite \
      > "$work/probe/$model.log" 2>&1
    rm -f "$work/probe/$model.gates.tsv"
    tail -1 "$work/probe/$model.log"
  done
done
