"""Encoder-decoder attention of a translation model: entropy, confidence, word alignment (AER, SAER),
cumulative coverage per decoder layer, and the L0Drop attention analyses of paper 000.

    fairseq-sparse-attention DATA --path CKPT --output-dir DIR [--gen-subset test]
        [--gold ALIGN [--gold-possible ALIGN] [--gold-index-base 0]] [--align-layers all]
        [--bpe-separator @@] [--l0drop | --no-l0drop] [--gates-from L0DROP_CKPT]
        [--max-sentences N] [--batch-size 32] [--cpu]

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
  to the source word of largest weight (paper 004 Sec. 3.2). AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|)
  (Och & Ney 2003); SAER of paper 002 Eq. (23) on the same word-level soft matrix. Corpus-level:
  counts are summed over sentences before dividing. The ``--align-layers`` row does the same on the
  mean of the chosen layers' head-averaged attention; its links go to alignment.txt (Pharaoh);
* ``coverage``: cumulative coverage ratio C_{<=i} = |A_1 ∪ ... ∪ A_i| / N of paper 004 Eq. (2), A_i the
  source words linked at layer i, N the number of source words of the corpus; ``coverage_layer``:
  |A_i| / N of the layer alone.

L0Drop (``--l0drop``: default on for L0Drop checkpoints or with ``--gates-from``; source tokens,
EOS excluded, classified kept (g_hat != 0) or pruned (g_hat = 0)):

* paper 000 Figs. 1/7: the attention each source token receives, averaged over the heads and layers
  of the encoder-decoder attention and summed over the target words (final EOS row excluded);
  histograms of all / kept / pruned tokens, mean and share below 0.6;
* paper 000 Fig. 8: the entropy (nats) of the last encoder self-attention layer's head-averaged row
  of each source token (its distribution over all source positions, EOS included), kept vs pruned.
  ``--gates-from`` classifies this model's tokens with another L0Drop model's gates, as the paper
  does for its baseline Transformer.

The L0Drop statistics are at token level (the gate is per token); with BPE a "word" there is a piece.

Gold alignments (``--gold``): Pharaoh lines ``i-j`` (sure) / ``i?j`` (possible), source word i,
target word j, 0-based (``--gold-index-base 1`` for 1-based files), one line per sentence of the
subset in order; or sure links in ``--gold`` and possible ones in ``--gold-possible``
(see :mod:`fairseq_sparse.alignment`). The gold is checked against the binarised subset (sentence
count, word indices after subword merging) before anything is computed or written.

Outputs in ``--output-dir``: layers.tsv, heads.tsv, attention.json, alignment.txt, layers.png
(AER/SAER, cumulative coverage, entropy per layer), entropy_heads.png, max_weight_heads.png; with
L0Drop also l0drop_tokens.tsv, l0drop_attention.png and l0drop_entropy.png. A summary goes to stdout.
"""
import argparse
import json
import logging
import math
import os
import sys
from typing import List, Optional, Sequence

import numpy as np
import torch

from fairseq_sparse import alignment as al
from fairseq_sparse.cli import common
from fairseq_sparse.modules.attention_capture import HeadAttentionRecorder

logger = logging.getLogger("fairseq_sparse.attention_analysis")

PROG = "fairseq-sparse-attention"
#: paper 000 Figs. 1 and 7 report the share of source words receiving less than this much attention
LOW_ATTENTION = 0.6


# ----------------------------------------------------------------------------------------------
# capturing attention


#: the recorder shared with fairseq-sparse-head-analysis
AttentionRecorder = HeadAttentionRecorder


def encdec_head_ids(model) -> List[List[int]]:
    """Original head ids of each decoder layer's encoder-decoder attention ([] for a headless layer)."""
    from fairseq_sparse.modules.head_gates import HeadlessAttention, head_ids

    out = []
    for layer in model.decoder.layers:
        mha = getattr(layer, "encoder_attn", None)
        out.append([] if mha is None or isinstance(mha, HeadlessAttention) else head_ids(mha))
    return out


# ----------------------------------------------------------------------------------------------
# accumulating statistics


class AttentionStats:
    """Sums over the corpus, per decoder layer; ``n_heads[l]`` heads in layer l (0: no heads)."""

    def __init__(self, n_heads: Sequence[int], with_gold: bool, l0drop: bool):
        self.n_heads = list(n_heads)
        L = len(self.n_heads)
        self.layers = L
        self.sentences = 0
        self.tgt_tokens = np.zeros(L)
        self.ent_sum = np.zeros(L)
        self.ent_heads_sum = np.zeros(L)
        self.max_sum = np.zeros(L)
        self.head_ent_sum = [np.zeros(h) for h in self.n_heads]
        self.head_max_sum = [np.zeros(h) for h in self.n_heads]
        self.with_gold = with_gold
        self.aer = np.zeros((L, 4))
        self.saer = np.zeros((L, 4))
        self.aer_comb = np.zeros(4)
        self.saer_comb = np.zeros(4)
        self.src_words = 0
        self.covered_cum = np.zeros(L)
        self.covered_layer = np.zeros(L)
        self.hyp_lines = {}  # sentence id -> Pharaoh line of the --align-layers alignment
        self.l0drop = l0drop
        self.tokens = []  # (sentence id, position, token, gate, summed attention, encoder entropy)


def analyse_sentence(stats: AttentionStats, sid: int, layer_attn: Sequence[Optional[np.ndarray]],
                     src_pieces: Sequence[str], tgt_pieces: Sequence[str], src_special: np.ndarray,
                     tgt_special: np.ndarray, separator: Optional[str], align_layers: Sequence[int],
                     gold=None, gates: Optional[np.ndarray] = None, enc_attn: Optional[np.ndarray] = None):
    """Add one sentence. ``layer_attn[l]``: [H, T, S] over its T target tokens (final EOS included)
    and S source tokens (EOS included), None for a layer without heads; ``gold``: (S, P) or None;
    ``gates``: [S] L0Drop gates; ``enc_attn``: [H, S, S] last encoder self-attention."""
    stats.sentences += 1
    n_src_words = len(set(al.word_ids([p for p, s in zip(src_pieces, src_special) if not s], separator)))
    stats.src_words += n_src_words
    seen = set()
    for l, attn in enumerate(layer_attn):
        links = None
        if attn is not None:
            T = attn.shape[1]
            stats.tgt_tokens[l] += T
            mean = attn.mean(0)
            stats.ent_sum[l] += al.entropy(mean).sum()
            stats.max_sum[l] += mean.max(-1).sum()
            h_ent = al.entropy(attn).sum(-1)  # [H]
            stats.head_ent_sum[l] += h_ent
            stats.ent_heads_sum[l] += h_ent.mean()
            stats.head_max_sum[l] += attn.max(-1).sum(-1)
            m = al.word_matrix(mean, src_pieces, tgt_pieces, src_special, tgt_special, separator)
            links = al.argmax_links(m)
            if gold is not None:
                stats.aer[l] += al.aer_counts(links, *gold)
                stats.saer[l] += al.saer_counts(m, *gold)
        covered = al.covered_source_words(links or ())
        stats.covered_layer[l] += len(covered)
        seen |= covered
        stats.covered_cum[l] += len(seen)

    comb = al.layer_average(layer_attn, align_layers)
    if comb is not None:
        m = al.word_matrix(comb, src_pieces, tgt_pieces, src_special, tgt_special, separator)
        links = al.argmax_links(m)
        stats.hyp_lines[sid] = al.format_links(links)
        if gold is not None:
            stats.aer_comb += al.aer_counts(links, *gold)
            stats.saer_comb += al.saer_counts(m, *gold)
    else:
        stats.hyp_lines[sid] = ""

    if gates is not None:
        all_layers = al.layer_average(layer_attn)  # [T, S], mean over heads and layers
        keep_rows = ~np.asarray(tgt_special, dtype=bool)
        received = all_layers[keep_rows].sum(0) if all_layers is not None else np.full(len(src_pieces), np.nan)
        ent = al.entropy(enc_attn.mean(0)) if enc_attn is not None else np.full(len(src_pieces), np.nan)
        for pos, piece in enumerate(src_pieces):
            if src_special[pos]:
                continue
            stats.tokens.append((sid, pos, piece, float(gates[pos]), float(received[pos]), float(ent[pos])))


# ----------------------------------------------------------------------------------------------
# results


def _ratio(num, den):
    return float(num / den) if den else math.nan


def summarize(stats: AttentionStats, head_labels, align_layers, bins: int = 30) -> dict:
    layers = []
    for l in range(stats.layers):
        has = stats.n_heads[l] > 0 and stats.tgt_tokens[l] > 0
        n = stats.tgt_tokens[l]
        row = {
            "layer": l, "heads": stats.n_heads[l],
            "entropy": _ratio(stats.ent_sum[l], n) if has else math.nan,
            "entropy_heads": _ratio(stats.ent_heads_sum[l], n) if has else math.nan,
            "max_weight": _ratio(stats.max_sum[l], n) if has else math.nan,
            "aer": al.aer_from_counts(stats.aer[l]) if stats.with_gold and has else math.nan,
            "saer": al.aer_from_counts(stats.saer[l]) if stats.with_gold and has else math.nan,
            "coverage": _ratio(stats.covered_cum[l], stats.src_words),
            "coverage_layer": _ratio(stats.covered_layer[l], stats.src_words),
        }
        layers.append(row)
    heads = []
    for l in range(stats.layers):
        for k, h in enumerate(head_labels[l]):
            n = stats.tgt_tokens[l]
            heads.append({"layer": l, "head": h, "entropy": _ratio(stats.head_ent_sum[l][k], n),
                          "max_weight": _ratio(stats.head_max_sum[l][k], n)})
    combined = {
        "layers": list(align_layers),
        "aer": al.aer_from_counts(stats.aer_comb) if stats.with_gold else math.nan,
        "saer": al.aer_from_counts(stats.saer_comb) if stats.with_gold else math.nan,
    }
    result = {"layers": layers, "heads": heads, "align": combined, "sentences": stats.sentences,
              "target_tokens": int(stats.tgt_tokens.max()) if stats.layers else 0, "source_words": stats.src_words}
    if stats.l0drop:
        result["l0drop"] = l0drop_summary(stats.tokens, bins)
    return result


def _distribution(values: np.ndarray, edges: np.ndarray, low: Optional[float] = None) -> dict:
    values = values[np.isfinite(values)]
    out = {"count": int(values.size),
           "mean": float(values.mean()) if values.size else math.nan,
           "median": float(np.median(values)) if values.size else math.nan,
           "histogram": np.histogram(values, bins=edges)[0].tolist()}
    if low is not None:
        out[f"share_below_{low}"] = float((values < low).mean()) if values.size else math.nan
    return out


def l0drop_summary(tokens, bins: int = 30) -> dict:
    gates = np.array([t[3] for t in tokens], dtype=float)
    received = np.array([t[4] for t in tokens], dtype=float)
    ent = np.array([t[5] for t in tokens], dtype=float)
    pruned = gates == 0
    hi = float(np.nanmax(received)) if received.size and np.isfinite(received).any() else 1.0
    att_edges = np.linspace(0.0, max(hi, LOW_ATTENTION) * 1.0001, bins + 1)
    ehi = float(np.nanmax(ent)) if ent.size and np.isfinite(ent).any() else 1.0
    ent_edges = np.linspace(0.0, max(ehi, 1e-6) * 1.0001, bins + 1)
    return {
        "source_tokens": int(gates.size), "pruned": int(pruned.sum()), "kept": int((~pruned).sum()),
        "sparsity": _ratio(pruned.sum(), gates.size),
        "summed_attention": {
            "bin_edges": att_edges.tolist(),
            "all": _distribution(received, att_edges, LOW_ATTENTION),
            "kept": _distribution(received[~pruned], att_edges, LOW_ATTENTION),
            "pruned": _distribution(received[pruned], att_edges, LOW_ATTENTION),
        },
        "encoder_entropy": {
            "bin_edges": ent_edges.tolist(),
            "all": _distribution(ent, ent_edges),
            "kept": _distribution(ent[~pruned], ent_edges),
            "pruned": _distribution(ent[pruned], ent_edges),
        },
    }


# ----------------------------------------------------------------------------------------------
# console tool


def parse_layers(spec: str, n_layers: int) -> List[int]:
    """``all``, ``last`` or comma-separated 0-based layer indices (negative ones count from the top)."""
    return common.parse_layers(spec, n_layers, option="--align-layers")


def get_parser():
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0],
        epilog="See the module docstring (python -m fairseq_sparse.cli.attention_analysis --help) and "
               "fairseq_sparse/alignment.py for the definitions.")
    p.add_argument("data", metavar="DATA", help="fairseq data-bin directory (dictionaries and the subset)")
    p.add_argument("--path", required=True, metavar="CKPT", help="fairseq encoder-decoder transformer checkpoint")
    p.add_argument("--user-dir", default=None, help="extra fairseq plugin to import (fairseq_sparse is always imported)")
    p.add_argument("--gen-subset", default="test", help="data split to analyse (default: test)")
    p.add_argument("--source-lang", default=None)
    p.add_argument("--target-lang", default=None)
    p.add_argument("--output-dir", required=True, metavar="DIR", help="TSV, JSON, alignment and PNG files go here")
    p.add_argument("--max-sentences", type=int, default=None, metavar="N", help="only the first N sentences")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--cpu", action="store_true", help="do not use CUDA even if available")
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
                   help="L0Drop analyses (paper 000 Figs. 1/7/8); default: on for L0Drop checkpoints and with "
                        "--gates-from")
    p.add_argument("--gates-from", default=None, metavar="CKPT",
                   help="classify source tokens kept/pruned with this L0Drop checkpoint's gates (e.g. to analyse "
                        "the baseline transformer, as paper 000 Fig. 8 does)")
    p.add_argument("--hist-bins", type=int, default=30, help="bins of the L0Drop histograms")
    p.add_argument("--no-progress-bar", action="store_true")
    p.add_argument("--log-format", default=None, choices=("json", "none", "simple", "tqdm"))
    p.add_argument("--log-interval", type=int, default=100)
    return p


def _fail(msg):
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _load(path, data, args, task=None):
    try:
        return common.load_checkpoint(path, data, args.source_lang, args.target_lang, task=task)
    except ValueError as e:
        _fail(str(e))


def _words(pieces, special, separator):
    return len(set(al.word_ids([p for p, s in zip(pieces, special) if not s], separator)))


def main(argv=None):
    args = get_parser().parse_args(argv)
    # validate everything that can be validated before loading anything
    if not os.path.isfile(args.path):
        _fail(f"checkpoint not found: {args.path}")
    if not os.path.isdir(args.data):
        _fail(f"data directory not found: {args.data}")
    for opt, f in (("--gold", args.gold), ("--gold-possible", args.gold_possible), ("--gates-from", args.gates_from)):
        if f is not None and not os.path.isfile(f):
            _fail(f"{opt} file not found: {f}")
    if args.gold_possible is not None and args.gold is None:
        _fail("--gold-possible needs --gold (the sure links)")
    if args.max_sentences is not None and args.max_sentences < 1:
        _fail("--max-sentences must be >= 1")
    if args.batch_size < 1 or args.hist_bins < 1:
        _fail("--batch-size and --hist-bins must be >= 1")
    if args.l0drop is False and args.gates_from:
        _fail("--gates-from makes no sense with --no-l0drop")
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        _fail(f"--output-dir exists and is not a directory: {args.output_dir}")
    gold = None
    if args.gold is not None:
        try:
            gold = al.read_gold_alignments(args.gold, args.gold_possible, args.gold_index_base)
        except (al.GoldAlignmentError, UnicodeDecodeError) as e:
            _fail(f"cannot read the gold alignment: {e}")

    from fairseq import utils
    from fairseq.logging import progress_bar

    common.import_plugins(args.user_dir)
    model, cfg, task = _load(args.path, args.data, args)
    decoder = getattr(model, "decoder", None)
    if getattr(model, "encoder", None) is None or decoder is None or not hasattr(decoder, "layers"):
        _fail(f"{args.path}: {type(model).__name__} is not a fairseq encoder-decoder transformer")
    n_layers = len(decoder.layers)
    try:
        align_layers = parse_layers(args.align_layers, n_layers)
    except ValueError as e:
        _fail(str(e))

    gate_model = None
    own_gates = hasattr(model.encoder, "l0drop")
    if args.gates_from:
        gate_model, _, _ = _load(args.gates_from, args.data, args, task=task)
        if not hasattr(gate_model.encoder, "l0drop"):
            _fail(f"--gates-from {args.gates_from} has no L0Drop gates")
        if list(gate_model.encoder.dictionary.symbols) != list(task.source_dictionary.symbols):
            _fail(f"--gates-from {args.gates_from} has another source dictionary than {args.path}")
    do_l0drop = args.l0drop if args.l0drop is not None else (own_gates or gate_model is not None)
    if do_l0drop and not own_gates and gate_model is None:
        _fail(f"--l0drop: {args.path} has no L0Drop gates; pass --gates-from an L0Drop checkpoint")

    try:
        task.load_dataset(args.gen_subset, task_cfg=cfg.task)
    except Exception as e:
        _fail(f"cannot load subset '{args.gen_subset}' from {args.data}: {type(e).__name__}: {e}")
    dataset = task.dataset(args.gen_subset)
    if getattr(dataset, "tgt", None) is None:
        _fail(f"subset '{args.gen_subset}' has no target side: the analysis needs reference translations")
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    src_specials = {src_dict.eos(), src_dict.bos(), src_dict.pad()}
    tgt_specials = {tgt_dict.eos(), tgt_dict.bos(), tgt_dict.pad()}
    separator = args.bpe_separator or None
    n_total = len(dataset)

    if gold is not None:  # every gold sentence must fit its sentence pair, before any computation
        src_words, tgt_words = [], []
        for i in range(n_total):
            s = [src_dict[t] for t in dataset.src[i].tolist()]
            t = [tgt_dict[t] for t in dataset.tgt[i].tolist()]
            src_words.append(_words(s, [x in src_specials for x in dataset.src[i].tolist()], separator))
            tgt_words.append(_words(t, [x in tgt_specials for x in dataset.tgt[i].tolist()], separator))
        try:
            al.check_gold_alignments(gold, src_words, tgt_words)
        except al.GoldAlignmentError as e:
            msg = f"{args.gold} does not match subset '{args.gen_subset}' of {args.data}: {e}"
            k = e.sentence
            if k is not None and k < n_total:
                src_text = src_dict.string(dataset.src[k])[:200]
                tgt_text = tgt_dict.string(dataset.tgt[k])[:200]
                msg += f"; source {src_text!r}, target {tgt_text!r}"
            _fail(msg)

    use_cuda = torch.cuda.is_available() and not args.cpu
    model.eval()
    if use_cuda:
        model.cuda()
    if own_gates:
        model.encoder.pruned_decoding = False  # attention over every source position
    if gate_model is not None:
        gate_model.eval()
        gate_model.encoder.pruned_decoding = False
        if use_cuda:
            gate_model.cuda()

    n_use = n_total if args.max_sentences is None else min(args.max_sentences, n_total)
    ids = list(range(n_use))
    max_pos = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    if max_pos is not None:
        ms, mt = max_pos if isinstance(max_pos, tuple) else (max_pos, max_pos)
        bad = {i for i in ids if (ms is not None and dataset.src_sizes[i] > ms)
               or (mt is not None and dataset.tgt_sizes[i] > mt)}
        if bad:
            logger.warning(f"skipping {len(bad)} sentences longer than the model's positions {max_pos}; they "
                           f"get an empty line in alignment.txt and do not count")
            ids = [i for i in ids if i not in bad]

    head_labels = encdec_head_ids(model)
    stats = AttentionStats([len(h) for h in head_labels], gold is not None, do_l0drop)
    os.makedirs(args.output_dir, exist_ok=True)
    logger.info(f"analysing {len(ids)} sentences of '{args.gen_subset}' ({n_total} in all), {n_layers} decoder "
                f"layers, heads per layer {[len(h) for h in head_labels]}, align layers {align_layers}, "
                f"gold {'yes' if gold is not None else 'no'}, L0Drop analysis {'on' if do_l0drop else 'off'}")

    ids = sorted(ids, key=lambda i: (-int(dataset.src_sizes[i]), i))  # similar lengths together
    batches = [ids[k:k + args.batch_size] for k in range(0, len(ids), args.batch_size)]
    itr = progress_bar.progress_bar(batches, log_format=args.log_format, log_interval=args.log_interval,
                                    prefix=f"attention analysis on '{args.gen_subset}'",
                                    default_log_format="none" if args.no_progress_bar else "tqdm")
    dec_modules = [getattr(layer, "encoder_attn", None) for layer in decoder.layers]
    enc_last = model.encoder.layers[-1].self_attn if do_l0drop else None
    src_pad, tgt_pad = src_dict.pad(), tgt_dict.pad()
    with torch.no_grad(), AttentionRecorder(dec_modules + [enc_last]) as rec:
        for batch_ids in itr:
            sample = dataset.collater([dataset[i] for i in batch_ids])
            if use_cuda:
                sample = utils.move_to_cuda(sample)
            net = sample["net_input"]
            rec.reset()
            enc_out = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
            model.decoder(net["prev_output_tokens"], encoder_out=enc_out, src_lengths=net["src_lengths"])
            gates = None
            if do_l0drop:
                g = enc_out["l0drop_gates"][0] if own_gates and gate_model is None else \
                    gate_model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])["l0drop_gates"][0]
                gates = g.float().cpu().numpy()
            weights = [None if w is None else w.numpy() for w in rec.weights]
            dec_w, enc_w = weights[:n_layers], weights[n_layers]
            for l, w in enumerate(dec_w):
                if w is not None and w.shape[0] != len(head_labels[l]):
                    raise RuntimeError(f"decoder layer {l} returned {w.shape[0]} heads, expected {len(head_labels[l])}")
            src, tgt = net["src_tokens"].cpu(), sample["target"].cpu()
            for row, sid in enumerate(sample["id"].tolist()):
                s_pos = src[row].ne(src_pad).nonzero().flatten().numpy()
                t_pos = tgt[row].ne(tgt_pad).nonzero().flatten().numpy()
                s_tok, t_tok = src[row, s_pos].tolist(), tgt[row, t_pos].tolist()
                layer_attn = [None if w is None else w[:, row][:, t_pos][:, :, s_pos] for w in dec_w]
                analyse_sentence(
                    stats, sid, layer_attn, [src_dict[t] for t in s_tok], [tgt_dict[t] for t in t_tok],
                    np.array([t in src_specials for t in s_tok]), np.array([t in tgt_specials for t in t_tok]),
                    separator, align_layers, gold=gold[sid] if gold is not None else None,
                    gates=None if gates is None else gates[row, s_pos],
                    enc_attn=None if enc_w is None else enc_w[:, row][:, s_pos][:, :, s_pos])

    result = summarize(stats, head_labels, align_layers, args.hist_bins)
    result.update({
        "checkpoint": os.path.abspath(args.path), "data": os.path.abspath(args.data), "subset": args.gen_subset,
        "settings": {"gold": args.gold, "gold_possible": args.gold_possible, "gold_index_base": args.gold_index_base,
                     "align_layers": align_layers, "bpe_separator": args.bpe_separator,
                     "gates_from": args.gates_from, "entropy_unit": "nats"},
    })
    write_outputs(result, stats, head_labels, n_use, args.output_dir)
    print_summary(result)
    return result


# ----------------------------------------------------------------------------------------------
# outputs


def _fmt(v):
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4f}"
    return str(v)


def _jsonable(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return _jsonable(x.item())
    return x


LAYER_COLS = ["layer", "heads", "entropy", "entropy_heads", "max_weight", "aer", "saer", "coverage", "coverage_layer"]


def write_outputs(result, stats, head_labels, n_use, out_dir):
    with open(os.path.join(out_dir, "layers.tsv"), "w") as f:
        f.write("\t".join(LAYER_COLS) + "\n")
        for r in result["layers"]:
            f.write("\t".join(_fmt(r[c]) for c in LAYER_COLS) + "\n")
        a = result["align"]
        f.write("\t".join(["align:" + ",".join(map(str, a["layers"]))] + ["nan"] * 4
                          + [_fmt(a["aer"]), _fmt(a["saer"]), "nan", "nan"]) + "\n")
    with open(os.path.join(out_dir, "heads.tsv"), "w") as f:
        f.write("layer\thead\tentropy\tmax_weight\n")
        for h in result["heads"]:
            f.write(f"{h['layer']}\t{h['head']}\t{_fmt(h['entropy'])}\t{_fmt(h['max_weight'])}\n")
    with open(os.path.join(out_dir, "alignment.txt"), "w") as f:
        for sid in range(n_use):
            f.write(stats.hyp_lines.get(sid, "") + "\n")
    with open(os.path.join(out_dir, "attention.json"), "w") as f:
        json.dump(_jsonable(result), f, indent=1)
    plot_layers(result, os.path.join(out_dir, "layers.png"))

    from fairseq_sparse.analysis.plotting import head_heatmap

    n_cols = max([max(h) + 1 for h in head_labels if h] + [1])
    for key, title, label in (("entropy", "Encoder-decoder attention: mean entropy per target token", "entropy (nats)"),
                              ("max_weight", "Encoder-decoder attention: mean max weight per target token",
                               "mean max weight")):
        mat = np.full((len(head_labels), n_cols), np.nan)
        for h in result["heads"]:
            mat[h["layer"], h["head"]] = h[key]
        head_heatmap(mat, os.path.join(out_dir, f"{key}_heads.png"), title, label,
                     vmin=0.0, vmax=1.0 if key == "max_weight" else None,
                     row_labels=[f"dec layer {l}" for l in range(len(head_labels))])
    if stats.l0drop:
        with open(os.path.join(out_dir, "l0drop_tokens.tsv"), "w") as f:
            f.write("id\tposition\ttoken\tgate\tpruned\tsummed_attention\tencoder_entropy\n")
            for sid, pos, tok, g, rec, ent in sorted(stats.tokens, key=lambda t: (t[0], t[1])):
                f.write(f"{sid}\t{pos}\t{tok}\t{g:.6g}\t{int(g == 0)}\t{rec:.6g}\t{ent:.6g}\n")
        plot_l0drop(result["l0drop"], stats.tokens, out_dir)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_layers(result, path):
    """Paper 004 Fig. 4 style: AER/SAER and cumulative coverage per decoder layer, plus entropy."""
    plt = _plt()
    layers = [r["layer"] for r in result["layers"]]
    has_gold = any(not math.isnan(r["aer"]) for r in result["layers"])
    panels = (["aer"] if has_gold else []) + ["coverage", "entropy"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    axes = np.atleast_1d(axes)
    for ax, panel in zip(axes, panels):
        if panel == "aer":
            ax.plot(layers, [r["aer"] for r in result["layers"]], "o-", label="AER")
            ax.plot(layers, [r["saer"] for r in result["layers"]], "s--", label="SAER")
            ax.set_ylabel("error rate (lower is better)")
            ax.set_title("(a) alignment error per layer")
            ax.legend(fontsize=8)
        elif panel == "coverage":
            ax.plot(layers, [r["coverage"] for r in result["layers"]], "o-", label="cumulative C<=i")
            ax.plot(layers, [r["coverage_layer"] for r in result["layers"]], "s--", label="layer alone |A_i|/N")
            ax.set_ylim(0, 1.02)
            ax.set_ylabel("share of source words")
            ax.set_title("cumulative coverage (paper 004 Eq. 2)")
            ax.legend(fontsize=8)
        else:
            ax.plot(layers, [r["entropy"] for r in result["layers"]], "o-", label="head-averaged")
            ax.plot(layers, [r["entropy_heads"] for r in result["layers"]], "s--", label="mean over heads")
            ax.set_ylabel("entropy per target token (nats)")
            ax.set_title("attention entropy")
            ax.legend(fontsize=8)
        ax.set_xlabel("decoder layer")
        ax.set_xticks(layers)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_l0drop(summary, tokens, out_dir):
    """Paper 000 Figs. 1/7 (summed attention per source token) and Fig. 8 (encoder entropy), kept vs pruned."""
    plt = _plt()
    gates = np.array([t[3] for t in tokens], dtype=float)
    pruned = gates == 0
    for key, col, fname, xlabel, title in (
            ("summed_attention", 4, "l0drop_attention.png", "attention weight summed over target words",
             "Summed encoder-decoder attention per source token (paper 000 Figs. 1/7)"),
            ("encoder_entropy", 5, "l0drop_entropy.png", "entropy of the last encoder self-attention row (nats)",
             "Encoder self-attention entropy, kept vs pruned (paper 000 Fig. 8)")):
        values = np.array([t[col] for t in tokens], dtype=float)
        edges = np.array(summary[key]["bin_edges"])
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        for mask, name, colour in ((~pruned, "kept", "tab:blue"), (pruned, "pruned", "tab:red")):
            v = values[mask]
            v = v[np.isfinite(v)]
            d = summary[key][name]
            label = f"{name} (n={d['count']}, mean {d['mean']:.2f}" + (
                f", {100 * d[f'share_below_{LOW_ATTENTION}']:.1f}% < {LOW_ATTENTION})" if key == "summed_attention"
                and d["count"] else ")")
            ax.hist(v, bins=edges, alpha=0.55, color=colour, label=label)
            if v.size:
                ax.axvline(float(v.mean()), color=colour, linestyle="--", linewidth=1)
        if key == "summed_attention":
            ax.axvline(LOW_ATTENTION, color="0.4", linestyle=":", linewidth=1)
            d = summary[key]["all"]
            title += f"\nall: mean {d['mean']:.2f}, {100 * d[f'share_below_{LOW_ATTENTION}']:.1f}% below {LOW_ATTENTION}" \
                if d["count"] else ""
        ax.set_xlabel(xlabel)
        ax.set_ylabel("source tokens")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, fname), dpi=110)
        plt.close(fig)


def print_summary(result):
    print(f"Encoder-decoder attention of {result['checkpoint']} on '{result['subset']}' ({result['sentences']} "
          f"sentences, {result['source_words']} source words; teacher-forced on the references)")
    print(f"{'layer':>7} {'heads':>5} {'entropy':>8} {'ent/head':>8} {'maxw':>6} {'AER':>6} {'SAER':>6} {'C<=i':>6} {'|Ai|/N':>6}")
    for r in result["layers"]:
        print(f"{r['layer']:>7} {r['heads']:>5} {_fmt(r['entropy']):>8} {_fmt(r['entropy_heads']):>8} "
              f"{_fmt(r['max_weight']):>6.6} {_fmt(r['aer']):>6.6} {_fmt(r['saer']):>6.6} "
              f"{_fmt(r['coverage']):>6.6} {_fmt(r['coverage_layer']):>6.6}")
    a = result["align"]
    print(f"alignment from layers {','.join(map(str, a['layers']))} (head- and layer-averaged): "
          f"AER {_fmt(a['aer'])}, SAER {_fmt(a['saer'])}")
    if "l0drop" in result:
        d = result["l0drop"]
        sa, ee = d["summed_attention"], d["encoder_entropy"]
        key = f"share_below_{LOW_ATTENTION}"
        print(f"L0Drop: {d['pruned']} of {d['source_tokens']} source tokens pruned ({_fmt(d['sparsity'])})")
        for name in ("all", "kept", "pruned"):
            print(f"  {name:>6}: summed attention mean {_fmt(sa[name]['mean'])}, below {LOW_ATTENTION}: "
                  f"{_fmt(sa[name][key])}; last encoder self-attention entropy mean {_fmt(ee[name]['mean'])}")


def cli_main():
    common.setup_logging()
    main()


if __name__ == "__main__":
    cli_main()
