"""The value checks of staged data: what ``check_data`` checks and the messages that name the culprit.

This module owns :class:`DataChecks` (which checks to make), :func:`check_values`
(finite values, label ranges) and :func:`list_values` (an Arrow list column
whose rows must all hold the same number of values, as features do). They
raise :class:`~sparkdl_avg.errors.DataError` wherever they run: on the driver
for numpy data (:mod:`sparkdl_avg.data`), and on executors inside the staging
and prediction bodies (:mod:`sparkdl_avg.export`,
:mod:`sparkdl_avg.predict_worker`), which hand the error to the driver
through :mod:`sparkdl_avg.remote`. Which checks a model needs follows from
its losses (:func:`sparkdl_avg.data.data_checks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import DataError


@dataclass(frozen=True)
class DataChecks:
    """Value checks made while staging (``check_data=True``).

    Attributes:
        finite: Features and labels must be finite (no NaN/Inf).
        label_ranges: Per model output, ``(low, high, integer, what)``: labels
            must lie in ``[low, high]`` (and be whole numbers if ``integer``);
            ``what`` describes the range in the error. ``None``: no check.
    """

    finite: bool = True
    label_ranges: Tuple[Optional[Tuple[float, float, bool, str]], ...] = ()


def check_values(
    values: np.ndarray,
    name: str,
    checks: Optional[DataChecks],
    output: Optional[int] = None,
    first_row: int = 0,
    partition: bool = True,
) -> None:
    """Raises ``DataError`` naming ``name`` if ``values`` (rows × values) fail ``checks``.

    Args:
        values: The staged values, one row per example.
        name: How the error names them, e.g. ``"Column 'label'"``.
        checks: The checks; ``None`` checks nothing.
        output: For labels, the model output they belong to.
        first_row: Row number of ``values[0]`` in its partition (or array),
            for the message. Default 0.
        partition: Whether ``values`` are rows of a Spark partition (the
            message says "row 5 of its partition") or of a whole array
            ("row 5"). Default ``True``.
    """
    if checks is None or values.size == 0:
        return
    if checks.finite and values.dtype.kind == "f":
        bad = ~np.isfinite(values)
        if bad.any():
            row = first_row + int(np.argwhere(bad)[0][0])
            where = f"row {row} of its partition" if partition else f"row {row}"
            raise DataError(
                f"{name} contains NaN or Inf ({int(bad.sum())} values; the first in {where}). "
                "Clean or impute the data, or pass check_data=False to train anyway."
            )
    bounds = checks.label_ranges[output] if output is not None and output < len(checks.label_ranges) else None
    if bounds is not None:
        low, high, integer, what = bounds
        bad = (values < low) | (values > high)
        if integer:
            bad |= values != np.round(values)
        if bad.any():
            value = values[tuple(np.argwhere(bad)[0])]
            raise DataError(f"{name} holds the label {value.item()!r}; expected {what}.")


def list_values(column: pa.Array, name: str, width: int, dtype: str) -> np.ndarray:
    """The Arrow list column ``column`` as a ``(rows, width)`` numpy array of ``dtype``.

    Raises:
        DataError: a null row, a row of another length than ``width``, or
            a null value inside a row.
    """
    if column.null_count:
        raise DataError(f"Column '{name}' contains null rows; expected {width} values per row.")
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(lengths != width)
    if bad.size:
        raise DataError(
            f"Column '{name}' has a row of {int(lengths[bad[0]])} values; expected "
            f"{width} values per row (the model's input or label size)."
        )
    values = column.flatten()
    if values.null_count:
        raise DataError(f"Column '{name}' contains null values inside its arrays.")
    return values.to_numpy(zero_copy_only=False).astype(dtype, copy=False).reshape(len(column), width)
