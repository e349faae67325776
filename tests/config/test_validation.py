"""Invalid arguments and data raise typed errors that name what was wrong.

``ConfigurationError`` and ``DataError`` subclass ``ValueError``. Errors that
can be found on the driver must be raised before any Spark job starts; the
``record_jobs`` helper runs the call in its own job group and returns the
jobs it started.
"""

import os
import re

import numpy as np
import pytest

import keras

from conftest import make_model, record_jobs, regression_data
from sparkdl_avg import ConfigurationError, DataError, ParameterAveragingTrainer, TrainerConfig, WorkerError


@pytest.fixture(scope="module")
def model():
    return make_model(optimizer=keras.optimizers.SGD(0.1), seed=0)


@pytest.fixture(scope="module")
def xy():
    return regression_data(64, seed=0)


def test_error_types_subclass_standard_exceptions():
    assert issubclass(ConfigurationError, ValueError)
    assert issubclass(DataError, ValueError)
    assert issubclass(WorkerError, RuntimeError)


# ------------------------------------------------------------------ constructor


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        (dict(batch_size=0), r"'batch_size'.*\[1, inf\).*Got 0 instead"),
        (dict(batch_size=-3), r"'batch_size'.*Got -3 instead"),
        (dict(batch_size=2.5), r"'batch_size'.*Got 2\.5 instead"),
        (dict(batch_size=True), r"'batch_size'.*Got True instead"),
        (dict(batch_size="32"), r"'batch_size'.*Got '32' instead"),
        (dict(averaging_frequency=0), r"'averaging_frequency'.*Got 0 instead"),
        (dict(aggregation_depth=0), r"'aggregation_depth'.*Got 0 instead"),
        (dict(num_workers=0), r"'num_workers'.*or None.*Got 0 instead"),
        (dict(num_workers=1.0), r"'num_workers'.*Got 1\.0 instead"),
        (dict(seed=-1), r"'seed'.*Got -1 instead"),
        (dict(optimizer_state="bogus"), r"'optimizer_state'.*'average', 'reset'.*Got 'bogus' instead"),
        (dict(update_rule="x"), r"'update_rule'.*Got 'x' instead"),
        (dict(staging_dir=""), r"'staging_dir'.*Got '' instead"),
        (dict(staging_dir=3), r"'staging_dir'.*Got 3 instead"),
    ],
)
def test_invalid_constructor_arguments(spark, model, kwargs, pattern):
    with record_jobs(spark) as jobs:
        with pytest.raises(ConfigurationError, match=pattern):
            ParameterAveragingTrainer(model, **kwargs)
    assert jobs.job_ids == []


@pytest.mark.parametrize("kwargs", [dict(batch_size=0), dict(optimizer_state="bogus"), dict(averaging_frequency=-1)])
def test_trainer_config_is_the_single_validator(kwargs):
    with pytest.raises(ConfigurationError) as trainer_error:
        ParameterAveragingTrainer(make_model(seed=1), **kwargs)
    with pytest.raises(ConfigurationError) as config_error:
        TrainerConfig(**kwargs)
    assert str(trainer_error.value) == str(config_error.value)


@pytest.mark.parametrize(
    "kwargs,needles",
    [
        (dict(staleness=5), ["'staleness'", "'synchronization'", "'stale'",
                             "Got staleness=5 with synchronization='sync' instead."]),
        (dict(staleness=0, synchronization="sync"), ["'staleness'", "Got staleness=0 with synchronization='sync'"]),
        (dict(aggregation="driver", aggregation_shards=4),
         ["'aggregation_shards'", "'aggregation'", "'shuffle', 'storage' or 'auto'",
          "Got aggregation_shards=4 with aggregation='driver' instead."]),
        (dict(state_transport="sql", aggregation="files", aggregation_shards=2),
         ["'aggregation_shards'", "Got aggregation_shards=2 with aggregation='files' instead."]),
        (dict(state_transport="spark", aggregation="shuffle"),
         ["'aggregation'", "'state_transport'", "'sql'",
          "Got aggregation='shuffle' with state_transport='spark' instead."]),
        (dict(state_transport="files", aggregation="driver"),
         ["'aggregation'", "Got aggregation='driver' with state_transport='files' instead."]),
        # issue 38: these were silently ignored
        (dict(state_transport="files", aggregation_shards=2),
         ["'aggregation_shards'", "'state_transport'", "'sql' or 'auto'",
          "Got aggregation_shards=2 with state_transport='files' instead."]),
        (dict(state_transport="spark", aggregation_shards=2), ["Got aggregation_shards=2 with state_transport='spark'"]),
        (dict(staleness_aware=False),
         ["'staleness_aware'", "'stale' or 'async'", "Got staleness_aware=False with synchronization='sync' instead."]),
        (dict(aggregation="storage", aggregation_shards=10**6),
         ["'aggregation_shards'", "must be an int in the range [1, 1024] or None. Got 1000000 instead."]),
    ],
)
def test_options_that_would_be_ignored_are_refused_at_construction(kwargs, needles):
    with pytest.raises(ConfigurationError) as err:
        TrainerConfig(**kwargs)
    for needle in needles:
        assert needle in str(err.value), str(err.value)
    with pytest.raises(ConfigurationError) as trainer_err:
        ParameterAveragingTrainer(make_model(seed=1), **kwargs)
    assert str(trainer_err.value) == str(err.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(synchronization="stale", staleness=5),
        dict(synchronization="async", staleness=2),
        dict(aggregation="shuffle", aggregation_shards=4),
        dict(aggregation="storage", aggregation_shards=4),
        dict(aggregation="auto", aggregation_shards=4),
        dict(state_transport="sql", aggregation="driver"),
        dict(state_transport="auto", aggregation="storage"),
        dict(state_transport="spark", aggregation="auto"),
        dict(synchronization="stale", staleness_aware=False),
        dict(aggregation="storage", aggregation_shards=1024),
    ],
)
def test_options_that_apply_are_accepted(kwargs):
    TrainerConfig(**kwargs)


def test_more_aggregation_shards_than_the_model_has_parameters_are_refused(model):
    parameters = model.count_params()
    with pytest.raises(ConfigurationError) as err:
        ParameterAveragingTrainer(model, aggregation="storage", aggregation_shards=parameters + 1)
    assert str(err.value).startswith(
        f"The 'aggregation_shards' parameter must be at most the model's {parameters} parameters")
    assert f"Got aggregation_shards={parameters + 1} instead." in str(err.value)
    ParameterAveragingTrainer(model, aggregation="storage", aggregation_shards=parameters)


def test_valid_arguments_are_stored_unchanged(model):
    trainer = ParameterAveragingTrainer(
        model, num_workers=3, batch_size=4, averaging_frequency=2, aggregation_depth=3, optimizer_state="reset", seed=5
    )
    assert trainer.config == TrainerConfig(
        num_workers=3, batch_size=4, averaging_frequency=2, aggregation_depth=3, optimizer_state="reset", seed=5
    )


def test_uncompiled_model(spark):
    uncompiled = make_model(compile=False, seed=2)
    with record_jobs(spark) as jobs:
        with pytest.raises(ConfigurationError, match=r"compiled.*uncompiled model") as err:
            ParameterAveragingTrainer(uncompiled)
    assert uncompiled.name in str(err.value)
    assert jobs.job_ids == []


@pytest.mark.parametrize("not_a_model", ["model.keras", None, 42, object()])
def test_not_a_model(spark, not_a_model):
    with record_jobs(spark) as jobs:
        with pytest.raises(ConfigurationError, match="keras.Model") as err:
            ParameterAveragingTrainer(not_a_model)
    assert str(err.value).startswith(f"The 'model' parameter must be a compiled keras.Model. Got {not_a_model!r} ")
    assert type(not_a_model).__name__ in str(err.value)
    assert jobs.job_ids == []


def test_model_with_two_inputs_is_accepted():
    # Several inputs are supported (tests/data/test_multi_io.py); the check is per input.
    a, b = keras.Input((2,), dtype="float64"), keras.Input((None, 3), dtype="float64")
    pooled = keras.layers.GlobalAveragePooling1D(dtype="float64")(b)
    out = keras.layers.Dense(1, dtype="float64")(keras.layers.Concatenate(dtype="float64")([a, pooled]))
    two = keras.Model([a, b], out)
    two.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ConfigurationError, match=r"fully defined input shapes.*None, None, 3"):
        ParameterAveragingTrainer(two)
    c = keras.Input((3,), dtype="float64")
    fine = keras.Model([a, c], keras.layers.Dense(1, dtype="float64")(keras.layers.Concatenate(dtype="float64")([a, c])))
    fine.compile(optimizer="sgd", loss="mse")
    assert ParameterAveragingTrainer(fine).model is fine


def test_model_with_undefined_input_shape():
    inp = keras.Input((None, 3), dtype="float64")
    out = keras.layers.Dense(1, dtype="float64")(keras.layers.GlobalAveragePooling1D(dtype="float64")(inp))
    m = keras.Model(inp, out)
    m.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ConfigurationError, match=r"fully defined input shape.*None, None, 3"):
        ParameterAveragingTrainer(m)


# ------------------------------------------------------------------ fit / evaluate arguments


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        (dict(epochs=0), r"'epochs'.*Got 0 instead"),
        (dict(epochs=-2), r"'epochs'.*Got -2 instead"),
        (dict(epochs=1.5), r"'epochs'.*Got 1\.5 instead"),
        (dict(epochs=True), r"'epochs'.*Got True instead"),
        (dict(verbose=5), r"'verbose'.*Got 5 instead"),
        (dict(verbose="loud"), r"'verbose'.*Got 'loud' instead"),
        # issue 38: nothing was checkpointed, without a word
        (dict(checkpoint_every=2), r"^The 'checkpoint_every' parameter applies only with a 'checkpoint_dir' .*"
                                   r"Got checkpoint_every=2 without a 'checkpoint_dir' instead\.$"),
    ],
)
def test_invalid_fit_arguments(spark, model, xy, kwargs, pattern):
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8)
    before = model.get_weights()
    with record_jobs(spark) as jobs:
        with pytest.raises(ConfigurationError, match=pattern):
            trainer.fit(xy, **kwargs)
    assert jobs.job_ids == []
    assert len(trainer.stats) == 0
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_class_weight_for_a_class_the_model_lacks_is_refused_before_any_job(spark, xy):
    """A bad-input trial (issue 38): class_weight={12: 2.0} on a 10-class model trained without a word."""
    x, _ = xy
    classifier = make_model(outputs=10, output_activation="softmax", loss="sparse_categorical_crossentropy",
                            metrics=(), seed=1)
    with record_jobs(spark) as jobs:
        with pytest.raises(ConfigurationError) as err:
            ParameterAveragingTrainer(classifier, num_workers=2, batch_size=8).fit(
                (x, np.arange(len(x)) % 10), class_weight={0: 1.0, 12: 2.0}, verbose=0)
    assert str(err.value) == (
        "The 'class_weight' parameter names class 12, which the model does not have: its loss "
        "'sparse_categorical_crossentropy' takes classes 0..9, so that weight would never apply. Got "
        "class_weight={0: 1.0, 12: 2.0} instead.")
    assert jobs.job_ids == []


def test_a_model_compiled_without_a_loss_is_refused_by_fit_and_evaluate_before_any_job(spark, xy):
    """A bad-input trial (issue 38): Keras' "No loss to compute" came from every worker's first minibatch."""
    lossless = make_model(compile=False, seed=1)
    lossless.compile("adam")
    trainer = ParameterAveragingTrainer(lossless, num_workers=2, batch_size=8)  # predict needs no loss
    with record_jobs(spark) as jobs:
        for call, what in ((lambda: trainer.fit(xy, verbose=0), "fit"), (lambda: trainer.evaluate(xy), "evaluate")):
            with pytest.raises(ConfigurationError) as err:
                call()
            assert str(err.value) == (
                f"The 'model' parameter must be compiled with a loss to {what}. Got the model {lossless.name!r}, "
                "compiled without one, instead; call model.compile(optimizer=..., loss=...).")
    assert jobs.job_ids == []


def _unregistered_metric(y_true, y_pred):
    return keras.ops.mean(keras.ops.abs(y_true - y_pred))


def test_evaluate_refuses_a_model_executors_cannot_rebuild_before_any_job(spark, xy):
    """A fresh trial (issue 60): evaluate sent it to every task, whose failure came back under pages of py4j frames."""
    custom = make_model(compile=False, seed=1)
    custom.compile("sgd", "mse", metrics=[_unregistered_metric])
    with record_jobs(spark) as jobs:
        with pytest.raises(ConfigurationError, match=r"^The model cannot be rebuilt from its Keras config, as executors "
                                                     r"must\. .* Keras said: TypeError: Could not locate function "
                                                     r"'_unregistered_metric'\.") as err:
            ParameterAveragingTrainer(custom, num_workers=2, batch_size=8).evaluate(xy)
    assert err.value.__cause__ is None and jobs.job_ids == []


def test_evaluate_refuses_a_return_dict_that_is_not_a_bool(spark, model, xy):
    with pytest.raises(ConfigurationError, match=r"^The 'return_dict' parameter must be True or False\. Got 'False' "
                                                 r"instead\.$"):
        ParameterAveragingTrainer(model, num_workers=2, batch_size=8).evaluate(xy, return_dict="False")


@pytest.mark.parametrize("columns, message", [
    (dict(prediction_col="p", probability_col="p"),
     "The 'prediction_col' and 'probability_col' parameters must name different columns. Got 'p' for both instead; "
     "pass probability_col=None to omit it."),
    (dict(prediction_col=""), "The 'prediction_col' parameter must be a column name. Got '' instead."),
    (dict(probability_col=" "), "The 'probability_col' parameter must be a column name or None (no probabilities). "
                                "Got ' ' instead."),
])
def test_predict_refuses_output_columns_that_clash_or_are_blank(spark, model, frames, columns, message):
    """A bad-input trial (issue 38): both gave a DataFrame with a duplicate or an empty column name."""
    with record_jobs(spark) as jobs:
        with pytest.raises(ConfigurationError) as err:
            ParameterAveragingTrainer(model, num_workers=2, batch_size=8).predict(frames["good"], **columns)
    assert str(err.value) == message
    assert jobs.job_ids == []


def test_invalid_evaluate_batch_size(spark, model, xy):
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8)
    with record_jobs(spark) as jobs:
        with pytest.raises(ConfigurationError, match=r"'batch_size'.*Got 0 instead"):
            trainer.evaluate(xy, batch_size=0)
    assert jobs.job_ids == []


# ------------------------------------------------------------------ numpy data


def fit_error(spark, model, data, expected=DataError, **trainer_kwargs):
    trainer = ParameterAveragingTrainer(model, **{"num_workers": 2, "batch_size": 8, **trainer_kwargs})
    with record_jobs(spark) as jobs:
        with pytest.raises(expected) as err:
            trainer.fit(data, epochs=1, verbose=0)
    assert len(trainer.stats) == 0  # no round ran
    return str(err.value), jobs.job_ids


def test_numpy_length_mismatch(spark, model, xy):
    x, y = xy
    message, jobs = fit_error(spark, model, (x, y[:-3]))
    assert "same number of examples" in message
    assert "x with 64" in message and "y with 61" in message
    assert jobs == []


@pytest.mark.parametrize("x", [np.zeros((0, 4)), np.zeros((0,)), np.float64(3.0)], ids=["0x4", "0", "scalar"])
def test_numpy_empty_arrays(spark, model, x):
    message, jobs = fit_error(spark, model, (x, np.zeros((0,))))
    assert "empty" in message and f"shape {x.shape}" in message
    assert jobs == []


def test_numpy_wrong_feature_width(spark, model):
    message, jobs = fit_error(spark, model, (np.zeros((64, 5)), np.zeros(64)))
    assert "input shape (4,)" in message and "(64, 5)" in message
    assert jobs == []


def test_numpy_non_numeric_labels(spark, model):
    message, jobs = fit_error(spark, model, (np.zeros((64, 4)), np.array(["a"] * 64)))
    assert "array y must be numeric" in message and "<U1" in message
    assert jobs == []


def test_fewer_examples_than_one_round_needs(spark, model, xy):
    x, y = xy
    message, jobs = fit_error(spark, model, (x[:15], y[:15]), num_workers=2, batch_size=8)
    assert "15 examples" in message
    assert "num_workers * batch_size = 2 * 8 = 16" in message
    assert jobs == []


@pytest.mark.parametrize("data", [{"x": 1}, (np.zeros((4, 4)),), "data.csv", [np.zeros((4, 4))] * 3])
def test_unsupported_data_kind(spark, model, data):
    message, jobs = fit_error(spark, model, data)
    assert "Spark DataFrame" in message and f"Got {type(data).__name__} instead" in message
    assert jobs == []


def test_pandas_dataframe_is_refused_with_how_to_convert(spark, model, xy):
    import pandas as pd

    x, y = xy
    pdf = pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "d": x[:, 3], "label": y})
    message, jobs = fit_error(spark, model, pdf)
    assert "Got a pandas DataFrame instead" in message
    assert "spark.createDataFrame(pdf)" in message
    assert "(pdf[features].to_numpy(), pdf[label].to_numpy())" in message
    assert jobs == []
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8)
    with pytest.raises(DataError, match=r"The validation data .* Got a pandas DataFrame instead"):
        trainer.fit((x, y), validation_data=pdf, epochs=1, verbose=0)
    with pytest.raises(DataError, match=r"The evaluation data .* Got a pandas DataFrame instead"):
        trainer.evaluate(pdf)


def test_more_workers_than_task_slots_warns_once(spark, xy, caplog):
    import logging

    slots = spark.sparkContext.defaultParallelism
    x, y = xy
    trainer = ParameterAveragingTrainer(make_model(seed=3), num_workers=slots * 2, batch_size=4,
                                        averaging_frequency=2, slow_warning=False)
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        trainer.fit((x, y), epochs=1, verbose=0)
    warned = [r.getMessage() for r in caplog.records if r.name == "sparkdl_avg" and "task slots" in r.getMessage()]
    assert len(warned) == 1, warned
    assert f"num_workers={slots * 2}" in warned[0] and f"only {slots} workers run at once" in warned[0]
    assert "2.0x as long" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        ParameterAveragingTrainer(make_model(seed=3), num_workers=slots, batch_size=4, averaging_frequency=2,
                                  slow_warning=False).fit((x, y), epochs=1, verbose=0)
    assert not [r for r in caplog.records if "task slots" in r.getMessage()]


# ------------------------------------------------------------------ DataFrames


@pytest.fixture(scope="module")
def frames(spark, xy):
    x, y = xy
    rows = [(row.tolist(), float(label), "s") for row, label in zip(x, y)]
    good = spark.createDataFrame(rows, "features array<double>, label double, text string")
    return {"good": good}


def test_dataframe_missing_features_column(spark, model, frames):
    df = frames["good"].withColumnRenamed("features", "inputs")
    message, jobs = fit_error(spark, model, df)
    assert "Column 'features' ('features_col') is not in the training DataFrame" in message
    assert "'inputs'" in message and "'label'" in message
    assert jobs == []


def test_dataframe_missing_label_column(spark, model, frames):
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8)
    with record_jobs(spark) as jobs:
        with pytest.raises(DataError, match=r"Column 'y' \('label_col'\) is not in the training DataFrame"):
            trainer.fit(frames["good"], label_col="y", verbose=0)
    assert jobs.job_ids == []


def test_dataframe_string_features_column(spark, model, frames):
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8)
    with record_jobs(spark) as jobs:
        with pytest.raises(DataError, match=r"Column 'text' must be array<float>, array<double> or a pyspark.ml Vector. Got string instead"):
            trainer.fit(frames["good"], features_col="text", verbose=0)
    assert jobs.job_ids == []


def test_dataframe_string_label_column(spark, model, frames):
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8)
    with record_jobs(spark) as jobs:
        with pytest.raises(DataError, match=r"Column 'text' must be numeric.*Got string instead"):
            trainer.fit(frames["good"], label_col="text", verbose=0)
    assert jobs.job_ids == []


def test_dataframe_array_width_mismatch_is_found_by_the_staging_job(spark, model, frames):
    df = frames["good"].selectExpr("slice(features, 1, 3) AS features", "label")
    message, jobs = fit_error(spark, model, df)
    assert "Column 'features'" in message
    assert "row of 3 values" in message and "expected 4 values per row" in message
    # the check ran on the executors (and the job recorder does see jobs)
    assert len(jobs) >= 1


def test_dataframe_array_with_null_row(spark, model, xy):
    x, y = xy
    rows = [(row.tolist(), float(label)) for row, label in zip(x, y)]
    rows[5] = (None, rows[5][1])
    df = spark.createDataFrame(rows, "features array<double>, label double")
    message, _ = fit_error(spark, model, df)
    assert "Column 'features' contains null rows" in message


def test_dataframe_vector_width_mismatch_from_assembler_metadata(spark, model, xy):
    from pyspark.ml.feature import VectorAssembler

    x, y = xy
    raw = spark.createDataFrame([(float(a), float(b), float(c), float(l)) for (a, b, c, _), l in zip(x, y)], ["a", "b", "c", "label"])
    df = VectorAssembler(inputCols=["a", "b", "c"], outputCol="features").transform(raw)
    message, jobs = fit_error(spark, model, df)
    assert "Column 'features' holds vectors of size 3; expected 4" in message
    assert jobs == []


def test_dataframe_fewer_examples_than_one_round_needs(spark, model, frames):
    message, _ = fit_error(spark, model, frames["good"].limit(10), num_workers=2, batch_size=8)
    assert "10 examples" in message and "= 16" in message


def test_dataframe_empty(spark, model, frames):
    message, _ = fit_error(spark, model, frames["good"].limit(0))
    assert "The training data is empty (0 rows)" in message


def test_validation_data_errors_name_the_validation_data(spark, model, xy, frames):
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8)
    x, y = xy
    with pytest.raises(DataError, match=r"not in the validation DataFrame"):
        trainer.fit((x, y), validation_data=frames["good"].drop("label"), verbose=0)
    assert len(trainer.stats) == 0
    # issue 38: a row of the wrong width, found by the staging job, did not say it was the validation data
    wide = spark.createDataFrame([(row.tolist() * 2, float(label)) for row, label in zip(x, y)],
                                 "features array<double>, label double")
    with pytest.raises(DataError) as err:
        trainer.fit((x, y), validation_data=wide, verbose=0)
    assert str(err.value).startswith("In the validation data: Column 'features' has a row of 8 values; expected 4 "
                                     "values per row"), str(err.value)
    assert len(trainer.stats) == 0


# ------------------------------------------------------------------ RDDs


def test_rdd_element_width_mismatch(spark, model):
    rdd = spark.sparkContext.parallelize([(np.zeros(3), 0.0)] * 32, 2)
    message, jobs = fit_error(spark, model, rdd)
    assert re.search(r"RDD element 0 of partition \d has features of 3 values; expected 4", message)
    assert len(jobs) >= 1


def test_rdd_elements_not_pairs(spark, model):
    rdd = spark.sparkContext.parallelize([np.zeros(4)] * 32, 2)
    message, _ = fit_error(spark, model, rdd)
    assert "RDD elements must be (x, y) pairs" in message and "ndarray" in message


# ------------------------------------------------------------------ executor failures


def test_failure_on_the_executors_is_a_worker_error(spark):
    """Labels out of the softmax's range fail inside Keras on the executors (staging checks off)."""
    m = make_model(outputs=3, output_activation="softmax", loss="sparse_categorical_crossentropy", metrics=(), seed=3)
    x = regression_data(32, seed=3)[0]
    labels = np.full(32, 7, dtype=np.int64)
    trainer = ParameterAveragingTrainer(m, num_workers=2, batch_size=8, averaging_frequency=1, check_data=False)
    before = m.get_weights()
    with pytest.raises(WorkerError, match=r"Worker [01] failed in epoch 0, round 0: InvalidArgumentError: .*label value of 7"):
        trainer.fit((x, labels), verbose=0)
    assert len(trainer.stats) == 0
    for a, b in zip(before, m.get_weights()):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ former library bugs (fixed)


def test_numpy_integers_are_accepted_by_the_constructor(model):
    trainer = ParameterAveragingTrainer(model, num_workers=np.int64(2), batch_size=np.int32(8), averaging_frequency=np.int64(3))
    assert trainer.config.batch_size == 8


def test_fit_accepts_numpy_integer_epochs(spark, model, xy):
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8)
    history = trainer.fit(xy, epochs=np.int64(2), verbose=0)
    assert len(history.history["loss"]) == 2


def _worker_error_message(spark):
    m = make_model(outputs=3, output_activation="softmax", loss="sparse_categorical_crossentropy", metrics=(), seed=4)
    x = regression_data(32, seed=4)[0]
    trainer = ParameterAveragingTrainer(m, num_workers=2, batch_size=8, averaging_frequency=1, check_data=False)
    with pytest.raises(WorkerError) as err:
        trainer.fit((x, np.full(32, 7, dtype=np.int64)), verbose=0)
    return str(err.value)


def test_worker_error_names_the_worker(spark):
    assert re.search(r"[Ww]orker \d", _worker_error_message(spark))


def test_worker_error_keeps_the_cause(spark):
    assert "label value of 7" in _worker_error_message(spark)


# ------------------------------------------------------------ output locations


@pytest.mark.parametrize("path", ["/proc/x", "/sys/x"])
def test_unwritable_checkpoint_dir_is_refused_naming_it_before_any_job(spark, model, xy, path):
    from sparkdl_avg.errors import PathError

    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8)
    with record_jobs(spark) as jobs:
        with pytest.raises(PathError) as err:
            trainer.fit(xy, verbose=0, checkpoint_dir=path)
    assert str(err.value).startswith(
        f"The 'checkpoint_dir' parameter must be a directory this process can write. Got '{path}' instead: "
    )
    assert jobs.job_ids == [] and len(trainer.stats) == 0


def test_checkpoint_dir_that_is_a_file_is_refused_and_kept(spark, model, xy, tmp_path):
    from sparkdl_avg.errors import PathError

    path = tmp_path / "notes.txt"
    path.write_text("mine")
    with pytest.raises(PathError, match=re.escape(f"Got '{path}' instead: it is a file, not a directory.")):
        ParameterAveragingTrainer(model, num_workers=2, batch_size=8).fit(xy, verbose=0, checkpoint_dir=str(path))
    assert path.read_text() == "mine"


def test_the_writability_probe_leaves_nothing_behind(tmp_path):
    from sparkdl_avg.shared.files import fs

    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "f").write_text("x")
    fs.check_writable(str(tmp_path / "existing"), "The 'checkpoint_dir' parameter")
    fs.check_writable(str(tmp_path / "new" / "deeper"), "The 'checkpoint_dir' parameter")
    assert sorted(os.listdir(tmp_path)) == ["existing"]  # the directories the probe made are gone
    assert os.listdir(tmp_path / "existing") == ["f"]


@pytest.mark.parametrize("kind", ["file", "/proc/x"])
def test_unusable_staging_dir_names_it_and_close_does_not_raise_it_again(spark, model, xy, tmp_path, kind):
    from sparkdl_avg.errors import PathError

    if kind == "file":
        path = tmp_path / "staging"
        path.write_text("mine")
        why = "it is a file, not a directory."
    else:
        path, why = kind, "[Errno 2]"
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, staging_dir=str(path))
    with record_jobs(spark) as jobs:
        with pytest.raises(PathError) as err:
            trainer.fit(xy, verbose=0)
    message = str(err.value)
    assert message.startswith(
        f"The 'staging_dir' parameter must be a directory this process can write. Got '{path}' instead: {why}"
    ), message
    assert "delete" not in message and jobs.job_ids == []
    trainer.close()  # the root was never made: nothing to delete, no second error
    trainer._finalizer()  # what runs at exit: silent too
    if kind == "file":
        assert path.read_text() == "mine"


# ------------------------------------------------------------------- predict


def test_predict_on_a_ragged_row_is_a_data_error_on_the_driver(spark, model, frames):
    from pyspark.errors import PythonException

    df = frames["good"].selectExpr("IF(label > 0, slice(features, 1, 3), features) AS features")
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8)
    with pytest.raises(DataError) as err:
        trainer.predict(df).collect()
    assert str(err.value) == (
        "Column 'features' has a row of 3 values; expected 4 values per row (the model's input or label size)."
    )
    assert isinstance(err.value, PythonException)  # except clauses written for PySpark's error still catch it
    assert trainer.predict(frames["good"]).count() == 64  # other actions are unaffected


# Issue 16, a user's first hour, item 1: predicting on a column that is neither an array nor a Vector.
def test_predict_rejects_an_unsupported_features_column(spark):
    df = spark.createDataFrame([("a",)], "features string")
    with pytest.raises(DataError, match=r"Column 'features' must be array<float>, array<double> or a pyspark.ml "
                                        r"Vector. Got string instead"):
        ParameterAveragingTrainer(make_model(), batch_size=4).predict(df)


def test_every_call_without_a_session_raises_one_error_type(monkeypatch):
    """Issue 29 item 4: warm_up, numpy data and a model path without a session raised DataError in two places and
    ConfigurationError in the third; now SessionError, which both ``except`` clauses still catch."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from sparkdl_avg import SessionError, warm_up
    from sparkdl_avg.ml import KerasAveragingEstimator

    monkeypatch.setattr(SparkSession, "getActiveSession", staticmethod(lambda: None))
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    trainer = ParameterAveragingTrainer(make_model(seed=11), num_workers=1, batch_size=8)
    calls = {
        "warm_up": lambda: warm_up(),
        "fit on numpy": lambda: trainer.fit(regression_data(16, seed=1), verbose=0),
        "estimator from a path": lambda: KerasAveragingEstimator(kerasModel="/tmp/model.keras"),
    }
    for what, call in calls.items():
        with pytest.raises(SessionError, match="SparkSession") as caught:
            call()
        assert isinstance(caught.value, DataError) and isinstance(caught.value, ConfigurationError), what


def test_write_report_before_any_fit_is_a_not_fitted_error():
    from sparkdl_avg import NotFittedError

    trainer = ParameterAveragingTrainer(make_model(seed=11), num_workers=1, batch_size=8)
    with pytest.raises(NotFittedError, match=r"write_report\(\) needs a completed fit\(\)"):
        trainer.write_report("report.html")
