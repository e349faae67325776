"""Custom layers, losses and metrics defined in ``__main__`` (a notebook cell, the job script).

Executors cannot import the driver's ``__main__``, so the ``ModelSpec``
carries those objects pickled by value and registers them before the
replica's archive loads. The fast tests define the objects with
``exec(..., {"__name__": "__main__"})``, which gives them ``__module__ ==
"__main__"`` as a notebook cell does; the slow one runs a script as
``__main__`` against ``local-cluster[2,1,1024]``, whose executors' Python
workers do not share the driver's process.
"""

import json
import os
import pickle
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from conftest import record_jobs
from sparkdl_avg import ParameterAveragingTrainer
from sparkdl_avg.errors import ConfigurationError
from sparkdl_avg.shared.model.modelspec import ModelSpec

PACKAGE = "nb_test"
NAMES = (f"{PACKAGE}>Scale", f"{PACKAGE}>scaled_mse", f"{PACKAGE}>mean_abs")

CELL = f"""
import keras
from keras import ops


@keras.saving.register_keras_serializable(package={PACKAGE!r})
class Scale(keras.layers.Layer):
    def __init__(self, init=1.0, **kwargs):
        super().__init__(**kwargs)
        self.init = init

    def build(self, input_shape):
        self.alpha = self.add_weight(shape=(), initializer=keras.initializers.Constant(self.init))

    def call(self, x):
        return x * self.alpha + OFFSET

    def get_config(self):
        return {{**super().get_config(), "init": self.init}}


# Labels may arrive with shape (batch,), predictions (batch, 1): compare per example.
@keras.saving.register_keras_serializable(package={PACKAGE!r})
def scaled_mse(y_true, y_pred):
    return 0.5 * ops.square(ops.reshape(y_true, (-1,)) - ops.reshape(y_pred, (-1,)))


@keras.saving.register_keras_serializable(package={PACKAGE!r})
def mean_abs(y_true, y_pred):
    return ops.abs(ops.reshape(y_true, (-1,)) - ops.reshape(y_pred, (-1,)))
"""


def notebook_cell(offset=0.0, source=CELL):
    """Runs ``source`` as a notebook cell would: its objects get ``__module__ == "__main__"``."""
    namespace = {"__name__": "__main__", "OFFSET": offset}
    exec(compile(source, "<notebook cell>", "exec"), namespace)
    return namespace


def unregister(*names):
    for name in names:
        keras.saving.get_custom_objects().pop(name, None)


@pytest.fixture
def cell():
    yield notebook_cell()
    unregister(*NAMES)


def custom_model(cell, seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="tanh")(cell["Scale"](0.5)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(keras.optimizers.SGD(0.05), loss=cell["scaled_mse"], metrics=[cell["mean_abs"]])
    return model


def test_spec_ships_main_objects_and_rebuilds_without_them_registered(cell):
    model = custom_model(cell)
    spec = ModelSpec.from_model(model)
    assert spec.custom_objects
    shipped = pickle.dumps(spec)
    # What an executor sees: neither the registry entries nor the cell's namespace.
    unregister(*NAMES)
    del cell["Scale"], cell["scaled_mse"], cell["mean_abs"]
    with pytest.raises(Exception, match="Could not locate"):
        ModelSpec(spec.keras_bytes, spec.fingerprint, spec.optimizer_shapes, spec.floatx).build()

    replica = pickle.loads(shipped).build()
    assert set(NAMES) <= set(keras.saving.get_custom_objects())
    assert type(replica.layers[1]).__name__ == "Scale"
    assert [w.shape for w in replica.get_weights()] == [w.shape for w in model.get_weights()]
    replica.set_weights(model.get_weights())  # the spec ships no weights: a task assigns them
    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    y = np.ones((16, 1), "float32")
    np.testing.assert_allclose(replica.predict_on_batch(x), model.predict_on_batch(x), rtol=0, atol=1e-7)
    logs = replica.evaluate(x, y, verbose=0, return_dict=True)
    assert logs == pytest.approx(model.evaluate(x, y, verbose=0, return_dict=True), rel=1e-6)
    assert set(logs) == {"loss", "mean_abs"}


def test_fingerprint_follows_the_shipped_code(cell):
    model = custom_model(cell)
    spec = ModelSpec.from_model(model)
    assert ModelSpec.from_model(model).fingerprint == spec.fingerprint
    # The cell re-run with a changed layer: same config, another class, another replica.
    changed = custom_model(notebook_cell(offset=1.0))
    assert ModelSpec.from_model(changed).fingerprint != spec.fingerprint
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    plain.compile("sgd", "mse")
    assert ModelSpec.from_model(plain).custom_objects == b""


@keras.saving.register_keras_serializable(package="test_custom_objects")
class Importable(keras.layers.Layer):
    def call(self, x):
        return x


def test_objects_of_importable_modules_are_not_shipped():
    model = keras.Sequential([keras.Input((4,)), Importable(), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    assert ModelSpec.from_model(model).custom_objects == b""  # executors import the module (--py-files)


UNPICKLABLE = f"""
import threading
import keras


@keras.saving.register_keras_serializable(package={PACKAGE!r})
class Locked(keras.layers.Layer):
    lock = threading.Lock()

    def call(self, x):
        with self.lock:
            return x
"""


def test_an_object_cloudpickle_cannot_pickle_is_refused_before_any_job(spark):
    from conftest import regression_data

    cell = notebook_cell(source=UNPICKLABLE)
    try:
        model = keras.Sequential([keras.Input((4,)), cell["Locked"](), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8)
        with record_jobs(spark) as jobs:
            with pytest.raises(
                ConfigurationError,
                match=r"^The custom object 'nb_test>Locked' is defined in __main__, which executors cannot "
                r"import, and it cannot be shipped to them by value \(cloudpickle said TypeError: cannot "
                r"pickle '_thread.lock' object\)\. Move it into a module .*--py-files.*addPyFile.*addArtifacts",
            ):
                trainer.fit(regression_data(64), verbose=0)
        assert jobs.job_ids == []
    finally:
        unregister(f"{PACKAGE}>Locked")


SCRIPT_HEAD = '''"""Trains, evaluates and predicts with custom objects defined only in this script (__main__)."""
import json
import sys

import numpy as np
from pyspark.sql import SparkSession

from sparkdl_avg import ParameterAveragingTrainer

OFFSET = 0.0
'''

SCRIPT = SCRIPT_HEAD + CELL + textwrap.dedent(
    '''
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.memory", "1g")
        .config("spark.local.dir", sys.argv[2])
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32").astype("float64")
    y = np.tanh(x @ rng.normal(size=4)).astype("float32").astype("float64")
    df = spark.createDataFrame([(r.tolist(), float(t)) for r, t in zip(x, y)], "features array<double>, label double")

    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(16, activation="tanh")(Scale(0.5)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(keras.optimizers.SGD(0.1), loss=scaled_mse, metrics=[mean_abs])

    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=4, seed=0)
    history = trainer.fit(df.repartition(2), epochs=2, verbose=0)
    result = trainer.evaluate(df, return_dict=True)
    local = model.evaluate(x, y, verbose=0, return_dict=True)
    rows = trainer.predict(df).select("prediction").collect()
    pids = {w["pid"] for r in trainer.stats.records for w in r["workers"]}
    with open(sys.argv[1], "w") as f:
        json.dump(
            {
                "loss": history.history["loss"],
                "evaluate": result,
                "local_evaluate": local,
                "predictions": [r.prediction for r in rows],
                "local_predictions": model.predict(x, verbose=0)[:, 0].tolist(),
                "alpha": float(model.layers[1].alpha.numpy()),
                "executor_pids": sorted(pids),
            },
            f,
        )
    spark.stop()
    '''
)


@pytest.mark.slow
def test_script_main_objects_train_evaluate_and_predict_on_local_cluster(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    out = tmp_path / "result.json"
    (tmp_path / "spark").mkdir()
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, str(script), str(out), str(tmp_path / "spark")],
        cwd=str(tmp_path),  # nothing importable next to the script
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    r = json.loads(out.read_text())
    assert len(r["loss"]) == 2 and r["loss"][-1] < r["loss"][0]
    assert r["alpha"] != 0.5  # the custom layer's weight was trained and averaged
    assert set(r["evaluate"]) == {"loss", "mean_abs"}
    assert r["evaluate"] == pytest.approx(r["local_evaluate"], rel=1e-5)
    np.testing.assert_allclose(r["predictions"], r["local_predictions"], rtol=0, atol=1e-6)
    assert len(r["executor_pids"]) == 2
