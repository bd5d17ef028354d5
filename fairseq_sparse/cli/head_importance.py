"""Head importance, ablation and pruning curves of paper 003 (Michel et al. 2019) on any fairseq
encoder-decoder transformer checkpoint (stock ``transformer`` or this plugin's models).

    fairseq-sparse-heads importance  DATA --path CKPT --output-dir DIR [--importance-subset valid]
                                     [--write-mask mask.json --prune-fraction 0.5]
    fairseq-sparse-heads evaluate    DATA --path CKPT [--head-mask mask.json] [--output-dir DIR]
    fairseq-sparse-heads ablate      DATA --path CKPT --output-dir DIR            # Sec. 3.2, Table 1
    fairseq-sparse-heads keep-one    DATA --path CKPT --output-dir DIR            # Sec. 3.3, Table 2
    fairseq-sparse-heads prune-curve DATA --path CKPT --output-dir DIR            # Sec. 4.2 / 5, Fig. 3 / 4
    fairseq-sparse-heads prune-curve DATA --checkpoints E1.pt E2.pt ... --output-dir DIR   # Sec. 6, Fig. 5

Importance I_h = E_x |dL(x)/dxi_h| (Eq. 2) is estimated on ``--importance-subset`` (default valid; the
paper uses held-out newstest2009-12), L(x) = -log p(y|x) of one sentence (teacher forced, eval mode),
averaged over sentences; per-layer l2 normalisation unless ``--no-normalize-by-layer``. BLEU is
measured on ``--gen-subset`` (default test), the first ``--max-sentences`` sentences, with fairseq's
SequenceGenerator (``--beam``, default 5 as in the paper's scripts) and sacrebleu
(``--sacrebleu-tokenize none`` = BLEU of the tokenised output, as in the paper). Significance: paired
bootstrap resampling (sacrebleu, ``--bootstrap-samples`` 1000), p < ``--alpha`` (0.01) is marked "*".

Head masks (``--head-mask``, ``--write-mask``): {"enc": [[1, 0, 1, 1], ...], "dec": ..., "encdec": ...},
one row per layer, one value per current head, omitted types all ones; ``fairseq-sparse-prune-heads
--head-mask FILE`` exports the physically smaller model.
"""
import argparse
import json
import logging
import math
import os
import sys

import numpy as np

from fairseq_sparse import head_importance as hi

logger = logging.getLogger("fairseq_sparse.head_importance")
PROG = "fairseq-sparse-heads"
TYPES = ("enc", "dec", "encdec")
TYPE_TITLES = {"enc": "encoder self-attention", "dec": "decoder self-attention", "encdec": "encoder-decoder attention"}
MODES = ("all",) + TYPES


class CliError(Exception):
    pass


def _fail(msg):
    raise CliError(msg)


# ----------------------------------------------------------------------------------------------
# arguments


def _common_parser():
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("model and data")
    g.add_argument("data", metavar="DATA", help="fairseq data-bin directory (dictionaries and splits)")
    g.add_argument("--path", metavar="CKPT", help="fairseq encoder-decoder transformer checkpoint")
    g.add_argument("--user-dir", default=None, help="extra fairseq plugin to import (fairseq_sparse is always imported)")
    g.add_argument("--source-lang", default=None)
    g.add_argument("--target-lang", default=None)
    g.add_argument("--cpu", action="store_true", help="run on CPU even if CUDA is available")
    g = p.add_argument_group("BLEU evaluation")
    g.add_argument("--gen-subset", default="test", help="split translated for BLEU (default: test)")
    g.add_argument("--max-sentences", type=int, default=None, metavar="N",
                   help="only the first N sentences of --gen-subset (default: all)")
    g.add_argument("--batch-size", type=int, default=32, metavar="B", help="sentences per generation batch (default 32)")
    g.add_argument("--beam", type=int, default=5, help="beam size (default 5, the paper's scripts)")
    g.add_argument("--lenpen", type=float, default=1.0, help="length penalty (default 1)")
    g.add_argument("--max-len-a", type=float, default=0.0)
    g.add_argument("--max-len-b", type=int, default=200)
    g.add_argument("--remove-bpe", nargs="?", const="@@ ", default=None, metavar="SYMBOL",
                   help="remove BPE before scoring (bare flag: '@@ '; also 'sentencepiece', 'subword_nmt', ...)")
    g.add_argument("--sacrebleu-tokenize", default="none",
                   help="sacrebleu tokenizer: 'none' (default) scores the tokenised text as the paper does "
                        "(multi-bleu style); '13a', 'intl', ... for detokenised output")
    g = p.add_argument_group("output and logging")
    g.add_argument("--output-dir", metavar="DIR", help="TSV, JSON and PNG files go here")
    g.add_argument("--no-progress-bar", action="store_true", help="log progress lines instead of a tqdm bar")
    g.add_argument("--log-format", default=None, choices=("json", "none", "simple", "tqdm"))
    g.add_argument("--log-interval", type=int, default=10)
    return p


def _importance_parser():
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("head importance (paper 003 Sec. 4.1)")
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


def get_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    common, imp, mask, sig = _common_parser(), _importance_parser(), _mask_writer_parser(), _significance_parser()

    s = sub.add_parser("importance", parents=[common, imp, mask], help="head importance I_h, heat maps, optional mask",
                       description="Head importance I_h = E_x |dL(x)/dxi_h| (paper 003 Eq. 2): importance.tsv, "
                                   "importance.json, importance_{enc,dec,encdec}.png.")
    s.set_defaults(func=cmd_importance)

    s = sub.add_parser("evaluate", parents=[common], help="BLEU of the model, optionally under a head mask",
                       description="BLEU of the model on --gen-subset, optionally with heads masked by --head-mask; "
                                   "prints it, and with --output-dir writes evaluate.json and hypotheses.txt.")
    s.add_argument("--head-mask", metavar="FILE", default=None, help="head mask JSON (xi_h per head)")
    s.set_defaults(func=cmd_evaluate)

    s = sub.add_parser("ablate", parents=[common, sig], help="BLEU delta of masking each head alone (Sec. 3.2)",
                       description="Each head masked alone (xi_h = 0, all others 1): BLEU, delta to the full model "
                                   "and paired-bootstrap p-value per head (paper 003 Sec. 3.2, Table 1): "
                                   "ablation.tsv, ablation.json, ablation_{type}.png.")
    s.set_defaults(func=cmd_ablate)

    s = sub.add_parser("keep-one", parents=[common, imp, sig], help="best score per layer with one head kept (Sec. 3.3)",
                       description="Every layer reduced to a single head, the other layers intact (paper 003 Sec. "
                                   "3.3, Table 2): keep_one.tsv, keep_one.json, keep_one.png.")
    s.add_argument("--select", choices=("bleu", "importance"), default="bleu",
                   help="'bleu' (paper): try every head as the one kept, report the best; 'importance': keep "
                        "the head with the highest I_h (one evaluation per layer)")
    s.set_defaults(func=cmd_keep_one)

    s = sub.add_parser("prune-curve", parents=[common, imp, mask],
                       help="BLEU vs %% heads pruned by increasing importance (Sec. 4.2, 5, 6)",
                       description="Iterative pruning in steps of --step of the heads in order of increasing I_h, "
                                   "computed once on the full model (paper 003 Sec. 4.2); modes: all heads together "
                                   "(Fig. 3) and each attention type alone (Fig. 4); with --checkpoints, one curve "
                                   "per checkpoint and the relative BLEU (Fig. 5). Writes curve.tsv, curve.json, "
                                   "curve.png (or curve_checkpoints_MODE.png) and importance files.")
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
    s.set_defaults(func=cmd_prune_curve)
    return p


def validate(args):
    """Every check that needs no model; raises CliError before anything is loaded or written."""
    paths = list(args.checkpoints or []) if getattr(args, "checkpoints", None) else []
    if args.path:
        paths = paths + [args.path] if args.path not in paths else paths
    if not paths:
        _fail("--path CKPT is required" + (" (or --checkpoints)" if args.command == "prune-curve" else ""))
    for path in paths:
        if not os.path.isfile(path):
            _fail(f"checkpoint not found: {path}")
    if not os.path.isdir(args.data):
        _fail(f"data directory not found: {args.data}")
    if args.command != "evaluate" and not args.output_dir:
        _fail("--output-dir is required")
    if args.output_dir and os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        _fail(f"--output-dir exists and is not a directory: {args.output_dir}")
    for name in ("max_sentences", "importance_max_sentences"):
        v = getattr(args, name, None)
        if v is not None and v < 1:
            _fail(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("batch_size", "beam", "importance_batch_size", "bootstrap_samples", "log_interval"):
        v = getattr(args, name, None)
        if v is not None and v < 1:
            _fail(f"--{name.replace('_', '-')} must be >= 1")
    if getattr(args, "alpha", None) is not None and not 0 < args.alpha < 1:
        _fail("--alpha must be in (0, 1)")
    if getattr(args, "step", None) is not None and not 0 < args.step <= 1:
        _fail(f"--step must be in (0, 1], got {args.step}")
    if getattr(args, "min_heads_per_layer", 0) < 0:
        _fail("--min-heads-per-layer must be >= 0")
    try:
        from sacrebleu.metrics import BLEU
        BLEU(tokenize=args.sacrebleu_tokenize)
    except Exception as e:
        _fail(f"--sacrebleu-tokenize {args.sacrebleu_tokenize!r}: {e}")
    if getattr(args, "write_mask", None) is not None or getattr(args, "prune_fraction", None) is not None:
        if args.write_mask is None or args.prune_fraction is None:
            _fail("--write-mask and --prune-fraction go together")
        if not 0 <= args.prune_fraction <= 1:
            _fail(f"--prune-fraction must be in [0, 1], got {args.prune_fraction}")
        d = os.path.dirname(os.path.abspath(args.write_mask))
        if not os.path.isdir(d):
            _fail(f"directory of --write-mask does not exist: {d}")
        if os.path.isdir(args.write_mask):
            _fail(f"--write-mask is a directory: {args.write_mask}")
        if "all" in args.mask_types and len(args.mask_types) > 1:
            _fail("--mask-types: 'all' cannot be combined with single types")
    if getattr(args, "head_mask", None) is not None:
        args.head_mask_matrix = read_mask_file(args.head_mask)


def read_mask_file(path):
    if not os.path.isfile(path):
        _fail(f"head mask file not found: {path}")
    try:
        with open(path) as f:
            matrix = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        _fail(f"head mask {path} is not valid JSON: {e}")
    if not isinstance(matrix, dict):
        _fail(f"head mask {path} must be a JSON object {{\"enc\": [[...], ...], ...}}")
    bad = [t for t in matrix if t not in TYPES]
    if bad:
        _fail(f"head mask {path}: unknown attention type(s) {', '.join(map(repr, bad))}; choose from {', '.join(TYPES)}")
    return matrix


def _types_of(mode_or_types):
    if isinstance(mode_or_types, str):
        return TYPES if mode_or_types == "all" else (mode_or_types,)
    return TYPES if "all" in mode_or_types else tuple(mode_or_types)


# ----------------------------------------------------------------------------------------------
# loading


class Session:
    """The loaded task, models and data selections of one run."""

    def __init__(self, args):
        import torch
        from fairseq import checkpoint_utils, utils

        self.args = args
        package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        utils.import_user_module(argparse.Namespace(user_dir=package_dir))  # models, safe checkpoint loading
        if args.user_dir:
            utils.import_user_module(argparse.Namespace(user_dir=args.user_dir))
        self.overrides = {"data": os.path.abspath(args.data)}
        if args.source_lang:
            self.overrides["source_lang"] = args.source_lang
        if args.target_lang:
            self.overrides["target_lang"] = args.target_lang
        self.use_cuda = torch.cuda.is_available() and not args.cpu
        self.task = self.cfg = None
        self.loaded_subsets = set()

    def load(self, path):
        from fairseq import checkpoint_utils

        try:
            if self.task is None:
                models, self.cfg, self.task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=self.overrides)
            else:
                models, _ = checkpoint_utils.load_model_ensemble([path], arg_overrides=self.overrides, task=self.task)
        except Exception as e:  # not a checkpoint, or the dictionaries are missing in DATA
            _fail(f"cannot load {path} with data {self.args.data}: {type(e).__name__}: {e}")
        model = models[0]
        if self.use_cuda:
            model.cuda()
        model.eval()
        try:
            layout = hi.head_layout(model)
        except ValueError as e:
            _fail(f"{path}: {e}")
        if not any(k[0] == "encdec" for k in layout):
            _fail(f"{path}: {type(model).__name__} is not an encoder-decoder transformer")
        return model

    def subset(self, name):
        if name not in self.loaded_subsets:
            try:
                self.task.load_dataset(name, task_cfg=self.cfg.task)
            except Exception as e:
                _fail(f"cannot load subset '{name}' from {self.args.data}: {type(e).__name__}: {e}")
            self.loaded_subsets.add(name)
        return self.task.dataset(name)

    def sentence_ids(self, model, name, max_sentences):
        from fairseq import utils

        ds = self.subset(name)
        n = len(ds) if max_sentences is None else min(max_sentences, len(ds))
        limit = utils.resolve_max_positions(self.task.max_positions(), model.max_positions())
        ids = list(range(n))
        if limit is not None:
            ok = ds.filter_indices_by_size(np.array(ids, dtype=np.int64), limit)[0].tolist()
            if len(ok) < n:
                logger.warning(f"skipping {n - len(ok)} sentences of '{name}' longer than the model's positions {limit}")
            ids = sorted(ok)
        if not ids:
            _fail(f"subset '{name}' has no usable sentences")
        return ids

    def progress(self, prefix):
        from fairseq.logging import progress_bar

        a = self.args

        def wrap(items):
            return progress_bar.progress_bar(items, log_format=a.log_format, log_interval=a.log_interval, prefix=prefix,
                                             default_log_format="simple" if a.no_progress_bar else "tqdm")
        return wrap

    def evaluator(self, model):
        a = self.args
        ids = self.sentence_ids(model, a.gen_subset, a.max_sentences)
        gen_args = argparse.Namespace(beam=a.beam, lenpen=a.lenpen, max_len_a=a.max_len_a, max_len_b=a.max_len_b)
        return hi.BleuEvaluator(model, self.task, a.gen_subset, ids, gen_args, batch_size=a.batch_size,
                                bpe_symbol=a.remove_bpe, tokenize=a.sacrebleu_tokenize)

    def importance(self, model, tag=""):
        a = self.args
        ds = self.subset(a.importance_subset)
        ids = self.sentence_ids(model, a.importance_subset, a.importance_max_sentences)
        ids.sort(key=lambda i: -int(ds.src_sizes[i]) - int(ds.tgt_sizes[i] if ds.tgt_sizes is not None else 0))
        chunks = [ids[k:k + a.importance_batch_size] for k in range(0, len(ids), a.importance_batch_size)]
        use_cuda = self.use_cuda

        def batches():
            from fairseq import utils
            for chunk in self.progress(f"importance{tag} on '{a.importance_subset}'")(chunks):
                sample = ds.collater([ds[i] for i in chunk])
                yield utils.move_to_cuda(sample) if use_cuda else sample

        imp, info = hi.head_importance(model, batches(), per_sentence=a.importance_per == "sentence",
                                       normalize=not a.no_normalize_by_layer)
        logger.info(f"importance{tag}: {info['sentences']} sentences of '{a.importance_subset}' in {info['batches']} "
                    f"batches, mean sentence loss {info['loss']:.3f} nats, averaging {info['averaging']}")
        return imp, info


# ----------------------------------------------------------------------------------------------
# outputs


def _matrix(values, model_ids, t):
    """[layers x original heads] array of one attention type (nan: head absent)."""
    keys = [k for k in model_ids if k[0] == t]
    n_cols = max([max(model_ids[k]) + 1 for k in keys if model_ids[k]] + [1])
    m = np.full((len(keys), n_cols), np.nan)
    for i, k in enumerate(keys):
        for pos, hid in enumerate(model_ids[k]):
            v = values.get((k, pos))
            if v is not None:
                m[i, hid] = v
    return m


def _fmt(v):
    if v is None:
        return "NA"
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.6g}"
    return str(v)


def write_tsv(path, header, rows):
    with open(path, "w") as f:
        f.write("\t".join(header) + "\n")
        for r in rows:
            f.write("\t".join(_fmt(r.get(h)) for h in header) + "\n")


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def _key_json(key):
    return f"{key[0]}:{key[1]}"


def importance_rows(imp, info, ids):
    order = {kh: r for r, kh in enumerate(hi.pruning_order(imp))}
    rows = []
    for key, v in imp.items():
        for h in range(v.numel()):
            rows.append({"type": key[0], "layer": key[1], "head": h, "head_id": ids[key][h],
                         "importance": float(v[h]), "importance_raw": float(info["raw"][key][h]),
                         "prune_rank": order[(key, h)]})
    return rows


def write_importance(out, imp, info, ids, settings, tag=""):
    from fairseq_sparse.analysis.plotting import head_heatmap

    rows = importance_rows(imp, info, ids)
    write_tsv(os.path.join(out, f"importance{tag}.tsv"),
              ["type", "layer", "head", "head_id", "importance", "importance_raw", "prune_rank"], rows)
    write_json(os.path.join(out, f"importance{tag}.json"), {
        "settings": settings, "sentences": info["sentences"], "batches": info["batches"],
        "mean_sentence_loss": info["loss"], "averaging": info["averaging"],
        "normalized_by_layer": info["normalized_by_layer"],
        "importance": {t: [imp[k].tolist() for k in imp if k[0] == t] for t in TYPES if any(k[0] == t for k in imp)},
        "importance_raw": {t: [info["raw"][k].tolist() for k in imp if k[0] == t] for t in TYPES if any(k[0] == t for k in imp)},
        "head_ids": {t: [ids[k] for k in ids if k[0] == t] for t in TYPES if any(k[0] == t for k in ids)},
        "heads": rows})
    label = "I_h (l2-normalised per layer)" if info["normalized_by_layer"] else "I_h"
    vals = {(k, h): float(v[h]) for k, v in imp.items() for h in range(v.numel())}
    for t in TYPES:
        if any(k[0] == t for k in ids):
            head_heatmap(_matrix(vals, ids, t), os.path.join(out, f"importance{tag}_{t}.png"),
                         f"Head importance: {TYPE_TITLES[t]}", label)


def write_mask_file(args, model, imp):
    layout = hi.head_layout(model)
    types = _types_of(args.mask_types)
    total = sum(n for k, n in layout.items() if k[0] in types)
    n = hi.heads_to_prune(args.prune_fraction, total)
    pruned, skipped = hi.select_pruned(imp, n, types, args.min_heads_per_layer)
    matrix = hi.masks_to_matrix(hi.masks_without(layout, pruned), layout)
    with open(args.write_mask, "w") as f:
        json.dump(matrix, f)
        f.write("\n")
    logger.info(f"wrote {args.write_mask}: {len(pruned)} of {total} {'/'.join(types)} heads masked "
                f"({100 * args.prune_fraction:g}%)" + (f", {len(skipped)} skipped by --min-heads-per-layer" if skipped else ""))
    return {"path": os.path.abspath(args.write_mask), "fraction": args.prune_fraction, "types": list(types),
            "n_pruned": len(pruned), "n_total": total, "skipped": [[k[0], k[1], h] for k, h in skipped]}


def check_mask_reachable(args, model):
    if getattr(args, "write_mask", None) is None:
        return
    layout = hi.head_layout(model)
    types = _types_of(args.mask_types)
    total = sum(n for k, n in layout.items() if k[0] in types)
    n = hi.heads_to_prune(args.prune_fraction, total)
    can = hi.prunable_heads(layout, types, args.min_heads_per_layer)
    if n > can:
        _fail(f"--prune-fraction {args.prune_fraction} asks for {n} of {total} heads, but only {can} can be masked "
              f"with --min-heads-per-layer {args.min_heads_per_layer}")


def _settings(args, extra=None):
    s = {k: v for k, v in vars(args).items() if k not in ("func", "head_mask_matrix") and not callable(v)}
    s.update(extra or {})
    return s


def _bleu_signature(ev):
    """sacrebleu's signature of the evaluator's BLEU (known after its first corpus score)."""
    return str(ev.bleu.get_signature())


def _plot_lines(series, path, title, xlabel, ylabel):
    """series: list of (label, xs, ys); None values are left out."""
    from fairseq_sparse.analysis import plotting  # noqa: F401  (selects the Agg backend)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, xs, ys in series:
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None and not (isinstance(y, float) and math.isnan(y))]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    layout = hi.head_layout(model)
    masks = None
    if args.head_mask is not None:
        try:
            masks = hi.check_mask_matrix(args.head_mask_matrix, layout)
        except ValueError as e:
            _fail(f"{args.head_mask}: {e}")
        masks = {**hi.full_masks(layout), **masks}
    ev = sess.evaluator(model)
    res = ev.evaluate(masks)
    masked = 0 if masks is None else int(sum(float((m == 0).sum()) for m in masks.values()))
    result = {"bleu": res["bleu"], "sentences": len(ev.ids), "subset": args.gen_subset, "heads_masked": masked,
              "heads_total": sum(layout.values()), "signature": _bleu_signature(ev), "settings": _settings(args)}
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        write_json(os.path.join(args.output_dir, "evaluate.json"), result)
        with open(os.path.join(args.output_dir, "hypotheses.txt"), "w") as f:
            f.writelines(h + "\n" for h in res["hyps"])
    print(f"BLEU {res['bleu']:.2f} on {len(ev.ids)} sentences of '{args.gen_subset}' "
          f"({masked} of {sum(layout.values())} heads masked) {result['signature']}")
    return result


def cmd_ablate(args, sess):
    model = sess.load(args.path)
    layout = hi.head_layout(model)
    ids = hi.original_head_ids(model)
    ev = sess.evaluator(model)
    base, rows = hi.ablate_heads(ev, layout, args.types, args.bootstrap_samples, args.alpha,
                                 progress=sess.progress("ablate"))
    for r in rows:
        r["head_id"] = ids[(r["type"], r["layer"])][r["head"]]
    os.makedirs(args.output_dir, exist_ok=True)
    write_tsv(os.path.join(args.output_dir, "ablation.tsv"),
              ["type", "layer", "head", "head_id", "bleu", "delta", "p_value", "significant"], rows)
    write_json(os.path.join(args.output_dir, "ablation.json"), {
        "base_bleu": base["bleu"], "sentences": len(ev.ids), "signature": _bleu_signature(ev),
        "settings": _settings(args), "heads": rows})
    from fairseq_sparse.analysis.plotting import head_heatmap
    for t in args.types:
        sel = [r for r in rows if r["type"] == t]
        if not sel:
            continue
        vals = {((t, r["layer"]), r["head"]): r["delta"] for r in sel}
        text_vals = {((t, r["layer"]), r["head"]): f"{r['delta']:+.2f}" + ("*" if r["significant"] else "") for r in sel}
        m = _matrix(vals, ids, t)
        text = np.full(m.shape, "", dtype=object)
        keys = [k for k in ids if k[0] == t]
        for i, k in enumerate(keys):
            for pos, hid in enumerate(ids[k]):
                text[i, hid] = text_vals.get((k, pos), "")
        lim = max(float(np.nanmax(np.abs(m))) if np.isfinite(m).any() else 0.0, 1e-6)
        head_heatmap(m, os.path.join(args.output_dir, f"ablation_{t}.png"),
                     f"BLEU delta, head masked alone: {TYPE_TITLES[t]} (base {base['bleu']:.2f}; * p<{args.alpha:g})",
                     "delta BLEU", cell_text=text, vmin=-lim, vmax=lim, cmap="RdBu")
    n_sig = sum(r["significant"] for r in rows)
    print(f"base BLEU {base['bleu']:.2f}; {len(rows)} heads ablated, {n_sig} significant at p < {args.alpha:g}")
    for r in rows:
        print(f"  {r['type']:6s} layer {r['layer']} head {r['head_id']}: {r['delta']:+.2f}"
              f"{' *' if r['significant'] else ''} (p={r['p_value']:.3f})")
    return {"base": base["bleu"], "rows": rows}


def cmd_keep_one(args, sess):
    model = sess.load(args.path)
    layout = hi.head_layout(model)
    ids = hi.original_head_ids(model)
    imp = None
    if args.select == "importance":
        imp, _ = sess.importance(model)
    ev = sess.evaluator(model)
    base, rows = hi.keep_one_per_layer(ev, layout, args.types, imp, args.select, args.bootstrap_samples, args.alpha,
                                       progress=sess.progress("keep-one"))
    for r in rows:
        r["kept_head_id"] = ids[(r["type"], r["layer"])][r["kept_head"]]
    os.makedirs(args.output_dir, exist_ok=True)
    write_tsv(os.path.join(args.output_dir, "keep_one.tsv"),
              ["type", "layer", "heads", "kept_head", "kept_head_id", "bleu", "delta", "p_value", "significant"], rows)
    write_json(os.path.join(args.output_dir, "keep_one.json"), {
        "base_bleu": base["bleu"], "sentences": len(ev.ids), "select": args.select,
        "signature": _bleu_signature(ev), "settings": _settings(args), "layers": rows})
    from fairseq_sparse.analysis.plotting import head_heatmap
    types = [t for t in TYPES if any(r["type"] == t for r in rows)]
    n_layers = max(r["layer"] for r in rows) + 1 if rows else 0
    if rows:
        m = np.full((n_layers, len(types)), np.nan)
        text = np.full(m.shape, "", dtype=object)
        for r in rows:
            j = types.index(r["type"])
            m[r["layer"], j] = r["delta"]
            text[r["layer"], j] = f"{r['delta']:+.2f}{'*' if r['significant'] else ''} (h{r['kept_head_id']})"
        lim = max(float(np.nanmax(np.abs(m))), 1e-6)
        head_heatmap(m, os.path.join(args.output_dir, "keep_one.png"),
                     f"Best BLEU delta with one head per layer (base {base['bleu']:.2f}; * p<{args.alpha:g})",
                     "delta BLEU", col_labels=types, cell_text=text, vmin=-lim, vmax=lim, cmap="RdBu",
                     xlabel="attention type")
    print(f"base BLEU {base['bleu']:.2f}; one head kept per layer (select: {args.select}):")
    for r in rows:
        print(f"  {r['type']:6s} layer {r['layer']}: head {r['kept_head_id']} {r['delta']:+.2f}"
              f"{' *' if r['significant'] else ''} (p={r['p_value']:.3f})")
    return {"base": base["bleu"], "rows": rows}


def cmd_prune_curve(args, sess):
    checkpoints = list(args.checkpoints) if args.checkpoints else [args.path]
    if args.checkpoints and args.path and args.path not in checkpoints:
        checkpoints.append(args.path)
    modes = args.modes or (["all"] if len(checkpoints) > 1 else list(MODES))
    orders = ["importance", "ablation"] if args.order == "both" else [args.order]
    out = args.output_dir
    curves, importances, mask_info, base_bleus = [], [], None, {}
    pending = []  # (writer, args): files are written after all the work succeeded
    for ci, path in enumerate(checkpoints):
        model = sess.load(path)
        layout = hi.head_layout(model)
        missing = [m for m in modes if m != "all" and not any(k[0] == m for k in layout)]
        if missing:
            _fail(f"{path} has no {', '.join(missing)} attention layers")
        if ci == len(checkpoints) - 1:
            check_mask_reachable(args, model)
        tag = "" if len(checkpoints) == 1 else f"_{ci}"
        name = os.path.basename(path) if len(checkpoints) == 1 else f"{ci}:{os.path.basename(path)}"
        imp, info = sess.importance(model, tag)
        ids = hi.original_head_ids(model)
        pending.append((write_importance, (imp, info, ids, _settings(args, {"checkpoint": os.path.abspath(path)}), tag)))
        importances.append({"checkpoint": os.path.abspath(path), "importance_file": f"importance{tag}.json"})
        ev = sess.evaluator(model)
        base = ev.evaluate(hi.full_masks(layout))["bleu"]
        base_bleus[path] = base
        scores = {"importance": imp}
        if "ablation" in orders:
            _, abl = hi.ablate_heads(ev, layout, _types_of(modes), n_bootstrap=0, progress=sess.progress(f"ablate{tag}"))
            scores["ablation"] = hi.ablation_order_scores(layout, abl)
        for mode in modes:
            for order in orders:
                rows = hi.prune_curve(ev, scores[order], _types_of(mode), args.step, args.min_heads_per_layer,
                                      progress=sess.progress(f"prune-curve{tag} {mode}/{order}"))
                for r in rows:
                    r["relative"] = (r["bleu"] / base if base > 0 else float("nan")) if r["bleu"] is not None else None
                unreachable = [r["fraction"] for r in rows if not r["reachable"]]
                if unreachable:
                    logger.warning(f"{name} {mode}: levels {unreachable} skipped: fewer heads can be pruned with "
                                   f"--min-heads-per-layer {args.min_heads_per_layer}")
                skipped = sorted({tuple(s) for r in rows if r["skipped"] for s in r["skipped"]})
                if skipped:
                    logger.warning(f"{name} {mode}: heads kept to respect --min-heads-per-layer "
                                   f"{args.min_heads_per_layer} (skipped in the order): {skipped}")
                curves.append({"checkpoint": os.path.abspath(path), "label": name, "mode": mode, "order": order,
                               "base_bleu": base, "rows": rows})
                logger.info(f"{name} {mode}/{order}: " + " ".join(
                    f"{100 * r['fraction']:.0f}%={r['bleu']:.2f}" for r in rows if r["bleu"] is not None))
        if ci == len(checkpoints) - 1 and args.write_mask:
            mask_args = (model, imp)
        logger.info(f"{name}: {ev.generations} generations on {len(ev.ids)} sentences")

    signature = _bleu_signature(ev)
    os.makedirs(out, exist_ok=True)
    for writer, wargs in pending:
        writer(out, *wargs)
    if args.write_mask:
        mask_info = write_mask_file(args, *mask_args)
    table = []
    for c in curves:
        for r in c["rows"]:
            table.append({"checkpoint": c["label"], "mode": c["mode"], "order": c["order"], **r})
    write_tsv(os.path.join(out, "curve.tsv"), ["checkpoint", "mode", "order", "fraction", "n_target", "n_pruned",
                                               "n_total", "reachable", "bleu", "relative"], table)
    write_json(os.path.join(out, "curve.json"), {
        "settings": _settings(args, {"modes": modes, "orders": orders}), "signature": signature,
        "importance_computed": "once per checkpoint, on the full model (paper 003 Sec. 4.2)",
        "checkpoints": importances, "curves": curves, "mask": mask_info})
    if len(checkpoints) == 1:
        series = [(f"{c['mode']}" + (f" ({c['order']})" if len(orders) > 1 else ""),
                   [100 * r["fraction"] for r in c["rows"]], [r["bleu"] for r in c["rows"]]) for c in curves]
        _plot_lines(series, os.path.join(out, "curve.png"), f"BLEU vs heads pruned by increasing importance "
                    f"({os.path.basename(checkpoints[0])})", "% of the mode's heads pruned", "BLEU")
    else:
        for mode in modes:
            for order in orders:
                series = [(f"{c['label']} [{c['base_bleu']:.1f}]", [100 * r["fraction"] for r in c["rows"]],
                           [None if r["relative"] is None else 100 * r["relative"] for r in c["rows"]])
                          for c in curves if c["mode"] == mode and c["order"] == order]
                suffix = mode + ("" if len(orders) == 1 else f"_{order}")
                _plot_lines(series, os.path.join(out, f"curve_checkpoints_{suffix}.png"),
                            f"Relative BLEU vs heads pruned ({mode}, order: {order}) [unpruned BLEU]",
                            "% of heads pruned", "% of the unpruned model's BLEU")
    for c in curves:
        print(f"{c['label']} {c['mode']}/{c['order']}: " + "  ".join(
            f"{100 * r['fraction']:.0f}%:{'-' if r['bleu'] is None else format(r['bleu'], '.2f')}" for r in c["rows"]))
    return {"curves": curves, "mask": mask_info}


def main(argv=None):
    parser = get_parser()
    args = parser.parse_args(argv)
    try:
        validate(args)
        sess = Session(args)
        return args.func(args, sess)
    except CliError as e:
        print(f"{PROG} {args.command}: error: {e}", file=sys.stderr)
        raise SystemExit(2)


def cli_main():
    # force: importing fairseq already configured the root logger at DEBUG (wav2vec2_classification)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", stream=sys.stderr,
                        level=os.environ.get("LOGLEVEL", "INFO").upper(), force=True)
    main()


if __name__ == "__main__":
    cli_main()
