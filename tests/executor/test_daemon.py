"""Executors' Python workers: the daemon that imports TensorFlow, warm_up, one pool, the executor check.

Issue 16's cold start. Two sessions, one after the other: PySpark's own
daemon (what a user's existing session has: the module's ``spark`` fixture,
which also runs the reuse of a fit's workers by SQL jobs and
tests/parity.py's executor check), and ``sparkdl_avg.daemon`` with worker
reuse off, so that every task runs in a freshly forked worker, as after
PySpark drops idle workers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import make_model, regression_data, spark_session
from parity import ExecutorCheckMixin
from sparkdl_avg import DAEMON_MODULE, ParameterAveragingTrainer, warm_up
from sparkdl_avg.cli import daemon_applies
from sparkdl_avg.errors import DataError

pytestmark = pytest.mark.integration  # tests/conftest.py: not in make test-fast's unit tier


def _rdd_probe(spark, n=2):
    """(pid, TensorFlow imported, Keras imported) of each of ``n`` RDD tasks (the classic rounds' kind of job)."""

    def probe(ids):  # nested: shipped by value (executors cannot import this test module)
        import os
        import sys

        list(ids)
        yield os.getpid(), "tensorflow" in sys.modules, "keras" in sys.modules

    return spark.sparkContext.parallelize(range(n), n).mapPartitions(probe).collect()


def _sql_probe(spark, n=2):
    """The same for ``n`` ``mapInArrow`` tasks (staging's, predict's and the SQL round's kind of job)."""

    def probe(batches):
        import os
        import sys

        import pyarrow as pa

        list(batches)
        yield pa.RecordBatch.from_pylist([{"pid": os.getpid(), "tf": "tensorflow" in sys.modules,
                                           "keras": "keras" in sys.modules}])

    rows = spark.range(n, numPartitions=n).mapInArrow(probe, "pid long, tf boolean, keras boolean").collect()
    return [tuple(r) for r in rows]


def _skipped_imports(spark, n=2):
    """Which of quiet.EXECUTOR_SKIPPED_IMPORTS each of ``n`` RDD tasks' Python workers has imported."""

    def probe(ids):  # nested: shipped by value (executors cannot import this test module)
        import sys

        from sparkdl_avg.shared.model import quiet

        list(ids)
        yield [m for m in quiet.EXECUTOR_SKIPPED_IMPORTS if m in sys.modules]

    return spark.sparkContext.parallelize(range(n), n).mapPartitions(probe).collect()


def _cold_start_notes(caplog) -> list:
    return [r.getMessage() for r in caplog.records if "new executor Python workers to import TensorFlow" in r.getMessage()]


def _small_fit(epochs=1):
    x, y = regression_data(64, seed=3)
    trainer = ParameterAveragingTrainer(make_model(seed=3), num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
    trainer.fit((x, y), epochs=epochs, verbose=0)
    return trainer


@pytest.fixture(scope="module")
def spark():
    """PySpark's own daemon, workers reused; the tests using it come first (the second session stops it)."""
    with spark_session("local[2]", "sparkdl_avg-plain-daemon", **{"spark.python.daemon.module": "pyspark.daemon"}) as session:
        yield session


def test_warm_up_leaves_tensorflow_ready_workers_that_training_and_sql_jobs_reuse(spark, caplog):
    # PySpark's own daemon imports nothing: a worker that ran no training has no TensorFlow.
    assert not any(tf for _, tf, _ in _sql_probe(spark))
    # Issue 28: a session without RECOMMENDED_CONF: the first fit says once what the imports cost it, and the fix.
    _small_fit()
    notes = _cold_start_notes(caplog)
    assert len(notes) == 1, caplog.text
    seconds = float(re.search(r"waited about ([0-9.]+) s", notes[0]).group(1))
    assert 0.5 <= seconds < 60 and "RECOMMENDED_CONF" in notes[0] and "warm_up" in notes[0], notes
    _small_fit()
    assert len(_cold_start_notes(caplog)) == 1  # once per application
    warm = warm_up(spark)
    assert warm_up(spark) is warm  # not repeated within WARM_UP_REUSE_S
    pids = set(warm.result(timeout=180))
    # Its RDD job starts the 2 workers of local[2]. Its SQL job reuses them, or forks 2 more where its tasks start
    # before Spark has given the new workers back to the idle pool (seen beside a second test worker's load):
    # Spark's reuse promises no more than that.
    assert 1 <= len(pids) <= 4
    # The warmed workers serve the RDD rounds and the SQL jobs (predict, staging) alike: one pool.
    rdd, sql = _rdd_probe(spark), _sql_probe(spark)
    assert {p for p, _, _ in rdd} <= pids and {p for p, _, _ in sql} <= pids, (pids, rdd, sql)
    assert all(tf and k for _, tf, k in rdd + sql)


def test_the_warm_ups_sql_job_yields_to_a_job_already_waiting(spark):
    """Issue 48: a fit's first round submitted during the warm-up's RDD job is not made to wait for its SQL job."""
    import threading
    import time

    from sparkdl_avg.driver.runtime.session import WARM_UP_GROUP, Engine, spark_job_labels

    engine, sc = Engine(spark), spark.sparkContext
    assert not engine._others_running()

    def job(group):
        with spark_job_labels(sc, "a job", group=group):
            sc.parallelize(range(2), 2).map(lambda i: time.sleep(4)).collect()

    def running(group):  # this group's job, once Spark's status store has heard of it
        tracker = sc.statusTracker()
        return set(tracker.getJobIdsForGroup(group)) & set(tracker.getActiveJobsIds())

    for group, expected in ((WARM_UP_GROUP, False), ("a-fit", True)):
        thread = threading.Thread(target=job, args=(group,))
        thread.start()
        deadline = time.monotonic() + 3
        while not running(group) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running(group), group
        assert engine._others_running() is expected, group
        thread.join()
        # The job's end is posted before ``collect`` returns; ``_others_running`` waits for the store to hear of it
        # (CI once read the ended job as still running: the store's thread had not caught up).
        assert not engine._others_running(), group


# Issue 16, a user's first hour: the fit's warm workers serve the SQL jobs that follow.
def test_a_sql_job_after_a_fit_reuses_the_fits_python_workers(spark):
    """Training (RDD rounds) and predict/staging (SQL jobs) share one pool of Python workers (session.py)."""
    import os

    x, y = np.random.default_rng(0).normal(size=(64, 4)), np.zeros((64, 1))
    trainer = ParameterAveragingTrainer(make_model(), num_workers=2, batch_size=8, averaging_frequency=2, seed=0,
                                        state_transport="files", slow_warning=False)
    trainer.fit((x, y), epochs=1, verbose=0)
    fit_pids = {w.pid for r in trainer.stats.records for w in r.workers}

    def parents(batches):
        import pyarrow as pa

        for batch in batches:
            yield pa.RecordBatch.from_pydict({"ppid": [os.getppid()] * batch.num_rows,
                                              "uuid": [os.environ.get("SPARK_JOB_ARTIFACT_UUID")] * batch.num_rows})

    def parent_of(pid):  # local[2]: the fit's workers are processes of this machine, alive in the pool
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("PPid:"))

    rows = spark.range(4, numPartitions=2).mapInArrow(parents, "ppid long, uuid string").collect()
    sql, uuids = {r.ppid for r in rows}, {r.uuid for r in rows}
    # After a local Spark Connect server ran in this process (an earlier test module on this pytest worker), Spark
    # gives classic SQL jobs their session's artifact UUID in the workers' environment (RDD jobs keep "default"):
    # PySpark keys its pools by that environment, so Spark itself keeps two pools there. Seen on a fresh clone's run;
    # reproduced by starting remote("local[2]") before a classic session.
    if uuids != {"default"}:
        sql_probe = _sql_probe(spark)  # what the user still gets: no cold worker
        assert all(tf and k for _, tf, k in sql_probe), (uuids, sql_probe)
        return
    # One pool is one daemon: PySpark keys its worker factories (each with a daemon that forks the workers, and an
    # idle queue) by the worker's environment. The SQL job's workers and the fit's are children of the same daemon,
    # so whichever idle workers a job takes, they come from the queue the fit's went back to. Which of them a job
    # takes depends on when Spark returned each to the queue: not asserted.
    assert sql == {parent_of(pid) for pid in fit_pids}, (sql, fit_pids)


class TestExecutorCheck(ExecutorCheckMixin):
    """tests/parity.py: the check a user runs first, on a classic session; test_connect.py runs it under Connect."""


def test_workers_forked_from_the_daemon_start_with_tensorflow_and_train(tmp_path, caplog):
    conf = {"spark.python.daemon.module": DAEMON_MODULE, "spark.python.worker.reuse": "false"}
    with spark_session("local[2]", "sparkdl_avg-daemon", **conf) as spark:
        first, second = _rdd_probe(spark), _sql_probe(spark)
        # Every task a fresh fork (reuse is off), each with TensorFlow and Keras imported before it started.
        assert len({p for p, _, _ in first + second}) == 4
        assert all(tf and k for _, tf, k in first + second), first + second
        # ... and without the packages Keras imports only for its optional integrations (issue 48).
        assert _skipped_imports(spark) == [[], []]
        x, y = regression_data(64, seed=3)
        trainer = ParameterAveragingTrainer(make_model(seed=3), num_workers=2, batch_size=8, averaging_frequency=2,
                                            seed=0)
        history = trainer.fit((x, y), epochs=3, verbose=0)
        assert history.history["loss"][-1] < history.history["loss"][0]
        # Forked with TensorFlow imported: nothing to say about imports (every task here was a new worker).
        assert not _cold_start_notes(caplog), caplog.text
        assert all(w.import_s == 0 for r in trainer.stats.records for w in r.workers)
        predictions = trainer.predict(spark.createDataFrame([(row.tolist(),) for row in x], "features array<double>"))
        got = np.array([r.prediction for r in predictions.collect()]).reshape(-1)
        np.testing.assert_allclose(got, trainer.model.predict(x, verbose=0).reshape(-1), rtol=1e-5, atol=1e-6)


def _preload(code: str) -> subprocess.CompletedProcess:
    script = "from sparkdl_avg.executor import daemon\n" + code + "\ndaemon.preload()\nprint('after preload', flush=True)\n"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


def test_the_daemon_keeps_its_stdout_for_the_jvm_and_survives_a_failed_import():
    # stdout carries the daemon's port to the JVM: what an import prints there goes to stderr.
    noisy = _preload("import builtins, sparkdl_avg.shared.model.quiet as q\n"
                     "q.import_tensorflow = lambda: print('printed while importing')")
    assert noisy.returncode == 0, noisy.stderr
    assert noisy.stdout == "after preload\n" and "printed while importing" in noisy.stderr
    # A missing package is reported and the daemon goes on (its workers then report the error themselves).
    broken = _preload("sys = __import__('sys'); sys.modules['keras'] = None")
    assert broken.returncode == 0, broken.stderr
    assert broken.stdout == "after preload\n"
    assert "sparkdl_avg.daemon: preloading failed; workers will import on their own" in broken.stderr
    assert "ImportError" in broken.stderr or "ModuleNotFoundError" in broken.stderr


def test_jobs_set_the_daemon_unless_the_user_did_or_ships_sparkdl_avg_with_py_files():
    assert daemon_applies(None, "")
    assert daemon_applies(None, "file:/work/mymodels.py")
    assert not daemon_applies("pyspark.daemon", "")  # the user's own choice stands
    assert not daemon_applies(None, "file:/work/mymodels.py, /work/dist/sparkdl_avg-0.1.0.zip")


def test_a_job_submitted_with_sparkdl_avg_in_py_files_keeps_pysparks_daemon(tmp_path):
    import zipfile

    shipped = tmp_path / "sparkdl_avg-0.1.0.zip"
    zipfile.ZipFile(shipped, "w").close()
    script = tmp_path / "probe.py"
    script.write_text("from sparkdl_avg import cli\ns = cli.recommended_settings()\n"
                      "print('DAEMON', s.get('spark.python.daemon.module'), s.get('spark.python.unix.domain.socket.enabled'))\n")
    submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")

    def setting(*args):
        proc = subprocess.run([submit, "--master", "local[1]", *args, str(script)], capture_output=True, text=True,
                              timeout=180, env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
        assert proc.returncode == 0, proc.stderr[-2000:]
        return [line for line in proc.stdout.splitlines() if line.startswith("DAEMON ")]

    runs = [(), ("--py-files", str(shipped)), ("--conf", "spark.python.daemon.module=pyspark.daemon"),
            ("--conf", "spark.python.unix.domain.socket.enabled=false")]
    with ThreadPoolExecutor(len(runs)) as pool:  # the four spark-submits (a JVM and imports each) run together
        default, py_files, users_daemon, users_socket = pool.map(lambda args: setting(*args), runs)
    assert default == [f"DAEMON {DAEMON_MODULE} true"]
    assert py_files == ["DAEMON None true"]  # the daemon could not import the zip
    assert users_daemon == ["DAEMON None true"]
    # The user's own choice stands.
    assert users_socket == [f"DAEMON {DAEMON_MODULE} None"]


def test_warm_up_without_a_session_names_what_to_do(monkeypatch):
    from pyspark.sql import SparkSession

    monkeypatch.setattr(SparkSession, "getActiveSession", staticmethod(lambda: None))
    with pytest.raises(DataError, match=r"warm_up\(\) needs a SparkSession; create one with SparkSession.builder"):
        warm_up()


def test_executors_without_sparkdl_avg_under_its_daemon_get_the_fix_named(monkeypatch):
    from sparkdl_avg.driver.runtime import preflight
    from sparkdl_avg import ExecutorEnvironmentError
    from sparkdl_avg.driver.runtime.session import Engine

    # What Spark reports when the daemon module cannot be imported (its text, abridged).
    text = ("Error from python worker:\n  /opt/env/bin/python: Error while finding module specification for "
            "'sparkdl_avg.daemon' (ModuleNotFoundError: No module named 'sparkdl_avg')\nPYTHONPATH was: ...")

    class Broken(Engine):
        def __init__(self):
            self.connect, self.sc, self._parallelism = True, None, 1

        def run_tasks(self, *args, **kwargs):
            raise RuntimeError(text)

        def labels(self, *args, **kwargs):
            import contextlib

            return contextlib.nullcontext()

    with pytest.raises(ExecutorEnvironmentError) as info:
        preflight.check_executors(Broken())
    message = str(info.value)
    assert message.startswith("Executors cannot import sparkdl_avg: ship it with spark-submit --py-files")
    assert "spark.python.daemon.module=sparkdl_avg.daemon needs it installed in the executors' Python" in message
