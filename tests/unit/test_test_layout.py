"""The tests' own layout: no test file imports another test file (read with ``ast``, nothing imported). What test files
share lives in tests/helpers/ (and fixtures in tests/conftest.py): a test file imported by another ran its module
code, fixtures and marks twice over, and tied two files that pytest-xdist hands to different workers."""
import ast
import glob
import os

import pytest

from conftest import REPO

TESTS = os.path.join(REPO, "tests")


def imports_of_test_modules(source):
    """(line, module) for every import of a test module (``test_*``) in ``source``: ``import test_x``, ``from test_x
    import y``, ``from .test_x import y``, ``from . import test_x``, importlib.import_module("test_x"); in functions
    too."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module] if node.module else [a.name for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        else:
            continue
        for name in names:
            if name.rpartition(".")[2].startswith("test_") or name.split(".")[0].startswith("test_"):
                yield node.lineno, name


def python_files():
    return sorted(glob.glob(os.path.join(TESTS, "**", "*.py"), recursive=True))


def test_no_test_file_imports_another():
    found = [f"{os.path.relpath(path, REPO)}:{line}: imports {name}" for path in python_files()
             for line, name in imports_of_test_modules(open(path, encoding="utf-8").read())]
    assert not found, "a test file imports a test file; move what they share to tests/helpers/:\n" + "\n".join(found)


def test_the_files_read_are_the_tests_and_their_helpers():
    rel = {os.path.relpath(path, TESTS) for path in python_files()}
    assert {"conftest.py", os.path.join("unit", "test_test_layout.py"), os.path.join("e2e", "test_cli.py"),
            os.path.join("helpers", "cli.py")} <= rel


@pytest.mark.parametrize("source, expected", [
    ("from test_cli import train", [(1, "test_cli")]),
    ("import test_cli as c", [(1, "test_cli")]),
    ("def f():\n    from test_shared_memory import build", [(2, "test_shared_memory")]),
    ("from .test_recipe import TINY", [(1, "test_recipe")]),
    ("from . import test_recipe", [(1, "test_recipe")]),
    ("import importlib\nimportlib.import_module('test_l0drop')", [(2, "test_l0drop")]),
    ("from helpers.cli import train\nfrom conftest import run\nimport pytest, torch", []),
    ("from fairseq_sparse.testing import x\nimport attest", []),
])
def test_the_rule_catches_imports_of_test_modules(source, expected):
    assert list(imports_of_test_modules(source)) == expected
