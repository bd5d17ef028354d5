"""The one interface between sparsity modules and the criterion.

A module that wants a penalty in the loss (L0Drop gates, head gates, attention regularisers)
subclasses :class:`SparsityModule` and, in its forward pass, calls :meth:`SparsityModule.record`
with a :class:`SparsityTerm`. The criterion (``label_smoothed_cross_entropy_with_sparsity``) collects
the terms of every such module after the forward pass, weights each by the lambda of its group and
logs its statistics; it never looks inside the modules.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn


@dataclass
class SparsityTerm:
    """What one sparsity module reports for one forward pass.

    group: the lambda that weights ``penalty`` (e.g. ``"l0drop"`` -> ``--l0drop-lambda``).
    penalty: scalar tensor, normalised so that the paper's lambda keeps its meaning next to a
        per-token mean cross-entropy (the criterion multiplies it by lambda * sample_size), or None
        when the module only reports statistics (eval mode).
    stats: name -> (numerator, denominator); summed over batches and workers and logged as
        numerator / denominator, e.g. ``{"l0drop_expected_l0": (sum P(g != 0), src_tokens)}``.
    sparsity: key -> :class:`SparsityCount` of the units this module gates (summed over the modules
        reporting the same key); the criterion logs ``<key>_expected_sparsity``, steers a key to
        ``--*-target-sparsity`` and warns when a key's units are (nearly) all closed. (The g_hat share
        is a statistic the module reports itself, as ``<key>_sparsity``.)
    """

    group: str
    penalty: Optional[torch.Tensor]
    stats: Dict[str, Tuple[float, float]] = field(default_factory=dict)
    sparsity: Dict[str, "SparsityCount"] = field(default_factory=dict)


@dataclass
class SparsityCount:
    """Closed units of one forward pass: ``expected`` = sum of P(g = 0) (differentiable in training),
    ``closed`` = number with g_hat = 0, out of ``units``."""

    expected: torch.Tensor
    closed: torch.Tensor
    units: float


class SparsityModule(nn.Module):
    """Base class of modules that report :class:`SparsityTerm` s for the criterion to read.

    A module keeps only the term of its latest forward pass, so decoding (where nobody collects the
    terms) holds no growing state.

    Every parameter a sparsity module holds, directly or in a submodule (L0Drop's w and b, head gates'
    log alpha), is a sparsity-control parameter: assigning it marks it ``p.sparsity_control = True``
    (:func:`mark_sparsity_control`), and ``--optimizer adam_sparsity`` gives such parameters their own
    learning rate and no weight decay. Criterions mark their own (e.g. Lagrange multipliers) the same way.
    """

    #: the lambda group of this module's penalty; subclasses set it
    penalty_group: str = ""

    def __init__(self):
        super().__init__()
        self._term: Optional[SparsityTerm] = None
        self.num_updates = 0

    def set_num_updates(self, num_updates):
        """fairseq passes the update count to every submodule that has this method."""
        self.num_updates = num_updates

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if isinstance(value, nn.Parameter):
            mark_sparsity_control([value])
        elif isinstance(value, nn.Module):
            mark_sparsity_control(value.parameters())

    def record(self, term: SparsityTerm):
        self._term = term

    def pop_sparsity_terms(self) -> List[SparsityTerm]:
        """The term of the latest forward pass, if it was not collected yet."""
        term, self._term = self._term, None
        return [] if term is None else [term]


#: the attribute that marks a parameter as a sparsity-control parameter (gates, Lagrange multipliers)
SPARSITY_CONTROL = "sparsity_control"


def mark_sparsity_control(params):
    """Mark ``params`` as sparsity-control parameters (see :class:`SparsityModule`)."""
    for p in params:
        setattr(p, SPARSITY_CONTROL, True)


def is_sparsity_control(param) -> bool:
    return bool(getattr(param, SPARSITY_CONTROL, False))


#: the attribute that marks an input-dependent gate weight (L0Drop's w): its Adam step moves log alpha by up to
#: lr times ||x||_1, so ``--l0drop-weight-lr`` may give it a rate of its own
INPUT_WEIGHT = "gate_input_weight"


def mark_input_weight(param):
    setattr(param, INPUT_WEIGHT, True)


def is_input_weight(param) -> bool:
    return bool(getattr(param, INPUT_WEIGHT, False))


def collect_sparsity_terms(model: nn.Module) -> List[SparsityTerm]:
    """All terms recorded by the sparsity modules inside ``model`` since the last collection."""
    terms = []
    for module in model.modules():
        if isinstance(module, SparsityModule):
            terms.extend(module.pop_sparsity_terms())
    return terms


def sparsity_groups(model: nn.Module) -> set:
    """The penalty groups the model's sparsity modules can report (e.g. {"l0drop"})."""
    return {m.penalty_group for m in model.modules() if isinstance(m, SparsityModule)}


def num_updates(model: nn.Module) -> int:
    """The training update count, as fairseq last passed it to the model's sparsity modules."""
    return max((m.num_updates for m in model.modules() if isinstance(m, SparsityModule)), default=0)
