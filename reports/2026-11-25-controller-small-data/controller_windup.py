#!/usr/bin/env python3
"""How the target-sparsity controller (modules/sparsity_control.py) overshoots when the task's pull on the gates
relaxes while it runs, as it does when the model learns to do without the pruned states: a pure-tensor L0Drop
(log alpha = x . w + b on fixed random token features, Adam lr 0.05 as adam_sparsity's gate group), a task
reward for every open gate that decays as exp(-update / DECAY), and the controller's multipliers. Prints the
held-out share of pruned tokens every 100 updates and its maximum, for a few values of LAMBDA1_SCALE.

    .venv/bin/python reports/2026-11-25-controller-small-data/controller_windup.py    # about a minute on one core
"""
import torch

import fairseq_sparse.modules.sparsity_control as control
from fairseq_sparse.modules.hard_concrete import HardConcrete
from fairseq_sparse.modules.l0drop import L0Drop
from fairseq_sparse.modules.sparsity import collect_sparsity_terms


def run(target=0.5, updates=400, warmup=200, batch=400, dim=16, tokens=5000, pull=3.0, decay=150.0, seed=0):
    """The held-out pruned share every 10 updates."""
    torch.manual_seed(seed)
    features, reward = torch.randn(tokens, dim), pull * torch.rand(tokens)
    gates = L0Drop(dim, HardConcrete(beta=0.33))
    ctrl = control.LagrangianController({"l0drop": target}, warmup_updates=warmup)
    opt = torch.optim.Adam(list(gates.parameters()) + list(ctrl.parameters()), lr=0.05, betas=(0.9, 0.98))
    shares = []
    for update in range(updates):
        idx = torch.randint(0, tokens, (batch,))
        gates.train()
        _, g = gates(features[idx].unsqueeze(1), None)
        count = collect_sparsity_terms(gates)[0].sparsity["l0drop"]
        share = control.straight_through(count.closed, count.expected, count.units)
        relax = 1.0 if not decay else float(torch.exp(torch.tensor(-update / decay)))
        loss = -(g[0] * reward[idx]).mean() * relax + ctrl.lagrangian({"l0drop": share}, update)["l0drop"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        if update % 10 == 9:
            with torch.no_grad():
                closed = gates.hard_concrete.deterministic(gates.log_alpha(features.unsqueeze(1))) == 0
            shares.append(float(closed.float().mean()))
    return shares


def main():
    for scale in (0.1, 0.2, 0.5):
        control.LAMBDA1_SCALE = scale
        for kw in (dict(decay=0.0, pull=1.0), dict(), dict(batch=40)):
            shares = run(**kw)
            print(f"LAMBDA1_SCALE {scale}, {kw}: at 100/200/300/400 updates "
                  f"{[round(shares[i], 3) for i in (9, 19, 29, 39)]}, max {max(shares):.3f}", flush=True)


if __name__ == "__main__":
    main()
