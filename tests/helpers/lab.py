"""What the lab tier's tests read from lab/: the queue of prepared device calls (lab/README.md)."""
import os
import re

from conftest import REPO


def queue(calls=None):
    """lab/README.md's queue lines up to its CALLS-th call (all of them without CALLS): (carried paths, command line,
    the call's script, timeout_s)."""
    with open(os.path.join(REPO, "lab", "README.md")) as f:
        text = f.read().split("## The queue", 1)[1].split("\n## ", 1)[0]
    lines, scripts = [], []
    for carried, timeout, command in re.findall(r"`run\(carry \[([^\]]*)\], timeout_s (\d+)\): ([^`]+)`", text):
        script = next(word for word in command.split() if "=" not in word)
        if script not in scripts:
            if calls is not None and len(scripts) == calls:
                break
            scripts.append(script)
        lines.append(([c.strip().strip('"') for c in carried.split(",")], command, script, int(timeout)))
    return lines
