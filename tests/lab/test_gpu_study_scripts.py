"""The prepared study calls of lab/calls/ (issue 42's studies c-e), each checked on tiny data the way it
will run on a GPU: the recipe's checks of its options, steps and carried inputs (CHECK_ONLY=1), so that a mistake in
one shows here and not in a device call; nothing is written by the checks."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, console, run
from helpers.recipe import bart_corpus

STUDIES = os.path.join(REPO, "lab", "calls")
RECIPE = console("fairseq-sparse-recipe")
SMALL = ["--bpe-merges", "60", "--device", "cpu", "--steps", "prepare", "--quiet"]


@pytest.fixture(scope="module")
def carry(raw_corpus, tmp_path_factory):
    """A carried folder as the calls expect it: en-de raw, its data-bin (W1) and its character-level data-bin (CH1),
    and two prepared summarisation data-bins."""
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
    for fraction in ("1", "0.5", "0.25"):  # study f's data-bins: shares of the pairs, one dictionary
        run([RECIPE, "--corpus", str(root / "en-de"), "-s", "en", "-t", "de", "--work-dir", str(root / f"DEC_f{fraction}"),
             "--train-fraction", fraction] + SMALL)
        shutil.rmtree(root / f"DEC_f{fraction}" / "tok")  # not carried
    (root / "test.segment_types").write_text("".join("synopsis\n" if i % 3 else "para0\n" for i in range(25)))
    return root


def check(script, carry, **env):
    # by its path, as the device runs it (a call stored without its run bit failed there with exit 126)
    return subprocess.run([os.path.join(STUDIES, script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "VENV": os.path.dirname(os.path.dirname(sys.executable)), "CHECK_ONLY": "1",
                               "DEVICE": "cpu", "AMP": "", "CARRY": str(carry), **env})


@pytest.mark.parametrize("script,env", [("c_heads_composed.sh", {}), ("d_summarisation.sh", {}),
                                        ("d_summarisation.sh", {"CORPUS": "mixed"}), ("e_char_level.sh", {}),
                                        ("f_decisive.sh", {}), ("h_merge_layers.sh", {}),
                                        ("h_merge_layers.sh", {"ARM": "6x1"})])
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

