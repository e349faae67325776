"""Data adapters: one class per container a user can pass as data, behind one protocol, found in one registry.

As Keras' ``DataAdapter`` and ``get_data_adapter``: every question the driver asks of the user's data (whose Spark
session runs it, whether it has a column, under which key its staged files are reused, how it is staged, how many
examples it has and its first few for ``advise``, the DataFrame ``predict`` adds its outputs to) is put to the data's
adapter, and one lookup (:func:`find_data_adapter`, in :data:`ADAPTERS`) chooses the adapter. The built-in adapters:

- :class:`DataFrameAdapter`: a Spark DataFrame, classic or Spark Connect;
- :class:`RDDAdapter`: an RDD of ``(x, y)`` pairs (classic sessions only);
- :class:`ArrayAdapter`: ``(x, y)`` or ``(x, y, sample_weight)`` numpy arrays;
- :class:`PandasAdapter`: a pandas DataFrame, refused with how to convert it.

A user's own container joins through :func:`register_data_adapter` with a :class:`DataAdapter` subclass that converts it
to one of the above (see the class's docstring); the lookup asks the user's adapters first, the latest registered first.
Every question goes to a built-in adapter: :func:`get_data_adapter` converts a user's container first. A new built-in
container is one class here (and, when it stages in its own way, the module that stages it: :mod:`.frames` and
:mod:`.arrays` are the built-ins').
"""

from __future__ import annotations

import inspect

import sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Type

from ...errors import ConfigurationError, DataError
from ...shared.data.columns import Field
from ...shared.data.preprocess import Preprocess
from ...shared.data.staged_dataset import StagedDataset
from ...shared.data.value_checks import DataChecks
from ...shared.registry import Registry
from ..runtime import inprocess
from ..runtime.session import Engine, active_engine, is_connect
from . import arrays, frames


@dataclass(frozen=True)
class StageRequest:
    """What a built-in adapter's ``stage`` is asked to write (see :func:`sparkdl_avg.driver.data.staging.stage`)."""

    x_fields: Sequence[Field]
    num_outputs: int
    label_float: str
    what: str
    checks: Optional[DataChecks] = None
    features_col: Any = "features"
    label_col: Any = "label"
    sample_weight_col: Optional[str] = None
    preprocess: Optional[Preprocess] = None


class DataAdapter:
    """Makes a container of data usable by ``fit``, ``evaluate``, ``predict`` and ``advise``.

    To pass a container the library does not know, subclass this class, implement the two methods below and register the
    class with :func:`sparkdl_avg.register_data_adapter`:

    - ``can_handle(cls, data) -> bool`` (a classmethod): whether ``data`` is your container. It must be cheap and must
      not raise.
    - ``convert(self) -> data``: ``self.data`` (your container) as data the library takes: a Spark DataFrame (with the
      columns ``features_col``, ``label_col`` and ``sample_weight_col`` name), an RDD of ``(x, y)`` pairs, or a tuple
      ``(x, y)`` / ``(x, y, sample_weight)`` of numpy arrays. ``self.what`` names the data in messages
      (``"training"``, ``"validation"``, ``"evaluation"``, ...).

    Each call of ``fit``, ``evaluate``, ``predict`` or ``advise`` converts your container once, then treats the result
    as if you had passed it: the same checks, messages and staging. ``predict`` returns a DataFrame with the predictions
    added, so it takes containers that convert to a DataFrame (as it takes DataFrames, not numpy arrays). Data staged
    from a converted DataFrame or RDD is not reused by a later call (each call converts again, into a new DataFrame);
    converted numpy arrays are reused when their contents are the same, as numpy arrays always are.

    Example::

        class ColumnsAdapter(sparkdl_avg.DataAdapter):
            @classmethod
            def can_handle(cls, data):
                return isinstance(data, MyColumns)

            def convert(self):
                return self.data.features, self.data.labels

        sparkdl_avg.register_data_adapter(ColumnsAdapter)
        trainer.fit(MyColumns(...))

    The driver's other questions go to the library's adapter of the data your container converts to (:meth:`known`); a
    user's adapter need not implement them.

    Args:
        data: The container.
        what: The data's name in messages.
    """

    def __init__(self, data: Any, what: str = "training") -> None:
        self.data = data
        self.what = what
        self._known: Optional["DataAdapter"] = None

    @classmethod
    def can_handle(cls, data: Any) -> bool:
        """Whether this adapter takes ``data``."""
        raise NotImplementedError(f"{cls.__name__} must implement the classmethod can_handle(cls, data)")

    def convert(self) -> Any:
        """``self.data`` as a Spark DataFrame, an RDD of ``(x, y)`` pairs or ``(x, y[, w])`` numpy arrays."""
        raise NotImplementedError(f"{type(self).__name__} must implement convert(self)")

    def known(self) -> "DataAdapter":
        """The built-in adapter of :meth:`convert`'s result (the data in a form the library knows), converting once.

        Raises:
            DataError: the conversion gave a container no built-in adapter takes.
        """
        if self._known is None:
            converted = self.convert()
            adapter = find_data_adapter(converted, self.what, built_in=True)
            if adapter is None:
                raise DataError(
                    f"The data adapter {type(self).__name__} converted the {self.what} data "
                    f"({type(self.data).__name__}) to {type(converted).__name__}; it must convert to a Spark "
                    "DataFrame, an RDD of (x, y) pairs or a tuple (x, y) (or (x, y, sample_weight)) of numpy arrays."
                )
            self._known = adapter.known()
        return self._known

    def key(self, settings: tuple) -> Optional[tuple]:
        """The key under which the data's staged files are reused (with ``settings``), or ``None``: never reused."""
        return None  # a converted container is new at each call

    def dataframe(self):
        """The data as a Spark DataFrame, if it is one (what ``predict`` takes); else ``None``."""
        return self.known().dataframe()


#: The adapters, asked the latest registered first: users' (:func:`register_data_adapter`), then the built-in
#: ones (which take disjoint containers); named by module and qualified name.
ADAPTERS = Registry("data", "data adapter", names_of=lambda cls: (f"{cls.__module__}.{cls.__qualname__}",),
                    pattern=None, latest_first=True)


class _BuiltIn(DataAdapter):
    """A container the library knows: answers the driver's questions itself.

    Besides :meth:`key` and :meth:`dataframe`: ``engine()`` (the ``Engine`` of the session that runs the data's
    jobs), ``has_column(name)``, ``stage(directory, request)`` (writes the examples into ``directory``, which
    exists, and describes them), ``count()`` (one Spark job for a DataFrame or an RDD) and ``head(n)`` (the
    first ``n`` examples, a container of the same kind).
    """

    def convert(self) -> Any:
        return self.data

    def known(self) -> "DataAdapter":
        return self

    def has_column(self, name: str) -> bool:
        return False

    def dataframe(self):
        return None


@ADAPTERS.register
class DataFrameAdapter(_BuiltIn):
    """A Spark DataFrame, classic or Spark Connect: staged by one Spark job (:mod:`.frames`)."""

    @classmethod
    def can_handle(cls, data: Any) -> bool:
        from pyspark.sql import DataFrame

        return isinstance(data, DataFrame)  # Connect's DataFrame subclasses it too

    def engine(self) -> Engine:
        return Engine(self.data.sparkSession)

    def has_column(self, name: str) -> bool:
        return name in self.data.columns

    def key(self, settings: tuple) -> Optional[tuple]:
        return (id(self.data), *settings)  # immutable: its identity suffices while the caller holds it

    def stage(self, directory: str, request: StageRequest) -> StagedDataset:
        r = request
        return frames.stage_dataframe(self.data, r.features_col, r.label_col, directory, r.x_fields, r.num_outputs,
                                      r.label_float, r.what, r.checks, r.sample_weight_col, r.preprocess)

    def count(self) -> int:
        return int(self.data.count())

    def head(self, n: int) -> Any:
        return self.data.limit(n)

    def dataframe(self):
        return self.data


@ADAPTERS.register
class RDDAdapter(_BuiltIn):
    """An RDD of ``(x, y)`` pairs, on a classic session: staged by one Spark job (:mod:`.arrays`)."""

    @classmethod
    def can_handle(cls, data: Any) -> bool:
        from pyspark import RDD

        return isinstance(data, RDD)

    def engine(self) -> Engine:
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None and is_connect(active):
            raise DataError(
                "The data must be a Spark DataFrame or a tuple (x, y) of numpy arrays under Spark Connect, "
                "which has no RDDs (spark.createDataFrame(...) with 'features' and 'label' columns). "
                "Got an RDD instead."
            )
        return Engine(SparkSession(self.data.context) if active is None else active)

    def key(self, settings: tuple) -> Optional[tuple]:
        return (id(self.data), *settings)

    def stage(self, directory: str, request: StageRequest) -> StagedDataset:
        r = request
        return arrays.stage_rdd(self.data, directory, r.x_fields, r.num_outputs, r.label_float, r.what, r.checks,
                                r.sample_weight_col, r.preprocess)

    def count(self) -> int:
        return int(self.data.count())

    def head(self, n: int) -> Any:
        return self.data.context.parallelize(self.data.take(n), max(1, self.data.getNumPartitions()))


@ADAPTERS.register
class ArrayAdapter(_BuiltIn):
    """``(x, y)`` or ``(x, y, sample_weight)`` numpy arrays (lists of arrays for several inputs or outputs).

    Staged on the driver, without a Spark job (:mod:`.arrays`); run by the active session, or inside
    ``with in_process(n):`` by its engine (:mod:`sparkdl_avg.driver.runtime.inprocess`).
    """

    @classmethod
    def can_handle(cls, data: Any) -> bool:
        return isinstance(data, (tuple, list)) and len(data) == 2 or isinstance(data, tuple) and len(data) == 3

    def engine(self) -> Engine:
        return inprocess.installed() or active_engine()  # inside ``with in_process(n):``, its engine

    def key(self, settings: tuple) -> Optional[tuple]:
        return ("arrays", arrays.digest(self.data), *settings)  # by contents: changed in place, staged again

    def stage(self, directory: str, request: StageRequest) -> StagedDataset:
        r = request
        if r.sample_weight_col is not None:
            raise ConfigurationError("The 'sample_weight_col' parameter names a DataFrame column; with numpy "
                                     "arrays pass (x, y, sample_weight) instead.")
        return arrays.stage_arrays(self.data, directory, r.x_fields, r.num_outputs, r.label_float, r.what, r.checks,
                                   r.sample_weight_col, r.preprocess)

    def count(self) -> int:
        return arrays.count(self.data)

    def head(self, n: int) -> Any:
        return arrays.head(self.data, n)


@ADAPTERS.register
class PandasAdapter(_BuiltIn):
    """A pandas DataFrame: refused, with how to convert it (``spark.createDataFrame(pdf)`` or numpy arrays)."""

    @classmethod
    def can_handle(cls, data: Any) -> bool:
        pandas = sys.modules.get("pandas")  # a pandas DataFrame means pandas is imported
        return pandas is not None and isinstance(data, pandas.DataFrame)

    def known(self) -> "DataAdapter":
        raise DataError(
            f"The {self.what} data must be a Spark DataFrame, an RDD of (x, y) pairs or a tuple (x, y) of numpy "
            "arrays. Got a pandas DataFrame instead; convert it with spark.createDataFrame(pdf), or pass "
            "(pdf[features].to_numpy(), pdf[label].to_numpy())."
        )


def register_data_adapter(adapter_cls: Type[DataAdapter]) -> Type[DataAdapter]:
    """Registers a :class:`DataAdapter` subclass, so that its container can be passed as data.

    As data to ``fit`` (and its ``validation_data``), ``evaluate``, ``predict`` and ``advise``. Adapters registered
    later are asked first, before the library's own; registering a class again (or a class defined again) moves it
    first. Returns the class, so it can be used as a class decorator.

    Raises:
        ConfigurationError: ``adapter_cls`` is not a ``DataAdapter`` subclass that implements ``can_handle`` and
            ``convert``.
    """
    user = isinstance(adapter_cls, type) and issubclass(adapter_cls, DataAdapter) and not issubclass(adapter_cls,
                                                                                                     _BuiltIn)
    if not user:
        raise ConfigurationError(f"register_data_adapter takes a subclass of sparkdl_avg.DataAdapter. Got "
                                 f"{adapter_cls!r} instead.")
    missing = [name for name in ("can_handle", "convert")
               if getattr(adapter_cls, name).__qualname__ == getattr(DataAdapter, name).__qualname__]
    if missing:
        raise ConfigurationError(f"The data adapter {adapter_cls.__name__} must implement {' and '.join(missing)} "
                                 "(see sparkdl_avg.DataAdapter).")
    # can_handle is asked of the class, before any instance exists: a plain method would get the data as ``cls``
    if not isinstance(inspect.getattr_static(adapter_cls, "can_handle"), (classmethod, staticmethod)):
        raise ConfigurationError(f"The data adapter {adapter_cls.__name__}'s can_handle must be a classmethod "
                                 "(@classmethod def can_handle(cls, data)): it is asked before any instance exists.")
    return ADAPTERS.register(adapter_cls)


def _takes(cls: Type[DataAdapter], data: Any) -> bool:
    """``cls.can_handle(data)``; a user's adapter that raises is named (it would otherwise break every call)."""
    try:
        return bool(cls.can_handle(data))
    except Exception as e:
        if issubclass(cls, _BuiltIn):
            raise
        raise ConfigurationError(
            f"The data adapter {cls.__name__}'s can_handle raised {type(e).__name__}: {e} (asked about "
            f"{type(data).__name__}). can_handle must answer False for data that is not its container, without "
            "raising; fix it, or register a corrected class.") from e


def find_data_adapter(data: Any, what: str = "training", built_in: bool = False) -> Optional[DataAdapter]:
    """The adapter that takes ``data`` (users' first, the latest registered first; or built-in only), or ``None``."""
    for cls in ADAPTERS.entries():
        if (not built_in or issubclass(cls, _BuiltIn)) and _takes(cls, data):
            return cls(data, what)
    return None


def get_data_adapter(data: Any, what: str = "training") -> DataAdapter:
    """The built-in adapter that answers the driver's questions about ``data``: a user's container converted (once).

    Raises:
        DataError: no adapter takes ``data`` (naming what data may be), nor its conversion; a pandas DataFrame.
    """
    adapter = find_data_adapter(data, what)
    if adapter is None:
        raise DataError(
            f"The {what} data must be a Spark DataFrame, an RDD of (x, y) pairs or "
            f"a tuple (x, y) (or (x, y, sample_weight)) of numpy arrays. Got {type(data).__name__} instead."
        )
    return adapter.known()


def known_data(data: Any, what: str = "training") -> Any:
    """``data`` in a form the library knows: a user's container converted (once), anything else as it is.

    The public verbs call it first, so that a container is converted once per call.

    Raises:
        DataError: as :func:`get_data_adapter`.
    """
    return get_data_adapter(data, what).data


def engine_for(data: Any, what: str = "training") -> Engine:
    """The :class:`Engine` of the session that owns ``data``, or of the active session for numpy arrays.

    Raises:
        DataError: no adapter takes ``data``; an RDD under Spark Connect (which has no RDDs); numpy arrays without an
            active session (``SessionError``).
    """
    return get_data_adapter(data, what).engine()


__all__ = ["ADAPTERS", "ArrayAdapter", "DataAdapter", "DataFrameAdapter", "PandasAdapter", "RDDAdapter",
           "StageRequest", "engine_for", "find_data_adapter", "get_data_adapter", "known_data",
           "register_data_adapter"]
