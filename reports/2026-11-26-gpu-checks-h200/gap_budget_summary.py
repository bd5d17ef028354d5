"""The table of reports/2026-11-26-gpu-checks-h200/gap_budget_gpu.sh's decodings: for each seed and budget, sacreBLEU (13a, the
detokenised hypotheses against the detokenised references of fairseq-generate's output) of the control and of
L0Drop, the gap with sacrebleu's paired bootstrap, and the share of source states L0Drop prunes at test time
(its training log's last value at or before that update).

    python reports/2026-11-26-gpu-checks-h200/gap_budget_summary.py OUT       (OUT as given to gap_budget_gpu.sh)
"""
import json
import re
import sys
from pathlib import Path

from sacrebleu.metrics import BLEU

from fairseq_sparse.analysis.scores import paired_bootstrap
from fairseq_sparse.recipe.decoding import generate_lines


def decoding(path):
    """(hypotheses, references) in sentence-id order."""
    lines = generate_lines(path.read_text())
    ids = sorted(lines["D"])
    return [lines["D"][i][1] for i in ids], [lines["T"][i][0] for i in ids]


def pruned_share(log, update):
    """L0Drop's test-time share of pruned source states logged last at or before ``update``."""
    share = None
    for line in log.read_text().splitlines():
        if "| train_inner |" in line:
            record = json.loads(line[line.index("{"):])
            if int(record["num_updates"]) <= update:
                share = float(record["l0drop_test_time_sparsity"])
    return share


def main(out):
    out = Path(out)
    if not (out / "gen").is_dir():
        raise SystemExit(f"{out}/gen: no such folder (the OUT given to gap_budget_gpu.sh)")
    found = sorted({(int(m[1]), int(m[2])) for m in (re.fullmatch(r"l0drop_s(\d+)@(\d+)\.txt", p.name)
                                                      for p in (out / "gen").iterdir()) if m})
    if not found:
        raise SystemExit(f"{out}/gen holds no l0drop_s<SEED>@<UPDATES>.txt decodings")
    print("| seed | updates | control BLEU | L0Drop BLEU | gap | p | pruned (test time) |")
    print("|---|---|---|---|---|---|---|")
    gaps = {}
    for seed, updates in found:
        if not (out / "gen" / f"control_s{seed}@{updates}.txt").is_file():
            raise SystemExit(f"seed {seed}, {updates} updates: no control decoding to compare with")
        control, refs = decoding(out / "gen" / f"control_s{seed}@{updates}.txt")
        method, method_refs = decoding(out / "gen" / f"l0drop_s{seed}@{updates}.txt")
        if refs != method_refs:
            raise SystemExit(f"seed {seed}, {updates} updates: the control's and L0Drop's decodings have other references")
        c, m = (BLEU().corpus_score(h, [refs]).score for h in (control, method))
        test = paired_bootstrap(control, method, refs)
        share = pruned_share(out / f"l0drop_s{seed}.log", updates)
        gaps.setdefault(updates, []).append(m - c)
        print(f"| {seed} | {updates:,} | {c:.2f} | {m:.2f} | {m - c:+.2f} | {test['p_value']:.4f} | {'-' if share is None else f'{share:.1%}'} |")
    for updates, values in sorted(gaps.items()):
        print(f"mean gap at {updates:,} updates over {len(values)} seed(s): {sum(values) / len(values):+.2f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
