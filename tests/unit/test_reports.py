"""reports/: every study's README opens with the header scripts/reports_index.py reads, reports/INDEX.md is what
that script writes now, and README's status table is what scripts/status_table.py generates from the reports'
results.json (README and a report cannot disagree)."""
import os
import sys

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))
import reports_index  # noqa: E402


def test_every_report_has_its_header_and_the_index_is_current():
    for folder in reports_index.studies():
        reports_index.header(folder)  # raises, naming what is missing
    with open(os.path.join(REPO, "reports", "INDEX.md"), encoding="utf-8") as f:
        assert f.read() == reports_index.index(), "reports/INDEX.md is stale: run python3 scripts/reports_index.py"


def test_readme_status_table_is_generated_from_the_reports_json():
    """Every number of README's status table is read from a report's results.json (scripts/status_table.py): README
    and a report cannot disagree."""
    import status_table

    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert status_table.readme_table(readme) == status_table.table(), \
        "README's status table is stale: run python3 scripts/status_table.py --write"
