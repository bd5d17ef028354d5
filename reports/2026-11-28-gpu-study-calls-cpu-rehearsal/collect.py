"""results.json of the rehearsal from what each call left: its study.log (the phases' and steps' clock times), the
files it would bring back (sizes; the parts joined again and compared with the work dir's checkpoint, tensor by
tensor, in fp16), and each work dir's results.json (what the report step found: decoding times, pruned decoding
against the full memory, the lead baseline).

    python3 reports/2026-11-28-gpu-study-calls-cpu-rehearsal/collect.py OUT_DIR...
"""
import datetime
import json
import os
import re
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "lab"))
import checkpoint_parts  # noqa: E402
import torch  # noqa: E402

from fairseq_sparse.checkpoint_safety import read_state  # noqa: E402


def clock(t):
    return datetime.datetime.strptime(t, "%H:%M:%S")


def timeline(log):
    """{what: seconds} of the call: each phase, each (seed, step) from its phase's start, the report, the whole."""
    text = open(log).read()
    prefix = re.search(r"^study \S+ (\S+) ", text, re.M).group(1)
    events = re.findall(r"^(phase \S+|report|done) \((\d\d:\d\d:\d\d)\)", text, re.M)
    steps = re.findall(r"^  seed (\d+), (\S+): exit (\d+) \((\d\d:\d\d:\d\d)\)", text, re.M)
    start, out, exits = clock(events[0][1]), {}, {}
    marks = [(name, clock(t)) for name, t in events]
    for (name, t), (_, t_next) in zip(marks, marks[1:]):
        out[name] = (t_next - t).seconds
    for seed, step, status, t in steps:
        began = max(m for _, m in marks if m < clock(t))  # the phase (or report) it ran in
        out[f"seed {seed}, {step}"] = (clock(t) - began).seconds
        exits[f"seed {seed}, {step}"] = int(status)
    out["whole call"] = (marks[-1][1] - start).seconds
    return prefix, out, exits


def brought_back(out_dir, prefix):
    """Each brought-back checkpoint: its files and sizes, and whether its parts join into the work dir's checkpoint."""
    groups = defaultdict(list)
    for name in sorted(os.listdir(out_dir)):
        if name.endswith(".pt"):
            groups[re.sub(r"\.part\d+of\d+\.pt$", ".pt", name)].append(name)
    found = {}
    for stem, names in groups.items():
        seed, rest = re.fullmatch(r"s(\d+)_(.+)\.pt", stem).groups()
        joined = checkpoint_parts.join([read_state(os.path.join(out_dir, n)) for n in names])
        # s<seed>_<dir>_<file>.pt: the dir is the one that makes an existing path (dir names hold "_" too)
        paths = [os.path.join(REPO, f"{prefix}{seed}", rest[:i], rest[i + 1:] + ".pt")
                 for i in range(len(rest)) if rest[i] == "_"]
        source = read_state(next(p for p in paths if os.path.isfile(p)))["model"]
        same = list(joined["model"]) == list(source) and all(
            torch.equal(joined["model"][k], v.half() if v.is_floating_point() else v) for k, v in source.items())
        found[stem] = {"files": {n: os.path.getsize(os.path.join(out_dir, n)) for n in names},
                       "joined_equals_the_work_dirs_fp16": same}
    return found


def work_results(work):
    r = json.load(open(os.path.join(work, "results.json")))
    out = {"decode_seconds": {n: m.get("decode_seconds") for n, m in r["models"].items()},
           "pruned_vs_full_memory": {k: {x: v[x] for x in ("identical", "sentences", "max_score_difference")}
                                     for k, v in r.items() if k.endswith("_exact")},
           "baseline_stopped": r["stopped"].get("baseline")}
    if r.get("lead"):
        out["lead"] = {"score": r["lead"]["score"], "documents": r["lead"]["documents"],
                       "baseline": r["models"]["baseline"]["score"]}
    return out


def main(out_dirs):
    calls = {}
    for out_dir in out_dirs:
        prefix, times, exits = timeline(os.path.join(out_dir, "study.log"))
        calls[os.path.basename(out_dir.rstrip("/"))] = {
            # the work dirs' prefix: relative to the repository, or (a carry of the rehearsal's own) to its folder
            "work_prefix": os.path.relpath(prefix, os.path.dirname(os.path.abspath(out_dir))) if os.path.isabs(prefix)
            else prefix, "seconds": times, "exit": exits, "brought_back": brought_back(out_dir, prefix),
            "files_in_out": len(os.listdir(out_dir)), "work": work_results(os.path.join(REPO, f"{prefix}1"))}
    with open(os.path.join(HERE, "results.json"), "w") as f:
        json.dump({"calls": calls}, f, indent=1)
    print(json.dumps(calls, indent=1)[:4000])


if __name__ == "__main__":
    main(sys.argv[1:])
