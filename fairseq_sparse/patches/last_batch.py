"""Keep the last, smaller batch that fairseq drops.

fairseq's ``data_utils.batch_by_size`` (the fairseq-fixed 0.12 release, as fairseq's main branch) drops
the last batch when its size is not a multiple of ``--required-batch-size-multiple`` (default 8;
facebookresearch/fairseq issue 5036): fairseq-generate on 30 sentences decodes 24, and validation skips
sentences too, without a word. Importing the plugin wraps the function so that the sentences of the
dropped batch come back as one last batch; every other batch is fairseq's own (FAIRSEQ_SPARSE_PATCHES: patches/switch.py).
"""
import numpy as np
from fairseq.data import data_utils

from .switch import enabled

_fairseq_batch_by_size = data_utils.batch_by_size


def batch_by_size(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None, max_sentences=None,
                  required_batch_size_multiple=1, fixed_shapes=None):
    """fairseq's ``batch_by_size`` (same signature), plus the indices of a last batch that it dropped."""
    if not isinstance(indices, np.ndarray):
        indices = np.fromiter(indices, dtype=np.int64, count=-1)
    batches = _fairseq_batch_by_size(indices, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences,
                                     required_batch_size_multiple, fixed_shapes)
    kept = sum(len(b) for b in batches)
    if fixed_shapes is None and kept < len(indices):  # batches are consecutive runs of ``indices``
        batches = list(batches) + [np.asarray(indices[kept:], dtype=np.int64)]
    return batches


if enabled("last_batch"):
    data_utils.batch_by_size = batch_by_size
