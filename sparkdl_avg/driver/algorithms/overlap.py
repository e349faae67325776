"""``overlap_rounds``' driver arithmetic: plain averaging applied one round late (eager updates).

Eager updates (Kale et al. 2025, arXiv 2502.12996) in this library's terms:
worker ``i`` of round ``t`` starts from ``x_i = G + e_i`` — the global
weights plus its own eager term ``e_i = δ_i^{t-1}/N``, its delta of the
round before standing in for its share of that round's average — and
returns ``y_i − e_i`` (:mod:`sparkdl_avg.executor.overlap`). The replicas'
mean of those is ``G + Δ̄_t``, exactly what an ordinary round's sums give,
so the driver reads ``Δ̄_t = average − sent`` as usual; :class:`OneRoundLate`
keeps it *pending* and applies the pending ``Δ̄_{t-1}`` instead:
``G ← G + Δ̄_{t-1}``. Each delta thus reaches ``G`` once, through the
average, and a round's start needs nothing of the round before it but the
worker's own delta. ``N = 1`` is sequential training.

The pending average is the rule's state (``"overlap_pending"``, one array
per weight in its dtype), so a checkpoint carries it and a resumed fit
continues bitwise; the fit's end applies it (:func:`flush`). Only plain
averaging is wrapped (the options refuse the outer rules with
``overlap_rounds``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

import numpy as np

from .rules import State, UpdateRule

PENDING = "overlap_pending"
"""The rule state's key of the average applied one round late."""


@dataclass(frozen=True)
class OneRoundLate(UpdateRule):
    """Plain averaging whose round-``t`` average is applied at round ``t + 1``'s end (``overlap_rounds=True``)."""

    base: UpdateRule = None  # the wrapped rule: plain averaging

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.base.name

    def resolve(self, num_workers: int, sparse_delta: bool = False) -> "OneRoundLate":
        return OneRoundLate(self.base.resolve(num_workers, sparse_delta))

    def init_state(self, weights: Sequence[np.ndarray], trainable: Sequence[bool]) -> State:
        """The base rule's state and a zero pending average (a zero is as good as none: nothing to apply)."""
        state = dict(self.base.init_state(weights, trainable))
        state[PENDING] = [np.zeros(np.shape(w), np.asarray(w).dtype) for w in weights]
        return state

    def apply(self, weights: Sequence[np.ndarray], sent: Sequence[np.ndarray], average: Sequence[np.ndarray],
              state: State, trainable: Sequence[bool], learning_rate: float) -> List[np.ndarray]:
        """``G + Δ̄_{t-1}`` (the pending average), keeping ``Δ̄_t = average − sent`` pending in ``state``.

        Weights that are not floating point (counters) take the average at once: they have no delta.
        """
        pending = state[PENDING]
        new, later = [], []
        for w, s, a, p in zip(weights, sent, average, pending):
            w = np.asarray(w)
            if w.dtype.kind != "f":
                new.append(np.asarray(a).astype(w.dtype, copy=False))
                later.append(np.zeros_like(w))
                continue
            new.append(_late(w, p))
            later.append((np.asarray(a, np.float64) - np.asarray(s, np.float64)).astype(w.dtype))
        state[PENDING] = later
        return new

    def describe(self) -> Dict[str, Any]:
        return {**self.base.describe(), "overlap_rounds": True}


def _late(w: np.ndarray, pending: np.ndarray) -> np.ndarray:
    """``G + Δ̄_{t-1}`` of one floating-point weight: the one formula of :meth:`OneRoundLate.apply` and :func:`preview`."""
    return (w + pending).astype(w.dtype, copy=False)


def preview(weights: Sequence[np.ndarray], state: State) -> "List[np.ndarray] | None":
    """The weights :meth:`OneRoundLate.apply` will give at the end of the round that starts from ``weights``.

    They need only the pending average, known at the round's start: the
    state the round after it starts from, announced while this one trains.
    ``None`` where a weight is not floating point (it takes the round's own
    average) or nothing is pending.
    """
    pending = state.get(PENDING)
    if pending is None or any(np.asarray(w).dtype.kind != "f" for w in weights):
        return None
    return [_late(np.asarray(w), p) for w, p in zip(weights, pending)]


def flush(weights: Sequence[np.ndarray], state: State) -> List[np.ndarray]:
    """``weights`` with the pending average applied; zeroes it in ``state`` (the fit's end: nothing in flight)."""
    pending = state.get(PENDING)
    if pending is None:
        return list(weights)
    out = [(np.asarray(w) + p).astype(np.asarray(w).dtype, copy=False) for w, p in zip(weights, pending)]
    state[PENDING] = [np.zeros_like(p) for p in pending]
    return out
