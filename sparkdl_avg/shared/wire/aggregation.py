"""Partial results of a round and their example-weighted sums.

Each worker returns a :class:`PartialResult` whose arrays are already multiplied by its number of examples;
``treeAggregate`` merges partials with :func:`merge`; the driver divides by the total examples with
:meth:`PartialResult.average`. float32 variables are summed in float32 and everything else (float64, integer counters)
in float64: float64 copies of float32 weights would double the bytes every round moves from the workers and through
the tree aggregation (docs/benchmarks/overhead.md), and the average is cast back to float32 anyway. float64 models
keep exact float64 sums, which the identity tests rely on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .stats import WorkerRecord


@dataclass
class PartialResult:
    """Example-weighted sums over one or more workers of a round.

    Attributes:
        examples: Examples trained on (the weight of each worker).
        weight_sums: ``Σ n_i · w_i`` per model weight (float32 for float32 weights, else float64).
        optimizer_sums: ``Σ n_i · s_i`` per optimizer variable, or ``None`` when optimizer state is not averaged.
        metric_sums: ``Σ n_b · value_b`` over minibatches ``b`` per logged metric (``loss`` and the compiled metrics).
        workers: One :class:`~sparkdl_avg.shared.wire.stats.WorkerRecord` per worker.
        received_bytes: Bytes of sums the driver received for this result (set by the transport that gathered it;
            ``None``: not known).
        state_bytes: Bytes of state the driver sent out for this round (set by the transport that published it: the
            whole state, or patches and any new base; ``None``: not known).
        driver_sum_s: The driver's seconds decoding and adding them.
        driver_sum_cpu_s: The CPU seconds of the driver's Python process in that time.
        reduce_s: In a sharded Spark SQL round, the slowest reducer task's seconds reading and
            summing its shard (decoding it, under ``update_compression``); 0 elsewhere.
        deltas: Under ``update_compression``, the workers' compressed deltas not yet summed, ``(worker, delta)`` (a
            :class:`~sparkdl_avg.shared.wire.delta_sums.Packed` from the worker, its bytes once its sink delivered it);
            ``merge`` keeps them all, so every path sums them in worker order
            (:func:`~sparkdl_avg.shared.wire.delta_sums.DeltaLayout.add`).
        delta_sums: ``weight_sums``/``optimizer_sums`` hold ``Σ n_i · (s_i − sent)``,
            the deltas from the state the round sent, not ``Σ n_i · s_i``.
    """

    examples: int
    weight_sums: Optional[List[np.ndarray]] = None
    optimizer_sums: Optional[List[np.ndarray]] = None
    metric_sums: Dict[str, float] = field(default_factory=dict)
    workers: List[WorkerRecord] = field(default_factory=list)
    received_bytes: Optional[int] = None
    state_bytes: Optional[int] = None
    driver_sum_s: float = 0.0
    driver_sum_cpu_s: float = 0.0
    reduce_s: float = 0.0
    deltas: Optional[List[Tuple[int, Any]]] = None
    delta_sums: bool = False

    def average(self, arrays: List[np.ndarray], like: List[np.ndarray]) -> List[np.ndarray]:
        """Divides sums by :attr:`examples`, cast to the dtypes of ``like``."""
        return [(s / self.examples).astype(ref.dtype, copy=False) for s, ref in zip(arrays, like)]

    def metric_means(self) -> Dict[str, float]:
        """Example-weighted mean of each logged metric."""
        return {k: v / self.examples for k, v in self.metric_sums.items()}


def _add(a: Optional[List[np.ndarray]], b: Optional[List[np.ndarray]]) -> Optional[List[np.ndarray]]:
    if a is None:
        return b
    if b is None:
        return a
    for x, y in zip(a, b):
        np.add(x, y, out=x)  # in place: partials are owned by the aggregation
    return a


def merge(a: Optional[PartialResult], b: Optional[PartialResult]) -> Optional[PartialResult]:
    """Combines two partial results (``treeAggregate``'s seqOp and combOp)."""
    if a is None:
        return b
    if b is None:
        return a
    # b's names first: the workers' order (loss, then the compiled metrics), which a result restored from a
    # checkpoint's JSON (sorted names) would otherwise impose on the epoch's logs
    metric_sums = {k: a.metric_sums.get(k, 0.0) + v for k, v in b.metric_sums.items()}
    metric_sums.update((k, v) for k, v in a.metric_sums.items() if k not in b.metric_sums)
    return PartialResult(
        examples=a.examples + b.examples,
        weight_sums=_add(a.weight_sums, b.weight_sums),
        optimizer_sums=_add(a.optimizer_sums, b.optimizer_sums),
        metric_sums=metric_sums,
        workers=a.workers + b.workers,
        deltas=None if a.deltas is None and b.deltas is None else (a.deltas or []) + (b.deltas or []),
        delta_sums=a.delta_sums or b.delta_sums,
    )


def weighted(arrays: List[np.ndarray], n: int) -> List[np.ndarray]:
    """``n · a`` for each array (a worker's contribution to a sum): float32 stays float32, else float64."""
    out = []
    for a in arrays:
        dtype = np.float32 if np.asarray(a).dtype == np.float32 else np.float64
        # np.array(...) then *= keeps 0-d arrays as arrays; `a * n` would give
        # numpy scalars, which the in-place sums of `merge` cannot update.
        w = np.array(a, dtype=dtype)
        w *= n
        out.append(w)
    return out


def weighted_in_place(arrays: List[np.ndarray], n: int) -> List[np.ndarray]:
    """:func:`weighted`, multiplying in place the arrays that are already writable sum dtypes (the same bits).

    For a worker's own fresh copies of its replica's state: scaling them in place instead of into new arrays saves one
    copy of the model's state on the executor. Other arrays (read-only views, counters of another dtype) are copied as
    :func:`weighted` does.
    """
    out = []
    for a in arrays:
        if isinstance(a, np.ndarray) and a.ndim and a.flags.writeable and a.dtype in (np.float32, np.float64):
            a *= n
            out.append(a)
        else:
            out.extend(weighted([a], n))
    return out


class WeightedArrays:
    """:func:`weighted_in_place` of a sequence of fresh arrays, each computed when read: a worker's sums, not held.

    Over a replica's :class:`~sparkdl_avg.shared.model.modelspec.VariableArrays` (each item a fresh copy, scaled in
    place: the same bits as :func:`weighted`). A sink that writes the sums one array at a time (a file,
    :class:`~sparkdl_avg.shared.wire.exchange.StoreSums`) then holds one array of them, not a copy of the model's
    state. :meth:`specs` gives the sums' dtypes and shapes without reading any.
    """

    def __init__(self, arrays, n: int) -> None:
        self.arrays, self.n = arrays, n

    def __len__(self) -> int:
        return len(self.arrays)

    def __getitem__(self, i: int) -> np.ndarray:
        return weighted_in_place([self.arrays[i]], self.n)[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def specs(self) -> List[Tuple[np.dtype, Tuple[int, ...]]]:
        return [(np.dtype(np.float32 if dtype == np.float32 else np.float64), shape)
                for dtype, shape in specs_of(self.arrays)]


def specs_of(arrays) -> List[Tuple[np.dtype, Tuple[int, ...]]]:
    """``(dtype, shape)`` of each array of ``arrays`` (``None``: none), without reading a lazy sequence's arrays.

    A sequence with a ``specs()`` method (:class:`~sparkdl_avg.shared.model.modelspec.VariableArrays`)
    answers it; other arrays are looked at one by one.
    """
    if arrays is None:
        return []
    specs = getattr(arrays, "specs", None)
    if specs is not None:
        return list(specs())
    return [(np.asarray(a).dtype, tuple(np.shape(a))) for a in arrays]


def nbytes_of(*parts) -> int:
    """The bytes of the arrays of ``parts`` (sequences of arrays, ``None``: none) from their specs (:func:`specs_of`)."""
    return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
               for part in parts for dtype, shape in specs_of(part))
