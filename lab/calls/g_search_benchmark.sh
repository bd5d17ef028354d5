#!/usr/bin/env bash
# Issue 53 item 3: the fixed-shape search's benchmark call, its most important rows first, each written when measured
# (the benchmarks write NAME.json.partial after every row, lab/gpu_checks.sh packs $OUT/report.tgz after every stage
# and every stage has its limit, so a call cut off still brings back what it measured):
#   1. fixed_trained: a stock model trained on the CPU (DDTP en-de, 3+3 x 128, reports/2026-11-28-l0drop-decisive's
#      seed-1 baseline at 1,700 updates), all 1,001 test sentences by fairseq's search and by the fixed-shape search
#      (CUDA graphs), fp32 and fp16, REPEATS rounds: time, sacrebleu, the share identical to fairseq's fp32;
#   2. fixed_b1, then fixed_b64: random transformer-base, stock / L0Drop pruned at 50% / the same unpruned, 25 and 400
#      source tokens (FIXED_LENGTHS), fairseq / graphs / eager / indirect reorder (copy against ancestry table), fp16;
#   3. the search's CUDA unit tests, then the three CUDA tests no call has run to the end (pruned heads, the composed
#      model, the tools on CUDA).
# The rest, the next call (at once on the warm machine, or in a later session, carrying the same):
#   FIXED_LENGTHS=1000,2000 REPEATS=2 BENCH="fixed_b64 fixed_b256 fixed_fp32_b64" LIMIT_BENCH=420 lab/gpu_checks.sh bench
# (L0Drop pruned against the same model unpruned at 1,000+ tokens, batch 256, fp32).
#
# Before, on the CPU (DEC: a work dir of the decisive study that has reached 1,700 updates, about an hour on 2 cores:
#   CORPUS=ddtp/en-de OUT=runs/decisive UPDATES=1700 POINTS=850,1700 reports/2026-11-28-l0drop-decisive/run.sh s1
#   makes DEC=runs/decisive/f1_s1; the corpus: docs/recipe.md#real-text-the-ddtp-corpora):
#   mkdir -p gpu_carry/SB && cp -r DEC/data-bin gpu_carry/SB/ \
#     && python3 lab/checkpoint_parts.py split DEC/baseline/checkpoint_last.pt gpu_carry/SB/baseline.pt
#@ run wheelhouse gpu_carry/SB -- lab/calls/g_search_benchmark.sh
#@ carry wheelhouse 32
#@ carry gpu_carry/SB 12.9
#@ input gpu_carry/SB/data-bin
#@ input gpu_carry/SB/baseline.pt
#@ returns report.tgz 2
#@ returns summary.txt 0.01
#@ plan install 80 48 s on an H200 from the wheelhouse's fairseq wheel (2026-11-27), the venv's creation beside it
#@ plan fixed_trained 110 four fairseq-generate runs of 1,001 sentences a round, 13-21 s each on an H200 under load (2026-11-27), 2 rounds, model loading
#@ plan fixed_b1_b64 160 the quick fixed_b64 took under 95 s (2 lengths, 1 round, 2026-11-27); 2 rounds, the indirect reorder and the unpruned model added, batch 1 beside it
#@ plan tests 120 the three tests' fixtures train tiny models on the CPU first (22 CUDA tests took about 5 minutes, 2026-11-26)
#@ resume LIMIT_BENCH=<what is left - 30> REPEATS=2 FIXED_LENGTHS=25,400 TRAINED_CKPT=gpu_carry/SB/baseline.pt TRAINED_DATA=gpu_carry/SB/data-bin TRAINED_ARGS="-s en -t de --remove-bpe --tokenizer moses" BENCH="fixed_trained fixed_b1 fixed_b64" lab/gpu_checks.sh bench
#@ fallback none: the call measures the fixed-shape search against fairseq's; a failure of it is its result
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
python3 lab/preflight.py --inputs "$0" || exit 2
CARRY=${CARRY:-gpu_carry}
export TRAINED_CKPT=$CARRY/SB/baseline.pt TRAINED_DATA=$CARRY/SB/data-bin
export TRAINED_ARGS="-s en -t de --remove-bpe --tokenizer moses" REPEATS=${REPEATS:-2} FIXED_LENGTHS=${FIXED_LENGTHS:-25,400}
LIMIT_INSTALL=${LIMIT_INSTALL:-150} lab/gpu_checks.sh install || exit 1
BENCH="fixed_trained fixed_b1 fixed_b64" LIMIT_BENCH=${LIMIT_BENCH:-280} lab/gpu_checks.sh bench
# the search's own CUDA unit tests first (seconds, no fixture to train), then the three end-to-end ones
TESTS="tests/unit/test_fixed_shape_search.py tests/e2e/test_cuda.py::test_pruned_heads_decode_like_the_masked_model_on_cuda
       tests/e2e/test_cuda.py::test_composed_model_decodes_exactly_on_cuda tests/e2e/test_cuda.py::test_tools_run_on_cuda" \
    LIMIT_TESTS=${LIMIT_TESTS:-110} lab/gpu_checks.sh tests
