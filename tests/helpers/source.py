"""The package's source files, for the tests that read the code itself (layering, sizes, doc pointers)."""
import ast
import os

from conftest import REPO

PACKAGE = "fairseq_sparse"


def package_files():
    """Path of every .py file of the package, in a fixed order (hidden and dunder folders left out)."""
    for root, dirs, files in os.walk(os.path.join(REPO, PACKAGE)):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        for f in sorted(files):
            if f.endswith(".py"):
                yield os.path.join(root, f)


def parsed(path):
    """The file's syntax tree."""
    with open(path, encoding="utf-8") as fh:
        return ast.parse(fh.read())
