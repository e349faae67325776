"""Driver side of the data path: checks the user's data and stages it once.

``stage`` accepts a Spark DataFrame, an RDD of ``(x, y)`` pairs or a tuple of
numpy arrays, checks what it can on the driver (types, columns, widths known
from the schema) and writes the examples to the staging directory in the
format of :mod:`sparkdl_avg.staging`: one Spark job for a DataFrame or an
RDD, none for arrays. The driver only ever receives one small row per
partition, never the data.
"""

from __future__ import annotations

import math
import uuid
from functools import partial
from typing import Any, Callable, Optional, Tuple, TypeVar

import numpy as np

from .errors import DATA_ERROR_MARKER, DataError
from .staging import StagedDataset, StagedFile, export_arrow_batches, export_pairs, join, write_examples

T = TypeVar("T")


def spark_context_for(data: Any):
    """The SparkContext that owns ``data``, or the active one for numpy arrays."""
    from pyspark import RDD, SparkContext
    from pyspark.sql import DataFrame

    if isinstance(data, DataFrame):
        return data.sparkSession.sparkContext
    if isinstance(data, RDD):
        return data.context
    sc = SparkContext._active_spark_context
    if sc is None:
        raise DataError(
            "Training on numpy arrays needs an active SparkSession; create one with "
            "SparkSession.builder.getOrCreate() first."
        )
    return sc


def run_spark_job(job: Callable[[], T]) -> T:
    """Runs a Spark action, turning executor-side data errors into ``DataError``."""
    try:
        return job()
    except Exception as exc:  # Py4JJavaError / PythonException carry the text
        text = str(exc)
        at = text.find(DATA_ERROR_MARKER)
        if at < 0:
            raise
        message = text[at + len(DATA_ERROR_MARKER) :].splitlines()[0]
        raise DataError(message) from None


def _label_dtype(is_integer: bool, x_dtype: str) -> str:
    return "int32" if is_integer else x_dtype


def _stage_arrays(data, directory: str, x_shape, x_dtype: str, what: str) -> StagedDataset:
    x, y = (np.asarray(a) for a in data)
    width = math.prod(x_shape)
    if x.ndim < 1 or len(x) == 0:
        raise DataError(f"The {what} arrays are empty. Received: x with shape {x.shape}.")
    if len(x) != len(y):
        raise DataError(
            f"The {what} arrays must have the same number of examples. Received: "
            f"x with {len(x)} and y with {len(y)}."
        )
    if tuple(x.shape[1:]) != tuple(x_shape) and math.prod(x.shape[1:]) != width:
        raise DataError(
            f"The {what} features do not fit the model's input shape {tuple(x_shape)}. "
            f"Received: x with shape {x.shape}."
        )
    for name, a in (("x", x), ("y", y)):
        if not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
            raise DataError(f"The {what} array {name} must be numeric. Received: dtype {a.dtype}.")
    y_dtype = _label_dtype(np.issubdtype(y.dtype, np.integer) or y.dtype == bool, x_dtype)
    uri = join(directory, "part-00000.arrow")
    write_examples(uri, x.astype(x_dtype, copy=False), y.astype(y_dtype, copy=False))
    return StagedDataset((StagedFile(uri, len(x)),), tuple(x_shape), tuple(y.shape[1:]), x_dtype, y_dtype)


def _check_columns(df, what: str, **columns: str) -> dict:
    """Checks that each named column exists; returns the DataFrame's fields by name."""
    fields = {f.name: f for f in df.schema.fields}
    for param, name in columns.items():
        if not isinstance(name, str) or name not in fields:
            raise DataError(
                f"Column {name!r} ('{param}') is not in the {what} DataFrame. "
                f"Available columns: {sorted(fields)}."
            )
    return fields


def feature_column(df, features_col: str, x_shape, x_dtype: str, what: str = "training"):
    """The features of ``df`` as an ``array<float|double>`` column expression.

    Accepts numeric arrays and ``pyspark.ml`` Vectors; a Vector size known
    from the schema's ML metadata (``VectorAssembler`` writes it) is checked
    against the model's input size here, on the driver.

    Raises:
        DataError: the column is missing, of another type, or of the wrong size.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    width = math.prod(x_shape)
    field = _check_columns(df, what, features_col=features_col)[features_col]
    if isinstance(field.dataType, VectorUDT):
        size = field.metadata.get("ml_attr", {}).get("num_attrs")
        if size is not None and size != width:
            raise DataError(
                f"Column '{features_col}' holds vectors of size {size}; expected {width} "
                f"values per row (the model's input shape {tuple(x_shape)})."
            )
        return vector_to_array(F.col(features_col), "float32" if x_dtype == "float32" else "float64")
    if isinstance(field.dataType, T.ArrayType) and isinstance(field.dataType.elementType, T.NumericType):
        return F.col(features_col).cast(f"array<{'float' if x_dtype == 'float32' else 'double'}>")
    raise DataError(
        f"Column '{features_col}' must be array<float>, array<double> or a "
        f"pyspark.ml Vector. Received: {field.dataType.simpleString()}."
    )


def _stage_dataframe(df, features_col, label_col, directory, x_shape, x_dtype, what) -> StagedDataset:
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    width = math.prod(x_shape)
    fields = _check_columns(df, what, features_col=features_col, label_col=label_col)
    features = feature_column(df, features_col, x_shape, x_dtype, what)
    float_name = "float" if x_dtype == "float32" else "double"
    label_type = fields[label_col].dataType
    if isinstance(label_type, T.NumericType):
        is_int = isinstance(label_type, T.IntegralType)
        label = F.col(label_col).cast("int" if is_int else float_name)
    elif isinstance(label_type, T.ArrayType) and isinstance(label_type.elementType, T.NumericType):
        is_int = False
        label = F.col(label_col).cast(f"array<{float_name}>")
    elif isinstance(label_type, VectorUDT):
        is_int = False
        label = vector_to_array(F.col(label_col), "float32" if x_dtype == "float32" else "float64")
    else:
        raise DataError(
            f"Column '{label_col}' must be numeric, an array of numbers or a pyspark.ml "
            f"Vector. Received: {label_type.simpleString()}."
        )
    y_dtype = _label_dtype(is_int, x_dtype)
    selected = df.select(features.alias(features_col), label.alias(label_col))
    body = partial(
        export_arrow_batches,
        directory=directory,
        features_col=features_col,
        label_col=label_col,
        x_width=width,
        x_dtype=x_dtype,
        y_dtype=y_dtype,
    )
    rows = run_spark_job(
        lambda: selected.mapInArrow(body, "uri string, rows long, label_width int").collect()
    )
    widths = {r.label_width for r in rows if r.rows}
    if len(widths) > 1:
        raise DataError(f"Column '{label_col}' has arrays of different lengths: {sorted(widths)}.")
    y_shape = () if not widths or widths == {0} else (widths.pop(),)
    files = tuple(StagedFile(r.uri, r.rows) for r in rows if r.rows)
    return StagedDataset(files, tuple(x_shape), y_shape, x_dtype, y_dtype)


def _stage_rdd(rdd, directory, x_shape, x_dtype, what) -> StagedDataset:
    body = partial(export_pairs, directory=directory, x_width=math.prod(x_shape), x_dtype=x_dtype, y_dtype=x_dtype)
    rows = run_spark_job(lambda: rdd.mapPartitionsWithIndex(body).collect())
    shapes = {shape for _, n, shape in rows if n}
    if len(shapes) > 1:
        raise DataError(f"The {what} RDD has labels of different shapes: {sorted(shapes)}.")
    files = tuple(StagedFile(uri, n) for uri, n, _ in rows if n)
    return StagedDataset(files, tuple(x_shape), shapes.pop() if shapes else (), x_dtype, x_dtype)


def stage(
    data: Any,
    *,
    root: str,
    x_shape: Tuple[int, ...],
    x_dtype: str,
    features_col: str = "features",
    label_col: str = "label",
    what: str = "training",
) -> StagedDataset:
    """Writes ``data`` to a new directory under ``root`` and describes it.

    Args:
        data: Spark DataFrame, RDD of ``(x, y)`` pairs, or ``(x, y)`` arrays.
        root: Staging root (local path or ``pyarrow.fs`` URI).
        x_shape: The model's input shape without the batch dimension.
        x_dtype: The model input's dtype (``float32`` or ``float64``).
        features_col: DataFrame column of the features.
        label_col: DataFrame column of the label.
        what: Name of the data in error messages ("training", "validation").

    Raises:
        DataError: naming the column or array and what was received.
    """
    from pyspark import RDD
    from pyspark.sql import DataFrame

    directory = join(root, f"{what}-{uuid.uuid4().hex[:12]}")
    if isinstance(data, DataFrame):
        staged = _stage_dataframe(data, features_col, label_col, directory, x_shape, x_dtype, what)
    elif isinstance(data, RDD):
        staged = _stage_rdd(data, directory, x_shape, x_dtype, what)
    elif isinstance(data, (tuple, list)) and len(data) == 2:
        staged = _stage_arrays(data, directory, x_shape, x_dtype, what)
    else:
        raise DataError(
            f"Expected the {what} data to be a Spark DataFrame, an RDD of (x, y) pairs or "
            f"a tuple (x, y) of numpy arrays. Received: {type(data).__name__}."
        )
    if staged.num_examples == 0:
        raise DataError(f"The {what} data is empty (0 rows).")
    return staged


def data_key(data: Any, features_col: str, label_col: str) -> Optional[tuple]:
    """A key under which staged data is reused when the same data is fitted again.

    DataFrames and RDDs are immutable, so their identity suffices; arrays are
    keyed by a hash of their contents, so changing them in place re-stages.
    """
    import hashlib

    from pyspark import RDD
    from pyspark.sql import DataFrame

    if isinstance(data, (DataFrame, RDD)):
        return (id(data), features_col, label_col)
    if isinstance(data, (tuple, list)) and len(data) == 2:
        digest = hashlib.sha1()
        for a in data:
            a = np.ascontiguousarray(a)
            digest.update(str((a.shape, a.dtype.str)).encode())
            digest.update(a.data)
        return ("arrays", digest.hexdigest())
    return None
