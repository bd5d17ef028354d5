"""fairseq-sparse-probe: the universal probing decoder of Yang et al. (2020), Sec. 3.1 and 3.3.

    fairseq-sparse-probe DATA --path CKPT --output-dir DIR [--probe source,target] [--modules all]
        [--layers all] [--train-subset train] [--valid-subset valid] [--max-updates 2000] [--max-epochs 1]
        [--max-tokens 4096] [--lr 1e-3] [--probe-embed-dim D] [--compare OTHER/probe.json] [--device cpu|cuda]

Freezes the checkpoint (any fairseq encoder-decoder transformer: stock ``transformer``, ours, a
simplified decoder, another sub-layer order), reads the representation of every decoder module (TEM,
SEM, IFM per layer and, inside the IFM, Add-Norm I, FFN, Add-Norm II) in teacher-forced passes over
the training subset, and trains one probe per (sequence, layer, module): a one-layer Transformer
decoder that recovers the source sentence, or the target sentence (with the attention mask that stops
it from reading states that have seen the word to predict). All probes train on the same batches
(disjoint parameters, one Adam step). It reports the recovery perplexity per module and layer on
held-out data (``--valid-subset``): lower = more of that sequence in the representation.

Outputs in --output-dir: probe.tsv (kind, layer, module, tokens, nll, ppl), probe.json, probe_modules.png
(TEM / SEM / IFM per layer, source and target panels: Yang et al. 2020, Fig. 3), probe_ifm.png (Add-Norm I /
FFN / Add-Norm II: Fig. 8; for decoders with an FFN) and, with ``--compare``, probe_compare.png (IFM
of this and another run: Fig. 10). Layers are numbered from 0 (bottom), as in fairseq-sparse-attention-analysis.
Output files that exist already are refused unless ``--overwrite``; every input is checked before
anything is loaded. The maths and the training loop are in :mod:`fairseq_sparse.analysis.probing`.
"""
import argparse
import json
import logging
import math
import os

import torch

from fairseq_sparse.analysis.probing import MODULE_LABELS, MODULES, PROBE_KINDS
from fairseq_sparse.cli import common

logger = logging.getLogger("fairseq_sparse.probe")
PROG = "fairseq-sparse-probe"
TSV_HEADER = ("kind", "layer", "module", "tokens", "nll", "ppl")


def get_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("data", help="fairseq-preprocess output directory (dictionaries and the subsets)")
    common.add_checkpoint_args(p, path_help="checkpoint of the translation model to probe (kept frozen)")
    p.add_argument("--output-dir", required=True, help="where probe.tsv, probe.json and the PNGs go")
    common.add_overwrite_arg(p)
    p.add_argument("--probe", default="source,target",
                   help="sequences to recover: source (auto-encoding the source sentence), target (with the mask "
                        "against copying the translation history), or both")
    p.add_argument("--modules", default="all",
                   help=f"decoder modules to probe, comma-separated from {','.join(MODULES)}; 'all' = every module "
                        "the decoder has (a simplified decoder has no ffn/addnorm2, sem-ifm no tem)")
    p.add_argument("--layers", default="all", help="decoder layers to probe: 'all', 'last' or 0-based indices like '0,5' (negative: from the top)")
    p.add_argument("--train-subset", default="train", help="subset the probes are trained on (paper: the MT training set)")
    p.add_argument("--valid-subset", default="valid", help="held-out subset the perplexities are reported on")
    p.add_argument("--max-updates", type=int, default=2000, help="stop training the probes after this many updates")
    p.add_argument("--max-epochs", type=int, default=1, help="... or after this many passes over --train-subset")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch (source or target, the longer)")
    p.add_argument("--batch-size", type=int, default=None, help="sentences per batch (default: as --max-tokens allows)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate of the probes")
    p.add_argument("--probe-embed-dim", type=int, default=None, help="probe width (default: the decoder's width)")
    p.add_argument("--probe-ffn-dim", type=int, default=None, help="probe FFN width (default: 4 x --probe-embed-dim)")
    p.add_argument("--probe-heads", type=int, default=None, help="probe attention heads (default: the decoder's)")
    p.add_argument("--probe-dropout", type=float, default=0.1, help="dropout inside the probes")
    p.add_argument("--label", default=None, help="name of this model in the plots (default: the checkpoint's arch)")
    p.add_argument("--compare", default=None, metavar="JSON",
                   help="probe.json of another model (e.g. the standard decoder): probe_compare.png overlays the "
                        "IFM curves of both (Yang et al. 2020, Fig. 10)")
    p.add_argument("--seed", type=int, default=1)
    common.add_progress_args(p)
    return p


def _csv(value):
    return [v.strip() for v in value.split(",") if v.strip()]


def output_files(modules, compare):
    """The files this run may write in --output-dir."""
    files = ["probe.tsv", "probe.json", "probe_modules.png"]
    if modules is None or "ffn" in modules:
        files.append("probe_ifm.png")
    if compare is not None:
        files.append("probe_compare.png")
    return files


def check_options(args):
    """(kinds, modules or None for all) from the option values; ToolError on a bad value."""
    common.check_finite(args)
    kinds = _csv(args.probe)
    if not kinds or any(k not in PROBE_KINDS for k in kinds):
        raise common.ToolError(f"--probe must name source and/or target, got {args.probe!r}")
    modules = None if args.modules.strip() == "all" else _csv(args.modules)
    if modules is not None and (not modules or any(m not in MODULES for m in modules)):
        raise common.ToolError(f"--modules: unknown module(s) in {args.modules!r}; choose from {', '.join(MODULES)} "
                               "or 'all'")
    for name in ("max_updates", "max_epochs", "max_tokens", "log_interval"):
        if getattr(args, name) < 1:
            raise common.ToolError(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("batch_size", "probe_embed_dim", "probe_ffn_dim", "probe_heads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise common.ToolError(f"--{name.replace('_', '-')} must be >= 1")
    if not args.lr > 0:
        raise common.ToolError("--lr must be > 0")
    if not 0 <= args.probe_dropout < 1:
        raise common.ToolError("--probe-dropout must be in [0, 1)")
    return kinds, modules


def read_compare(path):
    """The probe.json of --compare (None without it)."""
    if path is None:
        return None
    try:
        with open(path) as f:
            compare = json.load(f)
        compare["results"]
    except (ValueError, KeyError, TypeError) as e:
        raise common.ToolError(f"--compare {path} is not a probe.json written by {PROG}: {e}") from None
    return compare


def validate(args):
    """Everything that can be checked before a model is loaded: (kinds, modules, compare)."""
    common.check_checkpoint_file(args.path)
    common.check_data_dir(args.data)
    common.check_input_files(("--compare", args.compare))
    kinds, modules = check_options(args)
    files = output_files(modules, args.compare)
    common.check_output_dir(args.output_dir, files, args.overwrite, data=args.data)
    if os.path.isdir(args.output_dir):  # and none of them is an input (--compare OUT/probe.json)
        common.check_output_files([("--output-dir", os.path.join(args.output_dir, f)) for f in files], True,
                                  inputs=(args.path, args.compare))
    return kinds, modules, read_compare(args.compare)


def load(args, wanted_modules):
    """(model, cfg, task, layer ids, modules, recorder, train set, valid set)."""
    from fairseq_sparse.analysis.probing import DecoderModuleRecorder, check_modules

    common.import_plugins(args.user_dir)
    model, cfg, task = common.load_checkpoint(args.path, args.data, args.source_lang, args.target_lang)
    decoder = getattr(model, "decoder", None)
    if getattr(model, "encoder", None) is None or not hasattr(decoder, "layers"):
        raise common.ToolError(f"{args.path}: {type(model).__name__} is not a fairseq encoder-decoder transformer")
    layer_ids = common.parse_layers(args.layers, len(decoder.layers))
    modules = check_modules(decoder.layers, wanted_modules, layer_ids, what=args.path)
    recorder = DecoderModuleRecorder(decoder.layers)
    if not modules:
        raise common.ToolError(f"the chosen decoder layers of {args.path} share no probe-able module")
    train_set = common.load_split(task, cfg, args.train_subset, need_target=True)
    valid_set = common.load_split(task, cfg, args.valid_subset, need_target=True)
    return model, cfg, task, layer_ids, modules, recorder, train_set, valid_set


def probe_settings(args, cfg, model):
    from fairseq_sparse.analysis.probing import ProbeSettings

    embed_dim = args.probe_embed_dim or model.decoder.embed_dim
    heads = args.probe_heads or getattr(cfg.model, "decoder_attention_heads", None) or 4
    if embed_dim % heads:
        raise common.ToolError(f"--probe-embed-dim {embed_dim} is not a multiple of the probe's {heads} heads "
                               "(--probe-heads)")
    return ProbeSettings(embed_dim=embed_dim, ffn_dim=args.probe_ffn_dim or 4 * embed_dim, heads=heads,
                         dropout=args.probe_dropout, lr=args.lr, max_updates=args.max_updates,
                         max_epochs=args.max_epochs, log_interval=args.log_interval)


def batches(task, model, dataset, args, epoch, shuffle):
    """fairseq's token-bounded batches (one max-positions rule: the task's and the model's)."""
    from fairseq import utils

    itr = task.get_batch_iterator(
        dataset, max_tokens=args.max_tokens, max_sentences=args.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True, seed=args.seed, epoch=epoch, num_workers=0,
    )
    return itr.next_epoch_itr(shuffle=shuffle)


def run_probes(args, model, cfg, task, layer_ids, modules, recorder, train_set, valid_set, kinds, settings):
    """Build, train and evaluate the probes: the probe.json dictionary."""
    from fairseq_sparse.analysis.probing import build_probes, probe_model

    device = torch.device("cuda" if common.use_cuda(args.cpu) else "cpu")
    model.to(device)
    torch.manual_seed(args.seed)
    dictionaries = {"source": task.source_dictionary, "target": task.target_dictionary}
    probes = build_probes(kinds, layer_ids, modules, dictionaries, model.decoder.embed_dim, settings).to(device)
    n_params = sum(p.numel() for p in probes.parameters())
    label = args.label or getattr(cfg.model, "arch", type(model).__name__)
    logger.info(f"probing {args.path} ({label}): {len(probes.keys)} probes ({', '.join(kinds)} x layers {layer_ids} "
                f"x {', '.join(modules)}), {n_params} probe parameters; training on '{args.train_subset}' for at "
                f"most {args.max_updates} updates / {args.max_epochs} epochs, reporting on '{args.valid_subset}'")

    def train_epochs(epoch):
        return common.progress(batches(task, model, train_set, args, epoch, shuffle=True), args,
                               f"epoch {epoch:03d} | probe training on '{args.train_subset}'")

    def valid_samples():
        return batches(task, model, valid_set, args, 1, shuffle=False)

    run = probe_model(model, probes, recorder, train_epochs, valid_samples, dictionaries, settings)
    return {"checkpoint": os.path.abspath(args.path), "data": os.path.abspath(args.data), "label": label,
            "train_subset": args.train_subset, "valid_subset": args.valid_subset, "updates": run["updates"],
            "train_seconds": round(run["train_seconds"], 1), "probe_parameters": n_params,
            "settings": {"probe_embed_dim": settings.embed_dim, "probe_ffn_dim": settings.ffn_dim,
                         "probe_heads": settings.heads, "probe_dropout": settings.dropout, "lr": settings.lr,
                         "max_tokens": args.max_tokens, "seed": args.seed},
            "results": run["results"]}


def main(argv=None):
    args = get_parser().parse_args(argv)
    try:
        common.check_device(args)
        kinds, wanted_modules, compare = validate(args)
        model, cfg, task, layer_ids, modules, recorder, train_set, valid_set = load(args, wanted_modules)
        settings = probe_settings(args, cfg, model)
    except ValueError as e:  # ToolError, and check_modules' / DecoderModuleRecorder's clear errors
        common.fail(PROG, str(e))
    out = run_probes(args, model, cfg, task, layer_ids, modules, recorder, train_set, valid_set, kinds, settings)
    diverged = [f"{r['kind']} layer {r['layer']} {r['module']}" for r in out["results"] if not math.isfinite(r["nll"])]
    if diverged:  # nothing written: a NaN table is not a result
        common.fail(PROG, f"the probes diverged (non-finite loss: {', '.join(diverged[:3])}"
                          f"{', ...' if len(diverged) > 3 else ''}): lower --lr (now {settings.lr:g})")
    write_outputs(out, args.output_dir, compare)
    print_summary(out)
    return out


def write_outputs(out, output_dir, compare=None):
    from fairseq_sparse.analysis import plotting

    os.makedirs(output_dir, exist_ok=True)
    rows = [[r["kind"], r["layer"], r["module"], r["tokens"], f"{r['nll']:.4f}", f"{r['ppl']:.3f}"]
            for r in out["results"]]
    common.write_tsv(os.path.join(output_dir, "probe.tsv"), TSV_HEADER, rows)
    common.write_json(os.path.join(output_dir, "probe.json"), out)
    plotting.plot_probe_curves(out, ("tem", "sem", "ifm"), os.path.join(output_dir, "probe_modules.png"),
                               "recovery perplexity per decoder module (Yang et al. 2020, Fig. 3)")
    if any(r["module"] == "ffn" for r in out["results"]):
        plotting.plot_probe_curves(out, ("addnorm1", "ffn", "addnorm2"), os.path.join(output_dir, "probe_ifm.png"),
                                   "inside the IFM (Yang et al. 2020, Fig. 8)")
    if compare is not None:
        plotting.plot_probe_compare(out, compare, os.path.join(output_dir, "probe_compare.png"))


def print_summary(out):
    print(f"{PROG} | {out['label']} | {out['updates']} updates in {out['train_seconds']} s | recovery perplexity "
          f"on '{out['valid_subset']}' (lower = more information):")
    layers = sorted({r["layer"] for r in out["results"]})
    for kind in PROBE_KINDS:
        rows = [r for r in out["results"] if r["kind"] == kind]
        if not rows:
            continue
        print(f"  {kind:<11}" + "".join(f"{'layer ' + str(l):>10}" for l in layers))
        for m in MODULES:
            by_layer = {r["layer"]: r["ppl"] for r in rows if r["module"] == m}
            if by_layer:
                print(f"  {MODULE_LABELS[m]:<11}" + "".join(
                    f"{by_layer[l]:>10.2f}" if l in by_layer else f"{'-':>10}" for l in layers))


def cli_main():
    common.setup_logging()
    main()


if __name__ == "__main__":
    cli_main()
