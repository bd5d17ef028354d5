"""Sparsity on demand: a Lagrangian controller that drives an expected sparsity to a target.

For each controlled quantity k (e.g. ``l0drop``: the share of source states pruned; ``head_gates`` or
``head_gates_enc``: the share of gated heads closed) the training loss gets

    lambda_1 (s_k - t_k) + lambda_2 (s_k - t_k)^2                       (Xia, Zhong & Chen 2022, CoFi)

where s_k is the sparsity of the controlled units and t_k the target at this update. CoFi's gates read
no input, so s_k is the same on every batch; L0Drop's read the source, and s_k is a batch's share, which
varies from batch to batch (by about 0.35, root mean square, on a corpus of short descriptions and long documents,
docs/training-options.md). Ascent on (s_k - t_k)^2 would then grow lambda_2 without end, on target too, and with it
the term 2 lambda_2 (s_k - t_k) in each batch's gradient, into noise that swamps the task's. So lambda_2
ascends on (s_k - t_k)(m_k - t_k) instead, m_k the running mean of the earlier batches' s_k
(``MEAN_DECAY``): independent of this batch, so its expectation is (E s_k - t_k)(m_k - t_k), about
(m_k - t_k)^2, which vanishes on target. The model's gradient and the loss's value are CoFi's. Where s_k
does not vary from batch to batch, the two signals differ only by the lag of m_k (the first batch has no
m_k and uses s_k). What the user
asks for is the sparsity of the test-time gates g_hat, which is not differentiable; the *expected*
sparsity (the mean of P(g = 0)) is, but it differs from the g_hat share (a gate at the g_hat = 0
boundary is closed with probability 0.83 for beta 0.33). So s_k is a straight-through estimate
(:func:`straight_through`): its value is the g_hat share, its gradient that of the expected sparsity;
the multipliers then settle where the g_hat share meets the target. The model minimises the loss;
the multipliers maximise it (gradient ascent: their gradient's sign is flipped by a tensor hook), so
lambda_1 turns negative while the model is not sparse enough (pushing s up) and positive while it is
too sparse, and lambda_2 grows while s misses the target. The target rises linearly from 0 to its final
value over ``warmup_updates`` updates (then holds), so the gates close gradually. A schedule of targets
t_k^1 < t_k^2 < ... (one fine-tuning that gives a whole sparsity/quality curve, Zhang, Titov & Sennrich
2021 Fig. 4; Voita et al. 2019 Fig. 7) holds each for ``hold_updates`` updates, moving linearly from one
to the next over the first ``warmup_updates`` of its stage (:func:`scheduled_target`).

The options that set the targets (``--l0drop-target-sparsity``, ``--head-gates-target-sparsity``) are
parsed here (:func:`parse_targets`), for the criterion and for the tools that read a checkpoint's targets.

Adam moves every parameter by about its learning rate per update, the gates' log alpha as well as the
multipliers, and a gate needs (3 + 2.4) / lr updates to go from fully open to closed. Multipliers that
moved as fast would wind up while the gates lag and overshoot the target: lambda_1 is ``LAMBDA1_SCALE``
times its parameter, so it moves 5x slower than the gates. Measured on 40 head gates with a task loss
that keeps them open (tests/test_sparsity_control.py; Adam lr 0.05, warm-up 200): targets 0.25 / 0.5 /
0.75 held within 2 gates (0.05) over updates 500-600, overshoot <= 0.075; with lambda_1 at full speed
the overshoot was 0.33, without lambda_2 the g_hat share missed by up to 0.5.

The multipliers are ``nn.Parameter`` s of the criterion: fairseq's trainer gives them to the optimiser
(``criterion.parameters()``), all-reduces their gradients across workers (they stay identical on every
worker) and saves them in checkpoints. Each is marked a sparsity-control parameter, so that
``--optimizer adam_sparsity`` puts them in the gates' group (``--sparsity-lr``, no weight decay).
"""
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from .head_gates import ATTENTION_TYPES
from .sparsity import mark_sparsity_control

#: units at least this share closed count as "(nearly) all closed" for the log's warning
ALL_CLOSED = 0.99
#: lambda_1 = LAMBDA1_SCALE x its parameter: it moves this much slower than the gates (see above)
LAMBDA1_SCALE = 0.2
#: default updates over which the target rises from 0 (about two gate travel times at gate lr 0.05)
DEFAULT_TARGET_WARMUP = 200
#: decay of m_k, the running mean of the batches' sparsity for lambda_2's ascent (about 20 batches)
MEAN_DECAY = 0.95


def scheduled_target(stages: Sequence[float], num_updates: int, hold_updates: int = 0,
                     warmup_updates: int = DEFAULT_TARGET_WARMUP) -> float:
    """The target after ``num_updates`` updates: stage k = num_updates // hold_updates (the last stage
    holds on; one stage when hold_updates is 0), reached linearly from the previous stage's target (0
    before the first) over the stage's first ``warmup_updates`` updates."""
    k = 0 if hold_updates <= 0 else min(num_updates // hold_updates, len(stages) - 1)
    previous = stages[k - 1] if k > 0 else 0.0
    into_stage = num_updates - k * hold_updates if hold_updates > 0 else num_updates
    ramp = 1.0 if warmup_updates <= 0 else min(1.0, into_stage / warmup_updates)
    return previous + ramp * (stages[k] - previous)


def straight_through(closed: Tensor, expected: Tensor, units: float) -> Tensor:
    """The share of closed units: value closed / units (g_hat), gradient of expected / units."""
    return (closed + expected - expected.detach()) / units


def _ascent(grad: Tensor) -> Tensor:
    return -grad


class LagrangianController(nn.Module):
    """Multipliers (lambda_1, lambda_2) and a target schedule for each controlled key: a target, or a
    sequence of targets each held for ``hold_updates`` updates (:func:`scheduled_target`)."""

    def __init__(self, targets: Mapping[str, Union[float, Sequence[float]]],
                 warmup_updates: int = DEFAULT_TARGET_WARMUP, hold_updates: int = 0):
        super().__init__()
        self.targets = {key: (float(t),) if isinstance(t, (int, float)) else tuple(float(x) for x in t)
                        for key, t in targets.items()}
        for key, stages in self.targets.items():
            if not stages or not all(0.0 <= t < 1.0 for t in stages):
                raise ValueError(f"target sparsity for {key} must be in [0, 1), got {stages}")
        if warmup_updates < 0:
            raise ValueError(f"the target warm-up must be >= 0 updates, got {warmup_updates}")
        if hold_updates < 0:
            raise ValueError(f"the target hold must be >= 0 updates, got {hold_updates}")
        scheduled = any(len(stages) > 1 for stages in self.targets.values())
        if scheduled and hold_updates <= warmup_updates:
            raise ValueError(f"a schedule of targets holds each for --sparsity-target-hold-updates updates, which "
                             f"must exceed the {warmup_updates}-update warm-up towards it; got {hold_updates}")
        self.warmup_updates = warmup_updates
        self.hold_updates = hold_updates if scheduled else 0
        self.multipliers = nn.ParameterDict()
        # m_k per key (in the order of targets) and whether a batch has set it yet: a buffer, so that it is saved
        # with the criterion and a resumed run goes on with it
        self.register_buffer("running_share", torch.zeros(len(self.targets), 2))
        for key in self.targets:
            p = nn.Parameter(torch.zeros(2))  # lambda_1 / LAMBDA1_SCALE, lambda_2
            mark_sparsity_control([p])
            p.register_hook(_ascent)
            self.multipliers[key] = p

    def target(self, key: str, num_updates: int) -> float:
        """t_k at this update (:func:`scheduled_target`)."""
        return scheduled_target(self.targets[key], num_updates, self.hold_updates, self.warmup_updates)

    def stages(self) -> int:
        """Number of targets in the longest schedule (1 without a schedule)."""
        return max(len(stages) for stages in self.targets.values())

    def lambdas(self, key: str) -> Tensor:
        """(lambda_1, lambda_2) of ``key``."""
        p = self.multipliers[key]
        return torch.stack([LAMBDA1_SCALE * p[0], p[1]])

    def lagrangian(self, sparsity: Mapping[str, Tensor], num_updates: int) -> Dict[str, Tensor]:
        """{key: lambda_1 (s - t) + lambda_2 (s - t)^2} for every controlled key with a sparsity s (this
        batch's); lambda_2's gradient is (s - t)(m - t), m the running mean of the earlier batches' s."""
        out = {}
        for i, key in enumerate(self.multipliers):
            s = sparsity.get(key)
            if s is None:
                continue
            lam = self.lambdas(key)
            target = self.target(key, num_updates)
            gap = s - target
            share = s.detach()
            mean, seen = self.running_share[i, 0].clone(), self.running_share[i, 1] > 0
            mean_gap = torch.where(seen, mean - target, gap.detach())
            # value and model gradient lambda_2 gap^2; lambda_2's gradient gap * mean_gap
            quadratic = lam[1].detach() * gap * gap + (lam[1] - lam[1].detach()) * gap.detach() * mean_gap
            out[key] = lam[0] * gap + quadratic
            with torch.no_grad():
                self.running_share[i, 0] = torch.where(seen, MEAN_DECAY * mean + (1 - MEAN_DECAY) * share, share)
                self.running_share[i, 1] = 1.0
        return out

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """A checkpoint from before the running mean was saved: it starts afresh, as it did then."""
        state_dict.setdefault(prefix + "running_share", torch.zeros_like(self.running_share))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def parse_targets(l0drop, head_gates: Optional[str]) -> Dict[str, Tuple[float, ...]]:
    """{controlled key: target schedule} from --l0drop-target-sparsity and --head-gates-target-sparsity:
    a number or a schedule of numbers ('0.2,0.4' or '0.2:0.4'), or ``type=schedule`` pairs ('enc=0.2:0.4,
    encdec=0.1'): keys ``l0drop``, ``head_gates`` / ``head_gates_<type>``."""
    targets = {}
    if l0drop is not None and str(l0drop).strip():
        targets["l0drop"] = _schedule(str(l0drop), ",:", "--l0drop-target-sparsity")
    spec = (head_gates or "").strip()
    if spec and "=" not in spec:
        targets["head_gates"] = _schedule(spec, ",:", "--head-gates-target-sparsity")
    for part in filter(None, (p.strip() for p in spec.split(","))) if "=" in spec else ():
        kind, _, value = part.partition("=")
        kind = kind.strip()
        if kind not in ATTENTION_TYPES:
            raise ValueError(f"--head-gates-target-sparsity: unknown attention type {kind!r} in {spec!r}; "
                             f"use a number or e.g. 'enc=0.6,encdec=0.2' (types: {', '.join(ATTENTION_TYPES)})")
        if f"head_gates_{kind}" in targets:
            raise ValueError(f"--head-gates-target-sparsity: attention type {kind!r} is given twice in {spec!r}; "
                             f"give each type once (a schedule: '{kind}=0.2:0.4')")
        targets[f"head_gates_{kind}"] = _schedule(value, ":", f"--head-gates-target-sparsity {kind}")
    return targets


def _schedule(spec: str, separators: str, option: str) -> Tuple[float, ...]:
    for sep in separators[1:]:
        spec = spec.replace(sep, separators[0])
    return tuple(_target_value(v.strip(), option) for v in spec.split(separators[0]))


def _target_value(value, option: str) -> float:
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{option}: {value!r} is not a number (a target in [0, 1), or a schedule '0.2,0.4' "
                         "or, per attention type, 'enc=0.2:0.4')") from None
    if not 0.0 <= t < 1.0:  # also refuses nan and inf
        raise ValueError(f"{option} must be in [0, 1), got {value}")
    return t
