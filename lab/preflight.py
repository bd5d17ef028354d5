#!/usr/bin/env python3
"""The pre-flight check of a prepared device call (lab/README.md): does it fit what the device tool allows, before
the call is made? A call script declares, in lines starting with ``#@``:

    #@ run CARRY_PATHS... -- COMMAND     the exact run: the paths carried, then the command line
    #@ carry PATH MIB                    a carried path and its size as measured when it was prepared on the CPU
    #@ input PATH                        a file or folder the call reads (under a carried path)
    #@ returns NAME MIB                  a file the call leaves in $OUT (an install's report.tgz and summary.txt
                                         too, where the call runs lab/gpu_checks.sh itself)
    #@ plan STAGE SECONDS BASIS          the time of one stage and the measured rate it comes from
    #@ resume COMMAND                    what to run at once on the warm machine when the call is cut off
    #@ fallback COMMAND                  what to run when the fixed-shape search fails on the device

Checks: what travels (the working tree's files that git does not ignore, plus the carried paths, measured where
they exist here and as declared otherwise) under 64 MiB; at most 8 files come back, none over 16 MiB; every input
under a carried path; the planned time within the command's 600 s less a margin, with a resume command where the
margin is under a minute; a fallback command. ``--here``: before a real call, every carried path and input must
exist here. ``--inputs``: on the device, before the install, only that every input exists (CARRY renames
gpu_carry/). Exit 1 with one line per problem; 0 with the summary.
"""
import argparse
import os
import re
import subprocess
import sys

MIB = 1 << 20
TRAVEL_MIB, RETURN_FILES, RETURN_MIB, COMMAND_S = 64, 8, 16, 600
MARGIN_S = 45  # SECONDS_LEFT's default leaves the packing this much of the 600 s
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def declarations(path):
    """{kind: [fields]} of a call script's #@ lines."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#@ "):
                kind, _, rest = line[3:].strip().partition(" ")
                out.setdefault(kind, []).append(rest.strip())
    return out


def call_env(d, environ=os.environ):
    """The variables a call's paths may name ($CORPUS): the run line's VAR=value words, then the environment's."""
    command = d.get("run", [" -- "])[0].partition(" -- ")[2].split()
    env = dict(w.split("=", 1) for w in command if re.match(r"^[A-Z_]+=", w))
    env.update({k: v for k, v in environ.items() if k in env})
    return env


def expand(text, env):
    return re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), m.group(0)), text)


def sizes(entries, kind, name, env, problems):
    """{path or file: MiB} of #@ lines "KIND NAME MIB"; a malformed line is a problem in one line, not a traceback."""
    out = {}
    for entry in entries:
        fields = expand(entry, env).split()
        if fields and fields[0] in out:
            problems.append(f"{name}: '#@ {kind} {fields[0]}' is declared twice")
        try:
            out[fields[0]] = float(fields[1])
            ok = len(fields) == 2 and out[fields[0]] >= 0
        except (IndexError, ValueError):
            ok = False
        if not ok:
            problems.append(f"{name}: '#@ {kind} {entry}' is not '#@ {kind} PATH MIB' (a size in MiB, >= 0)")
    return out


def size_mib(path):
    """The size of a file or of everything under a folder, in MiB."""
    if os.path.isfile(path):
        return os.path.getsize(path) / MIB
    files = (os.path.join(d, f) for d, _, names in os.walk(path) for f in names)
    return sum(os.path.getsize(f) for f in files if os.path.exists(f)) / MIB  # a dangling link carries nothing


def tree_mib(repo=REPO):
    """What the device tool copies of the working tree: files git tracks or does not ignore."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo, capture_output=True,
                           check=True).stdout.decode().split("\0")
    return sum(os.path.getsize(os.path.join(repo, n)) for n in names if n and os.path.isfile(os.path.join(repo, n))) / MIB


def check(path, here=False, tree=None):
    """(problems, summary lines) of the call script PATH."""
    d, problems, lines = declarations(path), [], []
    name = os.path.relpath(path, REPO)
    if not d.get("run"):
        return [f"{name}: no '#@ run' line (the exact device call)"], lines
    if len(d["run"]) > 1 or not d["run"][0].partition(" -- ")[2].strip():
        return [f"{name}: not one '#@ run CARRY_PATHS... -- COMMAND' line with a command"], lines
    env = call_env(d)
    carried_in_run = expand(d["run"][0].partition(" -- ")[0], env).split()
    carry = sizes(d.get("carry", []), "carry", name, env, problems)
    if sorted(carried_in_run) != sorted(carry):
        problems.append(f"{name}: the run carries {carried_in_run}, the carry lines declare {sorted(carry)}")
    tree = tree_mib() if tree is None else tree
    measured = {}
    for p, declared in carry.items():
        full = os.path.join(REPO, p)
        if os.path.exists(full):
            measured[p] = size_mib(full)
        elif here:
            problems.append(f"{name}: carried path {p} is missing here: prepare it first (see the script's head)")
    travel = tree + sum(measured.get(p, mib) for p, mib in carry.items())
    lines.append(f"travels: {travel:.1f} MiB of {TRAVEL_MIB} (working tree {tree:.1f}; "
                 + ", ".join(f"{p} {measured.get(p, mib):.1f}{'' if p in measured else ' declared'}"
                             for p, mib in carry.items()) + ")")
    if travel > TRAVEL_MIB:
        problems.append(f"{name}: {travel:.1f} MiB would travel, over the {TRAVEL_MIB} MiB a call may send")
    for p in (expand(i, env) for i in d.get("input", [])):
        if not any(p == c or p.startswith(c.rstrip("/") + "/") for c in carry):
            problems.append(f"{name}: input {p} is under no carried path")
        elif here and not os.path.exists(os.path.join(REPO, p)):
            problems.append(f"{name}: input {p} is missing here")
    returns = sizes(d.get("returns", []), "returns", name, env, problems)
    lines.append(f"comes back: {len(returns)} files of {RETURN_FILES} ({', '.join(returns)})")
    if len(returns) > RETURN_FILES:
        problems.append(f"{name}: {len(returns)} files would come back, over {RETURN_FILES}")
    problems += [f"{name}: {n} ({mib} MiB) is over the {RETURN_MIB} MiB a returned file may have"
                 for n, mib in returns.items() if mib > RETURN_MIB]
    plan = [e.split(None, 2) + [""] * (3 - len(e.split(None, 2))) for e in d.get("plan", [])]
    bad = [" ".join(p).strip() for p in plan if not re.fullmatch(r"\d+(\.\d+)?", p[1])]
    problems += [f"{name}: '#@ plan {b}' is not '#@ plan STAGE SECONDS BASIS'" for b in bad]
    plan = [p for p in plan if " ".join(p).strip() not in bad]
    total = sum(float(seconds) for _, seconds, _ in plan)
    margin = COMMAND_S - MARGIN_S - total
    lines.append(f"planned: {total:.0f} s of the {COMMAND_S - MARGIN_S} s a call's work may take, margin {margin:.0f} s: "
                 + "; ".join(f"{stage} {float(s):.0f} s ({basis})" for stage, s, basis in plan))
    if not plan:
        problems.append(f"{name}: no '#@ plan' lines (the time of each stage and the rate it comes from)")
    if margin < 0:
        problems.append(f"{name}: the plan takes {total:.0f} s, over the {COMMAND_S - MARGIN_S} s one call may work (a "
                        "resume line continues a call cut off by surprise; it does not make a longer plan fit)")
    elif margin < 60 and not d.get("resume"):
        problems.append(f"{name}: {margin:.0f} s of margin and no '#@ resume' command for a call cut off")
    if not d.get("fallback"):
        problems.append(f"{name}: no '#@ fallback' command (what to run when the fixed-shape search fails)")
    return problems, lines


def missing_inputs(path):
    """The declared inputs of PATH that do not exist (gpu_carry/ read as $CARRY), relative to the repository."""
    carry, d = os.environ.get("CARRY", "gpu_carry").rstrip("/"), declarations(path)
    env = call_env(d)
    inputs = [carry + p[len("gpu_carry"):] if p.startswith("gpu_carry/") else p
              for p in (expand(i, env) for i in d.get("input", []))]
    return [p for p in inputs if not os.path.exists(os.path.join(REPO, p))]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("calls", nargs="+", help="call scripts (lab/calls/*.sh)")
    p.add_argument("--here", action="store_true", help="every carried path and input must exist here")
    p.add_argument("--inputs", action="store_true", help="only: every input exists (on the device, before the install)")
    a = p.parse_args(argv)
    failed = False
    for call in a.calls:
        if not os.path.isfile(call):
            print(f"preflight: no call script {call}", file=sys.stderr)
            return 2
        try:
            declarations(call)
        except (OSError, UnicodeDecodeError) as e:
            print(f"preflight: {call} is not a readable UTF-8 call script ({type(e).__name__})", file=sys.stderr)
            return 2
        if a.inputs:
            missing = missing_inputs(call)
            for m in missing:
                print(f"preflight: {os.path.basename(call)} reads {m}, which is missing: carry it (see the script's "
                      "head)", file=sys.stderr)
            failed |= bool(missing)
            continue
        problems, lines = check(os.path.abspath(call), a.here)
        print(f"{os.path.relpath(os.path.abspath(call), REPO)}: {'FAILS' if problems else 'fits'}")
        for line in lines:
            print(f"  {line}")
        for line in problems:
            print(f"  problem: {line}")
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
