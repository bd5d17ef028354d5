"""Each model's test-set decoding (fairseq-generate, every sentence) and its score, cached with the identity of the
checkpoints that produced it: the checkpoint decoded for a method (heads cut out first where it has head gates), what
fairseq-generate prints read, and decodings compared (paired bootstrap, lead baseline, same hypotheses). The analyses
beside the scores: :mod:`.analyses`."""
import json
import os
import re

from . import commands
from .lengths import check_decoded
from .methods import BUDGET_DECODINGS, Method
from .options import decoding_changes
from .workdir import checkpoint_identity
from ..analysis.scores import corpus_score, lead, scorer_identity
from ..cli.common import kept_heads_path


class Decoding:
    """The test-set decodings of one work dir. ``a``: the recipe's options; ``wd``: its WorkDir; ``data``: the
    data-bin."""

    def __init__(self, a, wd, data):
        self.a, self.wd, self.data = a, wd, data

    def decoding_settings(self, overrides=None):
        a, metric = self.a, scorer_identity(self.a.metric, self.a.rouge_impl)  # ROUGE's scorer by name: a new one scores anew
        return {"beam": a.beam, "batch_size": a.batch_size, "metric": metric, "tokenizer": a.tokenizer,
                "bpe": bool(a.bpe_merges), "overrides": overrides, **decoding_changes(a),
                **({"device": a.device} if a.device != "cpu" else {})}  # CPU decodings keep their key

    def generate(self, key, checkpoint, overrides=None):
        """Score (BLEU: sacrebleu, 13a on Moses-detokenised text, or on the tokens with --tokenizer none; or ROUGE-L
        summary-level, with ROUGE-1/2 and bootstrap 95% intervals: analysis.scores.corpus_score)
        of CHECKPOINT (relative to WORK) on the test split, every sentence decoded; the L0Drop sparsity rate
        fairseq-generate prints; the parameters. Cached by KEY and what produced it."""
        return self.wd.cached(key, [checkpoint], lambda: self._generate(key, checkpoint, overrides),
                              self.decoding_settings(overrides))

    def _generate(self, key, checkpoint, overrides):
        out = self.wd.run("report", commands.generate(self.a, self.data, key, checkpoint, overrides),
                          f"generate.{key}.log")
        lines = generate_lines(out)
        check_decoded(self.a, self.data, key, lines)  # every test document, none skipped
        hyps = {i: f[1] for i, f in lines["D"].items()}
        scores = {i: float(f[0]) for i, f in lines["H"].items()}
        refs = {i: f[0] if f else "" for i, f in lines["T"].items()}
        ids = sorted(refs)
        score, details = corpus_score(self.a.metric, [hyps[i] for i in ids], [refs[i] for i in ids],
                                      "13a" if self.a.tokenizer == "moses" else "none", self.a.rouge_impl)
        # fairseq-generate has no machine-readable output: its end-of-run lines are read as printed
        sparsity = re.search(r"L0Drop sparsity rate ([\d.]+)%", out)
        # summarisation: each test source's lead sentence as the baseline read it (BPE removed, truncated), for the
        # lead baseline beside the models (the sources are the same in every decoding: kept once)
        leads = ({"leads": [lead(lines["S"][i][0]) for i in ids]} if self.a.metric == "rouge" and key == "baseline"
                 else {})
        return {"score": score, **details, "sentences": len(ids), "checkpoint": checkpoint, **leads,
                "l0drop_sparsity": float(sparsity.group(1)) / 100 if sparsity else None,
                "decode_seconds": decode_seconds(out),
                "parameters": parameters(self.wd.path(checkpoint)),
                "hypotheses": [[hyps[i], scores.get(i)] for i in ids], "references": [refs[i] for i in ids]}

    def checkpoint(self, m: Method):
        """The checkpoint the report decodes for M (relative to WORK); heads cut out first where M has head gates."""
        if m.decoding == "best":
            return f"{m.name}/checkpoint_best.pt"
        if m.decoding == "importance":
            return "importance/pruned.pt"
        if m.heads_cut_out(self.a):
            return self.prune_heads(m.name)
        return f"{m.name}/checkpoint_last.pt"

    def at_updates(self, m: Method, updates, checkpoints):
        """(key, checkpoint) of M's decoding after UPDATES updates: M's own evaluation where its last checkpoint
        has those updates (the same weights, decoded once), else CHECKPOINTS[UPDATES] ({updates: checkpoint}),
        heads cut out where M cuts them (the last checkpoint's updates: its identity, read once per file version)."""
        last = checkpoint_identity(self.wd.path(m.name, "checkpoint_last.pt"))
        if m.decoding in BUDGET_DECODINGS and updates == last["updates"]:
            return m.name, self.checkpoint(m)
        ckpt = checkpoints[updates]
        return f"{m.name}@{updates}", self.prune_heads(m.name, ckpt) if m.heads_cut_out(self.a) else ckpt

    def full_memory(self, m: Method):
        """M decoded with pruned decoding off: every encoder layer over every state, the full memory."""
        return self.generate(f"{m.name}@full-memory", self.checkpoint(m), "{'pruned_decoding': False}")

    def prune_heads(self, name, checkpoint=None):
        """fairseq-sparse-prune-heads on NAME's last checkpoint (or CHECKPOINT; again when it changed); the
        smaller checkpoint (NAME/pruned.pt, or NAME/pruned_<checkpoint name>.pt)."""
        source = checkpoint or f"{name}/checkpoint_last.pt"
        pruned = f"{name}/pruned.pt" if checkpoint is None else f"{name}/pruned_{os.path.basename(checkpoint)}"
        log = f"prune.{name}.log" if checkpoint is None else f"prune.{name}.{os.path.basename(checkpoint)}.log"
        self.wd.produced(pruned, [source], lambda: self.wd.run("report", commands.prune_heads(source, pruned), log))
        return pruned

    def heads_kept(self, name, pruned=None):
        """Heads kept per attention type and in all, from the kept-heads JSON fairseq-sparse-prune-heads wrote
        next to NAME/pruned.pt (or PRUNED, relative to WORK)."""
        with open(self.wd.path(kept_heads_path(pruned or f"{name}/pruned.pt"))) as f:
            spec = json.load(f)
        kept = {t: sum(len(layer) for layer in layers) for t, layers in spec.items()}
        return {"kept": kept, "total": (sum(kept.values()), sum(self.a.heads * len(layers) for layers in spec.values()))}


def decode_seconds(out):
    """The decoding time fairseq-generate prints at its end ("Translated N sentences ... in X s"), or None."""
    speed = re.search(r"Translated [\d,]+ sentences .* in ([\d.]+)s", out)
    return float(speed.group(1)) if speed else None


def generate_lines(out):
    """fairseq-generate's output lines by kind: {"S"|"T"|"H"|"D": {sentence id: [the tab-separated fields after
    the id]}} (S: source, T: reference, H: score and hypothesis pieces, D: score and detokenised hypothesis)."""
    lines = {kind: {} for kind in "STHD"}
    for fields in (line.split("\t") for line in out.splitlines()):
        kind, _, i = fields[0].partition("-")
        if kind in lines and i.isdigit():
            lines[kind][int(i)] = fields[1:]
    return lines


def parameters(checkpoint):
    from ..checkpoint_safety import read_state

    return int(sum(v.numel() for v in read_state(checkpoint)["model"].values() if hasattr(v, "numel")))


def significance(a, rows, control_of):
    """{model: the paired bootstrap of its score against its control's (BLEU: sacrebleu's; ROUGE-L: over
    documents)} (rows decoded before references were kept are left out)."""
    out = {}
    for name, row in rows.items():
        control = rows.get(control_of.get(name))
        if control and "references" in row and "references" in control:
            out[name] = paired_test_of(a, control, row)
    return out


def paired_test_of(a, control, row):
    """The paired bootstrap of one decoding against its control's, in the run's metric."""
    from ..analysis.scores import paired_test

    return paired_test(a.metric, [h for h, _ in control["hypotheses"]], [h for h, _ in row["hypotheses"]],
                       row["references"], "13a" if a.tokenizer == "moses" else "none")


def lead_baseline(a, baseline):
    """The lead baseline of summarisation beside the models: the ROUGE of each test source's first sentence
    (``leads`` of the baseline's decoding) and the baseline's paired bootstrap against it, or None where the
    decoding kept no leads (BLEU, or decoded before they were kept)."""
    if "leads" not in baseline:
        return None
    score, details = corpus_score("rouge", baseline["leads"], baseline["references"], rouge_impl=a.rouge_impl)
    lead_row = {"hypotheses": [[h, None] for h in baseline["leads"]], "references": baseline["references"]}
    return {"score": score, **details, "documents": len(baseline["leads"]),
            "baseline_against_lead": paired_test_of(a, lead_row, baseline)}


def distinct_outputs(row):
    """Distinct outputs per test input (1: every input got its own output): a summariser that writes the same
    few texts whatever it reads scores near 0."""
    hyps = [h for h, _ in row["hypotheses"]]
    return round(len(set(hyps)) / len(hyps), 4) if hyps else None


def same_hypotheses(x, y):
    """Whether two decodings gave the same hypotheses, the test sentences (0-based, in id order) where they differ,
    and the largest score difference where the hypotheses agree (different outputs differ in score anyway)."""
    pairs = list(zip(x["hypotheses"], y["hypotheses"]))
    differ = [i for i, ((h, _), (g, _)) in enumerate(pairs) if h != g]
    diff = max((abs(s - t) for (h, s), (g, t) in pairs if h == g and s is not None and t is not None), default=0.0)
    return {"identical": not differ, "sentences": len(x["hypotheses"]), "differ": differ, "max_score_difference": diff}
