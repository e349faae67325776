"""Driver side of the data path: checks the user's data and stages it once.

``stage`` accepts a Spark DataFrame, an RDD of ``(x, y)`` pairs or a tuple of
numpy arrays, checks what it can on the driver (types, columns, widths known
from the schema; with a preprocessing function, its output on a few rows,
:func:`dry_run`) and writes the examples to the staging directory in the
format of :mod:`sparkdl_avg.shared.data.staged_dataset`: one Spark job for a DataFrame or an
RDD (whose task bodies are in :mod:`sparkdl_avg.executor.stage_writer`), none for arrays.
Each model input gets its own column in its own dtype (``model.inputs``):
numbers converted exactly (:func:`sparkdl_avg.shared.data.columns.exact_cast`), bytes,
text and Spark's image struct staged as they came; with a preprocessing
function, the raw columns it reads. The driver only ever receives one small
row per partition, never the data.
"""

from __future__ import annotations

import math
import posixpath
import uuid
from functools import partial
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa

from ...errors import ConfigurationError, DataError, PathError
from ...executor.stage_writer import check_staged, export_arrow_batches, export_pairs
from ...shared.data.columns import TEXT, Column, Field, exact_cast, is_image_struct, raw_value, stage_numpy
from ...shared.files.fs import is_full, join, make_dir, remove_tree, write_failure
from ...shared.data.preprocess import ORIGIN_COLUMNS, Preprocess
from ...shared.errors.remote_errors import raise_reported, run_job
from ...shared.data.staged_dataset import StagedDataset, StagedFile, write_columns
from ...shared.data.value_checks import DataChecks, LabelShape, check_label_shape, check_values

DRY_RUN_ROWS = 8
"""Rows a preprocessing function is run on, on the driver, before anything is staged (:func:`dry_run`)."""

STRING_INPUT_ADVICE = (
    "Give the model a string input (keras.Input(shape=(1,), dtype='string')) and decode in a layer "
    "(tf.io.decode_png, TextVectorization), or pass preprocess= a function that turns the column into the "
    "model's input (README, \"Images, text and ids\")."
)


def _as_list(value, count: int) -> list:
    """``value`` as a list of ``count`` parts: a list/tuple as is, anything else alone."""
    return list(value) if count > 1 and isinstance(value, (list, tuple)) else [value]


def _dtypes(x_dtype: Union[str, Sequence[str]], count: int) -> List[str]:
    return [x_dtype] * count if isinstance(x_dtype, str) else list(x_dtype)


def _label_float(x_dtype: Union[str, Sequence[str]], label_dtype: Optional[str]) -> str:
    """The dtype of float labels: ``label_dtype``, else float64 when every input is, else float32."""
    if label_dtype:
        return label_dtype
    dtypes = set(_dtypes(x_dtype, 1) if isinstance(x_dtype, str) else x_dtype)
    return "float64" if dtypes == {"float64"} else "float32"


def _input_name(k: int, count: int) -> str:
    return f"the model's input {k}" if count > 1 else "the model's input"


#: Keras' built-in losses that compare labels and outputs value by value (names lower-cased, without
#: underscores: the strings, functions and classes alike): their labels need the output's width.
ELEMENTWISE_LOSSES = frozenset((
    "mse", "meansquarederror", "mae", "meanabsoluteerror", "mape", "meanabsolutepercentageerror", "msle",
    "meansquaredlogarithmicerror", "huber", "logcosh", "hinge", "squaredhinge", "categoricalhinge", "poisson",
    "kld", "kldivergence", "cosinesimilarity",
))


def data_checks(model, enabled: bool = True) -> Optional[DataChecks]:
    """The staging checks for ``model`` (``check_data``): finite values, and label ranges and shapes its losses imply.

    Sparse categorical cross-entropy needs one class index ``0 .. classes-1``
    per row (``classes``: the output's last dimension); categorical
    cross-entropy a vector of ``classes`` values per row; binary
    cross-entropy labels in ``[0, 1]``, as many per row as the output has
    units; the value-by-value losses (:data:`ELEMENTWISE_LOSSES`: MSE, MAE,
    Huber, hinge, ...) as many values per row as the output has units
    (Keras fails on one value per row for a wider output). Shapes are checked only for outputs of shape ``(batch, units)``,
    and nothing of the labels when the losses are a dict (which output a
    loss belongs to is then Keras' business). Other losses (a user's own function) get no check.
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
        elif name in ("binarycrossentropy", "binaryfocalcrossentropy", "bce"):
            kind = "binary"
            ranges.append((0, 1, False, "a value in [0, 1] (the loss is a binary cross-entropy)"))
        else:
            if name in ("categoricalcrossentropy", "categoricalfocalcrossentropy"):
                kind = "categorical"
            elif name in ELEMENTWISE_LOSSES:
                kind = "elementwise"
            ranges.append(None)
        shapes.append(LabelShape(given, kind, int(units)) if kind and units is not None else None)
    return DataChecks(finite=True, label_ranges=tuple(ranges), label_shapes=tuple(shapes))


def _stage_arrays(data, directory: str, x_fields: Sequence[Field], num_outputs: int, label_float: str, what: str,
                  checks=None, weight: Optional[str] = None, preprocess=None) -> StagedDataset:
    if preprocess is not None:
        raise ConfigurationError("The 'preprocess' parameter applies to DataFrame data (its columns are what the "
                                 "function reads). Got numpy arrays; transform them yourself, or pass a DataFrame.")
    if len(data) == 3:
        xs_given, ys_given, w_given = data
    else:
        (xs_given, ys_given), w_given = data, None
    xs = [np.asarray(a) for a in _as_list(xs_given, len(x_fields))]
    ys = [np.asarray(a) for a in _as_list(ys_given, num_outputs)]
    if len(xs) != len(x_fields) or len(ys) != num_outputs:
        raise DataError(
            f"The model has {len(x_fields)} input(s) and {num_outputs} output(s); the {what} data "
            f"gives {len(xs)} feature array(s) and {len(ys)} label array(s). Pass lists in the "
            "order of model.inputs and model.outputs."
        )
    n = len(xs[0]) if xs[0].ndim else 0
    if n == 0:
        raise DataError(f"The {what} arrays must not be empty. Got x with shape {xs[0].shape} instead.")
    named = [*(("x", x) for x in xs), *(("y", y) for y in ys)]
    if w_given is not None:
        named.append(("sample_weight", np.asarray(w_given)))
    for name, a in named:
        if a.ndim == 0 or len(a) != n:
            raise DataError(
                f"The {what} arrays must have the same number of examples. Got "
                f"x with {n} and {name} with {len(a) if a.ndim else 0} instead."
            )
    for name, a in named[len(xs):]:
        if not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
            raise DataError(f"The {what} array {name} must be numeric. Got dtype {a.dtype} instead.")
    columns, arrays = [], {}
    for k, (x, field) in enumerate(zip(xs, x_fields)):
        name = f"The {what} array x" + (f"[{k}]" if len(xs) > 1 else "")
        if field.dtype == TEXT:
            if math.prod(x.shape[1:]) != 1:
                raise DataError(f"{name} must hold one string per example for {_input_name(k, len(xs))}. "
                                f"Got shape {x.shape} instead.")
            column = Column(f"x{k}", name, "text", field, "x", k)
        else:
            if not (np.issubdtype(x.dtype, np.number) or x.dtype == bool):
                advice = f" {STRING_INPUT_ADVICE}" if x.dtype.kind in "SUO" else ""
                raise DataError(f"The {what} array x must be numeric. Got dtype {x.dtype} instead.{advice}")
            if tuple(x.shape[1:]) != tuple(field.shape) and math.prod(x.shape[1:]) != field.width:
                raise DataError(
                    f"The {what} features must fit the model's input shape {tuple(field.shape)}. "
                    f"Got x with shape {x.shape} instead."
                )
            column = Column(f"x{k}", name, "tensor", field, "x", k)
        columns.append(column)
        arrays[column.name] = stage_numpy(x, column)
    for k, y in enumerate(ys):
        array = f"{what} array y" + (f"[{k}]" if len(ys) > 1 else "")
        check_label_shape(np.shape(y)[1:], f"the {array}", checks, k)
        integer = np.issubdtype(y.dtype, np.integer) or y.dtype == bool
        column = Column(f"y{k}", f"The {array}", "tensor",
                        Field(tuple(y.shape[1:]), "int32" if integer else label_float), "y", k)
        columns.append(column)
        arrays[column.name] = stage_numpy(y, column)
    if w_given is not None:
        column = Column("w", f"The {what} sample weights", "tensor", Field((), "float32"), "w")
        columns.append(column)
        arrays["w"] = stage_numpy(np.asarray(w_given), column)
    for column in columns:
        check_staged(arrays[column.name], column, checks, partition=False, name=column.source)
    uri = join(directory, "part-00000.arrow")
    nbytes = write_columns(uri, arrays)
    xcols, ycols = columns[: len(xs)], columns[len(xs): len(xs) + len(ys)]
    return StagedDataset(
        (StagedFile(uri, n, nbytes),), tuple(columns), tuple(c.name for c in xcols), tuple(c.field for c in xcols),
        tuple(c.name for c in ycols), tuple(c.field for c in ycols), "w" if w_given is not None else None,
    )


def _check_columns(df, what: str, **columns) -> dict:
    """Checks that each named column (or list of columns) exists; returns the fields by name."""
    fields = {f.name: f for f in df.schema.fields}
    for param, names in columns.items():
        for name in names if isinstance(names, (list, tuple)) else [names]:
            if name is None and param == "sample_weight_col":
                continue
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


def _quoted(name: str):
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def input_column(df, name: str, k: int, count: int, field: Field, what: str = "training"):
    """``(expression, Column)``: how DataFrame column ``name`` feeds model input ``k`` (of ``count``) of ``field``.

    Numeric arrays, numeric scalars (inputs of one value) and ``pyspark.ml``
    Vectors feed numeric inputs (a Vector size known from the schema's ML
    metadata, which ``VectorAssembler`` writes, is checked here); Spark's
    image struct feeds an input of shape ``(height, width, channels)``;
    ``binary`` and ``string`` columns feed string inputs.

    Raises:
        DataError: the column is missing, of a type the input cannot take, or of the wrong size.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    data_type = _check_columns(df, what, features_col=name)[name].dataType
    meta = _check_columns(df, what, features_col=name)[name].metadata
    source = _quoted(name)
    given = data_type.simpleString()
    text = isinstance(data_type, (T.BinaryType, T.StringType))
    if field.dtype == TEXT:
        if not text:
            raise DataError(f"Column '{name}' must be binary or string for {_input_name(k, count)}, a string "
                            f"input. Got {given} instead.")
        if field.width != 1:
            raise DataError(f"{_input_name(k, count)[0].upper()}{_input_name(k, count)[1:]} is a string input of "
                            f"shape {field.shape}; a string column feeds inputs of shape () or (1,).")
        return source, Column(name, name, "text", field, "x", k)
    if isinstance(data_type, VectorUDT):
        size = meta.get("ml_attr", {}).get("num_attrs")
        if size is not None and size != field.width:
            raise DataError(
                f"Column '{name}' holds vectors of size {size}; expected {field.width} "
                f"values per row (the model's input shape {tuple(field.shape)})."
            )
        return vector_to_array(source, "float32" if field.dtype == "float32" else "float64"), \
            Column(name, name, "tensor", field, "x", k)
    if isinstance(data_type, T.ArrayType) and isinstance(data_type.elementType, (T.NumericType, T.BooleanType)):
        return source, Column(name, name, "tensor", field, "x", k)
    if isinstance(data_type, (T.NumericType, T.BooleanType)) and field.width == 1:
        return source, Column(name, name, "tensor", field, "x", k)
    if isinstance(data_type, T.StructType) and is_image_struct(_arrow_struct(data_type)) and len(field.shape) == 3:
        return source, Column(name, name, "image", field, "x", k)
    advice = f" {STRING_INPUT_ADVICE}" if text else ""
    if isinstance(data_type, (T.NumericType, T.BooleanType)):
        advice = (f" A number per row feeds an input of one value; {_input_name(k, count)} takes "
                  f"{field.shape}.")
    raise DataError(
        f"Column '{name}' must be array<float>, array<double> or a pyspark.ml Vector. Got {given} instead "
        f"({_input_name(k, count)} takes {field.dtype} values of shape {tuple(field.shape)}).{advice}"
    )


def _arrow_struct(struct_type):
    import pyarrow as pa

    return pa.struct([pa.field(f.name, pa.null()) for f in struct_type.fields])


def _label_column(name: str, k: int, fields: dict, label_float: str, what: str):
    """``(expression, Column)`` of one label column (number, array or Vector)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    label_type = fields[name].dataType
    source = _quoted(name)
    if isinstance(label_type, (T.IntegralType, T.BooleanType)):
        return source, Column(f"y{k}", name, "tensor", Field((), "int32"), "y", k)
    if isinstance(label_type, T.NumericType):
        return source, Column(f"y{k}", name, "tensor", Field((), label_float), "y", k)
    if isinstance(label_type, T.ArrayType) and isinstance(label_type.elementType, (T.NumericType, T.BooleanType)):
        return source, Column(f"y{k}", name, "tensor", Field(None, label_float), "y", k)
    if isinstance(label_type, VectorUDT):
        return (vector_to_array(source, "float32" if label_float == "float32" else "float64"),
                Column(f"y{k}", name, "tensor", Field(None, label_float), "y", k))
    raise DataError(
        f"Column '{name}' must be numeric, an array of numbers or a pyspark.ml "
        f"Vector. Got {label_type.simpleString()} instead."
    )


def _weight_column(name: str, fields: dict):
    from pyspark.sql import types as T

    if not isinstance(fields[name].dataType, (T.NumericType, T.BooleanType)):
        raise DataError(f"Column '{name}' ('sample_weight_col') must be numeric: one weight per row. Got "
                        f"{fields[name].dataType.simpleString()} instead.")
    return _quoted(name), Column("w", name, "tensor", Field((), "float32"), "w")


def _run_staging(selected, columns, directory, checks, what, renamed) -> Tuple[Tuple[StagedFile, ...], list]:
    """The staging job over ``selected`` (one column per :class:`Column`); returns the files and the label widths."""
    body = partial(export_arrow_batches, directory=directory, columns=columns, checks=checks)
    rows = run_job(
        lambda: selected.mapInArrow(
            body, "uri string, rows long, label_widths array<int>, bytes long, error string").collect(),
        f"Staging the {what} data",
        renamed,
    )
    try:
        raise_reported((r.error for r in rows), renamed)
    except DataError as exc:  # "Column 'features' has a row of 32 values" must say which data it is
        if what == "training":
            raise
        raise DataError(f"In the {what} data: {exc}") from None
    widths = {tuple(r.label_widths) for r in rows if r.rows}
    files = tuple(StagedFile(r.uri, r.rows, r.bytes) for r in rows if r.rows)
    return files, widths


def _stage_dataframe(df, features_col, label_col, directory, x_fields, num_outputs, label_float, what, checks=None,
                     weight: Optional[str] = None, preprocess: Optional[Preprocess] = None) -> StagedDataset:
    from pyspark.sql import types as T

    feature_names = column_list(features_col, len(x_fields), "features_col", "input")
    label_names = column_list(label_col, num_outputs, "label_col", "output")
    if preprocess is not None:
        return _stage_preprocessed(df, feature_names, label_names, directory, x_fields, label_float, what, checks,
                                   weight, preprocess)
    fields = _check_columns(df, what, features_col=feature_names, label_col=label_names, sample_weight_col=weight)
    for k, c in enumerate(label_names):  # one number per row is known from the schema; arrays' lengths after staging
        scalar = isinstance(fields[c].dataType, T.NumericType)
        check_label_shape(() if scalar else None, f"label column '{c}'", checks, k)
    pairs = [input_column(df, c, k, len(x_fields), field, what) for k, (c, field) in enumerate(zip(feature_names, x_fields))]
    pairs = [(expr, Column(f"x{k}", col.source, col.kind, col.field, "x", k)) for k, (expr, col) in enumerate(pairs)]
    pairs += [_label_column(c, k, fields, label_float, what) for k, c in enumerate(label_names)]
    if weight is not None:
        pairs.append(_weight_column(weight, fields))
    # Positional aliases: the user's column names may repeat or need quoting.
    selected = df.select(*[expr.alias(col.name) for expr, col in pairs])
    columns = [col for _, col in pairs]
    renamed = {col.name: col.source for col in columns}
    files, widths = _run_staging(selected, columns, directory, checks, what, renamed)
    if len(widths) > 1:
        raise DataError(f"Label column(s) {label_names} hold arrays of different lengths: {sorted(widths)}.")
    label_widths = widths.pop() if widths else [0] * num_outputs
    y_fields = []
    for k, (c, w) in enumerate(zip(label_names, label_widths)):
        field = next(col.field for col in columns if col.name == f"y{k}")
        shape = () if w == 0 else (w,)
        if files:  # empty data is refused by stage(), not as a misfit
            check_label_shape(shape, f"label column '{c}'", checks, k)
        y_fields.append(Field(shape, field.dtype))
    columns = [Column(c.name, c.source, c.kind, y_fields[c.index], c.role, c.index) if c.role == "y" else c
               for c in columns]
    return StagedDataset(files, tuple(columns), tuple(f"x{k}" for k in range(len(x_fields))), tuple(x_fields),
                         tuple(f"y{k}" for k in range(num_outputs)), tuple(y_fields), "w" if weight else None)


def dry_run(df, preprocess: Preprocess, x_names: Sequence[str], x_fields: Sequence[Field],
            y_names: Sequence[str], label_float: str, weight: Optional[str], checks: Optional[DataChecks],
            what: str) -> Tuple[Preprocess, List[str], Tuple[Field, ...]]:
    """Runs ``preprocess`` on the first :data:`DRY_RUN_ROWS` rows of ``df`` on the driver, before anything is staged.

    Its output must give every model input in the shape and dtype the model
    takes, and labels the loss accepts (:func:`check_label_shape`, and the
    ``check_data`` value checks). Costs one small Spark job.

    Returns:
        The function with the columns it read, the DataFrame columns to
        stage (those it read, the names it does not return that the batch
        passes through, and a string ``path`` column, which names a row
        the function fails on in a round), and the labels' fields (shape from the
        output; integers as int32, else ``label_float``).

    Raises:
        DataError: the function failed, or its output does not fit the model.
    """
    from ...shared.data.staged_dataset import _as_field
    from pyspark.ml.linalg import VectorUDT

    usable = [f.name for f in df.schema.fields if not isinstance(f.dataType, VectorUDT)]
    sample = df.select(*[_quoted(c) for c in usable]).limit(DRY_RUN_ROWS).toArrow()
    if sample.num_rows == 0:
        raise DataError(f"The {what} data is empty (0 rows).")
    batch = {name: raw_value(sample.column(name)) for name in sample.column_names}
    out, read = preprocess.dry_run(batch, training=what == "training", what=f"{what} data")
    source = f"The preprocessing function {preprocess.name!r}"
    n = sample.num_rows

    def get(name, param):
        if name in out:
            return out[name]
        if name in batch:
            return batch[name]
        raise DataError(f"{source} returned {sorted(out)} on the first {n} rows of the {what} data; '{param}' names "
                        f"{name!r}, which it must return (or the DataFrame must hold).")

    for k, (name, field) in enumerate(zip(x_names, x_fields)):
        _as_field(get(name, "features_col"), field, name, n, source)
    y_fields = []
    for k, name in enumerate(y_names):
        value = np.asarray(get(name, "label_col"))
        if not (np.issubdtype(value.dtype, np.number) or value.dtype == bool) or len(value) != n:
            raise DataError(f"{source} gives the labels {name!r} as {value.dtype} with {len(value)} rows; expected "
                            f"numbers, one row per example ({n}).")
        integer = np.issubdtype(value.dtype, np.integer) or value.dtype == bool
        field = Field(tuple(value.shape[1:]), "int32" if integer else label_float)
        check_label_shape(field.shape, f"the labels {name!r} of {source}", checks, k)
        check_values(exact_cast(value.reshape(n, -1), field.dtype, f"{source} ({name!r})", where="of the batch"),
                     f"The labels {name!r} of {source}", checks, k, partition=False)
        y_fields.append(field)
    if weight is not None:
        _as_field(get(weight, "sample_weight_col"), Field((), "float32"), weight, n, source)
    wanted = [*x_names, *y_names, *([weight] if weight else [])]
    staged = list(read) + [c for c in wanted if c not in out and c in batch and c not in read]
    # Where a row came from (binaryFile's path), so that a row the function fails on in a round is named by it.
    staged += [c for c in ORIGIN_COLUMNS if c in batch and c not in staged and sample.schema.field(c).type in
               (pa.string(), pa.large_string())]
    return preprocess.with_columns(read), staged, tuple(y_fields)


def _stage_preprocessed(df, x_names, y_names, directory, x_fields, label_float, what, checks, weight,
                        preprocess: Preprocess) -> StagedDataset:
    """Stages the raw columns ``preprocess`` reads (and those passed through), as they came."""
    preprocess, staged, y_fields = dry_run(df, preprocess, x_names, x_fields, y_names, label_float, weight, checks,
                                           what)
    if not staged:
        raise DataError(f"The preprocessing function {preprocess.name!r} reads no column of the {what} data.")
    columns = [Column(c, c, "raw", None, "raw") for c in staged]
    selected = df.select(*[_quoted(c) for c in staged])
    files, _ = _run_staging(selected, columns, directory, None, what, None)
    return StagedDataset(files, tuple(columns), tuple(x_names), tuple(x_fields), tuple(y_names), y_fields,
                         weight, preprocess)


def _stage_rdd(rdd, directory, x_fields, num_outputs, label_float, what, checks=None, weight=None,
               preprocess=None) -> StagedDataset:
    if preprocess is not None or weight is not None:
        which = "preprocess" if preprocess is not None else "sample_weight_col"
        raise ConfigurationError(f"The '{which}' parameter applies to DataFrame data (it names columns). Got an "
                                 "RDD; convert it with spark.createDataFrame.")
    inputs = [Column(f"x{k}", f"x[{k}]", "text" if f.dtype == TEXT else "tensor", f, "x", k)
              for k, f in enumerate(x_fields)]
    body = partial(
        export_pairs,
        directory=directory,
        inputs=inputs,
        num_outputs=num_outputs,
        y_dtype=label_float,
        checks=checks,
    )
    rows = run_job(lambda: rdd.mapPartitionsWithIndex(body).collect(), f"Staging the {what} data")
    raise_reported(error for *_, error in rows)
    shapes = {shape for _, n, shape, _, _ in rows if n}
    if len(shapes) > 1:
        raise DataError(f"The {what} RDD has labels of different shapes: {sorted(shapes)}.")
    files = tuple(StagedFile(uri, n, nbytes) for uri, n, _, nbytes, _ in rows if n)
    y_shapes = shapes.pop() if shapes else ((),) * num_outputs
    if files:  # empty data is refused by stage(), not as a misfit
        for k, shape in enumerate(y_shapes):
            name = f"the labels of the {what} RDD" + (f" (output {k})" if num_outputs > 1 else "")
            check_label_shape(shape, name, checks, k)
    y_fields = tuple(Field(tuple(s), label_float) for s in y_shapes)
    columns = tuple(inputs) + tuple(Column(f"y{k}", f"y[{k}]", "tensor", f, "y", k) for k, f in enumerate(y_fields))
    return StagedDataset(files, columns, tuple(c.name for c in inputs), tuple(x_fields),
                         tuple(f"y{k}" for k in range(num_outputs)), y_fields)


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
    x_dtype: Union[str, Sequence[str]],
    num_outputs: int = 1,
    features_col="features",
    label_col="label",
    what: str = "training",
    checks: Optional[DataChecks] = None,
    sample_weight_col: Optional[str] = None,
    preprocess: Optional[Preprocess] = None,
    label_dtype: Optional[str] = None,
) -> StagedDataset:
    """Writes ``data`` to a new directory under ``root`` and describes it.

    Args:
        data: Spark DataFrame, RDD of ``(x, y)`` pairs, or ``(x, y)`` arrays
            (or ``(x, y, sample_weight)``); for a model with several inputs
            (outputs) ``x`` (``y``) is a list of arrays in the order of
            ``model.inputs`` (``model.outputs``).
        root: Staging root (local path or ``pyarrow.fs`` URI).
        x_shapes: The model's input shapes without the batch dimension.
        x_dtype: The model inputs' dtype, one for all or one per input
            (:func:`sparkdl_avg.shared.model.modelspec.input_dtypes`; ``"string"``
            for a string input).
        num_outputs: The model's number of outputs.
        features_col: DataFrame column(s) of the features, one per input
            (with ``preprocess``: names of its output).
        label_col: DataFrame column(s) of the labels, one per output.
        what: Name of the data in error messages ("training", "validation").
        checks: Value checks made while staging (:func:`data_checks`).
        sample_weight_col: DataFrame column of the examples' weights, or ``None``.
        preprocess: The preprocessing function (DataFrames only), or ``None``.
        label_dtype: The dtype of float labels; default float64 when every
            input is float64, else float32.

    Raises:
        DataError: naming the column or array and what was received.
        PathError: the filesystem of ``root`` filled up (:func:`no_room`).
    """
    from pyspark import RDD
    from pyspark.sql import DataFrame

    if isinstance(data, DataFrame):
        write = partial(_stage_dataframe, data, features_col, label_col)
    elif isinstance(data, RDD):
        write = partial(_stage_rdd, data)
    elif isinstance(data, (tuple, list)) and len(data) == 2 or isinstance(data, tuple) and len(data) == 3:
        if sample_weight_col is not None:
            raise ConfigurationError("The 'sample_weight_col' parameter names a DataFrame column; with numpy "
                                     "arrays pass (x, y, sample_weight) instead.")
        write = partial(_stage_arrays, data)
    else:
        refuse_pandas(data, what)
        raise DataError(
            f"The {what} data must be a Spark DataFrame, an RDD of (x, y) pairs or "
            f"a tuple (x, y) (or (x, y, sample_weight)) of numpy arrays. Got {type(data).__name__} instead."
        )
    x_fields = tuple(Field(tuple(shape), dtype) for shape, dtype in zip(x_shapes, _dtypes(x_dtype, len(x_shapes))))
    directory = join(root, f"{what}-{uuid.uuid4().hex[:12]}")
    # Made here, before any task writes into it: tasks do not create it (see
    # write_columns), so one still running when a failed job is given up
    # cannot bring it back after the removal below.
    make_dir(directory)
    try:
        staged = write(directory, x_fields, num_outputs, _label_float(x_dtype, label_dtype), what, checks,
                       sample_weight_col, preprocess)
        if staged.num_examples == 0:
            raise DataError(f"The {what} data is empty (0 rows).")
    except BaseException as exc:
        remove_tree(directory)  # a refused or failed staging leaves no partial files
        if is_full(exc):
            raise no_room(root, what, exc, directory) from None
        raise
    return staged


def no_room(root: str, what: str, exc: OSError, directory: str) -> PathError:
    """The error of staging that filled the filesystem of the trainer's ``root`` (under ``staging_dir``).

    ``exc`` is the failed write: on the driver (numpy data), or reported by
    a staging task (:func:`sparkdl_avg.shared.errors.remote_errors.reported_full`),
    with the file's URI as its ``filename``; else the message names the
    data's ``directory``. Raised after the partly staged files are removed,
    before any round: the model is as it was.
    """
    staging_dir = posixpath.dirname(root.rstrip("/"))
    where = f" (writing {exc.filename or join(directory, '')!r})"
    return PathError(
        f"Cannot stage the {what} data in the 'staging_dir' {staging_dir!r}: {write_failure(exc)}{where}. "
        "The model is unchanged and the partly staged data was removed. Free space there, or give a "
        "'staging_dir' on a larger filesystem."
    )


def data_key(data: Any, features_col: str, label_col: str, sample_weight_col: Optional[str] = None,
             preprocess: Optional[Preprocess] = None) -> Optional[tuple]:
    """A key under which staged data is reused when the same data is fitted again.

    DataFrames and RDDs are immutable, so their identity suffices; arrays are
    keyed by a hash of their contents, so changing them in place re-stages.
    The columns and the preprocessing function are part of the key.
    """
    import hashlib

    from pyspark import RDD
    from pyspark.sql import DataFrame

    def hashable(col):
        return tuple(col) if isinstance(col, list) else col

    settings = (hashable(features_col), hashable(label_col), sample_weight_col,
                preprocess.digest if preprocess is not None else None)
    if isinstance(data, (DataFrame, RDD)):
        return (id(data), *settings)
    if isinstance(data, (tuple, list)) and len(data) == 2 or isinstance(data, tuple) and len(data) == 3:
        digest = hashlib.sha1()
        for a in [*_as_list(data[0], 2), *_as_list(data[1], 2), *data[2:]]:
            a = np.ascontiguousarray(a)
            digest.update(str((a.shape, a.dtype.str)).encode())
            digest.update(a.data if a.dtype != object else repr(a.tolist()).encode())
        return ("arrays", digest.hexdigest(), *settings)
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
        engine: The session's :class:`~sparkdl_avg.driver.runtime.session.Engine`.
        root: The trainer's staging root (already created).
        tasks: Tasks of the probe job (the fit's workers, at least the
            cluster's slots, so that most executors answer).
        default: Whether ``root`` is the default (``staging_dir=None``: the
            driver's temp dir), for the message.

    Raises:
        ConfigurationError: some executor does not see the marker; names
            ``staging_dir``, the hosts and what to pass instead.
    """
    from ...errors import ConfigurationError
    from ...executor import worker

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
