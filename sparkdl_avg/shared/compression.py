"""Compressed deltas: the codecs a worker's round delta can travel in, and error feedback.

Issue 30 ("Compressed updates") sends each worker's *delta* from the round's
starting state in fewer bytes than float32; this module owns the number
formats and nothing about where they travel:

* ``"bf16"``: bfloat16, float32's top 16 bits rounded to nearest even
  (2 bytes per value; the exponent range of float32, 8 bits of mantissa);
* ``"int8"``: one signed byte per value and one float32 scale per block of
  :data:`BLOCK` consecutive values (``scale = max|x| / 127`` over the block,
  ``q = round(x / scale)``): 1 + 4/BLOCK bytes per value;
* error feedback (Seide et al. 2014; Karimireddy et al. 2019): what a codec
  drops from ``delta + residual`` is the next residual, so over rounds
  nothing is lost (:func:`with_feedback`).

Everything here is a pure function of its inputs (numpy only, no clocks, no
randomness), so a retried task encodes bitwise the same bytes. Sums of
decoded values are done in float32 by the caller (:func:`add_decoded`).
Vectors are flat float32; a block never spans two slices cut at multiples
of :data:`BLOCK` (:meth:`Encoded.slice`), so sharded reducers can decode
their slice alone. The block size is chosen by measurement:
``benchmarks/compression.py`` (docs/benchmarks.md, "Compressed updates").
int8 suits signed deltas of similar magnitude within a block (the weights');
Adam's second moments span many magnitudes and diverge through it, while
bf16 carries them (``benchmarks/compression_sim.py``, same section).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

CODECS = ("bf16", "int8")
BLOCK = 256
"""Values per int8 scale: 1.0156 bytes per value; measured in docs/benchmarks.md ("Compressed updates")."""

_INT8_MAX = 127  # symmetric: -127..127, so that -x encodes as -q


@dataclass(frozen=True)
class Encoded:
    """A flat float32 vector in a compressed form.

    Attributes:
        codec: ``"bf16"`` or ``"int8"``.
        size: Values encoded.
        payload: ``uint16`` (bf16: the top half of each float32) or ``int8`` values, ``size`` of them.
        scales: int8's float32 scale per block of ``block`` values (the last may be shorter); ``None`` for bf16.
        block: Values per scale (int8).
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
        """Values ``[start, stop)``; for int8 ``start`` must be a multiple of ``block`` (a block is never split)."""
        if self.scales is None:
            return Encoded(self.codec, stop - start, self.payload[start:stop])
        if start % self.block:
            raise ValueError(f"an int8 slice must start at a multiple of its block ({self.block}); got {start}")
        first, last = start // self.block, -(-stop // self.block)
        return Encoded(self.codec, stop - start, self.payload[start:stop], self.scales[first:last], self.block)


def _flat32(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"codecs take a flat float32 vector; got shape {x.shape}")
    return x


def encode(x: np.ndarray, codec: str, block: int = BLOCK) -> Encoded:
    """``x`` (flat float32) in ``codec``."""
    x = _flat32(x)
    if codec == "bf16":
        return Encoded("bf16", x.size, _to_bf16(x))
    if codec == "int8":
        q, scales = _to_int8(x, block)
        return Encoded("int8", x.size, q, scales, block)
    raise ValueError(f"unknown codec {codec!r}; expected one of {', '.join(map(repr, CODECS))}")


def decode(e: Encoded) -> np.ndarray:
    """The float32 values ``e`` stands for."""
    if e.codec == "bf16":
        return (e.payload.astype(np.uint32) << 16).view(np.float32)
    out = e.payload.astype(np.float32)
    _scale_blocks(out, e.scales, e.block)
    return out


def add_decoded(acc: np.ndarray, e: Encoded, weight: float = 1.0) -> np.ndarray:
    """``acc += weight · decode(e)`` in float32, in place; returns ``acc``."""
    values = decode(e)
    if weight != 1.0:
        values *= np.float32(weight)
    np.add(acc, values, out=acc)
    return acc


def with_feedback(delta: np.ndarray, residual: Optional[np.ndarray], codec: str,
                  block: int = BLOCK) -> Tuple[Encoded, np.ndarray]:
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


def _to_int8(x: np.ndarray, block: int) -> Tuple[np.ndarray, np.ndarray]:
    if block < 1:
        raise ValueError(f"block must be >= 1; got {block}")
    blocks = -(-x.size // block)
    padded = np.zeros(blocks * block, dtype=np.float32)
    padded[: x.size] = x
    by_block = padded.reshape(blocks, block)
    scales = np.abs(by_block).max(axis=1) / np.float32(_INT8_MAX)
    scales = scales.astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1.0))
    q = np.rint(by_block / safe[:, None])
    np.clip(q, -_INT8_MAX, _INT8_MAX, out=q)
    return q.astype(np.int8).reshape(-1)[: x.size], scales


def _scale_blocks(values: np.ndarray, scales: np.ndarray, block: int) -> None:
    whole = values.size // block
    if whole:
        values[: whole * block].reshape(whole, block)[...] *= scales[:whole, None]
    if values.size > whole * block:
        values[whole * block:] *= scales[whole]
