"""Layers point one way (docs' architecture): read with ``ast``, nothing imported.

* the core (modules, models, criterions, optim, tasks and the top-level modules) imports no analysis, cli or
  recipe module: loading the plugin loads neither the analysis library nor a tool;
* analysis imports, of the plugin, only analysis itself, modules/ (the maths) and the top-level modules
  (checkpoint reading): no criterion, model, optimiser or task internals, no search, no tool;
* search/ (the decoding side) may import the core and patches/, no tool; nothing of the core imports it but the
  package's ``__init__``, which loads it (its tasks register);
* patches/ (the repairs to fairseq and torch) imports nothing of the package but patches/ itself: any layer may
  import it;
* a tool imports no other tool: cli/common.py is the tools' shared helper (and imports no tool), the recipe
  imports no cli module but cli/common.py, and no cli module imports the recipe;
* the benchmarks (fairseq_sparse.benchmarks) sit on top: they may import any layer, and nothing but a benchmark
  imports them (the recipe runs them with ``python -m``);
* no import cycle in the package, counting imports inside functions too (one there only hides a cycle until a
  refactoring moves it to the top).
"""
import ast
import os

import pytest

from conftest import REPO
from helpers.source import PACKAGE, package_files

CORE = ("modules", "models", "criterions", "optim", "tasks")


def module_name(path):
    rel = os.path.relpath(path, REPO)[:-3].split(os.sep)
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def imported(source, name, is_package):
    """Every module ``source`` (the text of module ``name``) may import: ``import a.b``, ``from a import b``
    (a.b, a module or not), relative imports resolved; in functions too, and import_module("a.b")."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            yield base
            yield from (f"{base}.{a.name}" for a in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)):
            yield node.args[0].value


TOOLS_AND_LIBRARY = ("analysis", "cli", "recipe", "benchmarks")
#: rooms of their own below the tools: the decoding side and the repairs to fairseq and torch
ROOMS = ("search", "patches")


def part(name, i):
    """The i-th component of a dotted name in the package ('' if absent)."""
    parts = name.split(".")
    return parts[i] if len(parts) > i and parts[0] == PACKAGE else ""


def layer(name):
    """analysis / cli / recipe / benchmarks / search / patches, core for the rest of the package, None outside it."""
    if name.split(".")[0] != PACKAGE:
        return None
    return part(name, 1) if part(name, 1) in TOOLS_AND_LIBRARY + ROOMS else "core"


def violations(name, targets):
    """The rules of the module docstring, for module ``name`` importing ``targets``."""
    own, out = layer(name), []
    for t in sorted(set(targets)):
        sub, tool = part(t, 1), part(t, 2)
        if layer(t) is None or t == name:
            continue
        if sub == "benchmarks" and own != "benchmarks":
            out.append(f"{name} imports a benchmark: {t}")
        elif own == "patches" and layer(t) != "patches":
            out.append(f"{name} (patches) imports {t}: patches/ imports nothing of the package above it")
        elif own in ("core", "search") and sub in TOOLS_AND_LIBRARY:
            out.append(f"{name} ({own}) imports {t}")
        elif own == "core" and sub == "search" and name != PACKAGE:
            out.append(f"{name} (core) imports the search: {t}")
        elif own == "analysis" and sub in CORE + ("cli", "recipe", "search") and sub != "modules":
            out.append(f"{name} (analysis) imports {t}: only analysis, modules/ and the top-level modules")
        elif own == "cli" and sub == "recipe":
            out.append(f"{name} (a tool) imports the recipe: {t}")
        elif own in ("cli", "recipe") and sub == "cli" and tool not in ("", "common", part(name, 2)):
            out.append(f"{name} imports another tool: {t}")
        elif own == "cli" and part(name, 2) == "common" and sub == "cli" and tool not in ("", "common"):
            out.append(f"{name} (the tools' shared helper) imports a tool: {t}")
    return out


def package_modules():
    for path in package_files():
        yield module_name(path), path, os.path.basename(path) == "__init__.py"


def test_layers_point_one_way():
    found = []
    for name, path, is_package in package_modules():
        with open(path, encoding="utf-8") as f:
            found += violations(name, imported(f.read(), name, is_package))
    assert not found, "imports against the layering:\n" + "\n".join(found)


@pytest.mark.parametrize("name, source, bad", [
    ("fairseq_sparse.modules.x", "from ..analysis.token_types import TAGS", True),
    ("fairseq_sparse.modules.x", "from ..analysis import token_types", True),
    ("fairseq_sparse.tasks.x", "import fairseq_sparse.cli.common", True),
    ("fairseq_sparse.x", "from .recipe import main", True),
    ("fairseq_sparse.x", "from . import analysis", True),
    ("fairseq_sparse.models.x", "def f():\n    from fairseq_sparse.recipe import methods", True),
    ("fairseq_sparse.models.x", "import importlib\nimportlib.import_module('fairseq_sparse.analysis.lrp')", True),
    ("fairseq_sparse.models.x", "from ..modules.token_tags import read_tags", False),
    ("fairseq_sparse.analysis.x", "from ..criterions.label_smoothed_cross_entropy_with_sparsity import f", True),
    ("fairseq_sparse.analysis.x", "from ..models.transformer_l0drop import f", True),
    ("fairseq_sparse.analysis.x", "from fairseq_sparse.cli import common", True),
    ("fairseq_sparse.analysis.x", "from ..modules.sparsity_control import parse_targets", False),
    ("fairseq_sparse.analysis.x", "from ..checkpoint_safety import read_state", False),
    ("fairseq_sparse.analysis.x", "from .. import checkpoint_safety", False),
    ("fairseq_sparse.cli.a", "from fairseq_sparse.cli.b import Session", True),
    ("fairseq_sparse.cli.a", "from . import b", True),
    ("fairseq_sparse.cli.a", "from fairseq_sparse.cli import common, b", True),
    ("fairseq_sparse.cli.a", "from fairseq_sparse.cli import common\nfrom .common import ToolError", False),
    ("fairseq_sparse.cli.a", "from ..recipe import main", True),
    ("fairseq_sparse.cli.common", "from .a import f", True),
    ("fairseq_sparse.recipe.main", "from ..cli.a import f", True),
    ("fairseq_sparse.recipe.main", "from ..cli.common import ToolError", False),
    ("fairseq_sparse.recipe.main", "from . import corpus\nfrom ..analysis import scores", False),
    ("fairseq_sparse.recipe.speed", "from ..benchmarks import composed", True),
    ("fairseq_sparse.models.x", "from fairseq_sparse.benchmarks.bench_common import USER_DIR", True),
    ("fairseq_sparse.analysis.x", "from ..benchmarks import bench_common", True),
    ("fairseq_sparse.benchmarks.composed", "from fairseq_sparse.benchmarks import bench_common\n"
     "from fairseq_sparse.recipe.commands import model_flags\nfrom fairseq_sparse.cli.common import ToolError", False),
    ("fairseq_sparse.models.x", "from ..search.fixed_shape_search import Beams", True),
    ("fairseq_sparse.modules.x", "from ..search import static_cache", True),
    ("fairseq_sparse.tasks.x", "def f():\n    from fairseq_sparse.search import shared_memory", True),
    ("fairseq_sparse.analysis.x", "from ..search.shared_memory import share_encoder_memory", True),
    ("fairseq_sparse", "from .patches import last_batch\nfrom . import models, search", False),
    ("fairseq_sparse.search.x", "from ..models.l0drop_decoder import D\nfrom ..modules.head_gates import H\n"
     "from ..patches.ngram_block import f\nfrom .static_cache import cacheable", False),
    ("fairseq_sparse.search.x", "from ..analysis import heads", True),
    ("fairseq_sparse.benchmarks.x", "from fairseq_sparse.search.fixed_shape_search import F", False),
    ("fairseq_sparse.patches.x", "from .switch import enabled\nfrom . import NAMES", False),
    ("fairseq_sparse.patches.x", "from ..modules.sparsity import SparsityTerm", True),
    ("fairseq_sparse.patches.x", "from .. import checkpoint_safety", True),
    ("fairseq_sparse.checkpoint_safety", "from .patches import enabled", False),
])
def test_the_rules_catch_upward_and_sideways_imports(name, source, bad):
    assert bool(violations(name, imported(source, name, False))) == bad


def module_imports(source, name, is_package, known):
    """The package's modules (among ``known``) that module ``name`` imports, at module level or in functions:
    ``from a import b`` is a.b where that is a module, else a; a package's parents, which Python imports first
    whatever the import, are not counted unless named."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)):
            targets = [node.args[0].value]
        else:
            continue
        yield from (t for t in targets if t in known and t != name)


def import_cycles(graph):
    """One cycle, as [a, b, ..., a], through each strongly connected group of ``graph`` ({module: set of
    modules}) of two modules or more (Tarjan's algorithm, then a path back to the group's first module)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, group) for group in groups]


def _cycle_in(graph, group):
    """The shortest way from the group's first module round to itself, inside the group (breadth first)."""
    start = min(group)
    paths, seen = [[start]], set()
    while paths:
        path = paths.pop(0)
        for w in sorted(graph.get(path[-1], ())):
            if w == start:
                return path + [start]
            if w in group and w not in seen:
                seen.add(w)
                paths.append(path + [w])
    raise AssertionError(f"no cycle through {start}")  # not reached: a group of two or more holds one


def package_graph():
    modules = list(package_modules())
    known = {name for name, _, _ in modules}
    graph = {}
    for name, path, is_package in modules:
        with open(path, encoding="utf-8") as f:
            graph[name] = set(module_imports(f.read(), name, is_package, known))
    return graph


def test_no_import_cycle_in_the_package():
    graph = package_graph()
    assert "fairseq_sparse.recipe.commands" in graph["fairseq_sparse.recipe.decoding"]  # the graph is read
    cycles = import_cycles(graph)
    assert not cycles, "import cycles (imports in functions counted):\n" + "\n".join(" -> ".join(c) for c in cycles)


KNOWN = {"p", "p.a", "p.b", "p.c", "p.sub", "p.sub.d"}


@pytest.mark.parametrize("name, source, expected", [
    ("p.a", "from . import b\nfrom .c import f", {"p.b", "p.c"}),
    ("p.a", "def f():\n    from .b import g", {"p.b"}),
    ("p.a", "import p.sub.d\nimport os", {"p.sub.d"}),
    ("p.sub.d", "from .. import c\nfrom ..b import x", {"p.c", "p.b"}),
    ("p.sub", "from . import d", {"p.sub.d"}),
    ("p.a", "from . import __doc__", {"p"}),
    ("p.a", "import importlib\nimportlib.import_module('p.c')", {"p.c"}),
])
def test_imports_are_resolved_to_the_packages_modules(name, source, expected):
    assert set(module_imports(source, name, name == "p.sub", KNOWN)) == expected


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"a"}}, [["a", "b", "a"]]),
    ({"a": {"b", "x"}, "b": {"c"}, "c": {"a"}, "x": {"y"}, "y": {"x"}}, [["x", "y", "x"], ["a", "b", "c", "a"]]),
    ({"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": {"b"}}, [["a", "b", "c", "a"]]),
])
def test_every_cycle_is_found_and_named(graph, expected):
    assert import_cycles(graph) == expected
