"""Offline simplified-decoder demo (paper 004, Yang et al.), on the corpus and transformer of the L0Drop demo.

    scripts/demo.sh            # runs examples/l0drop_demo.py, examples/head_pruning_demo.py, then this

1. transformer_simplified_decoder (no FFN in the decoder) trained with exactly the stock transformer's
   command line and number of updates; BLEU, parameters, training words/s (fairseq-train's own wps)
   and decoding sentences/s (fairseq-generate's own) of both;
2. the universal probing decoder (fairseq-sparse-probe) on both: recovery perplexity of source and
   target per decoder module and layer, Figs. 3, 8 and 10 as PNG;
3. per-layer alignment error rate and cumulative coverage of the encoder-decoder attention
   (fairseq-sparse-attention-analysis with the corpus's gold alignments: Fig. 4).

Speeds here come from one run each on a tiny model; benchmarks/simplified_decoder.py measures the two
side by side at transformer-base size.
"""
import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from l0drop_demo import BIN, MODEL, TRAIN, USER_DIR, generate, prepare_data, sh, train_base  # noqa: E402


def console(name):
    return os.path.join(BIN, name)


def train_wps(log_path):
    """Median words/s of fairseq-train's periodic training log lines."""
    with open(log_path) as f:
        values = sorted(float(m) for m in re.findall(r"\| wps ([\d.]+) \|", f.read()))
    return values[len(values) // 2] if values else float("nan")


def parameters(log_path):
    with open(log_path) as f:
        m = re.search(r"num\. shared model params: ([\d,]+)", f.read())
    return int(m.group(1).replace(",", "")) if m else None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default="demo_out")
    p.add_argument("--train-sentences", type=int, default=20000)
    p.add_argument("--pretrain-updates", type=int, default=1500, help="updates of both models")
    p.add_argument("--probe-updates", type=int, default=300, help="updates of the probing decoders")
    p.add_argument("--quick", action="store_true", help="a much smaller run to check the pipeline")
    a = p.parse_args()
    if a.quick:
        a.train_sentences, a.pretrain_updates, a.probe_updates = 4000, 300, 30
    t0 = time.time()
    work = os.path.abspath(a.work_dir)
    out_dir = os.path.join(work, "simplified")
    os.makedirs(out_dir, exist_ok=True)
    data = prepare_data(work, a.train_sentences)
    base_ckpt = train_base(work, data, a.pretrain_updates)
    base_log = os.path.join(work, "train_transformer.log")

    print(f"== 7. transformer_simplified_decoder, the same command line and {a.pretrain_updates} updates")
    simp_dir = os.path.join(out_dir, "checkpoints")
    simp_ckpt = os.path.join(simp_dir, "checkpoint_last.pt")
    simp_log = os.path.join(out_dir, "train.log")
    if not os.path.exists(simp_ckpt):
        sh([console("fairseq-train"), data, "--user-dir", USER_DIR, "--arch", "transformer_simplified_decoder",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--save-dir", simp_dir,
            "--max-update", str(a.pretrain_updates)] + MODEL + TRAIN, simp_log)

    print("== 8. decode the test set (beam 4)")
    gen = {name: generate(data, ckpt, "test", log=os.path.join(out_dir, f"generate_{name}.log"))
           for name, ckpt in (("standard", base_ckpt), ("simplified", simp_ckpt))}

    print("== 9. probe every decoder module (fairseq-sparse-probe)")
    # small probes (width 64) so that 2 x 24 of them train in minutes on a CPU
    probe_args = ["--max-updates", str(a.probe_updates), "--max-tokens", "2048", "--probe-embed-dim", "64",
                  "--probe-ffn-dim", "256", "--cpu", "--no-progress-bar", "--overwrite"]
    sh([console("fairseq-sparse-probe"), data, "--path", base_ckpt, "--output-dir", os.path.join(out_dir, "probe_standard"),
        "--label", "standard"] + probe_args)
    sh([console("fairseq-sparse-probe"), data, "--path", simp_ckpt, "--output-dir", os.path.join(out_dir, "probe_simplified"),
        "--label", "simplified", "--compare", os.path.join(out_dir, "probe_standard", "probe.json")] + probe_args)

    print("== 10. alignment error rate and cumulative coverage per layer (fairseq-sparse-attention-analysis)")
    gold = os.path.join(work, "raw", "test.align")
    for name, ckpt in (("standard", base_ckpt), ("simplified", simp_ckpt)):
        sh([console("fairseq-sparse-attention-analysis"), data, "--path", ckpt, "--output-dir",
            os.path.join(out_dir, f"attention_{name}"), "--gold", gold, "--bpe-separator", "", "--cpu",
            "--no-progress-bar", "--overwrite"])

    def probe_rows(name):
        with open(os.path.join(out_dir, f"probe_{name}", "probe.json")) as f:
            return json.load(f)["results"]

    def attention_layers(name):
        with open(os.path.join(out_dir, f"attention_{name}", "attention.json")) as f:
            return json.load(f)["layers"]

    print("\n================ simplified decoder demo results ================")
    print(f"{'decoder':12s} {'parameters':>11s} {'BLEU':>6s} {'train wps':>10s} {'decode sent/s':>14s}")
    rows = {"standard": (base_log, gen["standard"]), "simplified": (simp_log, gen["simplified"])}
    for name, (log, g) in rows.items():
        print(f"{name:12s} {parameters(log) or 0:11,d} {g['bleu']:6.2f} {train_wps(log):10.0f} {g['sent_per_s']:14.1f}")
    s, b = rows["simplified"], rows["standard"]
    print(f"simplified vs standard: BLEU {s[1]['bleu'] - b[1]['bleu']:+.2f}, training {train_wps(s[0]) / train_wps(b[0]) - 1:+.1%}, "
          f"decoding {s[1]['sent_per_s'] / b[1]['sent_per_s'] - 1:+.1%} (one run each; see benchmarks/simplified_decoder.py)")
    for name in rows:
        res = probe_rows(name)
        layers = sorted({r["layer"] for r in res})
        for kind in ("source", "target"):
            cells = []
            for m in ("tem", "sem", "ifm", "addnorm1", "ffn"):
                v = {r["layer"]: r["ppl"] for r in res if r["kind"] == kind and r["module"] == m}
                if v:
                    cells.append(f"{m} " + "/".join(f"{v[l]:.1f}" for l in layers))
            print(f"probe PPL {name:10s} {kind:6s} (layers {'/'.join(map(str, layers))}): " + ", ".join(cells))
        att = attention_layers(name)
        print(f"attention {name:10s} AER per layer " + "/".join(f"{l['aer']:.3f}" for l in att)
              + ", cumulative coverage " + "/".join(f"{l['coverage']:.3f}" for l in att))
    print(f"plots: {out_dir}/probe_*/probe_*.png, {out_dir}/attention_*/layers.png; took {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
