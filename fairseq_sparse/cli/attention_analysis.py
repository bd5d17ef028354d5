"""Encoder-decoder attention of a translation model: entropy, confidence, word alignment (AER, SAER),
cumulative coverage per decoder layer, and the L0Drop attention analyses of Zhang, Titov & Sennrich (2021).

    fairseq-sparse-attention-analysis DATA --path CKPT --output-dir DIR [--gen-subset test]
        [--gold ALIGN [--gold-possible ALIGN] [--gold-index-base 0]] [--align-layers all]
        [--bpe-separator @@] [--l0drop | --no-l0drop] [--gates-from L0DROP_CKPT]
        [--max-sentences N] [--batch-size 32] [--device cpu|cuda] [--overwrite]

A teacher-forced forward pass over a split (the reference targets as decoder input) captures, with
forward hooks, every decoder layer's encoder-decoder attention per head (fairseq's slow attention
path is forced with ``skip_embed_dim_check``, which changes nothing else) and, for the L0Drop
analysis, the last encoder layer's self-attention. L0Drop models run with ``pruned_decoding =
False``, so that the attention covers every source position (a pruned state is a zero vector the
decoder still attends to, or a masked one with ``--l0drop-dropped-as mask``).

Per decoder layer (0 = bottom), on the attention of every reference target token (final EOS
included) over all source positions (EOS included: the full softmax distribution):

* ``entropy``: mean entropy (nats) per target token of the head-averaged distribution;
  ``entropy_heads``: the mean of the per-head entropies; per head in heads.tsv;
* ``max_weight``: mean largest weight per target token (head-averaged; and per head);
* ``aer``/``saer`` (with ``--gold``): word alignments extracted from the layer's head-averaged
  attention: EOS rows/columns dropped (no renormalisation), subwords merged (attention *to* a source
  word = sum over its pieces, *from* a target word = mean over its pieces), each target word linked
  to the source word of largest weight (Yang et al. 2020, Sec. 3.2).
  AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|) (Och & Ney 2003); SAER of Zhang, Zhao, Li & Zong (2019)
  Eq. (23) on the same word-level soft matrix. Corpus-level:
  counts are summed over sentences before dividing. The ``--align-layers`` row does the same on the
  mean of the chosen layers' head-averaged attention; its links go to alignment.txt (Pharaoh);
* ``coverage``: cumulative coverage ratio C_{<=i} = |A_1 ∪ ... ∪ A_i| / N of Yang et al. (2020)
  Eq. (2), A_i the source words linked at layer i, N the number of source words of the corpus; ``coverage_layer``:
  |A_i| / N of the layer alone.

L0Drop (``--l0drop``: default on for L0Drop checkpoints or with ``--gates-from``; source tokens,
EOS excluded, classified kept (g_hat != 0) or pruned (g_hat = 0)):

* Zhang, Titov & Sennrich (2021) Figs. 1/7: the attention each source token receives, averaged over
  the heads and layers of the encoder-decoder attention and summed over the target words (final EOS row excluded);
  histograms of all / kept / pruned tokens, mean and share below 0.6;
* Zhang, Titov & Sennrich (2021) Fig. 8: the entropy (nats) of the last encoder self-attention layer's
  head-averaged row of each source token (its distribution over all source positions, EOS included),
  kept vs pruned.
  ``--gates-from`` classifies this model's tokens with another L0Drop model's gates, as the paper
  does for its baseline Transformer.

The L0Drop statistics are at token level (the gate is per token); with BPE a "word" there is a piece.

Gold alignments (``--gold``): Pharaoh lines ``i-j`` (sure) / ``i?j`` (possible), source word i,
target word j, 0-based (``--gold-index-base 1`` for 1-based files), one line per sentence of the
subset in order; or sure links in ``--gold`` and possible ones in ``--gold-possible``
(see :mod:`fairseq_sparse.analysis.alignment`). The gold is checked against the binarised subset (sentence
count, word indices after subword merging) before anything is computed or written.

Outputs in ``--output-dir``: layers.tsv, heads.tsv, attention.json, alignment.txt, layers.png
(AER/SAER, cumulative coverage, entropy per layer), entropy_heads.png, max_weight_heads.png; with
L0Drop also l0drop_tokens.tsv, l0drop_attention.png and l0drop_entropy.png; existing ones are replaced only
with ``--overwrite``. A summary goes to stdout. The statistics are :mod:`fairseq_sparse.analysis.attention`'s.
"""
import argparse
import logging
import os
from types import SimpleNamespace

from fairseq_sparse.analysis import alignment as al
from fairseq_sparse.analysis import attention as att
from fairseq_sparse.cli import common

logger = logging.getLogger("fairseq_sparse.attention_analysis")

PROG = "fairseq-sparse-attention-analysis"
OUTPUTS = ["layers.tsv", "heads.tsv", "attention.json", "alignment.txt", "layers.png", "entropy_heads.png",
           "max_weight_heads.png"]
L0DROP_OUTPUTS = ["l0drop_tokens.tsv", "l0drop_attention.png", "l0drop_entropy.png"]
LAYER_COLS = ["layer", "heads", "entropy", "entropy_heads", "max_weight", "aer", "saer", "coverage", "coverage_layer"]
HEAD_COLS = ["layer", "head", "entropy", "max_weight"]
TOKEN_COLS = ["id", "position", "token", "gate", "pruned", "summed_attention", "encoder_entropy"]
fmt = common.format_value


def get_parser():
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0],
        epilog="See the module docstring (python -m fairseq_sparse.cli.attention_analysis --help) and "
               "fairseq_sparse/analysis/alignment.py, fairseq_sparse/analysis/attention.py for the definitions.")
    p.add_argument("data", metavar="DATA", help="fairseq data-bin directory (dictionaries and the subset)")
    common.add_checkpoint_args(p)
    p.add_argument("--gen-subset", default="test", help="data split to analyse (default: test)")
    p.add_argument("--output-dir", required=True, metavar="DIR", help="TSV, JSON, alignment and PNG files go here")
    common.add_overwrite_arg(p)
    p.add_argument("--max-sentences", type=int, default=None, metavar="N", help="only the first N sentences")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--gold", default=None, metavar="FILE",
                   help="gold alignment, Pharaoh 'i-j' (sure) and 'i?j' (possible), one line per sentence")
    p.add_argument("--gold-possible", default=None, metavar="FILE",
                   help="possible links in a separate file (then --gold holds the sure links)")
    p.add_argument("--gold-index-base", type=int, choices=(0, 1), default=0,
                   help="0: Pharaoh/fast_align indices (default); 1: 1-based gold files")
    p.add_argument("--align-layers", default="all",
                   help="decoder layers whose head-averaged attention is averaged for alignment.txt and the "
                        "combined AER/SAER: 'all' (default), 'last' or 0-based indices like '0,1'")
    p.add_argument("--bpe-separator", default="@@", help="subword continuation marker ('' = no BPE)")
    p.add_argument("--l0drop", default=None, action=argparse.BooleanOptionalAction,
                   help="L0Drop analyses (Zhang, Titov & Sennrich 2021, Figs. 1/7/8); default: on for L0Drop "
                        "checkpoints and with --gates-from")
    p.add_argument("--gates-from", default=None, metavar="CKPT",
                   help="classify source tokens kept/pruned with this L0Drop checkpoint's gates (e.g. to analyse "
                        "the baseline transformer, as Zhang, Titov & Sennrich 2021 do in Fig. 8)")
    p.add_argument("--hist-bins", type=int, default=30, help="bins of the L0Drop histograms")
    p.add_argument("--example-maps", type=int, default=0, metavar="N",
                   help="also draw the attention maps (head- and layer-averaged) of the first N sentences, "
                        "example_<id>.png, with the source tokens L0Drop prunes marked")
    common.add_progress_args(p)
    return p


def validate(args):
    """Every check that needs no model, before anything is loaded or written; returns the gold (or None)."""
    common.check_finite(args)
    common.check_checkpoint_file(args.path, "--path")
    if args.gates_from is not None:
        common.check_checkpoint_file(args.gates_from, "--gates-from")
    common.check_data_dir(args.data)
    common.check_input_files(("--gold", args.gold), ("--gold-possible", args.gold_possible))
    if args.gold_possible is not None and args.gold is None:
        raise common.ToolError("--gold-possible needs --gold (the sure links)")
    if args.max_sentences is not None and args.max_sentences < 1:
        raise common.ToolError("--max-sentences must be >= 1")
    if args.batch_size < 1 or args.hist_bins < 1:
        raise common.ToolError("--batch-size and --hist-bins must be >= 1")
    if args.example_maps < 0:
        raise common.ToolError("--example-maps must be >= 0")
    if args.l0drop is False and args.gates_from:
        raise common.ToolError("--gates-from makes no sense with --no-l0drop")
    names = OUTPUTS + (L0DROP_OUTPUTS if args.l0drop is not False else []) + [
        f"example_{i}.png" for i in range(args.example_maps)]
    common.check_output_dir(args.output_dir, names, args.overwrite, data=args.data)
    if os.path.isdir(args.output_dir):  # never over an input, --overwrite or not
        common.check_output_files([("--output-dir", os.path.join(args.output_dir, n)) for n in names], True,
                                  inputs=(args.path, args.gates_from, args.gold, args.gold_possible))
    if args.gold is None:
        return None
    try:
        return al.read_gold_alignments(args.gold, args.gold_possible, args.gold_index_base)
    except (al.GoldAlignmentError, UnicodeDecodeError) as e:
        raise common.ToolError(f"cannot read the gold alignment: {e}") from None


def load_models(args):
    """(model, cfg, task, the --gates-from model or None, whether to run the L0Drop analyses)."""
    model, cfg, task = common.load_checkpoint(args.path, args.data, args.source_lang, args.target_lang)
    decoder = getattr(model, "decoder", None)
    if getattr(model, "encoder", None) is None or decoder is None or not hasattr(decoder, "layers"):
        raise common.ToolError(f"{args.path}: {type(model).__name__} is not a fairseq encoder-decoder transformer")
    gate_model = None
    if args.gates_from:
        gate_model, _, _ = common.load_checkpoint(args.gates_from, args.data, args.source_lang, args.target_lang,
                                                  task=task)
        if not hasattr(gate_model.encoder, "l0drop"):
            raise common.ToolError(f"--gates-from {args.gates_from} has no L0Drop gates")
        if list(gate_model.encoder.dictionary.symbols) != list(task.source_dictionary.symbols):
            raise common.ToolError(f"--gates-from {args.gates_from} has another source dictionary than {args.path}")
    own_gates = hasattr(model.encoder, "l0drop")
    do_l0drop = args.l0drop if args.l0drop is not None else (own_gates or gate_model is not None)
    if do_l0drop and not own_gates and gate_model is None:
        raise common.ToolError(f"--l0drop: {args.path} has no L0Drop gates; pass --gates-from an L0Drop checkpoint")
    return model, cfg, task, gate_model, do_l0drop


def check_gold(args, gold, dataset, task):
    """Every gold sentence must fit its sentence pair (count, word indices), before any computation."""
    src_dict, tgt_dict, separator = task.source_dictionary, task.target_dictionary, args.bpe_separator or None
    src_words = [att.sentence_words(dataset.src[i].tolist(), src_dict, separator) for i in range(len(dataset))]
    tgt_words = [att.sentence_words(dataset.tgt[i].tolist(), tgt_dict, separator) for i in range(len(dataset))]
    try:
        al.check_gold_alignments(gold, src_words, tgt_words)
    except al.GoldAlignmentError as e:
        msg = f"{args.gold} does not match subset '{args.gen_subset}' of {args.data}: {e}"
        k = e.sentence
        if k is not None and k < len(dataset):
            msg += (f"; source {src_dict.string(dataset.src[k])[:200]!r}, "
                    f"target {tgt_dict.string(dataset.tgt[k])[:200]!r}")
        raise common.ToolError(msg) from None


def prepare(args) -> SimpleNamespace:
    """Validate, load and check everything; nothing is computed or written yet."""
    gold = validate(args)
    common.import_plugins(args.user_dir)
    model, cfg, task, gate_model, do_l0drop = load_models(args)
    align_layers = common.parse_layers(args.align_layers, len(model.decoder.layers), option="--align-layers")
    dataset = common.load_split(task, cfg, args.gen_subset, need_target=True)
    if gold is not None:
        check_gold(args, gold, dataset, task)
    n_use = len(dataset) if args.max_sentences is None else min(args.max_sentences, len(dataset))
    return SimpleNamespace(model=model, task=task, dataset=dataset, gate_model=gate_model, l0drop=do_l0drop,
                           gold=gold, align_layers=align_layers, n_use=n_use)


def analyse(args, run: SimpleNamespace):
    """The teacher-forced pass over the first ``run.n_use`` sentences (those that fit the model)."""
    cuda = common.use_cuda(args.cpu)
    for m in (run.model, run.gate_model):
        if m is not None:
            m.eval()
            if cuda:
                m.cuda()
            if hasattr(m.encoder, "l0drop"):
                m.encoder.pruned_decoding = False  # attention over every source position
    ids, _ = common.fitting_ids(run.task, run.model, run.dataset, range(run.n_use))
    head_labels = att.encdec_head_ids(run.model)
    stats = att.AttentionStats([len(h) for h in head_labels], run.gold is not None, run.l0drop, args.example_maps)
    logger.info(f"analysing {len(ids)} sentences of '{args.gen_subset}' ({len(run.dataset)} in all), "
                f"{len(head_labels)} decoder layers, heads per layer {[len(h) for h in head_labels]}, align "
                f"layers {run.align_layers}, gold {'yes' if run.gold is not None else 'no'}, L0Drop analysis "
                f"{'on' if run.l0drop else 'off'}")
    batches = common.progress(common.length_sorted_batches(run.dataset, ids, args.batch_size), args,
                              prefix=f"attention analysis on '{args.gen_subset}'")
    gate_encoder = (run.gate_model or run.model).encoder if run.l0drop else None
    att.analyse_samples(run.model, (common.collate(run.dataset, b, cuda) for b in batches), stats,
                        run.task.source_dictionary, run.task.target_dictionary, args.bpe_separator or None,
                        run.align_layers, run.gold, gate_encoder, head_labels)
    return stats, head_labels


def main(argv=None):
    args = get_parser().parse_args(argv)
    try:
        common.check_device(args)
        run = prepare(args)
    except common.ToolError as e:
        common.fail(PROG, str(e))
    stats, head_labels = analyse(args, run)
    result = att.summarise(stats, head_labels, run.align_layers, args.hist_bins)
    result.update({
        "checkpoint": os.path.abspath(args.path), "data": os.path.abspath(args.data), "subset": args.gen_subset,
        "settings": {"gold": args.gold, "gold_possible": args.gold_possible, "gold_index_base": args.gold_index_base,
                     "align_layers": run.align_layers, "bpe_separator": args.bpe_separator,
                     "gates_from": args.gates_from, "entropy_unit": "nats"},
    })
    os.makedirs(args.output_dir, exist_ok=True)
    write_outputs(result, stats, len(head_labels), run.n_use, args.output_dir)
    print_summary(result)
    return result


def write_outputs(result, stats, n_layers, n_use, out_dir):
    from fairseq_sparse.analysis import plotting

    def path(name):
        return os.path.join(out_dir, name)

    a = result["align"]
    align_row = ["align:" + ",".join(map(str, a["layers"]))] + [float("nan")] * 4 + [a["aer"], a["saer"]] \
        + [float("nan")] * 2
    common.write_tsv(path("layers.tsv"), LAYER_COLS, [[r[c] for c in LAYER_COLS] for r in result["layers"]]
                     + [align_row])
    common.write_tsv(path("heads.tsv"), HEAD_COLS, [[h[c] for c in HEAD_COLS] for h in result["heads"]])
    common.write_text(path("alignment.txt"), "".join(stats.hyp_lines.get(sid, "") + "\n" for sid in range(n_use)))
    common.write_json(path("attention.json"), result)
    plotting.plot_attention_layers(result["layers"], path("layers.png"))
    plotting.plot_encdec_head_maps(att.head_matrix(result["heads"], "entropy", n_layers),
                                   att.head_matrix(result["heads"], "max_weight", n_layers),
                                   path("entropy_heads.png"), path("max_weight_heads.png"))
    for sid, example in sorted(stats.examples.items()):
        plotting.plot_attention_example(example, path(f"example_{sid}.png"), f"sentence {sid}")
    if stats.l0drop:
        tokens = sorted(stats.tokens, key=lambda t: (t[0], t[1]))
        common.write_tsv(path("l0drop_tokens.tsv"), TOKEN_COLS,
                         [(sid, pos, tok, g, int(g == 0), rec, ent) for sid, pos, tok, g, rec, ent in tokens],
                         float_spec="{:.6g}")
        cols = att.token_columns(stats.tokens)
        plotting.plot_l0drop(result["l0drop"], cols["pruned"], cols["summed_attention"], cols["encoder_entropy"],
                             att.LOW_ATTENTION, path("l0drop_attention.png"), path("l0drop_entropy.png"))


def print_summary(result):
    print(f"Encoder-decoder attention of {result['checkpoint']} on '{result['subset']}' ({result['sentences']} "
          f"sentences, {result['source_words']} source words; teacher-forced on the references)")
    print(f"{'layer':>7} {'heads':>5} {'entropy':>8} {'ent/head':>8} {'maxw':>6} {'AER':>6} {'SAER':>6} "
          f"{'C<=i':>6} {'|Ai|/N':>6}")
    for r in result["layers"]:
        print(f"{r['layer']:>7} {r['heads']:>5} {fmt(r['entropy']):>8} {fmt(r['entropy_heads']):>8} "
              f"{fmt(r['max_weight']):>6.6} {fmt(r['aer']):>6.6} {fmt(r['saer']):>6.6} "
              f"{fmt(r['coverage']):>6.6} {fmt(r['coverage_layer']):>6.6}")
    a = result["align"]
    print(f"alignment from layers {','.join(map(str, a['layers']))} (head- and layer-averaged): "
          f"AER {fmt(a['aer'])}, SAER {fmt(a['saer'])}")
    if "l0drop" in result:
        d = result["l0drop"]
        sa, ee = d["summed_attention"], d["encoder_entropy"]
        key = f"share_below_{att.LOW_ATTENTION}"
        print(f"L0Drop: {d['pruned']} of {d['source_tokens']} source tokens pruned ({fmt(d['sparsity'])})")
        for name in ("all", "kept", "pruned"):
            print(f"  {name:>6}: summed attention mean {fmt(sa[name]['mean'])}, below {att.LOW_ATTENTION}: "
                  f"{fmt(sa[name][key])}; last encoder self-attention entropy mean {fmt(ee[name]['mean'])}")


def cli_main():
    common.setup_logging()
    main()


if __name__ == "__main__":
    cli_main()
