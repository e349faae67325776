"""Error types raised by sparkdl_avg.

Every error subclasses a standard Python exception (``ValueError`` or
``RuntimeError``) so that existing ``except`` clauses keep working, in the
style of scikit-learn's ``InvalidParameterError``.
"""


class ConfigurationError(ValueError):
    """A trainer parameter or the model has an invalid value."""


class DataError(ValueError):
    """The training or evaluation data does not fit the model or the options.

    The message names the column (or array) and the value that was received.
    """


class WorkerError(RuntimeError):
    """A task on an executor failed; the message names the epoch, round and worker."""


# Executors cannot raise our exception types through Spark (they arrive as
# Py4J/PythonException text), so executor-side data errors carry this marker
# and the driver turns them back into ``DataError`` with the same message.
DATA_ERROR_MARKER = "sparkdl_avg.DataError: "

# Likewise, a failure while training a replica is re-raised on the executor
# with this marker, the worker's index, epoch and round, and the original
# error's type and full message on one line, so the driver's WorkerError can
# name the worker and keep the cause.
WORKER_ERROR_MARKER = "sparkdl_avg.WorkerFailure: "
