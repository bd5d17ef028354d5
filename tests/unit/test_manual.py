"""docs/ is a manual (issue 54): dated findings live in reports, so a date in docs/ is only the name of a report (in a
link or a report's path); there is no second status table and no redirect page; no tracked text names a path of this
machine or the environment's ../shared folder (the project must not depend on it)."""
import glob
import os
import re
import subprocess

from conftest import REPO

LINK = re.compile(r"!?\[[^\]]*\]\([^)]*\)")
REPORT_PATH = re.compile(r"reports/20\d\d-\d\d-\d\d[\w.-]*")
DATE = re.compile(r"\b2026-\d\d-\d\d\b")


def findings(text):
    """Lines of a Markdown text with a 2026 date outside links and report paths."""
    return [line for line in text.splitlines() if DATE.search(REPORT_PATH.sub("", LINK.sub("", line)))]


def test_docs_carry_no_dated_findings():
    bad = {os.path.basename(p): findings(open(p).read()) for p in glob.glob(os.path.join(REPO, "docs", "*.md"))}
    assert {k: v for k, v in bad.items() if v} == {}


def test_a_dated_finding_is_caught_and_a_report_link_is_not():
    assert findings("measured on an H100 (2026-11-26)") != []
    assert findings("see [reports/2026-11-26-gpu](../reports/2026-11-26-gpu/README.md) and `reports/2026-11-24-x/a.sh`") == []


def test_one_status_table_and_no_redirect_page():
    assert not os.path.exists(os.path.join(REPO, "docs", "results.md"))
    for path in glob.glob(os.path.join(REPO, "docs", "*.md")):
        text = open(path).read()
        assert not re.search(r"^\| *(goal|what) *\| *(status|target)", text, re.M | re.I), path


def test_no_tracked_text_names_this_machines_paths_or_the_shared_folder():
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    bad = []
    for name in names:
        if name.endswith((".png", ".pt", ".tgz", ".gz")) or name == "tests/unit/test_manual.py":
            continue
        try:
            text = open(os.path.join(REPO, name), encoding="utf-8").read()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        for pattern in ("../shared", "/work/", "pytest-of-"):
            if pattern in text:
                bad.append(f"{name}: {pattern}")
    assert bad == []


def test_readmes_train_and_decode_commands_are_the_docs_use_sections():
    """README's complete example is the one docs/l0drop.md and docs/head-gates-and-importance.md teach: every command
    of it appears, as written, in one of their blocks (no second first command)."""
    from helpers.manual import commands, read, section, train_and_decode

    docs = commands(section(read("docs/l0drop.md"), "Use")) + commands(
        section(read("docs/head-gates-and-importance.md"), "Head gates"))
    readme = train_and_decode()
    assert readme and [c for c in readme if c not in docs] == []
    assert not any("..." in c for c in readme)  # complete commands, nothing elided


def words(cell):
    """The words a reader sees in a Markdown cell (a link counts as its label)."""
    return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cell).replace("*", "").split()


def test_readmes_status_cells_and_where_it_stands_stay_short():
    """A status table with short cells (the protocol lives in the reports), a conditions line per group, and "where it
    stands" in at most three sentences."""
    from helpers.manual import read, section

    import sys
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import status_table

    rows = [[c.strip() for c in line.strip("|").split("|")] for line in status_table.table().splitlines()[2:]]
    for cells in rows:
        group = cells[0].startswith("**") and all(c.strip() == "" for c in cells[1:])
        limit = 20 if group else 12
        long = [c for c in cells if len(words(c)) > limit]
        assert long == [], f"status cells over {limit} words: {long}"
    assert sum(cells[0].startswith("**") for cells in rows) >= 3
    prose = re.sub(r"^\|.*$", "", section(read(), "Where it stands"), flags=re.M)
    sentences = [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", " ".join(prose.split()[3:])) if s.strip()]
    assert len(sentences) <= 3, sentences


def test_a_long_status_cell_is_caught():
    assert len(words("**-0.38** BLEU ([report](reports/x/README.md))")) == 3
    assert len(words(" ".join(["word"] * 13))) > 12
