"""fairseq-sparse-probe: the universal probing decoder of paper 004 (Yang et al., Sec. 3.1 and 3.3).

    fairseq-sparse-probe DATA --path CKPT --output-dir DIR [--probe source,target] [--modules all]
        [--layers all] [--train-subset train] [--valid-subset valid] [--max-updates 2000] [--max-epochs 1]
        [--max-tokens 4096] [--lr 1e-3] [--probe-embed-dim D] [--compare OTHER/probe.json] [--cpu]

Freezes the checkpoint (any fairseq encoder-decoder transformer: stock ``transformer``, ours, a
simplified decoder, another sub-layer order), reads the representation of every decoder module (TEM,
SEM, IFM per layer and, inside the IFM, Add-Norm I, FFN, Add-Norm II) in teacher-forced passes over
the training subset, and trains one probe per (sequence, layer, module): a one-layer Transformer
decoder that recovers the source sentence, or the target sentence (with the attention mask that stops
it from reading states that have seen the word to predict). All probes train on the same batches
(disjoint parameters, one Adam step). It reports the recovery perplexity per module and layer on
held-out data (``--valid-subset``): lower = more of that sequence in the representation.

Outputs in --output-dir: probe.tsv (kind, layer, module, tokens, nll, ppl), probe.json, probe_modules.png
(TEM / SEM / IFM per layer, source and target panels: paper 004 Fig. 3), probe_ifm.png (Add-Norm I /
FFN / Add-Norm II: Fig. 8; for decoders with an FFN) and, with ``--compare``, probe_compare.png (IFM
of this and another run: Fig. 10). Layers are numbered from 0 (bottom), as in fairseq-sparse-attention.
"""
import argparse
import json
import logging
import math
import os
import sys
import time

import torch

from fairseq_sparse.cli import common
from fairseq_sparse.probing import MODULE_LABELS, MODULES, PROBE_KINDS

logger = logging.getLogger("fairseq_sparse.probe")
PROG = "fairseq-sparse-probe"


def get_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("data", help="fairseq-preprocess output directory (dictionaries and the subsets)")
    p.add_argument("--path", required=True, help="checkpoint of the translation model to probe (kept frozen)")
    p.add_argument("--output-dir", required=True, help="where probe.tsv, probe.json and the PNGs go")
    p.add_argument("--user-dir", default=None, help="another fairseq plugin the checkpoint needs")
    p.add_argument("--source-lang", default=None)
    p.add_argument("--target-lang", default=None)
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
                        "IFM curves of both (paper 004 Fig. 10)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cpu", action="store_true", help="run on the CPU even if CUDA is available")
    p.add_argument("--log-interval", type=int, default=100)
    p.add_argument("--no-progress-bar", action="store_true")
    p.add_argument("--log-format", default=None, choices=("json", "none", "simple", "tqdm"))
    return p


def _fail(msg):
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _csv(value):
    return [v.strip() for v in value.split(",") if v.strip()]


def validate(args):
    """Everything that can be checked before a model is loaded."""
    if not os.path.isfile(args.path):
        _fail(f"checkpoint not found: {args.path}")
    if not os.path.isdir(args.data):
        _fail(f"data directory not found: {args.data}")
    if args.compare is not None and not os.path.isfile(args.compare):
        _fail(f"--compare file not found: {args.compare}")
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        _fail(f"--output-dir exists and is not a directory: {args.output_dir}")
    kinds = _csv(args.probe)
    if not kinds or any(k not in PROBE_KINDS for k in kinds):
        _fail(f"--probe must name source and/or target, got {args.probe!r}")
    modules = None if args.modules.strip() == "all" else _csv(args.modules)
    if modules is not None and (not modules or any(m not in MODULES for m in modules)):
        _fail(f"--modules: unknown module(s) in {args.modules!r}; choose from {', '.join(MODULES)} or 'all'")
    for name in ("max_updates", "max_epochs", "max_tokens", "log_interval"):
        if getattr(args, name) < 1:
            _fail(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("batch_size", "probe_embed_dim", "probe_ffn_dim", "probe_heads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            _fail(f"--{name.replace('_', '-')} must be >= 1")
    if not args.lr > 0:
        _fail("--lr must be > 0")
    if not 0 <= args.probe_dropout < 1:
        _fail("--probe-dropout must be in [0, 1)")
    compare = None
    if args.compare is not None:
        try:
            with open(args.compare) as f:
                compare = json.load(f)
            compare["results"]
        except (ValueError, KeyError, TypeError) as e:
            _fail(f"--compare {args.compare} is not a probe.json written by {PROG}: {e}")
    return kinds, modules, compare


def load_subset(task, cfg, subset):
    try:
        task.load_dataset(subset, task_cfg=cfg.task)
    except Exception as e:
        _fail(f"cannot load subset '{subset}' from the data directory: {type(e).__name__}: {e}")
    dataset = task.dataset(subset)
    if getattr(dataset, "tgt", None) is None:
        _fail(f"subset '{subset}' has no target side: the probe reads the decoder on reference translations")
    return dataset


def batches(task, model, dataset, args, epoch, shuffle):
    from fairseq import utils

    itr = task.get_batch_iterator(
        dataset, max_tokens=args.max_tokens, max_sentences=args.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True, seed=args.seed, epoch=epoch, num_workers=0,
    )
    return itr.next_epoch_itr(shuffle=shuffle)


def forward_sequences(model, sample, recorder, kinds, src_dict, tgt_dict):
    """Teacher-forced pass of the frozen model: (memory padding mask, {kind: (prev_tokens, target)});
    the module representations are in ``recorder.records``."""
    from fairseq_sparse.probing import source_sequences

    net = sample["net_input"]
    recorder.reset()
    with torch.no_grad():
        enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
        model.decoder(net["prev_output_tokens"], encoder_out=enc, src_lengths=net["src_lengths"])
    memory_pad = net["prev_output_tokens"].eq(tgt_dict.pad())
    seqs = {}
    if "source" in kinds:
        seqs["source"] = source_sequences(net["src_tokens"], src_dict.pad(), src_dict.eos())
    if "target" in kinds:
        seqs["target"] = (net["prev_output_tokens"], sample["target"])
    return memory_pad, seqs


def main(argv=None):
    args = get_parser().parse_args(argv)
    kinds, wanted_modules, compare = validate(args)

    from fairseq import utils
    from fairseq.logging import progress_bar

    from fairseq_sparse.probing import DecoderModuleRecorder, ProbeSet, check_modules, frozen

    common.import_plugins(args.user_dir)
    try:
        model, cfg, task = common.load_checkpoint(args.path, args.data, args.source_lang, args.target_lang)
    except ValueError as e:
        _fail(str(e))
    decoder = getattr(model, "decoder", None)
    if getattr(model, "encoder", None) is None or not hasattr(decoder, "layers"):
        _fail(f"{args.path}: {type(model).__name__} is not a fairseq encoder-decoder transformer")
    try:
        layer_ids = common.parse_layers(args.layers, len(decoder.layers))
        modules = check_modules(decoder.layers, wanted_modules, layer_ids, what=args.path)
        recorder = DecoderModuleRecorder(decoder.layers)
    except ValueError as e:
        _fail(str(e))
    if not modules:
        _fail(f"the chosen decoder layers of {args.path} share no probe-able module")
    train_set = load_subset(task, cfg, args.train_subset)
    valid_set = load_subset(task, cfg, args.valid_subset)
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary

    use_cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda" if use_cuda else "cpu")
    model.to(device)
    torch.manual_seed(args.seed)
    dim = decoder.embed_dim
    embed_dim = args.probe_embed_dim or dim
    heads = args.probe_heads or getattr(cfg.model, "decoder_attention_heads", None) or 4
    if embed_dim % heads:
        _fail(f"--probe-embed-dim {embed_dim} is not a multiple of the probe's {heads} heads (--probe-heads)")
    keys = [(k, l, m) for k in kinds for l in layer_ids for m in modules]
    probes = ProbeSet(keys, {"source": src_dict, "target": tgt_dict}, memory_dim=dim, embed_dim=embed_dim,
                      ffn_dim=args.probe_ffn_dim or 4 * embed_dim, heads=heads, dropout=args.probe_dropout).to(device)
    optimizer = torch.optim.Adam(probes.parameters(), lr=args.lr)
    n_params = sum(p.numel() for p in probes.parameters())
    label = args.label or getattr(cfg.model, "arch", type(model).__name__)
    logger.info(f"probing {args.path} ({label}): {len(keys)} probes ({', '.join(kinds)} x layers {layer_ids} x "
                f"{', '.join(modules)}), {n_params} probe parameters; training on '{args.train_subset}' for at most "
                f"{args.max_updates} updates / {args.max_epochs} epochs, reporting on '{args.valid_subset}'")

    pads = {"source": src_dict.pad(), "target": tgt_dict.pad()}
    t0 = time.time()
    updates = 0
    with frozen(model), recorder:
        probes.train()
        for epoch in range(1, args.max_epochs + 1):
            itr = progress_bar.progress_bar(
                batches(task, model, train_set, args, epoch, shuffle=True), log_format=args.log_format,
                log_interval=args.log_interval, epoch=epoch, prefix=f"probe training on '{args.train_subset}'",
                default_log_format="none" if args.no_progress_bar else "tqdm")
            for sample in itr:
                if not sample:
                    continue
                sample = utils.move_to_cuda(sample) if use_cuda else sample
                memory_pad, seqs = forward_sequences(model, sample, recorder, kinds, src_dict, tgt_dict)
                ntok = {k: int(t.ne(pads[k]).sum()) for k, (_, t) in seqs.items()}
                losses = probes.losses(recorder.records, memory_pad, seqs)
                loss = sum(v / ntok[key[0]] for key, v in losses.items())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                updates += 1
                if updates % args.log_interval == 0:
                    itr.log({"mean_nll": round(loss.item() / len(keys), 4)}, tag="train", step=updates)
                if updates >= args.max_updates:
                    break
            if updates >= args.max_updates:
                break
        train_time = time.time() - t0

        probes.eval()
        nll = {k: 0.0 for k in keys}
        tokens = {k: 0 for k in keys}
        with torch.no_grad():
            for sample in batches(task, model, valid_set, args, 1, shuffle=False):
                if not sample:
                    continue
                sample = utils.move_to_cuda(sample) if use_cuda else sample
                memory_pad, seqs = forward_sequences(model, sample, recorder, kinds, src_dict, tgt_dict)
                for key, v in probes.losses(recorder.records, memory_pad, seqs).items():
                    nll[key] += float(v)
                    tokens[key] += int(seqs[key[0]][1].ne(pads[key[0]]).sum())

    results = [{"kind": k, "layer": l, "module": m, "tokens": tokens[(k, l, m)],
                "nll": nll[(k, l, m)] / max(tokens[(k, l, m)], 1),
                "ppl": math.exp(nll[(k, l, m)] / max(tokens[(k, l, m)], 1))} for (k, l, m) in keys]
    out = {"checkpoint": os.path.abspath(args.path), "data": os.path.abspath(args.data), "label": label,
           "train_subset": args.train_subset, "valid_subset": args.valid_subset, "updates": updates,
           "train_seconds": round(train_time, 1), "probe_parameters": n_params,
           "settings": {"probe_embed_dim": embed_dim, "probe_ffn_dim": args.probe_ffn_dim or 4 * embed_dim,
                        "probe_heads": heads, "probe_dropout": args.probe_dropout, "lr": args.lr,
                        "max_tokens": args.max_tokens, "seed": args.seed},
           "results": results}
    write_outputs(out, args.output_dir, compare)
    print_summary(out)
    return out


def write_outputs(out, output_dir, compare=None):
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "probe.tsv"), "w") as f:
        f.write("kind\tlayer\tmodule\ttokens\tnll\tppl\n")
        for r in out["results"]:
            f.write(f"{r['kind']}\t{r['layer']}\t{r['module']}\t{r['tokens']}\t{r['nll']:.4f}\t{r['ppl']:.3f}\n")
    with open(os.path.join(output_dir, "probe.json"), "w") as f:
        json.dump(out, f, indent=1)
    plot_curves(out, ("tem", "sem", "ifm"), os.path.join(output_dir, "probe_modules.png"),
                "recovery perplexity per decoder module (paper 004 Fig. 3)")
    if any(r["module"] == "ffn" for r in out["results"]):
        plot_curves(out, ("addnorm1", "ffn", "addnorm2"), os.path.join(output_dir, "probe_ifm.png"),
                    "inside the IFM (paper 004 Fig. 8)")
    if compare is not None:
        plot_compare(out, compare, os.path.join(output_dir, "probe_compare.png"))


def _series(out, kind, module):
    pts = sorted((r["layer"], r["ppl"]) for r in out["results"] if r["kind"] == kind and r["module"] == module)
    return [p[0] for p in pts], [p[1] for p in pts]


def _finish_axis(ax, out, title, ylabel):
    layers = sorted({r["layer"] for r in out["results"]})
    values = [y for line in ax.get_lines() for y in line.get_ydata() if y > 0]  # this panel's curves
    ax.set_xticks(layers)
    if values and max(values) / min(values) > 10:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("decoder layer (0 = bottom)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _panels(kinds):
    from fairseq_sparse.analysis import plotting  # noqa: F401  (selects the Agg backend)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 3.8), squeeze=False)
    return plt, fig, axes[0]


def plot_curves(out, modules, path, title):
    kinds = [k for k in PROBE_KINDS if any(r["kind"] == k for r in out["results"])]
    plt, fig, axes = _panels(kinds)
    drawn = False
    for ax, kind in zip(axes, kinds):
        for m in modules:
            xs, ys = _series(out, kind, m)
            if xs:
                ax.plot(xs, ys, marker="o", markersize=4, label=MODULE_LABELS[m])
                drawn = True
        _finish_axis(ax, out, f"{kind} ({out['label']})", "recovery PPL (lower = more information)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if drawn:
        fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_compare(out, other, path):
    kinds = [k for k in PROBE_KINDS if any(r["kind"] == k for r in out["results"])]
    plt, fig, axes = _panels(kinds)
    for ax, kind in zip(axes, kinds):
        for run, style in ((out, "-"), (other, "--")):
            xs, ys = _series(run, kind, "ifm")
            if xs:
                ax.plot(xs, ys, style, marker="o", markersize=4, label=f"IFM, {run.get('label', '?')}")
        _finish_axis(ax, out, kind, "recovery PPL (lower = more information)")
    fig.suptitle("IFM information per layer (paper 004 Fig. 10)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
