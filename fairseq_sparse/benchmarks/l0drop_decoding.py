#!/usr/bin/env python
"""Decoding speed of L0Drop's pruned decoding, side by side in one run (Zhang, Titov & Sennrich 2021, Table 1).

Four variants decode the same inputs with fairseq's SequenceGenerator (beam search):

  pruned    transformer_l0drop, pruned decoding on (the compressed memory of Algorithm 1)
  unpruned  the same checkpoint with pruned decoding off (``pruned_decoding=False``): the decoder
            attends to all N gated encoder states
  stock     fairseq's own ``transformer`` of the same size, holding the same weights (the checkpoint's
            state dict minus the L0Drop gate parameters). Without gates its encoder output differs, so
            its hypotheses differ too: it is a speed baseline only (same shapes, same amount of work).
  shared    that stock model switched to one encoder memory per sentence (``--task translation_shared_memory``
            of fairseq-generate, ``fairseq_sparse/search/shared_memory.py``): must give stock's hypotheses
            and scores bit for bit (checked and printed); what the memory shared by the hypotheses alone
            gains, on any stock checkpoint (the unpruned L0Drop model has it too).

The output length is forced (``min_len = max_len = --out-len``, default 60 tokens + EOS, via
``max_len_a=0, max_len_b=out_len, min_len=out_len``) so that every variant runs the same number of
beam steps whatever its weights; pruned and unpruned must give identical hypotheses (checked and
printed: the pruned memory is exact).

Without ``--path`` the models are built in-process with random weights (transformer-base by
default: 6+6 layers, 512 dim, 8 heads, FFN 2048, 8k joined dummy vocabulary) and saved as fairseq
checkpoints in a temporary folder, so both cases go through the same loading code. The gate
w, b of log alpha = x.w + b are set so that a fraction ``--sparsity`` of the source states closes:
w is a fixed random direction, and b puts the gate's closing point (log alpha = -log 11, where
g_hat = clamp(sigmoid(log alpha) * 1.2 - 0.1, 0, 1) reaches 0) at the ``--sparsity`` quantile of x.w
over a calibration batch of random sources of the same length (not the benchmark batch). With
random weights x.w drifts with the source length, so each length gets its own checkpoint that
differs only in that bias. The set of closed states is random but fixed (it depends on the token
and its context); the sparsity measured on each benchmark batch is printed.
With ``--path CKPT --data DIR`` the sources are the ``--gen-subset`` sentences of DIR concatenated
and cut into pieces of the benchmark lengths (random tokens if that subset is missing), and the
sparsity is whatever the checkpoint's gates give.

Timing (the rules of fairseq_sparse/benchmarks/bench_common.py): for each source length one fresh subprocess loads
all variants (and the unpruned model on the short source, below), runs ``--warmup`` generates per
variant (whose hypotheses are the ones compared), then ``--repeats`` interleaved rounds that time one
generate per variant, in an order rotated every round, so that load changes on a shared machine hit
all variants alike; the median per variant is reported, pruned/unpruned also as the median of
per-round ratios ("paired"), and the spread of the per-round ratios as the run's noise. The clock is the
wall clock (CUDA synchronised), or with ``--clock cpu`` the process's CPU time, which is steadier
when other jobs share the cores (use it with ``--threads 1``: with more threads, waiting threads'
spinning counts too). Memory: on CPU, one fresh subprocess per variant and length loads the model
and runs one generate; its peak resident set size (``ru_maxrss``: model + torch + decoding) and its
RSS right after loading are printed (``peak - loaded`` ~ what decoding added; the stock variant's
"loaded" includes the L0Drop model it was copied from). On CUDA: ``torch.cuda.max_memory_allocated``
during the warm-up generate.

Amdahl bound. Pruning shortens only the memory the decoder attends to, so it can only remove the
part of the time that grows with the source length. ``share`` = (t_L - t_short) / t_L, with t the
generate time of the unpruned model at source length L and at a very short source (``--short-len``,
8 tokens); the bound on pruned/unpruned is 1 / (1 - share * sparsity). That share also counts work
that grows with the source but is not pruned (the encoder; the generator's attention buffer of
B*beam x N x steps), so a second, tighter bound is printed: share_dec counts only the decoder's
growth (encoder time, measured separately, removed from both t_L and t_short) and the sparsity is
the memory's actual shrinkage 1 - T'/N (T' = 1 + max kept states in the batch: the counted dummy
state and padding to the longest kept sequence are attended too).

Usage:
  python -m fairseq_sparse.benchmarks.l0drop_decoding                      # CPU, full settings (quiet machine)
  python -m fairseq_sparse.benchmarks.l0drop_decoding --threads 1 --clock cpu   # the same on a shared, busy machine (~16 min)
  python -m fairseq_sparse.benchmarks.l0drop_decoding --quick --threads 1 --clock cpu   # about 2.5 minutes
  python -m fairseq_sparse.benchmarks.l0drop_decoding --device cuda --fp16
  python -m fairseq_sparse.benchmarks.l0drop_decoding --path ckpt.pt --data data-bin --json out.json
"""
import argparse
import gc
import os
import time

from fairseq_sparse.benchmarks import bench_common
from fairseq_sparse.benchmarks.bench_common import fmt, print_header

VARIANTS = ("stock", "shared", "unpruned", "pruned")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", help="a transformer_l0drop checkpoint (default: build a random model in-process)")
    p.add_argument("--data", help="the checkpoint's data-bin folder (dictionaries; sources from --gen-subset)")
    p.add_argument("--gen-subset", default="test", help="with --data: the subset whose sentences make the sources")
    p.add_argument("--lengths", default="25,400,800", help="source lengths in tokens, EOS included (comma list)")
    p.add_argument("--short-len", type=int, default=8, help="very short source used to estimate the Amdahl share")
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--out-len", type=int, default=60, help="forced output length (tokens before EOS)")
    p.add_argument("--sparsity", type=float, default=0.7, help="random model only: fraction of source states pruned")
    bench_common.add_size_args(p, help_prefix="random model: ")
    p.add_argument("--variants", default=",".join(VARIANTS), help="which variants to run (comma list)")
    bench_common.add_run_args(p, repeats=3, threads=0)
    p.add_argument("--quick", action="store_true",
                   help="small and fast (about 2.5 minutes on 2 cores): lengths 25,400, batch 5, out-len 30, 2 repeats")
    p.add_argument("--workdir", help="keep the random checkpoint and child outputs here (default: a temp dir)")
    p.add_argument("--_child", help=argparse.SUPPRESS)  # internal: JSON spec of one measurement
    args = p.parse_args(argv)
    if args.quick:
        bench_common.apply_quick(args, {"batch_size": 5, "out_len": 30, "repeats": 2},
                                 {"lengths": ("25,400,800", "25,400")})
    if args._child is None:
        check_args(p, args)
    return args


def check_args(p, args):
    """Everything the run needs, checked before anything is built or timed."""
    from fairseq_sparse.cli.common import ToolError, check_checkpoint_file, check_data_dir

    bench_common.check_size_args(p, args)
    bench_common.check_run_args(p, args)
    if (args.path is None) != (args.data is None):
        p.error("--path and --data go together")
    try:
        if args.path:
            check_checkpoint_file(args.path)
            check_data_dir(args.data, "--data")
    except ToolError as e:
        p.error(str(e))
    if args.path:
        from fairseq_sparse.analysis.sparsity_curve import describe_checkpoint

        if not describe_checkpoint(args.path)["gates"]["l0drop"]:
            p.error(f"--path {args.path}: no L0Drop gates and no encoder-output pattern, so nothing for pruned "
                    "decoding to shorten (a stock or head-gate checkpoint: fairseq_sparse/benchmarks/head_pruning.py)")
    high = None if args.path else bench_common.MAX_POSITIONS  # a checkpoint's own limit shows when it loads
    args._length_list = bench_common.int_list(p, "--lengths", args.lengths, low=2)
    for n in args._length_list:
        bench_common.check_range(p, "--lengths", n, 2, high)
    bench_common.check_range(p, "--short-len", args.short_len, 2, high)
    bench_common.check_range(p, "--batch-size", args.batch_size, 1, None)
    bench_common.check_range(p, "--out-len", args.out_len, 1, bench_common.MAX_POSITIONS - 1)
    if not 0 <= args.sparsity < 1:
        p.error(f"--sparsity {args.sparsity}: must lie in [0, 1)")
    asked = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in asked if v not in VARIANTS]
    if unknown or not asked:
        p.error(f"--variants: unknown or none: {', '.join(unknown) or repr(args.variants)} "
                f"(choose from {', '.join(VARIANTS)})")
    if args.workdir and os.path.exists(args.workdir) and not os.path.isdir(args.workdir):
        p.error(f"--workdir exists and is not a directory: {args.workdir}")


# ---------------------------------------------------------------------------------------------
# model building and loading (runs in the parent for the random model, in children to decode)
# ---------------------------------------------------------------------------------------------

def build_random_checkpoints(args, workdir, lengths):
    """Build transformer_l0drop with random weights and save one checkpoint per source length, whose
    gates close a fraction --sparsity of that length's states (all other weights are shared).

    One gate bias for all lengths does not work with random weights: x.w drifts with the source
    length (random attention averages over more states), e.g. 10% vs 68% closed at 25 vs 400 tokens.
    Each length's bias is calibrated on its own batch of random sources (not the benchmark batch)."""
    import torch

    data_dir = os.path.join(workdir, "data")
    model, task, margs = bench_common.build_random_model(args, data_dir, ["--arch", "transformer_l0drop"])
    model.eval()
    d = task.source_dictionary
    enc = model.encoder
    proj = enc.l0drop.log_alpha_proj
    w = torch.randn(args.dim, generator=torch.Generator().manual_seed(args.seed + 1))  # the gate's direction
    history = [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "none",
                "lr_scheduler_state": {"best": None}, "num_updates": 0}]
    paths = {}
    for n in lengths:
        B = bench_common.CALIBRATION_SENTENCES
        calib = bench_common.random_sources(d, B, n, args.seed + 7919 * n + 1)  # not the benchmark batch
        with torch.no_grad():
            enc.l0drop.reset_parameters()  # w = 0, b = 3: all gates open, the gated states are the raw ones
            enc.pruned_decoding = False
            x = enc(calib, src_lengths=torch.full((B,), n))["encoder_out"][0]
            enc.pruned_decoding = True
            bench_common.close_gate_at_quantile(proj, (x @ w).flatten(), w, args.sparsity)
        paths[n] = os.path.join(workdir, f"l0drop_random_len{n}.pt")
        torch.save({"args": margs, "model": model.state_dict(), "optimizer_history": history,
                    "extra_state": {"train_iterator": None}}, paths[n])
    return paths, data_dir


def load_models(path, data, variant, device, fp16):
    """The model of one variant, its task, and its config."""
    from fairseq import checkpoint_utils
    from fairseq.models.transformer import TransformerModel
    from omegaconf import OmegaConf

    from fairseq_sparse.search.shared_memory import share_encoder_memory

    overrides = {"data": data, "pruned_decoding": variant == "pruned"}
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides)
    model = models[0]
    if variant in ("stock", "shared"):
        margs = cfg.model
        margs = argparse.Namespace(**(vars(margs) if isinstance(margs, argparse.Namespace)
                                      else OmegaConf.to_container(margs, resolve=True)))
        margs.arch, margs._name = "transformer", "transformer"
        stock = TransformerModel.build_model(margs, task)
        sd = {k: v for k, v in model.state_dict().items() if "l0drop" not in k}
        stock.load_state_dict(sd, strict=True)
        model = stock
        if variant == "shared":
            share_encoder_memory(model)  # what --task translation_shared_memory does to a loaded stock model
    model.eval()
    if fp16:
        model.half()
    model.to(device)
    return model, task, cfg


# ---------------------------------------------------------------------------------------------
# one measurement (a child process)
# ---------------------------------------------------------------------------------------------

def child_torch(spec, device):
    """Quiet logs, the plugin, the parent's --threads, in a measuring child. Returns torch."""
    return bench_common.init_torch(argparse.Namespace(threads=spec["threads"], device=device))


def make_sample(task, cfg, spec, length, device):
    src, kind = bench_common.make_sources(task, length, spec["batch_size"], spec["gen_subset"], seed=spec["seed"] + length)
    return bench_common.source_sample(src.to(device)), kind


def warm_up(name, model, sample, gen, spec, cuda, pad):
    """A job's facts and its warm-up generates (whose hypotheses are the ones compared)."""
    import torch

    with torch.no_grad():
        enc_out = model.encoder.forward_torchscript(sample["net_input"])
    src = sample["net_input"]["src_tokens"]
    r = {"length": src.size(1), "memory_len": enc_out["encoder_out"][0].size(0)}  # T' (pruned) or N
    if "l0drop_gates" in enc_out and name != "short":
        gates, padded = enc_out["l0drop_gates"][0], src.eq(pad)
        r["sparsity"] = ((gates == 0) & ~padded).sum().item() / (~padded).sum().item()
    with bench_common.PeakMemory(cuda) as mem:
        for _ in range(max(1, spec["warmup"])):
            hypos = gen.generate([model], sample)
    if cuda:
        r["cuda_peak_mb"] = mem.peak_mb
    r["hypos"] = [[h["tokens"].tolist() for h in hs] for hs in hypos]
    r["scores"] = [[float(h["score"]) for h in hs] for hs in hypos]
    r["positional_scores"] = [[h["positional_scores"].tolist() for h in hs] for hs in hypos]
    r["out_lengths"] = bench_common.out_lengths(hypos)
    return r


def measure_times(spec):
    """Timing child: all variants of one source length (plus the unpruned model on the short source)
    loaded in one process and timed in interleaved rounds, so that load changes on a shared machine
    hit all of them alike."""
    torch = child_torch(spec, spec["device"])
    device = torch.device(spec["device"])
    cuda = device.type == "cuda"
    L = spec["length"]
    jobs = {}  # name -> (model, sample)
    source_kind = None
    for v in spec["variants"]:
        model, task, cfg = load_models(spec["path"], spec["data"], v, device, spec["fp16"])
        sample, source_kind = make_sample(task, cfg, spec, L, device)
        jobs[v] = (model, sample)
        if v == "unpruned" and spec.get("short_len"):
            jobs["short"] = (model, make_sample(task, cfg, spec, spec["short_len"], device)[0])
    gens = {name: bench_common.forced_generator(model, task.target_dictionary, spec["beam"], spec["out_len"])
            for name, (model, _) in jobs.items()}
    res = {"length": L, "source": source_kind, "threads": torch.get_num_threads(),
           "jobs": {name: warm_up(name, model, sample, gens[name], spec, cuda, task.source_dictionary.pad())
                    for name, (model, sample) in jobs.items()}}
    with torch.no_grad():
        rounds = bench_common.time_rounds(
            {name: (lambda name=name: gens[name].generate([jobs[name][0]], jobs[name][1])) for name in jobs},
            spec["repeats"], cuda,
            # the encoder alone, for share_dec (the same encoder in all variants)
            then={name: (lambda name=name: jobs[name][0].encoder.forward_torchscript(jobs[name][1]["net_input"]))
                  for name in jobs if name in ("unpruned", "short")})
    for name, r in res["jobs"].items():
        r.update(bench_common.clock_medians(rounds[name], spec["clock"]))
        r["encoder_s"] = (bench_common.clock_medians(rounds[name], spec["clock"], "then_")["time_s"]
                          if rounds[name]["then_wall"] else None)
        r["sent_per_s"] = spec["batch_size"] / r["time_s"]
    return res


def measure_memory(spec):
    """Memory child (CPU): one variant at one length in a fresh process, one generate; reports the
    process's peak RSS (ru_maxrss) and its RSS right after loading the model."""
    torch = child_torch(spec, "cpu")
    model, task, cfg = load_models(spec["path"], spec["data"], spec["variant"], torch.device("cpu"), False)
    gc.collect()
    loaded = bench_common.proc_status_mb("VmRSS")
    sample, _ = make_sample(task, cfg, spec, spec["length"], torch.device("cpu"))
    gen = bench_common.forced_generator(model, task.target_dictionary, spec["beam"], spec["out_len"])
    gen.generate([model], sample)
    return {"rss_loaded_mb": loaded, "peak_rss_mb": bench_common.peak_rss_mb()}


def run_child(args, mode, workdir, **spec):
    spec.update({"mode": mode, "data": spec.get("data"), "batch_size": args.batch_size, "beam": args.beam,
                 "out_len": args.out_len, "repeats": args.repeats, "warmup": args.warmup, "device": args.device,
                 "fp16": args.fp16, "threads": args.threads, "clock": args.clock, "seed": args.seed, "gen_subset": args.gen_subset})
    return bench_common.run_child(__spec__.name, workdir, spec)


# ---------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------

def amdahl(share, sparsity):
    return 1.0 / (1.0 - share * sparsity)


def summarise(timing, memory):
    """One row per source length: per-variant numbers, ratios, the Amdahl bounds."""
    rows = []
    for L, res in sorted(timing.items()):
        jobs = res["jobs"]
        row = {"length": L}
        for name, r in jobs.items():
            row[name] = {k: r.get(k) for k in ("time_s", "times_s", "wall_s", "cpu_s", "wall_times_s", "cpu_times_s", "sent_per_s", "encoder_s", "memory_len",
                                              "sparsity", "cuda_peak_mb", "length", "out_lengths")}
            row[name].update(memory.get((name, L), {}))
        p, u, s, short = (jobs.get(k) for k in ("pruned", "unpruned", "stock", "short"))
        if p:
            row["sparsity"] = p["sparsity"]
            row["memory_shrink"] = 1.0 - p["memory_len"] / L
        if p and u:
            # also taken round by round (paired), then the median: robust to load drift
            row["speedup_vs_unpruned"], row["speedup_vs_unpruned_paired"] = bench_common.speedup(u, p)
            row["identical_hypotheses"] = p["hypos"] == u["hypos"]
            row["max_score_diff"] = max(abs(a - b) for x, y in zip(p["scores"], u["scores"]) for a, b in zip(x, y))
        if p and s:
            row["speedup_vs_stock"] = s["time_s"] / p["time_s"]
        if u and s:
            row["unpruned_vs_stock"] = s["time_s"] / u["time_s"]
        sh = jobs.get("shared")
        if sh and s:
            row["shared_vs_stock"], row["shared_vs_stock_paired"] = bench_common.speedup(s, sh)
            # bit for bit: tokens, scores and positional scores
            row["shared_identical"] = all(sh[k] == s[k] for k in ("hypos", "scores", "positional_scores"))
        if sh and u:
            row["unpruned_vs_shared"] = sh["time_s"] / u["time_s"]
        if p and u and short:
            t_long, t_short = u["time_s"], short["time_s"]
            share = max(0.0, (t_long - t_short) / t_long)
            share_dec = max(0.0, ((t_long - u["encoder_s"]) - (t_short - short["encoder_s"])) / t_long)
            row.update(share=share, share_dec=share_dec, bound=amdahl(share, p["sparsity"]),
                       bound_dec=amdahl(share_dec, row["memory_shrink"]))
            sp = row["speedup_vs_unpruned"]
            row["of_bound"], row["of_bound_dec"] = sp / row["bound"], sp / row["bound_dec"]
            # the fraction of the possible gain obtained: (speedup - 1) / (bound - 1)
            # (printed only where the bound leaves a gain worth measuring, > 5%)
            row["gain_of_bound"] = (sp - 1) / (row["bound"] - 1) if row["bound"] > 1.05 else None
            row["gain_of_bound_dec"] = (sp - 1) / (row["bound_dec"] - 1) if row["bound_dec"] > 1.05 else None
        rows.append(row)
    return rows


def print_legend(args, cuda):
    """What the columns of :func:`print_report`'s tables mean."""
    print()
    print("wall s / cpu s: median wall / process CPU time of SequenceGenerator.generate on the batch; sent/s from the")
    print(f"{args.clock} time; enc s: the encoder alone (median, {args.clock} time);")
    print("mem len: source states the decoder attends to: T' = 1 + most kept states in the batch (pruned), N otherwise;")
    print(f"A/B: time(B) / time(A), {args.clock} time; (paired): median over rounds of the per-round ratio;")
    print("shared: the stock model with one encoder memory per sentence (--task translation_shared_memory);")
    print("share = (t_N - t_short) / t_N of the unpruned model, bound = 1 / (1 - share * sparsity);")
    print("share_dec leaves the encoder out of the growth, bound_dec = 1 / (1 - share_dec * (1 - T'/N));")
    print("reached = (pruned/unpruned) / bound; gain = (pruned/unpruned - 1) / (bound - 1), the part of the possible")
    print("gain obtained.")
    if not cuda and not args.no_memory:
        print("peak RSS: ru_maxrss of a fresh process that loads one model and runs one generate (model + torch +"
              " decoding); after load: its RSS before decoding.")


def print_report(args, rows, meta):
    cuda = args.device == "cuda"
    print()
    print(f"L0Drop pruned decoding benchmark: {meta['model']}")
    print(f"device {meta['device']}, torch threads {meta['threads']}, batch {args.batch_size}, beam {args.beam}, "
          f"output forced to {args.out_len} tokens + EOS, median of {args.repeats} interleaved rounds after "
          f"{args.warmup} warm-up; sources: {meta['source']}")
    print()
    _print_variants(rows, cuda)
    _print_speedups(rows)
    if any("shared_vs_stock" in row for row in rows):
        _print_shared(rows)
    _print_bounds(rows)
    print_legend(args, cuda)
    meta["noise"] = bench_common.noise_line({f"{v} vs {base}, {row['length']} tokens": (row[base]["times_s"], row[v]["times_s"])
                                             for row in rows for v, base in (("pruned", "unpruned"), ("pruned", "stock"),
                                                                             ("shared", "stock"))
                                             if v in row and base in row})
    print(meta["noise"])
    print(f"load average before / after: {meta['loadavg_before']} / {meta['loadavg_after']}")


def _print_variants(rows, cuda: bool):
    """The table of every variant's times, encoder share, memory length, sparsity and memory, per source length."""
    mem_name = "CUDA peak MB" if cuda else "peak RSS MB (after load)"
    print_header(f"{'src len':>7} {'variant':>9} {'wall s':>8} {'cpu s':>8} {'sent/s':>7} {'enc s':>6} {'mem len':>7} "
                 f"{'sparsity':>8}  {mem_name}")
    for row in rows:
        for v in VARIANTS + ("short",):
            r = row.get(v)
            if not r:
                continue
            mem = bench_common.memory_cell(r, cuda)
            name = v if v != "short" else "unpruned"
            note = "  <- short source, for the Amdahl share" if v == "short" else ""
            print(f"{r['length']:>7} {name:>9} {r['wall_s']:>8.3f} {r['cpu_s']:>8.3f} {r['sent_per_s']:>7.2f} {fmt(r['encoder_s'], '{:.3f}'):>6} "
                  f"{r['memory_len']:>7} {fmt(r.get('sparsity'), '{:.1%}'):>8}  {mem}{note}")


def _print_speedups(rows):
    """The table of sparsity, memory shrink, speed-ups and identical hypotheses (pruned vs unpruned)."""
    print()
    print_header(f"{'src len':>7} {'sparsity':>8} {'mem shrink':>10} {'pruned/unpruned':>15} {'(paired)':>8} "
                 f"{'pruned/stock':>12} {'unpruned/stock':>14}  identical hypotheses (pruned vs unpruned)")
    for row in rows:
        ident = row.get("identical_hypotheses")
        ident = "-" if ident is None else f"{'yes' if ident else 'NO'} (max score diff {row['max_score_diff']:.1e})"
        print(f"{row['length']:>7} {fmt(row.get('sparsity'), '{:.1%}'):>8} {fmt(row.get('memory_shrink'), '{:.1%}'):>10} "
              f"{fmt(row.get('speedup_vs_unpruned'), '{:.2f}x'):>15} {fmt(row.get('speedup_vs_unpruned_paired'), '{:.2f}x'):>8} "
              f"{fmt(row.get('speedup_vs_stock'), '{:.2f}x'):>12} {fmt(row.get('unpruned_vs_stock'), '{:.2f}x'):>14}  {ident}")


def _print_shared(rows):
    """The table of the shared-memory decoding against stock: speed-ups and bit-for-bit identical outputs."""
    print()
    print_header(f"{'src len':>7} {'shared/stock':>12} {'(paired)':>8} {'unpruned/shared':>15}  "
                 "identical hypotheses, scores and positional scores (shared vs stock, bit for bit)")
    for row in rows:
        ident = row.get("shared_identical")
        print(f"{row['length']:>7} {fmt(row.get('shared_vs_stock'), '{:.2f}x'):>12} "
              f"{fmt(row.get('shared_vs_stock_paired'), '{:.2f}x'):>8} "
              f"{fmt(row.get('unpruned_vs_shared'), '{:.2f}x'):>15}  {'-' if ident is None else 'yes' if ident else 'NO'}")


def _print_bounds(rows):
    """The table of each speed-up against its Amdahl bound, for the whole decoding and the decoder alone."""
    print()
    print_header(f"{'src len':>7} {'pruned/unpruned':>15} | {'share':>6} {'bound':>6} {'reached':>7} {'gain':>5} | "
                 f"{'share_dec':>9} {'bound_dec':>9} {'reached':>7} {'gain':>5}")
    for row in rows:
        print(f"{row['length']:>7} {fmt(row.get('speedup_vs_unpruned'), '{:.2f}x'):>15} | "
              f"{fmt(row.get('share'), '{:.0%}'):>6} {fmt(row.get('bound'), '{:.2f}x'):>6} "
              f"{fmt(row.get('of_bound'), '{:.0%}'):>7} {fmt(row.get('gain_of_bound'), '{:.0%}'):>5} | "
              f"{fmt(row.get('share_dec'), '{:.0%}'):>9} {fmt(row.get('bound_dec'), '{:.2f}x'):>9} "
              f"{fmt(row.get('of_bound_dec'), '{:.0%}'):>7} {fmt(row.get('gain_of_bound_dec'), '{:.0%}'):>5}")


def main(argv=None):
    bench_common.measure_or_run(parse_args(argv), measure_times, measure_memory, "l0drop_bench_", run)


def run(args, workdir):
    started = bench_common.start(args)
    bench_common.init_torch(args)
    lengths = args._length_list
    variants = [v for v in VARIANTS if v in args.variants.split(",")]
    if args.path:
        paths = {n: os.path.abspath(args.path) for n in lengths}
        data = os.path.abspath(args.data)
        model_desc = f"checkpoint {args.path}"
    else:
        model_desc = (f"random transformer_l0drop {args.layers}+{args.layers} layers, dim {args.dim}, "
                      f"{args.heads} heads, FFN {args.ffn}, vocab {args.vocab}, "
                      f"gates set for {args.sparsity:.0%} sparsity")
        print(f"building a {model_desc} at each source length ...", flush=True)
        paths, data = build_random_checkpoints(args, workdir, lengths)
    short_len = args.short_len if "unpruned" in variants and "pruned" in variants else None
    timing, memory = {}, {}
    for n in lengths:
        print(f"timing {', '.join(variants)}{' (and unpruned @ %d)' % short_len if short_len else ''} "
              f"@ {n} source tokens ...", flush=True)
        t0 = time.time()
        res = timing[n] = run_child(args, "times", workdir, path=paths[n], data=data, length=n,
                                    variants=variants, short_len=short_len)
        for name, r in res["jobs"].items():
            bench_common.print_rounds(name, r, 9, f", sparsity {r['sparsity']:.1%}, memory {r['memory_len']} states"
                                      if "sparsity" in r else "")
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
    if args.device == "cpu" and not args.no_memory:
        print("peak memory, one fresh process per variant and length ...", flush=True)
        for n in lengths:
            for v in variants:
                memory[(v, n)] = run_child(args, "memory", workdir, path=paths[n], data=data, length=n, variant=v)
    rows = summarise(timing, memory)
    first = next(iter(timing.values()))
    meta = {"model": model_desc, "source": first["source"], **bench_common.machine_facts(args, started)}
    print_report(args, rows, meta)
    bench_common.finish(args, started, meta, {"rows": rows})


if __name__ == "__main__":
    main()
