"""Errors raised on executors and re-raised on the driver: the protocol between the two.

Executors cannot raise the package's exception types through Spark: a failed task reaches the driver as a
``Py4JJavaError`` or ``PythonException`` whose text holds the executor's traceback. This module owns both ends of
carrying a typed error across anyway. On executors, :func:`failure` makes the exception to raise (its text starts with
a marker naming the type) and :func:`reporting_data_errors` turns a ``DataError`` raised inside a Spark body into one;
:func:`one_line` flattens a message such as TensorFlow's, and :func:`root_cause` finds the innermost cause of a failed
driver-side Spark call (a read) under its Java stack trace. On the driver, :func:`run_job` runs a Spark action and
:func:`decode` turns its failure back into the typed error with the executor's message, or, for a failure that carries
no marker (a lost executor, a crashed Python worker, an executor that cannot import the package), into a
``WorkerError`` that says which job failed and quotes the failure's last line. Actions the user runs
(``trainer.predict(df).collect()``) do not pass through :func:`run_job`: :func:`decode_user_actions` makes PySpark
raise a marked ``DataError`` from them as a ``DataError`` too. The markers are private to this module.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import re
import sys
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Type, TypeVar

from ...errors import DataError, WorkerError
from . import interrupt

T = TypeVar("T")
_FRAME = re.compile(r"\s*(at [\w$.<>/]+\(.*\)|\.\.\. \d+ more)\s*$")

# The start of a staging task's result-row message for a full filesystem (reported_full), not a DataError.
_FULL = "sparkdl_avg.Full: "
# The start of a staging task's result-row message for a ConfigurationError (reported_configuration).
_CONFIGURATION = "sparkdl_avg.ConfigurationError: "

# Searched in this order: a data error wins over the worker failure that may wrap it.
_MARKERS = {
    DataError: "sparkdl_avg.DataError: ",
    WorkerError: "sparkdl_avg.WorkerFailure: ",
}


def failure(kind: Type[Exception], message: str) -> Exception:
    """Executor side: the exception to raise so that the driver re-raises ``kind(message)``.

    Args:
        kind: :class:`~sparkdl_avg.errors.DataError` or :class:`~sparkdl_avg.errors.WorkerError`.
        message: One line (see :func:`one_line`); the driver keeps only the first line.
    """
    return kind(_MARKERS[kind] + message)


@contextlib.contextmanager
def reporting_data_errors() -> Iterator[None]:
    """Executor side: a ``DataError`` raised in the block leaves it as :func:`failure` ``(DataError, ...)``.

    Wraps the body of a Spark task (also a generator's body: the block may ``yield``), so the checks it calls raise
    plain ``DataError`` wherever they run, on the driver too.
    """
    try:
        yield
    except DataError as exc:
        if str(exc).startswith(_MARKERS[DataError]):
            raise
        raise failure(DataError, str(exc)) from exc


def reported(exc: DataError, rest: Iterable) -> str:
    """Executor side: a staging task's ``DataError`` as a message for its result row, instead of a failed task.

    A failed task makes Spark log an executor-side ``ERROR`` block with a Java stack trace for what is the user's
    data, and throws the Python worker away; a result row does neither. Consumes ``rest`` (the task's remaining input)
    so PySpark reuses the worker. The driver raises it with :func:`raise_reported`.
    """
    for _ in rest:
        pass
    return str(exc)


def reported_full(exc: OSError, uri: str, rest: Iterable) -> str:
    """Executor side: a staging task's failed write to a full filesystem as a message for its result row.

    As :func:`reported`, for an ``OSError`` that :func:`sparkdl_avg.shared.files.fs.is_full` recognises, writing
    ``uri``: Spark would log the task's failure with two stack traces (and retry it on a cluster, to fill the disk
    again); the driver raises it as an ``OSError`` with the ``errno`` of a full disk, naming ``uri``
    (:func:`raise_reported`), for the caller to name its parameter.
    """
    for _ in rest:
        pass
    return _FULL + json.dumps([exc.errno or errno.ENOSPC, " ".join(str(exc).split()), uri])


def reported_configuration(exc: Exception) -> str:
    """Executor side: a staging task's ``ConfigurationError`` (a preprocessing function it cannot load) for its row.

    The task's input is not consumed: reading the partition would be in vain, and the fit stops anyway.
    """
    return _CONFIGURATION + str(exc)


def raise_reported(messages: Iterable[Optional[str]], columns: Optional[Mapping[str, str]] = None) -> None:
    """Driver side: raises the first error staging tasks reported, if any.

    A ``DataError`` (:func:`reported`), a ``ConfigurationError`` (:func:`reported_configuration`), or the ``OSError``
    of a full filesystem (:func:`reported_full`: ``errno``, ``strerror`` and the file's URI as ``filename``).
    """
    from ...errors import ConfigurationError

    messages = list(messages)
    for message in messages:  # a function no executor can load comes first: every row would fail with it
        if message and message.startswith(_CONFIGURATION):
            raise ConfigurationError(message[len(_CONFIGURATION):]) from None
    for message in messages:
        if message and message.startswith(_FULL):
            raise OSError(*json.loads(message[len(_FULL):]))
        if message:
            raise DataError(user_columns(message, columns)) from None


def user_columns(message: str, columns: Optional[Mapping[str, str]]) -> str:
    """``message`` with internal column aliases (``'x0'``) replaced by the user's column names."""
    for alias, name in (columns or {}).items():
        message = message.replace(f"'{alias}'", repr(name))
    return message


def one_line(message: str) -> str:
    """``message`` on one line, without TensorFlow's graph-construction traceback."""
    kept = []
    for line in message.splitlines():
        line = line.strip()
        if not line or line.startswith(("File \"", "[[{{node")) or "defined at (most recent call last)" in line:
            continue
        kept.append(line)
    return " ".join(kept)


def last_line(text: str, containing: str = "") -> Optional[str]:
    """The last non-empty line of ``text`` that contains ``containing``, else its last non-empty line.

    ``None`` when ``text`` has no non-empty line. For failures without a marker, whose text is all the driver has.
    """
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if containing:
        lines = [line for line in lines if containing in line] or lines
    return lines[-1] if lines else None


def root_cause(exc: BaseException) -> str:
    """The innermost cause of a failed Spark call on the driver, on one line: ``JavaClass: message``.

    A ``Py4JJavaError`` and PySpark's captured exceptions (``AnalysisException``, ...) hold the Java exception, whose
    ``getCause`` chain ends at the cause (``ClassNotFoundException: Class ...S3AFileSystem not found``, ``... is not a
    Parquet file``) under pages of stack frames. Spark Connect's errors carry the server's chain as text
    (``getStackTrace``: ``Caused by:`` lines). Anything else: its message's first line.
    """
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    if java is not None:
        try:
            while java.getCause() is not None:
                java = java.getCause()
            message = java.getMessage()
            name = java.getClass().getName()
            return one_line(f"{name}: {message}" if message else name)
        except Exception:  # the gateway is gone: fall back to the text
            pass
    trace = exc.getStackTrace() if callable(getattr(exc, "getStackTrace", None)) else None
    causes = [line.strip()[len("Caused by: "):] for line in (trace or "").splitlines()
              if line.strip().startswith("Caused by: ")]
    if causes:
        return one_line(causes[-1])
    message = exc.getMessage() if callable(getattr(exc, "getMessage", None)) else str(exc)
    first = next((line for line in str(message).strip().splitlines() if line.strip()), None)
    return one_line(first) if first else type(exc).__name__


def decode(exc: BaseException, what: str, columns: Optional[Mapping[str, str]] = None) -> Exception:
    """Driver side: the typed error for the failure ``exc`` of a Spark action.

    Args:
        exc: What the action raised.
        what: The job, for failures without a marker, e.g. ``"Round 3 of epoch 0"``: the message is ``"{what} failed
            on the cluster: "`` and the failure's last line.
        columns: Internal column aliases → the user's column names, restored in a ``DataError``'s message.

    Returns:
        ``exc`` itself if it is a ``DataError`` raised on the driver; else a ``DataError`` or ``WorkerError`` with the
        executor's message (its first line) when ``exc``'s text carries a marker; else a ``WorkerError`` as above.
    """
    text = getattr(exc, "spark_text", None) or str(exc)  # a user action's DataError keeps PySpark's text
    if isinstance(exc, DataError) and not text.startswith(_MARKERS[DataError]) and not hasattr(exc, "spark_text"):
        return exc
    for kind, marker in _MARKERS.items():
        at = text.find(marker)
        if at >= 0:
            message = text[at + len(marker) :].splitlines()[0]
            return kind(user_columns(message, columns) if kind is DataError else message)
    # Without a marker the task died outside our code (lost executor, Python worker crash).
    message = f"{what} failed on the cluster: {_cause(text) or type(exc).__name__}"
    if "Cannot run program" in text:
        message += (
            ". Spark could not start the executors' Python: PYSPARK_PYTHON (spark.pyspark.python) must name a "
            "Python that exists on every executor, by an absolute path (under Spark Connect, tasks run in a "
            "per-session directory, so a relative path such as .venv/bin/python is not found)"
        )
    return WorkerError(message)


def _cause(text: str) -> Optional[str]:
    """The failure's last line, or, when that is a Java stack frame, the last line naming an exception."""
    line = last_line(text)
    if line is None or not _FRAME.match(line):
        return line
    causes = [ln.strip() for ln in text.splitlines() if ln.strip() and not _FRAME.match(ln)]
    named = [ln for ln in causes if "Exception" in ln or "Error" in ln]
    return (named or causes or [line])[-1]


def run_job(job: Callable[[], T], what: str, columns: Optional[Mapping[str, str]] = None) -> T:
    """Runs the Spark action ``job`` and returns its result, re-raising a failure as :func:`decode` says.

    A ``DataError`` (raised on the driver, or decoded) propagates with its own message and no chained cause. So does a
    ``WorkerError`` that our executor code raised with its message (the marker): the Spark exception it came in (pages
    of py4j and JVM frames) stays one attribute away, ``spark_exception``, and the executor's Python traceback in
    ``executor_traceback``. A failure outside our code (a lost executor, a crashed Python worker) is chained to the
    Spark exception: its text is all there is. A Ctrl-C in the job, or a failure it caused, is a ``KeyboardInterrupt``
    (:func:`sparkdl_avg.shared.errors.interrupt.spark_call`).

    Args:
        job: The action, e.g. ``lambda: rdd.mapPartitions(body).collect()``.
        what: The job in error messages, e.g. ``f"Round {round} of epoch {epoch}"``.
        columns: See :func:`decode`.
    """
    with interrupt.spark_call():  # a Ctrl-C in the job: its jobs cancelled, KeyboardInterrupt when it returns
        try:
            return job()
        except Exception as exc:  # Py4JJavaError / PythonException carry the executors' text
            error = decode(exc, what, columns)
            if error is exc:
                raise
            text = getattr(exc, "spark_text", None) or str(exc)
            if isinstance(error, DataError) or any(marker in text for marker in _MARKERS.values()):
                error.spark_exception, error.executor_traceback = exc, executor_traceback(text)
                raise error from None
            raise error from exc


def executor_traceback(text: str) -> Optional[str]:
    """The last Python traceback in a Spark failure's text (up to the JVM's frames), or ``None``."""
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    lines = []
    for line in text[start:].splitlines():
        if _FRAME.match(line):
            break
        lines.append(line)
    return "\n".join(lines).rstrip()


# ------------------------------------------------- actions the user runs


@functools.lru_cache(maxsize=None)
def _data_error_type(base: type) -> type:
    """A ``DataError`` that is also PySpark's ``base`` (``PythonException``), so both ``except`` clauses catch it."""

    def __str__(self) -> str:
        return self.args[0] if self.args else ""

    return type("DataError", (DataError, base), {"__str__": __str__, "__module__": DataError.__module__})


def _as_data_error(converted: Any) -> Any:
    """PySpark's converted exception, as a ``DataError`` with the executor's message when it carries the marker."""
    if not isinstance(converted, BaseException):
        return converted
    text = str(converted)
    at = text.find(_MARKERS[DataError])
    if at < 0 or isinstance(converted, DataError):
        return converted
    try:
        error = _data_error_type(type(converted)).__new__(_data_error_type(type(converted)))
    except TypeError:  # a type that cannot be combined: a plain DataError
        error = DataError.__new__(DataError)
    error.__dict__.update(getattr(converted, "__dict__", {}))
    error.args = (text[at + len(_MARKERS[DataError]) :].splitlines()[0],)
    error.spark_text = text  # for decode(), under run_job
    return error


def _decoding(convert: Callable[..., Any]) -> Callable[..., Any]:
    """``convert`` (PySpark's JVM/server error → Python exception), also turning a marked ``DataError`` into one."""
    if getattr(convert, "_sparkdl_avg", False):
        return convert

    @functools.wraps(convert)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return _as_data_error(convert(*args, **kwargs))

    wrapper._sparkdl_avg = True  # type: ignore[attr-defined]
    return wrapper


def decode_user_actions() -> None:
    """Driver side: a marked ``DataError`` from a Spark action the user runs reaches them as a ``DataError``.

    For lazy results such as ``trainer.predict(df)``, whose tasks run when the user calls ``collect()``, ``show()`` or
    a writer, outside :func:`run_job`. Wraps PySpark's conversion of a failed action into a Python exception (classic:
    ``pyspark.errors.exceptions.captured.convert_exception``; Connect: its client's) so that a failure carrying the
    marker becomes a ``DataError`` that is also the exception PySpark raised (``PythonException``), with the
    executor's message; every other failure is left exactly as PySpark makes it. Idempotent.
    """
    for name in ("pyspark.errors.exceptions.captured", "pyspark.sql.connect.client.core"):
        module = sys.modules.get(name)
        if module is not None and callable(getattr(module, "convert_exception", None)):
            module.convert_exception = _decoding(module.convert_exception)
