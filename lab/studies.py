"""A study over several recipe work dirs (seeds, data sizes, variants): each work dir's results.json (the report
step's), every model against its equal-updates control, every budget point, and means over seeds. The one reader
of recipe results that lab/study_summary.py and the report scripts share (importable with lab/ on sys.path)."""
import glob
import json
import os
import statistics
from typing import Dict, Iterable, List, Optional, Sequence

from fairseq_sparse.recipe.methods import CONTROL_OF


class StudyError(ValueError):
    """A work dir's results.json that cannot be read as the recipe writes it (its message names the file)."""


def read_results(path: str, where: Optional[str] = None) -> Optional[dict]:
    """The recipe's results.json at PATH (the file or its work dir): None where there is none or the JSON is not a
    recipe report's (no "models" and "settings"); StudyError naming it (WHERE, default PATH) where it is cut off or
    not JSON."""
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
    except (OSError, ValueError) as e:
        raise StudyError(f"{where or path} is not readable JSON ({e})")
    if not isinstance(results, dict) or "models" not in results or "settings" not in results:
        return None
    return results


def results_by_seed(folder: str) -> Dict[int, dict]:
    """{seed: {"work": the work dir relative to FOLDER, "results": its results.json}} of every recipe results.json
    below FOLDER (one work dir per seed; two of one seed: StudyError)."""
    seeds = {}
    for path in sorted(glob.glob(os.path.join(folder, "**", "results.json"), recursive=True)):
        where = os.path.relpath(path, folder)
        results = read_results(path, where)
        if results is None:
            continue
        seed = results["settings"].get("seed")
        if not isinstance(seed, int):
            raise StudyError(f"{where} lacks settings.seed where the recipe's report writes it (another version, or "
                             "edited)")
        if seed in seeds:
            raise StudyError(f"two work dirs of seed {seed} ({where})")
        seeds[seed] = {"work": os.path.relpath(os.path.dirname(path), folder), "results": results}
    return seeds


def pruned(row: dict, heads: Optional[dict] = None, name: Optional[str] = None) -> dict:
    """What a model or budget point prunes: {"source_states_pruned": share} (L0Drop, patterns), else
    {"heads_closed": share} (from the point's heads_closed, or the report's heads table of model NAME), else {}."""
    if row.get("l0drop_sparsity") is not None:
        return {"source_states_pruned": row["l0drop_sparsity"]}
    if row.get("heads_closed") is not None:
        return {"heads_closed": row["heads_closed"]}
    if heads and name in heads and heads[name]["total"][1]:
        kept, total = heads[name]["total"]
        return {"heads_closed": round(1 - kept / total, 4)}
    return {}


def against_controls(results: dict) -> Dict[str, dict]:
    """{model: score, what it prunes, parameters and, where its equal-updates control was reported, the control, its
    score, the gap, the paired test's p; updates and updates/s where timed} of one work dir's results.json."""
    models, significance, heads = results["models"], results.get("significance", {}), results.get("heads", {})
    timing, rows = results.get("timing", {}), {}
    for name, row in models.items():
        control = CONTROL_OF.get(name)
        out = {"score": row["score"], **pruned(row, heads, name), "parameters": row["parameters"]}
        if control in models:
            out.update(control=control, control_score=models[control]["score"],
                       gap=round(row["score"] - models[control]["score"], 2),
                       p_value=(significance.get(name) or {}).get("p_value"))
        if row.get("distinct_outputs") is not None:
            out["distinct_outputs"] = row["distinct_outputs"]
        if name in timing:
            out["updates"], out["updates_per_second"] = timing[name]["updates"], timing[name]["updates_per_second"]
        rows[name] = out
    return rows


def budget_rows(results: dict, models: Optional[Iterable[str]] = None) -> List[dict]:
    """One row per model and budget point of one work dir's results.json ("budget": each model and its
    equal-updates control decoded at the same update counts): model, updates, control, control_score, score, gap,
    relative_gap (gap / control_score; None where the control scored 0), p_value and what it prunes. MODELS: only
    these (default: all)."""
    rows = []
    for model, points in results.get("budget", {}).items():
        if models is not None and model not in models:
            continue
        for p in points:
            rows.append({"model": model, "updates": p["updates"], "control": p.get("control"),
                         "control_score": p["control_score"], "score": p["score"], "gap": p["gap"],
                         "relative_gap": round(p["gap"] / p["control_score"], 4) if p["control_score"] else None,
                         "p_value": p["p_value"], **pruned(p)})
    return rows


def means(rows: Sequence[dict], by: Sequence[str], fields: Sequence[str], digits: int = 2) -> Dict[tuple, dict]:
    """{the values of BY: {"seeds": the sorted seeds, each of FIELDS: its mean over the rows of that key (None
    values left out; None where none is left), rounded to DIGITS (relative gaps to 4)}}, keys in sorted order."""
    groups: Dict[tuple, List[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in by), []).append(row)
    out = {}
    for key in sorted(groups):
        sel = groups[key]
        mean = {"seeds": sorted(r["seed"] for r in sel if "seed" in r)}
        for field in fields:
            values = [r[field] for r in sel if r.get(field) is not None]
            mean[field] = round(statistics.mean(values), 4 if field.startswith("relative") else digits) \
                if values else None
        out[key] = mean
    return out
