#!/usr/bin/env python
"""Decoding speed of the fixed-shape beam search (``--task translation_fixed_shape``) against fairseq's
SequenceGenerator, side by side in one run, on the same models and inputs.

For each model (``--models``: ``stock``, fairseq's own transformer; ``l0drop``, transformer_l0drop with pruned
decoding and its gates closed for ``--sparsity`` of the source states, as benchmarks/l0drop_decoding.py closes
them), batch size and source length, two searches decode the same batch of random sources:

  fairseq      fairseq's SequenceGenerator (what fairseq-generate runs)
  fixed_shape  fairseq_sparse/fixed_shape_search.py (rows never removed, finished hypotheses in preallocated
               tensors, self-attention keys and values in preallocated buffers, the memory never reordered)

The output length is forced (``min_len = max_len = --out-len``), so both run the same number of steps; their
hypotheses must be the same (checked; the largest score difference is printed). Interleaved timing rounds in an
order rotated every round (benchmarks/bench_common.py), the median per search and the median of the per-round
ratios; the spread of those ratios says how noisy the run was. Memory on CUDA: ``torch.cuda.max_memory_allocated``
during one generate of each search.

Usage:
  python benchmarks/fixed_shape_search.py --quick --threads 1 --clock cpu     # about a minute on 2 cores
  python benchmarks/fixed_shape_search.py --device cuda --fp16 --batch-sizes 1,64 --lengths 25,400,1000
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common  # noqa: E402
from bench_common import print_header  # noqa: E402

MODELS = ("stock", "l0drop")
SEARCHES = ("fairseq", "fixed_shape")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    p.add_argument("--lengths", default="25,400", help="source lengths in tokens, EOS included (comma list)")
    p.add_argument("--batch-sizes", default="1,16", help="sentences per batch (comma list)")
    p.add_argument("--out-len", type=int, default=60, help="forced output length (tokens before EOS)")
    p.add_argument("--sparsity", type=float, default=0.5, help="l0drop: share of the source states pruned")
    bench_common.add_size_args(p, help_prefix="random model: ")
    bench_common.add_run_args(p, repeats=3, threads=0)
    p.add_argument("--quick", action="store_true",
                   help="small and fast: lengths 25,200, batch sizes 1,8, out-len 20")
    args = p.parse_args(argv)
    if args.quick:
        bench_common.apply_quick(args, {"out_len": 20, "repeats": 3},
                                 {"lengths": ("25,400", "25,200"), "batch_sizes": ("1,16", "1,8")})
    bench_common.check_size_args(p, args)
    bench_common.check_run_args(p, args)
    args._lengths = bench_common.int_list(p, "--lengths", args.lengths, low=2)
    for n in args._lengths:
        bench_common.check_range(p, "--lengths", n, 2)
    args._batch_sizes = bench_common.int_list(p, "--batch-sizes", args.batch_sizes)
    bench_common.check_range(p, "--out-len", args.out_len, 1, bench_common.MAX_POSITIONS - 1)
    if not 0 <= args.sparsity < 1:
        p.error(f"--sparsity {args.sparsity}: must lie in [0, 1)")
    args._models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args._models if m not in MODELS]
    if unknown or not args._models:
        p.error(f"--models: unknown or none: {', '.join(unknown) or repr(args.models)} (choose from {', '.join(MODELS)})")
    return args


def build(args, name, data_dir, calibration_len):
    """A random model of args' size: stock, or L0Drop with the share --sparsity of its states pruned (the gate
    closing point calibrated on random sources of ``calibration_len`` tokens, not the benchmark's)."""
    import torch

    arch = "transformer" if name == "stock" else "transformer_l0drop"
    model, task, _ = bench_common.build_random_model(args, data_dir, ["--arch", arch])
    model.eval()
    if name == "l0drop":
        enc, d = model.encoder, task.source_dictionary
        w = torch.randn(args.dim, generator=torch.Generator().manual_seed(args.seed + 1))
        calib = bench_common.random_sources(d, bench_common.CALIBRATION_SENTENCES, calibration_len, args.seed + 2)
        with torch.no_grad():
            enc.l0drop.reset_parameters()
            enc.pruned_decoding = False
            x = enc(calib, src_lengths=torch.full((calib.size(0),), calibration_len))["encoder_out"][0]
            enc.pruned_decoding = True
            bench_common.close_gate_at_quantile(enc.l0drop.log_alpha_proj, (x @ w).flatten(), w, args.sparsity)
    model.to(args.torch_device)
    if args.fp16:
        model.half()
    return model, task


def generators(model, task, args):
    from fairseq_sparse.fixed_shape_search import FixedShapeSequenceGenerator

    fairseq = bench_common.forced_generator(model, task.target_dictionary, args.beam, args.out_len)
    fixed = FixedShapeSequenceGenerator([model], task.target_dictionary, beam_size=args.beam, max_len_a=0,
                                        max_len_b=args.out_len, min_len=args.out_len)
    return {"fairseq": fairseq, "fixed_shape": fixed}


def compare(outs):
    """(same hypotheses?, largest score difference) of the two searches' outputs."""
    a, b = outs["fairseq"], outs["fixed_shape"]
    same = all([h["tokens"].tolist() for h in x] == [h["tokens"].tolist() for h in y] for x, y in zip(a, b))
    diff = max(abs(float(h["score"]) - float(g["score"])) for x, y in zip(a, b) for h, g in zip(x, y))
    return same, diff


def measure(args, model, task, batch, length):
    torch = bench_common.init_torch(args)
    cuda = args.device == "cuda"
    src = bench_common.random_sources(task.source_dictionary, batch, length, args.seed + 1000 * length + batch)
    sample = bench_common.source_sample(src.to(args.torch_device))
    gens = generators(model, task, args)
    outs, memory = {}, {}
    with torch.no_grad():
        for name, gen in gens.items():
            for _ in range(max(1, args.warmup)):
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                outs[name] = gen.generate([model], sample)
            memory[name] = torch.cuda.max_memory_allocated() / 2 ** 20 if cuda else None
        rounds = bench_common.time_rounds({n: (lambda g=g: g.generate([model], sample)) for n, g in gens.items()},
                                          args.repeats, cuda=cuda)
    same, diff = compare(outs)
    times = {n: bench_common.clock_medians(r, args.clock) for n, r in rounds.items()}
    ratio, paired = bench_common.speedup(times["fairseq"], times["fixed_shape"])
    steps = args.out_len + 1
    return {"batch": batch, "length": length, "same_hypotheses": same, "max_score_diff": diff,
            "memory_mb": memory, "ms_per_step": {n: 1000 * t["time_s"] / steps for n, t in times.items()},
            "times": times, "speedup": ratio, "speedup_paired": paired}


def main(argv=None):
    args = parse_args(argv)
    started = bench_common.start(args)
    bench_common.init_torch(args)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args._models:
            model, task = build(args, name, os.path.join(tmp, name), max(args._lengths))
            for batch in args._batch_sizes:
                for length in args._lengths:
                    r = dict(model=name, **measure(args, model, task, batch, length))
                    results.append(r)
                    print(f"{name} batch {batch} length {length}: fairseq {r['ms_per_step']['fairseq']:.2f} ms/step, "
                          f"fixed_shape {r['ms_per_step']['fixed_shape']:.2f} ms/step, x{r['speedup_paired']:.2f} "
                          f"(paired), same hypotheses: {r['same_hypotheses']}", flush=True)
    meta = bench_common.machine_facts(args, started)
    print_header(f"fixed-shape search against fairseq's SequenceGenerator: {meta['device']}, {meta['threads']} "
                 f"threads, {args.layers}+{args.layers} x {args.dim}, beam {args.beam}, {args.out_len + 1} steps, "
                 f"{args.clock} clock, median of {args.repeats} rounds")
    print(f"{'model':>7} {'batch':>5} {'length':>6} {'fairseq ms/step':>16} {'fixed ms/step':>14} {'speed-up':>9} "
          f"{'paired':>7} {'same':>5} {'max |score diff|':>17}" + ("  memory MB fairseq/fixed" if args.device == "cuda"
                                                                     else ""))
    for r in results:
        mem = (f"  {r['memory_mb']['fairseq']:.0f}/{r['memory_mb']['fixed_shape']:.0f}" if args.device == "cuda"
               else "")
        print(f"{r['model']:>7} {r['batch']:>5} {r['length']:>6} {r['ms_per_step']['fairseq']:>16.2f} "
              f"{r['ms_per_step']['fixed_shape']:>14.2f} {r['speedup']:>9.2f} {r['speedup_paired']:>7.2f} "
              f"{str(r['same_hypotheses']):>5} {r['max_score_diff']:>17.2e}{mem}")
    print(bench_common.noise_line({f"{r['model']} b{r['batch']} n{r['length']}":
                                   (r["times"]["fairseq"]["times_s"], r["times"]["fixed_shape"]["times_s"])
                                   for r in results}))
    bench_common.finish(args, started, meta, {"results": results})
    return 0 if all(r["same_hypotheses"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
