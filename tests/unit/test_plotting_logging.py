"""The plots of a script that imported fairseq print no matplotlib DEBUG lines (fairseq 0.12 sets the root logger to
DEBUG at import; analysis/plotting gives matplotlib's logger INFO)."""
import subprocess
import sys

SCRIPT = """
import sys
import fairseq  # noqa: F401
from fairseq_sparse.analysis import plotting
fig, ax = plotting.pyplot().subplots()
ax.plot([1, 2], [3, 4], label="x")
plotting.save(fig, sys.argv[1])
"""


def test_a_plot_after_importing_fairseq_prints_no_matplotlib_debug_lines(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "x.png")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "x.png").stat().st_size > 0
    assert "DEBUG:matplotlib" not in done.stderr, done.stderr[:2000]
