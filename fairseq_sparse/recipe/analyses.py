"""The analyses of the recipe's models beside their test-set scores (:mod:`.decoding`): the attention analysis
(which source pieces L0Drop pruned, by token type or position in the word), the sparsity curve against the control
at the same updates, and what the fairseq-train logs say (validations, the sparsity after each gated layer); every
result cached with the identity of the checkpoints that produced it."""
import json
import os
import re
import statistics

from . import commands
from .decoding import Decoding
from .methods import BY_NAME, Method
from .options import CHAR_BOUNDARY


class Analyses:
    """The evaluations of one work dir's models: each decoding (``dec``, a :class:`~.decoding.Decoding`) and the
    analyses that belong to it."""

    def __init__(self, dec: Decoding):
        self.dec, self.a, self.wd, self.data = dec, dec.a, dec.wd, dec.data

    def evaluate(self, m: Method):
        """The test-set evaluation of M (and the analyses that belong to it)."""
        if m.decoding == "curve":
            return self.curve_points()
        row = self.dec.generate(m.name, self.dec.checkpoint(m))
        if m.full_memory:
            self.dec.full_memory(m)
        if m.attention_analysed:
            self.attention_analysis(m.name)
        return row

    def attention_analysis(self, name):
        """fairseq-sparse-attention-analysis of NAME's last checkpoint on the test split (teacher forced):
        entropy and max weight per layer and head, AER with --gold-alignments, kept vs pruned with L0Drop."""
        def compute():
            self.wd.run("report", commands.attention_analysis(self.a, self.data, name), f"attention.{name}.log")
            with open(self.wd.path(name, "attention", "attention.json")) as f:
                result = json.load(f)
            layers = result["layers"]
            row = {"entropy": statistics.mean(r["entropy_heads"] for r in layers),
                   "max_weight": statistics.mean(r["max_weight"] for r in layers),
                   "aer": result["align"]["aer"] if self.a.gold_alignments else None}
            if "l0drop" in result:
                words = pruned_tokens(self.wd.path(name, "attention", "l0drop_tokens.tsv"))
                if self.a.char_level:
                    from ..analysis.token_types import pruned_by_position

                    positions = pruned_by_position(words, CHAR_BOUNDARY, bins=5)
                    row["char_positions"], row["char_boundary"] = positions.rows(), positions.boundary()
                else:
                    row["token_types"] = self.pruned_token_types(words)
            return row

        return self.wd.cached(f"attention.{name}", [f"{name}/checkpoint_last.pt"], compute,
                              {"gold": self.a.gold_alignments, "bpe": bool(self.a.bpe_merges),
                               **({"char_level": True} if self.a.char_level else {})})

    def pruned_token_types(self, words):
        """Share of each token type's source pieces that L0Drop pruned."""
        from ..analysis import token_types as tt

        function_words = (tt.read_function_words(self.a.function_words) if self.a.function_words
                          else tt.ENGLISH_FUNCTION_WORDS)
        by_type = tt.pruned_by_type(words, "@@" if self.a.bpe_merges else None, function_words)
        return {t: {"tokens": by_type.count[t], "pruned": by_type.pruned[t], "share": share}
                for t, share in by_type.shares().items()}

    def curve_points(self):
        """fairseq-sparse-sparsity-curve over the curve's checkpoints, and the control's score at the same updates."""
        from ..analysis.sparsity_curve import saved_checkpoints
        from ..checkpoint_safety import read_state, state_updates

        curve_dir = self.wd.path("curve")
        self.wd.produced("curve/curve.tsv", [os.path.relpath(c, self.wd.work) for c in saved_checkpoints(curve_dir)],
                         lambda: self.wd.run("report", commands.sparsity_curve(self.a, self.data), "curve_tool.log"))
        with open(self.wd.path("curve", "curve.tsv")) as f:
            header, *lines = [l.rstrip("\n").split("\t") for l in f]
        points = [dict(zip(header, l)) for l in lines]
        control = {state_updates(read_state(c)): os.path.relpath(c, self.wd.work)
                   for c in saved_checkpoints(self.wd.path("control"))}
        # the tool's BLEU is sacrebleu on the tokens: the report's own score when the corpus is tokenised already
        tools_score = self.a.tokenizer == "none" and self.a.metric == "bleu"
        for p in points:
            u = int(float(p["updates"]))
            p["score"] = float(p["bleu"]) if tools_score else self.dec.generate(f"curve@{u}", p["checkpoint"])["score"]
            if u in control:
                p["control_score"] = self.dec.generate(*self.dec.at_updates(BY_NAME["control"], u, control))["score"]
        return points


def pruned_tokens(tokens_tsv):
    """[(sentence id, [(source piece, pruned)])] from the attention analysis's per-token table."""
    sentences = {}
    with open(tokens_tsv) as f:
        header = next(f).rstrip("\n").split("\t")
        for line in f:
            r = dict(zip(header, line.rstrip("\n").split("\t")))
            sentences.setdefault(int(r["id"]), []).append((int(r["position"]), r["token"], bool(int(r["pruned"]))))
    return [(sid, [(tok, p) for _, tok, p in sorted(s) if tok not in ("</s>", "<s>", "<pad>")])
            for sid, s in sentences.items()]


def validations(wd, name):
    """Every validation of NAME's fairseq-train log (JSON lines), in order: fairseq's valid_* statistics."""
    found = []
    with open(wd.path("logs", f"{name}.log")) as f:
        for line in f:
            head, _, body = line.partition("| {")
            if "| valid " in head and body:
                found.append(json.loads("{" + body))
    return found


def valid_curve(wd, name):
    """[(updates, valid loss, valid BLEU or None)] of NAME's validations: how far from converged it stopped."""
    return [(int(v["valid_num_updates"]), float(v["valid_loss"]),
             float(v["valid_bleu"]) if "valid_bleu" in v else None) for v in validations(wd, name)]


def layer_sparsity(wd, name):
    """Cumulative share of source states pruned after each gated encoder layer and at the output, from the
    last validation of NAME's fairseq-train log (JSON lines)."""
    found = validations(wd, name)
    if not found:
        return {}
    last = found[-1]
    rates = {k[len("valid_"):-len("_sparsity")]: float(v) for k, v in last.items()
             if re.fullmatch(r"valid_l0drop(_layer\d+)?_sparsity", k)}
    return dict(sorted(rates.items(), key=lambda kv: (kv[0] == "l0drop", kv[0])))
