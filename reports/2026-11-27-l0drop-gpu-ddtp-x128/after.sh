#!/usr/bin/env bash
# The call right after run_next.sh, on the machine it left warm (nothing carried: its work dirs and the install
# stay), in what is left of the session's device time (TIMEOUT seconds, default 200), side by side:
#   - the x256 study's fp16.sh on seed 1's work dir: the baseline, L0Drop (pruned and full memory) and the control
#     decoded in fp16, beside the recipe's fp32 decodings; and the cuda-marked end-to-end tests (issue 42 item 1,
#     issue 43 item 4), into $OUT/fp16.tgz and $OUT/pytest_cuda.txt;
#   - the fixed-shape search through fairseq-generate on seed 1's baseline, fp32 and fp16 (issue 43: identical
#     hypotheses and BLEU on a trained checkpoint), into $OUT/report.tgz.
#   run(timeout_s = what is left): TIMEOUT=<that - 15> reports/2026-11-27-l0drop-gpu-ddtp-x128/after.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
T=${TIMEOUT:-200}
W=gpu_carry/C1 DATA=gpu_carry/W1/data-bin TIMEOUT=$T reports/2026-11-27-l0drop-gpu-ddtp-x256/fp16.sh &
TRAINED_DATA=gpu_carry/W1/data-bin TRAINED_CKPT=gpu_carry/x128/s1_baseline_checkpoint_best.pt \
    TRAINED_ARGS="-s en -t de --remove-bpe --tokenizer moses" QUICK=1 BENCH=fixed_trained LIMIT_BENCH=$((T - 10)) \
    lab/gpu_checks.sh bench
wait
