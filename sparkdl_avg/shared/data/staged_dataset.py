"""The staged dataset: its description, its on-disk format (Arrow IPC files written once per fit) and its reading.

This module owns :class:`StagedDataset` (what executors are told about the staged data and how it becomes the model's
arrays), the file format and :func:`read_examples`, the one way staged examples are read: by the workers of a round,
the evaluation tasks and the driver's checks. Each file holds one record batch with one column per
:class:`~sparkdl_avg.shared.data.columns.Column`: numbers as ``FixedSizeList`` columns of the dtype of the model input
they feed (so int64 ids stay exact), bytes and text as they came, Spark's image struct as it came. Files are read by
memory-mapping them, so a round's task touches only the pages of the examples it trains on; files on a remote
filesystem (HDFS, S3, ...) are first copied once per executor into a local cache directory, in the executor's files
directory that Spark deletes with the executor (:func:`_cache_parent`), where each of its Python workers finds them.

Reading ends in :func:`model_arrays`: the model's inputs, labels and sample weights by name, from the staged columns
directly or, with a preprocessing function (:mod:`sparkdl_avg.shared.data.preprocess`), from its output per minibatch,
each checked against the shape and dtype the model takes. It runs on executors and on the driver and holds no driver
state; what is staged belongs to :mod:`sparkdl_avg.driver.data.staging` (driver) and
:mod:`sparkdl_avg.executor.stage_writer` (executors).
"""

from __future__ import annotations

import atexit
import inspect
import math
import os
import shutil
import tempfile
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from ...errors import DataError
from ..errors.remote_errors import one_line
from ..files import fs
from .columns import TEXT, Column, Field, exact_cast, read_column
from .preprocess import Preprocess, describe_row, example_seeds
from .value_checks import DataChecks, check_values

def _file_cache_limit() -> int:
    """Mapped files a Python worker keeps open: 4096, or half its open-file limit where that is lower.

    A round reads examples from any file: data staged from many small partitions (``binaryFile`` over small images
    makes hundreds) would re-open its files every round once they outnumber the cache, several times slower
    (docs/benchmarks/data_formats.md).
    """
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, ValueError, OSError):
        return 256
    return max(64, min(4096, soft // 2 if soft > 0 else 4096))


_FILE_CACHE_LIMIT = _file_cache_limit()


@dataclass(frozen=True)
class StagedFile:
    """One staged file: its URI (or local path), number of examples and bytes of data."""

    uri: str
    rows: int
    nbytes: int = 0


@dataclass(frozen=True)
class StagedDataset:
    """A dataset written to the staging directory, described for executors.

    Attributes:
        files: The staged files, in data order.
        columns: The columns every file holds.
        x_names: Per model input, the name of the array it gets: a staged column, or a key of the preprocessing
            function's output.
        x_fields: Per model input, the shape and dtype it takes.
        y_names: Per model output, the name of its labels (as ``x_names``).
        y_fields: Per model output, one example's label shape (``()`` for one number) and dtype.
        weight_name: The sample weights' name (as ``x_names``), or ``None``.
        preprocess: The preprocessing function, or ``None``.
        class_weight: ``((class, weight), ...)``: each example's weight is multiplied by its class's (Keras'
            ``class_weight``), or ``None``.
        checks: With ``preprocess``, the value checks of its output (NaN/Inf, label ranges, Embedding ids), made per
            minibatch where it runs (:func:`model_arrays`); ``None``: none.
    """

    files: Tuple[StagedFile, ...]
    columns: Tuple[Column, ...]
    x_names: Tuple[str, ...]
    x_fields: Tuple[Field, ...]
    y_names: Tuple[str, ...]
    y_fields: Tuple[Field, ...]
    weight_name: Optional[str] = None
    preprocess: Optional[Preprocess] = None
    class_weight: Optional[Tuple[Tuple[int, float], ...]] = None
    checks: Optional[DataChecks] = None

    @property
    def num_examples(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def x_shapes(self) -> Tuple[Tuple[int, ...], ...]:
        return tuple(f.shape for f in self.x_fields)

    @property
    def y_shapes(self) -> Tuple[Tuple[int, ...], ...]:
        return tuple(f.shape for f in self.y_fields)

    @property
    def weighted(self) -> bool:
        return self.weight_name is not None or self.class_weight is not None

    @property
    def signature(self) -> tuple:
        """What a compiled step function depends on: the fields the model gets and whether they are weighted."""
        return (tuple((f.shape, f.dtype) for f in self.x_fields), tuple((f.shape, f.dtype) for f in self.y_fields),
                self.weighted)

    @property
    def nbytes(self) -> int:
        """Bytes of the staged files (``TrainingStats.staged_bytes``)."""
        return sum(f.nbytes for f in self.files)

    def offsets(self) -> np.ndarray:
        """Index of each file's first example, plus the total at the end."""
        return np.concatenate([[0], np.cumsum([f.rows for f in self.files])]).astype(np.int64)


def structure(parts: List):
    """What Keras expects for one or several inputs (or outputs): the array, or a tuple."""
    return parts[0] if len(parts) == 1 else tuple(parts)


def write_columns(uri: str, arrays: Mapping[str, pa.Array]) -> int:
    """Writes one staged file of ``arrays`` (one staged array per column, by name), atomically; returns its bytes.

    The file appears whole or not at all (:func:`sparkdl_avg.shared.files.fs.open_atomically`), so a retried task
    never leaves a half-written file behind. Its directory must exist (the driver makes it,
    :func:`sparkdl_avg.driver.data.staging.stage`): a task still running after its staging was given up and removed
    cannot recreate it.
    """
    arrays = {name: a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for name, a in arrays.items()}
    batch = pa.record_batch(list(arrays.values()), names=list(arrays))
    with fs.open_atomically(uri, parents=False) as sink:
        with pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)
    return int(sum(a.nbytes for a in arrays.values()))


def _cache_parent() -> Optional[str]:
    """Where a Python worker keeps its copies of remote staged files: in its executor's files directory
    (``SparkFiles.getRootDirectory()``, under ``spark.local.dir``), which Spark deletes when the executor stops.

    A worker forked from PySpark's daemon ends without running ``atexit`` hooks, so copies kept in the temporary
    directory stayed there after the application (1.6 MB per worker and fit in the suite's runs, the staged data's size
    on a cluster). ``None`` (the temporary directory) outside a Spark task: the driver's own reads.
    """
    try:
        from pyspark import SparkFiles
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return None
    if not getattr(SparkFiles, "_is_running_on_worker", False):
        return None
    root = SparkFiles.getRootDirectory()
    return root if os.path.isdir(root) else None


class _FileCache:
    """Memory-mapped staged files of this Python worker, least recently used out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: "OrderedDict[str, Tuple[pa.RecordBatch, Dict[str, np.ndarray]]]" = OrderedDict()
        self._local_dir = None

    def _local_path(self, uri: str) -> str:
        filesystem, path = fs.resolve(uri)
        if isinstance(filesystem, pafs.LocalFileSystem):
            return path
        if self._local_dir is None:
            parent = _cache_parent()
            if parent is None:  # the driver's own reads: a directory of this process, removed when it exits
                self._local_dir = tempfile.mkdtemp(prefix="sparkdl_avg-cache-")
                atexit.register(shutil.rmtree, self._local_dir, True)
            else:
                # One directory per executor, shared by its Python workers: a worker new to the data (the SQL
                # runner's pool, a worker started after another went idle) finds the copy a sibling made instead of
                # fetching the whole staged data again: 1.4-1.6 s of a round with 15 MB at 100 Mbit/s. A staged
                # file's URI is unique (a fresh directory per staging) and never rewritten, and each copy is
                # renamed into place whole, so a copy found is the file's bytes.
                self._local_dir = os.path.join(parent, "sparkdl_avg-cache-executor")
                os.makedirs(self._local_dir, exist_ok=True)
        local = os.path.join(self._local_dir, uuid.uuid5(uuid.NAMESPACE_URL, uri).hex + ".arrow")
        if not os.path.exists(local):
            fs.download(uri, local)
        return local

    def get(self, uri: str) -> Tuple[pa.RecordBatch, Dict[str, np.ndarray]]:
        """The file's record batch and zero-copy ``(rows, width)`` views of its tensor columns."""
        with self._lock:
            if uri in self._batches:
                self._batches.move_to_end(uri)
                return self._batches[uri]
        source = pa.memory_map(self._local_path(uri), "r")
        batch = pa.ipc.open_file(source).get_batch(0)
        n = batch.num_rows
        # Zero-copy views of the mapped file: reading them pages in only the rows that are indexed.
        views = {}
        for name, column in zip(batch.schema.names, batch.columns):
            if pa.types.is_fixed_size_list(column.type):
                views[name] = column.values.to_numpy(zero_copy_only=False).reshape((n, column.type.list_size))
        with self._lock:
            self._batches[uri] = (batch, views)
            while len(self._batches) > _FILE_CACHE_LIMIT:
                self._batches.popitem(last=False)
        return batch, views

    def clear(self) -> None:
        with self._lock:
            self._batches.clear()


_FILES = _FileCache()


def read_columns(dataset: StagedDataset, indices: np.ndarray) -> Dict[str, Any]:
    """The staged columns of the examples at ``indices`` (global example indices), in that order.

    Tensor columns come back as ``(len(indices), *shape)`` arrays of their dtype, copied out of the mapped files; the
    others as :func:`sparkdl_avg.shared.data.columns.read_column` makes them.
    """
    indices = np.asarray(indices, dtype=np.int64)
    offsets = dataset.offsets()
    which = np.searchsorted(offsets, indices, side="right") - 1
    files = np.unique(which)
    out: Dict[str, Any] = {}
    for column in dataset.columns:
        if column.handler.numeric:
            field = column.field
            values = None
            for f in files:
                _, views = _FILES.get(dataset.files[f].uri)
                view = views[column.name]
                if values is None:
                    values = np.empty((len(indices), view.shape[1]), dtype=view.dtype)
                rows = which == f
                values[rows] = view[indices[rows] - offsets[f]]
            if values is None:
                values = np.empty((0, field.width if field else 0), dtype=field.dtype if field else np.float32)
            shape = field.shape if field is not None else values.shape[1:]
            out[column.name] = values.reshape((len(indices), *shape))
        else:
            parts, order = [], []
            for f in files:
                batch, _ = _FILES.get(dataset.files[f].uri)
                rows = np.flatnonzero(which == f)
                parts.append(batch.column(column.name).take(pa.array(indices[rows] - offsets[f])))
                order.append(rows)
            if len(parts) == 1:
                taken = parts[0]
            else:
                taken = pa.concat_arrays(parts).take(pa.array(np.argsort(np.concatenate(order), kind="stable")))
            out[column.name] = read_column(taken, column)
    return out


@dataclass
class Examples:
    """The model's arrays for some examples.

    Attributes:
        xs: One array per model input.
        ys: One array per model output (empty when labels are not asked for).
        weights: The examples' sample weights (``float32``), or ``None``.
    """

    xs: List[np.ndarray]
    ys: List[np.ndarray]
    weights: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.xs[0]) if self.xs else 0

    def data(self, lo: int = 0, hi: Optional[int] = None) -> tuple:
        """``(x, y)`` or ``(x, y, sample_weight)`` of rows ``lo:hi``, as Keras' ``train_step`` takes them."""
        x = structure([a[lo:hi] for a in self.xs])
        y = structure([a[lo:hi] for a in self.ys])
        return (x, y) if self.weights is None else (x, y, self.weights[lo:hi])


def as_rows(value: Any, name: str, n: int, source: str, dtype: Any = None) -> np.ndarray:
    """An output of the preprocessing function as an array of one row per example, or a ``DataError`` naming it.

    A ragged list, a scalar or a generator is refused with the function and the key named, not numpy's own error.
    """
    if isinstance(value, np.ndarray) and (dtype is None or value.dtype == dtype):
        array = value
    else:
        what = type(value).__name__
        if inspect.isgenerator(value) or isinstance(value, (map, filter, zip)) or (
                hasattr(value, "__next__") and not hasattr(value, "__len__")):
            raise DataError(f"{source} gives {name!r} as a {what}; expected an array with one row per example "
                            f"({n}): make it a list or an array.")
        try:
            array = value.numpy() if hasattr(value, "numpy") else np.asarray(value, dtype=dtype)
        except (ValueError, TypeError) as exc:
            raise DataError(f"{source} gives {name!r} as a {what} that is not one array (rows of different "
                            f"shapes?): {one_line(str(exc)).rstrip('.')}. Expected one row per example ({n}), "
                            "every row of one shape.") from None
    if array.ndim == 0:
        raise DataError(f"{source} gives {name!r} as a single {type(value).__name__} ({_short(value)}); expected "
                        f"an array with one row per example ({n}).")
    return array


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _as_field(value: Any, field: Field, name: str, n: int, source: str) -> np.ndarray:
    """One output of the preprocessing (or one staged column) as ``(n, *field.shape)`` of ``field.dtype``."""
    if field.dtype == TEXT:
        array = as_rows(value, name, n, source, dtype=None if isinstance(value, np.ndarray) else object)
        if array.dtype.kind in "SU":
            array = array.astype(object)
        if array.dtype != object:
            raise DataError(f"{source} gives {name!r} as {array.dtype}; the model's input takes strings "
                            "(bytes or str objects).")
    else:
        array = as_rows(value, name, n, source)
    if len(array) != n:
        raise DataError(f"{source} gives {name!r} with {len(array)} rows for a batch of {n}; expected one per row.")
    shape = tuple(array.shape[1:])
    if shape != field.shape:
        if math.prod(shape) == field.width and (field.width != 1 or shape in ((), (1,))):
            array = array.reshape((n, *field.shape))
        else:
            raise DataError(f"{source} gives {name!r} of shape {shape} per row; the model takes {field.shape}.")
    if field.dtype != TEXT and array.dtype != np.dtype(field.dtype):
        array = exact_cast(array, field.dtype, f"{source} ({name!r})", where="of the batch")
    return array


def model_arrays(dataset: StagedDataset, columns: Mapping[str, Any], *, labels: bool = True,
                 seeds: Optional[np.ndarray] = None, training: bool = False, what: str = "training data",
                 first: int = 0, row_ids: Optional[np.ndarray] = None) -> Examples:
    """The model's arrays for a batch of staged columns (:func:`read_columns`), preprocessed if the data is.

    Args:
        columns: The batch's staged columns, by name.
        labels: Whether to produce labels and weights (not for ``predict``).
        seeds: Per example seeds for the preprocessing (training only).
        training: Passed to the preprocessing function.
        what: The data, for messages.
        first: Index of the batch's first example, for messages.
        row_ids: The examples' indices, for messages.

    Raises:
        DataError: the preprocessing function failed, or its output does not fit the model.
    """
    n = len(next(iter(columns.values()))) if columns else 0
    source = "The staged data"
    if dataset.preprocess is not None:
        output = dataset.preprocess.apply(dict(columns), seeds, training, what, first, row_ids)
        source = f"The preprocessing function {dataset.preprocess.name!r}"

        def get(name):
            if name in output:
                return output[name]
            if name in columns:
                return columns[name]
            raise DataError(f"{source} returned {sorted(output)}; it must return {name!r} (or the batch must hold "
                            f"it). Check features_col, label_col and sample_weight_col.")
    else:
        get = columns.__getitem__
    xs = [_as_field(get(name), field, name, n, source) for name, field in zip(dataset.x_names, dataset.x_fields)]
    checks = dataset.checks if dataset.preprocess is not None else None

    def check(array, name, **role):
        if checks is not None and array.dtype != object:
            check_values(array.reshape(n, -1), output_name(dataset.preprocess, name), checks,
                         where=lambda i: describe_row(columns, i, what, first, row_ids), **role)

    for k, (array, name) in enumerate(zip(xs, dataset.x_names)):
        check(array, name, input=k)
    if not labels:
        return Examples(xs, [])
    ys = [_as_field(get(name), field, name, n, source) for name, field in zip(dataset.y_names, dataset.y_fields)]
    for k, (array, name) in enumerate(zip(ys, dataset.y_names)):
        check(array, name, output=k)
    weights = None
    if dataset.weight_name is not None:
        weights = _as_field(get(dataset.weight_name), Field((), "float32"), dataset.weight_name, n, source)
        check(weights, dataset.weight_name)
    if dataset.class_weight is not None:
        weights = class_weights(dataset.class_weight, ys[0], weights)
    return Examples(xs, ys, weights)


def output_name(preprocess: Preprocess, key: str) -> str:
    """How a value check names key ``key`` of ``preprocess``'s output: "Key 'image' of the output of ..."."""
    return f"Key {key!r} of the output of the preprocessing function {preprocess.name!r}"


def class_weights(table: Sequence[Tuple[int, float]], y: np.ndarray, weights: Optional[np.ndarray]) -> np.ndarray:
    """Each example's weight times its class's, as Keras applies ``class_weight`` (the class: the label, or its argmax)."""
    classes = y.reshape(len(y)) if y.ndim == 1 or (y.ndim == 2 and y.shape[1] == 1) else np.argmax(y, axis=-1)
    lookup = dict(table)
    factor = np.array([lookup.get(int(c), 1.0) for c in classes], dtype=np.float32)
    return factor if weights is None else weights * factor


def read_examples(dataset: StagedDataset, indices: np.ndarray, *, labels: bool = True, seed: Optional[int] = None,
                  epoch: int = 0, training: bool = False, batch_size: Optional[int] = None,
                  what: str = "training data") -> Examples:
    """The model's arrays for the examples at ``indices`` (global example indices), in that order.

    With a preprocessing function it runs per minibatch of ``batch_size`` examples (default: all at once), with the
    examples' seeds (:func:`~sparkdl_avg.shared.data.preprocess.example_seeds` of ``seed``, ``epoch``) when ``seed``
    is given.
    """
    indices = np.asarray(indices, dtype=np.int64)
    columns = read_columns(dataset, indices)
    if dataset.preprocess is None or not batch_size or batch_size >= len(indices):
        seeds = example_seeds(seed, epoch, indices) if seed is not None and dataset.preprocess else None
        return model_arrays(dataset, columns, labels=labels, seeds=seeds, training=training, what=what,
                            row_ids=indices)
    parts = []
    for lo in range(0, len(indices), batch_size):
        ids = indices[lo: lo + batch_size]
        chunk = {name: _rows(value, lo, lo + batch_size) for name, value in columns.items()}
        seeds = example_seeds(seed, epoch, ids) if seed is not None else None
        parts.append(model_arrays(dataset, chunk, labels=labels, seeds=seeds, training=training, what=what,
                                  row_ids=ids))
    weights = None if parts[0].weights is None else np.concatenate([p.weights for p in parts])
    return Examples([np.concatenate([p.xs[k] for p in parts]) for k in range(len(parts[0].xs))],
                    [np.concatenate([p.ys[k] for p in parts]) for k in range(len(parts[0].ys))], weights)


def _rows(value: Any, lo: int, hi: int) -> Any:
    if isinstance(value, Mapping):
        return {k: _rows(v, lo, hi) for k, v in value.items()}
    return value[lo:hi]
