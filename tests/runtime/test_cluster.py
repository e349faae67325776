"""End to end on ``local-cluster[2,1,1024]``: two executor JVMs, each with its own Python workers.

This catches pickling and import mistakes that ``local[*]`` hides (there the
executors share the driver's JVM). The module starts and stops its own
session and does not use the shared ``spark`` fixture. The executors import
``sparkdl_avg`` from the virtualenv, where it is installed in editable mode
(PYSPARK_PYTHON is the venv's interpreter; no PYTHONPATH is passed on, so a
closure that drags in a test module would fail here).
"""

import os

import pytest

from conftest import spark_session

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    conf = {"spark.executor.memory": "1g", "spark.python.worker.reuse": "true"}
    with spark_session("local-cluster[2,1,1024]", "sparkdl_avg-cluster-test", **conf) as session:
        yield session


def digits_frames(spark):
    from pyspark.ml.linalg import Vectors
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    scaler = StandardScaler().fit(x_train)
    x_train, x_test = scaler.transform(x_train), scaler.transform(x_test)
    train = spark.createDataFrame(
        [(Vectors.dense(row), int(label)) for row, label in zip(x_train, y_train)], ["features", "label"]
    ).repartition(3)
    test = spark.createDataFrame(
        [(row.tolist(), int(label)) for row, label in zip(x_test, y_test)], "features array<double>, label int"
    )
    return train, test, (x_test, y_test)


def test_digits_mlp_on_two_executors(cluster):
    import keras

    from sparkdl_avg import ParameterAveragingTrainer

    sc = cluster.sparkContext
    assert sc.master == "local-cluster[2,1,1024]"
    train, test, (x_test, y_test) = digits_frames(cluster)

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.005), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    before = model.evaluate(x_test, y_test, verbose=0, return_dict=True)

    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=32, averaging_frequency=8, seed=0)
    history = trainer.fit(train, epochs=4, validation_data=test, verbose=0)

    assert len(history.history["loss"]) == 4
    assert history.history["loss"][-1] < history.history["loss"][0]
    result = trainer.evaluate(test, return_dict=True)
    assert result["accuracy"] >= 0.9, result
    assert before["accuracy"] < 0.5
    # the distributed evaluation agrees with Keras on the driver
    local = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
    assert result["accuracy"] == pytest.approx(local["accuracy"], abs=1e-6)
    assert result["loss"] == pytest.approx(local["loss"], rel=1e-5)
    assert history.history["val_accuracy"][-1] == pytest.approx(result["accuracy"], abs=1e-6)

    # both executors trained: two distinct Python worker processes, one per executor
    records = trainer.stats.records
    pids = {w["pid"] for r in records for w in r["workers"]}
    assert len(pids) == 2, pids
    assert all(len(r["workers"]) == 2 for r in records)
    assert os.getpid() not in pids
    # replicas were built once per Python worker and then reused
    assert sum(r["replicas_built"] for r in records) == 2
    assert len(records) == 4 * len({(r["round"]) for r in records})
