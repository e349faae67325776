"""What a round's tasks carry to read its state and hand back their sums, and the raw file format.

This module is the executor-visible half of the state transport
(:mod:`sparkdl_avg.transport` is the driver's half, which picks one):

* a *state source* — :class:`InlineState` (in the task itself: in-process
  tests), :class:`BroadcastState` (a Spark broadcast) or
  :class:`StoredState` (a file under the staging directory) — whose
  ``load()`` gives the round's ``(weights, optimizer variables)``;
* a *result sink* — :class:`ReturnSums` (the sums travel as Spark task
  results) or :class:`StoreSums` (the worker writes them to a file of its own
  and returns only its description) — whose ``deliver()`` turns a worker's
  :class:`~sparkdl_avg.aggregation.PartialResult` into what its task yields.

Why files: a round's partial sums (the model's weights and optimizer
variables, n× each) reach the driver through Spark's result path — pickled
in the Python worker, copied into the executor JVM, stored in the block
manager when over ``spark.task.maxDirectResultSize``, fetched by the driver
JVM, copied over a socket into Python and unpickled. On this project's 2-core
machine that is ≈ 5 ms per MB, the largest per-round cost at 1e6 parameters
(12 MB per worker with Adam). When the driver and the executors share a
filesystem (always on one host: ``local[N]``, ``local-cluster``), a worker
writing its arrays to a file and returning only the file's name costs a
page-cache copy on each side (measured in docs/benchmarks.md).

The format is deliberately raw: the arrays' bytes back to back, each at an
offset aligned to 64 bytes, described by a :class:`StoredArrays` that
travels through Spark (it is small). Local files are read through a memory
map, so the driver sums straight out of the page cache. A file is written
once by one task attempt under a unique name and read only if that attempt
succeeded, so retries and speculative attempts never mix.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow.fs as pafs

from .fs import join, resolve

_ALIGN = 64


@dataclass(frozen=True)
class StoredArrays:
    """Where and how a list of arrays was written by :func:`store`.

    Attributes:
        uri: The file (local path or ``pyarrow.fs`` URI).
        layout: ``(dtype, shape, byte offset)`` per array, in order. The
            dtype objects themselves, not their ``.str``: extension dtypes
            such as ``ml_dtypes.bfloat16`` (Keras bfloat16 weights) have no
            string that reads back as themselves.
    """

    uri: str
    layout: Tuple[Tuple[np.dtype, Tuple[int, ...], int], ...]


def _layout(arrays: Sequence[np.ndarray]) -> Tuple[Tuple[np.dtype, Tuple[int, ...], int], ...]:
    out, offset = [], 0
    for a in arrays:
        out.append((a.dtype, tuple(a.shape), offset))
        offset += -(-a.nbytes // _ALIGN) * _ALIGN
    return tuple(out)


def store(directory: str, name: str, arrays: Sequence[np.ndarray]) -> StoredArrays:
    """Writes ``arrays`` to a new file ``directory/name-<unique>.bin``; returns its description."""
    # Not np.ascontiguousarray: it turns 0-d arrays (counters) into 1-d ones.
    arrays = [np.asarray(a) if np.asarray(a).flags.c_contiguous else np.array(a, order="C") for a in arrays]
    layout = _layout(arrays)
    uri = join(directory, f"{name}-{uuid.uuid4().hex}.bin")
    fs, path = resolve(uri)
    local = isinstance(fs, pafs.LocalFileSystem)
    if local:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        sink = open(path, "wb")
    else:
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        sink = fs.open_output_stream(path)
    with sink:
        written = 0
        for a, (_, _, offset) in zip(arrays, layout):
            if offset > written:
                sink.write(b"\0" * (offset - written))
            # reshape(-1) gives 0-d arrays (counters) a 1-d buffer; bytes because the
            # buffer protocol refuses extension dtypes (bfloat16).
            sink.write(a.reshape(-1).view(np.uint8).data)
            written = offset + a.nbytes
    return StoredArrays(uri, layout)


def load(stored: StoredArrays) -> List[np.ndarray]:
    """The arrays of ``stored``: read-only views of a memory map (local) or of the file's bytes."""
    fs, path = resolve(stored.uri)
    if isinstance(fs, pafs.LocalFileSystem):
        if not any(int(np.prod(shape)) for _, shape, _ in stored.layout):
            return [np.zeros(shape, dtype) for dtype, shape, _ in stored.layout]
        buffer = np.memmap(path, dtype=np.uint8, mode="r")
    else:
        with fs.open_input_stream(path) as src:
            buffer = np.frombuffer(src.read(), dtype=np.uint8)
    out = []
    for dtype, shape, offset in stored.layout:
        count = int(np.prod(shape))
        out.append(buffer[offset : offset + count * dtype.itemsize].view(dtype).reshape(shape))
    return out


def remove(stored: StoredArrays) -> None:
    """Deletes the file of ``stored``; a missing file is fine."""
    fs, path = resolve(stored.uri)
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass


@dataclass(frozen=True)
class StoredState:
    """A model state in one file: ``num_weights`` weight arrays, then the optimizer variables if ``optimizer``."""

    arrays: StoredArrays
    num_weights: int
    optimizer: bool

    def load(self) -> Tuple[List[np.ndarray], Optional[List[np.ndarray]]]:
        """The round's state, as read-only views (a state source, like :class:`BroadcastState`)."""
        return load_state(self)


def store_state(
    directory: str, name: str, weights: Sequence[np.ndarray], optimizer: Optional[Sequence[np.ndarray]]
) -> StoredState:
    """Writes weights and optimizer variables (or ``None``) to one new file under ``directory``."""
    arrays = list(weights) + (list(optimizer) if optimizer is not None else [])
    return StoredState(store(directory, name, arrays), len(weights), optimizer is not None)


def load_state(stored: StoredState) -> Tuple[List[np.ndarray], Optional[List[np.ndarray]]]:
    """``(weights, optimizer variables or None)`` of ``stored``, as read-only views (see :func:`load`)."""
    arrays = load(stored.arrays)
    return arrays[: stored.num_weights], (arrays[stored.num_weights :] if stored.optimizer else None)


# ------------------------------------------------------------ state sources


@dataclass(frozen=True)
class InlineState:
    """The round's state carried in the task itself (in-process runs and tests)."""

    weights: Sequence[np.ndarray]
    optimizer: Optional[Sequence[np.ndarray]]

    def load(self) -> Tuple[Sequence[np.ndarray], Optional[Sequence[np.ndarray]]]:
        return self.weights, self.optimizer


@dataclass(frozen=True)
class BroadcastState:
    """The round's state in a Spark broadcast of ``(weights, optimizer variables)``."""

    broadcast: Any

    def load(self) -> Tuple[Sequence[np.ndarray], Optional[Sequence[np.ndarray]]]:
        return self.broadcast.value


# ------------------------------------------------------------- result sinks


@dataclass(frozen=True)
class ReturnSums:
    """Workers return their sums as Spark task results."""

    def deliver(self, result, name: str):
        return result


@dataclass(frozen=True)
class StoredResult:
    """A worker's result without its array sums, and the file holding them (``None``: it had no examples)."""

    result: Any
    sums: Optional[StoredState]


@dataclass(frozen=True)
class StoreSums:
    """Workers write their weight and optimizer sums to a file of their own under ``directory``."""

    directory: str

    def deliver(self, result, name: str) -> StoredResult:
        if result.weight_sums is None:
            return StoredResult(result, None)
        stored = store_state(self.directory, name, result.weight_sums, result.optimizer_sums)
        return StoredResult(dataclasses.replace(result, weight_sums=None, optimizer_sums=None), stored)
