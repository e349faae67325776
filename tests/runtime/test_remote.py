"""The executor → driver error protocol (sparkdl_avg.shared.errors.remote_errors), without Spark."""

import pytest

from sparkdl_avg import DataError, WorkerError
from sparkdl_avg.shared.errors import remote_errors


def _spark_text(exc: Exception) -> RuntimeError:
    """What the driver gets for a task that raised ``exc``: a Spark exception holding the traceback text."""
    return RuntimeError(
        "An error occurred while calling o42.collect.\nTraceback (most recent call last):\n"
        f'  File "worker.py", line 1, in main\n{type(exc).__module__}.{type(exc).__name__}: {exc}\n'
        "\tat org.apache.spark.api.python.BasePythonRunner.read(PythonRunner.scala:572)\n"
    )


def _raise(exc):
    raise exc


def test_a_marked_data_error_comes_back_typed_with_the_users_column_names():
    with pytest.raises(DataError) as info:
        with remote_errors.reporting_data_errors():
            raise DataError("Column 'x0' has a row of 3 values; expected 4")
    spark_exc = _spark_text(info.value)
    with pytest.raises(DataError) as back:
        remote_errors.run_job(lambda: _raise(spark_exc), "Staging the training data", {"x0": "pixels"})
    assert str(back.value) == "Column 'pixels' has a row of 3 values; expected 4"
    assert back.value.__cause__ is None and back.value.__suppress_context__


def test_a_marked_worker_failure_keeps_its_first_line_and_the_spark_error_one_attribute_away():
    marked = remote_errors.failure(
        WorkerError, "Worker 1 failed in epoch 0, round 2: ValueError: " + remote_errors.one_line("bad\n  File \"x\"\nvalue")
    )
    spark_exc = _spark_text(marked)
    with pytest.raises(WorkerError) as back:
        remote_errors.run_job(lambda: _raise(spark_exc), "Round 2 of epoch 0")
    assert str(back.value) == "Worker 1 failed in epoch 0, round 2: ValueError: bad value"
    # not chained (Python would print py4j's and the JVM's frames first): kept as attributes
    assert back.value.__cause__ is None and back.value.__suppress_context__
    assert back.value.spark_exception is spark_exc
    assert back.value.executor_traceback == (
        'Traceback (most recent call last):\n  File "worker.py", line 1, in main\n'
        f"sparkdl_avg.errors.WorkerError: {marked}")


def test_an_unmarked_failure_names_the_job_and_quotes_the_last_line():
    spark_exc = RuntimeError("Job aborted.\nExecutorLostFailure (executor 1 exited)\n\n")
    with pytest.raises(WorkerError, match=r"^Round 3 of epoch 1 failed on the cluster: ExecutorLostFailure") as lost:
        remote_errors.run_job(lambda: _raise(spark_exc), "Round 3 of epoch 1")
    assert lost.value.__cause__ is spark_exc  # outside our code: Spark's text is all there is
    with pytest.raises(WorkerError, match=r"failed on the cluster: RuntimeError$"):
        remote_errors.run_job(lambda: _raise(RuntimeError("")), "Round 3 of epoch 1")


def test_a_data_error_raised_on_the_driver_passes_unchanged():
    error = DataError("The training data is empty (0 rows).")
    with pytest.raises(DataError) as info:
        remote_errors.run_job(lambda: _raise(error), "Staging the training data")
    assert info.value is error
    assert remote_errors.run_job(lambda: 7, "anything") == 7


def test_last_line_prefers_lines_containing_a_word():
    text = "x\nModuleNotFoundError: No module named 'foo'\n\tat java.lang.Thread.run\n"
    assert remote_errors.last_line(text) == "\tat java.lang.Thread.run"
    assert remote_errors.last_line(text, containing="Error") == "ModuleNotFoundError: No module named 'foo'"
    assert remote_errors.last_line(text, containing="nowhere") == "\tat java.lang.Thread.run"
    assert remote_errors.last_line(" \n") is None


def test_a_failure_ending_in_java_frames_names_its_exception_and_a_missing_python_gets_the_fix():
    text = (
        "org.apache.spark.SparkException: Job aborted due to stage failure\n"
        'java.io.IOException: Cannot run program ".venv/bin/python" (in directory "/tmp/s/userFiles-1"): error=2, '
        "No such file or directory\n"
        "\tat java.base/java.lang.ProcessBuilder.start(ProcessBuilder.java:1143)\n"
        "\t... 12 more\n"
        "\tat java.lang.Thread.run(Thread.java:840)\n"
    )
    error = remote_errors.decode(RuntimeError(text), "Staging the training data")
    assert isinstance(error, WorkerError)
    assert str(error).startswith(
        'Staging the training data failed on the cluster: java.io.IOException: Cannot run program ".venv/bin/python"'
    )
    assert "must name a Python that exists on every executor, by an absolute path" in str(error)
    assert "Thread.run" not in str(error)
