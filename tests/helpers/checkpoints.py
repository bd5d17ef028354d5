"""A checkpoint trained by the session fixtures (conftest.py), loaded in this process: batches of its test set,
fairseq's SequenceGenerator on it, its L0Drop gates set to drop a given share of states, pruned against unpruned
decoding."""
import math

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.sequence_generator import SequenceGenerator

import fairseq_sparse  # noqa: F401  (registers the models)


LN11 = math.log(11.0)
SCORE_TOL = 1e-4
ATTN_TOL = 1e-5


def load(ckpt, data, **overrides):
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([ckpt], arg_overrides=dict(data=data, **overrides))
    task.load_dataset("test")
    return models[0].eval(), cfg, task


def mixed_batch(task, n=12):
    """Sentences of the test set spread over all source lengths (left-padded, as fairseq does)."""
    ds = task.dataset("test")
    order = sorted(range(len(ds)), key=lambda i: (int(ds.src_sizes[i]), i))
    step = max(1, len(order) // n)
    idx = order[::step][:n - 1] + [order[-1]]
    sample = ds.collater([ds[i] for i in idx])
    lengths = sample["net_input"]["src_lengths"]
    assert lengths.min() < lengths.max()
    return sample


def generate(model, task, sample, beam):
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=0, max_len_b=20)
    with torch.no_grad():
        return gen.generate([model], sample)


def gates_of(model, sample):
    """Output gates (B x T, g_hat in eval mode) and the padding mask of ``sample``."""
    enc = model.encoder
    saved = enc.pruned_decoding
    enc.pruned_decoding = False
    try:
        with torch.no_grad():
            out = enc(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"])
    finally:
        enc.pruned_decoding = saved
    return out["l0drop_gates"][0], sample["net_input"]["src_tokens"].eq(enc.padding_idx)


def sparsity(model, sample):
    gates, pad = gates_of(model, sample)
    return float(((gates == 0) & ~pad).sum()) / float((~pad).sum())


def drop_fraction(model, l0drop, sample, frac, seed=0):
    """Rescale ``l0drop``'s w and set its bias so that log alpha <= -ln 11 (g_hat = 0) for about ``frac``
    of the real states it sees on ``sample``, and the upper half of the kept states is fully open
    (g_hat = 1); a random w if it has none. A deterministic way to get mixed gates."""
    w = l0drop.log_alpha_proj.weight
    if w.detach().abs().max() == 0:
        with torch.no_grad():
            w.copy_(torch.randn(w.shape, generator=torch.Generator().manual_seed(seed)))
    seen = []
    handle = l0drop.register_forward_pre_hook(lambda mod, args: seen.append((args[0], args[1])))
    try:
        gates_of(model, sample)
    finally:
        handle.remove()
    x, pad = seen[0]
    with torch.no_grad():
        vals = (x @ w.view(-1)).t()[~pad].double().sort().values  # x.w of the real states
        n = vals.numel()
        k = min(n - 1, max(1, int(round(frac * n))))  # states 0..k-1 dropped
        q = (vals[k - 1] + vals[k]).item() / 2  # midway, so no state sits on the threshold
        hi = vals[min(n - 1, (k + n) // 2)].item()
        scale = 2 * LN11 / max(hi - q, 1e-3)  # log alpha(hi) = +ln 11: g_hat = 1 from there on
        w.mul_(scale)
        l0drop.log_alpha_proj.bias.fill_(-LN11 - scale * q)


def assert_same_hypos(a, b, check_attention=True):
    assert len(a) == len(b)
    for hyps_a, hyps_b in zip(a, b):
        assert len(hyps_a) == len(hyps_b)
        for ha, hb in zip(hyps_a, hyps_b):
            assert ha["tokens"].tolist() == hb["tokens"].tolist()
            # float(): pytest.approx turns a tensor into a NumPy array, which a CUDA tensor refuses
            assert float(ha["score"]) == pytest.approx(float(hb["score"]), abs=SCORE_TOL)
            assert torch.allclose(ha["positional_scores"], hb["positional_scores"], atol=SCORE_TOL)
            if check_attention:
                assert ha["attention"].shape == hb["attention"].shape
                assert torch.allclose(ha["attention"], hb["attention"], atol=ATTN_TOL), (
                    (ha["attention"] - hb["attention"]).abs().max())


def pruned_vs_unpruned(model, task, sample, beam, dropped_as):
    model.encoder.dropped_as = dropped_as
    model.encoder.pruned_decoding = True
    # the two settings really decode from different memories: N' + 1 rows instead of N
    gates, pad = gates_of(model, sample)
    with torch.no_grad():
        mem = model.encoder(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"])["encoder_out"][0]
    assert mem.size(0) == 1 + int(((gates != 0) & ~pad).sum(1).max())
    pruned = generate(model, task, sample, beam)
    model.encoder.pruned_decoding = False
    full = generate(model, task, sample, beam)
    model.encoder.pruned_decoding = True
    assert_same_hypos(pruned, full)
    return pruned, full
