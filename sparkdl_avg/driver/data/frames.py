"""How a Spark DataFrame is staged: its columns checked against the model, chosen by kind, written by one Spark job.

This module owns the DataFrame side of staging, which :class:`~sparkdl_avg.driver.data.adapters.DataFrameAdapter`
(classic and Spark Connect DataFrames) hands its data to: the columns named by ``features_col``, ``label_col`` and
``sample_weight_col`` checked against the schema (:func:`input_column`: each model input's column kind chosen by
:func:`sparkdl_avg.shared.data.kinds.kind_for_spark`), one ``mapInArrow`` job whose task bodies are
:mod:`sparkdl_avg.executor.stage_writer`'s, and, with a preprocessing function, its dry run on a few rows
(:func:`dry_run`) and the raw columns it reads. :mod:`sparkdl_avg.driver.data.inference` uses the same column checks for
``predict``. The driver only ever receives one small row per partition, never the data.
"""

from __future__ import annotations

import logging
import warnings
from functools import partial
from typing import List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from ...errors import DataError
from ...executor.stage_writer import export_arrow_batches, no_weight_message
from ...shared.data.columns import Column, Field, exact_cast, raw_value
from ...shared.data.kinds import STRING_INPUT_ADVICE, RawKind, TensorKind, input_name, kind_for_spark
from ...shared.data.preprocess import ORIGIN_COLUMNS, Preprocess
from ...shared.data.staged_dataset import StagedDataset, StagedFile
from ...shared.data.value_checks import DataChecks, check_label_shape, check_values
from ...shared.errors.remote_errors import user_columns, raise_reported, run_job

logger = logging.getLogger("sparkdl_avg")

DRY_RUN_ROWS = 8
"""Rows a preprocessing function is run on, on the driver, before anything is staged (:func:`dry_run`)."""


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


def quoted(name: str):
    """The Spark column ``name``, quoted (names may hold dots, spaces or backticks)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def input_column(df, name: str, k: int, count: int, field: Field, what: str = "training"):
    """``(expression, Column)``: how DataFrame column ``name`` feeds model input ``k`` (of ``count``) of ``field``.

    The column kinds are asked in turn (:func:`~sparkdl_avg.shared.data.kinds.kind_for_spark`): ``binary`` and
    ``string`` columns feed string inputs; numeric arrays, numeric scalars (inputs of one value) and ``pyspark.ml``
    Vectors feed numeric inputs (a Vector size known from the schema's ML metadata, which ``VectorAssembler`` writes, is
    checked here); Spark's image struct feeds an input of shape ``(height, width, channels)``.

    Raises:
        DataError: the column is missing, of a type the input cannot take, or of the wrong size.
    """
    from pyspark.sql import types as T

    schema_field = _check_columns(df, what, features_col=name)[name]
    data_type = schema_field.dataType
    chosen = kind_for_spark(quoted(name), data_type, schema_field.metadata, field, name, input_name(k, count))
    if chosen is not None:
        kind, expr = chosen
        return expr, Column(name, name, kind.name, field, "x", k)
    advice = f" {STRING_INPUT_ADVICE}" if isinstance(data_type, (T.BinaryType, T.StringType)) else ""
    if isinstance(data_type, (T.NumericType, T.BooleanType)):
        advice = (f" A number per row feeds an input of one value; {input_name(k, count)} takes "
                  f"{field.shape}.")
    raise DataError(
        f"Column '{name}' must be array<float>, array<double> or a pyspark.ml Vector. Got {data_type.simpleString()} "
        f"instead ({input_name(k, count)} takes {field.dtype} values of shape {tuple(field.shape)}).{advice}"
    )


def _label_column(name: str, k: int, fields: dict, label_float: str, what: str):
    """``(expression, Column)`` of one label column (number, array or Vector)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    label_type = fields[name].dataType
    source = quoted(name)
    if isinstance(label_type, (T.IntegralType, T.BooleanType)):
        return source, Column(f"y{k}", name, TensorKind.name, Field((), "int32"), "y", k)
    if isinstance(label_type, T.NumericType):
        return source, Column(f"y{k}", name, TensorKind.name, Field((), label_float), "y", k)
    if isinstance(label_type, T.ArrayType) and isinstance(label_type.elementType, (T.NumericType, T.BooleanType)):
        return source, Column(f"y{k}", name, TensorKind.name, Field(None, label_float), "y", k)
    if isinstance(label_type, VectorUDT):
        return (vector_to_array(source, "float32" if label_float == "float32" else "float64"),
                Column(f"y{k}", name, TensorKind.name, Field(None, label_float), "y", k))
    raise DataError(
        f"Column '{name}' must be numeric, an array of numbers or a pyspark.ml "
        f"Vector. Got {label_type.simpleString()} instead."
    )


def _weight_column(name: str, fields: dict):
    from pyspark.sql import types as T

    if not isinstance(fields[name].dataType, (T.NumericType, T.BooleanType)):
        raise DataError(f"Column '{name}' ('sample_weight_col') must be numeric: one weight per row. Got "
                        f"{fields[name].dataType.simpleString()} instead.")
    return quoted(name), Column("w", name, TensorKind.name, Field((), "float32"), "w")


def _run_staging(selected, columns, directory, checks, what, renamed,
                 preprocess: Optional[Preprocess] = None) -> Tuple[Tuple[StagedFile, ...], list]:
    """The staging job over ``selected`` (one column per :class:`Column`); returns the files and the label widths.

    With ``preprocess``, each task first loads the function as the rounds will: a module the executors lack stops the
    fit here, before the data is read.
    """
    body = partial(export_arrow_batches, directory=directory, columns=columns, checks=checks, preprocess=preprocess)
    rows = run_job(
        lambda: selected.mapInArrow(
            body, "uri string, rows long, label_widths array<int>, bytes long, error string, warning string, "
                  "weighted long").collect(),
        f"Staging the {what} data",
        renamed,
    )
    warning = next((r.warning for r in rows if r.warning), None)
    if warning:  # one warning per staging (negative ids), in the user's column names
        warnings.warn(user_columns(warning if what == "training" else f"In the {what} data: {warning}", renamed),
                      UserWarning, stacklevel=2)
    try:
        raise_reported((r.error for r in rows), renamed)
    except DataError as exc:  # "Column 'features' has a row of 32 values" must say which data it is
        if what == "training":
            raise
        raise DataError(f"In the {what} data: {exc}") from None
    widths = {tuple(r.label_widths) for r in rows if r.rows}
    files = tuple(StagedFile(r.uri, r.rows, r.bytes) for r in rows if r.rows)
    weight = next((c for c in columns if c.role == "w"), None)
    total = sum(r.rows for r in rows)
    if weight is not None and total and not sum(r.weighted for r in rows):
        message = no_weight_message(f"Column '{weight.source}' ('sample_weight_col')", total)
        raise DataError(message if what == "training" else f"In the {what} data: {message}")
    return files, widths


def stage_dataframe(df, features_col, label_col, directory, x_fields, num_outputs, label_float, what, checks=None,
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

    Its output must give every model input in the shape and dtype the model takes, and labels the loss accepts
    (:func:`check_label_shape`, and the ``check_data`` value checks: finite inputs, labels and weights, ids in an
    Embedding's range). Training data is run with ``training=True`` and, when the function takes ``training``, with
    ``training=False`` too, as validation, ``evaluate`` and ``predict`` will call it. Costs one small Spark job.

    Returns:
        The function with the columns it read, the DataFrame columns to stage (those it read, the names it does not
        return that the batch passes through, and a string ``path`` column, which names a row the function fails on in
        a round), and the labels' fields (shape from the output; integers as int32, else ``label_float``).

    Raises:
        DataError: the function failed, or its output does not fit the model.
    """
    from pyspark.ml.linalg import VectorUDT

    usable = [f.name for f in df.schema.fields if not isinstance(f.dataType, VectorUDT)]
    sample = df.select(*[quoted(c) for c in usable]).limit(DRY_RUN_ROWS).toArrow()
    if sample.num_rows == 0:
        raise DataError(f"The {what} data is empty (0 rows); expected at least one example per worker and minibatch.")
    batch = {name: raw_value(sample.column(name)) for name in sample.column_names}
    modes = [what == "training"] + ([False] if what == "training" and preprocess.takes_training else [])
    read: set = set()
    y_fields: Tuple[Field, ...] = ()
    returned: set = set()
    for training in modes:
        fields, out, columns = _check_output(batch, sample.num_rows, preprocess, training, modes, x_names, x_fields, y_names,
                                             label_float, weight, checks, what)
        y_fields = y_fields or fields
        read.update(columns)
        returned.update(out)
    read_cols = tuple(c for c in batch if c in read)
    wanted = [*x_names, *y_names, *([weight] if weight else [])]
    staged = list(read_cols) + [c for c in wanted if c not in returned and c in batch and c not in read]
    # Where a row came from (binaryFile's path), so that a row the function fails on in a round is named by it.
    staged += [c for c in ORIGIN_COLUMNS if c in batch and c not in staged and sample.schema.field(c).type in
               (pa.string(), pa.large_string())]
    return preprocess.with_columns(read_cols), staged, y_fields


def _check_output(batch, n: int, preprocess: Preprocess, training: bool, modes, x_names, x_fields, y_names, label_float,
                  weight, checks, what):
    """One dry-run call of ``preprocess`` (:func:`dry_run`): its labels' fields, output and the columns it read."""
    from ...shared.data.preprocess import describe_row
    from ...shared.data.staged_dataset import _as_field, as_rows, output_name

    data = f"{what} data"
    # The training=False run is named as such: the function passed with training=True
    mode = " (called with training=False, as validation, evaluate and predict call it)" if len(modes) > 1 and \
        not training else ""
    out, read = preprocess.dry_run(batch, training=training, what=data + mode)
    function = f"the preprocessing function {preprocess.name!r}{mode}"  # mid-sentence: "the labels 'y' of the ..."
    source = function[0].upper() + function[1:]

    def get(name, param):
        if name in out:
            return out[name]
        if name in batch:
            return batch[name]
        raise DataError(f"{source} returned {sorted(out)} on the first {n} rows of the {what} data; '{param}' names "
                        f"{name!r}, which it must return (or the DataFrame must hold).")

    def check(array, name, **role):  # finite values, ids in range: as the executors check every minibatch
        if checks is not None and name in out and array.dtype != object:
            check_values(array.reshape(n, -1), output_name(preprocess, name) + mode, checks,
                         where=lambda i: describe_row(batch, i, data), **role)

    for k, (name, field) in enumerate(zip(x_names, x_fields)):
        check(_as_field(get(name, "features_col"), field, name, n, source), name, input=k)
    y_fields = []
    for k, name in enumerate(y_names):
        value = as_rows(get(name, "label_col"), name, n, source)
        if not (np.issubdtype(value.dtype, np.number) or value.dtype == bool) or len(value) != n:
            raise DataError(f"{source} gives the labels {name!r} as {value.dtype} with {len(value)} rows; expected "
                            f"numbers, one row per example ({n}).")
        integer = np.issubdtype(value.dtype, np.integer) or value.dtype == bool
        field = Field(tuple(value.shape[1:]), "int32" if integer else label_float)
        check_label_shape(field.shape, f"the labels {name!r} of {function}", checks, k)
        check_values(exact_cast(value.reshape(n, -1), field.dtype, f"{source} ({name!r})", where="of the batch"),
                     f"The labels {name!r} of {function}", checks, k, partition=False,
                     where=lambda i: describe_row(batch, i, data))
        y_fields.append(field)
    if weight is not None:
        weights = _as_field(get(weight, "sample_weight_col"), Field((), "float32"), weight, n, source)
        check(weights, weight)
        if not mode and not np.any(np.asarray(weights, dtype="float64") > 0):  # the rows seen, not the whole data
            logger.warning("The sample weights %r of the first %d rows of the %s data (what %s returned) are all 0: "
                           "if every row weighs 0 the fit trains nothing; expected some weights above 0.",
                           weight, n, what, function)
    return tuple(y_fields), out, read


def _stage_preprocessed(df, x_names, y_names, directory, x_fields, label_float, what, checks, weight,
                        preprocess: Preprocess) -> StagedDataset:
    """Stages the raw columns ``preprocess`` reads (and those passed through), as they came."""
    preprocess, staged, y_fields = dry_run(df, preprocess, x_names, x_fields, y_names, label_float, weight, checks,
                                           what)
    if not staged:
        raise DataError(f"The preprocessing function {preprocess.name!r} reads no column of the {what} data.")
    columns = [Column(c, c, RawKind.name, None, "raw") for c in staged]
    selected = df.select(*[quoted(c) for c in staged])
    files, _ = _run_staging(selected, columns, directory, None, what, None, preprocess)
    return StagedDataset(files, tuple(columns), tuple(x_names), tuple(x_fields), tuple(y_names), y_fields,
                         weight, preprocess, checks=checks)
