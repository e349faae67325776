"""Executor side of distributed prediction: the body of the Arrow UDF that adds a model's outputs.

This module owns :class:`PredictTask` (what every prediction task needs,
pickled into the UDF) and :func:`predict_batches` (the UDF's body), which
:mod:`sparkdl_avg.driver.inference` wraps on the driver. It shares the replica
cache of :mod:`sparkdl_avg.executor.worker` (:func:`~sparkdl_avg.executor.worker.get_replica`),
so a Python worker that trained or evaluated a model predicts with the same
compiled replica. Nothing here touches driver state; :func:`predict_batches`
also runs in-process on a plain list of Arrow arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa

from ..shared import remote_errors
from ..shared.staged_dataset import structure, unflatten
from ..shared.value_checks import list_values
from .worker import _value, get_replica


@dataclass(frozen=True)
class PredictTask:
    """What every task of a distributed prediction needs.

    Attributes:
        spec: Broadcast of the :class:`ModelSpec` (or the spec itself).
        fingerprint: ``spec.fingerprint``.
        weights: Broadcast of the model's weights (list of arrays).
        x_shapes: The model's input shapes without the batch dimension; the
            features column holds them flattened and concatenated.
        x_dtype: The model inputs' dtype.
        batch_size: Examples per ``predict_on_batch`` call.
        kind: ``"multiclass"``, ``"binary"`` or ``"regression"`` (see
            :func:`sparkdl_avg.driver.inference.output_kind`).
        features_col: Name of the features column(s), for error messages.
    """

    spec: Any
    fingerprint: str
    weights: Any
    x_shapes: tuple
    x_dtype: str
    batch_size: int
    kind: str
    features_col: str


def predict_batches(task: PredictTask, batches: Iterable) -> Iterator:
    """Body of the iterator Arrow UDF: one ``pyarrow.StructArray`` of outputs per input batch.

    Each input is an Arrow list array of feature rows; its values are viewed
    as one ``(rows, width)`` numpy array without per-row Python objects.
    Outputs have the field ``prediction`` (class index as a double for
    classifiers, the value or values for regression) and, for classifiers,
    ``probability``.
    """
    model, _ = get_replica(task.spec, task.fingerprint)
    model.set_weights(_value(task.weights))
    width = sum(int(np.prod(shape)) for shape in task.x_shapes)
    out_width = sum(int(np.prod(o.shape[1:])) for o in model.outputs)

    def doubles(matrix: np.ndarray) -> pa.Array:
        """Rows of a 2-D array as an Arrow ``list<double>`` array."""
        rows, cols = matrix.shape
        offsets = pa.array(np.arange(0, rows * cols + 1, cols, dtype=np.int32))
        return pa.ListArray.from_arrays(offsets, pa.array(np.ascontiguousarray(matrix, dtype=np.float64).reshape(-1)))

    for column in batches:
        with remote_errors.reporting_data_errors():  # a ragged or null row: DataError on the driver's action
            x = list_values(column, task.features_col, width, task.x_dtype)
        xs = unflatten(x, task.x_shapes)
        chunks = []
        for lo in range(0, len(x), task.batch_size):
            pred = model.predict_on_batch(structure([a[lo : lo + task.batch_size] for a in xs]))
            parts = pred if isinstance(pred, (list, tuple)) else [pred]
            chunks.append(np.concatenate([np.asarray(p).reshape(len(p), -1) for p in parts], axis=1))
        out = (np.concatenate(chunks) if chunks else np.empty((0, out_width))).astype(np.float64)
        if task.kind == "multiclass":
            fields = [pa.array(out.argmax(axis=1).astype(np.float64)), doubles(out)]
        elif task.kind == "binary":
            p = out[:, 0]
            fields = [pa.array((p > 0.5).astype(np.float64)), doubles(np.stack([1 - p, p], axis=1))]
        elif out.shape[1] == 1:
            fields = [pa.array(out[:, 0])]
        else:
            fields = [doubles(out)]
        names = ["prediction", "probability"][: len(fields)]
        yield pa.StructArray.from_arrays(fields, names=names)
