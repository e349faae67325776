"""Models with several inputs and outputs: lists of arrays or of columns, in model order."""

import keras
import numpy as np
import pytest

from conftest import record_jobs
from sparkdl_avg import DataError, ParameterAveragingTrainer

N = 96


def two_in_two_out(seed=0):
    """Inputs a (3,) and b (2, 2); outputs a value and 3 class probabilities (float64)."""
    keras.utils.set_random_seed(seed)
    a = keras.Input((3,), dtype="float64", name="a")
    b = keras.Input((2, 2), dtype="float64", name="b")
    h = keras.layers.Concatenate(dtype="float64")([a, keras.layers.Flatten(dtype="float64")(b)])
    h = keras.layers.Dense(6, activation="tanh", dtype="float64")(h)
    value = keras.layers.Dense(1, dtype="float64", name="value")(h)
    klass = keras.layers.Dense(3, activation="softmax", dtype="float64", name="klass")(h)
    model = keras.Model([a, b], [value, klass])
    model.compile(
        keras.optimizers.SGD(0.05, momentum=0.9),
        loss=["mse", "sparse_categorical_crossentropy"],
    )
    return model


def data(seed=0):
    rng = np.random.default_rng(seed)
    xa = rng.normal(size=(N, 3)).astype(np.float32).astype(np.float64)
    xb = rng.normal(size=(N, 2, 2)).astype(np.float32).astype(np.float64)
    y1 = (xa.sum(axis=1, keepdims=True) - xb[:, 0, :1]).astype(np.float32).astype(np.float64)
    y2 = rng.integers(0, 3, size=N)
    return [xa, xb], [y1, y2]


def dataframe(spark, x, y):
    rows = [
        (x[0][i].tolist(), x[1][i].reshape(-1).tolist(), float(y[0][i, 0]), int(y[1][i]))
        for i in range(N)
    ]
    return spark.createDataFrame(rows, "a array<double>, b array<double>, y1 double, y2 int")


def fit_with(spark, data_, workers, **kwargs):
    model = two_in_two_out()
    trainer = ParameterAveragingTrainer(model, num_workers=workers, batch_size=8, averaging_frequency=3, seed=0)
    history = trainer.fit(data_, epochs=2, shuffle=False, verbose=0, **kwargs)
    return trainer, model, history


def test_one_worker_equals_sequential_keras(spark, floatx64):
    x, y = data()
    _, model, history = fit_with(spark, (x, y), workers=1)
    ref = two_in_two_out()
    ref_history = ref.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-10, rtol=0)
    for key in ("loss", "value_loss", "klass_loss"):
        np.testing.assert_allclose(history.history[key], ref_history.history[key], rtol=1e-9)


def test_dataframe_columns_and_rdd_equal_numpy_arrays(spark, floatx64):
    x, y = data(1)
    _, from_arrays, _ = fit_with(spark, (x, y), workers=2)
    _, from_df, _ = fit_with(spark, dataframe(spark, x, y), workers=2, features_col=["a", "b"], label_col=["y1", "y2"])
    pairs = [((x[0][i], x[1][i]), (y[0][i], y[1][i])) for i in range(N)]
    _, from_rdd, _ = fit_with(spark, spark.sparkContext.parallelize(pairs, 3), workers=2)
    for a, d, r in zip(from_arrays.get_weights(), from_df.get_weights(), from_rdd.get_weights()):
        np.testing.assert_allclose(d, a, atol=1e-12, rtol=0)
        np.testing.assert_allclose(r, a, atol=1e-12, rtol=0)


def test_evaluate_and_predict_match_keras(spark, floatx64):
    x, y = data(2)
    trainer, model, _ = fit_with(spark, (x, y), workers=2)
    df = dataframe(spark, x, y)
    got = trainer.evaluate(df, features_col=["a", "b"], label_col=["y1", "y2"], return_dict=True)
    want = model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
    assert set(got) == set(want)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key

    out = trainer.predict(df, features_col=["a", "b"]).orderBy("y1").toPandas()
    assert "probability" not in out.columns  # several outputs: values, not a classifier
    value, klass = model.predict(x, verbose=0)
    expected = np.concatenate([value, klass], axis=1)[np.argsort(y[0][:, 0], kind="stable")]
    np.testing.assert_allclose(np.stack(out["prediction"].to_numpy()), expected, atol=1e-6)


def test_column_count_must_match_the_model_before_any_job(spark):
    x, y = data(3)
    df = dataframe(spark, x, y)
    trainer = ParameterAveragingTrainer(two_in_two_out(), num_workers=2, batch_size=8)
    with record_jobs(spark) as jobs:
        with pytest.raises(DataError, match=r"2 input\(s\); 'features_col' must name one column per input.*features_col='a'"):
            trainer.fit(df, features_col="a", label_col=["y1", "y2"], verbose=0)
        with pytest.raises(DataError, match=r"2 output\(s\); 'label_col' must name one column per output"):
            trainer.fit(df, features_col=["a", "b"], label_col="y1", verbose=0)
        with pytest.raises(DataError, match=r"2 input\(s\) and 2 output\(s\).*gives 1 feature array"):
            trainer.fit((x[0], y), verbose=0)
    assert jobs.job_ids == []


def test_wrong_width_of_the_second_input_column_names_it(spark):
    x, y = data(4)
    rows = [(x[0][i].tolist(), [1.0, 2.0, 3.0], float(y[0][i, 0]), int(y[1][i])) for i in range(N)]
    df = spark.createDataFrame(rows, "a array<double>, bee array<double>, y1 double, y2 int")
    trainer = ParameterAveragingTrainer(two_in_two_out(), num_workers=2, batch_size=8)
    with pytest.raises(DataError, match=r"Column 'bee' has a row of 3 values; expected 4"):
        trainer.fit(df, features_col=["a", "bee"], label_col=["y1", "y2"], verbose=0)


def test_estimator_with_several_feature_and_label_columns(spark, tmp_path):
    from sparkdl_avg.ml import KerasAveragingEstimator, KerasAveragingModel

    x, y = data(5)
    df = dataframe(spark, x, y)
    est = KerasAveragingEstimator(
        kerasModel=two_in_two_out(),
        featuresCols=["a", "b"],
        labelCols=["y1", "y2"],
        numWorkers=2,
        batchSize=8,
        averagingFrequency=2,
        epochs=2,
        seed=3,
    )
    fitted = est.fit(df)
    assert len(fitted.history.history["value_loss"]) == 2
    out = fitted.transform(df).select("y1", "prediction").toPandas()
    value, klass = fitted.kerasModel.predict(x, verbose=0)
    np.testing.assert_allclose(np.stack(out["prediction"].to_numpy()), np.concatenate([value, klass], axis=1), atol=1e-5)
    fitted.save(str(tmp_path / "m"))
    again = KerasAveragingModel.load(str(tmp_path / "m"))
    assert again.getFeaturesCols() == ["a", "b"]
    reloaded = again.transform(df).select("prediction").toPandas()
    np.testing.assert_array_equal(np.stack(reloaded["prediction"].to_numpy()), np.stack(out["prediction"].to_numpy()))
