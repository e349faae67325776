"""Helpers that make executors misbehave on purpose, for the tests and benchmarks (not for training runs).

:class:`Straggler` makes one worker slower per minibatch, to measure and test
what the stale-synchronous and asynchronous modes (:mod:`sparkdl_avg.stale`)
do about a slow executor. Install it where the round runner looks up the
executor body each round::

    from sparkdl_avg import testing, worker
    monkeypatch.setattr(worker, "run_round_partition", testing.Straggler(slot=0, factor=3.0))
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from . import worker


@dataclass(frozen=True)
class Straggler:
    """A round entry point under which one worker takes ``factor`` times as long per minibatch.

    The slowed worker sleeps ``(factor - 1)`` times its measured compute
    after training, and the sleep counts as compute in its
    :class:`~sparkdl_avg.stats.WorkerRecord`, so the stats show it as a
    slower worker, not as overhead. Its results are those of the real entry.

    Args:
        slot: The slowed worker: the chunk's ``slot`` under
            ``synchronization="stale"``/``"async"``, the worker id in synchronous rounds.
        factor: Time per minibatch relative to the others (≥ 1). Default 3.
        entry: The real partition body. Default :func:`sparkdl_avg.worker.run_round_partition`.
    """

    slot: int = 0
    factor: float = 3.0
    entry: Callable[..., Iterator[Any]] = field(default=worker.run_round_partition)

    def __call__(self, task, workers: Iterable[int]) -> Iterator[Any]:
        ids = list(workers)
        who = task.slot if task.slot is not None else (ids[0] if len(ids) == 1 else None)
        if who != self.slot and not (task.slot is None and self.slot in ids):
            yield from self.entry(task, ids)
            return
        real = worker.train_round
        extra = self.factor - 1.0

        def slow(task, index):
            result = real(task, index)
            if task.slot is not None or index == self.slot:
                record = result.workers[0]
                pause = extra * record.compute_s
                time.sleep(pause)
                record.compute_s += pause
                record.end += pause
            return result

        worker.train_round = slow  # this Python worker runs one task at a time
        try:
            yield from self.entry(task, ids)
        finally:
            worker.train_round = real
