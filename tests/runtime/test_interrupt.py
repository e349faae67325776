"""Ctrl-C during a fit (issue 28): always a KeyboardInterrupt, the fit's Spark jobs cancelled, no py4j noise.

The test sends SIGINT to its own main thread (``signal.pthread_kill``: what
a terminal's Ctrl-C does, interrupting the system call the thread is
blocked in, usually py4j's wait for a round's job) at a few delays into a
fit of many epochs. Before :mod:`sparkdl_avg.shared.errors.interrupt` PySpark's handler
called ``cancelAllJobs`` on the connection that was waiting (it failed, so
the job ran on), py4j logged ``KeyboardInterrupt while sending command``
tracebacks, and a broken connection sometimes surfaced as
``WorkerError: Round 8 of epoch 1 failed on the cluster: Gateway must be
connected to send cancel cmd.``

Classic ``local[2]`` first, then a local Spark Connect server (one JVM runs
one of the two at a time; a Connect server runs in this process' JVM, so
its SparkContext's status tracker still says which jobs run). Connect's
client already interrupted its own operation on a ``KeyboardInterrupt``;
there the tests guard the handler's Connect path (``interruptTag``).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time

import pytest

from conftest import make_model, regression_data, spark_session, stop_active_session
from sparkdl_avg import ParameterAveragingTrainer, RECOMMENDED_CONF, WorkerError, testing
from sparkdl_avg.shared.errors import interrupt, remote_errors
from sparkdl_avg.executor import worker as worker_module
from sparkdl_avg.executor.daemon import quiet_when_killed

pytestmark = pytest.mark.filterwarnings("ignore:Failed to set spark:UserWarning")  # Connect: static settings

X, Y = regression_data(256, seed=7)
NOISE = ("KeyboardInterrupt while sending command", "Exception while sending command",
         "Gateway must be connected", "BrokenPipeError")


@pytest.fixture(scope="module", params=["classic", "connect"])
def session(request, tmp_path_factory):
    if request.param == "classic":
        with spark_session("local[2]", "sparkdl_avg-interrupt") as spark:
            yield spark
        return
    from pyspark.sql import SparkSession

    stop_active_session()
    spark = (
        SparkSession.builder.remote("local[2]")
        .config("spark.local.dir", str(tmp_path_factory.mktemp("connect-local")))
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config(map=RECOMMENDED_CONF)
        .getOrCreate()
    )
    try:
        yield spark
    finally:
        spark.stop()


def trainer_for(**options):
    return ParameterAveragingTrainer(make_model(seed=1), num_workers=2, batch_size=8, averaging_frequency=4, seed=0,
                                     slow_warning=False, **options)


def frame(spark):
    return spark.createDataFrame([(a.tolist(), float(b)) for a, b in zip(X, Y)], ["features", "label"])


def active_jobs():
    """The ids of the running Spark jobs (under Connect: of the in-process server's context)."""
    from pyspark import SparkContext

    return list(SparkContext._active_spark_context.statusTracker().getActiveJobsIds())


def no_job_within(seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while active_jobs():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def ctrl_c_after(delay: float) -> threading.Timer:
    """SIGINT to the main thread after ``delay`` seconds, as a terminal's Ctrl-C."""
    timer = threading.Timer(delay, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    timer.start()
    return timer


def interrupted_fit(trainer, data, delay: float) -> float:
    """Interrupts a long fit after ``delay`` s; returns how long after the signal it raised KeyboardInterrupt."""
    timers = [ctrl_c_after(delay), ctrl_c_after(delay + 20.0)]  # a lost interrupt: the second one fails the test
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.fit(data, epochs=10_000, verbose=0)
    finally:
        for timer in timers:
            timer.cancel()
    return time.monotonic() - start - delay


def assert_no_noise(caplog, capsys):
    captured = capsys.readouterr()
    for text in NOISE:
        assert text not in caplog.text
        assert text not in captured.err


@pytest.mark.parametrize("synchronization, delays", [("sync", (0.1, 0.6)), ("async", (0.6,))])
def test_ctrl_c_during_a_fit_raises_keyboard_interrupt_and_leaves_no_job_running(session, synchronization, delays,
                                                                                 caplog, capsys):
    caplog.set_level(logging.INFO)  # py4j logs its "KeyboardInterrupt while sending command" on the root logger
    data = frame(session)
    trainer = trainer_for(synchronization=synchronization)
    trainer.fit(data, epochs=1, verbose=0)  # builds the replicas: the interrupts below land in rounds
    start = time.monotonic()
    trainer.fit(data, epochs=1, verbose=0)
    normal = time.monotonic() - start
    for delay in delays:  # 0.1 s: before the first round; then in (or between) rounds
        late = interrupted_fit(trainer, data, delay)
        assert late < interrupt.GRACE_S + 3.0
        assert no_job_within(3.0), active_jobs()
        start = time.monotonic()
        history = trainer.fit(data, epochs=1, verbose=0)  # the trainer and the session still work
        again = time.monotonic() - start
        assert len(history.history["loss"]) == 1
        assert again < 3 * normal + 5.0, (again, normal)  # no job of the interrupted fit holds the cores
    assert_no_noise(caplog, capsys)


def test_ctrl_c_in_a_long_round_cancels_its_job(session, caplog, capsys):
    caplog.set_level(logging.INFO)
    data = frame(session)
    trainer = trainer_for()
    trainer.fit(data, epochs=1, verbose=0)
    real = worker_module.run_round_partition
    with testing.RoundEntry(lambda task, it: _slow(real, task, it)):
        late = interrupted_fit(trainer, data, 1.0)
    assert late < interrupt.GRACE_S + 3.0  # the 60 s round was cancelled, not waited for
    assert no_job_within(3.0), active_jobs()
    history = trainer.fit(data, epochs=1, verbose=0)
    assert len(history.history["loss"]) == 1
    assert_no_noise(caplog, capsys)


def _slow(real, task, iterator):
    time.sleep(60)
    return real(task, iterator)


# ------------------------------------------------------------------ without Spark


def test_an_error_raised_while_an_interrupt_was_handled_is_a_keyboard_interrupt():
    def job():  # what py4j does: its cleanup of the interrupted call fails
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("Gateway must be connected to send cancel cmd.")

    with pytest.raises(KeyboardInterrupt):
        remote_errors.run_job(job, "Round 8 of epoch 1")
    with pytest.raises(WorkerError, match="Round 8 of epoch 1 failed on the cluster: boom"):
        remote_errors.run_job(lambda: (_ for _ in ()).throw(RuntimeError("boom")), "Round 8 of epoch 1")


def test_a_killed_tasks_worker_ends_quietly_on_the_executor():
    def killed(sock, authenticated):
        raise BrokenPipeError(32, "Broken pipe")

    assert quiet_when_killed(killed)(None, True) == 1
    assert quiet_when_killed(lambda sock, authenticated: 0)(None, True) == 0
    with pytest.raises(ValueError):
        quiet_when_killed(lambda sock, authenticated: int("x"))(None, True)
