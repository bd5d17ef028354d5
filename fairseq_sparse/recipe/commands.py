"""Pure builders of the recipe's command lines (lists of strings, relative to the work dir): what a user would
type, and what the report repeats. Nothing here runs or reads anything."""
import json
import math
import os
from functools import reduce

from .methods import PRESSURE_OPTIONS, Method, updates_of
from .options import CHAR_BOUNDARY, depths
from .paths import BIN, USER_DIR


def tool(name):
    """A console script of the environment the recipe runs in."""
    return os.path.join(BIN, name)


def lang_flags(a):
    return ["--source-lang", a.source_lang, "--target-lang", a.target_lang]


def model_flags(layers, embed_dim, ffn_dim, heads, dropout=None, decoder_layers=None):
    """fairseq's transformer sizes, the same in the encoder and the decoder (but for DECODER_LAYERS where given),
    embeddings shared (also what the benchmarks and the test fixtures build)."""
    return ["--encoder-layers", str(layers), "--decoder-layers", str(layers if decoder_layers is None else decoder_layers),
            "--encoder-embed-dim", str(embed_dim), "--decoder-embed-dim", str(embed_dim),
            "--encoder-ffn-embed-dim", str(ffn_dim), "--decoder-ffn-embed-dim", str(ffn_dim),
            "--encoder-attention-heads", str(heads), "--decoder-attention-heads", str(heads),
            "--share-all-embeddings"] + ([] if dropout is None else ["--dropout", str(dropout)])


def recipe_model_flags(a):
    norm = ["--encoder-normalize-before", "--decoder-normalize-before"] if getattr(a, "pre_norm", False) else []
    encoder_layers, decoder_layers = depths(a)
    return model_flags(encoder_layers, a.embed_dim, a.ffn_dim, a.heads, a.dropout, decoder_layers) + norm


def position_flags(a):
    """The models' positions (lengths.fit sets them from the prepared data: --truncate-source + 1, or the longest
    source, at least fairseq's 1024; the longest target, at least 1024), in training and decoding alike."""
    return ["--max-source-positions", str(a.max_source_positions),
            "--max-target-positions", str(a.max_target_positions)]


def cpu_flag(a):
    """fairseq's --cpu under --device cpu; none under cuda (fairseq's own device selection)."""
    return ["--cpu"] if a.device == "cpu" else []


def common_train_flags(a, epoch_checkpoints=False):
    return (["--max-tokens", str(a.max_tokens), "--seed", str(a.seed)] + cpu_flag(a)
            + (["--amp"] if a.amp else []) + ["--num-workers", "0",
             "--skip-invalid-size-inputs-valid-test"] + position_flags(a)
            + ["--required-batch-size-multiple", "1", "--log-format", "json", "--log-interval", "50"]
            + ([] if epoch_checkpoints else ["--no-epoch-checkpoints"]))


def pieces_joined(a, flag="--remove-bpe"):
    """fairseq's option that joins the model's pieces back into words: BPE's '@@ ', --char-level's characters
    (sentencepiece's rule: spaces dropped, the boundary symbol made a space), nothing for whole words."""
    if a.char_level:
        return [flag, "sentencepiece"]
    return [flag] if a.bpe_merges else []


def validation_interval_flags(a):
    """Validate every --validate-interval epochs, or every --validate-interval-updates updates (and save there,
    so that the best checkpoint is one of those; epochs' ends then neither validate nor save); the checkpoints of
    --scratch-budget-points kept."""
    if not a.validate_interval_updates:
        return ["--validate-interval", str(a.validate_interval)] + scratch_save_flags(a)
    every, never = str(a.validate_interval_updates), str(10 ** 9)
    return (["--validate-interval-updates", every] + (scratch_save_flags(a) or
            ["--save-interval-updates", every, "--keep-interval-updates", "1"])
            + ["--validate-interval", never, "--save-interval", never])


def validation_flags(a):
    """Validation BLEU (greedy) picks the best checkpoint of a training from scratch (translation)."""
    if a.metric != "bleu":
        return validation_interval_flags(a)
    detok = ["--eval-bleu-detok", "moses"] if a.tokenizer == "moses" else []
    lengths = {k: getattr(a, k) for k in ("max_len_a", "max_len_b")} if a.char_level else {}
    return (["--eval-bleu", "--eval-bleu-args", json.dumps({"beam": 1, **lengths})] + detok
            + pieces_joined(a, "--eval-bleu-remove-bpe")
            + ["--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"] + validation_interval_flags(a))


def task_flags(method_name, search="fairseq"):
    """fairseq's --task of a model: the POS pattern reads its tags through translation_source_tags; a decoding with
    the fixed-shape search (--search fixed_shape) runs through translation_fixed_shape."""
    if method_name.startswith("pattern_pos"):  # pattern_pos and pattern_pos_scratch
        return ["--task", "translation_source_tags", "--source-tags-dir", "tags"]
    return ["--task", "translation_fixed_shape" if search == "fixed_shape" else "translation"]


def train_from_scratch(a, data, m: Method):
    """fairseq-train of the method's architecture from random weights with the baseline's command line, budget and
    batches, plus the method's own options (a gated method: fairseq's criterion and Adam with the gates' penalty and
    their own parameter group, the same updates for every other parameter); a checkpoint at every
    --scratch-budget-points update count."""
    flags = m.flags(a)
    gated = any(f in flags for f in PRESSURE_OPTIONS)
    criterion, optimizer = (("label_smoothed_cross_entropy_with_sparsity", ["adam_sparsity", "--sparsity-lr", str(a.sparsity_lr)])
                            if gated else ("label_smoothed_cross_entropy", ["adam"]))
    return ([tool("fairseq-train"), data, "--user-dir", USER_DIR] + task_flags(m.name) + lang_flags(a)
            + ["--arch", m.arch] + recipe_model_flags(a)
            + ["--criterion", criterion, "--label-smoothing", "0.1",
               "--optimizer"] + optimizer + ["--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
               "--lr", str(a.lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(a.warmup_updates),
               "--max-update", str(a.baseline_updates), "--save-dir", m.name]
            + common_train_flags(a, epoch_checkpoints=bool(scratch_budget_points(a))) + validation_flags(a)
            + (["--patience", str(a.baseline_patience)] if a.baseline_patience else [])
            + (["--stop-time-hours", f"{a.baseline_minutes / 60:.6g}"] if a.baseline_minutes else []) + flags)


def scratch_budget_points(a):
    """The update counts of --scratch-budget-points (none: [])."""
    return [int(u) for u in a.scratch_budget_points.split(",")] if a.scratch_budget_points else []


def scratch_save_flags(a):
    """With --scratch-budget-points: a checkpoint of every training from scratch at each of them, all kept (fairseq
    validates there too; with --validate-interval-updates every save is at a common divisor of both). fairseq saves
    an epoch checkpoint instead where one falls on an epoch's end; once the training ends, the checkpoints at no
    budget point go (budget.keep_budget_checkpoints)."""
    points = scratch_budget_points(a)
    if not points:
        return []
    every = reduce(math.gcd, points + ([a.validate_interval_updates] if a.validate_interval_updates else []))
    return ["--save-interval-updates", str(every), "--keep-interval-updates", "-1"]


def budget_points(a):
    """The update counts of --budget-points (none: [])."""
    return [int(u) for u in a.budget_points.split(",")] if a.budget_points else []


def save_interval(a, method):
    """fairseq's --save-interval-updates of a fine-tuning: a checkpoint at every budget point (and every
    --curve-updates for the curve and its control); 0: none between the start and the end."""
    points = budget_points(a) + ([a.curve_updates] if method.checkpoint_every or method.decoding == "curve" else [])
    return reduce(math.gcd, points) if points else 0


#: the file a continued fine-tuning starts from, next to its start model's checkpoint_best.pt
CONTINUED_START = "checkpoint_continue.pt"


def finetune(a, data, m: Method, resume=False, start_updates=None):
    """fairseq-train from the method's start model (the same optimiser, criterion, learning rate and batches for
    every method and its control). --finetune-protocol fresh: a new Adam at the fixed --finetune-lr; continue: the
    start's Adam state and its inverse-sqrt rate going on from START_UPDATES (optim/continued.py). ``resume``: an
    interrupted run goes on from its checkpoint_last. Bounded by updates only: fairseq's --stop-time-hours would
    count the training time stored in the start checkpoint."""
    save_every = save_interval(a, m)  # checkpoints within the run (one may fall on an epoch's end)
    every = save_every > 0
    if a.finetune_protocol == "continue":
        rate = ["--lr", str(a.lr), "--lr-scheduler", "inverse_sqrt_continued", "--warmup-updates",
                str(a.warmup_updates), "--lr-offset-updates", str(start_updates)]
        start = ["--continue-once", f"{m.start}/{CONTINUED_START}", "--reset-dataloader", "--reset-meters"]
    else:
        rate = ["--lr", str(a.finetune_lr), "--lr-scheduler", "fixed"]
        start = ["--finetune-from-model", f"{m.start}/checkpoint_best.pt"]
    return ([tool("fairseq-train"), data, "--user-dir", USER_DIR] + task_flags(m.name) + lang_flags(a)
            + ["--arch", m.arch] + recipe_model_flags(a)
            + ["--criterion", "label_smoothed_cross_entropy_with_sparsity", "--label-smoothing", "0.1",
               "--optimizer", "adam_sparsity", "--sparsity-lr", str(a.sparsity_lr), "--adam-betas", "(0.9, 0.98)"]
            + rate + ["--max-update", str(updates_of(m, a))]
            + ([] if resume else start)
            + ["--save-dir", m.name, "--save-interval-updates", str(save_every), "--keep-interval-updates", "-1"]
            + common_train_flags(a, every) + distill_flags(a) + m.flags(a))


def distill_flags(a):
    """Word-level distillation from the baseline (Kim & Rush 2016), the same for a method and its control."""
    if not a.distill_weight:
        return []
    return ["--distill-teacher", "baseline/checkpoint_best.pt", "--distill-weight", str(a.distill_weight),
            "--distill-temperature", str(a.distill_temperature)]


def decoding_flags(a):
    """The BLEU decoding of this package's tools (head importance, sparsity curve): they take the length penalty
    and the length bounds of fairseq-generate, not --min-len or --no-repeat-ngram-size."""
    return ["--beam", str(a.beam), "--batch-size", str(a.batch_size), "--device", a.device, "--lenpen", str(a.lenpen),
            "--max-len-a", str(a.max_len_a), "--max-len-b", str(a.max_len_b)]


def generation_flags(a):
    """fairseq-generate's search settings (the recipe's options, fairseq's defaults) and the models' positions:
    every test document fits, so none is skipped (and --skip-invalid-size-inputs-valid-test is never passed); the
    batches read in the decoding process (--num-workers 0, as the trainings and validations: fairseq's default forks a
    loader process, and one such decode hung on a loaded 2-core CPU, its loader waiting for indices that never came)."""
    return (["--lenpen", str(a.lenpen), "--min-len", str(a.min_len), "--max-len-a", str(a.max_len_a),
             "--max-len-b", str(a.max_len_b), "--no-repeat-ngram-size", str(a.no_repeat_ngram_size)]
            + position_flags(a) + ["--num-workers", "0"])


def generate(a, data, key, checkpoint, overrides=None):
    """fairseq-generate of a checkpoint on the test split, every sentence (the last partial batch included)."""
    cmd = ([tool("fairseq-generate"), data, "--user-dir", USER_DIR, "--path", checkpoint, "--gen-subset", "test"]
           + task_flags(key, a.search) + lang_flags(a) + ["--beam", str(a.beam), "--batch-size", str(a.batch_size),
                                                "--required-batch-size-multiple", "1"] + cpu_flag(a)
           + generation_flags(a))
    cmd += pieces_joined(a) + (["--tokenizer", "moses"] if a.tokenizer == "moses" else [])
    return cmd + (["--model-overrides", overrides] if overrides else [])


def generate_train_shard(a, data, beam, shard, shards):
    """The baseline's translations of shard SHARD of SHARDS of the training split (fairseq-generate's batches
    shard, shard + shards, ...), in BPE pieces: the targets of sequence-level distillation."""
    return ([tool("fairseq-generate"), data, "--user-dir", USER_DIR, "--path", "baseline/checkpoint_best.pt",
             "--gen-subset", "train", "--beam", str(beam), "--batch-size", str(a.batch_size),
             "--required-batch-size-multiple", "1"] + cpu_flag(a) + ["--distributed-world-size", str(shards),
             "--distributed-rank", str(shard)] + lang_flags(a) + generation_flags(a))


def attention_analysis(a, data, name):
    cmd = [tool("fairseq-sparse-attention-analysis"), data, "--user-dir", USER_DIR, "--path",
           f"{name}/checkpoint_last.pt", "--gen-subset", "test", "--output-dir", f"{name}/attention",
           "--overwrite", "--device", a.device, "--no-progress-bar", "--example-maps", "3",
           "--bpe-separator", "@@" if a.bpe_merges else ""] + lang_flags(a)
    return cmd + (["--gold", os.path.abspath(a.gold_alignments)] if a.gold_alignments else [])


def prune_heads(checkpoint, output, head_mask=None):
    """Closed (or masked) heads cut out; --overwrite: a checkpoint that changed is pruned again."""
    return [tool("fairseq-sparse-prune-heads"), "--path", checkpoint] + (
        ["--head-mask", head_mask] if head_mask else []) + ["--output", output, "--overwrite"]


def _bleu_flags(a):
    return decoding_flags(a) + lang_flags(a) + pieces_joined(a)


def head_importance(a, data, base="baseline/checkpoint_best.pt"):
    return ([tool("fairseq-sparse-head-importance"), "importance", data, "--path", base,
             "--output-dir", "importance/scores", "--write-mask", "importance/mask.json",
             "--prune-fraction", str(a.importance_fraction), "--overwrite", "--mask-types"]
            + a.importance_types.split(",") + _bleu_flags(a))


def importance_curve(a, data, base="baseline/checkpoint_best.pt"):
    return ([tool("fairseq-sparse-head-importance"), "prune-curve", data, "--path", base,
             "--output-dir", "importance/curve", "--max-sentences", str(a.importance_sentences),
             "--overwrite", "--modes", "all", "enc", "dec", "encdec"] + _bleu_flags(a))


def sparsity_curve(a, data, save_dir="curve"):
    cmd = ([tool("fairseq-sparse-sparsity-curve"), data, "--user-dir", USER_DIR, "--save-dir", save_dir,
            "--gen-subset", "test"] + decoding_flags(a) + ["--output-prefix", f"{save_dir}/curve"] + lang_flags(a)
           + pieces_joined(a) + (["--char-boundary", CHAR_BOUNDARY] if a.char_level else []))
    return cmd + (["--function-words", os.path.abspath(a.function_words)] if a.function_words else [])


def pos_tags(text, split, bpe):
    return [tool("fairseq-sparse-pos-tags"), "--input", text, "--output", f"tags/{split}.tags"] + (
        [] if bpe else ["--bpe-marker", ""])


def preprocess(a, prefix, destdir, dictionary=None, dict_only=False):
    """fairseq-preprocess with one dictionary for both sides: built from the training split, or DICTIONARY;
    ``dict_only``: the dictionary alone."""
    if dict_only:
        return [tool("fairseq-preprocess")] + lang_flags(a) + ["--trainpref", prefix["train"], "--destdir", destdir,
                                                               "--joined-dictionary", "--dict-only", "--workers", "2"]
    return [tool("fairseq-preprocess")] + lang_flags(a) + [
        "--trainpref", prefix["train"], "--validpref", prefix["valid"], "--testpref", prefix["test"],
        "--destdir", destdir, "--joined-dictionary"] + (["--srcdict", dictionary] if dictionary else []) + [
        "--workers", "2"]


def learn_bpe(merges, both, codes):
    return [tool("subword-nmt"), "learn-bpe", "-s", str(merges), "-i", both, "-o", codes]


def apply_bpe(codes, text, out):
    return [tool("subword-nmt"), "apply-bpe", "-c", codes, "-i", text, "-o", out]
