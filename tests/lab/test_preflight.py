"""lab/preflight.py (issue 53): every prepared device call fits what the device tool allows (what travels, what comes
back, its time with a margin or a resume command, a fallback), and a call whose inputs are missing stops before the
install; the queue in lab/README.md runs exactly these calls, each with its script's own run line."""
import glob
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO
from helpers.lab import queue

sys.path.insert(0, os.path.join(REPO, "lab"))
import preflight  # noqa: E402

CALLS = sorted(c for c in glob.glob(os.path.join(REPO, "lab", "calls", "*.sh")) if not c.endswith("common.sh"))


@pytest.mark.parametrize("call", CALLS, ids=os.path.basename)
def test_every_prepared_call_passes_its_preflight(call):
    problems, lines = preflight.check(call)
    assert problems == [], "\n".join(problems + lines)


# carried paths that exist nowhere, so the declared sizes are the ones checked (a wheelhouse built here is measured)
GOOD = """#@ run gpu_carry/not_made/wheels gpu_carry/X/data-bin -- lab/calls/x.sh
#@ carry gpu_carry/not_made/wheels 30
#@ carry gpu_carry/X/data-bin 5
#@ input gpu_carry/X/data-bin/dict.en.txt
#@ returns study.tgz 3
#@ plan install 80 measured
#@ plan train 300 measured
#@ fallback SEARCH=fairseq lab/calls/x.sh
"""


@pytest.mark.parametrize("change, problem", [
    ("", None),
    ("#@ carry gpu_carry/Y 40\n", "the run carries"),
    (None, "would travel, over the 64 MiB"),
    ("".join(f"#@ returns f{i} 1\n" for i in range(8)), "9 files would come back, over 8"),
    ("#@ returns model.pt 17\n", "model.pt (17.0 MiB) is over the 16 MiB"),
    ("#@ input gpu_carry/Z/dict.txt\n", "input gpu_carry/Z/dict.txt is under no carried path"),
    ("#@ plan decode 150 measured\n", "margin and no '#@ resume' command"),
    # malformed declarations: one line each, no traceback
    ("#@ returns model.pt\n", "'#@ returns model.pt' is not '#@ returns PATH MIB'"),
    ("#@ returns model.pt nan\n", "is not '#@ returns PATH MIB'"),
    ("#@ plan decode soon measured\n", "'#@ plan decode soon measured' is not '#@ plan STAGE SECONDS BASIS'"),
    # issue 62 item 9: a duplicate carry line, a plan of many calls beside a resume line
    ("#@ carry gpu_carry/X/data-bin 5\n", "'#@ carry gpu_carry/X/data-bin' is declared twice"),
    ("#@ plan decode 4840 measured\n#@ resume lab/calls/x.sh\n", "the plan takes 5220 s, over the 555 s"),
])
def test_each_limit_is_checked(tmp_path, change, problem):
    text = (GOOD.replace("#@ carry gpu_carry/not_made/wheels 30", "#@ carry gpu_carry/not_made/wheels 70")
            if change is None else GOOD + change)
    call = tmp_path / "x.sh"
    call.write_text(text)
    problems, _ = preflight.check(str(call), tree=3.0)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_no_fallback_and_no_plan_are_problems(tmp_path):
    call = tmp_path / "x.sh"
    call.write_text("\n".join(line for line in GOOD.splitlines() if not line.startswith(("#@ plan", "#@ fallback"))))
    problems, _ = preflight.check(str(call), tree=3.0)
    assert any("no '#@ plan' lines" in p for p in problems) and any("no '#@ fallback'" in p for p in problems)


def test_missing_inputs_stop_a_call_before_its_install(tmp_path):
    """On the device: the call's first act; CARRY renames gpu_carry/, $CORPUS comes from the run line or the
    environment."""
    call = tmp_path / "x.sh"
    call.write_text(GOOD.replace("gpu_carry/X", "gpu_carry/sum_$CORPUS").replace("-- lab", "-- CORPUS=a lab"))
    (tmp_path / "carry" / "sum_a" / "data-bin").mkdir(parents=True)
    env = {**os.environ, "CARRY": str(tmp_path / "carry")}
    done = subprocess.run([sys.executable, os.path.join(REPO, "lab", "preflight.py"), "--inputs", str(call)],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 1 and f"reads {tmp_path}/carry/sum_a/data-bin/dict.en.txt, which is missing" in done.stderr
    (tmp_path / "carry" / "sum_a" / "data-bin" / "dict.en.txt").write_text("a 1\n")
    assert subprocess.run([sys.executable, os.path.join(REPO, "lab", "preflight.py"), "--inputs", str(call)],
                          env=env).returncode == 0
    done = subprocess.run([sys.executable, os.path.join(REPO, "lab", "preflight.py"), "--inputs", str(call)],
                          capture_output=True, text=True, env={**env, "CORPUS": "b"})
    assert done.returncode == 1 and "sum_b" in done.stderr


def test_the_queue_runs_every_prepared_call_with_its_own_run_line():
    """lab/README.md's queue: each call once, in order, with the exact run line its script declares."""
    entries = queue()
    assert entries, "no run(...) entries in the queue"
    for carried, command, script, timeout in entries:
        assert timeout == 600, (script, timeout)
        d = preflight.declarations(os.path.join(REPO, script))
        carry, _, cmd = d["run"][0].partition(" -- ")
        settings = dict(w.split("=", 1) for w in command.split() if re.match(r"^[A-Z_]+=", w))
        carry = preflight.expand(carry, preflight.call_env(d, settings)).split()
        bare = [w for w in command.split() if not re.match(r"^[A-Z_]+=", w)]
        assert carried == carry, (script, carried, carry)
        assert bare == [w for w in cmd.split() if not re.match(r"^[A-Z_]+=", w)], (script, command, cmd)
    assert sorted({script for *_, script, _ in entries}) == sorted(os.path.relpath(c, REPO) for c in CALLS)


def test_every_call_and_the_scripts_it_runs_carry_their_run_bit():
    """The device runs a call by its path: f_decisive.sh, stored without its run bit, failed there with exit 126."""
    for path in CALLS + [os.path.join(REPO, "lab", name) for name in ("gpu_study.sh", "gpu_checks.sh")]:
        assert os.access(path, os.X_OK), f"{os.path.relpath(path, REPO)} is not executable (git update-index --chmod=+x)"
    listed = subprocess.run(["git", "ls-files", "-s", "lab"], cwd=REPO, capture_output=True, text=True).stdout
    modes = {line.split("\t")[1]: line.split()[0] for line in listed.splitlines()}
    for path in CALLS:
        rel = os.path.relpath(path, REPO)
        assert modes.get(rel, "100755") == "100755", f"{rel} is committed without its run bit"


def test_a_run_line_without_a_command_a_non_utf8_script_and_a_dangling_link_are_one_line(tmp_path):
    """Issue 62 item 9: these passed, or ended in raw tracebacks."""
    call = tmp_path / "x.sh"
    call.write_text(GOOD.replace(" -- lab/calls/x.sh", " --"))
    problems, _ = preflight.check(str(call), tree=3.0)
    assert any("with a command" in p for p in problems)
    call.write_bytes(GOOD.encode() + b"# caf\xe9\n")
    done = subprocess.run([sys.executable, os.path.join(REPO, "lab", "preflight.py"), str(call)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "not a readable UTF-8 call script" in done.stderr and "Traceback" not in done.stderr
    folder = tmp_path / "carried"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"x" * 1024)
    os.symlink(tmp_path / "gone", folder / "link")
    assert preflight.size_mib(str(folder)) == 1024 / (1 << 20)
