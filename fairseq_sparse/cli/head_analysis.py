"""Confidence and function of the encoder self-attention heads (Voita et al. 2019, Sec. 4-5).

    fairseq-sparse-head-analysis DATA --path CKPT --output-dir DIR [--gen-subset test]
        [--max-sentences N] [--batch-size 32] [--conllu FILE] [--bpe-separator @@]
        [--rare-min-rank 500] [--positional-threshold 0.9] [--syntactic-margin 0.10] [--device cpu|cuda] [--overwrite]

Works on any fairseq encoder-decoder transformer checkpoint (stock ``transformer`` or this plugin's
models, physically pruned ones included), on CUDA when available unless ``--device cpu``. The per-head
attention weights of every encoder self-attention layer are captured with forward hooks (fairseq's slow
attention path is forced with ``skip_embed_dim_check``, which changes nothing else; PyTorch's fast path
only returns the average over heads). The definitions of confidence, positional, rare-word and
syntactic heads are in :mod:`fairseq_sparse.analysis.heads`.

Word frequencies for the rare-word head are the source dictionary's counts, which fairseq-preprocess
fills from the training split (with ``--joined-dictionary`` they are source + target counts);
``--frequencies train`` counts the binarised source side of the train split instead. ``--conllu``: the
dependency parses of the subset's source sentences, one CoNLL-U sentence per source line, in order;
each must have as many words as its source sentence after merging ``--bpe-separator`` subwords.

``--lrp``: also the relevance of each head by layer-wise relevance propagation (Voita et al. 2019 Sec. 4,
Figs. 1-2; :mod:`fairseq_sparse.analysis.lrp`) on the first ``--lrp-sentences`` sentences, teacher forced:
an ``lrp`` column (the head's share of its layer's relevance), lrp.png next to confidence.png, and per layer
the rank correlation of relevance and confidence and the functions of the most relevant head. A checkpoint
whose forward pass the propagation does not re-compute is refused before any work.

Outputs in ``--output-dir`` (refused if they exist, unless ``--overwrite``): heads.tsv, heads.json (with
baselines and distributions), confidence.png and function.png (layers x heads maps), lrp.png with --lrp;
a summary table goes to stdout.
"""
import argparse
import logging
import os

import numpy as np
import torch

from . import common
from ..analysis import heads, lrp

logger = logging.getLogger("fairseq_sparse.head_analysis")

PROG = "fairseq-sparse-head-analysis"
OUTPUTS = ("heads.tsv", "heads.json", "confidence.png", "function.png")


def get_parser():
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0],
        epilog="Definitions: python -m pydoc fairseq_sparse.analysis.heads (Voita et al. 2019, Sec. 4-5).")
    p.add_argument("data", metavar="DATA", help="fairseq data-bin directory (dictionaries and the subset)")
    common.add_checkpoint_args(p, path_help="fairseq transformer checkpoint")
    p.add_argument("--gen-subset", default="test", help="data split to analyse (default: test)")
    p.add_argument("--max-sentences", type=int, default=None, metavar="N", help="only the first N sentences of the subset")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--output-dir", required=True, metavar="DIR", help="heads.tsv, heads.json and the PNGs go here")
    common.add_overwrite_arg(p)
    p.add_argument("--conllu", default=None, metavar="FILE",
                   help="dependency parses of the subset's source sentences, one sentence per source line, in order")
    p.add_argument("--bpe-separator", default="@@", help="subword continuation marker ('' = no BPE)")
    p.add_argument("--frequencies", choices=("dictionary", "train"), default="dictionary",
                   help="token frequencies for the rare-word head: the source dictionary's counts (from the train "
                        "split by fairseq-preprocess) or a count of the binarised train source")
    p.add_argument("--rare-min-rank", type=int, default=500,
                   help="use sentences whose rarest token is not among the K most frequent "
                        "(Voita et al. 2019: 500)")
    p.add_argument("--rare-threshold", type=float, default=0.5,
                   help="mark a head 'rare' if its maximum hits one of the two least frequent words this often")
    p.add_argument("--rare-margin", type=float, default=0.10, help="... and this much more often than chance")
    p.add_argument("--lrp", action="store_true",
                   help="also each head's relevance for the top-1 predictions by layer-wise relevance propagation "
                        "(Voita et al. 2019 Sec. 4)")
    p.add_argument("--lrp-sentences", type=int, default=100, metavar="N",
                   help="sentences of the subset the relevance is averaged over (default 100; one propagation each)")
    p.add_argument("--positional-threshold", type=float, default=0.9)
    p.add_argument("--syntactic-margin", type=float, default=0.10)
    common.add_progress_args(p)
    return p


def check_args(args):
    """Every input and output, before anything is loaded or written (ToolError otherwise)."""
    common.check_finite(args)
    common.check_checkpoint_file(args.path)
    common.check_data_dir(args.data)
    common.check_input_files(("--conllu", args.conllu))
    if args.max_sentences is not None and args.max_sentences < 1:
        raise common.ToolError("--max-sentences must be >= 1")
    if args.batch_size < 1:
        raise common.ToolError("--batch-size must be >= 1")
    if not 0 < args.positional_threshold <= 1:
        raise common.ToolError("--positional-threshold must be in (0, 1]")
    if args.lrp_sentences < 1:
        raise common.ToolError("--lrp-sentences must be >= 1")
    common.check_output_dir(args.output_dir, OUTPUTS + (("lrp.png",) if args.lrp else ()), args.overwrite,
                            data=args.data)


def read_parses(args):
    """The --conllu parses (None without), read before the model is loaded."""
    if args.conllu is None:
        return None
    try:
        return heads.read_conllu(args.conllu)
    except ValueError as e:
        raise common.ToolError(f"cannot read --conllu: {e}") from None


def load(args):
    """(model on its device, cfg, task, dataset of --gen-subset)."""
    common.import_plugins(args.user_dir)
    model, cfg, task = common.load_checkpoint(args.path, args.data, args.source_lang, args.target_lang)
    encoder = getattr(model, "encoder", None)
    if encoder is None or not hasattr(encoder, "layers") or not all(hasattr(x, "self_attn") for x in encoder.layers):
        raise common.ToolError(f"{args.path}: {type(model).__name__} has no fairseq transformer encoder layers")
    dataset = common.load_split(task, cfg, args.gen_subset)
    model.eval()
    if common.use_cuda(args.cpu):
        model.cuda()
    return model, cfg, task, dataset


def check_parses(args, parses, dataset, src_dict):
    """Every sentence of the subset must match its parse, before any work."""
    if parses is None:
        return
    if len(parses) != len(dataset):
        raise common.ToolError(f"--conllu has {len(parses)} sentences, subset '{args.gen_subset}' has {len(dataset)}")
    specials = heads.special_ids(src_dict)
    pieces = ([src_dict[t] for t in dataset.src[i].tolist() if t not in specials] for i in range(len(dataset)))
    try:
        heads.check_parses(parses, pieces, args.bpe_separator or None)
    except ValueError as e:
        raise common.ToolError(f"--conllu {e}") from None


def frequencies(args, task, cfg, src_dict) -> np.ndarray:
    """Token frequencies for the rare-word head (Voita et al. 2019, Sec. 5.3)."""
    if args.frequencies == "train":
        train = common.load_split(task, cfg, "train").src
        return heads.token_counts((train[i] for i in range(len(train))), len(src_dict))
    return np.array(src_dict.count, dtype=np.int64)


def analyse(args, model, cfg, task, dataset, parses, labels):
    """HeadStatistics of the first --max-sentences sentences that fit the model."""
    src_dict = task.source_dictionary
    n_use = len(dataset) if args.max_sentences is None else min(args.max_sentences, len(dataset))
    ids, _ = common.fitting_ids(task, model, dataset, range(n_use))
    logger.info(f"analysing {len(ids)} sentences of '{args.gen_subset}' ({len(dataset)} in all), "
                f"{len(labels)} encoder layers, heads per layer {[len(x) for x in labels]}")
    batches = common.length_sorted_batches(dataset, ids, args.batch_size)
    cuda = common.use_cuda(args.cpu)
    samples = (common.collate(dataset, b, cuda)
               for b in common.progress(batches, args, f"head analysis on '{args.gen_subset}'"))
    return heads.analyse_dataset(model, samples, src_dict, frequencies(args, task, cfg, src_dict),
                                 separator=args.bpe_separator or None, rare_min_rank=args.rare_min_rank,
                                 parses=parses, labels=labels)


def relevance(args, model, task, dataset):
    """LRP head relevance on the first --lrp-sentences sentences that fit the model (teacher forced)."""
    model = model.cpu().float()  # the propagation keeps [positions, out, in] impacts: CPU memory
    ids, _ = common.fitting_ids(task, model, dataset, range(min(args.lrp_sentences, len(dataset))))
    eos = task.target_dictionary.eos()
    pairs = ((dataset[i]["source"], torch.cat([torch.tensor([eos]), dataset[i]["target"][:-1]])) for i in ids)
    stats = lrp.head_relevance(model, common.progress(list(pairs), args, "LRP head relevance"))
    return stats.mean(), stats.sentences


def add_relevance(result, per_layer, sentences, labels):
    """The ``lrp`` value of every head row, and per layer the rank correlation with confidence and the most
    relevant head with its functions."""
    from scipy.stats import spearmanr

    layers = []
    for layer, values in enumerate(per_layer):
        rows = [h for h in result["heads"] if h["layer"] == layer]
        for h in rows:
            h["lrp"] = values[labels[layer].index(h["head"])]
        top = max(rows, key=lambda h: h["lrp"])
        conf = [h["confidence"] for h in rows]
        rho = spearmanr([h["lrp"] for h in rows], conf)[0] if len(rows) > 2 and None not in conf else None
        layers.append({"layer": layer, "spearman_confidence": None if rho != rho else rho, "top_head": top["head"],
                       "top_share": top["lrp"], "top_confidence": top["confidence"],
                       "top_is_most_confident": top["confidence"] == max(c for c in conf if c is not None),
                       "top_functions": heads.function_tags(top)})
    result["lrp"] = {"sentences": sentences, "layers": layers}


def main(argv=None):
    args = get_parser().parse_args(argv)
    try:
        common.check_device(args)
        check_args(args)
        parses = read_parses(args)
        model, cfg, task, dataset = load(args)
        if args.lrp:
            try:
                lrp.check_supported(model)
            except lrp.UnsupportedModel as e:
                raise common.ToolError(f"--lrp cannot read {args.path}: {e}") from None
        check_parses(args, parses, dataset, task.source_dictionary)
        labels = heads.layer_head_labels(model, getattr(cfg, "model", None))
        n_cols = heads.head_columns(labels, getattr(getattr(cfg, "model", None), "encoder_attention_heads", None))
        stats = analyse(args, model, cfg, task, dataset, parses, labels)
        if args.lrp:
            try:
                per_layer, lrp_sentences = relevance(args, model, task, dataset)
            except lrp.UnsupportedModel as e:  # the re-computed forward pass differs from the model's
                raise common.ToolError(f"--lrp cannot read {args.path}: {e}") from None
    except common.ToolError as e:
        common.fail(PROG, str(e))
    result = heads.summarise(stats, labels, positional_threshold=args.positional_threshold,
                             syntactic_margin=args.syntactic_margin, rare_threshold=args.rare_threshold,
                             rare_margin=args.rare_margin)
    result.update({
        "checkpoint": os.path.abspath(args.path), "data": os.path.abspath(args.data), "subset": args.gen_subset,
        "sentences": stats.sentences, "head_columns": n_cols, "head_ids": labels,
        "settings": {"positional_threshold": args.positional_threshold, "syntactic_margin": args.syntactic_margin,
                     "rare_min_rank": args.rare_min_rank, "rare_threshold": args.rare_threshold,
                     "rare_margin": args.rare_margin, "frequencies": args.frequencies,
                     "bpe_separator": args.bpe_separator, "conllu": args.conllu},
    })
    if args.lrp:
        add_relevance(result, per_layer, lrp_sentences, labels)
    write_outputs(result, labels, n_cols, args.output_dir)
    print_summary(result)
    return result


def write_outputs(result, labels, n_cols, out_dir):
    """heads.tsv, heads.json, confidence.png and function.png in ``out_dir`` (created if needed)."""
    from ..analysis.plotting import head_function_maps

    os.makedirs(out_dir, exist_ok=True)
    rel_cols = list(result["baselines"])
    cols = ["layer", "head", "confidence", "top_relative_position", "top_relative_position_share", "positional",
            "rare_acc", "rare2_acc", "rare"] + rel_cols + (["syntactic"] if rel_cols else []) + \
        (["lrp"] if "lrp" in result else [])
    rows = [[",".join(h[c]) if c == "syntactic" else h[c] for c in cols] for h in result["heads"]]
    common.write_tsv(os.path.join(out_dir, "heads.tsv"), cols, rows, none="None")
    common.write_json(os.path.join(out_dir, "heads.json"), result)
    conf, n_func, text = heads.function_matrices(result["heads"], labels, n_cols)
    head_function_maps(conf, n_func, text, os.path.join(out_dir, "confidence.png"),
                       os.path.join(out_dir, "function.png"))
    if "lrp" in result:
        from ..analysis.plotting import head_heatmap

        values = heads.heads_matrix([[h["lrp"] for h in result["heads"] if h["layer"] == l] for l in range(len(labels))],
                                    labels, n_cols)
        head_heatmap(values, os.path.join(out_dir, "lrp.png"),
                     "Encoder self-attention: relevance by LRP (Voita et al. 2019, Sec. 4)",
                     "share of the layer's head relevance", cell_text=text)


def print_summary(result):
    fmt = common.format_value
    print(f"Encoder self-attention heads of {result['checkpoint']} on '{result['subset']}' "
          f"({result['sentences']} sentences; rare-word statistics on {result['rare']['sentences']})")
    print(f"{'layer':>5} {'head':>4} {'conf':>6} {'pos (share)':>13} {'rare':>6} {'rare2':>6}  functions")
    for h in result["heads"]:
        pos = "-" if h["top_relative_position"] is None else f"{h['top_relative_position']:+d} ({h['top_relative_position_share']:.2f})"
        funcs = (["positional"] if h["positional"] else []) + (["rare"] if h["rare"] else []) + h["syntactic"]
        print(f"{h['layer']:>5} {h['head']:>4} {fmt(h['confidence']):>6.6} {pos:>13} {fmt(h['rare_acc']):>6.6} "
              f"{fmt(h['rare2_acc']):>6.6}  {', '.join(funcs) or '-'}")
    if "lrp" in result:
        print(f"LRP on {result['lrp']['sentences']} sentences, per layer: " + "; ".join(
            f"layer {x['layer']}: most relevant head {x['top_head']} ({fmt(x['top_share'])} of the relevance, "
            f"confidence {fmt(x['top_confidence'])}{', the most confident' if x['top_is_most_confident'] else ''}; "
            f"functions {','.join(x['top_functions']) or '-'}), Spearman with confidence {fmt(x['spearman_confidence'])}"
            for x in result["lrp"]["layers"]))
    if result["baselines"]:
        print("syntactic baselines (most frequent relative position): " + ", ".join(
            f"{k} {fmt(v['accuracy'])}@{v['offset']} (n={v['instances']})" for k, v in result["baselines"].items()))


def cli_main():
    common.setup_logging()
    main()


if __name__ == "__main__":
    cli_main()
