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
from typing import Optional, Tuple

import numpy as np

CODECS = ("bf16", "int8", "int4", "topk")
BLOCK = 256
"""Values per int8 scale: 1.0156 bytes per value; measured in docs/benchmarks.md ("Compressed updates")."""
TOPK_DENSITY = 0.02
"""The share of each chunk's values ``"topk"`` sends: 2% (0.009× float32's bytes), chosen over 1% and 3% on the digits
MLP (docs/benchmarks/sparse_codecs.md)."""
BLOCKS = {"int8": BLOCK, "int4": 128, "topk": 4096}
"""Values per scale of each codec that has scales (the default ``block`` of :func:`encode`). int4: 0.53125 bytes
per value; the smallest block whose halving still bought more error than the same bits spent on a finer grid
would (docs/benchmarks.md, "Compressed updates")."""

_MAX = {"int8": 127, "int4": 7}  # symmetric (-127..127, -7..7) so that -x encodes as -q
_DTYPES = {"bf16": np.uint16, "int8": np.int8, "int4": np.uint8, "topk": np.uint8}


def payload_dtype(codec: str) -> np.dtype:
    """The dtype of ``codec``'s payload (int4: ``uint8``, a byte holding two values)."""
    return np.dtype(_DTYPES[codec])


def payload_count(codec: str, size: int, block: Optional[int] = None) -> int:
    """Payload elements that encode ``size`` values in ``codec`` (int4: ``ceil(size / 2)`` bytes; topk: its chunks'
    bytes, :func:`_topk_bytes`, with chunks of ``block`` values, :data:`BLOCKS` by default)."""
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


def block_of(codec: str) -> int:
    """Values per scale of ``codec``; 1 for bf16, which has no scales (so a cut anywhere is whole)."""
    return BLOCKS.get(codec, 1)


@dataclass(frozen=True)
class Encoded:
    """A flat float32 vector in a compressed form.

    Attributes:
        codec: ``"bf16"``, ``"int8"`` or ``"int4"``.
        size: Values encoded.
        payload: ``uint16`` (bf16: the top half of each float32) or ``int8`` values, ``size`` of them; int4:
            ``uint8`` bytes, ``ceil(size / 2)`` of them, value ``2i`` in byte ``i``'s low nibble.
        scales: The float32 scale per block of ``block`` values (the last may be shorter); ``None`` for bf16.
        block: Values per scale (int8, int4).
    """

    codec: str
    size: int
    payload: np.ndarray
    scales: Optional[np.ndarray] = None
    block: int = BLOCK

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: the payload and the scales."""
        return int(self.payload.nbytes + (0 if self.scales is None else self.scales.nbytes))

    def slice(self, start: int, stop: int) -> "Encoded":
        """Values ``[start, stop)``; for int8 and int4 ``start`` must be a multiple of ``block`` (a block is
        never split), for int4 ``stop`` even or the end (a byte is never split)."""
        if self.scales is None:
            return Encoded(self.codec, stop - start, self.payload[start:stop])
        if start % self.block:
            raise ValueError(f"an {self.codec} slice must start at a multiple of its block ({self.block}); got {start}")
        first, last = start // self.block, -(-stop // self.block)
        if self.codec == "topk":
            if stop % self.block and stop != self.size:
                raise ValueError(f"a topk slice must stop at a multiple of its chunk ({self.block}) or the end; "
                                 f"got {stop}")
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


def encode(x: np.ndarray, codec: str, block: Optional[int] = None) -> Encoded:
    """``x`` (flat float32) in ``codec``; ``block``: values per scale (``None``: :data:`BLOCKS`)."""
    x = _flat32(x)
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
    if e.codec == "topk":
        out = np.zeros(e.size, np.float32)
        positions, values = topk_entries(e)
        out[positions] = values
        return out
    out = (_unpack_int4(e.payload) if e.codec == "int4" else e.payload).astype(np.float32)[: e.size]
    _scale_blocks(out, e.scales, e.block)
    return out


def add_decoded(acc: np.ndarray, e: Encoded, weight: float = 1.0) -> np.ndarray:
    """``acc += weight · decode(e)`` in float32, in place; returns ``acc``.

    A ``"topk"`` value is added at its positions only (each at most once), not densified first: bitwise the same
    sums, as adding ``0`` changes nothing.
    """
    if e.codec == "topk":
        positions, values = topk_entries(e)
        if weight != 1.0:
            values *= np.float32(weight)
        acc[positions] += values
        return acc
    values = decode(e)
    if weight != 1.0:
        values *= np.float32(weight)
    np.add(acc, values, out=acc)
    return acc


def with_feedback(delta: np.ndarray, residual: Optional[np.ndarray], codec: str,
                  block: Optional[int] = None) -> Tuple[Encoded, np.ndarray]:
    """Encodes ``delta + residual``; returns it and the next residual (what the codec dropped).

    ``residual=None`` is a zero residual (a worker's first round).
    """
    v = _flat32(delta).copy()
    if residual is not None:
        v += residual
    e = encode(v, codec, block)
    v -= decode(e)
    return e, v


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

#: The 2-bit values' magnitudes, in units of the chunk's scale (its largest kept magnitude): the magnitude bit picks one.
_TOPK_LEVELS = np.array([0.5, 1.0], np.float32)


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


def _topk_unpack(raw: np.ndarray, k: int, scales: np.ndarray, start: int, block: int):
    """Positions and values of ``raw``'s chunks (one row each, ``k`` kept values), the first chunk at ``start``."""
    chunks, pairs = raw.shape[0], -(-k // 2)
    b = raw[:, : 3 * pairs].reshape(chunks, pairs, 3).astype(np.uint32)
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    pos = np.stack([word & 4095, word >> 12], axis=2).reshape(chunks, -1)[:, :k].astype(np.int64)
    pos += (start + block * np.arange(chunks, dtype=np.int64))[:, None]
    v = raw[:, 3 * pairs:]
    code = np.stack([v & 3, (v >> 2) & 3, (v >> 4) & 3, (v >> 6) & 3], axis=2).reshape(chunks, -1)[:, :k]
    values = _TOPK_LEVELS[code >> 1] * scales.astype(np.float32)[:, None]
    np.negative(values, out=values, where=(code & 1).astype(bool))
    return pos.reshape(-1), values.astype(np.float32).reshape(-1)
