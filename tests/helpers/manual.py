"""README.md as a manual: its sections, the commands of its "Train and decode" block (one string per command, the
continuation lines joined), the cells of its status table."""
import os
import re

from conftest import REPO


def read(name="README.md"):
    with open(os.path.join(REPO, name), encoding="utf-8") as f:
        return f.read()


def section(text, title):
    """The text of the section ``## TITLE`` (up to the next ``## `` heading)."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def commands(block):
    """The commands of the first ```bash block of BLOCK, continuation lines joined, comments dropped."""
    code = re.search(r"```bash\n(.*?)```", block, re.S).group(1)
    joined = re.sub(r"\\\n\s*", "", code)
    return [" ".join(line.split()) for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def train_and_decode():
    return commands(section(read(), "Train and decode"))
