"""fairseq drops the last batch when its size is not a multiple of --required-batch-size-multiple
(facebookresearch/fairseq issue 5036); the plugin gives those sentences back as one last batch."""
import numpy as np
import pytest

import fairseq_sparse  # noqa: F401
from fairseq.data import data_utils
from fairseq_sparse.patches import last_batch


@pytest.mark.parametrize("max_tokens,max_sentences,expected", [
    (None, 32, [24, 6]), (100, None, [8, 8, 8, 6]), (None, 5, [5] * 6), (None, 8, [8, 8, 8, 6]), (None, 10, [8, 8, 8, 6]),
])
def test_every_index_batched_once(max_tokens, max_sentences, expected):
    indices = np.random.RandomState(0).permutation(30)
    lengths = np.full(30, 10)
    dropped = last_batch._fairseq_batch_by_size(indices, None, lengths, max_tokens, max_sentences, 8)
    batches = data_utils.batch_by_size(indices, None, num_tokens_vec=lengths, max_tokens=max_tokens,
                                       max_sentences=max_sentences, required_batch_size_multiple=8)
    assert [len(b) for b in batches] == expected
    assert sorted(np.concatenate(batches).tolist()) == list(range(30))
    # fairseq's own batches are unchanged, in order; only the dropped tail is added
    assert [b.tolist() for b in batches[:len(dropped)]] == [b.tolist() for b in dropped]
    assert sum(map(len, dropped)) < 30


def test_multiple_one_is_fairseqs_batching():
    indices = np.arange(30)
    lengths = np.full(30, 10)
    ours = data_utils.batch_by_size(indices, None, num_tokens_vec=lengths, max_sentences=7)
    theirs = last_batch._fairseq_batch_by_size(indices, None, lengths, None, 7, 1)
    assert [b.tolist() for b in ours] == [b.tolist() for b in theirs]
