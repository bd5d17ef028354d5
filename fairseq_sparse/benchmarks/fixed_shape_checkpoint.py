#!/usr/bin/env python
"""fairseq-generate with the fixed-shape search (``--task translation_fixed_shape``) against plain fairseq-generate
(``--task translation``) on a trained checkpoint, side by side in one run: the time, the share of identical
hypotheses and the BLEU of each, in fp32 and (``--fp16``, CUDA) fp16.

Each (precision, search) is one fairseq-generate process on the same split, rounds interleaved (the order rotated
every round). Time: the generation time fairseq-generate prints ("Translated N sentences ... in X s", model loading
left out) and the process's wall time, medians over rounds; the speed-up is fairseq's over the fixed-shape search's
at the same precision. Identical: the share of sentences whose hypothesis (H- line) is fairseq fp32's. BLEU:
sacrebleu (13a) of the D- lines against the T- lines, so pass the data's post-processing in ``--generate-args``
(e.g. ``--remove-bpe --tokenizer moses``) to score detokenised text. Each decoding prints its line when it ends,
and with ``--json`` every round is written as it ends (marked ``partial`` until the last): a run cut short keeps
what it measured.

Usage:
  python -m fairseq_sparse.benchmarks.fixed_shape_checkpoint DATA_BIN --path CKPT --generate-args "-s en -t de --remove-bpe"
  python -m fairseq_sparse.benchmarks.fixed_shape_checkpoint DATA_BIN --path CKPT --device cuda --fp16 --json out.json
"""
import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time

from fairseq_sparse.benchmarks import bench_common

SEARCHES = {"fairseq": "translation", "fixed_shape": "translation_fixed_shape"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="the data-bin the checkpoint was trained on")
    p.add_argument("--path", required=True, help="the checkpoint")
    p.add_argument("--gen-subset", default="test")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds per (precision, search)")
    p.add_argument("--generate-args", default="", help="more fairseq-generate options, given to every run")
    p.add_argument("--fixed-shape-args", default="",
                   help="options of the fixed-shape runs only (e.g. --fixed-shape-step-form prefix: its own eager "
                        "steps, where the default, auto, runs fairseq's search without a CUDA graph)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--fp16", action="store_true", help="fp16 runs too (CUDA only)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    from fairseq_sparse.cli.common import ToolError, check_output_files, device_error

    for path, what in ((args.data, "the data-bin"), (args.path, "--path")):
        if not os.path.exists(path):
            p.error(f"{what} {path} does not exist")
    for name in ("beam", "batch_size", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.fp16 and args.device != "cuda":
        p.error("--fp16 needs --device cuda (fairseq-generate decodes fp16 on a GPU only)")
    if device_error(args.device):
        p.error(device_error(args.device))
    for option in ("generate_args", "fixed_shape_args"):
        try:
            shlex.split(getattr(args, option))
        except ValueError as e:
            p.error(f"--{option.replace('_', '-')}: {e}")
    try:  # never over the checkpoint or a file of the data-bin
        check_output_files([("--json", args.json)], overwrite=True, inputs=[args.path], data=args.data)
    except ToolError as e:
        p.error(str(e))
    return args


def command(args, search, fp16):
    exe = os.path.join(os.path.dirname(sys.executable), "fairseq-generate")
    return ([exe, args.data, "--user-dir", bench_common.USER_DIR, "--path", args.path, "--gen-subset", args.gen_subset,
             "--task", SEARCHES[search], "--beam", str(args.beam), "--batch-size", str(args.batch_size),
             "--required-batch-size-multiple", "1"] + (["--cpu"] if args.device == "cpu" else [])
            + (["--fp16"] if fp16 else []) + shlex.split(args.generate_args)
            + (shlex.split(args.fixed_shape_args) if search == "fixed_shape" else []))


def run_once(cmd):
    """(wall seconds, generation seconds, {id: H text}, {id: D text}, {id: T text}) of one fairseq-generate run, its
    output read as the recipe reads it."""
    from fairseq_sparse.recipe.decoding import decode_seconds, generate_lines

    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    seconds = decode_seconds(proc.stdout + proc.stderr)
    if proc.returncode != 0 or seconds is None:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = generate_lines(proc.stdout)
    text = {kind: {i: fields[-1] if fields else "" for i, fields in lines[kind].items()} for kind in "HDT"}
    return wall, seconds, text["H"], text["D"], text["T"]


def summary(runs, times, outputs):
    """(sentences, one row per (precision, search)) over the rounds measured so far: median times, hypotheses
    identical to fairseq's in fp32, BLEU, the speed-up against fairseq's search in the same precision."""
    from fairseq_sparse.analysis.scores import bleu

    ref_h, _, refs = outputs[("fp32", "fairseq")]
    ids = sorted(refs)
    rows = []
    for precision, search in runs:
        h, d, _ = outputs[(precision, search)]
        rows.append({"precision": precision, "search": search,
                     "generate_s": statistics.median(g for _, g in times[(precision, search)]),
                     "wall_s": statistics.median(w for w, _ in times[(precision, search)]),
                     "identical_to_fairseq_fp32": sum(h.get(i) == ref_h.get(i) for i in ids) / len(ids),
                     "bleu": bleu([d.get(i, "") for i in ids], [refs[i] for i in ids]),
                     "rounds": [list(t) for t in times[(precision, search)]]})
    for row in rows:
        base = next(r for r in rows if r["precision"] == row["precision"] and r["search"] == "fairseq")
        row["speedup_generate"] = base["generate_s"] / row["generate_s"]
    return len(ids), rows


def main(argv=None):
    from fairseq_sparse.cli.common import write_json

    args = parse_args(argv)
    facts = argparse.Namespace(device=args.device, fp16=args.fp16, clock="wall")
    started = bench_common.start(facts)
    runs = [(p, s) for p in (["fp32", "fp16"] if args.fp16 else ["fp32"]) for s in SEARCHES]
    times = {r: [] for r in runs}
    outputs = {}
    for i in range(args.rounds):
        for r in runs[i % len(runs):] + runs[:i % len(runs)]:
            wall, gen, h, d, t = run_once(command(args, r[1], r[0] == "fp16"))
            times[r].append((wall, gen))
            outputs[r] = (h, d, t)
            print(f"round {i + 1} of {args.rounds}: {r[0]} {r[1]}: generate {gen:.2f} s, wall {wall:.1f} s", flush=True)
        if args.json and i + 1 < args.rounds:  # what a run cut short leaves: every round measured so far
            sentences, rows = summary(runs, times, outputs)
            write_json(args.json, {"settings": bench_common.settings_of(args), "partial": f"{i + 1} of {args.rounds} "
                                   "rounds", "sentences": sentences, "results": rows})
    sentences, rows = summary(runs, times, outputs)
    print(f"fairseq-generate, --task translation_fixed_shape against translation: {args.path}, {sentences} sentences "
          f"of {args.gen_subset}, beam {args.beam}, batch {args.batch_size}, {args.device}, median of {args.rounds} "
          "rounds")
    print(f"{'precision':>9} {'search':>11} {'generate s':>10} {'speed-up':>8} {'wall s':>7} {'identical':>9} "
          f"{'BLEU':>6}")
    for r in rows:
        print(f"{r['precision']:>9} {r['search']:>11} {r['generate_s']:>10.2f} {r['speedup_generate']:>8.2f} "
              f"{r['wall_s']:>7.1f} {100 * r['identical_to_fairseq_fp32']:>8.1f}% {r['bleu']:>6.2f}")
    meta = bench_common.machine_facts(facts, started)
    bench_common.finish(args, started, meta, {"sentences": sentences, "results": rows})


if __name__ == "__main__":
    main()
