"""Exact conversions between a user's values (Arrow arrays, numpy arrays) and the numbers and objects a model takes.

This module owns the value-level helpers every column kind (:mod:`sparkdl_avg.shared.data.kinds`) is built from:

- :func:`exact_cast`: numbers into the dtype of the model input they feed, refusing any integer conversion that would
  change a value (float32 holds integers exactly only up to 2^24);
- Arrow helpers: :func:`is_text`, :func:`is_list`, :func:`list_matrix` (a list column as a ``(rows, width)`` matrix),
  :func:`tensor_array` (the staged ``FixedSizeList`` layout of numbers);
- Spark's image struct: :func:`is_image_struct`, :func:`image_pixels` (BGR(A) bytes as RGB(A)
  ``(n, height, width, channels)`` arrays);
- :func:`raw_value`: any Arrow column as the closest numpy value (what a preprocessing function reads).

It runs on executors and on the driver and holds no state; it knows nothing of columns or kinds.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import DataError

IMAGE_FIELDS = ("origin", "height", "width", "nChannels", "mode", "data")
"""The fields of Spark's image struct (``spark.read.format("image")``), in its order."""


def _first(mask: np.ndarray) -> int:
    return int(np.argwhere(mask.reshape(len(mask), -1))[0][0])


def exact_cast(values: np.ndarray, dtype: str, name: str, advice: str = "", first_row: int = 0,
               where: str = "of its partition") -> np.ndarray:
    """``values`` as ``dtype``, refusing any conversion that would change a value.

    Integers stay exact: into a float type only while the float holds them (float32: up to 2^24, float64: 2^53), into
    a narrower integer type only within its range. Floats go into an integer type only when every value is a whole
    number in range. Floats into a narrower float type are rounded to it, as ``keras.Model.fit`` rounds float64 arrays
    to a float32 input.

    Args:
        values: One row per example.
        dtype: The target numpy dtype name.
        name: How the error names the values, e.g. ``"Column 'ids'"``.
        advice: What the user can do, appended to the message.
        first_row: Row number of ``values[0]``, for the message.
        where: What the row number counts in (``"of its partition"``, ``""``).

    Raises:
        DataError: naming ``name``, the first value that would change and the target dtype.
    """
    target = np.dtype(dtype)
    source = values.dtype
    if source == target or source.kind == "b" and target.kind in "biuf":
        return values.astype(target, copy=False)
    bad = None
    if source.kind in "iu":
        if target.kind == "f":
            limit = 2 ** (np.finfo(target).nmant + 1)
            bad = (values > limit) | (values < -limit)
            why = f"{target.name} holds integers exactly only up to 2^{np.finfo(target).nmant + 1}"
        elif target.kind in "iu":
            info = np.iinfo(target)
            if source.kind == "u" and target.kind == "i":
                bad = values > np.uint64(info.max)
            elif source.kind == "i" and target.kind == "u":
                bad = (values < 0) | (values.astype(np.int64) > np.int64(min(info.max, np.iinfo(np.int64).max)))
            else:
                bad = (values < info.min) | (values > info.max)
            why = f"{target.name} holds {info.min}..{info.max}"
        elif target.kind == "b":
            bad = (values != 0) & (values != 1)
            why = "bool holds 0 and 1"
    elif source.kind == "f":
        if target.kind == "f":
            return values.astype(target, copy=False)
        if target.kind in "iub":
            info = np.iinfo(target) if target.kind != "b" else None
            low, high = (info.min, info.max) if info else (0, 1)
            with np.errstate(invalid="ignore"):
                bad = ~np.isfinite(values) | (values != np.round(values)) | (values < low) | (values > high)
            why = f"{target.name} holds whole numbers in {low}..{high} only"
    if bad is None:
        raise DataError(f"{name} holds {source} values; expected numbers for a {target.name} input. {advice}".strip())
    if bad.any():
        row = _first(bad)
        value = values.reshape(len(values), -1)[row][bad.reshape(len(bad), -1)[row]][0]
        at = f"row {first_row + row}" + (f" {where}" if where else "")
        raise DataError(
            f"{name} holds {value.item()!r} ({at}), which {target.name} cannot hold exactly ({why}); "
            f"values are never rounded silently. {advice}".strip()
        )
    return values.astype(target)


# ----------------------------------------------------------------- Arrow


def is_text(data_type: pa.DataType) -> bool:
    return (pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type) or pa.types.is_string(data_type)
            or pa.types.is_large_string(data_type))


def is_list(data_type: pa.DataType) -> bool:
    return pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_fixed_size_list(data_type)


def list_matrix(column: pa.Array, name: str, width: Optional[int], first_row: int = 0) -> np.ndarray:
    """An Arrow list column whose rows all hold ``width`` values, as a ``(rows, width)`` array of its value type.

    ``width=None`` takes the first row's length (labels, whose width the staging job finds).

    Raises:
        DataError: a null row, a row of another length, or a null value inside a row.
    """
    if column.null_count:
        row = first_row + int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"Column '{name}' contains null rows (the first: row {row} of its partition); "
                        f"expected {width if width is not None else 'the same number of'} values per row.")
    if pa.types.is_fixed_size_list(column.type):
        lengths = np.full(len(column), column.type.list_size)
    else:
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    if width is None:
        width = int(lengths[0]) if len(lengths) else 0
    bad = np.flatnonzero(lengths != width)
    if bad.size:
        raise DataError(
            f"Column '{name}' has a row of {int(lengths[bad[0]])} values; expected "
            f"{width} values per row (the model's input or label size)."
        )
    values = column.flatten()
    if values.null_count:
        raise DataError(f"Column '{name}' contains null values inside its arrays; expected numbers only (fill them "
                        "before fitting, or drop those rows).")
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type) or pa.types.is_boolean(values.type)):
        raise DataError(f"Column '{name}' holds arrays of {values.type}; expected arrays of numbers.")
    return values.to_numpy(zero_copy_only=False).reshape(len(column), width)


def tensor_array(values: np.ndarray) -> pa.Array:
    """``(rows, width)`` numbers as the staged ``FixedSizeList`` column."""
    values = np.ascontiguousarray(values)
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1] if values.ndim > 1 else 1)


def is_image_struct(data_type: pa.DataType) -> bool:
    """Whether an Arrow type is Spark's image struct (``spark.read.format("image")``)."""
    return pa.types.is_struct(data_type) and {data_type.field(i).name for i in range(data_type.num_fields)} >= set(
        IMAGE_FIELDS[1:])


def image_pixels(column: pa.Array, shape: Tuple[int, int, int]) -> np.ndarray:
    """Spark image structs of one shape as ``(n, height, width, channels)`` uint8 in RGB(A) order.

    Spark's image source stores OpenCV's BGR(A); models trained on ``tf.io.decode_png``/``decode_jpeg`` output see
    RGB, so the channels are reversed once here.
    """
    data = column.field("data")
    raw = np.frombuffer(data.buffers()[2], dtype=np.uint8) if data.offset == 0 else None
    offsets = data.buffers()[1]
    if raw is None or offsets is None:
        pixels = np.stack([np.frombuffer(v.as_py(), np.uint8) for v in data]) if len(data) else np.empty((0,))
    else:
        starts = np.frombuffer(offsets, dtype=np.int32 if pa.types.is_binary(data.type) else np.int64)[: len(data)]
        size = math.prod(shape)
        pixels = raw[starts[:, None] + np.arange(size)[None, :]] if len(data) else np.empty((0, size), np.uint8)
    pixels = pixels.reshape((len(column), *shape))
    if shape[-1] in (3, 4):
        order = [2, 1, 0] + ([3] if shape[-1] == 4 else [])
        pixels = pixels[..., order]
    return pixels


def raw_value(array: pa.Array) -> Any:
    """A raw column's rows as what a preprocessing function gets.

    Numbers: a 1-D numpy array of their dtype; lists whose rows all have one length: a 2-D array (``(rows, length)``),
    else an object array of 1-D arrays; bytes and strings: an object array of ``bytes``/``str``; a struct (Spark's
    image struct too): a dict of its fields, each converted alike; timestamps: ``datetime64``.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    data_type = array.type
    if pa.types.is_struct(data_type):
        return {data_type.field(i).name: raw_value(array.field(i)) for i in range(data_type.num_fields)}
    if is_list(data_type) and array.null_count == 0:
        lengths = (np.full(len(array), data_type.list_size) if pa.types.is_fixed_size_list(data_type)
                   else pc.list_value_length(array).to_numpy(zero_copy_only=False))
        inner = array.flatten()
        if len(lengths) and (lengths == lengths[0]).all() and not (is_list(inner.type) or pa.types.is_struct(inner.type)):
            return np.asarray(raw_value(inner)).reshape(len(array), int(lengths[0]))
        values, out, at = raw_value(inner), np.empty(len(array), dtype=object), 0
        for i, n in enumerate(lengths):
            out[i] = values[at: at + int(n)]
            at += int(n)
        return out
    if is_text(data_type):
        out = np.empty(len(array), dtype=object)
        out[:] = array.to_pylist()
        return out
    return array.to_numpy(zero_copy_only=False)
