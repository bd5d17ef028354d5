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
