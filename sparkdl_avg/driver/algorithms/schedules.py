"""Averaging schedules: how many minibatches each round trains (``k``), round by round.

``averaging_frequency`` takes a fixed ``k`` (an int), or a schedule:

- :class:`PostLocalSGD` (Lin et al., ICLR 2020, arXiv 1808.07217): average
  after every minibatch (``k = 1``, i.e. synchronous SGD with batch
  ``N·B``) until ``switch_epoch``, then every ``period_after`` minibatches.
- :class:`AdaComm` (in the spirit of Wang & Joshi, SysML 2019, arXiv
  1810.08313): start with long periods and shorten them as the training loss
  falls, ``k_e = ⌈k₀·√(L_{e−1} / L₀)⌉`` at the start of epoch ``e``, where
  ``L₀`` is the first loss it sees and ``L_{e−1}`` the previous epoch's mean
  training loss; never longer than the previous period and never shorter
  than ``min_period``.
- any callable ``(epoch, round, logs) -> k``.

A schedule is asked before every round. ``logs`` is what the progress line
would show at that moment: ``{}`` before the first round of a fit, the
previous epoch's logs (with ``val_*`` entries if any) at round 0 of a later
epoch, else the running means of the current epoch. The last round of an
epoch is cut to the minibatches the epoch has left. Each round's ``k`` is
recorded in ``trainer.stats`` (``averaging_frequency``).
"""

from __future__ import annotations

import inspect
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

from ...errors import ConfigurationError


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_param(owner: str, name: str, value: Any, low: int) -> None:
    if not _is_int(value) or value < low:
        raise ConfigurationError(
            f"The '{name}' parameter of {owner} must be an int in the range [{low}, inf). "
            f"Got {value!r} instead."
        )


class AveragingSchedule:
    """Base class: :meth:`period` returns the ``k`` of the next round."""

    def period(self, epoch: int, round: int, logs: Dict[str, float]) -> int:  # noqa: A002
        raise NotImplementedError

    def describe(self) -> Dict[str, Any]:
        """Name and parameters, for reports and checkpoints."""
        return {"name": type(self).__name__}

    def get_state(self) -> Dict[str, Any]:
        """What a stateful schedule has learned (JSON-able), saved in checkpoints."""
        return {}

    def set_state(self, state: Dict[str, Any]) -> None:
        """Restores :meth:`get_state`'s result."""


@dataclass(frozen=True)
class FixedPeriod(AveragingSchedule):
    """The same ``k`` every round (what an int ``averaging_frequency`` means)."""

    k: int

    def __post_init__(self) -> None:
        _check_param("FixedPeriod", "k", self.k, 1)
        object.__setattr__(self, "k", int(self.k))

    def period(self, epoch, round, logs) -> int:  # noqa: A002
        return self.k

    def describe(self) -> Dict[str, Any]:
        return {"name": "fixed", "k": self.k}


@dataclass(frozen=True)
class PostLocalSGD(AveragingSchedule):
    """``k = 1`` before ``switch_epoch`` (0-based), ``period_after`` from then on.

    Args:
        switch_epoch: First epoch that averages every ``period_after`` minibatches.
        period_after: ``k`` from ``switch_epoch`` on (≥ 1).
    """

    switch_epoch: int
    period_after: int

    def __post_init__(self) -> None:
        _check_param("PostLocalSGD", "switch_epoch", self.switch_epoch, 0)
        _check_param("PostLocalSGD", "period_after", self.period_after, 1)
        object.__setattr__(self, "switch_epoch", int(self.switch_epoch))
        object.__setattr__(self, "period_after", int(self.period_after))

    def period(self, epoch, round, logs) -> int:  # noqa: A002
        return 1 if epoch < self.switch_epoch else self.period_after

    def describe(self) -> Dict[str, Any]:
        return {"name": "post_local_sgd", "switch_epoch": self.switch_epoch, "period_after": self.period_after}


@dataclass
class AdaComm(AveragingSchedule):
    """Long averaging periods first, shorter as the training loss falls.

    Stateful, like Keras' ``ReduceLROnPlateau``: it remembers the first loss
    it saw and its current period, so a second ``fit`` with the same object
    continues the adaptation. Make a new one for a new run.

    Args:
        initial_period: ``k₀``, the period while no loss is known (≥ 1).
        min_period: The shortest period it will choose (≥ 1). Default 1.
    """

    initial_period: int
    min_period: int = 1
    first_loss: Optional[float] = field(default=None, repr=False)
    current: Optional[int] = field(default=None, repr=False)
    _last_epoch: Optional[int] = field(default=None, repr=False)

    def __post_init__(self) -> None:
        _check_param("AdaComm", "initial_period", self.initial_period, 1)
        _check_param("AdaComm", "min_period", self.min_period, 1)
        self.initial_period, self.min_period = int(self.initial_period), int(self.min_period)
        if self.min_period > self.initial_period:
            raise ConfigurationError(
                "The 'min_period' parameter of AdaComm must be <= initial_period "
                f"({self.initial_period}). Got {self.min_period!r} instead."
            )

    def period(self, epoch, round, logs) -> int:  # noqa: A002
        loss = logs.get("loss")
        if self.current is None:
            self.current = self.initial_period
        if loss is not None and math.isfinite(loss) and loss > 0:
            if self.first_loss is None:
                self.first_loss = float(loss)
            elif round == 0 and epoch != self._last_epoch:
                wanted = math.ceil(self.initial_period * math.sqrt(loss / self.first_loss))
                self.current = max(self.min_period, min(self.current, wanted))
        self._last_epoch = epoch
        return self.current

    def describe(self) -> Dict[str, Any]:
        return {"name": "adacomm", "initial_period": self.initial_period, "min_period": self.min_period}

    def get_state(self) -> Dict[str, Any]:
        return {"first_loss": self.first_loss, "current": self.current, "last_epoch": self._last_epoch}

    def set_state(self, state: Dict[str, Any]) -> None:
        self.first_loss, self.current, self._last_epoch = state["first_loss"], state["current"], state["last_epoch"]


@dataclass(frozen=True)
class CallableSchedule(AveragingSchedule):
    """Wraps a user function ``(epoch, round, logs) -> k``."""

    fn: Callable[[int, int, Dict[str, float]], int]

    def period(self, epoch, round, logs) -> int:  # noqa: A002
        return self.fn(epoch, round, dict(logs))

    def describe(self) -> Dict[str, Any]:
        return {"name": "callable", "fn": getattr(self.fn, "__qualname__", repr(self.fn))}


def as_schedule(value: Any) -> AveragingSchedule:
    """The schedule for an ``averaging_frequency`` argument: an int ≥ 1, a schedule or a callable.

    Raises:
        ConfigurationError: anything else.
    """
    if _is_int(value) and value >= 1:
        return FixedPeriod(int(value))
    if isinstance(value, AveragingSchedule):
        return value
    if callable(value) and not isinstance(value, type):
        try:
            signature = inspect.signature(value)
        except (TypeError, ValueError):  # a builtin without one: asked as it is
            return CallableSchedule(value)
        try:
            signature.bind(0, 0, {})
        except TypeError:
            name = getattr(value, "__qualname__", repr(value))
            raise ConfigurationError(
                f"The 'averaging_frequency' function {name}{signature} must take three arguments, (epoch, round, "
                "logs), and return the round's k: it is asked before every round.") from None
        return CallableSchedule(value)
    raise ConfigurationError(
        "The 'averaging_frequency' parameter must be an int in the range [1, inf), an "
        "AveragingSchedule (PostLocalSGD, AdaComm) or a callable (epoch, round, logs) -> int. "
        f"Got {value!r} instead."
    )


def next_period(schedule: AveragingSchedule, epoch: int, round: int, logs: Dict[str, float], left: int) -> int:  # noqa: A002
    """Asks ``schedule`` for the next round's ``k``, checks it, and cuts it to ``left`` minibatches.

    Raises:
        ConfigurationError: the schedule returned something other than an int ≥ 1.
    """
    k = schedule.period(epoch, round, logs)
    if not _is_int(k) or k < 1:
        raise ConfigurationError(
            f"The averaging schedule {schedule!r} must return an int >= 1; for epoch {epoch}, "
            f"round {round} it returned {k!r}."
        )
    return min(int(k), left)
