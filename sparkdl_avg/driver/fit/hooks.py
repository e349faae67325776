"""The fit loop's built-in behaviours, each a :class:`FitHook`: Keras callbacks, progress, checkpoints, elastic bookkeeping, ``"auto"``'s re-choice of its path from the link's measured rate, tracking observers and the slow and cold-start warnings.

The loop (:mod:`.loop`) says what happened — an epoch began, a round was done, an epoch ended — through
:class:`Hooks`, which calls every hook's method of that name in the hooks' order. A behaviour is one class here, not
lines woven into the loop. The events, in the order one epoch emits them:

``epoch_begin(epoch)``; per round ``batch_begin(index)``, ``round_done(planned, state, record)`` (bookkeeping:
checkpoints, elastic membership), ``round_reported(record, logs, steps)`` (progress), ``batch_end(index, logs)``
(Keras' batch hooks); ``epoch_trained(epoch)`` (after its rounds, before validation); ``epoch_end(epoch, logs,
rounds_run, resumed_after)``; ``epoch_saved(epoch, last)`` (after the callbacks had their say, so a callback's
``stop_training`` makes the checkpoint the fit's last). Around the epochs: ``fit_begin(info)``, ``train_begin()``,
``train_end(logs)`` and ``fit_end(info, error)``, the last also when the fit fails. Stale and asynchronous epochs emit
``round_reported`` per chunk and the batch events per block of chunks (:mod:`.stale_async`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Dict, List, Optional

from ..observe.costmodel import WARM_ROUNDS, communication_advice, is_cold, overlapping, round_split, slower_than_one_process
from ..transport.link_rate import LinkChoice

logger = logging.getLogger("sparkdl_avg")

COLD_START_NOTE_S = 0.5
"""The seconds of TensorFlow imports in one new executor Python worker from which a fit says what would remove them
(:class:`SlowFitWarnings`)."""

_cold_start_noted: set = set()  # the Spark applications (Engine.key) told already


class FitHook:
    """One behaviour of the fit loop; every event is a no-op until a subclass overrides it."""

    def fit_begin(self, info) -> None: ...
    def train_begin(self) -> None: ...
    def epoch_begin(self, epoch: int) -> None: ...
    def batch_begin(self, index: int) -> None: ...
    def round_done(self, planned, state, record) -> None: ...
    def round_reported(self, record, logs: Dict[str, float], steps: Optional[float]) -> None: ...
    def batch_end(self, index: int, logs: Dict[str, float]) -> None: ...
    def epoch_trained(self, epoch: int) -> None: ...
    def epoch_end(self, epoch: int, logs: Dict[str, float], rounds_run: int, resumed_after: int) -> None: ...
    def epoch_saved(self, epoch: int, last: bool) -> None: ...
    def train_end(self, logs: Dict[str, float]) -> None: ...
    def fit_end(self, info, error: Optional[BaseException]) -> None: ...


class Hooks:
    """The fit's hooks in order; ``hooks.<event>(...)`` calls that event on each of them."""

    def __init__(self, hooks: List[FitHook]) -> None:
        self.hooks = list(hooks)

    def __getattr__(self, event: str):
        if event.startswith("_") or not callable(getattr(FitHook, event, None)):
            raise AttributeError(event)

        def emit(*args) -> None:
            for hook in self.hooks:
                getattr(hook, event)(*args)

        return emit


class KerasCallbacks(FitHook):
    """The user's Keras callbacks (a ``CallbackList`` with the History): batch hooks once per round or block."""

    def __init__(self, callbacks) -> None:
        self.callbacks = callbacks

    def train_begin(self) -> None:
        self.callbacks.on_train_begin()

    def epoch_begin(self, epoch: int) -> None:
        self.callbacks.on_epoch_begin(epoch)

    def batch_begin(self, index: int) -> None:
        self.callbacks.on_train_batch_begin(index)

    def batch_end(self, index: int, logs: Dict[str, float]) -> None:
        self.callbacks.on_train_batch_end(index, logs)

    def epoch_end(self, epoch: int, logs: Dict[str, float], rounds_run: int, resumed_after: int) -> None:
        self.callbacks.on_epoch_end(epoch, logs)

    def train_end(self, logs: Dict[str, float]) -> None:
        self.callbacks.on_train_end(logs)


class ProgressReport(FitHook):
    """The bar and log lines (:class:`~sparkdl_avg.driver.observe.progress.Progress`), and the time summary at the end."""

    def __init__(self, progress, stats) -> None:
        self.progress = progress
        self.stats = stats

    def epoch_begin(self, epoch: int) -> None:
        self.progress.epoch_begin(epoch)

    def round_reported(self, record, logs: Dict[str, float], steps: Optional[float]) -> None:
        self.progress.round_end(record, logs, steps)

    def epoch_end(self, epoch: int, logs: Dict[str, float], rounds_run: int, resumed_after: int) -> None:
        self.progress.epoch_end(epoch, rounds_run, logs, resumed_after)

    def train_end(self, logs: Dict[str, float]) -> None:
        self.progress.train_end(self.stats.summary())

    def fit_end(self, info, error: Optional[BaseException]) -> None:
        self.progress.close()  # a failed epoch's bar, and its logging redirection


class CheckpointSaves(FitHook):
    """Checkpoints after the rounds or epochs asked for (:class:`~sparkdl_avg.driver.checkpoint.policy.Checkpointing`)."""

    def __init__(self, checkpoints, ctx) -> None:
        self.checkpoints = checkpoints
        self.ctx = ctx

    def round_done(self, planned, state, record) -> None:
        self.checkpoints.after_round(self.ctx.rounds_in_fit, planned.epoch, state.rounds_done, state.steps_before,
                                     state.result, state.position if planned.start is not None else 0)

    def epoch_saved(self, epoch: int, last: bool) -> None:
        self.checkpoints.after_epoch(epoch, last=last)


class ElasticBookkeeping(FitHook):
    """Elastic rounds: each round's record tells the membership what the round's workers did."""

    def __init__(self, membership) -> None:
        self.membership = membership

    def round_done(self, planned, state, record) -> None:
        self.membership.round_done(record)


class TransportChoice(FitHook):
    """``state_transport="auto"`` on hosts of their own: re-chooses the path between rounds from the link's measured rate.

    After each synchronous round, :class:`~sparkdl_avg.driver.transport.link_rate.LinkChoice` reads the rounds' records;
    when it decides to switch, the next round runs on a transport built by ``build(name, rate)`` (the trainer's, with
    the measured rate as ``network_rate``), the model's spec shipped through it, and one INFO line says what was
    measured and chosen. The transport it replaces is kept until the fit ends (``ctx.retired``: its files may hold the
    fit's other files), then closed. Never during a round: rounds are run one at a time and this runs between them.

    Args:
        ctx: The fit's :class:`~.loop.FitContext` (its transport and round runner are replaced).
        spec: The model's :class:`~sparkdl_avg.shared.model.modelspec.ModelSpec` (to ship through a new transport).
        build: ``(transport name, rate in bytes/s) -> StateTransport``.
        assumed: The rate the first choice assumed, in words (``"1 Gbit/s"``).
    """

    def __init__(self, ctx, spec, build: Callable[[str, float], Any], assumed: str) -> None:
        self.ctx = ctx
        self.spec = spec
        self.build = build
        self.assumed = assumed
        self.choice = LinkChoice(ctx.transport.name, lambda r: not is_cold(r))

    def round_done(self, planned, state, record) -> None:
        ctx = self.ctx
        switch = self.choice.consider(ctx.rounds.stats.records, ctx.rounds_in_fit)
        if switch is None:
            return
        old, new = ctx.transport, self.build(switch.transport, switch.rate)
        old.drop_ahead()  # a round announced ahead on the old path would otherwise run there unread
        ctx.retired.append(old)
        ctx.rounds.settings = dataclasses.replace(ctx.rounds.settings, spec=new.ship_spec(self.spec))
        ctx.rounds.transport = ctx.transport = new
        logger.info(switch.message(old.name, f"the fit's round {ctx.rounds_in_fit + 1}", self.assumed))


class TrackingObservers(FitHook):
    """Callbacks with ``on_fit_begin(info)``/``on_fit_end(info, error)`` (trackers such as ``MlflowLogger``)."""

    def __init__(self, observers: List[Any]) -> None:
        self.observers = observers

    def fit_begin(self, info) -> None:
        for cb in self.observers:
            cb.on_fit_begin(info)

    def fit_end(self, info, error: Optional[BaseException]) -> None:
        for cb in self.observers:
            cb.on_fit_end(info, error)


class SlowFitWarnings(FitHook):
    """``slow_warning``: says once what cold executors cost, and whether the fit is slower than one process.

    The cold-start note comes after the fit's first epoch (:func:`note_cold_start`); the slow warning decides after the
    first epoch that brings the fit's steady rounds (no replica build, no first trace:
    :func:`~sparkdl_avg.driver.observe.costmodel.is_cold`) to :data:`~sparkdl_avg.driver.observe.costmodel.WARM_ROUNDS`,
    or after the last epoch with what there is (no steady round: no warning).
    """

    def __init__(self, engine, stats, settings_of, start_epoch: int, last_epoch: int, slow: bool) -> None:
        self.engine = engine
        self.stats = stats
        self.settings_of = settings_of  # () -> the round settings now (elastic epochs change them)
        self.start_epoch = start_epoch
        self.last_epoch = last_epoch
        self.pending = slow

    def epoch_trained(self, epoch: int) -> None:
        if epoch == self.start_epoch:
            note_cold_start(self.engine, self.stats.records)
        if self.pending:
            self.pending = not self._warn_if_slow(last=epoch == self.last_epoch)

    def _warn_if_slow(self, last: bool) -> bool:
        records = self.stats.records  # this fit's
        if not last and sum(not is_cold(r) for r in records) < WARM_ROUNDS:
            return False
        settings = self.settings_of()
        # the workers that ran its latest round: an elastic fit's settings hold the most it may have (max_workers)
        message = slower_than_one_process(records, settings.dataset.num_examples, records[-1].num_workers,
                                          settings.batch_size)
        if message:
            logger.warning(message)
        else:  # not slower than one process, but rounds that wait on communication could still go faster
            split = round_split(records)
            advice = split and communication_advice(*split[:3], max_k=settings.epoch_steps,
                                                    overlapping=overlapping(records))
            if advice:
                logger.info("%s Silence this with slow_warning=False.", advice)
        return True


def note_cold_start(engine, records) -> None:
    """Says once per application what the fit's new Python workers spent importing TensorFlow, and what removes it.

    On a session without :data:`~sparkdl_avg.driver.runtime.session.RECOMMENDED_CONF` (a notebook attached to a cluster
    someone else configured) every new worker imports TensorFlow itself before its first task: seconds the first fit
    waits, measured by the workers (``WorkerRecord.import_s``). Workers forked from :mod:`sparkdl_avg.daemon` report 0.
    """
    seconds = [w.import_s for r in records for w in r.workers if w.import_s > 0]
    if not seconds or max(seconds) < COLD_START_NOTE_S or engine.key in _cold_start_noted:
        return
    _cold_start_noted.add(engine.key)
    logger.warning(
        "This fit waited about %.1f s for new executor Python workers to import TensorFlow (%d workers, %.1f s "
        "in all). Start the session with .config(map=sparkdl_avg.RECOMMENDED_CONF) (spark.python.daemon.module="
        "sparkdl_avg.daemon: workers are forked with TensorFlow imported; under Spark Connect, in the server's "
        "config) and call sparkdl_avg.warm_up(spark) right after it: README, \"Warm executors\". "
        "Silence this with slow_warning=False.",
        max(seconds), len(seconds), sum(seconds),
    )
