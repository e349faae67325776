"""Typed records of a fit's rounds and their workers, as data and as JSON.

This module owns what a round reports about itself: the executors fill one :class:`WorkerRecord` per worker, the
round runner (:mod:`sparkdl_avg.driver.fit.rounds`) one :class:`RoundRecord` per round, and :class:`TrainingStats`
keeps them in order (``trainer.stats``), summarises them and writes ``stats.json``. Records are dataclasses; they also
read like the dicts of ``stats.json`` (``record["wall_s"]``) so notebooks written against either work.

Times are seconds. A round's wall time splits into driver phases: ``wall_s = broadcast_s + schedule_s + workers_s +
aggregate_s + update_s + other_s`` (``job_s = schedule_s + workers_s + aggregate_s``), where

* ``broadcast_s``: reading the model's state and sending it (broadcast or file);
* ``schedule_s``: from submitting the job until the first worker starts;
* ``workers_s``: first worker start to last worker end;
* ``aggregate_s``: the rest of the job — results, their sum, transfer;
* ``update_s``: averaging and setting the new state on the driver's model;
* ``other_s``: bookkeeping (normally well under a millisecond).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..files.fs import replace_atomically


class _ReadsLikeADict:
    """``record["name"]``, ``record.get(...)`` and ``record.keys()`` over a dataclass's fields."""

    def __getitem__(self, key: str) -> Any:
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self.keys() else default

    def keys(self) -> List[str]:
        return [f.name for f in dataclasses.fields(self)]

    def __contains__(self, key: str) -> bool:
        return key in self.keys()

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class WorkerRecord(_ReadsLikeADict):
    """What one executor task did in a round (or one part of an evaluation).

    Attributes:
        worker: The worker's index in the round (the part's, in evaluation).
        host, pid: Where its Python worker ran.
        examples: Examples it trained on (evaluated).
        start, end: Its wall clock (``time.time``) at the task's start and end.
        setup_s: Replica lookup or build plus setting the round's state.
        load_s: Reading its examples from the staged data.
        compute_s: Training its ``k`` minibatches (0 in evaluation).
        replica_built: Whether this task had to build the replica.
        replicas_built_by_process: Replicas its Python worker has built so far.
        finite: Whether its loss and weights were finite.
        loss: Its mean loss over the round's minibatches.
        build_s: Of ``setup_s``, the seconds building the replica (0 when cached).
        traced: Whether this task traced its replica's step function for these data's shapes (the first round of that
            replica and data in this Python worker): its ``compute_s`` includes the trace and the function's first run,
            which costs several times a later one.
        trace_s: Of ``compute_s``, the seconds tracing (0 when not ``traced``).
        import_s: Seconds its Python worker spent importing TensorFlow itself, before the task started; reported by
            the worker's first task only, and 0 for a worker forked from :mod:`sparkdl_avg.daemon` (which imported it
            once, before forking).
        sent_bytes: Bytes of sums (or, under ``update_compression``, of its compressed delta) it sent; 0 when it sent
            none; ``None`` in evaluation.
        encode_s: Under ``update_compression``, its seconds computing and encoding its delta.
        feedback_s: Under error feedback, its seconds reading and writing its residual file.
        local_state_s: Under ``optimizer_state="local"``, its seconds reading and writing its own optimizer state.
        local_state_restarted: Under ``optimizer_state="local"``, whether its own optimizer state from its
            previous round was not where this task ran (its host lost, or the task placed elsewhere) and it
            restarted from the driver's optimizer variables (:mod:`sparkdl_avg.shared.wire.local_state`).
        host_names: Under ``optimizer_state="local"`` kept on the hosts, the names Spark may know its host by
            (where the driver places the worker's next task); empty otherwise.
        memory_start, memory_peak: Its Python worker's resident memory (bytes) at the task's start, and the
            highest it reached until its sums were ready (:class:`PeakMemory`; ``None`` where ``/proc`` does
            not say). The process's peak is reset at each task's start, so a worker reused across fits reports
            this task's peak, not its lifetime's; :meth:`TrainingStats.worker_peak_memory` subtracts the level
            at the worker's first task of the fit. Sending the sums afterwards (pickling them, on Spark's
            result path) is not counted.

    A round where a worker built its replica or traced is not steady state:
    :func:`sparkdl_avg.driver.observe.costmodel.steady_costs` leaves it out.
    """

    worker: int
    host: str
    pid: int
    examples: int
    start: float
    end: float
    setup_s: float = 0.0
    load_s: float = 0.0
    compute_s: float = 0.0
    replica_built: bool = False
    replicas_built_by_process: int = 0
    finite: bool = True
    loss: float = float("nan")
    build_s: float = 0.0
    traced: bool = False
    trace_s: float = 0.0
    import_s: float = 0.0
    sent_bytes: Optional[int] = None
    encode_s: float = 0.0
    feedback_s: float = 0.0
    local_state_s: float = 0.0
    local_state_restarted: bool = False
    host_names: Tuple[str, ...] = ()
    memory_start: Optional[int] = None
    memory_peak: Optional[int] = None


@dataclass
class RoundRecord(_ReadsLikeADict):
    """One round's timing, size and loss, as the driver measured it (see the module docstring for the phases).

    Besides the phases: ``t_start`` (driver wall clock at the round's start), ``compute_{max,min,mean}_s``,
    ``load_{max,mean}_s``, ``setup_max_s`` over the workers, ``overhead_s`` (wall time minus the slowest worker's setup
    + load + compute), ``examples_per_s``, the round's mean ``loss``, ``replicas_built`` (tasks that built a replica),
    ``update_rule`` and ``workers`` (their :class:`WorkerRecord`\\ s, by index). How the sums travelled: ``transport``
    (``"spark"``, ``"files"``, ``"sql"``), ``aggregation`` and ``shards`` (the Spark SQL round's plan, see
    :mod:`sparkdl_avg.driver.transport`), ``received_bytes`` (bytes of sums the driver received or read; ``None`` on
    Spark's tree, which does not say), ``state_bytes`` (bytes of state the driver sent out: the whole state, or on the
    ``"spark"`` transport under ``optimizer_state="local"``/``"reset"`` the round's patch and any new base,
    :mod:`sparkdl_avg.shared.wire.state_patch`; ``None``: not known), ``driver_sum_s`` (the driver's time decoding and adding them, part of
    ``aggregate_s``) and ``driver_cpu_s`` (the CPU seconds the driver's Python process spent on that and on the update:
    its own work per round, without the time it waits for a core, though memory-bound work still costs more CPU time
    when other processes share the cores). ``reduce_max_s``: in a sharded Spark SQL round (``aggregation``
    ``"shuffle"``/``"storage"``), the slowest reducer's seconds reading and summing its shard, part of ``aggregate_s``.
    What the workers sent: ``compression`` (``update_compression``, ``""``: none), ``sent_bytes`` (the bytes of sums or
    compressed deltas all its workers sent), ``encode_max_s`` and ``feedback_max_s`` (the slowest worker's encoding and
    residual-file seconds).

    Under ``synchronization="stale"`` or ``"async"`` (:mod:`sparkdl_avg.driver.fit.stale_async`) each record is one
    worker's *chunk*: ``num_workers`` is 1, ``round`` the round whose data it trained, ``chunk`` its index in the epoch
    (``round * workers + part``), ``slot`` the driver's worker that ran it (also ``workers[0].worker``), ``staleness``
    how many rounds before its own were not yet all applied when it read the weights (at most the ``staleness``
    option), ``delay`` the updates applied between its read and its own, in rounds (``num_workers`` updates), and
    ``update_scale`` the factor its update was applied with. Chunk records overlap in time. All five are ``None`` for
    synchronous rounds.

    Elastic rounds (``min_workers``/``max_workers``, :mod:`sparkdl_avg.driver.elastic.membership`): ``membership`` is
    the change of workers that took effect at this round (``{"epoch", "round", "workers", "slots", "hosts",
    "reason"}``; ``None``: the same workers as the round before), ``start`` the epoch position of the round's first
    example and ``residuals_dropped`` the error-feedback residuals of workers that left, dropped at this round (their
    share of the codec's rounding is lost once).

    ``optimizer_state="local"``: ``local_states_restarted`` counts the workers whose own optimizer state was lost at
    this round (kept on a host the worker's task did not run on) and restarted from the driver's
    (:mod:`sparkdl_avg.shared.wire.local_state`).

    ``link_rate``: the driver link's effective rate (bytes/s) this round's sums measured (``None``: not measurable,
    e.g. on the ``"files"`` transport; on one host, the local "link"); what ``state_transport="auto"`` re-chooses its
    path from (:mod:`sparkdl_avg.driver.transport.link_rate`). ``transport`` is then the path each round took.
    ``overlapped``: the round ran under ``overlap_rounds`` (its average applied one round late).

    ``overlap_rounds``: ``announced_ahead`` says the round was announced while the round before it trained (a standing
    job's pipelined rounds): its workers went on to it as soon as they had answered that round, before its
    ``t_start``, so its ``wall_s`` is the time between the two rounds' ends on the driver, which the workers' compute
    overlaps.
    """

    epoch: int
    round: int
    averaging_frequency: int
    num_workers: int
    examples: int
    t_start: float
    wall_s: float
    broadcast_s: float
    job_s: float
    schedule_s: float
    workers_s: float
    aggregate_s: float
    update_s: float
    other_s: float
    compute_max_s: float
    compute_min_s: float
    compute_mean_s: float
    load_max_s: float
    load_mean_s: float
    setup_max_s: float
    overhead_s: float
    examples_per_s: float
    loss: Optional[float]
    replicas_built: int
    workers: List[WorkerRecord] = field(default_factory=list)
    update_rule: str = "average"
    transport: str = ""
    aggregation: str = ""
    shards: int = 0
    received_bytes: Optional[int] = None
    state_bytes: Optional[int] = None
    driver_sum_s: float = 0.0
    driver_cpu_s: float = 0.0
    reduce_max_s: float = 0.0
    compression: str = ""
    sent_bytes: Optional[int] = None
    encode_max_s: float = 0.0
    feedback_max_s: float = 0.0
    chunk: Optional[int] = None
    slot: Optional[int] = None
    staleness: Optional[int] = None
    delay: Optional[float] = None
    update_scale: Optional[float] = None
    membership: Optional[Dict[str, Any]] = None
    start: Optional[int] = None
    residuals_dropped: int = 0
    local_states_restarted: int = 0
    link_rate: Optional[float] = None
    overlapped: bool = False
    announced_ahead: bool = False


def wall_time(records) -> float:
    """Seconds the records cover: their sum for rounds, first start to last end for (overlapping) chunks."""
    records = list(records)
    if not records:
        return 0.0
    if records[0].chunk is None:
        return sum(r.wall_s for r in records)
    return max(r.t_start + r.wall_s for r in records) - min(r.t_start for r in records)


def _proc_status(*keys: str) -> Dict[str, int]:
    """Fields of ``/proc/self/status`` in bytes (``{}`` where there is no such file: not Linux)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in keys:
                    out[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        return {}
    return out


class PeakMemory:
    """This process's peak resident memory from now on, above its level now (Linux).

    ``VmHWM`` in ``/proc/self/status`` is the peak over the process's lifetime, and the driver and PySpark's Python
    workers live across fits: so the start resets it to the current resident size (writing ``5`` to
    ``/proc/self/clear_refs``, Linux ≥ 4.0) and keeps that size; :meth:`peak` is ``VmHWM`` after, :meth:`above` the
    difference (bytes). Resident memory counts the pages of mapped files the process touched (staged data, a state
    file) as well as its heap. Where ``/proc`` is missing or the reset is refused, both are ``None``.
    """

    def __init__(self) -> None:
        reset = False
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            reset = True
        except OSError:
            pass
        self.start: Optional[int] = _proc_status("VmRSS").get("VmRSS") if reset else None

    def peak(self) -> Optional[int]:
        """The process's highest resident size (bytes) since the start; ``None``: not known."""
        return None if self.start is None else _proc_status("VmHWM").get("VmHWM")

    def above(self) -> Optional[int]:
        """:meth:`peak` minus the resident size at the start (bytes); ``None``: not known."""
        peak = self.peak()
        return None if peak is None else peak - self.start


class TrainingStats:
    """The round records of one fit (``trainer.stats``: the latest fit's), in order.

    Attributes:
        records: The fit's :class:`RoundRecord`\\ s, in order.
        staging_s: Seconds the fit spent staging its training and validation data before its first round (the data's
            checks and copy, see :mod:`sparkdl_avg.driver.data.staging`); about 0 when an earlier fit of the same
            trainer had staged the same data.
        staged_bytes: Bytes of the fit's staged training data (its Arrow columns as written: images and text as they
            came, numbers in the model inputs' dtypes); 0 for a fit made without staging.
        validation_staged_bytes: Likewise for the validation data (0: none).
        driver_peak_memory: The driver process's peak resident memory during the fit above its level when the fit
            started, in bytes (:class:`PeakMemory`; ``None`` until the fit ends, or where not known).
        started: When ``fit`` was called (``time.time()``); ``None`` for records read back or built by hand.
    """

    def __init__(self, staging_s: float = 0.0, staged_bytes: int = 0, validation_staged_bytes: int = 0,
                 started: Optional[float] = None) -> None:
        self.records: List[RoundRecord] = []
        self.driver_peak_memory: Optional[int] = None
        self.staging_s = staging_s
        self.staged_bytes = staged_bytes
        self.validation_staged_bytes = validation_staged_bytes
        self.started = started

    @property
    def startup(self) -> Dict[str, Optional[float]]:
        """Where the fit's time went until its first round ended: what a session's first fit pays more than the next.

        Seconds, in order: ``driver_s``, the fit's own driver work before its first round, staging aside (its checks,
        the session's parallelism, the model's description, the transport's start; ``None`` without :attr:`started`);
        ``staging_s`` (above); ``wait_executors_s``, from the first round's job submitted to its first task started
        (executors starting Python workers: forking them from :mod:`sparkdl_avg.daemon`, or waiting for it to import
        TensorFlow, or for a warm-up's tasks); ``import_s``, ``build_s`` and ``trace_s``, the slowest worker's
        TensorFlow import in its worker, replica build and step function trace (0 when cached); ``first_steps_s``, the
        slowest worker's training of its first round beyond the trace (a step function's first run costs several later
        ones); ``round1_s`` the first round's wall time and ``round2_s`` the second's (the steady cost to compare with;
        ``None`` for a one-round fit); ``to_round1_end_s`` from the call of ``fit`` to the first round's end. Empty
        before the first round. A session's first fit against its second shows what was paid once
        (``benchmarks/first_fit.py`` fails when that grows past its targets).
        """
        if not self.records:
            return {}
        first = self.records[0]
        workers = first.workers or []

        def most(name):
            return max((getattr(w, name) for w in workers), default=0.0)

        known = self.started is not None
        return {
            "driver_s": first.t_start - self.started - self.staging_s if known else None,
            "staging_s": self.staging_s,
            "wait_executors_s": first.schedule_s,
            "import_s": most("import_s"),
            "build_s": most("build_s"),
            "trace_s": most("trace_s"),
            "first_steps_s": max((w.compute_s - w.trace_s for w in workers), default=0.0),
            "round1_s": first.wall_s,
            "round2_s": self.records[1].wall_s if len(self.records) > 1 else None,
            "to_round1_end_s": first.t_start + first.wall_s - self.started if known else None,
        }

    def add(self, record: RoundRecord) -> None:
        self.records.append(record)

    @property
    def membership(self) -> List[Dict[str, Any]]:
        """Elastic rounds: this fit's changes of workers, in order (each round's ``membership``, where it has one)."""
        return [r.membership for r in self.records if r.membership is not None]

    @property
    def local_states_restarted(self) -> int:
        """``optimizer_state="local"``: workers' own optimizer states this fit lost and restarted (see :class:`RoundRecord`)."""
        return sum(r.local_states_restarted for r in self.records)

    def worker_peak_memory(self) -> Dict[Tuple[str, int], int]:
        """``{(host, pid): bytes}``: each executor Python worker's peak resident memory in this fit above its level at its first task of the fit.

        From the workers' records (:attr:`WorkerRecord.memory_peak`, :attr:`WorkerRecord.memory_start`); workers that
        did not report are left out.
        """
        start: Dict[Tuple[str, int], int] = {}
        peak: Dict[Tuple[str, int], int] = {}
        for record in self.records:
            for w in record.workers:
                if w.memory_start is None or w.memory_peak is None:
                    continue
                key = (w.host, w.pid)
                start.setdefault(key, w.memory_start)
                peak[key] = max(peak.get(key, 0), w.memory_peak)
        return {key: peak[key] - start[key] for key in peak}

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[RoundRecord]:
        return iter(self.records)

    def to_json(self, path: Optional[str] = None) -> str:
        """The records as a JSON array; also written to ``path`` when given."""
        text = json.dumps([r.to_dict() for r in self.records], indent=1)
        if path is not None:
            with replace_atomically(path, suffix=".json") as tmp:
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(text)
        return text

    def summary(self, first: int = 0) -> Dict[str, float]:
        """Totals and medians over the rounds from index ``first`` on (default: all).

        ``compute_share`` is the slowest worker's compute time over the round wall time, summed over rounds;
        ``overhead_s_median`` is the median of (round wall time − slowest worker's setup, load and compute);
        ``straggler_ratio_median`` is the median slowest/fastest compute ratio. Chunk records (asynchronous modes)
        count each epoch's span once (:func:`wall_time`), and their compute share is per worker; they add
        ``staleness_max`` and ``delay_median``. ``sent_bytes_per_worker_median`` is the median bytes a worker sent per
        round (``None`` where not known), ``encode_s_median`` the median of the slowest worker's encoding seconds
        (``update_compression``; 0 without it); ``staged_bytes`` the training data's staged bytes;
        ``driver_peak_memory_bytes`` the driver's peak resident memory above its level at the fit's start
        (:attr:`driver_peak_memory`) and ``worker_peak_memory_bytes`` the highest of the executor workers'
        (:meth:`worker_peak_memory`), ``None`` where not known.
        """
        records = self.records[first:]
        if not records:
            return {}
        chunks = records[0].chunk is not None
        epochs = sorted({r.epoch for r in records})
        wall = sum(wall_time([r for r in records if r.epoch == e]) for e in epochs)
        slots = len({r.slot for r in records}) if chunks else 1
        extra = {}
        if chunks:
            extra = {"staleness_max": max(r.staleness for r in records),
                     "delay_median": statistics.median(r.delay for r in records)}
        return {
            "rounds": len(records),
            "wall_s": wall,
            "examples": sum(r.examples for r in records),
            "compute_share": sum(r.compute_max_s for r in records) / (wall * slots) if wall else 0.0,
            "overhead_s_median": statistics.median(r.overhead_s for r in records),
            "straggler_ratio_median": statistics.median(
                r.compute_max_s / r.compute_min_s if r.compute_min_s > 0 else 1.0 for r in records
            ),
            "replicas_built": sum(r.replicas_built for r in records),
            "sent_bytes_per_worker_median": (
                statistics.median(r.sent_bytes / r.num_workers for r in records)
                if all(r.sent_bytes is not None for r in records) else None),
            "encode_s_median": statistics.median(r.encode_max_s for r in records),
            "staged_bytes": self.staged_bytes,
            "driver_peak_memory_bytes": self.driver_peak_memory,
            "worker_peak_memory_bytes": max(self.worker_peak_memory().values(), default=None),
            **extra,
        }
