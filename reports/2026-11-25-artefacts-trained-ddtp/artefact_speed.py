#!/usr/bin/env python
"""CPU time of TorchScript artefacts (fairseq-sparse-export) translating one source file, interleaved (issue 25).

Each round translates SOURCE (tokenised and BPE'd as in training) with every artefact in turn, in batches, with one
thread, timed by the process's CPU time; the first artefact is the reference. Printed: per artefact the median
over the rounds and its ratio to the reference in the same round (median, min and max: how noisy the machine
was). Hypotheses are not scored here (int8_bleu.py does that).

    OMP_NUM_THREADS=1 python reports/2026-11-25-artefacts-trained-ddtp/artefact_speed.py \\
        --source WORK/tok/test.bpe.en --rounds 3 stock.ts.pt l0drop.ts.pt l0drop.int8.ts.pt
"""
import argparse
import os
import statistics
import time

import torch


def cpu_seconds(model, lines, batch_size):
    start = time.process_time()
    with torch.no_grad():
        for i in range(0, len(lines), batch_size):
            model.translate([model.encode(line) for line in lines[i:i + batch_size]])
    return time.process_time() - start


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("artefacts", nargs="+", help="TorchScript files; the first is the reference")
    p.add_argument("--source", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    a = p.parse_args(argv)
    for path in a.artefacts + [a.source]:
        if not os.path.isfile(path):
            p.error(f"no such file {path}")
    if a.rounds < 1 or a.batch_size < 1:
        p.error("--rounds and --batch-size must be at least 1")
    torch.set_num_threads(1)
    with open(a.source, encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    models = [torch.jit.load(path) for path in a.artefacts]
    cpu_seconds(models[0], lines[:a.batch_size], a.batch_size)  # warm-up: TorchScript's first-call profiling
    for m in models[1:]:
        cpu_seconds(m, lines[:a.batch_size], a.batch_size)
    times = [[cpu_seconds(m, lines, a.batch_size) for m in models] for _ in range(a.rounds)]
    print(f"{len(lines)} sentences, batches of {a.batch_size}, {a.rounds} interleaved rounds, one thread, CPU time")
    for k, path in enumerate(a.artefacts):
        ratios = [r[0] / r[k] for r in times]
        print(f"{os.path.basename(path)}: {statistics.median(r[k] for r in times):.1f} s; speed vs the first "
              f"{statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
