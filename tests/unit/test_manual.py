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


#: a measured figure as the docs write it: a signed percentage ("-36%"), a ratio ("2.41x"), a score ("17.3 BLEU"),
#: a time ("2.3 ms", "441 s", "50 minutes", "1,400-2,000 s"); an option's default, a model's size ("3+3 x 128"), a
#: share asked for ("50%") or a count is none of these
FIGURE = re.compile(r"(?<![\w.])[-+]\d+(?:\.\d+)?%"
                    r"|(?<![\w.])\d+(?:\.\d+)?x\b"
                    r"|(?<![\w.])\d+(?:\.\d+)? (?:BLEU|ROUGE)\b"
                    r"|(?<![\w.,])\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)? ?(?:ms|us|µs|s|seconds?|min|minutes?|hours?)\b")
#: a link to a report's folder (or a file in it): reports/INDEX.md names no single measurement
REPORT_LINK = re.compile(r"\]\((?:\.\./)?reports/20\d\d-\d\d-\d\d[\w.-]*[/)#]")


def doc_blocks(text):
    """The paragraphs, list items and table rows of a Markdown text, outside ``` code blocks."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    blocks = []
    for paragraph in re.split(r"\n\s*\n", text):
        blocks += re.split(r"\n(?=\s*(?:[-*+]|\d+\.) |\|)", paragraph)
    return blocks


def unsourced_figures(text):
    """The blocks of a Markdown text that quote a measured figure and link no report folder, as (figures, block)."""
    out = []
    for block in doc_blocks(text):
        figures = FIGURE.findall(block)
        if figures and not REPORT_LINK.search(block):
            out.append((figures, " ".join(block.split())[:120]))
    return out


def test_every_measured_figure_in_docs_links_its_report():
    """docs/ is a manual: a measured figure (a signed percentage, a ratio, a score, a time of a run) stands in the
    same paragraph, list item or table row as a link to the report that measured it; where a number comes from no
    report it belongs in one, not in the manual. No block is exempt: the bytes-per-step model's closed-form
    predictions, the one set of numbers that were not measured, live in the report whose run tested them."""
    bad = {os.path.basename(p): unsourced_figures(open(p, encoding="utf-8").read())
           for p in sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))}
    assert {k: v for k, v in bad.items() if v} == {}


def test_a_figure_without_its_report_is_caught_and_one_with_it_or_a_default_is_not():
    link = "[report](../reports/2026-11-27-fixed-shape-search-h200/README.md)"
    for figure in ("ran 5.9x faster", "lost -36% of its BLEU", "22.7 BLEU", "about 6 ms a step", "took 441 s",
                   "about 50 minutes", "within 1,400-2,000 s"):
        assert unsourced_figures(f"It {figure}.") != [], figure
        assert unsourced_figures(f"It {figure} ({link}).") == [], figure
    assert unsourced_figures(f"- one item, 2.41x\n- another, linked: {link}") != []  # a list item is its own block
    assert unsourced_figures("the INDEX only, 2.41x ([reports/INDEX.md](../reports/INDEX.md))") != []
    assert unsourced_figures("```\nbench --lengths 25 # about 77 s, 2.41x\n```\n"
                             "`--fixed-shape-source-bucket` (default 16), 3+3 x 128, 50% of the states, "
                             "`--baseline-minutes M`, a 3-minute baseline, `--l0drop-lambda 0.3`") == []


#: words about this project's borrowed GPU runs (lab/README.md's business, not the manual's)
GPU_RUN_WORDS = re.compile(r"\b(?:device calls?|lent|carry|carries|carried|carrying|LIMIT_\w*|borrowed GPUs?"
                           r"|next run)\b|\bthe prepared\b[^.]{0,60}?\bcalls?\b", re.I)


def test_docs_do_not_talk_about_the_borrowed_gpu_runs():
    """How this project's development borrowed GPUs (what a device call carries, its limits, what the next run will
    do) is lab/README.md's; the manual says how to run on a GPU and links the reports of what ran. The words are
    kept out of docs/ in every sense, so that none comes back in the GPU sense unnoticed."""
    bad = {}
    for path in sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))):
        found = [m.group(0) for m in GPU_RUN_WORDS.finditer(open(path, encoding="utf-8").read())]
        if found:
            bad[os.path.basename(path)] = found
    assert bad == {}


def test_the_gpu_run_words_are_caught_as_words():
    for text in ("the prepared device call's rest", "LIMIT_BENCH=360", "the lent machines", "over the 64 MiB carry",
                 "the benchmark's next run", "the borrowed GPU runs", "The prepared call for the study"):
        assert GPU_RUN_WORDS.search(text), text
    for text in ("an excellent, silent run", "the next runs' caches", "a call to prepare"):
        assert not GPU_RUN_WORDS.search(text), text
