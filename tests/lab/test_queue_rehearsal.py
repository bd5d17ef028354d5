"""A rehearsal of the queue's first two calls (lab/README.md), each run as the GPU machine runs it: in a copy of the
working tree as the device tool sends it (tracked files and untracked ones git does not ignore), with exactly the
paths its queue line carries (made by the commands its header gives, on tiny data), its queue line's command run by
a shell in that copy's root; on the CPU in the calls' plumbing mode (DEVICE=cpu AMP=, tiny sizes and budgets, one
seed, one run). The queue's lines up to its second call are rehearsed: a line that runs a call an earlier line ran
in full (the same script, other settings) runs in CHECK_ONLY mode, its command and carry list as written. Issue 62:
the queue's first entry had been stored without its run bit, which only a run by its path shows."""
import json
import os
import shutil
import subprocess
import sys
import tarfile

from conftest import REPO, console, run
from helpers.lab import queue

SMALL = ["--bpe-merges", "60", "--device", "cpu", "--steps", "prepare", "--quiet"]
#: the plumbing mode's tiny sizes and budgets (two budget points; in f_decisive.sh's run, half the pairs, the last
#: falls at an epoch's end, where fairseq saves no interval checkpoint), one seed and one run (each seed's runs are
#: the same commands; f_decisive.sh's RUNS: half the pairs, a run with a tag), and a CPU's time
TINY = {"UPDATES": "20", "POINTS": "10,20", "VALIDATE": "10", "WIDTH": "32", "HEADS": "2", "THREADS": "1",
        "SEEDS": "1", "RUNS": "1@0.5", "SECONDS_LEFT": "1500",
        "EXTRA_ARGS": "--max-tokens 2000 --beam 2 --warmup-updates 4 --search fairseq"}


def device_copy(dest):
    """What the device tool sends: tracked files and untracked files git does not ignore, with their modes."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = os.path.join(REPO, name)
        if os.path.isfile(source):  # a file deleted from the working tree is not sent
            os.makedirs(os.path.join(dest, os.path.dirname(name)), exist_ok=True)
            shutil.copy2(source, os.path.join(dest, name))


def carried_inputs(raw_corpus, root):
    """gpu_carry/ as the calls' headers make it: the data-bins of all, half and a quarter of the pairs (one
    dictionary; their tok/ left behind) and the test sentences' segment types; an empty wheelhouse (the plumbing mode
    installs nothing)."""
    carry = root / "gpu_carry"
    for fraction in ("1", "0.5", "0.25"):
        run([console("fairseq-sparse-recipe"), "--corpus", str(raw_corpus), "-s", "en", "-t", "de", "--train-fraction",
             fraction, "--work-dir", str(carry / f"DEC_f{fraction}")] + SMALL)
        shutil.rmtree(carry / f"DEC_f{fraction}" / "tok")
    (carry / "test.segment_types").write_text("".join("synopsis\n" if i % 3 else "para0\n" for i in range(25)))
    (root / "wheelhouse").mkdir()
    return root


def test_the_queues_first_two_calls_run_as_the_gpu_machine_runs_them(raw_corpus, tmp_path):
    """Every line at once (each its own copy of the tree and its own OUT), as device calls would run apart."""
    made = carried_inputs(raw_corpus, tmp_path / "made")
    started, rehearsed = [], set()
    lines = queue(2)
    assert len({script for _, _, script, _ in lines}) == 2, lines
    for i, (carried, command, script, _) in enumerate(lines):
        tree = tmp_path / f"device{i}"
        device_copy(tree)
        for path in carried:  # the carry list replaces those paths in the copy
            assert os.path.exists(made / path), f"queue line {i}: carries {path}, which its header does not make"
            shutil.rmtree(tree / path, ignore_errors=True)
            shutil.copytree(made / path, tree / path) if os.path.isdir(made / path) else shutil.copy2(made / path, tree / path)
        out = tmp_path / f"out{i}"
        out.mkdir()
        env = {**os.environ, "VENV": os.path.dirname(os.path.dirname(sys.executable)), "DEVICE": "cpu", "AMP": "",
               "OUT": str(out), **TINY, **({"CHECK_ONLY": "1"} if script in rehearsed else {})}
        started.append((command, out, env.get("CHECK_ONLY"), subprocess.Popen(
            ["bash", "-c", command], cwd=tree, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
        rehearsed.add(script)
    outputs = [proc.communicate(timeout=900)[0] for *_, proc in started]  # all ended before any assert
    for (command, out, check_only, proc), printed in zip(started, outputs):
        log = (out / "study.log").read_text() if (out / "study.log").exists() else ""
        assert proc.returncode == 0, (command, printed[-3000:] + log[-3000:])
        if check_only:
            assert "options, steps and inputs checked" in printed and not os.listdir(out), (command, printed[-3000:])
            continue
        assert "exit 1" not in log and "exit 2" not in log, log[-3000:]
        with tarfile.open(out / "study.tgz") as t:
            packed = [n for n in t.getnames() if n.endswith("results.json")]
            assert len(packed) == 1, packed  # the seed's (the run's) work dir, with its report
            results = json.load(t.extractfile(packed[0]))
        assert results["budget"] and results["gap_analysis"], sorted(results)
        for model, points in results["budget"].items():  # both points, each decoded
            assert [p["updates"] for p in points] == [10, 20], (model, points)
