"""The value checks of staged data: what ``check_data`` checks and the messages that name the culprit.

This module owns :class:`DataChecks` (which checks to make), :func:`check_values` (finite values, label ranges, ids
an ``Embedding`` can look up) and :func:`check_label_shape` (labels shaped as their loss needs: class indices or
vectors the output's size). They raise :class:`~sparkdl_avg.errors.DataError` wherever they run: on the driver for
numpy data (:mod:`sparkdl_avg.driver.data.staging`), and on executors inside the staging and prediction bodies
(:mod:`sparkdl_avg.executor.stage_writer`, :mod:`sparkdl_avg.executor.predict`), which hand the error to the driver
through :mod:`sparkdl_avg.shared.errors.remote_errors`. Which checks a model needs follows from its losses
(:func:`sparkdl_avg.driver.data.staging.data_checks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import numpy as np

from ...errors import DataError


@dataclass(frozen=True)
class LabelShape:
    """The label shape one model output's loss accepts (a cross-entropy on an output of shape ``(batch, units)``).

    Attributes:
        loss: The loss as the user gave it (``"sparse_categorical_crossentropy"``,
            ``"SparseCategoricalCrossentropy"``), for the message.
        kind: ``"sparse"`` (one integer class index per row), ``"categorical"`` (a vector of ``units`` class
            probabilities per row), ``"binary"`` (``units`` values in [0, 1] per row) or ``"elementwise"`` (a
            regression or hinge loss comparing label and output value by value: ``units`` values per row).
        units: The output's last dimension.
    """

    loss: str
    kind: str
    units: int


@dataclass(frozen=True)
class DataChecks:
    """Value checks made while staging (``check_data=True``).

    Attributes:
        finite: Features and labels must be finite (no NaN/Inf).
        label_ranges: Per model output, ``(low, high, integer, what)``: labels must lie in ``[low, high]`` (and be
            whole numbers if ``integer``); ``what`` describes the range in the error. ``None``: no check.
        label_shapes: Per model output, the :class:`LabelShape` its loss accepts; ``None``: no check.
        id_ranges: Per model input, ``(input_dim, layer name)`` of the ``Embedding`` layer it feeds directly, else
            ``None``: ids must lie in ``[0, input_dim)`` (TensorFlow fails on larger ones at round 0, naming neither
            column nor layer); negative ones, which Keras trains on silently, are warned of.
        advice: What a NaN/Inf message advises (``predict`` has no ``check_data`` to turn the check off).
    """

    finite: bool = True
    label_ranges: Tuple[Optional[Tuple[float, float, bool, str]], ...] = ()
    label_shapes: Tuple[Optional[LabelShape], ...] = ()
    id_ranges: Tuple[Optional[Tuple[int, str]], ...] = ()
    advice: str = "Clean or impute the data, or pass check_data=False to train anyway."


def check_values(
    values: np.ndarray,
    name: str,
    checks: Optional[DataChecks],
    output: Optional[int] = None,
    first_row: int = 0,
    partition: bool = True,
    input: Optional[int] = None,
    where: Optional[Callable[[int], str]] = None,
    warn: Optional[Callable[[str], None]] = None,
) -> None:
    """Raises ``DataError`` naming ``name`` if ``values`` (rows × values) fail ``checks``.

    Args:
        values: The staged values, one row per example.
        name: How the error names them, e.g. ``"Column 'label'"``.
        checks: ``None`` checks nothing.
        output: For labels, the model output they belong to.
        first_row: Row number of ``values[0]`` in its partition (or array), for the message. Default 0.
        partition: Whether ``values`` are rows of a Spark partition (the message says "row 5 of its partition") or of a
            whole array ("row 5"). Default ``True``.
        input: For features, the model input they feed (its ``id_ranges`` check).
        where: The message's description of row ``i`` of ``values`` (e.g. "row 12 of the training data; path
            '...'"); default from ``first_row`` and ``partition``.
        warn: Where a warning goes (negative ids); default :func:`warnings.warn`.
    """
    if checks is None or values.size == 0:
        return

    def describe(i: int) -> str:
        if where is not None:
            return where(i)
        return f"row {first_row + i} of its partition" if partition else f"row {first_row + i}"

    if checks.finite and values.dtype.kind == "f":
        bad = ~np.isfinite(values)
        if bad.any():
            raise DataError(
                f"{name} contains NaN or Inf ({int(bad.sum())} values; the first in "
                f"{describe(int(np.argwhere(bad)[0][0]))}). {checks.advice}"
            )
    ids = checks.id_ranges[input] if input is not None and input < len(checks.id_ranges) else None
    if ids is not None and values.dtype.kind in "iuf":
        dim, layer = ids
        for bad, what in ((values >= dim, "refused"), (values < 0, "warned")):
            if not bad.any():
                continue
            i, j = np.argwhere(bad)[0][:2] if values.ndim > 1 else (np.argwhere(bad)[0][0], 0)
            value = values[i, j] if values.ndim > 1 else values[i]
            message = (f"{name} holds the id {value.item()!r} ({int(bad.sum())} such values; the first in "
                       f"{describe(int(i))}); the Embedding layer {layer!r} it feeds takes ids in [0, {dim}) "
                       f"(its input_dim).")
            if what == "refused":
                raise DataError(message + f" Map the ids into that range or build the layer with input_dim > "
                                f"{int(values.max())}.")
            message += (" Keras trains on negative ids without complaint (they count from the end of the table); "
                        "map them into the range unless that is meant.")
            (warn or _warn)(message)
    bounds = checks.label_ranges[output] if output is not None and output < len(checks.label_ranges) else None
    if bounds is not None:
        low, high, integer, what = bounds
        bad = (values < low) | (values > high)
        if integer:
            bad |= values != np.round(values)
        if bad.any():
            value = values[tuple(np.argwhere(bad)[0])]
            raise DataError(f"{name} holds the label {value.item()!r}; expected {what}.")


def _warn(message: str) -> None:
    import warnings

    warnings.warn(message, UserWarning, stacklevel=3)


def _units(n: int) -> str:
    return f"{n} unit{'s' if n != 1 else ''}"


def check_label_shape(shape: Optional[Tuple[int, ...]], name: str, checks: Optional[DataChecks], output: int) -> None:
    """Raises ``DataError`` if labels of ``shape`` (one row's) do not fit the loss of model output ``output``.

    Keras would otherwise fail in the first round with a message about the rank of ``target`` and ``output``, from
    inside a worker.

    Args:
        shape: One example's label shape (``()`` for one number per row); ``None`` when not known yet (an array column
            before staging).
        name: How the message names the labels, e.g. ``"label column 'label'"``.
        checks: ``None`` checks nothing.
        output: The model output the labels belong to.
    """
    if checks is None or shape is None or output >= len(checks.label_shapes):
        return
    expected = checks.label_shapes[output]
    if expected is None:
        return
    shape = tuple(shape)
    one = shape in ((), (1,))  # Keras takes (batch,) and (batch, 1) alike
    units = expected.units
    if expected.kind == "sparse":
        if one:
            return
        want = "one integer class index per row"
        advice = "use categorical_crossentropy or argmax the labels"
    else:
        if shape == (units,) or (one and units == 1):
            return
        if expected.kind == "categorical":
            want = f"a one-hot vector of {units} values per row (the model's output has {units} classes)"
            advice = ("use sparse_categorical_crossentropy for class indices or one-hot encode the labels" if one
                      else f"give {units} values per row or change the output layer to {math.prod(shape)} units")
        elif expected.kind == "elementwise":
            want = f"{units} value(s) per row (one per unit of the model's output)"
            advice = f"give {units} value(s) per row or change the output layer to {_units(math.prod(shape))}"
        else:
            want = f"{units} value(s) in [0, 1] per row (one per unit of the model's output)"
            advice = f"give {units} value(s) per row or change the output layer to {_units(math.prod(shape))}"
    got = ("one number per row" if one else f"vectors of length {shape[0]}" if len(shape) == 1
           else f"arrays of shape {shape} per row")
    raise DataError(f"{expected.loss} expects {want}; {name} holds {got}: {advice}.")
