"""Compressed deltas: the codecs a worker's round delta can travel in, and error feedback.

``update_compression`` sends each worker's *delta* from the round's starting state in fewer bytes than float32; this
module owns the number formats and nothing about where they travel:

* ``"bf16"``: bfloat16, float32's top 16 bits rounded to nearest even (2 bytes per value; the exponent range of
  float32, 8 bits of mantissa);
* ``"int8"``: one signed byte per value and one float32 scale per block of :data:`BLOCK` consecutive values
  (``scale = max|x| / 127`` over the block, ``q = round(x / scale)``): 1 + 4/BLOCK bytes per value;
* ``"int4"``: Streaming DiLoCo's 4-bit outer gradients (Douillard et al. 2025; summed in float32 like the others): two
  signed 4-bit values per byte, value ``2i`` in the low nibble of byte ``i`` and ``2i + 1`` in its high nibble (two's
  complement, a last odd value's high nibble 0), and one float32 scale per block of :data:`BLOCKS` ``["int4"]`` values
  (``scale = max|x| / 7``, ``q = round(x / scale)`` in -7..7): 0.5 + 4/block bytes per value;
* ``"topk"``: SparseLoCo's sparse outer gradients (2025): per chunk of :data:`BLOCKS` ``["topk"]`` (4,096) values,
  only the :data:`TOPK_DENSITY` largest in magnitude (``k = ceil(density · chunk)``, at least one), each as its
  12-bit position in the chunk and a 2-bit value (sign, and whether its magnitude is nearer the chunk's largest kept
  one, the scale, or half of it), the chunk's scale in float32; positions packed two to three bytes, values four to a
  byte, a chunk's ``3·ceil(k/2) + ceil(k/4)`` bytes back to back (0.036 bytes a value at 2%: 1/110 of float32).
  Whatever it does not send stays in the residual;
* ``"threshold"``: Deeplearning4j's threshold encoding (Strom 2015), with its adaptive threshold: of each chunk of
  :data:`BLOCKS` ``["threshold"]`` (4,096) values, those whose magnitude reaches the worker's threshold ``τ`` travel as
  ``±τ``, each as its 12-bit position in its chunk and a sign bit, or, where that would be more bytes, the whole
  chunk as a 2-bit map (``0``, ``+τ``, ``-τ``; four values a byte); per chunk ``τ`` (float32) and the count sent
  (uint16). The payload: every sparse chunk's positions, in chunk order, three bytes a pair; then their signs, eight
  a byte; then the maps (:func:`_threshold_pack`: no padding per chunk, so the decoder reads each part whole).
  ``τ`` adapts round by round (:func:`adapt_threshold`) so that
  the share sent stays in :data:`THRESHOLD_DENSITY`; the residual is clipped at ``±``:data:`THRESHOLD_CLIP` ``· τ``.
  The worker keeps ``τ`` with its residual (:class:`Feedback`);
* error feedback (Seide et al. 2014; Karimireddy et al. 2019): what a codec drops from ``delta + residual`` is the next
  residual, so over rounds nothing is lost (:func:`with_feedback`).

Everything here is a pure function of its inputs (numpy only, no clocks, no randomness), so a retried task encodes
bitwise the same bytes. Sums of decoded values are done in float32 by the caller (:func:`add_decoded`). Vectors are
flat float32; a block never spans two slices cut at multiples of its codec's block (:meth:`Encoded.slice`; int4's
blocks hold an even number of values, so such a cut is also a whole byte), so sharded reducers can decode their slice
alone. The block sizes are chosen by measurement: ``benchmarks/compression.py`` (docs/benchmarks/compression.md).
int8 suits signed deltas of similar magnitude within a block (the weights'); Adam's second moments span many
magnitudes and diverge through it, while bf16 carries them (``benchmarks/compression_sim.py``, same page).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Optional, Tuple

import numpy as np

CODECS = ("bf16", "int8", "int4", "topk", "threshold")
BLOCK = 256
"""Values per int8 scale: 1.0156 bytes per value; measured in docs/benchmarks.md ("Compressed updates")."""
TOPK_DENSITY = 0.02
"""The share of each chunk's values ``"topk"`` sends: 2% (0.009× float32's bytes), chosen over 1% and 3% on the digits
MLP (docs/benchmarks/sparse_codecs.md)."""
THRESHOLD_START = 1e-4
"""``"threshold"``'s ``τ`` before a worker's first round: Deeplearning4j's initial threshold."""
THRESHOLD_STEP = 0.5 ** (1 / 20)
"""The factor ``τ`` moves by, one step at a time (0.966: Deeplearning4j's decay rate, half in 20 steps)."""
THRESHOLD_DENSITY = (1e-4, 2e-2)
"""The share of a worker's values ``"threshold"`` sends each round, kept by moving ``τ``. Deeplearning4j's band is 1e-4
to 1e-2 of each minibatch's update; a round sends once for its ``k`` minibatches, and 2e-2 at the top measured better
(docs/benchmarks/sparse_codecs.md: the digits MLP, 60 rounds, held-out 0.913 against 0.879 with 1e-2, at 0.0094× and
0.0053× float32's bytes)."""
THRESHOLD_CLIP = 5.0
"""A ``"threshold"`` residual is clipped at ``± THRESHOLD_CLIP · τ`` (Deeplearning4j's residual clipping)."""
BLOCKS = {"int8": BLOCK, "int4": 128, "topk": 4096, "threshold": 4096}
"""Values per scale of each codec that has scales (the default ``block`` of :func:`encode`). int4: 0.53125 bytes
per value; the smallest block whose halving still bought more error than the same bits spent on a finer grid
would (docs/benchmarks.md, "Compressed updates")."""

_MAX = {"int8": 127, "int4": 7}  # symmetric (-127..127, -7..7) so that -x encodes as -q
_DTYPES = {"bf16": np.uint16, "int8": np.int8, "int4": np.uint8, "topk": np.uint8, "threshold": np.uint8}
_COUNTED = ("threshold",)  # codecs whose chunks' bytes depend on their values: a count per chunk says how many
_SPARSE = ("topk", "threshold")  # codecs that send a few entries of each chunk, the rest left in the residual


def is_sparse(codec: str) -> bool:
    """Whether ``codec`` sends some entries of each chunk, the rest kept in the residual (``"topk"``, ``"threshold"``):
    summed at their positions (:func:`add_decoded`); DiLoCo's momentum defaults lower with them (``rules.DiLoCo``)."""
    return codec in _SPARSE


def is_counted(codec: str) -> bool:
    """Whether ``codec``'s payload length depends on the values (a count per chunk, :attr:`Encoded.counts`)."""
    return codec in _COUNTED


def adapts(codec: str) -> bool:
    """Whether ``codec`` adapts a threshold from round to round, which a worker keeps with its residual
    (:attr:`Feedback.threshold`)."""
    return codec == "threshold"


def payload_dtype(codec: str) -> np.dtype:
    """The dtype of ``codec``'s payload (int4: ``uint8``, a byte holding two values)."""
    return np.dtype(_DTYPES[codec])


def payload_count(codec: str, size: int, block: Optional[int] = None, counts: Optional[np.ndarray] = None) -> int:
    """Payload elements that encode ``size`` values in ``codec`` (int4: ``ceil(size / 2)`` bytes; topk: its chunks'
    bytes, :func:`_topk_bytes`, with chunks of ``block`` values, :data:`BLOCKS` by default; threshold: its bytes
    given the ``counts`` its chunks send, :func:`_threshold_layout`)."""
    if codec == "threshold":
        block = BLOCKS["threshold"] if block is None else block
        return int(_threshold_layout(_chunk_sizes(size, block), np.asarray(counts, np.int64)).maps_at[-1])
    if codec == "topk":
        block = BLOCKS["topk"] if block is None else block
        whole, rest = divmod(size, block)
        return whole * _topk_bytes(block) + (_topk_bytes(rest) if rest else 0)
    return -(-size // 2) if codec == "int4" else size


def topk_kept(chunk: int) -> int:
    """Values ``"topk"`` keeps of a chunk of ``chunk`` values: ``ceil(TOPK_DENSITY · chunk)``, at least one."""
    return min(chunk, max(1, int(np.ceil(TOPK_DENSITY * chunk - 1e-9))))


def _topk_bytes(chunk: int) -> int:
    """Bytes of one ``"topk"`` chunk of ``chunk`` values: 12-bit positions, three bytes a pair; 2-bit values."""
    k = topk_kept(chunk)
    return 3 * -(-k // 2) + -(-k // 4)


def _chunk_sizes(size: int, block: int) -> np.ndarray:
    """The values of each chunk of ``block`` values of a vector of ``size`` (the last may be shorter)."""
    whole, rest = divmod(size, block)
    out = np.full(whole + (1 if rest else 0), block, np.int64)
    if rest:
        out[-1] = rest
    return out


def _threshold_sparse(chunks: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Which ``"threshold"`` chunks of ``chunks`` values sending ``counts`` each travel sparse: where 12-bit positions
    (three bytes a pair) and a sign bit each take no more bytes than the chunk's 2-bit map."""
    return 3 * (-(-counts // 2)) + -(-counts // 8) <= -(-chunks // 4)


@dataclass(frozen=True)
class _ThresholdLayout:
    """Where a ``"threshold"`` payload's parts lie (:func:`_threshold_pack`): per chunk, its entries in the sparse part
    (``sent``: its count where sparse, else 0); the map chunks (``maps``, ascending); the signs' first byte
    (``signs_at``, after ``3·ceil(N/2)`` position bytes); each map's first byte, then the payload's length
    (``maps_at``)."""

    sent: np.ndarray
    maps: np.ndarray
    signs_at: int
    maps_at: np.ndarray


def _threshold_layout(chunks: np.ndarray, counts: np.ndarray) -> _ThresholdLayout:
    """The layout of a ``"threshold"`` payload whose chunks of ``chunks`` values send ``counts`` each."""
    sparse = _threshold_sparse(chunks, counts)
    sent = np.where(sparse, counts, 0)
    n = int(sent.sum())
    signs_at = 3 * -(-n // 2)
    maps = np.flatnonzero(~sparse)
    maps_at = signs_at + -(-n // 8) + np.concatenate([[0], np.cumsum(-(-chunks[maps] // 4))]).astype(np.int64)
    return _ThresholdLayout(sent, maps, signs_at, maps_at)


def _threshold_pack(local: np.ndarray, negative: np.ndarray, maps) -> np.ndarray:
    """A ``"threshold"`` payload: the sparse entries' 12-bit positions in their chunks (``local``) two to three bytes
    (the first low; an odd last pair padded with 0), their signs eight a byte (first lowest), then the maps' bytes."""
    p = np.zeros(2 * -(-local.size // 2), np.uint32)
    p[:local.size] = local
    word = p[0::2] | (p[1::2] << 12)  # 24 bits a pair
    positions = np.stack([word & 255, (word >> 8) & 255, word >> 16], axis=1).astype(np.uint8).reshape(-1)
    signs = np.packbits(np.asarray(negative, bool), bitorder="little")
    return np.concatenate([positions, signs, *maps])


def _threshold_sparse_entries(e: "Encoded", layout: _ThresholdLayout) -> Tuple[np.ndarray, np.ndarray]:
    """The sparse part of ``e``'s payload: each entry's 12-bit position in its chunk (int64) and sign bit (uint8)."""
    n = int(layout.sent.sum())
    raw = np.ascontiguousarray(e.payload)
    local = _positions12(raw[None, :layout.signs_at], layout.signs_at // 3).reshape(-1)[:n]
    negative = np.unpackbits(raw[layout.signs_at:layout.signs_at + -(-n // 8)], bitorder="little")[:n]
    return local, negative


def block_of(codec: str) -> int:
    """Values per scale of ``codec``; 1 for bf16, which has no scales (so a cut anywhere is whole)."""
    return BLOCKS.get(codec, 1)


@dataclass(frozen=True)
class Encoded:
    """A flat float32 vector in a compressed form.

    Attributes:
        codec: One of :data:`CODECS`.
        size: Values encoded.
        payload: ``uint16`` (bf16: the top half of each float32) or ``int8`` values, ``size`` of them; int4:
            ``uint8`` bytes, ``ceil(size / 2)`` of them, value ``2i`` in byte ``i``'s low nibble; topk and threshold:
            ``uint8`` bytes, each chunk's back to back (see the module docstring).
        scales: The float32 scale per block of ``block`` values (the last may be shorter); ``None`` for bf16.
            threshold: each chunk's ``τ``.
        block: Values per scale (int8, int4, topk, threshold).
        counts: threshold: the values each chunk sends (uint16); ``None`` for the other codecs.
    """

    codec: str
    size: int
    payload: np.ndarray
    scales: Optional[np.ndarray] = None
    block: int = BLOCK
    counts: Optional[np.ndarray] = None

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: the payload, the scales and the counts."""
        return int(self.payload.nbytes + sum(a.nbytes for a in (self.scales, self.counts) if a is not None))

    def slice(self, start: int, stop: int) -> "Encoded":
        """Values ``[start, stop)``; for int8 and int4 ``start`` must be a multiple of ``block`` (a block is
        never split), for int4 ``stop`` even or the end (a byte is never split)."""
        if self.scales is None:
            return Encoded(self.codec, stop - start, self.payload[start:stop])
        if start % self.block:
            raise ValueError(f"an {self.codec} slice must start at a multiple of its block ({self.block}); got {start}")
        first, last = start // self.block, -(-stop // self.block)
        if is_sparse(self.codec) and stop % self.block and stop != self.size:
            raise ValueError(f"a {self.codec} slice must stop at a multiple of its chunk ({self.block}) or the end; "
                             f"got {stop}")
        if self.codec == "threshold":  # its chunks' entries and maps, packed again as a payload of their own
            layout = _threshold_layout(_chunk_sizes(self.size, self.block), self.counts.astype(np.int64))
            local, negative = _threshold_sparse_entries(self, layout)
            a, b = int(layout.sent[:first].sum()), int(layout.sent[:last].sum())
            kept = np.flatnonzero((layout.maps >= first) & (layout.maps < last))
            maps = [self.payload[layout.maps_at[i]:layout.maps_at[i + 1]] for i in kept]
            return Encoded(self.codec, stop - start, _threshold_pack(local[a:b], negative[a:b], maps),
                           self.scales[first:last], self.block, self.counts[first:last])
        if self.codec == "topk":
            at = first * _topk_bytes(self.block)
            payload = self.payload[at:at + payload_count("topk", stop - start, self.block)]
        elif self.codec == "int4":
            if stop % 2 and stop != self.size:
                raise ValueError(f"an int4 slice must stop at a whole byte (an even index or the end); got {stop}")
            payload = self.payload[start // 2:-(-stop // 2)]
        else:
            payload = self.payload[start:stop]
        return Encoded(self.codec, stop - start, payload, self.scales[first:last], self.block)


def _flat32(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"codecs take a flat float32 vector; got shape {x.shape}")
    return x


def encode(x: np.ndarray, codec: str, block: Optional[int] = None, threshold: Optional[float] = None) -> Encoded:
    """``x`` (flat float32) in ``codec``; ``block``: values per scale (``None``: :data:`BLOCKS`); ``threshold``: the
    ``"threshold"`` codec's ``τ`` (``None``: :func:`adapt_threshold` from :data:`THRESHOLD_START`)."""
    x = _flat32(x)
    if codec == "threshold":
        block = BLOCKS[codec] if block is None else block
        if not 1 <= block <= 4096:
            raise ValueError(f"a threshold chunk must hold 1 to 4096 values (12-bit positions); got {block}")
        tau = adapt_threshold(x, THRESHOLD_START) if threshold is None else np.float32(threshold)
        if not (np.isfinite(tau) and tau > 0):
            raise ValueError(f"a threshold must be a positive finite number; got {threshold}")
        payload, counts = _threshold_encode(x, tau, block)
        return Encoded(codec, x.size, payload, np.full(counts.size, tau, np.float32), block, counts)
    if codec == "bf16":
        return Encoded("bf16", x.size, _to_bf16(x))
    if codec in _MAX:
        block = BLOCKS[codec] if block is None else block
        if codec == "int4" and block % 2:
            raise ValueError(f"an int4 block must hold an even number of values (whole bytes); got {block}")
        q, scales = _quantize(x, block, _MAX[codec])
        return Encoded(codec, x.size, _pack_int4(q) if codec == "int4" else q, scales, block)
    if codec == "topk":
        block = BLOCKS[codec] if block is None else block
        if not 1 <= block <= 4096:
            raise ValueError(f"a topk chunk must hold 1 to 4096 values (12-bit positions); got {block}")
        payload, scales = _topk_encode(x, block)
        return Encoded(codec, x.size, payload, scales, block)
    raise ValueError(f"unknown codec {codec!r}; expected one of {', '.join(map(repr, CODECS))}")


def decode(e: Encoded) -> np.ndarray:
    """The float32 values ``e`` stands for."""
    if e.codec == "bf16":
        return (e.payload.astype(np.uint32) << 16).view(np.float32)
    if is_sparse(e.codec):
        out = np.zeros(e.size, np.float32)
        positions, values = sparse_entries(e)
        out[positions] = values
        return out
    out = (_unpack_int4(e.payload) if e.codec == "int4" else e.payload).astype(np.float32)[: e.size]
    _scale_blocks(out, e.scales, e.block)
    return out


def add_decoded(acc: np.ndarray, e: Encoded, weight: float = 1.0) -> np.ndarray:
    """``acc += weight · decode(e)`` in float32, in place; returns ``acc``.

    A ``"topk"`` or ``"threshold"`` value is added at its positions only (each at most once), not densified first:
    bitwise the same sums, as adding ``0`` changes nothing.
    """
    if is_sparse(e.codec):
        positions, values = sparse_entries(e)
        if weight != 1.0:
            values *= np.float32(weight)
        np.add.at(acc, positions, values)  # positions are distinct: acc[p] + v each, 1.5× fancy indexing's speed
        return acc
    values = decode(e)
    if weight != 1.0:
        values *= np.float32(weight)
    np.add(acc, values, out=acc)
    return acc


@dataclass(frozen=True)
class Feedback:
    """What a worker keeps of one compressed vector from a round to its next (error feedback).

    Attributes:
        residual: What its codec dropped (float32, the vector's size).
        threshold: ``"threshold"``'s ``τ`` as the worker adapted it (``None`` for the other codecs, and before a
            worker's first round).
    """

    residual: np.ndarray
    threshold: Optional[float] = None


def with_feedback(delta: np.ndarray, kept: Optional[Feedback], codec: str, block: Optional[int] = None,
                  threshold: Optional[float] = None) -> Tuple[Encoded, Feedback]:
    """Encodes ``delta + residual``; returns it and what the worker keeps (what the codec dropped; ``τ``).

    ``kept=None``: a zero residual (a worker's first round). ``"threshold"``: ``τ`` starts from ``threshold`` if given
    (the workers' mean at an epoch's start), else from the kept one (else :data:`THRESHOLD_START`), and moves by
    :func:`adapt_threshold`; the residual is clipped at ``±THRESHOLD_CLIP · τ``.
    """
    v = _flat32(delta).copy()
    if kept is not None:
        v += kept.residual
    if codec != "threshold":
        e = encode(v, codec, block)
        v -= decode(e)
        return e, Feedback(v)
    start = threshold if threshold is not None else (kept.threshold if kept is not None and kept.threshold else None)
    tau = adapt_threshold(v, THRESHOLD_START if start is None else start)
    e = encode(v, codec, block, threshold=tau)
    v -= decode(e)
    np.clip(v, -THRESHOLD_CLIP * tau, THRESHOLD_CLIP * tau, out=v)
    return e, Feedback(v, float(tau))


def adapt_threshold(x: np.ndarray, tau: float, density: Tuple[float, float] = THRESHOLD_DENSITY) -> np.float32:
    """``"threshold"``'s ``τ`` for the values ``x``: ``tau`` moved by the fewest steps of :data:`THRESHOLD_STEP` that
    bring the share of ``|x| >= τ`` into ``density`` (float32).

    Deeplearning4j moves its threshold one step per minibatch; a round here is many minibatches and sends once, so
    ``τ`` takes as many steps as the round's values need, from where the worker's last round left it. With fewer
    non-zero values than the band's low end asks for, ``τ`` goes no lower than the smallest non-zero one; all zero,
    it stays.
    """
    mags = np.abs(_flat32(x))
    n = mags.size
    tau = np.float32(tau)
    if n == 0:
        return tau
    low, high = max(1, int(np.ceil(density[0] * n - 1e-9))), max(1, int(np.floor(density[1] * n + 1e-9)))

    def sent(t) -> int:
        return int(np.count_nonzero(mags >= t))

    def moved(m: int) -> np.float32:
        return np.float32(np.float64(tau) * THRESHOLD_STEP ** m)

    count = sent(tau)
    if count > high:  # too many: raise τ above the (high + 1)-th largest magnitude
        target = float(np.partition(mags, n - high - 1)[n - high - 1])
        m = int(np.floor(np.log(target / float(tau)) / np.log(THRESHOLD_STEP))) if target > tau else 0
        while sent(moved(m)) > high:  # the logarithm's rounding: a step or two more
            m -= 1
        return moved(m)
    if count < low:  # too few: lower τ to the low-th largest magnitude, or the smallest non-zero one
        nonzero = np.count_nonzero(mags)
        if nonzero == 0:
            return tau
        k = min(low, nonzero)
        target = float(np.partition(mags, n - k)[n - k])
        m = max(0, int(np.ceil(np.log(target / float(tau)) / np.log(THRESHOLD_STEP))))
        while sent(moved(m)) < k:
            m += 1
        return moved(m)
    return tau


def _to_bf16(x: np.ndarray) -> np.ndarray:
    u = x.view(np.uint32)
    # Round to nearest, ties to even: add 0x7FFF plus the lowest kept bit, keep the top half. uint32 wraps
    # only for NaNs with the sign bit set, which are set apart below. In place: one temporary, not four.
    t = u >> 16
    t &= 1
    t += 0x7FFF
    t += u
    t >>= 16
    rounded = t.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x0040).astype(np.uint16)  # stays a (quiet) NaN
    return rounded


def _quantize(x: np.ndarray, block: int, qmax: int) -> Tuple[np.ndarray, np.ndarray]:
    """``q`` (int8, in ``-qmax..qmax``) and the float32 scale of each block, ``max|x| / qmax``."""
    if block < 1:
        raise ValueError(f"block must be >= 1; got {block}")
    blocks = -(-x.size // block)
    padded = np.zeros(blocks * block, dtype=np.float32)
    padded[: x.size] = x
    by_block = padded.reshape(blocks, block)
    scales = np.abs(by_block).max(axis=1) / np.float32(qmax)
    scales = scales.astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1.0))
    q = np.rint(by_block / safe[:, None])
    np.clip(q, -qmax, qmax, out=q)
    return q.astype(np.int8).reshape(-1)[: x.size], scales


def _pack_int4(q: np.ndarray) -> np.ndarray:
    """int8 values in -7..7 as two's complement nibbles, value ``2i`` low in byte ``i`` (an odd tail's high 0)."""
    u = np.zeros(q.size + q.size % 2, dtype=np.uint8)
    u[: q.size] = q.view(np.uint8) & 15
    return u[0::2] | (u[1::2] << 4)


def _unpack_int4(payload: np.ndarray) -> np.ndarray:
    """Bytes of :func:`_pack_int4` as int8 values, two per byte (a padded tail's 0 included)."""
    signed = payload.view(np.int8)
    q = np.empty((payload.size, 2), dtype=np.int8)
    # arithmetic right shifts of int8 sign-extend the nibbles (faster than a table look-up)
    np.right_shift(signed, 4, out=q[:, 1])
    np.left_shift(signed, 4, out=q[:, 0])
    np.right_shift(q[:, 0], 4, out=q[:, 0])
    return q.reshape(-1)


def _scale_blocks(values: np.ndarray, scales: np.ndarray, block: int) -> None:
    whole = values.size // block
    if whole:
        values[: whole * block].reshape(whole, block)[...] *= scales[:whole, None]
    if values.size > whole * block:
        values[whole * block:] *= scales[whole]


# ------------------------------------------------------------------ topk

#: A byte of ``"topk"`` values as its four values in units of the chunk's scale, the first lowest (bit 0 of each: the
#: sign; bit 1: the scale, else half of it): one look-up decodes a byte (IEEE products are sign-symmetric).
_TOPK_BYTE_LEVELS = np.array([[(-1.0 if (b >> s) & 1 else 1.0) * (1.0 if (b >> s) & 2 else 0.5) for s in (0, 2, 4, 6)]
                              for b in range(256)], np.float32)


def _topk_encode(x: np.ndarray, block: int) -> Tuple[np.ndarray, np.ndarray]:
    """The payload bytes and per-chunk scales of ``x`` in ``"topk"`` (see the module docstring)."""
    pieces, scales = [], []
    whole = x.size // block
    if whole:  # the full chunks at once: one argpartition over a (chunks, block) view
        k = topk_kept(block)
        rows = x[: whole * block].reshape(whole, block)
        kept = np.sort(np.argpartition(-np.abs(rows), k - 1, axis=1)[:, :k], axis=1)
        pieces += _topk_pack(kept, np.take_along_axis(rows, kept, axis=1), scales)
    if x.size > whole * block:
        rest = x[whole * block:][None, :]
        k = topk_kept(rest.shape[1])
        kept = np.sort(np.argpartition(-np.abs(rest), k - 1, axis=1)[:, :k], axis=1)
        pieces += _topk_pack(kept, np.take_along_axis(rest, kept, axis=1), scales)
    payload = np.concatenate(pieces) if pieces else np.zeros(0, np.uint8)
    return payload, np.array(scales, np.float32).reshape(-1)


def _topk_pack(positions: np.ndarray, values: np.ndarray, scales: list) -> list:
    """Each row's chunk bytes: positions (three bytes a pair, the first in the low 12 bits), then the 2-bit values
    (bit 0: negative; bit 1: magnitude nearer the scale than half of it), four a byte, the first lowest."""
    chunks, k = positions.shape
    magnitude = np.abs(values)
    scale = magnitude.max(axis=1).astype(np.float32)
    scales.extend(scale.tolist())
    safe = np.where(scale > 0, scale, np.float32(1.0))[:, None]
    code = (values < 0).astype(np.uint8) | ((magnitude / safe >= np.float32(0.75)).astype(np.uint8) << 1)
    pairs = -(-k // 2)
    p = np.zeros((chunks, 2 * pairs), np.uint32)
    p[:, :k] = positions
    word = p[:, 0::2] | (p[:, 1::2] << 12)  # 24 bits a pair
    position_bytes = np.stack([word & 255, (word >> 8) & 255, word >> 16], axis=2).astype(np.uint8).reshape(chunks, -1)
    quads = -(-k // 4)
    c = np.zeros((chunks, 4 * quads), np.uint8)
    c[:, :k] = code
    value_bytes = c[:, 0::4] | (c[:, 1::4] << 2) | (c[:, 2::4] << 4) | (c[:, 3::4] << 6)
    return [np.concatenate([position_bytes, value_bytes], axis=1).reshape(-1)]


def sparse_entries(e: Encoded) -> Tuple[np.ndarray, np.ndarray]:
    """The positions (ascending) and float32 values a ``"topk"`` or ``"threshold"`` :class:`Encoded` sends."""
    return threshold_entries(e) if e.codec == "threshold" else topk_entries(e)


def topk_entries(e: Encoded) -> Tuple[np.ndarray, np.ndarray]:
    """The positions (in ``e``'s values, ascending) and float32 values a ``"topk"`` :class:`Encoded` sends."""
    whole, rest = divmod(e.size, e.block)
    parts = []
    if whole:
        nbytes = _topk_bytes(e.block)
        parts.append(_topk_unpack(e.payload[: whole * nbytes].reshape(whole, nbytes), topk_kept(e.block),
                                  e.scales[:whole], 0, e.block))
    if rest:
        parts.append(_topk_unpack(e.payload[whole * _topk_bytes(e.block):][None, :], topk_kept(rest),
                                  e.scales[whole:whole + 1], whole * e.block, e.block))
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    return np.concatenate([p for p, _ in parts]), np.concatenate([v for _, v in parts])


def _signed(magnitudes: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """``magnitudes`` (float32, non-negative, a copy of one's own) negated where ``negative`` is 1, in place: the
    sign bit set (exactly ``-x``; numpy's ``where=`` on a ufunc is several times slower)."""
    magnitudes.view(np.uint32)[...] |= np.asarray(negative, np.uint32) << np.uint32(31)
    return magnitudes


def _positions12(raw: np.ndarray, pairs: int) -> np.ndarray:
    """The 12-bit positions (int64, ``(rows, 2 · pairs)``) in the first ``3 · pairs`` bytes of each row of C-contiguous
    uint8 ``raw``: of three bytes, the first two's low 12 bits, the last two's high 12, read as two unaligned uint16
    views three bytes apart (two ufuncs: 2.3× the shifts and ors of one byte at a time on 19,000 positions)."""
    rows, stride = raw.shape[0], raw.strides[0]
    out = np.empty((rows, 2 * pairs), np.int64)
    if not (rows and pairs):
        return out
    view = partial(np.ndarray, (rows, pairs), "<u2", raw.reshape(-1).data, strides=(stride, 3))
    np.bitwise_and(view(offset=0), 4095, out=out[:, 0::2], casting="unsafe")
    np.right_shift(view(offset=1), 4, out=out[:, 1::2], casting="unsafe")
    return out


def _topk_unpack(raw: np.ndarray, k: int, scales: np.ndarray, start: int, block: int):
    """Positions and values of ``raw``'s chunks (one row each, ``k`` kept values), the first chunk at ``start``."""
    raw = np.ascontiguousarray(raw)
    chunks, pairs = raw.shape[0], -(-k // 2)
    pos = _positions12(raw, pairs)[:, :k]
    pos += (start + block * np.arange(chunks, dtype=np.int64))[:, None]
    levels = np.take(_TOPK_BYTE_LEVELS, raw[:, 3 * pairs:], axis=0).reshape(chunks, -1)[:, :k]
    return pos.reshape(-1), np.multiply(levels, scales.astype(np.float32)[:, None]).reshape(-1)


# ------------------------------------------------------------------ threshold


def _threshold_encode(x: np.ndarray, tau: np.float32, block: int) -> Tuple[np.ndarray, np.ndarray]:
    """The payload bytes and per-chunk counts of ``x`` in ``"threshold"`` at ``τ`` (see the module docstring)."""
    chunks = _chunk_sizes(x.size, block)
    if not chunks.size:
        return np.zeros(0, np.uint8), np.zeros(0, np.uint16)
    at = np.flatnonzero(np.abs(x) >= tau)
    chunk_of = at // block
    counts = np.bincount(chunk_of, minlength=chunks.size).astype(np.int64)
    layout = _threshold_layout(chunks, counts)
    sparse = at[layout.sent[chunk_of] > 0]  # the sparse chunks' entries, in order
    maps = []
    for k in layout.maps:  # the 2-bit maps: 1 for +τ, 2 for -τ, four values a byte, the first lowest
        part = x[k * block:k * block + chunks[k]]
        code = np.where(np.abs(part) >= tau, np.where(part < 0, 2, 1), 0).astype(np.uint8)
        quads = np.zeros(4 * -(-code.size // 4), np.uint8)
        quads[:code.size] = code
        maps.append(quads[0::4] | (quads[1::4] << 2) | (quads[2::4] << 4) | (quads[3::4] << 6))
    return _threshold_pack(sparse % block, x[sparse] < 0, maps), counts.astype(np.uint16)


def threshold_entries(e: Encoded) -> Tuple[np.ndarray, np.ndarray]:
    """The positions (in ``e``'s values, ascending) and float32 values (``±τ``) a ``"threshold"`` :class:`Encoded`
    sends."""
    chunks = _chunk_sizes(e.size, e.block)
    layout = _threshold_layout(chunks, e.counts.astype(np.int64))
    local, negative = _threshold_sparse_entries(e, layout)
    local += np.repeat(np.arange(chunks.size, dtype=np.int64) * e.block, layout.sent)
    positions = [local]
    values = [_signed(np.repeat(e.scales.astype(np.float32), layout.sent), negative)]
    for i, k in enumerate(layout.maps):
        b = e.payload[layout.maps_at[i]:layout.maps_at[i + 1]]
        code = np.stack([b & 3, (b >> 2) & 3, (b >> 4) & 3, (b >> 6) & 3], axis=1).reshape(-1)[:chunks[k]]
        at = np.flatnonzero(code)
        positions.append(k * e.block + at)
        values.append(np.where(code[at] == 2, -e.scales[k], e.scales[k]).astype(np.float32))
    if len(positions) == 1:  # every chunk sparse: already ascending
        return positions[0], values[0]
    positions, values = np.concatenate(positions), np.concatenate(values)
    order = np.argsort(positions, kind="stable")
    return positions[order], values[order]
