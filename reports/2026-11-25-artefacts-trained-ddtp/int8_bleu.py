#!/usr/bin/env python
"""BLEU and CPU time of a float32 and an int8 TorchScript artefact of one checkpoint on a test split (issue 25).

Both files come from ``fairseq-sparse-export`` (the second with ``--int8``); each translates SOURCE (tokenised and
BPE'd as in training, one sentence per line) in batches, in turn, with one thread, and is timed by the process's
CPU time. The hypotheses are joined at '@@ ', Moses-detokenised (--detok-lang) and scored against REFERENCE (raw
text) with sacrebleu (13a); the int8 model's BLEU is tested against float32's with sacrebleu's paired bootstrap.

    python reports/2026-11-25-artefacts-trained-ddtp/int8_bleu.py --float32 m.ts.pt --int8 m.int8.ts.pt \\
        --source WORK/tok/test.bpe.en --reference CORPUS/test.de --detok-lang de
"""
import argparse
import json
import os
import time

import torch


def translate(path, lines, batch_size):
    model = torch.jit.load(path)
    hyps, start = [], time.process_time()
    with torch.no_grad():
        for i in range(0, len(lines), batch_size):
            batch = [model.encode(line) for line in lines[i:i + batch_size]]
            hyps += [model.decode(nbest[0]["tokens"]) for nbest in model.translate(batch)]
    return hyps, time.process_time() - start


def main(argv=None):
    from sacremoses import MosesDetokenizer

    from fairseq_sparse.analysis.scores import corpus_score, paired_bootstrap

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--float32", required=True)
    p.add_argument("--int8", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--reference", required=True)
    p.add_argument("--detok-lang", required=True)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--json")
    a = p.parse_args(argv)
    for option in ("float32", "int8", "source", "reference"):
        if not os.path.isfile(getattr(a, option)):
            p.error(f"--{option}: no such file {getattr(a, option)}")
    if a.batch_size < 1:
        p.error("--batch-size must be at least 1")
    if a.json and os.path.exists(a.json):
        p.error(f"--json {a.json} exists: not overwritten")
    torch.set_num_threads(1)
    with open(a.source, encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    with open(a.reference, encoding="utf-8") as f:
        refs = [line.strip() for line in f]
    if len(lines) != len(refs) or not lines:
        p.error(f"--source has {len(lines)} lines, --reference {len(refs)}: they must match, and not be empty")
    detok = MosesDetokenizer(lang=a.detok_lang)
    out = {}
    for name, path in (("float32", a.float32), ("int8", a.int8)):
        hyps, seconds = translate(path, lines, a.batch_size)
        hyps = [detok.detokenize((h + " ").replace("@@ ", "").split()) for h in hyps]
        out[name] = {"bleu": corpus_score("bleu", hyps, refs)[0], "cpu_s": seconds, "hyps": hyps}
        print(f"{name}: BLEU {out[name]['bleu']:.2f}, {seconds:.1f} s CPU ({len(lines)} sentences, beam as exported)")
    test = paired_bootstrap(out["float32"]["hyps"], out["int8"]["hyps"], refs)
    same = sum(x == y for x, y in zip(out["float32"]["hyps"], out["int8"]["hyps"]))
    print(f"int8 - float32: {out['int8']['bleu'] - out['float32']['bleu']:+.2f} BLEU (paired bootstrap {test}); "
          f"speed {out['float32']['cpu_s'] / out['int8']['cpu_s']:.2f}x; {same} of {len(lines)} hypotheses identical")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({k: {kk: vv for kk, vv in v.items() if kk != "hyps"} for k, v in out.items()}
                      | {"paired_bootstrap": test, "identical": same}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
