"""README.md stays true to the code: every public parameter documented, commands present, links alive.

The "Configuration reference" section documents each callable in a Markdown
table (first column: the parameter in backticks, second: its default). A
table belongs to the callable named by the first backticked span of the
paragraph just above it (``ParameterAveragingTrainer(model, ...)``,
``trainer.fit(data, ...)``, ``KerasAveragingEstimator``, ...). The checks
compare those tables with ``inspect.signature`` and the Spark ML ``Params``:
a parameter added to the code without a row here makes the test fail, and so
does a row for a parameter that no longer exists. Every row of the option
table (``sparkdl_avg/driver/config/options.py``) must appear with its default, and its flag
in the jobs' section. Every Python block must parse, and the Quickstart's
runs as written, in a Python of its own (its own ``local[2]`` session, as a
reader's would be); the other checks need no Spark session.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

NO_DEFAULT = "—"


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\s*$(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def _cells(line: str):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def reference_tables() -> dict:
    """``{callable key: {parameter: default cell}}`` from the Configuration reference.

    The key is the first backticked span of the paragraph above the table, cut
    at its ``(``: ``ParameterAveragingTrainer``, ``trainer.fit``, ...
    """
    lines = _section(README.read_text(encoding="utf-8"), "Configuration reference").splitlines()
    tables: dict = {}
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("|"):
            i += 1
            continue
        start = i
        while i < len(lines) and lines[i].lstrip().startswith("|"):
            i += 1
        rows = lines[start:i]
        # The paragraph just above the table.
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        para = []
        while j >= 0 and lines[j].strip():
            para.insert(0, lines[j])
            j -= 1
        span = re.search(r"`([^`]+)`", " ".join(para))
        assert span, f"the table at {rows[0]!r} has no paragraph naming what it documents"
        key = span.group(1).split("(")[0].strip()
        assert key not in tables, f"two tables document {key}"
        params = {}
        for row in rows[2:]:  # header and separator first
            cells = _cells(row)
            name = re.fullmatch(r"`([A-Za-z_][A-Za-z0-9_]*)`", cells[0])
            assert name, f"{key}: the first cell of {row!r} should be one `parameter`"
            assert len(cells) >= 3 and cells[2], f"{key}: {name.group(1)} has no meaning"
            params[name.group(1)] = cells[1]
        tables[key] = params
    return tables


def _trainer():
    from sparkdl_avg import ParameterAveragingTrainer

    return ParameterAveragingTrainer


def _signature_params(func) -> dict:
    """``{name: default}`` of the public parameters (``inspect.Parameter.empty`` when required)."""
    return {
        name: p.default
        for name, p in inspect.signature(func).parameters.items()
        if name != "self" and not name.startswith("_") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def _stage_params(cls) -> dict:
    """The Spark ML Params of ``cls`` plus its constructor's keyword arguments (``kerasModel``)."""
    params = _signature_params(cls.__init__)
    for p in cls().params:
        params.setdefault(p.name, inspect.Parameter.empty)
    return params


def _callables():
    from sparkdl_avg.ml import KerasAveragingEstimator, KerasAveragingModel
    from sparkdl_avg.tracking import MlflowLogger

    trainer = _trainer()
    return {
        "ParameterAveragingTrainer": _signature_params(trainer.__init__),
        "trainer.fit": _signature_params(trainer.fit),
        "trainer.evaluate": _signature_params(trainer.evaluate),
        "trainer.predict": _signature_params(trainer.predict),
        "KerasAveragingEstimator": _stage_params(KerasAveragingEstimator),
        "KerasAveragingModel": _stage_params(KerasAveragingModel),
        "MlflowLogger": _signature_params(MlflowLogger.__init__),
    }


CALLABLES = [
    "ParameterAveragingTrainer",
    "trainer.fit",
    "trainer.evaluate",
    "trainer.predict",
    "KerasAveragingEstimator",
    "KerasAveragingModel",
    "MlflowLogger",
]


@pytest.fixture(scope="module")
def tables():
    return reference_tables()


@pytest.fixture(scope="module")
def api():
    return _callables()


@pytest.mark.parametrize("key", CALLABLES)
def test_every_public_parameter_is_documented(key, tables, api):
    assert key in tables, (
        f"README.md's 'Configuration reference' has no table for {key} "
        f"(found tables for: {sorted(tables)})"
    )
    documented, actual = set(tables[key]), set(api[key])
    missing = sorted(actual - documented, key=list(api[key]).index)
    assert not missing, f"{key}: parameters missing from README.md's Configuration reference: {missing}"
    stale = sorted(documented - actual)
    assert not stale, f"{key}: README.md documents parameters that do not exist: {stale}"


@pytest.mark.parametrize("key", CALLABLES)
def test_documented_defaults_match(key, tables, api):
    """A default written as a Python literal (`32`, `"average"`, `None`) must be the real one.

    Descriptive defaults ("unset", "—") are not compared, except that a
    parameter without a default must be shown as "—".
    """
    if key not in tables:
        pytest.skip(f"no table for {key} (reported by test_every_public_parameter_is_documented)")
    for name, cell in tables[key].items():
        if name not in api[key]:
            continue
        default = api[key][name]
        if default is inspect.Parameter.empty:
            if key.startswith(("ParameterAveragingTrainer", "trainer.")):
                assert cell == NO_DEFAULT, f"{key}: {name} has no default; README.md shows {cell!r}"
            continue
        literal = re.fullmatch(r"`(.+)`", cell)
        if literal is None:
            continue
        try:
            value = ast.literal_eval(literal.group(1))
        except (ValueError, SyntaxError):
            continue
        assert value == default and type(value) is type(default), (
            f"{key}: README.md says {name} defaults to {cell}; the code says {default!r}"
        )


def _expected_cell(default) -> str:
    """How the reference writes a default: `32`, `"average"`, `None`."""
    from sparkdl_avg.driver.config.codegen import literal

    return f"`{literal(default)}`"


def test_every_option_of_the_table_is_documented_with_its_default(tables):
    """Each row of sparkdl_avg.driver.config.options.OPTIONS: its trainer or fit row, its estimator Param, its flag.

    Unlike test_documented_defaults_match, descriptive cells are not skipped:
    the trainer's and fit's cells are the Python literal, the estimator's the
    literal or "unset" where the Param has no default.
    """
    from sparkdl_avg.driver.config import options

    jobs = _section(README.read_text(encoding="utf-8"), "Running on a cluster")
    wrong = []
    for o in options.OPTIONS:
        key = {options.TRAINER: "ParameterAveragingTrainer", options.FIT: "trainer.fit",
               options.TRACKING: "MlflowLogger"}.get(o.scope)
        if o.name == "mlflow":  # the switch of the jobs and the estimator, not a logger argument
            key = None
        if key is not None:
            cell = tables[key].get(o.name)
            if cell != _expected_cell(o.default):
                wrong.append(f"{key}: {o.name} is {cell!r}, expected {_expected_cell(o.default)!r}")
        if o.param is not None:
            default = o.param_default()
            expected = "unset" if default is None else _expected_cell(default)
            cell = tables["KerasAveragingEstimator"].get(o.param.name)
            if cell != expected:
                wrong.append(f"KerasAveragingEstimator: {o.param.name} is {cell!r}, expected {expected!r}")
        if o.cli is not None:
            flag = o.cli.flag or "--" + o.name.replace("_", "-")
            if not re.search(rf"`{re.escape(flag)}[` ]", jobs):
                wrong.append(f"'Running on a cluster' does not list {flag}")
    assert not wrong, "README.md's Configuration reference and sparkdl_avg/driver/config/options.py disagree:\n" + "\n".join(wrong)


def test_readme_parser_reads_the_trainer_table(tables):
    assert tables["ParameterAveragingTrainer"]["batch_size"] == "`32`"
    assert tables["ParameterAveragingTrainer"]["model"] == NO_DEFAULT


def test_the_two_commands():
    text = README.read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for command in ("make train", "make test"):
        assert re.search(rf"^{command}\b", text, re.MULTILINE), f"README.md does not show `{command}` in a code block"
        target = command.split()[1]
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), f"the Makefile has no '{target}' target"


def _links(text: str):
    """Targets of Markdown links and images, outside code blocks and code spans."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)  # link texts in backticks become empty: still links
    return re.findall(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)


def test_relative_links_point_to_files():
    text = README.read_text(encoding="utf-8")
    links = _links(text)
    assert links, "found no links in README.md"
    broken = []
    for target in links:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s)://, mailto:, in-page anchors
        path = target.split("#")[0]
        if not (README.parent / path).exists():
            broken.append(target)
    assert not broken, f"README.md links to missing files: {broken}"


def test_in_page_anchors_exist():
    text = README.read_text(encoding="utf-8")
    headings = re.findall(r"^#+ (.+)$", text, re.MULTILINE)

    def slug(heading: str) -> str:  # GitHub's anchor rule
        return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")

    anchors = {slug(h) for h in headings}
    missing = [t for t in _links(text) if t.startswith("#") and t[1:] not in anchors]
    assert not missing, f"README.md links to missing headings: {missing}"


def test_layout_names_every_module_and_every_module_says_what_it_owns():
    import ast
    import pathlib

    package = pathlib.Path(__file__).resolve().parents[1] / "sparkdl_avg"
    layout = README.read_text(encoding="utf-8").split("## Layout", 1)[1]
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and len(doc.split()) >= 8, f"{relative} has no module docstring saying what it owns"
        if path.name == "__init__.py":
            below = f"{relative.parent.name}/"  # a folder: in the tree
            assert below in layout or len(relative.parts) == 1, f"README's layout does not name {relative.parent}/"
        elif len(relative.parts) == 1:  # the root's modules: in the tree
            assert path.name in layout, f"README's layout does not name {relative}"
        elif relative.parts[0] == "driver" and len(relative.parts) == 2:  # the driver's shims of old paths
            assert f"driver/{path.name}" in layout, f"README's layout does not name {relative}"
        else:  # a side's modules: in its part of the table, by their path below the side
            side = layout.split(f"**{relative.parts[0]}/**", 1)[1].split("| **", 1)[0]
            name = "/".join(relative.parts[1:])
            assert f"`{name}`" in side, f"README's layout does not name {relative} under {relative.parts[0]}/"


def _python_blocks(text: str):
    """The ```python code blocks of ``text``, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_every_python_block_parses():
    blocks = _python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "README.md has no python blocks"
    for block in blocks:
        ast.parse(block)  # a SyntaxError names the line


def test_the_quickstart_runs_as_written(tmp_path):
    """Literally, top to bottom: every name it uses is defined in it (issue #29 item 16: val_df and test_df were not)."""
    blocks = _python_blocks(_section(README.read_text(encoding="utf-8"), "Quickstart"))
    assert len(blocks) == 1, "the Quickstart should be one python block"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    probe = "\nprint('REPLICAS', sum(r.replicas_built for r in trainer.stats.records))\n"
    proc = subprocess.run([sys.executable, "-c", blocks[0] + probe], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = [line for line in proc.stdout.splitlines() if line.strip()]
    assert printed[-1] == "REPLICAS 2"  # one replica per worker: not built again on a second set of workers
    assert printed[-2].startswith("{") and "'accuracy'" in printed[-2], proc.stdout[-2000:]
    assert ast.literal_eval(printed[-2])["accuracy"] > 0.8  # the digits are learnt, not just run through
    assert (tmp_path / "model.keras").is_file()
    # Issue 28 item 15: no TensorFlow start-up notices, no Spark progress bars over the epoch lines.
    for noise in ("absl::InitializeLog", "oneDNN", "cuda drivers", "cuInit", "cpu_feature_guard", "[Stage "):
        assert noise not in proc.stderr, proc.stderr[-3000:]
