"""The protocol every state transport follows and the settings a fit's transport is built from.

A *state transport* (``state_transport``: ``"spark"``, ``"files"``, ``"sql"``) moves one fit's model and each round's
state out to the workers and brings their sums back; the Spark SQL round sums them along one of its *aggregation paths*
(``aggregation``: ``"driver"``, ``"files"``, ``"shuffle"``, ``"storage"``, :mod:`.sql_paths`). Both are classes found by
name in the registries the options declare (:data:`sparkdl_avg.driver.config.options.TRANSPORTS`, ``AGGREGATIONS``): a
new one is a class in one module with ``@TRANSPORTS.register`` or ``@AGGREGATIONS.register``, and the options take its
name from there. ``"auto"`` is no class but a policy (:mod:`.policy`). What one fit's transport is built from is one
:class:`TransportSettings`, made from the trainer's config in one place (:meth:`TransportSettings.of`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np

from ...errors import WorkerError
from ...executor import worker as worker_mod
from ...shared.errors.remote_errors import run_job
from ...shared.files.fs import remove_tree
from ...shared.wire import exchange
from ...shared.wire.aggregation import PartialResult, merge
from ...shared.model.modelspec import state_of
from ...shared.wire.delta_sums import DeltaLayout, first_moments
from ...shared.wire.sparse_rows import SparseRowsLayout, table_groups

logger = logging.getLogger("sparkdl_avg")


@dataclass(frozen=True)
class TransportSettings:
    """What one fit's (or evaluation's) transport is built from: the options that shape it, read once.

    Attributes:
        mode: ``state_transport`` (``"auto"`` or a name in ``TRANSPORTS``).
        aggregation: ``aggregation`` (``"auto"`` or a name in ``AGGREGATIONS``).
        shards: ``aggregation_shards``; ``None``: :func:`.policy.plan_aggregation`'s.
        depth: ``aggregation_depth``: the ``treeAggregate``'s depth (Spark's tree, classic evaluations).
        network_rate: ``network_rate`` as given (``None``: :data:`.policy.DEFAULT_NETWORK_RATE`).
        num_workers: Workers per round (``"auto"``'s choice); ``None``: not known.
        sums_bytes: One worker's sums on the wire (a compressed delta's size under compression); ``None``: not known.
        optimizer_sums: Whether the workers' sums hold the optimizer's (``optimizer_state="average"``).
        compression: ``update_compression`` (``None``: float32 sums).
        feedback: Per compressed segment, whether workers keep its residual (error feedback).
        moments: Positions of the optimizer's first moments among its variables.
        standing: Whether rounds may share one standing job: not with ``standing_rounds="off"``, nor with
            elastic probes (they would wait on the job's slots).
        overlap: ``overlap_rounds``: on a classic session rounds run in one standing job too, each announced a round
            ahead, through local files where the executors share the driver's host and a local staging directory,
            else through the driver's socket (:class:`~sparkdl_avg.driver.transport.sql.SqlTransport`).
        standing_rounds: ``standing_rounds``: ``"socket"``, a classic session's standing job talks through the
            driver's socket even where the executors share its host.
        tables: Per embedding table, its position and its averaged slots' among the state's arrays
            (:func:`~sparkdl_avg.shared.wire.sparse_rows.table_groups`): workers send only their changed rows.
    """

    mode: str = "auto"
    aggregation: str = "auto"
    shards: Optional[int] = None
    depth: int = 2
    network_rate: Any = None
    num_workers: Optional[int] = None
    sums_bytes: Optional[int] = None
    optimizer_sums: bool = True
    compression: Optional[str] = None
    feedback: Tuple[bool, ...] = ()
    moments: Tuple[int, ...] = ()
    standing: bool = True
    tables: Tuple[Tuple[int, ...], ...] = ()
    overlap: bool = False
    standing_rounds: str = "auto"

    @classmethod
    def of(cls, config, model, num_workers: int, standing: bool = True) -> "TransportSettings":
        """The settings of a trainer's ``config`` for its compiled Keras ``model`` and ``num_workers`` workers.

        ``standing``: whether this fit's rounds may share a standing job (``False``: elastic rounds' probes);
        ``standing_rounds="off"`` rules it out too.
        """
        weights, optimizer = state_of(model)  # the layout reads dtypes and shapes only
        settings = cls(config.state_transport, config.aggregation, config.aggregation_shards, config.aggregation_depth,
                       config.network_rate, num_workers, None, config.optimizer_state == "average",
                       config.update_compression, tuple(config.feedback), first_moments(model.optimizer.variables),
                       standing and config.standing_rounds != "off",
                       table_groups(model, config.optimizer_state == "average"))
        return dataclasses.replace(settings, sums_bytes=settings.layout(weights, optimizer).nbytes,
                                   overlap=bool(getattr(config, "overlap_rounds", False)),
                                   standing_rounds=config.standing_rounds)

    def layout(self, weights: Sequence[np.ndarray], optimizer: Optional[Sequence[np.ndarray]]):
        """The layout of the workers' sums of a round on this state.

        A ``FlatLayout``, or a ``DeltaLayout`` when compressed; a ``SparseRowsLayout`` (sums of deltas, the tables'
        changed rows only) when the model has embedding tables, whatever the compression.
        """
        flat = exchange.FlatLayout.of(weights, optimizer if self.optimizer_sums else None)
        if self.tables:
            return SparseRowsLayout(flat, self.tables, self.compression, self.feedback, self.moments)
        return DeltaLayout(flat, self.compression, self.feedback, self.moments) if self.compression else flat


@dataclass(frozen=True)
class Site:
    """Where a fit runs, as the transports' choice reads it.

    Attributes:
        connect: A Spark Connect session (no broadcasts, no RDDs).
        one_host: Every executor runs on the driver's host.
        local_fs: The staging root is a local path (by its scheme: resolving a URI would connect to it).
        rate: The driver's link in bytes/s on hosts of their own; ``None`` on one host.
        root: The staging root (the fit's exchange directory is below it).
    """

    connect: bool
    one_host: bool
    local_fs: bool
    rate: Optional[float]
    root: str = ""


@dataclass(frozen=True)
class NextRound:
    """The fit's next round, which a transport running rounds in a standing job may announce while this one trains.

    ``overlap_rounds``: round ``t + 1`` starts from what round ``t``'s update will set, known when round ``t`` starts.
    The round runner gives it with round ``t`` (:meth:`StateTransport.run_job`'s ``ahead``), and asks the transport,
    when it runs round ``t + 1``, whether that is what was announced (:meth:`StateTransport.take_ahead`): the transport
    alone keeps what it announced.

    Attributes:
        key: ``(epoch, round, steps_before, steps, share)``: the round as the fit plans it.
        name: The round's name in the transport's files (``"e<epoch>-r<round>"``).
        weights: The weights it is sent.
        optimizer: The optimizer variables it is sent.
        make_task: ``make_task(state, sink)``: its tasks' :class:`~sparkdl_avg.executor.worker.RoundTask`.
    """

    key: Tuple[int, int, int, int, bool]
    name: str
    weights: Sequence[np.ndarray]
    optimizer: Sequence[np.ndarray]
    make_task: Callable[[Any, Any], Any]

    def same(self, key: tuple, weights: Sequence[np.ndarray], optimizer: Sequence[np.ndarray]) -> bool:
        """Whether round ``key`` as asked for now, with this state, is this round bitwise."""
        return self.key == key and _equal(self.weights, weights) and _equal(self.optimizer, optimizer)


def _equal(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> bool:
    """Whether two states are bitwise the same arrays."""
    return len(a) == len(b) and all(np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(x, y)
                                    for x, y in zip(a, b))


class StateTransport:
    """One fit's way of moving the model and round state out to the workers and their sums back.

    A transport is registered by its ``name`` (``TRANSPORTS``) and built by :meth:`for_fit`. Subclasses implement
    :meth:`publish` and :meth:`run`.

    Attributes:
        name: The ``state_transport`` value naming it (what ``"auto"`` chose).
        connect: Whether it runs under Spark Connect.
        engine: The :class:`~sparkdl_avg.driver.runtime.session.Engine` the jobs run on.
        settings: Its :class:`TransportSettings`.
        last_plan: ``(aggregation, shards)`` of the latest round of the Spark SQL round; ``None`` for the others.
        last_announced: Whether the latest round ran as announced ahead (``overlap_rounds`` in a standing job).
    """

    name = ""
    connect = False
    last_plan: Optional[Tuple[str, int]] = None
    last_announced = False  # whether the latest round ran as announced ahead (run_job's ``ahead``)

    def __init__(self, engine, settings: TransportSettings = TransportSettings()) -> None:
        self.engine = engine
        self.settings = settings
        self._spec_bc = None

    @classmethod
    def for_fit(cls, engine, directory: str, settings: TransportSettings, site: Site) -> "StateTransport":
        """This transport for one fit whose exchange files go under ``directory``."""
        return cls(engine, settings)

    #: ``sync_fragments``: the indices of the weights a round's workers return (its fragment), set by the round
    #: runner around the round's job; ``None``: all of them. The state sent is whole either way.
    returned: Optional[Tuple[int, ...]] = None

    def layout(self, weights: Sequence[np.ndarray], optimizer: Optional[Sequence[np.ndarray]]):
        """The layout of the workers' sums of a round on this state (:meth:`TransportSettings.layout`)."""
        if self.returned is not None:
            weights = [weights[j] for j in self.returned]
        return self.settings.layout(weights, optimizer)

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

        The transport decides where the workers deliver their sums (the result sink,
        :mod:`sparkdl_avg.shared.wire.exchange`); ``make_task(state, sink)`` gives the job's
        :class:`~sparkdl_avg.executor.worker.RoundTask` with it. ``entry`` is the executor body,
        ``worker.run_round_partition`` unless a test installed another (:func:`sparkdl_avg.executor.testing.round_entry`,
        looked up by the caller each round).
        ``places``: the host each worker's task should run on (classic sessions;
        :meth:`~sparkdl_avg.driver.runtime.session.Engine.located`), ``None``: anywhere.

        Raises:
            DataError, WorkerError: decoded from the failed job (:mod:`sparkdl_avg.shared.errors.remote_errors`).
        """
        raise NotImplementedError

    def run_job(self, name: str, weights, optimizer, make_task: Callable[[Any, Any], Any], entry,
                workers: Sequence[int], what: str, rounds_labels: Optional[Callable[[], Any]] = None,
                places: Optional[Sequence[Optional[str]]] = None, ahead=None) -> Tuple[PartialResult, float]:
        """A round's or a chunk's job: publishes its state under ``name``, runs it (:meth:`run`), sums it; thread-safe.

        What was published is released before this returns, however the job ends. ``rounds_labels``: given by a caller
        that runs rounds one after another on all its workers (not chunks from several threads), a context manager
        factory that labels a Spark job started in another thread
        (:meth:`~sparkdl_avg.driver.runtime.session.Engine.carried_labels`); a transport that keeps one job for such
        rounds (:class:`~sparkdl_avg.driver.transport.sql.SqlTransport`'s standing job) labels that job with it. The
        others ignore it. ``places``: see :meth:`run`. ``ahead``: the next round (:class:`NextRound`), that a standing
        job may announce before this one's sums are read (``overlap_rounds``); the others ignore it.

        Returns:
            The summed result and the wall-clock time (``time.time``) at which the state was published.
        """
        published = self.publish(name, weights, optimizer)
        try:
            at = time.time()
            result = self.run(make_task, entry, workers, what, published, places)
            result.state_bytes = published.nbytes
            return result, at
        finally:
            published.release()

    def take_ahead(self, key: tuple, weights: Sequence[np.ndarray], optimizer: Sequence[np.ndarray]) -> bool:
        """Whether round ``key``, asked for now with this state, runs as :meth:`run_job`'s ``ahead`` announced it.

        A round announced ahead that differs is dropped (:meth:`drop_ahead`). Transports that announce nothing ahead:
        ``False``.
        """
        return False

    def drop_ahead(self) -> None:
        """Forgets a round that :meth:`run_job`'s ``ahead`` announced and that will not run as announced."""

    def evaluate(self, spec, fingerprint: str, staged, parts: int, batch_size: int, state) -> PartialResult:
        """Evaluates ``state`` (``(weights, optimizer variables)``) on ``staged`` data in ``parts`` tasks."""
        bc = self.engine.broadcast(state)
        task = worker_mod.EvalTask(spec, fingerprint, exchange.BroadcastState(bc), staged, parts, batch_size)
        try:
            return run_job(lambda: self.tree(task, worker_mod.run_eval_partition, range(parts)), "Evaluation")
        finally:
            bc.unpersist()

    def tree(self, task, entry, parts: Sequence[int], places: Optional[Sequence[Optional[str]]] = None):
        """``entry(task, [part])``'s results, one task per part of ``parts``, merged by Spark's
        ``treeAggregate(aggregation_depth)`` (classic sessions); ``places``: as :meth:`run`'s."""
        return rdd_job(self.engine, task, entry, parts, places).treeAggregate(None, merge, merge, self.settings.depth)

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
        layout: The sums' layout (:class:`~sparkdl_avg.shared.wire.exchange.SumsLayout`): a ``FlatLayout``,
            or under ``update_compression`` a ``DeltaLayout``.
        nbytes: The bytes of state this made travel (the whole state, or patches and any new base); ``None``: not
            known.
    """

    state: Any
    release: Callable[[], None]
    directory: Optional[str] = None
    layout: Any = None
    nbytes: Optional[int] = None


def rdd_job(engine, task, entry, workers: Sequence[int], places: Optional[Sequence[Optional[str]]] = None):
    """The lazy RDD of a round's job on a classic session: one partition per worker, placed where asked."""
    if places is not None and any(places):
        ids = engine.located(list(workers), places)
    else:
        ids = engine.sc.parallelize(list(workers), len(workers))
    return ids.mapPartitions(partial(entry, task))


def remove_quietly(uri: str) -> None:
    """Deletes a tree of exchange files; a failure is logged, not raised (it must not hide the fit's own error)."""
    try:
        remove_tree(uri)
    except OSError as exc:
        logger.warning("Could not delete %s: %s", uri, exc)


def unreadable(what: str, directory: str, exc: BaseException, option: str, other: str) -> WorkerError:
    """The error of a driver that cannot read the workers' result files under ``directory``."""
    return WorkerError(
        f"Could not read the workers' results of {what[0].lower()}{what[1:]} under {directory!r}: {exc}. "
        f"With {option} the driver must read what executors write under staging_dir; use a "
        f"filesystem both see, or {other}."
    )
