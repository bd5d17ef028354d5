"""Let torch's safe checkpoint loader read fairseq checkpoints.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True`` and refuses any class that is not
allowlisted; fairseq checkpoints hold their training configuration as an ``argparse.Namespace`` (and
a few other plain classes). Rather than switching the safe loader off, we allowlist exactly these
classes when the plugin is imported, so stock ``fairseq-generate --user-dir fairseq_sparse`` and
``fairseq-train --finetune-from-model`` load our checkpoints and stock ``transformer`` checkpoints.

The checkpoint readers of the tools, the recipe and the benchmarks are here too: a checkpoint's contents
(:func:`read_state`), its update count and its model and criterion options, without building a model.
"""
import argparse
from typing import Mapping, Optional

import numpy as np
import torch

try:  # numpy >= 2
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import _reconstruct

#: the non-tensor classes found in fairseq translation checkpoints (cfg / args / extra_state)
FAIRSEQ_CHECKPOINT_CLASSES = [argparse.Namespace]

#: numpy arrays of plain numbers: the logged metrics in ``extra_state["metrics"]`` hold some, e.g.
#: ``--eval-bleu``'s n-gram counts (int64 arrays). Object arrays stay refused (their items are pickles).
NUMPY_ARRAY_GLOBALS = [_reconstruct, np.ndarray, np.dtype] + [
    cls for cls in (getattr(np.dtypes, name) for name in getattr(getattr(np, "dtypes", None), "__all__", []))
    if issubclass(cls.type, (np.bool_, np.integer, np.floating)) and not issubclass(cls.type, np.timedelta64)
]
#: a checkpoint written under the other numpy major version names _reconstruct by that version's path
NUMPY_ALIASES = [(_reconstruct, "numpy.core.multiarray._reconstruct"), (_reconstruct, "numpy._core.multiarray._reconstruct")]

torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_CLASSES + NUMPY_ARRAY_GLOBALS + NUMPY_ALIASES)


def read_state(path: str) -> dict:
    """A checkpoint's contents, tensors memory-mapped (cheap; torch's safe loader)."""
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


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
