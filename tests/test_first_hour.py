"""A user's first hour (issue 16): predicting on Vectors read from Parquet, and the files runs leave behind."""

import contextlib
import glob
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import make_model
from parity import ExecutorCheckMixin
from sparkdl_avg import DataError, ParameterAveragingTrainer
from sparkdl_avg.shared import fs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPARK_SUBMIT = os.path.join(os.path.dirname(sys.executable), "spark-submit")


@contextlib.contextmanager
def umask(mask: int):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path) -> int:
    return os.stat(path).st_mode & 0o777


def _vector_parquet(spark, path, n=24):
    """Parquet with a Vector ``features`` column, a sparse Vector ``extra`` and an ``id``; returns the features."""
    from pyspark.ml.linalg import Vectors

    x = np.random.default_rng(0).normal(size=(n, 4))
    rows = [(i, Vectors.dense(x[i].tolist()), Vectors.sparse(3, [i % 3], [1.0]), float(i % 2)) for i in range(n)]
    spark.createDataFrame(rows, ["id", "features", "extra", "label"]).write.parquet(str(path))
    return x


# ------------------------------------------------------------ 1. Vectors from Parquet


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


def test_predict_rejects_an_unsupported_features_column(spark):
    df = spark.createDataFrame([("a",)], "features string")
    with pytest.raises(DataError, match=r"Column 'features' must be array<float>, array<double> or a pyspark.ml "
                                        r"Vector. Got string instead"):
        ParameterAveragingTrainer(make_model(), batch_size=4).predict(df)


def test_predict_job_on_vectors_read_from_parquet(spark, tmp_path):
    x = _vector_parquet(spark, tmp_path / "v.parquet")
    model = make_model()
    model.save(str(tmp_path / "model.keras"))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run(
        [SPARK_SUBMIT, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         os.path.join(ROOT, "jobs", "predict.py"), "--data", str(tmp_path / "v.parquet"),
         "--model", str(tmp_path / "model.keras"), "--output", str(tmp_path / "pred"), "--no-check-executors"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "Wrote 24 predictions" in proc.stdout
    rows = sorted(spark.read.parquet(str(tmp_path / "pred")).collect(), key=lambda r: r.id)
    np.testing.assert_allclose([r.prediction for r in rows], model.predict(x, verbose=0)[:, 0], rtol=1e-5, atol=1e-6)  # keras.Model.predict computes in float32


# ------------------------------------------------------------ 2. files left behind or unreadable


def test_output_dir_makes_no_temporary_directory_until_written(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.keras").write_text("old")
    out = fs.OutputDir(str(tmp_path / "out"))
    with pytest.raises(fs.PathError, match="already exists"):
        out.check()  # a job stops here, before writing anything and without cleanup()
    assert glob.glob(str(tmp_path / "sparkdl_avg-output-*")) == []


def test_a_failing_train_job_leaves_no_temporary_directory(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "jobs"), TMPDIR=str(scratch))
    common = ["jobs/train.py", "--data", str(tmp_path / "none.parquet"), "--output-dir", str(tmp_path / "out"),
              "--model-builder", "digits_model:build"]
    for extra in (["--batch-size", "0"], ["--model-builder", "no_such_module_xyz:build"]):
        proc = subprocess.run([sys.executable, *common, *extra], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 2, proc.stderr[-2000:]
    assert glob.glob(str(scratch / "sparkdl_avg-*")) == []


def test_committed_output_gets_the_umask_modes(tmp_path):
    with umask(0o022):
        out = fs.OutputDir(str(tmp_path / "out"))
        with open(out.file("model.keras"), "w") as f:
            f.write("m")
        os.makedirs(out.file("assets"))
        out.write_json("metrics.json", {})
        out.commit()
    assert _mode(tmp_path / "out") == 0o755
    assert _mode(tmp_path / "out" / "assets") == 0o755
    assert _mode(tmp_path / "out" / "model.keras") == _mode(tmp_path / "out" / "metrics.json") == 0o644


def test_refused_staging_leaves_no_partial_files(spark, tmp_path):
    from pyspark.sql import functions as F

    n = 64
    df = spark.range(n).select(
        F.array(*[F.col("id").cast("double")] * 4).alias("features"),
        F.when(F.col("id") == n - 1, F.lit(float("nan"))).otherwise(F.lit(1.0)).alias("label"),
    ).repartition(4)
    trainer = ParameterAveragingTrainer(make_model(), batch_size=4, staging_dir=str(tmp_path))
    with pytest.raises(DataError, match="NaN"):
        trainer.fit(df, epochs=1, verbose=0)
    staged = [p for p in glob.glob(str(tmp_path / "**"), recursive=True) if os.path.isfile(p)]
    assert staged == []
    assert glob.glob(str(tmp_path / "sparkdl_avg-*" / "training-*")) == []
    trainer.close()


def test_local_staging_root_is_private(spark, tmp_path):
    x = np.random.default_rng(0).normal(size=(32, 4))
    y = x.sum(axis=1)
    base = tmp_path / "staging"
    with umask(0o022):
        base.mkdir()
        trainer = ParameterAveragingTrainer(make_model(), batch_size=4, staging_dir=str(base),
                                            state_transport="files")
        trainer.fit((x, y), epochs=1, verbose=0)
    (root,) = glob.glob(str(base / "sparkdl_avg-*"))
    assert _mode(root) == 0o700  # the staged data and the exchanged weights under it: owner only
    assert _mode(base) == 0o755  # the user's staging_dir itself is left alone
    trainer.close()
    assert not os.path.exists(root)


def test_refused_staging_data_is_reported_in_the_tasks_row_not_by_failing_it():
    """A failed task makes Spark log an executor ERROR block (naming internal columns) and drops the Python worker."""
    import pyarrow as pa

    from sparkdl_avg.shared.value_checks import DataChecks
    from sparkdl_avg.executor.stage_writer import export_arrow_batches

    consumed = []

    def batches():
        for i in range(3):
            consumed.append(i)
            x = [[float("nan"), 1.0]] if i == 0 else [[0.0, 1.0]]
            yield pa.record_batch([pa.array(x, pa.list_(pa.float64())), pa.array([1.0])], names=["x0", "y0"])

    (row,) = export_arrow_batches(batches(), directory="/nonexistent", features=[("x0", 2)], labels=["y0"],
                                  x_dtype="float64", y_dtype="float64", checks=DataChecks(finite=True))
    assert consumed == [0, 1, 2]  # the whole input, so PySpark reuses the worker
    error = row.column("error")[0].as_py()
    assert row.column("rows")[0].as_py() == 0 and "Column 'x0'" in error and "NaN" in error, error


def test_a_sql_job_after_a_fit_reuses_the_fits_python_workers(spark):
    """Training (RDD rounds) and predict/staging (SQL jobs) share one pool of Python workers (session.py)."""
    import os

    x, y = np.random.default_rng(0).normal(size=(64, 4)), np.zeros((64, 1))
    trainer = ParameterAveragingTrainer(make_model(), num_workers=2, batch_size=8, averaging_frequency=2, seed=0,
                                        state_transport="files", slow_warning=False)
    trainer.fit((x, y), epochs=1, verbose=0)
    fit_pids = {w.pid for r in trainer.stats.records for w in r.workers}

    def pids(batches):
        import pyarrow as pa

        for batch in batches:
            yield pa.RecordBatch.from_pydict({"pid": [os.getpid()] * batch.num_rows})

    sql_pids = {r.pid for r in spark.range(4, numPartitions=2).mapInArrow(pids, "pid long").collect()}
    assert sql_pids <= fit_pids, (sql_pids, fit_pids)


@pytest.fixture(scope="module")
def session(spark):
    """The session of tests/parity.py's tests."""
    return spark


class TestExecutorCheck(ExecutorCheckMixin):
    """tests/parity.py: the check a user runs first, on a classic session; test_connect.py runs it under Connect."""
