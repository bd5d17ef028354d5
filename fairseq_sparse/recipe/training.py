"""The recipe's model steps: each method of the table trained (from scratch or fine-tuned from its start model),
the importance step's pruning (no training), and the POS tags the tag pattern reads."""
import os
import time

from . import commands
from .budget import keep_budget_checkpoints
from .corpus import source_text
from .methods import Method, updates_of
from .options import SPLITS, fail
from .seqkd import seqkd_data
from .workdir import checkpoint_identity, command_options, file_identity, load_json, save_json


def train(a, wd, data, m: Method):
    """Train method M unless its run is finished; an interrupted fine-tuning resumes from its checkpoint_last."""
    if m.source_tags:
        source_tags(a, wd)
    if m.name == "baseline" and a.baseline_checkpoint:
        return bring_baseline(a, wd)
    if m.start is not None and a.seq_kd and not os.path.isdir(seqkd_data(wd)):
        fail(f"{m.name}: --seq-kd fine-tunes on the baseline's translations; run the distill_data step first")
    cmd = train_command(a, wd, data, m)
    if (a.finetune_protocol == "continue" and m.start is not None and os.path.exists(wd.path(m.start, "checkpoint_best.pt"))
            and not wd.finished(m.name, updates_of(m, a))):
        continued_start(wd, m)  # before check_model records the run's key: a refused start leaves the work dir as it was
    check_model(a, wd, m, cmd)
    if wd.finished(m.name, updates_of(m, a)):
        print(f"  {m.name}: done already ({wd.path(m.name)}); skipped")
        return
    start, before = time.time(), _updates(wd, m.name)
    out = wd.run(m.name, cmd, f"{m.name}.log")
    record_timing(wd, m.name, time.time() - start, _updates(wd, m.name) - before)
    if m.start is None:
        record_stop(a, wd, m.name, out)
        if commands.scratch_budget_points(a):
            keep_budget_checkpoints(wd, m.name, commands.scratch_budget_points(a))


def train_command(a, wd, data, m: Method):
    """Method M's fairseq-train: from scratch, or fine-tuned from its start model (resumed from its own
    checkpoint_last where there is one; on the baseline's translations with --seq-kd)."""
    if m.start is None:
        return commands.train_from_scratch(a, data, m)
    start_updates = None
    if a.finetune_protocol == "continue" and os.path.exists(wd.path(m.start, "checkpoint_best.pt")):
        start_updates = _updates(wd, m.start, "checkpoint_best.pt")
    return commands.finetune(a, seqkd_data(wd) if a.seq_kd else data, m,
                             resume=os.path.exists(wd.path(m.name, "checkpoint_last.pt")), start_updates=start_updates)


def continued_start(wd, m: Method):
    """--finetune-protocol continue: WORK/START/checkpoint_continue.pt, the start's checkpoint_best.pt with its
    optimiser state made a start for the sparsity criterion and adam_sparsity (optim/continued.py); again when the
    start changed."""
    import torch

    from ..checkpoint_safety import read_state
    from ..optim.continued import continued_start as continued

    source, output = f"{m.start}/checkpoint_best.pt", f"{m.start}/{commands.CONTINUED_START}"

    def write():
        try:
            state = continued(read_state(wd.path(source)))
        except ValueError as e:
            fail(f"{m.name}: --finetune-protocol continue: {source}: {e}")
        tmp = wd.path(f"{output}.{os.getpid()}.tmp")  # fine-tunings side by side may each write it: never one file
        try:
            torch.save(state, tmp)
            os.replace(tmp, wd.path(output))
        except (OSError, RuntimeError) as e:  # a full disk: torch's writer raises RuntimeError or OSError
            if os.path.exists(tmp):
                os.remove(tmp)
            fail(f"{m.name}: --finetune-protocol continue: cannot write {output}: {e}".splitlines()[0])
    wd.produced(output, [source], write)


#: fairseq-train options that bound a run, not what it trains: a budget raised later resumes the same run
BUDGET_OPTIONS = ("--max-update", "--save-interval-updates", "--keep-interval-updates", "--no-epoch-checkpoints",
                  "--stop-time-hours", "--patience", "--finetune-from-model", "--continue-once", "--reset-dataloader",
                  "--reset-meters")


def check_model(a, wd, m, cmd):
    """Refuse to reuse or resume WORK/NAME trained with another command line (any option but the budget's) or from
    another start checkpoint, or with more updates than this run asks for (it would be reported under this run's
    budget)."""
    key = {k: v for k, v in command_options(wd.shown(cmd)).items() if k not in BUDGET_OPTIONS}
    if m.start is not None:
        if not os.path.exists(wd.path(m.start, "checkpoint_best.pt")):
            fail(f"{m.name} is fine-tuned from {m.start}/checkpoint_best.pt, which {wd.work} lacks: run the "
                 f"{m.start} step first")
        key["start checkpoint"] = checkpoint_identity(wd.path(m.start, "checkpoint_best.pt"))["sha1"]
    remedy = f"use a new --work-dir, the same options, or delete {wd.path(m.name)} to train it again"
    wd.keep_key(f"{m.name}/key.json", key, m.name, remedy, exists=os.path.isdir(wd.path(m.name)))
    done, wanted = _updates(wd, m.name), updates_of(m, a)
    if done > wanted:
        bound = "--baseline-updates" if m.start is None else "--finetune-updates"
        fail(f"{m.name} in {wd.work} has {done} updates, more than this run's {bound} {wanted}: {remedy}")


def _updates(wd, name, checkpoint="checkpoint_last.pt"):
    from ..checkpoint_safety import read_state, state_updates

    last = wd.path(name, checkpoint)
    return (state_updates(read_state(last)) or 0) if os.path.exists(last) else 0


def record_timing(wd, name, seconds, updates):
    """WORK/NAME/timing.json: the wall time of this process's fairseq-train (start-up, validation and saving
    included) and the updates it made; a resumed run's calls add up."""
    path = wd.path(name, "timing.json")
    t = load_json(path, {"wall_seconds": 0.0, "updates": 0, "runs": 0})
    t = {"wall_seconds": round(t["wall_seconds"] + seconds, 1), "updates": t["updates"] + updates, "runs": t["runs"] + 1}
    t["updates_per_second"] = round(t["updates"] / t["wall_seconds"], 2) if t["wall_seconds"] else None
    save_json(path, t)


def record_stop(a, wd, name, log):
    """WORK/NAME/stopped.json: where a training from scratch stopped and why (fairseq's --patience, the
    --baseline-minutes bound, or the --baseline-updates bound), as fairseq-train printed it."""
    from ..checkpoint_safety import read_state, state_updates

    updates = state_updates(read_state(wd.path(name, "checkpoint_last.pt")))
    patience = "early stop since valid performance hasn't improved" in log
    timed = not patience and updates < a.baseline_updates and bool(a.baseline_minutes)
    if patience:
        reason = (f"no valid {'BLEU' if a.metric == 'bleu' else 'loss'} gain in {a.baseline_patience} validations "
                  "(--baseline-patience)")
    elif timed:
        reason = f"reached --baseline-minutes {a.baseline_minutes:g}"
    else:
        reason = f"reached --baseline-updates {a.baseline_updates}"
    save_json(wd.path(name, "stopped.json"), {"updates": updates, "early_stop": patience or timed, "reason": reason})
    print(f"  {name}: stopped after {updates} updates: {reason}")


def bring_baseline(a, wd):
    """--baseline-checkpoint: the user's converged model is the baseline (WORK/baseline/checkpoint_{best,last}.pt
    link to it); its updates are final whatever --baseline-updates says."""
    from ..checkpoint_safety import read_state, state_updates

    source = os.path.abspath(a.baseline_checkpoint)
    os.makedirs(wd.path("baseline"), exist_ok=True)
    for name in ("checkpoint_best.pt", "checkpoint_last.pt"):
        link = wd.path("baseline", name)
        if not os.path.islink(link) or os.readlink(link) != source:
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(source, link)
    updates = state_updates(read_state(source))
    save_json(wd.path("baseline", "stopped.json"), {"updates": updates, "early_stop": True,
                                                    "reason": f"the user's checkpoint {source} (--baseline-checkpoint)"})
    print(f"  baseline: {source} ({updates} updates), brought by --baseline-checkpoint")


def importance(a, wd, data):
    """Michel et al. (2019): head importance of the baseline on the valid split (heat maps), its pruning curves,
    and the --importance-fraction least important heads cut out of the weights (no training). Each output is
    remade when the baseline changed."""
    os.makedirs(wd.path("importance"), exist_ok=True)
    base = ["baseline/checkpoint_best.pt"]
    for output, cmd, log in (("importance/mask.json", commands.head_importance(a, data), "importance.log"),
                             ("importance/curve/curve.png", commands.importance_curve(a, data), "prune_curve.log")):
        wd.produced(output, base, lambda: wd.run("importance", cmd, log), [wd.shown(cmd)])
    prune = commands.prune_heads(base[0], "importance/pruned.pt", "importance/mask.json")
    wd.produced("importance/pruned.pt", base, lambda: wd.run("importance", prune, "prune.importance.log"),
                [wd.shown(prune), file_identity(wd.path("importance", "mask.json"))])


def source_tags(a, wd):
    """WORK/tags/{split}.tags: one tag per source word of each split, tagged on the prepared source text."""
    os.makedirs(wd.path("tags"), exist_ok=True)
    for split in SPLITS:
        if os.path.exists(wd.path("tags", f"{split}.tags")):
            continue
        wd.run("pattern_pos", commands.pos_tags(source_text(a, split), split, a.bpe_merges), f"pos_tags.{split}.log")
