"""The in-process engine's transport: the ``"spark"`` transport's state and sums, with its jobs run in this process.

:class:`InProcessTransport` is what :func:`~sparkdl_avg.driver.transport.policy.choose` builds for a fit on the
in-process engine (:mod:`sparkdl_avg.driver.runtime.inprocess`), whatever ``"auto"`` would choose on Spark: the state
goes out as the engine's stand-in for a broadcast, the workers return their sums (or compressed deltas) as task
results, and the driver merges them in worker order, as Spark's ``treeAggregate`` does for a few workers. It is no
``state_transport`` a user names: it exists only where the engine does.
"""

from __future__ import annotations

import functools
from functools import partial

from ...shared.wire.aggregation import merge
from .spark import SparkTransport


class InProcessTransport(SparkTransport):
    """:class:`~sparkdl_avg.driver.transport.spark.SparkTransport` on the in-process engine."""

    name = "inprocess"

    def tree(self, task, entry, parts, places=None):
        # Spark's treeAggregate over a handful of partitions folds their results on the driver in partition order:
        # the same additions in the same order.
        return functools.reduce(merge, self.engine.map_partitions(partial(entry, task), list(parts)), None)
