"""lab/gpu_checks.sh on a machine without a GPU: the report packed for the device tool after every stage, and a
stage stopped at its LIMIT_<STAGE> while the report still comes back (what a 15-minute GPU loan depends on)."""
import os
import subprocess
import sys
import tarfile

from conftest import REPO


def test_stages_pack_the_report_and_stop_at_their_limits(tmp_path):
    out, report = tmp_path / "out", tmp_path / "report"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), GPU_REPORT=str(report), GPU_VENV=sys.prefix, BENCH="l0drop_b64",
               LIMIT_BENCH="1")
    proc = subprocess.run(["bash", os.path.join(REPO, "lab", "gpu_checks.sh"), "tests", "bench"], env=env,
                          capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    summary = (out / "summary.txt").read_text()
    assert "tests: " in summary and "skipped" in summary, summary  # the CUDA tests, skipped here
    assert "bench: exit 124 (stopped at its limit, 1 s)" in summary, summary
    with tarfile.open(out / "report.tgz") as archive:
        names = {os.path.normpath(n) for n in archive.getnames()}
    assert {"summary.txt", "pytest.txt", "device.json", "gpu_checks.log"} <= names, names
    assert sorted(os.listdir(out)) == ["report.tgz", "summary.txt"]  # at most 8 files come back from $OUT


def test_bad_limit_or_benchmark_name_refused_before_any_work(tmp_path):
    for bad, message in (({"LIMIT_TESTS": "ten"}, "LIMIT_TESTS must be whole seconds > 0"),
                         ({"BENCH": "l0drop_b32"}, "BENCH names no run 'l0drop_b32'"),
                         ({"BENCH": "fixed_b32"}, "BENCH names no run 'fixed_b32'"),
                         ({"TESTS": "tests/unit/test_nothing.py"}, "TESTS names no test path")):
        report = tmp_path / "report"
        env = dict(os.environ, GPU_REPORT=str(report), GPU_VENV=sys.prefix, **bad)
        proc = subprocess.run(["bash", os.path.join(REPO, "lab", "gpu_checks.sh"), "tests", "bench"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and message in proc.stdout + proc.stderr, proc.stdout + proc.stderr
        assert not report.exists()  # nothing written
