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

SIDES = ("driver", "executor", "shared")
"""The subpackages, by where their code runs: the user's process, the executors' Python workers, both."""

TOP_SHARED = {"errors", "version"}
"""Top-level modules both sides import (the exception hierarchy, the version)."""

SHIMS = {"api", "daemon", "ml", "tracking", "cli", "testing"}
"""Top-level paths users and jobs write (and ``api``, the names ``__init__`` re-exports), naming modules below."""

DRIVER_SHIMS = {"driver.ml", "driver.pyfunc"}
"""Old paths inside the driver that saved files record (Spark ML pipelines, MLflow models)."""

DRIVER_LAYERS = {
    "algorithms": set(),
    "runtime": set(),
    "elastic": {"runtime"},  # membership reads Spark's status store through the session layer
    "config": {"algorithms"},
    "data": {"config", "runtime"},
    "transport": {"config", "runtime"},
    "observe": {"config", "runtime"},
    "checkpoint": {"algorithms", "config", "elastic", "transport"},
    "fit": {"algorithms", "checkpoint", "config", "data", "elastic", "observe", "runtime", "transport"},
    "api": {"algorithms", "checkpoint", "config", "data", "elastic", "fit", "observe", "runtime", "transport"},
}
"""The driver's folders and the folders each may import: data flows one way, from :mod:`api` down."""


def _modules() -> dict:
    """Every module of the package by dotted name below it (``"driver.trainer"``; ``"__init__"`` for the root)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1]) if parts[-1] == "__init__" and len(parts) > 1 else ".".join(parts)
        found[name] = path
    return found


def _side(module: str) -> str:
    head = module.split(".")[0]
    if head in SIDES:
        return head
    return "shared" if head in TOP_SHARED else "top"


def _resolve(dotted: str, modules) -> str:
    """The package module a dotted name below the package refers to (a name in a module: that module)."""
    while dotted and dotted not in modules:
        dotted = dotted.rpartition(".")[0]
    return dotted or "__init__"


def _imports(name: str, path: Path, modules) -> set:
    """The package's modules that module ``name`` imports anywhere in it (``"__init__"``: the root)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package and package != "__init__" else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                absolute = ".".join(base + ([node.module] if node.module else []))
            elif node.module == "sparkdl_avg" or (node.module or "").startswith("sparkdl_avg."):
                absolute = node.module.partition(".")[2]
            else:
                continue
            for alias in node.names:  # `from x import y`: y may be a module of x
                below = f"{absolute}.{alias.name}" if absolute else alias.name
                found.add(below if below in modules else _resolve(absolute, modules))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "sparkdl_avg" or alias.name.startswith("sparkdl_avg."):
                    found.add(_resolve(alias.name.partition(".")[2], modules))
    return found - {name}


@pytest.fixture(scope="module")
def graph() -> dict:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


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
    assert {"shared.wire.aggregation", "shared.model.modelspec", "shared.data.example_order",
            "shared.wire.stats"} <= graph["executor.worker"]
    assert "executor.warm" in graph["driver.runtime.session"]  # session imports the warm-up tasks inside Engine._warm_up only
    assert "errors" in graph["driver.api.trainer"] and "driver.fit.loop" in graph["driver.api.trainer"]
    assert "driver.fit.rounds" in graph["driver.fit.loop"]
    assert graph["errors"] == set()
    assert graph["ml"] == {"driver.api.ml"}
    assert graph["driver.ml"] == {"driver.api.ml"}


def test_no_module_is_on_an_import_cycle(graph):
    cycles = [c for c in (_cycle_through(graph, m) for m in sorted(graph) if m != "__init__") if c]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_the_package_root_or_a_shim(graph):
    # The root imports the public API (the trainer, the advisor): a module importing it is on a cycle with them.
    # The shims are for users: the package's own code names the modules they stand for.
    shims = {"__init__"} | SHIMS | DRIVER_SHIMS
    wrong = {m: sorted(deps & shims) for m, deps in graph.items() if m not in shims and deps & shims}
    assert wrong == {}


def test_the_drivers_folders_import_only_the_folders_below_them(graph):
    folders = {p.name for p in (PACKAGE / "driver").iterdir() if (p / "__init__.py").exists()}
    assert folders == set(DRIVER_LAYERS), "a driver folder without a layer (or a layer without its folder)"
    wrong = set()
    for module, deps in graph.items():
        parts = module.split(".")
        if parts[0] != "driver" or len(parts) < 3:
            continue
        for dep in deps:
            dep_parts = dep.split(".")
            if dep_parts[0] == "driver" and dep_parts[1] != parts[1]:
                if len(dep_parts) < 3 or dep_parts[1] not in DRIVER_LAYERS[parts[1]]:
                    wrong.add(f"{module} -> {dep}")
    assert not wrong, "driver modules importing a folder above theirs (or a shim): " + ", ".join(sorted(wrong))


def test_every_folder_docstring_says_what_it_owns_and_names_its_modules():
    import re

    unnamed, gone = {}, {}
    for init in sorted(PACKAGE.rglob("__init__.py")):
        folder = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and len(doc) > 60, f"{init.relative_to(PACKAGE)} says nothing of what its folder owns"
        here = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
        here |= {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
        missing = sorted(m for m in here if not re.search(rf"\b{re.escape(m)}\b", doc))
        if missing:
            unnamed[str(folder.relative_to(PACKAGE.parent))] = missing
        named = set(re.findall(r":mod:`\.(\w+)", doc))  # a module of this folder, by its relative name
        if named - here:
            gone[str(folder.relative_to(PACKAGE.parent))] = sorted(named - here)
    assert unnamed == {}, f"folder docstrings that do not name these modules of theirs: {unnamed}"
    assert gone == {}, f"folder docstrings that name modules no longer there: {gone}"


def test_no_module_is_over_600_lines_and_no_folder_holds_over_a_quarter_of_the_package():
    lines = {path: len(path.read_text(encoding="utf-8").splitlines()) for path in PACKAGE.rglob("*.py")}
    long = {str(p.relative_to(PACKAGE)): n for p, n in lines.items() if n > 600}
    assert long == {}, f"modules over 600 lines: {long}"
    total = sum(lines.values())
    folders = {}
    for path, n in lines.items():
        folders[path.parent] = folders.get(path.parent, 0) + n
    crowded = {str(f.relative_to(PACKAGE.parent)): round(n / total, 3) for f, n in folders.items() if n > total / 4}
    assert crowded == {}, f"folders holding over 25% of the package's {total} lines: {crowded}"


def test_every_module_is_on_a_side():
    top = {name for name in _modules() if "." not in name and name not in SIDES}
    assert top == TOP_SHARED | SHIMS | {"__init__"}, "a top-level module that is neither public nor on a side"


def test_executor_side_and_shared_modules_never_import_driver_side_ones(graph):
    driver = {m for m in graph if _side(m) == "driver"}
    executor = {m for m in graph if _side(m) == "executor"}
    assert "driver.api.trainer" in driver and "driver.fit.rounds" in driver and "executor.worker" in executor
    wrong = {m: sorted(graph[m] & driver) for m in sorted(graph)
             if _side(m) in ("executor", "shared") and graph[m] & driver}
    assert wrong == {}, f"executor-side or shared modules importing driver-side ones: {wrong}"
    shared_on_executors = {m: sorted(graph[m] & executor) for m in sorted(graph)
                           if _side(m) == "shared" and graph[m] & executor}
    assert shared_on_executors == {}, f"shared modules importing executor-side ones: {shared_on_executors}"


def test_the_root_exports_what_it_imports_for_users():
    import sparkdl_avg

    missing = [name for name in sparkdl_avg.__all__ if not hasattr(sparkdl_avg, name)]
    assert missing == []
    assert {"ParameterAveragingTrainer", "KerasAveragingEstimator", "MlflowLogger", "FitInfo", "PathError"} <= set(
        sparkdl_avg.__all__)


def test_the_shims_are_the_modules_they_name():
    import importlib

    for shim, real in [("ml", "driver.api.ml"), ("tracking", "driver.observe.tracking"), ("cli", "driver.api.cli"),
                       ("testing", "executor.testing"), ("driver.ml", "driver.api.ml"),
                       ("driver.pyfunc", "driver.observe.pyfunc")]:
        assert importlib.import_module(f"sparkdl_avg.{shim}") is importlib.import_module(f"sparkdl_avg.{real}")
    from sparkdl_avg.ml import KerasAveragingModel

    assert KerasAveragingModel.__module__ == "sparkdl_avg.driver.ml"  # the path saved pipelines have recorded


def test_every_error_the_library_raises_is_one_hierarchy():
    import inspect

    import sparkdl_avg
    from sparkdl_avg import errors

    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(classes) >= 9
    for cls in classes:
        assert issubclass(cls, errors.SparkdlAvgError), cls
        assert cls is errors.SparkdlAvgError or issubclass(cls, (ValueError, RuntimeError)), cls  # old excepts work
        assert getattr(sparkdl_avg, cls.__name__) is cls and cls.__name__ in sparkdl_avg.__all__
    # no module of the package defines an error type of its own outside errors.py, but the jobs' usage error
    import ast

    defined = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error") and path.name != "errors.py":
                defined.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert defined == ["driver/api/cli.py:UsageError"]


def test_the_extension_tests_use_only_the_public_api():
    """Issue 46: a user's rule, outer optimizer and data adapter are tested as a user writes them: public names only."""
    import sparkdl_avg

    modules = sorted((PACKAGE.parent / "tests").rglob("test_extensions*.py"))
    assert modules, "no tests/**/test_extensions*.py"
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sparkdl_avg"):
                assert node.module == "sparkdl_avg", f"{path.name} imports from {node.module}"
                names = {alias.name for alias in node.names}
                assert names <= set(sparkdl_avg.__all__), f"{path.name} imports {sorted(names - set(sparkdl_avg.__all__))}"
            elif isinstance(node, ast.Import):
                assert all(a.name == "sparkdl_avg" or not a.name.startswith("sparkdl_avg") for a in node.names), path.name
