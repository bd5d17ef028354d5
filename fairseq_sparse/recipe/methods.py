"""The recipe's method table: one row per model the recipe trains (or derives) and reports.

The step list, each model's equal-updates control, how it is evaluated and the report's row order all
follow from :data:`METHODS`. Adding a method is one row here plus its page in docs/.
"""
from dataclasses import dataclass, replace
from typing import Callable, List, Optional, Tuple

#: how a trained model is decoded for the report
#:   best: checkpoint_best.pt (trained from scratch, best by validation)
#:   last: checkpoint_last.pt
#:   heads_pruned: closed heads cut out of checkpoint_last.pt (fairseq-sparse-prune-heads)
#:   layered: checkpoint_last.pt (heads cut out when it has head gates), L0Drop between encoder layers
#:   importance: the importance step's pruned checkpoint (no training)
#:   curve: every checkpoint of a target schedule (fairseq-sparse-sparsity-curve)
DECODINGS = ("best", "last", "heads_pruned", "layered", "importance", "curve")
#: decodings whose intermediate checkpoints the budget table can decode as they are (or with heads cut out)
BUDGET_DECODINGS = ("last", "heads_pruned", "layered")


def _none(a) -> List[str]:
    return []


@dataclass(frozen=True)
class Method:
    """One model of the recipe.

    ``flags(a)``: its fairseq-train options beyond the shared command line (``a``: the recipe's options);
    ``start``: the model it is fine-tuned from (None: trained from scratch with the baseline's budget;
    ``arch`` None: no training at all); ``what(a)``: the report's one-line description; ``summary``: the
    line printed when its step starts."""
    name: str
    summary: str
    what: Callable[..., str]
    arch: Optional[str] = None
    flags: Callable[..., List[str]] = _none
    start: Optional[str] = "baseline"
    control: Optional[str] = None
    decoding: str = "last"
    opt_in: bool = False
    attention_analysed: bool = False
    source_tags: bool = False
    checkpoint_every: bool = False  # a checkpoint every --curve-updates (the curve's control points)
    full_memory: bool = False  # also decoded with pruned decoding off: the hypotheses must be identical

    def __post_init__(self):
        assert self.decoding in DECODINGS, self.decoding

    def heads_cut_out(self, a) -> bool:
        """Whether the decoded checkpoint has heads cut out (fairseq-sparse-prune-heads)."""
        return self.decoding in ("heads_pruned", "importance") or (
            self.decoding == "layered" and "--head-gates" in self.flags(a))


def target_flags(option: str, target: float, a) -> List[str]:
    """A sparsity target that rises from 0 over --target-warmup-updates (at most half the fine-tuning)."""
    return [option, str(target), "--sparsity-target-warmup-updates",
            str(min(a.target_warmup_updates, a.finetune_updates // 2))]


def l0drop_flags(a, target: Optional[float] = None) -> List[str]:
    """L0Drop's pressure: a fixed penalty weight (--l0drop-lambda; the paper's protocol, Zhang, Titov & Sennrich
    2021 Sec. 6: lambda 0.3, the sparsity whatever it reaches) or else a target sparsity (TARGET, by default
    --l0drop-target); what a dropped state is
    (--l0drop-dropped-as), the gates' initial bias (--l0drop-init-bias), temperature (--l0drop-beta) and w's rate
    (--l0drop-weight-lr), each only where it is not the default."""
    flags = [] if a.l0drop_dropped_as == "zero" else ["--l0drop-dropped-as", a.l0drop_dropped_as]
    for option in ("init_bias", "beta", "weight_lr"):  # the last is adam_sparsity's, for L0Drop's w
        if getattr(a, f"l0drop_{option}") is not None:
            flags += [f"--l0drop-{option.replace('_', '-')}", str(getattr(a, f"l0drop_{option}"))]
    pressure = (["--l0drop-lambda", str(a.l0drop_lambda)] if a.l0drop_lambda
                else target_flags("--l0drop-target-sparsity", a.l0drop_target if target is None else target, a))
    return flags + pressure


def l0drop_pressure(a, target: Optional[float] = None) -> str:
    pressure = (f"lambda {a.l0drop_lambda}" if a.l0drop_lambda
                else f"target {a.l0drop_target if target is None else target}")
    return pressure + (", dropped states masked" if a.l0drop_dropped_as == "mask" else "")


def regulariser_name(a) -> str:
    return "minimum-entropy" if a.attention_reg == "entropy" else "max-L-inf"


def _regulariser(a) -> List[str]:
    return ["--attention-reg", a.attention_reg, "--attention-reg-lambda", str(a.attention_reg_lambda)]


def _pattern(kind: str, what: str, row_name: str) -> Method:
    return Method(
        row_name, f"rule-based pattern: {what} (Zhang, Titov & Sennrich 2021 Sec. 7)",
        what=lambda a: {"freq": f"most frequent source tokens dropped by rule, rate {a.l0drop_target}",
                        "inv-freq": f"rarest source tokens dropped by rule, rate {a.l0drop_target}",
                        "group": f"every {max(1, round(1 / (1 - a.l0drop_target)))}-th source position kept by rule"
                        }[kind],
        arch="transformer_l0drop", control="control",
        flags=lambda a: ["--encoder-output-pattern", kind, "--encoder-output-pattern-rate", str(a.l0drop_target)])


def merged(m: Method, kind: str) -> Method:
    """Method M with its pruned encoder outputs folded into kept ones (--encoder-output-merge KIND): the same kept
    count and decoding cost, the dropped states' content kept."""
    return replace(m, name=f"{m.name}_merge_{kind}", summary=f"{m.summary}; pruned states merged into kept ones "
                   f"({kind})", what=lambda a: f"{m.what(a)}, pruned states merged ({kind})", opt_in=True,
                   flags=lambda a: m.flags(a) + ["--encoder-output-merge", kind])


def whole_words(m: Method) -> Method:
    """Rule M with a subword piece dropped only where its whole word is (``<name>_words``): no word split between
    kept and dropped pieces, and fewer states dropped than the rate's share of pieces."""
    return replace(m, name=f"{m.name}_words", summary=f"{m.summary}; a piece dropped only with its whole word",
                   what=lambda a: f"{m.what(a)}, whole words only (fewer dropped)", opt_in=True,
                   flags=lambda a: m.flags(a) + ["--encoder-output-pattern-whole-words"])


#: every model, in the order the recipe runs its steps and the report lists its rows
METHODS: Tuple[Method, ...] = (
    Method("baseline", "the stock fairseq transformer every method starts from",
           lambda a: "stock transformer" + (f", at most {a.baseline_updates} updates" if a.baseline_patience
                                             else f", {a.baseline_updates} updates"),
           arch="transformer", start=None, decoding="best"),
    Method("control", "equal-updates control: the baseline fine-tuned the same way without a method",
           lambda a: f"baseline + {a.finetune_updates} updates, no method",
           arch="transformer_head_gates", control="baseline", flags=lambda a: ["--head-gates", ""],
           attention_analysed=True, checkpoint_every=True),
    Method("l0drop", "L0Drop (Zhang, Titov & Sennrich 2021) asked for a share of pruned source states (or a fixed "
                     "lambda)",
           lambda a: f"L0Drop, {l0drop_pressure(a)}, pruned decoding",
           arch="transformer_l0drop", control="control", attention_analysed=True, full_memory=True,
           flags=l0drop_flags),
    Method("l0drop_low", "L0Drop at a second target (--l0drop-target-low) beside the same control",
           lambda a: f"L0Drop, {l0drop_pressure(a, a.l0drop_target_low)}, pruned decoding",
           arch="transformer_l0drop", control="control", opt_in=True, full_memory=True,
           flags=lambda a: l0drop_flags(a, a.l0drop_target_low)),
    Method("l0drop_layers", "L0Drop between every pair of encoder layers and on the output "
                            "(Zhang, Titov & Sennrich 2021 Sec. 6); fairseq-generate compacts the encoder",
           lambda a: f"L0Drop between encoder layers and on the output, {l0drop_pressure(a)}, "
                     "compacted encoder, pruned decoding",
           arch="transformer_l0drop", control="control", decoding="layered", opt_in=True, full_memory=True,
           flags=lambda a: ["--l0drop-between-layers"] + l0drop_flags(a)),
    Method("simplified", "Yang et al. (2020) Sec. 3.3: decoder layers without FFN, trained exactly as the baseline",
           lambda a: "simplified decoder (no decoder FFN), trained as the baseline",
           arch="transformer_simplified_decoder", start=None, control="baseline", decoding="best"),
    Method("simplified_control", "equal-updates control of composed: the simplified decoder fine-tuned, no gates",
           lambda a: f"simplified + {a.finetune_updates} updates, no method",
           arch="transformer_simplified_decoder", start="simplified", control="simplified", opt_in=True,
           flags=lambda a: ["--head-gates", ""]),
    Method("composed", "every method in one model: the simplified decoder with L0Drop between layers and head "
                       "gates, closed heads cut out",
           lambda a: f"simplified decoder + L0Drop between layers ({l0drop_pressure(a, a.composed_l0drop_target)}) "
                     f"+ head gates on {a.composed_head_gates} (target {a.heads_target}), closed heads cut out",
           arch="transformer_l0drop", start="simplified", control="control", decoding="layered", opt_in=True,
           full_memory=True, flags=lambda a: ["--simplified-decoder", "--l0drop-between-layers", "--head-gates", a.composed_head_gates]
           + l0drop_flags(a, a.composed_l0drop_target) + target_flags("--head-gates-target-sparsity", a.heads_target, a)),
    Method("pattern_pos", "rule-based pattern: function words, punctuation, MD, EX and non-initial subword pieces "
                          "dropped, from POS tags of the source (Zhang, Titov & Sennrich 2021 Sec. 7)",
           lambda a: "function words, punctuation, MD, EX, non-initial subword pieces dropped by rule (POS tags)",
           arch="transformer_l0drop", control="control", opt_in=True, source_tags=True,
           flags=lambda a: ["--encoder-output-pattern", "pos"]),
    _pattern("freq", "the most frequent source tokens dropped", "pattern_freq"),
    _pattern("inv-freq", "the rarest source tokens dropped", "pattern_inv_freq"),
    _pattern("group", "every k-th source position kept", "pattern_group"),
    Method("heads_all", "Voita et al. (2019): head gates in all three attention types, one overall target",
           lambda a: f"head gates in all three types, target {a.heads_target}, closed heads cut out",
           arch="transformer_head_gates", control="control", decoding="heads_pruned",
           flags=lambda a: ["--head-gates", "enc,dec,encdec"]
           + target_flags("--head-gates-target-sparsity", a.heads_target, a)),
    Method("attention_reg", "Zhang, Zhao, Li & Zong (2019): the minimum-entropy (Eq. 15) or max-L-inf (Eq. 14) "
                            "regulariser on the encoder-decoder attention",
           lambda a: f"{regulariser_name(a)} attention regulariser, lambda {a.attention_reg_lambda}",
           arch="transformer_head_gates", control="control", attention_analysed=True,
           flags=lambda a: ["--head-gates", ""] + _regulariser(a)),
    Method("coverage", "Zhang, Zhao, Li & Zong (2019) Sec. V: NMT+Coverage (Eqs. 21-22)",
           lambda a: "coverage model on the encoder-decoder attention",
           arch="transformer_head_gates", control="control", attention_analysed=True,
           flags=lambda a: ["--head-gates", "", "--encdec-attention-coverage"]),
    Method("coverage_entropy", "Zhang, Zhao, Li & Zong (2019) Table I: NMT+Cov+Ent",
           lambda a: f"coverage model and the {regulariser_name(a)} regulariser, lambda {a.attention_reg_lambda}",
           arch="transformer_head_gates", control="control", attention_analysed=True,
           flags=lambda a: ["--head-gates", "", "--encdec-attention-coverage"] + _regulariser(a)),
    Method("importance", "Michel et al. (2019): head importance of the baseline, its pruning curves, the least "
                         "important heads cut out (no training)",
           lambda a: f"{a.importance_fraction:.0%} of the {a.importance_types} heads with the lowest importance cut "
                     "out of the baseline, no training",
           control="baseline", decoding="importance"),
    Method("control_frozen", "equal-updates control of heads_enc: the decoder frozen, no gates",
           lambda a: "as control, decoder frozen",
           arch="transformer_head_gates", control="baseline", flags=lambda a: ["--head-gates", "", "--freeze-decoder"]),
    Method("heads_enc", "Voita et al. (2019) Sec. 6.2: encoder head gates only, the decoder frozen",
           lambda a: f"encoder head gates, decoder frozen, target {a.heads_target}, closed heads cut out",
           arch="transformer_head_gates", control="control_frozen", decoding="heads_pruned",
           flags=lambda a: ["--head-gates", "enc", "--freeze-decoder"]
           + target_flags("--head-gates-target-sparsity", a.heads_target, a)),
    Method("curve", "one fine-tuning through a schedule of L0Drop targets, a checkpoint at the end of each "
                    "(Zhang, Titov & Sennrich 2021 Fig. 4 from one run)",
           lambda a: f"L0Drop through the targets {a.curve_targets}",
           arch="transformer_l0drop", decoding="curve",
           flags=lambda a: ["--l0drop-target-sparsity", a.curve_targets,
                            "--sparsity-target-hold-updates", str(a.curve_updates),
                            "--sparsity-target-warmup-updates", str(min(a.target_warmup_updates, a.curve_updates // 2))]),
)

#: the methods the recipe also trains with merging instead of dropping (``<name>_merge_mean``, ``_merge_attention``)
MERGED_OF = ("l0drop", "pattern_freq")
METHODS = METHODS + tuple(merged(m, kind) for m in METHODS if m.name in MERGED_OF for kind in ("mean", "attention"))
METHODS = METHODS + tuple(whole_words(m) for m in METHODS if m.name == "pattern_freq")
#: the methods the recipe can also train from random weights (``<name>_scratch``), beside the stock baseline
SCRATCH_OF = ("l0drop", "l0drop_low", "heads_all", "pattern_freq", "pattern_pos", "pattern_group", "l0drop_merge_mean",
              "l0drop_merge_attention", "pattern_freq_merge_mean", "pattern_freq_merge_attention", "pattern_freq_words")
#: the options of a sparsity pressure (a gated method's): held back until --scratch-pressure-start from scratch
PRESSURE_OPTIONS = ("--l0drop-target-sparsity", "--head-gates-target-sparsity", "--l0drop-lambda")


def scratch_flags(flags, a):
    """A method's fine-tuning options made a training from random weights: a gated method's pressure (target or
    fixed lambda) held back until update --scratch-pressure-start, then ramped in over --scratch-pressure-ramp
    updates, so that the gates cannot close while the model is still a language model (Zhang, Titov & Sennrich
    2021 Sec. 6 ramp lambda over 200k of 300k updates; pressure from update 0 closed every gate here,
    docs/recipe.md#sparse-from-scratch-a-continued-fine-tuning-and-the-data-axis). Rule-based patterns drop their states from update 0."""
    flags = list(flags)
    if not any(f in flags for f in PRESSURE_OPTIONS):
        return flags
    start, ramp = (str(u) for u in scratch_pressure(a))
    if "--sparsity-target-warmup-updates" in flags:
        flags[flags.index("--sparsity-target-warmup-updates") + 1] = ramp
    else:
        flags += ["--sparsity-warmup-updates", ramp]
    return flags + ["--sparsity-start-update", start]


def scratch_pressure(a) -> Tuple[int, int]:
    """(first update with pressure, updates of its ramp) of a gated method trained from scratch: the options, or a
    third of --baseline-updates each."""
    return tuple(a.baseline_updates // 3 if u is None else u for u in (a.scratch_pressure_start, a.scratch_pressure_ramp))


def from_scratch(m: Method) -> Method:
    """Method M trained from random weights with the baseline's command line, budget and batches (its control:
    the baseline, at equal updates: ``--scratch-budget-points``); decoded from its last checkpoint, since a best
    checkpoint by validation could be one from before its pressure reached the target."""
    return replace(m, name=f"{m.name}_scratch", summary=f"{m.summary}, trained from scratch beside the baseline",
                   what=lambda a: f"{m.what(a)}, trained from scratch (pressure from update {scratch_pressure(a)[0]}, "
                                  f"ramped over {scratch_pressure(a)[1]})"
                   if any(f in m.flags(a) for f in PRESSURE_OPTIONS) else f"{m.what(a)}, trained from scratch",
                   start=None, control="baseline", opt_in=True, checkpoint_every=False,
                   decoding=m.decoding if m.decoding in BUDGET_DECODINGS else "last",
                   flags=lambda a: scratch_flags(m.flags(a), a))


METHODS = METHODS + tuple(from_scratch(m) for m in METHODS if m.name in SCRATCH_OF)
BY_NAME = {m.name: m for m in METHODS}
#: steps that are not a model: preparing the data, the benchmarks, the report
STEPS: Tuple[str, ...] = (("prepare", "baseline", "distill_data") + tuple(m.name for m in METHODS[1:])
                          + ("speed", "gap_analysis", "report"))
OPT_IN_STEPS: Tuple[str, ...] = tuple(m.name for m in METHODS if m.opt_in) + ("distill_data", "speed", "gap_analysis")
DEFAULT_STEPS: Tuple[str, ...] = tuple(s for s in STEPS if s not in OPT_IN_STEPS)
#: every model of the report -> its equal-updates control
CONTROL_OF = {m.name: m.control for m in METHODS if m.control}
STEP_SUMMARY = {"prepare": "tokenise, BPE and binarise the corpus",
                "distill_data": "sequence-level distillation data: the baseline's beam-5 translations of the "
                                "training sources (Kim & Rush 2016 Sec. 3.2), for --seq-kd",
                "speed": "the benchmarks on the trained models' shapes, against stock fairseq",
                "gap_analysis": "where each source-pruning model loses against its control at equal updates: by "
                                "segment type and source length, brevity, copied words by pruned or kept, train "
                                "and valid NLL (no training)",
                "report": "every finished model's results in WORK/REPORT.md and WORK/results.json",
                **{m.name: m.summary for m in METHODS}}


def updates_of(method: Method, a) -> int:
    """Updates a trained method's run reaches: the baseline's budget from scratch, every target's hold for
    the curve, --finetune-updates otherwise."""
    if method.start is None:
        return a.baseline_updates
    if method.decoding == "curve":
        return len(a.curve_targets.split(",")) * a.curve_updates
    return a.finetune_updates
