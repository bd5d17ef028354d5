"""The recipe's speed step: the benchmarks (fairseq_sparse.benchmarks) on the trained models' shapes, each timing its variants side by
side in one process against stock fairseq; and the report's rows, read from the benchmarks' JSON."""
import os
import sys

from .methods import BY_NAME, updates_of
from .paths import SPEED_MODULES
from .workdir import load_json


def timing_flags(a):
    """The benchmarks' timing: one thread and CPU time on the CPU (steadier on a shared machine); the wall clock,
    CUDA synchronised, on a GPU."""
    clock = ["--threads", "1", "--clock", "cpu"] if a.device == "cpu" else ["--clock", "wall"]
    return ["--device", a.device] + clock + ["--repeats", str(a.speed_repeats), "--beam", str(a.beam), "--no-memory"]


def benchmark_runs(a, wd, data):
    """(name, whether its model is ready, benchmark command line) of each benchmark the recipe runs."""
    timing = timing_flags(a)
    with open(os.path.join(data, f"dict.{a.source_lang}.txt")) as f:
        vocab = sum(1 for _ in f) + 4
    shapes = ["--layers", str(a.layers), "--dim", str(a.embed_dim), "--heads", str(a.heads), "--ffn",
              str(a.ffn_dim), "--vocab", str(vocab)]
    runs = [("l0drop", wd.finished("l0drop", updates_of(BY_NAME["l0drop"], a)),
             ["--path", "l0drop/checkpoint_last.pt", "--data", data,
              "--gen-subset", "test", "--lengths", a.speed_lengths, "--batch-size", "10"]),
            ("heads", os.path.exists(wd.path("importance", "mask.json")),
             ["--from-mask", "importance/mask.json", "--batch-sizes", str(a.speed_batch),
              "--no-bound"] + shapes),
            ("simplified", wd.finished("simplified", a.baseline_updates),
             ["--no-bleu", "--batch-size", str(a.speed_batch)] + shapes)]
    return [(name, ready, [sys.executable, "-m", SPEED_MODULES[name]] + cmd + timing
             + ["--json", f"speed/{name}.json"]) for name, ready, cmd in runs]


def speed(a, wd, data):
    """Each benchmark whose model is ready and that has not run yet (L0Drop's pruned decoding on the l0drop
    checkpoint, test sentences concatenated to --speed-lengths; the importance step's head mask and the
    simplified decoder on random weights of the models' shapes: speed depends on shapes only)."""
    os.makedirs(wd.path("speed"), exist_ok=True)
    for name, ready, cmd in benchmark_runs(a, wd, data):
        out = wd.path("speed", f"{name}.json")
        if os.path.exists(out):
            print(f"  speed ({name}): done already ({out}); skipped")
        elif not ready:
            print(f"  speed ({name}): its model is not trained yet; skipped")
        else:
            wd.run("speed", cmd, f"speed.{name}.log")


def _l0drop_rows(result):
    return [(f"L0Drop pruned decoding, {r['length']}-token inputs (batch 10)",
             f"{r['speedup_vs_stock']:.2f}x vs stock, {r['speedup_vs_unpruned_paired']:.2f}x vs the same "
             f"checkpoint unpruned", f"{100 * r['sparsity']:.1f}% of the states pruned; hypotheses "
             f"{'identical' if r['identical_hypotheses'] else 'DIFFER'} to unpruned") for r in result.get("rows", [])]


def _heads_rows(result):
    rows = []
    for batch, res in result.get("rows", {}).items():
        for variant, r in res.items():
            if variant.startswith("mask"):
                v = result["variants"][variant]
                rows.append((f"heads removed by importance ({v['heads_kept']}/{v['heads_total']} kept), "
                             f"batch {batch}", f"{r['vs_full-stock_paired'] - 1:+.1%} sent/s vs stock",
                             f"{r['vs_full-same-path_paired'] - 1:+.1%} vs the full model on the same code path"))
    return rows


def _simplified_rows(result):
    rows = []
    for part, unit in (("train", "training words/s"), ("infer", "decoding sent/s")):
        r = result.get("speed", {}).get(part, {}).get("simplified")
        if r:
            rows.append((f"simplified decoder, {unit}", f"{r['vs_standard_paired'] - 1:+.1%} vs stock", ""))
    return rows


def speed_results(wd):
    """(rows (what, ratio against stock fairseq, note), noise lines) from WORK/speed/*.json."""
    rows, noise = [], []
    for name, to_rows in (("l0drop", _l0drop_rows), ("heads", _heads_rows), ("simplified", _simplified_rows)):
        result = load_json(wd.path("speed", f"{name}.json"))
        if result is None:
            continue
        rows += to_rows(result)
        if result.get("meta", {}).get("noise"):
            noise.append(f"{name}: {result['meta']['noise']}")
    return rows, noise
