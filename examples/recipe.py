"""From a raw parallel corpus (or a fairseq data-bin) to the papers' result tables.

    .venv/bin/python examples/recipe.py --corpus DIR --source-lang en --target-lang de --work-dir runs/mine

DIR holds ``{train,valid,test}.{src,tgt}`` (one sentence per line, aligned). The steps, each a plain
console command that the report repeats, each skipped on a re-run once its output is complete:

1. ``prepare``: Moses tokenisation (sacremoses), joint BPE (subword-nmt), ``fairseq-preprocess``
   (``--data-bin DIR`` instead: an existing binarised corpus with a joined dictionary).
2. ``baseline``: a stock fairseq ``transformer`` (the converged model every method starts from).
3. one fine-tuning per method, each next to an equal-updates control (the baseline trained for the same
   extra updates without the method, so extra training is not mistaken for a method effect):
   ``l0drop`` (Zhang, Titov & Sennrich 2021, target sparsity), ``heads_enc`` (Voita et al. 2019 Sec. 6.2:
   encoder head gates, decoder frozen; control ``control_frozen``), ``heads_all`` (gates in all three
   attention types), ``curve`` (one run through a schedule of L0Drop targets, a checkpoint per target).
4. ``report``: BLEU (sacrebleu on detokenised output) of every model on the test split, sparsity,
   the commands, and the plots, in ``WORK/REPORT.md`` and ``WORK/results.json``.

Every size and budget is an option (``--help``). The recipe uses only the console scripts a user would.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
USER_DIR = os.path.join(REPO, "fairseq_sparse")
BIN = os.path.dirname(sys.executable)
SPLITS = ("train", "valid", "test")
STEPS = ("prepare", "baseline", "control", "l0drop", "control_frozen", "heads_enc", "heads_all", "curve", "report")


def fail(message):
    sys.exit(f"recipe.py: error: {message}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", help="folder with {train,valid,test}.{SRC,TGT} raw text")
    src.add_argument("--data-bin", help="an existing fairseq data-bin (joined dictionary) instead of --corpus")
    p.add_argument("--source-lang", "-s", required=True, help="source suffix (and Moses language code)")
    p.add_argument("--target-lang", "-t", required=True, help="target suffix (and Moses language code)")
    p.add_argument("--work-dir", required=True, help="every output goes here; a re-run skips finished steps")
    p.add_argument("--steps", default=",".join(STEPS),
                   help="comma-separated steps to run, in this order (steps after the baseline may run in parallel "
                        "processes, e.g. --steps control,l0drop,curve next to --steps control_frozen,heads_enc,heads_all)")
    g = p.add_argument_group("data")
    g.add_argument("--bpe-merges", type=int, default=8000, help="joint BPE merge operations")
    g.add_argument("--max-len", type=int, default=128, help="drop training pairs longer than this (BPE tokens)")
    g = p.add_argument_group("model (stock transformer; every method keeps these sizes)")
    g.add_argument("--layers", type=int, default=3, help="encoder and decoder layers")
    g.add_argument("--embed-dim", type=int, default=128)
    g.add_argument("--ffn-dim", type=int, default=512)
    g.add_argument("--heads", type=int, default=4, help="attention heads per layer")
    g.add_argument("--dropout", type=float, default=0.1)
    g = p.add_argument_group("budgets")
    g.add_argument("--max-tokens", type=int, default=4096)
    g.add_argument("--lr", type=float, default=2e-3, help="baseline peak learning rate (inverse_sqrt)")
    g.add_argument("--warmup-updates", type=int, default=500)
    g.add_argument("--baseline-updates", type=int, default=2610)
    g.add_argument("--finetune-lr", type=float, default=5e-4, help="fixed learning rate of every fine-tuning")
    g.add_argument("--finetune-updates", type=int, default=600, help="updates of every fine-tuning and control")
    g.add_argument("--sparsity-lr", type=float, default=0.05, help="adam_sparsity's rate for gates and multipliers")
    g.add_argument("--l0drop-target", type=float, default=0.5, help="L0Drop target sparsity")
    g.add_argument("--heads-target", type=float, default=0.5, help="head-gate target sparsity (share of heads closed)")
    g.add_argument("--curve-targets", default="0.3,0.5,0.7", help="L0Drop target schedule of the curve step")
    g.add_argument("--curve-updates", type=int, default=200, help="updates per target of the curve step")
    g.add_argument("--beam", type=int, default=5)
    g.add_argument("--batch-size", type=int, default=64, help="sentences per decoding batch")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--threads", type=int, default=0, help="torch threads per process (0: torch's default)")
    return p.parse_args(argv)


class Recipe:
    def __init__(self, args):
        self.args = args
        self.work = os.path.abspath(args.work_dir)
        self.data = os.path.abspath(args.data_bin) if args.data_bin else os.path.join(self.work, "data-bin")
        os.makedirs(self.work, exist_ok=True)
        self.commands_dir = os.path.join(self.work, "commands")  # one file per step: steps may run in parallel

    @staticmethod
    def _load_json(path, default):
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
        return default

    def _save_json(self, path, obj):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1)
        os.replace(tmp, path)

    def record(self, step, line):
        """Append LINE to the commands of STEP (once), for the report."""
        os.makedirs(self.commands_dir, exist_ok=True)
        if line not in self.commands(step):
            with open(os.path.join(self.commands_dir, f"{step}.sh"), "a") as f:
                f.write(line + "\n")

    def commands(self, step):
        path = os.path.join(self.commands_dir, f"{step}.sh")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return f.read().splitlines()

    def sh(self, step, cmd, log):
        """Run one console command, logging to WORK/logs/LOG; record it under STEP for the report."""
        line = " ".join(shlex.quote(c) for c in cmd).replace(self.work + "/", "").replace(REPO + "/", "")
        self.record(step, line)
        os.makedirs(os.path.join(self.work, "logs"), exist_ok=True)
        log_path = os.path.join(self.work, "logs", log)
        print(f"  $ {line[:300]}{' ...' if len(line) > 300 else ''}\n    (log: {log_path})", flush=True)
        env = dict(os.environ)
        if self.args.threads:
            env["OMP_NUM_THREADS"] = str(self.args.threads)
        with open(log_path, "w") as f:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=self.work)
        with open(log_path) as f:
            out = f.read()
        if proc.returncode != 0:
            fail(f"step {step} failed (exit {proc.returncode}); last lines of {log_path}:\n{out[-3000:]}")
        return out

    # ---- 1. prepare ------------------------------------------------------------------------------

    def check_inputs(self):
        """Every input problem, reported before any work starts."""
        a = self.args
        if a.corpus:
            from sacremoses.corpus import NonbreakingPrefixes

            known = NonbreakingPrefixes().available_langs
            for lang in (a.source_lang, a.target_lang):
                if lang not in known:
                    fail(f"no Moses tokeniser rules for language code {lang!r}; known: {', '.join(sorted(known))}")
            for split in SPLITS:
                counts = {}
                for lang in (a.source_lang, a.target_lang):
                    path = os.path.join(a.corpus, f"{split}.{lang}")
                    if not os.path.isfile(path):
                        fail(f"missing corpus file {path}")
                    with open(path, encoding="utf-8", errors="strict") as f:
                        counts[path] = sum(1 for _ in f)
                (p1, n1), (p2, n2) = counts.items()
                if n1 != n2:
                    fail(f"{p1} has {n1} lines but {p2} has {n2}: the sides are not aligned")
                if n1 == 0:
                    fail(f"{p1} is empty")
        else:
            for lang in (a.source_lang, a.target_lang):
                for name in [f"dict.{lang}.txt"] + [f"{s}.{a.source_lang}-{a.target_lang}.{lang}.bin" for s in SPLITS]:
                    path = os.path.join(self.data, name)
                    if not os.path.isfile(path):
                        fail(f"data-bin {self.data} lacks {name}")
            with open(os.path.join(self.data, f"dict.{a.source_lang}.txt"), "rb") as f1, \
                    open(os.path.join(self.data, f"dict.{a.target_lang}.txt"), "rb") as f2:
                if f1.read() != f2.read():
                    fail(f"data-bin {self.data}: the recipe shares all embeddings and needs a joined dictionary "
                         "(fairseq-preprocess --joined-dictionary)")

    def prepare(self):
        a = self.args
        if a.data_bin:
            print("  data-bin given: nothing to prepare")
            return
        if os.path.exists(os.path.join(self.data, "dict.%s.txt" % a.target_lang)):
            return self.skip("prepare", self.data)
        tok_dir = os.path.join(self.work, "tok")
        os.makedirs(tok_dir, exist_ok=True)
        self._tokenise(tok_dir)
        codes = os.path.join(tok_dir, "bpe.codes")
        if not os.path.exists(codes):
            self.sh("prepare", [os.path.join(BIN, "subword-nmt"), "learn-bpe", "-s", str(a.bpe_merges),
                                "-i", "tok/train.both", "-o", "tok/bpe.codes.tmp"], "learn_bpe.log")
            os.replace(codes + ".tmp", codes)
        for split in SPLITS:
            for lang in (a.source_lang, a.target_lang):
                out = os.path.join(tok_dir, f"{split}.bpe.{lang}")
                if not os.path.exists(out):
                    self.sh("prepare", [os.path.join(BIN, "subword-nmt"), "apply-bpe", "-c", "tok/bpe.codes",
                                        "-i", f"tok/{split}.{lang}", "-o", f"tok/{split}.bpe.{lang}.tmp"],
                            f"apply_bpe.{split}.{lang}.log")
                    os.replace(out + ".tmp", out)
        tmp = self.data + ".tmp"
        self.sh("prepare", [os.path.join(BIN, "fairseq-preprocess"), "--source-lang", a.source_lang,
                            "--target-lang", a.target_lang, "--trainpref", "tok/train.bpe", "--validpref",
                            "tok/valid.bpe", "--testpref", "tok/test.bpe", "--destdir", os.path.basename(tmp),
                            "--joined-dictionary", "--workers", "2"], "preprocess.log")
        os.replace(tmp, self.data)

    def _tokenise(self, tok_dir):
        """Moses tokenisation of every split (the recorded command is the equivalent sacremoses CLI)."""
        from sacremoses import MosesTokenizer

        a = self.args
        for lang in (a.source_lang, a.target_lang):
            tok = MosesTokenizer(lang=lang)
            for split in SPLITS:
                out = os.path.join(tok_dir, f"{split}.{lang}")
                if os.path.exists(out):
                    continue
                with open(os.path.join(a.corpus, f"{split}.{lang}"), encoding="utf-8") as f, \
                        open(out + ".tmp", "w", encoding="utf-8") as g:
                    for line in f:
                        g.write(tok.tokenize(line.strip(), escape=False, return_str=True) + "\n")
                os.replace(out + ".tmp", out)
            self.record("prepare", f"sacremoses -l {lang} -j 2 tokenize -x < CORPUS/SPLIT.{lang} > tok/SPLIT.{lang}")
        both = os.path.join(tok_dir, "train.both")
        if not os.path.exists(both):
            with open(both + ".tmp", "w", encoding="utf-8") as g:
                for lang in (a.source_lang, a.target_lang):
                    with open(os.path.join(tok_dir, f"train.{lang}"), encoding="utf-8") as f:
                        g.write(f.read())
            os.replace(both + ".tmp", both)

    def skip(self, step, output):
        print(f"  {step}: done already ({output}); skipped")

    # ---- 2. baseline -----------------------------------------------------------------------------

    def model_args(self):
        a = self.args
        return ["--encoder-layers", str(a.layers), "--decoder-layers", str(a.layers),
                "--encoder-embed-dim", str(a.embed_dim), "--decoder-embed-dim", str(a.embed_dim),
                "--encoder-ffn-embed-dim", str(a.ffn_dim), "--decoder-ffn-embed-dim", str(a.ffn_dim),
                "--encoder-attention-heads", str(a.heads), "--decoder-attention-heads", str(a.heads),
                "--share-all-embeddings", "--dropout", str(a.dropout)]

    def common_train_args(self):
        a = self.args
        return ["--max-tokens", str(a.max_tokens), "--seed", str(a.seed), "--cpu", "--num-workers", "0",
                "--skip-invalid-size-inputs-valid-test", "--max-source-positions", "1024",
                "--max-target-positions", "1024", "--required-batch-size-multiple", "1",
                "--log-format", "simple", "--log-interval", "100", "--no-epoch-checkpoints",
                "--eval-bleu", "--eval-bleu-args", json.dumps({"beam": 1}), "--eval-bleu-detok", "moses",
                "--eval-bleu-remove-bpe", "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"]

    def baseline(self):
        a = self.args
        out = os.path.join(self.work, "baseline")
        if self.finished(out, a.baseline_updates):
            return self.skip("baseline", out)
        self.sh("baseline", [os.path.join(BIN, "fairseq-train"), self.data, "--task", "translation",
                             "-s", a.source_lang, "-t", a.target_lang, "--arch", "transformer"] + self.model_args()
                + ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                   "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
                   "--lr", str(a.lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(a.warmup_updates),
                   "--max-update", str(a.baseline_updates), "--save-dir", "baseline",
                   "--keep-last-epochs", "1"] + self.common_train_args(), "baseline.log")

    @staticmethod
    def finished(save_dir, updates):
        """Whether a fairseq-train run in SAVE_DIR reached UPDATES (its last checkpoint says so)."""
        import torch

        last = os.path.join(save_dir, "checkpoint_last.pt")
        if not os.path.exists(last):
            return False
        state = torch.load(last, map_location="cpu", weights_only=False)
        return state["optimizer_history"][-1]["num_updates"] >= updates


    # ---- 3. fine-tunings, each next to an equal-updates control --------------------------------

    def finetune(self, name, arch, extra, updates=None, save_every=0, epoch_checkpoints=False):
        """fairseq-train from the baseline for --finetune-updates updates (the same optimiser, criterion,
        learning rate and batches for every method and its control); returns the save dir."""
        a = self.args
        out = os.path.join(self.work, name)
        updates = updates or a.finetune_updates
        if self.finished(out, updates):
            self.skip(name, out)
            return out
        cmd = [os.path.join(BIN, "fairseq-train"), self.data, "--user-dir", USER_DIR, "--task", "translation",
               "-s", a.source_lang, "-t", a.target_lang, "--arch", arch] + self.model_args() + [
            "--criterion", "label_smoothed_cross_entropy_with_sparsity", "--label-smoothing", "0.1",
            "--optimizer", "adam_sparsity", "--sparsity-lr", str(a.sparsity_lr), "--adam-betas", "(0.9, 0.98)",
            "--lr", str(a.finetune_lr), "--lr-scheduler", "fixed", "--max-update", str(updates),
            "--finetune-from-model", "baseline/checkpoint_best.pt", "--save-dir", name,
            "--save-interval-updates", str(save_every), "--keep-interval-updates", "-1"] + [
            x for x in self.common_train_args() if not x.startswith("--eval-bleu") and x not in (
                json.dumps({"beam": 1}), "moses", "bleu", "--maximize-best-checkpoint-metric", "--best-checkpoint-metric")
            and not (epoch_checkpoints and x == "--no-epoch-checkpoints")
        ] + list(extra)
        if os.path.isdir(out) and not os.path.exists(os.path.join(out, "checkpoint_last.pt")):
            pass  # an interrupted run without a checkpoint: start again
        elif os.path.isdir(out):  # interrupted after a checkpoint: fairseq resumes from checkpoint_last
            cmd.remove("--finetune-from-model")
            cmd.remove("baseline/checkpoint_best.pt")
        self.sh(name, cmd, f"{name}.log")
        return out

    def control(self):
        """Equal-updates control of the full fine-tunings (l0drop, heads_all) and the curve: the baseline,
        fine-tuned the same way without gates (checkpoints every --curve-updates for the curve's points)."""
        self.finetune("control", "transformer_head_gates", ["--head-gates", ""],
                      updates=max(self.args.finetune_updates, self.curve_updates()),
                      save_every=self.args.curve_updates, epoch_checkpoints=True)

    def l0drop(self):
        """L0Drop (Zhang, Titov & Sennrich 2021) asked for a share of pruned source states."""
        self.finetune("l0drop", "transformer_l0drop", ["--l0drop-target-sparsity", str(self.args.l0drop_target)])

    def control_frozen(self):
        """Equal-updates control of heads_enc: the decoder frozen, no gates."""
        self.finetune("control_frozen", "transformer_head_gates", ["--head-gates", "", "--freeze-decoder"])

    def heads_enc(self):
        """Voita et al. (2019) Sec. 6.2: gates on encoder self-attention heads only, the decoder frozen."""
        self.finetune("heads_enc", "transformer_head_gates", [
            "--head-gates", "enc", "--freeze-decoder", "--head-gates-target-sparsity", str(self.args.heads_target)])

    def heads_all(self):
        """Voita et al. (2019) Table 2 / Fig. 9: gates in all three attention types, one overall target (the
        model chooses which types lose heads)."""
        self.finetune("heads_all", "transformer_head_gates", [
            "--head-gates", "enc,dec,encdec", "--head-gates-target-sparsity", str(self.args.heads_target)])

    def curve_targets(self):
        return [float(t) for t in self.args.curve_targets.split(",")]

    def curve_updates(self):
        return len(self.curve_targets()) * self.args.curve_updates

    def curve(self):
        """One fine-tuning through a schedule of L0Drop targets, a checkpoint at the end of each
        (Zhang, Titov & Sennrich 2021 Fig. 4 from one run)."""
        a = self.args
        hold = a.curve_updates
        self.finetune("curve", "transformer_l0drop", [
            "--l0drop-target-sparsity", a.curve_targets, "--sparsity-target-hold-updates", str(hold),
            "--sparsity-target-warmup-updates", str(min(200, hold // 2))],
            updates=self.curve_updates(), save_every=hold, epoch_checkpoints=True)  # a target may end an epoch


    # ---- 4. evaluation and report ----------------------------------------------------------------

    def generate(self, key, ckpt):
        """BLEU (sacrebleu, default 13a, on Moses-detokenised hypotheses and references) of CKPT on the test
        split, every sentence decoded; the L0Drop sparsity rate when the model has L0Drop. Cached by KEY."""
        import sacrebleu

        results = self._load_json(self.results_file, {})
        if key in results.get("models", {}):
            return results["models"][key]
        a = self.args
        out = self.sh("report", [os.path.join(BIN, "fairseq-generate"), self.data, "--user-dir", USER_DIR,
                                 "--path", ckpt, "--gen-subset", "test", "-s", a.source_lang, "-t", a.target_lang,
                                 "--beam", str(a.beam), "--batch-size", str(a.batch_size), "--remove-bpe",
                                 "--tokenizer", "moses", "--required-batch-size-multiple", "1", "--cpu"],
                      f"generate.{key}.log")
        lines = [l.split("\t") for l in out.splitlines()]
        hyps = {int(f[0][2:]): f[2] for f in lines if f[0].startswith("D-")}
        refs = {int(f[0][2:]): f[1] if len(f) > 1 else "" for f in lines if f[0].startswith("T-")}
        ids = sorted(refs)
        bleu = sacrebleu.corpus_bleu([hyps[i] for i in ids], [[refs[i] for i in ids]])
        sparsity = re.search(r"L0Drop sparsity rate ([\d.]+)%", out)
        speed = re.search(r"Translated [\d,]+ sentences .* in ([\d.]+)s", out)
        row = {"bleu": round(bleu.score, 2), "sentences": len(ids), "checkpoint": os.path.relpath(ckpt, self.work),
               "l0drop_sparsity": float(sparsity.group(1)) / 100 if sparsity else None,
               "decode_seconds": float(speed.group(1)) if speed else None}
        results.setdefault("models", {})[key] = row
        self._save_json(self.results_file, results)
        return row

    def prune_heads(self, name):
        """fairseq-sparse-prune-heads on NAME's last checkpoint: heads kept per attention type."""
        pruned = os.path.join(self.work, name, "pruned.pt")
        log = os.path.join(self.work, "logs", f"prune.{name}.log")
        if not os.path.exists(pruned):
            self.sh("report", [os.path.join(BIN, "fairseq-sparse-prune-heads"), "--path",
                               f"{name}/checkpoint_last.pt", "--output", f"{name}/pruned.pt"], f"prune.{name}.log")
        with open(log) as f:
            out = f.read()
        kept = {t: sum(int(x) for x in re.findall(r"\d+", rows))
                for t, rows in re.findall(r"^\s*(enc|dec|encdec)\s+heads per layer: (.*)$", out, re.M)}
        total = re.search(r"kept (\d+) of (\d+) heads", out)
        return pruned, kept, (int(total.group(1)), int(total.group(2))) if total else None

    @property
    def results_file(self):
        return os.path.join(self.work, "results.json")

    def report(self):
        a = self.args
        ev = lambda name, ckpt="checkpoint_last.pt": self.generate(name, os.path.join(self.work, name, ckpt))  # noqa
        rows = {"baseline": self.generate("baseline", os.path.join(self.work, "baseline", "checkpoint_best.pt"))}
        for name in ("control", "l0drop", "control_frozen"):
            if self.finished(os.path.join(self.work, name), a.finetune_updates):
                rows[name] = ev(name)
        heads = {}
        for name in ("heads_enc", "heads_all"):
            if self.finished(os.path.join(self.work, name), a.finetune_updates):
                pruned, kept, total = self.prune_heads(name)
                rows[name] = self.generate(name, pruned)
                heads[name] = {"kept": kept, "total": total}
        curve = []
        if self.finished(os.path.join(self.work, "curve"), self.curve_updates()):
            curve = self.curve_points()
        results = self._load_json(self.results_file, {})
        results.update({"heads": heads, "curve": curve, "settings": vars(a)})
        self._save_json(self.results_file, results)
        self.write_report(rows, heads, curve)

    def curve_points(self):
        """fairseq-sparse-sparsity-curve over the curve's checkpoints, and the control's BLEU at the same updates."""
        a = self.args
        prefix = os.path.join(self.work, "curve", "curve")
        if not os.path.exists(prefix + ".tsv"):
            self.sh("report", [os.path.join(BIN, "fairseq-sparse-sparsity-curve"), self.data, "--user-dir", USER_DIR,
                               "--save-dir", "curve", "--gen-subset", "test", "--beam", str(a.beam),
                               "--batch-size", str(a.batch_size), "--remove-bpe", "--cpu",
                               "--output-prefix", "curve/curve"], "curve_tool.log")
        with open(prefix + ".tsv") as f:
            header, *lines = [l.rstrip("\n").split("\t") for l in f]
        points = [dict(zip(header, l)) for l in lines]
        from fairseq_sparse.analysis.sparsity_curve import read_state, saved_checkpoints, state_updates

        control = {state_updates(read_state(c)): c for c in saved_checkpoints(os.path.join(self.work, "control"))}
        for p in points:  # BLEU as for every other row of the report (the tool's is tokenised BLEU)
            u = int(float(p["updates"]))
            p["bleu"] = self.generate(f"curve@{u}", os.path.join(self.work, p["checkpoint"]))["bleu"]
            if u in control:
                p["control_bleu"] = self.generate(f"control@{u}", control[u])["bleu"]
        return points

    def write_report(self, rows, heads, curve):
        a = self.args
        lines = ["# fairseq_sparse recipe report", "",
                 f"Corpus: {a.corpus or a.data_bin} ({a.source_lang}-{a.target_lang}); model: stock transformer, "
                 f"{a.layers}+{a.layers} layers, width {a.embed_dim}, FFN {a.ffn_dim}, {a.heads} heads; baseline "
                 f"{a.baseline_updates} updates of <= {a.max_tokens} tokens; every fine-tuning {a.finetune_updates} "
                 f"updates at lr {a.finetune_lr} (gates and multipliers: --sparsity-lr {a.sparsity_lr}). BLEU: "
                 f"sacrebleu (13a) on the Moses-detokenised test split, beam {a.beam}, every sentence.", "",
                 "| model | what | BLEU | vs its control | sparsity |", "|---|---|---|---|---|"]
        control_of = {"l0drop": "control", "heads_all": "control", "heads_enc": "control_frozen",
                      "control": "baseline", "control_frozen": "baseline"}
        what = {"baseline": "stock transformer baseline", "control": "baseline + fine-tuning, no gates",
                "l0drop": f"L0Drop, target {a.l0drop_target}", "control_frozen": "as control, decoder frozen",
                "heads_enc": f"encoder head gates, decoder frozen, target {a.heads_target}",
                "heads_all": f"head gates in all three types, target {a.heads_target}"}
        for name, r in rows.items():
            ref = rows.get(control_of.get(name))
            delta = f"{r['bleu'] - ref['bleu']:+.2f} (vs {control_of[name]})" if ref else ""
            sparsity = ""
            if r.get("l0drop_sparsity") is not None:
                sparsity = f"{100 * r['l0drop_sparsity']:.1f}% of source states pruned"
            if name in heads and heads[name]["total"]:
                kept, total = heads[name]["total"]
                per = ", ".join(f"{t} {n}" for t, n in heads[name]["kept"].items())
                sparsity = f"{total - kept} of {total} heads closed (kept: {per})"
            lines.append(f"| {name} | {what.get(name, '')} | {r['bleu']:.2f} | {delta} | {sparsity} |")
        if curve:
            lines += ["", "One run through the L0Drop targets " + a.curve_targets + f" ({a.curve_updates} updates each):",
                      "", "| updates | target | sparsity | BLEU | control BLEU (same updates) | pruned punct. | "
                      "pruned function | pruned content |", "|---|---|---|---|---|---|---|---|"]
            for p in curve:
                lines.append("| " + " | ".join(str(p.get(k, "")) for k in (
                    "updates", "target_l0drop", "l0drop_sparsity", "bleu", "control_bleu", "pruned_punct",
                    "pruned_function", "pruned_content")) + " |")
            lines += ["", "![BLEU against sparsity](curve/curve.png)",
                      "![pruned share by token type](curve/curve_token_types.png)"]
        lines += ["", "## Commands", ""]
        for step in STEPS:
            if self.commands(step):
                lines += [f"### {step}", "", "```bash"] + self.commands(step) + ["```", ""]
        path = os.path.join(self.work, "REPORT.md")
        with open(path + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(path + ".tmp", path)
        print("\n".join(lines[:lines.index("## Commands")]))
        print(f"report: {path}")


def main(argv=None):
    args = parse_args(argv)
    recipe = Recipe(args)
    recipe.check_inputs()
    for step in args.steps.split(","):
        if not hasattr(recipe, step):
            fail(f"unknown step {step!r}")
    for step in args.steps.split(","):
        start = time.time()
        print(f"== {step}", flush=True)
        getattr(recipe, step)()
        print(f"   {step}: {time.time() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
