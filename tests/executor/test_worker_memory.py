"""What an executor's Python worker keeps after it frees a cached replica (no Spark session: the worker's own code)."""

import gc
import weakref

import numpy as np


def _traced(width):
    """A compiled model and its train step traced once, as a worker's step function is."""
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    step = tf.function(lambda x, y: model.train_step((x, y)))
    graph = step.get_concrete_function(tf.TensorSpec((None, 4), tf.float32), tf.TensorSpec((None,), tf.int32)).graph
    step(np.ones((8, 4), "float32"), np.zeros(8, "int32"))
    return model, step, graph


def _custom_gradients():
    from tensorflow.python.framework import ops

    return {n for n in ops._gradient_registry._registry if str(n).startswith("CustomGradient-")}


def test_evicting_a_replica_frees_the_graphs_tensorflow_kept_for_its_custom_gradients():
    """Issue 38: a worker fitting a new architecture each time grew ~8.5 MB per fit (375 -> 626 MB over 30 fits)."""
    from sparkdl_avg.executor import worker

    model, step, graph = _traced(5)
    assert _custom_gradients(), "Keras' loss no longer traces a tf.custom_gradient: this test guards nothing"
    graph_ref = weakref.ref(graph)
    worker._REPLICAS["test-fingerprint"] = model
    del model, step, graph
    worker._evict("test-fingerprint")
    gc.collect()
    assert not _custom_gradients()
    assert graph_ref() is None  # the registry's gradient function held the traced graph
    # a later trace registers its own and trains: the registry is only read while tracing
    model, step, _ = _traced(6)
    before = [w.copy() for w in model.get_weights()]
    step(np.ones((8, 4), "float32"), np.arange(8, dtype="int32") % 3)
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


def test_a_rounds_state_goes_into_the_replicas_own_buffers_a_block_at_a_time(tmp_path):
    """Issue 59: ``Variable.assign`` of a 128 MiB table held two transient copies (+256 MiB), a worker's peak."""
    import keras

    from sparkdl_avg.shared.model.modelspec import IN_PLACE_BLOCK, assign_state
    from sparkdl_avg.shared.wire.stats import PeakMemory

    rows = 2**20  # a 32 MiB table, with Adam's two moments 96 MiB of state
    model = keras.Sequential([keras.Input((1,), dtype="int64"), keras.layers.Embedding(rows, 8),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    variables = model.weights + model.optimizer.variables
    rng = np.random.default_rng(0)
    state = [rng.random(v.shape).astype(v.dtype) if v.dtype == "float32" else np.full(v.shape, 7, v.dtype)
             for v in variables]
    mapped = []
    for i, value in enumerate(state):  # as a worker reads the round's state: memory maps of a file
        np.save(tmp_path / f"{i}.npy", value)
        mapped.append(np.load(tmp_path / f"{i}.npy", mmap_mode="r"))
    table = [i for i, v in enumerate(variables) if v.shape == (rows, 8)]
    assert len(table) == 3 and state[table[0]].size > 4 * IN_PLACE_BLOCK
    buffers = {i: variables[i].value.value()._numpy().ctypes.data for i in table}

    memory = PeakMemory()
    assign_state(model, mapped[:len(model.weights)], mapped[len(model.weights):])
    above = memory.above()

    for v, value in zip(variables, state):
        np.testing.assert_array_equal(np.asarray(v.numpy()), value)
    assert {i: variables[i].value.value()._numpy().ctypes.data for i in table} == buffers  # written in place
    if above is not None:  # Linux: no copy of a table held, the file's pages let go block by block
        assert above < 8 * 2**20, f"{above / 2**20:.0f} MiB above the level before the state came in"
    # the replica trains from it (the optimizer's counter included) and its variables change
    model.fit(np.zeros((4, 1), "int64"), np.ones((4, 1), "float32"), verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 8
    assert not np.array_equal(np.asarray(variables[table[0]].numpy())[0], state[table[0]][0])
