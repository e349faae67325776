"""The Spark SQL round's aggregation paths (``aggregation``): where its workers deliver their sums and how they come to one sum.

One class per path, registered by its name in
:data:`~sparkdl_avg.driver.config.options.AGGREGATIONS`:

* :class:`DriverSum` (``"driver"``): every worker's whole sums reach the
  driver as Arrow rows, and it adds them in worker order (``N`` models' bytes
  into the driver);
* :class:`FilesSum` (``"files"``): each worker writes its sums to a file
  under the fit's directory and the driver reads and adds them itself
  (``N`` models' bytes, through the page cache when driver and executors
  share a host); its rounds may run in one standing job
  (:mod:`.standing`);
* :class:`ShuffleSum` (``"shuffle"``): each worker cuts its sums into ``S``
  slices; a ``repartition`` by slice sends slice ``j`` of every worker to
  reducer task ``j`` through Spark's shuffle, and the driver receives the
  ``S`` summed slices: one model's bytes;
* :class:`StorageSum` (``"storage"``): each worker writes its sums to a
  file, only the file's name crosses the shuffle, and reducer ``j`` reads
  slice ``j`` of every file by range.

Every path adds the same numbers in the same order (worker 0, 1, ...)
through the sums' layout protocol
(:class:`~sparkdl_avg.shared.wire.exchange.SumsLayout`: plain or compressed
sums alike), so all give bitwise the same sums. ``"auto"`` is the policy's
(:func:`~sparkdl_avg.driver.transport.policy.plan_aggregation`).
"""

from __future__ import annotations

import functools
import json
from typing import Any, Dict, List, Tuple

from ...errors import PathError
from ...shared.wire import round_rows
from ...shared.wire.aggregation import PartialResult, merge
from ..config.options import AGGREGATIONS
from .base import unreadable


class Aggregation:
    """One way the Spark SQL round sums its workers' sums.

    Attributes:
        name: The ``aggregation`` value naming it.
        sharded: Its sums are cut into ``S`` shards that ``S`` reducer tasks sum after a shuffle
            (:meth:`~sparkdl_avg.driver.transport.sql.SqlTransport.run`); else ``S`` is 1.
        standing: Its rounds may run in one standing job whose answers are local files (one host).
        inline: Its workers' rows carry their whole sums, so a standing job through the driver's socket
            (:mod:`sparkdl_avg.shared.wire.standing_net`) may run its rounds: the answers are the sums.
    """

    name = ""
    sharded = False
    standing = False
    inline = False

    def sink(self, directory: str, layout, shards: int):
        """Where the round's workers deliver their sums (:mod:`sparkdl_avg.shared.wire.round_rows`)."""
        raise NotImplementedError

    def shard_sums(self, pieces: Dict[Any, Any], layout, shards: int, what: str, directory: str) -> Tuple[List, int]:
        """The summed shards, in shard order, from the round's ``pieces`` (:func:`read_rows`); and bytes read beside the rows."""
        raise NotImplementedError


@AGGREGATIONS.register
class DriverSum(Aggregation):
    """Every worker's whole sums as Arrow rows to the driver, which adds them in worker order."""

    name = "driver"
    inline = True

    def sink(self, directory, layout, shards):
        return round_rows.ArrowSums(layout, 1)

    def shard_sums(self, pieces, layout, shards, what, directory):
        acc = None
        for (_, _), data in sorted(pieces.items(), key=lambda item: item[0][1]):  # worker order
            acc = layout.add(acc, data, 0, 1)
        return [acc], 0


@AGGREGATIONS.register
class FilesSum(Aggregation):
    """Every worker's sums in a file of its own, read and added by the driver in worker order."""

    name = "files"
    standing = True

    def sink(self, directory, layout, shards):
        return round_rows.StoreFlat(directory, layout, 1)

    def shard_sums(self, pieces, layout, shards, what, directory):
        acc, read = None, 0
        try:
            for _, (uri, offsets) in sorted(pieces.items()):  # worker order (one host: the page cache)
                data = layout.read_shard(uri, offsets, 0, 1)
                acc = layout.add(acc, data, 0, 1)
                # a delta's bytes as read (a sparse-rows delta is shorter than layout.nbytes); float32 sums' whole size
                read += len(data) if isinstance(data, bytes) else layout.nbytes
        except (OSError, PathError) as exc:
            raise unreadable(what, directory, exc, "aggregation='files'", "aggregation='storage'") from exc
        return ([acc] if acc is not None else []), read


class _Reduced(Aggregation):
    """A sharded path: reducer task ``j`` sums shard ``j`` of every worker; the driver joins the ``S`` sums."""

    sharded = True

    def shard_sums(self, pieces, layout, shards, what, directory):
        by_shard = {shard: data for (shard, _), data in pieces.items()}
        return [layout.parse_summed(by_shard[j], j, shards) for j in range(shards)], 0


@AGGREGATIONS.register
class ShuffleSum(_Reduced):
    """The workers' sums in ``S`` slices as Arrow rows, through Spark's shuffle to ``S`` reducers."""

    name = "shuffle"

    def sink(self, directory, layout, shards):
        return round_rows.ArrowSums(layout, shards)


@AGGREGATIONS.register
class StorageSum(_Reduced):
    """The workers' sums in files; only their names cross the shuffle, and ``S`` reducers read slices by range."""

    name = "storage"

    def sink(self, directory, layout, shards):
        return round_rows.StoreFlat(directory, layout, shards)


def read_rows(table):
    """``(worker results by worker id, pieces, the slowest reducer's seconds)`` of a round's Arrow rows.

    ``pieces``: ``{(shard, worker): data}`` (``worker`` -1: summed), or for
    the workers' file rows ``{worker: (uri, offsets)}``.
    """
    results, pieces, reduce_s = {}, {}, 0.0
    columns = table.to_pydict()
    for shard, worker, meta, data, uri, offsets in zip(
        columns["shard"], columns["worker"], columns["meta"], columns["data"], columns["uri"], columns["offsets"]
    ):
        if meta is not None and shard < 0:
            results[worker] = round_rows.decode_meta(meta)
            continue
        if meta is not None:  # a reducer's summed shard
            reduce_s = max(reduce_s, json.loads(meta)["sum_s"])
        if data is not None:
            pieces[(shard, worker)] = data
        elif uri is not None:
            pieces[worker] = (uri, tuple(offsets))
    return results, pieces, reduce_s


def assemble(results, pieces, layout, path: Aggregation, shards: int, what: str = "",
             directory: str = "") -> Tuple[PartialResult, int]:
    """The round's :class:`PartialResult` (the workers' results merged in worker order, and the sums); bytes read.

    ``what``, ``directory``: the round and its directory, for the error of files the driver cannot read.
    """
    total = functools.reduce(merge, [results[w] for w in sorted(results)], None)
    if layout.compressed:
        total.delta_sums = True
    if not pieces:
        return total, 0
    sums, read = path.shard_sums(pieces, layout, shards, what, directory)
    if sums:
        total.weight_sums, total.optimizer_sums = layout.sums(sums)
    return total, read
