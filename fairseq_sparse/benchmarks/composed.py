#!/usr/bin/env python
"""Decoding speed of the composed model against stock fairseq, each single method and CTranslate2, side by side.

Variants (one model size; fairseq's SequenceGenerator, beam search, output length forced):

  stock            fairseq's own ``transformer``
  l0drop           L0Drop on the encoder output, pruned decoding (Zhang, Titov & Sennrich 2021, Algorithm 1)
  layers           L0Drop between every pair of encoder layers and on the output (Sec. 6), the encoder
                   compacted (states dropped after layer k leave layers k+1..) and pruned decoding
  layers_unpruned  the same checkpoint as ``layers`` decoded with pruned decoding off: every state in every
                   layer and in the memory (same hypotheses; layers / layers_unpruned is what compaction and
                   pruning gain on one model)
  heads            physically pruned heads (Voita et al. 2019; Michel et al. 2019): --heads-pruned of the
                   heads of every layer and attention type removed
  simplified       the simplified decoder, no decoder FFN (Yang et al. 2020)
  composed         all of them in one model: transformer_l0drop --l0drop-between-layers --simplified-decoder
                   --kept-heads, as fairseq-train plus fairseq-sparse-prune-heads produce it
  stock_int8       stock and composed with every Linear of the decoder and encoder layers and the output
  composed_int8    projection quantised to int8 (torch's dynamic quantisation, as fairseq-sparse-export --int8;
                   the L0Drop gates' projections stay float32); CPU only
  stock_ts         the TorchScript artefact of fairseq-sparse-export (the model and fairseq's beam search
  composed_ts      compiled with torch.jit.script, the same forced length; --int8 for composed_int8_ts): what
  composed_int8_ts is deployed without Python fairseq; CPU only
  ct2_float32      the stock model converted to CTranslate2 (optional dependency: pip install ctranslate2),
  ct2_int8         float32 and int8 weights, same beam, same forced length

Every model has random weights (built in-process, saved as fairseq checkpoints, loaded back as
fairseq-generate would). L0Drop gates close a chosen share of the source states: w is a fixed random
direction and b is calibrated on a batch of random sources of each length (not the benchmark batch), gate by
gate in forward order, so that the cumulative share pruned after encoder layer k is the k-th value of
--layer-sparsity and the share pruned at the output is --sparsity. ``--layer-sparsity paper`` takes the
rates of paper 000's between-layer run (WMT14 En-De, lambda 0.2: 0.0, 0.0, 8.6, 8.6, 8.7% after layers 1-5,
34.0% at the output; 6 layers only).

The output length is forced (--out-len tokens + EOS in fairseq; CTranslate2: min = max decoding length
--out-len, so one step less), so that every variant runs the same number of beam steps.

Timing (the rules of fairseq_sparse/benchmarks/bench_common.py): per source length one fresh subprocess loads every
variant and times one generate per variant in interleaved rounds whose order rotates; medians and paired
ratios (median of per-round ratios) against stock; the spread of those ratios is the run's noise.

Amdahl bound of each variant: the stock model's decoding time split by hooks into encoder self-attention and
FFN per layer, decoder self-attention, encoder-decoder attention, decoder FFN and the generator's per-step
reordering of the memory (encoder output, encoder-decoder key/value cache); the rest is embeddings, output
projection and beam search. Each variant removes a share of those parts: an attention with a fraction k of
its heads kept over a fraction r of its keys costs k * r (k * r^2 for encoder self-attention, quadratic in
its rows), an FFN over a fraction r of the rows costs r, a removed FFN 0. transformer_l0drop shares one
memory per sentence (fairseq's beamable encoder-decoder attention): no reordering, and the memory's keys and
values are projected and read once per sentence, not once per hypothesis, so its encoder-decoder attention
is counted at 1 / beam of stock's (it is bound by reading the keys and values on long sources). bound = 1 / (1 - removed share):
the speed-up if the removed work cost nothing and everything else stayed (an upper bound under proportional
costs). r is measured: the rows each encoder layer ran over and the memory the decoder attended to.

Bytes-per-step model of each variant (fairseq_sparse/analysis/decoding_traffic.py; the roofline idea of
Williams, Waterman & Patterson 2009): per decoding step, the bytes of the decoder weights, the
encoder-decoder keys and values (per hypothesis, or per sentence where the memory is shared), the
self-attention keys and values and the logits, read at the memory bandwidth, or the step's FLOPs at the peak
rate where that is slower; plus the encoder and the memory's projection once. "bytes" counts the reads any
decoder must do, "+copies" adds the copies fairseq's generator makes every step (cache concatenation and
reordering, the stock encoder output's reordering). Each variant's structure as measured (rows, memory,
heads, FFNs, shared memory); the bandwidth (a large tensor copy) and peak rate (a large matmul) are measured
in each timing child with the run's clock, or given (--bandwidth-gbs, --peak-tflops). The model has no
per-operation overhead: where that dominates (small batches, small models, the CPU) it predicts too little
time and ratios too far from 1.

Usage:
  python -m fairseq_sparse.benchmarks.composed --threads 1 --clock cpu                 # small model, 25/400/800 tokens
  python -m fairseq_sparse.benchmarks.composed --quick --threads 1 --clock cpu         # smoke run, a few minutes
  python -m fairseq_sparse.benchmarks.composed --size base --layer-sparsity paper --sparsity 0.34
"""
import argparse
import importlib.util
import math
import os
import time

from fairseq_sparse.benchmarks import bench_common
from fairseq_sparse.benchmarks.composed_measure import measure_memory, measure_times
from fairseq_sparse.benchmarks.composed_report import print_report, summarise
from fairseq_sparse.benchmarks.composed_variants import (CPU_ONLY, CT2_ARCHS, CT2_VARIANTS, INT8_VARIANTS,
                                                         L0DROP_NAMES, PAPER_LAYER_SPARSITY, TS_VARIANTS, VARIANTS,
                                                         build_checkpoints, checkpoint, source_lang)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="25,400,800", help="source lengths in tokens, EOS included (comma list)")
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--out-len", type=int, default=60, help="forced output length (tokens before EOS)")
    p.add_argument("--sparsity", type=float, default=0.5, help="share of source states pruned at the encoder output")
    p.add_argument("--layer-sparsity", default="0.5",
                   help="cumulative share of source states pruned after encoder layers 1..L-1: one value for all, a "
                        "comma list of L-1 non-decreasing values <= --sparsity, or 'paper' (paper 000's between-layer "
                        "run, 6 layers)")
    p.add_argument("--heads-pruned", type=float, default=0.5,
                   help="share of the heads of every layer and attention type removed (heads, composed)")
    bench_common.add_size_args(p, "--size", bench_common.SIZES, default="small", help_prefix="random models: ")
    p.add_argument("--path", action="append", metavar="NAME=CKPT",
                   help="time trained checkpoints instead of random models (repeat; one must be named stock, e.g. "
                        "a stock transformer; l0drop, layers and layers_unpruned must have L0Drop gates or a pattern; a name ending in _unpruned decodes with pruned decoding off; ct2_float32 "
                        "and ct2_int8 convert the stock checkpoint; stock_int8 and composed_int8 in --variants quantise "
                        "the stock and composed checkpoints); the rates and sizes options then do not apply")
    p.add_argument("--data", help="with --path: the checkpoints' data-bin (dictionaries; sources from --gen-subset)")
    p.add_argument("--gen-subset", default="test", help="with --data: the split whose sentences, concatenated, make "
                                                      "the sources (random tokens if it is missing)")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="comma list; the CTranslate2 variants are left out with a note when ctranslate2 is not "
                        "installed, unless named here")
    bench_common.add_run_args(p, repeats=3, threads=1)
    p.add_argument("--bandwidth-gbs", type=float,
                   help="memory bandwidth for the bytes-per-step model, GB/s (default: measured in each timing child, "
                        "a large tensor copy)")
    p.add_argument("--peak-tflops", type=float,
                   help="peak FLOP rate for the model's compute bound, TFLOP/s (default: measured, a large matmul in "
                        "the model's precision)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run (a few minutes on 2 cores): size tiny, batch 4, out-len 20, 2 repeats")
    p.add_argument("--workdir", help="keep the random checkpoints and child outputs here (default: a temp dir)")
    p.add_argument("--_child", help=argparse.SUPPRESS)  # internal: JSON spec of one measurement
    args = p.parse_args(argv)
    if args.quick:
        bench_common.apply_quick(args, {"batch_size": 4, "out_len": 20, "repeats": 2}, {"size": ("small", "tiny")})
    if args._child is None:
        check_args(p, args)
    return args


def check_args(p, args):
    """Everything the run needs, checked before anything is built or timed."""

    bench_common.check_size_args(p, args, args.size)
    bench_common.check_run_args(p, args)
    args._length_list = bench_common.int_list(p, "--lengths", args.lengths, low=2)
    for n in args._length_list:  # a checkpoint's own limit is checked with --path
        bench_common.check_range(p, "--lengths", n, 2, None if args.path else bench_common.MAX_POSITIONS)
    bench_common.check_range(p, "--batch-size", args.batch_size, 1, None)
    bench_common.check_range(p, "--out-len", args.out_len, 1, bench_common.MAX_POSITIONS - 1)
    for option, value in (("--bandwidth-gbs", args.bandwidth_gbs), ("--peak-tflops", args.peak_tflops)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            p.error(f"{option} {value}: must be a positive number")
    for option, value in (("--sparsity", args.sparsity), ("--heads-pruned", args.heads_pruned)):
        if not 0 <= value < 1:
            p.error(f"{option} {value}: must lie in [0, 1)")
    args._layer_rates = layer_rates(p, args)
    args._paths = checkpoint_paths(p, args)
    int8_of_paths = tuple(f"{name}{suffix}" for name in args._paths for suffix in ("_int8", "_ts", "_int8_ts")
                          if f"{name}{suffix}" in INT8_VARIANTS + TS_VARIANTS)
    known = tuple(args._paths) + int8_of_paths + CT2_VARIANTS if args._paths else VARIANTS
    asked = ([v.strip() for v in args.variants.split(",") if v.strip()] if not args._paths
             else list(args._paths) + [v.strip() for v in args.variants.split(",")
                                       if v.strip() in CT2_VARIANTS + int8_of_paths])
    unknown = [v for v in asked if v not in known]
    if unknown or not asked:
        p.error(f"--variants: unknown or none: {', '.join(unknown) or repr(args.variants)} "
                f"(choose from {', '.join(known)})")
    if "stock" not in asked:
        p.error("--variants / --path: every ratio is against stock; keep it in the list")
    if importlib.util.find_spec("ctranslate2") is None and any(v in asked for v in CT2_VARIANTS):
        if args.variants != p.get_default("variants"):
            p.error("--variants names a CTranslate2 variant but ctranslate2 is not installed (pip install ctranslate2)")
        print("note: ctranslate2 is not installed (pip install ctranslate2): the CTranslate2 variants are left out")
        asked = [v for v in asked if v not in CT2_VARIANTS]
    if args.device != "cpu" and any(v in asked for v in CPU_ONLY):
        if args.variants != p.get_default("variants"):
            p.error("the CTranslate2, int8 and TorchScript variants run on CPU here: --device cpu, or leave them out of "
                "--variants")
        print("note: the CTranslate2, int8 and TorchScript variants run on CPU here: left out on --device cuda")
        asked = [v for v in asked if v not in CPU_ONLY]
    args._variants = [v for v in known if v in asked]
    if args.workdir and os.path.exists(args.workdir) and not os.path.isdir(args.workdir):
        p.error(f"--workdir exists and is not a directory: {args.workdir}")


def checkpoint_paths(p, args):
    """{name: checkpoint} of --path, each checked (a complete checkpoint whose positions hold every length)."""
    from fairseq_sparse.analysis.sparsity_curve import describe_checkpoint
    from fairseq_sparse.checkpoint_safety import model_options, read_state
    from fairseq_sparse.cli.common import ToolError, check_checkpoint_file, check_data_dir

    args._options = {}  # name -> the checkpoint's model options (read once)
    if not args.path:
        if args.data:
            p.error("--data goes with --path")
        return {}
    if not args.data:
        p.error("--path needs --data (the checkpoints' data-bin)")
    paths = {}
    for item in args.path:
        name, _, path = item.partition("=")
        if not name or not path or name in paths or name in CPU_ONLY:
            p.error(f"--path {item}: give NAME=CKPT, each NAME once, not a CTranslate2 or int8 variant's name")
        try:
            check_checkpoint_file(path, f"--path {name}")
            check_data_dir(args.data, "--data")
        except ToolError as e:
            p.error(str(e))
        options = args._options[name] = model_options(read_state(path))
        if name.startswith(L0DROP_NAMES) and not describe_checkpoint(path)["gates"]["l0drop"]:
            p.error(f"--path {name}={path}: no L0Drop gates and no encoder-output pattern, so it would be timed "
                    f"as {name} while decoding as a stock model; give an L0Drop checkpoint under that name")
        limit = options.get("max_source_positions") or bench_common.MAX_POSITIONS
        if max(args._length_list) > limit:
            p.error(f"--lengths {max(args._length_list)}: beyond --path {name}'s {limit} source positions")
        paths[name] = os.path.abspath(path)
    stock = paths.get("stock")
    if stock and importlib.util.find_spec("ctranslate2") is not None and any(
            v in args.variants.split(",") for v in CT2_VARIANTS):
        arch = args._options["stock"].get("arch")
        if arch not in CT2_ARCHS:
            p.error(f"--path stock={stock}: CTranslate2 converts fairseq's transformer architectures ({arch} is not "
                    "one); give a stock transformer checkpoint or leave the CTranslate2 variants out of --variants")
    return paths


def layer_rates(p, args):
    """The cumulative sparsity after each of the encoder layers 1..L-1, checked."""
    text = args.layer_sparsity.strip()
    if text == "paper":
        if args.layers != 6:
            p.error(f"--layer-sparsity paper: paper 000's rates are for 6 encoder layers, the model has {args.layers}")
        rates = list(PAPER_LAYER_SPARSITY)
    else:
        try:
            rates = [float(x) for x in text.split(",")]
        except ValueError:
            p.error(f"--layer-sparsity: a number, a comma list of numbers or 'paper', got {text!r}")
        if len(rates) == 1:
            rates = rates * (args.layers - 1)
    if len(rates) != args.layers - 1:
        p.error(f"--layer-sparsity: {len(rates)} values for {args.layers - 1} gates between {args.layers} encoder layers")
    if any(not 0 <= r < 1 for r in rates):
        p.error(f"--layer-sparsity {text}: every value must lie in [0, 1)")
    if any(b < a for a, b in zip(rates, rates[1:])) or (rates and rates[-1] > args.sparsity):
        p.error(f"--layer-sparsity {text}: a state dropped stays dropped, so the values must not decrease and must "
                f"not exceed --sparsity {args.sparsity}")
    return rates


def run_child(args, mode, workdir, paths, data, length, **spec):
    spec.update({"mode": mode, "data": data, "length": length, "batch_size": args.batch_size, "beam": args.beam,
                 "out_len": args.out_len, "repeats": args.repeats, "warmup": args.warmup, "device": args.device,
                 "fp16": args.fp16, "threads": args.threads, "clock": args.clock, "seed": args.seed,
                 "bandwidth_gbs": args.bandwidth_gbs, "peak_tflops": args.peak_tflops,
                 "gen_subset": args.gen_subset, "source_lang": source_lang(args),
                 "sources": os.path.join(workdir, f"sources_{length}.pt"),
                 "paths": {v: checkpoint(paths, v, length) for v in args._variants + ["stock"]}})
    return bench_common.run_child(__spec__.name, workdir, spec)


def main(argv=None):
    bench_common.measure_or_run(parse_args(argv), measure_times, measure_memory, "composed_bench_", run)


def run(args, workdir):
    started = bench_common.start(args)
    bench_common.init_torch(args)
    lengths = args._length_list
    if args._paths:
        model_desc = "checkpoints " + ", ".join(f"{k}={v}" for k, v in args._paths.items())
    else:
        model_desc = (f"random models, {args.layers}+{args.layers} layers, dim {args.dim}, {args.heads} heads, FFN "
                      f"{args.ffn}, vocab {args.vocab}")
        print(f"building {model_desc} ...", flush=True)
    paths, data = build_checkpoints(args, workdir, lengths)
    timing, memory = {}, {}
    for n in lengths:
        print(f"timing {', '.join(args._variants)} @ {n} source tokens ...", flush=True)
        t0 = time.time()
        res = timing[n] = run_child(args, "times", workdir, paths, data, n, variants=args._variants)
        for v, r in res["jobs"].items():
            bench_common.print_rounds(v, r, 15)
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
    if args.device == "cpu" and not args.no_memory:
        print(f"peak memory at {max(lengths)} tokens, one fresh process per variant ...", flush=True)
        for v in args._variants:
            memory[(v, max(lengths))] = run_child(args, "memory", workdir, paths, data, max(lengths), variant=v)
    rows = summarise(args, timing, memory)
    meta = {"model": model_desc, "source": next(iter(timing.values()))["source"],
            **bench_common.machine_facts(args, started)}
    print_report(args, rows, meta)
    bench_common.finish(args, started, meta, {"rows": rows})


if __name__ == "__main__":
    main()
