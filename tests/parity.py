"""Tests that run unchanged on a classic session and under Spark Connect.

Each class here is a mixin of test methods that take a ``session`` fixture
(as PySpark's own TorchDistributor tests share theirs through ``...Mixin``
classes). A classic test module subclasses it next to its own tests, with
``session`` its classic session; ``tests/test_connect.py`` subclasses it
with ``session`` its Spark Connect session. So one body runs on both
engines, each in a module that holds that session already: no test starts
a Spark session of its own (a Connect server takes ~25 s to start, and one
JVM runs one of the two kinds at a time).

=====================  ==========================  =================
Mixin                  classic subclass            Connect subclass
=====================  ==========================  =================
``TaskRetryMixin``     test_reliability.py         test_connect.py
``EstimatorPathMixin`` test_ml.py                  test_connect.py
``ExecutorCheckMixin`` test_daemon.py              test_connect.py
``CompressedUpdatesMixin`` test_update_compression.py test_connect.py
``DataKindsMixin``     test_data_kinds.py          test_connect.py
=====================  ==========================  =================

This module's name does not start with ``test_``: pytest collects the tests
only through the subclasses (whose names start with ``Test``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import numpy as np
import pytest
from pyspark import cloudpickle

from conftest import assert_weights_close, dropout_model, make_model, regression_data
from sparkdl_avg import BlockMomentum, ConfigurationError, ParameterAveragingTrainer
from sparkdl_avg.executor import worker as worker_module


class TaskRetryMixin:
    """A task whose first attempt fails is retried by Spark (the sessions allow 2+ attempts per task)."""

    def test_a_task_retried_by_spark_gives_exactly_the_weights_of_a_clean_run(self, session, monkeypatch, tmp_path):
        # Dropout: the replicas draw random numbers, which the retried attempt must draw again identically.
        data = regression_data(12 * 2 * 8, seed=11)  # 12 minibatches per worker per epoch

        def fit(model):
            trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=3,
                                                update_rule=BlockMomentum(0.5), seed=3)
            trainer.fit(data, epochs=2, verbose=0)  # numpy arrays: through the active session, `session`
            return trainer

        clean = dropout_model()
        fit(clean)
        cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import this module
        real = worker_module.run_round_partition
        marker = str(tmp_path / "failed-once")
        monkeypatch.setattr(
            worker_module, "run_round_partition", lambda task, it: _fail_first_attempt(real, task, it, marker)
        )
        try:
            retried = dropout_model()
            trainer = fit(retried)
        finally:
            cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        assert os.path.exists(marker)  # the first attempt did fail, and Spark retried it
        assert_weights_close(retried.get_weights(), clean.get_weights(), atol=0)
        assert np.isfinite(trainer.stats.records[-1]["loss"])


def _fail_first_attempt(real, task, iterator, marker):
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if task.epoch == 1 and task.round == 1 and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
        list(iterator)
        open(marker, "w").close()
        raise RuntimeError("injected failure on the first attempt")
    return real(task, iterator)


class EstimatorPathMixin:
    """``kerasModel`` given as the path of a saved ``.keras`` file (the driver reads it, with any session)."""

    def test_the_estimator_reads_a_keras_path_and_names_a_missing_one(self, session, tmp_path):
        from sparkdl_avg.ml import KerasAveragingEstimator

        saved = make_model(seed=4)
        path = str(tmp_path / "m.keras")
        saved.save(path)
        estimator = KerasAveragingEstimator(kerasModel=path)
        assert_weights_close(estimator.getKerasModel().get_weights(), saved.get_weights(), atol=0)
        with pytest.raises(ConfigurationError, match=r"'kerasModel' parameter must be .* Got '.*nothing.keras' instead"):
            KerasAveragingEstimator(kerasModel=str(tmp_path / "nothing.keras"))


class ExecutorCheckMixin:
    """``preflight.check_executors`` runs one probe per default-parallelism slot (2 on both test sessions)."""

    def test_the_executor_check_describes_each_slots_python(self, session):
        from sparkdl_avg.driver.preflight import check_executors

        import sparkdl_avg
        from sparkdl_avg import version

        infos = check_executors(session)
        assert len(infos) == 2
        for info in infos:  # the executors run this Python and this checkout (conftest sets PYSPARK_PYTHON)
            assert "import_error" not in info, info
            assert info["python"] == sys.executable and info["sparkdl_avg_version"] == version.__version__, info
            assert info["sparkdl_avg_file"] == os.path.abspath(sparkdl_avg.__file__), info


def f32_model(seed=0, hidden=64, dropout=0.2, optimizer=None):
    """A float32 MLP with dropout and Adam: what ``update_compression`` compresses (float32 weights and moments)."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,))
    h = keras.layers.Dense(hidden, activation="tanh")(inputs)
    h = keras.layers.Dropout(dropout)(h)
    out = keras.layers.Dense(1)(h)
    model = keras.Model(inputs, out)
    model.compile(optimizer or keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
    return model


COMPRESSED_DATA = regression_data(10 * 2 * 8, seed=5)  # 10 minibatches per worker per epoch


def compressed_fit(compression, epochs=2, model=None, fit=None, **options):
    """A fit of :func:`f32_model` with ``update_compression=compression``; returns ``(model, trainer)``.

    ``options``: the trainer's; ``fit``: ``fit``'s (checkpoints).
    """
    model = model if model is not None else f32_model()
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=3, seed=4,
                                        update_compression=compression, **options)
    trainer.fit(COMPRESSED_DATA, epochs=epochs, verbose=0, **(fit or {}))
    return model, trainer


class CompressedUpdatesMixin:
    """``update_compression``: every Spark SQL path sums the compressed deltas bitwise alike, and a retry changes nothing."""

    def test_every_sql_path_sums_compressed_deltas_bitwise_alike_and_records_the_bytes(self, session):
        float32 = compressed_fit(None, state_transport="sql", aggregation="driver")[1].stats.records
        for compression, ratio in (("int8", (0.40, 0.45)), ("bf16", (0.49, 0.51))):
            reference = None
            for options in ({"aggregation": "driver"}, {"aggregation": "files"},
                            {"aggregation": "shuffle", "aggregation_shards": 3},
                            {"aggregation": "storage", "aggregation_shards": 2}):
                model, trainer = compressed_fit(compression, state_transport="sql", **options)
                weights = model.get_weights()
                if reference is None:
                    reference = weights
                for got, want in zip(weights, reference):
                    np.testing.assert_array_equal(got, want, err_msg=f"{compression} {options}")
                records = trainer.stats.records
                assert [r.compression for r in records] == [compression] * len(records)
                assert [r.aggregation for r in records] == [options["aggregation"]] * len(records)
                # int8: the weights at 1 byte + a scale per 256, Adam's two moments in bf16: (1 + 2 * 2) / 12
                low, high = ratio
                for record, plain in zip(records, float32):
                    assert low * plain.sent_bytes < record.sent_bytes < high * plain.sent_bytes, (compression, record)
                    assert all(w.encode_s > 0 for w in record.workers)
                    assert (record.feedback_max_s > 0) == (compression == "int8")  # bf16: no feedback by default
                    # the reducers' decoding and summing, reported back with their shards
                    assert (record.reduce_max_s > 0) == (options["aggregation"] in ("shuffle", "storage"))
                assert not [f for f in os.listdir(trainer._staging_root) if f.startswith("exchange")]
            assert max(float(np.max(np.abs(a - b))) for a, b in zip(reference, f32_model().get_weights())) > 1e-3

    def test_a_task_retried_after_writing_its_residual_gives_the_clean_weights(self, session, monkeypatch, tmp_path):
        clean, _ = compressed_fit("int8", state_transport="sql")
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        real = worker_module.run_round_partition
        marker = str(tmp_path / "failed-once")
        monkeypatch.setattr(
            worker_module, "run_round_partition", lambda task, it: _fail_after_first_attempt(real, task, it, marker)
        )
        try:
            retried, _ = compressed_fit("int8", state_transport="sql")
        finally:
            cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        assert os.path.exists(marker)  # the first attempt trained, wrote its residual, then failed
        assert_weights_close(retried.get_weights(), clean.get_weights(), atol=0)


def _fail_after_first_attempt(real, task, iterator, marker):
    """Runs the task, residual file included, then fails its first attempt in epoch 1, round 1."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    results = list(real(task, iterator))
    if task.epoch == 1 and task.round == 1 and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
        open(marker, "w").close()
        raise RuntimeError("injected failure after the residual was written")
    return iter(results)
