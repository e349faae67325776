"""MLflow tracking of fits (issue 19), against a real MLflow tracking store (SQLite) read back with MlflowClient."""

import json
import os
import sys
import warnings

import numpy as np
import pytest

mlflow = pytest.importorskip("mlflow")  # the [dev] extra installs it; CI must not skip: see test_mlflow_is_installed
from mlflow import MlflowClient  # noqa: E402

from conftest import assert_weights_close, make_model, regression_data, run_job_in_process  # noqa: E402
from sparkdl_avg import ConfigurationError, ParameterAveragingTrainer  # noqa: E402
from sparkdl_avg.tracking import LOGGED_TAG, MlflowLogger, TrackingWarning, from_options  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_mlflow_is_installed():
    """The [dev] extra must install mlflow, or every other test here would be skipped silently."""
    assert mlflow.__version__.split(".")[0] >= "3"


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A SQLite tracking store under ``tmp_path`` (artifacts beside it), also MLflow's global URI for the test."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    client.create_experiment("exp", artifact_location=str(tmp_path / "artifacts"))
    yield uri, client
    while mlflow.active_run() is not None:
        mlflow.end_run()


def _data():
    return regression_data(192, seed=3)


def _trainer(**options):
    return ParameterAveragingTrainer(make_model(), batch_size=16, averaging_frequency=2, seed=5, **options)


def _steps(client, run_id, key):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))]


# ---------------------------------------------------------------- what a fit logs


def _halve_and_join(batch, training=False):
    """A preprocessing function: two raw columns (a scalar and an array) become the model's 4 features, halved."""
    return {"features": np.concatenate([batch["first"][:, None], batch["rest"]], axis=1) / 2.0}


def test_a_fit_with_a_preprocessing_function_logs_a_pyfunc_model_that_applies_it(spark, store):
    """Issue 37: MLflow's model of a fit with preprocess= takes the raw columns, as training did."""
    import pyarrow as pa
    from pyspark import cloudpickle

    uri, _ = store
    x, y = _data()
    raw = {"first": x[:, 0] * 2.0, "rest": list(x[:, 1:] * 2.0), "label": y}
    df = spark.createDataFrame(pa.table(raw))
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import this module
    try:
        trainer = _trainer(preprocess=_halve_and_join)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    logger = MlflowLogger(experiment="exp", tracking_uri=uri)
    trainer.fit(df, epochs=1, callbacks=[logger], verbose=0)
    assert logger.not_logged == []
    assert MlflowClient(uri).get_run(logger.run_id).data.params["preprocess"] == "test_tracking._halve_and_join"
    pandas = df.toPandas()
    got = mlflow.pyfunc.load_model(f"runs:/{logger.run_id}/model").predict(pandas[["first", "rest"]])
    np.testing.assert_allclose(got, trainer.model.predict(x, verbose=0), rtol=1e-6)


def test_a_fit_logs_params_epoch_metrics_the_model_and_reports(spark, store, tmp_path):
    uri, client = store
    x, y = _data()
    trainer = _trainer()
    logger = MlflowLogger(experiment="exp", tracking_uri=uri, run_name="first")
    history = trainer.fit((x, y), epochs=3, validation_data=(x[:64], y[:64]), callbacks=[logger], verbose=0)
    assert logger.not_logged == []
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "first"
    assert run.info.experiment_id == client.get_experiment_by_name("exp").experiment_id
    params = run.data.params
    assert params["batch_size"] == "16" and params["num_workers"] == "2" and params["epochs"] == "3"
    assert params["num_examples"] == "192" and params["validation_examples"] == "64"
    assert params["master"] == "local[2]" and params["transport"] == "files" and params["spark_connect"] == "False"
    assert json.loads(params["averaging_frequency"]) == {"name": "fixed", "k": 2}
    assert json.loads(params["update_rule"]) == {"name": "average"}
    assert params["model_parameters"] == str(trainer.model.count_params())
    # one step per epoch, with the History's values
    for key in ("loss", "mae", "val_loss", "val_mae"):
        got = _steps(client, logger.run_id, key)
        assert [s for s, _ in got] == [0, 1, 2], key
        np.testing.assert_allclose([v for _, v in got], history.history[key], rtol=1e-12)
    for key in ("epoch_time_s", "examples_per_s", "compute_share", "overhead_share"):
        assert [s for s, _ in _steps(client, logger.run_id, key)] == [0, 1, 2], key
    epoch1 = [r for r in trainer.stats.records if r.epoch == 1]
    np.testing.assert_allclose(_steps(client, logger.run_id, "epoch_time_s")[1][1], sum(r.wall_s for r in epoch1))
    # the model in MLflow's Keras flavour predicts as trainer.model; its signature is the model's tensors
    loaded = mlflow.keras.load_model(f"runs:/{logger.run_id}/model")
    np.testing.assert_allclose(loaded.predict(x[:16], verbose=0), trainer.model.predict(x[:16], verbose=0), rtol=1e-12)
    pyfunc = mlflow.pyfunc.load_model(f"runs:/{logger.run_id}/model")
    np.testing.assert_allclose(pyfunc.predict(x[:16]), trainer.model.predict(x[:16], verbose=0), rtol=1e-12)
    info = mlflow.models.get_model_info(f"runs:/{logger.run_id}/model")
    inputs = info.signature.inputs.to_dict()
    assert inputs == [{"type": "tensor", "tensor-spec": {"dtype": "float64", "shape": (-1, 4)}}]
    # the reports: stats.json is trainer.stats, report.html the HTML report
    local = client.download_artifacts(logger.run_id, "stats.json", str(tmp_path / "dl"))
    assert json.load(open(local)) == json.loads(trainer.stats.to_json())
    report = open(client.download_artifacts(logger.run_id, "report.html", str(tmp_path / "dl"))).read()
    assert report.startswith("<!doctype html>") and "sparkdl_avg training report" in report

    logger.log_evaluation(trainer.evaluate((x[:64], y[:64]), return_dict=True))
    final = client.get_run(logger.run_id).data.metrics
    # the same model on the same data; evaluate() may add the partitions' sums in another order
    assert final["final_loss"] == pytest.approx(history.history["val_loss"][-1], rel=1e-9)


def test_the_active_run_is_used_and_left_open_and_a_second_fit_nests(spark, store):
    uri, client = store
    x, y = _data()
    with mlflow.start_run(experiment_id=client.get_experiment_by_name("exp").experiment_id) as active:
        first = MlflowLogger()
        _trainer().fit((x, y), epochs=2, callbacks=[first], verbose=0)
        assert first.run_id == active.info.run_id
        assert client.get_run(active.info.run_id).info.status == "RUNNING"  # the user's run stays theirs
        second = MlflowLogger(log_model=False)
        _trainer(update_rule="bmuf").fit((x, y), epochs=1, callbacks=[second], verbose=0)
        assert second.run_id != active.info.run_id
        nested = client.get_run(second.run_id)
        assert nested.data.tags["mlflow.parentRunId"] == active.info.run_id and LOGGED_TAG in nested.data.tags
        assert nested.info.status == "FINISHED" and json.loads(nested.data.params["update_rule"])["name"] == "bmuf"
        assert [a.path for a in client.list_artifacts(second.run_id)] == []  # log_model=False
    assert [s for s, _ in _steps(client, active.info.run_id, "loss")] == [0, 1]


def test_resume_continues_the_run_without_logging_an_epoch_twice(spark, store, tmp_path):
    uri, client = store
    x, y = _data()
    reference = _trainer()
    reference.fit((x, y), epochs=4, verbose=0)

    import keras

    class CrashAfterEpoch2(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 2:  # after the logger logged epoch 2, before its checkpoint
                raise RuntimeError("executor lost")

    ckpt = str(tmp_path / "ckpt")
    first = MlflowLogger(experiment="exp", tracking_uri=uri)
    with pytest.raises(RuntimeError, match="executor lost"):
        _trainer().fit((x, y), epochs=4, checkpoint_dir=ckpt, callbacks=[first, CrashAfterEpoch2()], verbose=0)
    assert client.get_run(first.run_id).info.status == "FAILED"
    assert [s for s, _ in _steps(client, first.run_id, "loss")] == [0, 1, 2]

    again = MlflowLogger(experiment="exp", tracking_uri=uri)
    resumed = _trainer()
    resumed.fit((x, y), epochs=4, checkpoint_dir=ckpt, resume=True, callbacks=[again], verbose=0)
    assert again.run_id == first.run_id
    run = client.get_run(again.run_id)
    assert run.info.status == "FINISHED"
    assert len(client.search_runs([run.info.experiment_id])) == 1
    losses = _steps(client, again.run_id, "loss")
    assert [s for s, _ in losses] == [0, 1, 2, 3]  # epoch 2 trained twice, logged once
    np.testing.assert_allclose([v for _, v in losses], reference.history.history["loss"], rtol=1e-12)
    assert_weights_close(resumed.model.get_weights(), reference.model.get_weights(), atol=1e-12)


# ---------------------------------------------------------------- failures never cost the training


def test_an_unreachable_tracking_server_warns_and_the_fit_finishes(spark, store):
    x, y = _data()
    logger = MlflowLogger(experiment="exp", tracking_uri="http://127.0.0.1:9")  # nothing listens on port 9
    trainer = _trainer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = trainer.fit((x, y), epochs=2, callbacks=[logger], verbose=0)
    assert len(history.history["loss"]) == 2
    messages = [str(w.message) for w in caught if issubclass(w.category, TrackingWarning)]
    assert len(messages) == 2, messages
    assert messages[0].startswith("MLflow tracking failed while logging the run (") and "Training goes on" in messages[0]
    assert messages[1].startswith(
        "Not logged to MLflow: the run, params, the metrics of epochs 0-1, the model, stats.json and report.html ("
    )
    assert logger.run_id is None and "params" in logger.not_logged


def test_bad_tracking_options_are_refused_before_any_job(spark):
    with pytest.raises(ConfigurationError, match=r"The 'experiment' parameter must be a non-empty str or None\. Got 3"):
        MlflowLogger(experiment=3)
    with pytest.raises(ConfigurationError, match=r"'log_model' parameter must be a bool"):
        MlflowLogger(log_model="yes")
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) 'experiment_name'.*Valid options: experiment"):
        MlflowLogger(experiment_name="x")
    assert from_options({"mlflow": False, "experiment": None, "tracking_uri": None, "run_name": None}) is None
    assert from_options({"mlflow": True}).experiment is None
    assert from_options({"run_name": "r", "log_model": False}).log_model is False


def test_the_logger_refuses_keras_model_fit_and_a_missing_mlflow(monkeypatch):
    x, y = _data()
    model = make_model()
    with pytest.raises(ConfigurationError, match="MlflowLogger logs ParameterAveragingTrainer.fit"):
        model.fit(x, y, epochs=1, callbacks=[MlflowLogger()], verbose=0)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'sparkdl_avg\[mlflow\]'"):
        MlflowLogger()


# ---------------------------------------------------------------- the estimator and the job


def test_the_estimator_logs_into_the_pipeline_run_with_pyspark_autolog(spark, store):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    from sparkdl_avg.ml import KerasAveragingEstimator

    uri, client = store
    x, y = _data()
    df = spark.createDataFrame([(*map(float, r), float(t)) for r, t in zip(x, y.reshape(len(y)))], ["a", "b", "c", "d", "label"])
    est = KerasAveragingEstimator(kerasModel=make_model(), batchSize=16, averagingFrequency=2, epochs=2, seed=5,
                                  mlflowTracking=True)
    mlflow.set_experiment(experiment_id=client.get_experiment_by_name("exp").experiment_id)
    mlflow.pyspark.ml.autolog(log_models=False, log_datasets=False)
    try:
        model = Pipeline(stages=[VectorAssembler(inputCols=["a", "b", "c", "d"], outputCol="features"), est]).fit(df)
    finally:
        mlflow.pyspark.ml.autolog(disable=True)
    runs = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert len(runs) == 1, [r.data.tags for r in runs]  # autolog's pipeline run, which our fit logged into
    run = runs[0]
    assert LOGGED_TAG in run.data.tags and run.data.params["batch_size"] == "16"
    np.testing.assert_allclose([v for _, v in _steps(client, run.info.run_id, "loss")],
                               model.stages[-1].history.history["loss"], rtol=1e-12)
    assert "model" in [a.path for a in client.list_artifacts(run.info.run_id)]

    with pytest.raises(ConfigurationError, match=r"The 'mlflowExperiment' parameter must be a non-empty str"):
        KerasAveragingEstimator(kerasModel=make_model(), mlflowExperiment="").fit(df)


def test_train_job_logs_to_mlflow(spark, tmp_path, monkeypatch, capsys):
    """jobs/train.py's MLflow flags, its ``main`` run here on the module's session (conftest.run_job_in_process)."""
    from sklearn.datasets import load_digits

    import keras
    import pyarrow as pa
    import pyarrow.parquet as pq

    digits = load_digits()
    n = 400
    table = pa.table({"features": [r.tolist() for r in digits.data[:n].astype("float32")],
                      "label": digits.target[:n].astype("int64")})
    pq.write_table(table, str(tmp_path / "digits.parquet"))
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.optimizer.build(model.trainable_variables)  # saved with its variables: loads without a warning
    model.save(str(tmp_path / "mlp.keras"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("jobs", artifact_location=str(tmp_path / "artifacts"))
    try:
        code, _ = run_job_in_process(
            spark, monkeypatch, "train", "--data", str(tmp_path / "digits.parquet"), "--model",
            str(tmp_path / "mlp.keras"), "--epochs", "2", "--batch-size", "16", "--averaging-frequency", "4", "--seed",
            "1", "--validation-split", "0.25", "--output-dir", str(tmp_path / "out"), "--mlflow-experiment", "jobs",
            "--mlflow-tracking-uri", uri, "--mlflow-run-name", "from-the-job")
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()
    assert code == 0, capsys.readouterr().err[-3000:]
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("jobs").experiment_id])
    assert run.info.run_name == "from-the-job" and run.info.status == "FINISHED"
    metrics = json.load(open(tmp_path / "out" / "metrics.json"))
    assert [v for _, v in _steps(client, run.info.run_id, "val_accuracy")] == pytest.approx(
        metrics["history"]["val_accuracy"], rel=1e-12)
    assert run.data.metrics["final_val_accuracy"] == pytest.approx(metrics["validation"]["accuracy"], rel=1e-12)
    assert {"model", "stats.json", "report.html"} <= {a.path for a in client.list_artifacts(run.info.run_id)}


def test_the_job_names_the_flag_of_a_bad_tracking_option(spark, tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "jobs"))  # digits_model
    code, asked = run_job_in_process(
        spark, monkeypatch, "train", "--data", str(tmp_path / "none.parquet"), "--output-dir", str(tmp_path / "o"),
        "--model-builder", "digits_model:build", "--mlflow-experiment", "")
    assert code == 2 and asked == []  # before Spark
    assert "error: The --mlflow-experiment flag must be a non-empty str or None. Got '' instead." in capsys.readouterr().err
