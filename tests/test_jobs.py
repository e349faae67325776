"""The main job, run the way users run it: through spark-submit."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPARK_SUBMIT = os.path.join(os.path.dirname(sys.executable), "spark-submit")


def _submit(*args, timeout=600):
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
            os.path.join(ROOT, "jobs", "train_digits.py"),
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
    # spark-submit merges the Python driver's stderr into its stdout.
    assert "already exists; pass --overwrite" in again.stdout + again.stderr
    assert (out / "model.keras").read_bytes() == before
