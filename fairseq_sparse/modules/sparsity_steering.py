"""What a sparsity criterion does with the gated sparsity of every batch, beside the Lagrangian controller
(modules/sparsity_control.py), as CoFi keeps its L0 module's control beside the model (Xia, Zhong & Chen 2022):
check that the targets fit the model and the schedule fits fairseq's checkpoints, measure the share of L0Drop gates
the test-time gates close (what decoding prunes), log the expected and test-time shares, warn once when a key's units
are (nearly) all closed or its sparsity lags its target, and return the controller's Lagrangian. The criterion
(criterions/label_smoothed_cross_entropy_with_sparsity.py) holds one :class:`SparsitySteering` and the controller,
whose multipliers stay its parameters (saved with it)."""
import logging
from typing import Dict, Optional

import torch

from .encoder_patterns import encoder_inputs
from .sparsity import collect_sparsity_terms
from .sparsity_control import ALL_CLOSED, LagrangianController, straight_through

logger = logging.getLogger(__name__)

STAT_PREFIX = "sparsity/"
#: batches behind a logging output's penalties and lambdas: 1 per batch, summed like every other key when
#: fairseq merges the logging outputs of several workers (logging_outputs_can_be_summed), so their mean
#: stays a mean across workers
BATCHES_KEY = "sparsity_batches"
#: a controlled sparsity still this far from its target ...
LAG_TOLERANCE = 0.1
#: ... this many target warm-ups into training is reported (once per key)
LAG_CHECK_AFTER = 2
#: the study in which every gate trained from scratch closed and none reopened (the all-closed warning cites it)
FROM_SCRATCH_DOCS = "docs/recipe.md#sparse-from-scratch-a-continued-fine-tuning-and-the-data-axis"


class SparsityConfigError(ValueError, RuntimeError):
    """A sparsity option the model cannot honour (e.g. a lambda for a module the model lacks).

    Found before the first batch (fairseq's ``task.begin_epoch`` hook, see
    ``check_model_before_training`` in criterions/label_smoothed_cross_entropy_with_sparsity.py), else at the first
    forward pass. It is also a RuntimeError because fairseq's trainer saves a ``crash.pt`` checkpoint for
    any other exception raised inside a training step; a configuration error must stop without writing.
    """


class SparsitySteering:
    """The controller's per-batch work for a criterion (module docstring). ``controller``: None without targets (the
    shares are logged and the all-closed warning given all the same); ``schedule_checkpoints``: fairseq's
    (--save-interval-updates, --max-update, --no-epoch-checkpoints), which a schedule of targets must fit."""

    def __init__(self, controller: Optional[LagrangianController], schedule_checkpoints=(0, 0, False)):
        self.controller = controller
        self.schedule_checkpoints = schedule_checkpoints
        self._warned_closed = set()
        self._checked_lag = set()

    def check_targets(self, model, groups):
        """A target for gates the model lacks is a configuration error; so is a schedule that fairseq's
        checkpoints do not fit (:meth:`check_schedule_checkpoints`). ``groups``: the model's sparsity groups."""
        if self.controller is None:
            return
        if self.controller.stages() > 1:
            self.check_schedule_checkpoints(*self.schedule_checkpoints)
        gated_types = {m.attention_type for m in model.modules() if getattr(m, "penalty_group", "") == "head_gates"}
        available = ({"l0drop"} if "l0drop" in groups else set()) | (
            {"head_gates"} | {f"head_gates_{t}" for t in gated_types} if gated_types else set())
        for key in self.controller.targets:
            if key not in available:
                arch = getattr(getattr(model, "args", None), "arch", type(model).__name__)
                raise SparsityConfigError(
                    f"a target sparsity is set for {key}, but the model ({arch}) has no such gates "
                    f"(it has: {', '.join(sorted(available)) or 'none'})")

    def check_schedule_checkpoints(self, save_interval_updates, max_update, no_epoch_checkpoints=False):
        """A schedule saves one checkpoint per target: fairseq's --save-interval-updates must be the hold, and
        --max-update must leave room for every target. fairseq names a save at an epoch's last update
        checkpoint<epoch>.pt, which --no-epoch-checkpoints suppresses: a target ending there would be lost."""
        hold, stages = self.controller.hold_updates, self.controller.stages()
        if save_interval_updates != hold:
            raise SparsityConfigError(
                f"a schedule of {stages} targets holds each for {hold} updates; add --save-interval-updates {hold} "
                f"(got {save_interval_updates or 'none'}) so that fairseq saves a checkpoint at the end of each target")
        if max_update and max_update < hold * stages:
            raise SparsityConfigError(f"a schedule of {stages} targets x {hold} updates needs --max-update "
                                      f"{hold * stages}, got {max_update}")
        if no_epoch_checkpoints:
            logger.warning("--no-epoch-checkpoints with a schedule of targets: a target that ends on an epoch's "
                           "last update is saved as checkpoint<epoch>.pt, which this option suppresses")

    def test_time_closed(self, model, sample) -> Dict[str, torch.Tensor]:
        """{controlled L0Drop key: source states the test-time gates g_hat close on this batch}. In training
        the gates read encoder states with dropout, and on small data dropout alone moved the share of g_hat = 0
        by 2-5 points (docs/training-options.md#target-sparsity); decoding runs without it. So the
        encoder reruns on the batch in eval mode (no dropout, gradients or random draws) and the controller steers
        that share: what fairseq-generate will prune. Head gates read no input: nothing to redo."""
        encoder = getattr(model, "encoder", None)
        if self.controller is None or "l0drop" not in self.controller.targets or encoder is None:
            return {}
        net_input = sample["net_input"]
        modes = [(m, m.training) for m in encoder.modules()]
        encoder.eval()
        try:
            with torch.no_grad():
                encoder(net_input["src_tokens"], **encoder_inputs(encoder, net_input))
        finally:
            for m, mode in modes:
                m.training = mode
        counts = [t.sparsity["l0drop"].closed for t in collect_sparsity_terms(model) if "l0drop" in t.sparsity]
        return {"l0drop": sum(counts)} if counts else {}

    def control(self, terms, updates: int, training: bool, logging_output: dict, steered=None):
        """Log the expected sparsity of every gated key, warn once when a key's units are (nearly)
        all closed, and return the controller's Lagrangian (training with targets; else 0). ``steered``:
        {key: closed count} that replaces the training pass's g_hat count as the value the controller steers
        (:meth:`test_time_closed`); the gradient is the expected share's either way."""
        counts: Dict[str, tuple] = {}  # key -> (expected closed, closed, units), summed over the modules
        for term in terms:
            for key, c in term.sparsity.items():
                counts[key] = tuple(a + b for a, b in zip(counts.get(key, (0, 0, 0)), (c.expected, c.closed, c.units)))
        for key, closed in (steered or {}).items():
            if key in counts:
                logging_output[f"{STAT_PREFIX}{key}_test_time_sparsity:num"] = closed
                logging_output[f"{STAT_PREFIX}{key}_test_time_sparsity:den"] = counts[key][2]
                counts[key] = (counts[key][0], closed, counts[key][2])
        shares = {}
        for key, (exp, closed, units) in counts.items():
            if not units:
                continue
            # the g_hat share is each module's own statistic (<key>_sparsity); the expected one is logged here
            logging_output[f"{STAT_PREFIX}{key}_expected_sparsity:num"] = exp.detach()
            logging_output[f"{STAT_PREFIX}{key}_expected_sparsity:den"] = units
            shares[key] = straight_through(closed, exp, units)
            if key not in self._warned_closed and float(closed) >= ALL_CLOSED * float(units):
                self._warned_closed.add(key)
                target = (self.controller.target(key, updates)
                          if self.controller is not None and key in self.controller.targets else None)
                advice = ("Lower the target sparsity or lambda if this is not what you want; from scratch, gates "
                          "close while the model does not yet use its source, and closed gates do not reopen "
                          f"({FROM_SCRATCH_DOCS}): fine-tune from a trained model (--finetune-from-model)."
                          if target is None or target >= ALL_CLOSED else
                          f"The target is {target:.2f} now: the controller overshot, as it does when the gates "
                          "cannot follow while the model is still learning (a target from scratch closed every "
                          f"L0Drop gate at once, and so did a ramped fixed lambda, {FROM_SCRATCH_DOCS}); fine-tune "
                          "from a trained model (--finetune-from-model).")
                logger.warning("!!! %s: %d of %d gated units are closed (g_hat = 0): the model has (nearly) nothing "
                               "left there. %s", key, int(closed), int(units), advice)
        if self.controller is None or not training:
            return 0.0
        self.warn_if_lagging(shares, updates)
        lagrangian = self.controller.lagrangian(shares, updates)
        for key in lagrangian:
            lam = self.controller.lambdas(key).detach()
            logging_output[f"{STAT_PREFIX}{key}_target"] = self.controller.target(key, updates)
            logging_output[f"{STAT_PREFIX}{key}_lambda1"] = lam[0]
            logging_output[f"{STAT_PREFIX}{key}_lambda2"] = lam[1]
            logging_output[BATCHES_KEY] = 1
        return sum(lagrangian.values()) if lagrangian else 0.0

    def warn_if_lagging(self, shares, updates):
        """Once per key, LAG_CHECK_AFTER warm-ups into training: warn when the g_hat sparsity is still more
        than LAG_TOLERANCE from the target (typically gates at the model's small learning rate)."""
        if updates < LAG_CHECK_AFTER * max(self.controller.warmup_updates, 1):
            return
        for key, share in shares.items():
            if key in self._checked_lag or key not in self.controller.targets:
                continue
            self._checked_lag.add(key)
            target = self.controller.target(key, updates)
            share = float(share.detach()) if torch.is_tensor(share) else float(share)
            if abs(share - target) > LAG_TOLERANCE:
                logger.warning("%s: sparsity %.2f after %d updates, target %.2f: the gates move slowly. With "
                               "--optimizer adam they move at the model's --lr; --optimizer adam_sparsity gives them "
                               "and the multipliers --sparsity-lr (docs/training-options.md#target-sparsity).",
                               key, share, updates, target)
