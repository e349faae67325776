"""Executor side of staging: the Spark bodies that write a DataFrame's or an RDD's partitions as staged files.

This module owns the two task bodies :mod:`sparkdl_avg.driver.staging` hands to Spark:
:func:`export_arrow_batches` (``mapInArrow`` over a DataFrame) and
:func:`export_pairs` (``mapPartitionsWithIndex`` over an RDD of ``(x, y)``
pairs). Each turns one partition into one file of the format of
:mod:`sparkdl_avg.shared.staged_dataset`, checking the values on the way
(:mod:`sparkdl_avg.shared.value_checks`), and yields one small row describing it; data
the checks refuse is reported in that row, not by failing the task, and the
driver raises it as ``DataError`` (:func:`sparkdl_avg.shared.remote_errors.reported`). Nothing here touches driver
state, and both bodies run in-process on plain iterators.
"""

from __future__ import annotations

from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import DataError
from ..shared import remote_errors
from ..shared.fs import join
from ..shared.staged_dataset import write_examples
from ..shared.value_checks import DataChecks, check_values, list_values


def export_arrow_batches(
    batches: Iterator[pa.RecordBatch],
    *,
    directory: str,
    features: Sequence[Tuple[str, int]],
    labels: Sequence[str],
    x_dtype: str,
    y_dtype: str,
    checks: Optional[DataChecks] = None,
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body that stages one DataFrame partition as one file.

    Args:
        batches: The partition's Arrow record batches.
        directory: Where to write the file (local path or URI).
        features: ``(column, width)`` per model input; the columns are
            ``array<float|double>`` and every row must hold ``width`` values.
        labels: Label column per model output, each a number or an array.
        x_dtype: numpy dtype name of the staged features.
        y_dtype: numpy dtype name of the staged labels.
        checks: Value checks (NaN/Inf, label range); ``None``: none.

    Yields one row ``(uri, rows, label_widths, error)`` where a label width is
    0 for a scalar label; empty partitions write no file and yield ``rows =
    0``; a partition whose data is refused yields its ``DataError``'s message
    as ``error`` (:func:`sparkdl_avg.shared.remote_errors.reported`).
    """
    from pyspark import TaskContext

    try:
        xs, ys, label_widths = [], [], None
        rows_before = 0  # rows of the partition in earlier batches
        for batch in batches:
            if batch.num_rows == 0:
                continue
            feature_parts = []
            for name, width in features:
                values = list_values(batch.column(name), name, width, x_dtype)
                check_values(values, f"Column '{name}'", checks, first_row=rows_before)
                feature_parts.append(values)
            xs.append(np.concatenate(feature_parts, axis=1))
            parts, widths = [], []
            for output, name in enumerate(labels):
                label = batch.column(name)
                if pa.types.is_list(label.type) or pa.types.is_large_list(label.type):
                    width = int(pc.list_value_length(label).to_numpy(zero_copy_only=False)[0])
                    parts.append(list_values(label, name, width, y_dtype))
                else:
                    if label.null_count:
                        raise DataError(f"Column '{name}' contains null labels.")
                    width = 0
                    parts.append(label.to_numpy(zero_copy_only=False).astype(y_dtype, copy=False).reshape(-1, 1))
                check_values(parts[-1], f"Column '{name}'", checks, output, first_row=rows_before)
                widths.append(width)
            if label_widths not in (None, widths):
                raise DataError(f"Label column(s) {list(labels)} hold arrays of different lengths.")
            label_widths = widths
            ys.append(np.concatenate(parts, axis=1))
            rows_before += batch.num_rows
        rows = sum(len(x) for x in xs)
        uri = ""
        if rows:
            uri = join(directory, f"part-{TaskContext.get().partitionId():05d}.arrow")
            write_examples(uri, np.concatenate(xs), np.concatenate(ys))
        error = None
    except DataError as exc:
        uri, rows, label_widths, error = "", 0, None, remote_errors.reported(exc, batches)
    yield pa.record_batch(
        [pa.array([uri]), pa.array([rows], pa.int64()), pa.array([label_widths or []], pa.list_(pa.int32())),
         pa.array([error], pa.string())],
        names=["uri", "rows", "label_widths", "error"],
    )


def _flat_parts(value, count: int, what: str, where: str) -> List[np.ndarray]:
    """One flat array per input/output from an RDD element's ``x`` or ``y``."""
    parts = list(value) if count > 1 and isinstance(value, (tuple, list)) else [value]
    if len(parts) != count:
        raise DataError(f"{where} has {len(parts)} {what} arrays; the model has {count}.")
    return parts


def export_pairs(
    index: int,
    pairs: Iterable,
    *,
    directory: str,
    x_widths: Sequence[int],
    num_outputs: int,
    x_dtype: str,
    y_dtype: str,
    checks: Optional[DataChecks] = None,
) -> Iterator[Tuple[str, int, Tuple[Tuple[int, ...], ...], Optional[str]]]:
    """``mapPartitionsWithIndex`` body that stages an RDD partition of ``(x, y)`` pairs.

    ``x`` is an array (a tuple of arrays for a model with several inputs) and
    ``y`` a number or array (a tuple for several outputs). Yields one
    ``(uri, rows, label_shapes, error)``; empty partitions yield ``("", 0,
    (), None)``; a refused partition its ``DataError``'s message as ``error``.

    Args:
        index: The partition's index (names the file and the errors).
        pairs: The partition's elements.
        directory: Where to write the file (local path or URI).
        x_widths: Values per example, per model input.
        num_outputs: The model's number of outputs.
        x_dtype: numpy dtype name of the staged features.
        y_dtype: numpy dtype name of the staged labels.
        checks: Value checks (NaN/Inf, label range); ``None``: none.
    """
    pairs = iter(pairs)
    try:
        xs, ys, shapes = [], [], None
        for i, pair in enumerate(pairs):
            where = f"RDD element {i} of partition {index}"
            try:
                x, y = pair
            except (TypeError, ValueError):
                raise DataError(f"RDD elements must be (x, y) pairs; {where} is {type(pair).__name__}.") from None
            flat = []
            for k, (part, width) in enumerate(zip(_flat_parts(x, len(x_widths), "feature", where), x_widths)):
                part = np.asarray(part, dtype=x_dtype).reshape(-1)
                if part.size != width:
                    which = f" for input {k}" if len(x_widths) > 1 else ""
                    raise DataError(
                        f"{where} has features of {part.size} values{which}; expected {width} "
                        f"(the model's input size)."
                    )
                flat.append(part)
            labels = [np.asarray(p, dtype=y_dtype) for p in _flat_parts(y, num_outputs, "label", where)]
            label_shapes = tuple(p.shape for p in labels)
            if shapes not in (None, label_shapes):
                raise DataError(f"RDD partition {index} has labels of different shapes.")
            shapes = label_shapes
            xs.append(np.concatenate(flat))
            ys.append(np.concatenate([p.reshape(-1) for p in labels]))
        if not xs:
            result = ("", 0, (), None)
        else:
            x_all, y_all = np.stack(xs), np.stack(ys)
            check_values(x_all, f"The features of RDD partition {index}", checks)
            if checks is not None:
                start = 0
                for output, shape in enumerate(shapes):
                    width = int(np.prod(shape))
                    check_values(y_all[:, start : start + width], f"The labels of RDD partition {index}", checks, output)
                    start += width
            uri = join(directory, f"part-{index:05d}.arrow")
            write_examples(uri, x_all, y_all)
            result = (uri, len(xs), shapes, None)
    except DataError as exc:
        result = ("", 0, (), remote_errors.reported(exc, pairs))
    yield result
