"""The staged dataset: its description and its on-disk format, Arrow IPC files written once per fit.

This module owns :class:`StagedDataset` (what executors are told about the
staged data), the file format and its reading. Each file holds one record
batch with two ``FixedSizeList`` columns, ``x`` (an example's features of
all model inputs, flattened and concatenated) and ``y`` (likewise its
labels); :func:`write_examples` writes one, :func:`read_examples` gathers
examples by index and :func:`unflatten` splits rows back per input and
output. Files are read by memory-mapping them, so a round's task touches
only the pages of the examples it trains on; files on a remote filesystem
(HDFS, S3, ...) are first copied once per Python worker into a local cache
directory. It runs on executors and on the driver and holds no driver state;
what is staged and how it is checked belong to :mod:`sparkdl_avg.driver.staging`
(driver) and :mod:`sparkdl_avg.executor.stage_writer` (executors).
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from . import fs

_FILE_CACHE_LIMIT = 256  # mapped files kept open per Python worker


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


def write_examples(uri: str, x: np.ndarray, y: np.ndarray) -> None:
    """Writes ``x`` (n, ...) and ``y`` (n, ...) as one staged file, atomically.

    The file appears whole or not at all (:func:`sparkdl_avg.shared.fs.open_atomically`),
    so a retried task never leaves a half-written file behind. Its directory
    must exist (the driver makes it, :func:`sparkdl_avg.driver.staging.stage`): a task
    still running after its staging was given up and removed cannot
    recreate it.
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
    with fs.open_atomically(uri, parents=False) as sink:
        with pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)


class _FileCache:
    """Memory-mapped staged files of this Python worker, least recently used out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrays: "OrderedDict[str, Tuple[np.ndarray, np.ndarray]]" = OrderedDict()
        self._local_dir = None

    def _local_path(self, uri: str) -> str:
        filesystem, path = fs.resolve(uri)
        if isinstance(filesystem, pafs.LocalFileSystem):
            return path
        if self._local_dir is None:
            self._local_dir = tempfile.mkdtemp(prefix="sparkdl_avg-cache-")
        local = os.path.join(self._local_dir, uuid.uuid5(uuid.NAMESPACE_URL, uri).hex + ".arrow")
        if not os.path.exists(local):
            fs.download(uri, local)
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
