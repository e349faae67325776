"""The Spark ML layer (``KerasAveragingEstimator``/``KerasAveragingModel``) and distributed inference.

Covers a full ``Pipeline`` (assembler, scaler, indexer, estimator) with
persistence, predictions checked against ``keras.Model.predict``, the
trainer's ``predict``/``evaluate`` (also on Vectors read from Parquet, and
through ``jobs/predict.py``), stage persistence on its own, refitting, the
fitted model's Keras ``History``, tuning, and the errors raised before any
training round, which name the camelCase Params (``kerasModel``).

Data sets are scikit-learn's bundled ones (no downloads), kept small.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import keras

from conftest import make_model, record_jobs, regression_data, run_job_in_process
from parity import EstimatorPathMixin
from sparkdl_avg import ConfigurationError, DataError, ParameterAveragingTrainer
from sparkdl_avg.shared.errors import remote_errors
from sparkdl_avg.ml import KERAS_FILE, KerasAveragingEstimator, KerasAveragingModel

WINE_CLASSES = 3
N, B = 2, 8  # workers and batch size of the fits on ``regression_df``



# --------------------------------------------------------------------- helpers


def wine_pandas():
    """load_wine as a pandas frame: an ``id``, 13 features ('/' replaced) and a string label."""
    from sklearn.datasets import load_wine

    frame = load_wine(as_frame=True).frame
    frame.columns = [c.replace("/", "_") for c in frame.columns]
    features = [c for c in frame.columns if c != "target"]
    frame["cultivar"] = frame.pop("target").map(lambda t: f"class_{t}")
    frame.insert(0, "id", np.arange(len(frame), dtype=np.int64))
    return frame, features


def classifier(input_dim: int, outputs: int, seed: int = 0):
    """A float64 softmax MLP compiled with sparse categorical cross-entropy."""
    return make_model(
        input_dim=input_dim,
        hidden=16,
        outputs=outputs,
        optimizer=keras.optimizers.Adam(0.02),
        loss="sparse_categorical_crossentropy",
        metrics=("accuracy",),
        output_activation="softmax",
        seed=seed,
    )


def regressor(seed: int = 0):
    return make_model(input_dim=4, hidden=8, outputs=1, optimizer=keras.optimizers.SGD(0.1), seed=seed)


def array_df(spark, x, y, with_vector: bool = True):
    """``id``, ``features`` (array<double>), optionally ``vec`` (Vector), and ``label``."""
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    label_is_int = np.issubdtype(np.asarray(y).dtype, np.integer)
    rows = [
        (i, [float(v) for v in x[i]], int(y[i]) if label_is_int else float(y[i]))
        for i in range(len(x))
    ]
    label_type = "long" if label_is_int else "double"
    df = spark.createDataFrame(rows, f"id long, features array<double>, label {label_type}")
    if with_vector:
        df = df.withColumn("vec", array_to_vector(F.col("features")))
    return df


def collect_sorted(df, *columns):
    return df.select("id", *columns).orderBy("id").collect()


def as_matrix(rows, column):
    """A column of Vectors or arrays as an (n, d) float64 matrix."""
    values = [r[column] for r in rows]
    return np.array([v.toArray() if hasattr(v, "toArray") else v for v in values], dtype=np.float64)


def as_vector(rows, column):
    return np.array([r[column] for r in rows], dtype=np.float64)


def weights_equal(a, b) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b))


def _vector_parquet(spark, path, n=24):
    """Parquet with a Vector ``features`` column, a sparse Vector ``extra`` and an ``id``; returns the features."""
    from pyspark.ml.linalg import Vectors

    x = np.random.default_rng(0).normal(size=(n, 4))
    rows = [(i, Vectors.dense(x[i].tolist()), Vectors.sparse(3, [i % 3], [1.0]), float(i % 2)) for i in range(n)]
    spark.createDataFrame(rows, ["id", "features", "extra", "label"]).write.parquet(str(path))
    return x


# --------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def wine(spark):
    frame, features = wine_pandas()
    return spark.createDataFrame(frame), features


@pytest.fixture(scope="module")
def wine_pipeline(wine):
    """The wine Pipeline, fitted once: (pipeline, pipeline model, input DataFrame, initial Keras model)."""
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import StandardScaler, StringIndexer, VectorAssembler

    df, features = wine
    model = classifier(len(features), WINE_CLASSES)
    estimator = KerasAveragingEstimator(
        kerasModel=model,
        featuresCol="scaled",
        labelCol="label",
        numWorkers=2,
        batchSize=16,
        averagingFrequency=4,
        epochs=10,
        seed=1,
    )
    pipeline = Pipeline(
        stages=[
            VectorAssembler(inputCols=features, outputCol="raw"),
            StandardScaler(inputCol="raw", outputCol="scaled", withMean=True, withStd=True),
            StringIndexer(inputCol="cultivar", outputCol="label"),
            estimator,
        ]
    )
    fitted = pipeline.fit(df)
    return pipeline, fitted, df, model


@pytest.fixture(scope="module")
def binary_fit(spark):
    """A sigmoid classifier trained by the trainer on breast_cancer (standardised, 30 features)."""
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    x, y = x[:256], y[:256].astype(np.int64)
    model = make_model(
        input_dim=x.shape[1],
        hidden=8,
        outputs=1,
        optimizer=keras.optimizers.SGD(0.05),
        loss="binary_crossentropy",
        metrics=("accuracy",),
        output_activation="sigmoid",
        seed=3,
    )
    df = array_df(spark, x, y)
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=4, seed=2)
    trainer.fit(df, epochs=2, verbose=0)
    yield trainer, df, x, y
    trainer.close()


@pytest.fixture(scope="module")
def regression_df(spark):
    """48 rows (``features`` array<double>, ``label``): 3 minibatches of ``B`` per worker per epoch at ``N`` workers."""
    x, y = regression_data(N * B * 3, seed=5)
    return array_df(spark, x, y, with_vector=False)


@pytest.fixture(scope="module")
def regression_fit(spark):
    x, y = regression_data(128, seed=4)
    model = regressor(seed=4)
    df = array_df(spark, x, y)
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=2, seed=5)
    trainer.fit(df, epochs=2, verbose=0)
    yield trainer, df, x, y
    trainer.close()


# --------------------------------------------------------------------- 1. pipeline


def test_pipeline_fit_transform_accuracy_and_persistence(wine_pipeline, tmp_path):
    from pyspark.ml import PipelineModel
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator

    _, fitted, df, _ = wine_pipeline
    stage = fitted.stages[-1]
    assert isinstance(stage, KerasAveragingModel)
    assert len(stage.history.history["loss"]) == 10
    assert stage.history.history["loss"][-1] < stage.history.history["loss"][0]

    out = fitted.transform(df)
    accuracy = MulticlassClassificationEvaluator(
        labelCol="label", predictionCol="prediction", metricName="accuracy"
    ).evaluate(out)
    assert accuracy >= 0.85, accuracy

    path = str(tmp_path / "wine_pipeline")
    fitted.save(path)
    assert os.path.exists(os.path.join(path, "stages"))
    # the stage's class by the path saved pipelines have always recorded (a shim since the driver's folders)
    [keras_stage] = [d for d in os.listdir(os.path.join(path, "stages")) if "KerasAveragingModel" in d]
    metadata = os.path.join(path, "stages", keras_stage, "metadata")
    [part] = [f for f in os.listdir(metadata) if f.startswith("part-")]
    with open(os.path.join(metadata, part)) as f:
        assert json.loads(f.readline())["class"] == "sparkdl_avg.driver.ml.KerasAveragingModel"
    loaded = PipelineModel.load(path)
    assert [type(s).__name__ for s in loaded.stages] == [type(s).__name__ for s in fitted.stages]
    assert isinstance(loaded.stages[-1], KerasAveragingModel)
    assert loaded.stages[-1].getFeaturesCol() == "scaled"
    assert weights_equal(loaded.stages[-1].kerasModel.get_weights(), stage.kerasModel.get_weights())

    original = collect_sorted(out, "probability", "prediction")
    reloaded = collect_sorted(loaded.transform(df), "probability", "prediction")
    assert len(original) == len(reloaded) == df.count()
    np.testing.assert_array_equal(as_matrix(reloaded, "probability"), as_matrix(original, "probability"))
    np.testing.assert_array_equal(as_vector(reloaded, "prediction"), as_vector(original, "prediction"))

    # Saving again to the same path without overwrite() fails and loses nothing.
    with pytest.raises(Exception, match=r"(?i)already exists"):
        fitted.save(path)
    again = PipelineModel.load(path)
    again_rows = collect_sorted(again.transform(df), "probability", "prediction")
    np.testing.assert_array_equal(as_matrix(again_rows, "probability"), as_matrix(original, "probability"))


# --------------------------------------------------------------------- 2. predictions


def test_model_transform_equals_keras_predict(wine_pipeline):
    from pyspark.ml.linalg import DenseVector

    _, fitted, df, _ = wine_pipeline
    stage = fitted.stages[-1]
    prepared = df
    for s in fitted.stages[:-1]:
        prepared = s.transform(prepared)
    out = stage.transform(prepared)
    assert out.columns == prepared.columns + ["prediction", "probability"]
    assert out.schema["probability"].dataType.typeName() == "vectorudt"
    assert out.schema["prediction"].dataType.typeName() == "double"

    rows = collect_sorted(out, "scaled", "probability", "prediction")
    assert all(isinstance(r["probability"], DenseVector) for r in rows)
    x = as_matrix(rows, "scaled")
    expected = stage.kerasModel.predict(x, verbose=0)
    assert expected.shape == (len(rows), WINE_CLASSES)
    probability = as_matrix(rows, "probability")
    np.testing.assert_allclose(probability, expected, atol=1e-5)
    prediction = as_vector(rows, "prediction")
    np.testing.assert_array_equal(prediction, expected.argmax(axis=1).astype(np.float64))
    # Not a constant classifier: the three cultivars are all predicted.
    assert set(prediction.tolist()) == {0.0, 1.0, 2.0}


def test_transform_keeps_input_columns(wine_pipeline, spark):
    from pyspark.ml.linalg import VectorUDT

    _, fitted, _, _ = wine_pipeline
    stage = fitted.stages[-1]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 13))
    df = array_df(spark, x, np.arange(20) % 3).withColumnRenamed("vec", "scaled")
    out = stage.transform(df)
    assert out.columns == df.columns + ["prediction", "probability"]
    for name in df.columns:
        assert out.schema[name].dataType == df.schema[name].dataType
    assert isinstance(out.schema["scaled"].dataType, VectorUDT)
    before = collect_sorted(df, "features", "scaled", "label")
    after = collect_sorted(out, "features", "scaled", "label")
    assert [r.asDict() for r in after] == [r.asDict() for r in before]
    np.testing.assert_array_equal(as_matrix(after, "scaled"), x)
    np.testing.assert_allclose(
        as_matrix(collect_sorted(out, "probability"), "probability"),
        stage.kerasModel.predict(x, verbose=0),
        atol=1e-5,
    )


@pytest.mark.parametrize("features_col", ["features", "vec"])
def test_trainer_predict_binary(binary_fit, features_col):
    trainer, df, x, _ = binary_fit
    out = trainer.predict(df, features_col=features_col)
    assert out.columns == df.columns + ["prediction", "probability"]
    for name in df.columns:
        assert out.schema[name].dataType == df.schema[name].dataType

    rows = collect_sorted(out, "features", "vec", "label", "prediction", "probability")
    before = collect_sorted(df, "features", "vec", "label")
    assert [(r.features, r.vec, r.label) for r in rows] == [(r.features, r.vec, r.label) for r in before]

    p = trainer.model.predict(x, verbose=0)[:, 0]
    probability = as_matrix(rows, "probability")
    assert probability.shape == (len(x), 2)
    np.testing.assert_allclose(probability, np.stack([1 - p, p], axis=1), atol=1e-5)
    prediction = as_vector(rows, "prediction")
    np.testing.assert_array_equal(prediction, (p > 0.5).astype(np.float64))
    # The trained model separates the classes (both predicted, mostly right).
    assert set(prediction.tolist()) == {0.0, 1.0}
    assert np.mean(prediction == as_vector(rows, "label")) > 0.85


@pytest.mark.parametrize("features_col", ["features", "vec"])
def test_trainer_predict_regression(regression_fit, features_col):
    trainer, df, x, _ = regression_fit
    out = trainer.predict(df, features_col=features_col)
    assert "probability" not in out.columns
    assert out.columns == df.columns + ["prediction"]
    assert out.schema["prediction"].dataType.typeName() == "double"
    rows = collect_sorted(out, "features", "vec", "prediction")
    before = collect_sorted(df, "features", "vec")
    assert [(r.features, r.vec) for r in rows] == [(r.features, r.vec) for r in before]
    assert all(isinstance(r.prediction, float) for r in rows)
    expected = trainer.model.predict(x, verbose=0)[:, 0]
    np.testing.assert_allclose(as_vector(rows, "prediction"), expected, atol=1e-5)
    assert np.std(expected) > 1e-3  # not a constant


def test_trainer_predict_multiclass_array_column(wine_pipeline, spark):
    """``trainer.predict`` on a multi-class model with an array<double> features column."""
    _, fitted, _, _ = wine_pipeline
    model = fitted.stages[-1].getKerasModel()
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8)
    x = np.random.default_rng(1).normal(size=(30, 13))
    df = array_df(spark, x, np.arange(30) % 3, with_vector=False)
    rows = collect_sorted(trainer.predict(df, probability_col="proba"), "prediction", "proba")
    expected = model.predict(x, verbose=0)
    np.testing.assert_allclose(as_matrix(rows, "proba"), expected, atol=1e-5)
    np.testing.assert_array_equal(as_vector(rows, "prediction"), expected.argmax(axis=1).astype(np.float64))


# Issue 16, a user's first hour, item 1: Vectors read from Parquet.


def test_predict_on_vectors_read_from_parquet(spark, tmp_path):
    from pyspark.ml.linalg import SparseVector

    x = _vector_parquet(spark, tmp_path / "v.parquet")
    model = make_model()
    trainer = ParameterAveragingTrainer(model, batch_size=4)
    out = trainer.predict(spark.read.parquet(str(tmp_path / "v.parquet")))
    assert out.columns == ["id", "features", "extra", "label", "prediction"]
    rows = sorted(out.collect(), key=lambda r: r.id)
    expected = model.predict(x, verbose=0)[:, 0]
    np.testing.assert_allclose([r.prediction for r in rows], expected, rtol=1e-5, atol=1e-6)  # keras.Model.predict computes in float32
    # The other Vector columns pass through untouched: still sparse, same values.
    assert all(isinstance(r.extra, SparseVector) and r.extra[r.id % 3] == 1.0 for r in rows)


def test_predict_job_on_vectors_read_from_parquet(spark, tmp_path, monkeypatch, capsys):
    x = _vector_parquet(spark, tmp_path / "v.parquet")
    model = make_model()
    model.save(str(tmp_path / "model.keras"))
    # jobs/predict.py's main on this module's session (spark-submit runs it in test_standalone.py)
    code, asked = run_job_in_process(spark, monkeypatch, "predict", "--data", str(tmp_path / "v.parquet"),
                                     "--model", str(tmp_path / "model.keras"), "--output", str(tmp_path / "pred"),
                                     "--no-check-executors")
    out = capsys.readouterr()
    assert code == 0 and asked, (out.out + out.err)[-3000:]
    assert "Wrote 24 predictions" in out.out
    rows = sorted(spark.read.parquet(str(tmp_path / "pred")).collect(), key=lambda r: r.id)
    np.testing.assert_allclose([r.prediction for r in rows], model.predict(x, verbose=0)[:, 0], rtol=1e-5, atol=1e-6)  # keras.Model.predict computes in float32


# --------------------------------------------------------------------- 3. evaluate


def test_trainer_evaluate_equals_keras_evaluate(regression_fit, binary_fit):
    trainer, df, x, y = regression_fit
    got = trainer.evaluate(df, return_dict=True)
    expected = trainer.model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    assert set(got) == set(expected) == {"loss", "mae"}
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-5, rtol=0)

    trainer, df, x, y = binary_fit
    got = trainer.evaluate(df, features_col="vec", return_dict=True)
    expected = trainer.model.evaluate(x, y, verbose=0, return_dict=True)
    assert set(got) == set(expected) == {"loss", "accuracy"}
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-5, rtol=0)


def test_trainer_evaluate_list_regression_order(regression_fit):
    trainer, df, x, y = regression_fit
    got = trainer.evaluate(df)
    expected = trainer.model.evaluate(x, y, verbose=0)
    assert len(got) == len(expected) == 2
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def test_trainer_evaluate_list_is_loss_first(binary_fit):
    trainer, df, x, y = binary_fit
    got = trainer.evaluate(df)
    expected = trainer.model.evaluate(x, y, verbose=0)  # [loss, accuracy]
    assert len(got) == len(expected) == 2
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


# --------------------------------------------------------------------- 4. stage persistence


def test_estimator_save_load_and_fit(spark, tmp_path):
    x, y = regression_data(64, seed=6)
    df = array_df(spark, x, y)
    model = regressor(seed=6)
    est = KerasAveragingEstimator(
        kerasModel=model,
        featuresCol="vec",
        labelCol="label",
        predictionCol="pred",
        numWorkers=2,
        batchSize=8,
        averagingFrequency=3,
        epochs=2,
        optimizerState="reset",
        seed=11,
        shuffle=False,
        inferenceBatchSize=7,
    )
    path = str(tmp_path / "estimator")
    est.save(path)
    assert os.path.isfile(os.path.join(path, KERAS_FILE))
    assert os.path.isdir(os.path.join(path, "metadata"))

    loaded = KerasAveragingEstimator.load(path)
    assert isinstance(loaded, KerasAveragingEstimator)
    assert loaded.uid == est.uid
    for name, value in [
        ("featuresCol", "vec"),
        ("labelCol", "label"),
        ("predictionCol", "pred"),
        ("numWorkers", 2),
        ("batchSize", 8),
        ("averagingFrequency", 3),
        ("epochs", 2),
        ("optimizerState", "reset"),
        ("seed", 11),
        ("shuffle", False),
        ("inferenceBatchSize", 7),
    ]:
        assert loaded.getOrDefault(loaded.getParam(name)) == value, name
    assert weights_equal(loaded.getKerasModel().get_weights(), model.get_weights())

    fitted = loaded.fit(df)
    assert isinstance(fitted, KerasAveragingModel)
    assert fitted.getPredictionCol() == "pred"
    assert fitted.getInferenceBatchSize() == 7
    assert len(fitted.history.history["loss"]) == 2
    assert not weights_equal(fitted.kerasModel.get_weights(), model.get_weights())
    # inferenceBatchSize=7 splits each Arrow batch into several predict_on_batch calls.
    rows = collect_sorted(fitted.transform(df), "pred")
    np.testing.assert_allclose(
        as_vector(rows, "pred"), fitted.kerasModel.predict(x, verbose=0)[:, 0], atol=1e-5
    )
    # The loaded estimator trains like the original one (same params, same seed).
    original = est.fit(df)
    for a, b in zip(fitted.kerasModel.get_weights(), original.kerasModel.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-12, rtol=0)


def test_model_save_load_on_its_own(wine_pipeline, spark, tmp_path):
    _, fitted, df, _ = wine_pipeline
    stage = fitted.stages[-1].copy()
    stage.setPredictionCol("cls").setProbabilityCol("proba")
    path = str(tmp_path / "model")
    stage.save(path)
    assert os.path.isfile(os.path.join(path, KERAS_FILE))
    loaded = KerasAveragingModel.load(path)
    assert isinstance(loaded, KerasAveragingModel)
    assert (loaded.getFeaturesCol(), loaded.getPredictionCol(), loaded.getProbabilityCol()) == (
        "scaled",
        "cls",
        "proba",
    )
    assert weights_equal(loaded.kerasModel.get_weights(), stage.kerasModel.get_weights())
    prepared = df
    for s in fitted.stages[:-1]:
        prepared = s.transform(prepared)
    a = collect_sorted(stage.transform(prepared), "cls", "proba")
    b = collect_sorted(loaded.transform(prepared), "cls", "proba")
    np.testing.assert_array_equal(as_matrix(b, "proba"), as_matrix(a, "proba"))
    np.testing.assert_array_equal(as_vector(b, "cls"), as_vector(a, "cls"))
    with pytest.raises(Exception, match=r"(?i)already exists"):
        stage.save(path)
    # overwrite() replaces the stage, Keras file included.
    other = stage.copy().setPredictionCol("cls2")
    other.write().overwrite().save(path)
    assert KerasAveragingModel.load(path).getPredictionCol() == "cls2"
    assert os.path.isfile(os.path.join(path, KERAS_FILE))


# --------------------------------------------------------------------- 5. refitting, the fitted model's history


def test_estimator_fits_twice_same_result_and_leaves_user_model_alone(spark):
    x, y = regression_data(96, seed=7)
    df = array_df(spark, x, y, with_vector=False)
    model = regressor(seed=7)
    initial = [w.copy() for w in model.get_weights()]
    est = KerasAveragingEstimator(
        kerasModel=model, numWorkers=2, batchSize=8, averagingFrequency=2, epochs=2, seed=3
    )
    first = est.fit(df)
    second = est.fit(df)
    assert weights_equal(model.get_weights(), initial)
    assert weights_equal(est.getKerasModel().get_weights(), initial)
    w1, w2 = first.kerasModel.get_weights(), second.kerasModel.get_weights()
    assert not weights_equal(w1, initial)
    for a, b in zip(w1, w2):
        np.testing.assert_allclose(a, b, atol=1e-12, rtol=0)
    np.testing.assert_allclose(first.history.history["loss"], second.history.history["loss"], atol=1e-12, rtol=0)
    # A different seed changes the data order, hence the result.
    third = est.copy({est.seed: 4}).fit(df)
    assert not weights_equal(third.kerasModel.get_weights(), w1)


# Issue 16, user-reported surprise B2: ``KerasAveragingModel.history`` is a Keras ``History`` like ``trainer.fit``'s.
def test_the_fitted_models_history_is_a_keras_history(spark, regression_df):
    fitted = KerasAveragingEstimator(kerasModel=make_model(seed=1), numWorkers=N, batchSize=B, averagingFrequency=2, epochs=2,
                                     seed=3).fit(regression_df)
    assert isinstance(fitted.history, keras.callbacks.History)
    assert fitted.history.epoch == [0, 1] and len(fitted.history.history["loss"]) == 2
    assert [r.epoch for r in fitted.stats] == [0, 0, 1, 1]


# --------------------------------------------------------------------- 6. tuning


def test_train_validation_split_over_averaging_frequency(spark):
    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.tuning import ParamGridBuilder, TrainValidationSplit

    x, y = regression_data(160, seed=8)
    df = array_df(spark, x, y, with_vector=False)
    est = KerasAveragingEstimator(
        kerasModel=regressor(seed=8), numWorkers=2, batchSize=8, averagingFrequency=2, epochs=2, seed=1
    )
    grid = ParamGridBuilder().addGrid(est.averagingFrequency, [1, 8]).build()
    assert len(grid) == 2
    tvs = TrainValidationSplit(
        estimator=est,
        estimatorParamMaps=grid,
        evaluator=RegressionEvaluator(metricName="rmse"),
        trainRatio=0.75,
        seed=5,
    )
    tuned = tvs.fit(df)
    metrics = tuned.validationMetrics
    assert len(metrics) == 2
    assert all(np.isfinite(m) and m > 0 for m in metrics)
    # Different averaging frequencies train differently.
    assert metrics[0] != metrics[1]
    best = tuned.bestModel
    assert isinstance(best, KerasAveragingModel)
    rows = best.transform(df).select("prediction").collect()
    assert len(rows) == 160
    rmse = RegressionEvaluator(metricName="rmse").evaluate(best.transform(df))
    assert rmse < float(np.std(y))  # better than predicting the mean


# --------------------------------------------------------------------- 7. errors


def _assert_no_jobs(jobs):
    assert jobs.job_ids == [], f"Spark jobs ran: {jobs.job_ids}"


def test_missing_features_column(spark):
    x, y = regression_data(32, seed=9)
    df = array_df(spark, x, y, with_vector=False)
    est = KerasAveragingEstimator(kerasModel=regressor(), featuresCol="nope", numWorkers=2, batchSize=4)
    with record_jobs(spark) as jobs:
        with pytest.raises(DataError, match=r"'nope'") as info:
            est.fit(df)
    _assert_no_jobs(jobs)
    assert "Available columns: ['features', 'id', 'label']" in str(info.value)
    assert "('featuresCol')" in str(info.value)  # the Spark params' names, not the trainer option's


def test_wrong_vector_width_from_assembler_metadata(spark):
    from pyspark.ml.feature import VectorAssembler

    x, y = regression_data(32, d=3, seed=9)
    pdf = {"a": x[:, 0].tolist(), "b": x[:, 1].tolist(), "c": x[:, 2].tolist(), "label": y.tolist()}
    df = spark.createDataFrame(list(zip(*pdf.values())), "a double, b double, c double, label double")
    assembled = VectorAssembler(inputCols=["a", "b", "c"], outputCol="feats").transform(df)
    assert assembled.schema["feats"].metadata["ml_attr"]["num_attrs"] == 3
    est = KerasAveragingEstimator(kerasModel=regressor(), featuresCol="feats", numWorkers=2, batchSize=4)
    with record_jobs(spark) as jobs:
        with pytest.raises(DataError, match=r"'feats'.*size 3.*expected 4"):
            est.fit(assembled)
    _assert_no_jobs(jobs)

    # The fitted-model side checks the same metadata before any job.
    fitted = KerasAveragingModel(kerasModel=regressor(), featuresCol="feats")
    with record_jobs(spark) as jobs:
        with pytest.raises(DataError, match=r"'feats'.*size 3"):
            fitted.transform(assembled)
    _assert_no_jobs(jobs)


def test_string_label_column(spark, wine):
    from pyspark.ml.feature import VectorAssembler

    df, features = wine
    assembled = VectorAssembler(inputCols=features, outputCol="raw").transform(df)
    est = KerasAveragingEstimator(
        kerasModel=classifier(len(features), WINE_CLASSES),
        featuresCol="raw",
        labelCol="cultivar",
        numWorkers=2,
        batchSize=4,
    )
    with record_jobs(spark) as jobs:
        with pytest.raises(DataError, match=r"'cultivar'.*numeric.*string"):
            est.fit(assembled)
    _assert_no_jobs(jobs)


def test_a_param_value_of_the_wrong_type_is_named_as_the_library_names_one():
    """A bad-input trial (issue 38): setEpochs("5") read 'Could not convert 5 to int' (pyspark's TypeError)."""
    with pytest.raises(ConfigurationError) as err:
        KerasAveragingEstimator().setEpochs("5")
    assert str(err.value) == "The 'epochs' parameter must be an int in the range [1, inf). Got '5' instead."
    with pytest.raises(ConfigurationError, match=r"^The 'batchSize' parameter must be an int .* Got 'x' instead\.$"):
        KerasAveragingEstimator(batchSize="x")
    assert KerasAveragingEstimator().setEpochs(3).getEpochs() == 3


def test_batch_size_zero_names_the_spark_param(spark):
    x, y = regression_data(32, seed=9)
    df = array_df(spark, x, y, with_vector=False)
    est = KerasAveragingEstimator(kerasModel=regressor(), numWorkers=2, batchSize=0)
    with record_jobs(spark) as jobs:
        with pytest.raises(ConfigurationError, match=r"'batchSize'.*Got 0") as info:
            est.fit(df)
    _assert_no_jobs(jobs)
    assert "batch_size" not in str(info.value)


def test_existing_prediction_column(spark, regression_fit):
    trainer, df, _, _ = regression_fit
    fitted = KerasAveragingModel(kerasModel=trainer.model, featuresCol="features")
    taken = df.withColumnRenamed("label", "prediction")
    with record_jobs(spark) as jobs:
        with pytest.raises(DataError, match=r"'prediction'.*already"):
            fitted.transform(taken)
    _assert_no_jobs(jobs)
    # Another name works on the same DataFrame.
    out = fitted.setPredictionCol("yhat").transform(taken)
    assert out.columns == taken.columns + ["yhat"]


def test_existing_probability_column(spark, binary_fit):
    trainer, df, _, _ = binary_fit
    taken = df.withColumnRenamed("vec", "probability")
    with pytest.raises(DataError, match=r"'probability'.*already"):
        trainer.predict(taken)


def test_array_features_wrong_width_at_transform(spark):
    fitted = KerasAveragingModel(kerasModel=regressor(), featuresCol="short")
    df = spark.createDataFrame(
        [(i, [float(i), 1.0, 2.0]) for i in range(10)], "id long, short array<double>"
    )
    out = fitted.transform(df)  # lazy: the width is only known on the executors
    with pytest.raises(Exception) as info:
        out.collect()
    decoded = remote_errors.decode(info.value, "transform")  # the executor marked it as a DataError
    assert isinstance(decoded, DataError), str(info.value)
    text = str(decoded)
    assert "'short'" in text
    assert "3 values" in text and "expected 4" in text


# --------------------------------------------------------------------- 8. kerasModel as a path, and errors naming it


def test_keras_model_given_as_path(spark, tmp_path):
    x, y = regression_data(64, seed=10)
    df = array_df(spark, x, y, with_vector=False)
    model = regressor(seed=10)
    path = str(tmp_path / "initial.keras")
    model.save(path)
    est = KerasAveragingEstimator(kerasModel=path, numWorkers=2, batchSize=8, averagingFrequency=2, epochs=2, seed=2)
    assert weights_equal(est.getKerasModel().get_weights(), model.get_weights())
    fitted = est.fit(df)
    assert not weights_equal(fitted.kerasModel.get_weights(), model.get_weights())
    # Same as passing the model object.
    direct = KerasAveragingEstimator(
        kerasModel=model, numWorkers=2, batchSize=8, averagingFrequency=2, epochs=2, seed=2
    ).fit(df)
    for a, b in zip(fitted.kerasModel.get_weights(), direct.kerasModel.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-12, rtol=0)
    rows = collect_sorted(fitted.transform(df), "prediction")
    np.testing.assert_allclose(
        as_vector(rows, "prediction"), fitted.kerasModel.predict(x, verbose=0)[:, 0], atol=1e-5
    )


# Issue 16, user-reported surprise A: the estimator's errors name its camelCase Params (``kerasModel``).


def test_a_missing_keras_model_path_names_kerasModel_and_the_path(spark, tmp_path):
    path = str(tmp_path / "no_such_model.keras")
    with pytest.raises(ConfigurationError) as err:
        KerasAveragingEstimator(kerasModel=path)
    message = str(err.value)
    assert "'kerasModel'" in message and path in message and "no file" in message
    assert "Py4J" not in message and "java" not in message.lower()
    with pytest.raises(ConfigurationError, match="'kerasModel'.*cannot be read"):
        KerasAveragingEstimator(kerasModel="nosuchscheme://bucket/model.keras")


def test_an_uncompiled_model_names_kerasModel_given_as_a_model_or_a_path(spark, regression_df, tmp_path):
    uncompiled = make_model(compile=False)
    with pytest.raises(ConfigurationError, match=r"^The 'kerasModel' parameter must be a compiled keras.Model. Got the uncompiled model"):
        KerasAveragingEstimator(kerasModel=uncompiled)
    path = str(tmp_path / "uncompiled.keras")
    uncompiled.save(path)
    est = KerasAveragingEstimator(kerasModel=path, numWorkers=N, batchSize=B)
    with pytest.raises(ConfigurationError) as err:
        est.fit(regression_df)
    assert str(err.value).startswith("The 'kerasModel' parameter must be a compiled keras.Model. Got the uncompiled model"), str(err.value)
    assert "'model'" not in str(err.value)



class TestEstimatorPath(EstimatorPathMixin):
    """tests/parity.py (a missing path's error, the weights read): the same test runs under Spark Connect too."""
