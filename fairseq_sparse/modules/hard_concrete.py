"""The HardConcrete distribution (Louizos, Welling & Kingma 2018, "Learning sparse neural networks
through L0 regularization", Sec. 2.3), the one implementation every gate in this package uses.

Notation follows the L0Drop paper (Zhang, Titov & Sennrich, Eqs. 5-8 and 13):

    u ~ U(0, 1)
    s = sigmoid((log u - log(1 - u) + log_alpha) / beta)        BinaryConcrete sample (Eq. 6)
    s_bar = s * (zeta - gamma) + gamma                          stretch (Eq. 7; gamma = -eps, zeta = 1 + eps)
    g = min(1, max(0, s_bar))                                   rectify (Eq. 8)
    P(g = 0) = sigmoid(beta * log(-gamma / zeta) - log_alpha)   closed form (Sec. 4.1)
    g_hat = min(1, max(0, sigmoid(log_alpha) * (zeta - gamma) + gamma))   test-time gate (Eq. 13)
"""
import math

import torch
from torch import nn

#: defaults of the L0Drop paper: beta = 2/3, eps = 0.1 -> (gamma, zeta) = (-0.1, 1.1)
DEFAULT_BETA = 2.0 / 3.0
DEFAULT_GAMMA = -0.1
DEFAULT_ZETA = 1.1


class HardConcrete(nn.Module):
    """Stateless HardConcrete gate distribution; ``log_alpha`` is passed in, so the same object serves
    input-dependent gates (L0Drop, log_alpha = x.w + b) and free per-head parameters (head gates).

    Args:
        beta: temperature of the BinaryConcrete (2/3 in L0Drop and Louizos et al.; Voita et al.'s code uses 0.33)
        gamma, zeta: stretch interval (gamma < 0 < 1 < zeta); the L0Drop paper's eps = -gamma = zeta - 1
        eps: keeps the uniform noise away from 0 and 1 so log u and log(1 - u) stay finite
    """

    def __init__(self, beta=DEFAULT_BETA, gamma=DEFAULT_GAMMA, zeta=DEFAULT_ZETA, eps=1e-6):
        super().__init__()
        if not math.isfinite(beta):
            raise ValueError(f"HardConcrete beta must be a finite number > 0, got {beta}")
        if not (math.isfinite(gamma) and math.isfinite(zeta)):
            raise ValueError(f"HardConcrete gamma and zeta must be finite numbers, got gamma={gamma}, zeta={zeta}")
        if beta <= 0:
            raise ValueError(f"HardConcrete beta must be > 0, got {beta}")
        if not (gamma < 0.0 and zeta > 1.0):
            raise ValueError(f"HardConcrete needs gamma < 0 and zeta > 1, got gamma={gamma}, zeta={zeta}")
        self.beta, self.gamma, self.zeta, self.eps = float(beta), float(gamma), float(zeta), float(eps)
        self._log_ratio = math.log(-self.gamma / self.zeta)  # log(-gamma/zeta) < 0

    def extra_repr(self):
        return f"beta={self.beta:.4g}, gamma={self.gamma}, zeta={self.zeta}"

    def _stretch_and_rectify(self, s):
        return (s * (self.zeta - self.gamma) + self.gamma).clamp(0.0, 1.0)

    def sample(self, log_alpha):
        """Reparameterised sample g (Eqs. 6-8); gradients flow to log_alpha."""
        u = torch.rand_like(log_alpha, dtype=torch.float32).clamp(self.eps, 1.0 - self.eps)
        noise = torch.log(u) - torch.log1p(-u)
        s = torch.sigmoid((noise + log_alpha.float()) / self.beta)
        return self._stretch_and_rectify(s)

    def prob_closed(self, log_alpha):
        """P(g = 0) = sigmoid(beta * log(-gamma/zeta) - log_alpha)."""
        return torch.sigmoid(self.beta * self._log_ratio - log_alpha.float())

    def prob_open(self, log_alpha):
        """P(g != 0) = 1 - P(g = 0); its sum is the expected L0 norm (L0Drop Eq. 10)."""
        return torch.sigmoid(log_alpha.float() - self.beta * self._log_ratio)

    def expected_l0(self, log_alpha, mask=None):
        """Sum of P(g != 0) over the gates where ``mask`` is True (all gates without a mask)."""
        p = self.prob_open(log_alpha)
        if mask is not None:
            p = p * mask.to(p.dtype)
        return p.sum()

    def deterministic(self, log_alpha):
        """Test-time gate g_hat (Eq. 13): exactly 0 iff sigmoid(log_alpha) <= -gamma/(zeta-gamma)."""
        return self._stretch_and_rectify(torch.sigmoid(log_alpha.float()))

    def forward(self, log_alpha):
        """A sample in training mode, the deterministic gate in eval mode."""
        return self.sample(log_alpha) if self.training else self.deterministic(log_alpha)


def check_gate_options(prefix: str, beta, gamma, zeta, init_option: str, init):
    """Refuse bad options of one kind of gate (e.g. prefix ``--l0drop``) with the options' names: the
    HardConcrete parameters, and a finite initial log alpha (nan and inf pass comparisons)."""
    try:
        HardConcrete(beta, gamma, zeta)
    except ValueError as err:
        raise ValueError(f"{prefix}-beta, {prefix}-gamma, {prefix}-zeta: {err}") from None
    if not math.isfinite(init):
        raise ValueError(f"{prefix}-{init_option} must be a finite number, got {init}")
