"""Rounds that carry the tables' changed rows (shared/wire/sparse_rows.py): exact sums on every path, bytes, fallback."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from sparkdl_avg.driver.config.options import AGGREGATIONS
from sparkdl_avg.driver.transport import spark as spark_transport  # noqa: F401  (registers the transports)
from sparkdl_avg.driver.transport import sql_paths
from sparkdl_avg.driver.transport.base import TransportSettings
from sparkdl_avg.shared.wire import round_rows
from sparkdl_avg.shared.wire.aggregation import PartialResult
from sparkdl_avg.shared.wire.delta_sums import DeltaLayout, sum_deltas
from sparkdl_avg.shared.wire.exchange import FlatLayout, ReturnSums
from sparkdl_avg.shared.wire.sparse_rows import RowSums, SparseRowsLayout, _zeros_by_page, changed_rows
from sparkdl_avg.shared.wire.stats import WorkerRecord

ROWS, WIDTH = 1000, 4
# weights: table, dense kernel (float32), a float64 bias; optimizer: counter, table's m and v, kernel's m
TABLES = ((0, 4, 5),)


def _sent():
    rng = np.random.default_rng(0)
    weights = [rng.normal(size=(ROWS, WIDTH)).astype(np.float32), rng.normal(size=(WIDTH, 3)).astype(np.float32),
               rng.normal(size=3)]
    optimizer = [np.array(7, np.int64), np.zeros((ROWS, WIDTH), np.float32),
                 np.zeros((ROWS, WIDTH), np.float32), np.zeros((WIDTH, 3), np.float32)]
    return weights, optimizer


def _trained(sent, worker, touched=20):
    """A worker's state after its round: ``touched`` rows of the table (and its slots) moved, everything else dense."""
    rng = np.random.default_rng(100 + worker)
    weights, optimizer = [np.array(a) for a in sent[0]], [np.array(a) for a in sent[1]]
    rows = rng.choice(ROWS, touched, replace=False)
    for a in (weights[0], optimizer[1], optimizer[2]):
        a[rows] += rng.normal(size=(touched, WIDTH)).astype(np.float32)
    weights[1] += rng.normal(size=weights[1].shape).astype(np.float32)
    weights[2] += rng.normal(size=3)
    optimizer[0] = optimizer[0] + 4
    optimizer[3] += rng.normal(size=optimizer[3].shape).astype(np.float32)
    return weights, optimizer


def _layout(compression=None):
    flat = FlatLayout.of(*_sent())
    return SparseRowsLayout(flat, TABLES, compression, (False, False, False) if compression else (), (2,))


def _dense_delta_sums(sent, states, ns):
    """The reference: float32 ``Σ n·(s − sent)`` in worker order (float64 for float64 arrays), every value."""
    acc = None
    for (w, o), n in zip(states, ns):
        parts = []
        for a, b in zip(list(w) + list(o), list(sent[0]) + list(sent[1])):
            if np.asarray(a).dtype == np.float32:
                d = np.subtract(a, b, dtype=np.float32)
                d *= np.float32(n)
            else:
                d = np.subtract(a, b, dtype=np.float64) * np.float64(n)
            parts.append(d)
        acc = parts if acc is None else [x + y for x, y in zip(acc, parts)]
    return acc


def _result(layout, worker, sent, **kw):
    n = 3 + worker
    record = WorkerRecord(worker=worker, host="h", pid=1, examples=n, start=0.0, end=1.0)
    packed, _ = layout.pack(*_trained(sent, worker, **kw), *sent, examples=n, residual=None)
    return PartialResult(n, metric_sums={"loss": float(n)}, workers=[record], deltas=[(worker, packed)])


def _every_paths_sums(tmp_path, layout, sent):
    """``{path: PartialResult}`` of 4 workers' round summed by every aggregation path, and by the driver (``"driver"``:
    the Spark tree's and the files transport's way, every worker's bytes summed in worker order)."""
    totals = {}
    for name in AGGREGATIONS.names():
        path = AGGREGATIONS.get(name)()
        shards = 3 if path.sharded else 1
        directory = str(tmp_path / name)
        sink = path.sink(directory, layout, shards)
        batches = [sink.deliver(_result(layout, w, sent), f"w{w}") for w in range(4)]
        if path.sharded:
            batches = list(round_rows.reduce_shuffled(layout, shards, batches))
        table = pa.Table.from_batches(batches, round_rows.round_arrow_schema())
        results, pieces, _ = sql_paths.read_rows(table)
        totals[name], _ = sql_paths.assemble(results, pieces, layout, path, shards, "Round 0", directory)
    totals["driver"] = sum_deltas(layout, PartialResult(
        18, deltas=[(w, ReturnSums(layout).deliver(_result(layout, w, sent), "x").deltas[0][1]) for w in (2, 0, 3, 1)]))
    return totals


def test_every_aggregation_path_gives_the_dense_delta_sums_bitwise(tmp_path):
    sent, layout = _sent(), _layout()
    want = _dense_delta_sums(sent, [_trained(sent, w) for w in range(4)], [3, 4, 5, 6])
    for name, total in _every_paths_sums(tmp_path, layout, sent).items():
        assert total.delta_sums and total.examples == 18
        got = total.weight_sums + total.optimizer_sums
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes(), name


def test_a_worker_sends_its_changed_rows_and_falls_back_to_dense():
    sent, layout = _sent(), _layout()
    result = _result(layout, 0, sent, touched=20)
    packed = result.deltas[0][1]
    idx, values = packed.tables[0]
    assert idx.dtype == np.int32 and idx.size == 20 and values.shape == (20, 3, WIDTH)
    rest = 4 * (WIDTH * 3 + WIDTH * 3) + 8 * (3 + 1)  # kernel and its m (float32), bias and counter (float64)
    touched = 20 * (4 + 3 * 4 * WIDTH)  # indices and the rows of the table, m and v
    assert packed.nbytes == len(layout.shard_bytes(packed, 0, 1)) == 8 * 2 + rest + 8 + touched
    assert packed.nbytes <= 1.2 * touched + rest
    dense = _result(layout, 0, sent, touched=950).deltas[0][1]  # 950 rows with indices: more bytes than dense
    assert dense.tables[0][0] is None and dense.tables[0][1].shape == (ROWS, 3, WIDTH)
    assert dense.nbytes == layout.nbytes == len(layout.shard_bytes(dense, 0, 1)) == 8 * 2 + rest + 8 + 4 * ROWS * 3 * WIDTH


def test_a_row_is_changed_when_any_of_its_arrays_moved():
    old = [np.zeros((5, 2), np.float32) for _ in range(3)]
    new = [a.copy() for a in old]
    new[2][3, 1] = 1e-30  # only the second moment of row 3 moved (Adam keeps moving rows touched before)
    new[0][1, 0] = -0.0  # bitwise a change (sent), though its delta -0.0 adds to a sum what the dense sum adds
    idx, values = changed_rows(new, old)
    assert idx.tolist() == [1, 3] and values[1, 2, 1] == np.float32(1e-30)
    assert np.signbit(values[0, 0, 0]) and not values[0].any()


def test_compressed_rounds_keep_the_rows_exact_and_the_rest_in_the_codec():
    sent = _sent()
    layout, plain = _layout("int8"), DeltaLayout(FlatLayout.of(sent[0][1:], [sent[1][0], sent[1][3]]), "int8",
                                                   (False,) * 3, (1,))
    states = [_trained(sent, w) for w in range(3)]
    acc = None
    for w, state in enumerate(states):
        packed, _ = layout.pack(*state, *sent, examples=3 + w, residual=None)
        assert packed.nbytes == len(layout.shard_bytes(packed, 0, 1)) < layout.nbytes
        acc = layout.add(acc, layout.shard_bytes(packed, 0, 1), 0, 1)
    weights, optimizer = layout.sums([acc])
    want = _dense_delta_sums(sent, states, [3, 4, 5])
    for i, pos in enumerate((0, 4, 5)):  # the table, m, v: exact
        got = (weights + optimizer)[pos]
        assert got.tobytes() == want[pos].tobytes(), i
    # the rest: exactly what a DeltaLayout of those arrays alone sums
    ref = None
    for w, (sw, so) in enumerate(states):
        p, _ = plain.pack(sw[1:], [so[0], so[3]], sent[0][1:], [sent[1][0], sent[1][3]], 3 + w, None)
        ref = plain.add(ref, plain.shard_bytes(p, 0, 1), 0, 1)
    rw, ro = plain.sums([ref])
    for got, w in zip([weights[1], weights[2], optimizer[0], optimizer[3]], list(rw) + list(ro)):
        assert got.tobytes() == w.tobytes()


def test_settings_pick_the_sparse_layout_when_the_model_has_tables():
    sent = _sent()
    layout = TransportSettings(tables=TABLES).layout(*sent)
    assert isinstance(layout, SparseRowsLayout) and layout.compressed
    assert TransportSettings().layout(*sent) == FlatLayout.of(*sent)
    with pytest.raises(ValueError, match="one shape"):
        SparseRowsLayout(FlatLayout.of(*sent), ((0, 1),))
    assert dataclasses.is_dataclass(layout)


def test_the_tables_are_large_embeddings_with_their_averaged_slots():
    import keras

    from sparkdl_avg.shared.model.modelspec import get_state
    from sparkdl_avg.shared.wire.sparse_rows import table_groups

    ids = keras.Input((1,), dtype="int64")
    small = keras.layers.Flatten()(keras.layers.Embedding(12, 4)(ids))  # too small to travel by rows
    table = keras.layers.Embedding(4096, 4)
    large = keras.layers.Flatten()(table(ids))
    frozen = keras.layers.Embedding(4096, 4, trainable=False)
    model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Concatenate()([small, large,
                                                                              keras.layers.Flatten()(frozen(ids))])))
    model.compile(keras.optimizers.Adam(), "mse")
    model.optimizer.build(model.trainable_variables)
    weights, optimizer = get_state(model)
    (group,) = table_groups(model, optimizer_sums=True)
    assert weights[group[0]].shape == (4096, 4) and model.weights[group[0]] is table.embeddings
    names = [str(model.optimizer.variables[i - len(weights)].path) for i in group[1:]]
    assert len(names) == 2 and all(n.endswith(("_momentum", "_velocity")) for n in names), names
    assert table_groups(model, optimizer_sums=False) == ((group[0],),)


def test_a_tables_sums_name_the_rows_any_worker_sent_on_every_path(tmp_path):
    """The driver's update reads and writes those rows alone (driver/fit/update.py's means_as)."""
    sent, layout = _sent(), _layout()
    rows = np.unique(np.concatenate([np.random.default_rng(100 + w).choice(ROWS, 20, replace=False)
                                     for w in range(4)]))
    totals = _every_paths_sums(tmp_path, layout, sent)
    for name, total in totals.items():
        arrays = total.weight_sums + total.optimizer_sums
        for i in (0, 4, 5):  # the table and its two slots
            assert isinstance(arrays[i], RowSums) and np.array_equal(arrays[i].rows, rows), name
            assert not np.any(np.delete(np.asarray(arrays[i]), rows, axis=0)), name
        assert all(getattr(arrays[i], "rows", None) is None for i in (1, 2, 3, 6)), name
        assert (arrays[0] / 2).rows is None and arrays[0][:5].rows is None  # what is made from it is a plain array


def test_a_large_tables_sums_become_resident_only_where_rows_were_added():
    """np.zeros asks for huge pages: a few scattered rows made a 64 MiB table's sums resident whole."""
    import os

    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc here")

    def rss():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS"))

    before = rss()
    sums = _zeros_by_page((1 << 21, 8))  # 64 MiB
    sums[np.arange(0, 1 << 21, 1 << 14)] += 1.0  # 128 rows, 512 KiB apart
    assert rss() - before < 8 << 20
    assert sums.sum() == 128 * 8 and sums.flags.writeable and sums.dtype == np.float32
