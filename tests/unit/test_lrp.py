"""LRP head relevance (Voita et al. 2019 Sec. 4): the alpha-beta rule against closed forms, relevance
conservation through a trained model, the refusal of models whose forward pass it does not re-compute, and
fairseq-sparse-head-analysis --lrp end to end.
Here the pure tests; those that train or run console scripts are in tests/e2e/test_lrp_e2e.py."""

import pytest
import torch

import fairseq_sparse  # noqa: F401
from fairseq_sparse.analysis import lrp


def test_alpha_beta_rule_closed_form():
    """y = w1 x1 + w2 x2 + b with impacts z_i = w_i x_i + b/2; alpha = beta = 1/2 normalise each sign."""
    x, w, b = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, -1.0]]), torch.tensor([0.5])
    r = lrp.relprop_linear(x, w, b, torch.tensor([[2.0]]))
    z = torch.tensor([3.0 + 0.25, -2.0 + 0.25])  # 3.25 (positive), -1.75 (negative)
    expected = 2.0 * torch.tensor([0.5 * 3.25 / (3.25 + lrp.EPS), 0.5 * -1.75 / (-1.75 - lrp.EPS)])
    expected = expected * 2.0 / expected.abs().sum()  # rescaled: total |R| conserved
    assert torch.allclose(r, expected[None], atol=1e-6)
    a, c = lrp.relprop_add(torch.tensor([[1.0, -1.0]]), torch.tensor([[3.0, 1.0]]), torch.tensor([[1.0, 1.0]]))
    # element 0: both positive: 1/4 and 3/4 of alpha; element 1: -1 and 1 split by sign
    raw_a, raw_c = torch.tensor([0.5 * 0.25, 0.5]), torch.tensor([0.5 * 0.75, 0.5])
    scale = 2.0 / (raw_a.abs().sum() + raw_c.abs().sum())
    assert torch.allclose(a[0], raw_a * scale, atol=1e-4) and torch.allclose(c[0], raw_c * scale, atol=1e-4)


@pytest.mark.parametrize("rule", ["linear", "layer_norm", "relu", "values"])
def test_every_rule_conserves_relevance(rule):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 8, generator=g)
    r_out = torch.randn(5, 8, generator=g)
    if rule == "linear":
        r = lrp.relprop_linear(x, torch.randn(8, 8, generator=g), torch.randn(8, generator=g), r_out)
    elif rule == "layer_norm":
        norm = torch.nn.LayerNorm(8)
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_()
        r = lrp.relprop_layer_norm(x, norm, r_out)
    elif rule == "relu":
        r = lrp.relprop_relu(x, r_out)
    else:
        weights = torch.softmax(torch.randn(2, 5, 3, generator=g), -1)
        r = lrp.relprop_weighted_values(weights, torch.randn(3, 2, 4, generator=g), r_out.view(5, 2, 4))
    assert float(r.abs().sum()) == pytest.approx(float(r_out.abs().sum()), rel=1e-5)
