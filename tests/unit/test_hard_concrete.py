"""HardConcrete (Louizos et al. 2018) against closed forms derived here independently of the code.

With logistic noise L = log u - log(1 - u) and t in (0, 1):
    P(g <= x) = P(s <= (x - gamma)/(zeta - gamma)) = sigmoid(beta * logit((x - gamma)/(zeta - gamma)) - log_alpha)
for 0 <= x < 1, so P(g = 0) = sigmoid(beta * logit(-gamma/(zeta - gamma)) - log_alpha)
and P(g = 1) = 1 - sigmoid(beta * logit((1 - gamma)/(zeta - gamma)) - log_alpha).
"""
import math

import pytest
import torch

from fairseq_sparse.modules.hard_concrete import HardConcrete

LN11 = math.log(11.0)


def sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v)) if v >= 0 else math.exp(v) / (1.0 + math.exp(v))


def logit(p):
    return math.log(p / (1.0 - p))


def cdf(x, log_alpha, beta=2 / 3, gamma=-0.1, zeta=1.1):
    """P(g <= x) for 0 <= x < 1, derived from the sampling procedure (not from the code)."""
    return sigmoid(beta * logit((x - gamma) / (zeta - gamma)) - log_alpha)


def p_zero(log_alpha, beta=2 / 3, gamma=-0.1, zeta=1.1):
    return cdf(0.0, log_alpha, beta, gamma, zeta)


def p_one(log_alpha, beta=2 / 3, gamma=-0.1, zeta=1.1):
    return 1.0 - sigmoid(beta * logit((1.0 - gamma) / (zeta - gamma)) - log_alpha)


def g_hat(log_alpha, gamma=-0.1, zeta=1.1):
    return min(1.0, max(0.0, sigmoid(log_alpha) * (zeta - gamma) + gamma))


LOG_ALPHAS = [-3.0, -1.0, -0.2, 0.0, 0.7, 2.0, 4.0]


def test_prob_closed_matches_independent_formula():
    hc = HardConcrete()
    la = torch.tensor(LOG_ALPHAS)
    got = hc.prob_closed(la)
    # the paper's form sigmoid(beta * log(-gamma/zeta) - log_alpha), written out by hand
    paper = [sigmoid((2 / 3) * math.log(0.1 / 1.1) - a) for a in LOG_ALPHAS]
    derived = [p_zero(a) for a in LOG_ALPHAS]
    assert got.tolist() == pytest.approx(paper, abs=1e-6)
    assert got.tolist() == pytest.approx(derived, abs=1e-6)
    assert hc.prob_open(la).tolist() == pytest.approx([1 - p for p in derived], abs=1e-6)
    # monotone: a larger log_alpha closes the gate less often
    assert (got[1:] < got[:-1]).all()


@pytest.mark.parametrize("params", [dict(), dict(beta=0.33, gamma=-0.2, zeta=1.3)])
def test_samples_match_distribution_monte_carlo(params):
    """Point masses at 0 and 1 and the CDF at interior points have the predicted frequencies
    (tolerance: 5 binomial standard deviations)."""
    torch.manual_seed(0)
    hc = HardConcrete(**params)
    n = 200_000
    for a in [-1.0, 0.0, 0.5, 2.0]:
        g = hc.sample(torch.full((n,), a))
        assert torch.isfinite(g).all()
        assert g.min() >= 0.0 and g.max() <= 1.0
        checks = [((g == 0).float().mean().item(), p_zero(a, **params)),
                  ((g == 1).float().mean().item(), p_one(a, **params))]
        for x in (0.25, 0.5, 0.9):
            checks.append(((g <= x).float().mean().item(), cdf(x, a, **params)))
        for freq, p in checks:
            std = math.sqrt(p * (1 - p) / n)
            assert 0.0 < p < 1.0
            assert abs(freq - p) <= 5 * std + 1e-4, (a, freq, p)
        # both point masses really occur, and the interior too
        assert (g == 0).any() and (g == 1).any() and ((g > 0) & (g < 1)).any()


def test_expected_l0_with_and_without_mask():
    hc = HardConcrete()
    la = torch.tensor([[-2.0, 0.5, 3.0], [1.0, -0.3, 0.0]])
    mask = torch.tensor([[True, False, True], [True, True, False]])
    opens = [[1 - p_zero(a) for a in row] for row in la.tolist()]
    full = sum(sum(r) for r in opens)
    masked = sum(o for r, m in zip(opens, mask.tolist()) for o, k in zip(r, m) if k)
    assert hc.expected_l0(la).item() == pytest.approx(full, abs=1e-5)
    assert hc.expected_l0(la, mask).item() == pytest.approx(masked, abs=1e-5)
    assert hc.expected_l0(la, torch.zeros_like(mask)).item() == 0.0


def test_deterministic_gate_thresholds_and_values():
    hc = HardConcrete()
    # exactly 0 iff log_alpha <= -ln 11, exactly 1 iff log_alpha >= ln 11 (defaults gamma=-0.1, zeta=1.1)
    la = torch.tensor([-1e4, -50.0, -LN11 - 1e-2, -LN11 + 1e-2, -1.0, 0.0, 0.3, 1.5, LN11 - 1e-2, LN11 + 1e-2, 50.0, 1e4])
    g = hc.deterministic(la)
    for a, v in zip(la.tolist(), g.tolist()):
        if a <= -LN11:
            assert v == 0.0, a
        elif a >= LN11:
            assert v == 1.0, a
        else:
            assert 0.0 < v < 1.0, a
            assert v == pytest.approx(1.2 * sigmoid(a) - 0.1, abs=1e-6)
    assert hc.deterministic(torch.tensor([0.0])).item() == pytest.approx(0.5, abs=1e-7)


def test_deterministic_gate_custom_stretch():
    hc = HardConcrete(beta=0.5, gamma=-0.3, zeta=1.2)
    # zero iff sigmoid(a) <= 0.3/1.5 = 0.2 iff a <= log(0.25); one iff sigmoid(a) >= 1.3/1.5
    lo, hi = math.log(0.25), logit(1.3 / 1.5)
    la = torch.tensor([lo - 1e-2, lo + 1e-2, 0.0, hi - 1e-2, hi + 1e-2])
    g = hc.deterministic(la).tolist()
    assert g[0] == 0.0 and g[-1] == 1.0
    for a, v in zip(la.tolist()[1:-1], g[1:-1]):
        assert v == pytest.approx(g_hat(a, -0.3, 1.2), abs=1e-6) and 0 < v < 1
    assert hc.prob_closed(torch.tensor([0.7])).item() == pytest.approx(p_zero(0.7, 0.5, -0.3, 1.2), abs=1e-6)


def test_forward_samples_in_training_and_is_deterministic_in_eval():
    hc = HardConcrete()
    la = torch.linspace(-3, 3, 1000)
    hc.train()
    torch.manual_seed(1)
    a, b = hc(la), hc(la)
    assert not torch.equal(a, b)
    hc.eval()
    c, d = hc(la), hc(la)
    assert torch.equal(c, d)
    assert torch.equal(c, hc.deterministic(la))


def test_gradients_flow_through_samples():
    """dg/dlog_alpha = (zeta - gamma) * s (1 - s) / beta inside (0, 1), and 0 where clamped."""
    torch.manual_seed(2)
    hc = HardConcrete()
    la = torch.linspace(-3, 3, 2000).requires_grad_()
    g = hc.sample(la)
    g.sum().backward()
    grad = la.grad
    inside = (g > 0) & (g < 1)
    assert inside.sum() > 100 and (~inside).sum() > 100
    s = (g.detach() - hc.gamma) / (hc.zeta - hc.gamma)
    expected = (hc.zeta - hc.gamma) * s * (1 - s) / hc.beta
    assert (grad[inside] != 0).all()
    assert torch.allclose(grad[inside], expected[inside], atol=1e-4, rtol=1e-3)
    assert (grad[~inside] == 0).all()


def test_probability_gradient():
    """d P(g != 0) / d log_alpha = p (1 - p)."""
    hc = HardConcrete()
    la = torch.tensor([-2.0, 0.0, 1.0], requires_grad=True)
    hc.expected_l0(la).backward()
    expected = [(1 - p_zero(a)) * p_zero(a) for a in (-2.0, 0.0, 1.0)]
    assert la.grad.tolist() == pytest.approx(expected, abs=1e-6)


def test_extreme_log_alpha_is_finite():
    torch.manual_seed(3)
    hc = HardConcrete()
    la = torch.tensor([-1e4, 1e4] * 500, requires_grad=True)
    g = hc.sample(la)
    assert torch.isfinite(g).all()
    assert (g[0::2] == 0).all() and (g[1::2] == 1).all()
    p0 = hc.prob_closed(la)
    assert torch.isfinite(p0).all()
    assert (p0[0::2] == 1).all() and (p0[1::2] == 0).all()
    l0 = hc.expected_l0(la)
    assert l0.item() == pytest.approx(500.0)
    det = hc.deterministic(la)
    assert (det[0::2] == 0).all() and (det[1::2] == 1).all()
    (g.sum() + l0 + p0.sum() + det.sum()).backward()
    assert torch.isfinite(la.grad).all()
    # half precision inputs too (fp16 training)
    la16 = torch.tensor([-1e4, 1e4, 0.0], dtype=torch.float16)
    for out in (hc.sample(la16), hc.prob_closed(la16), hc.prob_open(la16), hc.deterministic(la16)):
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("kwargs", [
    dict(beta=0.0), dict(beta=-0.5), dict(gamma=0.0), dict(gamma=0.1), dict(zeta=1.0), dict(zeta=0.9),
])
def test_invalid_parameters_raise(kwargs):
    with pytest.raises(ValueError):
        HardConcrete(**kwargs)


def test_parameters_are_configurable():
    hc = HardConcrete(beta=0.33, gamma=-0.2, zeta=1.3)
    assert (hc.beta, hc.gamma, hc.zeta) == (0.33, -0.2, 1.3)
    la = torch.tensor([0.4])
    assert hc.prob_closed(la).item() == pytest.approx(sigmoid(0.33 * math.log(0.2 / 1.3) - 0.4), abs=1e-6)
    assert hc.deterministic(la).item() == pytest.approx(g_hat(0.4, -0.2, 1.3), abs=1e-6)
