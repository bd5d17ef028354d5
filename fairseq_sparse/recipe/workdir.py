"""The recipe's work dir: runs commands (logged, their progress echoed, recorded for the report), keeps results
keyed by what produced them, and knows which trainings are finished."""
import fcntl
import functools
import hashlib
import json
import os
import shlex
import subprocess
import sys

from .options import fail
from .paths import BIN, REPO


def load_json(path, default=None):
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


def save_json(path, obj):
    """Write atomically: a killed run leaves the old file or the new one, never half of one (runs side by side
    that write the same file each write their own temporary file)."""
    tmp = f"{path}.{os.getpid()}.tmp"
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

    return {"updates": state_updates(read_state(path)), "sha1": file_identity(path)}


def command_options(line):
    """{option: value} of a command line as WorkDir.shown writes it: the positional arguments under "args", an
    option without a value as True (what a trained model's key compares)."""
    words, options, name = shlex.split(line), {"args": []}, None
    for w in words[1:]:
        if w.startswith("--") or (w.startswith("-") and len(w) == 2 and not w[1].isdigit()):
            name = w
            options[name] = True
        elif name is None:
            options["args"].append(w)
        else:
            options[name] = w if options[name] is True else f"{options[name]} {w}"
            name = None
    return options


def key_changes(kept, now):
    """'NAME KEPT (this run: NOW)' for every entry of two keys that differs."""
    names = sorted(set(kept) | set(now), key=str)
    return [f"{n} {kept.get(n, '(none)')} (this run: {now.get(n, '(none)')})" for n in names
            if kept.get(n) != now.get(n)]


def file_identity(path):
    """The sha1 of a file's content (the corpus, a dictionary): what a product made from it depends on."""
    sha = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def keep_earlier(path):
    """PATH, after an earlier run's file there is moved to PATH.1 (or .2, ...): an interrupted run's log is kept."""
    if os.path.exists(path):
        n = 1
        while os.path.exists(f"{path}.{n}"):
            n += 1
        os.replace(path, f"{path}.{n}")
    return path


def stop(proc, grace=10):
    """End PROC if it still runs: SIGTERM, then SIGKILL after GRACE seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class StepLock:
    """One recipe run per step of a work dir (steps run side by side as separate runs). WORK/locks/STEP.lock is
    held with flock(2) by the run and, through the inherited descriptor, by every command it starts: a recipe
    killed with SIGKILL leaves its training running, and the lock stays held until that training ends too. The
    file names the run's pid and its commands' pids for the message; a file nobody holds is a stale lock, taken
    over (whatever pid it names)."""

    def __init__(self, wd, steps):
        self.wd, self.paths = wd, [wd.path("locks", f"{s}.lock") for s in steps]
        os.makedirs(wd.path("locks"), exist_ok=True)
        self.taken = {}  # path -> fd

    def __enter__(self):
        for path in self.paths:
            fd = self._take(path)
            if fd is None:
                self.__exit__()
                step = os.path.basename(path)[:-len(".lock")]
                fail(f"step {step} of {os.path.dirname(os.path.dirname(path))}: {_holder(path)} holds {path}; "
                     "wait for it, or stop it")
            self.taken[path] = fd
        self.wd.lock_fds = tuple(self.taken.values())
        return self

    @staticmethod
    def _take(path):
        """The locked descriptor of PATH (made if absent, the pid written), or None when another process holds it."""
        while True:
            fd = os.open(path, os.O_CREAT | os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # its holder removed the file between our open and our lock: take the new one
                os.close(fd)
                continue
            stale = os.read(fd, 200).decode(errors="replace").split()
            if stale:
                print(f"  step {os.path.basename(path)[:-len('.lock')]}: a stale lock of a run that is gone "
                      f"(pid {stale[0]}) taken over")
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd

    def __exit__(self, *exc):
        for path, fd in self.taken.items():
            os.remove(path)  # removed while held: a run waiting on the old file sees it gone and retries
            os.close(fd)
        self.taken = {}
        self.wd.lock_fds = ()


def note_command(fds, pid):
    """Add the pid of a command the run started to its lock files (open descriptors FDS), for the message."""
    for fd in fds:
        os.write(fd, f"{pid}\n".encode())


def _holder(path):
    """Who holds the lock PATH, in words: the recipe run, or the commands a killed run left running."""
    try:
        with open(path) as f:
            pids = [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        pids = []
    if not pids:
        return "another process"
    if _running(pids[0]):
        return f"another recipe run (pid {pids[0]})"
    left = [p for p in pids[1:] if _running(p)] or pids[1:]
    return (f"a command of a recipe run that was killed (pid {', '.join(map(str, left))}; the run was pid "
            f"{pids[0]})")


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WorkDir:
    """Paths under WORK, one command log per run, one commands file and one result file per step (steps may
    run as parallel processes)."""

    def __init__(self, work, quiet=False, threads=0):
        self.work, self.quiet, self.threads = os.path.abspath(work), quiet, threads
        self.lock_fds = ()  # the descriptors of the step locks held (StepLock): every command inherits them

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
        log_path = keep_earlier(self.path("logs", log))
        print(f"  $ {line[:300]}{' ...' if len(line) > 300 else ''}\n    (log: {log_path})", flush=True)
        with open(log_path, "w") as f:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env(),
                                    cwd=self.work, text=True, errors="replace", pass_fds=self.lock_fds)
            note_command(self.lock_fds, proc.pid)
            try:
                for out_line in proc.stdout:
                    f.write(out_line)
                    f.flush()
                    short = None if self.quiet else progress_line(step, out_line)
                    if short:
                        print(short, flush=True)
                proc.wait()
            finally:  # the recipe stopped (a signal, Ctrl-C): its command stops too, not left training alone
                stop(proc)
        with open(log_path) as f:
            out = f.read()
        if proc.returncode != 0:
            fail(f"step {step} failed (exit {proc.returncode}); last lines of {log_path}:\n{out[-3000:]}")
        return out

    def keep_key(self, key_file, key, product, remedy, exists=True, keep=True):
        """Refuse to reuse PRODUCT (the prepared data, a trained model) when the KEY it was made with (KEY_FILE,
        relative to WORK: the options and inputs that produced it) differs from this run's: one line naming every
        difference and REMEDY. Where the product does not exist (EXISTS false) or has no key yet, this run's key
        is kept (unless KEEP is false: a check before any work writes nothing)."""
        path = self.path(key_file)
        kept = load_json(path) if exists else None
        if kept is not None and kept != key:
            fail(f"{product} in {self.work} was made with {'; '.join(key_changes(kept, key))}: {remedy}")
        if kept is None and keep:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            save_json(path, key)

    def produced(self, output, inputs, produce, settings=None):
        """PRODUCE() writes OUTPUT from the checkpoints INPUTS; it runs unless OUTPUT exists and was made from
        the same checkpoints and SETTINGS, e.g. its command lines (WORK/results/OUTPUT.inputs.json keeps them);
        a remade output says why."""
        stamp = self.path("results", output.replace("/", "_") + ".inputs.json")
        made_from = {p: checkpoint_identity(self.path(p)) for p in inputs}
        if settings is not None:
            made_from = {"checkpoints": made_from, "settings": settings}
        kept = load_json(stamp)
        if os.path.exists(self.path(output)) and kept == made_from:
            return
        if os.path.exists(self.path(output)) and kept is not None:
            print(f"  {output}: made again ({'its settings' if kept.get('settings') != settings else 'its input'} "
                  "changed)")
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
