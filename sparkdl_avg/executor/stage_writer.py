"""Executor side of staging: the Spark bodies that write a DataFrame's or an RDD's partitions as staged files.

This module owns the two task bodies :mod:`sparkdl_avg.driver.data.staging` hands to Spark:
:func:`export_arrow_batches` (``mapInArrow`` over a DataFrame) and :func:`export_pairs` (``mapPartitionsWithIndex``
over an RDD of ``(x, y)`` pairs). Each turns one partition into one file of the format of
:mod:`sparkdl_avg.shared.data.staged_dataset`, one column per :class:`~sparkdl_avg.shared.data.columns.Column`
(numbers converted exactly to the model input's dtype, bytes, text and images kept as they came), checking the values
on the way (:mod:`sparkdl_avg.shared.data.value_checks`), and yields one small row describing it; data the checks
refuse is reported in that row, not by failing the task, and the driver raises it as ``DataError``
(:func:`sparkdl_avg.shared.errors.remote_errors.reported`); so is a write to a full filesystem
(:func:`sparkdl_avg.shared.errors.remote_errors.reported_full`), which the driver raises as a ``PathError`` naming
``staging_dir``. A task holds one partition at a time. Nothing here touches driver state, and both bodies run
in-process on plain iterators.
"""

from __future__ import annotations

from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from ..errors import ConfigurationError, DataError
from ..shared.errors import remote_errors
from ..shared.data.columns import Column, stage_arrow, stage_numpy
from ..shared.data.kinds import TensorKind
from ..shared.data.preprocess import Preprocess
from ..shared.files.fs import is_full, join
from ..shared.data.staged_dataset import write_columns
from ..shared.data.value_checks import DataChecks, check_values


def check_staged(array: pa.Array, column: Column, checks: Optional[DataChecks], first_row: int = 0,
                 partition: bool = True, name: Optional[str] = None, warn=None) -> None:
    """The ``check_data`` checks of one staged numeric column, by its role (finite values, label ranges, ids, weights ≥ 0).

    ``warn`` takes a warning's message (negative ids); default :func:`warnings.warn`.
    """
    if not column.handler.numeric or checks is None or len(array) == 0:
        return
    values = array.values.to_numpy(zero_copy_only=False).reshape(len(array), -1)
    name = name or f"Column '{column.source}'"
    output = column.index if column.role == "y" else None
    check_values(values, name, checks, output, first_row=first_row, partition=partition,
                 input=column.index if column.role == "x" else None, warn=warn)
    if column.role == "w" and (values < 0).any():
        row = first_row + int(np.argwhere(values < 0)[0][0])
        where = f"row {row} of its partition" if partition else f"row {row}"
        raise DataError(f"{name} holds the sample weight {values[values < 0][0].item()!r} ({where}); "
                        "expected weights >= 0.")


class _Full(Exception):
    """A staged file could not be written because its filesystem is full (``error``, writing ``uri``)."""

    def __init__(self, error: OSError, uri: str) -> None:
        super().__init__(str(error))
        self.error, self.uri = error, uri


def _write(uri: str, arrays) -> int:
    """:func:`write_columns`; a full filesystem raises :class:`_Full`, reported in the task's row.

    Reported rather than failing the task: a failed task makes Spark log its stack traces and, on a cluster, retry it
    onto the same full disk. Other write errors fail the task (a retry may get past them).
    """
    try:
        return write_columns(uri, arrays)
    except OSError as exc:
        if is_full(exc):
            raise _Full(exc, uri) from None
        raise


def export_arrow_batches(
    batches: Iterator[pa.RecordBatch],
    *,
    directory: str,
    columns: Sequence[Column],
    checks: Optional[DataChecks] = None,
    preprocess: Optional[Preprocess] = None,
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body that stages one DataFrame partition as one file.

    Args:
        batches: The partition's Arrow record batches, one column per :class:`Column` (named by its ``name``).
        directory: Where to write the file (local path or URI).
        checks: Value checks (NaN/Inf, label range, ids); ``None``: none.
        preprocess: The preprocessing function the rounds will call on this data: unpickled first, so that a module
            the executors lack is reported before any row is read, not at round 0.

    Yields one row ``(uri, rows, label_widths, bytes, error, warning, weighted)``: a label's width is its values per
    row (0 for one number), per label column in order; ``weighted`` counts the rows whose sample weight is above 0 (the
    driver refuses data where no row weighs anything); empty partitions write no file and yield ``rows = 0``; a
    partition whose data is refused yields its ``DataError``'s message as ``error``
    (:func:`sparkdl_avg.shared.errors.remote_errors.reported`), a function that cannot be loaded its
    ``ConfigurationError``'s (:func:`~sparkdl_avg.shared.errors.remote_errors.reported_configuration`, without reading
    the partition); ``warning`` is the first warning of the checks (negative ids), for the driver to show.
    """
    from pyspark import TaskContext

    notes: List[str] = []
    if preprocess is not None:
        try:
            preprocess.function()
        except ConfigurationError as exc:  # the rows are not read: staging them would be in vain
            yield _row("", 0, None, 0, remote_errors.reported_configuration(exc), None)
            return
    try:
        parts: Dict[str, List[pa.Array]] = {c.name: [] for c in columns}
        label_widths = None
        rows = 0  # rows of the partition in earlier batches
        weighted = 0  # rows whose sample weight is above 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            widths = []
            for column in columns:
                staged = stage_arrow(batch.column(column.name), column, first_row=rows)
                check_staged(staged, column, checks, first_row=rows, warn=notes.append)
                if column.role == "w":
                    weighted += positive_weights(staged)
                if column.role == "y" and column.handler.numeric:
                    source = batch.column(column.name)
                    widths.append(staged.type.list_size if pa.types.is_list(source.type)
                                  or pa.types.is_large_list(source.type) or pa.types.is_fixed_size_list(source.type)
                                  else 0)
                parts[column.name].append(staged)
            if label_widths not in (None, widths):
                raise DataError(f"Label column(s) {[c.source for c in columns if c.role == 'y']} hold arrays of "
                                "different lengths.")
            label_widths = widths
            rows += batch.num_rows
        uri, nbytes = "", 0
        if rows:
            uri = join(directory, f"part-{TaskContext.get().partitionId():05d}.arrow")
            nbytes = _write(uri, {name: pa.concat_arrays(arrays) for name, arrays in parts.items()})
        error = None
    except DataError as exc:
        uri, rows, label_widths, nbytes, error, weighted = "", 0, None, 0, remote_errors.reported(exc, batches), 0
    except _Full as full:
        uri, rows, label_widths, nbytes, error, weighted = ("", 0, None, 0,
                                                            remote_errors.reported_full(full.error, full.uri, batches), 0)
    yield _row(uri, rows, label_widths, nbytes, error, notes[0] if notes else None, weighted)


def _row(uri: str, rows: int, label_widths, nbytes: int, error: Optional[str], warning: Optional[str],
         weighted: int = 0):
    """The one result row of :func:`export_arrow_batches`."""
    return pa.record_batch(
        [pa.array([uri]), pa.array([rows], pa.int64()), pa.array([label_widths or []], pa.list_(pa.int32())),
         pa.array([nbytes], pa.int64()), pa.array([error], pa.string()), pa.array([warning], pa.string()),
         pa.array([weighted], pa.int64())],
        names=["uri", "rows", "label_widths", "bytes", "error", "warning", "weighted"],
    )


def positive_weights(array: pa.Array) -> int:
    """How many of a staged sample-weight column's rows weigh more than 0 (nulls and NaN do not)."""
    values = array.values.to_numpy(zero_copy_only=False) if pa.types.is_fixed_size_list(array.type) else \
        array.to_numpy(zero_copy_only=False)
    return int((np.asarray(values, dtype="float64") > 0).sum())


def no_weight_message(name: str, rows: int) -> str:
    """The refusal of data whose every sample weight is 0: it would train nothing."""
    return (f"{name} gives every one of the {rows} examples the sample weight 0, so the fit would train nothing; "
            "expected at least one weight above 0 (check the column, or leave out sample_weight_col).")


def _flat_parts(value, count: int, what: str, where: str) -> List:
    """One value per input/output from an RDD element's ``x`` or ``y``."""
    parts = list(value) if count > 1 and isinstance(value, (tuple, list)) else [value]
    if len(parts) != count:
        raise DataError(f"{where} has {len(parts)} {what} arrays; the model has {count}.")
    return parts


def export_pairs(
    index: int,
    pairs: Iterable,
    *,
    directory: str,
    inputs: Sequence[Column],
    num_outputs: int,
    y_dtype: str,
    checks: Optional[DataChecks] = None,
) -> Iterator[Tuple[str, int, Tuple[Tuple[int, ...], ...], int, Optional[str]]]:
    """``mapPartitionsWithIndex`` body that stages an RDD partition of ``(x, y)`` pairs.

    ``x`` is an array (a tuple of arrays for a model with several inputs; bytes or a string for a string input) and
    ``y`` a number or array (a tuple for several outputs). Yields one ``(uri, rows, label_shapes, bytes, error)``;
    empty partitions yield ``("", 0, (), 0, None)``; a refused partition its ``DataError``'s message as ``error``.

    Args:
        index: The partition's index (names the file and the errors).
        directory: Where to write the file (local path or URI).
        inputs: The staged column of each model input (``x0``, ``x1``, ...).
        y_dtype: numpy dtype name of the staged labels.
        checks: Value checks (NaN/Inf, label range); ``None``: none.
    """
    pairs = iter(pairs)
    try:
        xs: List[List] = [[] for _ in inputs]
        ys: List[List[np.ndarray]] = [[] for _ in range(num_outputs)]
        shapes = None
        for i, pair in enumerate(pairs):
            where = f"RDD element {i} of partition {index}"
            try:
                x, y = pair
            except (TypeError, ValueError):
                raise DataError(f"RDD elements must be (x, y) pairs; {where} is {type(pair).__name__}.") from None
            for k, (part, column) in enumerate(zip(_flat_parts(x, len(inputs), "feature", where), inputs)):
                xs[k].append(column.handler.element(part, column, where, f" for input {k}" if len(inputs) > 1 else ""))
            labels = [np.asarray(p, dtype=y_dtype) for p in _flat_parts(y, num_outputs, "label", where)]
            label_shapes = tuple(p.shape for p in labels)
            if shapes not in (None, label_shapes):
                raise DataError(f"RDD partition {index} has labels of different shapes.")
            shapes = label_shapes
            for k, p in enumerate(labels):
                ys[k].append(p.reshape(-1))
        if not xs[0]:
            result = ("", 0, (), 0, None)
        else:
            arrays = {}
            for column, values in zip(inputs, xs):
                arrays[column.name] = stage_numpy(column.handler.stack(values), column)
                check_staged(arrays[column.name], column, checks, partition=False,
                             name=f"The features of RDD partition {index}")
            for k, values in enumerate(ys):
                label = Column(f"y{k}", f"The labels of RDD partition {index}", TensorKind.name, role="y", index=k)
                arrays[label.name] = stage_numpy(np.stack(values), label)
                check_staged(arrays[label.name], label, checks, partition=False, name=label.source)
            uri = join(directory, f"part-{index:05d}.arrow")
            nbytes = _write(uri, arrays)
            result = (uri, len(xs[0]), shapes, nbytes, None)
    except DataError as exc:
        result = ("", 0, (), 0, remote_errors.reported(exc, pairs))
    except _Full as full:
        result = ("", 0, (), 0, remote_errors.reported_full(full.error, full.uri, pairs))
    yield result
