"""State through files (``state_transport``): the file format, the partial results, and whole fits.

The file path must give exactly the model the Spark path gives (same sums,
same order), leave no files behind, and be chosen by ``"auto"`` only where
driver and executors share the local filesystem.
"""

import os
import shutil
import tempfile
import types
from unittest import mock

import numpy as np
import pyarrow.fs as pafs
import pytest

import keras

from conftest import make_model, regression_data
from sparkdl_avg.driver.data import staging_roots
from sparkdl_avg import ConfigurationError, ParameterAveragingTrainer
from sparkdl_avg.shared.wire import exchange
from sparkdl_avg.driver import transport
from sparkdl_avg.driver.transport.base import TransportSettings
from sparkdl_avg.driver.transport.files import FileTransport
from sparkdl_avg.driver.transport.policy import choose
from sparkdl_avg.shared.wire.aggregation import PartialResult, merge


def _arrays():
    return [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.array(7, dtype=np.int64),  # 0-d, like the optimizer's iteration counter
        np.linspace(0, 1, 5),  # float64, 40 bytes: the next array starts at the 64-byte boundary
        np.zeros((0, 3), dtype=np.float32),
        np.array([[1.5, -2.5]], dtype=np.float32)[:, ::-1],  # not C-contiguous
    ]


def _assert_same(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
        np.testing.assert_array_equal(a, e)


def test_store_and_load_round_trip_keeps_dtypes_shapes_and_values(tmp_path):
    stored = exchange.store(str(tmp_path / "d"), "w0", _arrays())
    assert os.path.basename(stored.uri).startswith("w0-") and stored.uri.endswith(".bin")
    assert [offset for _, _, offset in stored.layout] == [0, 64, 128, 192, 192]
    assert os.path.getsize(stored.uri) == 192 + 8
    _assert_same(exchange.load(stored), _arrays())
    exchange.remove(stored)
    assert not os.path.exists(stored.uri)
    exchange.remove(stored)  # already gone: fine


def test_two_stores_under_one_name_get_two_files(tmp_path):
    a = exchange.store(str(tmp_path), "w0", [np.ones(3)])
    b = exchange.store(str(tmp_path), "w0", [np.zeros(3)])  # a retried task attempt
    assert a.uri != b.uri
    _assert_same(exchange.load(a), [np.ones(3)])


def test_a_file_uri_and_an_empty_state_work(tmp_path):
    stored = exchange.store("file://" + str(tmp_path), "empty", [np.zeros(0, dtype=np.float32)])
    _assert_same(exchange.load(stored), [np.zeros(0, dtype=np.float32)])


def test_a_non_local_filesystem_is_written_and_read_through_pyarrow(monkeypatch):
    from pyarrow._fs import _MockFileSystem

    fs = _MockFileSystem()
    monkeypatch.setattr(exchange, "resolve", lambda uri: (fs, uri.split("://", 1)[1]))
    stored = exchange.store("mock://bucket/exchange", "w1", _arrays())
    assert fs.get_file_info(stored.uri.split("://", 1)[1]).size == 200
    _assert_same(exchange.load(stored), _arrays())
    exchange.remove(stored)
    assert fs.get_file_info(pafs.FileSelector("bucket/exchange")) == []


def _partial(n, seed, optimizer=True):
    rng = np.random.default_rng(seed)
    weights = [rng.normal(size=(3, 2)).astype(np.float32) * n, np.array(rng.normal() * n)]
    opt = [np.array(n * 5, dtype=np.float64), rng.normal(size=4).astype(np.float32)] if optimizer else None
    return PartialResult(n, weights, opt, {"loss": 0.5 * n}, [{"worker": seed}])


@pytest.mark.parametrize("optimizer", [True, False])
def test_stored_partials_sum_exactly_like_in_memory_ones_and_their_files_go(tmp_path, optimizer):
    parts = [_partial(n, seed, optimizer) for seed, n in enumerate([3, 5, 8])]
    expected = None
    for p in [_partial(n, seed, optimizer) for seed, n in enumerate([3, 5, 8])]:
        expected = merge(expected, p)
    files = FileTransport(None, str(tmp_path / "fit"))
    published = files.publish("e0-r0", [np.zeros(2)], None)
    state, sink = published.state, files.sink(published)
    delivered = [sink.deliver(p, f"w{i}") for i, p in enumerate(parts)]
    assert all(d.result.weight_sums is None and d.sums is not None for d in delivered)
    assert len(os.listdir(tmp_path / "fit" / "e0-r0")) == 1 + 3  # the round's state and three workers' sums
    loaded = files.add_delivered(delivered, "Round 0 of epoch 0", str(tmp_path / "fit" / "e0-r0"))
    assert os.listdir(tmp_path / "fit" / "e0-r0") == [os.path.basename(state.arrays.uri)]
    assert loaded.examples == 16
    assert loaded.metric_sums == {"loss": 8.0} and [w["worker"] for w in loaded.workers] == [0, 1, 2]
    _assert_same(loaded.weight_sums, expected.weight_sums)
    if optimizer:
        _assert_same(loaded.optimizer_sums, expected.optimizer_sums)
    else:
        assert loaded.optimizer_sums is None
    # The sums are owned arrays, not views of a deleted file.
    assert all(a.flags.writeable and a.flags.owndata for a in loaded.weight_sums)
    published.release()
    assert os.listdir(tmp_path / "fit") == []
    files.close()
    assert not os.path.exists(tmp_path / "fit")


def test_a_partial_without_arrays_stores_nothing(tmp_path):
    metrics_only = PartialResult(0, metric_sums={}, workers=[{"worker": 1}])
    delivered = exchange.StoreSums(str(tmp_path)).deliver(metrics_only, "w1")
    assert delivered.result is metrics_only and delivered.sums is None
    assert not os.listdir(tmp_path)


def test_an_unknown_transport_is_refused_naming_the_parameter():
    with pytest.raises(ConfigurationError, match=r"'state_transport' parameter must be one of 'auto', 'spark', 'files', 'sql'. Got 'disk'"):
        ParameterAveragingTrainer(make_model(), state_transport="disk")


@pytest.mark.parametrize(
    "mode, master, staging, chosen_name",
    [
        ("auto", "local[2]", None, "files"),
        ("auto", "local-cluster[2,1,1024]", None, "files"),
        ("auto", "spark://10.0.0.1:7077", None, "sql"),
        ("auto", "yarn", None, "sql"),
        ("auto", "yarn", 32 << 20, "spark"),  # small rounds keep Spark's tree on a classic cluster (4 workers)
        ("auto", "yarn", 96 << 20, "sql"),  # large ones shard: 3 × 24 MB through a 1 Gbit/s link is 0.6 s
        ("auto", "local[2]", "hdfs://namenode/tmp", "sql"),
        ("spark", "local[2]", None, "spark"),
        ("sql", "local[2]", None, "sql"),
        ("files", "yarn", None, "files"),
        ("files", "yarn", "hdfs://namenode/tmp", "files"),
    ],
)
def test_auto_uses_files_only_when_executors_share_the_drivers_filesystem(
    mode, master, staging, chosen_name, tmp_path, caplog
):
    # No HDFS here, and none is contacted: the choice goes by the URI's scheme.
    round_bytes = staging if isinstance(staging, int) else None  # the sums of 4 workers in all
    staging = None if isinstance(staging, int) else staging
    root = staging or str(tmp_path)
    engine = types.SimpleNamespace(master=master, one_host=master.startswith("local"), connect=False, in_process=False)
    with caplog.at_level("WARNING", logger="sparkdl_avg"), mock.patch.object(transport.sql, "make_dir"):
        settings = TransportSettings(mode, num_workers=4 if round_bytes else None,
                                     sums_bytes=round_bytes // 4 if round_bytes else None)
        chosen = choose(settings, engine, root, "exchange-1")
    assert chosen.name == chosen_name
    if chosen_name != "spark":
        assert chosen.directory == root + "/exchange-1"
    # Forcing files with a local staging directory on a cluster master gets a warning.
    warned = [r.getMessage() for r in caplog.records if "state_transport='files'" in r.getMessage()]
    assert bool(warned) == (mode == "files" and staging is None)
    if warned:
        assert "the driver and every executor must read each other's files" in warned[0]


@pytest.mark.parametrize("mode", ["auto", "sql", "spark", "files"])
def test_under_connect_only_the_sql_round_is_offered(mode, tmp_path):
    engine = types.SimpleNamespace(master="local[2]", one_host=True, connect=True, in_process=False)
    if mode in ("auto", "sql"):
        assert choose(TransportSettings(mode), engine, str(tmp_path), "exchange-1").name == "sql"
    else:
        with pytest.raises(ConfigurationError, match=rf"'state_transport' parameter must be 'auto' or 'sql' under "
                                                     rf"Spark Connect .* Got '{mode}' instead"):
            choose(TransportSettings(mode), engine, str(tmp_path), "exchange-1")


def test_bfloat16_and_float16_arrays_round_trip(tmp_path):
    import pickle

    import ml_dtypes

    arrays = [np.arange(6, dtype=ml_dtypes.bfloat16).reshape(2, 3), np.ones(5, np.float16), np.array(3, np.int64)]
    stored = pickle.loads(pickle.dumps(exchange.store(str(tmp_path), "bf16", arrays)))  # as it travels in a task
    _assert_same(exchange.load(stored), arrays)


# ------------------------------------------------------------ whole fits


def _files_under(staging_dir):
    """Paths of the files under the trainer's directory in ``staging_dir``, relative to that directory (its owner marker aside)."""
    (root,) = os.listdir(staging_dir) or [None]  # the trainer makes one directory of its own there
    if root is None:
        return []
    root = os.path.join(staging_dir, root)
    files = (os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
    return sorted(f for f in files if f != staging_roots.MARKER)


class _ExchangeWatcher(keras.callbacks.Callback):
    """Lists the files left besides the staged data after every round (batch hooks run per round)."""

    def __init__(self, staging_dir):
        super().__init__()
        self.staging_dir = staging_dir
        self.after_rounds = []

    def on_train_batch_end(self, batch, logs=None):
        self.after_rounds.append([p for p in _files_under(self.staging_dir) if not p.startswith("training")])


def _fit(spark, transport, float32=False, **options):
    x, y = regression_data(256, seed=3)
    model = make_model(optimizer=keras.optimizers.Adam(0.01))
    if float32:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.01), "mse")
        x, y = x.astype(np.float32), y.astype(np.float32)
    staging_dir = tempfile.mkdtemp(prefix="sparkdl_avg-test-exchange-")
    with ParameterAveragingTrainer(model, num_workers=options.pop("num_workers", 2), batch_size=8, averaging_frequency=3,
                                   seed=5, state_transport=transport, staging_dir=staging_dir, **options) as trainer:
        watcher = _ExchangeWatcher(staging_dir)
        history = trainer.fit((x, y), epochs=2, verbose=0, callbacks=[watcher])
        leftovers = _files_under(staging_dir)
    shutil.rmtree(staging_dir)
    return model.get_weights(), history.history["loss"], leftovers, watcher.after_rounds


@pytest.mark.parametrize("options", [{}, {"update_rule": "bmuf", "optimizer_state": "reset"}])
def test_files_give_exactly_the_model_spark_gives_and_leave_no_files(spark, floatx64, options):
    w_spark, loss_spark, _, _ = _fit(spark, "spark", **dict(options))
    w_files, loss_files, leftovers, after_rounds = _fit(spark, "files", **dict(options))
    _assert_same(w_files, w_spark)
    assert loss_files == loss_spark
    # No state or result file outlives its round (2 epochs of 6 rounds: 16 minibatches in rounds of 3);
    # only the staged training data stays (until close).
    assert len(after_rounds) == 2 * 6 and all(files == [] for files in after_rounds), after_rounds
    assert leftovers and all(path.startswith("training") for path in leftovers), leftovers


def test_three_float32_workers_sum_in_sparks_order(spark):
    # float32 sums of three workers depend on the order of the additions; up to 4 workers
    # Spark's tree (depth 2) adds them on the driver in partition order, and so must the file path.
    w_spark, _, _, _ = _fit(spark, "spark", float32=True, num_workers=3)
    w_files, _, _, _ = _fit(spark, "files", float32=True, num_workers=3)
    assert all(w.dtype == np.float32 for w in w_files)
    _assert_same(w_files, w_spark)


def test_files_with_more_workers_than_cores_and_a_deep_tree_match_spark(spark, floatx64):
    w_spark, _, _, _ = _fit(spark, "spark", num_workers=5, aggregation_depth=3)
    w_files, _, _, _ = _fit(spark, "files", num_workers=5, aggregation_depth=3)
    # Spark sums in a tree, the driver in worker order: equal up to float64 rounding.
    for a, b in zip(w_files, w_spark):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def test_auto_on_local_moves_state_out_and_every_workers_sums_back_through_files(spark, floatx64, tmp_path, monkeypatch):
    stored, loaded = [], []
    real_store, real_load = exchange.store, exchange.load_one_by_one

    def spy_store(directory, name, arrays, parents=True, specs=None, flat=None):
        stored.append((os.path.basename(directory), name))
        return real_store(directory, name, arrays, parents, specs, flat)

    def spy_load(item):
        loaded.append(os.path.basename(item.uri).rsplit("-", 1)[0])
        return real_load(item)

    # Patched in this (the driver's) process only: workers write in their own processes.
    monkeypatch.setattr(exchange, "store", spy_store)
    monkeypatch.setattr(exchange, "load_one_by_one", spy_load)  # the driver reads sums one array at a time
    x, y = regression_data(64, seed=1)
    with ParameterAveragingTrainer(make_model(), num_workers=2, batch_size=8, averaging_frequency=2,
                                   staging_dir=str(tmp_path)) as trainer:
        trainer.fit((x, y), epochs=1, verbose=0)
    assert stored == [("e0-r0", "state"), ("e0-r1", "state")]
    # The driver read one file per worker per round, written by the workers.
    assert loaded == ["e0-r0-w0", "e0-r0-w1", "e0-r1-w0", "e0-r1-w1"]


def test_a_non_finite_round_through_files_raises_and_leaves_no_files(spark, floatx64, tmp_path):
    from sparkdl_avg import WorkerError

    x, y = regression_data(64, seed=2)
    x[16:32, :] = np.nan  # worker 1's examples in the first round (no shuffling: plan.worker_positions)
    with ParameterAveragingTrainer(make_model(), num_workers=2, batch_size=8, averaging_frequency=2,
                                   check_data=False, state_transport="files", staging_dir=str(tmp_path)) as trainer:
        with pytest.raises(WorkerError, match=r"Non-finite loss or weights \(NaN/Inf\) from worker\(s\) 1"):
            trainer.fit((x, y), epochs=1, verbose=0, shuffle=False)
        leftovers = _files_under(str(tmp_path))
    assert leftovers and all(path.startswith("training") for path in leftovers), leftovers


def test_a_bfloat16_model_trains_through_files_like_through_spark(spark):
    x, y = regression_data(128, seed=4)
    x, y = x.astype(np.float32), y.astype(np.float32)
    weights, losses = {}, {}
    for transport in ("spark", "files"):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh", dtype="bfloat16"),
                                  keras.layers.Dense(1, dtype="bfloat16")])
        model.compile(keras.optimizers.SGD(0.05), "mse")
        with ParameterAveragingTrainer(model, num_workers=2, batch_size=8, seed=1, state_transport=transport) as trainer:
            losses[transport] = trainer.fit((x, y), epochs=2, verbose=0).history["loss"]
        weights[transport] = model.get_weights()
    assert [str(w.dtype) for w in weights["files"]] == ["bfloat16"] * 4
    _assert_same(weights["files"], weights["spark"])
    assert losses["files"] == losses["spark"]


def test_a_stored_file_read_one_array_at_a_time_gives_writable_copies_of_the_same_arrays(tmp_path):
    """The driver adds a worker's sums file array by array (issue 47): the same values, dtypes and shapes as a memory map."""
    import ml_dtypes

    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4), np.array(7, np.int64), np.zeros((0, 2)),
              np.ones(5, ml_dtypes.bfloat16)]
    stored = exchange.store(str(tmp_path), "sums", arrays)
    read = list(exchange.load_one_by_one(stored))
    for a, b in zip(read, arrays):
        assert a.dtype == b.dtype and a.shape == b.shape and a.flags.writeable
        np.testing.assert_array_equal(a.astype(np.float64), b.astype(np.float64))


def test_released_pages_of_a_mapped_state_read_back_the_same(tmp_path):
    """A worker drops the mapped pages of each array it assigned (issue 47); the data are still there if read again."""
    arrays = [np.random.default_rng(0).normal(size=(1 << 18,)).astype(np.float32), np.arange(10.0)]
    loaded = exchange.load(exchange.store(str(tmp_path), "state", arrays))
    before = [a.copy() for a in loaded]
    exchange.release_pages(loaded)
    exchange.release_pages([np.ones(3)])  # not mapped: left alone
    for a, b in zip(loaded, before):
        np.testing.assert_array_equal(a, b)
