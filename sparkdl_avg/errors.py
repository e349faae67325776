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


class PathError(ValueError):
    """A path or URI cannot be used: no filesystem opens it, no file is there, or one is and may not be replaced.

    The message names the path.
    """


class CheckpointError(PathError):
    """A checkpoint cannot be read back: a file of it is missing, truncated or altered.

    The message names the checkpoint and what to do (resume from the previous
    one, which ``fit(resume=True)`` does by itself when one verifies).
    """


class SessionError(DataError, ConfigurationError):
    """A call needs an active SparkSession and there is none (numpy data, ``warm_up()``, a model path).

    A ``DataError`` and a ``ConfigurationError`` both, for the ``except``
    clauses written when these cases raised one or the other.
    """


class NotFittedError(RuntimeError):
    """A call needs a completed ``fit`` (``write_report``) and there has been none."""
