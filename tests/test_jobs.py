"""The jobs, run the way users run them: through spark-submit."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPARK_SUBMIT = os.path.join(os.path.dirname(sys.executable), "spark-submit")


def _submit(*args, job="train_digits.py", timeout=600):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    return subprocess.run(
        [
            SPARK_SUBMIT,
            "--master",
            "local[2]",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.log.level=WARN",
            os.path.join(ROOT, "jobs", job),
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_train_digits_job_reaches_accuracy_and_keeps_existing_model(tmp_path):
    import keras

    out = tmp_path / "digits"
    proc = _submit("--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Held-out test accuracy:" in proc.stdout
    assert "Epoch 20/20" in proc.stdout  # per-epoch progress
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["test"]["accuracy"] >= 0.95
    assert len(metrics["history"]["loss"]) == 20
    assert metrics["history"]["loss"][-1] < metrics["history"]["loss"][0]
    stats = json.loads((out / "stats.json").read_text())
    assert len(stats) == metrics["summary"]["rounds"] > 0
    model = keras.saving.load_model(str(out / "model.keras"))
    assert model.output_shape == (None, 10)
    before = (out / "model.keras").read_bytes()

    # Without --overwrite an existing model is never replaced.
    again = _submit("--output-dir", str(out), "--epochs", "1")
    assert again.returncode == 2
    assert "already exists; pass --overwrite" in _error_line(again)
    assert (out / "model.keras").read_bytes() == before


def _error_line(proc) -> str:
    """The job's one ``error:`` line, on spark-submit's stderr; stdout has none (issue #29 item 16)."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "error:" not in proc.stdout, proc.stdout[-3000:]
    return lines[0]


@pytest.mark.slow
def test_job_errors_reach_stderr_under_spark_submit(tmp_path):
    """spark-submit merges its Python application's stderr into its stdout; the jobs write past that."""
    proc = _submit("--data", str(tmp_path / "x.parquet"), "--model-builder", "digits_model:build",
                   "--output-dir", str(tmp_path / "out"), "--batch-size", "0", job="train.py")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert _error_line(proc) == "error: The --batch-size flag must be an int in the range [1, inf). Got 0 instead."
    usage = _submit("--data", "x", job="train.py")  # argparse's own error
    assert usage.returncode == 2
    assert "train.py: error: the following arguments are required: --output-dir" in usage.stderr
    assert "error" not in usage.stdout


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["text file", "s3a"])
def test_train_job_names_the_root_cause_of_a_read_error(tmp_path, kind):
    """Not the failed py4j call ("An error occurred while calling o49.load"): the cause under its Java trace (item 9)."""
    import pyspark

    if kind == "text file":
        data = tmp_path / "train.txt"
        data.write_text("label,features\n1,0.5\n")
        cause = f"java.lang.RuntimeException: file:{data} is not a Parquet file."
    else:
        data = "s3a://bucket/x"
        cause = "java.lang.ClassNotFoundException: Class org.apache.hadoop.fs.s3a.S3AFileSystem not found"
    proc = _submit("--data", str(data), "--model-builder", "digits_model:build",
                   "--output-dir", str(tmp_path / "out"), job="train.py")
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _error_line(proc)
    assert line.startswith(f"error: Cannot read --data '{data}' as parquet: {cause}"), line
    assert "An error occurred while calling" not in line and "\tat " not in line
    if kind == "s3a":
        jars = os.listdir(os.path.join(os.path.dirname(pyspark.__file__), "jars"))
        hadoop = next(j for j in jars if j.startswith("hadoop-client-api-"))[len("hadoop-client-api-"):-len(".jar")]
        assert f"pass --packages org.apache.hadoop:hadoop-aws:{hadoop} to spark-submit" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_train_images_job_trains_on_png_files_decoded_on_the_executors(tmp_path):
    """Issue 37: PNG files read with binaryFile, labels from the path, a preprocessing function in __main__."""
    out = tmp_path / "images"
    proc = _submit("--output-dir", str(out), "--epochs", "8", job="train_images.py")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["test"]["accuracy"] >= 0.85, metrics["test"]
    # predict decodes through the same function (training=False): its accuracy is evaluate's
    assert abs(metrics["predict_accuracy"] - metrics["test"]["accuracy"]) < 1e-6
    # the PNG bytes are staged as they came, with the paths (naming a file that fails to decode): nothing decoded
    # or widened; beyond them, per row an int32 label and two 4-byte offsets
    exact = metrics["file_bytes"] + metrics["path_bytes"]
    assert exact <= metrics["summary"]["staged_bytes"] <= exact + 12 * metrics["rows"]
    assert len(metrics["history"]["loss"]) == 8 and metrics["history"]["loss"][-1] < metrics["history"]["loss"][0]
