"""The encoder-depth study's summary (3+3 against 6+3): the layers study's reader and rule with the deep arm 6x3
(README.md here, the same thresholds); results.json next to this script (results_1700.json: the second reading, at
1,700 updates, one seed), the markdown tables printed.

    python summarise.py OUT [results_1700.json]
        (OUT holds 3x3_s<seed> and 6x3_s<seed>: the layers study's 3+3 work dirs and this one's)
"""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "layers_summary", os.path.join(HERE, "..", "2026-12-07-l0drop-layers", "summarise.py"))
layers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layers)

if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    layers.main(sys.argv[1], HERE, deep="6x3", name=sys.argv[2] if len(sys.argv) == 3 else "results.json")
