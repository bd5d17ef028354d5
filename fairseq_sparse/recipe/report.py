"""WORK/REPORT.md as a pure function of WORK/results.json: the models against their equal-updates controls,
exactness of pruned decoding, token types, attention, speed, the curve, the plots and every command."""
import os
from argparse import Namespace

from .methods import BY_NAME, CONTROL_OF, STEPS
from .options import CHAR_BOUNDARY, depths

#: (title, path relative to WORK) of every plot a step may make
PLOTS = (
    ("quality gap to the equal-updates control against the fine-tuning budget", "budget/gap.png"),
    ("BLEU against L0Drop sparsity (curve step)", "curve/curve.png"),
    ("share pruned by token type (curve step)", "curve/curve_token_types.png"),
    ("pruned characters by their position inside the word (curve step, --char-level)",
     "curve/curve_char_positions.png"),
    ("attention received by kept and pruned source tokens (L0Drop)", "l0drop/attention/l0drop_attention.png"),
    ("encoder self-attention entropy, kept vs pruned (L0Drop)", "l0drop/attention/l0drop_entropy.png"),
    ("head importance, encoder self-attention", "importance/scores/importance_enc.png"),
    ("head importance, decoder self-attention", "importance/scores/importance_dec.png"),
    ("head importance, encoder-decoder attention", "importance/scores/importance_encdec.png"),
    ("BLEU while pruning heads by importance", "importance/curve/curve.png"),
    ("attention entropy per head, control", "control/attention/entropy_heads.png"),
    ("attention entropy per head, attention regulariser", "attention_reg/attention/entropy_heads.png"),
    ("alignment error, coverage and entropy per layer, attention regulariser", "attention_reg/attention/layers.png"),
)
CURVE_COLUMNS = (("updates", ".0f"), ("target_l0drop", ".2f"), ("l0drop_sparsity", ".3f"), ("score", ".2f"),
                 ("control_score", ".2f"), ("pruned_punct", ".3f"), ("pruned_function", ".3f"),
                 ("pruned_content", ".3f"), ("pruned_bpeh", ".3f"), ("pruned_bpeo", ".3f"))


def plots_in(work):
    """(title, path) of every plot the steps made under WORK, the L0Drop example maps last."""
    found = [(t, p) for t, p in PLOTS if os.path.exists(os.path.join(work, p))]
    maps = os.path.join(work, "l0drop", "attention")
    examples = sorted(f for f in os.listdir(maps) if f.startswith("example")) if os.path.isdir(maps) else []
    return found + [(f"attention map with pruned sources marked ({f[:-4]})", f"l0drop/attention/{f}") for f in examples]


def metric_name(a):
    return "BLEU" if a.metric == "bleu" else "ROUGE-L (summary-level)"


def score_cell(row):
    """A model's score; with ROUGE its bootstrap 95% interval (analysis.scores.corpus_score) after it."""
    ci = row.get("rouge_ci95", {}).get("rougeLsum")
    return f"{row['score']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def cell(value, spec):
    """A table cell: a number formatted with SPEC, anything else as it is (NA, empty)."""
    try:
        return format(float(value), spec)
    except (TypeError, ValueError):
        return "" if value is None else str(value)


def sparsity_cell(name, row, heads):
    if row.get("l0drop_sparsity") is not None:
        return f"{100 * row['l0drop_sparsity']:.1f}% of source states pruned"
    if name in heads and heads[name]["total"]:
        kept, total = heads[name]["total"]
        per = ", ".join(f"{t} {n}" for t, n in heads[name]["kept"].items())
        return f"{total - kept} of {total} heads removed (kept: {per})"
    return ""


def training_lines(a, stopped):
    """Where each model trained from scratch stopped and why; the distillation of the fine-tunings."""
    lines = [f"- {name}: stopped after {s['updates']} updates: {s['reason']}." for name, s in stopped.items() if s]
    if getattr(a, "seq_kd", False):
        lines.append("- Every fine-tuning, method and control alike, trained on the baseline's beam-5 translations of "
                     "the training sources (sequence-level KD).")
    if a.distill_weight:
        lines.append(f"- Every fine-tuning, method and control alike, distilled from the baseline (word-level KD, "
                     f"weight {a.distill_weight}, temperature {a.distill_temperature}).")
    return lines + ([""] if lines else [])


def header(a, models):
    corpus = a.corpus or a.data_bin
    on = "Moses-detokenised" if a.tokenizer == "moses" else "tokenised"
    units = (", character level (--char-level: the hypotheses joined back into words before scoring)"
             if getattr(a, "char_level", False) else "")
    metric = "BLEU: sacrebleu" if a.metric == "bleu" else (
        "ROUGE-L F1, summary-level, with its bootstrap 95% interval (rouge-score's rougeLsum on sentences split after "
        ". ! ?, Porter-stemmed, averaged over documents, as files2rouge; ROUGE-1 / ROUGE-2 in results.json)")
    return [f"# fairseq_sparse report: {os.path.basename(os.path.normpath(corpus))} {a.source_lang}-{a.target_lang}", "",
            f"Corpus: {corpus}; model: stock transformer, {'+'.join(map(str, depths(a)))} layers, width {a.embed_dim}, FFN "
            f"{a.ffn_dim}, {a.heads} heads{units}; baseline at most {a.baseline_updates} updates of <= {a.max_tokens} tokens; "
            f"every fine-tuning and its control {a.finetune_updates} updates at lr {a.finetune_lr} (gates and "
            f"multipliers: --sparsity-lr {a.sparsity_lr}); one seed. {metric} on the {on} test "
            f"split, beam {a.beam}, all {models['baseline']['sentences']} sentences.", ""]


def length_lines(a, lengths):
    """How many sources were cut to --truncate-source tokens, per split; the models' positions; the decoding."""
    if not lengths:
        return []
    cut = lengths.get("truncation") or {}
    splits, n = cut.get("splits", {}), cut.get("tokens", 0)
    if n:
        counts = ", ".join(f"{split} {s['truncated']:,} of {s['documents']:,}" for split, s in splits.items())
        longest = max(s["longest"] for s in splits.values())
        lines = [f"- Sources cut to their first {n} tokens after tokenisation and BPE (--truncate-source): {counts} "
                 f"documents cut (the longest had {longest:,} tokens)."]
    else:
        longest = max(s["source"] for s in lengths["longest"].values()) - 1  # without EOS
        lines = [f"- Sources as the --data-bin holds them (the longest has {longest:,} tokens)." if a.data_bin else
                 f"- Sources not truncated (the longest has {longest:,} tokens after tokenisation and BPE)."]
    source, target = lengths["positions"]
    lines.append(f"- Model positions: {source:,} source, {target:,} target: no training pair dropped, every test "
                 "document decoded.")
    if hasattr(a, "lenpen"):
        lines.append(f"- Decoding: beam {a.beam}, --lenpen {a.lenpen}, --min-len {a.min_len}, --max-len-a "
                     f"{a.max_len_a}, --max-len-b {a.max_len_b}, --no-repeat-ngram-size {a.no_repeat_ngram_size}.")
    return lines + [""]


def test_name(a):
    """The paired test the report's p-values come from."""
    return ("sacrebleu's paired bootstrap resampling" if a.metric == "bleu" else
            "paired bootstrap resampling of documents (sacrebleu's form of the test) on rouge-score's per-document "
            "summary-level ROUGE-L")


def significance_cell(test):
    """The paired bootstrap: p-value, and the model's mean and 95% interval over the resamples."""
    if not test:
        return ""
    if test.get("identical"):
        return "identical outputs (no test)"
    return f"p = {test['p_value']:.3f}; {test['mean']:.2f} ± {test['ci95']:.2f}"


def model_table(a, models, heads, significance):
    lines = [f"| model | what | {metric_name(a)} | vs its control | paired bootstrap | sparsity | parameters |",
             "|---|---|---|---|---|---|---|"]
    for name, r in models.items():
        ref = models.get(CONTROL_OF.get(name))
        delta = f"{r['score'] - ref['score']:+.2f} (vs {CONTROL_OF[name]})" if ref else ""
        lines.append(f"| {name} | {BY_NAME[name].what(a)} | {score_cell(r)} | {delta} | "
                     f"{significance_cell(significance.get(name))} | {sparsity_cell(name, r, heads)} | "
                     f"{r['parameters']:,} |")
    notes = [f"- paired bootstrap: {test_name(a)} against the control (1,000 resamples): the p-value of the "
             f"difference, and the model's mean {metric_name(a)} and 95% interval over the resamples."]
    return lines + [""] + (notes + [""] if significance else [])


def reading_lines(a, models, lead):
    """Summarisation: whether the models read their input: the lead baseline beside them and their distinct
    outputs per test document."""
    if a.metric != "rouge":
        return []
    lines = []
    if lead:
        test = lead["baseline_against_lead"]
        lines.append(f"- lead baseline (each test source's first sentence, as the models read it): "
                     f"{metric_name(a)} {score_cell(lead)}; the baseline {models['baseline']['score'] - lead['score']:+.2f} "
                     f"against it ({significance_cell(test).split(';')[0]}).")
    shares = [f"{n} {r['distinct_outputs']:.0%}" for n, r in models.items() if r.get("distinct_outputs") is not None]
    if shares:
        lines.append("- distinct outputs per test document (a summariser that writes the same text whatever it "
                     "reads: near 0%): " + ", ".join(shares) + ".")
    return lines + [""] if lines else []


def exactness_lines(results):
    """Pruned decoding against the full memory, per model that was decoded both ways."""
    lines = []
    for name in results["models"]:
        e = results.get(f"{name}_exact")
        if e is None:
            continue
        differ = e.get("differ")
        if e["identical"]:
            same = f"identical hypotheses on all {e['sentences']} test sentences"
        elif differ is None:  # results of an earlier version: no count
            same = f"DIFFERENT hypotheses on some of the {e['sentences']} test sentences"
        else:
            same = (f"DIFFERENT hypotheses on {len(differ)} of {e['sentences']} test sentences (line "
                    f"{', '.join(str(i + 1) for i in differ[:5])}{', ...' if len(differ) > 5 else ''} of the test "
                    f"set; pruned decoding is exact in arithmetic, not bit for bit: a beam-search tie within float "
                    f"rounding can go the other way, docs/l0drop.md)")
        same += f" (largest score difference where they agree {e['max_score_difference']:.1e})"
        rates = results.get(f"{name}_layer_sparsity")
        if rates is None:
            lines.append(f"- {BY_NAME[name].summary.split(' (')[0]}: pruned decoding against the full memory: {same}.")
        else:
            lines.append(f"- {name}: share of source states pruned after each gated encoder layer and at the output "
                         f"(last validation): {', '.join(f'{k} {v:.1%}' for k, v in rates.items())}; the compacted "
                         f"encoder with the pruned memory against the full memory: {same}.")
    return lines


def attention_lines(att):
    from ..analysis.token_types import TYPE_NAMES

    lines = []
    types = att.get("l0drop", {}).get("token_types")
    if types:
        lines.append("- Source pieces L0Drop prunes, by token type: " + ", ".join(
            f"{TYPE_NAMES[t]} {100 * v['share']:.1f}% of {v['tokens']}" for t, v in types.items() if v["tokens"]) + ".")
    chars = att.get("l0drop", {}).get("char_positions")
    if chars:
        lines.append("- Characters L0Drop prunes, by their relative position inside the word (0: first, 1: last; "
                     "Zhang, Titov & Sennrich 2021 Fig. 6): " + ", ".join(
                         f"{r['from']:.1f}-{r['to']:.1f} {100 * r['share_pruned']:.1f}% of {r['chars']}"
                         for r in chars if r["chars"]) + ".")
    boundary = att.get("l0drop", {}).get("char_boundary")
    if boundary and boundary["chars"]:
        lines.append(f"- Word-boundary symbols ({CHAR_BOUNDARY}) L0Drop prunes: {100 * boundary['share_pruned']:.1f}% of "
                     f"{boundary['chars']} (the paper, Sec. 6: 89.2% of the space symbols on WMT14).")
    if att:
        lines.append("- Encoder-decoder attention on the test split (teacher forced; per head, mean over layers): " +
                     "; ".join(f"{n} entropy {v['entropy']:.3f} nats, max weight {v['max_weight']:.3f}"
                               + (f", AER {v['aer']:.3f}" if v.get("aer") is not None else "")
                               for n, v in att.items()) + ".")
    return lines + [""]


def speed_lines(speed, noise):
    if not speed:
        return []
    lines = ["Speed (fairseq_sparse.benchmarks, CPU time, one thread, variants timed side by side in one process; "
             "the importance and simplified-decoder rows on random weights of the same shapes):", "",
             "| what | against stock fairseq | note |", "|---|---|---|"]
    lines += [f"| {s['what']} | {s['ratio']} | {s['note']} |" for s in speed]
    return lines + [""] + [f"- {n}" for n in noise] + [""]


def curve_lines(a, curve):
    if not curve:
        return []
    lines = [f"One L0Drop run through the targets {a.curve_targets} ({a.curve_updates} updates each), "
             "with the share of each token type's source pieces pruned:", "",
             f"| updates | target | sparsity | {metric_name(a)} | control, same updates | pruned punct. | "
             "pruned function | pruned content | pruned BPEH | pruned BPEO |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(cell(p.get(k), spec) for k, spec in CURVE_COLUMNS) + " |" for p in curve]
    return lines + [""]


def budget_lines(a, budget):
    if not budget:
        return []
    lines = ["The gap to the equal-updates control against the budget (updates of the fine-tuning, or from random "
             "weights for the *_scratch models beside the baseline; checkpoints of one run each; "
             f"p: {test_name(a)}):", "",
             f"| model | updates | {metric_name(a)} | control (its {metric_name(a)}) | gap | p | L0Drop sparsity "
             "| heads closed |",
             "|---|---|---|---|---|---|---|---|"]
    for name, points in budget.items():
        lines += [f"| {name} | {p['updates']} | {p['score']:.2f} | {p.get('control', 'control')} "
                  f"({p['control_score']:.2f}) | {p['gap']:+.2f} | "
                  f"{'identical' if p.get('identical') else cell(p['p_value'], '.3f')} | {cell(p['l0drop_sparsity'], '.1%')} | "
                  f"{cell(p.get('heads_closed'), '.1%')} |" for p in points]
    return lines + [""]


def gap_lines(analyses):
    """The gap_analysis step's tables: per model against its control at equal updates."""
    if not analyses:
        return []
    lines = ["## Where the source-pruning models lose (gap_analysis)", ""]
    for name, r in analyses.items():
        b, nll = r["brevity"], r["nll"]
        lines += [f"**{name}** against {r['control']} ({r['sparsity']:.1%} of test source pieces pruned): BLEU "
                  f"{r['overall']['method']:.2f} against {r['overall']['control']:.2f}, length ratio "
                  f"{b['method']['ratio']:.3f} against {b['control']['ratio']:.3f} (BP {b['method']['bp']:.3f} / "
                  f"{b['control']['bp']:.3f}); NLL per target token (base 2) on 1,000 training pairs {nll['method']['train_sample']['nll_loss']:.3f} "
                  f"/ {nll['control']['train_sample']['nll_loss']:.3f}, valid {nll['method']['valid']['nll_loss']:.3f} / "
                  f"{nll['control']['valid']['nll_loss']:.3f} (model / control)." + extra_readouts(r), "",
                  "| group | sentences | control | model | gap | relative | length ratio (model / control) |",
                  "|---|---|---|---|---|---|---|"]
        for title, label in (("by_segment_type", ""), ("by_length", "length "), ("by_copy_share", "copied ")):
            for group, g in (r.get(title) or {}).items():
                lines.append(f"| {label}{group} | {g['sentences']} | "
                             f"{g['control']:.2f} | {g['method']:.2f} | {g['gap']:+.2f} | "
                             f"{cell(g['relative_gap'], '+.1%')} | {g['method_ratio']:.3f} / {g['control_ratio']:.3f} |")
        recall = r["copy_recall"]
        lines += ["", "Reference words copied verbatim from the source, recalled (model / control), by what the model "
                  "did to their source pieces: " + "; ".join(
                      f"{state} {cell(c['recall'], '.1%')} / {cell(recall['control'].get(state, {}).get('recall'), '.1%')} "
                      f"({c['words']} words)" for state, c in recall["method"].items()), ""]
    return lines


def extra_readouts(r) -> str:
    """chrF and repeated trigrams (model / control), for analyses that have them (before 2026-12 they did not)."""
    if "chrf" not in r:
        return ""
    c, rep = r["chrf"], r["repeated_trigrams"]
    return (f" chrF {c['method']:.2f} / {c['control']:.2f}; repeated trigrams {cell(rep['method'], '.1%')} / "
            f"{cell(rep['control'], '.1%')}.")


def plot_lines(plots):
    if not plots:
        return []
    return (["## Plots", ""] + [f"- [{title}]({path})" for title, path in plots] + [""]
            + [f"![{title}]({path})" for title, path in plots if "example" not in path] + [""])


def command_lines(commands):
    lines = ["## Commands", ""]
    for step in STEPS:
        if commands.get(step):
            lines += [f"### {step}", "", "```bash"] + commands[step] + ["```", ""]
    return lines


def render(results):
    """REPORT.md's lines from results.json's content (nothing else is read)."""
    a = Namespace(**results["settings"])
    models = results["models"]
    return (header(a, models) + length_lines(a, results.get("lengths"))
            + training_lines(a, results.get("stopped", {}))
            + model_table(a, models, results["heads"], results.get("significance", {}))
            + reading_lines(a, models, results.get("lead")) + exactness_lines(results)
            + attention_lines(results["attention"]) + speed_lines(results["speed"], results.get("noise", []))
            + curve_lines(a, results["curve"]) + budget_lines(a, results.get("budget", {}))
            + gap_lines(results.get("gap_analysis", {}))
            + plot_lines(results.get("plots", []))
            + command_lines(results.get("commands", {})))
