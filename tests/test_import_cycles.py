"""The packages' import graph: no cycle, and no task library module that imports its application.

Every module of ``peg_core``, ``peg_detr`` and ``peg_video`` is parsed (never imported) and every
``import`` / ``from ... import`` statement is an edge, those inside functions included: a
function-level import hides a cycle from Python's import machinery but not from this test.
Imports under ``if TYPE_CHECKING:`` are left out (they never run).  Relative imports are resolved;
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``.  A
package's ``__init__`` importing its children is fine; a child importing its parent package back
(``from . import name`` of a non-module name) closes a cycle through that ``__init__``.

The layer rule (``docs/architecture.md``): in each task the library (``models``, ``interop``,
``data``) never imports the application (``model``, ``task``, ``cli``, ``configs``, ``predict``,
``export``, ``demo``, ``make_data``, ``__main__``, ``prepare``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("peg_core", "peg_detr", "peg_video")
#: task -> its library subpackages, which must not import the task's application modules
LIBRARY = {task: ("models", "interop", "data") for task in ("peg_detr", "peg_video")}
APPLICATION = (
    "model",
    "task",
    "cli",
    "configs",
    "predict",
    "export",
    "demo",
    "make_data",
    "__main__",
    "prepare",
)


def _module_name(path: Path) -> str:
    """``peg_detr/models/build.py`` -> ``peg_detr.models.build``; a package's ``__init__`` -> the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    """Every project module name -> its file."""
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING`` (an ``if`` that never runs)."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement below ``node`` (function bodies too), skipping ``if TYPE_CHECKING:`` bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:  # the else branch does run
                yield from _import_nodes(ast.Module(body=[other], type_ignores=[]))
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from _import_nodes(child)


def _resolve(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module of ``from <node.module> import ...`` in module ``name`` (file ``path``)."""
    if not node.level:
        return node.module or ""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _known(target: str, modules: dict[str, Path]) -> str | None:
    """``target`` or its longest prefix that is a project module; None outside the project."""
    parts = target.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_graph() -> dict[str, dict[str, int]]:
    """``{module: {imported project module: line of the first such import}}`` for every project module."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _import_nodes(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve(name, path, node)
                # a submodule when one of that name exists, else a name defined in the package itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                known = _known(target, modules)
                if known is not None and known != name:
                    edges.setdefault(known, node.lineno)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _one_loop(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    """One closed path through ``component``, each step with the importing file and line."""
    members = set(component)
    start = component[0]
    # breadth-first from start back to start inside the component
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier and start not in previous:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child in members and child not in previous:
                    previous[child] = node
                    nxt.append(child)
        frontier = nxt
    path = [start]
    node = previous[start]
    while node != start:
        path.append(node)
        node = previous[node]
    path.append(start)
    path.reverse()
    modules = _modules()
    steps = [f"{a} -> {b} ({modules[a].relative_to(ROOT)}:{graph[a][b]})" for a, b in pairwise(path)]
    return "\n    ".join(steps)


def test_the_graph_sees_function_level_and_relative_imports():
    """The parser itself: a function-level relative import is an edge, a TYPE_CHECKING one is not."""
    graph = import_graph()
    assert len(graph) > 100, "the packages were not found"
    # peg_core/__init__ imports its children at top level (relative, ``from .x import y``)
    assert "peg_core.peg" in graph["peg_core"]
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .a import b\nelse:\n    from .c import d\n"
        "def f():\n    from ..e import g\n"
    )
    found = [(n.level, n.module) for n in _import_nodes(tree) if isinstance(n, ast.ImportFrom)]
    assert found == [(0, "typing"), (1, "c"), (2, "e")]


def test_no_import_cycle():
    graph = import_graph()
    cycles = _cycles(graph)
    if cycles:
        lines = [f"{len(cycles)} import cycle(s) among the packages (function-level imports included):"]
        for component in cycles:
            lines.append(f"  modules: {', '.join(component)}")
            lines.append(f"    {_one_loop(component, graph)}")
        pytest.fail("\n".join(lines), pytrace=False)


def test_no_cycle_between_subpackages():
    """The same graph with every module taken as its sub-package (``peg_core.interop.io`` ->
    ``peg_core.interop``; a top-level module stays itself): e.g. ``peg_core.models`` must not import
    ``peg_core.interop`` while ``peg_core.interop`` imports ``peg_core.models``, even when no two
    modules close the circle."""

    def part(module: str) -> str:
        return ".".join(module.split(".")[:2])

    graph = import_graph()
    packages: dict[str, dict[str, int]] = {}
    witness: dict[tuple[str, str], str] = {}  # (from, to) -> one module-level edge behind it
    for module, edges in graph.items():
        here = packages.setdefault(part(module), {})
        for target, line in edges.items():
            if part(target) != part(module):
                here.setdefault(part(target), line)
                witness.setdefault((part(module), part(target)), f"{module} -> {target}")
    cycles = _cycles(packages)
    if cycles:
        lines = [f"{len(cycles)} import cycle(s) between sub-packages:"]
        for component in cycles:
            members = set(component)
            lines.append(f"  {', '.join(component)}:")
            lines += [
                f"    {edge}" for (a, b), edge in sorted(witness.items()) if a in members and b in members
            ]
        pytest.fail("\n".join(lines), pytrace=False)


@pytest.mark.parametrize("task", sorted(LIBRARY))
def test_task_library_does_not_import_its_application(task):
    graph = import_graph()
    application = {f"{task}.{name}" for name in APPLICATION}
    bad = []
    for sub in LIBRARY[task]:
        library = f"{task}.{sub}"
        for module, edges in sorted(graph.items()):
            if module != library and not module.startswith(library + "."):
                continue
            for target, line in sorted(edges.items()):
                if any(target == app or target.startswith(app + ".") for app in application):
                    bad.append(f"{module} imports {target} ({_modules()[module].relative_to(ROOT)}:{line})")
    assert not bad, "library modules import the application:\n  " + "\n  ".join(bad)
