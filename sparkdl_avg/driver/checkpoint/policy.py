"""When a fit writes checkpoints, which one it resumes from, and what restoring one sets.

This module owns the checkpoint *policy* of ``fit(checkpoint_dir=..., checkpoint_every=..., resume=...)``: refusing to
write over another run's checkpoints (:func:`find`), checking that a checkpoint belongs to this run and putting its
state back into the model, the update rule and the schedule (:func:`restore`), and saving after the rounds or epochs the
user asked for (:class:`Checkpointing`), keeping the newest earlier checkpoint that verifies too (:data:`KEEP`), so that
``resume=True`` can fall back to it when the latest does not read back (:func:`locate`), also after a resume that
skipped a damaged one (see :mod:`sparkdl_avg.driver.checkpoint.files`'s "Pruning"). The files themselves (format, atomic
writes) are :mod:`sparkdl_avg.driver.checkpoint.files`'s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence, Tuple

from ...errors import CheckpointError, ConfigurationError
from ...shared.wire.aggregation import PartialResult
from ...shared.model.modelspec import get_state, set_state, trainable_mask
from . import files as checkpoint
from ..algorithms.rules import RuleState
from ..algorithms.rules import UpdateRule
from ..algorithms.schedules import AveragingSchedule

logger = logging.getLogger("sparkdl_avg")

KEEP = 2  # checkpoints a fit keeps: the latest and the newest earlier one that verifies, to fall back to


def find(checkpoint_dir: Optional[str], resume: Any, listed: Optional[list] = None) -> Optional[str]:
    """The checkpoint to resume from, if any; refuses to write over another run's checkpoints.

    With ``resume=True`` that is the latest; :func:`locate` also checks that it reads back. ``listed``:
    ``checkpoint.candidates(checkpoint_dir)`` when the caller has them already (listing again would repeat its warnings
    about ``LATEST``).
    """
    if checkpoint_dir is None:
        return resume if isinstance(resume, str) else None
    if listed is None:
        listed = checkpoint.candidates(checkpoint_dir)
    found = listed[0] if listed else None
    if isinstance(resume, str):
        if found is not None and found.rstrip("/") != resume.rstrip("/"):
            raise ConfigurationError(
                f"The 'checkpoint_dir' {checkpoint_dir!r} holds other checkpoints (latest: {found}) than "
                f"resume={resume!r}; new checkpoints would replace them. Pass resume=True to continue "
                "from the latest, or give an empty or new checkpoint_dir."
            )
        return resume
    if found is not None and not resume:
        raise ConfigurationError(
            f"The 'checkpoint_dir' {checkpoint_dir!r} already holds checkpoints (latest: {found}). "
            "Pass resume=True to continue that run, or give an empty or new directory."
        )
    return found


def locate(checkpoint_dir: Optional[str], resume: Any) -> Tuple[Optional[str], Optional[checkpoint.Checkpoint]]:
    """The checkpoint to resume from and its contents, read and verified; ``(None, None)`` for none.

    As :func:`find`, but with ``resume=True`` the newest checkpoint in ``checkpoint_dir`` that reads back
    (:func:`checkpoint.load`): a damaged latest one is skipped with a warning naming it, for the previous one (a fit
    keeps :data:`KEEP`).

    Raises:
        CheckpointError: the checkpoint asked for (``resume=<path>``) is damaged, or, with ``resume=True``, none in the
            directory reads back.
        ConfigurationError: as :func:`find`.
    """
    listed = checkpoint.candidates(checkpoint_dir) if checkpoint_dir is not None else None
    uri = find(checkpoint_dir, resume, listed)
    if uri is None:
        if resume is True:  # a first run of a resumable job, or a mistyped directory: either way, say so
            logger.warning("resume=True found no checkpoint in %r: this fit starts from the beginning.",
                           checkpoint_dir)
        return None, None
    if resume is not True:
        try:
            return uri, checkpoint.load(uri)
        except CheckpointError as exc:
            if isinstance(resume, str):  # the user named it: say which parameter did
                raise CheckpointError(f"The 'resume' parameter {resume!r} is not a checkpoint to resume from: "
                                      f"{exc} (resume=True continues from the latest in checkpoint_dir)") from exc
            raise
    first: Optional[CheckpointError] = None
    for candidate in listed:
        try:
            saved = checkpoint.load(candidate)
        except CheckpointError as exc:
            logger.warning("Skipping the checkpoint %s: %s", candidate, exc)
            first = first or exc
            continue
        if first is not None:
            logger.warning("Resuming from %s, the newest checkpoint in %s that reads back.", candidate, checkpoint_dir)
        return candidate, saved
    if first is None:  # the latest vanished in between
        return uri, checkpoint.load(uri)
    raise CheckpointError(f"{first} No other checkpoint in {checkpoint_dir!r} reads back either.") from None


def restore(uri: str, model, run_settings: Dict[str, Any], seed: Optional[int], rule: UpdateRule,
            rule_state: RuleState, schedule: AveragingSchedule, initial_epoch: int = 0,
            saved: Optional[checkpoint.Checkpoint] = None) -> checkpoint.Checkpoint:
    """Loads the checkpoint at ``uri`` into ``model``, ``rule_state`` and ``schedule``.

    Args:
        saved: The checkpoint's contents if already read (:func:`locate`); else it is read from ``uri``.
        seed: The trainer's own ``seed`` option (``None``: not given; the checkpoint's seed is taken without comparing).
        initial_epoch: ``fit``'s; the checkpoint must not be of an earlier epoch.

    Raises:
        ConfigurationError: the checkpoint is of another run, model or trainable weights, or of an epoch before
            ``initial_epoch``; the model is not touched then.
    """
    saved = saved if saved is not None else checkpoint.load(uri)
    if saved.epoch < initial_epoch:
        raise ConfigurationError(
            f"The checkpoint at {uri!r} is at epoch {saved.epoch}, before initial_epoch={initial_epoch}: it "
            "does not hold the model this fit continues. Resume from a later checkpoint, or pass the "
            "initial_epoch of the fit that wrote it."
        )
    current = dict(run_settings)
    if seed is not None:
        current["seed"] = seed
    checkpoint.check_compatible(uri, {**saved.meta.run, "seed": saved.meta.seed}, current)
    shapes = [tuple(w.shape) for w in model.get_weights()]
    if [tuple(w.shape) for w in saved.weights] != shapes:
        raise ConfigurationError(f"The checkpoint at {uri!r} holds weights of other shapes than the model's.")
    set_state(model, saved.weights, saved.optimizer)
    expected = rule.init_state(model.get_weights(), trainable_mask(model))
    if {k: [tuple(a.shape) for a in v] for k, v in saved.rule_state.items()} != {
        k: [tuple(a.shape) for a in v] for k, v in expected.items()
    }:
        raise ConfigurationError(
            f"The checkpoint at {uri!r} holds update-rule state for other trainable weights than the "
            "model's (were layers frozen or unfrozen?)."
        )
    rule_state.restore(saved.rule_state, rule, model)
    schedule.set_state(saved.meta.schedule_state)
    logger.info("Resuming from %s (epoch %d, after %d rounds of it).", uri, saved.epoch + 1, saved.rounds_done)
    return saved


def warn_dropped_residuals(uri: str, saved: checkpoint.Checkpoint, compression: Optional[str], keeps: bool) -> int:
    """Warns when this fit drops the error-feedback residuals the checkpoint carries; returns how many.

    A checkpoint of an ``update_compression`` fit with error feedback holds each worker's residual (what its codec
    rounded off and its next delta adds back). A fit resumed with another ``update_compression``, or with error feedback
    off, starts those chains from zero: the weights lose one round's rounding at most, which is why this warns rather
    than refuses, and says how to keep them.

    Args:
        compression: This fit's ``update_compression``.
        keeps: Whether this fit keeps residuals (error feedback on for some segment).
    """
    from ..transport.local_states import LOCAL_TAG

    dropped = sorted(key for key in saved.feedback  # optimizer_state="local"'s own states are not residuals
                     if key.split("/")[0] != LOCAL_TAG and (not keeps or key.split("/")[0] != compression))
    if dropped:
        was = sorted({key.split("/")[0] for key in dropped})
        logger.warning(
            "Resuming from %s without its error-feedback residuals: it was written by a fit with "
            "update_compression=%s and this fit uses update_compression=%r%s, so the %d residual(s) (what the "
            "codec had rounded off and the next round would have added back) are dropped. Resume with "
            "update_compression=%s to keep them.",
            uri, " and ".join(repr(c) for c in was), compression, "" if keeps else " without error feedback",
            len(dropped), " or ".join(repr(c) for c in was),
        )
    return len(dropped)


@dataclass
class Checkpointing:
    """Saves one fit's checkpoints after every ``every`` rounds or after every epoch (and at its end).

    The new checkpoint (read back before ``LATEST`` names it) and the newest earlier one that verifies stay in
    ``directory`` (:data:`KEEP`); damaged ones newer than that are deleted with a warning.

    Args:
        directory: ``fit``'s ``checkpoint_dir``, or ``None``: never saves.
        every: ``"epoch"`` or a number of rounds (counted over the fit).
        model: The driver's model (the global state).
        rule_state: The update rule's state.
        schedule: The averaging schedule (its state is saved, e.g. AdaComm's).
        seed: The run's seed (data order).
        run_settings: What a resumed run must match (see :func:`checkpoint.check_compatible`).
        tracking: The fit's tracking state (``FitInfo.tracking``), saved as it is at each checkpoint.
        kept: What the fit's workers keep between rounds (error feedback's residuals, local optimizer states,
            overlapped rounds' own terms, fragments' own weights: :mod:`sparkdl_avg.driver.transport.chains`),
            each exported into every checkpoint under its own tag.
        membership: Elastic rounds' :class:`~sparkdl_avg.driver.elastic.membership.Membership`, whose history each
            checkpoint carries; ``None``: fixed workers.
    """

    directory: Optional[str]
    every: Any
    model: Any
    rule_state: RuleState
    schedule: AveragingSchedule
    seed: int
    run_settings: Dict[str, Any]
    tracking: Dict[str, Any] = field(default_factory=dict)
    kept: Sequence[Any] = ()
    membership: Any = None

    def may_save_after(self, rounds_in_fit: int, epoch_may_end: bool) -> bool:
        """Whether a checkpoint may be saved after the fit's ``rounds_in_fit``-th round.

        ``epoch_may_end``: the round may be its epoch's last (a checkpoint follows every epoch, or the last one). A
        callback's ``stop_training`` mid-epoch is not foreseen (see
        :meth:`~sparkdl_avg.driver.transport.local_states.LocalStateLedger.export`).
        """
        if self.directory is None:
            return False
        return epoch_may_end or (self.every != "epoch" and rounds_in_fit % self.every == 0)

    def after_round(self, rounds_in_fit: int, epoch: int, rounds_done: int, steps_done: int,
                    epoch_result: Optional[PartialResult], position: int = 0) -> None:
        """Saves the position inside ``epoch`` when ``every`` is a number of rounds and it is due.

        ``position``: elastic rounds' examples of the epoch taken so far (see :class:`checkpoint.RunMeta`).
        """
        if self.directory is not None and self.every != "epoch" and rounds_in_fit % self.every == 0:
            self._save(epoch, rounds_done, steps_done, epoch_result, position)

    def after_epoch(self, epoch: int, last: bool) -> None:
        """Saves the start of the next epoch after every epoch (``every="epoch"``) or after the last."""
        if self.directory is not None and (self.every == "epoch" or last):
            self._save(epoch + 1, 0, 0, None)

    def _save(self, epoch: int, rounds_done: int, steps_done: int, epoch_result: Optional[PartialResult],
              position: int = 0) -> None:
        from ..elastic.membership import history_json

        weights, opt_vars = get_state(self.model)
        checkpoint.save(
            self.directory,
            checkpoint.Checkpoint(
                epoch=epoch,
                rounds_done=rounds_done,
                steps_done=steps_done,
                weights=weights,
                optimizer=opt_vars,
                rule_state=self.rule_state.state or {},
                feedback={k: v for kept in self.kept for k, v in kept.export().items()},
                meta=checkpoint.RunMeta(
                    seed=self.seed,
                    run=self.run_settings,
                    schedule_state=self.schedule.get_state(),
                    epoch_examples=epoch_result.examples if epoch_result is not None else 0,
                    epoch_metric_sums=dict(epoch_result.metric_sums) if epoch_result is not None else {},
                    history={k: [float(x) for x in v] for k, v in self.model.history.history.items()},
                    tracking=dict(self.tracking),
                    position=position,
                    membership=history_json(self.membership.history) if self.membership is not None else [],
                ),
            ),
            keep=KEEP,
        )
