"""reports/: every study's README opens with the header scripts/reports_index.py reads, reports/INDEX.md is what
that script writes now, and README's status table is what scripts/status_table.py generates from the reports'
results.json (README and a report cannot disagree)."""
import glob
import json
import os
import re
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


#: a measured number as README's prose writes it: a signed percentage ("-36%"), a ratio ("2.41x"), a score ("3.5 BLEU")
MEASURED = re.compile(r"(?<![\w.])([-+]\d+(?:\.\d+)?)%|(?<![\w.])(\d+(?:\.\d+)?)x\b|(?<![\w.])(\d+\.\d+) (?:BLEU|ROUGE)")


def readme_blocks(text):
    """README's paragraphs, list items and table rows outside code blocks and the generated status table."""
    import status_table

    text = re.sub(r"```.*?```", "", text.replace(status_table.readme_table(text), ""), flags=re.S)
    blocks = []
    for paragraph in re.split(r"\n\s*\n", text):
        blocks += re.split(r"\n(?=[|-] )", paragraph)
    return blocks


def json_numbers(obj):
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, list):
        for x in obj:
            yield from json_numbers(x)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield obj


def test_every_measured_number_in_readmes_prose_is_in_a_linked_reports_json():
    """Outside the status table (checked above), every percentage, speed ratio and score README's prose quotes is,
    to the digits it is written with, a number of the headline (or summary) of a JSON file of a report the same
    paragraph links (as it is, or as a fraction written as a percentage)."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        blocks = readme_blocks(f.read())
    checked = 0
    for block in blocks:
        quoted = [(m.group(0), next(g for g in m.groups() if g)) for m in MEASURED.finditer(block)]
        if not quoted:
            continue
        folders = re.findall(r"reports/([\w.-]+)/README\.md", block)
        assert folders, f"README quotes {[q for q, _ in quoted]} without linking the report they come from: {block[:100]!r}"
        values = []
        for folder in folders:
            for name in glob.glob(os.path.join(REPO, "reports", folder, "*.json")):
                with open(name, encoding="utf-8") as f:
                    data = json.load(f)
                # a report's headline (or summary) where it has one: what a study quotes, not any of its rows
                values += list(json_numbers(data.get("headline", data.get("summary", data))
                                            if isinstance(data, dict) else data))
        for shown, number in quoted:
            half_digit = 0.5 * 10 ** -len(number.partition(".")[2]) + 1e-9
            assert any(abs(x - float(number)) <= half_digit or abs(100 * x - float(number)) <= half_digit
                       for x in values), f"README's {shown} is in no JSON of {folders}"
            checked += 1
    assert checked >= 1  # "where it stands" quotes one at least (its length: tests/unit/test_manual.py)
