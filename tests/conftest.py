"""Shared fixtures: a tiny synthetic corpus binarised with fairseq-preprocess, and small checkpoints
trained with the real fairseq-train console script (session-scoped, built once per test run, shared by the
pytest-xdist workers); the ``cuda`` marker: such tests skip, with the reason, where torch sees no CUDA device."""
import os
import shutil
import subprocess
import sys

# One thread in the tests and in every console script they start, set before torch is imported: the tiny models
# gain nothing from a second thread, and where two threads share a core with other work (scripts/test.sh runs one
# pytest-xdist process per core) they spin waiting for each other: the session's 400-update tiny-model training
# had used 441 s of CPU time with two threads beside other jobs and was not done; 100 updates of it take 22 s with one.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from filelock import FileLock  # noqa: E402  (a dependency of torch)

from fairseq_sparse.recipe.commands import model_flags  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(REPO, "fairseq_sparse")
BIN = os.path.dirname(sys.executable)  # console scripts of the venv that runs the tests
# tests/unit holds pure tests, tests/e2e console scripts and training; what test files share is in tests/helpers/ (a
# package beside this file: pytest puts this folder on sys.path, so `from helpers.cli import train`), its asserts
# rewritten as a test file's are (the helpers assert too); no test file imports another (tests/unit/test_test_layout.py)
pytest.register_assert_rewrite("helpers")

# a model small enough to train in seconds on 2 CPU cores
TINY_MODEL = model_flags(layers=2, embed_dim=64, ffn_dim=128, heads=4, dropout=0.1)
TRAIN_COMMON = [
    "--optimizer", "adam", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100",
    "--max-tokens", "3000", "--log-interval", "50", "--no-epoch-checkpoints", "--cpu", "--seed", "1",
    "--no-progress-bar", "--num-workers", "0",
]


# the CPU, and CUDA as a parameter marked cuda (skipped without a GPU): @pytest.mark.parametrize("device", DEVICES)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def cuda_skip_reason():
    """Why the cuda-marked tests skip here, or None where torch sees a CUDA device."""
    import torch

    if torch.cuda.is_available():
        return None
    return f"needs a CUDA device: torch {torch.__version__} sees none (torch.cuda.is_available() is False)"


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device; skipped, with the reason, where torch sees none")


# The costliest product test files run first, the rest in collection order (tests/lab, the machinery of the project's
# own GPU runs, after tests/e2e): scripts/test.sh hands out whole files to the pytest-xdist workers in this order
# (--no-loadscope-reorder: pytest-xdist 3.x otherwise hands out the files with the most tests first, and the
# end-to-end recipe, one long test, went last and kept one worker busy alone). A worker is handed its next file when
# two tests of its files are left. CPU seconds per file (TEST_CPU_LOG, the console scripts in this process): the
# recipe variants 248-283, the end-to-end recipe 205-230, test_cli 148-160 (it builds the shared stock and L0Drop
# checkpoints); the rest fills in.
FIRST = [os.path.join("e2e", "test_recipe_variants.py"), os.path.join("e2e", "test_recipe.py"),
         os.path.join("e2e", "test_cli.py")]


def run_order(item) -> int:
    path = str(item.path)
    return next((i for i, name in enumerate(FIRST) if path.endswith(name)), len(FIRST))


def pytest_collection_modifyitems(config, items):
    reason = cuda_skip_reason()
    if reason:
        for item in items:
            if item.get_closest_marker("cuda"):
                item.add_marker(pytest.mark.skip(reason=reason))
    items.sort(key=run_order)  # stable: the rest keep their order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With TEST_CPU_LOG=PATH, each test's CPU seconds (this process and the console scripts it waited for,
    fixture set-up included) and wall seconds go to PATH.<worker> as `cpu wall nodeid` lines: CPU time, unlike
    pytest's --durations, does not grow when other jobs share the cores."""
    log = os.environ.get("TEST_CPU_LOG")
    if not log:
        yield
        return
    before = os.times()
    yield
    after = os.times()
    cpu = sum(getattr(after, f) - getattr(before, f) for f in ("user", "system", "children_user", "children_system"))
    with open(f"{log}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}", "a") as out:
        out.write(f"{cpu:.2f} {after.elapsed - before.elapsed:.2f} {item.nodeid}\n")


def pytest_runtest_logreport(report):
    """A cuda-marked test's failure is printed with its traceback as it happens, not only in the end-of-run summary:
    a GPU run stopped by its time limit (lab/gpu_checks.sh, the device tool) still says why (2026-11-26: six
    in-process failures came back as bare FAILED lines)."""
    if report.failed and "cuda" in report.keywords:
        sys.stderr.write(f"\n--- {report.nodeid} failed ({report.when}):\n{report.longreprtext[-4000:]}\n")
        sys.stderr.flush()


def console(name):
    return os.path.join(BIN, name)


def run(cmd, cwd=None, check=True, console=False, env=None, input=None):
    """Run a console script, through its entry point in this process (helpers/console.py) unless ``console`` asks
    for a new interpreter (one such run per tool: the real console script starts), the script reads ``input`` on
    stdin or is not one of this environment's console scripts (python, a script by path); on failure show its
    output."""
    from helpers.console import entry_point, run_in_process

    if console or input is not None or os.path.dirname(cmd[0]) != BIN or not entry_point(os.path.basename(cmd[0])):
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, input=input)
    else:
        proc = run_in_process(cmd, cwd=cwd, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def refused_in_process(main, argv, capsys, status=2) -> str:
    """A tool's ``main(argv)`` run in this process on bad input: it must exit with ``status`` (None: any but 0);
    returns what it printed to stderr. A refusal is cheap to check here (a console script's start, importing torch
    and fairseq, costs ~4 s of CPU); each tool keeps at least one refusal run through its console script."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    code, err = e.value.code, capsys.readouterr().err
    if isinstance(code, str):  # SystemExit("message"): the interpreter prints the message, exit status 1
        code, err = 1, err + code
    assert code not in (0, None) and (status is None or code == status), code
    return err


def fairseq_train(data_bin, save_dir, extra, max_update, console=False):
    """fairseq-train on TRAIN_COMMON; the session's checkpoints come from the real console script (its smoke run)."""
    cmd = [BIN + "/fairseq-train", data_bin, "--user-dir", USER_DIR, "--save-dir", save_dir,
           "--max-update", str(max_update)] + TRAIN_COMMON + extra
    return run(cmd, console=console)


def built_once(tmp_path_factory, name, build):
    """A session fixture's folder, ``build(folder)`` run once per test run: under pytest-xdist the first worker to
    ask builds it, holding a lock, and the others wait for it and reuse it (pytest-xdist's documented pattern)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        folder = tmp_path_factory.mktemp(name)
        build(str(folder))
        return str(folder)
    folder = tmp_path_factory.getbasetemp().parent / name
    with FileLock(f"{folder}.lock"):
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(str(folder))
            (folder / ".built").touch()
    return str(folder)


def _make_corpus(root):
    from fairseq_sparse.synthetic_corpus import make_corpus

    raw = make_corpus(os.path.join(root, "raw"), train=4000, valid=100, test=60, min_len=2, max_len=12)
    run([console("fairseq-preprocess"), "--source-lang", "src", "--target-lang", "tgt",
         "--trainpref", f"{raw}/train", "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test",
         "--destdir", os.path.join(root, "bin"), "--joined-dictionary", "--workers", "1"], console=True)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """dict(raw=..., bin=...): synthetic en-like -> de-like corpus, binarised with a joined dictionary."""
    root = built_once(tmp_path_factory, "corpus", _make_corpus)
    return {"raw": os.path.join(root, "raw"), "bin": os.path.join(root, "bin"), "root": root}


@pytest.fixture(scope="session")
def stock_transformer_ckpt(corpus, tmp_path_factory):
    """A stock fairseq `transformer` trained briefly (the converged model of the paper's recipe)."""
    save = built_once(tmp_path_factory, "stock", lambda save: fairseq_train(
        corpus["bin"], save, ["--arch", "transformer", "--criterion", "label_smoothed_cross_entropy",
                              "--label-smoothing", "0.1"] + TINY_MODEL, max_update=400, console=True))
    return os.path.join(save, "checkpoint_last.pt")


@pytest.fixture(scope="session")
def l0drop_ckpt(corpus, stock_transformer_ckpt, tmp_path_factory):
    """transformer_l0drop fine-tuned from the stock checkpoint (paper 000's recipe), with real sparsity."""
    save = built_once(tmp_path_factory, "l0drop", lambda save: fairseq_train(corpus["bin"], save, [
        "--arch", "transformer_l0drop", "--criterion", "label_smoothed_cross_entropy_with_sparsity",
        "--label-smoothing", "0.1", "--l0drop-lambda", "1.0", "--finetune-from-model", stock_transformer_ckpt,
        # gates start fully open (log alpha = 3); Adam moves them about lr per update, so a short
        # fine-tuning needs a larger step than the paper's 50k updates do. With this under-trained
        # tiny model lambda 0.3 closes no gate in 200 updates; 1.0 prunes about half the states.
        "--lr", "5e-3", "--warmup-updates", "30",
    ] + TINY_MODEL, max_update=200, console=True))
    return os.path.join(save, "checkpoint_last.pt")


@pytest.fixture(scope="module")
def raw_corpus(tmp_path_factory):
    """The synthetic corpus with language-code suffixes (en/de), as a user's raw corpus folder."""
    from fairseq_sparse.synthetic_corpus import make_corpus

    root = tmp_path_factory.mktemp("recipe_corpus")
    syn = make_corpus(str(root / "syn"), train=500, valid=30, test=25, min_len=2, max_len=10)
    raw = root / "raw"
    raw.mkdir()
    for split in ("train", "valid", "test"):
        shutil.copy(os.path.join(syn, f"{split}.src"), raw / f"{split}.en")
        shutil.copy(os.path.join(syn, f"{split}.tgt"), raw / f"{split}.de")
    shutil.copy(os.path.join(syn, "test.align"), raw / "test.align")
    return raw
