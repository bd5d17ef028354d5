"""The recipe's work dir: runs commands (logged, their progress echoed, recorded for the report), keeps results
keyed by what produced them, and knows which trainings are finished."""
import functools
import hashlib
import json
import os
import shlex
import subprocess
import sys

from .commands import BIN, USER_DIR
from .options import fail

REPO = os.path.dirname(USER_DIR)


def load_json(path, default=None):
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


def save_json(path, obj):
    """Write atomically: a killed run leaves the old file or the new one, never half of one."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def progress_line(step, line):
    """A short form of one of fairseq-train's JSON progress lines (train_inner, valid), or None."""
    head, _, body = line.partition("| {")
    if not body:
        return None
    try:
        stats = json.loads("{" + body)
    except ValueError:
        return None
    if "| train_inner " in head and "num_updates" in stats:
        return (f"    [{step}] epoch {stats.get('epoch', '?')} update {stats['num_updates']} "
                f"loss {stats.get('loss', '?')} ({stats.get('wall', '?')} s)")
    if "| valid " in head and "valid_num_updates" in stats:
        bleu = f" bleu {stats['valid_bleu']}" if "valid_bleu" in stats else ""
        return f"    [{step}] valid at update {stats['valid_num_updates']}: loss {stats.get('valid_loss', '?')}{bleu}"
    return None


def checkpoint_identity(path):
    """What a result computed from checkpoint PATH depends on: its training updates and its content (sha1).
    Computed once per file version in a process (a report reads the same checkpoints for several results)."""
    stat = os.stat(path)
    return _identity(os.path.realpath(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=None)
def _identity(path, mtime_ns, size):
    from ..checkpoint_safety import read_state, state_updates

    sha = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return {"updates": state_updates(read_state(path)), "sha1": sha.hexdigest()}


class WorkDir:
    """Paths under WORK, one command log per run, one commands file and one result file per step (steps may
    run as parallel processes)."""

    def __init__(self, work, quiet=False, threads=0):
        self.work, self.quiet, self.threads = os.path.abspath(work), quiet, threads

    def path(self, *parts):
        return os.path.join(self.work, *parts)

    def commands(self, step):
        path = self.path("commands", f"{step}.sh")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return f.read().splitlines()

    def record(self, step, line):
        """Append LINE to the commands of STEP (once), for the report."""
        os.makedirs(self.path("commands"), exist_ok=True)
        if line not in self.commands(step):
            with open(self.path("commands", f"{step}.sh"), "a") as f:
                f.write(line + "\n")

    def shown(self, cmd):
        """CMD as a user would type it: console scripts by name, paths relative to the work dir."""
        line = " ".join(shlex.quote(c) for c in cmd).replace(shlex.quote(sys.executable) + " ", "python ")
        return line.replace(BIN + "/", "").replace(self.work + "/", "").replace(REPO + "/", "")

    def env(self):
        env = dict(os.environ, PYTHONUNBUFFERED="1")  # the children's lines reach the log as they are printed
        if self.threads:
            env["OMP_NUM_THREADS"] = str(self.threads)
        return env

    def run(self, step, cmd, log):
        """Run CMD in WORK, logging to WORK/logs/LOG and echoing fairseq-train's progress; record it under STEP.
        Returns the output; a failure ends the recipe with the log's last lines."""
        line = self.shown(cmd)
        self.record(step, line)
        os.makedirs(self.path("logs"), exist_ok=True)
        log_path = self.path("logs", log)
        print(f"  $ {line[:300]}{' ...' if len(line) > 300 else ''}\n    (log: {log_path})", flush=True)
        with open(log_path, "w") as f:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env(),
                                    cwd=self.work, text=True, errors="replace")
            for out_line in proc.stdout:
                f.write(out_line)
                f.flush()
                short = None if self.quiet else progress_line(step, out_line)
                if short:
                    print(short, flush=True)
            proc.wait()
        with open(log_path) as f:
            out = f.read()
        if proc.returncode != 0:
            fail(f"step {step} failed (exit {proc.returncode}); last lines of {log_path}:\n{out[-3000:]}")
        return out

    def produced(self, output, inputs, produce):
        """PRODUCE() writes OUTPUT from the checkpoints INPUTS; it runs unless OUTPUT exists and was made from
        the same checkpoints (WORK/results/OUTPUT.inputs.json keeps their identity)."""
        stamp = self.path("results", output.replace("/", "_") + ".inputs.json")
        made_from = {p: checkpoint_identity(self.path(p)) for p in inputs}
        if os.path.exists(self.path(output)) and load_json(stamp) == made_from:
            return
        produce()
        os.makedirs(self.path("results"), exist_ok=True)
        save_json(stamp, made_from)

    def cached(self, key, inputs, compute, depends=None):
        """COMPUTE()'s result, kept in WORK/results/KEY.json together with what produced it (the identity of the
        checkpoints INPUTS and DEPENDS, e.g. decoding settings): recomputed when any of them changed."""
        path = self.path("results", key.replace("/", "_") + ".json")
        made_from = {"checkpoints": {p: checkpoint_identity(self.path(p)) for p in inputs}, "settings": depends}
        kept = load_json(path)
        if kept is not None and kept.get("produced_by") == made_from:
            return kept["result"]
        result = compute()
        os.makedirs(self.path("results"), exist_ok=True)
        save_json(path, {"produced_by": made_from, "result": result})
        return result

    def finished(self, save_dir, updates):
        """Whether a fairseq-train run in SAVE_DIR reached UPDATES (its last checkpoint says so), or stopped
        early there (fairseq's --patience; SAVE_DIR/stopped.json says so for that very checkpoint)."""
        from ..checkpoint_safety import read_state, state_updates

        last = self.path(save_dir, "checkpoint_last.pt")
        if not os.path.exists(last):
            return False
        done = state_updates(read_state(last)) or 0
        stopped = load_json(self.path(save_dir, "stopped.json"), {})
        return done >= updates or (stopped.get("early_stop", False) and stopped.get("updates") == done)
