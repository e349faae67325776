"""A model builder for ``jobs/train.py --model-builder digits_model:build``, with a custom layer.

The CNN of ``train_digits.py`` for 8×8 digit images whose pixels are 0..16
(scikit-learn's ``load_digits``), with a custom ``Rescale`` layer that scales
them to 0..1. Custom layers are what makes user code necessary on executors:
they rebuild the model from its ``.keras`` archive, so this module must be
importable there. Ship it with ``--py-files jobs/digits_model.py``.
"""

from __future__ import annotations

import keras


@keras.saving.register_keras_serializable(package="digits_model")
class Rescale(keras.layers.Layer):
    """Multiplies the inputs by a constant ``scale``."""

    def __init__(self, scale: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = float(scale)

    def call(self, inputs):
        return inputs * self.scale

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}


def build(seed: int = 0, learning_rate: float = 2e-3) -> keras.Model:
    """A ~10k-parameter CNN for 8×8×1 images and 10 classes, compiled."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            Rescale(1 / 16.0),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="digits_cnn",
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model
