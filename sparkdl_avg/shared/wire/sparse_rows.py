"""Rounds that carry what changed: a worker sends only the rows of its embedding tables that moved, with their indices.

A round that trains on a few thousand ids moves a few thousand rows of a table of millions (``Embedding``: its
gradients are ``IndexedSlices``), yet the plain round sends ``n · w`` for the whole table. Under this layout a worker
sends its **delta** from the state the round sent it (like ``update_compression``,
:mod:`sparkdl_avg.shared.wire.delta_sums`), and for each *table* (an ``Embedding``'s matrix with its row-shaped
optimizer variables, :func:`table_groups`) only the rows whose delta is non-zero in the matrix or in any of its
averaged slots, as ``int32`` indices and float32 values; every other variable travels as before (float32 deltas, or in
the ``update_compression`` codec). Whoever sums adds ``n · delta`` of those rows into a float32 sum in worker order,
exactly what a dense sum of deltas adds there (a row left out has a delta of exactly zero, and adding ``+0.0`` to a sum
that started at ``+0.0`` changes no bit), so every aggregation path gives bitwise the same sums as a dense float32 sum.

**Which rows.** The exact criterion is "the delta is non-zero", checked on the worker by comparing the table and its
slots with what was sent (one pass over the table, no bookkeeping of ids). With Adam or momentum a row touched in an
earlier round keeps moving (its moments are non-zero) and is sent; a row whose every value is bitwise unchanged is not.

**Fallback.** Per table, per worker and round: when the changed rows' bytes (indices and values) would reach the
table's dense bytes, the table goes dense (all its rows, no indices), same values, same sums. So the layout is
automatic: on whenever the model has a table, never more bytes than dense.

**Compression.** Under ``update_compression`` the non-table variables go through the codec's
:class:`~sparkdl_avg.shared.wire.delta_sums.DeltaLayout` (with its error feedback); the tables' changed rows travel
exact in float32 (a residual over a whole table would make every row non-zero the next round).

**Shards.** Shard ``j`` of ``S`` holds the inner (non-table) layout's shard ``j`` and rows ``[R·j/S, R·(j+1)/S)`` of
each table of ``R`` rows. A worker's shard value: ``n`` (int64), the inner part's byte length (int64) and bytes, then
per table its row count (int64; ``-1``: dense) and ``int32`` indices (from the shard's first row) padded to 8 bytes,
then the float32 values (rows × arrays × row width). A summed shard: the inner summed bytes' length and bytes, then per
table the rows any worker sent, in the same form.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from .delta_sums import DeltaLayout
from .exchange import FlatLayout, release_pages

_I64 = 8


#: Rows a table needs to travel by rows: a smaller one (a text model's vocabulary of a few dozen words) gains
#: nothing worth changing its model's sums from ``n · w`` to deltas, so its model keeps the plain round.
MIN_TABLE_ROWS = 1024


def table_groups(model, optimizer_sums: bool) -> Tuple[Tuple[int, ...], ...]:
    """Positions, among a state's arrays (weights, then optimizer variables), of each table and its row-shaped slots.

    A table is the matrix of a ``keras.layers.Embedding`` (or a subclass) that is trainable, float32 and at least
    :data:`MIN_TABLE_ROWS` rows; its slots are the optimizer variables Keras made from it
    (``add_variable_from_reference``: same shape, a path holding the table's path with ``/`` as ``_``), listed only
    when the optimizer's variables are averaged (``optimizer_sums``).
    """
    layers = getattr(model, "_flatten_layers", None)
    layers = list(layers(include_self=False, recursive=True)) if layers else list(getattr(model, "layers", []))
    weights = list(model.weights)
    opt_vars = list(model.optimizer.variables) if optimizer_sums else []
    groups = []
    for layer in layers:
        if not any(cls.__name__ == "Embedding" for cls in type(layer).__mro__):
            continue
        table = getattr(layer, "embeddings", None)
        at = next((i for i, w in enumerate(weights) if w is table), None)
        if (at is None or not table.trainable or str(table.dtype) != "float32" or len(table.shape) < 2
                or table.shape[0] < MIN_TABLE_ROWS):
            continue
        stem = str(table.path).replace("/", "_")
        slots = [len(weights) + i for i, v in enumerate(opt_vars)
                 if tuple(v.shape) == tuple(table.shape) and stem in str(v.path) and str(v.dtype) == "float32"]
        groups.append((at, *slots))
    return tuple(groups)


def _pad8(n: int) -> int:
    return -(-n // 8) * 8


def _zeros_by_page(shape) -> np.ndarray:
    """float32 zeros whose memory becomes resident one 4 KiB page at a time, as rows are added into it.

    ``np.zeros`` of a large array asks the kernel for huge pages (numpy's ``madvise(MADV_HUGEPAGE)``): adding a few
    hundred rows scattered over a table's sums then made all of it resident, 2 MiB for each row. An anonymous map
    without huge pages reads as zeros and holds only the pages written.
    """
    import mmap

    nbytes = int(np.prod(shape, dtype=np.int64)) * 4
    if nbytes < 1 << 22:
        return np.zeros(shape, np.float32)
    pages = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        pages.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(pages, np.float32).reshape(shape)


class RowSums(np.ndarray):
    """A table's sums (a float32 array, zero where no worker sent a row) that knows which rows any worker sent.

    ``rows``: those rows, sorted. Every other row's sum is exactly ``+0.0``, and its mean moves nothing: the driver's
    update computes and writes these rows alone (:func:`~sparkdl_avg.driver.fit.update.means_as`), so neither the
    rest of the sums (pages never written: :func:`_zeros_by_page`) nor the rest of the table is read or written.
    An array made from it (a view, ``x / n``) is a plain one (its ``rows`` is ``None``).
    """

    rows: Optional[np.ndarray] = None

    @classmethod
    def of(cls, array: np.ndarray, rows: np.ndarray) -> "RowSums":
        out = array.view(cls)
        out.rows = rows
        return out

    def __array_finalize__(self, obj) -> None:
        self.rows = None


@dataclass(frozen=True)
class RowsPacked:
    """One worker's round: its examples, the non-table part and per table ``(indices or None: dense, values)``.

    ``values``: float32, ``(rows, arrays, row width)``; ``indices``: sorted int32 rows of the table.
    """

    examples: int
    inner: Any  # a delta_sums.Packed (compressed) or (float32 delta, n · float64 delta)
    tables: Tuple[Tuple[Optional[np.ndarray], np.ndarray], ...]
    nbytes: int = 0  # bytes of the whole value on the wire (shard_bytes(…, 0, 1))


@dataclass(frozen=True)
class SparseRowsLayout:
    """The sums' layout (``SumsLayout``) of a round whose model has tables: sums of deltas, tables by changed rows.

    Attributes:
        flat: The whole state's :class:`~sparkdl_avg.shared.wire.exchange.FlatLayout`.
        groups: Per table, its position among ``flat.entries`` and its slots' (:func:`table_groups`).
        compression: ``update_compression`` for the non-table variables (``None``: float32 deltas).
        feedback: As :class:`~sparkdl_avg.shared.wire.delta_sums.DeltaLayout`'s (non-table variables only).
        moments: Positions of the optimizer's first moments among its variables.
    """

    flat: FlatLayout
    groups: Tuple[Tuple[int, ...], ...]
    compression: Optional[str] = None
    feedback: Tuple[bool, ...] = ()
    moments: Tuple[int, ...] = ()

    compressed = True  # sums of deltas: every path treats it as it treats a DeltaLayout

    def __post_init__(self) -> None:
        for group in self.groups:
            shapes = {self.flat.entries[i][1] for i in group}
            if len(shapes) != 1 or not all(self.flat.entries[i][0] for i in group):
                raise ValueError(f"a table's arrays must be float32 of one shape; got entries {group}")

    # ------------------------------------------------------------ structure

    @cached_property
    def rest(self) -> Tuple[int, ...]:
        """Positions of the non-table arrays."""
        taken = {i for g in self.groups for i in g}
        return tuple(i for i in range(len(self.flat.entries)) if i not in taken)

    @cached_property
    def rest_flat(self) -> FlatLayout:
        entries = tuple(self.flat.entries[i] for i in self.rest)
        weights = sum(1 for i in self.rest if i < self.flat.num_weights)
        return FlatLayout(entries, weights, len(entries) > weights)

    @cached_property
    def inner(self) -> Optional[DeltaLayout]:
        """The non-table variables' compressed layout (``None``: uncompressed float32 deltas)."""
        if not self.compression:
            return None
        opt_rest = [i - self.flat.num_weights for i in self.rest if i >= self.flat.num_weights]
        moments = tuple(k for k, i in enumerate(opt_rest) if i in self.moments)
        return DeltaLayout(self.rest_flat, self.compression, self.feedback, moments)

    @cached_property
    def shapes(self) -> Tuple[Tuple[int, int, int], ...]:
        """Per table: ``(rows, arrays, values per row)``."""
        out = []
        for g in self.groups:
            shape = self.flat.entries[g[0]][1]
            out.append((int(shape[0]), len(g), int(np.prod(shape[1:]))))
        return tuple(out)

    @staticmethod
    def _rows(rows: int, shard: int, shards: int) -> Tuple[int, int]:
        return rows * shard // shards, rows * (shard + 1) // shards

    # ----------------------------------------- what the round's plan and the worker's residuals read

    @property
    def nbytes(self) -> int:
        """Bytes of one worker's delta at most (every table dense): what a round's plan sizes."""
        inner = self.inner.nbytes if self.inner is not None else self.rest_flat.nbytes
        return 2 * _I64 + inner + sum(_I64 + 4 * r * k * w for r, k, w in self.shapes)

    @property
    def keeps_residuals(self) -> bool:
        return self.inner is not None and self.inner.keeps_residuals

    @property
    def sizes(self):
        return self.inner.sizes if self.inner is not None else ()

    @property
    def codecs(self):
        return self.inner.codecs if self.inner is not None else ()

    @property
    def adaptive(self):
        return self.inner.adaptive if self.inner is not None else ()

    def residual_bytes(self, residual) -> bytes:
        return self.inner.residual_bytes(residual)

    def read_residual(self, data):
        return self.inner.read_residual(data)

    # -------------------------------------------------------------- worker side

    def pack(self, weights, optimizer, sent_weights, sent_optimizer, examples: int, residual, thresholds=None):
        """A worker's :class:`RowsPacked` from the state it was sent, and its next residual (``None``: no feedback);
        ``residual``, ``thresholds``: the non-table variables' (:meth:`DeltaLayout.pack`)."""
        # indexed, not listed: a replica's VariableArrays are read one array at a time
        new, old = _Joined(weights, optimizer), _Joined(sent_weights, sent_optimizer)
        if len(new) != len(self.flat.entries) or len(old) != len(self.flat.entries):
            raise ValueError(f"The state holds {len(new)} arrays; its layout has {len(self.flat.entries)}.")
        new_rest, old_rest = [new[i] for i in self.rest], [old[i] for i in self.rest]
        kept = None
        if self.inner is not None:
            inner, kept = self.inner.pack(new_rest, None, old_rest, None, examples, residual, thresholds=thresholds)
        else:
            a32, a64 = self.rest_flat.flatten(new_rest, None)
            b32, b64 = self.rest_flat.flatten(old_rest, None)
            d64 = np.subtract(a64, b64, dtype=np.float64)
            d64 *= np.float64(examples)
            inner = (np.subtract(a32, b32, dtype=np.float32), d64)
        tables = tuple(changed_rows(_Joined.picked(new, g), _Joined.picked(old, g)) for g in self.groups)
        inner_bytes = self.inner.nbytes if self.inner is not None else self.rest_flat.nbytes
        tables_bytes = sum(_I64 + (4 * r * k * w if idx is None else _pad8(4 * idx.size) + 4 * idx.size * k * w)
                           for (r, k, w), (idx, _) in zip(self.shapes, tables))
        return RowsPacked(int(examples), inner, tables, 2 * _I64 + inner_bytes + tables_bytes), kept

    def shard_bytes(self, packed: RowsPacked, shard: int, shards: int) -> bytes:
        """Shard ``shard`` of ``S`` of a worker's round as one value (the module's format)."""
        if self.inner is not None:
            inner = self.inner.shard_bytes(packed.inner, shard, shards)
        else:
            inner = self.rest_flat.shard_bytes(packed.inner[0], packed.inner[1], shard, shards)
        pieces = [np.int64(packed.examples).tobytes(), np.int64(len(inner)).tobytes(), inner]
        for (rows, _, _), (idx, values) in zip(self.shapes, packed.tables):
            lo, hi = self._rows(rows, shard, shards)
            if idx is None:
                pieces += [np.int64(-1).tobytes(), values[lo:hi].tobytes()]
                continue
            a, b = np.searchsorted(idx, [lo, hi])
            local = (idx[a:b] - lo).astype(np.int32)
            pieces += [np.int64(b - a).tobytes(), local.tobytes(), b"\0" * (_pad8(local.nbytes) - local.nbytes),
                       values[a:b].tobytes()]
        return b"".join(pieces)

    def _parse_tables(self, buf: memoryview, offset: int, shard: int, shards: int):
        out = []
        for rows, k, w in self.shapes:
            lo, hi = self._rows(rows, shard, shards)
            count = int(np.frombuffer(buf, np.int64, count=1, offset=offset)[0])
            offset += _I64
            if count < 0:
                idx, count = None, hi - lo
            else:
                idx = np.frombuffer(buf, np.int32, count=count, offset=offset)
                offset += _pad8(4 * count)
            values = np.frombuffer(buf, np.float32, count=count * k * w, offset=offset).reshape(count, k, w)
            offset += 4 * count * k * w
            out.append((idx, values))
        if offset != len(buf):
            raise ValueError(f"a sparse-rows shard of {len(buf)} bytes does not match its layout ({offset} bytes)")
        return out

    # ----------------------------------------------------------------- the sum

    def add(self, acc, data, shard: int = 0, shards: int = 1):
        """``acc + n · delta`` of a worker's shard value, in place (``None``: zeros first); float32, as dense."""
        buf = memoryview(data)
        examples = int(np.frombuffer(buf, np.int64, count=1)[0])
        size = int(np.frombuffer(buf, np.int64, count=1, offset=_I64)[0])
        inner = buf[2 * _I64:2 * _I64 + size]
        acc = self.empty(shard, shards) if acc is None else acc
        if self.inner is not None:
            self.inner.add(acc[0], inner, shard, shards)
        else:
            d32, d64 = self.rest_flat.parse_shard(inner, shard, shards)
            values = d32 * np.float32(examples)
            np.add(acc[0][0], values, out=acc[0][0])
            np.add(acc[0][1], d64, out=acc[0][1])
        weight = np.float32(examples)
        for (sums, touched), (idx, values) in zip(acc[1], self._parse_tables(buf, 2 * _I64 + size, shard, shards)):
            scaled = values * weight
            if idx is None:
                for k, total in enumerate(sums):
                    np.add(total, scaled[:, k], out=total)
                touched[:] = True
            else:  # indices are unique within a worker's shard: a fancy += adds each row once
                for k, total in enumerate(sums):
                    total[idx] += scaled[:, k]
                touched[idx] = True
        return acc

    def empty(self, shard: int, shards: int):
        """Zero sums of shard ``shard``: the inner part's, then per table ``([sums (rows, width)] per array, touched rows)``."""
        if self.inner is not None:
            inner = self.inner.empty(shard, shards)
        else:
            (a, b), (c, d) = self.rest_flat.bounds(shard, shards)
            inner = (np.zeros(b - a, np.float32), np.zeros(d - c, np.float64))
        tables = []
        for rows, k, w in self.shapes:
            lo, hi = self._rows(rows, shard, shards)
            # one array per table array (not (rows, arrays, width)): the driver's sums are then views, no copy
            tables.append(([_zeros_by_page((hi - lo, w)) for _ in range(k)], np.zeros(hi - lo, bool)))
        return inner, tables

    def summed_bytes(self, acc, shard: int = 0, shards: int = 1) -> bytes:
        """A summed shard as one value: the inner summed bytes, then the rows any worker sent per table."""
        acc = self.empty(shard, shards) if acc is None else acc
        if self.inner is not None:
            inner = self.inner.summed_bytes(acc[0], shard, shards)
        else:
            inner = acc[0][0].tobytes() + acc[0][1].tobytes()
        pieces = [np.int64(0).tobytes(), np.int64(len(inner)).tobytes(), inner]
        for sums, touched in acc[1]:
            idx = np.flatnonzero(touched).astype(np.int32)
            pieces += [np.int64(idx.size).tobytes(), idx.tobytes(), b"\0" * (_pad8(idx.nbytes) - idx.nbytes),
                       np.stack([total[idx] for total in sums], axis=1).tobytes()]
        return b"".join(pieces)

    def parse_summed(self, data, shard: int, shards: int):
        """The sums a :meth:`summed_bytes` value holds, in :meth:`empty`'s form."""
        buf = memoryview(data)
        size = int(np.frombuffer(buf, np.int64, count=1, offset=_I64)[0])
        inner = buf[2 * _I64:2 * _I64 + size]
        if self.inner is not None:
            inner_acc = self.inner.parse_summed(inner, shard, shards)
        else:
            (a, b), (c, d) = self.rest_flat.bounds(shard, shards)
            inner_acc = (np.frombuffer(inner, np.float32, count=b - a),
                         np.frombuffer(inner, np.float64, count=d - c, offset=4 * (b - a)))
        acc = self.empty(shard, shards)
        for (sums, touched), (idx, values) in zip(acc[1], self._parse_tables(buf, 2 * _I64 + size, shard, shards)):
            for k, total in enumerate(sums):
                total[idx] = values[:, k]
            touched[idx] = True
        return inner_acc, acc[1]

    def delta_sums(self, shard_sums) -> Tuple[List[np.ndarray], Optional[List[np.ndarray]]]:
        """``(Σ n·Δweights, Σ n·Δoptimizer or None)`` from every shard's sums, in shard order."""
        if self.inner is not None:
            w, o = self.inner.delta_sums([s[0] for s in shard_sums])
            rest = list(w) + list(o or [])
        else:
            f32 = np.concatenate([s[0][0] for s in shard_sums])
            f64 = np.concatenate([s[0][1] for s in shard_sums])
            w, o = self.rest_flat.unflatten(f32, f64)
            rest = list(w) + list(o or [])
        out: List[Any] = [None] * len(self.flat.entries)
        for i, a in zip(self.rest, rest):
            out[i] = a
        for t, group in enumerate(self.groups):
            shape = self.flat.entries[group[0]][1]
            touched = [s[1][t][1] for s in shard_sums]
            rows = np.flatnonzero(touched[0] if len(touched) == 1 else np.concatenate(touched))
            for k, i in enumerate(group):
                parts = [s[1][t][0][k] for s in shard_sums]
                out[i] = RowSums.of((parts[0] if len(parts) == 1 else np.concatenate(parts)).reshape(shape), rows)
        n = self.flat.num_weights
        return out[:n], (out[n:] if self.flat.optimizer else None)

    sums = delta_sums

    # ----------------------------------------------- the wire (SumsLayout)

    @staticmethod
    def encode(result) -> Optional[RowsPacked]:
        return result.deltas[0][1] if result.deltas else None

    def value_bytes(self, encoded: RowsPacked, shard: int, shards: int) -> bytes:
        return self.shard_bytes(encoded, shard, shards)

    def file_bytes(self, packed: RowsPacked, shards: int) -> Tuple[bytes, List[int]]:
        blobs = [self.shard_bytes(packed, j, shards) for j in range(shards)]
        offsets = [0]
        for blob in blobs:
            offsets.append(offsets[-1] + len(blob))
        return b"".join(blobs), offsets

    def store_file(self, directory: str, name: str, encoded: RowsPacked, shards: int) -> Tuple[str, List[int]]:
        from .exchange import store

        data, starts = self.file_bytes(encoded, shards)
        stored = store(directory, name, [np.frombuffer(data, np.uint8)])
        return stored.uri, [stored.layout[0][2] + start for start in starts]

    read_shard = staticmethod(DeltaLayout.read_shard)


class _Joined:
    """Weights then optimizer variables (``None``: none) indexed as one sequence, each read only when indexed."""

    def __init__(self, first, second) -> None:
        self.first, self.second = first, (second if second is not None else ())
        self.split = len(self.first)

    def __len__(self) -> int:
        return self.split + len(self.second)

    def __getitem__(self, i: int):
        return self.first[i] if i < self.split else self.second[i - self.split]

    def reader(self, i: int):
        """``read(lo, hi)``: elements ``lo:hi`` of item ``i`` flattened (:func:`_reader`)."""
        return _reader(*((self.first, i) if i < self.split else (self.second, i - self.split)))

    @staticmethod
    def picked(seq, positions: Sequence[int]) -> "_Joined":
        """The items of ``seq`` at ``positions``, still read only when indexed."""
        return _Joined(_Picked(seq, positions), None)


class _Picked:
    def __init__(self, seq, positions: Sequence[int]) -> None:
        self.seq, self.positions = seq, tuple(positions)

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, k: int):
        return self.seq[self.positions[k]]

    def reader(self, k: int):
        return _reader(self.seq, self.positions[k])


def _reader(seq, i: int):
    """``read(lo, hi)``: elements ``lo:hi`` of ``seq[i]`` flattened, through ``seq.flat`` (a model's VariableArrays: a
    slice read of the variable, not a copy of it), else slices of ``seq[i]``, read once."""
    flat = getattr(seq, "flat", None)
    if callable(flat):
        return lambda lo, hi: flat(i, lo, hi)
    whole = np.asarray(seq[i]).reshape(-1)
    return lambda lo, hi: whole[lo:hi]


#: Elements of a table's array compared or subtracted at a time (:func:`changed_rows`): 4 MiB of float32.
ROW_BLOCK = 1 << 20


def changed_rows(new: Sequence[np.ndarray], old: Sequence[np.ndarray]) -> Tuple[Optional[np.ndarray], np.ndarray]:
    """``(indices, deltas)`` of the rows of a table and its slots whose delta is non-zero; ``(None, all)``: dense.

    ``new``/``old``: the table then its slots, one shape. Both are read a block of :data:`ROW_BLOCK` elements at a
    time (a replica's variables sliced as read, ``flat``; the sent state is a memory map whose pages are released
    after each block): the worker holds a block of each beside its replica, not a table's copy and its sent pages.
    Dense when the rows' indices and values would take as many bytes as the whole table.
    """
    rows = int(np.shape(old[0])[0])  # the sent arrays' shape: reading a replica's array for it would copy it
    count = len(new)
    width = int(np.prod(np.shape(old[0])[1:], dtype=np.int64))
    step = max(1, ROW_BLOCK // max(1, width))
    blocks = [(lo, min(rows, lo + step)) for lo in range(0, rows, step)]

    def walk(k, use):  # each block of array k of new and old, as (rows, width), then the old block's pages let go
        read = new.reader(k) if hasattr(new, "reader") else _reader(new, k)
        b = np.asarray(old[k]).reshape(rows, -1)
        for lo, hi in blocks:
            use(lo, hi, read(lo * width, hi * width).reshape(hi - lo, width), b[lo:hi])
            release_pages([b[lo:hi]])

    changed = np.zeros(rows, bool)
    for k in range(count):
        walk(k, lambda lo, hi, a, b: np.bitwise_or(changed[lo:hi], _moved(a, b), out=changed[lo:hi]))
    idx = np.flatnonzero(changed)
    dense = idx.size * (4 + 4 * width * count) >= 4 * rows * width * count
    values = np.empty((rows if dense else idx.size, count, width), np.float32)
    for k in range(count):  # each array read again: its delta, into the values (the same bits as a stack of them)
        if dense:
            walk(k, lambda lo, hi, a, b: np.subtract(a, b, out=values[lo:hi, k], dtype=np.float32))
        else:
            def rows_of(lo, hi, a, b):
                s, e = np.searchsorted(idx, (lo, hi))
                if e > s:
                    values[s:e, k] = np.subtract(a[idx[s:e] - lo], b[idx[s:e] - lo], dtype=np.float32)

            walk(k, rows_of)
    return (None, values) if dense else (idx.astype(np.int32), values)


def _moved(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row of two ``(rows, width)`` float32 arrays, whether any of its bits differ.

    Bitwise, not by value: a row whose ``0.0`` became ``-0.0`` (or a NaN another NaN) is sent too, with a delta of
    ``±0.0`` (or NaN), which adds to the sums exactly what the dense sum adds. The comparison runs on whole words of the
    rows and folds a row's flags by viewing them as one integer: numpy's ``.any(axis=1)`` over a float comparison is
    several times slower (docs/benchmarks/sparse_rounds.md).
    """
    x, y = np.ascontiguousarray(a), np.ascontiguousarray(b)
    word = np.uint64 if x.shape[1] % 2 == 0 else np.uint32
    ne = x.view(word) != y.view(word)  # (rows, words) bool
    for size, fold in ((8, np.uint64), (4, np.uint32), (2, np.uint16)):
        if ne.shape[1] % size == 0:
            ne = ne.view(fold)
            break
    return ne.any(axis=1) if ne.shape[1] > 1 else ne[:, 0] != 0
