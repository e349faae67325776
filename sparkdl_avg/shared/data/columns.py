"""What one staged column is, and how a user's values become it and come back out, exactly.

This module owns :class:`Field` (what a model input, a label or a sample
weight is per example: shape and dtype) and :class:`Column` (one column of a
staged file: where it came from, which kind of column it is, what it holds),
and the four ways values go through a column, each answered by the column's
kind (:mod:`sparkdl_avg.shared.data.kinds`):

- :func:`stage_arrow` and :func:`stage_numpy` turn an Arrow column of a
  DataFrame's partition, or a numpy array, into the staged Arrow array:
  numbers in the dtype of the model input they feed
  (:func:`~sparkdl_avg.shared.data.conversions.exact_cast` refuses any
  integer conversion that would change a value: float32 holds integers
  exactly only up to 2^24), bytes and text as they came, Spark's image
  struct as it came;
- :func:`read_column` turns the staged rows of one column back into what
  the model or the preprocessing function gets, and :func:`arrow_value` a
  column of a batch that was never staged (``predict``'s input).

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

from .conversions import (IMAGE_FIELDS, exact_cast, image_pixels, is_image_struct, is_list, is_text,
                          list_matrix, raw_value, tensor_array)
from .kinds import KINDS, TEXT, ColumnKind

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
        kind: The name of its :class:`~sparkdl_avg.shared.data.kinds.ColumnKind`
            (:data:`~sparkdl_avg.shared.data.kinds.KINDS`): ``"tensor"``
            (numbers of a fixed shape, stored as a ``FixedSizeList`` of
            ``field.width`` values of ``field.dtype``), ``"text"`` (one
            ``binary`` or ``string`` value per row, as it came),
            ``"image"`` (Spark's image struct as it came, read as
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

    @property
    def handler(self) -> ColumnKind:
        """The column's :class:`~sparkdl_avg.shared.data.kinds.ColumnKind` (by its ``kind``)."""
        return KINDS.get(self.kind)


def stage_arrow(column: pa.Array, spec: Column, first_row: int = 0) -> pa.Array:
    """One column of a DataFrame's partition (an Arrow array) as the staged array of ``spec``."""
    return spec.handler.stage_arrow(column, spec, first_row)


def stage_numpy(values: np.ndarray, spec: Column) -> pa.Array:
    """A numpy array (``(rows, ...)``) as the staged array of ``spec`` (numpy data and RDDs)."""
    return spec.handler.stage_numpy(values, spec)


def arrow_value(array: pa.Array, spec: Column) -> Any:
    """A column of a DataFrame's batch, not staged (``predict``'s input), as :func:`read_column` gives staged rows."""
    return spec.handler.arrow_value(array, spec)


def read_column(array: pa.Array, spec: Column) -> Any:
    """The staged rows ``array`` of column ``spec`` as the model or the preprocessing function gets them."""
    return spec.handler.read(array, spec)


__all__ = ["Column", "Field", "TEXT", "IMAGE_FIELDS", "arrow_value", "exact_cast", "image_pixels", "is_image_struct",
           "is_list", "is_text", "list_matrix", "raw_value", "read_column", "stage_arrow", "stage_numpy",
           "tensor_array"]
