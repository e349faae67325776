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
