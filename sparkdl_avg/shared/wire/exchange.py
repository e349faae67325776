"""What a round's tasks carry to read its state and hand back their sums, and the raw file format.

This module is the executor-visible half of the state transport (:mod:`sparkdl_avg.driver.transport` is the driver's
half, which picks one):

* a *state source* — :class:`InlineState` (in the task itself: in-process tests), :class:`BroadcastState` (a Spark
  broadcast, or :mod:`.local_broadcast`'s stand-in where rounds run without Spark) or :class:`StoredState` (a file under the staging directory) — whose ``load()`` gives the round's
  ``(weights, optimizer variables)``;
* a *result sink* — :class:`ReturnSums` (the sums travel as Spark task results), :class:`StoreSums` (the worker writes
  them to a file of its own and returns only its description), or for the Spark SQL round
  :class:`~sparkdl_avg.shared.wire.round_rows.ArrowSums` (raw bytes in Arrow rows, cut into shards) and
  :class:`~sparkdl_avg.shared.wire.round_rows.StoreFlat` (a file, and one row per shard naming it) — whose
  ``deliver()`` turns a worker's :class:`~sparkdl_avg.shared.wire.aggregation.PartialResult` into what its task yields;
* the Spark SQL round's model file (:class:`StoredSpec`) and its sums' flat layout and shards (:class:`FlatLayout`),
  one of the two implementations of :class:`SumsLayout` (the other is
  :class:`~sparkdl_avg.shared.wire.delta_sums.DeltaLayout`: compressed deltas); that round's rows and reducer are
  :mod:`sparkdl_avg.shared.wire.round_rows`'s.

Why files: a round's partial sums (n× the model's state) reach the driver through Spark's result path — pickled,
copied into the executor JVM, through the block manager over ``spark.task.maxDirectResultSize``, fetched by the driver
JVM, copied into Python and unpickled — the largest per-round cost at 1e6 parameters on one host
(docs/benchmarks/overhead.md). Where the driver and the executors share a filesystem (always on one host:
``local[N]``, ``local-cluster``), a worker's file costs a page-cache copy on each side.

The format is raw: the arrays' bytes back to back, each at an offset aligned to 64 bytes, described by a small
:class:`StoredArrays` that travels through Spark. Local files are read through a memory map, so the driver sums
straight out of the page cache. A file is written once by one task attempt under a unique name and read only if that
attempt succeeded, so retries and speculative attempts never mix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import uuid
from dataclasses import dataclass
from typing import Any, List, Optional, Protocol, Sequence, Tuple

import numpy as np
import pyarrow.fs as pafs

from ..files.fs import join, resolve
from .aggregation import specs_of

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


def _layout(specs) -> Tuple[Tuple[np.dtype, Tuple[int, ...], int], ...]:
    out, offset = [], 0
    for dtype, shape in specs:
        out.append((dtype, tuple(shape), offset))
        offset += -(-int(np.prod(shape, dtype=np.int64)) * dtype.itemsize // _ALIGN) * _ALIGN
    return tuple(out)


def _make_directory(fs, path: str, local: bool, parents: bool, directory: str) -> None:
    """Creates ``path`` (a directory); without ``parents`` only ``path`` itself, whose parent must exist.

    Raises:
        FileNotFoundError: without ``parents``, the parent is gone (the fit ended, or its staging root was swept).
    """
    # Object stores have no directories to test or leave behind: a parent "exists" only while objects are under it.
    if parents or (not local and getattr(fs, "type_name", "") in ("s3", "gcs")):
        if local:
            os.makedirs(path, exist_ok=True)
        else:
            fs.create_dir(path, recursive=True)
        return
    parent = os.path.dirname(path) if local else path.rsplit("/", 1)[0]
    exists = os.path.isdir(parent) if local else fs.get_file_info(parent).type != pafs.FileType.NotFound
    if not exists:
        raise FileNotFoundError(f"{directory!r} is gone with its parent (its fit ended or its staging root was removed): "
                        "a late task's result is not written there, so the root is not made again without its "
                        "owner marker.")
    if local:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
    else:
        fs.create_dir(path, recursive=False)


#: Elements of an array read and written at a time where :func:`store` is given ``flat``: 4 MiB of float32.
WRITE_BLOCK = 1 << 20


def store(directory: str, name: str, arrays: Sequence[np.ndarray], parents: bool = True, specs=None,
          flat=None) -> StoredArrays:
    """Writes ``arrays`` to a new file ``directory/name-<unique>.bin``; returns its description.

    ``parents=False`` (what executors write into a fit's directory): ``directory``'s parent must exist, so a task
    that outlives its fit never makes the deleted staging root again (``FileNotFoundError``); such a root had no owner
    marker and the sweep of dead drivers' roots never took it.

    ``specs``: ``(dtype, shape)`` per array (:func:`specs_of`), given when ``arrays`` is read on access (an iterator
    over a model's variables): the layout is known up front, and the arrays are read and written one at a time.
    ``flat``: with ``specs``, ``flat(i, lo, hi)`` reads elements ``lo:hi`` of array ``i`` flattened (a model's
    :class:`~sparkdl_avg.shared.model.modelspec.VariableArrays`), and each array is written :data:`WRITE_BLOCK`
    elements at a time, never read whole (``arrays`` is not read).
    """
    if specs is None:
        arrays = [np.asarray(a) for a in arrays]
        specs = [(a.dtype, a.shape) for a in arrays]
    layout = _layout(specs)
    uri = join(directory, f"{name}-{uuid.uuid4().hex}.bin")
    fs, path = resolve(uri)
    local = isinstance(fs, pafs.LocalFileSystem)
    _make_directory(fs, os.path.dirname(path) if local else path.rsplit("/", 1)[0], local, parents, directory)
    sink = open(path, "wb") if local else fs.open_output_stream(path)
    with sink:
        written = 0
        arrays = iter(arrays)
        # Not zip(arrays, layout): zip keeps its last tuple, and with it the array written last, while it reads the
        # next one (a model's variable read on access is a fresh copy: two arrays where one is written).
        for i, (dtype, shape, offset) in enumerate(layout):
            if flat is not None:
                if offset > written:
                    sink.write(b"\0" * (offset - written))
                size = int(np.prod(shape, dtype=np.int64))
                for lo in range(0, size, WRITE_BLOCK):
                    block = np.ascontiguousarray(flat(i, lo, min(size, lo + WRITE_BLOCK)))
                    if block.dtype != dtype:
                        raise ValueError(f"An array of {block.dtype} to write where its layout says {dtype} {shape}.")
                    sink.write(block.view(np.uint8).data)
                written = offset + size * dtype.itemsize
                continue
            a = next(arrays)
            # Not np.ascontiguousarray: it turns 0-d arrays (counters) into 1-d ones.
            a = np.asarray(a) if np.asarray(a).flags.c_contiguous else np.array(a, order="C")
            if a.dtype != dtype or tuple(a.shape) != shape:
                raise ValueError(f"An array of {a.dtype} {tuple(a.shape)} to write where its layout says {dtype} {shape}.")
            if offset > written:
                sink.write(b"\0" * (offset - written))
            # reshape(-1) gives 0-d arrays (counters) a 1-d buffer; bytes because the
            # buffer protocol refuses extension dtypes (bfloat16).
            sink.write(a.reshape(-1).view(np.uint8).data)
            written = offset + a.nbytes
            del a  # (the loop variable would hold it while the next is read)
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


def release_pages(arrays) -> None:
    """Drops the pages of ``arrays`` that lie in a read-only memory map (:func:`load`) from this process's memory.

    The data stay in the page cache and read back as they were if touched again (``MADV_DONTNEED`` on a shared file
    mapping); a worker that has copied the round's state into its replica releases each array so the mapped file does
    not stay resident beside the replica. Other arrays are left alone.
    """
    import mmap

    for a in arrays:
        if not isinstance(a, np.ndarray) or not a.nbytes:
            continue
        # A slice or view of a np.memmap is a np.memmap whose ``base`` is its parent array, not the mmap:
        # the mmap is its ``_mmap`` (numpy keeps it on every view), found up the chain of bases.
        view, mm = a, None
        while isinstance(view, np.ndarray) and mm is None:
            mm = getattr(view, "_mmap", None)
            view = view.base
        if not isinstance(mm, mmap.mmap) or mm.closed:
            continue
        origin = np.frombuffer(mm, np.uint8)  # the mapping's first byte (a read-only export, let go below)
        start = a.__array_interface__["data"][0] - origin.__array_interface__["data"][0]
        del origin
        if start < 0 or start >= len(mm):
            continue
        lo = start // mmap.PAGESIZE * mmap.PAGESIZE
        hi = min(len(mm), start + a.nbytes)
        try:
            mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        except (AttributeError, OSError, ValueError):  # no madvise here (not Linux): the pages stay
            return


def load_one_by_one(stored: StoredArrays):
    """Yields the arrays of ``stored`` one at a time, each a new writable array read from the file.

    For whoever consumes them one by one (the driver adding a worker's sums): at most one array is in memory beyond
    what the consumer keeps, where a memory map of the whole file (:func:`load`) stays resident until its last view
    goes. Remote files are read whole (:func:`load`), then copied array by array.
    """
    fs, path = resolve(stored.uri)
    if not isinstance(fs, pafs.LocalFileSystem):
        for a in load(stored):
            yield np.array(a)
        return
    with open(path, "rb") as f:
        for dtype, shape, offset in stored.layout:
            f.seek(offset)
            out = np.empty(shape, dtype)
            # through a uint8 view: the buffer protocol refuses extension dtypes (bfloat16)
            f.readinto(memoryview(out.reshape(-1).view(np.uint8)))
            yield out


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
    directory: str, name: str, weights: Sequence[np.ndarray], optimizer: Optional[Sequence[np.ndarray]],
    parents: bool = True,
) -> StoredState:
    """Writes weights and optimizer variables (or ``None``) to one new file under ``directory`` (``parents``: :func:`store`'s)."""
    # one array at a time from the sequences themselves: a model's variables (VariableArrays) are read as written
    specs = specs_of(weights) + specs_of(optimizer)
    arrays = itertools.chain(weights, optimizer if optimizer is not None else ())
    # read by blocks where both are a model's variables (flat): the driver's round state, no array read whole
    readers = [getattr(part, "flat", None) for part in (weights, optimizer) if part is not None]
    flat = None
    if all(callable(r) for r in readers):
        n = len(weights)
        flat = lambda i, lo, hi: readers[0](i, lo, hi) if i < n else readers[1](i - n, lo, hi)  # noqa: E731
    return StoredState(store(directory, name, arrays, parents, specs, flat), len(weights), optimizer is not None)


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


def _delta_of(result):
    """The one worker's compressed delta a result carries (``None``: it sends none)."""
    return result.deltas[0][1] if result.deltas else None


@dataclass(frozen=True)
class ReturnSums:
    """Workers return their sums as Spark task results.

    Attributes:
        deltas: Under ``update_compression`` the round's :class:`~sparkdl_avg.shared.wire.delta_sums.DeltaLayout`:
            workers send compressed deltas in its format (``None``: float32 sums).
    """

    deltas: Any = None

    def deliver(self, result, name: str):
        packed = _delta_of(result)
        if packed is not None:
            worker = result.workers[0].worker
            return dataclasses.replace(result, deltas=[(worker, self.deltas.shard_bytes(packed, 0, 1))])
        return result


@dataclass(frozen=True)
class StoredResult:
    """A worker's result without its array sums, and the file holding them (``None``: it had no examples)."""

    result: Any
    sums: Any  # a StoredState; a StoredArrays of one byte array (a compressed delta); None


@dataclass(frozen=True)
class StoreSums:
    """Workers write their weight and optimizer sums to a file of their own under ``directory``.

    ``deltas``: as :class:`ReturnSums`'; the file then holds the worker's compressed delta as one byte array.
    """

    directory: str
    deltas: Any = None

    #: Writes sums read on access (:class:`~sparkdl_avg.shared.wire.aggregation.WeightedArrays`) one array at a time.
    streams = True

    def deliver(self, result, name: str) -> StoredResult:
        packed = _delta_of(result)
        if packed is not None:
            data = np.frombuffer(self.deltas.shard_bytes(packed, 0, 1), np.uint8)
            return StoredResult(dataclasses.replace(result, deltas=None),
                                store(self.directory, name, [data], parents=False))
        if result.weight_sums is None:
            return StoredResult(result, None)
        stored = store_state(self.directory, name, result.weight_sums, result.optimizer_sums, parents=False)
        return StoredResult(dataclasses.replace(result, weight_sums=None, optimizer_sums=None), stored)


# ---------------------------------------------- the Spark SQL round's formats


@dataclass(frozen=True)
class StoredSpec:
    """A :class:`~sparkdl_avg.shared.model.modelspec.ModelSpec` in a file: how the Spark SQL round ships the model.

    Read only when an executor builds a replica (cached by ``fingerprint``): written once, rounds carry 100 bytes.
    """

    uri: str
    fingerprint: str

    @property
    def value(self):
        import pickle

        from ..files.fs import read_bytes

        # Our own file under the fit's staging directory, as trusted as a broadcast.
        return pickle.loads(read_bytes(self.uri))


def store_spec(directory: str, spec) -> StoredSpec:
    """Writes ``spec`` to a new file under ``directory``."""
    import pickle

    from ..files.fs import write_atomically

    uri = join(directory, f"spec-{spec.fingerprint[:16]}-{uuid.uuid4().hex[:8]}.pkl")
    write_atomically(uri, pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL))
    return StoredSpec(uri, spec.fingerprint)


class SumsLayout(Protocol):
    """How a round's sums travel and add up, plain (:class:`FlatLayout`) or compressed (``DeltaLayout``).

    Every aggregation path writes its assembly once against this protocol: a worker's result becomes one value
    (:meth:`encode`) cut into shards (:meth:`value_bytes`) or written to a file (:meth:`store_file`, read back by
    :meth:`read_shard`); whoever sums adds the workers' shards in worker order (:meth:`add`, ``acc`` ``None`` first), a
    summed shard travels as :meth:`summed_bytes` (:meth:`parse_summed` reads it), and the driver joins the summed shards
    into ``(weight sums, optimizer sums)`` (:meth:`sums`).
    """

    compressed: bool  # sums of deltas (update_compression), not of states
    nbytes: int  # one worker's sums on the wire

    def encode(self, result) -> Any: ...
    def value_bytes(self, encoded, shard: int, shards: int) -> bytes: ...
    def store_file(self, directory: str, name: str, encoded, shards: int) -> Tuple[str, List[int]]: ...
    def read_shard(self, uri: str, offsets: Sequence[int], shard: int, shards: int) -> Any: ...
    def add(self, acc, data, shard: int = 0, shards: int = 1) -> Any: ...
    def summed_bytes(self, acc, shard: int = 0, shards: int = 1) -> bytes: ...
    def parse_summed(self, data, shard: int, shards: int) -> Any: ...
    def sums(self, shard_sums) -> Tuple[List[np.ndarray], Optional[List[np.ndarray]]]: ...


@dataclass(frozen=True)
class FlatLayout:
    """How a worker's sums lie in two flat vectors, one float32 and one float64, and how those split into shards.

    The Spark SQL round moves sums as raw bytes: the weight sums then the optimizer sums, float32 arrays back to back
    in one vector and the rest (float64, counters) in another (:func:`~sparkdl_avg.shared.wire.aggregation.weighted`
    makes every sum one of the two). Shard ``j`` of ``S`` is the ``j``-th of ``S`` near-equal slices of each vector,
    so summing shard ``j`` of every worker in worker order gives exactly the elements a whole-vector sum would.

    Attributes:
        entries: ``(is_float32, shape)`` per array, weights first.
        num_weights: How many of the entries are weights.
        optimizer: Whether the optimizer variables follow.
    """

    entries: Tuple[Tuple[bool, Tuple[int, ...]], ...]
    num_weights: int
    optimizer: bool

    compressed = False  # a DeltaLayout (update_compression) says True

    @classmethod
    def of(cls, weights: Sequence[np.ndarray], optimizer: Optional[Sequence[np.ndarray]]) -> "FlatLayout":
        """The layout of the sums of a state ``(weights, optimizer variables or None)``."""
        entries = tuple((dtype == np.float32, shape) for dtype, shape in specs_of(weights) + specs_of(optimizer))
        return cls(entries, len(weights), optimizer is not None)

    @property
    def sizes(self) -> Tuple[int, int]:
        """Elements of the float32 and of the float64 vector."""
        n32 = sum(int(np.prod(s)) for f32, s in self.entries if f32)
        n64 = sum(int(np.prod(s)) for f32, s in self.entries if not f32)
        return n32, n64

    @property
    def nbytes(self) -> int:
        """Bytes of one worker's sums (one model's state in sum dtypes)."""
        n32, n64 = self.sizes
        return 4 * n32 + 8 * n64

    def flatten(self, weights: Sequence[np.ndarray], optimizer: Optional[Sequence[np.ndarray]]) -> Tuple[np.ndarray, np.ndarray]:
        """The two vectors of a worker's sums."""
        arrays = list(weights) + list(optimizer or [])
        if len(arrays) != len(self.entries):
            raise ValueError(f"The sums hold {len(arrays)} arrays; their layout has {len(self.entries)}.")
        f32 = [np.ravel(a) for a, (is32, _) in zip(arrays, self.entries) if is32]
        f64 = [np.ravel(a) for a, (is32, _) in zip(arrays, self.entries) if not is32]
        return (
            np.concatenate(f32).astype(np.float32, copy=False) if f32 else np.zeros(0, np.float32),
            np.concatenate(f64).astype(np.float64, copy=False) if f64 else np.zeros(0, np.float64),
        )

    def unflatten(self, f32: np.ndarray, f64: np.ndarray) -> Tuple[List[np.ndarray], Optional[List[np.ndarray]]]:
        """``(weight sums, optimizer sums or None)`` from the two vectors (views into them)."""
        out, i32, i64 = [], 0, 0
        for is32, shape in self.entries:
            n = math.prod(shape)  # not np.prod: a round's sums unflatten in microseconds, not tens of them
            if is32:
                out.append(f32[i32 : i32 + n].reshape(shape))
                i32 += n
            else:
                out.append(f64[i64 : i64 + n].reshape(shape))
                i64 += n
        return out[: self.num_weights], (out[self.num_weights :] if self.optimizer else None)

    def bounds(self, shard: int, shards: int) -> Tuple[Tuple[int, int], Tuple[int, int]]:
        """``((lo, hi) of the float32 vector, (lo, hi) of the float64 vector)`` of shard ``shard``."""
        n32, n64 = self.sizes
        return (n32 * shard // shards, n32 * (shard + 1) // shards), (n64 * shard // shards, n64 * (shard + 1) // shards)

    def shard_bytes(self, f32: np.ndarray, f64: np.ndarray, shard: int, shards: int) -> bytes:
        """Shard ``shard`` of the two vectors as one value: its float32 slice, then its float64 slice."""
        (a, b), (c, d) = self.bounds(shard, shards)
        if shards == 1:
            return f32.tobytes() + f64.tobytes()
        return f32[a:b].tobytes() + f64[c:d].tobytes()

    def parse_shard(self, data, shard: int, shards: int) -> Tuple[np.ndarray, np.ndarray]:
        """The two slices of a :meth:`shard_bytes` value (read-only views)."""
        (a, b), (c, d) = self.bounds(shard, shards)
        buf = memoryview(data)
        return (
            np.frombuffer(buf, np.float32, count=b - a),
            np.frombuffer(buf, np.float64, count=d - c, offset=4 * (b - a)),
        )

    def join(self, pieces: Sequence[Tuple[np.ndarray, np.ndarray]]) -> Tuple[List[np.ndarray], Optional[List[np.ndarray]]]:
        """The sums from every shard's two slices, in shard order (a single writable piece is used as it is)."""
        if len(pieces) > 1:
            return self.unflatten(np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces]))
        f32, f64 = pieces[0]
        return self.unflatten(*(a if a.flags.writeable else np.array(a) for a in (f32, f64)))

    # ------------------------------------------- the sums' protocol (SumsLayout)

    def encode(self, result) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """What a worker's result sends: its sums' two vectors (``None``: it has none)."""
        return None if result.weight_sums is None else self.flatten(result.weight_sums, result.optimizer_sums)

    def value_bytes(self, encoded, shard: int, shards: int) -> bytes:
        """Shard ``shard`` of an :meth:`encode` value as one value (:meth:`shard_bytes`)."""
        return self.shard_bytes(encoded[0], encoded[1], shard, shards)

    def store_file(self, directory: str, name: str, encoded, shards: int) -> Tuple[str, List[int]]:
        """Writes an :meth:`encode` value to a new file; returns its URI and the two vectors' byte offsets."""
        stored = store(directory, name, list(encoded), parents=False)  # a worker's: see store()
        return stored.uri, [offset for _, _, offset in stored.layout]

    def read_shard(self, uri: str, offsets: Sequence[int], shard: int, shards: int) -> Tuple[np.ndarray, np.ndarray]:
        """Shard ``shard`` of the two vectors in a :meth:`store_file` file (the whole file: a memory map if local)."""
        n32, n64 = self.sizes
        off32, off64 = offsets
        if shards == 1:
            return tuple(load(StoredArrays(uri, ((np.dtype(np.float32), (n32,), off32),
                                                 (np.dtype(np.float64), (n64,), off64)))))
        (a, b), (c, d) = self.bounds(shard, shards)
        return (np.frombuffer(read_range(uri, off32 + 4 * a, 4 * (b - a)), np.float32),
                np.frombuffer(read_range(uri, off64 + 8 * c, 8 * (d - c)), np.float64))

    def add(self, acc: Optional[Tuple[np.ndarray, np.ndarray]], data, shard: int = 0, shards: int = 1):
        """``acc +`` a worker's shard (a :meth:`value_bytes` value or :meth:`read_shard`'s slices), in place.

        ``acc`` ``None``: a copy of the shard (no zeros added first: ``-0.0`` stays ``-0.0``).
        """
        return add_slices(acc, data if isinstance(data, tuple) else self.parse_shard(data, shard, shards))

    def summed_bytes(self, acc, shard: int = 0, shards: int = 1) -> bytes:
        """A summed shard as one value, as :meth:`shard_bytes` lays it out (``acc`` ``None``: zeros)."""
        if acc is None:
            (a, b), (c, d) = self.bounds(shard, shards)
            acc = (np.zeros(b - a, np.float32), np.zeros(d - c, np.float64))
        return acc[0].tobytes() + acc[1].tobytes()

    def parse_summed(self, data, shard: int, shards: int) -> Tuple[np.ndarray, np.ndarray]:
        """The sums a :meth:`summed_bytes` value holds (read-only views)."""
        return self.parse_shard(data, shard, shards)

    def sums(self, shard_sums: Sequence[Tuple[np.ndarray, np.ndarray]]) -> Tuple[List[np.ndarray], Optional[List[np.ndarray]]]:
        """``(weight sums, optimizer sums or None)`` from every shard's sums, in shard order (:meth:`join`)."""
        return self.join(shard_sums)


def add_slices(acc: Optional[Tuple[np.ndarray, np.ndarray]], part: Tuple[np.ndarray, np.ndarray]):
    """``acc + part`` element-wise, in place in ``acc`` (a copy of ``part`` when ``acc`` is ``None``)."""
    if acc is None:
        return np.array(part[0]), np.array(part[1])
    np.add(acc[0], part[0], out=acc[0])
    np.add(acc[1], part[1], out=acc[1])
    return acc


def read_range(uri: str, offset: int, nbytes: int) -> bytes:
    """``nbytes`` bytes of the file at ``uri`` from ``offset`` (a ranged read on object stores)."""
    fs, path = resolve(uri)
    if nbytes == 0:
        return b""
    with fs.open_input_file(path) as f:
        return f.read_at(nbytes, offset)


# The Spark SQL round's rows moved to round_rows; the name the round protocol's tests read here keeps working.
from .round_rows import round_arrow_schema  # noqa: E402,F401
