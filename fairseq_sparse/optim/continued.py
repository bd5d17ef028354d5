"""A fine-tuning that continues its start model's optimisation, as Zhang, Titov & Sennrich (2021)'s code fine-tunes
L0Drop (github.com/bzhangGo/zero: the global step and Adam's moments restored, the inverse-sqrt rate going on):

- :func:`continued_start`: the start checkpoint made a ``--continue-once`` start for the sparsity criterion and
  ``adam_sparsity``: Adam's state kept (``adam_sparsity`` adds the gates' groups without state), the update count
  set to 0 so that the fine-tuning's budget counts from there;
- ``--lr-scheduler inverse_sqrt_continued --lr-offset-updates B``: fairseq's inverse-sqrt schedule at update
  B + u, so the rate goes on from where the start model's training left it.
"""
import copy
from dataclasses import dataclass, field

from fairseq.optim.lr_scheduler import register_lr_scheduler
from fairseq.optim.lr_scheduler.inverse_square_root_schedule import (
    InverseSquareRootLRScheduleConfig, InverseSquareRootSchedule)

#: the classes a continued fine-tuning trains with (fairseq checks a restored state's names against them)
CONTINUED_CRITERION = "LabelSmoothedCrossEntropyWithSparsity"
CONTINUED_OPTIMIZER = "FairseqAdamSparsity"
#: what each may continue from: fairseq's label-smoothed CE and Adam, or a fine-tuning of this package
CONTINUABLE = {"criterion_name": ("LabelSmoothedCrossEntropyCriterion", CONTINUED_CRITERION),
               "optimizer_name": ("FairseqAdam", CONTINUED_OPTIMIZER)}


@dataclass
class InverseSquareRootContinuedConfig(InverseSquareRootLRScheduleConfig):
    lr_offset_updates: int = field(default=0, metadata={
        "help": "the updates the start model was trained with: the rate at update u is inverse_sqrt's at update "
                "u + this (with the start's --lr and --warmup-updates, its rate continues)"})


@register_lr_scheduler("inverse_sqrt_continued", dataclass=InverseSquareRootContinuedConfig)
class InverseSquareRootContinuedSchedule(InverseSquareRootSchedule):
    """fairseq's inverse_sqrt, --lr-offset-updates later."""

    def __init__(self, cfg, optimizer):
        if not (isinstance(cfg.lr_offset_updates, int) and cfg.lr_offset_updates >= 0):
            raise ValueError(f"--lr-offset-updates must be an update count >= 0, got {cfg.lr_offset_updates}")
        super().__init__(cfg, optimizer)
        self.step_update(0)

    def step_update(self, num_updates):
        return super().step_update(num_updates + self.cfg.lr_offset_updates)


def continued_start(state: dict) -> dict:
    """A copy of checkpoint STATE (fairseq's dict) that ``fairseq-train --continue-once`` restores into a fine-tuning
    with the sparsity criterion and adam_sparsity: Adam's moments and step counts kept, the names fairseq checks
    set to those classes (subclasses of the start's: the same Adam, the same loss plus penalties), the update count
    0. ValueError for a start trained with another criterion or optimiser, or without optimiser state."""
    if not state.get("optimizer_history") or not state.get("last_optimizer_state"):
        raise ValueError("the start checkpoint has no optimiser state to continue (saved with --no-save-optimizer-state?)")
    last = state["optimizer_history"][-1]
    for key, allowed in CONTINUABLE.items():
        if last.get(key) not in allowed:
            raise ValueError(f"the start checkpoint was trained with {last.get(key)}; a continued fine-tuning "
                             f"restores only {' or '.join(allowed)}")
    out = copy.copy(state)
    out["optimizer_history"] = state["optimizer_history"][:-1] + [
        {**last, "criterion_name": CONTINUED_CRITERION, "optimizer_name": CONTINUED_OPTIMIZER, "num_updates": 0}]
    return out
