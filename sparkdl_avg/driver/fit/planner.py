"""The rounds of an epoch, planned one at a time: :class:`RoundPlanner` yields each :class:`PlannedRound`.

As Keras' ``EpochIterator`` makes ``fit``'s loop a few lines, the planner owns
every decision about the next round — how many minibatches it trains (the
schedule's ``k``, cut to what the epoch has left), how many workers it has
(elastic rounds: the live task slots now), which examples it starts at, and
whether the epoch may end with it — and :class:`EpochState` owns where the
epoch stands after each round. The loop (:mod:`.loop`) only runs what it is
given.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Optional

from ...shared.data.example_order import steps_per_epoch
from ...shared.wire.aggregation import PartialResult, merge
from ..algorithms.schedules import FixedPeriod, PostLocalSGD, next_period

logger = logging.getLogger("sparkdl_avg")


@dataclass(frozen=True)
class PlannedRound:
    """One round as planned: what :meth:`~sparkdl_avg.driver.fit.rounds.RoundRunner.run` is asked to run.

    Attributes:
        epoch: The epoch's index.
        index: The round's index in its epoch.
        steps_before: Minibatches per worker the epoch trained before it.
        steps: Minibatches per worker it trains (its ``k``).
        workers: Its workers.
        start: Elastic rounds: the position in the epoch's example order it starts at; else ``None``.
        change: Elastic rounds: the membership change it brings (``Change``), or ``None``.
        epoch_may_end: Whether the epoch may end with it (a checkpoint may follow).
    """

    epoch: int
    index: int
    steps_before: int
    steps: int
    workers: int
    start: Optional[int]
    change: Any
    epoch_may_end: bool

    def progress_steps(self, num_workers: int) -> Optional[float]:
        """What the bar counts: a full-size round's minibatches; an elastic round of fewer workers moves it less."""
        return self.steps * self.workers / num_workers if self.start is not None else None


@dataclass
class EpochState:
    """Where an epoch stands: minibatches per worker and rounds so far, the elastic position, the sums and logs."""

    steps_before: int = 0
    rounds_done: int = 0
    position: int = 0  # elastic rounds: the examples of the epoch its rounds have taken (all workers)
    result: Optional[PartialResult] = None
    logs: Dict[str, float] = field(default_factory=dict)

    @classmethod
    def begin(cls, checkpoint, logs: Dict[str, float]) -> "EpochState":
        """An epoch's start: from ``checkpoint`` of this epoch when one is given, with the previous epoch's ``logs``."""
        state = cls(logs=logs)
        if checkpoint is not None:
            state.steps_before, state.rounds_done = checkpoint.steps_done, checkpoint.rounds_done
            state.position = checkpoint.meta.position
            if checkpoint.meta.epoch_examples:
                state.result = PartialResult(checkpoint.meta.epoch_examples,
                                             metric_sums=checkpoint.meta.epoch_metric_sums)
                state.logs = state.result.metric_means()
        return state

    def advance(self, planned: PlannedRound, result, batch_size: int) -> None:
        """Counts a round that ran: its minibatches, examples and sums."""
        self.steps_before += planned.steps
        self.position += planned.workers * planned.steps * batch_size
        self.rounds_done += 1
        self.result = merge(self.result, PartialResult(result.examples, metric_sums=result.metric_sums))
        self.logs = self.result.metric_means()


class RoundPlanner:
    """Plans the rounds of one fit's epochs (see the module's docstring).

    Args:
        ctx: The fit's :class:`~sparkdl_avg.driver.fit.loop.FitContext`: its round
            settings, schedule, minibatches per epoch and elastic membership.
    """

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.capped_warned = False  # the warning that k exceeds an epoch's minibatches, once per fit

    def rounds(self, epoch: int, state: EpochState) -> Iterator[PlannedRound]:
        """The epoch's rounds from ``state`` on, each planned after the previous one ran (``state`` advanced)."""
        while True:
            planned = self._next(epoch, state)
            if planned is None:
                return
            yield planned

    def _next(self, epoch: int, state: EpochState) -> Optional[PlannedRound]:
        ctx, s = self.ctx, self.ctx.rounds.settings
        membership, rnd = ctx.membership, state.rounds_done
        if membership is None:
            workers, change, start = s.num_workers, None, None
            left = ctx.epoch_steps - state.steps_before
        else:  # the next n·k·B positions of the epoch, for the n workers that have slots now
            workers, change = membership.plan(epoch, rnd)
            start = state.position
            left = (s.dataset.num_examples - state.position) // (workers * s.batch_size)
        if left <= 0:
            return None
        steps = self.steps(epoch, rnd, left, state.logs)
        if change is not None:
            membership.commit(change)
        if membership is None:
            epoch_may_end = state.steps_before + steps >= ctx.epoch_steps
        else:  # the next round's workers are not known yet: the most it may have
            epoch_may_end = (s.dataset.num_examples - state.position - workers * steps * s.batch_size
                             < membership.max_workers * s.batch_size)
        return PlannedRound(epoch, rnd, state.steps_before, steps, workers, start, change, epoch_may_end)

    def following(self, epoch: int, planned: PlannedRound, next_epoch: bool = False) -> Optional[PlannedRound]:
        """The round after ``planned``, if known before ``planned`` runs; else ``None``.

        Known for fixed workers (no elastic rounds) and a schedule that does
        not read the logs (a fixed ``k``, post-local SGD): what ``overlap_rounds``
        announces a round ahead. After an epoch's last round, the next
        epoch's first if ``next_epoch`` (there is one, and nothing but
        callbacks comes between). The runner checks it against what is asked next.
        """
        ctx = self.ctx
        if ctx.membership is not None or planned.start is not None \
                or not isinstance(ctx.schedule, (FixedPeriod, PostLocalSGD)):
            return None
        before, index = planned.steps_before + planned.steps, planned.index + 1
        if before >= ctx.epoch_steps:
            if not next_epoch:
                return None
            epoch, before, index = epoch + 1, 0, 0
        left = ctx.epoch_steps - before
        steps = next_period(ctx.schedule, epoch, index, {}, left)
        return PlannedRound(epoch, index, before, steps, planned.workers, None, None, before + steps >= ctx.epoch_steps)

    def steps(self, epoch: int, rnd: int, left: int, logs: Dict[str, float]) -> int:
        """Minibatches per worker of round ``rnd``: the schedule's ``k``, cut to the ``left`` the epoch has."""
        ctx = self.ctx
        k = next_period(ctx.schedule, epoch, rnd, logs, sys.maxsize)  # checked, not yet cut to the epoch
        if k > ctx.epoch_steps and not self.capped_warned:
            self.capped_warned = True
            s = ctx.rounds.settings
            logger.warning(
                "averaging_frequency=%d is more than the %d minibatches each worker trains per epoch (%d examples // "
                "(%d workers * batch_size %d)); rounds are cut to the epoch, so the effective averaging_frequency is "
                "%d (one round per epoch) and any larger value trains the same model.",
                k, ctx.epoch_steps, s.dataset.num_examples, s.num_workers, s.batch_size, ctx.epoch_steps,
            )
        return min(k, left)

    def replan_chunks(self, epoch: int, rnd: int):
        """Elastic stale/async epochs: the epoch's workers, planned at its start (its chunks keep them); the change."""
        ctx = self.ctx
        workers, change = ctx.membership.plan(epoch, rnd)
        if change is not None:
            ctx.membership.commit(change)
        s = ctx.rounds.settings
        epoch_steps = steps_per_epoch(s.dataset.num_examples, workers, s.batch_size)
        ctx.rounds.settings = dataclasses.replace(s, num_workers=workers, epoch_steps=epoch_steps)
        for kept in ctx.rounds.kept:
            kept.resize(workers)
        return change
