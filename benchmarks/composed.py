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

Timing (the rules of benchmarks/bench_common.py): per source length one fresh subprocess loads every
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
  python benchmarks/composed.py --threads 1 --clock cpu                 # small model, 25/400/800 tokens
  python benchmarks/composed.py --quick --threads 1 --clock cpu         # smoke run, a few minutes
  python benchmarks/composed.py --size base --layer-sparsity paper --sparsity 0.34
"""
import argparse
import importlib.util
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common  # noqa: E402
from bench_common import fmt, print_header  # noqa: E402

VARIANTS = ("stock", "l0drop", "layers", "layers_unpruned", "heads", "simplified", "composed", "stock_int8",
            "composed_int8", "stock_ts", "composed_ts", "composed_int8_ts", "ct2_float32", "ct2_int8")
CT2_VARIANTS = ("ct2_float32", "ct2_int8")
#: --path names that say the checkpoint prunes source states: refused for a checkpoint without L0Drop gates
L0DROP_NAMES = ("l0drop", "layers", "layers_unpruned")
#: torch's dynamic int8 quantisation of a fairseq model (the _ts one also scripted)
INT8_VARIANTS = ("stock_int8", "composed_int8", "composed_int8_ts")
#: fairseq-sparse-export's TorchScript artefact (model and scripted beam search) of a checkpoint
TS_VARIANTS = ("stock_ts", "composed_ts", "composed_int8_ts")
CPU_ONLY = CT2_VARIANTS + INT8_VARIANTS + TS_VARIANTS
#: variants that decode themselves (not through a SequenceGenerator built here)
SELF_DECODING = CT2_VARIANTS + TS_VARIANTS
#: fairseq architectures CTranslate2's FairseqConverter takes (stock transformer and its size presets)
CT2_ARCHS = ("transformer", "transformer_iwslt_de_en", "transformer_wmt_en_de", "transformer_vaswani_wmt_en_de_big",
             "transformer_vaswani_wmt_en_fr_big", "transformer_wmt_en_de_big", "transformer_wmt_en_de_big_t2t")
#: the checkpoint each variant decodes (a variant not listed decodes its own)
CHECKPOINT_OF = {"layers_unpruned": "layers", "ct2_float32": "stock", "ct2_int8": "stock", "stock_int8": "stock",
                 "composed_int8": "composed", "stock_ts": "stock", "composed_ts": "composed",
                 "composed_int8_ts": "composed"}
#: models whose L0Drop gates are calibrated per source length
GATED = ("l0drop", "layers", "composed")
#: paper 000 Sec. 6: cumulative sparsity after encoder layers 1-5 and at the output (WMT14 En-De, lambda 0.2)
PAPER_LAYER_SPARSITY, PAPER_OUTPUT_SPARSITY = (0.0, 0.0, 0.086, 0.086, 0.087), 0.34


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
        if name in L0DROP_NAMES and not describe_checkpoint(path)["gates"]["l0drop"]:
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


# ---------------------------------------------------------------------------------------------
# the random checkpoints (built in the parent)
# ---------------------------------------------------------------------------------------------

def kept_heads(args):
    """--kept-heads JSON: in every layer and attention type, a seeded random subset of heads without --heads-pruned."""
    import random

    rng = random.Random(args.seed)
    keep = max(1, args.heads - round(args.heads * args.heads_pruned))
    return json.dumps({t: [sorted(rng.sample(range(args.heads), keep)) for _ in range(args.layers)]
                       for t in ("enc", "dec", "encdec")})


def arch_flags(args, variant):
    heads = ["--kept-heads", kept_heads(args)]
    return {"stock": ["--arch", "transformer"],
            "l0drop": ["--arch", "transformer_l0drop"],
            "layers": ["--arch", "transformer_l0drop", "--l0drop-between-layers"],
            "heads": ["--arch", "transformer_head_gates", "--head-gates", ""] + heads,
            "simplified": ["--arch", "transformer_simplified_decoder"],
            "composed": ["--arch", "transformer_l0drop", "--l0drop-between-layers", "--simplified-decoder"] + heads,
            }[variant]


def calibrate_gates(args, model, dictionary, length):
    """Set the L0Drop gates, in forward order, to the cumulative rates (--layer-sparsity, then --sparsity) on a
    calibration batch of random sources of ``length`` tokens."""
    import torch

    enc = model.encoder
    gates = list(enc.layer_l0drops or []) + [enc.l0drop]
    targets = (args._layer_rates if enc.layer_l0drops is not None else []) + [args.sparsity]
    B = bench_common.CALIBRATION_SENTENCES
    calib = bench_common.random_sources(dictionary, B, length, args.seed + 7919 * length + 1)
    w = torch.randn(args.dim, generator=torch.Generator().manual_seed(args.seed + 1))
    for gate in gates:
        gate.reset_parameters()  # open: every later gate sees the states the earlier ones leave
    dropped = 0.0
    for gate, target in zip(gates, targets):
        seen = {}
        hook = gate.register_forward_pre_hook(lambda m, a, kw: seen.update(x=a[0], alive=kw.get("alive")),
                                              with_kwargs=True)
        with torch.no_grad():
            enc(calib, src_lengths=torch.full((B,), length))  # a direct call: not compacted
        hook.remove()
        scores = (seen["x"] @ w).t()
        alive = seen["alive"] if seen["alive"] is not None else torch.ones_like(scores, dtype=torch.bool)
        share = (target - dropped) / (1.0 - dropped)  # of the states still alive
        bench_common.close_gate_at_quantile(gate.log_alpha_proj, scores[alive], w, min(max(share, 0.0), 1.0))
        dropped = target


def build_checkpoints(args, workdir, lengths):
    """{(model, length or None): path}: one checkpoint per model, per length for the gated ones."""
    import torch

    if args._paths:
        paths, data = {(name, None): path for name, path in args._paths.items()}, os.path.abspath(args.data)
        return convert_to_ct2(args, workdir, paths, data), data
    data = os.path.join(workdir, "data")
    history = [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "none",
                "lr_scheduler_state": {"best": None}, "num_updates": 0}]
    paths = {}
    models = {CHECKPOINT_OF.get(v, v) for v in args._variants}
    for name in [m for m in ("stock", "l0drop", "layers", "heads", "simplified", "composed") if m in models]:
        model, task, margs = bench_common.build_random_model(args, data, arch_flags(args, name))
        model.eval()
        for n in (lengths if name in GATED else [None]):
            if n is not None:
                calibrate_gates(args, model, task.source_dictionary, n)
            paths[(name, n)] = os.path.join(workdir, f"{name}{'' if n is None else f'_len{n}'}.pt")
            torch.save({"args": margs, "model": model.state_dict(), "optimizer_history": history,
                        "extra_state": {"train_iterator": None}}, paths[(name, n)])
    return convert_to_ct2(args, workdir, paths, data), data


def convert_to_ct2(args, workdir, paths, data):
    """The stock checkpoint converted to CTranslate2 (float32 weights; int8 is chosen when it is loaded)."""
    if any(v in CT2_VARIANTS for v in args._variants):
        import ctranslate2

        stock = args._options.get("stock", {"source_lang": "src", "target_lang": "tgt"})
        out = os.path.join(workdir, "ct2_stock")
        ctranslate2.converters.FairseqConverter(paths[("stock", None)], data, source_lang=stock["source_lang"],
                                                target_lang=stock["target_lang"]).convert(out, force=True)
        paths[("ct2", None)] = out
    return paths


def source_lang(args):
    """The source suffix of the dictionaries (src for the random models)."""
    return args._options["stock"]["source_lang"] if args._paths else "src"


def checkpoint(paths, variant, length):
    """The checkpoint (or CTranslate2 folder) variant decodes at a source length."""
    if variant in CT2_VARIANTS:
        return paths[("ct2", None)]
    name = variant if any(key[0] == variant for key in paths) else CHECKPOINT_OF[variant]
    return paths.get((name, length)) or paths[(name, None)]


# ---------------------------------------------------------------------------------------------
# one measurement (a child process)
# ---------------------------------------------------------------------------------------------

class Ct2Model:
    """The stock model in CTranslate2: translate_batch with fairseq's beam and forced length."""

    def __init__(self, path, compute_type, threads, dictionary):
        import ctranslate2

        self.translator = ctranslate2.Translator(path, device="cpu", compute_type=compute_type, inter_threads=1,
                                                 intra_threads=threads)
        self.dictionary = dictionary

    def generate(self, sample, beam, out_len):
        eos = self.dictionary.eos()
        tokens = [[self.dictionary[int(i)] for i in row if int(i) != eos]  # CTranslate2 adds the EOS itself
                  for row in sample["net_input"]["src_tokens"]]
        return self.translator.translate_batch(tokens, beam_size=beam, min_decoding_length=out_len,
                                               max_decoding_length=out_len, return_scores=True)


class ScriptedModel:
    """fairseq-sparse-export's artefact of a loaded model (scripted in memory, not written): fairseq's beam search
    with the output length forced as :func:`bench_common.forced_generator` forces it."""

    def __init__(self, model, task, beam, out_len):
        from fairseq_sparse import export

        options = dict(export.GENERATION_DEFAULTS, beam=beam, max_len_a=0, max_len_b=out_len, min_len=out_len)
        self.translator = export.script_translator(model, task, options, {})

    def generate(self, sample, beam, out_len):
        net_input = sample["net_input"]
        return self.translator(net_input["src_tokens"], net_input["src_lengths"])


def load(spec, variant, length):
    """(model, task) of one variant: a fairseq model in eval mode, a :class:`ScriptedModel` or a :class:`Ct2Model`."""
    import torch
    from fairseq import checkpoint_utils

    path = spec["paths"][variant]
    if variant in CT2_VARIANTS:
        from fairseq.data import Dictionary

        d = Dictionary.load(os.path.join(spec["data"], f"dict.{spec['source_lang']}.txt"))
        return Ct2Model(path, variant.split("_")[1], spec["threads"], d), None
    overrides = {"data": spec["data"]}
    if variant.endswith("_unpruned"):
        overrides["pruned_decoding"] = False
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides)
    model = models[0].eval()
    if variant in INT8_VARIANTS:
        from fairseq_sparse.export import quantise_int8

        model = quantise_int8(model)
    if variant in TS_VARIANTS:
        return ScriptedModel(model, task, spec["beam"], spec["out_len"]), task
    if spec["fp16"]:
        model.half()
    return model.to(torch.device(spec["device"])), task


def encoder_rows(model, sample):
    """The rows each encoder layer ran over and the memory length, on fairseq's generator path; the heads of
    every attention layer, the decoder layers with an FFN, whether the memory is shared by the hypotheses."""
    import torch

    from fairseq_sparse.modules.head_gates import head_layout

    rows, hooks = [], [layer.register_forward_pre_hook(lambda m, a: rows.append(a[0].size(0)))
                       for layer in model.encoder.layers]
    with torch.no_grad():
        out = model.encoder.forward_torchscript(sample["net_input"])
    for h in hooks:
        h.remove()
    src = sample["net_input"]["src_tokens"]
    layout = head_layout(model)
    r = {"enc_rows": rows, "memory_len": out["encoder_out"][0].size(0), "shape": model_shape(model),
         "heads": {t: [n for (kind, _), n in layout.items() if kind == t] for t in ("enc", "dec", "encdec")},
         "dec_ffn": [getattr(layer, "fc1", None) is not None for layer in model.decoder.layers],
         "shared_memory": "l0drop_gates" in out}
    if "l0drop_gates" in out:
        pad = src.eq(model.encoder.padding_idx)
        r["sparsity"] = float(((out["l0drop_gates"][0] == 0) & ~pad).sum()) / float((~pad).sum())
    return r


def model_shape(model):
    """The sizes the bytes-per-step model needs (:class:`fairseq_sparse.analysis.decoding_traffic.ModelShape`'s
    fields), read off a loaded fairseq transformer; None if it is not one this model describes (a decoder
    layer without self- or encoder-decoder attention)."""
    from fairseq_sparse.modules.head_gates import attention_modules, head_layout

    enc, dec = model.encoder, model.decoder
    layout = head_layout(model)
    heads = {t: [n for (kind, _), n in layout.items() if kind == t] for t in ("enc", "dec", "encdec")}
    if not len(heads["dec"]) == len(heads["encdec"]) == len(dec.layers):
        return None
    ffn = [[layer.fc1.out_features if getattr(layer, "fc1", None) is not None else 0 for layer in side.layers]
           for side in (enc, dec)]
    proj = getattr(dec, "output_projection", None)
    return {"dim": dec.embed_tokens.embedding_dim, "head_dim": next(iter(attention_modules(model).values())).head_dim,
            "vocab": proj.out_features, "enc_heads": heads["enc"], "enc_ffn": ffn[0], "dec_heads": heads["dec"],
            "cross_heads": heads["encdec"], "dec_ffn": ffn[1], "tied_output": proj.weight is dec.embed_tokens.weight,
            "dec_final_norm": getattr(dec, "layer_norm", None) is not None,
            "enc_final_norm": getattr(enc, "layer_norm", None) is not None}


def device_rates(spec, clock):
    """Memory bandwidth (GB/s: 2 x the bytes of a tensor copied / time, read and write; CPU 128 MB, CUDA 1 GB)
    and peak FLOP rate (TFLOP/s: a square matmul in the model's precision, CPU 1024, CUDA 8192), each the
    median of 5 timed runs after one untimed (``clock``: the run's --clock; CUDA synchronised); --bandwidth-gbs
    and --peak-tflops replace them."""
    import statistics

    import torch

    cuda = spec["device"] == "cuda"
    dtype = torch.float16 if spec["fp16"] else torch.float32
    out = {"bandwidth_source": "measured", "peak_source": "measured"}

    def median_time(fn):
        fn()
        return statistics.median(bench_common.timed(fn, cuda)[0][1 if clock == "cpu" else 0] for _ in range(5))

    if spec.get("bandwidth_gbs"):
        out.update(bandwidth_gbs=spec["bandwidth_gbs"], bandwidth_source="--bandwidth-gbs")
    else:
        n = (2**30 if cuda else 2**27) // (torch.finfo(dtype).bits // 8)
        src = torch.ones(n, dtype=dtype, device=spec["device"])
        dst = torch.empty_like(src)
        out["bandwidth_gbs"] = 2 * src.numel() * src.element_size() / median_time(lambda: dst.copy_(src)) / 1e9
        del src, dst
    if spec.get("peak_tflops"):
        out.update(peak_tflops=spec["peak_tflops"], peak_source="--peak-tflops")
    else:
        n = 8192 if cuda else 1024
        a = torch.randn(n, n, device=spec["device"]).to(dtype)
        b = torch.randn(n, n, device=spec["device"]).to(dtype)
        out["peak_tflops"] = 2 * n**3 / median_time(lambda: torch.mm(a, b)) / 1e12
    return out


def component_shares(model, gen, sample, clock):
    """Share of one generate's time (``clock``) spent in each part of a fairseq transformer (by hooks)."""
    import torch

    spent, began, hooks = {}, {}, []

    def watch(start_module, end_module, key):
        def start(*_):
            began[key] = clock()

        def end(*_):
            spent[key] = spent.get(key, 0.0) + clock() - began[key]

        hooks.append(start_module.register_forward_pre_hook(start))
        hooks.append(end_module.register_forward_hook(end))

    def watch_method(obj, name, key):  # an instance attribute shadows the class's method until deleted
        method = getattr(obj, name)

        def timed_call(*args, **kwargs):
            t = clock()
            try:
                return method(*args, **kwargs)
            finally:
                spent[key] = spent.get(key, 0.0) + clock() - t

        setattr(obj, name, timed_call)
        patched.append((obj, name))

    patched = []
    watch_method(model.encoder, "reorder_encoder_out", "memory_reorder")
    for i, layer in enumerate(model.encoder.layers):
        watch(layer.self_attn, layer.self_attn, f"enc_attn{i}")
        watch(layer.fc1, layer.fc2, f"enc_ffn{i}")
    for layer in model.decoder.layers:
        watch(layer.self_attn, layer.self_attn, "dec_self")
        watch(layer.encoder_attn, layer.encoder_attn, "dec_cross")
        watch_method(layer.encoder_attn, "reorder_incremental_state", "memory_reorder")
        watch(layer.fc1, layer.fc2, "dec_ffn")
    t0 = clock()
    with torch.no_grad():
        gen.generate([model], sample)
    total = clock() - t0
    for h in hooks:
        h.remove()
    for obj, name in patched:
        delattr(obj, name)
    return {k: v / total for k, v in spent.items()}


def measure_times(spec):
    """Timing child: every variant at one source length, loaded in one process, timed in interleaved rounds."""
    import torch

    bench_common.init_torch(argparse.Namespace(threads=spec["threads"], device=spec["device"]))
    cuda = spec["device"] == "cuda"
    L = spec["length"]
    jobs, facts, task = {}, {}, None
    for v in spec["variants"]:
        model, t = load(spec, v, L)
        task = task or t
        jobs[v] = model
    src, source = bench_common.make_sources(task, L, spec["batch_size"], spec["gen_subset"], spec["seed"] + L)
    torch.save(src, spec["sources"])  # the memory children decode the same sources
    sample = bench_common.source_sample(src.to(torch.device(spec["device"])))
    gens = {v: bench_common.forced_generator(m, task.target_dictionary, spec["beam"], spec["out_len"])
            for v, m in jobs.items() if v not in SELF_DECODING}
    run = {v: (lambda v=v: jobs[v].generate(sample, spec["beam"], spec["out_len"]) if v in SELF_DECODING
               else gens[v].generate([jobs[v]], sample)) for v in jobs}
    for v in jobs:
        facts[v] = {} if v in SELF_DECODING else encoder_rows(jobs[v], sample)
        if v in INT8_VARIANTS:
            facts[v]["shape"] = None  # the bytes-per-step model counts float weights: no prediction
        with torch.no_grad(), bench_common.PeakMemory(cuda) as mem:
            for _ in range(max(1, spec["warmup"])):
                out = run[v]()
        if cuda:
            facts[v]["cuda_peak_mb"] = mem.peak_mb
        if v in CT2_VARIANTS:
            facts[v]["out_lengths"] = sorted({len(h) for r in out for h in r.hypotheses})
        else:
            facts[v]["out_lengths"] = bench_common.out_lengths(out)
            facts[v]["hypos"] = [[h["tokens"].tolist() for h in hs] for hs in out]
            facts[v]["scores"] = [[float(h["score"]) for h in hs] for hs in out]
    clock = time.process_time if spec["clock"] == "cpu" else time.perf_counter
    shares = component_shares(jobs["stock"], gens["stock"], sample, clock)
    with torch.no_grad():
        rounds = bench_common.time_rounds(run, spec["repeats"], cuda)
    for v, r in facts.items():
        r.update(bench_common.clock_medians(rounds[v], spec["clock"]))
    with torch.no_grad():
        rates = device_rates(spec, spec["clock"])
    return {"length": L, "threads": torch.get_num_threads(), "shares": shares, "jobs": facts, "source": source,
            "rates": rates}


def measure_memory(spec):
    """Memory child (CPU): one variant in a fresh process, one generate; peak RSS and RSS after loading."""
    import gc

    import torch

    bench_common.init_torch(argparse.Namespace(threads=spec["threads"], device="cpu"))
    v, L = spec["variant"], spec["length"]
    model, task = load(spec, v, L)
    gc.collect()
    loaded = bench_common.proc_status_mb("VmRSS")
    sample = bench_common.source_sample(torch.load(spec["sources"]))  # the timing child's sources
    with torch.no_grad():
        if v in SELF_DECODING:
            model.generate(sample, spec["beam"], spec["out_len"])
        else:
            bench_common.forced_generator(model, task.target_dictionary, spec["beam"], spec["out_len"]).generate(
                [model], sample)
    return {"rss_loaded_mb": loaded, "peak_rss_mb": bench_common.peak_rss_mb()}


def run_child(args, mode, workdir, paths, data, length, **spec):
    spec.update({"mode": mode, "data": data, "length": length, "batch_size": args.batch_size, "beam": args.beam,
                 "out_len": args.out_len, "repeats": args.repeats, "warmup": args.warmup, "device": args.device,
                 "fp16": args.fp16, "threads": args.threads, "clock": args.clock, "seed": args.seed,
                 "bandwidth_gbs": args.bandwidth_gbs, "peak_tflops": args.peak_tflops,
                 "gen_subset": args.gen_subset, "source_lang": source_lang(args),
                 "sources": os.path.join(workdir, f"sources_{length}.pt"),
                 "paths": {v: checkpoint(paths, v, length) for v in args._variants + ["stock"]}})
    return bench_common.run_child(__file__, workdir, spec)


# ---------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------

def amdahl_bound(shares, r, stock, length, beam):
    """1 / (1 - the share of the stock model's time the variant ``r`` removes), see the module docstring; the
    variant's structure as measured (rows, memory, heads per layer, decoder FFNs) against stock's."""
    if "enc_rows" not in r:  # CTranslate2: another engine
        return None

    def kept(kind, i):
        return r["heads"][kind][i] / stock["heads"][kind][i]

    mem = r["memory_len"] / length
    per_sentence = 1.0 / beam if r["shared_memory"] else 1.0  # keys and values projected and read per sentence
    removed = shares.get("memory_reorder", 0.0) if r["shared_memory"] else 0.0
    for i, n in enumerate(r["enc_rows"]):
        f = n / length
        removed += shares.get(f"enc_attn{i}", 0.0) * (1 - kept("enc", i) * f * f)
        removed += shares.get(f"enc_ffn{i}", 0.0) * (1 - f)
    layers = len(r["dec_ffn"])
    for i in range(layers):  # decoder shares are summed over layers: each layer counts 1 / layers of them
        removed += shares.get("dec_self", 0.0) / layers * (1 - kept("dec", i)) if stock["heads"]["dec"] else 0.0
        removed += shares.get("dec_cross", 0.0) / layers * (1 - kept("encdec", i) * mem * per_sentence)
        removed += 0.0 if r["dec_ffn"][i] else shares.get("dec_ffn", 0.0) / layers
    return 1.0 / max(1.0 - removed, 1e-9)


def traffic_prediction(args, r, rates):
    """The bytes-per-step model's prediction of one variant's generate (module docstring of
    :mod:`fairseq_sparse.analysis.decoding_traffic`): {"reads": ..., "copies": ...} (without and with fairseq's
    per-step copies), each decoding_time's result; None for CTranslate2 or a model it does not describe."""
    from fairseq_sparse.analysis import decoding_traffic as dt

    if not r.get("shape"):
        return None
    shape = dt.ModelShape(**{k: tuple(v) if isinstance(v, list) else v for k, v in r["shape"].items()})
    common = dict(enc_rows=r["enc_rows"], memory_len=r["memory_len"], sentences=args.batch_size, beam=args.beam,
                  steps=args.out_len + 1, shared_memory=r["shared_memory"], element_bytes=2 if args.fp16 else 4,
                  bandwidth=rates["bandwidth_gbs"] * 1e9, peak_flops=rates["peak_tflops"] * 1e12)
    return {kind: dt.decoding_time(shape, copies=kind == "copies", **common) for kind in ("reads", "copies")}


def same_share(a, b):
    """The share of the hypotheses (every n-best entry of every sentence) identical in a and b."""
    pairs = [(x, y) for p, q in zip(a, b) for x, y in zip(p, q)]
    return sum(x == y for x, y in pairs) / max(1, len(pairs))


def summarise(args, timing, memory):
    rows = []
    for L, res in sorted(timing.items()):
        jobs, stock = res["jobs"], res["jobs"]["stock"]
        row = {"length": L, "shares": res["shares"], "rates": res["rates"], "variants": {}}
        predicted = {v: traffic_prediction(args, r, res["rates"]) for v, r in jobs.items()}
        for v, r in jobs.items():
            ratio, paired = bench_common.speedup(stock, r)
            pred, base = predicted[v], predicted["stock"]
            row["variants"][v] = dict({k: r.get(k) for k in ("time_s", "times_s", "wall_s", "cpu_s", "wall_times_s",
                                                             "cpu_times_s", "enc_rows", "memory_len", "sparsity",
                                                             "heads", "dec_ffn", "shared_memory", "out_lengths",
                                                             "cuda_peak_mb", "shape")},
                                      vs_stock=ratio, vs_stock_paired=paired,
                                      bound=amdahl_bound(res["shares"], r, stock, L, args.beam),
                                      traffic=pred,
                                      vs_stock_bytes=(base["reads"]["time_s"] / pred["reads"]["time_s"]
                                                      if pred else None),
                                      vs_stock_bytes_copies=(base["copies"]["time_s"] / pred["copies"]["time_s"]
                                                             if pred else None),
                                      **memory.get((v, L), {}))
        # each TorchScript artefact against the eager model it was scripted from (same weights, same sources)
        row["ts_same_hypotheses"] = {v: same_share(jobs[v]["hypos"], jobs[v[:-3]]["hypos"])
                                     for v in TS_VARIANTS if v in jobs and v[:-3] in jobs}
        if "layers" in jobs and "layers_unpruned" in jobs:
            a, b = jobs["layers"], jobs["layers_unpruned"]
            row["pruned_vs_unpruned"], row["pruned_vs_unpruned_paired"] = bench_common.speedup(b, a)
            row["identical_hypotheses"] = a["hypos"] == b["hypos"]
            row["max_score_diff"] = max(abs(x - y) for p, q in zip(a["scores"], b["scores"]) for x, y in zip(p, q))
        rows.append(row)
    return rows


def print_report(args, rows, meta):
    print()
    print(f"Composed model benchmark: {meta['model']}")
    print(f"device {meta['device']}, torch threads {meta['threads']}, batch {args.batch_size}, beam {args.beam}, output "
          f"forced to {args.out_len} tokens, median of {args.repeats} interleaved rounds after {args.warmup} warm-up; "
          f"sources: {meta['source']}")
    if not args._paths:
        print(f"assumed: output sparsity {args.sparsity:.1%}; cumulative sparsity after encoder layers "
              f"1..{args.layers - 1}: {', '.join(f'{r:.1%}' for r in args._layer_rates)}; heads removed per layer and "
              f"type: {round(args.heads * args.heads_pruned)} of {args.heads}")
    mem_name = "CUDA peak MB" if args.device == "cuda" else "peak RSS MB (loaded)"
    for row in rows:
        print()
        print(f"source length {row['length']}; stock's time: " + ", ".join(
            f"{k} {v:.0%}" for k, v in sorted(row["shares"].items(), key=lambda kv: -kv[1]) if v >= 0.01))
        rates, base = row["rates"], row["variants"]["stock"]["traffic"]
        print(f"bytes model: {rates['bandwidth_gbs']:.1f} GB/s ({rates['bandwidth_source']}), "
              f"{rates['peak_tflops'] * 1e3:.1f} GFLOP/s ({rates['peak_source']}); stock's mean step reads "
              + ", ".join(f"{k} {b / 1e6:.1f} MB" for k, b in base["copies"]["step_bytes"].items())
              + f"; predicted {base['reads']['time_s'] * 1e3:.3g} ms (+copies {base['copies']['time_s'] * 1e3:.3g} ms; "
              f"{base['copies']['memory_bound_share']:.0%} of the steps memory-bound), measured "
              f"{row['variants']['stock']['time_s'] * 1e3:.3g} ms")
        print_header(f"{'variant':>15} {args.clock + ' s':>8} {'vs stock':>8} {'(paired)':>8} {'bound':>6} "
                     f"{'bytes':>6} {'+copies':>7} {'pred ms':>7} {'sparsity':>8} {'encoder rows':>16} {'memory':>6}  "
                     f"{mem_name}")
        for v, r in row["variants"].items():
            if args.device == "cuda":
                mem = fmt(r.get("cuda_peak_mb"), "{:.0f}")
            else:
                mem = (f"{fmt(r.get('peak_rss_mb'), '{:.0f}')} ({fmt(r.get('rss_loaded_mb'), '{:.0f}')})"
                       if r.get("peak_rss_mb") else "-")
            enc_rows = "/".join(str(n) for n in r["enc_rows"]) if r.get("enc_rows") else "-"
            pred_ms = r["traffic"]["copies"]["time_s"] * 1e3 if r["traffic"] else None
            print(f"{v:>15} {r['time_s']:>8.3f} {r['vs_stock']:>7.2f}x {r['vs_stock_paired']:>7.2f}x "
                  f"{fmt(r['bound'], '{:.2f}x'):>6} {fmt(r['vs_stock_bytes'], '{:.2f}x'):>6} "
                  f"{fmt(r['vs_stock_bytes_copies'], '{:.2f}x'):>7} {fmt(pred_ms, '{:.3g}'):>7} "
                  f"{fmt(r.get('sparsity'), '{:.1%}'):>8} {enc_rows:>16} "
                  f"{fmt(r.get('memory_len'), '{}'):>6}  {mem}")
        for v, share in row.get("ts_same_hypotheses", {}).items():
            print(f"{v}: {share:.0%} of the hypotheses identical to {v[:-3]}'s (the eager model it was scripted from)")
        if "pruned_vs_unpruned" in row:
            print(f"layers / layers_unpruned (compaction and pruned memory on one checkpoint): "
                  f"{row['pruned_vs_unpruned']:.2f}x (paired {row['pruned_vs_unpruned_paired']:.2f}x); identical "
                  f"hypotheses: {'yes' if row['identical_hypotheses'] else 'NO'} (max score diff "
                  f"{row['max_score_diff']:.1e})")
    print()
    print("vs stock: time(stock) / time(variant); (paired): median of the per-round ratios; bound: Amdahl bound from "
          "stock's time split (see the docstring);")
    print("bytes, +copies: time(stock) / time(variant) predicted by the bytes-per-step roofline model (weights, "
          "cross- and self-attention keys/values, logits read per step at the bandwidth, or FLOPs at the peak rate, "
          "whichever is slower; +copies: with fairseq's per-step cache copies); pred ms: its time with copies;")
    print("encoder rows: rows each encoder layer ran over (compacted: 1 + most kept states); memory: source states the "
          "decoder attends to.")
    if args.device == "cpu" and not args.no_memory:
        print(f"peak RSS at {max(r['length'] for r in rows)} tokens: ru_maxrss of a fresh process that loads one "
              "model and runs one generate (model + libraries + decoding); (loaded): its RSS before decoding.")
    ct2 = [v for v in rows[0]["variants"] if v in CT2_VARIANTS]
    if ct2:
        lengths = rows[0]["variants"][ct2[0]]["out_lengths"]
        print(f"CTranslate2 output lengths {lengths} (fairseq: {args.out_len} + EOS).")
    meta["noise"] = bench_common.noise_line({f"{v} vs stock, {row['length']} tokens": (row["variants"]["stock"]["times_s"],
                                                                                        r["times_s"])
                                             for row in rows for v, r in row["variants"].items() if v != "stock"})
    print(meta["noise"])
    print(f"load average before / after: {meta['loadavg_before']} / {meta['loadavg_after']}")


def main(argv=None):
    args = parse_args(argv)
    if bench_common.child_main(args, measure_times, measure_memory):
        return
    with bench_common.workdir(args.workdir, "composed_bench_") as workdir:
        run(args, workdir)


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
