"""``--optimizer adam_sparsity``: fairseq's Adam with the sparsity-control parameters in their own group.

Sparsity-control parameters are those marked ``p.sparsity_control = True``: every parameter of a
:class:`~fairseq_sparse.modules.sparsity.SparsityModule` (HardConcrete gates: L0Drop's w and b, head
gates' log alpha) and whatever a criterion marks (the Lagrange multipliers of a target sparsity).
Two torch param groups, always in this order:

0. every other parameter: ``--lr`` as the lr scheduler sets it, ``--weight-decay``;
1. the sparsity-control parameters: ``--sparsity-lr``, fixed (the lr scheduler leaves it alone), and
   no weight decay (decay would pull log alpha to 0, i.e. towards half-open gates, and the multipliers
   to 0);
2. only with ``--l0drop-weight-lr``: L0Drop's input weights w, at that rate, fixed, no weight decay (they
   leave group 1).

Why a fixed learning rate: Adam moves a parameter by about its lr per update whatever the gradient's
size, so a gate starting at log alpha a needs about (a + 2.4) / lr updates to close (g_hat = 0 below
log alpha = log(1/11) = -2.4). At the model's fine-tuning lr (5e-4) a fully open gate (a = 3) needs
~10k updates; scaled by the schedule it would also wait out the warm-up (inverse_sqrt starts at
--warmup-init-lr, 0 by default). CoFi (Xia, Zhong & Chen 2022) trains its log alphas and multipliers
with their own constant learning rate too.

fairseq's plain ``--fp16`` (and ``--bf16``) copies all parameters into new fp32 tensors (one flat
buffer unless ``--fp16-no-flatten-grads``), which loses the groups: refused here, use
``--memory-efficient-fp16`` or ``--amp``, which hand this optimiser the model's own parameters.
"""
import logging
import math
from dataclasses import dataclass, field
from typing import Optional

from fairseq.optim import register_optimizer
from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig
from omegaconf import II

from ..modules.sparsity import INPUT_WEIGHT, is_input_weight, is_sparsity_control

logger = logging.getLogger(__name__)

#: the flag that names the sparsity-control param group (saved with the optimiser state)
GROUP_FLAG = "sparsity_control"
DEFAULT_SPARSITY_LR = 0.05


@dataclass
class FairseqAdamSparsityConfig(FairseqAdamConfig):
    sparsity_lr: float = field(default=DEFAULT_SPARSITY_LR, metadata={
        "help": "learning rate of the sparsity-control parameters (HardConcrete gates' log alpha, L0Drop's "
                "w and b, Lagrange multipliers), fixed: the lr scheduler does not change it, and no weight "
                "decay. Adam moves a gate's log alpha by about this much per update, so a gate starting "
                "fully open (log alpha 3) needs about (3 + 2.4) / lr updates to close; CoFi (Xia, Zhong & "
                "Chen 2022) uses 0.01-0.1"})
    l0drop_weight_lr: Optional[float] = field(default=None, metadata={
        "help": "learning rate of L0Drop's input weights w (log alpha_i = x_i . w + b), fixed, no weight decay; "
                "default: --sparsity-lr. Adam moves each of w's d weights by about this much per update, so a "
                "state's log alpha can move by up to this times ||x_i||_1 (about 0.8 d times it for "
                "layer-normalised states), where b moves by --sparsity-lr. Given, w gets a param group of its own"})
    fp16: bool = II("common.fp16")
    bf16: bool = II("common.bf16")
    memory_efficient_fp16: bool = II("common.memory_efficient_fp16")
    memory_efficient_bf16: bool = II("common.memory_efficient_bf16")
    ddp_backend: str = II("distributed_training.ddp_backend")


def check_config(cfg):
    """Refuse settings under which the groups cannot work, with a message that says what to use instead."""
    for option, lr in (("--sparsity-lr", cfg.sparsity_lr), ("--l0drop-weight-lr", getattr(cfg, "l0drop_weight_lr", None))):
        if lr is not None and not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
            raise ValueError(f"{option} must be a finite number > 0, got {lr}")
    if (getattr(cfg, "fp16", False) or getattr(cfg, "bf16", False)) and not (
            getattr(cfg, "memory_efficient_fp16", False) or getattr(cfg, "memory_efficient_bf16", False)):
        raise ValueError(
            "--optimizer adam_sparsity does not work with plain --fp16/--bf16: fairseq's FP16Optimizer copies "
            "all parameters into one fp32 buffer, so the gates cannot keep their own learning rate and zero "
            "weight decay. Use --fp16 --memory-efficient-fp16 or --amp instead (or --optimizer adam)")
    if getattr(cfg, "ddp_backend", None) == "fully_sharded":
        raise ValueError("--optimizer adam_sparsity does not work with --ddp-backend fully_sharded (FSDP "
                         "flattens all parameters into one): use c10d, no_c10d or legacy_ddp")


def split_params(params):
    """[other parameters, sparsity-control parameters], each in the given order."""
    params = list(params)
    return ([p for p in params if not is_sparsity_control(p)], [p for p in params if is_sparsity_control(p)])


@register_optimizer("adam_sparsity", dataclass=FairseqAdamSparsityConfig)
class FairseqAdamSparsity(FairseqAdam):
    """fairseq's Adam (AdamW-style decay) with group 1 = sparsity-control parameters (see the module doc)."""

    def __init__(self, cfg: FairseqAdamSparsityConfig, params):
        check_config(cfg)
        main, control = split_params(params)
        if not control:
            logger.warning("--optimizer adam_sparsity: the model and criterion have no sparsity-control "
                           "parameters (gates, multipliers); --sparsity-lr has no effect")
        groups = [{"params": main}, {"params": control, GROUP_FLAG: True}]
        if getattr(cfg, "l0drop_weight_lr", None) is not None:
            weights = [p for p in control if is_input_weight(p)]
            if not weights:
                raise ValueError("--l0drop-weight-lr: the model has no L0Drop gates (no input weights w to give "
                                 "that rate); leave the option out")
            groups[1]["params"] = [p for p in control if not is_input_weight(p)]
            groups.append({"params": weights, GROUP_FLAG: True, INPUT_WEIGHT: True})
        super().__init__(cfg, groups)
        self._fix_control_group()
        def size(group):
            return f"{sum(p.numel() for p in group['params']):,} parameters in {len(group['params'])} tensors"
        weights = f"; {size(groups[2])} (L0Drop's w) at --l0drop-weight-lr {cfg.l0drop_weight_lr}" if len(groups) > 2 else ""
        logger.info(f"adam_sparsity: {size(groups[0])} at the scheduled --lr (weight decay {cfg.weight_decay}); "
                    f"sparsity control, fixed rates, no weight decay: {size(groups[1])} at --sparsity-lr "
                    f"{cfg.sparsity_lr}{weights}")

    def _fix_control_group(self):
        for group in self.param_groups:
            if group.get(GROUP_FLAG, False):
                group["lr"] = self.cfg.l0drop_weight_lr if group.get(INPUT_WEIGHT) else self.cfg.sparsity_lr
                group["weight_decay"] = 0.0

    def get_lr(self):
        """The scheduled learning rate (group 0's), what fairseq logs as ``lr``."""
        return self.param_groups[0]["lr"]

    def set_lr(self, lr):
        """The lr scheduler's value goes to group 0 only; the sparsity-control group keeps --sparsity-lr."""
        self.param_groups[0]["lr"] = lr
        self._fix_control_group()

    def load_state_dict(self, state_dict, optimizer_overrides=None):
        """Both groups' Adam state comes back; the control group's lr and weight decay are today's options
        (a resumed run may change --sparsity-lr; --optimizer-overrides never give the gates weight decay). The
        one-group state of fairseq's Adam (a baseline continued with its moments, as Zhang, Titov & Sennrich
        2021's code fine-tunes) becomes group 0, the gates' groups starting without state."""
        if len(state_dict.get("param_groups", ())) == 1 < len(self.param_groups):
            state_dict = with_new_groups(state_dict, self.param_groups)
        if len(state_dict.get("param_groups", ())) != len(self.param_groups):
            raise ValueError(
                f"the checkpoint's optimiser state has {len(state_dict['param_groups'])} parameter group(s), "
                f"adam_sparsity has {len(self.param_groups)}: add --reset-optimizer")
        super().load_state_dict(state_dict, optimizer_overrides)
        self._fix_control_group()


def with_new_groups(state_dict, param_groups):
    """A one-group Adam state for PARAM_GROUPS: the saved group is group 0 (the same tensors in the same order: each
    moment's shape checked against its parameter), every other group added with its settings and no state."""
    saved, main = state_dict["param_groups"][0], param_groups[0]["params"]
    if len(saved["params"]) != len(main):
        raise ValueError(f"the checkpoint's optimiser state holds {len(saved['params'])} tensors, the model's "
                         f"parameters outside the gates are {len(main)}: not the model it was trained as; add "
                         "--reset-optimizer")
    for index, p in zip(saved["params"], main):
        moment = state_dict["state"].get(index, {}).get("exp_avg")
        if moment is not None and tuple(moment.shape) != tuple(p.shape):
            raise ValueError(f"the checkpoint's optimiser state for tensor {index} has shape {tuple(moment.shape)}, "
                             f"the model's has {tuple(p.shape)}; add --reset-optimizer")
    groups, index = [saved], len(main)
    for group in param_groups[1:]:
        groups.append({**{k: v for k, v in group.items() if k != "params"},
                       "params": list(range(index, index + len(group["params"])))})
        index += len(group["params"])
    return {"state": state_dict["state"], "param_groups": groups}
