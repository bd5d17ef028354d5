#!/usr/bin/env bash
# The second call, on the machine run.sh left warm (nothing carried, so its work dirs stay): seed 1's trained
# checkpoints decoded in fp16 (the baseline; L0Drop at 0.5 with pruned decoding and with the full memory), to set
# beside the recipe's fp32 decodings of the same checkpoints (gpu_carry/W1/logs/generate.*.log in study.tgz); and the
# cuda-marked tests, for what is left of TIMEOUT seconds. Everything into $OUT/fp16.tgz and $OUT/pytest_cuda.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
W=${W:-gpu_carry/W1} DATA=${DATA:-${W:-gpu_carry/W1}/data-bin} O=${OUT:-/tmp} T=${TIMEOUT:-150}
BIN=$(dirname "$(command -v python3)")
mkdir -p /tmp/fp16
gen() {  # NAME CHECKPOINT [OPTION ...]: the recipe's fairseq-generate (beam 5, fairseq's defaults) with --fp16
    local name=$1 ckpt=$2; shift 2
    "$BIN/fairseq-generate" "$DATA" --user-dir fairseq_sparse --path "$W/$ckpt" --gen-subset test \
        --task translation --source-lang en --target-lang de --beam 5 --batch-size 64 --required-batch-size-multiple 1 \
        --lenpen 1.0 --min-len 1 --max-len-a 0 --max-len-b 200 --no-repeat-ngram-size 0 --max-source-positions 1024 \
        --max-target-positions 1024 --remove-bpe --tokenizer moses --fp16 "$@" > "/tmp/fp16/$name.txt" 2>&1
    echo "$name: exit $?"
}
(timeout $((T - 10)) python3 -m pytest -v -rs -m cuda -p no:cacheprovider tests/e2e/test_cuda.py \
    tests/e2e/test_generation_exactness.py > "$O/pytest_cuda.txt" 2>&1) &
gen baseline baseline/checkpoint_best.pt &
gen l0drop l0drop/checkpoint_last.pt &
gen l0drop_full l0drop/checkpoint_last.pt --model-overrides "{'pruned_decoding': False}" &
gen control control/checkpoint_last.pt &
wait
tar -czf "$O/fp16.tgz" -C /tmp fp16
tail -3 "$O/pytest_cuda.txt"
