"""One round of parameter averaging, on the driver: state out, the Spark job, sums back, the update.

This module owns a round from the driver's side. :class:`RoundRunner` is made once per ``fit`` with everything its
rounds share; each :meth:`RoundRunner.run` reads the model's state, has the update rule say what to send, sends it
through the fit's state transport (:mod:`sparkdl_avg.driver.transport`), runs one Spark job in which each of
``num_workers`` tasks trains its replica (:func:`sparkdl_avg.executor.worker.run_round_partition`; under a local Spark
Connect server, one round of a job that runs many), gets the example-weighted sums back, stops on non-finite replicas,
applies the update rule, sets the new state on the model and records the round's
:class:`~sparkdl_avg.shared.wire.stats.RoundRecord`. :class:`~sparkdl_avg.driver.algorithms.rules.RuleState` keeps the
update rule's state (BMUF's ``Δ``) between rounds and fits. The stale-synchronous and asynchronous scheduler
(:mod:`sparkdl_avg.driver.fit.stale_async`) asks the same runner for one worker's chunk at a time
(:meth:`RoundRunner.run_chunk`) and has it record the chunks it applies (:meth:`RoundRunner.record_chunk`).

The executor entry point is looked up at each round (:func:`sparkdl_avg.executor.testing.round_entry`:
``worker.run_round_partition`` unless a test installed a :class:`~sparkdl_avg.executor.testing.RoundEntry` to inject
executor faults, a failed first attempt or a slow worker).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...errors import WorkerError
from ...executor import testing
from ...executor.worker import RoundTask
from ...shared.wire.aggregation import PartialResult
from ...shared.model.modelspec import (current_learning_rate, get_state, iterations_index, set_state, state_of,
                                       trainable_mask)
from ...shared.data.staged_dataset import StagedDataset
from ...shared.wire.stats import RoundRecord, TrainingStats
from ..transport.chains import KeptKind
from ..algorithms.overlap import preview
from ..algorithms.rules import RuleState, UpdateRule
from .update import round_state
from ..transport.base import NextRound, StateTransport
from ..transport.link_rate import round_rate

logger = logging.getLogger("sparkdl_avg")


@dataclass(frozen=True)
class RoundSettings:
    """What every round of one fit shares (see :class:`~sparkdl_avg.executor.worker.RoundTask` for the fields)."""

    spec: Any
    fingerprint: str
    dataset: StagedDataset
    num_workers: int
    batch_size: int
    seed: int
    shuffle: bool
    average_optimizer: bool
    on_nonfinite: str
    epochs: int
    epoch_steps: int
    compression: Optional[str] = None
    overlap: bool = False  # overlap_rounds


@dataclass
class ChunkStart:
    """What an epoch of asynchronous chunks starts from (:meth:`RoundRunner.chunk_start`, :mod:`sparkdl_avg.driver.fit.stale_async`)."""

    weights: List[np.ndarray]
    optimizer: List[np.ndarray]
    rule: UpdateRule
    rule_state: Dict[str, List[np.ndarray]]  # the rule's state, updated in place at each block's end
    trainable: List[bool]
    iterations: int  # the optimizer's iteration counter's position among its variables
    learning_rate: float


class RoundRunner:
    """Runs the rounds (or the chunks, :mod:`sparkdl_avg.driver.fit.stale_async`) of one fit and records their stats.

    Args:
        engine: The session's :class:`~sparkdl_avg.driver.runtime.session.Engine`.
        model: The driver's compiled model; holds the global state.
        rule: The update rule, resolved for ``settings.num_workers``.
        rule_state: The rule's state, updated in place each round.
        transport: How state and sums move (one per fit).
        stats: Where each round's record goes.
        kept: What workers keep between rounds, one :class:`~sparkdl_avg.driver.transport.chains.KeptKind` per kind
            that applies, in registration order.
    """

    def __init__(self, engine, model, settings: RoundSettings, rule: UpdateRule, rule_state: RuleState,
                 transport: StateTransport, stats: TrainingStats, kept: Sequence[KeptKind] = ()) -> None:
        self.engine = engine
        self.model = model
        self.settings = settings
        self.rule = rule
        self.rule_state = rule_state
        self.transport = transport
        self.stats = stats
        #: What workers keep between rounds, each walked alike (:mod:`sparkdl_avg.driver.transport.chains`).
        self.kept = list(kept)

    def pipelines(self) -> bool:
        """Whether a round may be announced while the one before it trains (``overlap_rounds`` in a standing job).

        Only the protocol's arithmetic makes that possible (round ``t + 1`` starts from ``G_t``, known when round ``t``
        starts); averaged optimizer states and kinds of kept state that are not ``pipelined`` (error feedback,
        fragments) are not.
        """
        return (self.settings.overlap and all(k.pipelined for k in self.kept)
                and not self.settings.average_optimizer and bool(getattr(self.transport, "standing", False)))

    def run(self, epoch: int, rnd: int, steps_before: int, steps: int, num_workers: Optional[int] = None,
            start: Optional[int] = None, membership: Optional[Dict[str, Any]] = None,
            share: bool = False, ahead: Optional[Tuple[int, int, int, int, bool]] = None) -> PartialResult:
        """Trains round ``rnd`` of ``epoch``: ``steps`` minibatches per worker after ``steps_before``.

        Elastic rounds (:mod:`sparkdl_avg.driver.elastic.membership`) give the round's ``num_workers`` (default: the
        fit's), ``start`` (the epoch position of its first example, see
        :func:`~sparkdl_avg.shared.data.example_order.worker_positions`) and the ``membership`` change it makes,
        recorded with it. ``share``: a checkpoint may be saved after the round, so ``optimizer_state="local"`` states
        kept on the hosts are also written where it reads them. ``ahead``: the fit's next round, ``(epoch, round,
        steps_before, steps, share)``, which :meth:`pipelines` fits announce with this one's state update already
        applied (``overlap_rounds``: its tasks go on to it as soon as they have answered this one). A round asked for
        later is checked, bitwise, against what was announced; one that differs runs as announced now.
        """
        s = self.settings
        n = s.num_workers if num_workers is None else num_workers
        for kept in self.kept:
            kept.resize(n)
        # Wall-clock times (time.time) so they compare with the workers' own.
        t0 = time.time()
        # Read from the model on access, not copied: written to the round's state as they are read, and read
        # again for the update (the model does not change during the round): no copy of its state held.
        weights, opt_vars = state_of(self.model)
        mask = trainable_mask(self.model)
        learning_rate = current_learning_rate(self.model)
        sent = self.rule.to_send(weights, self.rule_state.state, mask)
        if start is None and n == s.num_workers:  # a round announced ahead (overlap_rounds) is kept by the transport
            took = self.transport.take_ahead((epoch, rnd, steps_before, steps, share), sent, opt_vars)
        else:
            took = False
            self.transport.drop_ahead()
        following = None
        if ahead is not None and start is None and n == s.num_workers and self.pipelines():
            following = self._announce(ahead, weights, opt_vars, mask, steps, n)
        # A transport may run consecutive rounds in one Spark job (SqlTransport's standing job, under Spark Connect):
        # its label, and the fit's tags that the thread it waits in must carry.
        rounds_labels = self.engine.carried_labels(
            f"sparkdl_avg fit: epoch {epoch + 1}/{s.epochs}, rounds from {rnd + 1} (one Spark job for them)"
        ) if getattr(self.transport, "standing", False) else None
        if start is None:
            what = f"minibatches {steps_before + 1}-{steps_before + steps} of {s.epoch_steps}"
        else:
            what = f"examples {start + 1}-{start + n * steps * s.batch_size} of {s.dataset.num_examples}, {n} workers"
        synced = next((r for r in (k.returned() for k in self.kept) if r is not None), None)
        self.transport.returned = synced  # the round's sums' layout: its fragment's (sync_fragments)
        try:
            result, t1 = self._job(
                f"sparkdl_avg fit: epoch {epoch + 1}/{s.epochs}, round {rnd + 1} ({what})", None,
                f"e{epoch}-r{rnd}", sent, opt_vars,
                partial(self.task, epoch, rnd, steps_before, steps, workers=range(n), num_workers=n, start=start,
                        share=share),
                range(n), f"Round {rnd} of epoch {epoch}", rounds_labels, self._places(n), following,
            )
        finally:
            self.transport.returned = None
        dropped = sum(k.dropped(epoch, rnd) for k in self.kept)
        for kept in self.kept:
            kept.done(epoch, rnd, range(n), result.workers)
        t2, cpu2 = time.time(), time.process_time()
        self._check_finite(epoch, rnd, result)
        self.update(result, weights, sent, opt_vars, mask, learning_rate, steps, synced)
        # The sums became the new state (divided in place): not kept into the next round, a state less.
        result.weight_sums = result.optimizer_sums = None
        del weights, sent, opt_vars
        t3, cpu3 = time.time(), time.process_time()
        record = round_record(epoch, rnd, steps, n, result, self.rule.name, t0, t1, t2, t3)
        record.driver_cpu_s = result.driver_sum_cpu_s + (cpu3 - cpu2)
        record.membership, record.start, record.residuals_dropped = membership, start, dropped
        record.announced_ahead = took and self.transport.last_announced  # (not if its job ended before it ran)
        self._finish(record)
        return result

    def run_chunk(self, epoch: int, rnd: int, part: int, slot: int, steps_before: int, steps: int,
                  sent: Sequence[np.ndarray], optimizer: Sequence[np.ndarray],
                  group: Optional[str]) -> Tuple[PartialResult, float, float]:
        """Trains worker ``part``'s chunk of round ``rnd`` of ``epoch`` from ``sent``/``optimizer``; thread-safe.

        ``slot``: the driver thread running it (see :class:`~sparkdl_avg.executor.worker.RoundTask`); ``group``: the
        fit's Spark job group (a thread does not inherit it). The driver's model is not touched.

        Returns:
            The chunk's result, the wall-clock times (``time.time``) its state was published and its job done.
        """
        s = self.settings
        result, published = self._job(
            f"sparkdl_avg fit: epoch {epoch + 1}/{s.epochs}, round {rnd + 1}, worker {part} "
            f"(slot {slot}; minibatches {steps_before + 1}-{steps_before + steps} of {s.epoch_steps})", group,
            f"e{epoch}-r{rnd}-w{part}", sent, optimizer,
            partial(self.task, epoch, rnd, steps_before, steps, slot=slot, workers=[part]),
            [part], f"Worker {part}'s chunk of round {rnd} of epoch {epoch}",
        )
        for kept in self.kept:
            kept.done(epoch, rnd, [part], result.workers)
        return result, published, time.time()

    def _job(self, label: str, group: Optional[str], name: str, sent, optimizer, make_task, workers: Sequence[int],
             what: str, rounds_labels=None, places=None, ahead=None) -> Tuple[PartialResult, float]:
        """A round's or a chunk's job through the transport, its Spark jobs labelled ``label``.

        ``rounds_labels``, ``places``, ``ahead``: for a synchronous round (not a chunk), see
        :meth:`StateTransport.run_job`.
        """
        with self.engine.labels(label, group=group):
            return self.transport.run_job(name, sent, optimizer, make_task, testing.round_entry(), workers, what,
                                          rounds_labels=rounds_labels, places=places, ahead=ahead)

    def _announce(self, ahead, weights, opt_vars, mask, steps: int, n: int) -> Optional[NextRound]:
        """The next round for the transport to announce (see :meth:`run`).

        Its state is what :meth:`update` will set after this round: the weights with the pending average
        (:func:`~sparkdl_avg.driver.algorithms.overlap.preview`) and the optimizer's variables with the iteration
        counter ``steps`` on. ``None`` where that is not known in advance.
        """
        epoch, rnd, steps_before, next_steps, share = ahead
        new_weights = preview(weights, self.rule_state.state)
        if new_weights is None:
            return None
        sent = self.rule.to_send(new_weights, self.rule_state.state, mask)
        optimizer = list(opt_vars)
        at = iterations_index(self.model)
        optimizer[at] = np.asarray(int(opt_vars[at]) + steps, dtype=opt_vars[at].dtype)
        return NextRound((epoch, rnd, steps_before, next_steps, share), f"e{epoch}-r{rnd}", sent, optimizer,
                         partial(self.task, epoch, rnd, steps_before, next_steps, workers=range(n), num_workers=n,
                                 share=share, ahead=True))

    def _places(self, n: int) -> Optional[List[Optional[str]]]:
        """Where the round's ``n`` tasks should run: each worker's ``optimizer_state="local"`` host (classic sessions)."""
        kept = next((k for k in self.kept if k.host_local), None)
        if kept is None or self.engine.sc is None:
            return None
        from ..elastic.membership import status_slots

        return kept.places(range(n), status_slots(self.engine.sc).hosts)

    def chunk_start(self) -> ChunkStart:
        """The driver's state, rule and learning rate an epoch of chunks starts from."""
        weights, opt = get_state(self.model)
        return ChunkStart(weights, opt, self.rule, self.rule_state.state, trainable_mask(self.model),
                          iterations_index(self.model), current_learning_rate(self.model))

    def set_global_state(self, weights, optimizer) -> float:
        """Sets the model's state (a block of chunks applied); returns its learning rate now."""
        set_state(self.model, weights, optimizer)
        return current_learning_rate(self.model)

    def record_chunk(self, epoch: int, rnd: int, steps: int, result: PartialResult, t_read: float, t1: float,
                     t2: float, *, chunk: int, slot: int, staleness: int, delay: float, scale: float) -> RoundRecord:
        """Records an applied chunk (one worker's, read at ``t_read``; see :mod:`sparkdl_avg.shared.wire.stats`); returns the record."""
        record = round_record(epoch, rnd, steps, 1, result, self.rule.name, t_read, t1, t2, time.time())
        record.chunk, record.slot, record.staleness = chunk, slot, staleness
        record.delay, record.update_scale = delay, scale
        record.workers[0].worker = slot
        return self._finish(record)

    def _finish(self, record: RoundRecord) -> RoundRecord:
        """Finishes a round's or a chunk's record (the transport and its plan) and keeps it in ``stats``."""
        record.transport = self.transport.name
        record.aggregation, record.shards = self.transport.last_plan or ("", 0)
        record.compression = self.settings.compression or ""
        record.link_rate = round_rate(record)
        record.overlapped = self.settings.overlap
        self.stats.add(record)
        return record

    def update(self, result: PartialResult, weights, sent, opt_vars, mask, learning_rate: float, steps: int,
               synced=None) -> None:
        """Sets the model's state from a round's sums: the update rule on the averaged weights, the optimizer's average.

        ``weights``/``opt_vars``: the state the round started from; ``sent``: what the workers started from
        (:meth:`UpdateRule.to_send`); the optimizer's iteration counter advances by ``steps``. Sums of deltas
        (``update_compression``) are from ``sent`` and ``opt_vars``. The arithmetic is
        :func:`~sparkdl_avg.driver.fit.update.round_state`'s; ``synced``: a fragment round's.
        """
        new_weights, new_opt = round_state(result, weights, sent, opt_vars, self.rule, self.rule_state.state, mask,
                                           learning_rate, self.settings.average_optimizer,
                                           iterations_index(self.model), steps, synced)
        set_state(self.model, new_weights, new_opt)

    def task(self, epoch: int, rnd: int, steps_before: int, steps: int, state, sink, slot: Optional[int] = None,
             workers: Sequence[int] = (), num_workers: Optional[int] = None,
             start: Optional[int] = None, share: bool = False, ahead: bool = False) -> RoundTask:
        """The :class:`~sparkdl_avg.executor.worker.RoundTask` of round ``rnd`` of ``epoch`` for ``workers``.

        ``slot``, ``start``: see its doc; ``num_workers``: the round's (default: the fit's); ``share``: see :meth:`run`;
        ``ahead``: announced while the round before it trains (its chained files not yet recorded).
        """
        s = self.settings
        return RoundTask(
            spec=s.spec, fingerprint=s.fingerprint, state=state, results=sink, dataset=s.dataset,
            epoch=epoch, round=rnd, steps_before=steps_before, steps=steps,
            num_workers=s.num_workers if num_workers is None else num_workers,
            batch_size=s.batch_size, seed=s.seed, shuffle=s.shuffle, average_optimizer=s.average_optimizer,
            skip_nonfinite=s.on_nonfinite == "skip", slot=slot,
            start=start, kept=tuple(k.for_round(epoch, rnd, workers, share, ahead) for k in self.kept),
        )

    def _check_finite(self, epoch: int, rnd: int, result: PartialResult) -> None:
        """Stops (or, with ``on_nonfinite="skip"``, warns) when replicas' loss or weights are NaN/Inf.

        Raised before the driver's model is touched, so it keeps the last good weights.
        """
        check_finite(result, f"epoch {epoch}, round {rnd}", self.settings.on_nonfinite, whole=True)


def check_finite(result: PartialResult, where: str, policy: str, whole: bool) -> None:
    """Raises ``WorkerError`` for NaN/Inf replicas in ``result`` under ``policy="raise"``, else warns.

    ``whole``: ``result`` is a whole round, and a round whose every replica is bad raises even under ``"skip"`` (nothing
    would be left to average). An asynchronous chunk is one replica: skipping it leaves the others' updates.
    """
    bad = sorted((w for w in result.workers if not w.finite), key=lambda w: w.worker)
    if not bad:
        return
    # A finite loss with non-finite weights is the weights' fault: "(loss 0.4542)" alone misled users.
    names = ", ".join(f"{w.worker} (loss {w.loss:.4g}{', weights NaN/Inf' if math.isfinite(w.loss) else ''})"
                      for w in bad)
    if policy == "raise" or (whole and len(bad) == len(result.workers)):
        raise WorkerError(
            f"Non-finite loss or weights (NaN/Inf) from worker(s) {names} in {where}. The model "
            "keeps the weights from before this round (and the last checkpoint is unchanged). "
            "Lower the learning rate, check the data, or pass on_nonfinite='skip' to leave such "
            "replicas out of the average."
        )
    logger.warning("Left worker(s) %s out of the average of %s: non-finite loss or weights.", names, where)


def round_record(epoch: int, rnd: int, steps: int, num_workers: int, result: PartialResult, rule_name: str,
                 t0: float, t1: float, t2: float, t3: float) -> RoundRecord:
    """The stats record of one round (see :mod:`sparkdl_avg.shared.wire.stats` for the fields).

    ``t0``..``t3`` are driver wall-clock times: round start, state sent, summed result received, driver update done. The
    job's time splits into scheduling (until the first worker starts), the workers' span (first start to last end, by
    the workers' clocks) and aggregation (the rest: serialising results, their sum and the transfer to the driver). On a
    multi-host cluster clock skew blurs that split a little.
    """
    workers = sorted(result.workers, key=lambda w: w.worker)
    compute = [w.compute_s for w in workers]
    busy = [w.setup_s + w.load_s + w.compute_s for w in workers]
    first_start = min(w.start for w in workers)
    last_end = max(w.end for w in workers)
    schedule = min(max(0.0, first_start - t1), t2 - t1)
    span = min(max(0.0, last_end - max(first_start, t1)), t2 - t1 - schedule)
    wall = time.time() - t0
    return RoundRecord(
        epoch=epoch,
        round=rnd,
        averaging_frequency=steps,
        num_workers=num_workers,
        examples=result.examples,
        t_start=t0,
        wall_s=wall,
        broadcast_s=t1 - t0,
        job_s=t2 - t1,
        schedule_s=schedule,
        workers_s=span,
        aggregate_s=t2 - t1 - schedule - span,
        update_s=t3 - t2,
        other_s=wall - (t3 - t0),
        compute_max_s=max(compute),
        compute_min_s=min(compute),
        compute_mean_s=sum(compute) / len(compute),
        load_max_s=max(w.load_s for w in workers),
        load_mean_s=sum(w.load_s for w in workers) / len(workers),
        setup_max_s=max(w.setup_s for w in workers),
        overhead_s=wall - max(busy),
        examples_per_s=result.examples / wall if wall > 0 else 0.0,
        loss=result.metric_means().get("loss"),
        replicas_built=sum(1 for w in workers if w.replica_built),
        workers=workers,
        update_rule=rule_name,
        received_bytes=result.received_bytes,
        state_bytes=result.state_bytes,
        driver_sum_s=result.driver_sum_s,
        reduce_max_s=result.reduce_s,
        sent_bytes=sum(w.sent_bytes for w in workers) if all(w.sent_bytes is not None for w in workers) else None,
        encode_max_s=max(w.encode_s for w in workers),
        feedback_max_s=max(w.feedback_s for w in workers),
        local_states_restarted=sum(1 for w in workers if w.local_state_restarted),
    )
