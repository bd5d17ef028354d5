"""The composed benchmark's variants (fairseq_sparse/benchmarks/composed.py's docstring says what each is) and their
checkpoints: random models built and saved as fairseq-train would, the L0Drop gates calibrated to the asked rates,
the stock model converted to CTranslate2; which checkpoint each variant decodes."""
import json
import os

from fairseq_sparse.benchmarks import bench_common

VARIANTS = ("stock", "l0drop", "layers", "layers_unpruned", "heads", "simplified", "composed", "stock_int8",
            "composed_int8", "stock_ts", "composed_ts", "composed_int8_ts", "ct2_float32", "ct2_int8")
CT2_VARIANTS = ("ct2_float32", "ct2_int8")
#: --path names that say the checkpoint prunes source states (these and any name they begin, l0drop_unpruned among
#: them): refused for a checkpoint without L0Drop gates
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
