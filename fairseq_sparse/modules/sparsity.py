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
        numerator / denominator, e.g. ``{"l0drop_sparsity": (pruned, src_tokens)}``.
    """

    group: str
    penalty: Optional[torch.Tensor]
    stats: Dict[str, Tuple[float, float]] = field(default_factory=dict)


class SparsityModule(nn.Module):
    """Base class of modules that report :class:`SparsityTerm` s for the criterion to read.

    A module keeps only the term of its latest forward pass, so decoding (where nobody collects the
    terms) holds no growing state.
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

    def record(self, term: SparsityTerm):
        self._term = term

    def pop_sparsity_terms(self) -> List[SparsityTerm]:
        """The term of the latest forward pass, if it was not collected yet."""
        term, self._term = self._term, None
        return [] if term is None else [term]


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
