"""``warm_up(spark, model)``: the executors build the replica and trace its step before the first fit (issue 48)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import make_model, regression_data
from sparkdl_avg import ConfigurationError, ParameterAveragingTrainer, warm_up
from sparkdl_avg.shared.model.tracing import WarmReplica, likely_signature


def _fit(model, data):
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=4, seed=0,
                                        slow_warning=False)
    trainer.fit(data, epochs=1, verbose=0)
    return trainer


def test_the_first_fit_after_warm_up_with_the_model_neither_builds_nor_traces(spark):
    data = regression_data(128, out=1)
    model = make_model(hidden=13)  # an architecture no other test builds: no worker has its replica
    pids = warm_up(spark, model).result(timeout=300)
    trainer = _fit(model, data)
    first = trainer.stats.records[0]
    assert {w.pid for w in first.workers} <= set(pids)
    assert [w.replica_built for w in first.workers] == [False, False]
    assert [w.traced for w in first.workers] == [False, False]
    startup = trainer.stats.startup
    assert startup["build_s"] == 0.0 and startup["trace_s"] == 0.0
    assert 0 <= startup["driver_s"] < startup["to_round1_end_s"]
    # Nothing was trained by the warm-up: the same fit again (replica cached either way) gives the same weights.
    again = _fit(make_model(hidden=13), data)
    for a, b in zip(trainer.model.get_weights(), again.model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_fit_without_warm_up_reports_its_build_and_trace_in_the_startup(spark):
    trainer = _fit(make_model(hidden=11), regression_data(128, out=1))
    startup = trainer.stats.startup
    assert startup["build_s"] > 0 and startup["trace_s"] > 0
    assert startup["round1_s"] >= startup["wait_executors_s"] >= 0
    assert startup["round2_s"] is not None and startup["first_steps_s"] > 0


def test_likely_signature_matches_what_the_fit_stages_for_arrays():
    import keras

    model = keras.Sequential([keras.Input((5, 5, 1)), keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    sig = likely_signature(model)
    assert sig.signature == ((((5, 5, 1), "float32"),), (((), "int32"),), False)
    regression = likely_signature(make_model())
    assert regression.signature == ((((4,), "float64"),), (((1,), "float64"),), False)
    assert WarmReplica.of(model).spec.fingerprint


def test_warm_up_refuses_a_model_that_is_not_compiled(spark):
    with pytest.raises(ConfigurationError, match=r"'model' parameter of warm_up\(\) must be a compiled keras.Model"):
        warm_up(spark, make_model(compile=False))
