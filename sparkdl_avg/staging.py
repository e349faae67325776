"""The staged-data format: examples written once per fit as Arrow IPC files.

Each file holds one record batch with two ``FixedSizeList`` columns, ``x``
(the flattened features) and ``y`` (the flattened label). Files are read by
memory-mapping them, so a round's task touches only the pages of the examples
it trains on. Files on a remote ``pyarrow.fs`` filesystem (HDFS, S3, ...) are
copied once per Python worker into a local cache directory, then mapped.

This module runs on executors and on the driver; it holds no driver state.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from .errors import DATA_ERROR_MARKER

_FILE_CACHE_LIMIT = 256


@dataclass(frozen=True)
class StagedFile:
    """One staged file: its URI (or local path) and number of examples."""

    uri: str
    rows: int


@dataclass(frozen=True)
class StagedDataset:
    """A dataset written to the staging directory, described for executors.

    A file row holds one example's features of all model inputs flattened
    and concatenated (``x``), and likewise its labels of all outputs (``y``);
    :func:`unflatten` splits them back.

    Attributes:
        files: The staged files, in data order.
        x_shapes: Shape of one example's features, per model input.
        y_shapes: Shape of one example's label, per model output; ``()`` for
            a scalar label.
        x_dtype: numpy dtype name of the features (the model inputs' dtype).
        y_dtype: numpy dtype name of the labels.
    """

    files: Tuple[StagedFile, ...]
    x_shapes: Tuple[Tuple[int, ...], ...]
    y_shapes: Tuple[Tuple[int, ...], ...]
    x_dtype: str
    y_dtype: str

    @property
    def num_examples(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def x_width(self) -> int:
        return sum(math.prod(s) for s in self.x_shapes)

    @property
    def y_width(self) -> int:
        return sum(math.prod(s) for s in self.y_shapes)

    def offsets(self) -> np.ndarray:
        """Index of each file's first example, plus the total at the end."""
        return np.concatenate([[0], np.cumsum([f.rows for f in self.files])]).astype(np.int64)


def unflatten(flat: np.ndarray, shapes: Sequence[Tuple[int, ...]]) -> List[np.ndarray]:
    """Splits ``(n, Σ widths)`` rows into one ``(n, *shape)`` array per shape (views)."""
    parts, at = [], 0
    for shape in shapes:
        width = math.prod(shape)
        parts.append(flat[:, at : at + width].reshape((len(flat), *shape)))
        at += width
    return parts


def structure(parts: List):
    """What Keras expects for one or several inputs (or outputs): the array, or a tuple."""
    return parts[0] if len(parts) == 1 else tuple(parts)


def resolve(uri: str) -> Tuple[pafs.FileSystem, str]:
    """Returns the ``pyarrow.fs`` filesystem and path for a local path or URI."""
    if "://" in uri:
        return pafs.FileSystem.from_uri(uri)
    return pafs.LocalFileSystem(), os.path.abspath(uri)


def join(base: str, name: str) -> str:
    """Joins a directory URI or path with a file name."""
    return base.rstrip("/") + "/" + name


def data_error(message: str) -> ValueError:
    """An executor-side data error the driver re-raises as ``DataError``."""
    return ValueError(DATA_ERROR_MARKER + message)


def write_examples(uri: str, x: np.ndarray, y: np.ndarray) -> None:
    """Writes ``x`` (n, ...) and ``y`` (n, ...) as one staged file, atomically.

    The file is written under a temporary name and renamed, so a retried
    task never leaves a half-written file behind.
    """
    n = len(x)
    x_flat = np.ascontiguousarray(x).reshape(n, -1)
    y_flat = np.ascontiguousarray(y).reshape(n, -1)
    batch = pa.record_batch(
        [
            pa.FixedSizeListArray.from_arrays(pa.array(x_flat.reshape(-1)), x_flat.shape[1]),
            pa.FixedSizeListArray.from_arrays(pa.array(y_flat.reshape(-1)), y_flat.shape[1]),
        ],
        names=["x", "y"],
    )
    fs, path = resolve(uri)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    fs.create_dir(os.path.dirname(path), recursive=True)
    with fs.open_output_stream(tmp) as sink:
        with pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)
    fs.move(tmp, path)


class _FileCache:
    """Memory-mapped staged files of this Python worker, least recently used out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrays: "OrderedDict[str, Tuple[np.ndarray, np.ndarray]]" = OrderedDict()
        self._local_dir = None

    def _local_path(self, uri: str) -> str:
        fs, path = resolve(uri)
        if isinstance(fs, pafs.LocalFileSystem):
            return path
        if self._local_dir is None:
            self._local_dir = tempfile.mkdtemp(prefix="sparkdl_avg-cache-")
        local = os.path.join(self._local_dir, uuid.uuid5(uuid.NAMESPACE_URL, uri).hex + ".arrow")
        if not os.path.exists(local):
            tmp = local + ".part"
            with fs.open_input_stream(path) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
            os.replace(tmp, local)
        return local

    def get(self, uri: str, x_width: int, y_width: int) -> Tuple[np.ndarray, np.ndarray]:
        with self._lock:
            if uri in self._arrays:
                self._arrays.move_to_end(uri)
                return self._arrays[uri]
        source = pa.memory_map(self._local_path(uri), "r")
        batch = pa.ipc.open_file(source).get_batch(0)
        n = batch.num_rows
        # Zero-copy views of the mapped file: reading them pages in only the
        # rows that are indexed.
        x = batch.column("x").values.to_numpy(zero_copy_only=True).reshape((n, x_width))
        y = batch.column("y").values.to_numpy(zero_copy_only=True).reshape((n, y_width))
        with self._lock:
            self._arrays[uri] = (x, y)
            while len(self._arrays) > _FILE_CACHE_LIMIT:
                self._arrays.popitem(last=False)
        return x, y

    def clear(self) -> None:
        with self._lock:
            self._arrays.clear()


_FILES = _FileCache()


def read_examples(dataset: StagedDataset, indices: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Gathers the examples at ``indices`` (global example indices), in that order.

    Returns:
        ``(x, y)`` flat numpy arrays of shapes ``(len(indices), x_width)`` and
        ``(len(indices), y_width)``, copied out of the mapped files; split
        them per input/output with :func:`unflatten`.
    """
    indices = np.asarray(indices, dtype=np.int64)
    offsets = dataset.offsets()
    which = np.searchsorted(offsets, indices, side="right") - 1
    x = np.empty((len(indices), dataset.x_width), dtype=dataset.x_dtype)
    y = np.empty((len(indices), dataset.y_width), dtype=dataset.y_dtype)
    for f in np.unique(which):
        rows = which == f
        fx, fy = _FILES.get(dataset.files[f].uri, dataset.x_width, dataset.y_width)
        local = indices[rows] - offsets[f]
        x[rows] = fx[local]
        y[rows] = fy[local]
    return x, y


def remove_tree(uri: str) -> None:
    """Deletes a staging directory and everything in it; missing is fine."""
    fs, path = resolve(uri)
    try:
        fs.delete_dir(path)
    except FileNotFoundError:
        pass


@dataclass(frozen=True)
class DataChecks:
    """Value checks made while staging (``check_data=True``).

    Attributes:
        finite: Features and labels must be finite (no NaN/Inf).
        label_ranges: Per model output, ``(low, high, integer, what)``: labels
            must lie in ``[low, high]`` (and be whole numbers if ``integer``);
            ``what`` describes the range in the error. ``None``: no check.
    """

    finite: bool = True
    label_ranges: Tuple[Optional[Tuple[float, float, bool, str]], ...] = ()


def check_values(
    values: np.ndarray, name: str, checks: Optional[DataChecks], output: Optional[int] = None, first_row: int = 0
) -> None:
    """Raises a data error naming ``name`` if ``values`` (rows × values) fail ``checks``.

    Args:
        values: The staged values, one row per example.
        name: How the error names them, e.g. ``"Column 'label'"``.
        checks: The checks; ``None`` checks nothing.
        output: For labels, the model output they belong to.
        first_row: Row number of ``values[0]`` in its partition, for the message.
    """
    if checks is None or values.size == 0:
        return
    if checks.finite and values.dtype.kind == "f":
        bad = ~np.isfinite(values)
        if bad.any():
            row = first_row + int(np.argwhere(bad)[0][0])
            raise data_error(
                f"{name} contains NaN or Inf ({int(bad.sum())} values; the first in row {row} of its "
                "partition). Clean or impute the data, or pass check_data=False to train anyway."
            )
    bounds = checks.label_ranges[output] if output is not None and output < len(checks.label_ranges) else None
    if bounds is not None:
        low, high, integer, what = bounds
        bad = (values < low) | (values > high)
        if integer:
            bad |= values != np.round(values)
        if bad.any():
            value = values[tuple(np.argwhere(bad)[0])]
            raise data_error(f"{name} holds the label {value.item()!r}; expected {what}.")


def list_values(column: pa.Array, name: str, width: int, dtype: str) -> np.ndarray:
    """Flattens an Arrow list column whose rows must all hold ``width`` values."""
    if column.null_count:
        raise data_error(f"Column '{name}' contains null rows; expected {width} values per row.")
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(lengths != width)
    if bad.size:
        raise data_error(
            f"Column '{name}' has a row of {int(lengths[bad[0]])} values; expected "
            f"{width} values per row (the model's input or label size)."
        )
    values = column.flatten()
    if values.null_count:
        raise data_error(f"Column '{name}' contains null values inside its arrays.")
    return values.to_numpy(zero_copy_only=False).astype(dtype, copy=False).reshape(len(column), width)


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
        features: ``(column, width)`` per model input; the columns are
            ``array<float|double>`` and every row must hold ``width`` values.
        labels: Label column per model output, each a number or an array.
        checks: Value checks (NaN/Inf, label range); ``None``: none.

    Yields one row ``(uri, rows, label_widths)`` where a label width is 0 for
    a scalar label; empty partitions write no file and yield ``rows = 0``.
    """
    from pyspark import TaskContext

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
                    raise data_error(f"Column '{name}' contains null labels.")
                width = 0
                parts.append(label.to_numpy(zero_copy_only=False).astype(y_dtype, copy=False).reshape(-1, 1))
            check_values(parts[-1], f"Column '{name}'", checks, output, first_row=rows_before)
            widths.append(width)
        if label_widths not in (None, widths):
            raise data_error(f"Label column(s) {list(labels)} hold arrays of different lengths.")
        label_widths = widths
        ys.append(np.concatenate(parts, axis=1))
        rows_before += batch.num_rows
    rows = sum(len(x) for x in xs)
    uri = ""
    if rows:
        uri = join(directory, f"part-{TaskContext.get().partitionId():05d}.arrow")
        write_examples(uri, np.concatenate(xs), np.concatenate(ys))
    yield pa.record_batch(
        [pa.array([uri]), pa.array([rows], pa.int64()), pa.array([label_widths or []], pa.list_(pa.int32()))],
        names=["uri", "rows", "label_widths"],
    )


def _flat_parts(value, count: int, what: str, where: str) -> List[np.ndarray]:
    """One flat array per input/output from an RDD element's ``x`` or ``y``."""
    parts = list(value) if count > 1 and isinstance(value, (tuple, list)) else [value]
    if len(parts) != count:
        raise data_error(f"{where} has {len(parts)} {what} arrays; the model has {count}.")
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
) -> Iterator[Tuple[str, int, Tuple[Tuple[int, ...], ...]]]:
    """``mapPartitionsWithIndex`` body that stages an RDD partition of ``(x, y)`` pairs.

    ``x`` is an array (a tuple of arrays for a model with several inputs) and
    ``y`` a number or array (a tuple for several outputs). Yields one
    ``(uri, rows, label_shapes)``; empty partitions yield ``("", 0, ())``.
    """
    xs, ys, shapes = [], [], None
    for i, pair in enumerate(pairs):
        where = f"RDD element {i} of partition {index}"
        try:
            x, y = pair
        except (TypeError, ValueError):
            raise data_error(f"RDD elements must be (x, y) pairs; {where} is {type(pair).__name__}.") from None
        flat = []
        for k, (part, width) in enumerate(zip(_flat_parts(x, len(x_widths), "feature", where), x_widths)):
            part = np.asarray(part, dtype=x_dtype).reshape(-1)
            if part.size != width:
                which = f" for input {k}" if len(x_widths) > 1 else ""
                raise data_error(
                    f"{where} has features of {part.size} values{which}; expected {width} "
                    f"(the model's input size)."
                )
            flat.append(part)
        labels = [np.asarray(p, dtype=y_dtype) for p in _flat_parts(y, num_outputs, "label", where)]
        label_shapes = tuple(p.shape for p in labels)
        if shapes not in (None, label_shapes):
            raise data_error(f"RDD partition {index} has labels of different shapes.")
        shapes = label_shapes
        xs.append(np.concatenate(flat))
        ys.append(np.concatenate([p.reshape(-1) for p in labels]))
    if not xs:
        yield "", 0, ()
        return
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
    yield uri, len(xs), shapes
