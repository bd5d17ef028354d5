"""Every figure of the analysis tools; the one module that chooses matplotlib's backend (Agg: files only).

Heat maps of per-head values (layers x heads), as in Voita et al. (2019) Figures 1 and 2, used by the head
tools (confidence and function of heads, head importance, retained heads)::

    head_heatmap(values, "confidence.png", "Encoder self-attention", "confidence")

``values`` is a [layers x heads] array; ``np.nan`` marks a head that does not exist (a physically
pruned model has fewer heads in some layers) and is drawn as a blank, hatched cell.
"""
import logging
import math
import os
import textwrap
from typing import Optional, Sequence

# importing fairseq 0.12 sets the root logger to DEBUG (fairseq/models/wav2vec/wav2vec2_classification.py calls
# logging.basicConfig(level=DEBUG)), and matplotlib then prints hundreds of DEBUG lines (its import, its font manager)
# in any script that plots after it: matplotlib's logger gets INFO unless somebody gave it a level of its own
if logging.getLogger("matplotlib").level == logging.NOTSET:
    logging.getLogger("matplotlib").setLevel(logging.INFO)

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only, no display; must precede the pyplot import
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def pyplot():
    """matplotlib.pyplot with the Agg backend (for the plotting functions of the tools)."""
    return plt


def save(fig, path: str) -> str:
    """``fig`` laid out tight, saved as a 110-dpi PNG at ``path`` and closed; the path."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _finish(fig, ax, title: str, path: str) -> str:
    """The line plots' title, grid and legend, then :func:`save`."""
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, path)


def head_heatmap(values, path: str, title: str, cbar_label: str, row_labels: Optional[Sequence[str]] = None,
                 annotate: bool = True, mask=None, col_labels: Optional[Sequence[str]] = None,
                 cell_text=None, vmin: Optional[float] = None, vmax: Optional[float] = None,
                 cmap: str = "viridis", xlabel: str = "head") -> str:
    """Save a [layers x heads] heat map as a PNG at ``path`` and return the path.

    Args:
        values: 2-D array, one row per layer, one column per head; ``np.nan`` = no such head.
        path: output file (its directory must exist).
        title: figure title.
        cbar_label: colour bar label (what the values are).
        row_labels: one label per row (default "layer 0", "layer 1", ...).
        annotate: write each cell's value (or ``cell_text``) into the cell.
        xlabel: what the columns are (default "head").
        mask: optional boolean array of ``values``' shape; True cells are drawn hatched/blank as if nan.
        col_labels: one label per column (default "0", "1", ...: head ids).
        cell_text: optional array of strings of ``values``' shape to print instead of the numbers.
        vmin, vmax: colour scale limits (default: the finite values' range).
        cmap: matplotlib colour map name.
    """
    data, hidden = _heatmap_cells(values, mask)
    n_rows, n_cols = data.shape
    row_labels, col_labels = _heatmap_labels(n_rows, n_cols, row_labels, col_labels)
    shown = np.ma.masked_array(data, mask=hidden)
    vmin, vmax = _colour_range(data[~hidden], vmin, vmax)

    width = max(5.0, 1.8 + 0.7 * n_cols)
    fig, ax = plt.subplots(figsize=(width, 1.6 + 0.55 * max(n_rows, 2)))
    colours = matplotlib.colormaps[cmap].with_extremes(bad="white")
    im = ax.imshow(shown, cmap=colours, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    _hatch_cells(ax, hidden)
    if annotate:
        _annotate_cells(ax, im, data, hidden, cell_text)
    ax.set_xticks(range(n_cols))
    ax.set_xticklabels(col_labels, fontsize=8)
    ax.set_yticks(range(n_rows))
    ax.set_yticklabels(row_labels, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_title("\n".join(textwrap.wrap(title, int(width * 12))), fontsize=9)
    cbar = fig.colorbar(im, ax=ax)
    cbar.set_label("\n".join(textwrap.wrap(cbar_label, 28)), fontsize=8)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return save(fig, path)


def _heatmap_labels(n_rows: int, n_cols: int, row_labels, col_labels):
    """(row labels, column labels): the given ones, else "layer i" and "j"; ValueError if they miss the shape."""
    if row_labels is None:
        row_labels = [f"layer {i}" for i in range(n_rows)]
    if col_labels is None:
        col_labels = [str(j) for j in range(n_cols)]
    if len(row_labels) != n_rows or len(col_labels) != n_cols:
        raise ValueError("row_labels/col_labels do not match the shape of values")
    return row_labels, col_labels


def _colour_range(finite, vmin: Optional[float], vmax: Optional[float]):
    """(vmin, vmax): the given limits, else the range of the ``finite`` values (0..1 if none); never empty."""
    if vmin is None:
        vmin = float(finite.min()) if finite.size else 0.0
    if vmax is None:
        vmax = float(finite.max()) if finite.size else 1.0
    if vmax <= vmin:
        vmax = vmin + 1e-6
    return vmin, vmax


def _hatch_cells(ax, hidden) -> None:
    """Hatch the cells of ``ax`` that ``hidden`` marks (absent heads)."""
    for i, j in zip(*np.nonzero(hidden)):
        ax.add_patch(matplotlib.patches.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//",
                                                  edgecolor="0.75", linewidth=0))


def _heatmap_cells(values, mask):
    """(the values as a 2-D float array, the cells not drawn: nan or masked)."""
    data = np.array(values, dtype=float)
    if data.ndim != 2:
        raise ValueError(f"head_heatmap needs a [layers x heads] array, got shape {data.shape}")
    hidden = np.isnan(data)
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != data.shape:
            raise ValueError(f"mask shape {mask.shape} != values shape {data.shape}")
        hidden = hidden | mask
    return data, hidden


def _annotate_cells(ax, im, data, hidden, cell_text):
    """Each drawn cell's value (or its ``cell_text``) in a colour readable on the cell."""
    for i, j in zip(*np.nonzero(~hidden)):
        text = cell_text[i][j] if cell_text is not None else f"{data[i, j]:.2f}"
        if text:
            r, g, b, _ = im.cmap(im.norm(data[i, j]))
            dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")


# ------------------------------------------------------------------------------------------------
# head functions (Voita et al. 2019, Sec. 4-5): fairseq-sparse-head-analysis


def head_function_maps(confidence, n_functions, cell_text, confidence_path: str, function_path: str):
    """The two layers x heads maps of the encoder heads: confidence (Sec. 4) and the functions of each
    head (Sec. 5: positional, rare-word, syntactic), from :func:`fairseq_sparse.analysis.heads.function_matrices`."""
    head_heatmap(confidence, confidence_path, "Encoder self-attention: confidence (Voita et al. 2019, Sec. 4)",
                 "mean max attention weight (EOS excluded)", vmin=0.0, vmax=1.0)
    n_functions = np.asarray(n_functions, dtype=float)
    top = float(np.nanmax(n_functions)) if np.isfinite(n_functions).any() else 3.0
    head_heatmap(n_functions, function_path,
                 "Function of encoder heads (p: positional, rare, rel> head->dep, rel< dep->head)",
                 "number of functions", cell_text=cell_text, vmin=0.0, vmax=max(3.0, top), cmap="Greens")


# ------------------------------------------------------------------------------------------------
# head importance (Michel et al. 2019): BLEU against the share of heads pruned, Figs. 3-5


def line_plot(series, path: str, title: str, xlabel: str, ylabel: str) -> str:
    """Save one line per (label, xs, ys) of ``series`` as a PNG at ``path`` (None / NaN y values left out)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, xs, ys in series:
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None and not (isinstance(y, float) and np.isnan(y))]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return _finish(fig, ax, title, path)


# ------------------------------------------------------------------------------------------------
# sparsity/quality curves of a target schedule (fairseq-sparse-sparsity-curve): BLEU against the L0Drop
# sparsity rate (Zhang, Titov & Sennrich 2021, Fig. 4) or the share of heads closed (Voita et al. 2019, Fig. 7)


def plot_sparsity_curve(points, path: str, title: str, xlabel: str, baseline=None) -> str:
    """BLEU against sparsity: one marked point per (x, bleu, label) of ``points`` (joined in order, each
    labelled, e.g. with its target), and ``baseline`` (x or None, bleu, label) as a dashed horizontal line
    with a marked point (at x, or at sparsity 0 when None)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    if points:
        xs, ys = [100 * p[0] for p in points], [p[1] for p in points]
        ax.plot(xs, ys, marker="o", label="schedule checkpoints")
        for x, y, (_, _, label) in zip(xs, ys, points):
            if label:
                ax.annotate(f"target {label}", (x, y), textcoords="offset points", xytext=(4, 6), fontsize=7)
    if baseline is not None:
        bx, by, blabel = baseline
        ax.axhline(by, color="0.4", linestyle="--", linewidth=1, label=f"{blabel} ({by:.2f})")
        ax.plot([100 * (bx or 0.0)], [by], marker="s", color="0.4", linestyle="none")
    top = max([p[1] for p in points] + ([baseline[1]] if baseline is not None else []) + [1.0])
    ax.set_ylim(-0.03 * top, 1.1 * top)  # BLEU from 0: no offset axis when every score is (nearly) equal
    ax.set_xlabel(xlabel)
    ax.set_ylabel("BLEU")
    return _finish(fig, ax, title, path)


def plot_pruned_by_type(series, path: str, title: str) -> str:
    """Share of each token type's source pieces pruned against the L0Drop sparsity rate (the direction of
    Zhang, Titov & Sennrich 2021, Fig. 5: punctuation and function words go first); ``series``: (type,
    sparsities, shares), a share None for a type without pieces."""
    series = [(label, [100 * x for x in xs], [None if y is None else 100 * y for y in ys]) for label, xs, ys in series]
    return line_plot(series, path, title, "L0Drop sparsity rate (% of source tokens pruned)",
                     "% of the type's source tokens pruned")


def plot_pruned_positions(series, path: str) -> str:
    """Where inside a word the pruned characters of a character-level source sit (Zhang, Titov & Sennrich
    2021, Fig. 6): per (label, bin rows of ``token_types.PrunedPositions``), each bin's share of the pruned
    characters against the bin's centre (0: a word's first character, 1: its last)."""
    lines = [(label, [(b["from"] + b["to"]) / 2 for b in bins],
              [None if b["share_of_pruned"] is None else 100 * b["share_of_pruned"] for b in bins])
             for label, bins in series]
    return line_plot(lines, path, "Position of pruned characters in their word (Zhang, Titov & Sennrich 2021, "
                     "Fig. 6)", "relative position in the word", "% of the pruned characters")


# ------------------------------------------------------------------------------------------------
# encoder-decoder attention: fairseq-sparse-attention-analysis (alignment per layer: Yang et al. 2020, Fig. 4;
# L0Drop kept vs pruned: Zhang, Titov & Sennrich 2021, Figs. 1/7/8)


def plot_attention_layers(layers: Sequence[dict], path: str) -> str:
    """AER/SAER (when the rows have them), cumulative coverage and entropy per decoder layer, in the style of
    Yang et al. (2020) Fig. 4; ``layers``: the per-layer rows of ``analysis.attention.summarise``."""
    x = [r["layer"] for r in layers]
    has_gold = any(not np.isnan(r["aer"]) for r in layers)
    panels = {
        "aer": (("aer", "o-", "AER"), ("saer", "s--", "SAER"), "error rate (lower is better)",
                "(a) alignment error per layer"),
        "coverage": (("coverage", "o-", "cumulative C<=i"), ("coverage_layer", "s--", "layer alone |A_i|/N"),
                     "share of source words", "cumulative coverage (Yang et al. 2020, Eq. 2)"),
        "entropy": (("entropy", "o-", "head-averaged"), ("entropy_heads", "s--", "mean over heads"),
                    "entropy per target token (nats)", "attention entropy"),
    }
    names = (["aer"] if has_gold else []) + ["coverage", "entropy"]
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4))
    for ax, name in zip(np.atleast_1d(axes), names):
        first, second, ylabel, title = panels[name]
        for key, style, label in (first, second):
            ax.plot(x, [r[key] for r in layers], style, label=label)
        if name == "coverage":
            ax.set_ylim(0, 1.02)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=8)
        ax.set_xlabel("decoder layer")
        ax.set_xticks(x)
    return save(fig, path)


def plot_encdec_head_maps(entropy, max_weight, entropy_path: str, max_weight_path: str):
    """Heat maps [decoder layers x heads] of the mean entropy and mean largest weight per target token."""
    rows = [f"dec layer {l}" for l in range(np.shape(entropy)[0])]
    head_heatmap(entropy, entropy_path, "Encoder-decoder attention: mean entropy per target token",
                 "entropy (nats)", vmin=0.0, row_labels=rows)
    head_heatmap(max_weight, max_weight_path, "Encoder-decoder attention: mean max weight per target token",
                 "mean max weight", vmin=0.0, vmax=1.0, row_labels=rows)


#: the largest side of an example attention map: at 0.32 inch a token, a 600-character sentence made a figure of
#: 194 inches (21k pixels at 110 dpi), and three of them took 17 GB and 77 s
MAX_EXAMPLE_INCHES = 30.0


def plot_attention_example(example: dict, path: str, title: str) -> str:
    """One sentence's encoder-decoder attention [target x source] (head- and layer-averaged); source tokens
    that L0Drop prunes (``example["pruned"]``) in red, their columns shaded (Zhang, Titov & Sennrich 2021,
    Fig. 1: pruned tokens receive little attention)."""
    attn, src, tgt, pruned = example["attention"], example["source"], example["target"], example["pruned"]
    width, height = (min(MAX_EXAMPLE_INCHES, max(4.0, 0.32 * len(src) + 2)),
                     min(MAX_EXAMPLE_INCHES, max(3.0, 0.3 * len(tgt) + 1.6)))
    fig, ax = plt.subplots(figsize=(width, height))
    im = ax.imshow(attn, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    # every token labelled where it fits; on a capped figure (long, e.g. character-level, sentences) every k-th
    src_ticks = range(0, len(src), max(1, math.ceil(0.32 * len(src) / (width - 2))))
    ax.set_xticks(list(src_ticks))
    ax.set_xticklabels([src[i] for i in src_ticks], rotation=90, fontsize=8)
    tgt_ticks = range(0, len(tgt), max(1, math.ceil(0.3 * len(tgt) / (height - 1.6))))
    ax.set_yticks(list(tgt_ticks))
    ax.set_yticklabels([tgt[i] for i in tgt_ticks], fontsize=8)
    if pruned is not None:
        for label, pos in zip(ax.get_xticklabels(), src_ticks):
            if pruned[pos]:
                label.set_color("tab:red")
        for pos, is_pruned in enumerate(pruned):
            if is_pruned:
                ax.axvspan(pos - 0.5, pos + 0.5, color="tab:red", alpha=0.12, linewidth=0)
        title += f": {int(np.sum(pruned))} of {len(src)} source tokens pruned (red)"
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.03, label="attention weight")
    return save(fig, path)


def plot_l0drop(summary: dict, pruned, summed_attention, encoder_entropy, low: float, attention_path: str,
                entropy_path: str):
    """Histograms of kept vs pruned source tokens: the attention each receives (Zhang, Titov & Sennrich 2021,
    Figs. 1/7, with the share below ``low``) and its last encoder self-attention entropy (Fig. 8).
    ``summary``: ``analysis.attention.l0drop_summary``; ``pruned`` and the values: one entry per token."""
    pruned = np.asarray(pruned, dtype=bool)
    share = f"share_below_{low}"
    for key, values, path, xlabel, title in (
            ("summed_attention", summed_attention, attention_path, "attention weight summed over target words",
             "Summed encoder-decoder attention per source token\n(Zhang, Titov & Sennrich 2021, Figs. 1/7)"),
            ("encoder_entropy", encoder_entropy, entropy_path, "entropy of the last encoder self-attention row (nats)",
             "Encoder self-attention entropy, kept vs pruned\n(Zhang, Titov & Sennrich 2021, Fig. 8)")):
        values = np.asarray(values, dtype=float)
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        for mask, name, colour in ((~pruned, "kept", "tab:blue"), (pruned, "pruned", "tab:red")):
            v = values[mask]
            v = v[np.isfinite(v)]
            d = summary[key][name]
            label = f"{name} (n={d['count']}, mean {d['mean']:.2f}" + (
                f", {100 * d[share]:.1f}% < {low})" if share in d and d["count"] else ")")
            ax.hist(v, bins=np.array(summary[key]["bin_edges"]), alpha=0.55, color=colour, label=label)
            if v.size:
                ax.axvline(float(v.mean()), color=colour, linestyle="--", linewidth=1)
        d = summary[key]["all"]
        if share in d:
            ax.axvline(low, color="0.4", linestyle=":", linewidth=1)
            title += f"\nall: mean {d['mean']:.2f}, {100 * d[share]:.1f}% below {low}" if d["count"] else ""
        ax.set_xlabel(xlabel)
        ax.set_ylabel("source tokens")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
        save(fig, path)


# ------------------------------------------------------------------------------------------------
# probing (Yang et al. 2020): recovery perplexity per decoder module and layer (Figs. 3, 8 and 10),
# fairseq-sparse-probe; ``out`` is its probe.json ({label, results: [{kind, layer, module, ppl}]})


def _probe_series(out, kind, module):
    pts = sorted((r["layer"], r["ppl"]) for r in out["results"] if r["kind"] == kind and r["module"] == module)
    return [p[0] for p in pts], [p[1] for p in pts]


def _probe_axis(ax, out, title, ylabel):
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


def _probe_panels(out):
    """(figure, axes, kinds): one panel per probed sequence (source, target)."""
    from .probing import PROBE_KINDS

    kinds = [k for k in PROBE_KINDS if any(r["kind"] == k for r in out["results"])]
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 3.8), squeeze=False)
    return fig, axes[0], kinds


def plot_probe_curves(out: dict, modules: Sequence[str], path: str, title: str) -> Optional[str]:
    """Recovery PPL per layer of each of ``modules``, a panel per sequence (Figs. 3 and 8); nothing is
    saved when none of ``modules`` was probed. Returns the path saved, or None."""
    from .probing import MODULE_LABELS

    fig, axes, kinds = _probe_panels(out)
    drawn = False
    for ax, kind in zip(axes, kinds):
        for m in modules:
            xs, ys = _probe_series(out, kind, m)
            if xs:
                ax.plot(xs, ys, marker="o", markersize=4, label=MODULE_LABELS[m])
                drawn = True
        _probe_axis(ax, out, f"{kind} ({out['label']})", "recovery PPL (lower = more information)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if drawn:
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return path if drawn else None


def plot_probe_compare(out: dict, other: dict, path: str) -> str:
    """The IFM curves of two runs overlaid, a panel per sequence (Fig. 10)."""
    fig, axes, kinds = _probe_panels(out)
    for ax, kind in zip(axes, kinds):
        for run, style in ((out, "-"), (other, "--")):
            xs, ys = _probe_series(run, kind, "ifm")
            if xs:
                ax.plot(xs, ys, style, marker="o", markersize=4, label=f"IFM, {run.get('label', '?')}")
        _probe_axis(ax, out, kind, "recovery PPL (lower = more information)")
    fig.suptitle("IFM information per layer (Yang et al. 2020, Fig. 10)", fontsize=10)
    return save(fig, path)
