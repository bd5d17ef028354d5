"""lab/gpu_study.sh's own logic, with a stand-in recipe that records its command lines (the real study runs in
tests/lab/test_gpu_study.py): each seed's process gets its own seed, work dir and {seed} in RECIPE_ARGS."""
import os
import subprocess

from conftest import REPO

SCRIPT = os.path.join(REPO, "lab", "gpu_study.sh")


def stand_in_venv(tmp_path):
    """A VENV whose fairseq-sparse-recipe appends its arguments to calls.txt and whose python accepts the option
    check."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    calls = tmp_path / "calls.txt"
    (bin_dir / "fairseq-sparse-recipe").write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\n')
    (bin_dir / "python").write_text(f'#!/usr/bin/env bash\necho "check $*" >> {calls}\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return tmp_path / "venv", calls


def test_each_seed_gets_its_own_value_of_seed_in_the_recipe_options(tmp_path):
    venv, calls = stand_in_venv(tmp_path)
    env = dict(os.environ, VENV=str(venv), DEVICE="cpu",
               RECIPE_ARGS="--data-bin D --baseline-checkpoint carried/s{seed}_baseline.pt --finetune-updates 4")
    done = subprocess.run(["bash", SCRIPT, str(tmp_path / "W"), "1 2", "control,l0drop"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = calls.read_text().splitlines()
    check = [ln for ln in lines if ln.startswith("check ")]
    assert len(check) == 1 and "carried/s1_baseline.pt" in check[0] and "{seed}" not in check[0], check
    runs = [ln for ln in lines if not ln.startswith("check ")]
    assert len(runs) == 6, runs  # (control, l0drop) x 2 seeds, then the report per seed
    for ln in runs:
        seed = ln.split("--seed ")[1].split()[0]
        assert f"carried/s{seed}_baseline.pt" in ln and f"--work-dir {tmp_path}/W{seed}" in ln, ln
        assert "{seed}" not in ln
