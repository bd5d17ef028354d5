"""The encoder-decoder attention normalisers' tests: the module's sizes, a batch of a loaded checkpoint's test set
and beam search on it (the checkpoint itself: helpers.checkpoints.load)."""
import torch
from fairseq.sequence_generator import SequenceGenerator


EMBED, HEADS = 16, 4


def batch(task, n=8):
    ds = task.dataset("test")
    order = sorted(range(len(ds)), key=lambda i: (int(ds.src_sizes[i]), i))
    step = max(1, len(order) // n)
    return ds.collater([ds[i] for i in order[::step][:n - 1] + [order[-1]]])


def generate(model, task, sample, beam=4):
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=0, max_len_b=12)
    with torch.no_grad():
        return gen.generate([model], sample)
