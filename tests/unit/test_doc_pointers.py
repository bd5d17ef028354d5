"""The package's pointers into the manual hold: every ``README.md``, ``docs/X.md`` or ``reports/X/Y.md`` that a
string in fairseq_sparse/ names (a message, a --help text, a docstring) exists, and its ``#anchor``, where it has
one, is the GitHub slug of one of the file's headings; the older form ``(README, 'Section')`` names a heading that exists.
Read with ``ast``: nothing imported."""
import ast
import os
import re

import pytest

from conftest import REPO
from helpers.source import package_files, parsed

POINTER = re.compile(r"(?<![\w/.-])((?:(?:docs|reports)/[\w./-]+|README)\.md)(?:#([\w-]+))?")
SECTION = re.compile(r"(?<![\w/.-])(README|docs/[\w./-]+\.md)(?:\.md)?,? '([^']+)'")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def slug(title):
    """GitHub's anchor of a heading: its text (links by their text) lowercased, every character but letters,
    digits, '_', '-' and spaces dropped, spaces made '-'."""
    return re.sub(r"[^\w\- ]", "", LINK.sub(r"\1", title).strip().lower()).replace(" ", "-")


def headings(text):
    """The headings of a Markdown text, outside fenced code blocks."""
    fenced, out = False, []
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and HEADING.match(line):
            out.append(HEADING.match(line).group(2))
    return out


def anchors(text):
    """GitHub's anchors of a Markdown text's headings (a repeated slug gets -1, -2, ...)."""
    seen, out = {}, set()
    for title in headings(text):
        s = slug(title)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def package_strings():
    """(file:line, text) of every string constant in the package, f-strings' literal parts and docstrings too."""
    for path in package_files():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                yield f"{os.path.relpath(path, REPO)}:{node.lineno}", node.value


def pointer_problems(where, text, read):
    """What is wrong with the pointers into README.md or docs/ of one string; ``read(path)``: the file's text
    relative to the repository, or None where it does not exist."""
    out = []
    for m in POINTER.finditer(text):
        path, anchor = m.groups()
        content = read(path)
        if content is None:
            out.append(f"{where}: {m.group(0)}: no such file {path}")
        elif anchor and anchor not in anchors(content):
            out.append(f"{where}: {m.group(0)}: {path} has no heading with the anchor #{anchor}")
    for m in SECTION.finditer(text):
        path = m.group(1) if m.group(1).endswith(".md") else m.group(1) + ".md"
        content = read(path)
        if content is None or m.group(2) not in headings(content):
            out.append(f"{where}: {m.group(0)}: {path} has no section {m.group(2)!r}")
    return out


def read_repo(path):
    full = os.path.join(REPO, path)
    if not os.path.isfile(full):
        return None
    with open(full, encoding="utf-8") as f:
        return f.read()


def test_every_pointer_into_readme_or_docs_in_the_package_holds():
    found, problems = 0, []
    for where, text in package_strings():
        found += len(POINTER.findall(text))
        problems += pointer_problems(where, text, read_repo)
    assert found >= 5  # the package's messages and docstrings do point into docs/
    assert not problems, "stale pointers into the manual:\n" + "\n".join(problems)


DOC = """# Title

## Target sparsity

```bash
# not a heading
```

## Criterion `label_smoothed_cross_entropy_with_sparsity`
### One run, a whole curve
## Target sparsity
## See [the report](../reports/x/README.md)
"""


@pytest.mark.parametrize("text, bad", [
    ("see docs/a.md#target-sparsity", False),
    ("see docs/a.md#target-sparsity-1", False),  # GitHub numbers a repeated heading
    ("(docs/a.md#criterion-label_smoothed_cross_entropy_with_sparsity)", False),
    ("docs/a.md#one-run-a-whole-curve.", False),
    ("docs/a.md#see-the-report", False),
    ("docs/a.md", False),
    ("docs/a.md#not-a-heading", True),
    ("docs/a.md#target-sparsity-2", True),
    ("docs/a.md#Target-sparsity", True),
    ("docs/gone.md", True),
    ("README.md#title", False),
    ("README.md#setup", True),
    ("the moved section (README, 'Target sparsity')", False),
    ("the moved section (README, 'Setup')", True),
    ("WORK/REPORT.md and runs/reports/x/README.md#anything", False),  # not the repository's
    ("reports/x/README.md#title", False),
    ("reports/y/README.md", True),
])
def test_a_pointer_to_a_missing_file_or_heading_is_caught(text, bad):
    files = {"docs/a.md": DOC, "README.md": DOC, "reports/x/README.md": DOC}
    assert bool(pointer_problems("x.py:1", text, files.get)) == bad


REPORT = re.compile(r"(?<![\w/.-])reports/20\d\d-\d\d-\d\d[\w.-]*")


def test_no_package_string_cites_a_report():
    """A message, --help text or docstring of the package points into the manual (docs/ anchors, which link the
    studies), never at a reports/ folder: the studies are the project's records, a user's installed package has
    none of them."""
    cited = [f"{where}: {m.group(0)}" for where, text in package_strings() for m in REPORT.finditer(text)]
    assert cited == []
    assert REPORT.search("(reports/2026-11-26-l0drop-from-scratch/README.md)")
