#!/usr/bin/env python
"""Decoding speed and memory of a transformer with attention heads physically removed (Michel et al. 2019, Sec. 4.3).

Michel, Levy & Neubig 2019, Table 4: BERT with 50% of its heads pruned processes +17.5% examples/s
at batch sizes 16 and 64 (GPU), about +2% at batch 1 and 4. This script measures the same kind of
ratio for translation decoding with fairseq's SequenceGenerator (beam search), side by side in one
run and on one source batch (the first B sentences of it for batch size B), for these variants:

  full-stock      the model as built: fairseq ``transformer``, every head. fairseq's MultiheadAttention
                  hands the encoder self-attention to PyTorch's ``F.multi_head_attention_forward`` (its
                  "fast path"); the decoder's self- and encoder-decoder attention always run fairseq's own
                  code (they have an incremental state / static keys).
  full-same-path  the same weights with ``skip_embed_dim_check = True`` on every attention module: the
                  encoder self-attention runs fairseq's own code too. Physically pruned modules must take
                  that path (their q/k/v width no longer equals the model dim), so this is the fair
                  reference for "what removing heads does"; full-stock is what a user runs today.
  pruned-25% ...  a deep copy of the full model with that fraction of ALL attention heads (encoder
                  self, decoder self, encoder-decoder) removed by ``prune_heads`` (q/k/v rows and
                  out_proj columns cut out). ``--selection even`` (default) removes the same number from
                  every attention layer (75% of 8 heads keeps 2 in each; when the fraction is not a
                  whole number of heads per layer, some layers lose one more, spread over the model,
                  so that the total is exact; every layer keeps a head while the fraction is at most
                  (heads - 1) / heads); the kept positions are spread over the layer and rotate from
                  layer to layer. ``--selection random`` removes a
                  uniformly random set of heads (``--seed``), which may empty a layer (it then outputs
                  its out_proj bias, fairseq_sparse's HeadlessAttention).
  pruned-100%     every head removed (each attention layer outputs its out_proj bias): not a usable model,
                  but full-same-path / pruned-100% measures the share of the decoding time spent in
                  attention, hence the bound ("lin. bound") on what removing a fraction f of the heads
                  can give if attention time were proportional to heads: 1 / (1 - f * share).
                  ``--no-bound`` skips it.
  mask:FILE       with ``--from-mask FILE`` (a head mask JSON {"enc": [[1, 0, ...], ...], "dec": ...,
                  "encdec": ...}, one row per layer, a value in [0, 1] per head; heads with value 0 are
                  removed as by fairseq-sparse-prune-heads): that real pruning pattern on the random
                  model. The mask is read and checked by the head-gates module's validator (read_head_mask,
                  check_head_mask) before anything is built: the model size must match it (``--size`` /
                  ``--layers`` / ``--heads``). With a mask the percentage variants are off unless
                  ``--fractions`` is given.

The weights are random (transformer-base by default: 6+6 layers, dim 512, 8 heads, FFN 2048, joined
vocabulary 8k from a dummy dictionary, no corpus needed): decoding speed does not depend on the values,
only on the shapes, and the output length is forced: ``min_len = max_len = --out-len`` (60 tokens +
EOS) via SequenceGenerator(max_len_a=0, max_len_b=out_len, min_len=out_len), as
fairseq_sparse/benchmarks/l0drop_decoding.py does, so every variant runs the same number of beam steps on the same
number of hypotheses. All sources have ``--src-len`` tokens (EOS included; random words).

Correctness check (printed, not timed): on the first ``--check-batch`` sentences, each pruned variant
must give the same hypotheses (tokens) and scores (to 1e-4) as a copy of the full model with exactly
those heads masked (``set_head_masks``, the xi_h = 0 of Michel et al. 2019, Eq. 1), and the same log-probabilities
when teacher-forced on those hypotheses (max |diff| printed).

Timing (the rules of fairseq_sparse/benchmarks/bench_common.py): one process holds all variants. Per batch size:
``--warmup`` generates per variant, one more per variant whose peak memory is measured (see below;
``--no-memory`` skips it), then ``--repeats`` interleaved rounds that time one generate per variant, in
an order rotated every round; medians per variant, every ratio also paired (the median of the per-round
ratios), and the spread of those per-round ratios printed as the run's noise. Wall clock and process
CPU time are both recorded; ``--clock`` picks the one sent/s and the ratios use (``cpu`` is steadier on
a busy machine, with ``--threads 1``, the default). "enc s": the encoder alone (median over rounds,
timed separately after each generate).

Memory: "model MB" is the parameters' size; "decode MB" is the peak memory that one untimed generate
added, measured once every variant has had its warm-up (a process's first big generate costs the
allocator some 8% more, whichever variant it is): bench_common.PeakMemory, on CPU Linux's VmHWM (peak
RSS, reset through /proc/self/clear_refs just before the generate, after gc and malloc_trim) minus
VmRSS at that moment; on CUDA, max_memory_allocated minus memory_allocated.

Usage:
  python -m fairseq_sparse.benchmarks.head_pruning                                  # base model, batch 1,16,64, beam 4
  python -m fairseq_sparse.benchmarks.head_pruning --clock cpu                       # the same on a busy shared machine
  python -m fairseq_sparse.benchmarks.head_pruning --quick                           # smoke run, ~2 min (base) on 2 busy cores
  python -m fairseq_sparse.benchmarks.head_pruning --quick --size tiny --repeats 1   # seconds: does it run?
  python -m fairseq_sparse.benchmarks.head_pruning --size iwslt --from-mask mask.json --json out.json
  python -m fairseq_sparse.benchmarks.head_pruning --device cuda --fp16 --batch-sizes 1,16,64,128
"""
import argparse
import copy
import gc
import os
import random
import sys
import tempfile
import time
from collections import OrderedDict

from fairseq_sparse.benchmarks import bench_common
from fairseq_sparse.benchmarks.bench_common import fmt, pct, print_header

PRESETS = ("base", "iwslt", "small", "tiny")  # of bench_common.SIZES
TYPES = ("enc", "dec", "encdec")
PAPER_TARGET = 0.175  # Michel et al. 2019, Table 4: +17.5% examples/s at 50% heads pruned, batch >= 16
SCORE_TOL = 1e-4


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_common.add_size_args(p, "--size", PRESETS)
    p.add_argument("--fractions", help="fractions of all heads to remove, comma list (default 0.25,0.5,0.75; "
                                       "none with --from-mask)")
    p.add_argument("--selection", default="even", choices=["even", "random"],
                   help="which heads go: the same number from every layer (even), or a random set (random)")
    p.add_argument("--from-mask", metavar="FILE", help="also benchmark the pruning given by this head mask JSON")
    p.add_argument("--no-bound", action="store_true", help="skip the pruned-100%% variant (attention's share)")
    p.add_argument("--batch-sizes", default="1,16,64", help="comma list (default 1,16,64)")
    p.add_argument("--src-len", type=int, default=60, help="source length in tokens, EOS included")
    p.add_argument("--out-len", type=int, default=60, help="forced output length (tokens before EOS)")
    p.add_argument("--check-batch", type=int, default=4, help="sentences of the equivalence check")
    bench_common.add_run_args(p, repeats=3, threads=1)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: batch sizes 1,16, source and output 20 tokens, 2 repeats")
    args = p.parse_args(argv)
    bench_common.check_size_args(p, args, args.size)
    if args.quick:
        bench_common.apply_quick(args, {"src_len": 20, "out_len": 20, "repeats": 2},
                                 {"batch_sizes": ("1,16,64", "1,16")})
    if args.fractions is None:
        args.fractions = "" if args.from_mask else "0.25,0.5,0.75"
    try:
        args.fraction_list = [float(x) for x in args.fractions.split(",") if x.strip()]
    except ValueError:
        p.error(f"--fractions: not a comma list of numbers: {args.fractions!r}")
    if any(not 0 < f <= 1 for f in args.fraction_list):
        p.error("--fractions must lie in (0, 1]")
    args.batch_list = sorted(set(bench_common.int_list(p, "--batch-sizes", args.batch_sizes)))
    bench_common.check_run_args(p, args)
    bench_common.check_range(p, "--src-len", args.src_len, 2)
    bench_common.check_range(p, "--out-len", args.out_len, 1, bench_common.MAX_POSITIONS - 1)
    bench_common.check_range(p, "--check-batch", args.check_batch, 1, None)
    args._mask_keep = keep_from_mask(p, args) if args.from_mask else None
    return args


# ---------------------------------------------------------------------------------------------
# the variants
# ---------------------------------------------------------------------------------------------

def spread_positions(n_heads, n_keep, offset):
    """n_keep of n_heads positions, evenly spaced, rotated by offset."""
    return sorted((offset + round(i * n_heads / n_keep)) % n_heads for i in range(n_keep))


def select_heads(modules, fraction, selection, seed):
    """(type, layer) -> head positions to keep, removing round(fraction x all heads)."""
    keys = list(modules)
    heads = {k: modules[k].num_heads for k in keys}
    remove_total = round(fraction * sum(heads.values()))
    if selection == "random":
        rng = random.Random(seed)
        gone = set(rng.sample([(k, h) for k in keys for h in range(heads[k])], remove_total))
        return {k: [h for h in range(heads[k]) if (k, h) not in gone] for k in keys}
    # even: the same count from every layer; the remainder goes one each to layers spread over the list
    base, extra = divmod(remove_total, len(keys))
    extra_at = {int((i + 0.5) * len(keys) / extra) for i in range(extra)} if extra else set()
    remove = {k: base + (i in extra_at) for i, k in enumerate(keys)}
    # a layer asked to lose more than it has passes the rest on to layers that still have heads
    spill = sum(max(0, remove[k] - heads[k]) for k in keys)
    remove = {k: min(remove[k], heads[k]) for k in keys}
    for k in sorted(keys, key=lambda k: remove[k] - heads[k]):
        take = min(spill, heads[k] - remove[k])
        remove[k] += take
        spill -= take
    keep = {}
    for i, k in enumerate(keys):
        n_keep = heads[k] - remove[k]
        keep[k] = spread_positions(heads[k], n_keep, i) if n_keep else []
    return keep


def keep_from_mask(p, args):
    """(type, layer) -> head positions with mask value > 0 (the rule of fairseq-sparse-prune-heads
    --head-mask), from --from-mask checked by the project's head-mask validator against the model that
    --size / --layers / --heads describe, before anything is built."""
    from fairseq_sparse.modules.head_gates import check_head_mask, read_head_mask

    layout = OrderedDict(((t, i), args.heads) for t in TYPES for i in range(args.layers))
    try:
        matrix = read_head_mask(args.from_mask)
    except ValueError as e:
        p.error(f"--from-mask: {e}")
    try:
        masks = check_head_mask(matrix, layout)
    except ValueError as e:
        p.error(f"--from-mask {args.from_mask}: {e} (set --size / --layers / --heads to the mask's model)")
    return {k: [h for h, v in enumerate(m.tolist()) if v > 0] for k, m in masks.items()}


def param_counts(model):
    from fairseq_sparse.modules.head_gates import attention_modules

    total = sum(p.numel() for p in model.parameters())
    attn = sum(p.numel() for m in attention_modules(model).values() for p in m.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"params": total, "attention_params": attn, "model_mb": nbytes / 2**20}


def make_variants(full, args):
    """name -> {"model", "keep" (None for the full models), ...}; pruned ones are deep copies + prune_heads."""
    from fairseq_sparse.modules.head_gates import attention_modules, prune_heads

    modules = attention_modules(full)
    total_heads = sum(m.num_heads for m in modules.values())
    variants = OrderedDict()
    variants["full-stock"] = {"model": full, "keep": None}
    same = copy.deepcopy(full)
    for m in attention_modules(same).values():
        m.skip_embed_dim_check = True  # fairseq's own attention code everywhere, as in the pruned models
    variants["full-same-path"] = {"model": same, "keep": None}
    plans = [(f"pruned-{f:.0%}", select_heads(modules, f, args.selection, args.seed)) for f in args.fraction_list]
    if args._mask_keep is not None:
        plans.append((f"mask:{os.path.basename(args.from_mask)}", args._mask_keep))
    if not args.no_bound and 1.0 not in args.fraction_list:
        plans.append(("pruned-100%", {k: [] for k in modules}))
    for name, keep in plans:
        model = copy.deepcopy(full)
        prune_heads(model, keep, allow_empty_layers=True)
        variants[name] = {"model": model, "keep": keep}
    for name, v in variants.items():
        kept = total_heads if v["keep"] is None else sum(len(h) for h in v["keep"].values())
        v.update(param_counts(v["model"]), heads_kept=kept, heads_total=total_heads,
                 removed=1.0 - kept / total_heads,
                 kept_per_layer=None if v["keep"] is None else
                 {t: [len(v["keep"][k]) for k in modules if k[0] == t] for t in TYPES})
        v["model"].to(args.torch_device)
        if args.fp16:
            v["model"].half()
    return variants


# ---------------------------------------------------------------------------------------------
# measurements
# ---------------------------------------------------------------------------------------------

def make_generator(model, task, args):
    return bench_common.forced_generator(model, task.target_dictionary, args.beam, args.out_len)


def teacher_forced_lprobs(model, sample, hypos, pad, eos):
    """Log-probabilities of the model along the given hypotheses (every beam of every sentence)."""
    import torch

    toks = [h["tokens"] for hs in hypos for h in hs]
    n_beam = len(hypos[0])
    T = max(len(t) for t in toks)
    tgt = torch.full((len(toks), T), pad, dtype=torch.long, device=toks[0].device)
    for i, t in enumerate(toks):
        tgt[i, :len(t)] = t
    prev = torch.cat([torch.full((len(toks), 1), eos, dtype=torch.long, device=tgt.device), tgt[:, :-1]], 1)
    ni = sample["net_input"]
    src = ni["src_tokens"].repeat_interleave(n_beam, 0)
    with torch.no_grad():
        out = model(src, ni["src_lengths"].repeat_interleave(n_beam, 0), prev)
        return model.get_normalized_probs(out, log_probs=True).float()


def equivalence_check(full, variants, task, src, args):
    """Each pruned variant vs the full model with the same heads masked (set_head_masks)."""
    import torch
    from fairseq_sparse.modules.head_gates import attention_modules, set_head_masks

    masked = copy.deepcopy(full)
    modules = attention_modules(masked)
    n = min(args.check_batch, src.size(0))
    sample = bench_common.source_sample(src[:n])
    d = task.target_dictionary
    results = OrderedDict()
    for name, v in variants.items():
        if v["keep"] is None:
            continue
        dt = next(masked.parameters()).dtype
        masks = {k: torch.tensor([1.0 if h in v["keep"][k] else 0.0 for h in range(m.num_heads)],
                                 device=src.device, dtype=dt) for k, m in modules.items()}
        set_head_masks(masked, masks)
        with torch.no_grad():
            ref = make_generator(masked, task, args).generate([masked], sample)
            got = make_generator(v["model"], task, args).generate([v["model"]], sample)
        same_tokens = all(torch.equal(a["tokens"], b["tokens"]) for x, y in zip(ref, got) for a, b in zip(x, y))
        score_diff = max(abs(float(a["score"]) - float(b["score"])) for x, y in zip(ref, got) for a, b in zip(x, y))
        lp_diff = (teacher_forced_lprobs(masked, sample, ref, d.pad(), d.eos())
                   - teacher_forced_lprobs(v["model"], sample, ref, d.pad(), d.eos())).abs().max().item()
        tol = SCORE_TOL if not args.fp16 else 5e-2
        results[name] = {"identical_hypotheses": same_tokens, "max_score_diff": score_diff,
                         "max_lprob_diff": lp_diff, "sentences": n,
                         "passed": bool(same_tokens and score_diff <= tol and lp_diff <= tol * 10)}
    del masked
    gc.collect()
    return results


def time_batch_size(variants, task, src, B, args):
    """Warm-up (with memory) then interleaved timed rounds, for one batch size."""
    import torch

    cuda = args.device == "cuda"
    sample = bench_common.source_sample(src[:B])
    gens = {name: make_generator(v["model"], task, args) for name, v in variants.items()}
    res = OrderedDict()
    for name, v in variants.items():
        for _ in range(max(1, args.warmup)):
            hypos = gens[name].generate([v["model"]], sample)
        res[name] = {"decode_mb": None, "out_lengths": bench_common.out_lengths(hypos)}
        del hypos
    if not args.no_memory:
        # after every variant's warm-up: the process's first big generate costs the allocator extra (~8%)
        for name, v in variants.items():
            with bench_common.PeakMemory(cuda) as mem:
                gens[name].generate([v["model"]], sample)
            res[name]["decode_mb"] = mem.mb
    with torch.no_grad():
        rounds = bench_common.time_rounds(
            {n: (lambda n=n: gens[n].generate([variants[n]["model"]], sample)) for n in variants}, args.repeats, cuda,
            then={n: (lambda n=n: variants[n]["model"].encoder.forward_torchscript(sample["net_input"]))
                  for n in variants})
    for name, r in res.items():
        r.update(bench_common.clock_medians(rounds[name], args.clock))
        r["enc_wall_s"], r["enc_cpu_s"] = rounds[name]["then_wall"], rounds[name]["then_cpu"]
        r["enc_s"] = bench_common.clock_medians(rounds[name], args.clock, "then_")["time_s"]
        r["sent_per_s"] = B / r["time_s"]
    for name, r in res.items():
        for ref in ("full-stock", "full-same-path"):
            r[f"vs_{ref}"], r[f"vs_{ref}_paired"] = bench_common.speedup(res[ref], r)
    if "pruned-100%" in res:  # attention's share of the decoding time, and the linear bound
        share = max(0.0, 1.0 - res["pruned-100%"]["time_s"] / res["full-same-path"]["time_s"])
        for name, r in res.items():
            r["attention_share"] = share
            if variants[name]["keep"] is not None and name != "pruned-100%":
                r["linear_bound"] = 1.0 / (1.0 - variants[name]["removed"] * share)
    return res


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------

def print_variants(variants, checks):
    print_header(f"{'variant':<22} {'heads kept':>11} {'removed':>7} {'params':>11} {'attn params':>11} "
                 f"{'model MB':>8}  per layer kept (enc | dec | encdec)")
    for name, v in variants.items():
        per = "all" if v["kept_per_layer"] is None else " | ".join(
            ",".join(map(str, v["kept_per_layer"][t])) for t in TYPES)
        print(f"{name:<22} {v['heads_kept']:>5}/{v['heads_total']:<5} {v['removed']:>7.1%} {v['params']:>11,} "
              f"{v['attention_params']:>11,} {v['model_mb']:>8.1f}  {per}")
    print()
    print(f"equivalence check (not timed): each pruned variant vs the full model with the same heads masked "
          f"(set_head_masks), {next(iter(checks.values()))['sentences'] if checks else 0} sentences:")
    for name, c in checks.items():
        print(f"  {name:<22} hypotheses {'identical' if c['identical_hypotheses'] else 'DIFFER'}, "
              f"max |score diff| {c['max_score_diff']:.1e}, max |log-prob diff| (teacher-forced) "
              f"{c['max_lprob_diff']:.1e}: {'PASS' if c['passed'] else 'FAIL'}")
    all_ok = all(c["passed"] for c in checks.values())
    print(f"equivalence check: {'PASS' if all_ok else 'FAIL'}")


def print_times(args, rows, meta):
    print_header(f"{'batch':>5} {'variant':<22} {'wall s':>8} {'cpu s':>8} {'enc s':>7} {'sent/s':>8} "
                 f"{'vs stock':>8} {'(paired)':>8} {'vs same-path':>12} {'(paired)':>8} {'lin. bound':>10} "
                 f"{'decode MB':>9}")
    for B, res in rows.items():
        for name, r in res.items():
            print(f"{B:>5} {name:<22} {r['wall_s']:>8.3f} {r['cpu_s']:>8.3f} {r['enc_s']:>7.3f} "
                  f"{r['sent_per_s']:>8.2f} {pct(r['vs_full-stock']):>8} {pct(r['vs_full-stock_paired']):>8} "
                  f"{pct(r['vs_full-same-path']):>12} {pct(r['vs_full-same-path_paired']):>8} "
                  f"{pct(r.get('linear_bound')):>10} {fmt(r['decode_mb'], '{:.1f}'):>9}")
        share = next(iter(res.values())).get("attention_share")
        if share is not None:
            print(f"{'':>5} attention's share of the decoding time (1 - pruned-100% / full-same-path): {share:.1%}")
        print()
    print(f"sent/s: batch / median {args.clock} time of SequenceGenerator.generate; wall s / cpu s: medians of "
          f"both clocks; enc s: the encoder alone.")
    print("vs stock / vs same-path: sent/s change against full-stock (encoder self-attention on PyTorch's fast path,")
    print("  what users run) / full-same-path (same weights, fairseq's attention code everywhere, as the pruned")
    print("  modules must use: the effect of removing heads alone); (paired): median of the per-round ratios.")
    print("lin. bound: 1 / (1 - removed * share), the gain if attention time were proportional to the heads kept.")
    print("decode MB: peak memory one untimed generate added, after the warm-ups (CPU: peak RSS increase;")
    print("  CUDA: allocated); model MB: the parameters.")
    print("The weights are random: speed depends on the shapes only (same forced output length for all variants).")
    meta["noise"] = bench_common.noise_line({f"{name} vs full-same-path, batch {B}": (res["full-same-path"]["times_s"],
                                                                                    r["times_s"])
                                             for B, res in rows.items() for name, r in res.items()
                                             if name != "full-same-path"})
    print(meta["noise"])


def print_report(args, variants, checks, rows, meta):
    print()
    print(f"Head pruning decoding benchmark: {meta['model']}")
    print(f"device {meta['device']}, torch threads {meta['threads']}, beam {args.beam}, source {args.src_len} "
          f"tokens, output forced to {args.out_len} tokens + EOS; median of {args.repeats} interleaved rounds "
          f"after {args.warmup} warm-up; clock: {args.clock}; selection: {args.selection}")
    print()
    print_variants(variants, checks)
    print()
    print_times(args, rows, meta)
    targets = [(B, res[n]) for B, res in rows.items() if B >= 16 for n in res if n == "pruned-50%"]
    if targets:
        print()
        print(f"Michel et al. 2019, Table 4 (BERT, GPU): +{PAPER_TARGET:.1%} examples/s with 50% of the heads "
              f"pruned, batch >= 16.")
        for B, r in targets:
            ok = r["vs_full-same-path"] >= 1 + PAPER_TARGET
            ok_stock = r["vs_full-stock"] >= 1 + PAPER_TARGET
            print(f"  batch {B:>3}, pruned-50%: {pct(r['vs_full-same-path'])} vs full-same-path "
                  f"({'met' if ok else 'not met'}), {pct(r['vs_full-stock'])} vs full-stock "
                  f"({'met' if ok_stock else 'not met'})")
    print()
    print(f"load average before / after: {meta['loadavg_before']} / {meta['loadavg_after']}")


def main(argv=None):
    args = parse_args(argv)
    started = bench_common.start(args)
    torch = bench_common.init_torch(args)
    L, D, H, F, V = args.layers, args.dim, args.heads, args.ffn, args.vocab
    model_desc = (f"random fairseq transformer {L}+{L} layers, dim {D}, {H} heads, FFN {F}, vocab {V} "
                  f"(--size {args.size})")
    print(f"building {model_desc} and its pruned variants ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="head_pruning_bench_") as workdir:
        full, task, _ = bench_common.build_random_model(args, workdir, ["--arch", "transformer"])
    full.eval()
    variants = make_variants(full, args)
    src = bench_common.random_sources(task.source_dictionary, max(args.batch_list + [args.check_batch]),
                                      args.src_len, args.seed + 12345).to(args.torch_device)
    print("equivalence check ...", flush=True)
    checks = equivalence_check(full, variants, task, src, args)
    rows = OrderedDict()
    for B in args.batch_list:
        print(f"timing batch {B}: {', '.join(variants)} ...", flush=True)
        t0 = time.time()
        rows[B] = time_batch_size(variants, task, src, B, args)
        for name, r in rows[B].items():
            bench_common.print_rounds(name, r, 22)
            if r["out_lengths"] != [args.out_len + 1]:
                raise SystemExit(f"{name}: output lengths {r['out_lengths']}, expected {args.out_len + 1}")
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
    meta = {"model": model_desc, **bench_common.machine_facts(args, started)}
    print_report(args, variants, checks, rows, meta)
    bench_common.finish(args, started, meta, {
        "equivalence": checks,
        "variants": {n: {k: v for k, v in var.items() if k not in ("model", "keep")}
                     | {"kept_heads": None if var["keep"] is None else
                        {f"{t}.{i}": h for (t, i), h in var["keep"].items()}}
                     for n, var in variants.items()},
        "rows": {str(B): res for B, res in rows.items()}})
    return 0 if all(c["passed"] for c in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
