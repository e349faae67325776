"""Executes every notebook in ``notebooks/`` top to bottom and checks what it printed.

Each ``notebooks/*.ipynb`` is run by ``nbclient`` in a fresh ``python3``
kernel (this interpreter: ``ipykernel`` from the dev extras), with the
notebooks directory as its working directory, as Jupyter would. A new
notebook needs no change here; it is picked up by the glob.

Convention the checks rely on: a notebook that reports a classifier's quality
prints lines ``Held-out accuracy...: <number>``; every such line must show at
least ``MIN_ACCURACY`` (or the notebook's entry in ``MIN_ACCURACY_BY_NOTEBOOK``),
and the notebooks listed in ``EXPECTED_ACCURACY_LINES`` must print that many.

Committed notebooks carry no outputs (``test_notebook_is_stripped``).
"""

from __future__ import annotations

import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))

# Seconds one cell may run; the notebooks take well under a minute each.
CELL_TIMEOUT_S = 300
MIN_ACCURACY = 0.85
MIN_ACCURACY_BY_NOTEBOOK = {"quickstart.ipynb": 0.9}
# "Held-out accuracy" lines each of these notebooks must print.
EXPECTED_ACCURACY_LINES = {"quickstart.ipynb": 2, "pipeline.ipynb": 2}

ACCURACY_LINE = re.compile(r"^Held-out accuracy[^:\n]*:\s*([0-9]*\.?[0-9]+)", re.MULTILINE)


def _ids(paths):
    return [p.name for p in paths]


def test_notebooks_found():
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"
    for name in EXPECTED_ACCURACY_LINES:
        assert (NOTEBOOK_DIR / name).exists(), f"notebooks/{name} is missing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_stripped(path):
    """Committed notebooks have no outputs or execution counts (small diffs, no stale results)."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: cell {i} has outputs; strip them before committing"
            assert cell.execution_count is None, f"{path.name}: cell {i} has an execution count"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernel must be python3"


def _stream_text(nb) -> str:
    """Everything the notebook's code cells printed (stdout, stderr, text results)."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            elif out.output_type in ("execute_result", "display_data"):
                parts.append(out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def _measures_time(nb) -> bool:
    """Whether a notebook times its own work (``advise``, within a budget): it runs alone."""
    return any(cell.cell_type == "code" and "advise(" in cell.source for cell in nb.cells)


def _execute(path, env, wait_for=()):
    """Executes the notebook at ``path`` (after the futures ``wait_for``) with the environment ``env``; returns ``(nb,
    seconds, error)``.

    ``env`` is a copy of ``os.environ`` made on pytest's thread: the kernel's start copies the environment it is
    given, and copying ``os.environ`` itself here, in a pool thread, raced pytest setting and deleting
    ``PYTEST_CURRENT_TEST`` between a test's phases (``KeyError: 'PYTEST_CURRENT_TEST'`` in a CI run, 2026-12-07).
    """
    for future in wait_for:
        future.exception()  # waits; its own test reports what it raised
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    t0 = time.perf_counter()
    try:
        client.execute(env=env)
        error = None
    except nbclient.exceptions.CellExecutionError as exc:
        error = exc
    return nb, time.perf_counter() - t0, error


@pytest.fixture(scope="module")
def executed(request):
    """``{name: future of _execute's result}`` for the selected notebooks, started when the first test asks.

    A notebook's kernel, Spark JVM and Python workers keep about one of 2
    cores busy, so the notebooks run together; one that times its own work
    (:func:`_measures_time`: ``advise`` and its budget) runs after them, alone.
    """
    paths = [item.callspec.params["path"] for item in request.session.items
             if item.module is request.module and getattr(item, "originalname", None) == "test_notebook_runs"]
    alone = [p for p in paths if _measures_time(nbformat.read(p, as_version=4))]
    together = [p for p in paths if p not in alone]
    pool = ThreadPoolExecutor(max(1, len(together)) + len(alone))
    env = dict(os.environ)  # here, on pytest's thread (see _execute)
    futures = {p.name: pool.submit(_execute, p, env) for p in together}
    first = list(futures.values())
    for p in alone:  # one after another, after those that run together
        futures[p.name] = pool.submit(_execute, p, env, first)
        first = [futures[p.name]]
    try:
        yield futures
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# Each starts a kernel, a Spark JVM and TensorFlow in its Python workers:
# 40-150 s per notebook on a busy 2-core machine.
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs(path, tmp_path, executed):
    nb, elapsed, error = executed[path.name].result()
    if error is not None:
        executed_copy = tmp_path / path.name
        nbformat.write(nb, executed_copy)
        raise error

    # The kernel must be this interpreter (the venv with TensorFlow and sparkdl_avg),
    # not another "python3" kernel registered for the user.
    text = _stream_text(nb)
    kernel_python = re.search(r"^Python of the driver and the executors: (.+)$", text, re.MULTILINE)
    if kernel_python:
        assert Path(kernel_python.group(1).strip()).parent.resolve() == Path(sys.executable).parent.resolve(), (
            f"the python3 kernel ran {kernel_python.group(1)}, not {sys.executable}"
        )

    errors = [out for cell in nb.cells for out in cell.get("outputs", []) if out.output_type == "error"]
    assert not errors, f"{path.name} raised: {errors[0].ename}: {errors[0].evalue}"
    text = _stream_text(nb)
    assert "Traceback" not in text, f"{path.name} printed a traceback:\n{text[-3000:]}"

    accuracies = [float(v) for v in ACCURACY_LINE.findall(text)]
    expected = EXPECTED_ACCURACY_LINES.get(path.name)
    if expected is not None:
        assert len(accuracies) == expected, (
            f"{path.name} printed {len(accuracies)} 'Held-out accuracy' lines, expected {expected}:\n{text[-3000:]}"
        )
    threshold = MIN_ACCURACY_BY_NOTEBOOK.get(path.name, MIN_ACCURACY)
    for value in accuracies:
        assert value >= threshold, f"{path.name}: held-out accuracy {value} < {threshold}\n{text[-3000:]}"
    check = EXTRA_CHECKS.get(path.name)
    if check is not None:
        check(nb, text)
    print(f"{path.name}: executed in {elapsed:.1f} s; held-out accuracies {accuracies}", file=sys.stderr)


def _plotly_figures(nb) -> int:
    return sum(
        "application/vnd.plotly.v1+json" in out.get("data", {})
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if out.output_type in ("display_data", "execute_result")
    )


def _check_quickstart(nb, text: str) -> None:
    # Progress: one log line per epoch and the time summary, shown in the notebook.
    assert re.search(r"^Epoch 10/10 - \d+ rounds", text, re.MULTILINE), f"no per-epoch progress lines:\n{text[-3000:]}"
    assert "Time in rounds:" in text
    # The loss curves and the time breakdown, inline.
    assert _plotly_figures(nb) == 3  # advise's speed-up plot, then the loss curves and the time breakdown
    assert re.search(r"^(Stay on one machine: one epoch takes|Use \d+ workers with averaging_frequency >=)", text,
                     re.MULTILINE), text[-3000:]
    assert "Held-out accuracy of trainer.predict" in text
    # MLflow: the fit's run, its final evaluation, and the logged model
    assert re.search(r"^run digits-mlp FINISHED params: \d+ \| val_accuracy 0\.9\d* \| final_accuracy 0\.9", text,
                     re.MULTILINE), text[-3000:]
    assert "the logged model predicts as trainer.model" in text


def _check_pipeline(nb, text: str) -> None:
    assert "loaded pipeline predicts the same: True" in text
    assert re.search(r"averagingFrequency=1: validation accuracy", text)
    assert re.search(r"averagingFrequency=4: validation accuracy", text)


EXTRA_CHECKS = {"quickstart.ipynb": _check_quickstart, "pipeline.ipynb": _check_pipeline}
