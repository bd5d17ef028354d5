"""--encoder-output-merge: pruned encoder outputs folded into kept ones (fairseq_sparse/modules/encoder_merge.py).
Closed forms of the groups and the merged states, the gradient that reaches pruned states, exact pruned decoding
of merged models (pattern and learned gates, zeros and masks), and the refused combinations.
TorchScript: tests/unit/test_l0drop_scripting.py; the fixed-shape search: tests/unit/test_fixed_shape_search.py."""
import math
from argparse import Namespace

import pytest
import torch

from fairseq_sparse.modules.encoder_merge import EncoderOutputMerge, merge_groups, merge_states
from helpers.models import build_l0drop_model, gated, mixed_length_batch


def states(values):
    """T x 1 x 1 states of one sentence holding VALUES (one number each)."""
    return torch.tensor(values, dtype=torch.float32).view(-1, 1, 1)


def test_groups_are_the_nearest_kept_position_to_the_left_and_leading_ones_join_the_first():
    kept = torch.tensor([[0, 1, 0, 0, 1, 0],
                         [1, 0, 1, 1, 0, 0],
                         [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    assert merge_groups(kept).tolist() == [[1, 1, 1, 1, 4, 4],
                                           [0, 0, 2, 3, 3, 3],
                                           [0, 0, 0, 0, 0, 0]]


def test_mean_merge_in_closed_form_with_left_padding():
    #        pad  a   b   c   d   e    (kept: b and d)
    h = states([100.0, 1.0, 2.0, 4.0, 8.0, 16.0])
    gates = torch.tensor([[0.0, 0.0, 1.0, 0.0, 1.0, 0.0]])
    pad = torch.tensor([[True, False, False, False, False, False]])
    got = merge_states(h, gates, pad).view(-1).tolist()
    # b's group: a, b, c (a leads, joins the first kept); d's group: d, e; padding contributes nothing
    assert got == pytest.approx([0.0, 0.0, (1 + 2 + 4) / 3, 0.0, (8 + 16) / 2, 0.0])


def test_the_kept_gate_scales_its_merged_state_and_a_sentence_with_nothing_kept_stays_zero():
    h = states([2.0, 4.0, 6.0])
    assert merge_states(h, torch.tensor([[0.5, 0.0, 0.0]]), None).view(-1).tolist() == pytest.approx([2.0, 0, 0])
    assert merge_states(h, torch.zeros(1, 3), None).abs().sum() == 0


def test_attention_merge_is_a_softmax_within_each_group():
    h = states([1.0, 2.0, 4.0, 8.0])
    gates = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    scores = torch.tensor([[0.0, math.log(2.0), math.log(5.0), 30.0]])  # the last group is alone: weight 1
    got = merge_states(h, gates, None, scores).view(-1).tolist()
    assert got == pytest.approx([(1 * 1 + 2 * 2 + 5 * 4) / 8, 0.0, 0.0, 8.0])
    # very different scores in two groups underflow nothing: each group's softmax is its own
    far = torch.tensor([[-200.0, -199.0, -201.0, 300.0]])
    w = torch.softmax(far[0, :3], 0)
    assert merge_states(h, gates, None, far).view(-1)[0].item() == pytest.approx(float((w * h.view(-1)[:3]).sum()))


def test_a_merge_with_zero_scores_is_the_mean_and_identity_where_nothing_is_pruned():
    torch.manual_seed(0)
    h = torch.randn(7, 3, 16)
    gates = (torch.rand(3, 7) > 0.4).float()
    gates[:, 0] = 1.0
    attention = EncoderOutputMerge("attention", 16)  # its scorer starts at 0
    torch.testing.assert_close(attention(h, gates, None), EncoderOutputMerge("mean", 16)(h, gates, None))
    ones = torch.ones(3, 7)
    torch.testing.assert_close(merge_states(h, ones, None), h)


def test_gradients_reach_the_pruned_states_and_the_scorer():
    torch.manual_seed(0)
    h = torch.randn(6, 2, 8, requires_grad=True)
    gates = torch.tensor([[1.0, 0.0, 0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0, 0.0, 1.0]])
    merge = EncoderOutputMerge("attention", 8)
    torch.nn.init.normal_(merge.score.weight)
    merge(h, gates, None).pow(2).sum().backward()
    assert (h.grad.abs().sum(-1) > 0).all()  # every state, pruned or kept, shapes the memory
    assert merge.score.weight.grad.abs().sum() > 0


def model_with(*extra, seed=1):
    """An eval-mode transformer_l0drop with about half its output gates closed (random directions)."""
    return gated(build_l0drop_model(*extra)[0], seed=seed).eval()


MERGED = [("--encoder-output-merge", "mean"), ("--encoder-output-merge", "attention"),
          ("--encoder-output-merge", "mean", "--l0drop-dropped-as", "mask"),
          ("--encoder-output-merge", "attention", "--encoder-output-pattern", "group",
           "--encoder-output-pattern-every", "2"),
          ("--encoder-output-merge", "mean", "--encoder-output-pattern", "freq", "--encoder-output-pattern-top-k", "8")]


@pytest.mark.parametrize("extra", MERGED)
def test_pruned_decoding_of_a_merged_model_is_exact(extra):
    """Algorithm 1 on the merged memory: fairseq's beam search gives the hypotheses and scores of the full merged
    memory (pruned decoding off), and the merged memory differs from the dropped one."""
    from fairseq.sequence_generator import SequenceGenerator

    model = model_with(*extra)
    d = model.encoder.dictionary
    src, lengths = mixed_length_batch()
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}

    def decode(pruned):
        model.encoder.pruned_decoding = pruned
        with torch.no_grad():
            return SequenceGenerator([model], d, beam_size=3, max_len_b=8)(sample)

    with torch.no_grad():
        out = model.encoder.forward_torchscript(sample["net_input"])
    real = src.ne(d.pad())
    assert 0 < int(((out["l0drop_gates"][0] == 0) & real).sum()) < int(real.sum())
    for pruned, full in zip(decode(True), decode(False)):
        for p, f in zip(pruned, full):
            assert p["tokens"].tolist() == f["tokens"].tolist()
            assert float(p["score"]) == pytest.approx(float(f["score"]), abs=1e-4)
    dropped = model_with(*[e for e in extra if e not in ("--encoder-output-merge", "mean", "attention")])
    with torch.no_grad():
        other = dropped.encoder.forward_torchscript(sample["net_input"])
    assert not torch.allclose(other["encoder_out"][0], out["encoder_out"][0])


def test_training_follows_the_sampled_gates():
    """In training the groups are those of the sampled gates: each kept row is its gate times the mean of its
    group's states (the encoder's own output before gating)."""
    model = model_with("--encoder-output-merge", "mean")
    model.train()
    src, lengths = mixed_length_batch()
    seen = {}
    hook = model.encoder.layers[-1].register_forward_hook(lambda m, a, out: seen.setdefault("h", out))
    torch.manual_seed(5)
    out = model.encoder(src, src_lengths=lengths)
    hook.remove()
    h = seen["h"]
    if model.encoder.layer_norm is not None:
        h = model.encoder.layer_norm(h)
    gates = out["l0drop_gates"][0]
    torch.testing.assert_close(out["encoder_out"][0], merge_states(h, gates, src.eq(1)))
    assert ((gates > 0) & (gates < 1)).any()  # sampled, not g_hat


@pytest.mark.parametrize("options,message", [
    ({"encoder_output_merge": "sum"}, "--encoder-output-merge must be one of"),
    ({"encoder_output_merge": "mean", "l0drop_between_layers": True}, "does not combine with --l0drop-between-layers"),
])
def test_bad_merge_options_are_refused(options, message):
    from fairseq_sparse.models.l0drop_config import check_merge_args

    args = Namespace(encoder_output_merge="none", l0drop_between_layers=False, **{})
    for k, v in options.items():
        setattr(args, k, v)
    with pytest.raises(ValueError) as e:
        check_merge_args(args)
    assert message in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="must be one of mean, attention"):
        EncoderOutputMerge("none", 8)
