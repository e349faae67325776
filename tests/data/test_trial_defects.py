"""Issue 48, part 2, defects 1 to 7 of the fresh user trial: each as the user met it, and what they get now.

First without Spark (a preprocessing function's odd or non-finite output, an
unloadable function in a staging task, the non-finite round's message, ids
outside an Embedding's range in numpy data), then on the module's shared
``local[2]`` session (the train job's validation data, the dry run, fit and
predict on DataFrames), and last a user's own session in a subprocess,
whose stderr must not carry Spark's copies of a failed task's traces.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest

from conftest import run_job_in_process
from sparkdl_avg import ConfigurationError, DataError, ParameterAveragingTrainer
from sparkdl_avg.shared.data.columns import Column, Field
from sparkdl_avg.shared.data.preprocess import Preprocess
from sparkdl_avg.shared.data.staged_dataset import StagedDataset, model_arrays
from sparkdl_avg.errors import WorkerError
from sparkdl_avg.shared.data.value_checks import DataChecks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _dataset(fn, checks=None, x=("x",), y=("y",)):
    """A preprocessed StagedDataset without files: one float input of 2 values, one number label."""
    return StagedDataset((), (Column("v", "v", "raw", None, "raw"), Column("path", "path", "raw", None, "raw")),
                         x, tuple(Field((2,), "float32") for _ in x), y, tuple(Field((), "float32") for _ in y),
                         preprocess=Preprocess.of(fn).with_columns(["v"]), checks=checks)


BATCH = {"v": np.arange(4, dtype=np.float64), "path": np.array(["a", "b", "c", "d"], dtype=object)}


# ------------------------------------------------------------------ defect 4: odd outputs


def ragged(batch):
    return {"x": [[1.0, 2.0], [3.0]] + [[0.0, 0.0]] * (len(batch["v"]) - 2), "y": batch["v"]}


def scalar(batch):
    return {"x": np.zeros((len(batch["v"]), 2)), "y": 1.0}


def generator(batch):
    return {"x": (np.zeros(2) for _ in batch["v"]), "y": batch["v"]}


@pytest.mark.parametrize("fn, key, expected", [
    (ragged, "x", "as a list that is not one array (rows of different shapes?): setting an array element with a "
              "sequence"),
    (scalar, "y", "as a single float (1.0); expected an array with one row per example (4)"),
    (generator, "x", "as a generator; expected an array with one row per example (4): make it a list or an array"),
])
def test_odd_outputs_are_refused_naming_the_function_and_the_key(fn, key, expected):
    """Issue 48 defect 4: numpy's "inhomogeneous shape" ValueError and "len() of unsized object" named neither."""
    with pytest.raises(DataError) as info:
        model_arrays(_dataset(fn), BATCH, training=True)
    message = str(info.value)
    assert message.startswith(f"The preprocessing function '{fn.__module__}.{fn.__name__}' gives '{key}' "), message
    assert expected in message, message


# ------------------------------------------------------------------ defect 2: NaN out of the function


def nan_in_row_2(batch):
    x = np.stack([batch["v"], batch["v"]], axis=1).astype("float32")
    x[batch["v"] == 2, 1] = np.nan
    return {"x": x, "y": batch["v"]}


def test_nan_out_of_the_function_is_named_with_the_function_key_and_row_where_it_runs():
    """Issue 48 defect 2, on the executors: each minibatch's output is checked (check_data), the row named by its
    index in the staged data and its path."""
    with pytest.raises(DataError) as info:
        model_arrays(_dataset(nan_in_row_2, DataChecks(finite=True)), BATCH, training=True, what="training data",
                     row_ids=np.array([10, 11, 12, 13]))
    assert str(info.value) == (
        f"Key 'x' of the output of the preprocessing function '{__name__}.nan_in_row_2' contains NaN or Inf (1 "
        "values; the first in row 12 of the training data; path 'c'). Clean or impute the data, or pass "
        "check_data=False to train anyway.")
    # check_data=False: no checks, the NaN passes as before
    assert np.isnan(model_arrays(_dataset(nan_in_row_2), BATCH, training=True).xs[0]).sum() == 1


def test_a_non_finite_round_with_a_finite_loss_blames_the_weights():
    """Issue 48 defect 2: "Non-finite loss or weights ... (loss 0.4542)" showed a finite loss alone."""
    from sparkdl_avg.driver.fit.rounds import check_finite
    from sparkdl_avg.shared.wire.stats import WorkerRecord

    def record(worker, loss, finite):
        return WorkerRecord(worker=worker, host="h", pid=1, examples=8, start=0.0, end=1.0, setup_s=0.0, load_s=0.0,
                            compute_s=1.0, finite=finite, loss=loss)

    result = type("R", (), {"workers": [record(0, 0.4542, False), record(1, float("nan"), False),
                                        record(2, 0.5, True)]})()
    with pytest.raises(WorkerError) as info:
        check_finite(result, "epoch 0, round 0", "raise", whole=True)
    assert "worker(s) 0 (loss 0.4542, weights NaN/Inf), 1 (loss nan) in epoch 0, round 0" in str(info.value)


# ------------------------------------------------------------------ defect 3: a function executors cannot load


def test_a_staging_task_that_cannot_load_the_function_reports_it_without_reading_its_rows(tmp_path):
    """Issue 48 defect 3: the module was missed only at round 0, after the whole staging job had read every file."""
    from sparkdl_avg.executor.stage_writer import export_arrow_batches
    from sparkdl_avg.shared.errors.remote_errors import raise_reported

    # the function by reference to a module this process lacks, as cloudpickle ships one from an importable module
    unloadable = Preprocess("shipless.decode", b"cshipless\ndecode\n.", "0" * 64, False, False)
    read = []

    def batches():
        for i in range(3):
            read.append(i)
            yield pa.record_batch([pa.array([b"x"])], names=["content"])

    rows = list(export_arrow_batches(batches(), directory=str(tmp_path), columns=[Column("content", "content", "raw",
                                     None, "raw")], preprocess=unloadable))
    assert read == [] and os.listdir(tmp_path) == []
    error = rows[0].column("error")[0].as_py()
    with pytest.raises(ConfigurationError) as info:
        raise_reported([None, error])
    message = str(info.value)
    assert message.startswith("The preprocessing function 'shipless.decode' cannot be loaded on this executor: "
                              "ModuleNotFoundError: No module named 'shipless'. Ship its module to the executors "
                              "(--py-files, spark.sparkContext.addPyFile"), message


# ------------------------------------------------------------------ defect 7: ids outside an Embedding's range


def _embedding_model(input_dim=10):
    import keras

    ids = keras.Input((3,), dtype="int64", name="ids")
    num = keras.Input((2,), name="num")
    emb = keras.layers.Embedding(input_dim, 2, name="item_embedding")(ids)
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([keras.layers.Flatten()(emb), num]))
    model = keras.Model([num, ids], out)
    model.compile("sgd", "mse")
    return model


def test_ids_outside_an_embeddings_range_in_arrays_are_refused_or_warned_of(tmp_path):
    """Issue 48 defect 7: ids >= input_dim failed at round 0 with TensorFlow's "indices[0,0] = ... is not in [0, 10)",
    naming neither column nor layer; negative ids train silently (as in keras.Model.fit)."""
    from sparkdl_avg.driver.data.checks import data_checks
    from sparkdl_avg.driver.data.staging import stage

    model = _embedding_model()
    checks = data_checks(model)
    assert checks.id_ranges == (None, (10, "item_embedding"))
    num = np.zeros((6, 2), "float32")
    ids = np.arange(18, dtype=np.int64).reshape(6, 3) % 10
    y = np.zeros(6, "float32")
    kwargs = dict(root=str(tmp_path), x_shapes=[(2,), (3,)], x_dtype=["float32", "int64"], checks=checks)
    stage(([num, ids], y), **kwargs)  # in range: staged
    big = ids.copy()
    big[4, 1] = 1099511627812
    with pytest.raises(DataError) as info:
        stage(([num, big], y), **kwargs)
    assert str(info.value).startswith(
        "The training array x[1] holds the id 1099511627812 (1 such values; the first in row 4); the Embedding "
        "layer 'item_embedding' it feeds takes ids in [0, 10) (its input_dim)."), str(info.value)
    negative = ids.copy()
    negative[2, 0] = -3
    with pytest.warns(UserWarning, match=r"x\[1\] holds the id -3 .*row 2.*'item_embedding'.*\[0, 10\)"):
        stage(([num, negative], y), **kwargs)


# ------------------------------------------------------------------ on the shared session


@pytest.fixture(scope="module")
def numbers(spark):
    """32 rows: ``features`` (2 floats), ``label``, ``w``; and the same without ``w``."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 2)).astype("float32")
    rows = [(x[i].tolist(), float(x[i].sum()), 1.0 + i % 2) for i in range(32)]
    with_w = spark.createDataFrame(rows, "features array<float>, label double, w double")
    return with_w, with_w.drop("w")


def _dense():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


def test_the_train_job_weighs_validation_data_only_when_it_has_the_weight_column(spark, numbers, tmp_path,
                                                                                   monkeypatch):
    """Issue 48 defect 1: --sample-weight-col demanded the column in --validation-data; the API does not."""
    train, val = (str(tmp_path / name) for name in ("train.parquet", "val.parquet"))
    numbers[0].write.parquet(train)
    numbers[1].write.parquet(val)
    model_path = str(tmp_path / "dense.keras")
    _dense().save(model_path)
    code, _ = run_job_in_process(
        spark, monkeypatch, "train", "--data", train, "--validation-data", val, "--model", model_path,
        "--sample-weight-col", "w", "--num-workers", "2", "--batch-size", "4", "--averaging-frequency", "2",
        "--epochs", "1", "--seed", "1", "--no-check-executors", "--output-dir", str(tmp_path / "out"))
    assert code == 0
    # the training data still needs it, named in the job's own spelling
    code, _ = run_job_in_process(
        spark, monkeypatch, "train", "--data", val, "--model", model_path, "--sample-weight-col", "w",
        "--no-check-executors", "--output-dir", str(tmp_path / "out2"))
    assert code == 2


def _images(spark, n=32):
    """``n`` rows: ``path``, ``v`` (the row's number) and ``label``."""
    rows = [(f"img-{i}.png", float(i), float(i % 2)) for i in range(n)]
    return spark.createDataFrame(rows, "path string, v double, label double")


def test_nan_out_of_the_function_is_refused_in_the_dry_run_and_on_the_executors_and_by_predict(spark):
    """Issue 48 defect 2: training stopped with "Non-finite loss or weights ... (loss 0.4542)", naming neither the
    function nor the row, and predict turned the NaN input into a class."""
    def to_features(batch, training=False):
        v = batch["v"]
        x = np.stack([v, v], axis=1).astype("float32")
        x[(v == 3) | (v == 27), 0] = np.nan  # row 3 is in the dry run's 8 rows, row 27 only on the executors
        return {"x": x}

    def late_nan(batch, training=False):
        out = to_features(batch, training)
        out["x"][batch["v"] == 3, 0] = 0.0
        return out

    df = _images(spark)
    trainer = ParameterAveragingTrainer(_dense(), num_workers=2, batch_size=4, averaging_frequency=2,
                                        preprocess=to_features, seed=1)
    with pytest.raises(DataError) as info:
        trainer.fit(df, features_col="x", epochs=1, verbose=0)
    message = str(info.value)
    assert message.startswith("Key 'x' of the output of the preprocessing function ") and \
        "to_features' contains NaN or Inf (1 values; the first in row 3 of the training data; path " \
        "'img-3.png')" in message, message

    trainer = ParameterAveragingTrainer(_dense(), num_workers=2, batch_size=4, averaging_frequency=4,
                                        preprocess=late_nan, seed=1)
    with pytest.raises(WorkerError) as info:  # a round's failure names the worker and round, then the cause
        trainer.fit(df, features_col="x", epochs=1, verbose=0)
    message = str(info.value)
    assert message.startswith("Worker ") and "failed in epoch 0, round " in message, message
    assert "late_nan' contains NaN or Inf (1 values; the first in row 27 of the training data; path " \
        "'img-27.png')" in message, message

    with pytest.raises(DataError, match=r"to_features' contains NaN or Inf .*row 3 of the input data.*"
                                        r"Clean or impute the data before predicting on it"):
        ParameterAveragingTrainer(_dense(), preprocess=to_features).predict(df, features_col="x")
    predicted = ParameterAveragingTrainer(_dense(), preprocess=late_nan).predict(df, features_col="x")
    with pytest.raises(DataError, match=r"late_nan' contains NaN or Inf .*Clean or impute the data before"):
        predicted.collect()


def test_the_dry_run_calls_the_function_with_training_false_too(spark):
    """Issue 48 defect 5: a function that returns the model's key only when training passed the dry run and failed
    at evaluation on the executors (138 stderr lines)."""
    def only_when_training(batch, training=False):
        x = np.stack([batch["v"], batch["v"]], axis=1).astype("float32")
        return {"x": x} if training else {"features": x}

    trainer = ParameterAveragingTrainer(_dense(), num_workers=2, batch_size=4, preprocess=only_when_training)
    with pytest.raises(DataError) as info:
        trainer.fit(_images(spark), features_col="x", epochs=1, verbose=0)
    message = str(info.value)
    assert message.startswith("The preprocessing function ") and "only_when_training' (called with training=False, " \
        "as validation, evaluate and predict call it) returned ['features'] on the first 8 rows of the training " \
        "data; 'features_col' names 'x'" in message, message


def test_a_module_the_executors_lack_is_named_before_the_data_is_staged(spark, tmp_path, monkeypatch):
    """Issue 48 defect 3: found only at round 0, after 19 s of staging 5,000 files and with 130 stderr lines."""
    (tmp_path / "driver_only_decoders.py").write_text(textwrap.dedent("""
        import numpy as np

        def decode(batch, training=False):
            return {"x": np.stack([batch["v"], batch["v"]], axis=1).astype("float32")}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))  # the driver's path only: the executors' Python workers lack it
    import driver_only_decoders

    trainer = ParameterAveragingTrainer(_dense(), num_workers=2, batch_size=4, preprocess=driver_only_decoders.decode)
    with pytest.raises(ConfigurationError) as info:
        trainer.fit(_images(spark), features_col="x", epochs=1, verbose=0)
    message = str(info.value)
    assert message.startswith("The preprocessing function 'driver_only_decoders.decode' cannot be loaded on this "
                              "executor: ModuleNotFoundError: No module named 'driver_only_decoders'. Ship its "
                              "module to the executors (--py-files, spark.sparkContext.addPyFile"), message

    # the jobs' check of the executors, before they read or stage anything
    from sparkdl_avg.driver.runtime.preflight import check_executors

    with pytest.raises(ConfigurationError, match="No module named 'driver_only_decoders'. Ship its module"):
        check_executors(spark, 2, preprocess=driver_only_decoders.decode)


def test_ids_outside_an_embeddings_range_in_a_dataframe_are_refused_naming_the_column_and_layer(spark):
    """Issue 48 defect 7, staged by Spark: the column is named in the user's spelling; negative ids warn."""
    model = _embedding_model()
    rows = [([0.0, 1.0], [i % 10, 1, 2], 0.5) for i in range(16)]
    rows[9] = ([0.0, 1.0], [1, 1099511627812, 2], 0.5)
    df = spark.createDataFrame(rows, "num array<float>, `item ids` array<long>, label double")
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=4)
    with pytest.raises(DataError) as info:
        trainer.fit(df, features_col=["num", "item ids"], epochs=1, verbose=0)
    assert str(info.value).startswith(
        "Column 'item ids' holds the id 1099511627812 (1 such values; the first in row "), str(info.value)
    assert "the Embedding layer 'item_embedding' it feeds takes ids in [0, 10) (its input_dim)" in str(info.value)
    rows[9] = ([0.0, 1.0], [1, -1, 2], 0.5)
    df = spark.createDataFrame(rows, "num array<float>, `item ids` array<long>, label double")
    with pytest.warns(UserWarning, match=r"Column 'item ids' holds the id -1 .*'item_embedding'"):
        trainer.fit(df, features_col=["num", "item ids"], epochs=1, verbose=0)

    # with a preprocessing function: the dry run sees its output
    def ids_out(batch):
        return {"num": np.zeros((len(batch["v"]), 2), "float32"),
                "ids": np.stack([batch["v"].astype("int64") * 3] * 3, axis=1)}

    trainer = ParameterAveragingTrainer(_embedding_model(), num_workers=2, batch_size=4, preprocess=ids_out)
    with pytest.raises(DataError, match=r"Key 'ids' of the output of the preprocessing function .*ids_out' holds "
                                        r"the id 12 .*row 4 of the training data; path 'img-4.png'.*"
                                        r"'item_embedding' it feeds takes ids in \[0, 10\)"):
        trainer.fit(_images(spark), features_col=["num", "ids"], epochs=1, verbose=0)


# ------------------------------------------------------------------ defect 6: a user's own session


USER_SCRIPT = """
import numpy as np, keras
from pyspark.sql import SparkSession
from sparkdl_avg import DataError, ParameterAveragingTrainer
from sparkdl_avg.errors import WorkerError

spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
df = spark.createDataFrame([(float(i), float(i % 2)) for i in range(32)], "v double, label double")

def fails_on_row_20(batch, training=False):
    if (batch["v"] == 20).any():
        raise ValueError("cannot read row 20")
    return {"x": np.stack([batch["v"], batch["v"]], axis=1).astype("float32")}

model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=4, preprocess=fails_on_row_20)
for action in (lambda: trainer.fit(df, features_col="x", epochs=1, verbose=0),
               lambda: trainer.predict(df, features_col="x").collect()):
    try:
        action()
    except (DataError, WorkerError) as exc:
        print("RAISED", type(exc).__name__, str(exc)[:300], flush=True)
spark.stop()
"""


@pytest.mark.slow
def test_a_failed_round_or_prediction_in_a_users_session_prints_no_spark_traces(tmp_path):
    """Issue 48 defect 6: 61 to 138 lines of Spark's executor traces reached stderr per failure, where the
    library's own message was clear (the jobs already kept them back)."""
    script = tmp_path / "user.py"
    script.write_text(USER_SCRIPT)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    raised = [line for line in proc.stdout.splitlines() if line.startswith("RAISED")]
    assert len(raised) == 2 and all("cannot read row 20" in line for line in raised), proc.stdout
    traces = [ln for ln in proc.stderr.splitlines() if ln.startswith("\tat ") or " Executor: " in ln
              or " TaskSetManager: " in ln or "Traceback" in ln]
    assert traces == [], proc.stderr[-3000:]


def test_a_function_that_adds_a_key_to_the_batch_and_returns_it_stages_what_it_passes_through(spark):
    """A fresh trial (issue 60): the dry run saw only the column it read ('v') as needed, so 'w', which the model's
    input takes from the returned batch, was not staged, and every round-0 task failed."""
    def add_x(batch):
        batch["x"] = np.stack([batch["v"], batch["v"]], axis=1).astype("float32")
        return batch  # 'w', never read, passes through to sample_weight_col

    df = _images(spark).selectExpr("*", "v / 32 AS w")
    trainer = ParameterAveragingTrainer(_dense(), num_workers=2, batch_size=4, preprocess=add_x, seed=1)
    history = trainer.fit(df, features_col="x", sample_weight_col="w", epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][-1]) and trainer.stats.records
