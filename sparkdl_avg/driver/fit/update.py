"""The update math on the driver: from a round's or a chunk's sums to the replicas' means, and a round's new state.

This module owns the arithmetic that synchronous rounds
(:meth:`~sparkdl_avg.driver.fit.rounds.RoundRunner.update`) and stale or
asynchronous chunks (:class:`~sparkdl_avg.driver.fit.stale_async.StaleUpdater`)
share: :func:`replica_means` reads the sums of a
:class:`~sparkdl_avg.shared.wire.aggregation.PartialResult` (plain
``Σ n_i·s_i``, or ``Σ n_i·(s_i − base)`` with ``delta_sums``) as the replicas'
example-weighted means, absolute or as a move from the state they started
at; :func:`round_state` is a synchronous round's new weights (the update
rule on the means) and optimizer variables. Both paths call the update rule
the same way (:class:`~sparkdl_avg.driver.algorithms.rules.UpdateRule`'s
contract). Pure numpy: no Spark, no model.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from ...shared.wire.aggregation import PartialResult
from ..algorithms.rules import State, UpdateRule


def replica_means(sums: Sequence[np.ndarray], examples: int, base: Sequence[np.ndarray], delta_sums: bool,
                  move: bool = False, in_place: bool = False) -> List[np.ndarray]:
    """The replicas' example-weighted means of one list of arrays, from their sums.

    Args:
        sums: ``Σ n_i·s_i`` per array, or ``Σ n_i·(s_i − base)`` where ``delta_sums``.
        examples: ``Σ n_i``.
        base: What the replicas started from (the sent weights, the optimizer's variables).
        move: Return the means' move from ``base`` (``s̄ − base``, float64), as
            an asynchronous update adds it, instead of the means ``s̄``
            themselves (float64 from delta sums, else in the sums' dtype:
            float32 sums of float32 weights stay float32).
        in_place: Divide writable ``sums`` in place (the same bits as a new
            array) instead of into new arrays: a round's sums are not read
            after its update, and a copy of the model's state less on the
            driver (issue 47). ``sums`` then holds the means.
    """
    if move:
        out = []
        for total, b in zip(sums, base):
            mean = np.asarray(total, np.float64) / examples
            out.append(mean if delta_sums else mean - b)
        return out
    if delta_sums:
        return [np.asarray(b, np.float64) + x / examples for b, x in zip(base, sums)]
    if in_place:
        return [np.divide(x, examples, out=x) if _own(x) else x / examples for x in sums]
    return [x / examples for x in sums]


def _own(x) -> bool:
    """Whether ``x`` is a writable float array (not a 0-d one: ``x / n`` of those gives a scalar, kept so)."""
    return isinstance(x, np.ndarray) and x.ndim > 0 and x.flags.writeable and x.dtype.kind == "f"


def round_state(result: PartialResult, weights: Sequence[np.ndarray], sent: Sequence[np.ndarray],
                opt_vars: Sequence[np.ndarray], rule: UpdateRule, rule_state: State, trainable: Sequence[bool],
                learning_rate: float, average_optimizer: bool, iterations: int,
                steps: int, synced: Optional[Sequence[int]] = None) -> Tuple[List[np.ndarray], List[np.ndarray]]:
    """A synchronous round's new ``(weights, optimizer variables)`` from its sums; updates ``rule_state`` in place.

    ``weights``/``opt_vars``: the state the round started from; ``sent``: what
    the workers started from (:meth:`UpdateRule.to_send`); the update rule
    steps from the replicas' means; the optimizer's variables are averaged
    (``average_optimizer``) or kept, and its iteration counter (at
    ``iterations`` among them) advances by ``steps``. ``synced``: a fragment round's variables
    (:mod:`~sparkdl_avg.driver.fit.fragments`): the sums are of those alone, the rule steps them with its
    state sliced to them, and the other weights stay.
    """
    if synced is not None:
        from .fragments import rule_slice

        pick = lambda arrays: [arrays[j] for j in synced]  # noqa: E731
        average = replica_means(result.weight_sums, result.examples, pick(sent), result.delta_sums, in_place=True)
        sub, write_back = rule_slice(rule_state, trainable, synced)
        stepped = rule.apply(pick(weights), pick(sent), average, sub, pick(trainable), learning_rate)
        write_back(sub)
        new_weights = list(weights)
        for j, value in zip(synced, stepped):
            new_weights[j] = value
    else:
        average = replica_means(result.weight_sums, result.examples, sent, result.delta_sums, in_place=True)
        new_weights = rule.apply(weights, sent, average, rule_state, trainable, learning_rate)
    if not average_optimizer:
        new_opt = list(opt_vars)
    else:
        means = replica_means(result.optimizer_sums, result.examples, opt_vars, result.delta_sums, in_place=True)
        new_opt = [m.astype(np.asarray(v).dtype, copy=False) for m, v in zip(means, opt_vars)]
    new_opt[iterations] = np.asarray(int(opt_vars[iterations]) + steps, dtype=opt_vars[iterations].dtype)
    return new_weights, new_opt
