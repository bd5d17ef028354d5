"""lab/gpu_study.sh's own logic, with a stand-in recipe that records its command lines (the real study runs in
tests/lab/test_gpu_study.py): each seed's process gets its own seed, work dir and {seed} in RECIPE_ARGS."""
import os
import subprocess

import pytest

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


def study_check(tmp_path, phases, recipe_args="--data-bin D", seeds="1 2"):
    """gpu_study.sh WORK_PREFIX SEEDS PHASES... in its check mode (CHECK_ONLY=1) with the stand-in recipe."""
    venv = tmp_path / "venv"
    if not venv.exists():
        stand_in_venv(tmp_path)
    env = dict(os.environ, VENV=str(venv), DEVICE="cpu", CHECK_ONLY="1", RECIPE_ARGS=recipe_args)
    return subprocess.run(["bash", SCRIPT, str(tmp_path / "W"), seeds, *phases], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("phases,wanted", [
    (["prepare,control"], "step control starts from the baseline model, which no earlier phase trains"),
    (["prepare", "control,l0drop"], "step control starts from the baseline model"),
    (["baseline,control"], "step control starts from the baseline model"),  # side by side: no baseline yet
    (["control", "baseline"], "step control starts from the baseline model"),
    (["baseline,simplified,composed"], "step composed starts from the simplified model"),
    (["prepare"], "the report compares with the baseline model, which no phase trains"),
    (["l0drop_scratch"], "the report compares with the baseline model"),
])
def test_the_check_refuses_steps_whose_start_model_no_earlier_phase_makes(tmp_path, phases, wanted):
    """Issue 62 item 3: the check mode approved `prepare,control`; on the GPU the control (and every method
    fine-tuned from the baseline) then failed after the install, and the report after it: a call spent for nothing.
    Now refused in one line, before any work, in the check mode as in a real call."""
    done = study_check(tmp_path, phases)
    assert done.returncode == 2 and wanted in done.stdout, done.stdout + done.stderr
    assert len(done.stdout.strip().splitlines()) == 1, done.stdout
    assert "in a phase before it" in done.stdout
    assert sorted(os.listdir(tmp_path)) == ["calls.txt", "venv"]  # no work dir made


@pytest.mark.parametrize("phases", [["baseline", "control,l0drop"], ["prepare", "baseline", "control"],
                                    ["baseline,simplified", "control,simplified_control,composed"],
                                    ["baseline,pattern_freq_scratch", "gap_analysis"]])
def test_the_check_approves_a_start_model_made_in_an_earlier_phase(tmp_path, phases):
    done = study_check(tmp_path, phases)
    assert done.returncode == 0 and "options, steps and inputs checked" in done.stdout, done.stdout + done.stderr


def test_a_carried_baseline_is_a_start(tmp_path):
    """--baseline-checkpoint in the options (each run's: {seed}), or each run's work dir holding the baseline of an
    earlier call (carried, or a call resumed on the warm machine): the fine-tunings need no baseline phase."""
    args = "--data-bin D --baseline-checkpoint carried/s{seed}_baseline.pt"
    assert study_check(tmp_path, ["control,l0drop"], args).returncode == 0
    for seed in ("1", "2@half"):
        (tmp_path / ("W1" if seed == "1" else "Whalf_s2") / "baseline").mkdir(parents=True)
    (tmp_path / "W1" / "baseline" / "checkpoint_best.pt").write_bytes(b"carried")
    done = study_check(tmp_path, ["control"], seeds="1 2@half")  # the second run's baseline is not there
    assert done.returncode == 2 and f"{tmp_path}/Whalf_s2/baseline/checkpoint_best.pt does not hold" in done.stdout, \
        done.stdout
    (tmp_path / "Whalf_s2" / "baseline" / "checkpoint_best.pt").write_bytes(b"carried")
    done = study_check(tmp_path, ["control"], seeds="1 2@half")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_scripts_start_models_are_the_recipes():
    """start_of in gpu_study.sh (which model a step is fine-tuned from) agrees with the recipe's METHODS."""
    from fairseq_sparse.recipe.methods import METHODS, STEPS

    with open(SCRIPT) as f:
        function = next(line for line in f if line.startswith("start_of()"))
    steps = [s for s in STEPS if s != "report"]
    done = subprocess.run(["bash", "-c", function + '\nfor s in "$@"; do echo "$s:$(start_of "$s")"; done', "-",
                           *steps], capture_output=True, text=True, check=True)
    got = dict(line.split(":") for line in done.stdout.splitlines())
    want = {s: "" for s in steps}
    want.update({m.name: m.start or "" for m in METHODS})
    want["distill_data"] = "baseline"  # it translates the training data with the baseline
    assert got == want
