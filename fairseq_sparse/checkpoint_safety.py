"""Let torch's safe checkpoint loader read fairseq checkpoints.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True`` and refuses any class that is not
allowlisted; fairseq checkpoints hold their training configuration as an ``argparse.Namespace`` (and
a few other plain classes). Rather than switching the safe loader off, we allowlist exactly these
classes when the plugin is imported, so stock ``fairseq-generate --user-dir fairseq_sparse`` and
``fairseq-train --finetune-from-model`` load our checkpoints and stock ``transformer`` checkpoints.
"""
import argparse

import torch

#: the non-tensor classes found in fairseq translation checkpoints (cfg / args / extra_state)
FAIRSEQ_CHECKPOINT_CLASSES = [argparse.Namespace]

torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_CLASSES)
