"""jobs/train.py through spark-submit on local[2], local-cluster and a real standalone cluster.

The standalone cluster (a master and two 1-core workers on 127.0.0.1, from
the pip-installed pyspark) is started by ``scripts/cluster.sh up`` in a
fixture and always stopped. Executors there and on ``local-cluster`` get
``sparkdl_avg`` only through the shipping mechanisms of ``make dist``, never
from the editable install of the driver's virtualenv:

- ``local-cluster[2,1,1024]``: ``--py-files dist/sparkdl_avg-<v>.zip``, with
  executors running a bare venv (same base interpreter, no packages);
- standalone: ``--archives env.tar.gz#environment`` and
  ``PYSPARK_PYTHON=./environment/bin/python``, an environment packed by
  venv-pack with the sparkdl_avg wheel installed.

To keep the test fast, neither environment carries TensorFlow & co. (a full
``make dist-env`` archive is 1.3 GB): executors find them through
``spark.executorEnv.PYTHONPATH`` set to the driver venv's site-packages. A
directory on PYTHONPATH does not run its ``.pth`` files, so the editable
install's import hook (``__editable__.sparkdl_avg-*.pth``) is not active
there and ``sparkdl_avg`` is not importable from it; the test checks that,
and checks where each executor imported ``sparkdl_avg`` from (the job's
executor check reports ``sparkdl_avg.__file__``). The model comes from
``jobs/digits_model.py`` (a builder with a custom layer), shipped with
``--py-files`` everywhere.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time

import numpy as np
import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
SPARK_SUBMIT = os.path.join(BIN, "spark-submit")
SITE_PACKAGES = sysconfig.get_paths()["purelib"]
DIGITS_MODEL = os.path.join(ROOT, "jobs", "digits_model.py")
EPOCHS = 5

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import build_dist  # noqa: E402


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("standalone")


@pytest.fixture(scope="module")
def cluster(work):
    """A standalone master and two workers; started in the background, always stopped."""
    env = dict(os.environ, CLUSTER_DIR=str(work / "cluster"), PYTHON=sys.executable)
    script = os.path.join(ROOT, "scripts", "cluster.sh")
    starting = subprocess.Popen([script, "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def master_url():
        out, err = starting.communicate(timeout=180)
        assert starting.returncode == 0, err
        return out.strip().splitlines()[-1]

    try:
        yield master_url
    finally:
        if starting.poll() is None:
            starting.wait(timeout=180)
        subprocess.run([script, "down"], env=env, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def digits(work):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype("float32"), y, test_size=0.25, random_state=0, stratify=y
    )
    paths = {}
    for name, xs, ys in (("train", x_train, y_train), ("test", x_test, y_test)):
        table = pa.table(
            {
                "id": pa.array(np.arange(len(ys), dtype=np.int64)),
                "features": pa.array(list(xs), type=pa.list_(pa.float32())),
                "label": pa.array(ys.astype("int32")),
            }
        )
        paths[name] = str(work / f"{name}.parquet")
        pq.write_table(table, paths[name])
    return paths


@pytest.fixture(scope="module")
def shipped(work):
    """The --py-files zip, a venv-pack archive with the wheel, and a bare executor venv."""
    dist = work / "dist"
    wheel = build_dist.build_wheel(str(dist))
    bare = work / "bare-venv"
    subprocess.run([build_dist._base_python(sys.executable), "-m", "venv", "--without-pip", str(bare)], check=True)
    return {
        "zip": build_dist.build_zip(str(dist)),
        "env": build_dist.build_env(str(dist / "env.tar.gz"), wheel, deps=False),
        "bare_python": str(bare / "bin" / "python"),
    }


def _start_training(work, name, master, spark_args=(), executor_python=sys.executable):
    """Starts ``spark-submit jobs/train.py``; :func:`_finish` waits for it."""
    out = work / f"out-{name}"
    env = dict(os.environ, PYSPARK_DRIVER_PYTHON=sys.executable, PYSPARK_PYTHON=executor_python)
    cmd = [
        SPARK_SUBMIT, "--master", master,
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.log.level=WARN",
        "--conf", "spark.executorEnv.TF_CPP_MIN_LOG_LEVEL=2",
        *spark_args,
        os.path.join(ROOT, "jobs", "train.py"),
        "--data", str(work / "train.parquet"),
        "--validation-data", str(work / "test.parquet"),
        "--model-builder", "digits_model:build",
        "--epochs", str(EPOCHS), "--num-workers", "2", "--batch-size", "32", "--averaging-frequency", "8",
        "--seed", "0", "--output-dir", str(out),
    ]
    log = open(work / f"{name}.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=str(work))
    return name, out, proc, log, time.time()


def _finish(started, timeout=420):
    name, out, proc, log, start = started
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = open(log.name).read()
    assert proc.returncode == 0, f"{name}: {text[-4000:]}"
    metrics = json.loads((out / "metrics.json").read_text())
    print(f"{name}: {time.time() - start:.0f} s, validation {metrics['validation']}")
    return out, metrics


def _start_job(work, name, script, *args):
    env = dict(os.environ, PYSPARK_DRIVER_PYTHON=sys.executable, PYSPARK_PYTHON=sys.executable)
    cmd = [SPARK_SUBMIT, "--master", "local[2]", "--conf", "spark.ui.enabled=false", "--conf", "spark.log.level=WARN",
           "--py-files", DIGITS_MODEL, os.path.join(ROOT, "jobs", script), *args]
    log = open(work / f"{name}.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=str(work))
    return name, proc, log


def _wait_job(started, timeout=420):
    name, proc, log = started
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = open(log.name).read()
    assert proc.returncode == 0, f"{name}: {text[-4000:]}"
    return text


def test_train_job_on_local_local_cluster_and_standalone_gives_equal_models(work, digits, shipped, cluster):
    import keras

    # The executors' interpreters cannot import sparkdl_avg by themselves.
    for python in (shipped["bare_python"],):
        probe = subprocess.run(
            [python, "-c", "import numpy, pyarrow; import sparkdl_avg"],
            env=dict(os.environ, PYTHONPATH=SITE_PACKAGES), capture_output=True, text=True, cwd=str(work),
        )
        assert probe.returncode == 1 and "No module named 'sparkdl_avg'" in probe.stderr, probe.stderr

    # evaluate.py and predict.py with a saved (untrained) model, alongside the training jobs.
    sys.path.insert(0, os.path.dirname(DIGITS_MODEL))
    try:
        import digits_model  # the module name is recorded with the custom layer
    finally:
        sys.path.remove(os.path.dirname(DIGITS_MODEL))

    reference = digits_model.build(seed=1)
    reference.save(str(work / "reference.keras"))
    side_jobs = [
        _start_job(work, "evaluate", "evaluate.py", "--model", str(work / "reference.keras"), "--data", digits["test"],
                   "--output", str(work / "eval.json"), "--no-check-executors"),
        _start_job(work, "predict", "predict.py", "--model", str(work / "reference.keras"), "--data", digits["test"],
                   "--keep-cols", "id,label", "--output", str(work / "predictions")),
    ]

    deps = ["--conf", f"spark.executorEnv.PYTHONPATH={SITE_PACKAGES}", "--conf", "spark.executor.memory=768m"]
    # The three jobs run at the same time (they share nothing but the CPUs).
    started = [
        _start_training(work, "local", "local[2]", ["--py-files", DIGITS_MODEL]),
        _start_training(
            work, "local-cluster", "local-cluster[2,1,1024]",
            [*deps, "--py-files", f"{shipped['zip']},{DIGITS_MODEL}"],
            executor_python=shipped["bare_python"],
        ),
    ]
    try:
        started.append(
            _start_training(
                work, "standalone", cluster(),
                [*deps, "--archives", f"{shipped['env']}#environment", "--py-files", DIGITS_MODEL],
                executor_python="./environment/bin/python",
            )
        )
    finally:
        runs = {s[0]: _finish(s) for s in started}

    for job in side_jobs:
        _wait_job(job)
    _check_evaluate_and_predict(work, digits, reference)

    # local-cluster keeps its executors' directories under the pip-installed pyspark (SPARK_HOME/work): drop ours.
    for e in runs["local-cluster"][1]["executors"]:
        app_dir = e["sparkdl_avg_file"].split(".zip/")[0].rsplit("/", 2)[0]
        if os.path.basename(app_dir).startswith("app-") and os.path.dirname(app_dir).endswith("/work"):
            shutil.rmtree(app_dir, ignore_errors=True)

    # Where the executors' sparkdl_avg came from.
    local_cluster = runs["local-cluster"][1]["executors"]
    assert local_cluster and all(e["python"] == shipped["bare_python"] for e in local_cluster)
    assert all(e["sparkdl_avg_file"].endswith(".zip/sparkdl_avg/__init__.py") for e in local_cluster), local_cluster
    standalone = runs["standalone"][1]["executors"]
    assert standalone and all(e["python"].endswith("/environment/bin/python") for e in standalone)
    assert all(
        "/environment/lib/" in e["sparkdl_avg_file"] and str(work / "cluster") in e["sparkdl_avg_file"]
        for e in standalone
    ), standalone
    for name in ("local-cluster", "standalone"):
        assert not any(e["sparkdl_avg_file"].startswith(os.path.join(ROOT, "sparkdl_avg")) for e in runs[name][1]["executors"])
        stats = json.loads((runs[name][0] / "stats.json").read_text())
        assert len({w["pid"] for r in stats for w in r["workers"]}) == 2  # two executors' Python workers

    # Equal models: each reaches the accuracy, and they agree.
    accuracy = {name: m["validation"]["accuracy"] for name, (_, m) in runs.items()}
    assert min(accuracy.values()) >= 0.9, accuracy
    assert max(accuracy.values()) - min(accuracy.values()) <= 0.03, accuracy
    for name, (out, metrics) in runs.items():
        assert len(metrics["history"]["loss"]) == EPOCHS
        assert {p.name for p in out.iterdir()} == {"model.keras", "stats.json", "metrics.json", "report.html"}

    # The saved model (custom layer included) loads on the driver and scores what the job reported.
    model = keras.saving.load_model(str(runs["standalone"][0] / "model.keras"))
    _, x, y = _test_arrays(digits)
    local = model.evaluate(x, y, verbose=0, return_dict=True)
    assert local["accuracy"] == pytest.approx(accuracy["standalone"], abs=1e-6)


def _test_arrays(digits):
    import pyarrow.parquet as pq

    test = pq.read_table(digits["test"])
    x = np.stack(test.column("features").to_numpy(zero_copy_only=False)).reshape(-1, 8, 8, 1)
    return test.column("id").to_numpy(), x, test.column("label").to_numpy()


def _check_evaluate_and_predict(work, digits, reference):
    import pandas as pd

    ids, x, y = _test_arrays(digits)
    expected = reference.evaluate(x, y, verbose=0, return_dict=True)
    metrics = json.loads((work / "eval.json").read_text())
    assert metrics["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-6)
    assert metrics["loss"] == pytest.approx(expected["loss"], rel=1e-4)

    predictions = pd.read_parquet(work / "predictions").sort_values("id")
    assert list(predictions.columns) == ["id", "label", "prediction", "probability"]
    assert len(predictions) == len(y) and (predictions["id"].to_numpy() == ids).all()
    np.testing.assert_array_equal(predictions["prediction"].to_numpy(), reference.predict(x, verbose=0).argmax(axis=1))
