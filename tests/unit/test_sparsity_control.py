"""The target-sparsity controller (CoFi-style Lagrangian): target schedule, the multipliers' ascent,
reaching and holding a target on a small gated problem, and the criterion's options and checks.
Here the pure tests; those that train or run console scripts are in tests/e2e/test_sparsity_control_e2e.py."""
import math

import pytest
import torch

import fairseq_sparse  # noqa: F401
from fairseq_sparse.criterions.label_smoothed_cross_entropy_with_sparsity import (
    SparsityConfigError,
    parse_targets,
)
from fairseq_sparse.modules.hard_concrete import HardConcrete
from fairseq_sparse.modules.head_gates import HeadGates
from fairseq_sparse.modules.sparsity import collect_sparsity_terms
from fairseq_sparse.modules.sparsity_control import LAMBDA1_SCALE, LagrangianController, straight_through
from helpers.criterion import sparsity_criterion


def test_target_rises_linearly_then_holds():
    c = LagrangianController({"l0drop": 0.6}, warmup_updates=100)
    assert [c.target("l0drop", u) for u in (0, 50, 100, 1000)] == pytest.approx([0.0, 0.3, 0.6, 0.6])
    assert LagrangianController({"l0drop": 0.6}, warmup_updates=0).target("l0drop", 0) == 0.6


def test_schedule_holds_each_target_and_ramps_between():
    """0.2 then 0.6, each held 100 updates, 40-update ramps: from 0 to 0.2, then from 0.2 to 0.6."""
    c = LagrangianController({"l0drop": (0.2, 0.6), "head_gates": 0.5}, warmup_updates=40, hold_updates=100)
    assert [c.target("l0drop", u) for u in (0, 20, 40, 99, 100, 120, 140, 199, 500)] == pytest.approx(
        [0.0, 0.1, 0.2, 0.2, 0.2, 0.4, 0.6, 0.6, 0.6])
    assert [c.target("head_gates", u) for u in (20, 150)] == pytest.approx([0.25, 0.5])  # one target: no stages
    assert c.stages() == 2


def test_schedule_needs_a_hold_longer_than_the_warmup():
    with pytest.raises(ValueError, match="must exceed"):
        LagrangianController({"l0drop": (0.2, 0.6)}, warmup_updates=200, hold_updates=200)
    with pytest.raises(ValueError, match="must exceed"):
        LagrangianController({"l0drop": (0.2, 0.6)}, warmup_updates=200)
    assert LagrangianController({"l0drop": 0.2}, warmup_updates=200, hold_updates=50).hold_updates == 0


@pytest.mark.parametrize("s,sign", [(0.1, -1.0), (0.9, 1.0)])
def test_multipliers_ascend(s, sign):
    """One SGD step on the Lagrangian: lambda_1 moves towards -(t - s) (negative while not sparse enough,
    positive while too sparse); lambda_2 grows whenever s misses the target."""
    c = LagrangianController({"k": 0.5}, warmup_updates=0)
    c.multipliers["k"].data[1] = 0.0
    opt = torch.optim.SGD(c.parameters(), lr=1.0)
    loss = c.lagrangian({"k": torch.tensor(s)}, 0)["k"]
    loss.backward()
    opt.step()
    lam1, lam2 = c.lambdas("k").tolist()
    assert lam1 == pytest.approx(sign * abs(s - 0.5) * LAMBDA1_SCALE ** 2)
    assert lam2 == pytest.approx((s - 0.5) ** 2)


def run_gates(target, steps=600, units=40, lr=0.05, warmup=200, seed=0):
    """Head gates whose 'task loss' rewards every open gate (more for some): alone, all gates stay open.
    The controller must close the requested share, and hold it."""
    torch.manual_seed(seed)
    gates = HeadGates(units, HardConcrete(beta=0.33), "enc")
    gates.train()
    value = torch.linspace(0.2, 1.0, units)
    ctrl = LagrangianController({"head_gates": target}, warmup_updates=warmup)
    opt = torch.optim.Adam(list(gates.parameters()) + list(ctrl.parameters()), lr=lr)
    history = []
    for step in range(steps):
        g = gates()
        term = collect_sparsity_terms(gates)[0]
        count = term.sparsity["head_gates"]
        share = straight_through(count.closed, count.expected, count.units)
        lagrangian = ctrl.lagrangian({"head_gates": share}, step)["head_gates"]
        loss = -(g * value).sum() / units + lagrangian
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(float((gates.deterministic() == 0).float().mean()))
    return history, ctrl


def test_straight_through_share():
    expected = torch.tensor(3.0, requires_grad=True)
    share = straight_through(torch.tensor(5), expected, 10.0)
    share.backward()
    assert share.item() == 0.5 and expected.grad.item() == pytest.approx(0.1)


@pytest.mark.parametrize("target,seed", [(0.25, 0), (0.5, 1), (0.75, 0)])
def test_controller_reaches_and_holds_target(target, seed):
    """The g_hat share of 40 gates ends within 2 gates (0.05) of the target and holds it over the last
    100 of 600 updates, overshooting by at most 3 gates on the way."""
    history, ctrl = run_gates(target, seed=seed)
    final = history[-100:]
    assert all(abs(s - target) <= 0.05 + 1e-6 for s in final), (target, final[::10])
    assert max(history) <= target + 0.075 + 1e-6, max(history)
    assert history[0] == 0.0  # started fully open


def test_controller_with_no_target_pressure_keeps_gates_open():
    history, _ = run_gates(0.0, steps=100)
    assert history[-1] == 0.0


@pytest.mark.parametrize("l0drop,heads,expected", [
    (0.5, None, {"l0drop": (0.5,)}),
    (None, "0.3", {"head_gates": (0.3,)}),
    (None, "enc=0.6, encdec=0.2", {"head_gates_enc": (0.6,), "head_gates_encdec": (0.2,)}),
    (0.0, "", {"l0drop": (0.0,)}),
    ("0.2,0.4, 0.6", "0.1:0.3", {"l0drop": (0.2, 0.4, 0.6), "head_gates": (0.1, 0.3)}),
    (None, "enc=0.2:0.4,encdec=0.1", {"head_gates_enc": (0.2, 0.4), "head_gates_encdec": (0.1,)}),
])
def test_parse_targets(l0drop, heads, expected):
    assert parse_targets(l0drop, heads) == expected


@pytest.mark.parametrize("l0drop,heads,match", [
    (1.0, None, r"\[0, 1\)"), (-0.1, None, r"\[0, 1\)"), (math.nan, None, r"\[0, 1\)"), (math.inf, None, r"\[0, 1\)"),
    (None, "nan", r"\[0, 1\)"), (None, "x", "not a number"), (None, "foo=0.5", "unknown attention type"),
    (None, "enc=1.5", r"\[0, 1\)"), ("0.2,,0.4", None, "not a number"), ("0.2,1.0", None, r"\[0, 1\)"),
    (None, "enc=0.2,0.4", "unknown attention type"),
])
def test_bad_targets_refused(l0drop, heads, match):
    with pytest.raises(ValueError, match=match):
        parse_targets(l0drop, heads)


class _Task:
    target_dictionary = type("D", (), {"pad": lambda self: 1})()

    def begin_epoch(self, epoch, model):
        pass


def criterion(**kw):
    return sparsity_criterion(_Task(), False, 0.1, **kw)


def test_target_with_fixed_lambda_refused():
    with pytest.raises(ValueError, match="both set"):
        criterion(l0drop_lambda=0.3, l0drop_target_sparsity=0.5)
    with pytest.raises(ValueError, match="both set"):
        criterion(head_gates_lambda=0.1, head_gates_target_sparsity="enc=0.5")


def test_schedule_checkpoint_options_checked_before_training():
    """A schedule saves a checkpoint per target: --save-interval-updates must be the hold, and --max-update
    must cover every target; a hold without a schedule is refused."""
    kw = dict(l0drop_target_sparsity="0.2,0.4", sparsity_target_hold_updates=300, sparsity_target_warmup_updates=100)
    for save, max_update, match in [(0, 600, "--save-interval-updates 300"), (100, 600, "--save-interval-updates 300"),
                                    (300, 500, "--max-update 600")]:
        c = criterion(save_interval_updates=save, max_update=max_update, **kw)
        with pytest.raises(SparsityConfigError, match=match):
            c.steering.check_schedule_checkpoints(*c.steering.schedule_checkpoints)
    c = criterion(save_interval_updates=300, max_update=0, **kw)
    c.steering.check_schedule_checkpoints(*c.steering.schedule_checkpoints)
    assert c.steering.schedule_checkpoints == (300, 0, False)
    with pytest.raises(ValueError, match="no target sparsity is a schedule"):
        criterion(l0drop_target_sparsity="0.3", sparsity_target_hold_updates=300)


def test_criterion_owns_multipliers_only_with_targets():
    assert list(criterion().parameters()) == []
    c = criterion(l0drop_target_sparsity=0.5, head_gates_target_sparsity="enc=0.4")
    params = dict(c.named_parameters())
    assert set(params) == {"controller.multipliers.l0drop", "controller.multipliers.head_gates_enc"}
    assert all(getattr(p, "sparsity_control", False) for p in params.values())


def test_criterion_loads_checkpoints_without_multipliers():
    c = criterion(l0drop_target_sparsity=0.5)
    c.controller.multipliers["l0drop"].data.fill_(2.0)
    saved = {k: v.clone() for k, v in c.state_dict().items()}
    fresh = criterion(l0drop_target_sparsity=0.5)
    fresh.load_state_dict(None)  # fine-tuning from a converged model: fairseq saved criterion None
    assert fresh.controller.multipliers["l0drop"].tolist() == [0.0, 0.0]
    fresh.load_state_dict(saved)  # resume
    assert fresh.controller.multipliers["l0drop"].tolist() == [2.0, 2.0]
    other = criterion(head_gates_target_sparsity="0.5")
    other.load_state_dict(saved)  # a multiplier without a target in this run is not used
    assert other.controller.multipliers["head_gates"].tolist() == [0.0, 0.0]


def test_lagging_sparsity_reported_once(caplog):
    """Two warm-ups into training, a sparsity more than 0.1 from its target is reported, once per key;
    one within 0.1 is not."""
    c = criterion(l0drop_target_sparsity=0.5, head_gates_target_sparsity="0.5", sparsity_target_warmup_updates=100)
    shares = {"l0drop": torch.tensor(0.05), "head_gates": torch.tensor(0.45)}
    with caplog.at_level("WARNING"):
        c.steering.warn_if_lagging(shares, 199)
        assert not caplog.records
        c.steering.warn_if_lagging(shares, 200)
        c.steering.warn_if_lagging(shares, 300)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and messages[0].startswith("l0drop: sparsity 0.05 after 200 updates, target 0.50")
    assert "adam_sparsity" in messages[0]


def test_all_closed_warning_says_when_the_controller_overshot(caplog):
    """(Nearly) every gate closed: once per key; where a target asks for less, the warning says the controller
    overshot and how to start instead (a target from scratch did this,
    docs/recipe.md, from scratch); under a fixed lambda it says to lower it."""
    from fairseq_sparse.modules.sparsity import SparsityCount, SparsityTerm

    def terms(closed):
        return [SparsityTerm(group="l0drop", penalty=None, stats={},
                             sparsity={"l0drop": SparsityCount(torch.tensor(float(closed)), torch.tensor(closed), 100)})]

    c = criterion(l0drop_target_sparsity=0.5, sparsity_target_warmup_updates=1000)
    with caplog.at_level("WARNING"):
        c.steering.control(terms(50), 500, True, {})
        assert not caplog.records
        c.steering.control(terms(100), 500, True, {})
        c.steering.control(terms(100), 600, True, {})
    messages = [r.getMessage() for r in caplog.records if "gated units are closed" in r.getMessage()]
    assert len(messages) == 1 and "l0drop: 100 of 100" in messages[0]
    assert "The target is 0.25 now: the controller overshot" in messages[0] and "--finetune-from-model" in messages[0]
    caplog.clear()
    fixed = criterion(l0drop_lambda=0.3)
    with caplog.at_level("WARNING"):
        fixed.steering.control(terms(100), 500, True, {})
    assert "Lower the target sparsity or lambda" in caplog.records[-1].getMessage()
    assert "--finetune-from-model" in caplog.records[-1].getMessage()


def test_target_for_missing_module_refused():
    model = torch.nn.Sequential(HeadGates(4, HardConcrete(), "enc"))
    with pytest.raises(SparsityConfigError, match="l0drop"):
        criterion(l0drop_target_sparsity=0.5).check_model(model)
    with pytest.raises(SparsityConfigError, match="head_gates_dec"):
        criterion(head_gates_target_sparsity="dec=0.5").check_model(model)


def test_a_target_needs_the_plugins_optimiser():
    from fairseq_sparse.criterions.label_smoothed_cross_entropy_with_sparsity import check_target_optimizer

    with pytest.raises(ValueError, match="add --optimizer adam_sparsity --sparsity-lr 0.05"):
        check_target_optimizer({"l0drop": (0.5,)}, "adam")
    with pytest.raises(ValueError, match="--head-gates-target-sparsity with --optimizer sgd"):
        check_target_optimizer({"head_gates_enc": (0.5,)}, "sgd")
    check_target_optimizer({"l0drop": (0.5,)}, "adam_sparsity")
    check_target_optimizer({}, "adam")  # no target: any optimiser


@pytest.mark.parametrize("between", [False, True])
def test_controller_steers_the_test_time_share(between):
    """With dropout, the training pass's g_hat share differs from what decoding prunes; the controller steers
    the latter: the criterion runs the encoder again in eval mode and its count is what the multipliers see
    (logged as l0drop_test_time_sparsity), while every module keeps its training mode."""
    from helpers.models import build_l0drop_model

    from fairseq_sparse.modules.l0drop import L0Drop

    model, _ = build_l0drop_model("--dropout", "0.5", *(["--l0drop-between-layers"] if between else []))
    for gate in (m for m in model.modules() if isinstance(m, L0Drop)):  # log alpha around g_hat = 0's -2.4
        gate.log_alpha_proj.weight.data.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
        gate.log_alpha_proj.bias.data.fill_(-2.4)
    model.train()
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, 24, (6, 9), generator=g)
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.full((6,), 9),
                            "prev_output_tokens": torch.randint(4, 24, (6, 5), generator=g)},
              "target": torch.randint(4, 24, (6, 5), generator=g), "ntokens": 30}
    c = criterion(l0drop_target_sparsity=0.5)
    seen = {}
    lagrangian = c.controller.lagrangian
    c.controller.lagrangian = lambda shares, updates: seen.update(shares) or lagrangian(shares, updates)
    _, _, log = c(model, sample)
    assert all(m.training for m in model.modules())
    model.eval()
    with torch.no_grad():
        gates = model.encoder(src, src_lengths=sample["net_input"]["src_lengths"])["l0drop_gates"][0]
    test_time = (gates == 0).sum().item()
    assert 0 < test_time < src.numel()
    assert log["sparsity/l0drop_test_time_sparsity:num"].item() == test_time
    assert seen["l0drop"].item() == pytest.approx(test_time / src.numel())
    # the training pass alone would have steered another share (dropout moves gates across g_hat = 0)
    assert log["sparsity/l0drop_sparsity:num"].item() != test_time


def run_noisy_share(target=0.5, steps=600, units=40, noise=0.35, lr=0.05, warmup=200, seed=0):
    """Input-dependent gates (L0Drop's): the share each batch reports is the gates' expected share plus
    noise of its own (batches differ), while a task loss keeps the gates open. Returns the reported shares
    and the controller."""
    torch.manual_seed(seed)
    log_alpha = torch.nn.Parameter(torch.full((units,), 3.0))
    value = torch.linspace(0.2, 1.0, units)
    ctrl = LagrangianController({"l0drop": target}, warmup_updates=warmup)
    opt = torch.optim.Adam([log_alpha] + list(ctrl.parameters()), lr=lr)
    shares = []
    for step in range(steps):
        closed = torch.sigmoid(-log_alpha)
        share = closed.mean() + noise * torch.randn(())
        loss = -((1 - closed) * value).mean() + ctrl.lagrangian({"l0drop": share}, step)["l0drop"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        shares.append(float(closed.detach().mean()))
    return shares, ctrl


def test_batch_noise_does_not_wind_up_lambda2():
    """With a share that varies by 0.35 from batch to batch, lambda_2 ascending on (s - t)^2 grows by about
    the learning rate every update (Adam: 17 after 600 updates, 33 after 1,200), and 2 lambda_2 (s - t)
    swamps every batch's gradient; on (s - t)(m - t) it levels off (about 5 and 6.5), and the gates' mean
    share still meets the target."""
    shares, ctrl = run_noisy_share(steps=1200)
    lam2 = float(ctrl.lambdas("l0drop")[1])
    assert abs(lam2) < 10.0, lam2
    final = shares[-200:]
    assert abs(sum(final) / len(final) - 0.5) <= 0.03, final[::20]


def test_the_running_mean_is_saved_so_a_resumed_controller_goes_on_exactly():
    """m_k (lambda_2's ascent) is part of the controller's state: a controller loaded from another's state after k
    batches gives the multipliers the same gradients from then on, bit for bit; a state from before it was saved
    (no running_share) loads and starts it afresh."""
    shares = [0.10, 0.45, 0.20, 0.35, 0.50, 0.15]

    def step(controller, s, update):
        controller.zero_grad()
        sum(controller.lagrangian({"l0drop": torch.tensor(s)}, update).values()).backward()
        return controller.multipliers["l0drop"].grad.clone()

    first = LagrangianController({"l0drop": 0.3}, warmup_updates=2)
    for k, s in enumerate(shares[:3]):
        step(first, s, k)
    resumed = LagrangianController({"l0drop": 0.3}, warmup_updates=2)
    resumed.load_state_dict(first.state_dict())
    for k, s in enumerate(shares[3:], start=3):
        assert torch.equal(step(resumed, s, k), step(first, s, k))
    afresh = LagrangianController({"l0drop": 0.3}, warmup_updates=2)
    state = {k: v for k, v in first.state_dict().items() if k != "running_share"}
    afresh.load_state_dict(state)
    assert afresh.running_share.eq(0).all()
    assert not torch.equal(step(afresh, 0.4, 6), step(first, 0.4, 6))  # without m_k the ascent differs
