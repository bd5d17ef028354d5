"""BLEU against sparsity of the checkpoints of one fine-tuning with a schedule of target sparsities: the
curve of Zhang, Titov & Sennrich (2021) Fig. 4 (L0Drop) and Voita et al. (2019) Fig. 7 (head gates).

    fairseq-sparse-sparsity-curve DATA --user-dir fairseq_sparse (--checkpoints C1.pt C2.pt ... | --save-dir DIR) \\
        [--baseline BASE.pt] --gen-subset test --beam 5 --remove-bpe [--max-sentences N] \\
        --output-prefix OUT [--function-words FILE] [--overwrite] [--device cpu|cuda]

Train with a schedule, e.g. ``--l0drop-target-sparsity 0.2,0.4,0.6 --sparsity-target-hold-updates 300
--save-interval-updates 300 --max-update 900``; ``--save-dir`` then takes the checkpoints saved at the end
of each target (``checkpoint_<epoch>_<updates>.pt``, or ``checkpoint<epoch>.pt`` where a target ends an
epoch), by updates. Per checkpoint (and the unpruned
``--baseline``, e.g. the converged model, drawn as a dashed line): BLEU on ``--gen-subset`` (fairseq's
SequenceGenerator and sacrebleu, as ``fairseq-sparse-head-importance evaluate``), the L0Drop sparsity rate
(share of non-padding source tokens, EOS included, with g_hat = 0), the share of gated heads closed
(g_hat = 0) overall and per attention type, the update count and the target the checkpoint was trained at
last, and the share of pruned source pieces per token type (Zhang, Titov & Sennrich 2021 Sec. 6): the first
piece of a word split in several (bpeh), its other pieces (bpeo), and for words of one piece punctuation,
function words, content words and other, from --tags (Penn Treebank tags, the paper's groups) or, without
tags, from the word itself (a word list; numbers are other). Words are joined at the --remove-bpe marker.
Rule-based pattern checkpoints (--encoder-output-pattern) count as L0Drop.

Writes OUT.tsv (one row per model; floats %.6g, NA where a value does not apply), OUT.png (BLEU against
the L0Drop sparsity rate, or the share of heads closed without L0Drop; points labelled with their target)
and, with L0Drop, OUT_token_types.png (share pruned per token type against the sparsity rate; Zhang, Titov
& Sennrich 2021 Fig. 5); with --char-boundary (a character-level source), OUT_char_positions.png and .tsv:
where inside a word the pruned characters sit (their Fig. 6). Every input is checked before any model is loaded, a checkpoint without gates
(no L0Drop, no head gates) is refused by name, and existing outputs are refused unless --overwrite.
"""
import argparse
import logging
import os

from fairseq_sparse.analysis import sparsity_curve as sc
from fairseq_sparse.analysis import token_types as tt
from fairseq_sparse.analysis.scores import bleu_metric
from fairseq_sparse.checkpoint_safety import other_dictionary, read_state
from fairseq_sparse.cli import common
from fairseq_sparse.cli.common import ToolError

logger = logging.getLogger("fairseq_sparse.sparsity_curve")
PROG = "fairseq-sparse-sparsity-curve"


# ----------------------------------------------------------------------------------------------
# arguments


def _model_args(p):
    g = p.add_argument_group("models and data")
    g.add_argument("data", metavar="DATA", help="fairseq data-bin directory (dictionaries and splits)")
    which = g.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoints", nargs="+", metavar="CKPT", help="the checkpoints of the curve")
    which.add_argument("--save-dir", metavar="DIR",
                       help="take every checkpoint_<epoch>_<updates>.pt of DIR (a schedule's targets), by updates")
    g.add_argument("--baseline", metavar="CKPT", default=None,
                   help="an unpruned reference (e.g. the converged model or an equal-updates control): drawn as a "
                        "dashed line; it may have no gates")
    g.add_argument("--user-dir", default=None,
                   help="extra fairseq plugin to import (fairseq_sparse is always imported)")
    g.add_argument("--source-lang", default=None)
    g.add_argument("--target-lang", default=None)
    common.add_device_args(g)


def get_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    _model_args(p)
    common.add_bleu_args(p.add_argument_group("BLEU evaluation (as fairseq-sparse-head-importance)"),
                         "; its marker also joins pieces into words for the token types")
    g = p.add_argument_group("token types of pruned source tokens")
    g.add_argument("--function-words", metavar="FILE", default=None,
                   help="closed-class words of the source language, one per line (default: a built-in English "
                        "list of about 190 determiners, pronouns, prepositions, conjunctions, auxiliaries and "
                        "particles)")
    g.add_argument("--tags", metavar="FILE", default=None,
                   help="part-of-speech tags of --gen-subset's source side: one line per sentence, Penn Treebank "
                        "tags, one per word (pieces joined at the --remove-bpe marker) or one per piece; the "
                        "token types then follow the paper's tag groups")
    g.add_argument("--char-boundary", metavar="SYMBOL", default=None,
                   help="a character-level source whose words are separated by the token SYMBOL (e.g. '_'): also "
                        "the position of the pruned characters inside their word (Fig. 6)")
    g = p.add_argument_group("output and logging")
    g.add_argument("--output-prefix", required=True, metavar="OUT",
                   help="writes OUT.tsv, OUT.png and (with L0Drop) OUT_token_types.png, and with --char-boundary "
                        "OUT_char_positions.png and OUT_char_positions.tsv")
    common.add_overwrite_arg(g)
    common.add_progress_args(g)
    return p


# ----------------------------------------------------------------------------------------------
# validation: every check before anything is loaded or written


def check_options(args):
    common.check_finite(args)
    for name in ("max_sentences", "batch_size", "beam", "log_interval"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ToolError(f"--{name.replace('_', '-')} must be >= 1")
    try:
        bleu_metric(args.sacrebleu_tokenize)
    except Exception as e:
        raise ToolError(f"--sacrebleu-tokenize {args.sacrebleu_tokenize!r}: {e}") from None


def checkpoint_paths(args):
    """--checkpoints, or the interval checkpoints of --save-dir (ToolError if there are none)."""
    if args.checkpoints:
        return list(args.checkpoints)
    if not os.path.isdir(args.save_dir):
        raise ToolError(f"--save-dir: directory not found: {args.save_dir}")
    paths = sc.saved_checkpoints(args.save_dir)
    if not paths:
        raise ToolError(f"--save-dir: no checkpoint_<epoch>_<updates>.pt or checkpoint<epoch>.pt in {args.save_dir} "
                        "(train the schedule "
                        "with --save-interval-updates equal to --sparsity-target-hold-updates, or name the "
                        "checkpoints with --checkpoints)")
    return paths


def output_paths(args):
    return {"tsv": args.output_prefix + ".tsv", "png": args.output_prefix + ".png",
            "types": args.output_prefix + "_token_types.png",
            "chars_png": args.output_prefix + "_char_positions.png",
            "chars_tsv": args.output_prefix + "_char_positions.tsv"}


def check_inputs_and_outputs(args):
    """Returns (checkpoint paths, function words). Token-type plot: checked once L0Drop is known."""
    common.check_data_dir(args.data)
    paths = checkpoint_paths(args)
    for path in paths:
        common.check_checkpoint_file(path, "--checkpoints" if args.checkpoints else "--save-dir")
    if args.baseline is not None:
        common.check_checkpoint_file(args.baseline, "--baseline")
    words = tt.ENGLISH_FUNCTION_WORDS
    if args.tags is not None:
        common.check_input_files(("--tags", args.tags))
    if args.char_boundary is not None and not args.char_boundary.strip():
        raise ToolError("--char-boundary: give the token that separates words (e.g. '_')")
    if args.function_words is not None:
        common.check_input_files(("--function-words", args.function_words))
        try:
            words = tt.read_function_words(args.function_words)
        except ValueError as e:
            raise ToolError(f"--function-words: {e}") from None
    out = output_paths(args)
    common.check_output_files([("--output-prefix", out["tsv"]), ("--output-prefix", out["png"])], args.overwrite,
                              inputs=paths + [args.baseline, args.function_words, args.tags], data=args.data)
    return paths, words


def _describe(path):
    try:
        return sc.describe_checkpoint(path)
    except Exception as e:  # passed the archive check, but is no fairseq checkpoint
        raise ToolError(f"cannot read {path}: {type(e).__name__}: {e}") from e


def describe(args, paths):
    """(infos of the checkpoints, info of the baseline or None), read without building models; a checkpoint
    without gates is refused, and the token-type plot checked when there is L0Drop."""
    infos = []
    for path in paths:
        info = _describe(path)
        if not any(info["gates"].values()):
            raise ToolError(f"{path} has no L0Drop gates and no head gates: nothing to measure a sparsity of "
                            "(an unpruned model goes in --baseline)")
        infos.append(info)
    if args.save_dir:
        infos = sc.stage_ends(infos)
    missing = sc.missing_stage_ends(infos)
    if missing:
        logger.warning(f"no checkpoint at the end of the targets at updates {missing}: fairseq names a save at an "
                       "epoch's last update checkpoint<epoch>.pt, which --no-epoch-checkpoints suppresses")
    if any(i["gates"]["l0drop"] for i in infos):
        out = output_paths(args)
        names = ["types"] + (["chars_png", "chars_tsv"] if args.char_boundary else [])
        common.check_output_files([("--output-prefix", out[k]) for k in names], args.overwrite,
                                  inputs=paths + [args.baseline, args.function_words, args.tags], data=args.data)
    elif args.tags or args.char_boundary:
        raise ToolError("--tags / --char-boundary describe pruned source tokens, and no checkpoint has L0Drop gates "
                        "or an encoder-output pattern")
    for option, path in [("--checkpoints", p) for p in paths] + ([("--baseline", args.baseline)] if args.baseline else []):
        theirs = other_dictionary(read_state(path), args.data)
        if theirs:
            raise ToolError(f"{option} {path} was trained with {theirs}, whose symbols differ from those of "
                            f"{args.data}: its scores would be of other words; decode it with its own data")
    return infos, (_describe(args.baseline) if args.baseline else None)


# ----------------------------------------------------------------------------------------------
# measuring


def split_tags(args, sess):
    """{sentence id: tags} of --gen-subset from --tags, checked against the split's source pieces (ToolError
    naming the first line that does not match), or None without --tags."""
    if args.tags is None:
        return None
    if getattr(sess, "tags", None) is None:
        ds, d = sess.subset(args.gen_subset), sess.task.source_dictionary
        specials = {d.eos(), d.bos(), d.pad()}
        sentences = [[d[t] for t in ds[i]["source"].tolist() if t not in specials] for i in range(len(ds))]
        try:
            sess.tags = dict(enumerate(tt.read_tags(args.tags, sentences, tt.continuation_marker(args.remove_bpe))))
        except ValueError as e:
            raise ToolError(f"--tags: {e}") from None
    return sess.tags


def measure(args, sess, info, function_words, baseline=False):
    """One row of the table: BLEU, sparsities and token types of one checkpoint."""
    model = sess.load(info["path"])
    tags = split_tags(args, sess)
    ev = sess.evaluator(model)
    bleu = ev.evaluate(None)["bleu"]
    sparsity = sc.head_gate_sparsity(model)
    if hasattr(model.encoder, "l0drop"):
        ds = sess.subset(args.gen_subset)
        batches = common.length_sorted_batches(ds, ev.ids, args.batch_size)
        samples = (common.collate(ds, b, sess.use_cuda) for b in batches)
        sparsity.update(sc.l0drop_pruning(model.encoder, samples, sess.task.source_dictionary,
                                          tt.continuation_marker(args.remove_bpe), function_words, tags,
                                          args.char_boundary))
    row = sc.curve_row(info, bleu, sparsity, baseline)
    shares = [f"{k} sparsity {v:.3f}" for k, v in sparsity.items() if k in sc.SPARSITY_KEYS and v is not None]
    logger.info(f"{info['path']}: BLEU {bleu:.2f} on {len(ev.ids)} sentences of '{args.gen_subset}'"
                + "".join(f", {x}" for x in shares))
    return row


# ----------------------------------------------------------------------------------------------
# outputs


def _fmt(v, spec=".3f"):
    return "NA" if v is None else format(v, spec)


def write_outputs(args, rows):
    from fairseq_sparse.analysis.plotting import plot_pruned_by_type, plot_pruned_positions, plot_sparsity_curve

    out = output_paths(args)
    written = [out["tsv"], out["png"]]
    common.write_tsv(out["tsv"], sc.COLUMNS, ([r[c] for c in sc.COLUMNS] for r in rows), float_spec="{:.6g}",
                     none="NA")
    axis = sc.curve_axis(rows)
    base = next((r for r in rows if r["baseline"]), None)
    baseline = None if base is None else (base[f"{axis}_sparsity"], base["bleu"],
                                          f"baseline {os.path.basename(base['checkpoint'])}")
    xlabel, cite = (("L0Drop sparsity rate (% of source tokens pruned)", "Zhang, Titov & Sennrich 2021, Fig. 4")
                    if axis == "l0drop" else ("% of gated heads closed", "Voita et al. 2019, Fig. 7"))
    plot_sparsity_curve(sc.curve_points(rows, axis), out["png"], f"BLEU against sparsity ({cite})", xlabel, baseline)
    if axis == "l0drop":
        plot_pruned_by_type(sc.token_type_series(rows), out["types"],
                            "Source tokens pruned per token type (Zhang, Titov & Sennrich 2021, Fig. 5)")
        written.append(out["types"])
    chars = [r for r in rows if r.get("char_positions")]
    if args.char_boundary and chars:
        header = ["checkpoint", "l0drop_sparsity", "from", "to", "chars", "pruned", "share_pruned", "share_of_pruned"]
        common.write_tsv(out["chars_tsv"], header, ([r["checkpoint"], r["l0drop_sparsity"]] + [b[k] for k in header[2:]]
                                                    for r in chars for b in r["char_positions"]),
                         float_spec="{:.6g}", none="NA")
        plot_pruned_positions([(f"sparsity {r['l0drop_sparsity']:.2f}", r["char_positions"]) for r in chars],
                              out["chars_png"])
        written += [out["chars_tsv"], out["chars_png"]]
    return written


def print_table(rows):
    axis = sc.curve_axis(rows)
    print(f"{'checkpoint':32s} {'updates':>7s} {'target':>14s} {'l0drop':>7s} {'heads':>7s} {'BLEU':>6s}")
    for r in rows:
        name = ("baseline " if r["baseline"] else "") + os.path.basename(r["checkpoint"])
        print(f"{name:32s} {_fmt(r['updates'], 'd'):>7s} {sc.point_label(r, axis) or 'NA':>14s} "
              f"{_fmt(r['l0drop_sparsity']):>7s} {_fmt(r['head_gates_sparsity']):>7s} {r['bleu']:6.2f}")


def main(argv=None):
    args = get_parser().parse_args(argv)
    try:
        common.check_device(args)
        check_options(args)
        paths, function_words = check_inputs_and_outputs(args)
        sess = common.Session(args)  # imports the plugins: the checkpoints' classes
        infos, base = describe(args, paths)
        rows = [measure(args, sess, base, function_words, baseline=True)] if base is not None else []
        rows += [measure(args, sess, info, function_words) for info in infos]
    except ToolError as e:
        common.fail(PROG, str(e))
    written = write_outputs(args, rows)
    print_table(rows)
    print("wrote " + ", ".join(written))
    return rows


def cli_main():
    common.setup_logging()
    main()


if __name__ == "__main__":
    cli_main()
