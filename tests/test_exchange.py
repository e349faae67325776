"""State through files (``state_transport``): the file format, the partial results, and whole fits.

The file path must give exactly the model the Spark path gives (same sums,
same order), leave no files behind, and be chosen by ``"auto"`` only where
driver and executors share the local filesystem.
"""

import os
import types

import numpy as np
import pyarrow.fs as pafs
import pytest

import keras

from conftest import make_model, regression_data
from sparkdl_avg import ConfigurationError, ParameterAveragingTrainer, exchange
from sparkdl_avg.aggregation import PartialResult, merge


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
    merged = None
    for i, p in enumerate(parts):
        merged = merge(merged, p.store(str(tmp_path), f"w{i}"))
    assert merged.weight_sums is None and len(merged.stored) == 3
    assert len(os.listdir(tmp_path)) == 3
    loaded = merged.load_stored()
    assert not os.listdir(tmp_path)
    assert loaded.stored == [] and loaded.examples == 16
    assert loaded.metric_sums == {"loss": 8.0} and [w["worker"] for w in loaded.workers] == [0, 1, 2]
    _assert_same(loaded.weight_sums, expected.weight_sums)
    if optimizer:
        _assert_same(loaded.optimizer_sums, expected.optimizer_sums)
    else:
        assert loaded.optimizer_sums is None
    # The sums are owned arrays, not views of a deleted file.
    assert all(a.flags.writeable and a.flags.owndata for a in loaded.weight_sums)


def test_a_partial_without_arrays_stores_nothing(tmp_path):
    metrics_only = PartialResult(0, metric_sums={}, workers=[{"worker": 1}])
    assert metrics_only.store(str(tmp_path), "w1") is metrics_only
    assert not os.listdir(tmp_path)


def test_an_unknown_transport_is_refused_naming_the_parameter():
    with pytest.raises(ConfigurationError, match=r"'state_transport' parameter must be one of 'auto', 'spark', 'files'. Got 'disk'"):
        ParameterAveragingTrainer(make_model(), state_transport="disk")


@pytest.mark.parametrize(
    "transport, master, staging, files",
    [
        ("auto", "local[2]", None, True),
        ("auto", "local-cluster[2,1,1024]", None, True),
        ("auto", "spark://10.0.0.1:7077", None, False),
        ("auto", "yarn", None, False),
        ("auto", "local[2]", "hdfs://namenode/tmp", False),
        ("spark", "local[2]", None, False),
        ("files", "yarn", None, True),
        ("files", "yarn", "hdfs://namenode/tmp", True),
    ],
)
def test_auto_uses_files_only_when_executors_share_the_drivers_filesystem(
    transport, master, staging, files, tmp_path, monkeypatch
):
    import sparkdl_avg.trainer as trainer_mod

    real = trainer_mod.resolve
    # No HDFS here: only the kind of filesystem matters.
    monkeypatch.setattr(trainer_mod, "resolve", lambda uri: (object(), uri) if uri.startswith("hdfs://") else real(uri))
    trainer = ParameterAveragingTrainer(make_model(), state_transport=transport, staging_dir=staging or str(tmp_path))
    chosen = trainer._exchange_dir(types.SimpleNamespace(master=master))
    trainer._finalizer.detach()  # nothing was staged; there is no HDFS to clean up
    assert (chosen is not None) == files
    if files:
        assert chosen.startswith(trainer._staging_root + "/")


# ------------------------------------------------------------ whole fits


def _fit(spark, transport, floatx64=None, **options):
    x, y = regression_data(256, seed=3)
    model = make_model(optimizer=keras.optimizers.Adam(0.01))
    with ParameterAveragingTrainer(model, num_workers=options.pop("num_workers", 2), batch_size=8,
                                   averaging_frequency=3, seed=5, state_transport=transport, **options) as trainer:
        history = trainer.fit((x, y), epochs=2, verbose=0)
        root = trainer._staging_root
        leftovers = sorted(
            os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
        )
    return model.get_weights(), history.history["loss"], leftovers


@pytest.mark.parametrize("options", [{}, {"update_rule": "bmuf", "optimizer_state": "reset"}])
def test_files_give_exactly_the_model_spark_gives_and_leave_no_files(spark, floatx64, options):
    w_spark, loss_spark, _ = _fit(spark, "spark", **dict(options))
    w_files, loss_files, leftovers = _fit(spark, "files", **dict(options))
    _assert_same(w_files, w_spark)
    assert loss_files == loss_spark
    # Only the staged training data stays (until close); no state or result files.
    assert leftovers and all(path.startswith("training") for path in leftovers), leftovers


def test_files_with_more_workers_than_cores_and_a_deep_tree_match_spark(spark, floatx64):
    w_spark, _, _ = _fit(spark, "spark", num_workers=5, aggregation_depth=3)
    w_files, _, _ = _fit(spark, "files", num_workers=5, aggregation_depth=3)
    # Spark sums in a tree, the driver in worker order: equal up to float64 rounding.
    for a, b in zip(w_files, w_spark):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def test_auto_on_local_moves_state_through_files(spark, floatx64, tmp_path, monkeypatch):
    seen = []
    real = exchange.store

    def spy(directory, name, arrays):
        seen.append(name.split("-")[0])
        return real(directory, name, arrays)

    monkeypatch.setattr(exchange, "store", spy)
    x, y = regression_data(64, seed=1)
    with ParameterAveragingTrainer(make_model(), num_workers=2, batch_size=8, averaging_frequency=2,
                                   staging_dir=str(tmp_path)) as trainer:
        trainer.fit((x, y), epochs=1, verbose=0)
    # Driver side (this process): one state file per round; workers write in their own processes.
    assert seen == ["state"] * 2
