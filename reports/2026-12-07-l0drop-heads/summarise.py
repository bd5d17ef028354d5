"""The heads study's summary: each seed's stock model and freq rule at 0.5 with 8 heads (OUT/h8_s<seed>) against the
same seed's with 4 (the merge study's SOURCE/f0.25_s<seed>), through the width study's summary with this study's
shape: Delta = G_h8 - G_x128 per seed and the decision rule of README.md as committed (the width study's thresholds);
results.json next to this script, the table printed.

    python summarise.py SOURCE OUT
"""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "width_summary", os.path.join(HERE, "..", "2026-12-07-l0drop-width", "summarise.py"))
width = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(width)

if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    width.main(*sys.argv[1:], dest=HERE, label="h8", factor="heads")
