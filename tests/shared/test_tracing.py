"""A replica's step function is traced once: the compiled metrics' variables exist before its first trace."""

import numpy as np
import pytest

from sparkdl_avg.shared.data.columns import Field
from sparkdl_avg.shared.model.tracing import build_training_state


def _model():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.optimizer.build(model.trainable_variables)
    return model


def _traces(model):
    """Python calls of the step function's body while tracing it (TensorFlow repeats a trace that creates variables)."""
    import tensorflow as tf

    calls = []

    @tf.function(input_signature=[tf.TensorSpec((None, 4), tf.float32), tf.TensorSpec((None,), tf.int32)])
    def step(x, y):
        calls.append(1)
        return model.train_step((x, y))

    step.get_concrete_function()
    return len(calls), step


@pytest.mark.parametrize("weighted", [False, True])
def test_one_trace_after_building_the_training_state(weighted):
    model = _model()
    assert build_training_state(model, [Field((4,), "float32")], [Field((), "int32")], weighted)
    assert model._compile_metrics.built  # noqa: SLF001 - what the helper is for
    traces, step = _traces(model)
    assert traces == 1
    x, y = np.ones((8, 4), np.float32), np.zeros((8,), np.int32)
    logs = step(x, y)
    assert set(logs) == {"loss", "accuracy"} and np.isfinite(float(logs["loss"]))


def test_without_it_tensorflow_traces_twice():
    """What the helper saves: the first trace creates the metrics' variables, and TensorFlow traces again."""
    traces, _ = _traces(_model())
    assert traces == 2


def test_a_model_without_symbolic_build_is_left_alone():
    class Bare:
        pass

    assert build_training_state(Bare(), [Field((4,), "float32")], [Field((), "int32")], False) is False
