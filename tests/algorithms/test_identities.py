"""Parameter averaging on local[2] equals known single-machine Keras training.

docs/algorithms.md ("Optimizer state"): with plain SGD, ``averaging_frequency=1``
and equal minibatches, averaging N workers is synchronous SGD with batch
``N·B``; with ``N=1`` and the optimizer state carried between rounds it is
sequential Keras training.
All models are float64 and the data float32-exact (see ``conftest.f32_exact``)
so the identities hold to ~1e-10.

Logged losses: Keras computes losses and metrics, and their running means,
in ``floatx``. With the default float32 both Keras' ``History`` and the
trainer's (whose workers report float32 running means over each round) carry
~1e-7 relative rounding, so they are compared with ``rtol=1e-6``. The tests
using the ``floatx64`` fixture run everything with float64 losses and compare
the histories with ``rtol=1e-9``.
"""

import numpy as np
import pytest

import keras

from conftest import (
    assert_weights_close,
    clone_compiled,
    make_model,
    max_weight_change,
    regression_data,
)
from sparkdl_avg import ParameterAveragingTrainer, testing
from sparkdl_avg.shared.data import example_order
from sparkdl_avg.shared.model.modelspec import get_state, iterations_index, set_state

ATOL = 1e-10
LOSS_RTOL = 1e-6


def optimizer_vars(model):
    return {v.path.split("/", 1)[1]: np.asarray(v.numpy()) for v in model.optimizer.variables}


def assert_optimizer_state_close(actual_model, expected_model, atol=ATOL):
    actual, expected = optimizer_vars(actual_model), optimizer_vars(expected_model)
    # Keras names slots after the variables, whose auto-generated names differ
    # between a model and its clone; compare in order instead.
    assert len(actual) == len(expected)
    for (ka, a), (ke, e) in zip(actual.items(), expected.items()):
        np.testing.assert_allclose(a, e, atol=atol, rtol=0, err_msg=f"{ka} vs {ke}")


def sequential_reference(model, optimizer, batches_per_epoch, epochs, loss="mse", metrics=("mae",)):
    """Keras ``train_on_batch`` over ``batches_per_epoch(epoch)``; mean loss per epoch in float64."""
    ref = clone_compiled(model, optimizer, loss=loss, metrics=metrics)
    history = {}
    for epoch in range(epochs):
        logs = [ref.train_on_batch(xb, yb, return_dict=True) for xb, yb in batches_per_epoch(epoch)]
        for k in logs[0]:
            history.setdefault(k, []).append(sum(l[k] for l in logs) / len(logs))
    return ref, history


# ------------------------------------------------------------------ identities


def test_sgd_k1_two_workers_equals_keras_fit_with_double_batch(in_process_engine):
    B, N, E = 8, 2, 2
    x, y = regression_data(6 * N * B, seed=1)  # 96 examples, no remainder
    model = make_model(optimizer=keras.optimizers.SGD(0.1), seed=1)
    ref = clone_compiled(model, keras.optimizers.SGD(0.1))
    initial = model.get_weights()

    trainer = ParameterAveragingTrainer(model, num_workers=N, batch_size=B, averaging_frequency=1, seed=0)
    history = trainer.fit((x, y), epochs=E, shuffle=False, verbose=0)
    ref_history = ref.fit(x, y, batch_size=N * B, shuffle=False, epochs=E, verbose=0)

    assert trainer.model is model
    assert max_weight_change(initial, model.get_weights()) > 1e-3  # it did train
    assert_weights_close(model.get_weights(), ref.get_weights(), atol=ATOL)
    assert int(model.optimizer.iterations.numpy()) == int(ref.optimizer.iterations.numpy()) == 6 * E
    assert len(history.history["loss"]) == E
    np.testing.assert_allclose(history.history["loss"], ref_history.history["loss"], rtol=LOSS_RTOL)
    np.testing.assert_allclose(history.history["mae"], ref_history.history["mae"], rtol=LOSS_RTOL)
    # one record per round, each with both workers' examples
    assert len(trainer.stats.records) == 6 * E
    assert all(r["examples"] == N * B and r["num_workers"] == N for r in trainer.stats.records)


def test_momentum_sgd_k1_two_workers_with_averaged_state_equals_keras_fit(in_process_engine):
    B, N, E = 8, 2, 2
    x, y = regression_data(5 * N * B, seed=2)
    opt = lambda: keras.optimizers.SGD(0.05, momentum=0.9)  # noqa: E731
    model = make_model(optimizer=opt(), seed=2)
    ref = clone_compiled(model, opt())

    trainer = ParameterAveragingTrainer(
        model, num_workers=N, batch_size=B, averaging_frequency=1, optimizer_state="average", seed=0
    )
    history = trainer.fit((x, y), epochs=E, shuffle=False, verbose=0)
    ref_history = ref.fit(x, y, batch_size=N * B, shuffle=False, epochs=E, verbose=0)

    assert_weights_close(model.get_weights(), ref.get_weights(), atol=ATOL)
    # the momentum buffers are averaged too, so they match Keras' as well
    assert_optimizer_state_close(model, ref)
    assert max(np.abs(v).max() for k, v in optimizer_vars(model).items() if "momentum" in k) > 1e-4
    np.testing.assert_allclose(history.history["loss"], ref_history.history["loss"], rtol=LOSS_RTOL)


def test_one_worker_adam_k5_equals_sequential_keras_fit(in_process_engine):
    B, E, k = 8, 2, 5
    x, y = regression_data(13 * B, seed=3)  # 13 minibatches: rounds of 5, 5, 3
    assert example_order.round_lengths(len(x), 1, B, k) == [5, 5, 3]
    opt = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
    model = make_model(optimizer=opt(), seed=3)
    ref = clone_compiled(model, opt())
    exact_ref, exact_history = sequential_reference(
        model, opt(), lambda e: [(x[i : i + B], y[i : i + B]) for i in range(0, len(x), B)], E
    )

    trainer = ParameterAveragingTrainer(model, num_workers=1, batch_size=B, averaging_frequency=k, seed=0)
    history = trainer.fit((x, y), epochs=E, shuffle=False, verbose=0)
    ref_history = ref.fit(x, y, batch_size=B, shuffle=False, epochs=E, verbose=0)

    assert_weights_close(model.get_weights(), ref.get_weights(), atol=ATOL)
    assert_weights_close(model.get_weights(), exact_ref.get_weights(), atol=ATOL)
    assert_optimizer_state_close(model, ref)
    assert int(model.optimizer.iterations.numpy()) == 13 * E
    assert [r["averaging_frequency"] for r in trainer.stats.records] == [5, 5, 3] * E
    np.testing.assert_allclose(history.history["loss"], ref_history.history["loss"], rtol=LOSS_RTOL)
    np.testing.assert_allclose(history.history["loss"], exact_history["loss"], rtol=LOSS_RTOL)
    np.testing.assert_allclose(history.history["mae"], exact_history["mae"], rtol=LOSS_RTOL)


def test_shuffled_one_worker_equals_keras_on_the_epoch_order(in_process_engine):
    B, E, k, seed = 8, 3, 3, 1234
    M = 8 * B
    x, y = regression_data(M, seed=4)
    opt = lambda: keras.optimizers.SGD(0.05, momentum=0.5)  # noqa: E731
    model = make_model(optimizer=opt(), seed=4)
    ref = clone_compiled(model, opt())

    trainer = ParameterAveragingTrainer(model, num_workers=1, batch_size=B, averaging_frequency=k, seed=seed)
    history = trainer.fit((x, y), epochs=E, shuffle=True, verbose=0)

    ref_losses = []
    orders = []
    for epoch in range(E):
        idx = example_order.EpochOrder(M, seed, epoch).indices(0, M)
        orders.append(idx)
        h = ref.fit(x[idx], y[idx], batch_size=B, shuffle=False, epochs=1, verbose=0)
        ref_losses.append(h.history["loss"][0])
    assert not np.array_equal(orders[0], np.arange(M)) and not np.array_equal(orders[0], orders[1])

    assert_weights_close(model.get_weights(), ref.get_weights(), atol=ATOL)
    np.testing.assert_allclose(history.history["loss"], ref_losses, rtol=LOSS_RTOL)

    # the unshuffled order trains to a different model: the check above can fail
    other = clone_compiled(make_model(optimizer=opt(), seed=4), opt())
    other.fit(x, y, batch_size=B, shuffle=False, epochs=E, verbose=0)
    assert max_weight_change(other.get_weights(), model.get_weights()) > 1e-6


def test_same_seed_repeats_a_shuffled_fit_exactly(in_process_engine):
    x, y = regression_data(64, seed=5)
    results = []
    for _ in range(2):
        model = make_model(optimizer=keras.optimizers.Adam(0.01), seed=5)
        trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=99)
        trainer.fit((x, y), epochs=2, verbose=0)
        results.append(model.get_weights())
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def simulate_local_sgd(model, optimizer, x, y, N, B, k, E):
    """Plain-Keras simulation of the algorithm (shuffle=False): per round, each of
    ``N`` replicas starts from the averaged weights and optimizer variables, takes
    its ``steps`` minibatches with ``train_on_batch``; then everything is averaged
    and the iteration counter advances by ``steps``. Returns (weights, optimizer
    variables, per-epoch mean loss)."""
    sim = clone_compiled(model, optimizer)
    sim.optimizer.build(sim.trainable_variables)
    weights, opt_vars = get_state(sim)
    it = iterations_index(sim)
    M = len(x)
    losses = []
    for epoch in range(E):
        before, loss_sum, loss_n = 0, 0.0, 0
        for steps in example_order.round_lengths(M, N, B, k):
            new_w, new_o = [], []
            for worker in range(N):
                set_state(sim, weights, opt_vars)
                pos = example_order.worker_positions(before, steps, worker, N, B)
                for s in range(steps):
                    sl = slice(pos.start + s * B, pos.start + (s + 1) * B)
                    loss_sum += sim.train_on_batch(x[sl], y[sl], return_dict=True)["loss"]
                    loss_n += 1
                w, o = get_state(sim)
                new_w.append(w)
                new_o.append(o)
            weights = [sum(ws) / N for ws in zip(*new_w)]
            iterations = int(opt_vars[it]) + steps
            opt_vars = [(sum(np.asarray(v, np.float64) for v in vs) / N).astype(vs[0].dtype) for vs in zip(*new_o)]
            opt_vars[it] = np.asarray(iterations, dtype=new_o[0][it].dtype)
            before += steps
        losses.append(loss_sum / loss_n)
    return weights, opt_vars, losses


def test_two_workers_adam_k3_equals_a_simulated_local_sgd(in_process_engine):
    """N=2, k=3: each worker takes k Adam steps from the averaged state, then all is averaged."""
    B, N, k, E = 8, 2, 3, 2
    M = N * B * 5 + 5  # 5 minibatches per worker (rounds of 3 and 2), 5 examples left over
    x, y = regression_data(M, seed=6)
    opt = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
    model = make_model(optimizer=opt(), seed=6)
    weights, opt_vars, sim_losses = simulate_local_sgd(model, opt(), x, y, N, B, k, E)

    trainer = ParameterAveragingTrainer(model, num_workers=N, batch_size=B, averaging_frequency=k, seed=0)
    history = trainer.fit((x, y), epochs=E, shuffle=False, verbose=0)

    assert_weights_close(model.get_weights(), weights, atol=ATOL)
    for a, e in zip(get_state(model)[1], opt_vars):
        np.testing.assert_allclose(a, e, atol=ATOL, rtol=0)
    assert int(model.optimizer.iterations.numpy()) == 5 * E
    np.testing.assert_allclose(history.history["loss"], sim_losses, rtol=LOSS_RTOL)


def test_more_workers_than_cores_with_a_deep_aggregation_tree(spark):
    """N=6 tasks on 2 cores; depth 2 makes treeAggregate add a reduceByKey level.

    (The reference is the simulation, not ``fit(batch_size=24)``: Keras scales
    the loss gradient by a float32 1/24, which is inexact, while 1/4 is exact.)
    """
    B, N, E = 4, 6, 1
    x, y = regression_data(N * B * 3, seed=21)
    opt = lambda: keras.optimizers.SGD(0.05, momentum=0.9)  # noqa: E731
    model = make_model(optimizer=opt(), seed=21)
    weights, opt_vars, losses = simulate_local_sgd(model, opt(), x, y, N, B, 1, E)
    trainer = ParameterAveragingTrainer(
        model, num_workers=N, batch_size=B, averaging_frequency=1, aggregation_depth=2, seed=0
    )
    history = trainer.fit((x, y), epochs=E, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), weights, atol=ATOL)
    np.testing.assert_allclose(history.history["loss"], losses, rtol=LOSS_RTOL)
    assert all(sorted(w["worker"] for w in r["workers"]) == list(range(N)) for r in trainer.stats.records)


@pytest.mark.parametrize(
    "N,B,k,optimizer",
    [(2, 8, 1, lambda: keras.optimizers.SGD(0.1)), (1, 8, 5, lambda: keras.optimizers.Adam(0.01))],
    ids=["sgd-N2-k1", "adam-N1-k5"],
)
def test_history_loss_is_exact_with_float64_floatx(in_process_engine, floatx64, N, B, k, optimizer):
    E = 2
    x, y = regression_data(N * B * 7, seed=27)
    rng = np.random.default_rng(27)
    x = x + rng.normal(scale=1e-9, size=x.shape)  # not float32-exact: nothing casts to float32 now
    model = make_model(optimizer=optimizer(), seed=27)
    ref = clone_compiled(model, optimizer())
    trainer = ParameterAveragingTrainer(model, num_workers=N, batch_size=B, averaging_frequency=k, seed=0)
    history = trainer.fit((x, y), epochs=E, shuffle=False, verbose=0)
    ref_history = ref.fit(x, y, batch_size=N * B, shuffle=False, epochs=E, verbose=0)
    assert_weights_close(model.get_weights(), ref.get_weights(), atol=ATOL)
    for key in ("loss", "mae"):
        np.testing.assert_allclose(history.history[key], ref_history.history[key], rtol=1e-9)
    # and the float32 rounding these tests avoid would be visible at this tolerance
    assert any(float(np.float32(v)) != v for v in history.history["loss"])


# ------------------------------------------------------------------ evaluate


def test_evaluate_equals_keras_evaluate(in_process_engine):
    x, y = regression_data(101, seed=7)
    model = make_model(optimizer=keras.optimizers.SGD(0.1), seed=7)
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
    trainer.fit((x, y), epochs=1, verbose=0)

    expected = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    got = trainer.evaluate((x, y), batch_size=16, return_dict=True)
    assert set(got) == {"loss", "mae"}
    assert got == pytest.approx(expected, rel=1e-6)
    as_list = trainer.evaluate((x, y))
    assert as_list == pytest.approx([expected["loss"], expected["mae"]], rel=1e-6)


def test_evaluate_classification_accuracy(in_process_engine):
    rng = np.random.default_rng(8)
    x = rng.normal(size=(90, 4))
    labels = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    model = make_model(
        outputs=3,
        output_activation="softmax",
        loss="sparse_categorical_crossentropy",
        metrics=("accuracy",),
        optimizer=keras.optimizers.Adam(0.05),
        seed=8,
    )
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=4, seed=0)
    trainer.fit((x, labels), epochs=3, verbose=0)
    expected = model.evaluate(x, labels, batch_size=32, verbose=0, return_dict=True)
    got = trainer.evaluate((x, labels), batch_size=32, return_dict=True)
    assert got == pytest.approx(expected, rel=1e-6)
    assert got["accuracy"] > 0.6


def test_validation_data_adds_val_logs_equal_to_evaluate(in_process_engine):
    x, y = regression_data(64, seed=9)
    xv, yv = regression_data(30, seed=10)
    model = make_model(optimizer=keras.optimizers.Adam(0.01), seed=9)
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
    history = trainer.fit((x, y), epochs=2, validation_data=(xv, yv), verbose=0)
    assert set(history.history) == {"loss", "mae", "val_loss", "val_mae"}
    assert len(history.history["val_loss"]) == 2
    expected = model.evaluate(xv, yv, batch_size=8, verbose=0, return_dict=True)
    assert history.history["val_loss"][-1] == pytest.approx(expected["loss"], rel=1e-6)
    assert history.history["val_mae"][-1] == pytest.approx(expected["mae"], rel=1e-6)


def test_callbacks_see_epochs_and_rounds(in_process_engine):
    x, y = regression_data(64, seed=11)
    model = make_model(optimizer=keras.optimizers.SGD(0.1), seed=11)

    class Recorder(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.events = []

        def on_train_batch_end(self, batch, logs=None):
            self.events.append(("batch", batch))

        def on_epoch_end(self, epoch, logs=None):
            self.events.append(("epoch", epoch, round(logs["loss"], 12)))

    rec = Recorder()
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
    history = trainer.fit((x, y), epochs=2, callbacks=[rec], verbose=0)
    # 64 / (2 * 8) = 4 minibatches per worker -> rounds of 2 and 2
    loss = [round(v, 12) for v in history.history["loss"]]
    assert rec.events == [("batch", 0), ("batch", 1), ("epoch", 0, loss[0]), ("batch", 0), ("batch", 1), ("epoch", 1, loss[1])]


# ------------------------------------------------------------------ input kinds


def fit_numpy_reference(model, x, y, **fit_kwargs):
    clone = clone_compiled(model, keras.optimizers.Adam(0.01))
    trainer = ParameterAveragingTrainer(clone, num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
    history = trainer.fit((x, y), shuffle=False, verbose=0, **fit_kwargs)
    return clone, history


@pytest.fixture(scope="module")
def frame_data():
    return regression_data(72, seed=12)  # 72 = 4 * 16 + 8: a remainder is skipped


def test_dataframe_array_column_equals_numpy(spark, frame_data):
    x, y = frame_data
    df = spark.createDataFrame(
        [(row.tolist(), float(label)) for row, label in zip(x, y)], "features array<double>, label double"
    )
    model = make_model(optimizer=keras.optimizers.Adam(0.01), seed=12)
    ref, ref_history = fit_numpy_reference(model, x, y, epochs=2)

    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
    history = trainer.fit(df, epochs=2, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), ref.get_weights(), atol=1e-12)
    np.testing.assert_allclose(history.history["loss"], ref_history.history["loss"], rtol=1e-12)
    assert trainer.evaluate(df, return_dict=True) == pytest.approx(trainer.evaluate((x, y), return_dict=True), rel=1e-12)


def test_dataframe_float_array_and_custom_columns(spark, frame_data):
    x, y = frame_data
    df = spark.createDataFrame(
        [(row.astype(np.float32).tolist(), float(label), "extra") for row, label in zip(x, y)],
        "inputs array<float>, target double, other string",
    )
    model = make_model(optimizer=keras.optimizers.Adam(0.01), seed=13)
    ref, _ = fit_numpy_reference(model, x, y, epochs=1)
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
    trainer.fit(df, epochs=1, features_col="inputs", label_col="target", shuffle=False, verbose=0)
    # x is float32-exact, so array<float> loses nothing
    assert_weights_close(model.get_weights(), ref.get_weights(), atol=1e-12)


def test_dataframe_dense_vectors_equal_numpy(spark, frame_data):
    from pyspark.ml.linalg import Vectors

    x, y = frame_data
    df = spark.createDataFrame([(Vectors.dense(row), float(label)) for row, label in zip(x, y)], ["features", "label"])
    model = make_model(optimizer=keras.optimizers.Adam(0.01), seed=14)
    ref, _ = fit_numpy_reference(model, x, y, epochs=1)
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
    trainer.fit(df, epochs=1, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), ref.get_weights(), atol=1e-12)


def test_dataframe_vector_assembler_equals_numpy(spark, frame_data):
    from pyspark.ml.feature import VectorAssembler

    x, y = frame_data
    cols = [f"c{i}" for i in range(x.shape[1])]
    raw = spark.createDataFrame([tuple(map(float, row)) + (float(label),) for row, label in zip(x, y)], cols + ["label"])
    df = VectorAssembler(inputCols=cols, outputCol="features").transform(raw)
    assert df.schema["features"].metadata["ml_attr"]["num_attrs"] == x.shape[1]
    model = make_model(optimizer=keras.optimizers.Adam(0.01), seed=15)
    ref, _ = fit_numpy_reference(model, x, y, epochs=1)
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
    trainer.fit(df, epochs=1, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), ref.get_weights(), atol=1e-12)


def test_dataframe_integer_labels_for_classification(spark):
    rng = np.random.default_rng(16)
    x = np.asarray(rng.normal(size=(64, 4)), np.float32).astype(np.float64)
    labels = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)
    df = spark.createDataFrame([(row.tolist(), int(l)) for row, l in zip(x, labels)], "features array<double>, label int")
    kwargs = dict(outputs=3, output_activation="softmax", loss="sparse_categorical_crossentropy", metrics=("accuracy",), seed=16)
    model = make_model(optimizer=keras.optimizers.Adam(0.01), **kwargs)
    ref = clone_compiled(model, keras.optimizers.Adam(0.01), loss=kwargs["loss"], metrics=kwargs["metrics"])
    ParameterAveragingTrainer(ref, num_workers=2, batch_size=8, averaging_frequency=2, seed=0).fit(
        (x, labels), epochs=1, shuffle=False, verbose=0
    )
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
    history = trainer.fit(df, epochs=1, shuffle=False, verbose=0)
    assert "accuracy" in history.history
    assert_weights_close(model.get_weights(), ref.get_weights(), atol=1e-12)


def test_rdd_of_pairs_equals_numpy(spark, frame_data):
    x, y = frame_data
    rdd = spark.sparkContext.parallelize(list(zip(x, y)), 3)
    model = make_model(optimizer=keras.optimizers.Adam(0.01), seed=17)
    ref, ref_history = fit_numpy_reference(model, x, y, epochs=2)
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
    history = trainer.fit(rdd, epochs=2, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), ref.get_weights(), atol=1e-12)
    np.testing.assert_allclose(history.history["loss"], ref_history.history["loss"], rtol=1e-12)


# ------------------------------------------------------------------ replicas, optimizer state


def test_replicas_are_reused_across_rounds_and_fits(spark):
    x, y = regression_data(64, seed=18)
    model = make_model(hidden=7, optimizer=keras.optimizers.Adam(0.01), seed=18)
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=1, seed=0)
    trainer.fit((x, y), epochs=1, verbose=0)
    first = trainer.stats  # trainer.stats holds the latest fit's rounds; each fit starts a new one
    trainer.fit((x, y), epochs=1, verbose=0)
    records = first.records + trainer.stats.records
    assert len(first) == len(trainer.stats) == 4  # 4 rounds per fit, 2 workers each
    # Each Python worker builds the replica once, in the first round it runs. Training and SQL jobs share
    # one pool of workers (session._share_python_workers), which staging may have left with more workers
    # than task slots; every worker in it builds at most once.
    workers = [w for r in records for w in r["workers"]]
    builds = {}
    for w in workers:
        builds[w["pid"]] = builds.get(w["pid"], 0) + int(w["replica_built"])
    assert all(n <= 1 for n in builds.values()), builds
    assert sum(r["replicas_built"] for r in first) >= 1
    assert sum(r["replicas_built"] for r in trainer.stats) == 0  # the second fit reuses the replicas
    summary = trainer.stats.summary()
    assert summary["rounds"] == 4 and summary["examples"] == 4 * 16
    assert summary["replicas_built"] == 0


def test_optimizer_state_reset_keeps_the_moments_but_counts_the_steps(in_process_engine):
    B, N, k, E = 8, 2, 2, 2
    x, y = regression_data(N * B * 3, seed=19)  # 3 minibatches per worker: rounds of 2, 1
    model = make_model(optimizer=keras.optimizers.Adam(0.01), seed=19)
    initial = model.get_weights()
    trainer = ParameterAveragingTrainer(
        model, num_workers=N, batch_size=B, averaging_frequency=k, optimizer_state="reset", seed=0
    )
    trainer.fit((x, y), epochs=E, verbose=0)
    assert max_weight_change(initial, model.get_weights()) > 1e-3
    assert int(model.optimizer.iterations.numpy()) == 3 * E
    moments = {k: v for k, v in optimizer_vars(model).items() if "momentum" in k or "velocity" in k}
    assert len(moments) == 2 * len(model.trainable_variables)
    for name, value in moments.items():
        np.testing.assert_array_equal(value, np.zeros_like(value), err_msg=name)


def test_optimizer_state_average_carries_the_moments(in_process_engine):
    x, y = regression_data(48, seed=20)
    model = make_model(optimizer=keras.optimizers.Adam(0.01), seed=20)
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
    trainer.fit((x, y), epochs=1, verbose=0)
    moments = [v for k, v in optimizer_vars(model).items() if "momentum" in k or "velocity" in k]
    assert all(np.abs(v).max() > 0 for v in moments)
    assert int(model.optimizer.iterations.numpy()) == 3


# ------------------------------------------------------------------ staging, evaluate edge cases


def test_staging_dir_is_used_and_removed_by_close(in_process_engine, tmp_path):
    x, y = regression_data(32, seed=22)
    model = make_model(seed=22)
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, staging_dir=str(tmp_path))
    trainer.fit((x, y), epochs=1, verbose=0)
    staged = list(tmp_path.rglob("*.arrow"))
    assert len(staged) == 1 and staged[0].parent.name.startswith("training-")
    trainer.close()
    assert list(tmp_path.rglob("*.arrow")) == []
    # still usable: the data is staged again
    trainer.fit((x, y), epochs=1, verbose=0)
    assert len(list(tmp_path.rglob("*.arrow"))) == 1
    with trainer:
        pass
    assert list(tmp_path.rglob("*.arrow")) == []


def test_same_data_is_staged_once_and_arrays_changed_in_place_are_restaged(in_process_engine, tmp_path):
    x, y = regression_data(32, seed=23)
    model = make_model(seed=23)
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, staging_dir=str(tmp_path))
    trainer.fit((x, y), epochs=1, verbose=0)
    first = trainer.evaluate((x, y), return_dict=True)
    assert len(list(tmp_path.rglob("*.arrow"))) == 1  # evaluate reused the training data
    x[:] = x[::-1] * 2.0
    second = trainer.evaluate((x, y), return_dict=True)
    assert len(list(tmp_path.rglob("*.arrow"))) == 2
    assert second == pytest.approx(model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True), rel=1e-6)
    assert second["loss"] != pytest.approx(first["loss"], rel=1e-3)


def test_evaluate_without_metrics_returns_the_loss(in_process_engine):
    x, y = regression_data(40, seed=24)
    model = make_model(seed=24, metrics=())
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8)
    loss = trainer.evaluate((x, y))
    assert isinstance(loss, float)
    assert loss == pytest.approx(model.evaluate(x, y, verbose=0), rel=1e-6)


def test_evaluate_with_fewer_examples_than_parts(in_process_engine):
    x, y = regression_data(2, seed=25)
    model = make_model(seed=25)
    trainer = ParameterAveragingTrainer(model, num_workers=3, batch_size=8)
    got = trainer.evaluate((x, y), return_dict=True)
    assert got == pytest.approx(model.evaluate(x, y, verbose=0, return_dict=True), rel=1e-6)


def test_stop_training_from_a_callback_ends_the_fit(in_process_engine):
    x, y = regression_data(64, seed=26)
    model = make_model(seed=26)

    class StopAfterFirstRound(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.model.stop_training = True

    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=1)
    history = trainer.fit((x, y), epochs=3, callbacks=[StopAfterFirstRound()], verbose=0)
    assert len(trainer.stats.records) == 1
    assert len(history.history["loss"]) == 1
    assert int(model.optimizer.iterations.numpy()) == 1


# ------------------------------------------------------------------ schedules, callbacks changing the optimizer


def test_learning_rate_schedule_follows_the_global_step(in_process_engine):
    """The iteration counter follows the global step, so schedules match Keras' batch-2B fit."""
    B, N, E = 8, 2, 2
    x, y = regression_data(4 * N * B, seed=28)
    sched = lambda: keras.optimizers.schedules.ExponentialDecay(0.2, decay_steps=1, decay_rate=0.7)  # noqa: E731
    model = make_model(optimizer=keras.optimizers.SGD(sched()), seed=28)
    ref = clone_compiled(model, keras.optimizers.SGD(sched()))
    trainer = ParameterAveragingTrainer(model, num_workers=N, batch_size=B, averaging_frequency=1, seed=0)
    trainer.fit((x, y), epochs=E, shuffle=False, verbose=0)
    ref.fit(x, y, batch_size=N * B, shuffle=False, epochs=E, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 4 * E
    assert_weights_close(model.get_weights(), ref.get_weights(), atol=ATOL)
    # without the decay the result would differ a lot
    flat = clone_compiled(make_model(seed=28), keras.optimizers.SGD(0.2))
    flat.fit(x, y, batch_size=N * B, shuffle=False, epochs=E, verbose=0)
    assert max_weight_change(flat.get_weights(), model.get_weights()) > 1e-3


def test_callback_changing_the_learning_rate_reaches_the_workers(in_process_engine):
    x, y = regression_data(64, seed=29)
    model = make_model(optimizer=keras.optimizers.SGD(0.1), seed=29)
    after_first_epoch = {}

    class Freeze(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                after_first_epoch["weights"] = self.model.get_weights()
                self.model.optimizer.learning_rate = 0.0

    initial = model.get_weights()
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
    trainer.fit((x, y), epochs=3, callbacks=[Freeze()], verbose=0)
    assert max_weight_change(initial, after_first_epoch["weights"]) > 1e-3
    assert_weights_close(model.get_weights(), after_first_epoch["weights"], atol=0)
    assert len(trainer.stats.records) == 3 * 2


def test_verbose_logs_one_line_per_epoch(in_process_engine, caplog):
    import logging

    x, y = regression_data(32, seed=30)
    model = make_model(seed=30)
    # slow_warning=False: the tiny fit is slower than one process, and warnings are not progress lines
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=1, slow_warning=False)
    with caplog.at_level(logging.INFO, logger="sparkdl_avg"):
        trainer.fit((x, y), epochs=2, verbose=2)
    messages = [r.getMessage() for r in caplog.records if r.name == "sparkdl_avg"]
    epoch_lines = [m for m in messages if m.startswith("Epoch ")]
    assert [m.split(" - ")[0] for m in epoch_lines] == ["Epoch 1/2", "Epoch 2/2"]
    assert all("loss: " in m for m in epoch_lines)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sparkdl_avg"):
        trainer.fit((x, y), epochs=1, verbose=0)
    assert [r for r in caplog.records if r.name == "sparkdl_avg"] == []


def test_fit_restores_the_callers_job_group(spark):
    sc = spark.sparkContext
    x, y = regression_data(32, seed=31)
    trainer = ParameterAveragingTrainer(make_model(seed=31), num_workers=2, batch_size=8)
    sc.setJobGroup("callers-group", "the caller's jobs")
    try:
        trainer.fit((x, y), epochs=1, verbose=0)
        assert sc.getLocalProperty("spark.jobGroup.id") == "callers-group"
        assert sc.getLocalProperty("spark.job.description") == "the caller's jobs"
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)


def test_stats_records_put_known_delays_in_their_phases_and_serialise(spark, tmp_path, monkeypatch):
    """Sleeps injected into three phases of every round show up in those phases, within the test's own clock.

    (The phases add up to ``wall_s`` by construction, ``other_s`` being the
    rest; what can go wrong is a delay landing in the wrong phase or the
    records using another clock than the workers' ``time.time``.)
    """
    import json
    import time

    from sparkdl_avg.driver.fit import rounds as round_module
    from sparkdl_avg.executor import worker

    send_delay, start_delay, update_delay = 0.15, 0.2, 0.1
    real_state_of, real_set_state, real_entry = round_module.state_of, round_module.set_state, worker.run_round_partition

    def slow_state_of(model):  # the driver reads the model's state first thing in a round: broadcast_s
        time.sleep(send_delay)
        return real_state_of(model)

    def slow_set_state(model, weights, opt_vars):  # the driver's update: update_s
        time.sleep(update_delay)
        return real_set_state(model, weights, opt_vars)

    def late_start(task, ids):  # nested, so shipped to the executors by value; before the workers start: schedule_s
        import time

        time.sleep(start_delay)
        return real_entry(task, ids)

    monkeypatch.setattr(round_module, "state_of", slow_state_of)
    monkeypatch.setattr(round_module, "set_state", slow_set_state)
    x, y = regression_data(48, seed=32)
    trainer = ParameterAveragingTrainer(make_model(seed=32), num_workers=2, batch_size=8, averaging_frequency=1)
    before = time.time()
    with testing.RoundEntry(late_start):
        trainer.fit((x, y), epochs=1, verbose=0)
    after = time.time()
    records = trainer.stats.records
    assert len(records) == 3
    for r in records:
        assert r["broadcast_s"] >= send_delay, r
        assert r["schedule_s"] >= start_delay, r
        assert r["update_s"] >= update_delay, r
        # the job holds the wait for the workers and the workers' own busy time
        assert r["job_s"] >= r["schedule_s"] + max(w["end"] - w["start"] for w in r["workers"]) - 1e-6, r
        # the workers' own clocks: both started after the injected delay, within the round
        assert all(r["t_start"] + send_delay + start_delay <= w["start"] <= w["end"] <= r["t_start"] + r["wall_s"]
                   for w in r["workers"]), r
        assert [w["worker"] for w in r["workers"]] == [0, 1]
        assert r["examples"] == 16 and r["loss"] > 0
    # the rounds follow each other inside the fit, as timed by the test
    spans = [(r["t_start"], r["t_start"] + r["wall_s"]) for r in records]
    assert before <= spans[0][0] and all(a[1] <= b[0] for a, b in zip(spans, spans[1:])) and spans[-1][1] <= after
    path = tmp_path / "stats.json"
    text = trainer.stats.to_json(str(path))
    assert json.loads(path.read_text()) == json.loads(text)
    assert [r["round"] for r in json.loads(text)] == [0, 1, 2]
