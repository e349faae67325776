"""Driver side of the data path: checks the user's data and stages it once.

``stage`` accepts a Spark DataFrame, an RDD of ``(x, y)`` pairs or a tuple of
numpy arrays, checks what it can on the driver (types, columns, widths known
from the schema) and writes the examples to the staging directory in the
format of :mod:`sparkdl_avg.shared.staged_dataset`: one Spark job for a DataFrame or an
RDD (whose task bodies are in :mod:`sparkdl_avg.executor.stage_writer`), none for arrays.
The driver only ever receives one small row per partition, never the data.
"""

from __future__ import annotations

import math
import uuid
from functools import partial
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import DataError
from ..executor.stage_writer import export_arrow_batches, export_pairs
from ..shared.fs import join, make_dir, remove_tree
from ..shared.remote_errors import raise_reported, run_job
from ..shared.staged_dataset import StagedDataset, StagedFile, write_examples
from ..shared.value_checks import DataChecks, LabelShape, check_label_shape, check_values


def _label_dtype(is_integer: bool, x_dtype: str) -> str:
    return "int32" if is_integer else x_dtype


def _as_list(value, count: int) -> list:
    """``value`` as a list of ``count`` parts: a list/tuple as is, anything else alone."""
    return list(value) if count > 1 and isinstance(value, (list, tuple)) else [value]


def data_checks(model, enabled: bool = True) -> Optional[DataChecks]:
    """The staging checks for ``model`` (``check_data``): finite values, and label ranges and shapes its losses imply.

    Sparse categorical cross-entropy needs one class index ``0 .. classes-1``
    per row (``classes``: the output's last dimension); categorical
    cross-entropy a vector of ``classes`` values per row; binary
    cross-entropy labels in ``[0, 1]``, as many per row as the output has
    units. Shapes are checked only for outputs of shape ``(batch, units)``,
    and nothing of the labels when the losses are a dict (which output a
    loss belongs to is then Keras' business). Other losses get no check.
    """
    if not enabled:
        return None
    if isinstance(model.loss, dict):
        return DataChecks(finite=True)
    losses = model.loss if isinstance(model.loss, (list, tuple)) else [model.loss] * len(model.outputs)
    ranges, shapes = [], []
    for loss, output in zip(losses, model.outputs):
        given = loss if isinstance(loss, str) else getattr(loss, "__name__", type(loss).__name__)
        name = given.lower().replace("_", "")
        units = output.shape[-1] if len(output.shape) == 2 else None
        kind = None
        if name == "sparsecategoricalcrossentropy":
            kind = "sparse"
            classes = int(output.shape[-1])
            ranges.append(
                (0, classes - 1, True, f"a class index in 0..{classes - 1} (the model's output has {classes} "
                 "classes and the loss is a sparse categorical cross-entropy)")
            )
        elif name in ("binarycrossentropy", "binaryfocalcrossentropy"):
            kind = "binary"
            ranges.append((0, 1, False, "a value in [0, 1] (the loss is a binary cross-entropy)"))
        else:
            if name in ("categoricalcrossentropy", "categoricalfocalcrossentropy"):
                kind = "categorical"
            ranges.append(None)
        shapes.append(LabelShape(given, kind, int(units)) if kind and units is not None else None)
    return DataChecks(finite=True, label_ranges=tuple(ranges), label_shapes=tuple(shapes))


def _check_arrays(xs, ys, checks: Optional[DataChecks], what: str) -> None:
    """:func:`check_label_shape` and :func:`check_values` on the driver for numpy data."""
    for k, x in enumerate(xs):
        name = f"The {what} array x" + (f"[{k}]" if len(xs) > 1 else "")
        check_values(np.asarray(x).reshape(len(x), -1), name, checks, partition=False)
    for k, y in enumerate(ys):
        array = f"{what} array y" + (f"[{k}]" if len(ys) > 1 else "")
        check_label_shape(np.shape(y)[1:], f"the {array}", checks, k)
        name = f"The {array}"
        check_values(np.asarray(y).reshape(len(y), -1), name, checks, k, partition=False)


def _stage_arrays(data, directory: str, x_shapes, num_outputs: int, x_dtype: str, what: str, checks=None) -> StagedDataset:
    xs = [np.asarray(a) for a in _as_list(data[0], len(x_shapes))]
    ys = [np.asarray(a) for a in _as_list(data[1], num_outputs)]
    if len(xs) != len(x_shapes) or len(ys) != num_outputs:
        raise DataError(
            f"The model has {len(x_shapes)} input(s) and {num_outputs} output(s); the {what} data "
            f"gives {len(xs)} feature array(s) and {len(ys)} label array(s). Pass lists in the "
            "order of model.inputs and model.outputs."
        )
    n = len(xs[0]) if xs[0].ndim else 0
    if n == 0:
        raise DataError(f"The {what} arrays must not be empty. Got x with shape {xs[0].shape} instead.")
    for name, a in [*(("x", x) for x in xs), *(("y", y) for y in ys)]:
        if a.ndim == 0 or len(a) != n:
            raise DataError(
                f"The {what} arrays must have the same number of examples. Got "
                f"x with {n} and {name} with {len(a) if a.ndim else 0} instead."
            )
        if not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
            raise DataError(f"The {what} array {name} must be numeric. Got dtype {a.dtype} instead.")
    for x, shape in zip(xs, x_shapes):
        if tuple(x.shape[1:]) != tuple(shape) and math.prod(x.shape[1:]) != math.prod(shape):
            raise DataError(
                f"The {what} features must fit the model's input shape {tuple(shape)}. "
                f"Got x with shape {x.shape} instead."
            )
    _check_arrays(xs, ys, checks, what)
    all_int = all(np.issubdtype(y.dtype, np.integer) or y.dtype == bool for y in ys)
    y_dtype = _label_dtype(all_int, x_dtype)
    uri = join(directory, "part-00000.arrow")
    write_examples(
        uri,
        np.concatenate([x.reshape(n, -1).astype(x_dtype, copy=False) for x in xs], axis=1),
        np.concatenate([y.reshape(n, -1).astype(y_dtype, copy=False) for y in ys], axis=1),
    )
    return StagedDataset(
        (StagedFile(uri, n),), tuple(map(tuple, x_shapes)), tuple(tuple(y.shape[1:]) for y in ys), x_dtype, y_dtype
    )


def _check_columns(df, what: str, **columns) -> dict:
    """Checks that each named column (or list of columns) exists; returns the fields by name."""
    fields = {f.name: f for f in df.schema.fields}
    for param, names in columns.items():
        for name in names if isinstance(names, (list, tuple)) else [names]:
            if not isinstance(name, str) or name not in fields:
                raise DataError(
                    f"Column {name!r} ('{param}') is not in the {what} DataFrame. "
                    f"Available columns: {sorted(fields)}."
                )
    return fields


def column_list(value, count: int, param: str, kind: str) -> List[str]:
    """``features_col``/``label_col`` as a list of one column per model input/output.

    Raises:
        DataError: the number of columns differs from the model's inputs/outputs.
    """
    names = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(names) != count:
        raise DataError(
            f"The model has {count} {kind}(s); '{param}' must name one column per {kind}, in "
            f"the order of model.{kind}s. Got {param}={value!r} instead."
        )
    return names


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
        f"pyspark.ml Vector. Got {field.dataType.simpleString()} instead."
    )


def _label_column(df, name: str, fields: dict, float_name: str, x_dtype: str):
    """``(expression, is_integer)`` of one label column (number, array or Vector)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    label_type = fields[name].dataType
    if isinstance(label_type, T.NumericType):
        is_int = isinstance(label_type, T.IntegralType)
        return F.col(name).cast("int" if is_int else float_name), is_int
    if isinstance(label_type, T.ArrayType) and isinstance(label_type.elementType, T.NumericType):
        return F.col(name).cast(f"array<{float_name}>"), False
    if isinstance(label_type, VectorUDT):
        return vector_to_array(F.col(name), "float32" if x_dtype == "float32" else "float64"), False
    raise DataError(
        f"Column '{name}' must be numeric, an array of numbers or a pyspark.ml "
        f"Vector. Got {label_type.simpleString()} instead."
    )


def _stage_dataframe(df, features_col, label_col, directory, x_shapes, num_outputs, x_dtype, what, checks=None) -> StagedDataset:
    from pyspark.sql import types as T

    feature_names = column_list(features_col, len(x_shapes), "features_col", "input")
    label_names = column_list(label_col, num_outputs, "label_col", "output")
    fields = _check_columns(df, what, features_col=feature_names, label_col=label_names)
    for k, c in enumerate(label_names):  # one number per row is known from the schema; arrays' lengths after staging
        scalar = isinstance(fields[c].dataType, T.NumericType)
        check_label_shape(() if scalar else None, f"label column '{c}'", checks, k)
    float_name = "float" if x_dtype == "float32" else "double"
    features = [feature_column(df, c, shape, x_dtype, what) for c, shape in zip(feature_names, x_shapes)]
    labels = [_label_column(df, c, fields, float_name, x_dtype) for c in label_names]
    all_int = all(is_int for _, is_int in labels)
    y_dtype = _label_dtype(all_int, x_dtype)
    if not all_int:  # one label dtype for all outputs
        labels = [(expr.cast(float_name) if is_int else expr, False) for expr, is_int in labels]
    # Positional aliases: the user's column names may repeat or need quoting.
    selected = df.select(
        *[f.alias(f"x{k}") for k, f in enumerate(features)], *[l.alias(f"y{k}") for k, (l, _) in enumerate(labels)]
    )
    renamed = {f"x{k}": c for k, c in enumerate(feature_names)} | {f"y{k}": c for k, c in enumerate(label_names)}
    body = partial(
        export_arrow_batches,
        directory=directory,
        features=[(f"x{k}", math.prod(shape)) for k, shape in enumerate(x_shapes)],
        labels=[f"y{k}" for k in range(num_outputs)],
        x_dtype=x_dtype,
        y_dtype=y_dtype,
        checks=checks,
    )
    rows = run_job(
        lambda: selected.mapInArrow(body, "uri string, rows long, label_widths array<int>, error string").collect(),
        f"Staging the {what} data",
        renamed,
    )
    raise_reported((r.error for r in rows), renamed)
    widths = {tuple(r.label_widths) for r in rows if r.rows}
    if len(widths) > 1:
        raise DataError(f"Label column(s) {label_names} hold arrays of different lengths: {sorted(widths)}.")
    y_shapes = tuple(() if w == 0 else (w,) for w in (widths.pop() if widths else [0] * num_outputs))
    if any(r.rows for r in rows):  # empty data is refused by stage(), not as a misfit
        for k, (c, shape) in enumerate(zip(label_names, y_shapes)):
            check_label_shape(shape, f"label column '{c}'", checks, k)
    files = tuple(StagedFile(r.uri, r.rows) for r in rows if r.rows)
    return StagedDataset(files, tuple(map(tuple, x_shapes)), y_shapes, x_dtype, y_dtype)


def _stage_rdd(rdd, directory, x_shapes, num_outputs, x_dtype, what, checks=None) -> StagedDataset:
    body = partial(
        export_pairs,
        directory=directory,
        x_widths=[math.prod(s) for s in x_shapes],
        num_outputs=num_outputs,
        x_dtype=x_dtype,
        y_dtype=x_dtype,
        checks=checks,
    )
    rows = run_job(lambda: rdd.mapPartitionsWithIndex(body).collect(), f"Staging the {what} data")
    raise_reported(error for _, _, _, error in rows)
    shapes = {shape for _, n, shape, _ in rows if n}
    if len(shapes) > 1:
        raise DataError(f"The {what} RDD has labels of different shapes: {sorted(shapes)}.")
    files = tuple(StagedFile(uri, n) for uri, n, _, _ in rows if n)
    y_shapes = shapes.pop() if shapes else ((),) * num_outputs
    if files:  # empty data is refused by stage(), not as a misfit
        for k, shape in enumerate(y_shapes):
            name = f"the labels of the {what} RDD" + (f" (output {k})" if num_outputs > 1 else "")
            check_label_shape(shape, name, checks, k)
    return StagedDataset(files, tuple(map(tuple, x_shapes)), y_shapes, x_dtype, x_dtype)


def refuse_pandas(data: Any, what: str = "training") -> None:
    """Raises a ``DataError`` saying how to convert ``data`` if it is a pandas DataFrame; else nothing.

    ``fit`` and ``evaluate`` call it before looking for the data's Spark session.
    """
    import sys

    pandas = sys.modules.get("pandas")  # a pandas DataFrame means pandas is imported
    if pandas is not None and isinstance(data, pandas.DataFrame):
        raise DataError(
            f"The {what} data must be a Spark DataFrame, an RDD of (x, y) pairs or a tuple (x, y) of numpy "
            "arrays. Got a pandas DataFrame instead; convert it with spark.createDataFrame(pdf), or pass "
            "(pdf[features].to_numpy(), pdf[label].to_numpy())."
        )


def stage(
    data: Any,
    *,
    root: str,
    x_shapes: Sequence[Tuple[int, ...]],
    x_dtype: str,
    num_outputs: int = 1,
    features_col="features",
    label_col="label",
    what: str = "training",
    checks: Optional[DataChecks] = None,
) -> StagedDataset:
    """Writes ``data`` to a new directory under ``root`` and describes it.

    Args:
        data: Spark DataFrame, RDD of ``(x, y)`` pairs, or ``(x, y)`` arrays;
            for a model with several inputs (outputs) ``x`` (``y``) is a list
            of arrays in the order of ``model.inputs`` (``model.outputs``).
        root: Staging root (local path or ``pyarrow.fs`` URI).
        x_shapes: The model's input shapes without the batch dimension.
        x_dtype: The model inputs' dtype (``float32`` or ``float64``).
        num_outputs: The model's number of outputs.
        features_col: DataFrame column(s) of the features, one per input.
        label_col: DataFrame column(s) of the labels, one per output.
        what: Name of the data in error messages ("training", "validation").
        checks: Value checks made while staging (:func:`data_checks`).

    Raises:
        DataError: naming the column or array and what was received.
    """
    from pyspark import RDD
    from pyspark.sql import DataFrame

    if isinstance(data, DataFrame):
        write = partial(_stage_dataframe, data, features_col, label_col)
    elif isinstance(data, RDD):
        write = partial(_stage_rdd, data)
    elif isinstance(data, (tuple, list)) and len(data) == 2:
        write = partial(_stage_arrays, data)
    else:
        refuse_pandas(data, what)
        raise DataError(
            f"The {what} data must be a Spark DataFrame, an RDD of (x, y) pairs or "
            f"a tuple (x, y) of numpy arrays. Got {type(data).__name__} instead."
        )
    directory = join(root, f"{what}-{uuid.uuid4().hex[:12]}")
    # Made here, before any task writes into it: tasks do not create it (see
    # write_examples), so one still running when a failed job is given up
    # cannot bring it back after the removal below.
    make_dir(directory)
    try:
        staged = write(directory, x_shapes, num_outputs, x_dtype, what, checks)
        if staged.num_examples == 0:
            raise DataError(f"The {what} data is empty (0 rows).")
    except BaseException:
        remove_tree(directory)  # a refused or failed staging leaves no partial files
        raise
    return staged


def data_key(data: Any, features_col: str, label_col: str) -> Optional[tuple]:
    """A key under which staged data is reused when the same data is fitted again.

    DataFrames and RDDs are immutable, so their identity suffices; arrays are
    keyed by a hash of their contents, so changing them in place re-stages.
    """
    import hashlib

    from pyspark import RDD
    from pyspark.sql import DataFrame

    def hashable(col):
        return tuple(col) if isinstance(col, list) else col

    if isinstance(data, (DataFrame, RDD)):
        return (id(data), hashable(features_col), hashable(label_col))
    if isinstance(data, (tuple, list)) and len(data) == 2:
        digest = hashlib.sha1()
        for a in [*_as_list(data[0], 2), *_as_list(data[1], 2)]:
            a = np.ascontiguousarray(a)
            digest.update(str((a.shape, a.dtype.str)).encode())
            digest.update(a.data)
        return ("arrays", digest.hexdigest())
    return None


def check_shared_root(engine, root: str, tasks: int, default: bool) -> None:
    """Refuses a local staging root that the executors cannot see, before anything is staged there.

    On a master whose executors may run on other hosts (anything but
    ``local[N]``/``local-cluster``) a local path is shared only if it is a
    shared mount: the driver writes a marker file under ``root`` and one
    small job of ``tasks`` tasks (:func:`sparkdl_avg.executor.worker.probe_path_batches`)
    asks each executor whether it sees it. URIs (``s3://``, ``hdfs://``) and
    one-host masters are not checked. It costs one small Spark job (an empty
    job's cost: docs/benchmarks.md, "Where the time goes as work grows"),
    once per trainer and session.

    Args:
        engine: The session's :class:`~sparkdl_avg.driver.session.Engine`.
        root: The trainer's staging root (already created).
        tasks: Tasks of the probe job (the fit's workers, at least the
            cluster's slots, so that most executors answer).
        default: Whether ``root`` is the default (``staging_dir=None``: the
            driver's temp dir), for the message.

    Raises:
        ConfigurationError: some executor does not see the marker; names
            ``staging_dir``, the hosts and what to pass instead.
    """
    from ..errors import ConfigurationError
    from ..executor import worker

    if "://" in root and not root.startswith("file://"):
        return
    import os

    marker = os.path.join(root.replace("file://", "", 1), f".shared-{uuid.uuid4().hex[:12]}")
    with open(marker, "w") as f:
        f.write("sparkdl_avg: executors that see this file share the staging directory\n")
    try:
        rows = run_job(
            lambda: engine.run_tasks(tasks, partial(worker.probe_path_batches, marker),
                                     "task long, host string, seen boolean").collect(),
            "The staging directory check",
        )
    finally:
        os.remove(marker)
    blind = sorted({r.host for r in rows if not r.seen})
    if blind:
        where = (f"the default, {os.path.dirname(root)!r} (the driver's temp dir)" if default
                 else f"{os.path.dirname(root)!r}")
        raise ConfigurationError(
            f"The 'staging_dir' parameter must be a directory the driver and every executor share; "
            f"got {where}, which executors on {', '.join(blind)} cannot see (master {engine.master}). "
            "Pass staging_dir= a filesystem every host reaches: an s3:// or hdfs:// URI, or a shared mount "
            "(NFS) at the same path on every host."
        )
