"""Helpers that make executors misbehave on purpose, for the tests and benchmarks (not for training runs).

:class:`Straggler` makes one worker slower per minibatch, to measure and test
what the stale-synchronous and asynchronous modes (:mod:`sparkdl_avg.driver.fit.stale_async`)
do about a slow executor. Install it where the round runner looks up the
executor body each round::

    from sparkdl_avg import testing
    from sparkdl_avg.executor import worker
    monkeypatch.setattr(worker, "run_round_partition", testing.Straggler(slot=0, factor=3.0))

:class:`Sleeper` makes every worker hold its task slot a fixed time per
minibatch without using the CPU, standing for compute on a host of its own
where many namespaced hosts share a machine's few cores (benchmarks/elastic.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from . import worker


@dataclass(frozen=True)
class Straggler:
    """A round entry point under which one worker takes ``factor`` times as long per chunk.

    The slowed worker sleeps ``(factor - 1)`` times what its task took (setup,
    loading, compute) before handing its result back, like a node that is
    that much slower (the records' ``compute_s`` do not include the sleep:
    it shows as the round's waiting). Its results are those of the real
    entry.

    Args:
        slot: The slowed worker: the chunk's ``slot`` under
            ``synchronization="stale"``/``"async"``, the worker id in synchronous rounds.
        factor: Time per chunk relative to the others (≥ 1). Default 3.
        entry: The real partition body. Default :func:`sparkdl_avg.executor.worker.run_round_partition`.
    """

    slot: int = 0
    factor: float = 3.0
    entry: Callable[..., Iterator[Any]] = field(default=worker.run_round_partition)

    def __call__(self, task, workers: Iterable[int]) -> Iterator[Any]:
        ids = list(workers)
        for index in ids:
            start = time.perf_counter()
            results = list(self.entry(task, [index]))
            if (task.slot if task.slot is not None else index) == self.slot:
                time.sleep((self.factor - 1.0) * (time.perf_counter() - start))
            yield from results


@dataclass(frozen=True)
class Sleeper:
    """A round entry point under which every worker sleeps ``seconds_per_minibatch`` for each minibatch it trains.

    The sleep comes before the real entry runs (so the records' ``compute_s``
    do not include it) and holds the task slot without the CPU: work that
    scales with the minibatches, as a host's own compute does, on hosts that
    share a few cores. Its results are those of the real entry.

    Args:
        seconds_per_minibatch: Seconds slept per minibatch of the round (``task.steps``), ≥ 0.
        entry: The real partition body. Default :func:`sparkdl_avg.executor.worker.run_round_partition`.
    """

    seconds_per_minibatch: float
    entry: Callable[..., Iterator[Any]] = field(default=worker.run_round_partition)

    def __call__(self, task, workers: Iterable[int]) -> Iterator[Any]:
        ids = list(workers)
        time.sleep(self.seconds_per_minibatch * task.steps * len(ids))
        yield from self.entry(task, ids)
