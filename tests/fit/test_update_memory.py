"""The driver's update and the state read on access give the same bits as the whole-array code they replace (issue 47)."""

import os
import weakref

import numpy as np
import pytest

import keras
import tensorflow as tf

from conftest import make_model
from sparkdl_avg.driver.fit import update
from sparkdl_avg.shared.model import modelspec
from sparkdl_avg.shared.model.modelspec import VariableArrays, get_state, state_of
from sparkdl_avg.shared.wire import exchange
from sparkdl_avg.shared.wire.aggregation import WeightedArrays, weighted
from sparkdl_avg.shared.wire.sparse_rows import RowSums, changed_rows


def _reference(sums, examples, base, delta, dtypes):
    """The whole-array expressions the chunked update replaced: replica_means, then the cast."""
    if delta:
        return [(np.asarray(b, np.float64) + x / examples).astype(d, copy=False) for x, b, d in zip(sums, base, dtypes)]
    return [np.asarray(x / examples).astype(d, copy=False) for x, d in zip(sums, dtypes)]


@pytest.mark.parametrize("delta", [True, False])
def test_means_in_slices_are_bitwise_the_whole_array_means(monkeypatch, delta):
    monkeypatch.setattr(update, "CHUNK", 1000)  # several slices, the last one short
    rng = np.random.default_rng(3)
    base = [rng.normal(size=(2_345, 7)).astype(np.float32), rng.normal(size=(13,)).astype(np.float32),
            np.asarray(41, np.int64)]
    sums = [(rng.normal(size=b.shape) * 3).astype(np.float32) if b.dtype == np.float32 else np.asarray(5.0)
            for b in base]
    dtypes = [b.dtype for b in base]
    want = _reference([s.copy() for s in sums], 3, base, delta, dtypes)
    got = update.means_as([s.copy() for s in sums], 3, base, delta, dtypes)
    for g, w, d in zip(got, want, dtypes):
        assert g.dtype == d and g.shape == w.shape
        assert np.asarray(g).tobytes() == np.asarray(w).tobytes()


def test_a_models_variables_read_on_access_are_get_states_arrays_and_specs():
    model = make_model(seed=5)
    model.optimizer.build(model.trainable_variables)
    weights, opt = get_state(model)
    lazy_w, lazy_o = state_of(model)
    assert isinstance(lazy_w, VariableArrays) and len(lazy_w) == len(weights) and len(lazy_o) == len(opt)
    for a, b in zip(list(lazy_w) + list(lazy_o), weights + opt):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert lazy_w.specs() == [(a.dtype, a.shape) for a in weights]
    assert exchange.specs_of(lazy_o) == [(a.dtype, a.shape) for a in opt]


def test_a_state_written_from_the_model_and_sums_written_on_access_read_back_the_same(tmp_path):
    model = make_model(seed=6)
    model.optimizer.build(model.trainable_variables)
    weights, opt = get_state(model)
    stored = exchange.store_state(str(tmp_path), "state", *state_of(model))
    back_w, back_o = exchange.load_state(stored)
    for a, b in zip(list(back_w) + list(back_o), weights + opt):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    lazy_w, _ = state_of(model)
    sums = WeightedArrays(lazy_w, 7)
    assert sums.specs() == [(a.dtype, a.shape) for a in weighted(weights, 7)]
    stored = exchange.store_state(str(tmp_path), "sums", sums, None)
    for a, b in zip(exchange.load_state(stored)[0], weighted(weights, 7)):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    with pytest.raises(ValueError, match="layout says"):
        exchange.store(str(tmp_path), "bad", iter([np.zeros(3, np.float32)]), specs=[(np.dtype(np.float32), (4,))])


@pytest.mark.parametrize("moved", [5, 900])  # a few rows, and enough for the dense fallback
def test_changed_rows_read_one_array_at_a_time_give_the_stacked_deltas(monkeypatch, moved):
    _changed_rows_by_blocks(monkeypatch, moved, sliced=False)


@pytest.mark.parametrize("moved", [5, 900])
def test_changed_rows_read_a_replicas_variables_block_by_block(monkeypatch, moved):
    _changed_rows_by_blocks(monkeypatch, moved, sliced=True)


def _changed_rows_by_blocks(monkeypatch, moved, sliced):
    """``changed_rows`` in blocks of 250 rows: by index (each array read once, sliced), or through ``flat`` (a
    replica's VariableArrays: read block by block, never whole)."""
    from sparkdl_avg.shared.wire import sparse_rows

    monkeypatch.setattr(sparse_rows, "ROW_BLOCK", 1_000)  # 250 rows of 4: four blocks
    rng = np.random.default_rng(4)
    old = [rng.normal(size=(1_000, 4)).astype(np.float32) for _ in range(3)]
    new = [a.copy() for a in old]
    rows = rng.choice(1_000, moved, replace=False)
    new[1][rows] += 1.0
    reads = []

    class Counting:
        def __init__(self, arrays):
            self.arrays = arrays

        def __len__(self):
            return len(self.arrays)

        def __getitem__(self, k):
            reads.append(k)
            return self.arrays[k].copy()

    class Sliced(Counting):
        def __getitem__(self, k):
            pytest.fail("read a whole array")

        def flat(self, k, lo, hi):
            reads.append((k, lo))
            return self.arrays[k].reshape(-1)[lo:hi].copy()

    idx, values = changed_rows((Sliced if sliced else Counting)(new), old)
    want = np.stack([np.subtract(a, b, dtype=np.float32) for a, b in zip(new, old)], axis=1)
    if idx is None:
        assert moved == 900 and np.array_equal(values, want)
    else:
        assert np.array_equal(idx, np.sort(rows)) and np.array_equal(values, want[idx])
    if sliced:  # each array read block by block, twice (its changed rows, then its deltas)
        assert reads == [(k, lo) for k in range(3) for lo in range(0, 4_000, 1_000)] * 2
    else:
        assert reads == [0, 1, 2, 0, 1, 2]  # by index: each array read when needed, none kept whole


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS"))


def test_released_pages_of_a_loaded_state_leave_the_resident_memory(tmp_path):
    """``load`` gives np.memmap slices (whose ``base`` is not the mmap): their pages must still be dropped."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc here")
    stored = exchange.store_state(str(tmp_path), "s", [np.ones((1 << 20, 16), np.float32)], None)  # 64 MiB
    (table,), _ = exchange.load_state(stored)
    assert isinstance(table, np.memmap)
    before = _rss()
    total = float(table.sum())
    assert _rss() - before > 48 << 20  # read: resident
    exchange.release_pages([table])
    assert _rss() - before < 16 << 20
    assert float(table.sum()) == total  # and it reads back the same


class _Tracked:
    """A lazy state (as a model's VariableArrays): a fresh array per item, and how many earlier items were still
    alive whenever one was read."""

    def __init__(self, arrays):
        self.arrays, self.refs, self.most_alive = arrays, [], 0

    def __len__(self):
        return len(self.arrays)

    def __getitem__(self, i):
        self.most_alive = max(self.most_alive, sum(r() is not None for r in self.refs))
        out = self.arrays[i].copy()
        self.refs.append(weakref.ref(out))
        return out

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def specs(self):
        return [(a.dtype, a.shape) for a in self.arrays]


def test_writing_and_averaging_a_lazy_state_hold_one_of_its_arrays_at_a_time(tmp_path):
    """zip() keeps its last tuple while it reads the next: a loop over a model's state held two tables (Adam's two
    moments) where it used one, at the driver's send and its update."""
    rng = np.random.default_rng(5)
    arrays = [rng.normal(size=(50, 4)).astype(np.float32) for _ in range(4)]
    state = _Tracked(arrays)
    stored = exchange.store(str(tmp_path), "s", state, specs=state.specs())
    assert state.most_alive == 0
    assert all(np.array_equal(a, b) for a, b in zip(exchange.load(stored), arrays))
    base = _Tracked(arrays)
    sums = [(a * 3).astype(np.float32) for a in arrays]
    got = update.means_as([s.copy() for s in sums], 3, base, True, [a.dtype for a in arrays])
    assert base.most_alive == 0
    want = _reference(sums, 3, arrays, True, [a.dtype for a in arrays])
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want))


def test_a_models_variables_iterate_without_keeping_the_array_yielded_last():
    model = make_model(seed=7)
    it = iter(VariableArrays(model.weights))
    first = weakref.ref(next(it))
    next(it)
    assert first() is None


def test_means_from_a_models_variables_read_slice_by_slice_are_bitwise_the_whole_array_means(monkeypatch):
    monkeypatch.setattr(update, "CHUNK", 100)  # several slices of the kernel, the last one short
    model = make_model(seed=8)
    model.optimizer.build(model.trainable_variables)
    weights, opt = get_state(model)
    lazy_w, lazy_o = state_of(model)
    monkeypatch.setattr(VariableArrays, "__getitem__", lambda self, i: pytest.fail("read a whole variable"))
    rng = np.random.default_rng(9)
    for base, lazy in ((weights, lazy_w), (opt, lazy_o)):
        sums = [(rng.normal(size=b.shape) * 3).astype(b.dtype) if b.dtype.kind == "f" else np.asarray(5, b.dtype)
                for b in base]
        dtypes = [b.dtype for b in base]
        want = _reference([s.copy() for s in sums], 3, base, True, dtypes)
        got = update.means_as([s.copy() for s in sums], 3, lazy, True, dtypes)
        for g, w, d in zip(got, want, dtypes):
            assert g.dtype == d and np.asarray(g).tobytes() == np.asarray(w).tobytes()


def _table_model(rows=3_000):
    keras.utils.set_random_seed(12)
    model = keras.Sequential([keras.Input((1,), dtype="int64"), keras.layers.Embedding(rows, 4), keras.layers.Flatten(),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


@pytest.mark.parametrize("lazy", [True, False])
def test_a_tables_moved_rows_give_the_dense_update_bitwise_reading_and_writing_those_rows_alone(monkeypatch, lazy):
    model = _table_model()
    weights, _ = get_state(model)
    rows = np.array([0, 1, 2, 7, 500, 501, 2_999])  # four runs of consecutive rows
    rng = np.random.default_rng(13)
    table_sums = np.zeros(weights[0].shape, np.float32)
    table_sums[rows] = rng.normal(size=(rows.size, 4)).astype(np.float32) * 3
    sums = [RowSums.of(table_sums.copy(), rows)] + [(rng.normal(size=w.shape) * 3).astype(w.dtype) for w in weights[1:]]
    want = _reference([np.asarray(s).copy() for s in sums], 3, weights, True, [w.dtype for w in weights])
    base = state_of(model)[0] if lazy else weights
    if lazy:  # read by rows and slices, never whole
        monkeypatch.setattr(VariableArrays, "__getitem__", lambda self, i: pytest.fail("read a whole variable"))
    got = update.means_as(sums, 3, base, True, [w.dtype for w in weights])
    monkeypatch.undo()
    assert isinstance(got[0], modelspec.RowUpdate) and np.array_equal(got[0].rows, rows)
    assert got[0].values.tobytes() == want[0][rows].tobytes()
    writes = []
    real = tf.raw_ops.ResourceStridedSliceAssign
    monkeypatch.setattr(tf.raw_ops, "ResourceStridedSliceAssign",
                        lambda **kw: writes.append((kw["begin"][0], kw["end"][0])) or real(**kw))
    modelspec.set_state(model, got, [None] * len(model.optimizer.variables))
    assert writes == [(0, 3), (7, 8), (500, 502), (2_999, 3_000)]  # a strided assignment per run, nothing else
    for g, w in zip(model.get_weights(), want):  # the other rows' means are the base rows themselves
        assert g.tobytes() == np.asarray(w).tobytes()


def test_a_table_whose_rows_moved_all_over_it_takes_the_dense_update(monkeypatch):
    monkeypatch.setattr(update, "MOVED_RUNS", 3)
    model = _table_model()
    weights, _ = get_state(model)
    rows = np.array([0, 10, 20, 30])  # four runs
    sums = [RowSums.of(np.zeros(weights[0].shape, np.float32), rows)] + [np.zeros_like(w) for w in weights[1:]]
    got = update.means_as(sums, 2, weights, True, [w.dtype for w in weights])
    assert isinstance(got[0], np.ndarray) and got[0].tobytes() == weights[0].tobytes()


def test_row_runs_are_the_runs_of_consecutive_rows():
    assert modelspec.row_runs(np.array([3, 4, 5, 9, 11, 12])) == [(0, 3), (3, 4), (4, 6)]
    assert modelspec.row_runs(np.array([7])) == [(0, 1)] and modelspec.row_runs(np.array([], np.int64)) == []


def test_the_drivers_state_is_written_from_the_models_variables_a_block_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(exchange, "WRITE_BLOCK", 7)  # blocks of 7 elements, the last of each array short
    model = make_model(seed=14)
    model.optimizer.build(model.trainable_variables)
    weights, opt = get_state(model)
    monkeypatch.setattr(VariableArrays, "__getitem__", lambda self, i: pytest.fail("read a whole variable"))
    stored = exchange.store_state(str(tmp_path), "state", *state_of(model))
    monkeypatch.undo()
    back_w, back_o = exchange.load_state(stored)
    for a, b in zip(list(back_w) + list(back_o), weights + opt):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
