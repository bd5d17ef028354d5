"""Head importance, ablation and pruning curves of Michel, Levy & Neubig (2019), "Are Sixteen Heads Really
Better than One?", on any fairseq encoder-decoder transformer checkpoint (stock ``transformer`` or this
plugin's models).

    fairseq-sparse-head-importance importance  DATA --path CKPT --output-dir DIR [--importance-subset valid]
                                               [--write-mask mask.json --prune-fraction 0.5]
    fairseq-sparse-head-importance evaluate    DATA --path CKPT [--head-mask mask.json] [--output-dir DIR]
    fairseq-sparse-head-importance ablate      DATA --path CKPT --output-dir DIR  # Sec. 3.2, Table 1
    fairseq-sparse-head-importance keep-one    DATA --path CKPT --output-dir DIR  # Sec. 3.3, Table 2
    fairseq-sparse-head-importance prune-curve DATA --path CKPT --output-dir DIR  # Sec. 4.2 / 5, Fig. 3 / 4
    fairseq-sparse-head-importance prune-curve DATA --checkpoints E1.pt E2.pt ... --output-dir DIR  # Sec. 6, Fig. 5

Importance I_h = E_x |dL(x)/dxi_h| (Eq. 2) is estimated on ``--importance-subset`` (default valid; the
paper uses held-out newstest2009-12), L(x) = -log p(y|x) of one sentence (teacher forced, eval mode),
averaged over sentences; per-layer l2 normalisation unless ``--no-normalize-by-layer``. BLEU is
measured on ``--gen-subset`` (default test), the first ``--max-sentences`` sentences, with fairseq's
SequenceGenerator (``--beam``, default 5 as in the paper's scripts) and sacrebleu
(``--sacrebleu-tokenize none`` = BLEU of the tokenised output, as in the paper). Significance: paired
bootstrap resampling (sacrebleu, ``--bootstrap-samples`` 1000), p < ``--alpha`` (0.01) is marked "*".
The maths is in :mod:`fairseq_sparse.analysis.head_importance`.

Head masks (``--head-mask``, ``--write-mask``): {"enc": [[1, 0, 1, 1], ...], "dec": ..., "encdec": ...},
one row per layer, one value in [0, 1] per current head, omitted types all ones;
``fairseq-sparse-prune-heads --head-mask FILE`` exports the physically smaller model. Every input is
checked before any work; existing output files are refused unless ``--overwrite``.
"""
import argparse
import logging
import os

from fairseq_sparse.analysis import head_importance as hi
from fairseq_sparse.analysis.scores import bleu_metric
from fairseq_sparse.cli import common
from fairseq_sparse.cli.common import ToolError
from fairseq_sparse.modules.head_gates import (ATTENTION_TYPES, check_head_mask, head_layout, read_head_mask,
                                               write_head_mask)

logger = logging.getLogger("fairseq_sparse.head_importance")
PROG = "fairseq-sparse-head-importance"
TYPES = ATTENTION_TYPES
TYPE_TITLES = {"enc": "encoder self-attention", "dec": "decoder self-attention", "encdec": "encoder-decoder attention"}
MODES = ("all",) + TYPES
CITE = "Michel et al. 2019"


# ----------------------------------------------------------------------------------------------
# arguments


def _common_parser():
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("model and data")
    g.add_argument("data", metavar="DATA", help="fairseq data-bin directory (dictionaries and splits)")
    common.add_checkpoint_args(g, path_required=False)
    common.add_bleu_args(p.add_argument_group("BLEU evaluation"))
    g = p.add_argument_group("output and logging")
    g.add_argument("--output-dir", metavar="DIR", help="TSV, JSON and PNG files go here")
    common.add_overwrite_arg(g)
    common.add_progress_args(g)
    p.set_defaults(log_interval=10)
    return p


def _importance_parser():
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group(f"head importance ({CITE}, Sec. 4.1)")
    g.add_argument("--importance-subset", default="valid",
                   help="split to estimate I_h on (default: valid; the paper uses held-out dev sets)")
    g.add_argument("--importance-max-sentences", type=int, default=None, metavar="N",
                   help="only the first N sentences of --importance-subset (default: all)")
    g.add_argument("--importance-batch-size", type=int, default=16, metavar="B",
                   help="sentences per forward/backward pass (default 16). With --importance-per sentence the "
                        "result does not depend on it")
    g.add_argument("--importance-per", choices=("sentence", "batch"), default="sentence",
                   help="'sentence' (default, exact Eq. 2): |dL(x)/dxi_h| of every sentence x, via one mask "
                        "variable per sentence; 'batch': |d(sum of the batch's L)/dxi_h| per batch (exact only "
                        "with --importance-batch-size 1, else a lower bound), as in the authors' code")
    g.add_argument("--no-normalize-by-layer", action="store_true",
                   help="skip the per-layer l2 normalisation of I_h (paper: normalised)")
    return p


def _mask_writer_parser():
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("head mask for export (fairseq-sparse-prune-heads --head-mask)")
    g.add_argument("--write-mask", metavar="FILE", default=None,
                   help="write the head mask JSON of --prune-fraction of the heads, least important first")
    g.add_argument("--prune-fraction", type=float, default=None, metavar="F",
                   help="fraction in [0, 1] of the heads of --mask-types to mask in --write-mask")
    g.add_argument("--mask-types", nargs="+", choices=MODES, default=["all"],
                   help="attention types the fraction applies to (default: all heads together)")
    g.add_argument("--min-heads-per-layer", type=int, default=0, metavar="K",
                   help="never leave a layer with fewer than K heads (default 0: a layer may lose all "
                        "heads, as in the paper); heads that would break this are skipped and reported")
    return p


def _significance_parser():
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("significance")
    g.add_argument("--bootstrap-samples", type=int, default=1000, help="paired bootstrap resamples (paper: 1000)")
    g.add_argument("--alpha", type=float, default=0.01, help="significance level marked '*' (paper: 0.01)")
    g.add_argument("--types", nargs="+", choices=TYPES, default=list(TYPES),
                   help="attention types to ablate (default: all)")
    return p


def _add_prune_curve_args(s):
    s.add_argument("--checkpoints", nargs="+", metavar="CKPT", default=None,
                   help="a series of checkpoints (e.g. epochs), each with its own importance and curve (Fig. 5); "
                        "--write-mask then uses the last one")
    s.add_argument("--modes", nargs="+", choices=MODES, default=None,
                   help="'all' = all heads together (Fig. 3), enc/dec/encdec = that type only (Fig. 4); "
                        "default: all four for one checkpoint, 'all' for --checkpoints")
    s.add_argument("--step", type=float, default=0.1, help="pruning step as a fraction of the mode's heads (default 0.1)")
    s.add_argument("--order", choices=("importance", "ablation", "both"), default="importance",
                   help="pruning order: I_h (default), the BLEU delta of masking each head alone (the paper's "
                        "'individual oracle', Fig. 3 dashed; one extra evaluation per head), or both")


def get_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    common_, imp, mask, sig = _common_parser(), _importance_parser(), _mask_writer_parser(), _significance_parser()
    s = sub.add_parser("importance", parents=[common_, imp, mask], help="head importance I_h, heat maps, optional mask",
                       description=f"Head importance I_h = E_x |dL(x)/dxi_h| ({CITE}, Eq. 2): importance.tsv, "
                                   "importance.json, importance_{enc,dec,encdec}.png.")
    s.set_defaults(func=cmd_importance)
    s = sub.add_parser("evaluate", parents=[common_], help="BLEU of the model, optionally under a head mask",
                       description="BLEU of the model on --gen-subset, optionally with heads masked by --head-mask; "
                                   "prints it, and with --output-dir writes evaluate.json and hypotheses.txt.")
    s.add_argument("--head-mask", metavar="FILE", default=None, help="head mask JSON (xi_h in [0, 1] per head)")
    s.set_defaults(func=cmd_evaluate)
    s = sub.add_parser("ablate", parents=[common_, sig], help="BLEU delta of masking each head alone (Sec. 3.2)",
                       description="Each head masked alone (xi_h = 0, all others 1): BLEU, delta to the full model "
                                   f"and paired-bootstrap p-value per head ({CITE}, Sec. 3.2, Table 1): "
                                   "ablation.tsv, ablation.json, ablation_{type}.png.")
    s.set_defaults(func=cmd_ablate)
    s = sub.add_parser("keep-one", parents=[common_, imp, sig], help="best score per layer with one head kept (Sec. 3.3)",
                       description=f"Every layer reduced to a single head, the other layers intact ({CITE}, Sec. "
                                   "3.3, Table 2): keep_one.tsv, keep_one.json, keep_one.png.")
    s.add_argument("--select", choices=("bleu", "importance"), default="bleu",
                   help="'bleu' (paper): try every head as the one kept, report the best; 'importance': keep "
                        "the head with the highest I_h (one evaluation per layer)")
    s.set_defaults(func=cmd_keep_one)
    s = sub.add_parser("prune-curve", parents=[common_, imp, mask],
                       help="BLEU vs %% heads pruned by increasing importance (Sec. 4.2, 5, 6)",
                       description="Iterative pruning in steps of --step of the heads in order of increasing I_h, "
                                   f"computed once on the full model ({CITE}, Sec. 4.2); modes: all heads together "
                                   "(Fig. 3) and each attention type alone (Fig. 4); with --checkpoints, one curve "
                                   "per checkpoint and the relative BLEU (Fig. 5). Writes curve.tsv, curve.json, "
                                   "curve.png (or curve_checkpoints_MODE.png) and importance files.")
    _add_prune_curve_args(s)
    s.set_defaults(func=cmd_prune_curve)
    return p


# ----------------------------------------------------------------------------------------------
# validation: every check before anything is loaded or written


def check_options(args):
    """The checks of option values that need no file."""
    common.check_finite(args)
    for name in ("max_sentences", "importance_max_sentences", "batch_size", "beam", "importance_batch_size",
                 "bootstrap_samples", "log_interval"):
        v = getattr(args, name, None)
        if v is not None and v < 1:
            raise ToolError(f"--{name.replace('_', '-')} must be >= 1")
    if getattr(args, "alpha", None) is not None and not 0 < args.alpha < 1:
        raise ToolError("--alpha must be in (0, 1)")
    if getattr(args, "step", None) is not None and not 0 < args.step <= 1:
        raise ToolError(f"--step must be in (0, 1], got {args.step}")
    if getattr(args, "min_heads_per_layer", 0) < 0:
        raise ToolError("--min-heads-per-layer must be >= 0")
    try:
        bleu_metric(args.sacrebleu_tokenize)
    except Exception as e:
        raise ToolError(f"--sacrebleu-tokenize {args.sacrebleu_tokenize!r}: {e}") from None
    if getattr(args, "write_mask", None) is not None or getattr(args, "prune_fraction", None) is not None:
        if args.write_mask is None or args.prune_fraction is None:
            raise ToolError("--write-mask and --prune-fraction go together")
        if not 0 <= args.prune_fraction <= 1:
            raise ToolError(f"--prune-fraction must be in [0, 1], got {args.prune_fraction}")
        if "all" in args.mask_types and len(args.mask_types) > 1:
            raise ToolError("--mask-types: 'all' cannot be combined with single types")
    if args.command != "evaluate" and not args.output_dir:
        raise ToolError("--output-dir is required")


def checkpoints_of(args):
    """The checkpoints of this run: --checkpoints (then --path, if not among them), else --path."""
    paths = list(getattr(args, "checkpoints", None) or [])
    if args.path and args.path not in paths:
        paths.append(args.path)
    return paths


def check_inputs(args):
    """Every checkpoint readable and complete, DATA a directory, --head-mask a well-formed mask."""
    paths = checkpoints_of(args)
    if not paths:
        raise ToolError("--path CKPT is required" + (" (or --checkpoints)" if args.command == "prune-curve" else ""))
    for path in paths:
        common.check_checkpoint_file(path, "--path" if path == args.path else "--checkpoints")
    common.check_data_dir(args.data)
    if getattr(args, "head_mask", None) is not None:
        try:
            args.head_mask_matrix = read_head_mask(args.head_mask)
        except ValueError as e:
            raise ToolError(f"--head-mask: {e}") from None


def output_files(args):
    """Names of the files the command writes into --output-dir."""
    if args.command == "evaluate":
        return ["evaluate.json", "hypotheses.txt"]
    if args.command == "ablate":
        return ["ablation.tsv", "ablation.json"] + [f"ablation_{t}.png" for t in args.types]
    if args.command == "keep-one":
        return ["keep_one.tsv", "keep_one.json", "keep_one.png"]
    tags = [""]
    files = []
    if args.command == "prune-curve":
        n = len(checkpoints_of(args))
        tags = [""] if n == 1 else [f"_{i}" for i in range(n)]
        suffixes = [f"{m}{'' if args.order != 'both' else '_' + o}" for m in _modes(args) for o in _orders(args)]
        files = ["curve.tsv", "curve.json"] + (["curve.png"] if n == 1 else
                                               [f"curve_checkpoints_{s}.png" for s in suffixes])
    return files + [f"importance{tag}{ext}" for tag in tags
                    for ext in [".tsv", ".json"] + [f"_{t}.png" for t in TYPES]]


def check_outputs(args):
    """--output-dir and --write-mask: no existing file replaced without --overwrite, no input replaced."""
    files = output_files(args) if args.output_dir else []
    if args.output_dir:
        common.check_output_dir(args.output_dir, files, args.overwrite, data=args.data)
    write_mask = getattr(args, "write_mask", None)
    if write_mask is not None:
        if os.path.isdir(write_mask):
            raise ToolError(f"--write-mask is a directory: {write_mask}")
        if any(os.path.abspath(write_mask) == os.path.abspath(os.path.join(args.output_dir, f)) for f in files):
            raise ToolError(f"--write-mask {write_mask} is one of the files of --output-dir")
        common.check_output_files([("--write-mask", write_mask)], args.overwrite, inputs=checkpoints_of(args),
                                  data=args.data)


def _modes(args):
    return args.modes or (["all"] if len(checkpoints_of(args)) > 1 else list(MODES))


def _orders(args):
    return ["importance", "ablation"] if args.order == "both" else [args.order]


# ----------------------------------------------------------------------------------------------
# loading


class Session(common.Session):
    """:class:`common.Session` with the importance estimate of this tool."""

    def importance(self, model, tag=""):
        a = self.args
        ds = self.subset(a.importance_subset)
        ids = self.sentence_ids(model, a.importance_subset, a.importance_max_sentences)
        ids.sort(key=lambda i: -int(ds.src_sizes[i]) - int(ds.tgt_sizes[i] if ds.tgt_sizes is not None else 0))
        chunks = [ids[k:k + a.importance_batch_size] for k in range(0, len(ids), a.importance_batch_size)]
        batches = (common.collate(ds, chunk, self.use_cuda)
                   for chunk in self.progress(f"importance{tag} on '{a.importance_subset}'")(chunks))
        imp, info = hi.head_importance(model, batches, per_sentence=a.importance_per == "sentence",
                                       normalise=not a.no_normalize_by_layer)
        logger.info(f"importance{tag}: {info['sentences']} sentences of '{a.importance_subset}' in {info['batches']} "
                    f"batches, mean sentence loss {info['loss']:.3f} nats, averaging {info['averaging']}")
        return imp, info


# ----------------------------------------------------------------------------------------------
# outputs


def write_rows(path, header, rows):
    """TSV of dict rows, the tool's format: floats %.6g, None as NA."""
    common.write_tsv(path, header, ([r.get(h) for h in header] for r in rows), float_spec="{:.6g}", none="NA")


def write_importance(out, imp, info, ids, settings, tag=""):
    from fairseq_sparse.analysis.plotting import head_heatmap

    record = hi.importance_record(imp, info, ids)
    write_rows(os.path.join(out, f"importance{tag}.tsv"),
               ["type", "layer", "head", "head_id", "importance", "importance_raw", "prune_rank"], record["heads"])
    common.write_json(os.path.join(out, f"importance{tag}.json"), {"settings": settings, **record})
    label = "I_h (l2-normalised per layer)" if info["normalized_by_layer"] else "I_h"
    vals = {(k, h): float(v[h]) for k, v in imp.items() for h in range(v.numel())}
    for t in TYPES:
        if any(k[0] == t for k in ids):
            head_heatmap(hi.head_matrix(vals, ids, t), os.path.join(out, f"importance{tag}_{t}.png"),
                         f"Head importance: {TYPE_TITLES[t]}", label)


def write_mask_file(args, model, imp):
    types = hi.types_of(args.mask_types)
    sel = hi.pruning_mask(imp, head_layout(model), args.prune_fraction, types, args.min_heads_per_layer)
    write_head_mask(args.write_mask, sel["matrix"])
    pruned, skipped, total = sel["pruned"], sel["skipped"], sel["n_total"]
    logger.info(f"wrote {args.write_mask}: {len(pruned)} of {total} {'/'.join(types)} heads masked "
                f"({100 * args.prune_fraction:g}%)" + (f", {len(skipped)} skipped by --min-heads-per-layer" if skipped else ""))
    return {"path": os.path.abspath(args.write_mask), "fraction": args.prune_fraction, "types": list(types),
            "n_pruned": len(pruned), "n_total": total, "skipped": [[k[0], k[1], h] for k, h in skipped]}


def check_mask_reachable(args, model):
    if getattr(args, "write_mask", None) is None:
        return
    short = hi.mask_shortfall(head_layout(model), args.prune_fraction, hi.types_of(args.mask_types),
                              args.min_heads_per_layer)
    if short is not None:
        n, total, can = short
        raise ToolError(f"--prune-fraction {args.prune_fraction} asks for {n} of {total} heads, but only {can} can be "
                        f"masked with --min-heads-per-layer {args.min_heads_per_layer}")


def _settings(args, extra=None):
    s = {k: v for k, v in vars(args).items() if k not in ("func", "head_mask_matrix") and not callable(v)}
    s.update(extra or {})
    return s


def _bleu_signature(ev):
    """sacrebleu's signature of the evaluator's BLEU (known after its first corpus score)."""
    return str(ev.bleu.get_signature())


def _significance(r):
    return f"{' *' if r['significant'] else ''} (p={r['p_value']:.3f})"


# ----------------------------------------------------------------------------------------------
# commands


def cmd_importance(args, sess):
    model = sess.load(args.path)
    check_mask_reachable(args, model)
    imp, info = sess.importance(model)
    ids = hi.original_head_ids(model)
    os.makedirs(args.output_dir, exist_ok=True)
    mask_info = write_mask_file(args, model, imp) if args.write_mask else None
    write_importance(args.output_dir, imp, info, ids, _settings(args, {"mask": mask_info}))
    for t in TYPES:
        rows = [imp[k].tolist() for k in imp if k[0] == t]
        if rows:
            print(f"{t} importance (rows = layers):")
            for i, r in enumerate(rows):
                print(f"  {i}: " + " ".join(f"{v:.3f}" for v in r))
    return {"importance": imp, "info": info, "mask": mask_info}


def cmd_evaluate(args, sess):
    model = sess.load(args.path)
    layout = head_layout(model)
    masks = None
    if args.head_mask is not None:
        try:
            masks = check_head_mask(args.head_mask_matrix, layout)
        except ValueError as e:
            raise ToolError(f"--head-mask: head mask {args.head_mask}: {e}") from None
    ev = sess.evaluator(model)
    res = ev.evaluate(masks)
    masked = 0 if masks is None else int(sum(float((m == 0).sum()) for m in masks.values()))
    result = {"bleu": res["bleu"], "sentences": len(ev.ids), "subset": args.gen_subset, "heads_masked": masked,
              "heads_total": sum(layout.values()), "signature": _bleu_signature(ev), "settings": _settings(args)}
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        common.write_json(os.path.join(args.output_dir, "evaluate.json"), result)
        common.write_text(os.path.join(args.output_dir, "hypotheses.txt"), "".join(h + "\n" for h in res["hyps"]))
    print(f"BLEU {res['bleu']:.2f} on {len(ev.ids)} sentences of '{args.gen_subset}' "
          f"({masked} of {sum(layout.values())} heads masked) {result['signature']}")
    return result


def cmd_ablate(args, sess):
    from fairseq_sparse.analysis.plotting import head_heatmap

    model = sess.load(args.path)
    layout, ids = head_layout(model), hi.original_head_ids(model)
    ev = sess.evaluator(model)
    base, rows = hi.ablate_heads(ev, layout, args.types, args.bootstrap_samples, args.alpha,
                                 progress=sess.progress("ablate"))
    for r in rows:
        r["head_id"] = ids[(r["type"], r["layer"])][r["head"]]
    os.makedirs(args.output_dir, exist_ok=True)
    write_rows(os.path.join(args.output_dir, "ablation.tsv"),
               ["type", "layer", "head", "head_id", "bleu", "delta", "p_value", "significant"], rows)
    common.write_json(os.path.join(args.output_dir, "ablation.json"), {
        "base_bleu": base["bleu"], "sentences": len(ev.ids), "signature": _bleu_signature(ev),
        "settings": _settings(args), "heads": rows})
    for t in args.types:
        if not any(r["type"] == t for r in rows):
            continue
        m, text = hi.ablation_matrix(rows, ids, t)
        lim = hi.symmetric_limit(m)
        head_heatmap(m, os.path.join(args.output_dir, f"ablation_{t}.png"),
                     f"BLEU delta, head masked alone: {TYPE_TITLES[t]} (base {base['bleu']:.2f}; * p<{args.alpha:g})",
                     "delta BLEU", cell_text=text, vmin=-lim, vmax=lim, cmap="RdBu")
    n_sig = sum(r["significant"] for r in rows)
    print(f"base BLEU {base['bleu']:.2f}; {len(rows)} heads ablated, {n_sig} significant at p < {args.alpha:g}")
    for r in rows:
        print(f"  {r['type']:6s} layer {r['layer']} head {r['head_id']}: {r['delta']:+.2f}{_significance(r)}")
    return {"base": base["bleu"], "rows": rows}


def cmd_keep_one(args, sess):
    from fairseq_sparse.analysis.plotting import head_heatmap

    model = sess.load(args.path)
    layout, ids = head_layout(model), hi.original_head_ids(model)
    imp = sess.importance(model)[0] if args.select == "importance" else None
    ev = sess.evaluator(model)
    base, rows = hi.keep_one_per_layer(ev, layout, args.types, imp, args.select, args.bootstrap_samples, args.alpha,
                                       progress=sess.progress("keep-one"))
    for r in rows:
        r["kept_head_id"] = ids[(r["type"], r["layer"])][r["kept_head"]]
    os.makedirs(args.output_dir, exist_ok=True)
    write_rows(os.path.join(args.output_dir, "keep_one.tsv"),
               ["type", "layer", "heads", "kept_head", "kept_head_id", "bleu", "delta", "p_value", "significant"], rows)
    common.write_json(os.path.join(args.output_dir, "keep_one.json"), {
        "base_bleu": base["bleu"], "sentences": len(ev.ids), "select": args.select,
        "signature": _bleu_signature(ev), "settings": _settings(args), "layers": rows})
    if rows:
        m, text, types = hi.keep_one_matrix(rows)
        lim = hi.symmetric_limit(m)
        head_heatmap(m, os.path.join(args.output_dir, "keep_one.png"),
                     f"Best BLEU delta with one head per layer (base {base['bleu']:.2f}; * p<{args.alpha:g})",
                     "delta BLEU", col_labels=types, cell_text=text, vmin=-lim, vmax=lim, cmap="RdBu",
                     xlabel="attention type")
    print(f"base BLEU {base['bleu']:.2f}; one head kept per layer (select: {args.select}):")
    for r in rows:
        print(f"  {r['type']:6s} layer {r['layer']}: head {r['kept_head_id']} {r['delta']:+.2f}{_significance(r)}")
    return {"base": base["bleu"], "rows": rows}


def _checkpoint_curves(args, sess, ci, path, n_checkpoints):
    """Importance and pruning curves of one checkpoint of prune-curve; nothing is written here."""
    model = sess.load(path)
    layout = head_layout(model)
    missing = [m for m in _modes(args) if m != "all" and not any(k[0] == m for k in layout)]
    if missing:
        raise ToolError(f"{path} has no {', '.join(missing)} attention layers")
    last = ci == n_checkpoints - 1
    if last:
        check_mask_reachable(args, model)
    tag = "" if n_checkpoints == 1 else f"_{ci}"
    name = os.path.basename(path) if n_checkpoints == 1 else f"{ci}:{os.path.basename(path)}"
    imp, info = sess.importance(model, tag)
    ev = sess.evaluator(model)
    base, curves = hi.pruning_curves(ev, imp, layout, _modes(args), _orders(args), args.step, args.min_heads_per_layer,
                                     progress=lambda label: sess.progress(f"{label}{tag}"))
    curves = [{"checkpoint": os.path.abspath(path), "label": name, "mode": c["mode"], "order": c["order"],
               "base_bleu": base, "rows": c["rows"]} for c in curves]
    for c in curves:
        _log_curve(args, c)
    logger.info(f"{name}: {ev.generations} generations on {len(ev.ids)} sentences")
    return {"path": path, "tag": tag, "importance": imp, "info": info, "ids": hi.original_head_ids(model),
            "curves": curves, "signature": _bleu_signature(ev), "model": model if last and args.write_mask else None}


def _log_curve(args, c):
    rows, name, mode = c["rows"], c["label"], c["mode"]
    unreachable = [r["fraction"] for r in rows if not r["reachable"]]
    if unreachable:
        logger.warning(f"{name} {mode}: levels {unreachable} skipped: fewer heads can be pruned with "
                       f"--min-heads-per-layer {args.min_heads_per_layer}")
    skipped = sorted({tuple(s) for r in rows if r["skipped"] for s in r["skipped"]})
    if skipped:
        logger.warning(f"{name} {mode}: heads kept to respect --min-heads-per-layer "
                       f"{args.min_heads_per_layer} (skipped in the order): {skipped}")
    logger.info(f"{name} {mode}/{c['order']}: " + " ".join(
        f"{100 * r['fraction']:.0f}%={r['bleu']:.2f}" for r in rows if r["bleu"] is not None))


def _plot_curves(args, curves, checkpoints):
    from fairseq_sparse.analysis.plotting import line_plot

    orders = _orders(args)
    if len(checkpoints) == 1:
        series = [(f"{c['mode']}" + (f" ({c['order']})" if len(orders) > 1 else ""),
                   [100 * r["fraction"] for r in c["rows"]], [r["bleu"] for r in c["rows"]]) for c in curves]
        line_plot(series, os.path.join(args.output_dir, "curve.png"), f"BLEU vs heads pruned by increasing "
                  f"importance ({os.path.basename(checkpoints[0])})", "% of the mode's heads pruned", "BLEU")
        return
    for mode in _modes(args):
        for order in orders:
            series = [(f"{c['label']} [{c['base_bleu']:.1f}]", [100 * r["fraction"] for r in c["rows"]],
                       [None if r["relative"] is None else 100 * r["relative"] for r in c["rows"]])
                      for c in curves if c["mode"] == mode and c["order"] == order]
            suffix = mode + ("" if len(orders) == 1 else f"_{order}")
            line_plot(series, os.path.join(args.output_dir, f"curve_checkpoints_{suffix}.png"),
                      f"Relative BLEU vs heads pruned ({mode}, order: {order}) [unpruned BLEU]",
                      "% of heads pruned", "% of the unpruned model's BLEU")


def cmd_prune_curve(args, sess):
    checkpoints = checkpoints_of(args)
    results = [_checkpoint_curves(args, sess, ci, path, len(checkpoints)) for ci, path in enumerate(checkpoints)]
    curves = [c for res in results for c in res["curves"]]
    out = args.output_dir
    os.makedirs(out, exist_ok=True)  # files are written after all the work succeeded
    for res in results:
        write_importance(out, res["importance"], res["info"], res["ids"],
                         _settings(args, {"checkpoint": os.path.abspath(res["path"])}), res["tag"])
    mask_info = write_mask_file(args, results[-1]["model"], results[-1]["importance"]) if args.write_mask else None
    write_rows(os.path.join(out, "curve.tsv"), ["checkpoint", "mode", "order", "fraction", "n_target", "n_pruned",
                                                "n_total", "reachable", "bleu", "relative"], hi.curve_table(curves))
    common.write_json(os.path.join(out, "curve.json"), {
        "settings": _settings(args, {"modes": _modes(args), "orders": _orders(args)}),
        "signature": results[-1]["signature"],
        "importance_computed": f"once per checkpoint, on the full model ({CITE}, Sec. 4.2)",
        "checkpoints": [{"checkpoint": os.path.abspath(r["path"]), "importance_file": f"importance{r['tag']}.json"}
                        for r in results],
        "curves": curves, "mask": mask_info})
    _plot_curves(args, curves, checkpoints)
    for c in curves:
        print(f"{c['label']} {c['mode']}/{c['order']}: " + "  ".join(
            f"{100 * r['fraction']:.0f}%:{'-' if r['bleu'] is None else format(r['bleu'], '.2f')}" for r in c["rows"]))
    return {"curves": curves, "mask": mask_info}


def main(argv=None):
    args = get_parser().parse_args(argv)
    try:
        common.check_device(args)
        check_options(args)
        check_inputs(args)
        check_outputs(args)
        return args.func(args, Session(args))
    except ToolError as e:
        common.fail(f"{PROG} {args.command}", str(e))


def cli_main():
    common.setup_logging()
    main()


if __name__ == "__main__":
    cli_main()
