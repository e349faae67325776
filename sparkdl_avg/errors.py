"""Error types raised by sparkdl_avg: one hierarchy under :class:`SparkdlAvgError`.

Every error is a :class:`SparkdlAvgError` (``except sparkdl_avg.SparkdlAvgError``
catches all of the library's) and subclasses a standard Python exception
(``ValueError`` or ``RuntimeError``) so that existing ``except`` clauses keep
working, in the style of scikit-learn's ``InvalidParameterError``. Unknown
keyword arguments raise ``TypeError``, as any Python call does.
"""


class SparkdlAvgError(Exception):
    """The base of every error sparkdl_avg raises on purpose."""


class ConfigurationError(SparkdlAvgError, ValueError):
    """A trainer parameter or the model has an invalid value."""


class DataError(SparkdlAvgError, ValueError):
    """The training or evaluation data does not fit the model or the options.

    The message names the column (or array) and the value that was received.
    """


class WorkerError(SparkdlAvgError, RuntimeError):
    """A task on an executor failed; the message names the epoch, round and worker.

    Where the library's executor code reported the failure, the executor's Python traceback is in
    ``executor_traceback`` (text) and PySpark's exception in ``spark_exception``, rather than printed before the
    message; a failure outside it (a lost executor) is chained to PySpark's exception.
    """


class PathError(SparkdlAvgError, ValueError):
    """A path or URI cannot be used: no filesystem opens it, no file is there, or one is and may not be replaced.

    The message names the path.
    """


class CheckpointError(PathError):
    """A checkpoint cannot be written (a full disk) or read back: a file of it is missing, truncated or altered.

    The message names the checkpoint and what to do (resume from the previous
    one, which ``fit(resume=True)`` does by itself when one verifies).
    """


class SessionError(DataError, ConfigurationError):
    """A call needs an active SparkSession and there is none (numpy data, ``warm_up()``, a model path).

    A ``DataError`` and a ``ConfigurationError`` both, for the ``except``
    clauses written when these cases raised one or the other.
    """


class NotFittedError(SparkdlAvgError, RuntimeError):
    """A call needs a completed ``fit`` (``write_report``) and there has been none."""


class ExecutorEnvironmentError(SparkdlAvgError, RuntimeError):
    """The executors' Python cannot run the trainer (a missing package, most often); the message names the fix."""
