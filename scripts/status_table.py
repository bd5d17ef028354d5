#!/usr/bin/env python3
"""README's status table ("Where it stands") generated from the studies' results: each row names its reports, and
every number in it is read from a report's results.json by a format field (``{x256[summary][baseline_bleu]:.1f}``:
the report named x256, its JSON's summary.baseline_bleu); the words are the row's own. A key a report's JSON lists
under "transcribed" was copied there by hand from the report's text, which says where it came from. A study changes README by
changing its JSON, or a row here when a status changes; tests/unit/test_reports.py fails while README's table is not
what this prints.

    python3 scripts/status_table.py           # prints the table
    python3 scripts/status_table.py --write   # puts it into README.md
"""
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = "| method | goal | best measured | met? | where |\n|---|---|---|---|---|"
#: method, goal, measured (a format string over the row's reports), met, where (links), reports ({name: folder})
ROWS = [
    ("head gates, all three types, half the heads", "within 0.5 BLEU",
     "**{r[headline][gap_bleu_2000_mean]:.2f}** BLEU (mean of 2 seeds; 3+3 x 128, CPU, 2,000 updates)", "yes",
     "[report]({r})", {"r": "2026-11-26-head-gates-two-seeds"}),
    ("L0Drop, 40-50% of source states", "within 0.5 BLEU",
     "{x128[headline][gap_bleu_1800_mean]:.2f} (2 seeds; x128, the 1,827-update CPU baseline, 1,800 updates; H200); "
     "**{x256[summary][mean_gap_after_1000_updates][l0drop][gap]:.2f}** from GPU-trained x256 baselines "
     "({x256[summary][baseline_bleu]:.1f} BLEU, not converged; 1,000 updates; H200); "
     "**{gx128[summary][mean_gap_after_800_updates_common_sentences][l0drop][gap]:.2f}** from x128 ones "
     "({gx128[summary][baseline_bleu]:.1f} BLEU; 800 updates; the shorter test sentences only)", "no",
     "[x256]({x256}), [x128 GPU]({gx128}), [x128 CPU]({x128})",
     {"x256": "2026-11-27-l0drop-gpu-ddtp-x256", "gx128": "2026-11-27-l0drop-gpu-ddtp-x128",
      "x128": "2026-11-26-gpu-checks-h200"}),
    ("the freq rule at 50% and learned L0Drop gates, trained sparse from scratch or fine-tuned with the baseline's "
     "optimiser continued (the decisive test of L0Drop's gap)", "within 3% relative of stock at equal updates",
     "the freq rule from scratch **{d[headline][relative_gap_pct_1700]:+.1f}%** relative ({d[headline][gap_1700]:+.2f} "
     "BLEU against stock's {d[headline][stock_bleu_1700]:.2f}; 1,700 updates, {d[headline][seeds_1700]} seeds), "
     "**{d[headline][relative_gap_pct_3000]:+.1f}%** at 3,000 (seed 2, {d[headline][passes_27427_3000]:.1f} passes "
     "over the pairs); fine-tuned from seed 1's stock model {d[headline][protocol_continue_relative_gap_pct]:+.1f}% "
     "with its Adam and schedule continued, {d[headline][protocol_fresh_relative_gap_pct]:+.1f}% with a fresh Adam; "
     "a quarter of the pairs, 850 updates, {d[headline][seeds_quarter_850]} seeds: the rule "
     "{d[headline][relative_gap_pct_quarter_850]:+.1f}%, learned gates "
     "**{d[headline][relative_gap_pct_l0drop_scratch_quarter_850]:+.1f}%** at target 0.5 "
     "({d[headline][pruned_pct_l0drop_scratch_quarter_850]:.1f}% pruned) and "
     "**{d[headline][relative_gap_pct_l0drop_low_scratch_quarter_850]:+.1f}%** at 0.3 "
     "({d[headline][pruned_pct_l0drop_low_scratch_quarter_850]:.1f}% pruned, "
     "{d[headline][seeds_l0drop_low_scratch_quarter_850]} seeds); the rule at 2,000 updates "
     "{d[headline][relative_gap_pct_quarter_2000]:+.1f}% ({d[headline][passes_6857_2000]:.0f} passes; the line "
     "through the shorter runs said {d[headline][predicted_pct_6857_2000]:+.1f}%) (3+3 x 128, CPU)",
     "no: not the protocol, not the budget past ten passes, not the data size",
     "[report]({d})", {"d": "2026-11-28-l0drop-decisive"}),
    ("merge instead of drop: the freq rule at 50%, each pruned state folded into a kept one",
     "recover what dropping loses (within 3% relative of stock)",
     "merged by the mean **{m[headline][relative_gap_pct_merge_mean]:+.1f}%** relative against dropping's "
     "{m[headline][relative_gap_pct_drop_mean]:+.1f}% ({m[headline][seeds_mean]} seeds), by attention "
     "{m[headline][relative_gap_pct_merge_attention]:+.1f}% (seed 1); the kept states hold more of the pruned pieces "
     "(a probe recovers {m[headline][probe_accuracy_pct_pattern_freq_merge_mean_scratch]:.0f}% against dropping's "
     "{m[headline][probe_accuracy_pct_pattern_freq_scratch]:.0f}%, seed 1) (3+3 x 128, a quarter of the pairs, 850 updates, CPU)",
     "no: the loss is in reading the slots, not in routing", "[report]({m})", {"m": "2026-12-07-l0drop-merge"}),
    ("composed (simplified decoder + L0Drop 10% + half the heads)", "2x stock at 400 tokens, within 1 BLEU",
     "**{r[headline][speed_vs_stock_400_seed1]:.2f}x** / **{r[headline][speed_vs_stock_400_seed2]:.2f}x** (CPU, one "
     "thread); **{r[headline][gap_bleu_2000_mean]:.2f}** BLEU (2 seeds, 2,000 updates)", "speed yes, quality no",
     "[report]({r})", {"r": "2026-11-27-composed-mild-target"}),
    ("L0Drop on summarisation (multi-document)", "70% pruned within 0.5 ROUGE-L, 1.65x faster",
     "**{r[headline][pruned_multidoc_test_target05_600_pct]:.1f}**% pruned, **{r[headline][rougeL_gap_target05_600]:.2f}"
     "** ROUGE-L (p {r[headline][p_rougeL_target05_600]:.2f}), **{r[headline][speed_pruned_vs_unpruned_1000_target05_after_b362a6b]:.2f}x** (one seed, "
     "weak degenerate summarisers: ROUGE-L {r[headline][baseline_rougeL]:.2f} against a lead baseline's "
     "{r[headline][lead_rougeL_2026_11_28]:.2f})", "no", "[report]({r})", {"r": "2026-11-26-summarisation-ddtp-multidoc"}),
    ("pruned decoding (Algorithm 1)", "identical to the full memory",
     "identical hypotheses, CPU and GPU (fp32), but for rare near-ties of beam scores (one sentence of 1,001 in one "
     "run)", "yes", "[l0drop.md](docs/l0drop.md#caveats), [the tie]({t})",
     {"t": "2026-11-26-l0drop-gap-vs-target"}),
    ("int8 TorchScript artefact of the composed model", "faster than CTranslate2 int8",
     "**{r[headline][remeasured_2026_11_29][composed_int8_ts_vs_stock_400]:.2f}x** / "
     "**{r[headline][remeasured_2026_11_29][composed_int8_ts_vs_stock_800]:.2f}x** stock at 400 / 800 tokens against "
     "**{r[headline][remeasured_2026_11_29][ct2_int8_vs_stock_400]:.2f}x** / "
     "**{r[headline][remeasured_2026_11_29][ct2_int8_vs_stock_800]:.2f}x** (random weights, CPU, idle, "
     "{r[headline][remeasured_2026_11_29][rounds]} rounds, spread {r[headline][remeasured_2026_11_29][spread_median_pct]}%; "
     "re-measured: the first run's {r[headline][composed_int8_ts_vs_stock_400]:.2f}x / "
     "{r[headline][ct2_int8_vs_stock_400]:.2f}x at 400 kept the order, not the factors)",
     "yes at 800 tokens; level at 400", "[report]({r})",
     {"r": "2026-11-25-speed-int8-artefacts"}),
    ("decoding on a GPU", "pruning saves time",
     "host-bound: {r[headline][stock_ms_per_step_min]:.1f}-{r[headline][stock_ms_per_step_max]:.1f} ms a step whatever the source; pruned **{r[headline][l0drop_pruned_vs_stock_400]:.2f}x** stock "
     "(saves memory, not time); under the fixed-shape search's graphs L0Drop 50% decodes at "
     "{gpu[results][3][searches][fixed_shape][ms_per_step]:.2f} ms a step against stock's "
     "{gpu[results][1][searches][fixed_shape][ms_per_step]:.2f} (400 tokens, other random models; pruned against the "
     "same model unpruned not measured yet)", "not yet", "[report]({r}), [graphs]({gpu})",
     {"r": "2026-11-26-gpu-checks-h100", "gpu": "2026-11-27-fixed-shape-search-h200"}),
    ("fixed-shape beam search, CUDA graphs", "3x fairseq-generate on a GPU (batch 64, 400 tokens, fp16)",
     "**{gpu[results][1][searches][fixed_shape][speedup_paired]:.2f}x** (random stock transformer-base, batch "
     "{gpu[results][1][batch]}, {gpu[results][1][length]} tokens, fp16, H200, one round); fairseq's hypotheses in "
     "fp32; on the CPU its eager steps **{cpu[speedup_generate][prefix]:.2f}x** fairseq-generate on a trained "
     "checkpoint, so without a CUDA graph it runs fairseq's search (**{cpu[speedup_generate][auto]:.2f}x**)",
     "yes at batch 64; batch 1 not yet", "[GPU]({gpu}), [CPU]({cpu})",
     {"gpu": "2026-11-27-fixed-shape-search-h200", "cpu": "2026-11-27-fixed-shape-search-cpu-trained"}),
]


def load(folder):
    with open(os.path.join(REPO, "reports", folder, "results.json"), encoding="utf-8") as f:
        return json.load(f)


def table() -> str:
    """The table, header included, one line per row."""
    lines = [HEADER]
    for method, goal, measured, met, where, reports in ROWS:
        data = {name: load(folder) for name, folder in reports.items()}
        links = {name: f"reports/{folder}/README.md" for name, folder in reports.items()}
        lines.append(f"| {method} | {goal} | {measured.format(**data)} | {met} | {where.format(**links)} |")
    return "\n".join(lines)


def readme_table(text: str) -> str:
    """The status table as README holds it (the lines from its header to the first line that is not a row)."""
    lines = text[text.index(HEADER):].split("\n")
    n = next((i for i, line in enumerate(lines) if not line.startswith("|")), len(lines))
    return "\n".join(lines[:n])


def main(argv):
    new = table()
    if argv[1:] == ["--write"]:
        path = os.path.join(REPO, "README.md")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        text = text.replace(readme_table(text), new)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    elif argv[1:]:
        sys.exit(f"usage: {argv[0]} [--write]")
    else:
        print(new)


if __name__ == "__main__":
    main(sys.argv)
