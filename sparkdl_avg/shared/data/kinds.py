"""Column kinds: what each kind of staged column holds, and how it is chosen, staged, checked and read.

A staged column (:class:`~sparkdl_avg.shared.data.columns.Column`) names its kind (``Column.kind``); the kind is a
:class:`ColumnKind` found by that name in this module's registry (``KINDS.get(name)``, :data:`KINDS`), and every
question about a column's kind is put to it, on the driver and on the executors alike:

- ``"tensor"`` (:class:`TensorKind`): numbers of a fixed shape (numeric arrays, numbers, ``pyspark.ml`` Vectors,
  labels, sample weights, ids), staged as a ``FixedSizeList`` of ``field.width`` values of ``field.dtype``;
- ``"text"`` (:class:`TextKind`): one ``binary`` or ``string`` value per row, as it came, for a string input;
- ``"image"`` (:class:`ImageKind`): Spark's image struct as it came, read as ``(height, width, channels)`` arrays in
  RGB(A) order;
- ``"raw"`` (:class:`RawKind`): any Arrow type, as it came: the columns a preprocessing function reads.

Which kind a model input's column is, is chosen here too, in one place per kind of data: :func:`kind_for_field` for
data without a schema (numpy arrays, RDD elements), :func:`kind_for_spark` for a DataFrame column (the kinds are asked
in registration order; the first that takes the column wins). A new kind is one class here, registered with
``@KINDS.register``. The staged files' format is the kinds' business and stays as it is.

It runs on executors and on the driver and holds no state but the registry; the value-level conversions are
:mod:`sparkdl_avg.shared.data.conversions`'.
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import DataError
from ..registry import Registry
from .conversions import (exact_cast, image_pixels, is_image_struct, is_list, is_text, list_matrix, raw_value,
                          tensor_array)

TEXT = "string"
"""The dtype of a :class:`~sparkdl_avg.shared.data.columns.Field` of bytes or text (``keras.Input(..., dtype="string")``)."""

STRING_INPUT_ADVICE = (
    "Give the model a string input (keras.Input(shape=(1,), dtype='string')) and decode in a layer "
    "(tf.io.decode_png, TextVectorization), or pass preprocess= a function that turns the column into the "
    "model's input (docs/guides/data.md, \"Images, text and ids\")."
)


def input_name(k: int, count: int) -> str:
    """How messages name model input ``k`` of ``count``: "the model's input" when it has one."""
    return f"the model's input {k}" if count > 1 else "the model's input"


def _first_null(column: pa.Array, first_row: int) -> int:
    return first_row + int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])


class ColumnKind:
    """One kind of staged column, behind the protocol every kind implements.

    ``spec`` below is the :class:`~sparkdl_avg.shared.data.columns.Column` the values belong to (its ``field``,
    ``source``, ``role`` and ``index``).

    Attributes:
        name: ``Column.kind``, its key in the registry.
        numeric: Whether the column is staged as a ``FixedSizeList`` of numbers: read as zero-copy views of the mapped
            file, checked by ``check_data`` (finite values, label ranges, weights), and a label column whose width the
            staging job finds.
    """

    name: str = ""
    numeric: bool = False

    # -- choosing (driver)

    def takes_field(self, field) -> bool:
        """Whether a model input of ``field`` is fed by a column of this kind in data without a schema (numpy, RDDs)."""
        return False

    def spark_input(self, source, data_type, metadata: dict, field, name: str, input_name: str):
        """How DataFrame column ``name`` (of Spark SQL ``data_type``, as ``source``) feeds ``input_name`` of ``field``.

        Returns the expression to stage, or ``None`` when this kind does not take the column (the next kind is asked).

        Raises:
            DataError: the column is this kind's, but does not fit the input.
        """
        return None

    def check_array(self, x: np.ndarray, field, name: str, input_name: str, what: str) -> None:
        """Refuses a numpy array ``x`` (``(rows, ...)``) that cannot feed ``input_name`` of ``field``."""

    # -- staging (executors; the driver for numpy arrays)

    def stage_arrow(self, column: pa.Array, spec, first_row: int = 0) -> pa.Array:
        """One column of a DataFrame's partition (an Arrow array) as the staged array of ``spec``."""
        return column

    def stage_numpy(self, values: np.ndarray, spec) -> pa.Array:
        """A numpy array (``(rows, ...)``) as the staged array of ``spec`` (numpy data and RDDs)."""
        raise TypeError(f"{self.name} columns are staged from DataFrames only")

    def element(self, part: Any, spec, where: str, which: str) -> Any:
        """One RDD element's value for the column ``spec`` (``where``: the element, ``which``: the input), checked."""
        raise TypeError(f"{self.name} columns are staged from DataFrames only")

    def stack(self, values: List[Any]) -> np.ndarray:
        """A partition's :meth:`element` values as one array for :meth:`stage_numpy`."""
        return np.stack(values)

    # -- reading (executors, the driver's checks)

    def read(self, array: pa.Array, spec) -> Any:
        """The staged rows ``array`` of column ``spec`` as the model or the preprocessing function gets them."""
        return raw_value(array)

    def arrow_value(self, array: pa.Array, spec) -> Any:
        """A column of a DataFrame's batch, not staged (``predict``'s input), as :meth:`read` gives staged rows."""
        return self.read(self.stage_arrow(array, spec), spec)


#: The kinds by ``Column.kind`` name (one instance each), asked in registration order; staged files record the names.
KINDS = Registry("kind", "column kind", instances=True, unknown=lambda name, names: ValueError(
    f"Unknown column kind {name!r}; the column kinds are {sorted(names)}."))


def kind_for_field(field) -> ColumnKind:
    """The kind of the column that feeds a model input of ``field`` from numpy arrays or RDD elements."""
    for kind in KINDS.entries():
        if kind.takes_field(field):
            return kind
    raise ValueError(f"No column kind takes a model input of {field}; the column kinds are {sorted(KINDS.names())}.")


def kind_for_spark(source, data_type, metadata: dict, field, name: str,
                   input_name: str) -> Optional[Tuple[ColumnKind, Any]]:
    """``(kind, expression)`` for DataFrame column ``name`` feeding ``input_name`` (:meth:`ColumnKind.spark_input`).

    ``None`` when no kind takes it (the caller's message says what would).
    """
    for kind in KINDS.entries():
        expr = kind.spark_input(source, data_type, metadata, field, name, input_name)
        if expr is not None:
            return kind, expr
    return None


# ----------------------------------------------------------------- the kinds


def _input_advice(spec) -> str:
    if spec.role != "x":
        return ""
    return (f"Declare the model's input {spec.index} with the dtype the values need (keras.Input(..., "
            "dtype='int64') for ids), or cast the column yourself if rounding is what you want.")


@KINDS.register
class TextKind(ColumnKind):
    """Bytes or text, one value per row, staged as they came (``binary``/``string``, ``large_*`` kept)."""

    name = "text"

    def takes_field(self, field) -> bool:
        return field.dtype == TEXT

    def spark_input(self, source, data_type, metadata, field, name, input_name):
        from pyspark.sql import types as T

        if field.dtype != TEXT:
            return None
        if not isinstance(data_type, (T.BinaryType, T.StringType)):
            raise DataError(f"Column '{name}' must be binary or string for {input_name}, a string "
                            f"input. Got {data_type.simpleString()} instead.")
        if field.width != 1:
            raise DataError(f"{input_name[0].upper()}{input_name[1:]} is a string input of "
                            f"shape {field.shape}; a string column feeds inputs of shape () or (1,).")
        return source

    def check_array(self, x, field, name, input_name, what) -> None:
        if math.prod(x.shape[1:]) != 1:
            raise DataError(f"{name} must hold one string per example for {input_name}. "
                            f"Got shape {x.shape} instead.")

    def stage_arrow(self, column, spec, first_row=0):
        """Refuses another type and nulls."""
        if not is_text(column.type):
            raise DataError(f"Column '{spec.source}' holds {column.type}; expected binary or string values "
                            f"(the model's input {spec.index} is a string input).")
        if column.null_count:
            raise DataError(f"Column '{spec.source}' contains null values (the first: row "
                            f"{_first_null(column, first_row)} of its partition); expected bytes or text in every row.")
        return column

    def stage_numpy(self, values, spec):
        flat = values.reshape(len(values))
        if flat.dtype.kind == "S" or (flat.dtype == object and all(isinstance(v, (bytes, bytearray)) for v in flat)):
            return pa.array([bytes(v) for v in flat], pa.binary())
        if flat.dtype.kind == "U" or (flat.dtype == object and all(isinstance(v, str) for v in flat)):
            return pa.array([str(v) for v in flat], pa.string())
        raise DataError(f"{spec.source} must hold bytes or str for the model's string input {spec.index}. "
                        f"Got dtype {flat.dtype} instead.")

    def element(self, part, spec, where, which):
        return part

    def stack(self, values):
        return np.array(values, dtype=object)

    def read(self, array, spec):
        out = np.empty(len(array), dtype=object)
        out[:] = array.to_pylist()
        return out.reshape((len(array), *spec.field.shape))


@KINDS.register
class TensorKind(ColumnKind):
    """Numbers of a fixed shape, converted exactly to the model input's dtype (:func:`exact_cast`)."""

    name = "tensor"
    numeric = True

    def takes_field(self, field) -> bool:
        return field.dtype != TEXT

    def spark_input(self, source, data_type, metadata, field, name, input_name):
        from pyspark.ml.functions import vector_to_array
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql import types as T

        if field.dtype == TEXT:
            return None
        if isinstance(data_type, VectorUDT):
            size = metadata.get("ml_attr", {}).get("num_attrs")
            if size is not None and size != field.width:
                raise DataError(
                    f"Column '{name}' holds vectors of size {size}; expected {field.width} "
                    f"values per row (the model's input shape {tuple(field.shape)})."
                )
            return vector_to_array(source, "float32" if field.dtype == "float32" else "float64")
        if isinstance(data_type, T.ArrayType) and isinstance(data_type.elementType, (T.NumericType, T.BooleanType)):
            return source
        if isinstance(data_type, (T.NumericType, T.BooleanType)) and field.width == 1:
            return source
        return None

    def check_array(self, x, field, name, input_name, what) -> None:
        if not (np.issubdtype(x.dtype, np.number) or x.dtype == bool):
            advice = f" {STRING_INPUT_ADVICE}" if x.dtype.kind in "SUO" else ""
            raise DataError(f"The {what} array x must be numeric. Got dtype {x.dtype} instead.{advice}")
        if tuple(x.shape[1:]) != tuple(field.shape) and math.prod(x.shape[1:]) != field.width:
            raise DataError(
                f"The {what} features must fit the model's input shape {tuple(field.shape)}. "
                f"Got x with shape {x.shape} instead."
            )

    @staticmethod
    def values(column: pa.Array, spec, first_row: int = 0) -> np.ndarray:
        """A column of a partition (numbers, arrays of numbers) as ``(rows, width)`` numbers of its dtype."""
        field = spec.field
        width = None if field is None else field.width
        if is_list(column.type):
            values = list_matrix(column, spec.source, width, first_row)
        elif pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_boolean(column.type):
            if column.null_count:
                what = "labels" if spec.role == "y" else "sample weights" if spec.role == "w" else "values"
                raise DataError(f"Column '{spec.source}' contains null {what} (the first: row "
                                f"{_first_null(column, first_row)} of its partition); expected a number in every row "
                                f"(drop or fill them: df.na.drop(subset=['{spec.source}'])).")
            if width not in (None, 1):
                raise DataError(f"Column '{spec.source}' holds one number per row; expected {width} values per row "
                                f"(the model's input shape {field.shape}).")
            values = column.to_numpy(zero_copy_only=False).reshape(-1, 1)
        else:
            raise DataError(f"Column '{spec.source}' holds {column.type}; expected numbers or arrays of numbers.")
        if field is None:
            return values
        return exact_cast(values, field.dtype, f"Column '{spec.source}'", _input_advice(spec), first_row)

    def stage_arrow(self, column, spec, first_row=0):
        return tensor_array(self.values(column, spec, first_row))

    def stage_numpy(self, values, spec):
        values = values.reshape(len(values), -1)
        if not (np.issubdtype(values.dtype, np.number) or values.dtype == bool):
            raise DataError(f"{spec.source} must be numeric. Got dtype {values.dtype} instead.")
        if spec.field is not None:
            values = exact_cast(values, spec.field.dtype, spec.source, _input_advice(spec), where="")
        return tensor_array(values)

    def element(self, part, spec, where, which):
        part = np.asarray(part).reshape(-1)
        if part.size != spec.field.width:
            raise DataError(
                f"{where} has features of {part.size} values{which}; expected {spec.field.width} "
                f"(the model's input size)."
            )
        return part

    def read(self, array, spec):
        raise TypeError("tensor columns are read as views of the mapped file (sparkdl_avg.shared.data.staged_dataset)")

    def arrow_value(self, array, spec):
        return self.values(array, spec).reshape((len(array), *spec.field.shape))


def _arrow_struct(struct_type) -> pa.DataType:
    """A Spark SQL struct type's field names as an Arrow struct (for :func:`is_image_struct`)."""
    return pa.struct([pa.field(f.name, pa.null()) for f in struct_type.fields])


@KINDS.register
class ImageKind(ColumnKind):
    """Spark's image struct (``spark.read.format("image")``) as it came; read as RGB(A) arrays of ``field.dtype``."""

    name = "image"

    def spark_input(self, source, data_type, metadata, field, name, input_name):
        from pyspark.sql import types as T

        if isinstance(data_type, T.StructType) and is_image_struct(_arrow_struct(data_type)) and len(field.shape) == 3:
            return source
        return None

    def stage_arrow(self, column, spec, first_row=0):
        """Refuses nulls and images of another shape than the model's input."""
        height, width, channels = spec.field.shape
        if column.null_count:
            raise DataError(f"Column '{spec.source}' contains a null image (row {_first_null(column, first_row)} "
                            "of its partition).")
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

    def read(self, array, spec):
        return image_pixels(array, spec.field.shape).astype(spec.field.dtype, copy=False)


@KINDS.register
class RawKind(ColumnKind):
    """Any Arrow type, as it came: a column a preprocessing function reads (:func:`raw_value`)."""

    name = "raw"
