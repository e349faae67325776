"""The executor-side round and evaluation functions, called in-process (no Spark).

``worker.train_round`` gets plain values where the trainer passes broadcasts:
``spec`` is a ``ModelSpec``, ``state`` the ``(weights, optimizer_variables)``
tuple, and the data is staged from numpy arrays into a temp directory.

Weights and optimizer variables are float64 and must match plain Keras to
1e-12. Logged losses and metrics are computed by Keras in ``floatx``: with the
default float32 they carry float32 rounding (compared with ``rel=1e-6``);
``test_metrics_are_exact_with_float64_floatx`` checks them tightly.
"""

import time

import numpy as np
import pytest

from conftest import clone_compiled, make_model, regression_data
from sparkdl_avg.driver.data import staging
from sparkdl_avg.shared.wire import exchange
from sparkdl_avg.executor import worker
from sparkdl_avg.shared.wire.aggregation import merge
from sparkdl_avg.shared.model.modelspec import ModelSpec, get_state, iterations_index, set_state
from sparkdl_avg.shared.data.example_order import EpochOrder, worker_positions

import keras

TOL = dict(rtol=0.0, atol=1e-12)
METRIC_REL = 1e-6  # float32 losses/metrics (floatx), see the module docstring




def make_task(model, staged, **fields):
    spec = ModelSpec.from_model(model)
    defaults = dict(
        spec=spec,
        fingerprint=spec.fingerprint,
        state=exchange.InlineState(*get_state(model)),
        results=exchange.ReturnSums(),
        dataset=staged,
        epoch=0,
        round=0,
        steps_before=0,
        steps=3,
        num_workers=2,
        batch_size=8,
        seed=11,
        shuffle=False,
        average_optimizer=True,
    )
    defaults.update(fields)
    return worker.RoundTask(**defaults)


@pytest.fixture(scope="module")
def arrays():
    return regression_data(100, d=4, seed=3)


@pytest.fixture
def staged(arrays, tmp_path):
    return staging.stage(arrays, root=str(tmp_path), x_shapes=((4,),), x_dtype="float64")


def keras_reference(model, x, y, indices, steps, batch, optimizer):
    """Plain Keras: train a clone on the minibatches at ``indices``, in order."""
    ref = clone_compiled(model, optimizer)
    ref.optimizer.build(ref.trainable_variables)
    set_state(ref, *get_state(model))  # same starting optimizer state as the task
    losses = []
    for s in range(steps):
        idx = indices[s * batch : (s + 1) * batch]
        losses.append(ref.train_on_batch(x[idx], y[idx], return_dict=True))
    return ref, losses


def test_stage_arrays_round_trip(arrays, staged):
    from sparkdl_avg.shared.data.staged_dataset import read_examples

    x, y = arrays
    assert staged.num_examples == 100
    assert staged.x_shapes == ((4,),) and staged.y_shapes == ((),)
    assert [f.dtype for f in staged.x_fields] == ["float64"] and [f.dtype for f in staged.y_fields] == ["float64"]
    idx = np.array([99, 0, 57, 3, 3])
    examples = read_examples(staged, idx)  # one array per input and per output, in the examples' order
    ((rx,), (ry,)) = examples.xs, examples.ys
    assert rx.dtype == np.float64 and examples.weights is None
    np.testing.assert_array_equal(rx, x[idx])
    np.testing.assert_array_equal(ry, y[idx])


@pytest.mark.parametrize("worker_id", [0, 1])
@pytest.mark.parametrize(
    "optimizer_factory",
    [lambda: keras.optimizers.SGD(0.1), lambda: keras.optimizers.Adam(0.01)],
    ids=["sgd", "adam"],
)
def test_train_round_equals_keras_train_on_batch(arrays, staged, worker_id, optimizer_factory):
    x, y = arrays
    model = make_model(optimizer=optimizer_factory(), seed=1)
    task = make_task(model, staged, steps_before=2, steps=3, num_workers=2, batch_size=8)

    before = time.time()
    result = worker.train_round(task, worker_id)
    after = time.time()

    positions = worker_positions(2, 3, worker_id, 2, 8)
    assert positions.start == (2 * 2 + worker_id * 3) * 8
    ref, losses = keras_reference(model, x, y, np.arange(positions.start, positions.stop), 3, 8, optimizer_factory())
    n = 3 * 8
    assert result.examples == n
    ref_weights, ref_opt = get_state(ref)
    for s, r in zip(result.weight_sums, ref_weights):
        assert s.dtype == np.float64
        np.testing.assert_allclose(s / n, r, **TOL)
    assert len(result.optimizer_sums) == len(ref_opt)
    for s, r in zip(result.optimizer_sums, ref_opt):
        np.testing.assert_allclose(s / n, r, **TOL)
    # the optimizer counted 3 steps from the task's starting point
    it = iterations_index(model)
    assert result.optimizer_sums[it] / n == pytest.approx(3)
    expected_metrics = {k: sum(l[k] for l in losses) / 3 for k in losses[0]}
    assert set(result.metric_means()) == {"loss", "mae"}
    assert result.metric_means() == pytest.approx(expected_metrics, rel=METRIC_REL)
    # and training did move the weights
    assert max(float(np.max(np.abs(s / n - w))) for s, w in zip(result.weight_sums, model.get_weights())) > 1e-4
    (record,) = result.workers
    assert record["worker"] == worker_id and record["examples"] == n
    # the driver compares these times with its own time.time(): same clock, within the call
    assert before <= record["start"] <= record["end"] <= after


def test_a_slow_read_of_the_examples_shows_in_load_s_only(staged, monkeypatch):
    delay = 0.5
    real_read = worker.read_examples

    def slow_read(*args, **kwargs):
        time.sleep(delay)
        return real_read(*args, **kwargs)

    task = make_task(make_model(optimizer=keras.optimizers.SGD(0.1), seed=1), staged)
    worker.train_round(task, 0)  # builds the replica and traces its step function: the timed round does neither
    monkeypatch.setattr(worker, "read_examples", slow_read)
    (record,) = worker.train_round(task, 0).workers
    assert not record.replica_built
    assert record.load_s >= delay
    assert record.setup_s < delay and record.compute_s < delay  # a warm replica: milliseconds each


def test_train_round_shuffled_reads_the_epoch_order(arrays, staged):
    x, y = arrays
    model = make_model(optimizer=keras.optimizers.SGD(0.1), seed=2)
    task = make_task(model, staged, shuffle=True, seed=5, epoch=3, num_workers=1, steps_before=1, steps=4, batch_size=8)
    result = worker.train_round(task, 0)
    order = EpochOrder(100, 5, 3).indices(8, 8 + 32)
    assert not np.array_equal(order, np.arange(8, 40))
    ref, _ = keras_reference(model, x, y, order, 4, 8, keras.optimizers.SGD(0.1))
    for s, r in zip(result.weight_sums, ref.get_weights()):
        np.testing.assert_allclose(s / 32, r, **TOL)


def test_train_round_starts_from_the_task_state_each_time(staged):
    """The cached replica is reused, but never carries state between rounds."""
    model = make_model(optimizer=keras.optimizers.Adam(0.01), seed=3)
    task = make_task(model, staged, average_optimizer=True)
    first = worker.train_round(task, 0)
    second = worker.train_round(task, 0)
    assert second.workers[0]["replica_built"] is False
    for a, b in zip(first.weight_sums, second.weight_sums):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(first.optimizer_sums, second.optimizer_sums):
        np.testing.assert_array_equal(a, b)
    assert first.metric_sums == second.metric_sums


def test_train_round_without_optimizer_averaging_returns_no_optimizer_sums(staged):
    model = make_model(optimizer=keras.optimizers.Adam(0.01), seed=4)
    result = worker.train_round(make_task(model, staged, average_optimizer=False), 1)
    assert result.optimizer_sums is None
    assert result.weight_sums is not None and result.examples == 24


def test_two_workers_with_k1_average_to_one_big_sgd_step(arrays, staged):
    """Averaging two workers' single SGD steps equals one step on both minibatches."""
    x, y = arrays
    model = make_model(optimizer=keras.optimizers.SGD(0.1), seed=5)
    task = make_task(model, staged, steps=1, num_workers=2, batch_size=8, steps_before=3)
    total = merge(worker.train_round(task, 0), worker.train_round(task, 1))
    avg = total.average(total.weight_sums, model.get_weights())
    ref = clone_compiled(model, keras.optimizers.SGD(0.1))
    ref.train_on_batch(x[48:64], y[48:64])
    for a, r in zip(avg, ref.get_weights()):
        np.testing.assert_allclose(a, r, **TOL)


def test_model_spec_ships_no_weights():
    """The spec's archive is a few kB whatever the model's size, and holds no weights file (issue 47)."""
    import zipfile, io

    small, large = make_model(hidden=4), make_model(hidden=4000)
    sizes = [len(ModelSpec.from_model(m).keras_bytes) for m in (small, large)]
    assert abs(sizes[1] - sizes[0]) < 64 and sizes[1] < 10_000, sizes
    assert zipfile.ZipFile(io.BytesIO(ModelSpec.from_model(large).keras_bytes)).namelist() == ["metadata.json", "config.json"]


def test_model_spec_round_trip_and_fingerprint():
    model = make_model(optimizer=keras.optimizers.Adam(0.01), seed=6)
    spec = ModelSpec.from_model(model)
    replica = spec.build()
    assert replica.optimizer.__class__ is model.optimizer.__class__
    # the spec carries no weights (issue 47): the replica's have the model's shapes, the round assigns them
    assert [w.shape for w in replica.get_weights()] == [w.shape for w in model.get_weights()]
    assert replica.get_compile_config() == model.get_compile_config()
    assert tuple(tuple(v.shape) for v in replica.optimizer.variables) == spec.optimizer_shapes
    # same architecture and compile settings -> same fingerprint; another optimizer -> another
    assert ModelSpec.from_model(model).fingerprint == spec.fingerprint
    other = clone_compiled(model, keras.optimizers.SGD(0.1))
    assert ModelSpec.from_model(other).fingerprint != spec.fingerprint


def test_a_rebuilt_model_of_the_same_architecture_keeps_its_fingerprint():
    """A notebook cell re-run builds the same layers under new names (dense_3, adam_1): one replica, not one per fit."""
    first, again = make_model(seed=1), make_model(seed=2)
    assert {l.name for l in first.layers} != {l.name for l in again.layers}
    assert ModelSpec.from_model(again).fingerprint == ModelSpec.from_model(first).fingerprint
    assert ModelSpec.from_model(make_model(hidden=9)).fingerprint != ModelSpec.from_model(first).fingerprint

    def two_outputs():
        inputs = keras.Input((3,))
        hidden = keras.layers.Dense(4)(inputs)
        model = keras.Model(inputs, [keras.layers.Dense(2)(hidden), keras.layers.Dense(1)(hidden)])
        model.compile("sgd", ["mse", "mse"])
        return model

    # A multi-output model's metric names carry its output layers' names: those still count.
    assert ModelSpec.from_model(two_outputs()).fingerprint != ModelSpec.from_model(two_outputs()).fingerprint


def test_a_round_that_builds_or_traces_says_so_and_how_long_it_took(staged, monkeypatch):
    """What lets the advisor leave such rounds out of its steady-state times (issue 28)."""
    monkeypatch.setattr(worker, "_REPLICAS", type(worker._REPLICAS)())
    monkeypatch.setattr(worker, "_STEP_FUNCTIONS", {})
    task = make_task(make_model(hidden=9), staged)
    (first,), (second,) = worker.train_round(task, 0).workers, worker.train_round(task, 0).workers
    assert first.replica_built and first.traced
    assert 0 < first.build_s <= first.setup_s and 0 < first.trace_s <= first.compute_s
    assert not second.replica_built and not second.traced and second.build_s == 0 and second.trace_s == 0
    # a cached replica without its step function (as for data of other shapes) traces again, builds nothing
    monkeypatch.setattr(worker, "_STEP_FUNCTIONS", {})
    (third,) = worker.train_round(task, 0).workers
    assert not third.replica_built and third.traced and third.trace_s > 0


def test_the_replica_cache_keeps_the_most_recently_used(arrays, staged, monkeypatch):
    monkeypatch.setattr(worker, "_REPLICAS", type(worker._REPLICAS)())
    monkeypatch.setattr(worker, "_STEP_FUNCTIONS", {})
    tasks = [make_task(make_model(hidden=h), staged) for h in (5, 6, 7)]
    worker.train_round(tasks[0], 0)
    worker.train_round(tasks[1], 0)
    worker.train_round(tasks[0], 0)  # now the most recent: the next build evicts tasks[1]'s
    worker.train_round(tasks[2], 0)
    assert list(worker._REPLICAS) == [tasks[0].fingerprint, tasks[2].fingerprint]
    assert {key[0] for key in worker._STEP_FUNCTIONS} == {tasks[0].fingerprint, tasks[2].fingerprint}
    assert worker.train_round(tasks[1], 0).workers[0].replica_built


def test_evaluate_parts_add_up_to_keras_evaluate(arrays, staged):
    x, y = arrays
    model = make_model(optimizer=keras.optimizers.SGD(0.1), seed=7)
    spec = ModelSpec.from_model(model)
    parts = 3
    task = worker.EvalTask(spec, spec.fingerprint, exchange.InlineState(*get_state(model)), staged, parts, 16)
    total = None
    for part in range(parts):
        total = merge(total, worker.evaluate_part(task, part))
    assert total.examples == 100
    expected = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    assert total.metric_means() == pytest.approx(expected, rel=1e-6)


def test_run_round_partition_consumes_its_input_and_yields_one_result_per_worker(staged):
    model = make_model(optimizer=keras.optimizers.SGD(0.1), seed=8)
    task = make_task(model, staged, steps=1)
    consumed = []

    def ids():
        for i in (0, 1):
            consumed.append(i)
            yield i

    results = list(worker.run_round_partition(task, ids()))
    assert consumed == [0, 1]
    assert [r.workers[0]["worker"] for r in results] == [0, 1]


def test_metrics_are_exact_with_float64_floatx(arrays, staged, floatx64):
    x, y = arrays
    model = make_model(optimizer=keras.optimizers.Adam(0.01), seed=9)
    spec = ModelSpec.from_model(model)
    assert spec.floatx == "float64"
    task = make_task(model, staged, steps_before=1, steps=4, num_workers=2, batch_size=8)
    result = worker.train_round(task, 1)
    positions = worker_positions(1, 4, 1, 2, 8)
    ref, logs = keras_reference(model, x, y, np.arange(positions.start, positions.stop), 4, 8, keras.optimizers.Adam(0.01))
    expected = {k: sum(l[k] for l in logs) / 4 for k in logs[0]}
    assert result.metric_means() == pytest.approx(expected, rel=1e-12)
    for s, r in zip(result.weight_sums, ref.get_weights()):
        np.testing.assert_allclose(s / 32, r, **TOL)


def test_replica_computes_losses_in_the_drivers_floatx(arrays, floatx64):
    """A float64 driver's spec builds replicas whose loss is float64, whatever the worker's floatx."""
    x, y = arrays
    model = make_model(seed=10, metrics=())
    spec = ModelSpec.from_model(model)
    keras.config.set_floatx("float32")  # a fresh executor process
    replica = spec.build()
    replica.set_weights(model.get_weights())  # the spec ships no weights: a task assigns them
    loss = replica.test_on_batch(x, y)
    pred = model.predict(x, verbose=0)[:, 0]
    expected = float(np.mean((pred - y) ** 2))
    assert float(np.float32(expected)) != expected  # float32 rounding would show
    assert loss == pytest.approx(expected, rel=1e-12)
    # the floatx is part of the fingerprint: a float32 driver must not reuse this replica
    keras.config.set_floatx("float32")
    assert ModelSpec.from_model(model).fingerprint != spec.fingerprint


def test_no_active_spark_context_for_numpy_is_a_data_error(arrays, monkeypatch):
    from pyspark import SparkContext

    from sparkdl_avg import DataError, ParameterAveragingTrainer

    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    trainer = ParameterAveragingTrainer(make_model(seed=11), num_workers=1, batch_size=8)
    with pytest.raises(DataError, match="needs an active SparkSession"):
        trainer.fit(arrays, verbose=0)
