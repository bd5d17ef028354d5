"""The sparsity/quality curve of one fine-tuning with a schedule of target sparsities: Zhang, Titov &
Sennrich (2021) Fig. 4 (BLEU against the L0Drop sparsity rate) and Voita et al. (2019) Fig. 7 (BLEU
against the number of heads kept), one point per checkpoint.

``--l0drop-target-sparsity 0.2,0.4,0.6 --sparsity-target-hold-updates H --save-interval-updates H`` holds
each target H updates, so fairseq's ``checkpoint_<epoch>_<k H>.pt`` holds the model at the end of
target k. The forward pass of update n sees ``num_updates`` n - 1, so the target a checkpoint saved
after n updates was trained at last is ``scheduled_target(stages, n - 1, H, warm-up)``.

Per model: the L0Drop sparsity (share of non-padding source tokens, EOS included, whose g_hat is 0, as
``fairseq-sparse-l0drop-gates`` counts it), the share of gated heads closed (g_hat = 0) overall and per
attention type, and the share of pruned pieces per token type (:mod:`.token_types`; Zhang, Titov &
Sennrich 2021 Fig. 5). BLEU is :class:`.head_importance.BleuEvaluator`'s.
"""
import itertools
import os
import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

from ..checkpoint_safety import criterion_options, model_options, read_state, state_updates
from ..modules.head_gates import ATTENTION_TYPES, attention_modules
from ..modules.sparsity_control import DEFAULT_TARGET_WARMUP, parse_targets, scheduled_target
from . import token_types as tt
from .attention import source_token_gates

#: fairseq's name of a checkpoint saved every --save-interval-updates (not at an epoch's end)
INTERVAL_CHECKPOINT = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")
EPOCH_CHECKPOINT = re.compile(r"^checkpoint(\d+)\.pt$")
#: the controlled quantities, named as the criterion's targets and logged sparsities
SPARSITY_KEYS = ("l0drop", "head_gates") + tuple(f"head_gates_{t}" for t in ATTENTION_TYPES)
COLUMNS = (["checkpoint", "baseline", "updates"] + [f"target_{k}" for k in SPARSITY_KEYS]
           + [f"{k}_sparsity" for k in SPARSITY_KEYS] + ["bleu"] + [f"pruned_{t}" for t in tt.TOKEN_TYPES])
_L0DROP_PARAM = re.compile(r"(^|\.)(l0drop|layer_l0drops)\.")
_HEAD_GATE_PARAM = re.compile(r"\.head_gates\.log_alpha$")


# ----------------------------------------------------------------------------------------------
# checkpoints: which, how many updates, which target, which gates (read without building a model)


def saved_checkpoints(save_dir: str) -> List[str]:
    """Every ``checkpoint_<epoch>_<updates>.pt`` and ``checkpoint<epoch>.pt`` of ``save_dir`` (fairseq names a
    save at an epoch's last update ``checkpoint<epoch>.pt``, also when a target ends there)."""
    return [os.path.join(save_dir, name) for name in sorted(os.listdir(save_dir))
            if INTERVAL_CHECKPOINT.match(name) or EPOCH_CHECKPOINT.match(name)]


def stage_ends(infos: Sequence[dict]) -> List[dict]:
    """The checkpoints saved at the end of a schedule's target (updates a multiple of the hold), one per
    update count, by updates; checkpoints of runs without a schedule are all kept."""
    out = {}
    for info in infos:
        scheduled = info["hold"] > 0 and info["stages"] > 1
        if not scheduled or (info["updates"] is not None and info["updates"] % info["hold"] == 0):
            out.setdefault((info["updates"] or 0, info["path"] if not scheduled else ""), info)
    return [out[k] for k in sorted(out)]


def checkpoint_gates(model_state: Mapping) -> Dict[str, bool]:
    """{"l0drop": has L0Drop gates, "head_gates": has head gates}, from the parameter names."""
    return {"l0drop": any(_L0DROP_PARAM.search(k) for k in model_state),
            "head_gates": any(_HEAD_GATE_PARAM.search(k) for k in model_state)}


def target_schedules(criterion: Mapping) -> Dict[str, tuple]:
    """{controlled key: schedule of targets} of the criterion options ({} without targets)."""
    try:
        return parse_targets(criterion.get("l0drop_target_sparsity"), criterion.get("head_gates_target_sparsity"))
    except ValueError:
        return {}


def checkpoint_targets(criterion: Mapping, num_updates: Optional[int]) -> Dict[str, float]:
    """{controlled key: the target sparsity the checkpoint was trained at last}: the schedule's target at
    ``num_updates - 1`` (the forward pass of update n sees n - 1 updates). {} without targets."""
    if num_updates is None:
        return {}
    schedules = target_schedules(criterion)
    scheduled = any(len(s) > 1 for s in schedules.values())
    hold = int(criterion.get("sparsity_target_hold_updates") or 0) if scheduled else 0
    warmup = criterion.get("sparsity_target_warmup_updates")
    warmup = DEFAULT_TARGET_WARMUP if warmup is None else int(warmup)
    return {k: scheduled_target(s, max(num_updates - 1, 0), hold, warmup) for k, s in schedules.items()}


def describe_checkpoint(path: str) -> dict:
    """{"path", "updates", "targets", "gates", "hold", "stages"} of one checkpoint, read without building its model."""
    state = read_state(path)
    criterion = criterion_options(state)
    updates = state_updates(state)
    gates = checkpoint_gates(state.get("model") or {})
    gates["l0drop"] = gates["l0drop"] or (model_options(state).get("encoder_output_pattern") or "none") != "none"
    return {"path": path, "updates": updates, "targets": checkpoint_targets(criterion, updates), "gates": gates,
            "hold": int(criterion.get("sparsity_target_hold_updates") or 0),
            "stages": max([len(v) for v in target_schedules(criterion).values()] + [0])}


def missing_stage_ends(infos: Sequence[dict]) -> List[int]:
    """Update counts k x hold (k = 1 .. stages) of the schedule that no checkpoint of ``infos`` was saved at
    (fairseq names a save at an epoch's last update ``checkpoint<epoch>.pt``, which ``--no-epoch-checkpoints``
    suppresses)."""
    schedule = [i for i in infos if i["hold"] > 0 and i["stages"] > 1]
    if not schedule:
        return []
    hold, stages = schedule[-1]["hold"], schedule[-1]["stages"]
    have = {i["updates"] for i in infos}
    return [k * hold for k in range(1, stages + 1) if k * hold not in have]


# ----------------------------------------------------------------------------------------------
# measurements on a loaded model


def head_gate_sparsity(model) -> Dict[str, float]:
    """{"head_gates": share of gated heads closed (g_hat = 0), "head_gates_<type>": the same per attention
    type}; {} without head gates (Voita et al. 2019, Fig. 7 counts the heads kept)."""
    closed: Dict[str, int] = {}
    total: Dict[str, int] = {}
    for (t, _), mha in attention_modules(model).items():
        gates = getattr(mha, "head_gates", None)
        if gates is None:
            continue
        g_hat = gates.deterministic().detach()
        for key in ("head_gates", f"head_gates_{t}"):
            closed[key] = closed.get(key, 0) + int((g_hat == 0).sum())
            total[key] = total.get(key, 0) + g_hat.numel()
    return {k: closed[k] / total[k] for k in total if total[k]}


def l0drop_pruning(encoder, samples: Iterable[dict], dictionary, separator: Optional[str],
                   function_words=tt.ENGLISH_FUNCTION_WORDS, tags: Optional[Mapping[int, Sequence[str]]] = None,
                   char_boundary: Optional[str] = None) -> dict:
    """L0Drop (or a rule-based pattern) on the source sentences of ``samples`` (Zhang, Titov & Sennrich 2021,
    Figs. 4-6): {"l0drop": pruned / tokens, "tokens", "pruned"} over every non-padding token (EOS included),
    {"pruned_<type>": share of that type's pieces pruned} over the word pieces (EOS, BOS excluded; words
    joined at ``separator``, types from ``tags`` {sentence id: tags} when given, :func:`.token_types.piece_types`)
    and, for a character-level source with the space symbol ``char_boundary``, {"char_positions": rows of
    :class:`.token_types.PrunedPositions`}."""
    specials = {dictionary[dictionary.eos()], dictionary[dictionary.bos()], dictionary[dictionary.pad()]}
    was_pruned_decoding = getattr(encoder, "pruned_decoding", None)
    encoder.pruned_decoding = False  # the same gates either way; no compressed memory needed
    try:
        rows = source_token_gates(encoder, samples, dictionary)
        sentences = [(sid, [(tok, g == 0) for _, _, tok, g in s]) for sid, s in itertools.groupby(rows, lambda r: r[0])]
    finally:
        encoder.pruned_decoding = was_pruned_decoding
    n = sum(len(s) for _, s in sentences)
    pruned = sum(p for _, s in sentences for _, p in s)
    words = [(sid, [(tok, p) for tok, p in s if tok not in specials]) for sid, s in sentences]
    by_type = tt.pruned_by_type(words, separator, function_words, tags)
    out = {"l0drop": pruned / n if n else None, "tokens": n, "pruned": pruned}
    out.update({f"pruned_{t}": v for t, v in by_type.shares().items()})
    if char_boundary is not None:
        out["char_positions"] = tt.pruned_by_position(words, char_boundary).rows()
    return out


# ----------------------------------------------------------------------------------------------
# the table and the plotted points


def curve_row(info: dict, bleu: float, sparsity: Mapping[str, Optional[float]], baseline: bool = False) -> dict:
    """One row of the table (:data:`COLUMNS`); missing values are None."""
    row = {"checkpoint": info["path"], "baseline": baseline, "updates": info["updates"], "bleu": bleu}
    row.update({f"target_{k}": (None if baseline else info["targets"].get(k)) for k in SPARSITY_KEYS})
    row.update({f"{k}_sparsity": sparsity.get(k) for k in SPARSITY_KEYS})
    row.update({f"pruned_{t}": sparsity.get(f"pruned_{t}") for t in tt.TOKEN_TYPES})
    row["char_positions"] = sparsity.get("char_positions")
    return row


def curve_axis(rows: Sequence[dict]) -> str:
    """The x axis: "l0drop" if a (non-baseline) model has L0Drop gates, else "head_gates"."""
    return "l0drop" if any(r["l0drop_sparsity"] is not None for r in rows if not r["baseline"]) else "head_gates"


def point_label(row: dict, axis: str) -> str:
    """A point's label: its target(s) of the plotted kind ("0.3"; "enc 0.2, encdec 0.1"), "" without."""
    keys = [axis] if axis == "l0drop" else [k for k in SPARSITY_KEYS if k.startswith("head_gates")]
    parts = [(k[len("head_gates_"):] + " " if k.startswith("head_gates_") else "") + f"{row[f'target_{k}']:g}"
             for k in keys if row.get(f"target_{k}") is not None]
    return ", ".join(parts)


def curve_points(rows: Sequence[dict], axis: str) -> List[tuple]:
    """(sparsity, BLEU, label) of the non-baseline rows with a sparsity on ``axis``, by sparsity."""
    pts = [(r[f"{axis}_sparsity"], r["bleu"], point_label(r, axis)) for r in rows
           if not r["baseline"] and r[f"{axis}_sparsity"] is not None]
    return sorted(pts, key=lambda p: p[0])


def token_type_series(rows: Sequence[dict]) -> List[tuple]:
    """(type, L0Drop sparsities, shares of the type pruned) of the non-baseline L0Drop rows, by sparsity."""
    rows = sorted((r for r in rows if not r["baseline"] and r["l0drop_sparsity"] is not None),
                  key=lambda r: r["l0drop_sparsity"])
    return [(t, [r["l0drop_sparsity"] for r in rows], [r[f"pruned_{t}"] for r in rows]) for t in tt.TOKEN_TYPES]
