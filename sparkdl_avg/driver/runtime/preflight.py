"""A check, before training, that executors can run the trainer's code.

On a real cluster the executors' Python may lack ``sparkdl_avg`` (not shipped
with ``--py-files`` / ``--archives``) or TensorFlow; without this check that
shows up minutes later as a Py4J stack trace from the first round.
:func:`check_executors` runs one cheap Spark job whose tasks import both and
describe their Python (interpreter, where ``sparkdl_avg`` was imported from,
versions, assigned GPUs); it fails with one clear message naming the fix.
The tasks consume their input, so their Python workers (now with TensorFlow
imported) are reused by the first round.

:func:`check_executors` runs on the driver; the tasks' body is
:mod:`sparkdl_avg.executor.describe`.
"""

from __future__ import annotations

from typing import List, Optional

from ...errors import ExecutorEnvironmentError
from ...executor.describe import probe_batches
from ...shared.errors.remote_errors import last_line
from .session import Engine

SHIP_HINT = (
    "ship it with spark-submit --py-files dist/sparkdl_avg-<version>.zip (built by `make dist`) "
    "or an --archives environment that has it installed; see docs/guides/cluster.md, 'Shipping the code to executors'"
)


def check_executors(spark, num_tasks: Optional[int] = None, preprocess=None) -> List[dict]:
    """Runs :func:`~sparkdl_avg.executor.describe.describe_python` in ``num_tasks`` tasks; raises if executors lack a package.

    Args:
        spark: The SparkSession (classic or Connect) or its :class:`~sparkdl_avg.driver.runtime.session.Engine`.
        num_tasks: Tasks to run; default the cluster's default parallelism.
        preprocess: A preprocessing function (or its
            :class:`~sparkdl_avg.shared.data.preprocess.Preprocess`) the
            executors must be able to load, or ``None``.

    Returns:
        One description per task (see :func:`~sparkdl_avg.executor.describe.describe_python`).

    Raises:
        ExecutorEnvironmentError: an executor cannot import ``sparkdl_avg``
            or TensorFlow/Keras.
        ConfigurationError: an executor cannot load ``preprocess`` (its
            module is not shipped); names the module and how to ship it.
    """
    import json
    from functools import partial

    from ...errors import ConfigurationError
    from ...shared.data.preprocess import Preprocess

    engine = spark if isinstance(spark, Engine) else Engine(spark)
    n = max(1, int(num_tasks or engine.default_parallelism))
    try:
        with engine.labels("sparkdl_avg: check executors' Python"):
            body = partial(probe_batches, preprocess=Preprocess.of(preprocess)) if preprocess else probe_batches
            rows = engine.run_tasks(n, body, "info string").collect()
        infos = [json.loads(r.info) for r in rows]
    except Exception as exc:
        # Not remote.run_job: the probe reports import errors in its result instead of raising, and
        # a task that fails anyway could not load sparkdl_avg to mark its error; the text is all there is.
        text = str(exc)
        if "No module named 'sparkdl_avg'" in text:
            daemon = (
                " The session's spark.python.daemon.module=sparkdl_avg.daemon needs it installed in the "
                "executors' Python (files shipped with --py-files come too late for the daemon); otherwise "
                "leave that setting out."
                if "sparkdl_avg.daemon" in text
                else ""
            )
            raise ExecutorEnvironmentError(f"Executors cannot import sparkdl_avg: {SHIP_HINT}.{daemon}") from None
        cause = (last_line(text, containing="Error") or type(exc).__name__).strip()
        raise ExecutorEnvironmentError(f"Executors failed to start the trainer's code: {cause}") from exc
    broken = [i for i in infos if "import_error" in i]
    if broken:
        info = broken[0]
        raise ExecutorEnvironmentError(
            f"The executors' Python ({info['python']} on {info['host']}) cannot import TensorFlow/Keras: "
            f"{info['import_error']}. Point PYSPARK_PYTHON at a Python that has them, or ship an environment "
            "with --archives (see docs/guides/cluster.md, 'Shipping the code to executors')."
        )
    unloadable = [i for i in infos if "preprocess_error" in i]
    if unloadable:
        raise ConfigurationError(unloadable[0]["preprocess_error"])
    return infos
