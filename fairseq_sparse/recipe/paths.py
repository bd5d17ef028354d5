"""Where the recipe finds what it runs: the plugin's directory (fairseq's --user-dir), the console scripts of the
environment it runs in, the repository around the package and the benchmark modules of the speed step. A leaf: it
imports nothing of the recipe."""
import os
import sys

#: the plugin package (fairseq's --user-dir)
USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the console scripts of the environment the recipe runs in
BIN = os.path.dirname(sys.executable)
#: the checkout around the package (a wheel install has none: the site-packages directory)
REPO = os.path.dirname(USER_DIR)
#: the benchmark module of each benchmark the speed step runs (python -m), by the name of its results
#: (WORK/speed/NAME.json)
SPEED_MODULES = {name: f"fairseq_sparse.benchmarks.{module}" for name, module in
                 (("l0drop", "l0drop_decoding"), ("heads", "head_pruning"), ("simplified", "simplified_decoder"))}
