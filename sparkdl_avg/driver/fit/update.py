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

import itertools
from functools import partial
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ...shared.model.modelspec import RowUpdate, row_runs
from ...shared.wire.aggregation import PartialResult, specs_of
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
            driver. ``sums`` then holds the means.
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
    elif type(rule).apply is UpdateRule.apply:  # w ← w̄ in the weights' dtypes: slice by slice, into the sums
        new_weights = means_as(result.weight_sums, result.examples, sent, result.delta_sums, dtypes(weights))
    else:
        average = replica_means(result.weight_sums, result.examples, sent, result.delta_sums, in_place=True)
        new_weights = rule.apply(weights, sent, average, rule_state, trainable, learning_rate)
    if not average_optimizer:  # kept as they are in the model: only the counter is set
        new_opt: List = [None] * len(opt_vars)
    else:
        new_opt = means_as(result.optimizer_sums, result.examples, opt_vars, result.delta_sums, dtypes(opt_vars))
    counter = opt_vars[iterations]
    new_opt[iterations] = np.asarray(int(counter) + steps, dtype=counter.dtype)
    return new_weights, new_opt


#: Elements per slice of :func:`means_as`: its float64 temporaries are 8 MiB, not a table's size.
CHUNK = 1 << 20
#: A table's sums whose moved rows (:class:`~sparkdl_avg.shared.wire.sparse_rows.RowSums`) lie in at most this many
#: runs of consecutive rows are averaged and assigned by those rows alone (a TensorFlow op per run); more, and the
#: dense update, a slice of the whole table at a time, is the cheaper one.
MOVED_RUNS = 4096


def dtypes(arrays) -> List[np.dtype]:
    """The dtypes of ``arrays`` (a list, or a model's :class:`~sparkdl_avg.shared.model.modelspec.VariableArrays`)."""
    return [dtype for dtype, _ in specs_of(arrays)]


def means_as(sums: Sequence[np.ndarray], examples: int, base: Sequence[np.ndarray], delta_sums: bool,
             out_dtypes: Sequence[np.dtype]) -> List[np.ndarray]:
    """The replicas' means in ``out_dtypes``: :func:`replica_means` then a cast, without whole-array temporaries.

    The same bits as ``replica_means(..., in_place=True)`` cast with
    ``astype(dtype, copy=False)``: from delta sums each mean is
    ``float64(base) + Σ/n`` cast, here computed ``CHUNK`` elements at a time
    and written into the (float32) sums array it came from, where the whole
    expression made two float64 copies and a cast copy of each table: two
    model states more on the driver at the round's end. ``base`` is read one
    array at a time, and a model's ``VariableArrays`` one slice at a time
    (:meth:`~sparkdl_avg.shared.model.modelspec.VariableArrays.flat`): a round's
    update holds its sums and ``CHUNK`` elements more, not a table's copy.

    A table's sums that know the rows workers sent (:class:`~sparkdl_avg.shared.wire.sparse_rows.RowSums`, sums of
    deltas) give a :class:`~sparkdl_avg.shared.model.modelspec.RowUpdate` of those rows' means, where at most
    :data:`MOVED_RUNS` runs of rows moved: every other row's sum is ``+0.0``, and its mean is the base row itself (bit
    for bit, but for a ``-0.0`` in it, which ``base + 0.0`` would make ``+0.0``). The update then reads and writes
    those rows alone, and the sums' other pages are never touched.
    """
    out = []
    # A model's VariableArrays is read slice by slice (its flat()): no copy of a whole table beside the sums.
    reader = getattr(base, "flat", None) if delta_sums else None
    bases = iter(base) if delta_sums and reader is None else itertools.repeat(None)
    # Not zip(sums, bases, ...): zip keeps its last tuple, and with it the last base, while it reads the next one (a
    # model's variable read on access is a copy of the whole array: two tables where one is used).
    for j, (x, dtype) in enumerate(zip(sums, out_dtypes)):
        rows = getattr(x, "rows", None) if delta_sums else None
        if rows is not None and len(row_runs(rows)) > MOVED_RUNS:
            rows = None  # rows moved all over the table: its dense update, slice by slice
        b = partial(reader, j) if reader is not None else next(bases)
        if rows is None:
            out.append(_mean_as(x, examples, b, np.dtype(dtype)))
        else:  # a table of which workers sent a few rows: those rows' means alone (the same expression)
            moved = base.rows(j, rows) if reader is not None else np.asarray(b)[rows]
            out.append(RowUpdate(rows, (np.asarray(moved, np.float64) + np.asarray(x)[rows] / examples).astype(dtype)))
        del b
    return out


def _mean_as(x, examples: int, b, dtype: np.dtype):
    """One mean of :func:`means_as`; ``b``: the base array, ``None`` (plain sums), or ``read(lo, hi)`` of its flat
    elements."""
    if b is None:  # plain sums: divided in place as replica_means does, then cast (no copy when it is the dtype)
        mean = np.divide(x, examples, out=x) if _own(x) else x / examples
        return np.asarray(mean).astype(dtype, copy=False)
    read = b if callable(b) else None
    if _own(x) and x.dtype == dtype and x.flags.c_contiguous:
        flat = x.reshape(-1)
        base = None if read is not None else np.asarray(b).reshape(-1)
        for lo in range(0, flat.size, CHUNK):
            hi = min(lo + CHUNK, flat.size)
            part = np.asarray(read(lo, hi) if read is not None else base[lo:hi], np.float64) + flat[lo:hi] / examples
            flat[lo:hi] = part.astype(dtype)
        return x
    whole = read(0, int(np.size(x))).reshape(np.shape(x)) if read is not None else b
    return (np.asarray(whole, np.float64) + x / examples).astype(dtype, copy=False)
