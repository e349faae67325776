"""The package's layering, read from its source: no import cycle, and executor-side code never imports the driver's.

Every import counts, also those inside functions (a lazy import is still a
dependency, and a cycle through one is still a cycle to a reader). Pure
source analysis: no Spark, no TensorFlow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "sparkdl_avg"

EXECUTOR = {"worker", "predict_worker", "export", "daemon"}
"""Modules whose code runs in the executors' Python workers (and the daemon that forks them)."""

SHARED = {
    "aggregation", "checks", "custom_objects", "dataset", "devices", "errors", "exchange", "fs", "interrupt",
    "modelspec", "plan", "quiet", "remote", "stats", "version",
}
"""Modules both sides import: records, formats, the error protocol, file systems."""


def _modules() -> dict:
    return {p.stem: p for p in sorted(PACKAGE.glob("*.py"))}


def _imports(path: Path, modules) -> set:
    """The package's modules that ``path`` imports anywhere in it (``"__init__"`` for the package itself)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            absolute = node.module or ""
            if node.level == 1:
                if node.module:
                    found.add(node.module.split(".")[0])
                else:  # from . import x, y: modules, or names of the package's __init__
                    found.update(a.name if a.name in modules else "__init__" for a in node.names)
            elif absolute == "sparkdl_avg":
                found.update(a.name if a.name in modules else "__init__" for a in node.names)
            elif absolute.startswith("sparkdl_avg."):
                found.add(absolute.split(".")[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("sparkdl_avg."):
                    found.add(alias.name.split(".")[1])
                elif alias.name == "sparkdl_avg":
                    found.add("__init__")
    return found - {path.stem}


@pytest.fixture(scope="module")
def graph() -> dict:
    modules = _modules()
    return {name: _imports(path, modules) for name, path in modules.items()}


def _cycle_through(graph: dict, start: str):
    """One import cycle through ``start`` as a list of modules, or ``None``."""
    stack = [(start, [start])]
    seen = set()
    while stack:
        node, path = stack.pop()
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


def test_the_import_graph_is_read_from_the_source(graph):
    # The analysis itself: known edges are found, lazy (function-level) imports included.
    assert {"aggregation", "modelspec", "plan", "stats"} <= graph["worker"]
    assert "worker" in graph["session"]  # session imports worker inside Engine._warm_up only
    assert graph["errors"] == set()


def test_no_module_is_on_an_import_cycle(graph):
    cycles = [c for c in (_cycle_through(graph, m) for m in sorted(graph) if m != "__init__") if c]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_the_package_root(graph):
    # The root imports the public API (the trainer, the advisor): a module importing it is on a cycle with them.
    assert [m for m, deps in graph.items() if "__init__" in deps and m != "__init__"] == []


def test_executor_side_and_shared_modules_never_import_driver_side_ones(graph):
    unknown = set(graph) - EXECUTOR - SHARED
    assert "trainer" in unknown and "round" in unknown  # the rest is the driver's
    wrong = {m: sorted(graph[m] & unknown) for m in sorted(EXECUTOR | SHARED) if m in graph and graph[m] & unknown}
    assert wrong == {}, f"executor-side or shared modules importing driver-side ones: {wrong}"
    shared_on_executors = {m: sorted(graph[m] & EXECUTOR) for m in sorted(SHARED) if m in graph and graph[m] & EXECUTOR}
    assert shared_on_executors == {}, f"shared modules importing executor-side ones: {shared_on_executors}"
