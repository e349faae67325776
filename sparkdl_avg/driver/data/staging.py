"""Driver side of the data path: stages the user's data once, whatever container it comes in.

:func:`stage` asks the data's adapter (:mod:`sparkdl_avg.driver.data.adapters`:
a Spark DataFrame, an RDD of ``(x, y)`` pairs, a tuple of numpy arrays, or a
user's container converted to one of them) to check what it can on the
driver and write the examples to a new directory under the staging root, in
the format of :mod:`sparkdl_avg.shared.data.staged_dataset`: one Spark job
for a DataFrame (:mod:`.frames`) or an RDD, none for arrays (:mod:`.arrays`).
Each model input gets its own column in its own dtype (``model.inputs``), of
the column kind that takes it (:mod:`sparkdl_avg.shared.data.kinds`): numbers
converted exactly, bytes, text and Spark's image struct staged as they came;
with a preprocessing function, the raw columns it reads. This module also
owns what surrounds a staging: the key under which staged data is reused
(:func:`data_key`), the error of a full filesystem (:func:`no_room`) and the
check that the executors share the staging root (:func:`check_shared_root`).
The checks a model implies are :mod:`.checks`'. The driver only ever
receives one small row per partition, never the data.
"""

from __future__ import annotations

import posixpath
import uuid
from functools import partial
from typing import Any, List, Optional, Sequence, Tuple, Union

from ...errors import DataError, PathError
from ...shared.data.columns import Field
from ...shared.data.kinds import STRING_INPUT_ADVICE
from ...shared.data.preprocess import Preprocess
from ...shared.data.staged_dataset import StagedDataset
from ...shared.data.value_checks import DataChecks
from ...shared.errors.remote_errors import run_job
from ...shared.files.fs import is_full, join, make_dir, remove_tree, write_failure
from .adapters import StageRequest, find_data_adapter, get_data_adapter
from .checks import ELEMENTWISE_LOSSES, data_checks
from .frames import DRY_RUN_ROWS, column_list, dry_run, input_column, quoted


def _dtypes(x_dtype: Union[str, Sequence[str]], count: int) -> List[str]:
    return [x_dtype] * count if isinstance(x_dtype, str) else list(x_dtype)


def _label_float(x_dtype: Union[str, Sequence[str]], label_dtype: Optional[str]) -> str:
    """The dtype of float labels: ``label_dtype``, else float64 when every input is, else float32."""
    if label_dtype:
        return label_dtype
    dtypes = set(_dtypes(x_dtype, 1) if isinstance(x_dtype, str) else x_dtype)
    return "float64" if dtypes == {"float64"} else "float32"


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
            ``model.inputs`` (``model.outputs``); or a container a
            registered :class:`~sparkdl_avg.driver.data.adapters.DataAdapter`
            converts to one of them.
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
    adapter = get_data_adapter(data, what)
    x_fields = tuple(Field(tuple(shape), dtype) for shape, dtype in zip(x_shapes, _dtypes(x_dtype, len(x_shapes))))
    directory = join(root, f"{what}-{uuid.uuid4().hex[:12]}")
    # Made here, before any task writes into it: tasks do not create it (see
    # write_columns), so one still running when a failed job is given up
    # cannot bring it back after the removal below.
    make_dir(directory)
    try:
        staged = adapter.stage(directory, StageRequest(
            x_fields, num_outputs, _label_float(x_dtype, label_dtype), what, checks, features_col, label_col,
            sample_weight_col, preprocess))
        if staged.num_examples == 0:
            raise DataError(f"The {what} data is empty (0 rows); expected at least one example per worker and minibatch.")
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
    """A key under which staged data is reused when the same data is fitted again (``None``: never reused).

    DataFrames and RDDs are immutable, so their identity suffices; arrays are
    keyed by a hash of their contents, so changing them in place re-stages
    (:meth:`~sparkdl_avg.driver.data.adapters.DataAdapter.key`). The columns
    and the preprocessing function are part of the key.
    """
    def hashable(col):
        return tuple(col) if isinstance(col, list) else col

    adapter = find_data_adapter(data)
    settings = (hashable(features_col), hashable(label_col), sample_weight_col,
                preprocess.digest if preprocess is not None else None)
    return None if adapter is None else adapter.key(settings)


def validation_weight_col(data: Any, sample_weight_col: Optional[str]) -> Optional[str]:
    """The weight column of validation ``data``: ``sample_weight_col`` when ``data`` has it, else ``None``.

    As Keras weighs ``validation_data`` only when it is given with weights,
    validation data without the column is evaluated unweighted rather than
    refused. The one rule for the API (``fit``) and the jobs
    (:func:`sparkdl_avg.driver.api.cli.needed_columns`, which therefore does not
    require the column in ``--validation-data``).
    """
    if sample_weight_col is None:
        return None
    return sample_weight_col if get_data_adapter(data, "validation").has_column(sample_weight_col) else None


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


__all__ = ["DRY_RUN_ROWS", "ELEMENTWISE_LOSSES", "STRING_INPUT_ADVICE", "check_shared_root", "column_list",
           "data_checks", "data_key", "dry_run", "input_column", "no_room", "quoted", "stage",
           "validation_weight_col"]
