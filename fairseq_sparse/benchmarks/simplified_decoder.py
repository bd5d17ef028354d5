#!/usr/bin/env python
"""Training and inference speed, and BLEU, of the simplified decoder vs the standard one (Yang et al. 2020, Table 4).

Yang, Wang, Shi, Tadepalli, Lee & Tu 2020, Table 4: dropping the decoder FFN (the information-fusion module is one
Add&Norm: ``transformer_simplified_decoder``) speeds Base training up by +11.2..12.6% (words/s) and
inference by +11.6..40% (sentences/s, GPU), for -0.16..-0.32 BLEU (En-De, En-Fr). This script measures
the same ratios against stock fairseq, side by side in one run.

Speed part (in one process; random weights: speed depends on the shapes only). Models, all of the same
size (``--arch-size``: transformer-base by default, 6+6 layers, dim 512, 8 heads, FFN 2048, joined
vocabulary 8k from a dummy dictionary, shared embeddings), built through fairseq's task and model
registries from a fairseq-train command line:

  standard     stock fairseq ``transformer`` (fairseq's own decoder layer): the baseline of every ratio
  simplified   ``transformer_simplified_decoder`` (plugin's SublayerDecoderLayer, blocks self -> cross)
  ORDER        (optional, ``--variants``) ``transformer_head_gates --head-gates ''`` with
               ``--decoder-sublayer-order ORDER`` (sem-tem-ifm or sem-ifm; FFN kept, Yang et al. 2020, Table 1)
  simplified-ORDER  (optional) the simplified decoder with that sub-layer order (e.g. simplified-sem-ifm)

(a) inference: fairseq's SequenceGenerator, beam ``--beam``, one batch of ``--batch-size`` random
    sources of ``--src-len`` tokens; the output length is forced (``max_len_a=0, max_len_b=min_len=
    --out-len``, so every hypothesis has out-len tokens + EOS, checked) so all variants run the same
    number of beam steps. Sentences/s = batch / time of one ``generate``.
(b) training: one full fairseq training step per timing: ``task.train_step`` (forward, fairseq's
    label_smoothed_cross_entropy 0.1, backward), the Trainer's grad-norm and ``task.optimizer_step``
    (fairseq's Adam), dropout 0.1, on one fixed synthetic batch of ``--train-tokens`` target tokens
    (sentences of ``--src-len`` source and ``--tgt-len`` target tokens). Words/s = target tokens / time.

Timing (the rules of fairseq_sparse/benchmarks/bench_common.py): ``--warmup`` untimed runs per variant (the first Adam
step allocates its state), one untimed run per variant whose peak memory is taken (bench_common.PeakMemory:
CPU peak-RSS increase, CUDA allocated; ``--no-memory`` skips it), then ``--repeats`` interleaved rounds
that time one run per variant in an order rotated every round, so machine load hits all variants alike.
Medians are reported, every ratio also as the median of the per-round ratios ("paired"), and the spread
of those per-round ratios as the run's noise. ``--clock cpu`` (process CPU time, with ``--threads 1``) is
steadier on a shared machine than the wall clock.

Quality part (``--bleu``; default on, off with ``--quick`` unless asked): a synthetic corpus
(fairseq_sparse.synthetic_corpus), binarised by fairseq-preprocess (--joined-dictionary); fairseq-train
trains ``transformer`` and ``transformer_simplified_decoder`` with the identical command line apart from
--arch (``--bleu-*`` sizes, same seed, ``--bleu-updates`` updates, no validation), both at the same
time, one CPU thread each, so that machine load hits both alike; fairseq-generate decodes the test set
(beam 4, ``--required-batch-size-multiple 1``: no sentence dropped) and its BLEU4 is reported. Second
views of speed: the median of the ``wps`` (words/s) that fairseq-train logs every ``--log-interval``
updates while both trainings ran (the first interval left out; once the faster run is done the other
has the machine to itself), and the sentences/s that fairseq-generate logs (real, unforced output
lengths, so the two models do different amounts of work there).

Usage:
  python -m fairseq_sparse.benchmarks.simplified_decoder                          # base speed + BLEU (~20 min on 2 cores)
  python -m fairseq_sparse.benchmarks.simplified_decoder --clock cpu --no-bleu    # speed only, on a busy shared machine
  python -m fairseq_sparse.benchmarks.simplified_decoder --variants standard,simplified,sem-ifm,simplified-sem-ifm
  python -m fairseq_sparse.benchmarks.simplified_decoder --quick                  # smoke run (seconds)
  python -m fairseq_sparse.benchmarks.simplified_decoder --device cuda --fp16 --train-tokens 8000 --batch-size 64
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict

from fairseq_sparse.benchmarks import bench_common
from fairseq_sparse.benchmarks.bench_common import USER_DIR, fmt, pct, print_header

BIN = os.path.dirname(sys.executable)
PRESETS = ("base", "big", "tiny")  # of bench_common.SIZES
ORDERS = ("tem-sem-ifm", "sem-tem-ifm", "sem-ifm")
PAPER_TARGET = 0.11  # Yang et al. 2020, Table 4 (Base): +11.18% .. +12.62% train words/s, +11.60% .. +40.23% sent/s
PAPER_BLEU_DROP = 0.3  # Yang et al. 2020, Table 4: -0.16 / -0.32 BLEU (En-De / En-Fr), +0.91 En-Zh


def add_quality_args(p):
    """The quality part's options: both decoders trained on a synthetic corpus, BLEU compared."""
    g = p.add_argument_group("quality part")
    g.add_argument("--bleu", dest="bleu", action="store_true", default=None,
                   help="train both decoders on a synthetic corpus and compare BLEU (default on; off with --quick)")
    g.add_argument("--no-bleu", dest="bleu", action="store_false", help="skip the quality part")
    g.add_argument("--bleu-train", type=int, default=20000, help="training sentence pairs (default 20000)")
    g.add_argument("--bleu-test", type=int, default=500, help="test sentence pairs (default 500)")
    g.add_argument("--bleu-updates", type=int, default=1000, help="fairseq-train --max-update (default 1000: ~17 min for both on 2 busy "
                   "cores, but BLEU is still far from converged there; 3000 for a BLEU comparison)")
    g.add_argument("--bleu-layers", type=int, default=2, help="encoder and decoder layers (default 2)")
    g.add_argument("--bleu-dim", type=int, default=128, help="embedding dim (default 128)")
    g.add_argument("--bleu-heads", type=int, default=4, help="attention heads (default 4)")
    g.add_argument("--bleu-ffn", type=int, default=512, help="FFN dim (default 512)")
    g.add_argument("--bleu-max-tokens", type=int, default=2000, help="fairseq-train --max-tokens (default 2000)")
    g.add_argument("--log-interval", type=int, default=50, help="fairseq-train --log-interval (wps samples)")
    g.add_argument("--workdir", help="corpus, data-bin, checkpoints and logs go here (default: a temp dir)")


def parse_args(argv=None):
    p = _parser()
    args = p.parse_args(argv)
    if args.quick:
        _apply_quick(args)
    if args.bleu is None:
        args.bleu = True
    bench_common.check_size_args(p, args, args.arch_size)
    args.variant_list = _variant_list(p, args.variants)
    _check_ranges(p, args)
    return args


def _parser():
    """The benchmark's argument parser."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_common.add_size_args(p, "--arch-size", PRESETS)
    p.add_argument("--variants", default="standard,simplified",
                   help="comma list of standard, simplified, ORDER, simplified-ORDER (ORDER: sem-tem-ifm, "
                        "sem-ifm); default standard,simplified")
    p.add_argument("--batch-size", type=int, default=16, help="inference: sentences per generate (default 16)")
    p.add_argument("--src-len", type=int, default=30, help="source length in tokens, EOS included (default 30)")
    p.add_argument("--out-len", type=int, default=30, help="inference: forced output length before EOS")
    p.add_argument("--tgt-len", type=int, default=30, help="training: target length, EOS included")
    p.add_argument("--train-tokens", type=int, default=2000, help="training: target tokens per batch")
    p.add_argument("--no-train", action="store_true", help="skip the training-speed part")
    p.add_argument("--no-infer", action="store_true", help="skip the inference-speed part")
    bench_common.add_run_args(p, repeats=5, threads=1)
    add_quality_args(p)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tiny sizes, 2 repeats, short sequences; with --bleu a tiny corpus, 30 updates")
    return p


def _apply_quick(args):
    """--quick: tiny sizes, 2 repeats, short sequences; a tiny BLEU corpus and model, BLEU off unless asked."""
    args.arch_size = "tiny" if args.layers is None and args.dim is None else args.arch_size
    bench_common.apply_quick(args, {"repeats": 2, "batch_size": 4, "src_len": 8, "out_len": 6, "tgt_len": 8,
                                    "train_tokens": 200, "bleu_updates": 30, "log_interval": 10})
    args.bleu_train, args.bleu_test = 300, 20
    args.bleu_layers, args.bleu_dim, args.bleu_heads, args.bleu_ffn = 1, 32, 2, 64
    if args.bleu is None:
        args.bleu = False


def _variant_list(p, variants: str):
    """The variants of the comma list VARIANTS, "standard" first (the baseline of every ratio); p.error if unknown."""
    variant_list = [v.strip() for v in variants.split(",") if v.strip()]
    for v in variant_list:
        if v not in ("standard", "simplified") and v.replace("simplified-", "", 1) not in ORDERS:
            p.error(f"--variants: unknown variant {v!r}")
    if "standard" not in variant_list:
        variant_list.insert(0, "standard")  # the baseline of every ratio
    return variant_list


def _check_ranges(p, args):
    """p.error unless the run, batch and length options (and with --bleu, the BLEU run's) are in range."""
    bench_common.check_run_args(p, args)
    bench_common.check_range(p, "--batch-size", args.batch_size, 1, None)
    bench_common.check_range(p, "--train-tokens", args.train_tokens, 1, None)
    bench_common.check_range(p, "--src-len", args.src_len, 2)
    bench_common.check_range(p, "--tgt-len", args.tgt_len, 2)
    bench_common.check_range(p, "--out-len", args.out_len, 1, bench_common.MAX_POSITIONS - 1)
    if args.bleu:
        for option in ("--bleu-train", "--bleu-test", "--bleu-updates", "--bleu-layers", "--bleu-heads",
                       "--bleu-ffn", "--bleu-max-tokens", "--log-interval"):
            bench_common.check_range(p, option, getattr(args, option[2:].replace("-", "_")), 1, None)
        if args.bleu_dim % args.bleu_heads:
            p.error(f"--bleu-dim {args.bleu_dim} is not a multiple of --bleu-heads {args.bleu_heads}")
        if args.workdir and os.path.exists(args.workdir) and not os.path.isdir(args.workdir):
            p.error(f"--workdir exists and is not a directory: {args.workdir}")


def variant_flags(name):
    """fairseq-train flags of a variant (see the module docstring)."""
    if name == "standard":
        return ["--arch", "transformer"]
    if name == "simplified":
        return ["--arch", "transformer_simplified_decoder"]
    if name.startswith("simplified-"):
        return ["--arch", "transformer_simplified_decoder", "--decoder-sublayer-order", name[len("simplified-"):]]
    return ["--arch", "transformer_head_gates", "--head-gates", "", "--decoder-sublayer-order", name]


# ---------------------------------------------------------------------------------------------
# speed part
# ---------------------------------------------------------------------------------------------

def build(name, args, data):
    """(model, task, criterion, optimizer) of a variant, from a fairseq-train command line, random weights."""
    from fairseq import optim

    extra = ["--dropout", "0.1", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
             "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "1e-4"] + (["--fp16"] if args.fp16 else [])
    model, task, cfg = bench_common.build_random_model(args, data, variant_flags(name) + extra, as_config=True)
    criterion = task.build_criterion(cfg.criterion)
    if args.fp16:
        model.half()
    model.to(args.torch_device)
    criterion.to(args.torch_device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = (optim.FP16Optimizer.build_optimizer(cfg, params) if args.fp16
                 else optim.build_optimizer(cfg.optimizer, params))
    return {"model": model, "task": task, "criterion": criterion, "optimizer": optimizer,
            "params": sum(p.numel() for p in model.parameters()),
            "decoder_params": sum(p.numel() for p in model.decoder.parameters()),
            "decoder_layer_params": sum(p.numel() for p in model.decoder.layers.parameters()),
            "blocks": ",".join(getattr(model.decoder.layers[0], "blocks", ("self", "cross", "ffn")))}


def make_batches(args, d):
    """(inference sample, training sample): fixed random tokens, no padding."""
    import torch

    g = torch.Generator().manual_seed(args.seed + 12345)
    dev = args.torch_device
    infer = bench_common.source_sample(bench_common.random_sources(d, args.batch_size, args.src_len, g).to(dev))
    n = max(1, args.train_tokens // args.tgt_len)
    train = bench_common.source_sample(bench_common.random_sources(d, n, args.src_len, g).to(dev))
    tgt = bench_common.random_sources(d, n, args.tgt_len, g).to(dev)
    prev = torch.cat([torch.full((n, 1), d.eos(), dtype=tgt.dtype, device=dev), tgt[:, :-1]], 1)
    train.update(nsentences=n, ntokens=tgt.numel(), target=tgt)
    train["net_input"]["prev_output_tokens"] = prev
    return infer, train


def generate_fn(v, sample, args):
    import torch

    gen = bench_common.forced_generator(v["model"], v["task"].target_dictionary, args.beam, args.out_len)

    def run():
        v["model"].eval()
        with torch.no_grad():
            lengths = bench_common.out_lengths(gen.generate([v["model"]], sample))
        if lengths != [args.out_len + 1]:
            raise SystemExit(f"output lengths {lengths}, expected {args.out_len + 1}")
    return run


def train_step_fn(v, sample):
    """One training step as fairseq's Trainer does it (its bookkeeping aside)."""
    step = [0]

    def run():
        v["optimizer"].zero_grad()
        v["task"].train_step(sample, v["model"], v["criterion"], v["optimizer"], step[0])
        v["optimizer"].clip_grad_norm(0.0)  # the Trainer always computes the norm (clip_norm 0: no clipping)
        v["task"].optimizer_step(v["optimizer"], v["model"], step[0])
        step[0] += 1
    return run


def time_part(fns, args, work):
    """Warm-up, peak memory, then interleaved rounds; name -> results. work: units (words, sentences) per run."""
    cuda = args.device == "cuda"
    res = OrderedDict((n, {"peak_mb": None}) for n in fns)
    for name, fn in fns.items():
        for _ in range(max(1, args.warmup)):
            fn()
    if not args.no_memory:
        for name, fn in fns.items():
            with bench_common.PeakMemory(cuda) as mem:
                fn()
            res[name]["peak_mb"] = mem.mb
    rounds = bench_common.time_rounds(fns, args.repeats, cuda)
    for name, r in res.items():
        r.update(bench_common.clock_medians(rounds[name], args.clock))
        r["per_s"] = work / r["time_s"]
    for name, r in res.items():
        r["vs_standard"], r["vs_standard_paired"] = bench_common.speedup(res["standard"], r)
    return res


def speed_part(args):
    import torch

    with tempfile.TemporaryDirectory(prefix="simplified_decoder_bench_") as data:
        variants = OrderedDict((n, build(n, args, data)) for n in args.variant_list)
    infer, train = make_batches(args, variants["standard"]["task"].source_dictionary)
    out = {"variants": {n: {k: v[k] for k in ("params", "decoder_params", "decoder_layer_params", "blocks")}
                        for n, v in variants.items()},
           "train_tokens": train["ntokens"], "train_sentences": train["nsentences"]}
    if not args.no_infer:
        print(f"timing inference ({', '.join(variants)}) ...", flush=True)
        t0 = time.time()
        out["infer"] = time_part({n: generate_fn(v, infer, args) for n, v in variants.items()}, args, args.batch_size)
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
    if not args.no_train:
        print(f"timing training steps ({', '.join(variants)}) ...", flush=True)
        t0 = time.time()
        out["train"] = time_part({n: train_step_fn(v, train) for n, v in variants.items()}, args, train["ntokens"])
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
    del variants
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------------------------------------
# quality part
# ---------------------------------------------------------------------------------------------

def run_logged(cmd, log, env):
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)


def wait_all(procs):
    for name, (proc, log) in procs.items():
        if proc.wait() != 0:
            with open(log) as f:
                raise SystemExit(f"{name} failed ({proc.returncode}), log {log}:\n{f.read()[-4000:]}")


def train_wps(text):
    """[(time, wps)] that fairseq-train logged: every --log-interval updates (train_inner), else per epoch."""
    found = re.findall(r"^(\S+ \S+) \| INFO \| train_inner \|.*? wps=([\d.]+)", text, re.M)
    if not found:  # fewer updates than --log-interval: the per-epoch summaries
        found = re.findall(r"^(\S+ \S+) \| INFO \| train \| epoch .*?\| wps ([\d.]+)", text, re.M)
    return [(t, float(w)) for t, w in found]


def bleu_part(args, workdir):
    """Corpus, fairseq-preprocess, fairseq-train (both at once), fairseq-generate; BLEU and logged speeds."""
    from fairseq_sparse.synthetic_corpus import make_corpus

    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    raw = make_corpus(os.path.join(workdir, "raw"), train=args.bleu_train, valid=50, test=args.bleu_test,
                      seed=args.seed)
    data = os.path.join(workdir, "bin")
    log = os.path.join(workdir, "preprocess.log")
    wait_all({"fairseq-preprocess": (run_logged(
        [os.path.join(BIN, "fairseq-preprocess"), "--source-lang", "src", "--target-lang", "tgt",
         "--trainpref", f"{raw}/train", "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test",
         "--destdir", data, "--joined-dictionary", "--workers", "1"], log, env), log)})
    from fairseq_sparse.recipe.commands import cpu_flag, model_flags

    common = ["--user-dir", USER_DIR, *model_flags(args.bleu_layers, args.bleu_dim, args.bleu_ffn, args.bleu_heads, 0.1),
              "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
              "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt",
              "--warmup-updates", str(max(1, min(200, args.bleu_updates // 5))), "--max-tokens", str(args.bleu_max_tokens),
              "--max-update", str(args.bleu_updates), "--seed", str(args.seed), *cpu_flag(args), "--num-workers", "0",
              "--no-progress-bar", "--log-format", "simple", "--log-interval", str(args.log_interval),
              "--disable-validation", "--no-epoch-checkpoints", "--no-save-optimizer-state"]
    names = ("standard", "simplified")
    runs = OrderedDict()
    for n in names:
        runs[n] = {"save": os.path.join(workdir, n), "train_log": os.path.join(workdir, f"train_{n}.log"),
                   "gen_log": os.path.join(workdir, f"generate_{n}.log")}
        runs[n]["train_cmd"] = ([os.path.join(BIN, "fairseq-train"), data, "--save-dir", runs[n]["save"]]
                                + variant_flags(n) + common)
    print(f"training {' and '.join(names)} at once ({args.bleu_updates} updates, logs in {workdir}) ...", flush=True)
    t0 = time.time()
    wait_all({f"fairseq-train {n}": (run_logged(r["train_cmd"], r["train_log"], env), r["train_log"])
              for n, r in runs.items()})
    print(f"  ({time.time() - t0:.0f} s); decoding the test set ...", flush=True)
    for n, r in runs.items():
        r["gen_cmd"] = [os.path.join(BIN, "fairseq-generate"), data, "--user-dir", USER_DIR,
                        "--path", os.path.join(r["save"], "checkpoint_last.pt"), "--gen-subset", "test",
                        "--beam", "4", "--batch-size", "64", "--required-batch-size-multiple", "1",
                        *cpu_flag(args), "--quiet", "--num-workers", "0"]
    wait_all({f"fairseq-generate {n}": (run_logged(r["gen_cmd"], r["gen_log"], env), r["gen_log"])
              for n, r in runs.items()})
    return read_logs(runs, args.bleu_test)


def read_logs(runs, test_sentences):
    """BLEU, length ratio, sentences/s of fairseq-generate; wps, last nll, parameters of fairseq-train."""
    logs = {}
    for n, r in runs.items():
        with open(r["train_log"]) as f:
            logs[n] = f.read()
    # wps while both ran: intervals logged after the faster run's last one had the machine to themselves
    ends = [train_wps(text)[-1][0] for text in logs.values() if train_wps(text)]
    for n, r in runs.items():
        text = logs[n]
        both = [w for t, w in train_wps(text) if t <= min(ends)] or [w for _, w in train_wps(text)]
        r["wps_logged"] = [w for _, w in train_wps(text)]
        r["wps"] = statistics.median(both[1:] if len(both) > 1 else both) if both else None
        nll = re.findall(r"\| train \| epoch .*?\| nll_loss ([\d.]+)", text)
        r["train_nll"] = float(nll[-1]) if nll else None  # the last epoch's (base 2), a view of convergence
        m = re.search(r"num\. shared model params: ([\d,]+)", text)
        r["params"] = int(m.group(1).replace(",", "")) if m else None
        with open(r["gen_log"]) as f:
            text = f.read()
        m = re.search(r"BLEU4? = ([\d.]+).*?ratio=([\d.]+)", text)
        r["bleu"], r["length_ratio"] = (float(m.group(1)), float(m.group(2))) if m else (None, None)
        m = re.search(r"Translated ([\d,]+) sentences .*?\(([\d.]+) sentences/s", text)
        r["test_sentences"], r["gen_sent_per_s"] = (int(m.group(1).replace(",", "")), float(m.group(2))) if m else (None, None)
        if r["bleu"] is None or r["test_sentences"] != test_sentences:
            raise SystemExit(f"fairseq-generate {n}: no BLEU or not all {test_sentences} sentences; log {r['gen_log']}")
    return runs


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------

def print_speed(args, speed, meta):
    print(f"speed: {meta['model']}; device {meta['device']}, torch threads {meta['threads']}, clock {args.clock}, "
          f"median of {args.repeats} interleaved rounds after {args.warmup} warm-up")
    print()
    print_header(f"{'variant':<20} {'decoder blocks':<16} {'params':>12} {'decoder':>12} {'dec. layers':>12}")
    for n, v in speed["variants"].items():
        print(f"{n:<20} {v['blocks']:<16} {v['params']:>12,} {v['decoder_params']:>12,} "
              f"{v['decoder_layer_params']:>12,}")
    print("(decoder: with the shared embeddings; dec. layers: the decoder layers only)")
    for part, unit, desc in (
            ("train", "words/s", f"training step (fwd + label-smoothed CE + bwd + Adam), {speed['train_sentences']} "
                                 f"x {args.src_len} -> {args.tgt_len} tokens = {speed['train_tokens']} target words"),
            ("infer", "sent/s", f"inference: SequenceGenerator, batch {args.batch_size}, beam {args.beam}, "
                                f"source {args.src_len}, output forced to {args.out_len} tokens + EOS")):
        if part not in speed:
            continue
        print()
        print(desc)
        print_header(f"{'variant':<20} {'wall s':>8} {'cpu s':>8} {unit:>10} {'vs standard':>11} {'(paired)':>8} "
                     f"{'peak MB':>8}")
        for n, r in speed[part].items():
            print(f"{n:<20} {r['wall_s']:>8.3f} {r['cpu_s']:>8.3f} {r['per_s']:>10.1f} {pct(r['vs_standard']):>11} "
                  f"{pct(r['vs_standard_paired']):>8} {fmt(r['peak_mb'], '{:.0f}'):>8}")
    print()
    print(f"words/s, sent/s: work / median {args.clock} time; vs standard: speed ratio - 1 against stock fairseq "
          "transformer; (paired): median of the per-round ratios; peak MB: what one untimed run added "
          "(CPU: peak RSS, CUDA: allocated)")
    meta["noise"] = bench_common.noise_line({f"{n} vs standard, {part}": (speed[part]["standard"]["times_s"], r["times_s"])
                                             for part in ("train", "infer") if part in speed
                                             for n, r in speed[part].items() if n != "standard"})
    print(meta["noise"])


def print_quality(args, runs):
    s, x = runs["standard"], runs["simplified"]
    print(f"quality: synthetic corpus ({args.bleu_train} train / {args.bleu_test} test pairs), "
          f"{args.bleu_layers}+{args.bleu_layers} layers, dim {args.bleu_dim}, {args.bleu_heads} heads, FFN "
          f"{args.bleu_ffn}, {args.bleu_updates} updates of <= {args.bleu_max_tokens} tokens, seed {args.seed}; "
          "both trained at once, 1 thread each")
    print_header(f"{'variant':<20} {'params':>10} {'train nll':>9} {'BLEU4':>7} {'hyp/ref':>7} {'train wps':>10} "
                 f"{'gen sent/s':>10}")
    for n, r in runs.items():
        print(f"{n:<20} {fmt(r['params'], '{:,}'):>10} {fmt(r['train_nll'], '{:.3f}'):>9} {r['bleu']:>7.2f} "
              f"{r['length_ratio']:>7.3f} {fmt(r['wps'], '{:.0f}'):>10} {fmt(r['gen_sent_per_s'], '{:.1f}'):>10}")
    wps = None if not (s["wps"] and x["wps"]) else x["wps"] / s["wps"]
    gen = None if not (s["gen_sent_per_s"] and x["gen_sent_per_s"]) else x["gen_sent_per_s"] / s["gen_sent_per_s"]
    print(f"{'simplified - standard':<20} {'':>10} {'':>9} {x['bleu'] - s['bleu']:>+7.2f} {'':>7} {pct(wps):>10} "
          f"{pct(gen):>10}")
    print("train nll: fairseq-train's last epoch summary (base 2); hyp/ref: fairseq-generate's length ratio")
    print("train wps: median of the wps fairseq-train logged while both ran (first interval left out); gen sent/s: "
          "fairseq-generate's (real output lengths)")


def print_report(args, speed, runs, meta):
    print()
    print(f"Simplified vs standard decoder (Yang et al. 2020, Table 4); load average before / after "
          f"{meta['loadavg_before']} / {meta['loadavg_after']} ({meta.get('cores', '?')} cores)")
    if speed:
        print_speed(args, speed, meta)
    if runs:
        print()
        print_quality(args, runs)
    print()
    print(f"Yang et al. 2020, Table 4 (Base, GPU): train +11.2..+12.6%, inference +11.6..+40.2%, BLEU -0.16..-0.32 "
          f"(En-De, En-Fr); target here: >= +{PAPER_TARGET:.0%} speed, BLEU within ~{PAPER_BLEU_DROP}")
    if speed and "simplified" in speed["variants"]:
        for part in ("train", "infer"):
            if part in speed:
                r = speed[part]["simplified"]
                print(f"  {part:<5}: simplified {pct(r['vs_standard'])} (paired {pct(r['vs_standard_paired'])}): "
                      f"{'met' if r['vs_standard'] >= 1 + PAPER_TARGET else 'not met'}")
    if runs:
        diff = runs["simplified"]["bleu"] - runs["standard"]["bleu"]
        print(f"  BLEU : {diff:+.2f}: {'met' if diff >= -PAPER_BLEU_DROP else 'not met'}")


def main(argv=None):
    args = parse_args(argv)
    started = bench_common.start(args)
    bench_common.init_torch(args)
    L, D, H, F, V = args.layers, args.dim, args.heads, args.ffn, args.vocab
    model_desc = f"random {L}+{L} layers, dim {D}, {H} heads, FFN {F}, vocab {V} (--arch-size {args.arch_size})"
    speed = runs = None
    if not (args.no_train and args.no_infer):
        print(f"building {', '.join(args.variant_list)}: {model_desc} ...", flush=True)
        speed = speed_part(args)
    if args.bleu:
        if args.workdir:
            os.makedirs(args.workdir, exist_ok=True)
            runs = bleu_part(args, args.workdir)
        else:
            with tempfile.TemporaryDirectory(prefix="simplified_decoder_bleu_") as workdir:
                runs = bleu_part(args, workdir)
    meta = {"model": model_desc, **bench_common.machine_facts(args, started)}
    print_report(args, speed, runs, meta)
    bench_common.finish(args, started, meta, {"speed": speed, "quality": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
