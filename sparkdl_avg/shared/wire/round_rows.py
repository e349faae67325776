"""The Spark SQL round's rows: what its tasks yield (:class:`ArrowSums`, :class:`StoreFlat`) and its reducers sum.

A round's job yields rows of :data:`ROUND_SCHEMA`: each worker's result
without its arrays (:func:`encode_meta`) and its sums, as raw bytes cut
into shards or as a file naming them; :func:`reduce_shuffled` sums shard
``j`` of every worker in worker order. Both work through the sums' layout
protocol (:class:`~sparkdl_avg.shared.wire.exchange.FlatLayout`, or under
``update_compression`` :class:`~sparkdl_avg.shared.wire.delta_sums.DeltaLayout`),
so each is written once for plain and compressed sums. The driver's half
is :mod:`sparkdl_avg.driver.transport.sql`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, List

from ...errors import WorkerError
from ..errors import remote_errors

#: The rows of a Spark SQL round: what workers yield and reducers pass on. ``shard`` -1 with a ``meta``
#: (a worker's result without its sums, as JSON) or ``shard`` j >= 0 with ``data`` (raw sums of that
#: shard, :meth:`FlatLayout.shard_bytes`; ``worker`` -1 once summed, its ``meta`` the reducer's
#: ``{"sum_s": seconds}``) or ``uri`` (a file of
#: :func:`store` holding the worker's two vectors, for reducers to read shard by shard).
ROUND_SCHEMA = "shard int, worker int, meta string, data binary, uri string, offsets array<bigint>"


def encode_meta(result) -> str:
    """A :class:`~sparkdl_avg.shared.wire.aggregation.PartialResult` without its arrays, as JSON."""
    import json

    return json.dumps({
        "examples": result.examples,
        "metric_sums": result.metric_sums,
        "workers": [dataclasses.asdict(w) for w in result.workers],
    })


def decode_meta(text: str):
    """The :class:`~sparkdl_avg.shared.wire.aggregation.PartialResult` (without arrays) of :func:`encode_meta`."""
    import json

    from .aggregation import PartialResult
    from .stats import WorkerRecord

    d = json.loads(text)
    return PartialResult(d["examples"], metric_sums=d["metric_sums"], workers=[WorkerRecord(**w) for w in d["workers"]])


@dataclass(frozen=True)
class ArrowSums:
    """Workers yield their sums as Arrow rows, cut into ``shards`` shards (:data:`ROUND_SCHEMA`)."""

    layout: Any  # a SumsLayout: a FlatLayout, or a DeltaLayout under update_compression
    shards: int = 1

    @property
    def deltas(self):
        """The round's ``DeltaLayout`` when workers send compressed deltas (``None``: float32 sums)."""
        return self.layout if self.layout.compressed else None

    def deliver(self, result, name: str):
        worker = result.workers[0].worker
        rows = [_row(-1, worker, meta=encode_meta(result))]
        encoded = self.layout.encode(result)
        if encoded is not None:
            rows += [_row(j, worker, data=self.layout.value_bytes(encoded, j, self.shards)) for j in range(self.shards)]
        return _batch(rows)


@dataclass(frozen=True)
class StoreFlat:
    """Workers write their sums' two vectors to a file under ``directory`` and yield one row per shard naming it.

    The rows (:data:`ROUND_SCHEMA`: ``uri`` and the vectors' ``offsets``) are
    all that crosses the round's shuffle; reducer ``j`` reads its slice of
    every worker's file by range (:func:`reduce_shuffled`). Under
    ``update_compression`` the file holds one byte array, the delta's shards
    back to back, and ``offsets`` says where each starts, and the end.
    """

    directory: str
    layout: Any  # a SumsLayout: a FlatLayout, or a DeltaLayout under update_compression
    shards: int = 1

    deltas = ArrowSums.deltas

    def deliver(self, result, name: str):
        worker = result.workers[0].worker
        rows = [_row(-1, worker, meta=encode_meta(result))]
        encoded = self.layout.encode(result)
        if encoded is not None:
            uri, offsets = self.layout.store_file(self.directory, name, encoded, self.shards)
            rows += [_row(j, worker, uri=uri, offsets=offsets) for j in range(self.shards)]
        return _batch(rows)


def _row(shard: int, worker: int, meta=None, data=None, uri=None, offsets=None) -> dict:
    """One row of :data:`ROUND_SCHEMA`."""
    return {"shard": shard, "worker": worker, "meta": meta, "data": data, "uri": uri, "offsets": offsets}


def round_arrow_schema():
    """:data:`ROUND_SCHEMA` as a ``pyarrow`` schema."""
    import pyarrow as pa

    return pa.schema([("shard", pa.int32()), ("worker", pa.int32()), ("meta", pa.string()), ("data", pa.binary()),
                      ("uri", pa.string()), ("offsets", pa.list_(pa.int64()))])


def _summed_row(shard: int, acc, layout, shards: int, seconds: float) -> dict:
    """Shard ``shard``'s summed row; its ``meta`` says the reducer's seconds reading and summing it (``sum_s``)."""
    import json

    return _row(shard, -1, meta=json.dumps({"sum_s": seconds}), data=layout.summed_bytes(acc, shard, shards))


def _batch(rows: List[dict]):
    import pyarrow as pa

    schema = round_arrow_schema()
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def reduce_shuffled(layout, shards: int, batches):
    """``mapInArrow`` body of a round's reducer: sums each shard it received over the workers, in worker order.

    A shard's rows carry its slice of a worker's sums (``data``, from
    :class:`ArrowSums`) or name the worker's file (``uri``, from
    :class:`StoreFlat`), whose slice is then read by range. Rows without
    either (the workers' results) pass through; each shard ``j`` present
    becomes one row of its sum (two shards share a reducer only if their
    keys' hash partitions collide, which :func:`~sparkdl_avg.driver.transport.murmur3.shard_keys` avoids).
    ``layout``: the round's sums layout (a ``FlatLayout`` or a ``DeltaLayout``, the same protocol).
    """
    passed, pieces = [], {}
    try:
        for batch in batches:
            for row in batch.to_pylist():
                if row["data"] is None and row["uri"] is None:
                    passed.append({k: row[k] for k in ("shard", "worker", "meta", "data", "uri", "offsets")})
                else:
                    pieces.setdefault(row["shard"], []).append(row)
        out = []
        for shard, rows in sorted(pieces.items()):
            acc, start = None, time.perf_counter()
            for row in sorted(rows, key=lambda r: r["worker"]):
                data = row["data"]
                if data is None:
                    data = layout.read_shard(row["uri"], row["offsets"], shard, shards)
                acc = layout.add(acc, data, shard, shards)
            out.append(_summed_row(shard, acc, layout, shards, time.perf_counter() - start))
    except Exception as exc:
        raise remote_errors.failure(WorkerError, f"Summing the round's shard(s) {sorted(pieces)} failed: "
                             f"{type(exc).__name__}: {remote_errors.one_line(str(exc))}") from exc
    yield _batch(passed + out)
