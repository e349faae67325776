"""How a fit's model, each round's state and the workers' sums move: the driver's half.

This module owns the ``state_transport``, ``aggregation`` and
``aggregation_shards`` options: :func:`choose` turns them into one
:class:`StateTransport` per fit (or evaluation). That object ships the
model, sends each round's state, runs the round's Spark job and brings the
workers' sums back as one :class:`~sparkdl_avg.shared.wire.aggregation.PartialResult`
(:meth:`StateTransport.run_job`, for :mod:`sparkdl_avg.driver.fit.rounds`: a round's
job, or one worker's chunk at a time from several threads; a call leaves no
state behind but ``last_plan``), evaluates and cleans up. The tasks' side
and the file and row formats are in :mod:`sparkdl_avg.shared.wire.exchange`, the
executor-visible half.

* :class:`SparkTransport` — ``sc.broadcast`` out, ``treeAggregate`` back
  (depth ``aggregation_depth``); classic sessions only.
* :class:`FileTransport` — one file out and one file per worker back, under
  the staging directory, summed by the driver: the cheapest round when
  driver and executors share a host (measured in docs/benchmarks.md);
  classic sessions only.
* :class:`SqlTransport` — the round as a DataFrame job
  (``spark.range(N).mapInArrow``): state out as a file under the staging
  directory, sums back as raw Arrow bytes, optionally cut into ``S`` shards
  summed by ``S`` reducer tasks (through Spark's shuffle or the staging
  storage) so the driver receives one model's bytes whatever ``N`` is. Runs
  the same on a classic session and on Spark Connect.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from ...errors import ConfigurationError, PathError, WorkerError
from ...executor import worker as worker_mod
from ...shared.wire import exchange, standing
from ...shared.wire.aggregation import PartialResult, merge
from ...shared.wire.delta_sums import DeltaLayout, sum_deltas
from ...shared.files.fs import join, make_dir, remove_tree, resolve
from ...shared.errors.remote_errors import run_job
from ..config.options import parse_rate
from ..runtime.session import struct_type

logger = logging.getLogger("sparkdl_avg")


class StateTransport:
    """One fit's way of moving the model and round state out to the workers and their sums back.

    Attributes:
        name: ``"spark"``, ``"files"`` or ``"sql"`` (what ``state_transport="auto"`` chose).
        engine: The :class:`~sparkdl_avg.driver.runtime.session.Engine` the jobs run on.
        last_plan: ``(aggregation, shards)`` of the latest round of the Spark SQL round; ``None`` for the others.
    """

    name = ""
    last_plan: Optional[Tuple[str, int]] = None

    def __init__(self, engine, depth: int = 2, optimizer_sums: bool = True, compression: Optional[str] = None,
                 feedback: Tuple[bool, ...] = (), moments: Tuple[int, ...] = ()) -> None:
        self.engine = engine
        self.depth = depth  # of the classic evaluation's (and SparkTransport's) treeAggregate
        self.optimizer_sums = optimizer_sums  # whether the workers return optimizer sums (optimizer_state)
        self.compression = compression  # update_compression: workers send compressed deltas
        self.feedback = feedback  # per compressed segment, whether workers keep its residual
        self.moments = moments  # the optimizer's first moments (delta_sums.first_moments)
        self._spec_bc = None

    def layout(self, weights: Sequence[np.ndarray], optimizer: Optional[Sequence[np.ndarray]]):
        """The layout of the workers' sums of a round on this state: a ``FlatLayout``, or a ``DeltaLayout`` when compressed."""
        flat = exchange.FlatLayout.of(weights, optimizer if self.optimizer_sums else None)
        return DeltaLayout(flat, self.compression, self.feedback, self.moments) if self.compression else flat

    def ship_spec(self, spec):
        """The handle tasks carry to build the model's replica: a broadcast (classic) or a stored file."""
        self._spec_bc = self.engine.broadcast(spec)
        return self._spec_bc

    def publish(self, name: str, weights: Sequence[np.ndarray], optimizer: Optional[Sequence[np.ndarray]]) -> "Published":
        """Publishes a state under ``name`` for one job's tasks (a round's or a chunk's)."""
        raise NotImplementedError

    def run(self, make_task: Callable[[Any, Any], Any], entry, workers: Sequence[int], what: str,
            published: "Published", places: Optional[Sequence[Optional[str]]] = None) -> PartialResult:
        """Runs one job whose tasks train the contiguous worker ids ``workers`` on ``published`` and sums their results.

        The transport decides where the workers deliver their sums (the
        result sink, :mod:`sparkdl_avg.shared.wire.exchange`); ``make_task(state, sink)``
        gives the job's :class:`~sparkdl_avg.executor.worker.RoundTask` with it.
        ``entry`` is the executor body, ``worker.run_round_partition`` (looked
        up by the caller each round: the tests' fault-injection seam).
        ``places``: the host each worker's task should run on (classic
        sessions; :meth:`~sparkdl_avg.driver.runtime.session.Engine.located`), ``None``: anywhere.

        Raises:
            DataError, WorkerError: decoded from the failed job (:mod:`sparkdl_avg.shared.errors.remote_errors`).
        """
        raise NotImplementedError

    def run_job(self, name: str, weights, optimizer, make_task: Callable[[Any, Any], Any], entry,
                workers: Sequence[int], what: str, rounds_labels: Optional[Callable[[], Any]] = None,
                places: Optional[Sequence[Optional[str]]] = None) -> Tuple[PartialResult, float]:
        """A round's or a chunk's job: publishes its state under ``name``, runs it (:meth:`run`), sums it; thread-safe.

        What was published is released before this returns, however the job ends.
        ``rounds_labels``: given by a caller that runs rounds one after
        another on all its workers (not chunks from several threads), a
        context manager factory that labels a Spark job started in another
        thread (:meth:`~sparkdl_avg.driver.runtime.session.Engine.carried_labels`);
        a transport that keeps one job for such rounds
        (:class:`SqlTransport`'s standing job) labels that job with it.
        The others ignore it. ``places``: see :meth:`run`.

        Returns:
            The summed result and the wall-clock time (``time.time``) at which the state was published.
        """
        published = self.publish(name, weights, optimizer)
        try:
            at = time.time()
            return self.run(make_task, entry, workers, what, published, places), at
        finally:
            published.release()

    def evaluate(self, spec, fingerprint: str, staged, parts: int, batch_size: int, state) -> PartialResult:
        """Evaluates ``state`` (``(weights, optimizer variables)``) on ``staged`` data in ``parts`` tasks."""
        bc = self.engine.broadcast(state)
        task = worker_mod.EvalTask(spec, fingerprint, exchange.BroadcastState(bc), staged, parts, batch_size)
        try:
            return run_job(
                lambda: self.engine.sc.parallelize(range(parts), parts)
                .mapPartitions(partial(worker_mod.run_eval_partition, task))
                .treeAggregate(None, merge, merge, self.depth),
                "Evaluation",
            )
        finally:
            bc.unpersist()

    def close(self) -> None:
        """Releases everything left at the end of the fit, however it ends."""
        if self._spec_bc is not None:
            self._spec_bc.unpersist()
            self._spec_bc = None


@dataclass(frozen=True)
class Published:
    """What :meth:`StateTransport.publish` made for one job: what its tasks carry and how to take it back.

    Attributes:
        state: The state source the tasks load (:mod:`sparkdl_avg.shared.wire.exchange`).
        release: Deletes the broadcast or the files.
        directory: The job's directory under the exchange directory (file-based transports).
        layout: The sums' :class:`~sparkdl_avg.shared.wire.exchange.FlatLayout`, or under
            ``update_compression`` their :class:`~sparkdl_avg.shared.wire.delta_sums.DeltaLayout`.
    """

    state: Any
    release: Callable[[], None]
    directory: Optional[str] = None
    layout: Any = None


def _rdd_job(engine, task, entry, workers: Sequence[int], places: Optional[Sequence[Optional[str]]] = None):
    if places is not None and any(places):
        ids = engine.located(list(workers), places)
    else:
        ids = engine.sc.parallelize(list(workers), len(workers))
    return ids.mapPartitions(partial(entry, task))


class SparkTransport(StateTransport):
    """State as a Spark broadcast; sums as task results, summed by ``treeAggregate(depth)``."""

    name = "spark"

    def publish(self, name, weights, optimizer):
        broadcast = self.engine.broadcast((weights, optimizer))
        return Published(exchange.BroadcastState(broadcast), broadcast.unpersist, layout=self.layout(weights, optimizer))

    def run(self, make_task, entry, workers, what, published, places=None):
        layout = published.layout
        # sums (or compressed deltas) as task results
        task = make_task(published.state, exchange.ReturnSums(layout if layout.compressed else None))
        results = _rdd_job(self.engine, task, entry, workers, places)
        total = run_job(lambda: results.treeAggregate(None, merge, merge, self.depth), what)
        if layout.compressed:  # the tree kept every worker's delta; summed here, in worker order
            t0, c0 = time.perf_counter(), time.process_time()
            total.received_bytes = sum(len(data) for _, data in total.deltas or [])
            sum_deltas(layout, total)
            total.driver_sum_s, total.driver_sum_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        return total


class FileTransport(StateTransport):
    """State and sums as files under ``directory``, one subdirectory per round.

    The driver collects the workers' small :class:`~sparkdl_avg.shared.wire.exchange.StoredResult`\\ s
    (no tree: the arrays never pass through Spark) and adds their files in
    the tasks' order. Deleting a round's directory also takes the files of
    failed or speculative attempts; :meth:`close` deletes the fit's.
    """

    name = "files"

    def __init__(self, engine, directory: str, depth: int = 2, **options) -> None:
        super().__init__(engine, depth, **options)
        self.directory = directory

    def publish(self, name, weights, optimizer):
        directory = join(self.directory, name)
        state = exchange.store_state(directory, "state", weights, optimizer)
        return Published(state, partial(_remove_quietly, directory), directory, self.layout(weights, optimizer))

    def sink(self, published: "Published") -> exchange.StoreSums:
        """Where the workers of the job on ``published`` deliver: files of their own beside its state."""
        layout = published.layout
        return exchange.StoreSums(published.directory, layout if layout.compressed else None)

    def run(self, make_task, entry, workers, what, published, places=None):
        results = _rdd_job(self.engine, make_task(published.state, self.sink(published)), entry, workers, places)
        return self.add_delivered(run_job(results.collect, what), what, published.directory, published.layout)

    def add_delivered(self, delivered: List[exchange.StoredResult], what: str, directory: str,
                      layout=None) -> PartialResult:
        """The sum of what the workers' :class:`~sparkdl_avg.shared.wire.exchange.StoreSums` delivered; deletes their files.

        ``layout``: the round's, when its workers sent compressed deltas (a ``DeltaLayout``).
        """
        t0, c0 = time.perf_counter(), time.process_time()
        total = functools.reduce(merge, [d.result for d in delivered], None)
        stored = [d.sums for d in delivered if d.sums is not None]
        if layout is not None and layout.compressed:
            try:
                total.deltas = [(d.result.workers[0].worker, _read_and_remove(d.sums)) for d in delivered
                                if d.sums is not None]
            except (OSError, PathError) as exc:
                raise _unreadable(what, directory, exc, "state_transport='files'", "state_transport='sql'") from exc
            total.received_bytes = sum(len(data) for _, data in total.deltas)
            sum_deltas(layout, total)
            total.driver_sum_s, total.driver_sum_cpu_s = time.perf_counter() - t0, time.process_time() - c0
            return total
        try:
            weight_sums, optimizer_sums = _add_stored(stored)
        except (OSError, PathError) as exc:  # PathError: the staging URI cannot be opened from here
            raise _unreadable(what, directory, exc, "state_transport='files'", "state_transport='sql'") from exc
        total.weight_sums, total.optimizer_sums = weight_sums, optimizer_sums
        total.received_bytes = sum(_nbytes(d.sums) for d in delivered if d.sums is not None)
        total.driver_sum_s, total.driver_sum_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        return total

    def close(self) -> None:
        super().close()
        # Files of rounds cut short by an error, and of task attempts that outlived their round.
        _remove_quietly(self.directory)


class SqlTransport(StateTransport):
    """The round as a DataFrame job; works on classic sessions and under Spark Connect.

    The model (once per fit) and each round's state go out as files under
    ``directory`` (every executor reads the staging directory: it holds the
    staged data). Each worker's sums come back as raw bytes in Arrow rows
    (:data:`~sparkdl_avg.shared.wire.exchange.ROUND_SCHEMA`), summed as ``aggregation``
    says:

    * ``"driver"``: every worker's whole sums reach the driver, which adds
      them in worker order (``N`` models' bytes into the driver);
    * ``"shuffle"``: each worker cuts its sums into ``shards`` slices; a
      ``repartition`` by slice sends slice ``j`` of every worker to reducer
      task ``j`` (:func:`~sparkdl_avg.shared.wire.exchange.reduce_shuffled`) through
      Spark's shuffle, and the driver receives the ``S`` summed slices: one
      model's bytes;
    * ``"files"``: each worker writes its sums to a file under
      ``directory`` and the driver reads and adds them itself, as
      :class:`FileTransport` does (``N`` models' bytes, through the page
      cache when driver and executors share a host: what ``"auto"`` takes
      under Spark Connect with a local server and staging directory);
    * ``"storage"``: each worker writes its sums to a file under
      ``directory`` and only the file's name crosses the shuffle; reducer
      task ``j`` reads slice ``j`` of every file by range and returns the
      summed slices: one model's bytes into the driver, none through the
      shuffle, in the same job.

    Every path adds the same numbers in the same order (worker 0, 1, ...),
    so all give bitwise the same sums as each other, as ``"files"`` and as
    ``"spark"`` at ``aggregation_depth=1`` (deeper trees add in another order).

    Args:
        engine: The session's :class:`~sparkdl_avg.driver.runtime.session.Engine`.
        directory: The fit's exchange directory under the staging root.
        aggregation: One of :data:`sparkdl_avg.driver.config.options.AGGREGATIONS` (``"auto"``: see :func:`plan_aggregation`).
        shards: Slices ``S`` for ``"shuffle"``/``"storage"``; ``None``: :func:`plan_aggregation`'s.
        one_host_files: ``"auto"`` sums the workers' files on the driver (Connect, one host, local staging).
        network_rate: The driver's link in bytes/s when executors run on other hosts (``"auto"``'s
            choice, :func:`plan_aggregation`); ``None`` when they share its host.
        optimizer_sums: Whether the workers return optimizer sums (``optimizer_state="average"``):
            the sums' layout.
        standing: Run consecutive rounds in one standing job (see below); only where the driver
            and the executors share a host and the directory is local.

    **One job for the rounds.** Under Spark Connect the server analyses,
    optimises and plans every job it is sent, and its Python tasks start and
    end through Spark SQL's Python runner: most of what a Connect round costs
    beyond a classic one (docs/benchmarks.md, "Spark Connect round overhead,
    one job for the rounds"). With ``standing``, rounds run through
    :meth:`run_job` with ``rounds_labels`` (a fit's synchronous rounds) go
    to one job whose ``N`` tasks train round after round: the driver
    announces each round (its state and task) in a file and the tasks answer
    in files (:mod:`sparkdl_avg.shared.wire.standing`,
    :func:`~sparkdl_avg.executor.worker.run_standing_rounds`). The job is
    planned once, its tasks start once, and a round costs what its files
    cost. It is stopped (its tasks end) when a round comes without
    ``rounds_labels`` or for other workers, when no round comes within
    :data:`STANDING_IDLE_S` of the last one's end (a callback's or an
    evaluation's job then finds the executor slots free), at :meth:`evaluate`
    and at :meth:`close`; the next round starts a new one. Only
    ``aggregation`` ``"files"`` (what ``"auto"`` takes there) and at most as
    many workers as the cluster has task slots run this way: every task
    must hold a slot at once. A task that fails is retried by Spark as
    usual and joins at the round in progress; a failed job raises what
    the round's own job would have.
    """

    name = "sql"

    def __init__(self, engine, directory: str, aggregation: str = "auto", shards: Optional[int] = None,
                 one_host_files: bool = False, network_rate: Optional[float] = None, standing: bool = False,
                 **options) -> None:
        super().__init__(engine, **options)
        self.directory = directory
        self.aggregation = aggregation
        self.shards = shards
        self.one_host_files = one_host_files
        self.network_rate = network_rate  # bytes/s of the driver's link on hosts of their own; None: one host
        self.standing = standing
        self._spec: Optional[exchange.StoredSpec] = None
        self.last_plan: Optional[Tuple[str, int]] = None  # (aggregation, shards) of the latest round
        self._standing: Optional[_StandingJob] = None  # the standing job, while it runs
        self._lock = threading.Lock()  # guards _standing against its idle timer
        self._jobs = 0  # standing jobs started: their directories' names
        make_dir(directory)

    def ship_spec(self, spec):
        if self._spec is None or self._spec.fingerprint != spec.fingerprint:
            self._spec = exchange.store_spec(self.directory, spec)
        return self._spec

    def publish(self, name, weights, optimizer):
        directory = join(self.directory, name)
        state = exchange.store_state(directory, "state", weights, optimizer)
        return Published(state, partial(_remove_quietly, directory), directory, self.layout(weights, optimizer))

    def run_job(self, name, weights, optimizer, make_task, entry, workers, what, rounds_labels=None, places=None):
        job = self._standing_job(workers, weights, optimizer, rounds_labels)
        if job is None:  # (a standing job runs where the driver does: one host, nothing to place)
            return super().run_job(name, weights, optimizer, make_task, entry, workers, what, places=places)
        published = None
        try:
            published = self.publish(name, weights, optimizer)
            self.last_plan = ("files", 1)
            task = make_task(published.state, self._sink("files", 1, published.directory, published.layout))
            seq = job.announce(entry, task)
            at = time.time()
            batches = run_job(partial(job.answers, seq), what)
            if batches is None:  # the job ended without an error and without this round: a job of its own
                logger.debug("%s: the standing job ended before the round; running it as a job of its own", what)
                return self.run(make_task, entry, workers, what, published), at
            import pyarrow as pa

            table = pa.Table.from_batches(batches, exchange.round_arrow_schema())
            return self._collect(table, what, published.directory, published.layout, "files", 1), at
        except BaseException:
            self._stop_standing()  # failed (the error is the round's) or interrupted: no job of the fit left running
            raise
        finally:
            if published is not None:
                published.release()
            self._stop_when_idle()

    def _standing_job(self, workers: Sequence[int], weights, optimizer,
                      labels: Optional[Callable[[], Any]]) -> Optional["_StandingJob"]:
        """The standing job to run a round on ``workers`` in (started if need be), or ``None``: a job of its own.

        A job that is started stays reachable (``_standing``) until it is stopped: :meth:`close` stops it whatever
        interrupts the fit.
        """
        usable = (labels is not None and self.standing
                  and self.plan(len(workers), self.layout(weights, optimizer).nbytes) == ("files", 1)
                  and len(workers) <= self.engine.default_parallelism)
        with self._lock:
            job = self._standing
            if job is not None:
                job.keep()
                if usable and job.workers == list(workers) and not job.ended():
                    job.busy = True
                    return job
                self._standing = None
        if job is not None:
            job.stop()
        if not usable:
            return None
        self._jobs += 1
        job = _StandingJob(self.engine, join(self.directory, f"standing-{self._jobs}"), workers, labels)
        job.busy = True
        with self._lock:
            self._standing = job
        return job

    def _stop_when_idle(self) -> None:
        """Stops the standing job if no round comes within :data:`STANDING_IDLE_S` from now."""
        with self._lock:
            job = self._standing
            if job is not None:
                job.busy = False
                job.stop_after(STANDING_IDLE_S, self._expire)

    def _expire(self, job: "_StandingJob") -> None:
        with self._lock:
            if self._standing is not job or job.busy:  # a round took it meanwhile
                return
            self._standing = None
        logger.debug("stopping the standing round job: no round within %.1f s", STANDING_IDLE_S)
        job.stop()

    def _stop_standing(self, wait_s: float = 0.0) -> None:
        """Stops the standing job, if any; waits up to ``wait_s`` seconds for it to end."""
        with self._lock:
            job, self._standing = self._standing, None
        if job is not None:
            job.keep()
            job.stop(wait_s)

    def plan(self, num_workers: int, nbytes: int) -> Tuple[str, int]:
        """``(aggregation, shards)`` for ``num_workers`` workers and sums of ``nbytes`` bytes each."""
        if self.aggregation == "auto" and self.one_host_files:
            return "files", 1
        return plan_aggregation(self.aggregation, self.shards, num_workers, nbytes, self.network_rate)

    def run(self, make_task, entry, workers, what, published, places=None):
        layout = published.layout
        how, shards = self.plan(len(workers), layout.nbytes)
        self.last_plan = (how, shards)
        rows = self._rows(make_task(published.state, self._sink(how, shards, published.directory, layout)), entry,
                          workers, layout, how, shards, places)
        return self._collect(run_job(rows.toArrow, what), what, published.directory, layout, how, shards)

    @staticmethod
    def _sink(how: str, shards: int, directory: str, layout):
        """Where the workers of a job aggregated ``how`` deliver their sums."""
        if how in ("storage", "files"):
            return exchange.StoreFlat(directory, layout, shards)
        return exchange.ArrowSums(layout, shards if how == "shuffle" else 1)

    def _rows(self, task, entry, workers: Sequence[int], layout, how: str, shards: int, places=None):
        """The lazy DataFrame of a round's job: its tasks' rows, summed by reducers when sharded."""
        rows = self.engine.run_tasks(
            len(workers), partial(worker_mod.run_round_batches, task, entry=entry), exchange.ROUND_SCHEMA,
            start=workers[0], places=places,
        )
        if how in ("shuffle", "storage"):
            from pyspark.sql import functions as F

            # Shard j's rows to reducer task j; the workers' results (shard -1) to reducer 0.
            keys = shard_keys(shards)
            slot = F.when(F.col("shard") < 0, 0).otherwise(F.col("shard"))
            key = F.element_at(F.array(*[F.lit(k) for k in keys]), slot + 1)
            rows = rows.repartition(shards, key).mapInArrow(
                partial(exchange.reduce_shuffled, layout, shards), struct_type(exchange.ROUND_SCHEMA)
            )
        return rows

    def _collect(self, table, what: str, directory: str, layout, how: str, shards: int) -> PartialResult:
        """The round's sums from its job's Arrow rows (and, for ``"files"``, the workers' files)."""
        t0, c0 = time.perf_counter(), time.process_time()
        results, pieces, reduce_s = _read_rows(table)
        received = table.nbytes
        if how == "files":  # the workers' files, read here in worker order (one host: the page cache)
            acc = None
            try:
                for _, (uri, offsets) in sorted(pieces.items()):
                    if layout.compressed:  # one byte array: the worker's whole delta
                        data = exchange.read_range(uri, offsets[0], offsets[-1] - offsets[0])
                        acc = layout.add(acc, data, 0, 1)
                        received += len(data)
                        continue
                    n32, n64 = layout.sizes
                    off32, off64 = offsets
                    stored = exchange.StoredArrays(uri, ((np.dtype(np.float32), (n32,), off32),
                                                         (np.dtype(np.float64), (n64,), off64)))
                    acc = exchange.add_slices(acc, tuple(exchange.load(stored)))
                    received += layout.nbytes
            except (OSError, PathError) as exc:
                raise _unreadable(what, directory, exc, "aggregation='files'", "aggregation='storage'") from exc
            pieces = {(0, -1): acc} if acc is not None else {}
        total = _assemble(results, pieces, layout, how, shards)
        total.received_bytes, total.driver_sum_s = received, time.perf_counter() - t0
        total.reduce_s = reduce_s
        total.driver_sum_cpu_s = time.process_time() - c0
        return total

    def evaluate(self, spec, fingerprint, staged, parts, batch_size, state):
        self._stop_standing()  # its waiting tasks would hold the slots this job needs
        directory = join(self.directory, "evaluate")
        stored = exchange.store_state(directory, "state", *state)
        task = worker_mod.EvalTask(spec, fingerprint, stored, staged, parts, batch_size)
        try:
            table = run_job(
                lambda: self.engine.run_tasks(parts, partial(worker_mod.run_eval_batches, task), "meta string").toArrow(),
                "Evaluation",
            )
        finally:
            _remove_quietly(directory)
        parts_results = sorted((exchange.decode_meta(m) for m in table.column("meta").to_pylist()),
                               key=lambda r: r.workers[0].worker)
        return functools.reduce(merge, parts_results, None)

    def close(self) -> None:
        self._stop_standing(wait_s=STANDING_CLOSE_S)  # no job of the fit left running
        _remove_quietly(self.directory)


class _StandingJob:
    """One standing round job of a :class:`SqlTransport` (see its doc): its directory, tasks and thread.

    The job is submitted (in a thread of its own, where ``toArrow`` waits
    for it to end) at its first :meth:`announce`.
    """

    def __init__(self, engine, directory: str, workers: Sequence[int], labels: Callable[[], Any]) -> None:
        self.engine = engine
        self.directory = directory
        self.path = resolve(directory)[1]  # local
        self.workers = list(workers)
        self.labels = labels
        self.seq = -1  # the latest round announced
        self.future: concurrent.futures.Future = concurrent.futures.Future()  # the job's end (_run)
        self.thread: Optional[threading.Thread] = None
        self.timer: Optional[threading.Timer] = None
        self.busy = False  # a round runs in it (guarded by the transport's lock)
        self.stopped = False
        make_dir(directory)

    def announce(self, entry, task) -> int:
        """Has the tasks train ``task`` with ``entry`` (the job starts at the first); returns the round's number."""
        word = standing.go(entry, task)
        self.seq += 1
        standing.announce(self.path, self.seq, word)
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="sparkdl_avg-standing-job", daemon=True)
            self.thread.start()
        return self.seq

    def _run(self) -> None:
        body = partial(worker_mod.run_standing_rounds, self.path, STANDING_DEADLINE_S)
        try:
            with self.labels():
                self.engine.run_tasks(len(self.workers), body, exchange.ROUND_SCHEMA, start=self.workers[0]).toArrow()
        except BaseException as exc:  # noqa: BLE001 - the round that waits for it raises it
            self.future.set_exception(exc)
        else:
            self.future.set_result(None)

    def answers(self, seq: int):
        """The workers' rows of round ``seq`` once all have answered; ``None`` if the job ended without them.

        Raises what the job raised (a worker's error, an interrupt).
        """
        delay = 0.0002
        while True:
            batches = standing.collect(self.path, seq, self.workers)
            if batches is not None:
                return batches
            if self.future.done():
                self.future.result()  # the job's error
                return standing.collect(self.path, seq, self.workers)  # answered just before it ended, or not
            time.sleep(delay)
            delay = min(2 * delay, 0.002)  # a stat per worker costs microseconds; this is the round's latency

    def ended(self) -> bool:
        """Whether the job has ended (an error, or its tasks' deadline)."""
        return self.future.done()

    def stop_after(self, seconds: float, expire: Callable[["_StandingJob"], None]) -> None:
        """Calls ``expire(self)`` in ``seconds`` unless :meth:`keep` comes first."""
        self.timer = threading.Timer(seconds, expire, (self,))
        self.timer.daemon = True
        self.timer.start()

    def keep(self) -> None:
        """Cancels :meth:`stop_after`."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def stop(self, wait_s: float = 0.0) -> None:
        """Tells the tasks to end; the directory goes when the job has ended. Waits up to ``wait_s`` seconds for it."""
        if self.stopped:
            return
        self.stopped = True
        if self.thread is None or self.thread.ident is None:  # never submitted
            _remove_quietly(self.directory)
            return
        try:
            standing.stop(self.path)
        except OSError as exc:  # its tasks then end at their deadline
            logger.warning("Could not stop the standing round job under %s: %s", self.directory, exc)
        self.future.add_done_callback(lambda _: _remove_quietly(self.directory))
        if wait_s > 0:
            try:
                self.future.exception(timeout=wait_s)
            except concurrent.futures.TimeoutError:
                pass


def _unreadable(what: str, directory: str, exc: BaseException, option: str, other: str) -> WorkerError:
    """The error of a driver that cannot read the workers' result files under ``directory``."""
    return WorkerError(
        f"Could not read the workers' results of {what[0].lower()}{what[1:]} under {directory!r}: {exc}. "
        f"With {option} the driver must read what executors write under staging_dir; use a "
        f"filesystem both see, or {other}."
    )


def _read_and_remove(stored: exchange.StoredArrays) -> bytes:
    """The bytes of a worker's compressed delta file (:class:`~sparkdl_avg.shared.wire.exchange.StoreSums`); deletes it."""
    try:
        return exchange.load(stored)[0].tobytes()
    finally:
        exchange.remove(stored)


def _read_rows(table):
    """``(worker results by worker id, pieces, the slowest reducer's seconds)`` of a round's Arrow rows.

    ``pieces``: ``{(shard, worker): data}`` (``worker`` -1: summed), or for
    the workers' file rows ``{worker: (uri, offsets)}``.
    """
    import json

    results, pieces, reduce_s = {}, {}, 0.0
    columns = table.to_pydict()
    for shard, worker, meta, data, uri, offsets in zip(
        columns["shard"], columns["worker"], columns["meta"], columns["data"], columns["uri"], columns["offsets"]
    ):
        if meta is not None and shard < 0:
            results[worker] = exchange.decode_meta(meta)
            continue
        if meta is not None:  # a reducer's summed shard
            reduce_s = max(reduce_s, json.loads(meta)["sum_s"])
        if data is not None:
            pieces[(shard, worker)] = data
        elif uri is not None:
            pieces[worker] = (uri, tuple(offsets))
    return results, pieces, reduce_s


def _assemble(results, pieces, layout, how: str, shards: int) -> PartialResult:
    """The round's :class:`PartialResult`: the workers' results merged in worker order, and the sums."""
    total = functools.reduce(merge, [results[w] for w in sorted(results)], None)
    if layout.compressed:
        total.delta_sums = True
    if not pieces:
        return total
    if layout.compressed:
        if how == "files":
            sums = [pieces[(0, -1)]]
        elif how == "driver":
            acc = None
            for (_, _), data in sorted(pieces.items(), key=lambda item: item[0][1]):  # worker order
                acc = layout.add(acc, data, 0, 1)
            sums = [acc]
        else:
            by_shard = {shard: data for (shard, _), data in pieces.items()}
            sums = [layout.parse_summed(by_shard[j], j, shards) for j in range(shards)]
        total.weight_sums, total.optimizer_sums = layout.delta_sums(sums)
        return total
    if how == "files":
        total.weight_sums, total.optimizer_sums = layout.unflatten(*pieces[(0, -1)])
    elif how == "driver":
        acc = None
        for (_, _), data in sorted(pieces.items(), key=lambda item: item[0][1]):  # worker order
            acc = exchange.add_slices(acc, layout.parse_shard(data, 0, 1))
        total.weight_sums, total.optimizer_sums = layout.unflatten(*acc)
    else:
        by_shard = {shard: data for (shard, _), data in pieces.items()}
        total.weight_sums, total.optimizer_sums = layout.join(
            [layout.parse_shard(by_shard[j], j, shards) for j in range(shards)]
        )
    return total


#: At most this many bytes of sums per round in all (workers × one model's sums) go straight to the driver
#: under ``aggregation="auto"`` when every executor shares the driver's host; above, reducers sum them from the
#: staging storage: the largest size at which the driver path measured at least as fast on one host
#: (docs/benchmarks.md, "Aggregation paths").
DRIVER_SUM_BYTES = 48 << 20

#: On a classic session whose executors share the driver's host but not its files (a local master with a URI
#: staging directory), ``state_transport="auto"`` keeps Spark's broadcast + ``treeAggregate`` for rounds of at
#: most this many bytes of sums in all, where it measured faster than the Spark SQL round on one host
#: (docs/benchmarks.md, "Aggregation paths").
SPARK_TREE_BYTES = 64 << 20

#: The driver's link rate ``auto`` assumes on a multi-host cluster when ``network_rate`` is not given: 1 Gbit/s.
DEFAULT_NETWORK_RATE = "1gbit"

#: Seconds a sharded round (a second stage of reducer tasks after a shuffle) costs beyond a driver-bound one
#: whatever the model's size: measured on the shaped-network cluster at 10^5 parameters, whose bytes take almost
#: no time on the wire (docs/benchmarks.md, "On a shaped network").
SHARDED_STAGE_S = 0.3


#: Whether Spark Connect rounds run in one standing job where they can (:class:`SqlTransport`, ``standing``): with a
#: local server and staging directory. ``False`` gives every round a job of its own (for comparisons).
STANDING = True

#: Seconds the standing round job (:class:`SqlTransport`) waits, once a round has ended, for the next one. Past
#: that it is stopped and its tasks free their executor slots (a callback's or an evaluation's job may need them);
#: the next round starts a new one, which costs one job's planning (tens of milliseconds) against the second the
#: driver spent between the two rounds.
STANDING_IDLE_S = 1.0

#: Seconds a task of the standing round job waits for the driver's next word before it ends (a driver that has gone).
STANDING_DEADLINE_S = 300.0

#: Seconds :meth:`SqlTransport.close` waits for the stopped standing job to end (its tasks see the stop at once).
STANDING_CLOSE_S = 30.0


def driver_bound_pays(num_workers: int, nbytes: int, rate_bytes_s: float) -> bool:
    """Whether bringing every worker's sums through the driver's link beats sharding them, on hosts of their own.

    A driver-bound round (Spark's tree at depth 1, the SQL round's ``"driver"``)
    moves ``N × S`` bytes in through the driver's link; a sharded one
    (``"shuffle"``) about ``S`` in (and ``S`` through every other link), plus
    a second stage (:data:`SHARDED_STAGE_S`). So the driver path pays while
    ``(N - 1) · S / rate <= SHARDED_STAGE_S`` (at 1 Gbit/s, which of the
    benchmarked sizes pass: docs/benchmarks.md, "On a shaped network") and the
    ``N`` sums together stay within :data:`SPARK_TREE_BYTES`, which the driver
    holds at once (however fast the link: ``spark.driver.maxResultSize`` and its memory).
    """
    return (num_workers - 1) * nbytes / rate_bytes_s <= SHARDED_STAGE_S and num_workers * nbytes <= SPARK_TREE_BYTES


def plan_aggregation(aggregation: str, shards: Optional[int], num_workers: int, nbytes: int,
                     network_rate: Optional[float] = None) -> Tuple[str, int]:
    """``(aggregation, shards)`` the Spark SQL round uses (see :class:`SqlTransport`).

    ``"auto"`` on hosts of their own (``network_rate``: the driver's link,
    bytes/s) sums on the driver while :func:`driver_bound_pays`, else through
    the shuffle, which measured faster than the storage reducers on the
    shaped-network cluster at every size (the store's HTTP requests, its one
    link and its CPU; docs/benchmarks.md, "On a shaped network"). With
    ``network_rate=None`` (every executor on the driver's host) it sums on
    the driver when all the workers' sums together are at most
    :data:`DRIVER_SUM_BYTES`, else through the staging storage, which
    measured faster than the shuffle there. ``shards=None`` gives one shard
    per worker, each at least 256 kB, and enough shards that none exceeds 64 MB.
    """
    how = aggregation
    if how == "auto":
        if network_rate is not None:
            how = "driver" if driver_bound_pays(num_workers, nbytes, network_rate) else "shuffle"
        else:
            how = "driver" if num_workers * nbytes <= DRIVER_SUM_BYTES else "storage"
    if how in ("driver", "files"):
        return how, 1
    if shards is None:
        # At most 64 MB per slice: one Arrow binary value each, well under Spark Connect's 128 MB messages.
        shards = max(1, min(num_workers, nbytes // (256 << 10)), -(-nbytes // (64 << 20)))
    return how, int(shards)


def _spark_int_hash(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of an ``int`` (Murmur3 x86_32, seed 42): what ``repartition(n, col)`` partitions by."""
    mask = 0xFFFFFFFF

    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & mask

    k1 = (value & mask) * 0xCC9E2D51 & mask
    k1 = rotl(k1, 15) * 0x1B873593 & mask
    h1 = seed ^ k1
    h1 = (rotl(h1, 13) * 5 + 0xE6546B64) & mask
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & mask
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & mask
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= (1 << 31) else h1


@functools.lru_cache(maxsize=64)
def shard_keys(shards: int) -> Tuple[int, ...]:
    """Keys ``k_j`` with ``pmod(hash(k_j), shards) == j``: repartitioning by them gives shard ``j`` partition ``j``.

    Without them, hash partitioning of the shard ids 0..S-1 would put
    several shards in one reducer and leave others idle.
    """
    keys: List[Optional[int]] = [None] * shards
    left, candidate = shards, 0
    while left:
        j = _spark_int_hash(candidate) % shards
        if keys[j] is None:
            keys[j] = candidate
            left -= 1
        candidate += 1
    return tuple(keys)


def _nbytes(stored: exchange.StoredState) -> int:
    return sum(int(np.prod(shape)) * dtype.itemsize for dtype, shape, _ in stored.arrays.layout)


def _add_stored(stored: Sequence[exchange.StoredState]):
    """The element-wise sums of the stored states' weights and optimizer variables, in order; deletes their files."""
    weight_sums = optimizer_sums = None
    try:
        for item in stored:
            weights, opt = exchange.load_state(item)
            weight_sums = _accumulate(weight_sums, weights)
            if opt is not None:
                optimizer_sums = _accumulate(optimizer_sums, opt)
            del weights, opt  # drop the views so the memory map closes
    finally:
        for item in stored:
            exchange.remove(item.arrays)
    return weight_sums, optimizer_sums


def _accumulate(acc: Optional[List[np.ndarray]], arrays: List[np.ndarray]) -> List[np.ndarray]:
    """Adds ``arrays`` (read-only views) into ``acc``; copies them when ``acc`` is ``None``."""
    if acc is None:
        return [np.array(a) for a in arrays]
    for x, y in zip(acc, arrays):
        np.add(x, y, out=x)
    return acc


def _remove_quietly(uri: str) -> None:
    """Deletes a tree of exchange files; a failure is logged, not raised (it must not hide the fit's own error)."""
    try:
        remove_tree(uri)
    except OSError as exc:
        logger.warning("Could not delete %s: %s", uri, exc)


def choose(mode: str, engine, staging_root: str, fit_name: str, depth: int, aggregation: str = "auto",
           shards: Optional[int] = None, num_workers: Optional[int] = None, model_bytes: Optional[int] = None,
           network_rate: Any = None, optimizer_sums: bool = True, compression: Optional[str] = None,
           feedback: Tuple[bool, ...] = (), moments: Tuple[int, ...] = (), standing: bool = True) -> StateTransport:
    """The transport of one fit for ``state_transport=mode`` (``"auto"``, ``"spark"``, ``"files"`` or ``"sql"``).

    ``"auto"``: under Spark Connect the Spark SQL round (the only one there;
    summing the workers' files on the client when the server's executors
    share its host and the staging directory is local, see :class:`SqlTransport`);
    on a classic session files when every executor runs on the driver's host
    (``local[N]``, ``local-cluster``) and the staging directory is local.
    On hosts of their own (any other master) Spark's tree while
    :func:`driver_bound_pays` for ``num_workers`` sums of ``model_bytes``
    each through a link of ``network_rate`` (default
    :data:`DEFAULT_NETWORK_RATE`), else the Spark SQL round, which then
    shards through the shuffle (:func:`plan_aggregation`); with a local
    master and a URI staging directory, the tree up to
    :data:`SPARK_TREE_BYTES` of sums in all. ``fit_name`` names the fit's
    directory under ``staging_root``; ``optimizer_sums``: whether the
    workers return optimizer sums (:class:`SqlTransport`);
    ``compression``, ``feedback``, ``moments``: ``update_compression``,
    which compressed segments' residuals its workers keep, and the
    optimizer's first moments (:class:`~sparkdl_avg.shared.wire.delta_sums.DeltaLayout`;
    ``model_bytes`` is then a compressed delta's size); ``standing=False``
    keeps Spark Connect's rounds in a job each (elastic rounds that probe
    the slots with a job between rounds).

    Raises:
        ConfigurationError: ``"spark"`` or ``"files"`` under Spark Connect; a bad ``network_rate``.
    """
    directory = join(staging_root, fit_name)
    options = dict(optimizer_sums=optimizer_sums, compression=compression, feedback=feedback, moments=moments)
    # By the URI's scheme: resolving an hdfs:// or s3:// root would connect to it.
    local_fs = "://" not in staging_root or staging_root.startswith("file://")
    one_host = engine.one_host
    rate = None if one_host else parse_rate(network_rate if network_rate is not None else DEFAULT_NETWORK_RATE)
    if engine.connect:
        if mode in ("spark", "files"):
            raise ConfigurationError(
                f"The 'state_transport' parameter must be 'auto' or 'sql' under Spark Connect (it has no "
                f"broadcasts or RDDs). Got {mode!r} instead."
            )
        # One standing job where its tasks can wait on local files that the client writes (one host, local staging).
        return SqlTransport(engine, directory, aggregation, shards, one_host_files=local_fs and one_host,
                            network_rate=rate, standing=standing and STANDING and local_fs and one_host, **options)
    if mode == "spark":
        return SparkTransport(engine, depth, **options)
    if mode == "sql":
        return SqlTransport(engine, directory, aggregation, shards, network_rate=rate, **options)
    if mode == "auto" and not (local_fs and one_host):
        if num_workers is not None and model_bytes is not None:
            tree = (driver_bound_pays(num_workers, model_bytes, rate) if rate is not None
                    else num_workers * model_bytes <= SPARK_TREE_BYTES)
            if tree:
                return SparkTransport(engine, depth, **options)
        return SqlTransport(engine, directory, aggregation, shards, network_rate=rate, **options)
    if local_fs and not one_host:
        logger.warning(
            "state_transport='files' with the local staging directory %s while the master is %s: "
            "the driver and every executor must read each other's files there (e.g. one host, or NFS).",
            staging_root,
            engine.master,
        )
    return FileTransport(engine, directory, depth, **options)
