"""One budget point of a pair whose runs have not finished (this session ran out before 1,700 updates): the recipe's
own evaluation (fairseq-generate on every test sentence, sacrebleu, the paired bootstrap, cached in the work dir as
the report step caches them) of the stock baseline's and the freq rule's checkpoints at UPDATES, and the gap analysis
of the pair (analysis/gap.py, as the gap_analysis step computes it), into WORK/point_UPDATES.json.

    python evaluate_point.py UPDATES RECIPE_OPTIONS...   # the options run.sh gives the recipe, --work-dir included
"""
import json
import os
import sys

from fairseq_sparse.analysis import gap
from fairseq_sparse.recipe import gap_analysis
from fairseq_sparse.recipe.budget import checkpoints_by_updates
from fairseq_sparse.recipe.evaluation import paired_test_of
from fairseq_sparse.recipe.main import checked


def main():
    updates, argv = int(sys.argv[1]), sys.argv[2:]
    recipe = checked(argv)
    a, ev, wd = recipe.a, recipe.ev, recipe.wd
    recipe.fit()
    rows, ckpts = {}, {}
    for name in ("baseline", "pattern_freq_scratch"):
        ckpts[name] = checkpoints_by_updates(wd, name)[updates]
        rows[name] = ev.generate(f"{name}@{updates}", ckpts[name])
    stock, freq = rows["baseline"], rows["pattern_freq_scratch"]
    test = paired_test_of(a, stock, freq)
    refs, hyps = freq["references"], [h for h, _ in freq["hypotheses"]]
    ctrl = [h for h, _ in stock["hypotheses"]]
    os.makedirs(wd.path("gap_analysis"), exist_ok=True)
    by_id = gap_analysis.gates(a, wd, ev.data, f"pattern_freq_scratch@{updates}", ckpts["pattern_freq_scratch"])
    ids = sorted(by_id)
    sources = [gap.source_words(by_id[i][0][:-1], by_id[i][1][:-1], "@@") for i in ids]
    lengths = [gap.length_bucket(len(by_id[i][0]) - 1) for i in ids]
    types = gap_analysis.segment_types(a, len(refs))
    out = {"updates": updates, "stock": stock["score"], "freq": freq["score"],
           "gap": round(freq["score"] - stock["score"], 2),
           "relative_gap": round((freq["score"] - stock["score"]) / stock["score"], 4), "p_value": test.get("p_value"),
           "sparsity": freq["l0drop_sparsity"], "checkpoints": ckpts,
           "brevity": {"freq": gap.brevity(hyps, refs), "stock": gap.brevity(ctrl, refs)},
           "by_segment_type": gap.by_group(types, ctrl, hyps, refs) if types else None,
           "by_length": gap.by_group(lengths, ctrl, hyps, refs),
           "copy_recall": {"freq": gap.copy_recall(sources, refs, hyps), "stock": gap.copy_recall(sources, refs, ctrl)},
           "nll": {name: gap_analysis.nll(a, wd, ev.data, f"{name}@{updates}", ckpts[name]) for name in ckpts}}
    with open(wd.path(f"point_{updates}.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k not in ("by_length", "copy_recall")}, indent=1))


if __name__ == "__main__":
    main()
