"""What one staged column is, and how a user's values become it and come back out, exactly.

This module owns :class:`Field` (what a model input, a label or a sample
weight is per example: shape and dtype), :class:`Column` (one column of a
staged file: where it came from, what it holds, how it is stored) and the
conversions between a user's values and a column:

- :func:`stage_arrow` and :func:`stage_numpy` turn an Arrow column of a
  DataFrame's partition, or a numpy array, into the staged Arrow array:
  numbers in the dtype of the model input they feed (:func:`exact_cast`
  refuses any integer conversion that would change a value: float32 holds
  integers exactly only up to 2^24), bytes and text as they came, Spark's
  image struct as it came;
- :func:`read_column` turns the staged rows of one column back into what
  the model or the preprocessing function gets: numpy arrays of the
  column's dtype, object arrays of ``bytes``/``str`` for text, images as
  ``(n, height, width, channels)`` arrays, and anything else (the raw
  columns a preprocessing function reads) as the closest numpy value.

It runs on executors and on the driver and holds no driver state; which
columns a dataset has is :mod:`sparkdl_avg.driver.data.staging`'s business, the
file that holds them :mod:`sparkdl_avg.shared.data.staged_dataset`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import DataError

TEXT = "string"
"""The dtype of a :class:`Field` that holds bytes or text (a ``keras.Input(..., dtype="string")``)."""

IMAGE_FIELDS = ("origin", "height", "width", "nChannels", "mode", "data")
"""The fields of Spark's image struct (``spark.read.format("image")``), in its order."""

_IMAGE_MODES = {0: 1, 16: 3, 24: 4}  # OpenCV types Spark's image source writes (CV_8UC1, CV_8UC3, CV_8UC4) -> channels


@dataclass(frozen=True)
class Field:
    """One value per example that the model gets: a model input, a label or a sample weight.

    Attributes:
        shape: The example's shape (no batch dimension); ``()`` for one value.
        dtype: A numpy dtype name (``"float32"``, ``"int64"``, ...) or
            :data:`TEXT` for bytes and strings.
    """

    shape: Optional[Tuple[int, ...]]
    dtype: str

    @property
    def width(self) -> Optional[int]:
        """Values per example; ``None`` while the shape is unknown (a label array before staging)."""
        return None if self.shape is None else math.prod(self.shape)


@dataclass(frozen=True)
class Column:
    """One column of a staged file.

    Attributes:
        name: The column's name in the file.
        source: The user's column (or array) it came from, for messages.
        kind: ``"tensor"`` (numbers of a fixed shape, stored as a
            ``FixedSizeList`` of ``field.width`` values of ``field.dtype``),
            ``"text"`` (one ``binary`` or ``string`` value per row, as it
            came), ``"image"`` (Spark's image struct as it came, read as
            ``(height, width, channels)`` arrays in RGB(A) order, cast to
            ``field.dtype``) or ``"raw"`` (any Arrow type, as it came: the
            columns a preprocessing function reads).
        field: Shape and dtype of one example of the column as read
            (``"tensor"``, ``"text"``, ``"image"``); ``None`` for ``"raw"``.
            A label array's shape is ``None`` until the staging job finds
            its width.
        role: ``"x"`` (a model input), ``"y"`` (a label), ``"w"`` (sample
            weights) or ``"raw"``: which checks apply while staging.
        index: The model input or output it feeds (for labels: which loss
            checks its values).
    """

    name: str
    source: str
    kind: str
    field: Optional[Field] = None
    role: str = "x"
    index: int = 0


# ----------------------------------------------------------------- exactness


def _first(mask: np.ndarray) -> int:
    return int(np.argwhere(mask.reshape(len(mask), -1))[0][0])


def exact_cast(values: np.ndarray, dtype: str, name: str, advice: str = "", first_row: int = 0,
               where: str = "of its partition") -> np.ndarray:
    """``values`` as ``dtype``, refusing any conversion that would change a value.

    Integers stay exact: into a float type only while the float holds them
    (float32: up to 2^24, float64: 2^53), into a narrower integer type only
    within its range. Floats go into an integer type only when every value
    is a whole number in range. Floats into a narrower float type are
    rounded to it, as ``keras.Model.fit`` rounds float64 arrays to a
    float32 input.

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


# ----------------------------------------------------------------- staging


def is_text(data_type: pa.DataType) -> bool:
    return (pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type) or pa.types.is_string(data_type)
            or pa.types.is_large_string(data_type))


def _is_list(data_type: pa.DataType) -> bool:
    return pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_fixed_size_list(data_type)


def list_matrix(column: pa.Array, name: str, width: Optional[int], first_row: int = 0) -> np.ndarray:
    """An Arrow list column whose rows all hold ``width`` values, as a ``(rows, width)`` array of its value type.

    ``width=None`` takes the first row's length (labels, whose width the
    staging job finds).

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
        raise DataError(f"Column '{name}' contains null values inside its arrays.")
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type) or pa.types.is_boolean(values.type)):
        raise DataError(f"Column '{name}' holds arrays of {values.type}; expected arrays of numbers.")
    return values.to_numpy(zero_copy_only=False).reshape(len(column), width)


def tensor_array(values: np.ndarray) -> pa.Array:
    """``(rows, width)`` numbers as the staged ``FixedSizeList`` column."""
    values = np.ascontiguousarray(values)
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1] if values.ndim > 1 else 1)


def _input_advice(column: Column) -> str:
    if column.role != "x":
        return ""
    return (f"Declare the model's input {column.index} with the dtype the values need (keras.Input(..., "
            "dtype='int64') for ids), or cast the column yourself if rounding is what you want.")


def tensor_values(column: pa.Array, spec: Column, first_row: int = 0) -> np.ndarray:
    """A tensor column of a DataFrame partition (numbers, arrays of numbers) as ``(rows, width)`` numbers of its dtype."""
    field = spec.field
    width = None if field is None else field.width
    if _is_list(column.type):
        values = list_matrix(column, spec.source, width, first_row)
    elif pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_boolean(column.type):
        if column.null_count:
            row = first_row + int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            what = "labels" if spec.role == "y" else "sample weights" if spec.role == "w" else "values"
            raise DataError(f"Column '{spec.source}' contains null {what} (the first: row {row} of its partition).")
        if width not in (None, 1):
            raise DataError(f"Column '{spec.source}' holds one number per row; expected {width} values per row "
                            f"(the model's input shape {field.shape}).")
        values = column.to_numpy(zero_copy_only=False).reshape(-1, 1)
    else:
        raise DataError(f"Column '{spec.source}' holds {column.type}; expected numbers or arrays of numbers.")
    if field is None:
        return values
    return exact_cast(values, field.dtype, f"Column '{spec.source}'", _input_advice(spec), first_row)


def check_text(column: pa.Array, spec: Column, first_row: int = 0) -> pa.Array:
    """A bytes or text column of a partition, as it came (``large_*`` types kept); refuses nulls."""
    if not is_text(column.type):
        raise DataError(f"Column '{spec.source}' holds {column.type}; expected binary or string values "
                        f"(the model's input {spec.index} is a string input).")
    if column.null_count:
        row = first_row + int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"Column '{spec.source}' contains null values (the first: row {row} of its partition); "
                        "expected bytes or text in every row.")
    return column


def is_image_struct(data_type: pa.DataType) -> bool:
    """Whether an Arrow type is Spark's image struct (``spark.read.format("image")``)."""
    return pa.types.is_struct(data_type) and {data_type.field(i).name for i in range(data_type.num_fields)} >= set(
        IMAGE_FIELDS[1:])


def check_images(column: pa.Array, spec: Column, first_row: int = 0) -> pa.Array:
    """An image-struct column of a partition, as it came, once every image fits the model's input shape."""
    height, width, channels = spec.field.shape
    if column.null_count:
        row = first_row + int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"Column '{spec.source}' contains a null image (row {row} of its partition).")
    dims = np.stack([column.field(f).to_numpy(zero_copy_only=False) for f in ("height", "width", "nChannels")], 1)
    lengths = pc.binary_length(column.field("data")).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero((dims != (height, width, channels)).any(axis=1) | (lengths != height * width * channels))
    if bad.size:
        i = int(bad[0])
        origin = column.field("origin")[i].as_py() if "origin" in column.type.names else None
        raise DataError(
            f"Column '{spec.source}' holds an image of {dims[i][0]}x{dims[i][1]}x{dims[i][2]} (height x width x "
            f"channels; row {first_row + i} of its partition" + (f", origin {origin!r}" if origin else "")
            + f"); the model's input {spec.index} takes {height}x{width}x{channels}. Resize the images first, or "
            "pass preprocess= a function that does."
        )
    return column


def stage_arrow(column: pa.Array, spec: Column, first_row: int = 0) -> pa.Array:
    """One column of a DataFrame's partition (an Arrow array) as the staged array of ``spec``."""
    if spec.kind == "tensor":
        return tensor_array(tensor_values(column, spec, first_row))
    if spec.kind == "text":
        return check_text(column, spec, first_row)
    if spec.kind == "image":
        return check_images(column, spec, first_row)
    return column


def stage_numpy(values: np.ndarray, spec: Column) -> pa.Array:
    """A numpy array (``(rows, ...)``) as the staged array of ``spec`` (numpy data and RDDs)."""
    if spec.kind == "text":
        flat = values.reshape(len(values))
        if flat.dtype.kind == "S" or (flat.dtype == object and all(isinstance(v, (bytes, bytearray)) for v in flat)):
            return pa.array([bytes(v) for v in flat], pa.binary())
        if flat.dtype.kind == "U" or (flat.dtype == object and all(isinstance(v, str) for v in flat)):
            return pa.array([str(v) for v in flat], pa.string())
        raise DataError(f"{spec.source} must hold bytes or str for the model's string input {spec.index}. "
                        f"Got dtype {flat.dtype} instead.")
    values = values.reshape(len(values), -1)
    if not (np.issubdtype(values.dtype, np.number) or values.dtype == bool):
        raise DataError(f"{spec.source} must be numeric. Got dtype {values.dtype} instead.")
    if spec.field is not None:
        values = exact_cast(values, spec.field.dtype, spec.source, _input_advice(spec), where="")
    return tensor_array(values)


# ----------------------------------------------------------------- reading


def image_pixels(column: pa.Array, shape: Tuple[int, int, int]) -> np.ndarray:
    """Spark image structs of one shape as ``(n, height, width, channels)`` uint8 in RGB(A) order.

    Spark's image source stores OpenCV's BGR(A); models trained on
    ``tf.io.decode_png``/``decode_jpeg`` output see RGB, so the channels are
    reversed once here.
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

    Numbers: a 1-D numpy array of their dtype; lists whose rows all have one
    length: a 2-D array (``(rows, length)``), else an object array of 1-D
    arrays; bytes and strings: an object array of ``bytes``/``str``; a
    struct (Spark's image struct too): a dict of its fields, each converted
    alike; timestamps: ``datetime64``.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    data_type = array.type
    if pa.types.is_struct(data_type):
        return {data_type.field(i).name: raw_value(array.field(i)) for i in range(data_type.num_fields)}
    if _is_list(data_type) and array.null_count == 0:
        lengths = (np.full(len(array), data_type.list_size) if pa.types.is_fixed_size_list(data_type)
                   else pc.list_value_length(array).to_numpy(zero_copy_only=False))
        inner = array.flatten()
        if len(lengths) and (lengths == lengths[0]).all() and not (_is_list(inner.type) or pa.types.is_struct(inner.type)):
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


def arrow_value(array: pa.Array, spec: Column) -> Any:
    """A column of a DataFrame's batch, not staged (``predict``'s input), as :func:`read_column` gives staged rows."""
    if spec.kind == "tensor":
        return tensor_values(array, spec).reshape((len(array), *spec.field.shape))
    if spec.kind == "text":
        check_text(array, spec)
    elif spec.kind == "image":
        check_images(array, spec)
    return read_column(array, spec)


def read_column(array: pa.Array, spec: Column) -> Any:
    """The staged rows ``array`` of column ``spec`` as the model or the preprocessing function gets them."""
    if spec.kind == "tensor":
        raise TypeError("tensor columns are read as views of the mapped file (sparkdl_avg.shared.data.staged_dataset)")
    if spec.kind == "text":
        out = np.empty(len(array), dtype=object)
        out[:] = array.to_pylist()
        return out.reshape((len(array), *spec.field.shape))
    if spec.kind == "image":
        return image_pixels(array, spec.field.shape).astype(spec.field.dtype, copy=False)
    return raw_value(array)
