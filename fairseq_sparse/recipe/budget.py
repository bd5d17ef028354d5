"""The quality gap against the budget: each method and its equal-updates control decoded at the same update counts
(``--budget-points`` for fine-tunings, ``--scratch-budget-points`` for models trained from scratch beside the
baseline), from the checkpoints of one run each."""
import os
import sys

from .commands import budget_points, scratch_budget_points
from .decoding import paired_test_of
from .methods import BUDGET_DECODINGS, BY_NAME, METHODS
from .workdir import checkpoint_identity


def checkpoints_by_updates(wd, name):
    """{updates: checkpoint path relative to WORK} of every interval and epoch checkpoint of run NAME, and of its
    last checkpoint where none of those has its updates (fairseq saves no interval checkpoint at an epoch's end, and
    no epoch checkpoint where epochs are not saved)."""
    from ..analysis.sparsity_curve import saved_checkpoints
    from ..checkpoint_safety import read_state, state_updates

    found = {state_updates(read_state(c)): os.path.relpath(c, wd.work) for c in saved_checkpoints(wd.path(name))}
    last = wd.path(name, "checkpoint_last.pt")
    if os.path.exists(last):
        found.setdefault(checkpoint_identity(last)["updates"], os.path.relpath(last, wd.work))
    return found


def keep_budget_checkpoints(wd, name, points):
    """After run NAME trained from scratch with --scratch-budget-points POINTS: remove its epoch and interval
    checkpoints whose updates are no budget point (fairseq saves one at every epoch's end and every save interval,
    all kept: 40 for a 200-update run on a small corpus, enough to fill a disk at full size); checkpoint_last.pt and
    checkpoint_best.pt stay. Returns the names removed."""
    from ..analysis.sparsity_curve import saved_checkpoints
    from ..checkpoint_safety import read_state, state_updates

    removed = []
    for path in saved_checkpoints(wd.path(name)):
        if state_updates(read_state(path)) not in points:
            os.remove(path)
            removed.append(os.path.basename(path))
    return removed


def budget_control(m):
    """The run M is compared with at each budget point: its control where that is fine-tuned too; where M's control
    is trained from scratch (simplified_control's is the simplified decoder itself) the stock control, which has had
    the same updates (the simplified decoder's gap at equal updates); None for the stock control itself."""
    if BY_NAME[m.control].start is not None:
        return m.control
    return "control" if m.name != "control" else None


def points_of(a, m):
    """The update counts at which M is decoded against its control: --scratch-budget-points for a model trained from
    scratch (the baseline among them), --budget-points for a fine-tuning; none for the other decodings."""
    if m.start is None:
        return scratch_budget_points(a) if m.arch else []
    return budget_points(a) if m.decoding in BUDGET_DECODINGS else []


def decode_budget_points(a, dec, m):
    """M's own decodings at every budget point it has a checkpoint for, in M's step: the runs of a study decode
    side by side, and the report pairs the cached decodings."""
    points = points_of(a, m)
    if not points:
        return
    mine = checkpoints_by_updates(dec.wd, m.name)
    for u in points:
        if u in mine:
            dec.generate(*dec.at_updates(m, u, mine))


def budget_rows(a, dec, rows):
    """{method: [{updates, score, control, control_score, gap, p_value, l0drop_sparsity, heads_closed}, ...]} for
    every reported fine-tuned method with a control, at every budget point both runs have a checkpoint for
    (heads_closed: the share of gated heads cut out, where they are)."""
    out = {}
    for m in METHODS:
        if m.control is None or not points_of(a, m):
            continue
        control = m.control if m.start is None else budget_control(m)  # from scratch: beside the baseline
        if control is None or m.name not in rows or control not in rows:
            continue
        mine, theirs = checkpoints_by_updates(dec.wd, m.name), checkpoints_by_updates(dec.wd, control)
        points = []
        for u in points_of(a, m):
            if u not in mine or u not in theirs:
                lacking = " and ".join(n for n, c in ((m.name, mine), (control, theirs)) if u not in c)
                print(f"warning: budget point {u} of {m.name} not compared: {lacking} kept no checkpoint at update {u} "
                      "(trained before that point was asked for, or stopped before it); train them again in a new "
                      "--work-dir with the points given from the start", file=sys.stderr)
                continue
            key, ckpt = dec.at_updates(m, u, mine)
            heads = dec.heads_kept(m.name, ckpt)["total"] if m.heads_cut_out(a) else None
            r, c = dec.generate(key, ckpt), dec.generate(*dec.at_updates(BY_NAME[control], u, theirs))
            test = paired_test_of(a, c, r)
            points.append({"updates": u, "score": r["score"], "control": control, "control_score": c["score"],
                           "gap": round(r["score"] - c["score"], 2), "p_value": test.get("p_value"),
                           "identical": bool(test.get("identical")),
                           "l0drop_sparsity": r["l0drop_sparsity"],
                           "heads_closed": round(1 - heads[0] / heads[1], 4) if heads else None})
        if points:
            out[m.name] = points
    return out


def plot_gap(wd, budget, metric):
    """WORK/budget/gap.png: each method's gap to its control against the fine-tuning updates."""
    from ..analysis.plotting import line_plot

    os.makedirs(wd.path("budget"), exist_ok=True)
    series = [(name, [p["updates"] for p in pts], [p["gap"] for p in pts]) for name, pts in budget.items()]
    return line_plot(series, wd.path("budget", "gap.png"), f"{metric} gap to the equal-updates control",
                     "fine-tuning updates", f"{metric} (method - control)")
