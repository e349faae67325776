"""Compressed round sums (``update_compression``): a worker's delta on the wire, its shards' sums, its residual.

Under ``update_compression`` a worker does not send ``n · w`` (its weights, optimizer variables, example-weighted) but
its **delta** from the state the round sent it, in a codec of :mod:`sparkdl_avg.shared.wire.compression`, with its
example count ``n``; whoever sums (the driver, or reducer ``j`` of a sharded round) adds ``n · decode(delta)`` in
float32, in worker order, and the driver sets ``start + Σ/Σn``. This module owns that format, its sum and the residual
files of error feedback; the transports move its bytes (:mod:`sparkdl_avg.shared.wire.exchange`,
:mod:`sparkdl_avg.shared.wire.round_rows`, :mod:`sparkdl_avg.driver.transport`).

**Segments.** A worker's state is cut into four segments: ``"w"``, the float32 weights; ``"m"``, the optimizer's
float32 first moments (its variables named ``*_momentum``: :func:`first_moments`); ``"o"``, its other float32
variables (second moments, accumulators); ``"x"``, everything else (float64 weights, counters), sent as raw float64
``n · delta`` (a few values in practice). ``"int8"``, ``"int4"`` (Streaming DiLoCo's 4-bit outer gradients) and
``"topk"`` (SparseLoCo's sparse ones) send ``"w"`` in their codec and ``"m"`` and ``"o"`` in bf16 (:data:`SEGMENT_CODECS`
says why).

**Shards.** Shard ``j`` of ``S`` is the ``j``-th of ``S`` near-equal runs of each segment, cut at whole blocks of its
codec (int8's 256 values, int4's 128: whole bytes too), so a reducer decodes its shard alone and summing shard by shard
gives exactly the elements of a whole sum. A worker's shard is one ``bytes`` value: ``n`` (int64), the ``"x"`` slice
(float64), the scales of the segments that have them (int8, int4, topk, threshold: float32, in segment order), the
counts of threshold's chunks (uint16: what each sends, so its payload's length), then the payloads (bf16's uint16,
then int8's, int4's bytes of two values, the even index in the low nibble, topk's chunks, threshold's entries and
maps: a shard's slice of them packed as a payload of its own). A summed shard is the segments' float64 and float32
sums back to back. Every path (Spark's tree, the driver, the shuffle, the storage reducers, the files) adds with
:meth:`DeltaLayout.add` in worker order, so all give bitwise the same sums.

**Error feedback.** A worker adds its residual to its delta before encoding and keeps what the codec dropped
(:func:`~sparkdl_avg.shared.wire.compression.with_feedback`) in a file under the fit's staging directory, named by the
round's place in the fit and the worker (:class:`FeedbackFiles`): the next round's task for that worker, on whatever
executor, reads it; a retried task reads the same file and rewrites identical bytes, and a lost executor loses nothing
(Spark reruns its task, which reads the same file). Which segments keep a residual is the layout's ``feedback``
(``error_feedback``: by default those of the codecs with scales, bf16 measured equal to float32 without it). The
residual is stored in int8 whatever the segment's codec (1 byte a value and a scale per 256, not 4): what that drops is
the residual's own rounding, 1/254 of the residual, itself about 1/254 of the delta for int8, 1/14 for int4 and 1/512
for bf16. A ``"threshold"`` segment's worker also keeps its threshold ``τ`` there, first in the file (float32), and at
an epoch's first round every worker starts from the mean of the ``τ`` its peers kept
(:meth:`FeedbackFiles.mean_thresholds`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .compression import (BLOCK, BLOCKS, THRESHOLD_DENSITY, THRESHOLD_START, Encoded, Feedback, adapts, add_decoded,
                          block_of, decode, encode, is_counted, is_sparse, payload_count, payload_dtype,
                          with_feedback)
from .kept import WorkerRound, WorkerRoundFiles

#: ``update_compression`` values (``None``: float32 sums, as without this module).
COMPRESSIONS = ("bf16", "int8", "int4", "topk", "threshold")

#: Codecs of the compressed segments (``"w"``, ``"m"``, ``"o"``: see the module docstring) per ``update_compression``.
#: int8 on all of Adam's variables lost 0.025-0.031 accuracy and diverged with error feedback in the pre-study; int8 on
#: ``"m"`` alone matched float32 in fewer bytes, but its residual doubled the residual files and made the rounds on the
#: shaped-network cluster slower, so ``"m"`` stays in bf16 (docs/benchmarks/compression.md). ``"int4"`` follows int8.
SEGMENT_CODECS = {"bf16": ("bf16", "bf16", "bf16"), "int8": ("int8", "bf16", "bf16"),
                  "int4": ("int4", "bf16", "bf16"), "topk": ("topk", "bf16", "bf16"),
                  "threshold": ("threshold", "bf16", "bf16")}

_QUANTIZED = ("int8", "int4", "topk", "threshold")  # the codecs with scales, which keep a residual by default


def sparse_weights(compression: Optional[str]) -> bool:
    """Whether ``update_compression`` sends the weights' deltas sparse (``"topk"``, ``"threshold"``): only some
    entries a round, the rest in the worker's residual (:func:`~sparkdl_avg.shared.wire.compression.is_sparse`)."""
    return compression is not None and is_sparse(SEGMENT_CODECS[compression][0])


def segment_feedback(compression: str, error_feedback: Optional[bool]) -> Tuple[bool, ...]:
    """Which segments keep a residual: ``error_feedback=None`` those with scales (int8, int4, topk, threshold),
    ``True`` all, ``False`` none."""
    codecs = SEGMENT_CODECS[compression]
    if error_feedback is None:
        return tuple(codec in _QUANTIZED for codec in codecs)
    return (bool(error_feedback),) * len(codecs)


def first_moments(optimizer_variables) -> Tuple[int, ...]:
    """Positions of an optimizer's first moments among its variables: those whose path ends in ``_momentum``.

    Keras names them so in Adam, AdamW, Nadam, Adamax, RMSprop, SGD and Lion; they are signed and move like the
    weights. Every other variable (second moments, accumulators, custom optimizers' state) is the ``"o"`` segment.
    """
    return tuple(i for i, v in enumerate(optimizer_variables) if str(getattr(v, "path", "")).endswith("_momentum"))

_HEADER = 8  # int64 n
_PAYLOADS = ("bf16", "int8", "int4", "topk", "threshold")  # the payloads' order in a shard (older codecs' bytes kept)


def _bounds(size: int, codec: str, shard: int, shards: int) -> Tuple[int, int]:
    """``[lo, hi)`` of shard ``shard`` of a segment of ``size`` values (int8, int4: at whole blocks)."""
    unit = block_of(codec)
    units = -(-size // unit)
    return min(size, units * shard // shards * unit), min(size, units * (shard + 1) // shards * unit)


@dataclass(frozen=True)
class Packed:
    """One worker's compressed delta: its examples, the raw ``"x"`` segment (``n · delta``) and the encoded ones."""

    examples: int
    x: np.ndarray
    encoded: Tuple[Encoded, ...]


@dataclass(frozen=True)
class DeltaLayout:
    """How a worker's compressed delta lies in segments and shards, and how shards are summed.

    The transports tell it from an uncompressed :class:`~sparkdl_avg.shared.wire.exchange.FlatLayout` by
    :attr:`compressed`.

    Attributes:
        flat: The sums' :class:`~sparkdl_avg.shared.wire.exchange.FlatLayout` (the state's arrays).
        compression: One of :data:`COMPRESSIONS`.
        feedback: Per compressed segment (``"w"``, ``"m"``, ``"o"``), whether workers keep its residual
            (:func:`segment_feedback`).
        moments: Positions of the optimizer's first moments among its variables (:func:`first_moments`).
    """

    flat: Any
    compression: str
    feedback: Tuple[bool, ...]
    moments: Tuple[int, ...] = ()

    compressed = True

    def __post_init__(self) -> None:
        if self.compression not in SEGMENT_CODECS:
            raise ValueError(f"unknown update_compression {self.compression!r}; expected one of {COMPRESSIONS}")

    @property
    def keeps_residuals(self) -> bool:
        """Whether any segment keeps a residual (workers read and write residual files)."""
        return any(self.feedback)

    @property
    def codecs(self) -> Tuple[str, ...]:
        """Codecs of the compressed segments (``"w"``, ``"m"``, ``"o"``)."""
        return SEGMENT_CODECS[self.compression]

    def _segment_of(self, entry: int) -> int:
        """The compressed segment of a float32 entry of :attr:`flat`."""
        if entry < self.flat.num_weights:
            return 0
        return 1 if entry - self.flat.num_weights in self.moments else 2

    @cached_property  # read by every parse, add and sum: computed once per layout
    def sizes(self) -> Tuple[int, ...]:
        """Values of each compressed segment, then of ``"x"``."""
        out = [0] * len(self.codecs)
        for i, (f32, shape) in enumerate(self.flat.entries):
            if f32:
                out[self._segment_of(i)] += int(np.prod(shape))
        return (*out, self.flat.sizes[1])

    @property
    def nbytes(self) -> int:
        """Bytes of one worker's whole delta on the wire (what a round's plan sizes)."""
        return sum(self._blob_sizes(0, 1))

    # -------------------------------------------------------------- worker side

    def pack(self, weights, optimizer, sent_weights, sent_optimizer, examples: int,
             residual: Optional[List[Optional[Feedback]]],
             thresholds: Optional[Sequence[Optional[float]]] = None) -> Tuple[Packed, Optional[List[Optional[Feedback]]]]:
        """A worker's :class:`Packed` delta from the state it was sent, and what it keeps (``None``: no feedback).

        ``optimizer``/``sent_optimizer``: ``None`` when the optimizer is not averaged. ``residual``: the worker's
        :class:`~sparkdl_avg.shared.wire.compression.Feedback` per compressed segment (``None``: zero; an entry
        ``None``: a segment without feedback). ``thresholds``: per segment, the ``"threshold"`` codec's ``τ`` to start
        from instead of the worker's own (the workers' mean at an epoch's start, :meth:`FeedbackFiles.mean_thresholds`).
        """
        parts, x = self._deltas(weights, optimizer, sent_weights, sent_optimizer)
        x *= np.float64(examples)
        encoded, kept = [], []
        for i, (codec, part, feedback) in enumerate(zip(self.codecs, parts, self.feedback)):
            start = thresholds[i] if thresholds is not None else None
            if feedback:
                e, r = with_feedback(part, residual[i] if residual is not None else None, codec, threshold=start)
            else:
                e, r = encode(part, codec, threshold=start), None
            encoded.append(e)
            kept.append(r)
        return Packed(int(examples), x, tuple(encoded)), (kept if self.keeps_residuals else None)

    def _deltas(self, weights, optimizer, sent_weights, sent_optimizer) -> Tuple[List[np.ndarray], np.ndarray]:
        """``new − sent``: one float32 vector per compressed segment and the float64 ``"x"``, in entry order."""
        new = list(weights) + list(optimizer or [])
        old = list(sent_weights) + list(sent_optimizer or [])
        if len(new) != len(self.flat.entries) or len(old) != len(self.flat.entries):
            raise ValueError(f"The state holds {len(new)} arrays; its layout has {len(self.flat.entries)}.")
        sizes = self.sizes
        parts = [np.empty(n, np.float32) for n in sizes[:-1]]
        x = np.empty(sizes[-1], np.float64)
        at, ix = [0] * len(parts), 0
        for i, (a, b, (is32, shape)) in enumerate(zip(new, old, self.flat.entries)):
            n = int(np.prod(shape))
            if is32:
                seg = self._segment_of(i)
                np.subtract(np.ravel(a), np.ravel(b), out=parts[seg][at[seg]:at[seg] + n])
                at[seg] += n
            else:
                np.subtract(np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64), out=x[ix:ix + n])
                ix += n
        return parts, x

    def _blob_sizes(self, shard: int, shards: int) -> List[int]:
        sizes = [_HEADER]
        (xa, xb) = _bounds(self.sizes[-1], "f64", shard, shards)
        sizes.append(8 * (xb - xa))
        runs = self._runs(shard, shards)
        for (a, b), codec in zip(runs, self.codecs):
            sizes.append(4 * (-(-(b - a) // block_of(codec))) if codec in _QUANTIZED else 0)
        for (a, b), codec in zip(runs, self.codecs):
            sizes.append(2 * (-(-(b - a) // block_of(codec))) if is_counted(codec) else 0)
        for codec in _PAYLOADS:
            for (a, b), c in zip(runs, self.codecs):
                if c == codec:
                    sizes.append(payload_dtype(codec).itemsize * payload_count(codec, b - a,
                                                                                 counts=_expected_counts(c, b - a)))
        return sizes

    def shard_bytes(self, packed: Packed, shard: int, shards: int) -> bytes:
        """Shard ``shard`` of ``S`` of a worker's delta, as one value (the module's format)."""
        xa, xb = _bounds(self.sizes[-1], "f64", shard, shards)
        pieces = [np.int64(packed.examples).tobytes(), packed.x[xa:xb].tobytes()]
        runs = self._runs(shard, shards)
        slices = [e.slice(a, b) for e, (a, b) in zip(packed.encoded, runs)]
        pieces += [s.scales.tobytes() for s in slices if s.scales is not None]
        pieces += [s.counts.tobytes() for s in slices if s.counts is not None]
        for codec in _PAYLOADS:
            pieces += [s.payload.tobytes() for s in slices if s.codec == codec]
        return b"".join(pieces)

    def file_bytes(self, packed: Packed, shards: int) -> Tuple[bytes, List[int]]:
        """A worker's whole delta as one file: its shards back to back, and their ``S + 1`` offsets."""
        blobs = [self.shard_bytes(packed, j, shards) for j in range(shards)]
        offsets = [0]
        for blob in blobs:
            offsets.append(offsets[-1] + len(blob))
        return b"".join(blobs), offsets

    def parse(self, data, shard: int, shards: int) -> Packed:
        """The :class:`Packed` slice a :meth:`shard_bytes` value holds (views into ``data``)."""
        buf = memoryview(data)
        examples = int(np.frombuffer(buf, np.int64, count=1)[0])
        offset = _HEADER
        xa, xb = _bounds(self.sizes[-1], "f64", shard, shards)
        x = np.frombuffer(buf, np.float64, count=xb - xa, offset=offset)
        offset += 8 * (xb - xa)
        runs = self._runs(shard, shards)
        scales = {}
        for i, ((a, b), codec) in enumerate(zip(runs, self.codecs)):
            if codec in _QUANTIZED:
                count = -(-(b - a) // block_of(codec))
                scales[i] = np.frombuffer(buf, np.float32, count=count, offset=offset)
                offset += 4 * count
        counts = {}
        for i, ((a, b), codec) in enumerate(zip(runs, self.codecs)):
            if is_counted(codec):
                count = -(-(b - a) // block_of(codec))
                if offset + 2 * count > len(buf):
                    raise ValueError(f"a compressed shard of {len(buf)} bytes does not match its layout (more "
                                     "than its bytes)")
                counts[i] = np.frombuffer(buf, np.uint16, count=count, offset=offset)
                offset += 2 * count
        payloads = {}
        for codec in _PAYLOADS:
            dtype = payload_dtype(codec)
            for i, ((a, b), c) in enumerate(zip(runs, self.codecs)):
                if c == codec:
                    count = payload_count(codec, b - a, counts=counts.get(i))
                    if offset + dtype.itemsize * count > len(buf):
                        raise ValueError(f"a compressed shard of {len(buf)} bytes does not match its layout (more "
                                         "than its bytes)")
                    payloads[i] = np.frombuffer(buf, dtype, count=count, offset=offset)
                    offset += dtype.itemsize * count
        if offset != len(buf):
            raise ValueError(f"a compressed shard of {len(buf)} bytes does not match its layout ({offset} bytes)")
        encoded = tuple(Encoded(c, b - a, payloads[i], scales.get(i), block_of(c), counts.get(i))
                        for i, ((a, b), c) in enumerate(zip(runs, self.codecs)))
        return Packed(examples, x, encoded)

    # ----------------------------------------------------------------- the sum

    def _runs(self, shard: int, shards: int) -> List[Tuple[int, int]]:
        """``[lo, hi)`` of shard ``shard`` in each compressed segment."""
        return [_bounds(size, codec, shard, shards) for size, codec in zip(self.sizes, self.codecs)]

    def empty(self, shard: int, shards: int) -> List[np.ndarray]:
        """Zero sums of shard ``shard``: one float32 array per compressed segment, then ``x`` (float64)."""
        xa, xb = _bounds(self.sizes[-1], "f64", shard, shards)
        return [np.zeros(b - a, np.float32) for a, b in self._runs(shard, shards)] + [np.zeros(xb - xa, np.float64)]

    def add(self, acc: Optional[List[np.ndarray]], data, shard: int, shards: int) -> List[np.ndarray]:
        """``acc + n · decode(delta)`` for a worker's shard value ``data``, in place (``None``: zeros first)."""
        acc = self.empty(shard, shards) if acc is None else acc
        packed = self.parse(data, shard, shards)
        weight = np.float32(packed.examples)
        for sums, e in zip(acc[:-1], packed.encoded):
            if e.size:  # a segment this layout leaves empty (optimizer_state="local": the optimizer's) adds nothing
                add_decoded(sums, e, weight)  # a topk delta at its positions only, not densified
        np.add(acc[-1], packed.x, out=acc[-1])
        return acc

    def summed_bytes(self, acc: Optional[List[np.ndarray]], shard: int = 0, shards: int = 1) -> bytes:
        """A summed shard as one value: ``x`` (float64), then each compressed segment's (float32); ``None``: zeros."""
        acc = self.empty(shard, shards) if acc is None else acc
        return b"".join([acc[-1].tobytes()] + [a.tobytes() for a in acc[:-1]])

    def parse_summed(self, data, shard: int, shards: int) -> List[np.ndarray]:
        """The sums a :meth:`summed_bytes` value holds (views), as :meth:`empty` orders them."""
        zero = self.empty(shard, shards)
        buf = memoryview(data)
        x = np.frombuffer(buf, np.float64, count=zero[-1].size)
        out, offset = [], x.nbytes
        for z in zero[:-1]:
            out.append(np.frombuffer(buf, np.float32, count=z.size, offset=offset))
            offset += 4 * z.size
        return out + [x]

    def delta_sums(self, shard_sums: Sequence[List[np.ndarray]]) -> Tuple[List[np.ndarray], Optional[List[np.ndarray]]]:
        """``(Σ n·Δweights, Σ n·Δoptimizer or None)`` from every shard's sums, in shard order."""
        if len(shard_sums) == 1:  # a single writable piece is used as it is (as FlatLayout.join)
            segments = [a if a.flags.writeable else np.array(a) for a in shard_sums[0]]
        else:
            segments = [np.concatenate([s[i] for s in shard_sums]) for i in range(len(self.codecs) + 1)]
        if segments[0].size == self.flat.sizes[0]:  # the weights alone (no optimizer sums): already in entry order
            return self.flat.unflatten(segments[0], segments[-1])
        f32, at = np.empty(self.flat.sizes[0], np.float32), [0] * len(self.codecs)
        i32 = 0
        for i, (is32, shape) in enumerate(self.flat.entries):  # the segments' values back in entry order
            if is32:
                n, seg = math.prod(shape), self._segment_of(i)
                f32[i32:i32 + n] = segments[seg][at[seg]:at[seg] + n]
                at[seg] += n
                i32 += n
        return self.flat.unflatten(f32, segments[-1])

    sums = delta_sums  # the sums' protocol (SumsLayout), as FlatLayout.sums

    # ----------------------------------------------- the wire (SumsLayout)

    @staticmethod
    def encode(result) -> Optional[Packed]:
        """What a worker's result sends: its one compressed delta (``None``: it sends none)."""
        return result.deltas[0][1] if result.deltas else None

    def value_bytes(self, encoded: Packed, shard: int, shards: int) -> bytes:
        """Shard ``shard`` of a worker's delta as one value (:meth:`shard_bytes`)."""
        return self.shard_bytes(encoded, shard, shards)

    def store_file(self, directory: str, name: str, encoded: Packed, shards: int) -> Tuple[str, List[int]]:
        """Writes a worker's delta to a new file, its shards back to back; returns its URI and the ``S + 1`` offsets."""
        from .exchange import store

        data, starts = self.file_bytes(encoded, shards)
        stored = store(directory, name, [np.frombuffer(data, np.uint8)], parents=False)  # a worker's: see store()
        return stored.uri, [stored.layout[0][2] + start for start in starts]

    @staticmethod
    def read_shard(uri: str, offsets: Sequence[int], shard: int, shards: int) -> bytes:
        """Shard ``shard`` of a worker's delta in a :meth:`store_file` file (a ranged read)."""
        from .exchange import read_range

        return read_range(uri, offsets[shard], offsets[shard + 1] - offsets[shard])

    # ---------------------------------------------------------- the residuals

    @property
    def adaptive(self) -> Tuple[int, ...]:
        """The compressed segments whose workers keep a ``"threshold"`` ``τ`` with their residual."""
        return tuple(i for i, (codec, fb) in enumerate(zip(self.codecs, self.feedback)) if fb and adapts(codec))

    def residual_bytes(self, residual: Sequence[Optional[Feedback]]) -> bytes:
        """What a worker keeps (per compressed segment; ``None`` where it keeps nothing) as one value: first each
        :attr:`adaptive` segment's ``τ`` (float32; where readers of ``τ`` alone find it), then each residual's int8
        scales and values."""
        pieces = [np.float32(THRESHOLD_START if residual[i].threshold is None else residual[i].threshold).tobytes()
                  for i in self.adaptive]
        for kept, feedback in zip(residual, self.feedback):
            if feedback:
                e = encode(kept.residual, "int8")
                pieces += [e.scales.tobytes(), e.payload.tobytes()]
        return b"".join(pieces)

    def read_residual(self, data) -> List[Optional[Feedback]]:
        """What a worker keeps per compressed segment, from a :meth:`residual_bytes` value (``None`` where nothing)."""
        buf = memoryview(data)
        taus = dict(zip(self.adaptive, np.frombuffer(buf, np.float32, count=len(self.adaptive)).tolist()))
        offset, out = 4 * len(self.adaptive), []
        for i, (size, feedback) in enumerate(zip(self.sizes, self.feedback)):
            if not feedback:
                out.append(None)
                continue
            blocks = -(-size // BLOCK)
            scales = np.frombuffer(buf, np.float32, count=blocks, offset=offset)
            payload = np.frombuffer(buf, np.int8, count=size, offset=offset + 4 * blocks)
            offset += 4 * blocks + size
            out.append(Feedback(decode(Encoded("int8", size, payload, scales)), taus.get(i)))
        if offset != len(buf):
            raise ValueError(f"a residual of {len(buf)} bytes does not match its layout ({offset} bytes)")
        return out


@dataclass(frozen=True)
class FeedbackFiles(WorkerRoundFiles):
    """Where a round's workers read and write their residuals (error feedback); ``fresh`` ones start from zero.

    Attributes:
        peers: At an epoch's first round, the workers whose files the round reads (every one that wrote one): the
            ``"threshold"`` codec starts each worker from their ``τ``'s mean (Deeplearning4j averages its threshold
            across workers at the epoch's end). Empty: each worker starts from its own.
    """

    peers: Tuple[int, ...] = ()

    what = "error-feedback residual"

    def begin(self, w: WorkerRound) -> None:
        w.residuals = self  # read and written by the round's codec (pack_result)

    def load(self, layout: DeltaLayout, worker: int) -> Optional[List[Optional[Feedback]]]:
        """Worker ``worker``'s residual to add this round, with its ``τ`` (``None``: zero)."""
        data = self.read_bytes(worker)
        return None if data is None else layout.read_residual(data)

    def save(self, layout: DeltaLayout, worker: int, residual: Sequence[Optional[Feedback]]) -> None:
        """Writes worker ``worker``'s residual of this round."""
        self.write_bytes(worker, layout.residual_bytes(residual))

    def mean_thresholds(self, layout: DeltaLayout) -> Optional[List[Optional[float]]]:
        """Per compressed segment, the mean of the :attr:`peers`' ``τ`` (float64 sums in worker order, so every
        worker and a retried task get the same float32); ``None`` without peers or adaptive segments."""
        from .exchange import read_range

        if not self.peers or not layout.adaptive or self.read is None:
            return None
        n = len(layout.adaptive)
        taus = np.array([np.frombuffer(read_range(self.path(self.read, p), 0, 4 * n), np.float32)
                         for p in sorted(self.peers)], np.float64)
        means = taus.sum(axis=0) / len(self.peers)
        out: List[Optional[float]] = [None] * len(layout.codecs)
        for i, mean in zip(layout.adaptive, means):
            out[i] = float(np.float32(mean))
        return out


def pack_result(layout: DeltaLayout, feedback: Optional[FeedbackFiles], worker: int, examples: int, weights,
                optimizer, sent_weights, sent_optimizer, finite: bool) -> Tuple[Optional[Packed], Dict[str, float]]:
    """What a worker of a compressed round sends, its residual written; and its ``{"encode_s", "feedback_s"}``.

    ``encode_s``: seconds computing and encoding the delta; ``feedback_s``: seconds reading and writing the residual
    file. A non-finite worker sends nothing (``None``) and keeps the residual it had.
    """
    t0 = time.perf_counter()
    residual = feedback.load(layout, worker) if feedback is not None else None
    thresholds = feedback.mean_thresholds(layout) if feedback is not None else None
    t1 = time.perf_counter()
    if not finite:
        packed, kept = None, residual
    else:
        packed, kept = layout.pack(weights, optimizer, sent_weights, sent_optimizer, examples, residual,
                                   thresholds=thresholds)
    t2 = time.perf_counter()
    if feedback is not None:
        if kept is None:
            kept = [Feedback(np.zeros(size, np.float32)) if fb else None
                    for size, fb in zip(layout.sizes, layout.feedback)]
        feedback.save(layout, worker, kept)
    feedback_s = (t1 - t0) + (time.perf_counter() - t2) if feedback is not None else 0.0
    return packed, {"encode_s": t2 - t1, "feedback_s": feedback_s}


def sum_deltas(layout: DeltaLayout, total):
    """Sums the compressed deltas a :class:`~sparkdl_avg.shared.wire.aggregation.PartialResult` carries, in worker order.

    ``total.deltas`` (``(worker, bytes)`` of whole deltas) become its ``weight_sums``/``optimizer_sums`` of deltas
    (``delta_sums``); returns ``total``.
    """
    acc = None
    for _, data in sorted(total.deltas or [], key=lambda item: item[0]):
        acc = layout.add(acc, data, 0, 1)
    total.deltas = None
    total.delta_sums = True
    if acc is not None:
        total.weight_sums, total.optimizer_sums = layout.delta_sums([acc])
    return total


def _expected_counts(codec: str, size: int) -> Optional[np.ndarray]:
    """What a round's plan sizes a counted codec's chunks at: the density band's top (``"threshold"``)."""
    if not is_counted(codec):
        return None
    block = BLOCKS[codec]
    chunks = [block] * (size // block) + ([size % block] if size % block else [])
    return np.array([max(1, int(np.ceil(THRESHOLD_DENSITY[1] * c))) for c in chunks], np.int64)
