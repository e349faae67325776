"""A classic session's live slots read from its status store after Spark's listener bus delivered its events.

The race, modelled in one thread: Spark posts "executor added" (the driver's own in ``local[N]``) to its listener bus,
and the status store's thread files it later. A session just started on a loaded machine read as no slots at all
(``test_live_slots_are_read_from_spark_and_a_probe_job_counts_them`` beside a CPU-bound process). And ``local[N]``'s
driver, whose slots are its N cores whatever ``spark.executor.cores`` says.
"""

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from py4j.protocol import Py4JJavaError

from sparkdl_avg.driver.elastic.membership import status_slots
from sparkdl_avg.driver.runtime.session import STATUS_DRAIN_MS


class Summary:
    def __init__(self, host_port, max_tasks, active=True, executor_id="1", total_cores=None):
        self._host_port, self._max_tasks, self._active = host_port, max_tasks, active
        self._id, self._total_cores = executor_id, max_tasks if total_cores is None else total_cores

    def id(self):
        return self._id

    def totalCores(self):  # noqa: N802
        return self._total_cores

    def isActive(self):  # noqa: N802 (Spark's ExecutorSummary)
        return self._active

    def maxTasks(self):  # noqa: N802
        return self._max_tasks

    def hostPort(self):  # noqa: N802
        return self._host_port


class JavaList(list):
    def iterator(self):
        it = iter(self)
        box = {}

        def has_next():
            if "next" not in box:
                box["next"] = next(it, StopIteration)
            return box["next"] is not StopIteration

        def take():
            has_next()
            return box.pop("next")

        return SimpleNamespace(hasNext=has_next, next=take)


class Bus:
    """A listener bus holding posted events until ``waitUntilEmpty`` delivers them to the store (or times out)."""

    def __init__(self, store, posted, slow=False):
        self.store, self.posted, self.slow, self.waits = store, list(posted), slow, []

    def waitUntilEmpty(self, timeout_ms):  # noqa: N802
        self.waits.append(timeout_ms)
        if self.slow:
            raise Py4JJavaError("An error occurred while calling o1.waitUntilEmpty", SimpleNamespace(_target_id="o2"))
        self.store.executors += self.posted
        self.posted = []


class Store:
    def __init__(self, executors=()):
        self.executors = list(executors)

    def executorList(self, active_only):  # noqa: N802
        return JavaList(e for e in self.executors if e.isActive() or not active_only)


def _context(store, bus, conf=None):
    settings = dict(conf or {})
    jsc = SimpleNamespace(statusStore=lambda: store, listenerBus=lambda: bus,
                          conf=lambda: SimpleNamespace(get=lambda key, default: settings.get(key, default)))
    return SimpleNamespace(_jsc=SimpleNamespace(sc=lambda: jsc))


def test_a_session_just_started_reads_the_driver_slots_its_bus_had_not_delivered():
    store = Store()
    bus = Bus(store, [Summary("driver-host:40000", 2)])
    slots = status_slots(_context(store, bus))
    assert (slots.count, slots.hosts) == (2, ("driver-host",))
    assert bus.waits == [STATUS_DRAIN_MS]


def test_executors_posted_before_the_call_count_and_lost_ones_do_not():
    store = Store([Summary("a:1", 2), Summary("b:1", 1, active=False)])
    bus = Bus(store, [Summary("c:7077", 4)])
    slots = status_slots(_context(store, bus))
    assert (slots.count, slots.hosts) == (6, ("a", "c"))


def test_a_bus_that_does_not_empty_in_time_leaves_the_store_as_it_is():
    store = Store([Summary("a:1", 2)])
    bus = Bus(store, [Summary("c:7077", 4)], slow=True)
    slots = status_slots(_context(store, bus))
    assert (slots.count, slots.hosts) == (2, ("a",))
    assert bus.waits == [STATUS_DRAIN_MS]


def test_a_local_masters_driver_counts_its_cores_whatever_spark_executor_cores_says():
    """``local[2]`` with ``spark.executor.cores=1`` (set by the session, or left in the JVM's system properties by the
    first session's spark-submit): Spark's store says 1 task at a time, the driver runs 2."""
    store = Store([Summary("driver-host:40000", 1, executor_id="driver", total_cores=2)])
    assert status_slots(_context(store, Bus(store, []))).count == 2
    assert status_slots(_context(store, Bus(store, []), {"spark.task.cpus": "2"})).count == 1
    executor = Store([Summary("a:1", 1, total_cores=2)])  # an executor's own: its maxTasks (GPUs may bound it)
    assert status_slots(_context(executor, Bus(executor, []))).count == 1


_TWO_SESSIONS = """
import sys
sys.path.insert(0, sys.argv[1])
from conftest import spark_session
from sparkdl_avg.driver.elastic.membership import status_slots

with spark_session("local[2]", "first", **{"spark.executor.cores": "1"}) as first:  # launches this process' JVM
    print("FIRST", status_slots(first.sparkContext).count)
with spark_session("local[2]", "second") as second:
    print("SECOND", status_slots(second.sparkContext).count, second.sparkContext.getConf().get("spark.executor.cores"))
"""


@pytest.mark.integration
def test_a_session_neither_reads_nor_leaves_spark_executor_cores_as_local_slots():
    """The order CI met: the process' first session (its conf, the JVM's system properties) set
    ``spark.executor.cores=1``; a later ``local[2]`` session inherited it and read one slot. In a fresh Python, so
    that the first session launches the JVM."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", _TWO_SESSIONS, tests], capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("FIRST", "SECOND"))]
    assert lines == ["FIRST 2", "SECOND 2 None"], proc.stdout[-2000:] + proc.stderr[-3000:]


class JobStore:
    """The status store's jobs as ``statusTracker()`` reads them: ids by group, and the active ones."""

    def __init__(self, active, groups):
        self.active, self.groups = set(active), dict(groups)

    def getActiveJobsIds(self):  # noqa: N802
        return sorted(self.active)

    def getJobIdsForGroup(self, group):  # noqa: N802
        return [j for j, g in self.groups.items() if g == group]


class JobBus:
    """A listener bus holding posted job ends until ``waitUntilEmpty`` delivers them."""

    def __init__(self, store, ended):
        self.store, self.ended, self.waits = store, list(ended), []

    def waitUntilEmpty(self, timeout_ms):  # noqa: N802
        self.waits.append(timeout_ms)
        self.store.active -= set(self.ended)
        self.ended = []


@pytest.mark.parametrize("group, running", [("a-fit", False), ("a-fit", True), ("sparkdl_avg-warm-up", True)])
def test_the_warm_ups_check_reads_jobs_once_the_bus_has_delivered_their_ends(group, running):
    """CI read a job whose ``collect`` had returned as still running: its end was posted, not yet delivered."""
    from sparkdl_avg.driver.runtime.session import WARM_UP_GROUP, Engine

    assert WARM_UP_GROUP == "sparkdl_avg-warm-up"
    store = JobStore(active=[7], groups={7: group})
    bus = JobBus(store, ended=[] if running else [7])
    jsc = SimpleNamespace(listenerBus=lambda: bus)
    engine = Engine.__new__(Engine)
    engine.sc = SimpleNamespace(_jsc=SimpleNamespace(sc=lambda: jsc), statusTracker=lambda: store)
    assert engine._others_running() is (running and group != WARM_UP_GROUP)
    assert bus.waits == [STATUS_DRAIN_MS]
