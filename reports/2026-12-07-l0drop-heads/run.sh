#!/usr/bin/env bash
# Heads (issue 61): at 3+3 x 128 with 8 heads per attention (head dim 16) instead of 4 (32), otherwise the merge
# study's setting, does dropping half the source states by the freq rule lose less of stock's BLEU? The width study's
# grid (its run.sh: stock and the freq rule at 0.5 from scratch, seeds 1 and 2, side by side, one thread each) with
# this shape, then this study's summary.
#   SOURCE=runs/merge OUT=runs/heads reports/2026-12-07-l0drop-heads/run.sh PHASE ...
# PHASE: train, read (after train), summary; a phase run again resumes.
set -euo pipefail
: "${SOURCE:?SOURCE=the OUT of the merge study}" "${OUT:?OUT=a folder for the work dirs}"
here=$(dirname "$0")
export SOURCE OUT NAME=h8 SHAPE="--embed-dim 128 --ffn-dim 512 --heads 8"
for phase in "$@"; do
  case $phase in
    train|read) "$here/../2026-12-07-l0drop-width/run.sh" "$phase" ;;
    summary) python3 "$here/summarise.py" "$SOURCE" "$OUT" ;;
    *) echo "unknown phase $phase (train read summary)" >&2; exit 2 ;;
  esac
done
