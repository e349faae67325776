"""Executor side of distributed prediction: the body of the Arrow UDF that adds a model's outputs.

This module owns :class:`PredictTask` (what every prediction task needs,
pickled into the UDF) and :func:`predict_batches` (the UDF's body), which
:mod:`sparkdl_avg.driver.data.inference` wraps on the driver. The UDF gets the
columns the model's inputs come from (or the raw columns the preprocessing
function reads), and turns them into the model's arrays the way training
does (:func:`sparkdl_avg.shared.data.staged_dataset.model_arrays`), so inference
applies what training applied. It shares the replica cache of
:mod:`sparkdl_avg.executor.worker` (:func:`~sparkdl_avg.executor.worker.get_replica`),
so a Python worker that trained or evaluated a model predicts with the same
compiled replica. Nothing here touches driver state; :func:`predict_batches`
also runs in-process on plain lists of Arrow arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa

from ..shared.errors import remote_errors
from ..shared.data.columns import arrow_value
from ..shared.data.staged_dataset import StagedDataset, model_arrays, structure
from .worker import _value, get_replica


@dataclass(frozen=True)
class PredictTask:
    """What every task of a distributed prediction needs.

    Attributes:
        spec: Broadcast of the :class:`ModelSpec` (or the spec itself).
        fingerprint: ``spec.fingerprint``.
        weights: Broadcast of the model's weights (list of arrays).
        inputs: How the UDF's argument columns become the model's inputs: a
            :class:`~sparkdl_avg.shared.data.staged_dataset.StagedDataset` without
            files (its ``columns`` are the arguments, in order; its
            ``preprocess`` the preprocessing function).
        batch_size: Examples per ``predict_on_batch`` call.
        kind: ``"multiclass"``, ``"binary"`` or ``"regression"`` (see
            :func:`sparkdl_avg.driver.data.inference.output_kind`).
    """

    spec: Any
    fingerprint: str
    weights: Any
    inputs: StagedDataset
    batch_size: int
    kind: str


def _doubles(matrix: np.ndarray) -> pa.Array:
    """Rows of a 2-D array as an Arrow ``list<double>`` array."""
    rows, cols = matrix.shape
    offsets = pa.array(np.arange(0, rows * cols + 1, cols, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(np.ascontiguousarray(matrix, dtype=np.float64).reshape(-1)))


def predict_batches(task: PredictTask, batches: Iterable) -> Iterator:
    """Body of the iterator Arrow UDF: one ``pyarrow.StructArray`` of outputs per input batch.

    Each input is a tuple of Arrow arrays, one per column of
    ``task.inputs.columns`` (extra trailing arrays are ignored); numeric
    columns are viewed as numpy arrays without per-row Python objects.
    Outputs have the field ``prediction`` (class index as a double for
    classifiers, the value or values for regression) and, for classifiers,
    ``probability``.
    """
    model, _ = get_replica(task.spec, task.fingerprint)
    model.set_weights(_value(task.weights))
    out_width = sum(int(np.prod(o.shape[1:])) for o in model.outputs)
    columns = task.inputs.columns
    for arrays in batches:
        n = len(arrays[0])
        with remote_errors.reporting_data_errors():  # a ragged or null row: DataError on the driver's action
            values = {c.name: arrow_value(a, c) for c, a in zip(columns, arrays)}
            examples = model_arrays(task.inputs, values, labels=False, what="data to predict on")
        chunks = []
        for lo in range(0, n, task.batch_size):
            pred = model.predict_on_batch(structure([a[lo : lo + task.batch_size] for a in examples.xs]))
            parts = pred if isinstance(pred, (list, tuple)) else [pred]
            chunks.append(np.concatenate([np.asarray(p).reshape(len(p), -1) for p in parts], axis=1))
        out = (np.concatenate(chunks) if chunks else np.empty((0, out_width))).astype(np.float64)
        if task.kind == "multiclass":
            fields = [pa.array(out.argmax(axis=1).astype(np.float64)), _doubles(out)]
        elif task.kind == "binary":
            p = out[:, 0]
            fields = [pa.array((p > 0.5).astype(np.float64)), _doubles(np.stack([1 - p, p], axis=1))]
        elif out.shape[1] == 1:
            fields = [pa.array(out[:, 0])]
        else:
            fields = [_doubles(out)]
        names = ["prediction", "probability"][: len(fields)]
        yield pa.StructArray.from_arrays(fields, names=names)
