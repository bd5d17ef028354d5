"""A console script run in this process, through its entry point: what a test reads of a console run (the exit
status, stdout with fairseq's log lines, stderr with Python's warnings and the traceback of an uncaught error)
without the start of a new interpreter, which costs about 4 s of CPU (importing torch and fairseq). On 2026-11-27 the
suite started about 160 console scripts (64 fairseq-train, 27 fairseq-generate, 26 recipe runs, the tools): 1,713 s
of CPU before they ran here, 1,199-1,220 s after. Each tool keeps one run through its real console script
(``run(..., console=True)`` in conftest.py)."""
import contextlib
import io
import logging
import os
import subprocess
import sys
import traceback
import warnings
from importlib.metadata import entry_points

# fairseq's console log format (fairseq_cli/train.py, generate.py: logging.basicConfig to stdout, level INFO)
LOG_FORMAT = logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s", "%Y-%m-%d %H:%M:%S")
# what a fresh interpreter ignores (Python's default warning filters); every other warning is shown once
IGNORED_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def entry_point(name):
    """The console_scripts entry point named ``name`` (None where no installed package has one)."""
    return next(iter(entry_points(group="console_scripts", name=name)), None)


def exit_status(code) -> int:
    """The exit status of ``SystemExit(code)``, as the interpreter sets it."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


@contextlib.contextmanager
def console_state(name, argv, cwd, env):
    """sys.argv, the working folder and the environment of a console run, and fairseq's log handler on the root
    logger at INFO, for the length of the run; the warnings it raises written to its stderr as they come, under a fresh
    interpreter's filters."""
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(LOG_FORMAT)
    root = logging.getLogger()
    saved = sys.argv, os.getcwd(), dict(os.environ), root.level
    with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: err.write(
            warnings.formatwarning(message, category, filename, lineno, line))
        warnings.resetwarnings()
        warnings.simplefilter("default")
        for category in IGNORED_WARNINGS:
            warnings.simplefilter("ignore", category)
        sys.argv = [name] + list(argv)
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        if cwd is not None:
            os.chdir(cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        try:
            yield out, err
        finally:
            root.removeHandler(handler)
            sys.argv, cwd_before, env_before, level = saved
            root.setLevel(level)
            os.chdir(cwd_before)
            os.environ.clear()
            os.environ.update(env_before)


def forget_fairseq_best():
    """fairseq-train keeps the best validation loss of the process on two functions (``save_checkpoint.best``, which
    decides whether checkpoint_best.pt is written, and ``should_stop_early.best`` / ``.num_runs`` for --patience):
    a new interpreter starts without them, so a run in this process must too."""
    from fairseq import checkpoint_utils
    from fairseq_cli import train

    for function, names in ((checkpoint_utils.save_checkpoint, ("best",)),
                            (train.should_stop_early, ("best", "num_runs"))):
        for name in names:
            if hasattr(function, name):
                delattr(function, name)


@contextlib.contextmanager
def one_process_of_decoding_stats():
    """The L0Drop sparsity line of what fairseq's generators decoded, which a console script logs when its process
    ends (``DECODING_STATS``, models/l0drop_encoder.py), logged at the end of the run instead; the counts of what
    decoded in this process before are set aside and restored."""
    from fairseq_sparse.models.l0drop_encoder import DECODING_STATS, DecodingStats

    before = dict(vars(DECODING_STATS))
    counts = {k: v for k, v in vars(DecodingStats()).items() if k not in ("registered", "blocks")}  # exit report as it was
    vars(DECODING_STATS).update(counts)
    try:
        yield
    finally:
        DECODING_STATS.report()
        vars(DECODING_STATS).update(before)


def run_in_process(cmd, cwd=None, env=None) -> subprocess.CompletedProcess:
    """``cmd`` (a console script's path, then its arguments) run through the script's entry point here."""
    name = os.path.basename(cmd[0])
    found = entry_point(name)
    if found is None:
        raise LookupError(f"no console script {name!r} is installed")
    main = found.load()
    status = 0
    forget_fairseq_best()
    with console_state(name, cmd[1:], cwd, env) as (out, err), one_process_of_decoding_stats():
        try:
            main()
        except SystemExit as e:
            status = exit_status(e.code)
            if isinstance(e.code, str):
                err.write(e.code + "\n")
        except Exception:  # the interpreter prints the traceback and exits with status 1
            err.write(traceback.format_exc())
            status = 1
    return subprocess.CompletedProcess(list(cmd), status, out.getvalue(), err.getvalue())
