"""One fit's epochs on the driver: :func:`start` builds what they share, :class:`FitLoop` runs them.

The loop is short on purpose: for each epoch it asks the planner (:class:`~.planner.RoundPlanner`) for the next round,
runs it (:class:`~.rounds.RoundRunner`) and tells the hooks (:mod:`.hooks`) what happened; stale and asynchronous epochs
run as chunks (:mod:`.stale_async`) with the same hooks. Validation after each epoch and closing the transport however
the fit ends are the loop's own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ...shared.files.fs import join
from ..algorithms.schedules import AveragingSchedule, FixedPeriod
from ..checkpoint import policy as resume_mod
from ..elastic.membership import Change, Membership, slot_source
from ..observe.progress import Progress
from ..transport import feedback, local_states  # noqa: F401 (kinds of kept state: registered as they load)
from ..transport.chains import KEPT, KeptFit
from . import fragments  # noqa: F401 (a kind of kept state)
from . import hooks as fit_hooks
from .plan import FitInfo, FitPlan
from .overlap import apply_pending
from .planner import EpochState, RoundPlanner
from .rounds import RoundRunner, RoundSettings
from .stale_async import EpochHooks, StaleRunner

logger = logging.getLogger("sparkdl_avg")


@dataclass
class FitContext:
    """What the epochs of one ``fit`` share."""

    rounds: RoundRunner
    transport: Any  # the fit's StateTransport (also the round runner's)
    group: str  # the fit's Spark job group
    labels: Any  # the fit's job labels, a context manager (Engine.labels)
    epochs: int
    schedule: AveragingSchedule
    callbacks: Any
    progress: Progress
    checkpoints: resume_mod.Checkpointing
    stale: Optional[StaleRunner] = None  # synchronization="stale"/"async": the epochs run as chunks
    membership: Optional[Membership] = None  # elastic rounds: each round's workers, planned for the live slots
    rounds_in_fit: int = 0
    retired: List[Any] = field(default_factory=list)  # transports "auto" switched away from, closed at the fit's end

    @property
    def epoch_steps(self) -> int:
        """Minibatches per worker in an epoch (its rounds' settings': elastic epochs re-plan them)."""
        return self.rounds.settings.epoch_steps


def callback_list(model, plan: FitPlan, callbacks):
    """The fit's ``keras.callbacks.CallbackList``, with a History (``trainer.history``) and no progress bar."""
    import keras

    return keras.callbacks.CallbackList(
        callbacks,
        add_history=True,
        add_progbar=False,
        model=model,
        verbose=plan.verbose,
        epochs=plan.epochs,
        # Batch hooks run once per round; rounds per epoch are known for a fixed k only.
        steps=-(-plan.epoch_steps // plan.schedule.k) if isinstance(plan.schedule, FixedPeriod) else None,
    )


def start(config, model, plan: FitPlan, callbacks, *, stats, transport, rule_state, seed: int, exchange: str,
          group: str, labels) -> FitContext:
    """What the fit's epochs share: the round runner on ``transport``, ledgers, membership, checkpoints, progress.

    Args:
        exchange: The fit's directory under the staging root, beside the transport's files.
        group, labels: The fit's Spark job group and its labels (``Engine.labels``).
    """
    membership = _membership(config, plan)
    # what workers keep between rounds: each kind that applies (transport/chains.py), beside the transport's files
    fit = KeptFit(config, model, plan, transport, exchange)
    kept = [k for k in (kind.for_fit(fit) for kind in KEPT.entries()) if k is not None]
    settings = RoundSettings(
        spec=transport.ship_spec(plan.spec),
        fingerprint=plan.spec.fingerprint,
        dataset=plan.train,
        num_workers=plan.num_workers,
        batch_size=config.batch_size,
        seed=seed,
        shuffle=plan.shuffle,
        average_optimizer=config.optimizer_state == "average",
        on_nonfinite=config.on_nonfinite,
        epochs=plan.epochs,
        epoch_steps=plan.epoch_steps,
        compression=config.update_compression,
        overlap=config.overlap_rounds,
    )
    rounds = RoundRunner(plan.engine, model, settings, plan.rule, rule_state, transport, stats, kept)
    if plan.restored is not None:  # each kind takes its own entries (by their tag) from the checkpoint's
        for kept in rounds.kept:
            kept.restore(plan.restored.feedback)
    stale = None
    if config.synchronization != "sync":  # the epochs run as chunks
        stale = StaleRunner(rounds, config.staleness if config.synchronization == "stale" else None,
                            config.staleness_aware, group, reproducible=config.reproducible)
    return FitContext(
        rounds=rounds,
        transport=transport,
        group=group,
        labels=labels,
        epochs=plan.epochs,
        schedule=plan.schedule,
        callbacks=callbacks,
        progress=Progress(plan.verbose, plan.epochs, plan.epoch_steps),
        checkpoints=resume_mod.Checkpointing(
            plan.checkpoint_dir, plan.checkpoint_every, model, rule_state, plan.schedule, seed,
            plan.run_settings, tracking=dict(plan.restored.meta.tracking) if plan.restored is not None else {},
            kept=rounds.kept, membership=membership,
        ),
        stale=stale,
        membership=membership,
    )


def _membership(config, plan: FitPlan) -> Optional[Membership]:
    """Elastic rounds: what plans each round's workers, with a resumed checkpoint's history; else ``None``."""
    if not config.elastic:
        return None
    most = min(plan.num_workers, plan.train.num_examples // config.batch_size)  # a round needs a minibatch each
    history = [Change.from_json(c) for c in plan.restored.meta.membership] if plan.restored is not None else []
    return Membership(slot_source(plan.engine, most), config.min_workers or 1, most, config.elastic_timeout_s,
                      history=history, resumed=plan.restored is not None,
                      checkpointed=plan.checkpoint_dir is not None)


class FitLoop:
    """Runs one fit's epochs from ``fit_begin`` to ``fit_end``.

    Args:
        model: The Keras model holding the global weights (its ``stop_training`` and ``history`` are read).
        plan: The fit's :class:`~.plan.FitPlan`.
        ctx: What its epochs share (:func:`start`).
        observers: Callbacks that observe the fit (``on_fit_begin``/``on_fit_end``).
        evaluate: ``(staged data) -> logs``: the validation data's metrics on the model's weights now.
        slow_warning: The ``slow_warning`` option: say what a cold start cost and whether the fit is slow.
        retransport: Where ``state_transport="auto"`` learns the link's rate
            (:func:`~sparkdl_avg.driver.transport.link_rate.learns`), ``(name, rate) -> StateTransport`` and the rate
            the first choice assumed, in words (:class:`~.hooks.TransportChoice`); else ``None``.
    """

    def __init__(self, model, plan: FitPlan, ctx: FitContext, observers: List[Any], evaluate,
                 slow_warning: bool, retransport=None) -> None:
        self.model, self.plan, self.ctx, self.evaluate = model, plan, ctx, evaluate
        self.planner = RoundPlanner(ctx)
        stats = ctx.rounds.stats
        built_in: List[fit_hooks.FitHook] = [fit_hooks.TrackingObservers(observers),
                                             fit_hooks.CheckpointSaves(ctx.checkpoints, ctx)]
        if ctx.membership is not None:
            built_in.append(fit_hooks.ElasticBookkeeping(ctx.membership))
        if retransport is not None and ctx.stale is None:
            built_in.append(fit_hooks.TransportChoice(ctx, plan.spec, *retransport))
        built_in += [fit_hooks.ProgressReport(ctx.progress, stats), fit_hooks.KerasCallbacks(ctx.callbacks)]
        if slow_warning:
            built_in.append(fit_hooks.SlowFitWarnings(plan.engine, stats, lambda: ctx.rounds.settings,
                                                      plan.start_epoch, plan.epochs - 1, slow=ctx.stale is None))
        self.hooks = fit_hooks.Hooks(built_in)

    def run(self, info: FitInfo, on_trained) -> None:
        """The fit; ``on_trained()`` runs after the last epoch, before ``fit_end`` (the trainer keeps the History)."""
        ctx, hooks = self.ctx, self.hooks
        error: Optional[BaseException] = None
        try:
            hooks.fit_begin(info)
            hooks.train_begin()
            logs = self._resume_history()
            for epoch in range(self.plan.start_epoch, self.plan.epochs):
                logs = self._epoch(epoch, logs)
                if self.model.stop_training:
                    break
            if ctx.rounds.settings.overlap:  # the last round's average, pending until now
                apply_pending(self.model, ctx.rounds.rule_state)
            hooks.train_end(logs)
            on_trained()
        except BaseException as exc:
            error = exc
            raise
        finally:
            for transport in [ctx.transport] + ctx.retired:
                transport.close()
            for kept in ctx.rounds.kept:  # the fit's shared files go, and so its hosts' files may be swept
                kept.close()
            hooks.fit_end(info, error)

    def _epoch(self, epoch: int, logs: Dict[str, float]) -> Dict[str, float]:
        """One epoch: its rounds (or chunks), validation, and the hooks around them; returns its logs."""
        plan, hooks = self.plan, self.hooks
        hooks.epoch_begin(epoch)
        begin = plan.restored if plan.restored is not None and epoch == plan.restored.epoch else None
        state = EpochState.begin(begin, logs)
        if self.ctx.stale is not None:
            logs, rounds_done = self._chunks(epoch, state)
        else:
            logs, rounds_done = self._rounds(epoch, state)
        hooks.epoch_trained(epoch)
        if plan.val is not None:
            logs = {**logs, **{f"val_{k}": v for k, v in self.evaluate(plan.val).items()}}
        resumed_after = begin.rounds_done if begin is not None else 0
        hooks.epoch_end(epoch, logs, rounds_done - resumed_after, resumed_after)
        hooks.epoch_saved(epoch, epoch == plan.epochs - 1 or self.model.stop_training)
        return logs

    def _rounds(self, epoch: int, state: EpochState):
        """A synchronous epoch: the planner's rounds, each run and reported; returns its logs and rounds run."""
        ctx, hooks, runner = self.ctx, self.hooks, self.ctx.rounds
        for planned in self.planner.rounds(epoch, state):
            hooks.batch_begin(planned.index)
            ahead = None
            if runner.pipelines():  # overlap_rounds: the next round is announced before this one's sums are read
                # over an epoch's end too, unless a validation (its own job) comes between
                following = self.planner.following(epoch, planned, epoch + 1 < self.plan.epochs and self.plan.val is None)
                if following is not None:
                    ahead = (following.epoch, following.index, following.steps_before, following.steps,
                             ctx.checkpoints.may_save_after(ctx.rounds_in_fit + 2, following.epoch_may_end))
            result = runner.run(epoch, planned.index, planned.steps_before, planned.steps, planned.workers,
                                planned.start, planned.change.to_json() if planned.change is not None else None,
                                share=ctx.checkpoints.may_save_after(ctx.rounds_in_fit + 1, planned.epoch_may_end),
                                ahead=ahead)
            state.advance(planned, result, runner.settings.batch_size)
            ctx.rounds_in_fit += 1
            record = runner.stats.records[-1]
            hooks.round_done(planned, state, record)
            hooks.round_reported(record, state.logs, planned.progress_steps(runner.settings.num_workers))
            hooks.batch_end(planned.index, state.logs)
            if self.model.stop_training:
                break
        return state.logs, state.rounds_done

    def _chunks(self, epoch: int, state: EpochState):
        """A stale or asynchronous epoch (:mod:`.stale_async`); returns its logs and rounds run."""
        ctx, hooks, stats = self.ctx, self.hooks, self.ctx.rounds.stats
        first = len(stats.records)
        change = self.planner.replan_chunks(epoch, state.rounds_done) if ctx.membership is not None else None

        def block_end(block: int, logs: Dict[str, float]) -> bool:
            ctx.rounds_in_fit += 1
            hooks.batch_end(block, logs)
            return bool(self.model.stop_training)

        epoch_hooks = EpochHooks(
            next_steps=lambda rnd, steps_before, logs: self.planner.steps(epoch, rnd, ctx.epoch_steps - steps_before,
                                                                          logs),
            chunk_end=hooks.round_reported,
            block_begin=hooks.batch_begin,
            block_end=block_end,
        )
        done = ctx.stale.run_epoch(epoch, state.logs, state.rounds_done, state.steps_before, state.result,
                                   epoch_hooks)
        if change is not None and len(stats.records) > first:
            stats.records[first].membership = change.to_json()
        return done

    def _resume_history(self) -> Dict[str, float]:
        """Puts the resumed checkpoint's epochs in the History; returns the latest one's logs (``{}``: none)."""
        plan = self.plan
        restored = plan.restored
        if restored is None:
            return {}
        start_epoch = restored.epoch
        history = restored.meta.history
        # the checkpointed fit's epochs from initial_epoch on (those of this command)
        first = start_epoch - max((len(v) for v in history.values()), default=0)
        drop = max(0, plan.initial_epoch - first)
        self.model.history.history = {k: list(v)[drop:] for k, v in history.items()}
        self.model.history.epoch = list(range(first + drop, start_epoch))
        logs = {k: v[-1] for k, v in history.items() if v}
        if start_epoch >= plan.epochs:
            logger.warning(
                "The checkpoint %s is at epoch %d; fit(epochs=%d) has nothing left to train.",
                plan.resumed_from, start_epoch, plan.epochs,
            )
        return logs
