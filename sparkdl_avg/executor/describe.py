"""Executor side of the executors' check: a task's description of its Python (what it imported, from where).

:func:`sparkdl_avg.driver.runtime.preflight.check_executors` runs :func:`probe_batches`
in a few tasks before training, so a missing package on the executors is one
clear error on the driver rather than a stack trace from the first round.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Iterable, Iterator

from ..version import __version__


def describe_python() -> dict:
    """This process' Python as the trainer sees it (runs on an executor)."""
    info = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "python": sys.executable,
        "python_version": sys.version.split()[0],
        "sparkdl_avg_file": os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "__init__.py"),
        "sparkdl_avg_version": __version__,
    }
    try:
        from ..shared.model.quiet import import_tensorflow

        tf = import_tensorflow()
        import keras

        info["tensorflow_version"] = tf.__version__
        info["keras_version"] = keras.__version__
    except Exception as exc:  # reported to the driver, which raises
        info["import_error"] = f"{type(exc).__name__}: {exc}"
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None:
            from ..shared.model.devices import assigned_addresses

            info["gpus"] = list(assigned_addresses(ctx.resources()))
    except Exception:  # pragma: no cover - informative only
        pass
    return info


def probe_batches(batches: Iterable, preprocess=None) -> Iterator:
    """``mapInArrow`` body: the task's :func:`describe_python` as one JSON row.

    With ``preprocess`` (a :class:`~sparkdl_avg.shared.data.preprocess.Preprocess`)
    it also loads the function as the rounds will, and reports why it
    cannot (``preprocess_error``): a module the executors lack.
    """
    import json

    import pyarrow as pa

    for _ in batches:  # consume the input so PySpark reuses this worker
        pass
    info = describe_python()
    if preprocess is not None and "import_error" not in info:
        from ..errors import ConfigurationError

        try:
            preprocess.function()
        except ConfigurationError as exc:
            info["preprocess_error"] = str(exc)
    yield pa.RecordBatch.from_pydict({"info": [json.dumps(info)]})
