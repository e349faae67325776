"""``state_transport="sql"``: the round as a DataFrame job; the only transport under Spark Connect.

The model (once per fit) and each round's state go out as files under the fit's exchange directory (every executor reads
the staging directory: it holds the staged data); each worker's sums come back through the round's aggregation path
(:mod:`.sql_paths`: Arrow rows or files, summed by the driver or by reducer tasks), chosen per round by
:func:`~sparkdl_avg.driver.transport.policy.plan_aggregation`. Runs the same on a classic session and under Spark
Connect, where consecutive rounds may share one standing job (:mod:`.standing`).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from ...executor import worker as worker_mod
from ...shared.errors.remote_errors import run_job
from ...shared.files.fs import join, make_dir
from ...shared.wire import exchange, round_rows, standing
from ...shared.wire.aggregation import PartialResult, merge, nbytes_of
from ..config.options import AGGREGATIONS, TRANSPORTS
from ..runtime.session import struct_type
from .base import NextRound, Published, StateTransport, TransportSettings, remove_quietly
from .murmur3 import shard_keys
from .policy import plan_aggregation, round_socket
from .sql_paths import Aggregation, assemble, read_rows
from .standing import STANDING_CLOSE_S, StandingRounds

logger = logging.getLogger("sparkdl_avg")


@TRANSPORTS.register
class SqlTransport(StateTransport):
    """The round as a DataFrame job (``spark.range(N).mapInArrow``); works on classic sessions and under Spark Connect.

    Every aggregation path adds the same numbers in the same order (worker 0, 1, ...), so all give bitwise the same sums
    as each other, as ``state_transport="files"`` and as ``"spark"`` at ``aggregation_depth=1`` (deeper trees add in
    another order).

    Args:
        engine: The session's :class:`~sparkdl_avg.driver.runtime.session.Engine`.
        directory: The fit's exchange directory under the staging root.
        settings: Its :class:`~sparkdl_avg.driver.transport.base.TransportSettings` (``aggregation``, ``shards``).
        one_host_files: ``"auto"`` sums the workers' files on the driver (Connect, one host, local staging).
        network_rate: The driver's link in bytes/s when executors run on other hosts (``"auto"``'s choice,
            :func:`~sparkdl_avg.driver.transport.policy.plan_aggregation`); ``None`` when they share its host.
        standing: Run consecutive rounds in one standing job (:mod:`.standing`); where the driver and the executors
            share a host and the directory is local, or with ``network``. Rounds run through :meth:`run_job` with
            ``rounds_labels`` (a fit's synchronous rounds) go to it when their path allows
            (:attr:`~sparkdl_avg.driver.transport.sql_paths.Aggregation.standing`: ``"files"``, what ``"auto"`` takes
            there; with ``network``, ``Aggregation.inline``: ``"driver"``) and they have at most as many workers as the
            cluster has task slots (every task must hold a slot at once). A task that fails is retried by Spark as
            usual and joins at the round in progress; a failed job raises what the round's own job would have.
        network: The standing job's words and answers go through the driver's socket (``overlap_rounds`` on a classic
            session whose executors run on other hosts, or ``standing_rounds="socket"``): a round's weights travel in
            its word (the optimizer variables kept by the driver until a worker asks), and each worker's sums in its
            answer (``"auto"`` takes the ``"driver"`` aggregation there), none of it through the staging store. Rounds
            that run a job of their own publish as usual (files under the staging directory).
    """

    name = "sql"
    connect = True

    def __init__(self, engine, directory: str, settings: TransportSettings = TransportSettings(),
                 one_host_files: bool = False, network_rate: Optional[float] = None, standing: bool = False,
                 network: bool = False) -> None:
        super().__init__(engine, settings)
        self.directory = directory
        self.one_host_files = one_host_files
        self.network_rate = network_rate  # bytes/s of the driver's link on hosts of their own; None: one host
        self.standing = standing
        self.network = network
        self._spec: Optional[exchange.StoredSpec] = None
        self.last_plan: Optional[Tuple[str, int]] = None  # (aggregation, shards) of the latest round
        self._rounds = StandingRounds(engine, directory, network)
        self._ahead: Optional[Announced] = None  # overlap_rounds: the round announced ahead, until run_job takes it
        make_dir(directory)

    @classmethod
    def for_fit(cls, engine, directory, settings, site):
        if not site.connect:
            # overlap_rounds: rounds in a standing job, a round ahead; through local files on one host with a local
            # staging directory (unless standing_rounds="socket"), else through the driver's socket
            overlap = settings.overlap and settings.standing
            network = round_socket(overlap, settings.standing_rounds, False, site.one_host, site.local_fs)
            return cls(engine, directory, settings, one_host_files=overlap and not network, network_rate=site.rate,
                       standing=overlap, network=network)
        # One standing job where its tasks can wait on local files that the client writes (one host, local staging;
        # standing_rounds="socket" is refused here before any job: trainer.fit, policy.check_standing_rounds).
        shared = site.local_fs and site.one_host
        return cls(engine, directory, settings, one_host_files=shared, network_rate=site.rate,
                   standing=settings.standing and shared)

    def ship_spec(self, spec):
        if self._spec is None or self._spec.fingerprint != spec.fingerprint:
            self._spec = exchange.store_spec(self.directory, spec)
        return self._spec

    def publish(self, name, weights, optimizer, job=None):
        """See :meth:`StateTransport.publish`; ``job``: the standing job whose word will carry the state."""
        if self.network and job is not None:  # the weights in the standing job's word, through the driver's socket
            directory = join(self.directory, name)  # only if the sums go to files (an aggregation asked for)
            layout = self.layout(weights, optimizer)
            if job.opening(weights, optimizer):  # the job's closure carries it (a broadcast): not in each word
                return Published(standing.OPENING, partial(remove_quietly, directory), directory, layout,
                                 nbytes_of(weights, optimizer))
            if optimizer is not None:
                # kept by the driver: a worker fetches them only to start or restart its own (optimizer_state="local")
                optimizer = job.post.keep(name, optimizer)
            state = exchange.InlineState([np.asarray(w) for w in weights], optimizer)

            def release():
                job.post.forget(name)
                remove_quietly(directory)

            # the word carries the weights; a worker fetches the optimizer's variables only to start its own
            return Published(state, release, directory, layout, nbytes_of(weights))
        directory = join(self.directory, name)
        state = exchange.store_state(directory, "state", weights, optimizer)
        return Published(state, partial(remove_quietly, directory), directory, self.layout(weights, optimizer),
                         nbytes_of(weights, optimizer))

    def plan(self, num_workers: int, nbytes: int, standing: bool = False) -> Tuple[str, int]:
        """``(aggregation, shards)`` for ``num_workers`` workers and sums of ``nbytes`` bytes each.

        ``standing``: for a round of the standing job, whose answers carry the sums through the driver's socket
        (``network``: ``"auto"`` takes ``"driver"``).
        """
        s = self.settings
        if standing and self.network and s.aggregation == "auto":
            return "driver", 1
        return plan_aggregation(s.aggregation, s.shards, num_workers, nbytes, self.network_rate, self.one_host_files)

    def run_job(self, name, weights, optimizer, make_task, entry, workers, what, rounds_labels=None, places=None,
                ahead=None):
        plan = path = None
        if rounds_labels is not None and self.standing:
            plan = self.plan(len(workers), self.layout(weights, optimizer).nbytes, standing=True)
            path = AGGREGATIONS.get(plan[0])()
        usable = path is not None and self._standing_path(path) and len(workers) <= self.engine.default_parallelism
        announced, self._ahead = self._ahead, None
        if announced is not None and (announced.round.name != name or not usable or announced.job.ended()):
            self._drop(announced)  # not the round announced: its job stops, this round starts another
            announced = None
        job = self._rounds.job_for(workers, rounds_labels, usable, places)
        if announced is not None and announced.job is not job:
            announced.published.release()
            announced = None
        self.last_announced = announced is not None
        if job is None:
            return super().run_job(name, weights, optimizer, make_task, entry, workers, what, places=places)
        published = None
        try:
            if announced is not None:  # announced while the round before trained (overlap_rounds)
                seq, published, plan, path = announced.seq, announced.published, announced.plan, announced.path
                at = time.time()
            else:
                published = self.publish(name, weights, optimizer, job)
                task = make_task(published.state, path.sink(published.directory, published.layout, plan[1]))
                seq = job.announce(entry, task)
                at = time.time()
            self.last_plan = plan
            if ahead is not None:  # the next round's word now: its tasks go on to it as soon as they answer this one
                self._ahead = self._announce_ahead(job, seq, entry, workers, ahead)
            batches = run_job(partial(job.answers, seq), what)
            if batches is None:  # the job ended without an error and without this round: a job of its own
                logger.debug("%s: the standing job ended before the round; running it as a job of its own", what)
                self._drop(self._ahead)
                self._ahead = None
                self.last_announced = False
                if not job.post.reached():  # no task could connect to the driver's socket: never try again
                    host, port = job.post.address
                    logger.warning(
                        "The executors could not connect to the driver at %s:%d (spark.driver.host), where "
                        "overlapped rounds hand out their state and collect the sums; from here on each round runs "
                        "as a Spark job of its own, one after another. Let the executors reach the driver's "
                        "host on any port, or set spark.driver.host to an address they reach.", host, port)
                    self.standing = False
                if self.network:  # the state was in the word: a job of its own reads it from files
                    published.release()
                    published = self.publish(name, weights, optimizer)
                return self.run(make_task, entry, workers, what, published), at
            import pyarrow as pa

            table = pa.Table.from_batches(batches, round_rows.round_arrow_schema())
            result = self._collect(table, what, published.directory, published.layout, path, plan[1])
            result.state_bytes = published.nbytes
            return result, at
        except BaseException:
            self._drop(self._ahead)
            self._ahead = None
            self._rounds.stop()  # failed (the error is the round's) or interrupted: no job of the fit left running
            raise
        finally:
            if published is not None:
                published.release()
            if self._ahead is None:
                self._rounds.idle()

    def _announce_ahead(self, job, seq: int, entry, workers, ahead: NextRound) -> Optional["Announced"]:
        """Publishes and announces ``ahead`` after round ``seq`` in ``job``; what :meth:`run_job` takes up next."""
        plan = self.plan(len(workers), self.layout(ahead.weights, ahead.optimizer).nbytes, standing=True)
        path = AGGREGATIONS.get(plan[0])()
        if not self._standing_path(path):
            return None
        published = self.publish(ahead.name, ahead.weights, ahead.optimizer, job)
        task = ahead.make_task(published.state, path.sink(published.directory, published.layout, plan[1]))
        job.announce(entry, task, keep_from=seq)
        return Announced(ahead, job, job.seq, published, plan, path)

    def take_ahead(self, key, weights, optimizer) -> bool:
        if self._ahead is None:
            return False
        if self._ahead.round.same(key, weights, optimizer):
            return True
        logger.debug("The round announced ahead, %s, is not round %s as asked now: run anew", self._ahead.round.key,
                     key)
        self.drop_ahead()
        return False

    def _standing_path(self, path: Aggregation) -> bool:
        """Whether a round summed by ``path`` may run in this transport's standing job (files, or the socket)."""
        return path.inline if self.network else path.standing

    def drop_ahead(self) -> None:
        """Forgets the round announced ahead, if any (its state differs from what the round needs)."""
        announced, self._ahead = self._ahead, None
        self._drop(announced)

    def _drop(self, announced) -> None:
        """Forgets a round announced ahead that will not be taken up (its job stops; its state goes)."""
        if announced is None:
            return
        self._rounds.stop()  # its tasks may be training it: no job of the fit left running a round nobody reads
        announced.published.release()

    def run(self, make_task, entry, workers, what, published, places=None):
        layout = published.layout
        how, shards = self.last_plan = self.plan(len(workers), layout.nbytes)
        path = AGGREGATIONS.get(how)()
        task = make_task(published.state, path.sink(published.directory, layout, shards))
        rows = self._rows(task, entry, workers, layout, path, shards, places)
        return self._collect(run_job(rows.toArrow, what), what, published.directory, layout, path, shards)

    def _rows(self, task, entry, workers: Sequence[int], layout, path: Aggregation, shards: int, places=None):
        """The lazy DataFrame of a round's job: its tasks' rows, summed by reducers when sharded."""
        rows = self.engine.run_tasks(
            len(workers), partial(worker_mod.run_round_batches, task, entry=entry), round_rows.ROUND_SCHEMA,
            start=workers[0], places=places,
        )
        if path.sharded:
            from pyspark.sql import functions as F

            # Shard j's rows to reducer task j; the workers' results (shard -1) to reducer 0.
            keys = shard_keys(shards)
            slot = F.when(F.col("shard") < 0, 0).otherwise(F.col("shard"))
            key = F.element_at(F.array(*[F.lit(k) for k in keys]), slot + 1)
            rows = rows.repartition(shards, key).mapInArrow(
                partial(round_rows.reduce_shuffled, layout, shards), struct_type(round_rows.ROUND_SCHEMA)
            )
        return rows

    def _collect(self, table, what: str, directory: str, layout, path: Aggregation, shards: int) -> PartialResult:
        """The round's sums from its job's Arrow rows (and whatever files its path reads)."""
        t0, c0 = time.perf_counter(), time.process_time()
        results, pieces, reduce_s = read_rows(table)
        total, read = assemble(results, pieces, layout, path, shards, what, directory)
        total.received_bytes, total.driver_sum_s = table.nbytes + read, time.perf_counter() - t0
        total.reduce_s = reduce_s
        total.driver_sum_cpu_s = time.process_time() - c0
        return total

    def evaluate(self, spec, fingerprint, staged, parts, batch_size, state):
        self._drop(self._ahead)
        self._ahead = None
        self._rounds.stop()  # its waiting tasks would hold the slots this job needs
        directory = join(self.directory, "evaluate")
        stored = exchange.store_state(directory, "state", *state)
        task = worker_mod.EvalTask(spec, fingerprint, stored, staged, parts, batch_size)
        try:
            table = run_job(
                lambda: self.engine.run_tasks(parts, partial(worker_mod.run_eval_batches, task), "meta string").toArrow(),
                "Evaluation",
            )
        finally:
            remove_quietly(directory)
        parts_results = sorted((round_rows.decode_meta(m) for m in table.column("meta").to_pylist()),
                               key=lambda r: r.workers[0].worker)
        return functools.reduce(merge, parts_results, None)

    def close(self) -> None:
        self._drop(self._ahead)
        self._ahead = None
        self._rounds.stop(wait_s=STANDING_CLOSE_S)  # no job of the fit left running
        remove_quietly(self.directory)


@dataclass(frozen=True)
class Announced:
    """A round a standing job announced ahead (``overlap_rounds``), until :meth:`SqlTransport.run_job` takes it up.

    Attributes:
        round: The round as the round runner gave it.
        job: The standing job it is announced in; ``seq``: its number there.
        published: Its published state (released when it runs, or is dropped).
        plan: ``(aggregation, shards)`` of its sums; ``path``: that aggregation path.
    """

    round: NextRound
    job: Any
    seq: int
    published: Any
    plan: Tuple[str, int]
    path: Aggregation
