#!/usr/bin/env python
"""Decoding speed of the fixed-shape beam search (``--task translation_fixed_shape``) against fairseq's
SequenceGenerator, side by side in one run, on the same models and inputs.

For each model (``--models``: ``stock``, fairseq's own transformer; ``l0drop``, transformer_l0drop with pruned
decoding and its gates closed for ``--sparsity`` of the source states, as fairseq_sparse/benchmarks/l0drop_decoding.py closes
them; ``l0drop_full``, the same weights with pruned decoding off: the full memory), batch size and source length,
the searches decode the same batch of random sources:

  fairseq        fairseq's SequenceGenerator (what fairseq-generate runs)
  fixed_shape    fairseq_sparse/search/fixed_shape_search.py: on CUDA as ``--task translation_fixed_shape`` runs it, its
                 steps of fixed shape captured in CUDA graphs; on the CPU its eager steps (``prefix``)
  fixed_eager    the same search with eager steps (``--fixed-shape-step-form prefix``; CUDA runs only)
  fixed_indirect steps of fixed shape whose beams reorder through an ancestry table, the self-attention keys and
                 values never copied (``--fixed-shape-beam-reorder indirect``): captured on CUDA, eager on the CPU

The output length is forced (``min_len = max_len = --out-len``), so all run the same number of steps; their
hypotheses must be fairseq's in fp32 (checked: the share of sentences with fairseq's n-best, and the largest score
difference, are printed; in fp16 they say what rounding changes). Interleaved timing rounds in an
order rotated every round (fairseq_sparse/benchmarks/bench_common.py), the median per search and the median of the per-round
ratios to fairseq; the spread of those ratios says how noisy the run was. On CUDA also: the memory
(``torch.cuda.max_memory_allocated`` during one generate, the first, which captures the graph) and the GPU kernel time
per step (``torch.profiler``, one generate) beside the wall time per step: a step whose kernels take much less than
its wall time is bound by the host, not the device.

Usage:
  python -m fairseq_sparse.benchmarks.fixed_shape_search --quick --threads 1 --clock cpu     # about a minute on 2 cores
  python -m fairseq_sparse.benchmarks.fixed_shape_search --device cuda --fp16 --batch-sizes 1,64 --lengths 25,400,1000
"""
import argparse
import os
import sys
import tempfile

from fairseq_sparse.benchmarks import bench_common
from fairseq_sparse.benchmarks.bench_common import print_header

MODELS = ("stock", "l0drop", "l0drop_full")
SEARCHES = ("fairseq", "fixed_shape", "fixed_eager", "fixed_indirect")


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
    if name.startswith("l0drop"):
        enc, d = model.encoder, task.source_dictionary
        w = torch.randn(args.dim, generator=torch.Generator().manual_seed(args.seed + 1))
        calib = bench_common.random_sources(d, bench_common.CALIBRATION_SENTENCES, calibration_len, args.seed + 2)
        with torch.no_grad():
            enc.l0drop.reset_parameters()
            enc.pruned_decoding = False
            x = enc(calib, src_lengths=torch.full((calib.size(0),), calibration_len))["encoder_out"][0]
            bench_common.close_gate_at_quantile(enc.l0drop.log_alpha_proj, (x @ w).flatten(), w, args.sparsity)
        enc.pruned_decoding = name == "l0drop"  # l0drop_full: the same weights decoded over the full memory
    model.to(args.torch_device)
    if args.fp16:
        model.half()
    return model, task


def generators(model, task, args):
    from fairseq_sparse.search.fixed_shape_search import FixedShapeSequenceGenerator

    gens = {"fairseq": bench_common.forced_generator(model, task.target_dictionary, args.beam, args.out_len)}
    # on the CPU the search's eager steps (its default there, auto, is fairseq's own search)
    forms = ({"fixed_shape": ("auto", "copy"), "fixed_eager": ("prefix", "copy"), "fixed_indirect": ("auto", "indirect")}
             if args.device == "cuda" else {"fixed_shape": ("prefix", "copy"), "fixed_indirect": ("fixed", "indirect")})
    for name, (form, reorder) in forms.items():
        gens[name] = FixedShapeSequenceGenerator([model], task.target_dictionary, beam_size=args.beam, max_len_a=0,
                                                 max_len_b=args.out_len, min_len=args.out_len, step_form=form,
                                                 beam_reorder=reorder)
    return gens


def compare(ref, out):
    """(share of sentences with the same n-best hypotheses, largest score difference) of two searches' outputs: 1.0
    in fp32; in fp16 the share that rounding leaves alone."""
    same = [[h["tokens"].tolist() for h in x] == [h["tokens"].tolist() for h in y] for x, y in zip(ref, out)]
    diff = max(abs(float(h["score"]) - float(g["score"])) for x, y in zip(ref, out) for h, g in zip(x, y))
    return sum(same) / len(same), diff


def kernel_ms(torch, generate):
    """The GPU kernel time of one call of ``generate``, in ms (torch.profiler's device time, summed over kernels), or
    None where the profiler cannot run here (said once: the timings do not depend on it)."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            generate()
            torch.cuda.synchronize()
        return sum(e.self_device_time_total for e in prof.key_averages()) / 1000
    except Exception as e:  # noqa: BLE001  (CUPTI missing or refused: kernel times left out, timings stand)
        print(f"warning: no GPU kernel times ({type(e).__name__}: {e})", flush=True)
        return None


def measure(args, model, task, batch, length):
    torch = bench_common.init_torch(args)
    cuda = args.device == "cuda"
    src = bench_common.random_sources(task.source_dictionary, batch, length, args.seed + 1000 * length + batch)
    sample = bench_common.source_sample(src.to(args.torch_device))
    gens = generators(model, task, args)
    calls = {n: (lambda g=g: g.generate([model], sample)) for n, g in gens.items()}
    outs, memory, kernels = {}, {}, {}
    with torch.no_grad():
        for name, call in calls.items():
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            outs[name] = call()
            memory[name] = torch.cuda.max_memory_allocated() / 2 ** 20 if cuda else None
            for _ in range(args.warmup - 1):
                call()
        rounds = bench_common.time_rounds(calls, args.repeats, cuda=cuda)
        if cuda:
            kernels = {name: kernel_ms(torch, call) for name, call in calls.items()}
    steps = args.out_len + 1
    times = {n: bench_common.clock_medians(r, args.clock) for n, r in rounds.items()}
    out = {}
    for name in gens:
        share, diff = compare(outs["fairseq"], outs[name])
        ratio, paired = bench_common.speedup(times["fairseq"], times[name])
        graphs = getattr(gens[name], "graphs", None)
        out[name] = {"ms_per_step": 1000 * times[name]["time_s"] / steps, "times": times[name], "speedup": ratio,
                     "speedup_paired": paired, "same_hypotheses": share == 1.0, "same_share": share,
                     "max_score_diff": diff,
                     "memory_mb": memory[name],
                     "kernel_ms_per_step": kernels[name] / steps if kernels.get(name) is not None else None,
                     "graphs": len(graphs.graphs) if graphs is not None else None}
    return {"batch": batch, "length": length, "searches": out}


def write_partial(args, results):
    """With --json, what is measured so far into JSON.partial (removed at the end): a run stopped by a time limit
    (lab/gpu_checks.sh's stages) still brings its finished measurements back."""
    if args.json:
        from fairseq_sparse.cli.common import write_json

        write_json(args.json + ".partial", {"settings": bench_common.settings_of(args), "results": results})


def pruned_vs_unpruned(results):
    """Per (batch, length) measured for both l0drop and l0drop_full: the unpruned model's time per step over the
    pruned one's, under each search (> 1: pruning pays)."""
    by = {(r["model"], r["batch"], r["length"]): r["searches"] for r in results}
    return [{"batch": b, "length": n, "speedup": {s: full[s]["ms_per_step"] / by[("l0drop", b, n)][s]["ms_per_step"]
                                                  for s in full}}
            for (m, b, n), full in by.items() if m == "l0drop_full" and ("l0drop", b, n) in by]


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
                    write_partial(args, results)
                    print(f"{name} batch {batch} length {length}: " + ", ".join(
                        f"{n} {x['ms_per_step']:.2f} ms/step x{x['speedup_paired']:.2f}"
                        for n, x in r["searches"].items()), flush=True)
    meta = bench_common.machine_facts(args, started)
    cuda = args.device == "cuda"
    print_header(f"fixed-shape search against fairseq's SequenceGenerator: {meta['device']}, {meta['threads']} "
                 f"threads, {args.layers}+{args.layers} x {args.dim}, beam {args.beam}, {args.out_len + 1} steps, "
                 f"{args.clock} clock, median of {args.repeats} rounds; speed-up: paired, against fairseq")
    print(f"{'model':>11} {'batch':>5} {'length':>6} {'search':>12} {'ms/step':>8} {'speed-up':>9} {'same':>6} "
          f"{'max |score diff|':>17}" + (f" {'kernel ms/step':>15} {'memory MB':>10} {'graphs':>6}" if cuda else ""))
    for r in results:
        for name, x in r["searches"].items():
            kernel = "-" if x["kernel_ms_per_step"] is None else f"{x['kernel_ms_per_step']:.2f}"
            extra = f" {kernel:>15} {x['memory_mb']:>10.0f} {x['graphs'] or 0:>6}" if cuda else ""
            print(f"{r['model']:>11} {r['batch']:>5} {r['length']:>6} {name:>12} {x['ms_per_step']:>8.2f} "
                  f"{x['speedup_paired']:>9.2f} {x['same_share']:>6.1%} {x['max_score_diff']:>17.2e}{extra}")
    print(bench_common.noise_line({f"{r['model']} b{r['batch']} n{r['length']} {n}":
                                   (r["searches"]["fairseq"]["times"]["times_s"], x["times"]["times_s"])
                                   for r in results for n, x in r["searches"].items() if n != "fairseq"}))
    pruning = pruned_vs_unpruned(results)
    for r in pruning:
        print(f"L0Drop pruned against the same model unpruned, batch {r['batch']}, {r['length']} tokens: "
              + ", ".join(f"{n} {x:.2f}x" for n, x in r["speedup"].items()))
    bench_common.finish(args, started, meta, {"results": results, "pruned_vs_unpruned": pruning})
    if args.json and os.path.exists(args.json + ".partial"):
        os.remove(args.json + ".partial")
    exact = all(x["same_hypotheses"] for r in results for x in r["searches"].values())
    return 0 if exact or args.fp16 else 1


if __name__ == "__main__":
    sys.exit(main())
