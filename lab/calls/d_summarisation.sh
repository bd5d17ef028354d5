#!/usr/bin/env bash
# Issue 42, study d: L0Drop on summarisation from GPU-trained summarisers, two seeds side by side, one corpus a call
# (CORPUS=synopsis: one Debian package description -> its synopsis; CORPUS=mixed: trained on the synopsis and the
# multi-document training sets together, validated and tested on multi-document inputs, every description of a source
# package -> its synopsis, up to 1,000 tokens: the CPU study's setting, reports/2026-11-26-summarisation-ddtp-multidoc).
#   phase 1: the stock 3+3 x 256 baselines, MINUTES of training each (validation every 500 updates, patience 3);
#   phase 2, side by side, UPDATES updates each: control (no method), L0Drop at target 0.5 (l0drop) and at 0.7
#            (l0drop_low);
# then every test document decoded (beam 4, no repeated 3-grams, fp32), ROUGE-1/2/L with bootstrap intervals, the
# paired bootstrap against the control, the lead baseline (each source's first sentence) and every model's distinct
# outputs per document beside them (are the summarisers reading their input?), the share pruned by token type (the
# attention analysis of l0drop), the report; seed 1's two L0Drop checkpoints brought back (fp16, in parts) for the CPU
# benchmark of long-input decoding against the same model unpruned.
#
# Before, on the CPU (the DDTP synopsis and multi-document corpora, docs/recipe.md#real-text-the-ddtp-corpora; mixed: train = both
# training sets concatenated, valid and test = multidoc's):
#   fairseq-sparse-recipe --corpus ddtp_synopsis --tokenizer-lang en --truncate-source 1000 --metric rouge \
#       --work-dir gpu_carry/sum_synopsis --steps prepare --device cpu        # and ddtp_mixed -> gpu_carry/sum_mixed
# The call (CORPUS=mixed: the same with sum_mixed), what it carries (the size declared is sum_mixed's, 11.8 MiB;
# sum_synopsis's is 8.4), returns and plans: the #@ lines (lab/preflight.py).
#@ run wheelhouse gpu_carry/sum_$CORPUS/data-bin -- CORPUS=synopsis lab/calls/d_summarisation.sh
#@ carry wheelhouse 32
#@ carry gpu_carry/sum_$CORPUS/data-bin 11.8
#@ input gpu_carry/sum_$CORPUS/data-bin/dict.source.txt
#@ returns study.tgz 3
#@ returns study.log 0.1
#@ returns s1_l0drop_checkpoint_last.part1of2.pt 15.5
#@ returns s1_l0drop_checkpoint_last.part2of2.pt 7.3
#@ returns s1_l0drop_low_checkpoint_last.part1of2.pt 15.5
#@ returns s1_l0drop_low_checkpoint_last.part2of2.pt 7.3
#@ plan install 50 48 s on an H200 from the wheelhouse's fairseq wheel (2026-11-27)
#@ plan phase1 260 a baseline bounded by --baseline-minutes M takes about 1.22 M of wall time (2026-11-27)
#@ plan phase2 150 six fine-tunings side by side, 800 updates at about 5-6 updates/s (2026-11-27)
#@ plan decode 80 test documents, beam 4, under six runs side by side (2026-11-27's 70 s for 1,001 sentences)
#@ resume SECONDS_LEFT=<what is left - 20> CORPUS=synopsis lab/calls/d_summarisation.sh
#@ fallback SEARCH=fairseq SECONDS_LEFT=<what is left - 20> CORPUS=synopsis lab/calls/d_summarisation.sh
source "$(dirname "$0")/common.sh"
CORPUS=${CORPUS:-synopsis}
[[ "$CORPUS" == synopsis || "$CORPUS" == mixed ]] || { echo "d_summarisation.sh: CORPUS is synopsis or mixed, not '$CORPUS'"; exit 2; }
export BRING_BACK=${BRING_BACK-"1:l0drop/checkpoint_last.pt 1:l0drop_low/checkpoint_last.pt"}
export RECIPE_ARGS="--data-bin $CARRY/sum_$CORPUS/data-bin -s source -t target --tokenizer-lang en $AMP --search $SEARCH
  --metric rouge --beam 4 --no-repeat-ngram-size 3
  --layers 3 --embed-dim 256 --ffn-dim 1024 --heads 4 --dropout 0.2 --lr 0.0015
  --baseline-updates 100000 --baseline-minutes ${MINUTES:-3.5} --validate-interval-updates ${VALIDATE:-500}
  --baseline-patience 3 --finetune-updates ${UPDATES:-800} ${POINTS:+--budget-points $POINTS}
  --l0drop-target 0.5 --l0drop-target-low 0.7"
study "$CARRY/D_$CORPUS" "${SEEDS:-1 2}" baseline control,l0drop,l0drop_low
