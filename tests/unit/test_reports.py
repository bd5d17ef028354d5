"""reports/: every study's README opens with the header scripts/reports_index.py reads, reports/INDEX.md is what
that script writes now, and every bold number of README's status table that cites a report is in that report's
results.json (README and the report cannot disagree)."""
import json
import os
import re
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))
import reports_index  # noqa: E402


def test_every_report_has_its_header_and_the_index_is_current():
    for folder in reports_index.studies():
        reports_index.header(folder)  # raises, naming what is missing
    with open(os.path.join(REPO, "reports", "INDEX.md"), encoding="utf-8") as f:
        assert f.read() == reports_index.index(), "reports/INDEX.md is stale: run python3 scripts/reports_index.py"


def numbers_in(obj):
    if isinstance(obj, dict):
        return set().union(*(numbers_in(v) for v in obj.values())) if obj else set()
    if isinstance(obj, list):
        return set().union(*(numbers_in(v) for v in obj)) if obj else set()
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return {round(float(obj), 2)}
    return set()


def status_rows():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    table = text[text.index("## Where it stands"):].split("\n## ")[0]
    return [line for line in table.splitlines() if line.startswith("| ") and "(reports/" in line]


def test_readme_status_numbers_that_cite_a_report_are_the_reports_numbers():
    rows = status_rows()
    assert rows, "README's status table cites no report"
    for row in rows:
        folder = re.search(r"\(reports/([^/)]+)/", row).group(1)
        path = os.path.join(REPO, "reports", folder, "results.json")
        with open(path) as f:
            known = numbers_in(json.load(f))
        bold = [float(x) for x in re.findall(r"\*\*([-+]?\d+(?:\.\d+)?)", row)]
        assert bold, row
        for x in bold:
            assert round(x, 2) in known, f"README says {x} for reports/{folder}, its results.json does not"
