"""One budget point of a pair whose runs have not finished (this session ran out before 1,700 updates): the recipe's
own evaluation (fairseq-generate on every test sentence, sacrebleu, the paired bootstrap, cached in the work dir as
the report step caches them) of the stock baseline's and the freq rule's checkpoints at UPDATES, and the gap analysis
of the pair (analysis/gap.py, as the gap_analysis step computes it), into WORK/point_UPDATES.json.

    python evaluate_point.py UPDATES RECIPE_OPTIONS...   # the options run.sh gives the recipe, --work-dir included
"""
import json
import sys

from fairseq_sparse.recipe import gap_analysis
from fairseq_sparse.recipe.budget import checkpoints_by_updates
from fairseq_sparse.recipe.decoding import paired_test_of
from fairseq_sparse.recipe.main import checked


def main():
    updates, argv = int(sys.argv[1]), sys.argv[2:]
    recipe = checked(argv)
    a, ev, wd = recipe.a, recipe.ev, recipe.wd
    recipe.fit()
    pair = {name: (f"{name}@{updates}", checkpoints_by_updates(wd, name)[updates])
            for name in ("baseline", "pattern_freq_scratch")}
    stock, freq = (ev.generate(*pair[name]) for name in pair)
    out = {**gap_analysis.compare(a, ev, pair["pattern_freq_scratch"], pair["baseline"]),
           "updates": updates, "stock": stock["score"], "freq": freq["score"],
           "gap": round(freq["score"] - stock["score"], 2),
           "relative_gap": round((freq["score"] - stock["score"]) / stock["score"], 4),
           "p_value": paired_test_of(a, stock, freq).get("p_value"),
           "sparsity": freq["l0drop_sparsity"]}  # what fairseq-generate prints, as the recipe's tables give it
    with open(wd.path(f"point_{updates}.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k not in ("by_length", "copy_recall")}, indent=1))


if __name__ == "__main__":
    main()
