"""How numpy arrays and RDDs of ``(x, y)`` pairs are staged: checked against the model, columns chosen by kind.

This module owns the staging of data without a schema, which
:class:`~sparkdl_avg.driver.data.adapters.ArrayAdapter` and
:class:`~sparkdl_avg.driver.data.adapters.RDDAdapter` hand their data to:
each model input's column kind is chosen from the input's field
(:func:`sparkdl_avg.shared.data.kinds.kind_for_field`); numpy arrays are
checked and written on the driver as one file (no Spark job), an RDD by one
Spark job whose task body is :func:`sparkdl_avg.executor.stage_writer.export_pairs`.
It also owns what the adapters ask of arrays: their digest (:func:`digest`,
which keys reused staging) and their first rows (:func:`head`).
"""

from __future__ import annotations

import hashlib
from functools import partial
from typing import Optional, Sequence

import numpy as np

from ...errors import ConfigurationError, DataError
from ...executor.stage_writer import check_staged, export_pairs, no_weight_message, positive_weights
from ...shared.data.columns import Column, Field, stage_numpy
from ...shared.data.kinds import TensorKind, input_name, kind_for_field
from ...shared.data.staged_dataset import StagedDataset, StagedFile, write_columns
from ...shared.files.fs import join
from ...shared.data.value_checks import check_label_shape
from ...shared.errors.remote_errors import raise_reported, run_job


def as_list(value, count: int) -> list:
    """``value`` as a list of ``count`` parts: a list/tuple as is, anything else alone."""
    return list(value) if count > 1 and isinstance(value, (list, tuple)) else [value]


def digest(data) -> str:
    """A hash of ``(x, y)``/``(x, y, sample_weight)`` arrays' shapes, dtypes and contents."""
    found = hashlib.sha1()
    for a in [*as_list(data[0], 2), *as_list(data[1], 2), *data[2:]]:
        a = np.ascontiguousarray(a)
        found.update(str((a.shape, a.dtype.str)).encode())
        found.update(a.data if a.dtype != object else repr(a.tolist()).encode())
    return found.hexdigest()


def count(data) -> int:
    """Examples in ``(x, y)``/``(x, y, sample_weight)`` arrays: the length of the (first) features array."""
    x = data[0]
    return len(x[0] if isinstance(x, (list, tuple)) else x)


def head(data, n: int):
    """The first ``n`` examples of ``(x, y)``/``(x, y, sample_weight)`` arrays, in the same structure."""
    def cut(a):
        return [v[:n] for v in a] if isinstance(a, (list, tuple)) else a[:n]

    return tuple(cut(a) for a in data)


def stage_arrays(data, directory: str, x_fields: Sequence[Field], num_outputs: int, label_float: str, what: str,
                  checks=None, weight: Optional[str] = None, preprocess=None) -> StagedDataset:
    if preprocess is not None:
        raise ConfigurationError("The 'preprocess' parameter applies to DataFrame data (its columns are what the "
                                 "function reads). Got numpy arrays; transform them yourself, or pass a DataFrame.")
    if len(data) == 3:
        xs_given, ys_given, w_given = data
    else:
        (xs_given, ys_given), w_given = data, None
    xs = [np.asarray(a) for a in as_list(xs_given, len(x_fields))]
    ys = [np.asarray(a) for a in as_list(ys_given, num_outputs)]
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
            raise DataError(f"The {what} array {name} must be numeric (labels: class indices or values). Got dtype "
                            f"{a.dtype} instead; encode text labels as numbers first (np.unique(y, "
                            "return_inverse=True), or StringIndexer on a DataFrame).")
    columns, arrays = [], {}
    for k, (x, field) in enumerate(zip(xs, x_fields)):
        name = f"The {what} array x" + (f"[{k}]" if len(xs) > 1 else "")
        kind = kind_for_field(field)
        kind.check_array(x, field, name, input_name(k, len(xs)), what)
        column = Column(f"x{k}", name, kind.name, field, "x", k)
        columns.append(column)
        arrays[column.name] = stage_numpy(x, column)
    for k, y in enumerate(ys):
        array = f"{what} array y" + (f"[{k}]" if len(ys) > 1 else "")
        check_label_shape(np.shape(y)[1:], f"the {array}", checks, k)
        integer = np.issubdtype(y.dtype, np.integer) or y.dtype == bool
        column = Column(f"y{k}", f"The {array}", TensorKind.name,
                        Field(tuple(y.shape[1:]), "int32" if integer else label_float), "y", k)
        columns.append(column)
        arrays[column.name] = stage_numpy(y, column)
    if w_given is not None:
        column = Column("w", f"The {what} sample weights", TensorKind.name, Field((), "float32"), "w")
        weights = np.asarray(w_given)
        if weights.ndim != 1:
            raise DataError(f"{column.source} have shape {weights.shape}; expected one weight per example, shape "
                            f"({n},), as keras.Model.fit's sample_weight.")
        columns.append(column)
        arrays["w"] = stage_numpy(weights, column)
    for column in columns:
        check_staged(arrays[column.name], column, checks, partition=False, name=column.source)
    if w_given is not None and n and not positive_weights(arrays["w"]):
        raise DataError(no_weight_message(f"The {what} sample weights", n))
    uri = join(directory, "part-00000.arrow")
    nbytes = write_columns(uri, arrays)
    xcols, ycols = columns[: len(xs)], columns[len(xs): len(xs) + len(ys)]
    return StagedDataset(
        (StagedFile(uri, n, nbytes),), tuple(columns), tuple(c.name for c in xcols), tuple(c.field for c in xcols),
        tuple(c.name for c in ycols), tuple(c.field for c in ycols), "w" if w_given is not None else None,
    )


def stage_rdd(rdd, directory, x_fields, num_outputs, label_float, what, checks=None, weight=None,
               preprocess=None) -> StagedDataset:
    if preprocess is not None or weight is not None:
        which = "preprocess" if preprocess is not None else "sample_weight_col"
        raise ConfigurationError(f"The '{which}' parameter applies to DataFrame data (it names columns). Got an "
                                 "RDD; convert it with spark.createDataFrame.")
    inputs = [Column(f"x{k}", f"x[{k}]", kind_for_field(f).name, f, "x", k) for k, f in enumerate(x_fields)]
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
    columns = tuple(inputs) + tuple(Column(f"y{k}", f"y[{k}]", TensorKind.name, f, "y", k) for k, f in enumerate(y_fields))
    return StagedDataset(files, columns, tuple(c.name for c in inputs), tuple(x_fields),
                         tuple(f"y{k}" for k in range(num_outputs)), y_fields)
