"""The MLflow pyfunc model of a fit with a preprocessing function: the function, then the Keras model.

A model trained with ``preprocess=`` takes raw columns (PNG bytes, text), not
the model's inputs, so MLflow's Keras flavour alone would not apply what
training applied. :class:`PreprocessedKerasModel` is an
``mlflow.pyfunc.PythonModel`` that holds the ``.keras`` archive and the
pickled function as artifacts; its ``predict`` takes a pandas DataFrame of
the raw columns and returns the model's outputs, the function run with
``training=False`` and its output turned into the model's inputs as in
``trainer.predict`` (:func:`sparkdl_avg.shared.data.staged_dataset.model_arrays`).
:func:`save` writes it; ``sparkdl_avg``'s own code travels in the model
(``code_paths``), so ``mlflow.pyfunc.load_model`` needs only TensorFlow,
Keras, numpy and pyarrow where it loads. Imported only when MLflow logs
such a fit (:class:`sparkdl_avg.driver.observe.tracking.MlflowLogger`).
"""

from __future__ import annotations

import os
import sys
import pickle
from typing import List, Sequence

import mlflow.pyfunc
import numpy as np


class PreprocessedKerasModel(mlflow.pyfunc.PythonModel):
    """The preprocessing function, then the Keras model (artifacts ``keras_model`` and ``preprocess``).

    Args:
        features_col: The names of the model's inputs in the function's
            output (``fit``'s ``features_col``), in the order of ``model.inputs``.
    """

    def __init__(self, features_col: Sequence[str]) -> None:
        self.features_col: List[str] = list(features_col)

    def load_context(self, context) -> None:
        import keras

        from ...shared.data.preprocess import Preprocess

        self.model = keras.saving.load_model(context.artifacts["keras_model"], compile=False)
        with open(context.artifacts["preprocess"], "rb") as f:
            self.preprocess = Preprocess.of(pickle.loads(f.read()))

    def predict(self, context, model_input, params=None):
        """The model's outputs (one array; a list for several outputs) for a pandas DataFrame of raw columns."""
        from ...shared.data.columns import Column, Field
        from ...shared.model.modelspec import input_dtypes, input_shapes
        from ...shared.data.staged_dataset import StagedDataset, model_arrays

        fields = tuple(Field(s, d) for s, d in zip(input_shapes(self.model), input_dtypes(self.model)))
        columns = tuple(Column(c, c, "raw", None, "raw") for c in model_input.columns)
        inputs = StagedDataset((), columns, tuple(self.features_col), fields, (), (), preprocess=self.preprocess)
        batch = {c: _column(model_input[c]) for c in model_input.columns}
        examples = model_arrays(inputs, batch, labels=False, what="input data")
        xs = examples.xs[0] if len(examples.xs) == 1 else examples.xs
        return self.model.predict(xs, verbose=0)


def _column(series) -> np.ndarray:
    """A pandas column as the preprocessing function gets it: numbers as their dtype, anything else as objects."""
    values = series.to_numpy()
    if values.dtype == object and len(values) and isinstance(values[0], (list, np.ndarray)):
        try:
            return np.stack([np.asarray(v) for v in values])
        except ValueError:
            return values
    return values


def save(path: str, keras_file: str, preprocess_payload: bytes, features_col: Sequence[str],
         pip_requirements: Sequence[str]) -> None:
    """Writes the pyfunc model of a Keras model saved at ``keras_file`` and its pickled preprocessing function."""
    package = os.path.dirname(sys.modules[__name__.partition(".")[0]].__file__)  # sparkdl_avg/, shipped whole
    folder = os.path.dirname(keras_file)
    pickled = os.path.join(folder, "preprocess.pkl")
    with open(pickled, "wb") as f:
        f.write(preprocess_payload)
    mlflow.pyfunc.save_model(
        path,
        python_model=PreprocessedKerasModel(features_col),
        artifacts={"keras_model": keras_file, "preprocess": pickled},
        code_paths=[package],
        pip_requirements=list(pip_requirements),
    )
