"""``state_transport="files"``: the state as a file under the staging directory, each worker's sums as a file of its own.

The cheapest round when the driver and the executors share a host
(measured in docs/benchmarks.md); classic sessions only. The driver
collects the workers' small
:class:`~sparkdl_avg.shared.wire.exchange.StoredResult`\\ s (no tree: the arrays
never pass through Spark) and adds their files in the tasks' order.
"""

from __future__ import annotations

import functools
import logging
import time
from functools import partial
from typing import List, Sequence

import numpy as np

from ...errors import PathError
from ...shared.errors.remote_errors import run_job
from ...shared.files.fs import join
from ...shared.wire import exchange
from ...shared.wire.aggregation import PartialResult, merge, nbytes_of
from ...shared.wire.delta_sums import sum_deltas
from ..config.options import TRANSPORTS
from .base import Published, StateTransport, TransportSettings, rdd_job, remove_quietly, unreadable

logger = logging.getLogger("sparkdl_avg")


@TRANSPORTS.register
class FileTransport(StateTransport):
    """State and sums as files under ``directory``, one subdirectory per round.

    Deleting a round's directory also takes the files of failed or
    speculative attempts; :meth:`close` deletes the fit's.
    """

    name = "files"

    def __init__(self, engine, directory: str, settings: TransportSettings = TransportSettings()) -> None:
        super().__init__(engine, settings)
        self.directory = directory

    @classmethod
    def for_fit(cls, engine, directory, settings, site):
        if site.local_fs and not site.one_host:
            logger.warning(
                "state_transport='files' with the local staging directory %s while the master is %s: "
                "the driver and every executor must read each other's files there (e.g. one host, or NFS).",
                site.root,
                engine.master,
            )
        return cls(engine, directory, settings)

    def publish(self, name, weights, optimizer):
        directory = join(self.directory, name)
        state = exchange.store_state(directory, "state", weights, optimizer)
        return Published(state, partial(remove_quietly, directory), directory, self.layout(weights, optimizer),
                         nbytes_of(weights, optimizer))

    def sink(self, published: Published) -> exchange.StoreSums:
        """Where the workers of the job on ``published`` deliver: files of their own beside its state."""
        layout = published.layout
        return exchange.StoreSums(published.directory, layout if layout.compressed else None)

    def run(self, make_task, entry, workers, what, published, places=None):
        results = rdd_job(self.engine, make_task(published.state, self.sink(published)), entry, workers, places)
        return self.add_delivered(run_job(results.collect, what), what, published.directory, published.layout)

    def add_delivered(self, delivered: List[exchange.StoredResult], what: str, directory: str,
                      layout=None) -> PartialResult:
        """The sum of what the workers' :class:`~sparkdl_avg.shared.wire.exchange.StoreSums` delivered; deletes their files.

        ``layout``: the round's, when its workers sent compressed deltas (a ``DeltaLayout``).
        """
        t0, c0 = time.perf_counter(), time.process_time()
        total = functools.reduce(merge, [d.result for d in delivered], None)
        stored = [d.sums for d in delivered if d.sums is not None]
        compressed = layout is not None and layout.compressed
        try:  # PathError: the staging URI cannot be opened from here
            if compressed:
                total.deltas = [(d.result.workers[0].worker, _read_and_remove(d.sums)) for d in delivered
                                if d.sums is not None]
            else:
                total.weight_sums, total.optimizer_sums = _add_stored(stored)
        except (OSError, PathError) as exc:
            raise unreadable(what, directory, exc, "state_transport='files'", "state_transport='sql'") from exc
        if compressed:
            total.received_bytes = sum(len(data) for _, data in total.deltas)
            sum_deltas(layout, total)
        else:
            total.received_bytes = sum(_nbytes(s) for s in stored)
        total.driver_sum_s, total.driver_sum_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        return total

    def close(self) -> None:
        super().close()
        # Files of rounds cut short by an error, and of task attempts that outlived their round.
        remove_quietly(self.directory)


def _read_and_remove(stored: exchange.StoredArrays) -> bytes:
    """The bytes of a worker's compressed delta file (:class:`~sparkdl_avg.shared.wire.exchange.StoreSums`); deletes it."""
    try:
        return exchange.load(stored)[0].tobytes()
    finally:
        exchange.remove(stored)


def _nbytes(stored: exchange.StoredState) -> int:
    return sum(int(np.prod(shape)) * dtype.itemsize for dtype, shape, _ in stored.arrays.layout)


def _add_stored(stored: Sequence[exchange.StoredState]):
    """The element-wise sums of the stored states' weights and optimizer variables, in order; deletes their files."""
    sums = None
    try:
        for item in stored:
            # One array at a time, not a memory map of the whole file: a model's state less on the driver.
            arrays = exchange.load_one_by_one(item.arrays)
            if sums is None:
                sums = list(arrays)  # fresh arrays: the first worker's are the accumulator
            else:
                for total, part in zip(sums, arrays):
                    np.add(total, part, out=total)
    finally:
        for item in stored:
            exchange.remove(item.arrays)
    if sums is None:
        return None, None
    first = stored[0]
    return sums[: first.num_weights], (sums[first.num_weights :] if first.optimizer else None)

