"""Every Python script of lab/ and of reports/*/ at least imports (issue 54): a moved module or a renamed helper
shows here, not when a report's script is next run. One process imports them all, each from its own folder, with
__name__ not "__main__" (nothing runs)."""
import glob
import os
import subprocess
import sys

from conftest import REPO

IMPORT_ALL = r"""
import importlib.util, os, sys, traceback
failed = []
for path in sys.argv[1:]:
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec = importlib.util.spec_from_file_location("script_" + str(abs(hash(path))), path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except BaseException as e:
        failed.append(f"{path}: {type(e).__name__}: {e}")
    finally:
        sys.path.pop(0)
print("\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_lab_and_report_script_imports():
    scripts = sorted(glob.glob(os.path.join(REPO, "lab", "*.py")) + glob.glob(os.path.join(REPO, "reports", "*", "*.py")))
    assert len(scripts) > 10
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL] + scripts, capture_output=True, text=True, cwd=REPO,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
