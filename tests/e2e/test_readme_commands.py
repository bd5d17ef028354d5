"""README's "Train and decode" block, run as written on a tiny corpus: each command as README gives it, but for the
budgets (--max-update, --warmup-updates), a tiny model appended to every training, the CPU, and --user-dir (README's
commands run in the repository's root, these in a folder of their own); the L0Drop model
decodes with its shortened memory and the head-gated one is cut down and decoded."""
import os
import re
import shlex

from conftest import TINY_MODEL, USER_DIR, console, run
from helpers.cli import SPARSITY_RE
from helpers.manual import train_and_decode

BUDGETS = {"--max-update": "3", "--warmup-updates": "1", "--user-dir": USER_DIR}
TRAIN_HERE = TINY_MODEL + ["--cpu", "--num-workers", "0", "--no-progress-bar", "--seed", "1"]


def as_run_here(command):
    """COMMAND's argv with the tiny budgets, model, device and the plugin's path (README's own options otherwise)."""
    argv = shlex.split(command)
    for i, a in enumerate(argv[:-1]):
        if a in BUDGETS:
            argv[i + 1] = BUDGETS[a]
    if argv[0] == "fairseq-train":
        argv += TRAIN_HERE
    elif argv[0] == "fairseq-generate":
        argv += ["--cpu"]
    return [console(argv[0])] + argv[1:]


def test_readmes_train_and_decode_block_runs_as_written(corpus, tmp_path):
    lines = {"train": 300, "valid": 30, "test": 20}
    os.mkdir(tmp_path / "corpus")
    for split, n in lines.items():
        for ours, theirs in (("src", "en"), ("tgt", "de")):
            with open(os.path.join(corpus["raw"], f"{split}.{ours}")) as f:
                head = [next(f) for _ in range(n)]
            (tmp_path / "corpus" / f"{split}.{theirs}").write_text("".join(head))
    outputs = {}
    for command in train_and_decode():
        proc = run(as_run_here(command), cwd=str(tmp_path))
        outputs[command] = proc.stdout + proc.stderr
    decoded = [c for c in outputs if c.startswith("fairseq-generate")]
    assert len(decoded) == 2 and all(re.search(r"^H-0\t", outputs[c], re.M) for c in decoded)
    assert SPARSITY_RE.search(outputs[decoded[0]])  # the L0Drop model, decoded with pruned decoding
    assert (tmp_path / "gates" / "pruned.pt").exists()
