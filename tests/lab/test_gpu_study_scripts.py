"""The prepared study calls of lab/calls/ that the queue's rehearsal (tests/lab/test_queue_rehearsal.py) does not run,
each checked on tiny data the way it will run on a GPU: the recipe's checks of its options, steps and carried inputs
(CHECK_ONLY=1), so that a mistake in one shows here and not in a device call; nothing is written by the checks."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, console, run
from helpers.lab import queue
from helpers.recipe import bart_corpus

STUDIES = os.path.join(REPO, "lab", "calls")
RECIPE = console("fairseq-sparse-recipe")
SMALL = ["--bpe-merges", "60", "--device", "cpu", "--steps", "prepare", "--quiet"]
#: every study call and the settings its queue lines give it (g_search_benchmark.sh is a benchmark, not a study:
#: its preflight and its own checks are in test_preflight.py)
CALLS = [("c_heads_composed.sh", {}), ("d_summarisation.sh", {}), ("d_summarisation.sh", {"CORPUS": "mixed"}),
         ("e_char_level.sh", {}), ("f_decisive.sh", {}), ("h_merge_layers.sh", {}), ("h_merge_layers.sh", {"ARM": "6x1"})]
#: the calls the rehearsal runs, each of its queue lines (in full or its checks) as the device would
REHEARSED = {os.path.basename(script) for *_, script, _ in queue(2)}


@pytest.fixture(scope="module")
def carry(raw_corpus, tmp_path_factory):
    """A carried folder as the calls checked here expect it: en-de raw, its data-bin (W1) and its character-level
    data-bin (CH1), two prepared summarisation data-bins, and where study f or h is not rehearsed, their data-bins."""
    root = tmp_path_factory.mktemp("carry")
    shutil.copytree(raw_corpus, root / "en-de")
    run([RECIPE, "--corpus", str(root / "en-de"), "-s", "en", "-t", "de", "--work-dir", str(root / "W1")] + SMALL)
    run([RECIPE, "--corpus", str(root / "en-de"), "-s", "en", "-t", "de", "--work-dir", str(root / "CH1"),
         "--char-level", "--device", "cpu", "--steps", "prepare", "--quiet"])
    shutil.rmtree(root / "CH1" / "tok")  # not carried
    summaries = bart_corpus(tmp_path_factory.mktemp("summaries"))
    run([RECIPE, "--corpus", str(summaries), "--tokenizer-lang", "en", "--metric", "rouge", "--work-dir",
         str(root / "sum_synopsis")] + SMALL)
    os.symlink(root / "sum_synopsis", root / "sum_mixed")
    if {"f_decisive.sh", "h_merge_layers.sh"} - REHEARSED:  # study f's and h's data-bins: shares of the pairs
        for fraction in ("1", "0.5", "0.25"):
            run([RECIPE, "--corpus", str(root / "en-de"), "-s", "en", "-t", "de", "--work-dir",
                 str(root / f"DEC_f{fraction}"), "--train-fraction", fraction] + SMALL)
            shutil.rmtree(root / f"DEC_f{fraction}" / "tok")  # not carried
    (root / "test.segment_types").write_text("".join("synopsis\n" if i % 3 else "para0\n" for i in range(25)))
    return root


def check(script, carry, **env):
    # by its path, as the device runs it (a call stored without its run bit failed there with exit 126)
    return subprocess.run([os.path.join(STUDIES, script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "VENV": os.path.dirname(os.path.dirname(sys.executable)), "CHECK_ONLY": "1",
                               "DEVICE": "cpu", "AMP": "", "CARRY": str(carry), **env})


def test_every_study_call_is_checked_here_or_rehearsed():
    studies = sorted(os.path.basename(c) for c in os.listdir(STUDIES) if c.endswith(".sh")
                     and c not in ("common.sh", "g_search_benchmark.sh"))
    assert sorted({script for script, _ in CALLS}) == studies
    assert REHEARSED <= set(studies) and [c for c in CALLS if c[0] not in REHEARSED], REHEARSED


@pytest.mark.parametrize("script,env", [c for c in CALLS if c[0] not in REHEARSED])
def test_each_prepared_call_passes_the_recipes_checks_and_writes_nothing(carry, script, env):
    before = sorted(os.listdir(carry))
    done = check(script, carry, **env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "options, steps and inputs checked" in done.stdout
    assert sorted(os.listdir(carry)) == before  # no work dir made by a check


def test_a_call_whose_options_the_recipe_refuses_fails_its_check(carry, tmp_path):
    # the GPU's --amp on the CPU: the recipe's refusal, before any work
    done = check("c_heads_composed.sh", carry, AMP="--amp")
    assert done.returncode == 2 and "--amp is mixed precision on CUDA" in done.stderr
    bad = check("d_summarisation.sh", carry, CORPUS="wikisum")
    assert bad.returncode == 2 and "CORPUS is synopsis or mixed" in bad.stdout
    # a carried input missing: the call stops at its first act, before any install (lab/preflight.py --inputs)
    missing = tmp_path / "carry"
    shutil.copytree(carry, missing, symlinks=True)
    (missing / "test.segment_types").unlink()
    done = check("f_decisive.sh", missing)
    assert done.returncode == 2 and "test.segment_types, which is missing: carry it" in done.stderr, done.stderr

