"""``state_transport="spark"``: the state as a Spark broadcast, the sums as task results summed by ``treeAggregate``.

Classic sessions only (Spark Connect has no broadcasts or RDDs). Under ``optimizer_state="local"`` or ``"reset"``
the state goes out as bases broadcast once and each round's patch (:mod:`.downlink`). The tree
(depth ``aggregation_depth``) merges the workers' float sums; under
``update_compression`` it keeps every worker's compressed delta, which the
driver then adds in worker order (:func:`~sparkdl_avg.shared.wire.delta_sums.sum_deltas`).
"""

from __future__ import annotations

import time

from ...shared.errors.remote_errors import run_job
from ...shared.wire import exchange
from ...shared.wire.delta_sums import sum_deltas
from ...shared.wire.aggregation import nbytes_of
from ..config.options import TRANSPORTS
from .base import Published, StateTransport, TransportSettings
from .downlink import Downlink


@TRANSPORTS.register
class SparkTransport(StateTransport):
    """State as a Spark broadcast; sums as task results, summed by ``treeAggregate(depth)``."""

    name = "spark"

    def __init__(self, engine, settings: TransportSettings = TransportSettings()) -> None:
        super().__init__(engine, settings)
        # the driver's optimizer variables stay as they are but for their counter: bases once, patches each round
        self._downlink = Downlink(engine) if not self.settings.optimizer_sums else None

    def publish(self, name, weights, optimizer):
        layout = self.layout(weights, optimizer)
        if self._downlink is not None:
            state, release, nbytes = self._downlink.publish(weights, optimizer)
            return Published(state, release, layout=layout, nbytes=nbytes)
        # lists: a model's VariableArrays (read on access) are read here, for the broadcast's pickle
        broadcast = self.engine.broadcast((list(weights), None if optimizer is None else list(optimizer)))
        return Published(exchange.BroadcastState(broadcast), broadcast.unpersist, layout=layout,
                         nbytes=nbytes_of(weights, optimizer))

    def run(self, make_task, entry, workers, what, published, places=None):
        layout = published.layout
        # sums (or compressed deltas) as task results
        task = make_task(published.state, exchange.ReturnSums(layout if layout.compressed else None))
        total = run_job(lambda: self.tree(task, entry, workers, places), what)
        if layout.compressed:  # the tree kept every worker's delta; summed here, in worker order
            t0, c0 = time.perf_counter(), time.process_time()
            total.received_bytes = sum(len(data) for _, data in total.deltas or [])
            sum_deltas(layout, total)
            total.driver_sum_s, total.driver_sum_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        return total

    def close(self) -> None:
        super().close()
        if self._downlink is not None:
            self._downlink.close()
