"""Executors that misbehave on purpose, for tests and benchmarks (not for training runs): the round-entry seam.

A fit's rounds run ``entry(task, workers)`` on the executors, :func:`sparkdl_avg.executor.worker.run_round_partition`
unless a :class:`RoundEntry` is installed: inside ``with RoundEntry(entry):`` every round this process starts runs
``entry`` instead (looked up per round by the driver, :func:`round_entry`). ``entry`` may wrap the real one to fail a
task's first attempt, slow a worker or record what it trained::

    from sparkdl_avg import testing

    with testing.Straggler(slot=0, factor=3.0):  # Straggler and Sleeper are RoundEntry's
        trainer.fit(data)

:class:`Straggler` makes one worker slower per minibatch, to measure and test what the stale-synchronous and
asynchronous modes (:mod:`sparkdl_avg.driver.fit.stale_async`) do about a slow executor. :class:`Sleeper` makes every
worker hold its task slot a fixed time per minibatch without using the CPU, standing for compute on a host of its own
where many namespaced hosts share a machine's few cores (benchmarks/elastic.py).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, List

from . import worker

_installed: List[Callable[..., Iterator[Any]]] = []  # the installed entries, innermost last (this process)
_by_value: Counter = Counter()  # modules pickled by value for the installed entries, by how many


def round_entry() -> Callable[..., Iterator[Any]]:
    """The executors' round body for a round the driver starts now: the innermost installed :class:`RoundEntry`'s
    ``entry``, else :func:`sparkdl_avg.executor.worker.run_round_partition`."""
    return _installed[-1] if _installed else worker.run_round_partition


class RoundEntry:
    """Inside ``with RoundEntry(entry):``, the rounds this process starts run ``entry(task, workers)`` on the
    executors instead of :func:`~sparkdl_avg.executor.worker.run_round_partition` (which ``entry`` may call).

    ``entry``'s module, where executors could not import it (a test module, a benchmark script), is pickled by value
    while installed, as PySpark ships a notebook's functions; ``sparkdl_avg``'s own and ``__main__`` are left as
    they are. Nested blocks: the innermost entry runs.

    Args:
        entry: ``(task, workers) -> iterator of results``, as ``run_round_partition``.
    """

    def __init__(self, entry: Callable[..., Iterator[Any]]) -> None:
        self.entry = entry

    def installed(self) -> Callable[..., Iterator[Any]]:
        """What rounds run inside the block (a :class:`Straggler` or :class:`Sleeper` is its own entry)."""
        return self.entry

    def _module(self):
        installed = self.installed()
        name = getattr(getattr(installed, "func", installed), "__module__", None)  # functools.partial: its func
        if not name or name == "__main__" or name.split(".")[0] == "sparkdl_avg":
            return None
        return sys.modules.get(name)

    def __enter__(self) -> "RoundEntry":
        module = self._module()
        if module is not None:
            from pyspark import cloudpickle

            if not _by_value[module.__name__]:
                cloudpickle.register_pickle_by_value(module)
            _by_value[module.__name__] += 1
        _installed.append(self.installed())
        return self

    def __exit__(self, *exc: Any) -> None:
        installed = self.installed()
        for i in range(len(_installed) - 1, -1, -1):  # this block's, even if an inner one was left open
            if _installed[i] is installed:
                del _installed[i]
                break
        module = self._module()
        if module is not None:
            _by_value[module.__name__] -= 1
            if not _by_value[module.__name__]:
                from pyspark import cloudpickle

                cloudpickle.unregister_pickle_by_value(module)


@dataclass(frozen=True)
class Straggler(RoundEntry):
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

    def installed(self) -> "Straggler":
        return self

    def __call__(self, task, workers: Iterable[int]) -> Iterator[Any]:
        ids = list(workers)
        for index in ids:
            start = time.perf_counter()
            results = list(self.entry(task, [index]))
            if (task.slot if task.slot is not None else index) == self.slot:
                time.sleep((self.factor - 1.0) * (time.perf_counter() - start))
            yield from results


@dataclass(frozen=True)
class Sleeper(RoundEntry):
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

    def installed(self) -> "Sleeper":
        return self

    def __call__(self, task, workers: Iterable[int]) -> Iterator[Any]:
        ids = list(workers)
        time.sleep(self.seconds_per_minibatch * task.steps * len(ids))
        yield from self.entry(task, ids)
