"""The jobs, run the way users run them: through spark-submit.

Each spark-submit here takes 10-60 s, most of it one core's work (a JVM,
TensorFlow's imports, a session): the module starts those of its selected
tests together, ``JOBS_AT_ONCE`` at a time, and each test waits for its own
(the ``submitted`` fixture).
"""

import json
import os
import subprocess
import sys
import types
from concurrent.futures import ThreadPoolExecutor

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPARK_SUBMIT = os.path.join(os.path.dirname(sys.executable), "spark-submit")
JOBS_AT_ONCE = 3


def _submit(*args, job="train_digits.py", timeout=600, readme=False):
    """spark-submit of ``jobs/<job> ARGS``; with ``readme``, with README's logging flags too (its conf/log4j2.properties)."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    logging = ["--driver-java-options", f"-Dlog4j2.configurationFile=file:{ROOT}/conf/log4j2.properties",
               "--conf", "spark.ui.showConsoleProgress=false"] if readme else []
    return subprocess.run(
        [
            SPARK_SUBMIT,
            "--master",
            "local[2]",
            *logging,
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


READ_ERRORS = ["text file", "s3a"]


def _read_error_data(work, kind):
    return work / "train.txt" if kind == "text file" else "s3a://bucket/x"


@pytest.fixture(scope="module")
def submitted(request, tmp_path_factory):
    """The spark-submits of the module's selected tests, started at once, the longest first.

    ``result(name)`` waits for one and returns its ``CompletedProcess``;
    ``work`` is their directory; ``existing`` the bytes of the model that
    the ``existing`` job must leave in place.
    """
    import keras

    work = tmp_path_factory.mktemp("jobs")
    items = [item for item in request.session.items if item.module is request.module]
    selected = {getattr(item, "originalname", item.name) for item in items}
    jobs = {}  # name: (args, job), the longest first
    if "test_train_images_job_trains_on_png_files_decoded_on_the_executors" in selected:
        jobs["images"] = (("--output-dir", str(work / "images"), "--epochs", "8"), "train_images.py")
    existing = None
    if "test_train_digits_job_reaches_accuracy_and_keeps_existing_model" in selected:
        jobs["digits"] = (("--output-dir", str(work / "digits")), "train_digits.py")
        (work / "existing").mkdir()
        keras.utils.set_random_seed(0)
        keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)]).save(str(work / "existing" / "model.keras"))
        existing = (work / "existing" / "model.keras").read_bytes()
        jobs["existing"] = (("--output-dir", str(work / "existing"), "--epochs", "1"), "train_digits.py")
    kinds = [item.callspec.params["kind"] for item in items
             if getattr(item, "originalname", None) == "test_train_job_names_the_root_cause_of_a_read_error"]
    if kinds:
        (work / "train.txt").write_text("label,features\n1,0.5\n")
        for kind in kinds:
            jobs[kind] = (("--data", str(_read_error_data(work, kind)), "--model-builder", "digits_model:build",
                           "--output-dir", str(work / f"out-{kind}")), "train.py")
    if "test_job_errors_reach_stderr_under_spark_submit" in selected:
        jobs["batch_size"] = (("--data", str(work / "x.parquet"), "--model-builder", "digits_model:build",
                               "--output-dir", str(work / "out-batch-size"), "--batch-size", "0"), "train.py")
        jobs["usage"] = (("--data", "x"), "train.py")  # argparse's own error
    if "test_a_failing_job_prints_its_error_line_and_nothing_of_sparks_traces" in selected:
        (work / "unreadable.txt").write_text("label,features\n1,0.5\n")
        jobs["readme"] = (("--data", str(work / "unreadable.txt"), "--model-builder", "digits_model:build",
                           "--output-dir", str(work / "out-readme")), "train.py")
    pool = ThreadPoolExecutor(JOBS_AT_ONCE)
    futures = {name: pool.submit(_submit, *args, job=job, readme=name == "readme") for name, (args, job) in jobs.items()}
    try:
        yield types.SimpleNamespace(work=work, result=lambda name: futures[name].result(), existing=existing)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.slow
def test_train_digits_job_reaches_accuracy_and_keeps_existing_model(submitted):
    import keras

    out = submitted.work / "digits"
    proc = submitted.result("digits")
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

    # Without --overwrite an existing model is never replaced (one saved before that job started).
    again = submitted.result("existing")
    assert again.returncode == 2
    assert "already exists; pass --overwrite" in _error_line(again)
    assert (submitted.work / "existing" / "model.keras").read_bytes() == submitted.existing


def _error_line(proc) -> str:
    """The job's one ``error:`` line, on spark-submit's stderr; stdout has none (issue #29 item 16)."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "error:" not in proc.stdout, proc.stdout[-3000:]
    return lines[0]


@pytest.mark.slow
def test_job_errors_reach_stderr_under_spark_submit(submitted):
    """spark-submit merges its Python application's stderr into its stdout; the jobs write past that."""
    proc = submitted.result("batch_size")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert _error_line(proc) == "error: The --batch-size flag must be an int in the range [1, inf). Got 0 instead."
    usage = submitted.result("usage")  # argparse's own error
    assert usage.returncode == 2
    assert "train.py: error: the following arguments are required: --output-dir" in usage.stderr
    assert "error" not in usage.stdout


@pytest.mark.slow
@pytest.mark.parametrize("kind", READ_ERRORS)
def test_train_job_names_the_root_cause_of_a_read_error(submitted, kind):
    """Not the failed py4j call ("An error occurred while calling o49.load"): the cause under its Java trace (item 9)."""
    import pyspark

    data = _read_error_data(submitted.work, kind)
    if kind == "text file":
        cause = f"java.lang.RuntimeException: file:{data} is not a Parquet file."
    else:
        cause = "java.lang.ClassNotFoundException: Class org.apache.hadoop.fs.s3a.S3AFileSystem not found"
    proc = submitted.result(kind)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _error_line(proc)
    assert line.startswith(f"error: Cannot read --data '{data}' as parquet: {cause}"), line
    assert "An error occurred while calling" not in line and "\tat " not in line
    if kind == "s3a":
        jars = os.listdir(os.path.join(os.path.dirname(pyspark.__file__), "jars"))
        hadoop = next(j for j in jars if j.startswith("hadoop-client-api-"))[len("hadoop-client-api-"):-len(".jar")]
        assert f"pass --packages org.apache.hadoop:hadoop-aws:{hadoop} to spark-submit" in line
    assert not (submitted.work / f"out-{kind}").exists()


@pytest.mark.slow
def test_a_failing_job_prints_its_error_line_and_nothing_of_sparks_traces(submitted):
    """Issue 38 item 5: README's spark-submit line with a --data Spark cannot read printed 95 lines on stderr, the
    failed task's stack traces (ERROR Executor, WARN TaskSetManager "Lost task", ERROR TaskSetManager), before the
    one ``error:`` line. Wanted: at most 5 lines besides it, at the default log level."""
    proc = submitted.result("readme")
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _error_line(proc)
    assert line.startswith(f"error: Cannot read --data '{submitted.work / 'unreadable.txt'}' as parquet: "
                           "java.lang.RuntimeException: "), line
    others = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip() and not ln.startswith("error:")]
    assert len(others) <= 5, "\n".join(others)[-3000:]
    traces = [ln for ln in others if ln.startswith("\tat ") or " Executor: " in ln or " TaskSetManager: " in ln
              or "Traceback" in ln]
    assert traces == [], "\n".join(others)[-3000:]


@pytest.mark.slow
def test_train_images_job_trains_on_png_files_decoded_on_the_executors(submitted):
    """Issue 37: PNG files read with binaryFile, labels from the path, a preprocessing function in __main__."""
    out = submitted.work / "images"
    proc = submitted.result("images")
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
