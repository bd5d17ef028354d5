"""The options of transformer_l0drop (Zhang, Titov & Sennrich 2021): the L0Drop gates, the rule-based encoder
output patterns, pruned decoding and the compacted encoder, and their checks."""
import argparse
import math
from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from ..modules.encoder_merge import MERGE_CHOICES
from ..modules.encoder_patterns import PATTERNS
from ..modules.hard_concrete import DEFAULT_BETA, DEFAULT_GAMMA, DEFAULT_ZETA
from ..modules.l0drop import DROPPED_AS_CHOICES


#: how the L0 penalties of the gated layers combine under --l0drop-between-layers
LAYER_PENALTY_CHOICES = ("mean", "sum")


@dataclass
class L0DropConfig(FairseqDataclass):
    l0drop_beta: float = field(
        default=DEFAULT_BETA, metadata={"help": "HardConcrete temperature beta (Zhang, Titov & Sennrich 2021: 2/3)"}
    )
    l0drop_gamma: float = field(
        default=DEFAULT_GAMMA, metadata={"help": "HardConcrete stretch lower limit gamma = -eps (Zhang, Titov & Sennrich 2021: -0.1)"}
    )
    l0drop_zeta: float = field(
        default=DEFAULT_ZETA, metadata={"help": "HardConcrete stretch upper limit zeta = 1 + eps (Zhang, Titov & Sennrich 2021: 1.1)"}
    )
    l0drop_init_bias: float = field(
        default=3.0,
        metadata={"help": "initial bias b of log alpha = x.w + b (w starts at 0); 3.0 starts every gate "
                          "fully open (g_hat = 1), so fine-tuning starts from the converged model"},
    )
    l0drop_dropped_as: ChoiceEnum(DROPPED_AS_CHOICES) = field(
        default="zero",
        metadata={"help": "what a dropped encoder state is, in training and decoding alike: 'zero' = a zero "
                          "vector the decoder still attends to (Algorithm 1's counted dummy), 'mask' = removed "
                          "from the encoder-decoder attention"},
    )
    l0drop_between_layers: bool = field(
        default=False,
        metadata={"help": "also put L0Drop between every pair of encoder layers (Zhang, Titov & Sennrich 2021 Sec. 6, 'prune "
                          "encodings earlier'); a state dropped there stays dropped"},
    )
    l0drop_layer_penalty: ChoiceEnum(LAYER_PENALTY_CHOICES) = field(
        default="mean",
        metadata={"help": "with --l0drop-between-layers, how the L gated layers' L0 penalties combine (the paper "
                          "does not say): 'mean' (default) keeps --l0drop-lambda's single-gate meaning (lambda x "
                          "expected share of states kept), so a lambda tuned without the option (Zhang, Titov & "
                          "Sennrich 2021: 0.2-0.3) transfers whatever the depth; 'sum' makes one lambda act about "
                          "L times as strongly"},
    )
    encoder_output_pattern: ChoiceEnum(PATTERNS) = field(
        default="none",
        metadata={"help": "drop encoder outputs by a fixed rule instead of learnt gates (Zhang, Titov & Sennrich 2021 "
                          "Sec. 7): 'pos' function words, punctuation, MD, EX and non-initial subword pieces (tags "
                          "from --task translation_source_tags), 'freq' the most frequent source tokens, 'inv-freq' "
                          "the rarest, 'group' all but every k-th position; decoded through the same compressed "
                          "memory as L0Drop"},
    )
    encoder_output_pattern_whole_words: bool = field(
        default=False,
        metadata={"help": "freq, inv-freq: drop a subword piece only when its whole word is dropped (no word split "
                          "between kept and dropped pieces; drops less than the rate, which counts pieces)"},
    )
    encoder_output_merge: ChoiceEnum(MERGE_CHOICES) = field(
        default="none",
        metadata={"help": "fold each pruned encoder output into a kept one instead of dropping its content (the "
                          "nearest kept state to its left; leading ones into the first): 'mean' of the group, "
                          "'attention' a learned softmax weighting within it; the kept count and the compressed "
                          "memory are those of dropping. With learned gates or any --encoder-output-pattern"},
    )
    encoder_output_pattern_top_k: Optional[int] = field(
        default=None, metadata={"help": "freq: drop the K most frequent source tokens (the paper: 100)"})
    encoder_output_pattern_min_rank: Optional[int] = field(
        default=None, metadata={"help": "inv-freq: drop the tokens of frequency rank R and beyond (the paper: 452)"})
    encoder_output_pattern_every: Optional[int] = field(
        default=None, metadata={"help": "group: keep every k-th source position only (the paper: 2)"})
    encoder_output_pattern_rate: Optional[float] = field(
        default=None,
        metadata={"help": "instead of the pattern's own setting: the share of source tokens to drop (freq, "
                          "inv-freq: from the dictionary's counts; group: k = 1 / (1 - rate))"},
    )


def check_merge_args(args):
    """--encoder-output-merge: one of its choices, on the encoder output only."""
    merge = getattr(args, "encoder_output_merge", "none")
    if merge not in MERGE_CHOICES:
        raise ValueError(f"--encoder-output-merge must be one of {', '.join(MERGE_CHOICES)}, got {merge!r}")
    if merge != "none" and args.l0drop_between_layers:
        raise ValueError("--encoder-output-merge folds the pruned states of the encoder output; it does not combine "
                         "with --l0drop-between-layers (states dropped inside the encoder are gone before the output)")


PATTERN_SETTINGS = {"freq": "encoder_output_pattern_top_k", "inv-freq": "encoder_output_pattern_min_rank",
                    "group": "encoder_output_pattern_every"}


def check_pattern_args(args):
    """--encoder-output-pattern and its settings: one setting or a rate for the chosen rule, none without."""
    kind = args.encoder_output_pattern
    if kind not in PATTERNS:
        raise ValueError(f"--encoder-output-pattern must be one of {', '.join(PATTERNS)}, got {kind!r}")
    given = [f for f in list(PATTERN_SETTINGS.values()) + ["encoder_output_pattern_rate"]
             if getattr(args, f, None) is not None]
    option = lambda f: "--" + f.replace("_", "-")  # noqa: E731
    if kind == "none" and getattr(args, "encoder_output_pattern_whole_words", False):
        raise ValueError("--encoder-output-pattern-whole-words needs --encoder-output-pattern freq or inv-freq")
    if kind in ("none", "pos"):
        if given:
            raise ValueError(f"{option(given[0])} " + ("needs --encoder-output-pattern" if kind == "none" else
                             "does not apply to --encoder-output-pattern pos (its rule is fixed by the tags)"))
        if kind == "none":
            return
    wrong = [f for f in given if f not in (PATTERN_SETTINGS[kind], "encoder_output_pattern_rate")]
    if wrong:
        raise ValueError(f"{option(wrong[0])} does not apply to --encoder-output-pattern {kind}")
    if kind != "pos" and len(given) != 1:
        raise ValueError(f"--encoder-output-pattern {kind} needs exactly one of {option(PATTERN_SETTINGS[kind])} "
                         f"and --encoder-output-pattern-rate")
    rate = args.encoder_output_pattern_rate
    if rate is not None and not (math.isfinite(rate) and 0 <= rate < 1):
        raise ValueError(f"--encoder-output-pattern-rate must lie in [0, 1), got {rate}")
    setting = getattr(args, PATTERN_SETTINGS[kind]) if kind != "pos" else None
    if setting is not None and setting < (0 if kind == "freq" else 1):
        raise ValueError(f"{option(PATTERN_SETTINGS[kind])} must be >= {0 if kind == 'freq' else 1}, got {setting}")
    if getattr(args, "encoder_output_pattern_whole_words", False) and kind not in ("freq", "inv-freq"):
        raise ValueError(f"--encoder-output-pattern-whole-words applies to the freq and inv-freq patterns, not {kind}")
    if args.l0drop_between_layers:
        raise ValueError("--encoder-output-pattern replaces the gates of the encoder output; it does not combine "
                         "with --l0drop-between-layers")
    if (getattr(args, "l0drop_lambda", 0) or 0) > 0 or getattr(args, "l0drop_target_sparsity", None):
        raise ValueError("--encoder-output-pattern drops states by rule: there are no L0Drop gates for "
                         "--l0drop-lambda / --l0drop-target-sparsity to act on")


def parse_bool(value) -> bool:
    """--pruned-decoding / --compact-encoder: True / False (any case), 1 / 0, yes / no. Anything else is
    argparse's one-line error (fairseq's eval_bool evaluates the text as Python: 'foo' ended in a NameError)."""
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {value!r}")


PRUNED_DECODING_HELP = (
    "in eval mode, decode with the compressed memory of Algorithm 1 (exact; default True). Switch off "
    "at generation time with --model-overrides \"{'pruned_decoding': False}\""
)
COMPACT_ENCODER_HELP = (
    "with --l0drop-between-layers and pruned decoding: in fairseq's generators (fairseq-generate, "
    "fairseq-interactive, validation BLEU), states dropped after encoder layer k leave the sequence of layers "
    "k+1.. (shorter self-attention and FFN; exact, see CompactedEncoder; default True). Training keeps every "
    "state. Switch off with --model-overrides \"{'compact_encoder': False}\""
)
