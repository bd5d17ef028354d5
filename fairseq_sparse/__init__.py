"""fairseq_sparse: a fairseq plugin (``--user-dir fairseq_sparse``) for sparser, faster Transformers.

Importing the package registers its models and criterions with fairseq and lets torch's safe
checkpoint loader (weights_only=True, the default since torch 2.6) read fairseq checkpoints.
"""
from . import checkpoint_safety  # noqa: F401  (first: fairseq tools may load checkpoints right after)
from . import criterions, models, modules  # noqa: F401
