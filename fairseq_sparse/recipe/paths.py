"""Where the recipe finds what it runs: the plugin's directory (fairseq's --user-dir), the console scripts of the
environment it runs in, the repository around the package and its benchmark scripts. A leaf: it imports nothing
of the recipe."""
import os
import sys

#: the plugin package (fairseq's --user-dir)
USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the console scripts of the environment the recipe runs in
BIN = os.path.dirname(sys.executable)
#: the checkout around the package (a wheel install has none: the site-packages directory)
REPO = os.path.dirname(USER_DIR)
#: the benchmark scripts of the checkout, which the speed step runs by path (a wheel install has none)
BENCHMARKS = os.path.join(REPO, "benchmarks")
#: the script of each benchmark the speed step runs, by the name of its results (WORK/speed/NAME.json)
SPEED_SCRIPTS = {"l0drop": "l0drop_decoding.py", "heads": "head_pruning.py", "simplified": "simplified_decoder.py"}
#: what those scripts import from beside them
BENCHMARK_HELPERS = ("bench_common.py",)


def missing_benchmarks(names=tuple(SPEED_SCRIPTS)):
    """The files of the benchmarks NAMES (keys of :data:`SPEED_SCRIPTS`) that are not there, as paths: their
    scripts, and the helpers they import where any is run."""
    needed = [SPEED_SCRIPTS[n] for n in names] + (list(BENCHMARK_HELPERS) if names else [])
    return [os.path.join(BENCHMARKS, f) for f in needed if not os.path.isfile(os.path.join(BENCHMARKS, f))]
