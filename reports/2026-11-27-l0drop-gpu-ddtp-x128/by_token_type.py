"""What seed 1's GPU-trained L0Drop model (target 0.5, 800 updates) prunes, by token type (Zhang, Titov & Sennrich
2021, Sec. 6: punctuation and function words first, other subword pieces before first pieces), from the tokens table
of fairseq-sparse-attention-analysis on the test split (the brought-back fp16 checkpoint, on the CPU):

    fairseq-sparse-attention-analysis DATA_BIN --user-dir fairseq_sparse --path s1_l0drop_checkpoint_last.pt \\
        --gen-subset test --output-dir OUT --device cpu --bpe-separator @@ --source-lang en --target-lang de
    python3 reports/2026-11-27-l0drop-gpu-ddtp-x128/by_token_type.py OUT/l0drop_tokens.tsv

Writes token_types.json here: per type, its pieces, the share pruned, and the mean summed attention of its kept and
pruned pieces. Types without part-of-speech tags (fairseq_sparse.analysis.token_types' word-list fallback).
"""
import csv
import json
import os
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from fairseq_sparse.analysis.token_types import TOKEN_TYPES, TYPE_NAMES, piece_types, pruned_by_type  # noqa: E402


def main(tsv):
    sentences = defaultdict(list)
    with open(tsv, encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            sentences[int(row["id"])].append((row["token"], row["pruned"] == "1", float(row["summed_attention"])))
    counts = pruned_by_type(((sid, [(t, p) for t, p, _ in pieces]) for sid, pieces in sentences.items()), "@@")
    attention = defaultdict(list)
    for pieces in sentences.values():
        for kind, (_, pruned, att) in zip(piece_types([t for t, _, _ in pieces], "@@"), pieces):
            attention[(kind, pruned)].append(att)
    shares = counts.shares()
    out = {t: {"name": TYPE_NAMES[t], "pieces": counts.count[t], "pruned": round(shares[t], 4) if shares[t] else None,
               "summed_attention_kept": round(sum(attention[(t, False)]) / max(1, len(attention[(t, False)])), 3),
               "summed_attention_pruned": round(sum(attention[(t, True)]) / max(1, len(attention[(t, True)])), 3)}
           for t in TOKEN_TYPES}
    out["all"] = {"pieces": sum(counts.count.values()),
                  "pruned": round(sum(counts.pruned.values()) / sum(counts.count.values()), 4)}
    with open(os.path.join(HERE, "token_types.json"), "w") as f:
        json.dump(out, f, indent=1)
    for t, v in out.items():
        print(t, v)


if __name__ == "__main__":
    main(sys.argv[1])
