"""fedlib's imports flow one way: the layer contract of pyproject.toml holds and no import circle exists.

The layer order (``[tool.importlinter]`` in pyproject.toml, explained in docs/layers.md) is checked
by import-linter's ``lint-imports``. A layers contract cannot see a circle between modules of one
layer (``reporting.results`` -> ``reporting.consistency`` -> ``reporting.results``), so the second
test builds the module import graph with grimp (import-linter's graph builder) and looks for
circles itself. Both count imports inside functions too: a deferred import is still a dependency.
An import by name (``importlib.import_module("fedlib.x")``) is invisible to both tools, so the
circle test adds the literal ones it finds in the source.
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedlib.paths import project_root

try:
    import grimp
except ImportError as error:  # pragma: no cover - the test extras were not installed
    raise ImportError("tests/test_import_layers.py needs import-linter (and its grimp): pip install -e '.[dev]'") from error

PACKAGE = "fedlib"


# --------------------------------------------------------------------------------------
# Helpers: dynamic imports by name, circles in an import graph
# --------------------------------------------------------------------------------------
def literal_dynamic_imports(source: str, package: str = PACKAGE) -> list[tuple[str, int]]:
    """``(module, line)`` of every ``importlib.import_module("<package>...")`` with a literal name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
            continue
        function = node.func
        name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
        target = node.args[0].value
        if name == "import_module" and isinstance(target, str) and target.split(".")[0] == package:
            found.append((target, node.lineno))
    return sorted(found, key=lambda hit: hit[1])


def module_name(path: Path, package_dir: Path) -> str:
    """``fedlib/data/loaders.py`` -> ``fedlib.data.loaders``; ``fedlib/data/__init__.py`` -> ``fedlib.data``."""
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[int]]]:
    """fedlib's module import graph: ``{importer: {imported, ...}}`` and the line numbers of each edge.

    Static imports (module level and inside functions) come from grimp; imports by a literal
    name through ``importlib.import_module`` are added from the source.
    """
    graph = grimp.build_graph(PACKAGE, cache_dir=None)
    edges: dict[str, set[str]] = {module: set(graph.find_modules_directly_imported_by(module))
                                  for module in graph.modules}
    lines: dict[tuple[str, str], list[int]] = {}
    for importer, imported_set in edges.items():
        for imported in imported_set:
            details = graph.get_import_details(importer=importer, imported=imported)
            lines[(importer, imported)] = sorted(d["line_number"] for d in details)
    package_dir = project_root() / PACKAGE
    for path in sorted(package_dir.rglob("*.py")):
        importer = module_name(path, package_dir)
        for imported, line in literal_dynamic_imports(path.read_text(encoding="utf-8")):
            if imported in edges:  # the name of a fedlib module; others fail at run time anyway
                edges.setdefault(importer, set()).add(imported)
                lines.setdefault((importer, imported), []).append(line)
    return edges, lines


def find_circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module.

    Each circle is a list of modules ``[a, b, ..., a]`` in import order (``a`` imports ``b``).
    Tarjan's algorithm, iterative (no recursion limit on deep graphs).
    """
    nodes = sorted(set(edges) | {m for targets in edges.values() for m in targets})
    successors = {node: sorted(edges.get(node, ())) for node in nodes}
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = lowlink[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            for position in range(child, len(successors[node])):
                target = successors[node][position]
                if target not in index:
                    work.append((node, position + 1))
                    work.append((target, 0))
                    break
                if target in on_stack:
                    lowlink[node] = min(lowlink[node], index[target])
            else:
                if lowlink[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
                if work:
                    parent = work[-1][0]
                    lowlink[parent] = min(lowlink[parent], lowlink[node])
    return sorted(_circle_through(component, successors) for component in components)


def _circle_through(component: list[str], successors: dict[str, list[str]]) -> list[str]:
    """The shortest circle from the component's first module back to itself, inside the component."""
    start, members = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in successors[node]:
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start] + path[::-1][1:] + [start]
                if target in members and target not in previous and target != start:
                    previous[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"{component} is not a strongly connected component")  # pragma: no cover


def describe_circle(circle: list[str], lines: dict[tuple[str, str], list[int]]) -> str:
    steps = [circle[0]]
    for importer, imported in zip(circle, circle[1:]):
        where = ", ".join(f"l.{n}" for n in lines.get((importer, imported), []))
        steps.append(f"{imported} ({importer} {where})" if where else imported)
    return " -> ".join(steps)


# --------------------------------------------------------------------------------------
# The helpers can fail
# --------------------------------------------------------------------------------------
def test_find_circles_reports_each_circle_in_import_order_and_nothing_in_a_tree():
    tree = {"p.a": {"p.b", "p.c"}, "p.b": {"p.c"}, "p.c": set()}
    assert find_circles(tree) == []
    two = {"p.results": {"p.paper", "p.consistency"}, "p.consistency": {"p.results"}, "p.paper": set()}
    assert find_circles(two) == [["p.consistency", "p.results", "p.consistency"]]
    three = {"p.download": {"p.registry"}, "p.loaders": {"p.download", "p.registry"}, "p.registry": {"p.loaders"},
             "p.other": {"p.x"}, "p.x": {"p.other"}}
    assert find_circles(three) == [["p.download", "p.registry", "p.loaders", "p.download"], ["p.other", "p.x", "p.other"]]


def test_literal_dynamic_imports_are_found_and_other_calls_are_not():
    source = (
        "import importlib\n"
        "from importlib import import_module\n"
        "def load(self):\n"
        "    return importlib.import_module('fedlib.data.loaders')\n"
        "x = import_module('fedlib.papers.fedrkg.method')\n"
        "y = importlib.import_module(name)\n"          # not a literal: cannot be resolved
        "z = importlib.import_module('numpy')\n"       # not fedlib
    )
    assert literal_dynamic_imports(source) == [("fedlib.data.loaders", 4), ("fedlib.papers.fedrkg.method", 5)]


# --------------------------------------------------------------------------------------
# The package
# --------------------------------------------------------------------------------------
def lint_imports_command() -> list[str]:
    beside_python = Path(sys.executable).with_name("lint-imports")
    found = str(beside_python) if beside_python.exists() else shutil.which("lint-imports")
    if found is None:
        pytest.fail("lint-imports is not installed; install the test extras: pip install -e '.[dev]'")
    return [found]


def test_layer_contracts_of_pyproject_hold():
    result = subprocess.run(lint_imports_command() + ["--no-cache", "--no-logo"], cwd=project_root(),
                            capture_output=True, text=True, timeout=600)
    report = result.stdout + result.stderr
    assert result.returncode == 0 and re.search(r"Contracts: [1-9]\d* kept, 0 broken", report), (
        f"lint-imports failed (exit status {result.returncode}); move the code to the layer it belongs to "
        f"(docs/layers.md):\n{report}")


def test_no_import_circle_among_fedlib_modules():
    edges, lines = import_graph()
    package_dir = project_root() / PACKAGE
    unseen = {module_name(path, package_dir) for path in package_dir.rglob("*.py")} - set(edges)
    assert not unseen, f"grimp's graph lacks modules {sorted(unseen)}: is fedlib imported from another checkout?"
    circles = find_circles(edges)
    listed = "\n  ".join(describe_circle(circle, lines) for circle in circles)
    assert not circles, (f"{len(circles)} import circle(s) among fedlib modules (a -> b: a imports b, at the lines "
                         f"given); move the shared code into a module both can import:\n  {listed}")
