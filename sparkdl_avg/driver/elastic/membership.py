"""Elastic rounds' membership, on the driver: how many workers each round has, and why.

With ``min_workers`` or ``max_workers`` set (``TrainerConfig.elastic``) the trainer asks :class:`Membership` before
every round how many workers to plan. It reads the task slots Spark has live, from Spark's own status and no service of
ours:

* a classic session: the status store's executors that are active and their task slots (``maxTasks``: cores over
  ``spark.task.cpus``), as the Spark UI lists them; a read of the driver's memory, milliseconds;
* Spark Connect, which has no SparkContext: with a ``local[N]`` master, ``N``; otherwise a probe job of one short task
  per slot wanted, which counts the Python workers its tasks ran in (a slot runs its tasks one after another in one
  reused worker, so ``P`` tasks on ``S < P`` slots run in ``S`` workers). It runs every :data:`PROBE_EVERY_S` seconds,
  and at once after a round whose tasks shared a worker (a slot was lost).

A round then has ``min(max_workers, slots)`` workers. Under dynamic allocation (``spark.dynamicAllocation.enabled``, a
classic session) fewer slots than ``max_workers`` also ask Spark for the executors missing
(``SparkContext.requestExecutors``, at most every :data:`REQUEST_EVERY_S`): Spark's own policy adds executors only for
tasks that wait, and elastic rounds never make tasks wait. Executors that dynamic allocation releases (idle past
``executorIdleTimeout``, e.g. while a callback runs) leave the plan like lost ones. While fewer than ``min_workers``
slots are live the fit waits, polling every :data:`WAIT_POLL_S`, and fails after ``elastic_timeout_s`` with a
``WorkerError`` that says what it saw. Which examples the workers train follows from the count alone
(:mod:`sparkdl_avg.shared.data.example_order`: a round of ``n`` workers takes the next ``n·k·B`` positions of the
epoch), so a lost worker's examples go to the workers of the next rounds and a fit that replays the same counts trains
bitwise the same weights.

Each change is kept as a :class:`Change` (epoch, round, workers, hosts, why): in the round's record
(``RoundRecord.membership``), in ``trainer.stats.membership`` and in every checkpoint.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ...errors import WorkerError

logger = logging.getLogger("sparkdl_avg")

PROBE_EVERY_S = 2.0
"""Under Spark Connect (not ``local[N]``), the seconds between two probe jobs while no round shows a lost slot."""

PROBE_HOLD_S = 0.05
"""Seconds each probe task holds its slot, so that the probe's tasks overlap and each slot runs one at a time."""

REQUEST_EVERY_S = 30.0
"""Under dynamic allocation, the seconds between two requests for the executors that ``max_workers`` lacks."""

WAIT_POLL_S = 0.5
"""Seconds between two reads of the live slots while fewer than ``min_workers`` are live."""


@dataclass(frozen=True)
class Slots:
    """The task slots Spark has live: how many, and on which hosts (sorted, each once)."""

    count: int
    hosts: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Change:
    """A change of a fit's workers, recorded at the round it took effect.

    Attributes:
        epoch: 0-based epoch of the first round with ``workers`` workers.
        round: 0-based round of ``epoch``.
        workers: Workers per round from then on.
        slots: Task slots live when it was planned.
        hosts: The hosts with live slots.
        reason: ``"start"``, ``"resumed"``, ``"slots lost"``, ``"slots joined"``.
    """

    epoch: int
    round: int
    workers: int
    slots: int
    hosts: Tuple[str, ...] = ()
    reason: str = ""

    def to_json(self) -> Dict[str, Any]:
        return {**asdict(self), "hosts": list(self.hosts)}

    @classmethod
    def from_json(cls, value: Dict[str, Any]) -> "Change":
        return cls(**{**value, "hosts": tuple(value.get("hosts", ()))})


def status_slots(sc) -> Slots:
    """The live task slots of a classic session: its status store's active executors (the driver's in ``local[N]``).

    Read once Spark's listener bus has delivered what was posted before the call (:func:`drain_status_events`): a
    session just started, on a loaded machine, otherwise reads as no slots at all, and an executor added a moment ago
    as absent.
    """
    from ..runtime.session import drain_status_events

    drain_status_events(sc)
    jsc = sc._jsc.sc()
    task_cpus = int(jsc.conf().get("spark.task.cpus", "1"))
    summaries = jsc.statusStore().executorList(True)
    count, hosts = 0, set()
    it = summaries.iterator()
    while it.hasNext():
        summary = it.next()
        # ``local[N]``'s one executor is the driver, with N cores. The store divides ``spark.executor.cores`` by the
        # task's CPUs instead, a setting meaningless there: with it at 1, ``local[2]`` read as one slot.
        slots = int(summary.totalCores()) // task_cpus if summary.id() == "driver" else int(summary.maxTasks())
        if summary.isActive() and slots > 0:
            count += slots
            hosts.add(str(summary.hostPort()).rsplit(":", 1)[0])
    return Slots(count, tuple(sorted(hosts)))


def probe_task(batches):
    """A probe task (``mapInArrow``): holds its slot :data:`PROBE_HOLD_S`, then says which host and Python worker ran it."""
    import pyarrow as pa

    for _ in batches:
        pass
    time.sleep(PROBE_HOLD_S)
    yield pa.RecordBatch.from_pydict({"host": [socket.gethostname()], "pid": [os.getpid()]})


def probe_slots(engine, tasks: int) -> Slots:
    """The live task slots, up to ``tasks``, measured by a probe job of ``tasks`` tasks (Spark Connect)."""
    with engine.labels("sparkdl_avg elastic rounds: which task slots are live"):
        rows = engine.run_tasks(tasks, probe_task, "host string, pid long").collect()
    workers = {(r.host, r.pid) for r in rows}
    return Slots(len(workers), tuple(sorted({host for host, _ in workers})))


def probes(engine) -> bool:
    """Whether reading ``engine``'s live slots takes a probe job: Spark Connect, unless its master is ``local[N]``."""
    return engine.sc is None and not engine.master.startswith("local[")


class LiveSlots:
    """Reads an engine's live task slots (see the module docstring); called before each elastic round.

    Args:
        engine: The session's :class:`~sparkdl_avg.driver.runtime.session.Engine`.
        wanted: The most slots a round can use (a probe job runs that many tasks).
    """

    def __init__(self, engine, wanted: int) -> None:
        self.engine, self.wanted = engine, wanted
        self._probed: Optional[Tuple[float, Slots]] = None
        self._requested: Optional[float] = None  # when executors were last requested (dynamic allocation)

    def request(self, missing: int) -> None:
        """Under dynamic allocation, asks Spark for the executors that ``missing`` more slots take (see the module doc)."""
        sc = self.engine.sc
        if sc is None or missing <= 0 or sc.getConf().get("spark.dynamicAllocation.enabled", "false") != "true":
            return
        now = time.monotonic()
        if self._requested is not None and now - self._requested < REQUEST_EVERY_S:
            return
        self._requested = now
        per_executor = int(sc.getConf().get("spark.executor.cores", "1")) // int(sc.getConf().get("spark.task.cpus",
                                                                                                    "1"))
        executors = -(-missing // max(1, per_executor))
        logger.info("Elastic rounds under dynamic allocation: %d task slots short of max_workers; requesting %d "
                    "executor(s).", missing, executors)
        sc._jsc.sc().requestExecutors(executors)

    def __call__(self, suspect: bool = False, epoch: int = 0, round: int = 0) -> Slots:  # noqa: A002
        """The live slots; ``suspect``: the last round's tasks shared a Python worker (probe again now).

        ``epoch``, ``round``: the round they are read for (a :class:`ScriptedSlots` answers by them).
        """
        engine = self.engine
        if engine.sc is not None:
            return status_slots(engine.sc)
        if not probes(engine):  # Connect on local[N]: its N slots live as long as the server
            return Slots(engine.default_parallelism, (socket.gethostname(),))
        now = time.monotonic()
        if suspect or self._probed is None or now - self._probed[0] >= PROBE_EVERY_S:
            self._probed = (now, probe_slots(self.engine, self.wanted))
        return self._probed[1]


SlotSource = Callable[..., Slots]

_source_override: List[SlotSource] = []  # ScriptedSlots in effect, innermost last


class ScriptedSlots:
    """Task slots as a script says instead of Spark's, for tests and for replaying a fit's membership.

    Inside ``with ScriptedSlots(changes):`` every elastic fit sees, for the round of ``(epoch, round)``, the slots of
    the last change at or before it (the first change's before that). The rounds' tasks still run on Spark's real slots.
    A fit replayed with its own history (:meth:`replay`, from ``trainer.stats.membership`` or a checkpoint's) plans the
    same workers for every round, so it trains bitwise the same weights.

    Args:
        changes: ``(epoch, round, slots)`` triples.
    """

    def __init__(self, changes) -> None:
        self.changes = sorted((int(e), int(r), int(n)) for e, r, n in changes)
        if not self.changes:
            raise ValueError("ScriptedSlots needs at least one (epoch, round, slots) change")

    @classmethod
    def replay(cls, membership) -> "ScriptedSlots":
        """The script of a recorded membership (``trainer.stats.membership``: dicts with epoch, round and workers)."""
        return cls([(c["epoch"], c["round"], c["workers"]) for c in membership])

    def __call__(self, suspect: bool = False, epoch: int = 0, round: int = 0) -> Slots:  # noqa: A002
        count = self.changes[0][2]
        for e, r, n in self.changes:
            if (e, r) <= (epoch, round):
                count = n
        return Slots(count, ("scripted",))

    def __enter__(self) -> "ScriptedSlots":
        _source_override.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _source_override.remove(self)


def slot_source(engine, wanted: int) -> SlotSource:
    """What reads the slots for a fit: :class:`LiveSlots`, unless a test scripts them (``ScriptedSlots``)."""
    if _source_override:
        return _source_override[-1]
    return LiveSlots(engine, wanted)


@dataclass
class Membership:
    """Plans each elastic round's workers and keeps the history of changes.

    Args:
        slots: Reads the live slots (:func:`slot_source`).
        min_workers, max_workers: The fewest and the most workers a round may have.
        timeout_s: How long to wait for ``min_workers`` slots before failing.
        history: Changes so far (a resumed fit's, from its checkpoint).
        resumed: The fit continues a checkpoint: its first round records a change (``"resumed"``) whatever its workers.
        checkpointed: The fit writes checkpoints (``checkpoint_dir``): the timeout's advice is to resume from them;
            without, to run the fit again.
    """

    slots: SlotSource
    min_workers: int
    max_workers: int
    timeout_s: float
    history: List[Change] = field(default_factory=list)
    resumed: bool = False
    checkpointed: bool = False
    _suspect: bool = False

    @property
    def workers(self) -> Optional[int]:
        """The workers of the latest round that ran; ``None`` before the first."""
        return self.history[-1].workers if self.history else None

    def plan(self, epoch: int, rnd: int) -> Tuple[int, Optional[Change]]:
        """The workers for round ``rnd`` of ``epoch`` and the :class:`Change` it would make (``None``: the same as before).

        The change counts once the round runs (:meth:`commit`): the epoch's end may come first, when what it has left is
        less than a minibatch each.
        """
        live = self._wait(epoch, rnd)
        workers = min(self.max_workers, live.count)
        request = getattr(self.slots, "request", None)
        if request is not None and live.count < self.max_workers:
            request(self.max_workers - live.count)
        before = self.workers
        if before == workers and not self.resumed:
            return workers, None
        reason = ("resumed" if self.resumed else "start" if before is None
                  else "slots lost" if workers < before else "slots joined")
        return workers, Change(epoch, rnd, workers, live.count, live.hosts, reason)

    def commit(self, change: Change) -> None:
        """Records ``change``: its round runs."""
        before = self.workers
        self.history.append(change)
        self.resumed = False
        if before is not None and before != change.workers:
            logger.info("Elastic rounds: %d workers from round %d of epoch %d (%d before; %s; %d task slots on %s).",
                        change.workers, change.round + 1, change.epoch + 1, before, change.reason, change.slots,
                        ", ".join(change.hosts) or "?")

    def round_done(self, record) -> None:
        """Notes a round's record: tasks that shared a Python worker mean a slot was lost; probe again at once."""
        ran_in = {(w.host, w.pid) for w in record.workers}
        self._suspect = len(ran_in) < len(record.workers)

    def _wait(self, epoch: int, rnd: int) -> Slots:
        """The live slots, once at least ``min_workers``; raises ``WorkerError`` after ``timeout_s``."""
        started = time.monotonic()
        live = self.slots(suspect=self._suspect, epoch=epoch, round=rnd)
        self._suspect = False
        warned = False
        while live.count < self.min_workers:
            waited = time.monotonic() - started
            if waited >= self.timeout_s:
                raise WorkerError(
                    f"Elastic rounds need at least min_workers={self.min_workers} task slots, and only {live.count} "
                    f"were live ({', '.join(live.hosts) or 'no executor'}) for {waited:.0f} s (elastic_timeout_s="
                    f"{self.timeout_s:g}). " + (
                        "The model keeps the weights of the last round (and the last checkpoint is unchanged): add "
                        "executors, or lower min_workers, and resume." if self.checkpointed else
                        "The model keeps the weights of the last round; this fit wrote no checkpoints (no "
                        "checkpoint_dir), so it cannot be resumed: add executors, or lower min_workers, and fit "
                        "again (with checkpoint_dir set, a later failure can be resumed)."))
            if not warned:
                logger.warning("Elastic rounds: %d task slots live, min_workers=%d; waiting up to %.0f s for more.",
                               live.count, self.min_workers, self.timeout_s)
                warned = True
            time.sleep(WAIT_POLL_S)
            live = self.slots(suspect=True, epoch=epoch, round=rnd)
        return live


def history_json(history: Sequence[Change]) -> List[Dict[str, Any]]:
    """The changes as JSON-able dicts (what a checkpoint and ``stats.json`` hold)."""
    return [c.to_json() for c in history]
