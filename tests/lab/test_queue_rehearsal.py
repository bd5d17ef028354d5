"""A rehearsal of the queue's first two calls (lab/README.md), each run as the GPU machine runs it: in a copy of the
working tree as the device tool sends it (tracked files and untracked ones git does not ignore), with exactly the
paths its queue line carries (made by the commands its header gives, on tiny data), its queue line's command run by
a shell in that copy's root; on the CPU in the calls' plumbing mode (DEVICE=cpu AMP=, tiny sizes and budgets, one
seed). Issue 62: the queue's first entry had been stored without its run bit, which only a run by its path shows."""
import os
import re
import shutil
import subprocess
import sys
import tarfile

from conftest import REPO, console, run

SMALL = ["--bpe-merges", "60", "--device", "cpu", "--steps", "prepare", "--quiet"]
#: the plumbing mode's tiny sizes and budgets, one seed (each seed's runs are the same commands), and a CPU's time
TINY = {"UPDATES": "12", "POINTS": "12", "VALIDATE": "12", "WIDTH": "32", "HEADS": "2", "THREADS": "1", "SEEDS": "1",
        "SECONDS_LEFT": "1500", "EXTRA_ARGS": "--max-tokens 2000 --beam 2 --warmup-updates 4 --search fairseq"}


def queue(n):
    """The first N entries of lab/README.md's queue: (carried paths, command line)."""
    with open(os.path.join(REPO, "lab", "README.md")) as f:
        text = f.read().split("## The queue", 1)[1].split("\n## ", 1)[0]
    entries = re.findall(r"`run\(carry \[([^\]]*)\], timeout_s \d+\): ([^`]+)`", text)
    return [([c.strip().strip('"') for c in carried.split(",")], command) for carried, command in entries[:n]]


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
    """gpu_carry/ as h_merge_layers.sh's header makes it: the data-bin of all the pairs (its tok/ left behind) and
    the test sentences' segment types; an empty wheelhouse (the plumbing mode installs nothing)."""
    carry = root / "gpu_carry"
    run([console("fairseq-sparse-recipe"), "--corpus", str(raw_corpus), "-s", "en", "-t", "de", "--work-dir",
         str(carry / "DEC_f1")] + SMALL)
    shutil.rmtree(carry / "DEC_f1" / "tok")
    (carry / "test.segment_types").write_text("".join("synopsis\n" if i % 3 else "para0\n" for i in range(25)))
    (root / "wheelhouse").mkdir()
    return root


def test_the_queues_first_two_calls_run_as_the_gpu_machine_runs_them(raw_corpus, tmp_path):
    """Both calls at once (each its own copy of the tree and its own OUT), as two device calls would run apart."""
    made = carried_inputs(raw_corpus, tmp_path / "made")
    started = []
    for i, (carried, command) in enumerate(queue(2)):
        tree = tmp_path / f"device{i}"
        device_copy(tree)
        for path in carried:  # the carry list replaces those paths in the copy
            assert os.path.exists(made / path), f"queue entry {i}: carries {path}, which its header does not make"
            shutil.rmtree(tree / path, ignore_errors=True)
            shutil.copytree(made / path, tree / path) if os.path.isdir(made / path) else shutil.copy2(made / path, tree / path)
        out = tmp_path / f"out{i}"
        out.mkdir()
        env = {**os.environ, "VENV": os.path.dirname(os.path.dirname(sys.executable)), "DEVICE": "cpu", "AMP": "",
               "OUT": str(out), **TINY}
        started.append((command, out, subprocess.Popen(["bash", "-c", command], cwd=tree, env=env, text=True,
                                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
    outputs = [proc.communicate(timeout=900)[0] for _, _, proc in started]  # both ended before any assert
    for (command, out, proc), printed in zip(started, outputs):
        log = (out / "study.log").read_text() if (out / "study.log").exists() else ""
        assert proc.returncode == 0, (command, printed[-3000:] + log[-3000:])
        assert "exit 1" not in log and "exit 2" not in log, log[-3000:]
        with tarfile.open(out / "study.tgz") as t:
            packed = [n for n in t.getnames() if n.endswith("results.json")]
        assert len(packed) == 1, packed  # the seed's work dir, with its report
