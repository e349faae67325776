"""Which Spark a call runs on — a classic session or Spark Connect — and how its jobs are launched and labelled.

This module owns the driver's view of Spark itself (as opposed to the data or the round). The data's adapter
(:mod:`sparkdl_avg.driver.data.adapters`) finds the session that owns the data a user passes, or :func:`active_engine`
the session of data that names none, and wraps it in an :class:`Engine`, the one object the rest of the driver asks for
the master, the default parallelism, job labels and "``n`` tasks of this Arrow function" jobs. Only a classic engine has
a ``SparkContext`` (:attr:`Engine.sc`); under Spark Connect everything a fit needs goes through DataFrame APIs
(``spark.range(n, numPartitions=n).mapInArrow(...)``), which run the same on both. It also keeps the stack traces Spark
logs for a failed task off the jobs' console (:func:`quiet_task_failures`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import re
import threading
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from ...errors import ConfigurationError, SessionError

_TAG = re.compile(r"[^A-Za-z0-9_.-]+")
logger = logging.getLogger(__name__)

DAEMON_MODULE = "sparkdl_avg.daemon"
"""The value of ``spark.python.daemon.module`` that makes executors fork Python workers with TensorFlow already
imported (:mod:`sparkdl_avg.daemon`). Static: give it to the session's builder or the cluster's Spark config."""

UNIX_SOCKETS = "spark.python.unix.domain.socket.enabled"
"""The Spark setting (Spark >= 4.1, static) that, set to ``"true"``, has each JVM talk to its Python processes (the
executors' workers, the driver's result streams) over Unix domain sockets instead of loopback TCP. Over TCP each Python
task waits for its input (Nagle's algorithm meeting delayed acknowledgements), once per round: a large share of a small
round's overhead (measured in docs/benchmarks.md, "Unix domain sockets")."""

CONSOLE_PROGRESS = "spark.ui.showConsoleProgress"
"""The Spark setting (static) for Spark's console progress bars. Its bars (``[Stage 7:>  (0 + 2) / 2]``) are redrawn
on stderr over a fit's own progress bar and epoch lines, one per round's job; ``"false"`` leaves the fit's progress
(:mod:`sparkdl_avg.driver.observe.progress`) alone on the console."""

RECOMMENDED_CONF: Dict[str, str] = {
    "spark.python.daemon.module": DAEMON_MODULE,
    UNIX_SOCKETS: "true",
    CONSOLE_PROGRESS: "false",
}
"""The static Spark settings we recommend for sessions that train with sparkdl_avg, and that its jobs, notebooks and
tests use: executors fork TensorFlow-ready workers (:data:`DAEMON_MODULE`), the JVMs talk to Python over Unix domain
sockets (:data:`UNIX_SOCKETS`), and Spark's console progress bars stay off the fit's output
(:data:`CONSOLE_PROGRESS`). Give them to the session's builder (``SparkSession.builder.config(map=RECOMMENDED_CONF)``),
``spark-submit --conf`` or the cluster's Spark config; they cannot change once the session exists."""

TASK_FAILURE_MESSAGES: Dict[str, Tuple[str, ...]] = {
    # ERROR "Exception in task 0.0 in stage 1.0 (TID 2)" and the task's stack trace, its Python traceback included
    "org.apache.spark.executor.Executor": (r"Exception in task ",),
    # WARN "Lost task 0.0 in stage 1.0 (TID 2) (host executor driver): <the trace again>", and
    # ERROR "Task 0 in stage 1.0 failed 1 times; aborting job"
    "org.apache.spark.scheduler.TaskSetManager": (r"Lost task ", r"Task \S+ in stage \S+ failed \d+ times; aborting job"),
    # WARN "Failed to cancel job group ..." after a Ctrl-C, for each job group that had already ended
    "org.apache.spark.scheduler.DAGScheduler": (r"Failed to cancel job group ",),
    # ERROR "Aborting task" with the trace, "Job: job_..., Task: ..., Task attempt ... aborted." and "Aborting
    # job ..." with it again, when the failed task was writing files (the predict job's output)
    "org.apache.spark.util.Utils": (r"Aborting task",),
    "org.apache.spark.sql.execution.datasources.FileFormatWriter": (r"Aborting job ", r"Job:? \S+ .*aborted"),
    # WARN "Assume no metadata directory. Error while looking for metadata directory in the path: ..." and a
    # FileNotFoundException's stack, before reading a --data path that does not exist fails
    "org.apache.spark.sql.execution.streaming.sinks.FileStreamSink": (r"Assume no metadata directory",),
    # ERROR "Error in TaskCompletionListener" with "Block broadcast_0 does not exist": a job that fails before
    # training stops its session while the background warm-up's task (warm_up) is still running
    "org.apache.spark.TaskContextImpl": (r"Error in TaskCompletionListener",),
}
"""Spark's log messages that repeat a failed task's stack trace on the driver's console (in local mode the executor
runs in the driver's JVM), by logger: the start of each message, a regular expression. A failed task reaches the caller
as an exception, which sparkdl_avg turns into its own error with the task's message
(:mod:`sparkdl_avg.shared.errors.remote_errors`); these messages would print a long Java stack before a job's one
``error:`` line. Only they are dropped: the loggers' other warnings and errors (a lost executor, an uncaught exception)
still show. See :func:`quiet_task_failures`."""

WARM_UP_REUSE_S = 20.0
"""A warm-up started less than this many seconds ago is not repeated: its workers are still in the pool (PySpark drops
them after a minute idle)."""

WARM_UP_MODEL_BYTES = 64 * 2**20
"""The largest model archive ``warm_up(spark, model)`` ships in its tasks to build the replica ahead of the
fit (the tasks carry it in their closure; a fit ships the model by broadcast or file)."""

_warm_ups: Dict[Tuple[str, Optional[str]], Tuple[float, concurrent.futures.Future]] = {}
_warm_lock = threading.Lock()
_warming: Dict[int, "Engine"] = {}  # id(future) → the engine of a warm-up still running (cancelled at exit)
WARM_UP_GROUP = "sparkdl_avg-warm-up"  #: the job group (Connect: the tag) of the warm-up's jobs
#: How long the exit waits for a cancelled warm-up's jobs to end before the interpreter goes on (seconds).
WARM_UP_EXIT_WAIT_S = 5.0


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext, no RDDs, no broadcasts)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


class Engine:
    """One Spark session as the trainer uses it.

    Attributes:
        spark: The ``SparkSession`` (classic or Connect).
        connect: Whether it is a Spark Connect session.
        sc: The ``SparkContext`` of a classic session; ``None`` under Connect.
    """

    in_process = False  #: whether jobs run in this process without Spark (:mod:`.inprocess`)

    def __init__(self, spark) -> None:
        self.spark = spark
        self.connect = is_connect(spark)
        self.sc = None if self.connect else spark.sparkContext
        self._parallelism: Optional[int] = None
        self._ranges: Dict[Tuple[int, int], Any] = {}
        if self.sc is not None:
            _share_python_workers(spark)
            _quiet_once(spark)

    @property
    def master(self) -> str:
        """The master URL (``local[2]``, ``spark://...``, ``yarn``)."""
        if self.sc is not None:
            return self.sc.master
        return self.spark.conf.get("spark.master", "") or ""

    @property
    def version(self) -> str:
        """Spark's version (the server's under Connect)."""
        return self.spark.version

    def conf(self, key: str) -> Optional[str]:
        """The Spark setting ``key`` (the application's; the session's under Connect); ``None``: unset or unreadable."""
        try:
            return self.sc.getConf().get(key, None) if self.sc is not None else self.spark.conf.get(key, None)
        except Exception:  # noqa: BLE001 - a setting that cannot be read is one not known
            return None

    def check_options(self, config) -> None:
        """Refuses the trainer's options this engine cannot run, before any job (a Spark session runs them all)."""

    def cancel(self, group: Optional[str]) -> None:
        """Cancels the jobs of ``group`` (classic: the job group; Connect: the tag)."""
        self.sc.cancelJobGroup(group) if self.sc is not None else self.spark.interruptTag(group)

    @property
    def one_host(self) -> bool:
        """Whether every executor runs on the driver's host: ``local[N]`` and ``local-cluster[...]``.

        Under Connect the "driver" is the server's; the client may be elsewhere.
        """
        return self.master.startswith("local")

    @property
    def default_parallelism(self) -> int:
        """The cluster's default parallelism (task slots), which ``num_workers=None`` means.

        Connect has no ``defaultParallelism``: it is read from the master (``local[N]``, ``local-cluster[W,C,M]``) or
        ``spark.default.parallelism``, else measured once with a small job (the partitions of ``spark.range``, which the
        server sizes by its default parallelism).
        """
        if self._parallelism is None:
            self._parallelism = self._find_parallelism()
        return self._parallelism

    def _find_parallelism(self) -> int:
        if self.sc is not None:
            return int(self.sc.defaultParallelism)
        configured = self.spark.conf.get("spark.default.parallelism", None)
        if configured:
            return int(configured)
        m = re.fullmatch(r"local\[(\d+)(?:,\s*\d+)?\]", self.master)
        if m:
            return int(m.group(1))
        m = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", self.master)
        if m:
            return int(m.group(1)) * int(m.group(2))
        from pyspark.sql import functions as F

        row = self.spark.range(1 << 16).select(F.spark_partition_id().alias("p")).agg(F.max("p")).first()
        return int(row[0]) + 1

    @contextlib.contextmanager
    def labels(self, description: str, group: Optional[str] = None):
        """Labels the Spark jobs started inside the block, restoring the caller's labels.

        Classic: the job description and group the Spark UI shows. Connect has neither; the jobs get tags instead
        (``spark.addTag``: the group, and the description made tag-safe), which its UI lists and ``spark.interruptTag``
        can cancel.
        """
        if self.sc is not None:
            with spark_job_labels(self.sc, description, group):
                yield
            return
        tags = [t for t in (group, _TAG.sub("_", description)[:120]) if t]
        tags = [t for t in tags if t not in self.spark.getTags()]
        for tag in tags:
            self.spark.addTag(tag)
        try:
            yield
        finally:
            for tag in tags:
                self.spark.removeTag(tag)

    def carried_labels(self, description: str) -> Callable[[], Any]:
        """A context manager factory: jobs started in another thread inside it are labelled as the calling thread's.

        Job labels belong to a thread (classic: its local properties; Connect: its tags). What this returns, entered in
        another thread, gives the jobs started there the calling thread's group (and, under Connect, its tags, e.g. the
        fit's, which a Ctrl-C interrupts) and ``description`` as theirs (:meth:`labels`).
        """
        if self.sc is not None:
            group = self.sc.getLocalProperty("spark.jobGroup.id")
            return lambda: self.labels(description, group=group)
        tags = set(self.spark.getTags())  # a copy: the client's set is the calling thread's own

        @contextlib.contextmanager
        def carried():
            for tag in tags:
                self.spark.addTag(tag)
            try:
                with self.labels(description):
                    yield
            finally:
                for tag in tags:
                    self.spark.removeTag(tag)

        return carried

    def run_tasks(self, n: int, body: Callable, schema: str, start: int = 0,
                  places: Optional[Sequence[Optional[str]]] = None):
        """Runs ``body`` (a ``mapInArrow`` function) in ``n`` tasks, task ``i`` getting the ids ``[start + i]``.

        Returns the lazy DataFrame of what the tasks yield (``schema``, a DDL string), for the caller to transform
        further or bring back with ``toArrow()``. ``places`` (classic sessions): the host task ``i`` should run on, or
        ``None`` (see :meth:`located`).

        The ``spark.range`` DataFrame is made once per ``(start, n)`` and reused: ``mapInArrow`` asks for its input's
        columns, which under Spark Connect is an ``AnalyzePlan`` round trip per round (measured in docs/benchmarks.md,
        "Spark Connect against a classic session") unless the DataFrame already knows its schema.
        """
        if self.sc is not None and places is not None and any(places):
            ids = self.spark.createDataFrame(self.located([(start + i,) for i in range(n)], places), "id long")
            return ids.mapInArrow(body, struct_type(schema))
        ids = self._ranges.get((start, n))
        if ids is None:
            ids = self._ranges[(start, n)] = self.spark.range(start, start + n, numPartitions=n)
            ids.columns  # noqa: B018 - resolves the schema once; later mapInArrow calls reuse it
        return ids.mapInArrow(body, struct_type(schema))

    def located(self, items: Sequence[Any], places: Sequence[Optional[str]]):
        """An RDD of ``items``, one a partition, partition ``i`` to run on host ``places[i]`` (classic sessions).

        ``sc.parallelize`` sets no place; Spark's ``makeRDD`` takes one per item (a host name as Spark knows its
        executors': a locality preference, which the scheduler keeps for ``spark.locality.wait``, 3 s by default, while
        that host has no free slot; ``None``: anywhere). Narrow transformations of the RDD keep the preference.
        """
        from pyspark import RDD
        from pyspark.serializers import BatchedSerializer, CPickleSerializer

        sc, pickle = self.sc, CPickleSerializer()
        jvm = sc._jvm
        pairs = [jvm.scala.Tuple2(bytearray(pickle.dumps([item])), jvm.PythonUtils.toSeq([place] if place else []))
                 for item, place in zip(items, places)]
        any_ref = getattr(getattr(jvm.scala.reflect, "ClassTag$"), "MODULE$").AnyRef()
        rdd = sc._jsc.sc().makeRDD(jvm.PythonUtils.toSeq(pairs), any_ref)
        return RDD(rdd.toJavaRDD(), sc, BatchedSerializer(pickle, 1))

    @property
    def key(self) -> str:
        """What identifies the Spark application across ``Engine`` objects: its id, or the Connect session's."""
        if self.sc is not None:
            return f"app:{self.sc.applicationId}"
        return f"connect:{self.spark.session_id}"

    def warm_up(self, model=None) -> concurrent.futures.Future:
        """Starts making the executors' Python workers ready to train, in the background; returns its future.

        A new Python worker spends seconds importing TensorFlow before its first task (docs/benchmarks.md, "Cold
        start"; with ``spark.python.daemon.module`` set to :data:`DAEMON_MODULE` the daemon imports it once and a worker
        then costs a fork). Small jobs of ``default_parallelism`` tasks (an RDD job, then a Spark SQL one unless other
        jobs, e.g. a fit's first round, wait by then; under Connect only the SQL one) start those workers while the
        caller goes on with driver-side work, and leave them in the one pool that the fit's RDD rounds and Spark SQL
        jobs take workers from (see :func:`_share_python_workers`). Given a compiled ``model``, the first job's tasks
        also build its replica and trace its step function for the data a fit most likely stages
        (:class:`~sparkdl_avg.shared.model.tracing.WarmReplica`; a model whose archive exceeds
        :data:`WARM_UP_MODEL_BYTES` is left to the fit). The future's result is the workers' pids; a failure is logged
        at DEBUG and left to the real jobs to report. Repeated within :data:`WARM_UP_REUSE_S` seconds for the same
        model (or none), the earlier warm-up's future is returned.
        """
        replica = None
        if model is not None:
            from ...shared.model.tracing import WarmReplica

            replica = WarmReplica.of(model)  # here, not in the thread: the caller may change the model next
            if len(replica.spec.keras_bytes) > WARM_UP_MODEL_BYTES:
                replica = None
        key = (self.key, replica.spec.fingerprint if replica is not None else None)
        with _warm_lock:
            started = _warm_ups.get(key)
            if started is not None and time.monotonic() - started[0] < WARM_UP_REUSE_S:
                return started[1]
            future: concurrent.futures.Future = concurrent.futures.Future()
            _warm_ups[key] = (time.monotonic(), future)
            _warming[id(future)] = self
        _cancel_at_exit()
        threading.Thread(target=self._warm_up, args=(future, replica), name="sparkdl_avg-warm-up", daemon=True).start()
        return future

    def _warm_up(self, future: concurrent.futures.Future, replica=None) -> None:
        from ...executor import warm

        try:
            n = self.default_parallelism
            pids = set()
            with self.labels("sparkdl_avg warm-up: executors import TensorFlow", group=WARM_UP_GROUP):
                if self.sc is not None:
                    # An RDD job first: it starts the workers sooner than a SQL job, whose first run in an
                    # application also compiles Spark's Arrow path (docs/benchmarks/first_fit.md), needed by predict
                    # and staging but not by a fit on numpy arrays that may start meanwhile.
                    body = functools.partial(warm.warm_up_partition, replica=replica)
                    pids.update(self.sc.parallelize(range(n), n).mapPartitions(body).collect())
                    replica = None  # built and traced in those workers, which the SQL job's tasks reuse
                if not self._others_running():
                    body = functools.partial(warm.warm_up_batches, replica=replica)
                    pids.update(r.pid for r in self.run_tasks(n, body, "pid long").collect())
            future.set_result(sorted(pids))
        except BaseException as exc:  # noqa: BLE001 - the fit's own jobs report what is wrong
            logger.debug("warming up the executors failed: %s", exc)
            future.set_exception(exc)
        finally:
            with _warm_lock:
                _warming.pop(id(future), None)

    def _others_running(self) -> bool:
        """Whether jobs other than the warm-up's run on this classic session (a fit's first round, the user's own).

        The warm-up's SQL job then stays unsubmitted: its tasks would take the slots from those jobs' later tasks (a
        fit's next rounds) for a compilation of Spark's Arrow path that only a later ``predict`` or staging of a
        DataFrame needs, and pays for itself. Read once the listener bus has delivered what was posted
        (:func:`drain_status_events`): a job that just ended otherwise still reads as running.
        """
        if self.sc is None:
            return False
        try:
            drain_status_events(self.sc)
            tracker = self.sc.statusTracker()
            return bool(set(tracker.getActiveJobsIds()) - set(tracker.getJobIdsForGroup(WARM_UP_GROUP)))
        except Exception:  # noqa: BLE001 - the SQL job is only an optimisation
            return False

    def cancel_warm_up(self) -> None:
        """Cancels this session's running warm-up jobs with Spark's logging turned off (the process is ending)."""
        if self.sc is not None:
            self.sc.setLogLevel("OFF")  # the killed tasks' ERROR traces are no news to a script that ended
        self.cancel(WARM_UP_GROUP)

    def broadcast(self, value: Any):
        """A Spark broadcast of ``value`` (classic sessions only)."""
        if self.sc is None:
            raise RuntimeError("Spark Connect has no broadcasts; ship the value through the staging directory.")
        return self.sc.broadcast(value)


STATUS_DRAIN_MS = 5000
"""How long a read of a classic session's status store waits for Spark's listener bus to deliver the events posted
before it (milliseconds)."""


def drain_status_events(sc) -> None:
    """Waits until Spark's listener bus has delivered the events posted so far to the status store, or
    :data:`STATUS_DRAIN_MS` has passed.

    The store (``statusTracker()``, the executor list) learns of jobs and executors from events its own thread
    handles: without the wait, a job that ended a moment ago reads as running, an executor just added as absent, and a
    session just started on a loaded machine as having no slots. A timeout (a user's slow listener) leaves the store as
    it is.
    """
    from py4j.protocol import Py4JJavaError

    try:
        sc._jsc.sc().listenerBus().waitUntilEmpty(STATUS_DRAIN_MS)
    except Py4JJavaError:  # a TimeoutException
        pass


@functools.lru_cache(maxsize=None)
def _cancel_at_exit() -> None:
    """Registers (once) :func:`_cancel_warm_ups`, to run when the interpreter exits."""
    import atexit

    atexit.register(_cancel_warm_ups)


def _cancel_warm_ups() -> None:
    """At exit: cancels the warm-ups still running, quietly, and waits for them up to :data:`WARM_UP_EXIT_WAIT_S`.

    Otherwise a script that ends (or fails on a typo a few lines after ``warm_up``) while the executors still import
    TensorFlow leaves Spark to kill the warm-up's tasks as the JVM goes down: the console gets Spark's ERROR traces of a
    job nobody waits for, and the exit waits. Registered after PySpark's own exit hook (which kills the JVM), so it runs
    before it.
    """
    with _warm_lock:
        running = list(_warming.items())
    for key, engine in running:
        try:
            engine.cancel_warm_up()
        except Exception as exc:  # noqa: BLE001 - the session may be gone already
            logger.debug("could not cancel the warm-up at exit: %s", exc)
    deadline = time.monotonic() + WARM_UP_EXIT_WAIT_S
    for _, started in list(_warm_ups.values()):
        if id(started) in dict(running):
            try:
                started.exception(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - a timeout: the exit goes on
                pass


def warm_up(spark=None, model=None) -> concurrent.futures.Future:
    """Starts warming the executors' Python workers of ``spark`` (default: the active session) in the background.

    Call it right after creating the session: the seconds a new worker spends importing TensorFlow then pass while the
    notebook's or job's driver reads data, not in the first fit (a fit that starts before the warm-up ends waits for
    it). See :meth:`Engine.warm_up`; returns its future (the workers' pids).

    Args:
        spark: Default the active session.
        model: A compiled ``keras.Model`` the session will fit, or ``None`` (default). Given, the workers also build its
            replica and trace its training step (work taken out of the first fit, docs/benchmarks/first_fit.md) for
            numpy arrays or array columns of its input shapes, class indices as labels of a sparse loss; other data
            are traced again by the fit. Nothing is trained; a replica the fit cannot use costs the workers' memory
            until a fit of another model evicts it.

    Raises:
        SessionError: ``spark`` is ``None`` and no session is active.
        ConfigurationError: ``model`` is not compiled.
    """
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise SessionError("warm_up() needs a SparkSession; create one with SparkSession.builder.getOrCreate() first.")
    if model is not None and getattr(model, "optimizer", None) is None:
        raise ConfigurationError("The 'model' parameter of warm_up() must be a compiled keras.Model (call model.compile "
                           f"first). Got {type(model).__name__} without an optimizer.")
    return Engine(spark).warm_up(model)


def _console_level(jvm):
    """The least severe level Spark's console shows: the more severe of its shell threshold (where set) and the root's.

    A session started from Python (a script, a notebook, the pyspark shell) keeps the root logger at ``INFO`` and shows
    ``WARN`` and above through Spark's shell threshold ("Setting default log level to "WARN""); the jobs'
    ``spark.log.level=WARN`` sets the root logger itself.
    """
    root = jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel()
    try:
        logging_object = jvm.java.lang.Class.forName("org.apache.spark.internal.Logging$").getField("MODULE$").get(None)
        threshold = logging_object.sparkShellThresholdLevel()
    except Exception:  # noqa: BLE001 - another Spark: the root logger's level is all there is
        threshold = None
    return threshold if threshold is not None and threshold.isMoreSpecificThan(root) else root


_quieted: Dict[int, bool] = {}  # SparkContexts given quiet_task_failures, by id of their Java context


def _quiet_once(spark) -> None:
    """:func:`quiet_task_failures` once per SparkContext (each call costs a few Py4J round trips)."""
    key = id(spark.sparkContext._jsc)
    if key not in _quieted:
        _quieted[key] = quiet_task_failures(spark)


def quiet_task_failures(spark) -> bool:
    """Keeps failed tasks' stack traces off the console of ``spark``'s driver, unless its logging was turned up.

    Adds a log4j2 filter to each logger of :data:`TASK_FAILURE_MESSAGES`, in the driver's JVM (classic sessions), that
    drops those messages, when Spark's console shows ``WARN`` or quieter (:func:`_console_level`: a session's default,
    and ``spark.log.level=WARN``, the jobs' setting). With ``--conf spark.log.level=INFO`` (or ``DEBUG``: spark-submit's
    own default is ``INFO``) everything is logged, traces included. Under Spark Connect the server's logging is the
    server's: nothing is changed. Calling it again changes nothing; a later ``sc.setLogLevel("INFO")`` shows the
    loggers' other messages again but not these (start the session with ``spark.log.level=INFO``). Every session the
    trainer runs jobs on gets it (:class:`Engine`), the jobs' (:func:`sparkdl_avg.driver.api.cli.spark_session`) and
    users' alike: a failed round, staging or prediction reaches the caller as an exception that holds the task's trace
    (a ``WorkerError`` chains it; a ``DataError`` says which row), so the console's copy is noise. A user's own failing
    job still raises its trace in Python; only the log's copy is dropped.

    Returns:
        Whether the filters are in place.
    """
    if is_connect(spark):
        return False
    try:
        jvm = spark.sparkContext._jvm
        log4j = jvm.org.apache.logging.log4j
        core = log4j.core
        console = _console_level(jvm)
        if not console.isMoreSpecificThan(log4j.Level.WARN):
            return False  # INFO, DEBUG, ...: the user asked for Spark's details
        # Under the shell threshold the root logger stays at INFO and its own filter drops the rest; a logger
        # of its own does not pass through that filter, so it gets the console's level itself.
        root = log4j.LogManager.getRootLogger().getLevel()
        level = None if console.equals(root) else console
        context = log4j.LogManager.getContext(False)
        config = context.getConfiguration()
        for name, messages in TASK_FAILURE_MESSAGES.items():
            if config.getLoggerConfig(name).getName() != name:  # a logger of its own, its level inherited
                core.config.Configurator.setLevel(name, level)
            logger_config = config.getLoggerConfig(name)
            pattern = "(?s)(?:" + "|".join(messages) + ").*"  # the whole message: a trace spans lines
            if pattern in str(logger_config.getFilter()):
                continue
            result = core.Filter.Result
            logger_config.addFilter(core.filter.RegexFilter.createFilter(pattern, None, False, result.DENY,
                                                                         result.NEUTRAL))
        context.updateLoggers()
    except Exception as exc:  # noqa: BLE001 - another logging backend: its traces are not ours to hide
        logger.debug("could not filter Spark's task-failure messages: %s", exc)
        return False
    return True


#: What Spark's SQL runner adds to a Python worker's environment and its RDD runner does not (Spark 4.x).
_SQL_WORKER_ENV = {"SPARK_SIMPLIFIED_TRACEBACK": "1"}


def _share_python_workers(spark) -> None:
    """Lets RDD jobs (the classic rounds) reuse the Python workers of SQL jobs (predict, staging), and back.

    PySpark pools Python workers by their environment, and its SQL runner adds ``SPARK_SIMPLIFIED_TRACEBACK=1`` (while
    ``spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled`` is on, the default) where the RDD runner does not.
    Two pools would leave a fit's workers, with TensorFlow imported, of no use to the ``predict`` that follows: its
    first call would start and warm new ones, each pool with a daemon of its own (docs/benchmarks.md, "Cold start").
    Adding the variable to the context's worker environment (``SparkContext.environment``, what every Python function of
    the context ships with) makes the two pools one. The only other effect: tracebacks of the context's RDD tasks leave
    out PySpark's own frames, as its SQL tasks' do.
    """
    sc = spark.sparkContext
    if spark.conf.get("spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled", "true").lower() != "true":
        return
    for key, value in _SQL_WORKER_ENV.items():
        sc.environment.setdefault(key, value)


@functools.lru_cache(maxsize=64)
def struct_type(ddl: str):
    """The ``StructType`` of a DDL string, parsed once per process.

    ``mapInArrow(f, "a int, ...")`` parses its string schema on every call, and under Spark Connect that is a round trip
    to the server (an ``AnalyzePlan`` request) per round without this cache.
    """
    from pyspark.sql.types import DataType

    return DataType.fromDDL(ddl)


@contextlib.contextmanager
def spark_job_labels(sc, description: str, group: Optional[str] = None):
    """Labels the Spark jobs started inside the block (Spark UI), restoring the caller's labels."""
    keys = ("spark.job.description", "spark.jobGroup.id")
    saved = [sc.getLocalProperty(k) for k in keys]
    sc.setLocalProperty("spark.job.description", description)
    if group is not None:
        sc.setLocalProperty("spark.jobGroup.id", group)
    try:
        yield
    finally:
        for key, value in zip(keys, saved):
            sc.setLocalProperty(key, value)


def active_engine() -> Engine:
    """The :class:`Engine` of the active session, or of a session on the running SparkContext (numpy arrays' engine).

    Raises:
        SessionError: neither a session nor a SparkContext is active.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None:
        from pyspark import SparkContext

        sc = SparkContext._active_spark_context
        if sc is None:
            raise SessionError(
                "Training on numpy arrays needs an active SparkSession; create one with "
                "SparkSession.builder.getOrCreate() first."
            )
        active = SparkSession(sc)
    return Engine(active)
