"""What every analysis tool repeats: logging, the plugin, checking inputs and outputs before any work,
loading a checkpoint with its task, the data split with one max-positions rule, length-sorted batches
with fairseq's progress bar, and the TSV / JSON writers.

A tool's ``main`` parses, validates (``fail`` on bad input, before anything is loaded or written), loads,
calls :mod:`fairseq_sparse.analysis`, writes with ``write_tsv`` / ``write_json`` and prints.
"""
import argparse
import json
import logging
import math
import os
import sys
import zipfile
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

logger = logging.getLogger("fairseq_sparse.cli")


class ToolError(ValueError):
    """Bad input found by a shared helper; ``fail`` turns it into the tool's error message."""


# ------------------------------------------------------------------------------------------------
# process set-up and errors


def doc_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """A tool's parser: its module docstring's first paragraph as the description, the rest as the epilog."""
    paragraphs = doc.split("\n\n")
    return argparse.ArgumentParser(prog=prog, description=paragraphs[0], epilog="\n\n".join(paragraphs[1:]),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def setup_logging():
    """fairseq-style INFO logs on stderr. force: importing fairseq's models (wav2vec) already configured the
    root logger at DEBUG level."""
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stderr, force=True)


def fail(prog: str, msg: str):
    """Print ``prog: error: msg`` (argparse's format) and exit with status 2."""
    print(f"{prog}: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def write_or_fail(prog: str, writers: Sequence[Tuple[str, Callable[[str], object]]]):
    """Write each (OUTPUT, WRITE) of WRITERS as WRITE(OUTPUT.part), then rename every part onto its output once all
    are written. On an OSError (a full disk, a folder made read-only meanwhile) the parts are removed and every
    output, an earlier run's included, stays as it was; one line naming the file, exit status 2."""
    parts = [f"{path}.part" for path, _ in writers]
    try:
        for (_, write), part in zip(writers, parts):
            write(part)
        for (path, _), part in zip(writers, parts):
            os.replace(part, path)
    except OSError as e:
        for part in parts:
            for left in (part, f"{part}.tmp"):  # .tmp: what fairseq's torch_persistent_save writes first
                if os.path.exists(left):
                    os.remove(left)
        fail(prog, f"cannot write {e.filename or writers[0][0]}: {e.strerror or e}; "
                   f"{', '.join(path for path, _ in writers)} left as they were")


def import_plugins(user_dir: Optional[str] = None):
    """Register fairseq_sparse (models, safe checkpoint loading) and another --user-dir plugin if given."""
    from fairseq import utils

    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    utils.import_user_module(argparse.Namespace(user_dir=package_dir))
    if user_dir:
        utils.import_user_module(argparse.Namespace(user_dir=user_dir))


def use_cuda(cpu: bool = False) -> bool:
    """CUDA when available, unless ``--cpu``."""
    import torch

    return torch.cuda.is_available() and not cpu


# ------------------------------------------------------------------------------------------------
# the device: one rule for the tools, the recipe and the benchmarks

DEVICES = ("cpu", "cuda")


def default_device() -> str:
    """cuda where torch sees a CUDA device, else cpu."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_error(device: str) -> Optional[str]:
    """Why ``device`` cannot run here (one line), or None."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        return (f"--device cuda: torch {torch.__version__} sees no CUDA device here (torch.cuda.is_available() "
                "is False); use --device cpu")
    return None


def add_device_args(parser):
    """--device {cpu,cuda} (default: cuda where available) and --cpu, the same as --device cpu."""
    parser.add_argument("--device", choices=DEVICES, default=None,
                        help="where the model runs (default: cuda where torch sees a CUDA device, else cpu)")
    parser.add_argument("--cpu", action="store_true", help="the same as --device cpu")


def check_device(args) -> str:
    """Resolve --device / --cpu before any work: args.device 'cpu' or 'cuda', args.cpu to match.
    ToolError for --device cuda without CUDA, or with --cpu."""
    if args.cpu and args.device == "cuda":
        raise ToolError("--cpu and --device cuda contradict each other: give one")
    device = "cpu" if args.cpu else (args.device or default_device())
    message = device_error(device)
    if message:
        raise ToolError(message)
    args.device, args.cpu = device, device == "cpu"
    return device


# ------------------------------------------------------------------------------------------------
# options every tool shares


def add_checkpoint_args(parser, path_help="fairseq encoder-decoder transformer checkpoint", path_required=True):
    """--path, --user-dir, --source-lang, --target-lang, --device, --cpu."""
    parser.add_argument("--path", required=path_required, metavar="CKPT", help=path_help)
    parser.add_argument("--user-dir", default=None,
                        help="extra fairseq plugin to import (fairseq_sparse is always imported)")
    parser.add_argument("--source-lang", default=None)
    parser.add_argument("--target-lang", default=None)
    add_device_args(parser)


def add_bleu_args(group, remove_bpe_note=""):
    """The BLEU evaluation options the tools that decode a split share (fairseq-generate's names and defaults but
    beam 5, the papers' scripts): --gen-subset, --max-sentences, --batch-size, --beam, --lenpen, --max-len-a/-b,
    --remove-bpe, --sacrebleu-tokenize."""
    group.add_argument("--gen-subset", default="test", help="split translated for BLEU (default: test)")
    group.add_argument("--max-sentences", type=int, default=None, metavar="N",
                       help="only the first N sentences of --gen-subset (default: all)")
    group.add_argument("--batch-size", type=int, default=32, metavar="B",
                       help="sentences per generation batch (default 32)")
    group.add_argument("--beam", type=int, default=5, help="beam size (default 5, the papers' scripts)")
    group.add_argument("--lenpen", type=float, default=1.0, help="length penalty (default 1)")
    group.add_argument("--max-len-a", type=float, default=0.0)
    group.add_argument("--max-len-b", type=int, default=200)
    group.add_argument("--remove-bpe", nargs="?", const="@@ ", default=None, metavar="SYMBOL",
                       help="remove BPE before scoring (bare flag: '@@ '; also 'sentencepiece', 'subword_nmt', ...)"
                            + remove_bpe_note)
    group.add_argument("--sacrebleu-tokenize", default="none",
                       help="sacrebleu tokenizer: 'none' (default) scores the tokenised text as the papers do "
                            "(multi-bleu style); '13a', 'intl', ... for detokenised output")


def add_progress_args(parser):
    """fairseq's progress-bar options."""
    parser.add_argument("--no-progress-bar", action="store_true", help="no progress bar")
    parser.add_argument("--log-format", default=None, choices=("json", "none", "simple", "tqdm"))
    parser.add_argument("--log-interval", type=int, default=100)


def add_overwrite_arg(parser):
    parser.add_argument("--overwrite", action="store_true",
                        help="replace output files that already exist (default: refuse to start)")


# ------------------------------------------------------------------------------------------------
# checking inputs and outputs before any work


def check_checkpoint_file(path: str, option: str = "--path"):
    """Raise ToolError unless ``path`` is a readable, complete torch checkpoint (zip archive whose members
    pass their CRC check): a truncated or corrupt file is found before any work starts."""
    if not os.path.isfile(path):
        raise ToolError(f"{option}: checkpoint not found: {path}")
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise ToolError(f"{option}: cannot read {path}: not a complete torch checkpoint (truncated or corrupt?): "
                        f"{e}") from None
    if bad is not None:
        raise ToolError(f"{option}: {path} is corrupt (member {bad} fails its CRC check)")


def check_finite(args):
    """Every float option of ``args`` is a finite number: NaN and inf pass the comparison-based range checks
    (nan < 0 is False) and used to end in NaN results with exit status 0."""
    for name, value in sorted(vars(args).items()):
        if isinstance(value, float) and not math.isfinite(value):
            raise ToolError(f"--{name.replace('_', '-')} must be a finite number, got {value}")


def check_input_files(*options: Tuple[str, Optional[str]]):
    """Each (option, path) with a path given must be an existing file."""
    for option, path in options:
        if path is not None and not os.path.isfile(path):
            raise ToolError(f"{option} file not found: {path}")


def check_data_dir(data: Optional[str], option: str = "DATA"):
    if data is not None and not os.path.isdir(data):
        raise ToolError(f"{option}: data directory not found: {data}")


def check_dictionaries(data: Optional[str], source_lang: Optional[str] = None, target_lang: Optional[str] = None,
                       option: str = "DATA"):
    """The dictionaries fairseq's translation task reads from the first data directory of ``data``: dict.SRC.txt and
    dict.TGT.txt, the language pair given or, as fairseq does when either is missing, read from the names of the split
    files there. ToolError naming what is missing (fairseq's FileNotFoundError traceback otherwise)."""
    first = (data or "").split(os.pathsep)[0]
    if not os.path.isdir(first):
        raise ToolError(f"{option}: data directory not found: {first}")
    if source_lang is None or target_lang is None:
        from fairseq.data.data_utils import infer_language_pair

        source_lang, target_lang = infer_language_pair(first)
        if source_lang is None or target_lang is None:
            raise ToolError(f"{option}: cannot tell the language pair from the file names in {first} (no "
                            "SPLIT.SRC-TGT.* files of fairseq-preprocess there); pass --source-lang and --target-lang")
    missing = [path for path in dict.fromkeys(os.path.join(first, f"dict.{lang}.txt")
                                              for lang in (source_lang, target_lang)) if not os.path.isfile(path)]
    if missing:
        raise ToolError(f"{option}: dictionary file{'s' if len(missing) > 1 else ''} not found: {', '.join(missing)} "
                        "(fairseq-preprocess writes them into its --destdir)")


def check_output_dir(output_dir: str, files: Iterable[str], overwrite: bool, option: str = "--output-dir",
                     data: Optional[str] = None):
    """``output_dir`` must be a directory or not exist, and hold none of ``files`` unless ``overwrite`` (and
    never a file of the data directory ``data``)."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ToolError(f"{option} exists and is not a directory: {output_dir}")
    check_writable(option, output_dir)
    if not os.path.isdir(output_dir):
        return  # the tool creates it: nothing there to replace
    check_output_files([(option, os.path.join(output_dir, f)) for f in files], overwrite, data=data)


def data_files(data: Optional[str]) -> List[Tuple[str, str]]:
    """(directory, file) of every file in the data directories ``data`` (os.pathsep-separated, as fairseq
    takes them): the dictionaries, the splits, and anything else kept there are inputs of the command."""
    dirs = [d for d in (data or "").split(os.pathsep) if d and os.path.isdir(d)]
    return [(d, os.path.join(d, f)) for d in dirs for f in sorted(os.listdir(d)) if os.path.isfile(os.path.join(d, f))]


def check_output_files(options: Sequence[Tuple[str, Optional[str]]], overwrite: bool,
                       inputs: Sequence[Optional[str]] = (), data: Optional[str] = None):
    """Each (option, path) with a path given: its directory exists, the file does not (unless
    ``overwrite``), and it is none of ``inputs`` nor a file of the data directory ``data`` (an output never
    replaces an input, whatever ``overwrite`` says)."""
    in_data = data_files(data)
    for option, path in options:
        if path is None:
            continue
        folder = next((d for d, f in in_data if _same_file(f, path)), None)
        if folder is not None:
            raise ToolError(f"{option} {path} is a file of the data directory {folder}: refusing to write over it "
                            "(--overwrite or not); choose another path")
        if any(src is not None and _same_file(src, path) for src in inputs):
            raise ToolError(f"{option} {path} is an input of this command: refusing to write over it")
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise ToolError(f"{option}: directory does not exist: {parent}")
        if os.path.exists(path) and not overwrite:
            raise ToolError(f"{option}: {path} exists; pass --overwrite to replace it")
        check_writable(option, parent)


def check_writable(option: str, folder: str):
    """ToolError unless this process may write into ``folder``, or create it (the nearest existing folder above it
    writable): a read-only destination refused before any work, not in a traceback once the work is done."""
    existing = os.path.abspath(folder)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ToolError(f"{option}: cannot create {folder}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ToolError(f"{option}: cannot write into {existing} (not writable by this user, or a read-only file "
                        "system); choose another location")


def _same_file(a: str, b: str) -> bool:
    """The same path (after links) or, both existing, the same file (hard links)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)


# ------------------------------------------------------------------------------------------------
# loading


def load_checkpoint(path: str, data: str, source_lang: Optional[str] = None, target_lang: Optional[str] = None,
                    task=None):
    """(model, cfg, task) of a translation checkpoint read with the dictionaries of ``data`` (with ``task``
    given: that task, and cfg of this checkpoint). Raises ToolError with a message for the user."""
    from fairseq import checkpoint_utils

    overrides = {"data": os.path.abspath(data)}
    if source_lang:
        overrides["source_lang"] = source_lang
    if target_lang:
        overrides["target_lang"] = target_lang
    try:
        if task is None:
            models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides)
        else:
            models, cfg = checkpoint_utils.load_model_ensemble([path], arg_overrides=overrides, task=task)
    except Exception as e:  # not a checkpoint, or dictionaries missing in DATA
        raise ToolError(f"cannot load {path} with data {data}: {type(e).__name__}: {e}") from e
    return models[0], cfg, task


def load_split(task, cfg, subset: str, need_target: bool = False):
    """The dataset of split ``subset``; ToolError if it cannot be read (or has no target side when needed)."""
    try:
        task.load_dataset(subset, task_cfg=cfg.task)
    except Exception as e:
        raise ToolError(f"cannot load subset '{subset}' from {cfg.task.data}: {type(e).__name__}: {e}") from e
    dataset = task.dataset(subset)
    if need_target and getattr(dataset, "tgt", None) is None:
        raise ToolError(f"subset '{subset}' has no target side: the analysis needs reference translations")
    return dataset


def fitting_ids(task, model, dataset, ids: Sequence[int]) -> Tuple[List[int], List[int]]:
    """(ids that fit the model's and the task's max positions, ids that do not): the one rule of every tool."""
    from fairseq import utils

    max_pos = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    if max_pos is None:
        return list(ids), []
    ms, mt = max_pos if isinstance(max_pos, tuple) else (max_pos, max_pos)
    tgt_sizes = getattr(dataset, "tgt_sizes", None)

    def too_long(i):
        return (ms is not None and dataset.src_sizes[i] > ms) or (
            mt is not None and tgt_sizes is not None and tgt_sizes[i] > mt)

    bad = [i for i in ids if too_long(i)]
    if bad:
        logger.warning(f"skipping {len(bad)} sentences longer than the model's positions {max_pos}")
    bad_set = set(bad)
    return [i for i in ids if i not in bad_set], bad


def length_sorted_batches(dataset, ids: Sequence[int], batch_size: int) -> List[List[int]]:
    """``ids`` sorted by source length (longest first, then id) and cut into batches of ``batch_size``."""
    ids = sorted(ids, key=lambda i: (-int(dataset.src_sizes[i]), i))
    return [ids[k:k + batch_size] for k in range(0, len(ids), batch_size)]


def progress(items, args, prefix: str, no_bar_format: str = "none"):
    """fairseq's progress bar over ``items`` with the tool's --log-format / --log-interval / --no-progress-bar."""
    from fairseq.logging import progress_bar

    return progress_bar.progress_bar(items, log_format=args.log_format, log_interval=args.log_interval,
                                     prefix=prefix,
                                     default_log_format=no_bar_format if args.no_progress_bar else "tqdm")


def collate(dataset, ids: Sequence[int], cuda: bool = False):
    """A fairseq sample of the sentences ``ids`` (moved to CUDA when asked)."""
    from fairseq import utils

    sample = dataset.collater([dataset[i] for i in ids])
    return utils.move_to_cuda(sample) if cuda else sample


class Session:
    """The task, the loaded splits and the device of one run of a tool that loads encoder-decoder
    transformer checkpoints and measures BLEU (fairseq-sparse-head-importance, -sparsity-curve)."""

    def __init__(self, args):
        import_plugins(args.user_dir)
        self.args = args
        self.use_cuda = use_cuda(args.cpu)
        self.task = self.cfg = None
        self.datasets = {}

    def load(self, path):
        from ..modules.head_gates import head_layout

        a = self.args
        model, cfg, task = load_checkpoint(path, a.data, a.source_lang, a.target_lang, task=self.task)
        if self.task is None:
            self.cfg, self.task = cfg, task
        if self.use_cuda:
            model.cuda()
        model.eval()
        try:
            layout = head_layout(model)
        except ValueError as e:
            raise ToolError(f"{path}: {e}") from None
        if not any(k[0] == "encdec" for k in layout):
            raise ToolError(f"{path}: {type(model).__name__} is not an encoder-decoder transformer")
        return model

    def subset(self, name):
        if name not in self.datasets:
            self.datasets[name] = load_split(self.task, self.cfg, name, need_target=True)
        return self.datasets[name]

    def sentence_ids(self, model, name, max_sentences):
        ds = self.subset(name)
        n = len(ds) if max_sentences is None else min(max_sentences, len(ds))
        ids, _ = fitting_ids(self.task, model, ds, range(n))
        if not ids:
            raise ToolError(f"subset '{name}' has no usable sentences")
        return ids

    def progress(self, prefix):
        return lambda items: progress(items, self.args, prefix, no_bar_format="simple")

    def evaluator(self, model):
        from ..analysis.head_importance import BleuEvaluator

        a = self.args
        ids = self.sentence_ids(model, a.gen_subset, a.max_sentences)
        gen_args = argparse.Namespace(beam=a.beam, lenpen=a.lenpen, max_len_a=a.max_len_a, max_len_b=a.max_len_b)
        return BleuEvaluator(model, self.task, a.gen_subset, ids, gen_args, batch_size=a.batch_size,
                             bpe_symbol=a.remove_bpe, tokenize=a.sacrebleu_tokenize)


def parse_layers(spec: str, n_layers: int, option: str = "--layers") -> List[int]:
    """``all``, ``last`` or comma-separated 0-based layer indices (negative ones count from the top)."""
    spec = spec.strip().lower()
    if spec == "all":
        return list(range(n_layers))
    if spec == "last":
        return [n_layers - 1]
    out = []
    for part in spec.split(","):
        try:
            k = int(part)
        except ValueError:
            raise ToolError(f"{option}: {part!r} is not a layer index (use 'all', 'last' or e.g. '2,3')") from None
        if not -n_layers <= k < n_layers:
            raise ToolError(f"{option}: layer {k} does not exist, the decoder has {n_layers} layers (0-based)")
        out.append(k % n_layers)
    return sorted(set(out))


# ------------------------------------------------------------------------------------------------
# writing (each file appears whole or not at all: written next to its place, then renamed)


def format_value(v, float_spec: str = "{:.4f}", none: str = "-") -> str:
    """A TSV cell: floats by ``float_spec`` (``nan`` for NaN), bools as 0/1, None as ``none``, else str."""
    if v is None:
        return none
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, float):
        return "nan" if math.isnan(v) else float_spec.format(v)
    return str(v)


def jsonable(x):
    """numpy / torch scalars and arrays, tuples and dict keys made JSON-serialisable (NaN -> None)."""
    import numpy as np

    if isinstance(x, dict):
        return {str(k) if not isinstance(k, str) else k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):  # numpy / torch
        return jsonable(x.tolist())
    if isinstance(x, (np.floating, float)):
        return None if math.isnan(float(x)) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    return x


def write_text(path: str, text: str) -> str:
    """Write ``text`` to ``path`` atomically (a temporary file in the same directory, then renamed)."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def write_tsv(path: str, header: Sequence[str], rows: Iterable[Sequence], float_spec: str = "{:.4f}",
              none: str = "-") -> str:
    """A header line and one line per row, cells by :func:`format_value`."""
    lines = ["\t".join(header)] + ["\t".join(format_value(v, float_spec, none) for v in row) for row in rows]
    return write_text(path, "\n".join(lines) + "\n")


def write_json(path: str, obj) -> str:
    return write_text(path, json.dumps(jsonable(obj), indent=1) + "\n")


def kept_heads_path(checkpoint: str) -> str:
    """The JSON of the kept head ids fairseq-sparse-prune-heads writes next to its output checkpoint."""
    return os.path.splitext(checkpoint)[0] + ".kept_heads.json"
