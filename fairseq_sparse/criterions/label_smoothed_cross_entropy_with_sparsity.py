"""label_smoothed_cross_entropy_with_sparsity: label-smoothed CE + lambda-weighted sparsity penalties.

The penalties come from the model's :class:`~fairseq_sparse.modules.sparsity.SparsityModule` s
through :func:`~fairseq_sparse.modules.sparsity.collect_sparsity_terms`; each term names the group of
the lambda that weights it. Each penalty is a value per target token, next to the per-token
cross-entropy (Zhang, Titov & Sennrich 2021 Eq. 12 with the paper's lambda; Zhang, Zhao, Li & Zong 2019
Eq. 12's sum over target positions), so it is added as lambda * penalty * (target tokens of the batch),
as is the controller's Lagrangian: fairseq divides the loss by ``sample_size``, and under
``--sentence-avg`` (sample_size = sentences) every lambda and target still means what it means per
token. Modules report penalties in training only: the valid loss is the cross-entropy of every model,
comparable across models.

``--attention-reg entropy|linf`` adds Zhang, Zhao, Li & Zong's (2019) attention regulariser on encoder-decoder attention
(group ``attention_reg``, weighted by ``--attention-reg-lambda``). The criterion attaches an
:class:`~fairseq_sparse.modules.attention_regularisers.AttentionRegulariser` to the model at its first
forward pass, so it works with any fairseq encoder-decoder transformer (stock ``transformer`` and all
of ours; no special architecture). The mean attention entropy and maximum weight per target token
(``attn_entropy``, ``attn_max``) are logged in training and validation whatever ``--attention-reg`` is.
"""
import importlib.util
import logging
import math
import weakref
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq import metrics, utils
from fairseq.dataclass import ChoiceEnum
from omegaconf import II
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)

from ..modules.attention_regularisers import (
    DEFAULT_HEADS,
    DEFAULT_LAYERS,
    HEAD_MODES,
    REG_KINDS,
    attach_attention_regulariser,
    attention_capture,
    encoder_decoder_attention,
    parse_layers,
)
from ..modules.distillation import FrozenTeacher, word_kd_loss
from ..modules.sparsity import collect_sparsity_terms, num_updates, sparsity_groups
from ..modules.sparsity_control import DEFAULT_TARGET_WARMUP, LagrangianController, parse_targets
from ..modules.sparsity_steering import BATCHES_KEY, STAT_PREFIX, SparsityConfigError, SparsitySteering

logger = logging.getLogger(__name__)

def check_lambdas(lambdas, warmup_updates) -> None:
    """Fixed lambdas finite and >= 0; a fixed-lambda warm-up only with a fixed lambda to ramp."""
    for group, value in lambdas.items():
        if not math.isfinite(value):
            raise ValueError(f"--{group.replace('_', '-')}-lambda must be a finite number, got {value}")
        if value < 0:
            raise ValueError(f"--{group.replace('_', '-')}-lambda must be >= 0, got {value}")
    if warmup_updates < 0:
        raise ValueError(f"--sparsity-warmup-updates must be >= 0, got {warmup_updates}")
    if warmup_updates > 0 and not any(v > 0 for v in lambdas.values()):
        raise ValueError(f"--sparsity-warmup-updates {warmup_updates} ramps fixed lambdas (--l0drop-lambda, "
                         "--head-gates-lambda, --attention-reg-lambda) and none is set; target sparsities ramp "
                         "over --sparsity-target-warmup-updates")


def check_attention_reg(kind: str, reg_lambda: float, heads: str) -> None:
    """--attention-reg's kind and heads known, its lambda only with a regulariser (a regulariser with lambda 0 is
    only logged, which is said)."""
    if kind not in REG_KINDS:
        raise ValueError(f"--attention-reg must be one of {REG_KINDS}, got {kind!r}")
    if heads not in HEAD_MODES:
        raise ValueError(f"--attention-reg-heads must be one of {HEAD_MODES}, got {heads!r}")
    if kind == "none" and reg_lambda > 0:
        raise ValueError(f"--attention-reg-lambda {reg_lambda} is set but --attention-reg is 'none'; "
                         "choose --attention-reg entropy or linf")
    if kind != "none" and reg_lambda == 0:
        logger.warning("--attention-reg %s with --attention-reg-lambda 0: the regulariser is only logged", kind)


def check_model_before_training(criterion, task):
    """Have ``task.begin_epoch(epoch, model)`` check the model first (``criterion.check_model``). fairseq builds the
    criterion after the model but hands it the model only in the first training step, when its batch-prefetch thread
    already runs (an error there ends in "terminate called", exit 134); the trainer calls the task's begin_epoch
    hook with the model just before it reads the first batch."""
    if task is None:
        return
    installed = hasattr(task, "_sparsity_criterion")
    task._sparsity_criterion = weakref.ref(criterion)  # the latest criterion built for the task checks
    if installed:
        return
    task_begin_epoch = task.begin_epoch

    def begin_epoch(epoch, model):
        crit = task._sparsity_criterion()
        if crit is not None and not crit._checked_model:
            crit.check_model(model)
        return task_begin_epoch(epoch, model)

    task.begin_epoch = begin_epoch


def check_target_optimizer(targets, optimizer) -> None:
    """A target sparsity needs ``--optimizer adam_sparsity``: under another optimiser the gates and the
    Lagrange multipliers move at the model's --lr (Adam: about lr per update, so ~10k updates at 5e-4 to
    close a gate that starts open), and a short fine-tuning reaches nothing (issue 23: 0.00% pruned after
    400 updates with plain adam)."""
    if targets and optimizer is not None and str(optimizer) != "adam_sparsity":
        option = "--l0drop-target-sparsity" if "l0drop" in targets else "--head-gates-target-sparsity"
        raise ValueError(f"{option} with --optimizer {optimizer}: the gates and multipliers would move at the model's "
                         "--lr and barely move in a fine-tuning; add --optimizer adam_sparsity --sparsity-lr 0.05 "
                         "(Adam with the gates in their own group at a fixed rate)")


def check_precision(bf16) -> None:
    """fairseq 0.12's ``--bf16`` (and ``--memory-efficient-bf16``) means training on a TPU: its options set
    ``--tpu`` and the trainer asks torch_xla for the device, so on a GPU or CPU it fails inside fairseq with
    "'NoneType' object has no attribute 'xla_device'" (the CUDA test that expected adam_sparsity's refusal
    failed that way on an H100, 2026-11-26). Refused here first, with what works on a GPU."""
    if bf16 and importlib.util.find_spec("torch_xla") is None:
        raise ValueError("--bf16 in fairseq 0.12 trains on a TPU (it implies --tpu and needs torch_xla, which is not "
                         "installed): on a GPU use --amp, or --fp16 --memory-efficient-fp16")


def distillation_settings(teacher, weight, temperature) -> dict:
    """{"weight", "temperature"} of --distill-*, checked before anything is loaded (ValueError otherwise)."""
    if teacher is None:
        given = [name for name, value in (("weight", weight), ("temperature", temperature)) if value is not None]
        if given:
            raise ValueError(f"--distill-{given[0]} is set but --distill-teacher is not; add --distill-teacher CHECKPOINT")
        return {}
    weight = 0.5 if weight is None else weight
    temperature = 1.0 if temperature is None else temperature
    if not (math.isfinite(weight) and 0.0 <= weight <= 1.0):
        raise ValueError(f"--distill-weight must lie in [0, 1], got {weight}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"--distill-temperature must be a finite number > 0, got {temperature}")
    return {"weight": weight, "temperature": temperature}


def load_teacher(path: str, task) -> FrozenTeacher:
    """The teacher checkpoint, checked (a readable fairseq checkpoint whose embeddings fit the data's
    dictionaries, and the same dictionary files where its training data is still there) and built once
    with the task's dictionaries through fairseq's checkpoint_utils (torch's safe loader). A refused teacher ends
    the process with one line (SystemExit), before any work."""
    from fairseq import checkpoint_utils

    from ..checkpoint_safety import check_teacher_checkpoint

    try:
        check_teacher_checkpoint(path, task)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    models, _ = checkpoint_utils.load_model_ensemble([path], task=task)
    logger.info("distilling from %s (%s parameters, frozen)", path, f"{sum(p.numel() for p in models[0].parameters()):,}")
    return FrozenTeacher(models[0])


@dataclass
class LabelSmoothedCrossEntropyWithSparsityConfig(LabelSmoothedCrossEntropyCriterionConfig):
    l0drop_lambda: float = field(
        default=0.0,
        metadata={"help": "weight of the L0Drop expected-L0 penalty (Zhang, Titov & Sennrich 2021 Eq. 12; the paper fine-tunes "
                          "with 0.2-0.3), normalised per source token as in the reference code"},
    )
    head_gates_lambda: float = field(
        default=0.0,
        metadata={"help": "weight of the head gates' L0 penalty L_C (Voita et al. 2019 Eq. 7: expected number of open "
                          "heads, summed or layer-averaged as --head-gates-penalty says), next to the per-token CE"},
    )
    sparsity_warmup_updates: int = field(
        default=0,
        metadata={"help": "raise every fixed lambda (--l0drop-lambda, --head-gates-lambda, --attention-reg-lambda) "
                          "linearly from 0 to its value over this many updates (training from scratch, Zhang, Titov "
                          "& Sennrich 2021 Sec. 6); 0 = full lambda from the start. Target sparsities ramp over "
                          "--sparsity-target-warmup-updates instead"},
    )
    sparsity_start_update: int = field(
        default=0,
        metadata={"help": "no sparsity pressure before this update (no penalty, no controller); from it on, "
                          "--sparsity-warmup-updates and --sparsity-target-warmup-updates count from here. For "
                          "training from scratch: gates pressed while the model is still a language model all close "
                          "(paper 000 Sec. 6 ramps lambda in over most of training)"},
    )
    l0drop_target_sparsity: Optional[str] = field(
        default=None,
        metadata={"help": "share of source states to prune, in [0, 1): instead of a fixed --l0drop-lambda, a "
                          "Lagrangian controller (Xia, Zhong & Chen 2022, CoFi) steers the sparsity of the "
                          "encoder-output gates to this target; a schedule '0.2,0.4,0.6' (or '0.2:0.4:0.6') holds "
                          "each target for --sparsity-target-hold-updates updates"},
    )
    head_gates_target_sparsity: Optional[str] = field(
        default=None,
        metadata={"help": "share of gated heads to close, in [0, 1): one number for all gated heads, or per "
                          "attention type, e.g. 'enc=0.6,encdec=0.2'; a Lagrangian controller replaces "
                          "--head-gates-lambda. Schedules: '0.2,0.4' or 'enc=0.2:0.4,encdec=0.1:0.2'"},
    )
    sparsity_target_warmup_updates: int = field(
        default=DEFAULT_TARGET_WARMUP,
        metadata={"help": "raise every target sparsity linearly from 0 (in a schedule: from the previous target) "
                          "over this many updates, then hold it (the controller's counterpart of "
                          "--sparsity-warmup-updates, which ramps fixed lambdas)"},
    )
    sparsity_target_hold_updates: int = field(
        default=0,
        metadata={"help": "with a schedule of targets: updates per target (warm-up included); fairseq saves a "
                          "checkpoint at the end of each (--save-interval-updates must equal it), so one run "
                          "gives a whole sparsity/quality curve (fairseq-sparse-sparsity-curve)"},
    )
    optimizer: Optional[str] = II("optimizer._name")
    bf16: bool = II("common.bf16")
    save_interval_updates: int = II("checkpoint.save_interval_updates")
    no_epoch_checkpoints: bool = II("checkpoint.no_epoch_checkpoints")
    max_update: int = II("optimization.max_update")
    attention_reg: ChoiceEnum(REG_KINDS) = field(
        default="none",
        metadata={"help": "regulariser on encoder-decoder attention (Zhang, Zhao, Li & Zong 2019 Sec. III): 'entropy' adds lambda * "
                          "attention entropy (minimum entropy, Eq. 15), 'linf' adds -lambda * max weight (maximum "
                          "L-inf, Eq. 14, weak subgradient); 'none' only logs attn_entropy / attn_max"},
    )
    attention_reg_lambda: float = field(
        default=0.0,
        metadata={"help": "weight of --attention-reg, next to the per-token CE (the regulariser is a mean per "
                          "real target token); Zhang, Zhao, Li & Zong 2019 uses 0.01"},
    )
    attention_reg_layers: str = field(
        default=DEFAULT_LAYERS,
        metadata={"help": "decoder layers whose encoder-decoder attention is regularised and measured: 'all', "
                          "'last' or comma-separated indices (e.g. 0,2); averaged over layers"},
    )
    attention_reg_heads: ChoiceEnum(HEAD_MODES) = field(
        default=DEFAULT_HEADS,
        metadata={"help": "'each': the regulariser of every head's distribution, averaged over heads (each head "
                          "may focus on its own position); 'mean': the regulariser of the head-averaged distribution"},
    )
    distill_teacher: Optional[str] = field(
        default=None,
        metadata={"help": "word-level knowledge distillation (Kim & Rush 2016; Hinton et al. 2015) from this "
                          "checkpoint, typically the dense model the fine-tuning starts from: any fairseq "
                          "translation model with the data's dictionaries, frozen, run on the same batches. The "
                          "equal-updates control of a distilled method needs the same teacher"},
    )
    distill_weight: Optional[float] = field(
        default=None,
        metadata={"help": "w in [0, 1]: the training loss is (1 - w) * label-smoothed CE + w * KD (default 0.5 "
                          "with --distill-teacher); the valid loss stays the CE, comparable across models"},
    )
    distill_temperature: Optional[float] = field(
        default=None,
        metadata={"help": "softmax temperature T > 0 of both distributions in the KD term, scaled by T^2 "
                          "(default 1 with --distill-teacher)"},
    )


def sparsity_controller(cfg, lambdas):
    """The Lagrangian controller of CFG's target sparsities (None without one), after the checks of the start update,
    the targets against the fixed LAMBDAS, the optimiser and the hold."""
    start = cfg.sparsity_start_update
    if not (isinstance(start, int) and start >= 0):
        raise ValueError(f"--sparsity-start-update must be an update count >= 0, got {start}")
    targets = parse_targets(cfg.l0drop_target_sparsity, cfg.head_gates_target_sparsity)
    for key in targets:
        group = "l0drop" if key == "l0drop" else "head_gates"
        if lambdas[group] > 0:
            raise ValueError(f"--{group.replace('_', '-')}-target-sparsity and --{group.replace('_', '-')}-lambda "
                             f"{lambdas[group]} both set: the controller chooses the weight; drop the lambda")
    if start and not targets and not any(v > 0 for v in lambdas.values()):
        raise ValueError(f"--sparsity-start-update {start} holds back a sparsity pressure, and "
                         "none is set (a target sparsity or a lambda > 0)")
    check_target_optimizer(targets, cfg.optimizer)
    controller = LagrangianController(targets, cfg.sparsity_target_warmup_updates,
                                      cfg.sparsity_target_hold_updates) if targets else None
    if cfg.sparsity_target_hold_updates and not (controller and controller.stages() > 1):
        raise ValueError("--sparsity-target-hold-updates is set but no target sparsity is a schedule "
                         "(e.g. --l0drop-target-sparsity 0.2,0.4,0.6)")
    return controller


@register_criterion("label_smoothed_cross_entropy_with_sparsity", dataclass=LabelSmoothedCrossEntropyWithSparsityConfig)
class LabelSmoothedCrossEntropyWithSparsity(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, cfg: LabelSmoothedCrossEntropyWithSparsityConfig, task):
        super().__init__(task, cfg.sentence_avg, cfg.label_smoothing, cfg.ignore_prefix_size, cfg.report_accuracy)
        check_precision(cfg.bf16)
        self.distill = distillation_settings(cfg.distill_teacher, cfg.distill_weight, cfg.distill_temperature)
        self.lambdas = {"l0drop": cfg.l0drop_lambda, "head_gates": cfg.head_gates_lambda,
                        "attention_reg": cfg.attention_reg_lambda}
        check_lambdas(self.lambdas, cfg.sparsity_warmup_updates)
        attention_reg = str(cfg.attention_reg)  # ChoiceEnum members compare equal to their names
        check_attention_reg(attention_reg, cfg.attention_reg_lambda, str(cfg.attention_reg_heads))
        self.attention_reg = {"kind": attention_reg, "layers": parse_layers(str(cfg.attention_reg_layers)),
                              "heads": str(cfg.attention_reg_heads)}
        self.warmup_updates = cfg.sparsity_warmup_updates
        self.start_update = cfg.sparsity_start_update
        self.controller = sparsity_controller(cfg, self.lambdas)
        self.steering = SparsitySteering(self.controller, (cfg.save_interval_updates, cfg.max_update,
                                                           cfg.no_epoch_checkpoints))
        self._checked_model = False
        self.teacher = load_teacher(cfg.distill_teacher, task) if cfg.distill_teacher else None
        check_model_before_training(self, task)

    def check_model(self, model):
        """Lambdas for penalties the model cannot produce are a configuration error. Then attaches the
        attention regulariser (statistics only with --attention-reg none)."""
        groups = sparsity_groups(model)
        for group, value in self.lambdas.items():
            if group == "attention_reg":
                continue  # any encoder-decoder model gets the regulariser below
            if value > 0 and group not in groups:
                arch = getattr(getattr(model, "args", None), "arch", type(model).__name__)
                raise SparsityConfigError(
                    f"--{group.replace('_', '-')}-lambda {value} is set but the model ({arch}) has no {group} "
                    f"module; use an architecture with it (e.g. --arch transformer_{group})"
                    + (" or --head-gates enc,dec,encdec" if group == "head_gates" else "")
                )
        self.steering.check_targets(model, groups)
        self.attach_attention_regulariser(model)
        self._checked_model = True

    def attach_attention_regulariser(self, model):
        kind = self.attention_reg["kind"]
        if kind == "none" and not encoder_decoder_attention(model):
            return  # nothing to measure (e.g. no encoder-decoder attention); nothing asked for either
        try:
            attach_attention_regulariser(model, kind, self.attention_reg["layers"], self.attention_reg["heads"])
        except ValueError as err:
            arch = getattr(getattr(model, "args", None), "arch", type(model).__name__)
            raise SparsityConfigError(f"--attention-reg {kind} on the model ({arch}): {err}") from err

    def current_lambda(self, group, updates):
        value = self.lambdas.get(group)
        if value is None:
            raise SparsityConfigError(f"the model reports a '{group}' penalty but this criterion has no lambda for it")
        if self.warmup_updates > 0:
            value *= min(1.0, updates / self.warmup_updates)
        return value

    def forward(self, model, sample, reduce=True):
        if not self._checked_model:
            self.check_model(model)
        collect_sparsity_terms(model)  # drop terms of forward passes nobody collected (e.g. generation)
        with attention_capture(model):  # the attention regulariser's hooks are live only here
            net_output = model(**sample["net_input"])
        loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        penalty, logging_output = self.compute_sparsity_loss(model, sample)
        if self.teacher is not None:
            kd = self.compute_kd_loss(model, net_output, sample)
            logging_output.update({"ce_loss": loss.data, "kd_loss": kd.data})
            if model.training:  # the valid loss stays the CE: comparable with undistilled models
                weight = self.distill["weight"]
                loss = (1.0 - weight) * loss + weight * kd
        loss = loss + penalty * sample["ntokens"]  # per target token, whatever the averaging (see above)
        logging_output.update({
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        })
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = utils.item(n_correct.data)
            logging_output["total"] = utils.item(total.data)
        return loss, sample_size, logging_output

    def compute_kd_loss(self, model, net_output, sample):
        """Word-level KD against the frozen teacher on the same batch (summed over target tokens, as the CE)."""
        teacher_logits = self.teacher.logits(sample["net_input"], next(model.parameters()))
        student_logits, target = net_output[0], sample["target"]
        if self.ignore_prefix_size > 0:
            student_logits, teacher_logits = (x[:, self.ignore_prefix_size:] for x in (student_logits, teacher_logits))
            target = target[:, self.ignore_prefix_size:]
        return word_kd_loss(student_logits, teacher_logits, target, self.padding_idx, self.distill["temperature"])

    def compute_sparsity_loss(self, model, sample=None):
        """The controller's Lagrangian plus the sum over reported terms of lambda_group * penalty (per target
        token), and the terms' statistics for logging."""
        penalty = torch.zeros(())
        logging_output = {}
        held = num_updates(model) < self.start_update  # --sparsity-start-update: no pressure yet
        updates = max(0, num_updates(model) - self.start_update)
        terms = collect_sparsity_terms(model)
        if not held:
            steered = self.steering.test_time_closed(model, sample) if model.training and sample is not None else {}
            penalty = penalty + self.steering.control(terms, updates, model.training, logging_output, steered)
        for term in terms:
            lam = 0.0 if held else self.current_lambda(term.group, updates)
            if term.penalty is not None:
                penalty = penalty.to(term.penalty) + lam * term.penalty
                key = f"{STAT_PREFIX}{term.group}_penalty"  # summed over the group's modules, as in the loss
                logging_output[key] = logging_output.get(key, 0) + term.penalty.detach()
                logging_output[f"{STAT_PREFIX}{term.group}_lambda"] = lam
                logging_output[BATCHES_KEY] = 1
            for name, (num, den) in term.stats.items():  # summed over the modules reporting the same name
                for suffix, value in ((":num", num), (":den", den)):
                    key = f"{STAT_PREFIX}{name}{suffix}"
                    logging_output[key] = logging_output.get(key, 0) + value
        return penalty, logging_output

    def load_state_dict(self, state_dict, strict=True):
        """fairseq restores the criterion's multipliers on resume; a checkpoint without them (the converged
        model a fine-tuning starts from, or a run without targets) leaves them at 0."""
        own = self.state_dict()
        state_dict = state_dict or {}
        dropped = sorted(k for k in state_dict if k not in own)
        if dropped:
            logger.info("the checkpoint's sparsity multipliers %s have no target in this run: not used", dropped)
        return super().load_state_dict({k: state_dict.get(k, v) for k, v in own.items()}, strict=True)

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        for key in ("ce_loss", "kd_loss"):  # in base 2 per target token, as fairseq logs its loss
            if sample_size and any(key in log for log in logging_outputs):
                total = utils.item(sum(log.get(key, 0) for log in logging_outputs))
                metrics.log_scalar(key, total / sample_size / math.log(2), sample_size, round=3)
        keys = {k for log in logging_outputs for k in log if k.startswith(STAT_PREFIX)}
        for key in sorted(keys):
            name = key[len(STAT_PREFIX):]
            total = utils.item(sum(log.get(key, 0) for log in logging_outputs))
            if name.endswith(":num"):
                den = utils.item(sum(log.get(key[:-4] + ":den", 0) for log in logging_outputs))
                if den > 0:
                    metrics.log_scalar(name[:-4], total / den, den, round=4)
            elif not name.endswith(":den"):
                # penalties and lambdas: mean over the batches of this log interval (and over workers)
                n = sum(log.get(BATCHES_KEY, 1) for log in logging_outputs if key in log)
                if n > 0:
                    metrics.log_scalar(name, total / n, n, round=4)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
