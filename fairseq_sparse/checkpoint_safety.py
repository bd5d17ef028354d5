"""The checkpoint readers of the tools, the recipe and the benchmarks: a checkpoint's contents (:func:`read_state`,
torch's safe loader with fairseq's classes allowed: patches/safe_globals.py), its update count and its model and
criterion options, without building a model.
"""
import os
from typing import Mapping, Optional

import torch

from .patches.safe_globals import SAFE_GLOBALS


class UnreadableCheckpoint(ValueError):
    """A checkpoint file that torch cannot read (truncated by a full disk or a killed write, or not a checkpoint);
    ``path`` and ``cause`` (one line) for a caller's own message."""

    def __init__(self, path: str, cause):
        if isinstance(cause, BaseException):
            cause = f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
        self.path, self.cause = path, cause
        super().__init__(f"{path} is not a readable checkpoint ({cause}): it may be truncated (a full disk, a killed "
                         "write); delete it (a fairseq-train run then starts again from its last readable checkpoint, "
                         "or from the start)")


def read_state(path: str) -> dict:
    """A checkpoint's contents, tensors memory-mapped (cheap; torch's safe loader). A file torch cannot read raises
    UnreadableCheckpoint naming it (not torch's own error, which names no file)."""
    try:
        # only what the allowlist lacks (FAIRSEQ_SPARSE_PATCHES without safe_globals): torch's context manager takes
        # out on exit every global it was given, even one that was allowed before
        allowed = torch.serialization.get_safe_globals()
        with torch.serialization.safe_globals([g for g in SAFE_GLOBALS if g not in allowed]):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except FileNotFoundError:
        raise
    except Exception as e:
        raise UnreadableCheckpoint(path, e) from None


def check_archive(path: str) -> None:
    """UnreadableCheckpoint unless every member of the checkpoint's zip archive reads back whole (CRC checked): a
    corrupt tensor passes read_state, which maps the tensors without reading them, and torch's loader then fails
    naming no file (or reads wrong numbers)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise UnreadableCheckpoint(path, e) from None
    if bad is not None:
        raise UnreadableCheckpoint(path, f"its member {bad} is corrupt")


def state_updates(state: Mapping) -> Optional[int]:
    """Updates the checkpoint was trained for (``optimizer_history[-1]["num_updates"]``), None if unknown."""
    history = state.get("optimizer_history") or [{}]
    n = history[-1].get("num_updates")
    return None if n is None else int(n)


def _options(state: Mapping, part: str) -> dict:
    cfg = state.get("cfg")
    if cfg is not None:
        value = cfg.get(part) or {}
        return dict(vars(value)) if hasattr(value, "__dict__") and not isinstance(value, Mapping) else dict(value)
    args = state.get("args")
    return dict(vars(args)) if args is not None else {}


def criterion_options(state: Mapping) -> dict:
    """The checkpoint's criterion options (``cfg["criterion"]``, or the old ``args`` namespace)."""
    return _options(state, "criterion")


def model_options(state: Mapping) -> dict:
    """The checkpoint's model options (``cfg["model"]``, a namespace for our models, or the old ``args``)."""
    return _options(state, "model")


def data_dir(state: Mapping) -> str:
    """The first data directory the checkpoint was trained on (its dictionaries), or '' where it names none."""
    data = _options(state, "task").get("data")
    return str(data).split(os.pathsep)[0] if data else ""


def dictionary_symbols(path: str) -> list:
    """The words of a fairseq dictionary file (``dict.LANG.txt``: one 'word count' a line), in order."""
    with open(path, encoding="utf-8") as f:
        return [line.split(" ", 1)[0] for line in f]


def dictionary_files(state: Mapping) -> dict:
    """{"source": path, "target": path} of the dictionary files the checkpoint was trained with, those its data
    directory still holds: dict.LANG.txt, LANG from its cfg or, trained without -s/-t, inferred from the data's file
    names as fairseq does."""
    data = data_dir(state)
    if not data or not os.path.isdir(data):
        return {}
    task = _options(state, "task")
    langs = (task.get("source_lang"), task.get("target_lang"))
    if not all(langs):
        from fairseq.data.data_utils import infer_language_pair

        langs = infer_language_pair(data)
    files = {side: os.path.join(data, f"dict.{lang}.txt") for side, lang in zip(("source", "target"), langs) if lang}
    return {side: path for side, path in files.items() if os.path.isfile(path)}


def other_dictionary(state: Mapping, data: str) -> Optional[str]:
    """The dictionary file the checkpoint STATE was trained with, where its data directory still holds it and its
    symbols differ from those of the same file name in DATA (a model decoded through another dictionary of the same
    size reads other words and scores silently wrong); None where they agree or cannot be compared."""
    for path in dictionary_files(state).values():
        mine = os.path.join(data, os.path.basename(path))
        if os.path.isfile(mine) and os.path.abspath(mine) != os.path.abspath(path) \
                and dictionary_symbols(mine) != dictionary_symbols(path):
            return path
    return None


def check_teacher_checkpoint(path: str, task) -> None:
    """ValueError unless PATH is a complete, readable fairseq checkpoint whose embedding tables have the sizes of
    ``task``'s dictionaries, and, where the teacher's training data directory still exists, dictionaries of the
    same symbols (a distillation teacher must predict over the student's vocabulary)."""
    if not os.path.isfile(path):
        raise ValueError(f"--distill-teacher {path}: no such file")
    try:
        check_archive(path)
        state = read_state(path)
        model_state = state["model"]
    except UnreadableCheckpoint as e:  # truncated or corrupt, or not a torch file
        raise ValueError(f"--distill-teacher {path} is not a readable fairseq checkpoint ({e.cause}): truncated or "
                         "corrupt; pass a complete checkpoint") from None
    except Exception as e:  # not a fairseq checkpoint
        raise ValueError(f"--distill-teacher {path} is not a readable fairseq checkpoint ({type(e).__name__}: {e})") from None
    for side, dictionary in (("encoder", task.source_dictionary), ("decoder", task.target_dictionary)):
        weight = model_state.get(f"{side}.embed_tokens.weight")
        if weight is not None and weight.size(0) != len(dictionary):
            raise ValueError(f"--distill-teacher {path}: its {side} has {weight.size(0)} embeddings but the data's "
                             f"dictionary has {len(dictionary)} symbols; the teacher must use the data's dictionaries")
    theirs = dictionary_files(state)
    for side, dictionary in (("source", task.source_dictionary), ("target", task.target_dictionary)):
        if side in theirs and dictionary_symbols(theirs[side]) != dictionary.symbols[dictionary.nspecial:]:
            raise ValueError(f"--distill-teacher {path} was trained with the dictionary {theirs[side]}, whose symbols "
                             "differ from the data's; the teacher must use the data's dictionaries")
