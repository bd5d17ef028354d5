"""The package's functions and classes stay small: no function over 60 lines, no class over 200 (counted from
``def``/``class`` to the last line, methods and nested functions each on their own), read with ``ast``. Today's
exceptions are named in ALLOWED with their sizes: one may shrink, not grow; a new one fails."""
import ast
import os

import pytest

from conftest import REPO
from helpers.source import package_files, parsed

LIMITS = {"function": 60, "class": 200}
#: (file, qualified name): lines today, for a known knot over its limit (none today): it may shrink, not grow.
ALLOWED = {}


def definitions(tree, prefix=""):
    """(qualified name, kind, lines) of every function and class in TREE, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = prefix + node.name
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            yield name, kind, node.end_lineno - node.lineno + 1
            yield from definitions(node, name + ".")
        else:
            yield from definitions(node, prefix)


def package_sizes():
    """{(file relative to the repository, qualified name): (kind, lines)} of the whole package."""
    out = {}
    for path in package_files():
        rel = os.path.relpath(path, REPO).replace(os.sep, "/")
        for name, kind, lines in definitions(parsed(path)):
            out[(rel, name)] = (kind, lines)
    return out


def oversized(sizes, allowed):
    """What breaks the limits in SIZES: a definition over its limit that ALLOWED does not name, or one that has
    grown past its allowed size."""
    out = []
    for (path, name), (kind, lines) in sorted(sizes.items()):
        limit = max(LIMITS[kind], allowed.get((path, name), 0))
        if lines > limit:
            why = f"allowed {limit} (today's exception)" if (path, name) in allowed else f"limit {limit}"
            out.append(f"{path}: {kind} {name} has {lines} lines ({why})")
    return out


def test_functions_and_classes_stay_small():
    problems = oversized(package_sizes(), ALLOWED)
    assert not problems, "split these (or, only for today's knots, see ALLOWED):\n" + "\n".join(problems)


def test_the_allow_list_names_only_exceptions_that_are_still_there():
    """An exception split up or brought within its limit leaves the list (so the list stays the knots of today)."""
    sizes = package_sizes()
    stale = [f"{path}: {name}" for (path, name) in ALLOWED
             if (path, name) not in sizes or sizes[(path, name)][1] <= LIMITS[sizes[(path, name)][0]]]
    assert not stale, "no longer over the limit, drop from ALLOWED:\n" + "\n".join(stale)


@pytest.mark.parametrize("source, allowed, expected", [
    ("def f():\n" + "    x = 1\n" * 59, {}, []),  # 60 lines
    ("def f():\n" + "    x = 1\n" * 60, {}, ["m.py: function f has 61 lines (limit 60)"]),
    ("class C:\n    def g(self):\n" + "        x = 1\n" * 60, {},
     ["m.py: function C.g has 61 lines (limit 60)"]),
    ("def f():\n    def inner():\n" + "        x = 1\n" * 60, {},
     ["m.py: function f has 62 lines (limit 60)", "m.py: function f.inner has 61 lines (limit 60)"]),
    ("def f():\n" + "    x = 1\n" * 60, {("m.py", "f"): 61}, []),
    ("def f():\n" + "    x = 1\n" * 61, {("m.py", "f"): 61},
     ["m.py: function f has 62 lines (allowed 61 (today's exception))"]),
    ("class C:\n" + "    x = 1\n" * 200, {}, ["m.py: class C has 201 lines (limit 200)"]),
])
def test_new_and_grown_exceptions_are_caught(source, allowed, expected):
    sizes = {("m.py", name): (kind, lines) for name, kind, lines in definitions(ast.parse(source))}
    assert oversized(sizes, allowed) == expected
