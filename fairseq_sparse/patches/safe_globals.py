"""Let torch's safe checkpoint loader read fairseq checkpoints.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True`` and refuses any class that is not
allowlisted; fairseq checkpoints hold their training configuration as an ``argparse.Namespace`` (and
a few other plain classes). Rather than switching the safe loader off, we allowlist exactly these
classes when the plugin is imported, so stock ``fairseq-generate --user-dir fairseq_sparse`` and
``fairseq-train --finetune-from-model`` load our checkpoints and stock ``transformer`` checkpoints.
"""
import argparse

import numpy as np
import torch

from .switch import enabled

try:  # numpy >= 2
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import _reconstruct

#: the non-tensor classes found in fairseq translation checkpoints (cfg / args / extra_state)
FAIRSEQ_CHECKPOINT_CLASSES = [argparse.Namespace]

#: numpy arrays of plain numbers: the logged metrics in ``extra_state["metrics"]`` hold some, e.g.
#: ``--eval-bleu``'s n-gram counts (int64 arrays). Object arrays stay refused (their items are pickles).
#: (numpy.dtypes.__all__ holds more than dtype classes in numpy 2.5, e.g. functions: those are skipped)
NUMPY_ARRAY_GLOBALS = [_reconstruct, np.ndarray, np.dtype] + [
    cls for cls in (getattr(np.dtypes, name) for name in getattr(getattr(np, "dtypes", None), "__all__", []))
    if isinstance(getattr(cls, "type", None), type)
    and issubclass(cls.type, (np.bool_, np.integer, np.floating)) and not issubclass(cls.type, np.timedelta64)
]
#: a checkpoint written under the other numpy major version names _reconstruct by that version's path
NUMPY_ALIASES = [(_reconstruct, "numpy.core.multiarray._reconstruct"), (_reconstruct, "numpy._core.multiarray._reconstruct")]


def _broadcast_globals():
    """What a loaded checkpoint's omegaconf config pickles to. fairseq's multi-process training hands the state
    that rank 0 loaded (``--finetune-from-model``, resume) to the other ranks through torch.save / torch.load
    (distributed_utils.broadcast_object), whose safe loader refused it: 2-process fine-tuning failed."""
    import collections
    import typing

    from fairseq.distributed.utils import _TensorPlaceholder  # the tensors travel apart, in its place
    from omegaconf import DictConfig, ListConfig
    from omegaconf.base import ContainerMetadata, Metadata
    from omegaconf.nodes import AnyNode

    return [DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode, typing.Any, dict, list, int,
            collections.defaultdict, _TensorPlaceholder]


SAFE_GLOBALS = FAIRSEQ_CHECKPOINT_CLASSES + NUMPY_ARRAY_GLOBALS + NUMPY_ALIASES + _broadcast_globals()
if enabled("safe_globals"):
    torch.serialization.add_safe_globals(SAFE_GLOBALS)
