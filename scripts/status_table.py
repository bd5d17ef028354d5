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
HEADER = "| method | goal | measured | met? | report |\n|---|---|---|---|---|"
#: (the conditions every row of the group shares, [(method, goal, measured (a format string over the row's reports),
#: met, where (links), reports ({name: folder}))]); the protocol of each number is in its report
GROUPS = [
    ("Translation, DDTP en-de (27k pairs), 3+3 layers x 128, CPU; against an equal-updates control, 2 seeds", [
        ("head gates, half the heads", "within 0.5 BLEU", "**{r[headline][gap_bleu_2000_mean]:.2f}** BLEU", "yes",
         "[report]({r})", {"r": "2026-11-26-head-gates-two-seeds"}),
        ("L0Drop, the freq rule at 50%, from scratch", "within 3% relative",
         "**{d[headline][relative_gap_pct_1700]:+.1f}%**", "no", "[report]({d})", {"d": "2026-11-28-l0drop-decisive"}),
        ("L0Drop, learned gates at {d[headline][pruned_pct_l0drop_scratch_quarter_850]:.0f}% pruned, a quarter of the "
         "pairs", "within 3% relative", "**{d[headline][relative_gap_pct_l0drop_scratch_quarter_850]:+.1f}%**", "no",
         "[report]({d})", {"d": "2026-11-28-l0drop-decisive"}),
        ("L0Drop, merge instead of drop, a quarter of the pairs", "recover the loss",
         "**{m[headline][relative_gap_pct_merge_mean]:+.1f}%** (drop {m[headline][relative_gap_pct_drop_mean]:+.1f}%)",
         "no", "[report]({m})", {"m": "2026-12-07-l0drop-merge"}),
        ("composed: simplified decoder, L0Drop 10%, half the heads", "within 1 BLEU",
         "**{r[headline][gap_bleu_2000_mean]:.2f}** BLEU", "no", "[report]({r})", {"r": "2026-11-27-composed-mild-target"}),
    ]),
    ("Translation, DDTP en-de, x256 fine-tuned from a GPU-trained baseline, H200, 2 seeds", [
        ("L0Drop, {x256[summary][mean_gap_after_1000_updates][l0drop][pruned]:.0%} pruned", "within 0.5 BLEU",
         "**{x256[summary][mean_gap_after_1000_updates][l0drop][gap]:.2f}** BLEU", "no", "[report]({x256})",
         {"x256": "2026-11-27-l0drop-gpu-ddtp-x256"}),
    ]),
    ("Summarisation, DDTP multi-document, one seed (weak summarisers)", [
        ("L0Drop", "70% pruned within 0.5 ROUGE-L",
         "**{r[headline][pruned_multidoc_test_target05_600_pct]:.1f}%** pruned, "
         "**{r[headline][rougeL_gap_target05_600]:.2f}** ROUGE-L", "no", "[report]({r})",
         {"r": "2026-11-26-summarisation-ddtp-multidoc"}),
    ]),
    ("Exactness, CPU and GPU, fp32", [
        ("pruned decoding (Algorithm 1)", "the full memory's hypotheses", "identical but for rare near-ties", "yes",
         "[docs](docs/l0drop.md#caveats), [tie]({t})", {"t": "2026-11-26-l0drop-gap-vs-target"}),
    ]),
    ("Speed, ratios against stock fairseq timed in the same run", [
        ("composed, CPU, one thread, 400 tokens", "2x", "**{r[headline][speed_vs_stock_400_seed1]:.2f}x**", "yes",
         "[report]({r})", {"r": "2026-11-27-composed-mild-target"}),
        ("composed, int8 TorchScript, CPU, 800 tokens", "faster than CTranslate2 int8",
         "**{r[headline][remeasured_2026_11_29][composed_int8_ts_vs_stock_800]:.2f}x** "
         "(CTranslate2 {r[headline][remeasured_2026_11_29][ct2_int8_vs_stock_800]:.2f}x)", "yes", "[report]({r})",
         {"r": "2026-11-25-speed-int8-artefacts"}),
        ("fixed-shape search, CUDA graphs, H200, batch 64, fp16", "3x fairseq-generate",
         "**{gpu[results][1][searches][fixed_shape][speedup_paired]:.2f}x**", "yes", "[report]({gpu})",
         {"gpu": "2026-11-27-fixed-shape-search-h200"}),
        ("L0Drop pruned decoding, H100, 400 tokens", "faster than stock",
         "**{r[headline][l0drop_pruned_vs_stock_400]:.2f}x**", "no", "[report]({r})",
         {"r": "2026-11-26-gpu-checks-h100"}),
    ]),
]


def load(folder):
    with open(os.path.join(REPO, "reports", folder, "results.json"), encoding="utf-8") as f:
        return json.load(f)


def table() -> str:
    """The table, header included: a line of conditions per group, then one line per row."""
    lines = [HEADER]
    for conditions, rows in GROUPS:
        lines.append(f"| **{conditions}** | | | | |")
        for method, goal, measured, met, where, reports in rows:
            data = {name: load(folder) for name, folder in reports.items()}
            links = {name: f"reports/{folder}/README.md" for name, folder in reports.items()}
            lines.append(f"| {method.format(**data)} | {goal} | {measured.format(**data)} | {met} | "
                         f"{where.format(**links)} |")
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
