"""``--optimizer adam_sparsity``: the sparsity-control parameters (HardConcrete gates, Lagrange multipliers)
in their own Adam param group with their own fixed learning rate and no weight decay.

Unit tests of the groups, the lr scheduler and the state dict, then the real fairseq-train console
script: train, resume from checkpoint_last.pt, --reset-optimizer, a checkpoint trained with plain adam,
the fp16 variants (plain --fp16 refused before training; --memory-efficient-fp16 and --amp keep the groups).
Here the pure tests; those that train or run console scripts are in tests/e2e/test_gate_optimiser_e2e.py.
"""
import math

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

import fairseq_sparse  # noqa: F401  (registers the optimiser; allowlists checkpoint classes)
from fairseq_sparse.modules.hard_concrete import HardConcrete
from fairseq_sparse.modules.head_gates import HeadGates
from fairseq_sparse.modules.l0drop import L0Drop
from fairseq_sparse.optim.adam_sparsity import GROUP_FLAG, FairseqAdamSparsity
from helpers.optim import LR, SPARSITY_LR, WD, by_id


def adam_cfg(**overrides):
    """The optimiser's config as fairseq resolves it (interpolations filled in)."""
    cfg = dict(_name="adam_sparsity", adam_betas="(0.9, 0.999)", adam_eps=1e-8, weight_decay=WD, use_old_adam=False,
               fp16_adam_stats=False, tpu=False, lr=[LR], sparsity_lr=SPARSITY_LR, fp16=False, bf16=False,
               memory_efficient_fp16=False, memory_efficient_bf16=False, ddp_backend="pytorch_ddp",
               l0drop_weight_lr=None)
    cfg.update(overrides)
    return OmegaConf.create(cfg)


class Toy(nn.Module):
    """An ordinary layer, L0Drop (w, b), head gates (log alpha) and a criterion-style multiplier."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.l0drop = L0Drop(8, HardConcrete())
        self.heads = HeadGates(4, HardConcrete(beta=0.33), "enc", 1)
        self.multiplier = nn.Parameter(torch.zeros(2))
        self.multiplier.sparsity_control = True  # what the criterion does for its Lagrange multipliers

    def gates(self):
        return [self.l0drop.log_alpha_proj.weight, self.l0drop.log_alpha_proj.bias, self.heads.log_alpha,
                self.multiplier]


def test_sparsity_modules_mark_their_parameters():
    toy = Toy()
    assert all(p.sparsity_control for p in toy.gates())
    assert not any(hasattr(p, "sparsity_control") for p in toy.proj.parameters())
    # a parameter assigned later (e.g. after loading or pruning) is marked too
    toy.heads.log_alpha = nn.Parameter(torch.zeros(2))
    assert toy.heads.log_alpha.sparsity_control


def test_groups_own_lr_no_weight_decay():
    toy = Toy()
    opt = FairseqAdamSparsity(adam_cfg(), list(toy.parameters()))
    main, control = opt.param_groups
    gates = set(by_id(toy.gates()))
    # each group keeps the order of model.parameters() (the optimiser state's indices follow it)
    assert by_id(control["params"]) == [i for i in by_id(toy.parameters()) if i in gates] and control[GROUP_FLAG]
    assert set(by_id(control["params"])) == gates
    assert by_id(main["params"]) == by_id(toy.proj.parameters())
    assert (main["lr"], main["weight_decay"]) == (LR, WD)
    assert (control["lr"], control["weight_decay"]) == (SPARSITY_LR, 0.0)
    assert opt.get_lr() == LR

    # behaviour, not just settings: a zero gradient decays the ordinary weights only; a unit gradient
    # moves each parameter by about its group's lr (Adam's first step is lr * g / |g|)
    before = {id(p): p.detach().clone() for p in toy.parameters()}
    for p in toy.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    assert not torch.equal(toy.proj.weight, before[id(toy.proj.weight)])
    for p in toy.gates():
        assert torch.equal(p, before[id(p)]), "weight decay reached a sparsity-control parameter"
    opt = FairseqAdamSparsity(adam_cfg(weight_decay=0.0), list(toy.parameters()))
    before = {id(p): p.detach().clone() for p in toy.parameters()}
    for p in toy.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    for p in toy.parameters():
        lr = SPARSITY_LR if getattr(p, "sparsity_control", False) else LR
        assert torch.allclose(before[id(p)] - p.detach(), torch.full_like(p, lr), rtol=1e-4)


def test_l0drop_weight_lr_gives_w_a_group_of_its_own():
    """--l0drop-weight-lr: L0Drop's w (and only w) leaves the control group for a third one at that rate, which
    the lr scheduler leaves alone and which keeps no weight decay; a state dict of two groups is refused."""
    toy = Toy()
    two_groups = FairseqAdamSparsity(adam_cfg(), list(toy.parameters())).state_dict()
    opt = FairseqAdamSparsity(adam_cfg(l0drop_weight_lr=1e-4), list(toy.parameters()))
    main, control, weights = opt.param_groups
    assert by_id(weights["params"]) == [id(toy.l0drop.log_alpha_proj.weight)]
    assert set(by_id(control["params"])) == set(by_id(toy.gates())) - {id(toy.l0drop.log_alpha_proj.weight)}
    opt.set_lr(0.123)
    assert (main["lr"], control["lr"], weights["lr"], weights["weight_decay"]) == (0.123, SPARSITY_LR, 1e-4, 0.0)
    before = {id(p): p.detach().clone() for p in toy.parameters()}
    for p in toy.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    moved = {id(p): (before[id(p)] - p.detach()).abs().max().item() for p in toy.parameters()}
    assert moved[id(toy.l0drop.log_alpha_proj.weight)] == pytest.approx(1e-4, rel=1e-3)
    assert moved[id(toy.l0drop.log_alpha_proj.bias)] == pytest.approx(SPARSITY_LR, rel=1e-3)
    with pytest.raises(ValueError, match="--reset-optimizer"):
        opt.load_state_dict(two_groups)
    with pytest.raises(ValueError, match="--l0drop-weight-lr must be a finite number > 0, got -1"):
        FairseqAdamSparsity(adam_cfg(l0drop_weight_lr=-1.0), list(toy.parameters()))
    with pytest.raises(ValueError, match="--l0drop-weight-lr: the model has no L0Drop gates"):
        FairseqAdamSparsity(adam_cfg(l0drop_weight_lr=1e-4), list(toy.proj.parameters()) + [toy.heads.log_alpha])


def test_lr_scheduler_leaves_the_sparsity_lr_alone():
    """inverse_sqrt warms the model's lr up from 0 and then decays it; the gates keep --sparsity-lr all along
    (a fine-tuning's warm-up must not freeze them)."""
    from fairseq.optim.lr_scheduler import build_lr_scheduler

    opt = FairseqAdamSparsity(adam_cfg(), list(Toy().parameters()))
    sched = build_lr_scheduler(OmegaConf.create(
        {"_name": "inverse_sqrt", "warmup_updates": 100, "warmup_init_lr": -1, "lr": [LR]}), opt)
    main, control = opt.param_groups
    assert main["lr"] == 0.0 and control["lr"] == SPARSITY_LR
    for n, expected in [(50, LR / 2), (100, LR), (400, LR / 2)]:
        assert sched.step_update(n) == pytest.approx(expected)
        assert main["lr"] == pytest.approx(expected) and opt.get_lr() == pytest.approx(expected)
        assert (control["lr"], control["weight_decay"]) == (SPARSITY_LR, 0.0)


def test_state_dict_restores_both_groups():
    torch.manual_seed(0)
    toy = Toy()
    opt = FairseqAdamSparsity(adam_cfg(), list(toy.parameters()))
    for _ in range(3):
        for p in toy.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
    state = opt.state_dict()
    twin = Toy()
    twin.load_state_dict(toy.state_dict())
    # a resumed run may change --sparsity-lr; --optimizer-overrides apply to every group in fairseq, but the
    # gates never get weight decay
    new = FairseqAdamSparsity(adam_cfg(sparsity_lr=0.02), list(twin.parameters()))
    new.load_state_dict(state, {"weight_decay": 0.1})
    for a, b in zip(toy.parameters(), twin.parameters()):
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.optimizer.state[a][key], new.optimizer.state[b][key])
    main, control = new.param_groups
    assert (control["lr"], control["weight_decay"]) == (0.02, 0.0) and main["weight_decay"] == 0.1

    plain = torch.optim.Adam(Toy().parameters()).state_dict()  # one group: plain adam's layout
    with pytest.raises(ValueError, match="--reset-optimizer"):
        new.load_state_dict(plain)


@pytest.mark.parametrize("overrides, message", [
    (dict(sparsity_lr=0.0), "--sparsity-lr must be a finite number > 0, got 0.0"),
    (dict(sparsity_lr=-0.1), "--sparsity-lr must be a finite number > 0, got -0.1"),
    (dict(sparsity_lr=math.nan), "--sparsity-lr must be a finite number > 0, got nan"),
    (dict(sparsity_lr=math.inf), "--sparsity-lr must be a finite number > 0, got inf"),
    (dict(fp16=True), "does not work with plain --fp16/--bf16"),
    (dict(bf16=True), "does not work with plain --fp16/--bf16"),
    (dict(ddp_backend="fully_sharded"), "does not work with --ddp-backend fully_sharded"),
])
def test_refused_settings(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        FairseqAdamSparsity(adam_cfg(**overrides), list(Toy().parameters()))


def test_memory_efficient_fp16_accepted():
    opt = FairseqAdamSparsity(adam_cfg(fp16=True, memory_efficient_fp16=True), list(Toy().parameters()))
    assert len(opt.param_groups) == 2
