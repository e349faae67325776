"""The user's preprocessing function: shipped to executors, called per minibatch, its output checked.

A preprocessing function maps a minibatch of raw columns to the model's inputs and labels, as Ray Data's
``map_batches`` and Horovod's ``transformation_fn`` do::

    def decode(batch, seeds=None, training=False):
        images = np.stack([tf.io.decode_png(b).numpy() for b in batch["content"]])
        if training:  # a random flip per example, the same wherever and however often the example is trained
            flip = np.array([np.random.default_rng(s).random() < 0.5 for s in seeds])
            images[flip] = images[flip, :, ::-1]
        return {"image": images.astype("float32") / 255.0}

``batch`` is a dict of numpy arrays, one per column the function reads
(:func:`sparkdl_avg.shared.data.columns.raw_value`: numbers, object arrays of ``bytes``/``str``, dicts for structs
such as Spark's image struct). It returns a dict of arrays with one row per example; ``features_col``, ``label_col``
and ``sample_weight_col`` then name keys of that dict, and a name the function does not return is taken from ``batch``
(a label column passes through untouched). Two optional parameters, by name: ``seeds`` (one ``int64`` per example,
derived from the fit's seed, the epoch and the example, :func:`example_seeds`: random augmentation repeats bitwise in
a retried task, a resumed fit and a re-run) and ``training`` (``True`` in ``fit``'s rounds, ``False`` in
``evaluate``, validation and ``predict``).

This module owns :class:`Preprocess` (the function pickled with cloudpickle, by value when defined in ``__main__`` as
PySpark ships a notebook's functions; by reference otherwise, so its module must be importable on the executors, like
custom layers), :func:`example_seeds`, and :meth:`Preprocess.apply`, which calls it and turns a failure into a
:class:`~sparkdl_avg.errors.DataError` naming the function, the columns and the first row that fails. What the output
must be is checked by :func:`sparkdl_avg.shared.data.staged_dataset.model_arrays`.
"""

from __future__ import annotations

import hashlib
import inspect
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from ...errors import ConfigurationError, DataError
from .example_order import _splitmix64, epoch_key

_FUNCTIONS: Dict[str, Callable] = {}  # unpickled functions of this process, by digest
_LOCK = threading.Lock()
ORIGIN_COLUMNS = ("path", "origin")
"""Columns that say where a row came from (``binaryFile``'s, the image source's): a failure names the row by them."""


def example_seeds(seed: int, epoch: int, indices: np.ndarray) -> np.ndarray:
    """One non-negative ``int64`` seed per example, from ``(seed, epoch, example index)`` alone.

    The same example in the same epoch gets the same seed whichever worker, round, task attempt or fit trains it; use
    it to key a numpy generator (``np.random.default_rng(s)``) or a stateless TensorFlow op
    (``tf.random.stateless_uniform(shape, seed=[s, 0])``).
    """
    key = np.uint64(epoch_key(seed, epoch))
    with np.errstate(over="ignore"):
        mixed = _splitmix64(np.asarray(indices, dtype=np.uint64) ^ key)
    return (mixed >> np.uint64(1)).astype(np.int64)


_DECODERS: Dict[int, Callable] = {}  # decode_images' compiled decoders of this process, by channels


def decode_images(contents, channels: int = 0) -> np.ndarray:
    """Encoded images (PNG, JPEG, GIF, BMP) as one ``uint8`` array ``(n, height, width, channels)``.

    For preprocessing functions: ``decode_images(batch["content"])`` decodes a minibatch of ``binaryFile`` bytes in one
    TensorFlow graph call (a ``tf.function`` of ``tf.map_fn`` over ``tf.io.decode_image``, traced once per process),
    faster than decoding image by image in Python, and the images stay exactly what ``tf.io.decode_image`` gives.

    Args:
        contents: The encoded images: an array or list of ``bytes``.
        channels: Channels to decode to (1 gray, 3 RGB, 4 RGBA); 0 (default) keeps each file's own, which must then be
            the same for all.

    Raises:
        DataError: the images do not all have one size (resize them in the function first), or one does not decode.
    """
    import tensorflow as tf

    decoder = _DECODERS.get(channels)
    if decoder is None:
        def decode(data):
            return tf.map_fn(lambda one: tf.io.decode_image(one, channels=channels, expand_animations=False), data,
                             fn_output_signature=tf.TensorSpec((None, None, channels or None), tf.uint8))

        decoder = _DECODERS[channels] = tf.function(decode, reduce_retracing=True)
    values = np.asarray(contents, dtype=object).reshape(-1)
    try:
        return decoder(tf.constant(values, dtype=tf.string)).numpy()
    except (tf.errors.InvalidArgumentError, ValueError) as exc:
        lines = [line.strip() for line in str(getattr(exc, "message", exc)).splitlines()]
        why = next((line for line in lines if line and not line.startswith(("Graph execution", "Detected at",
                                                                             "File ", "[[", "{{"))), lines[0])
        raise DataError(f"decode_images: {type(exc).__name__}: {why} (the images must decode and have one size; "
                        f"{len(values)} given)") from None


def _describe(fn: Callable) -> str:
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{module}.{name}" if module and module != "__main__" else name


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class _Recorder(dict):
    """The dry run's batch: a dict that records which keys the function reads."""

    def __init__(self, data: Mapping) -> None:
        super().__init__(data)
        self.read: set = set()
        self.everything = False

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        self.read.add(key)
        return super().__contains__(key)

    def _all(self):
        self.everything = True

    def keys(self):
        self._all()
        return super().keys()

    def values(self):
        self._all()
        return super().values()

    def items(self):
        self._all()
        return super().items()

    def __iter__(self):
        self._all()
        return super().__iter__()

    def copy(self):
        self._all()
        return dict(super().items())


#: The parameters a preprocessing function is given by name, besides the batch: one seed per example, and whether
#: the batch is trained on.
PASSED = ("seeds", "training")


def _signature(fn):
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _meant(name: str) -> Optional[str]:
    """The parameter we pass that ``name`` likely misspells (``sed``, ``seed``, ``random_seed``, ``is_training``), or ``None``."""
    import difflib

    lowered = name.lower()
    if lowered in PASSED:
        return None
    if "seed" in lowered:
        return "seeds"
    if "train" in lowered:
        return "training"
    close = difflib.get_close_matches(lowered, PASSED, n=1, cutoff=0.7)
    return close[0] if close else None


def _check_parameters(fn, parameters, others, param: str, usage: str) -> None:
    """Refuses parameters after the batch that would never be given: required ones, and misspellings of :data:`PASSED`.

    A misspelt ``seeds`` (``seed``, ``sed``, ``random_seed``) keeps its default in every call, so "repeatable"
    augmentation silently is not.
    """
    for p in parameters.values():
        if p.name in PASSED or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        meant = _meant(p.name)
        if meant is not None and (p in others or p.kind is p.KEYWORD_ONLY):
            raise ConfigurationError(
                f"The '{param}' function {_describe(fn)!r} has a parameter {p.name!r}, which is never given: the "
                f"library passes {meant!r} by name ({usage}). Rename {p.name!r} to {meant!r}"
                f"{' (one int64 seed per example)' if meant == 'seeds' else ' (True only in fit rounds)'}, or give "
                "it a name unlike it if it is something else.")
        if p.default is p.empty and (p in others or p.kind is p.KEYWORD_ONLY):
            raise ConfigurationError(
                f"The '{param}' function {_describe(fn)!r} requires the argument {p.name!r}, which is never given: "
                f"it is called with the batch and, by name, {' and '.join(map(repr, PASSED))} ({usage}). Give "
                f"{p.name!r} a default, or bind it first (functools.partial).")


@dataclass(frozen=True)
class Preprocess:
    """A preprocessing function, ready to travel to executors.

    Attributes:
        name: ``module.qualname`` of the function, for messages.
        payload: The function pickled with cloudpickle.
        digest: SHA-256 of ``payload`` (staged data and cached functions are keyed by it).
        takes_seeds: Whether it accepts ``seeds``.
        takes_training: Whether it accepts ``training``.
        columns: The raw columns it reads, found by its dry run on the driver
            (:func:`sparkdl_avg.driver.data.staging.dry_run`); staged with the data.
    """

    name: str
    payload: bytes = field(repr=False)
    digest: str
    takes_seeds: bool
    takes_training: bool
    columns: Tuple[str, ...] = ()

    @classmethod
    def of(cls, fn: Any, param: str = "preprocess") -> Optional["Preprocess"]:
        """Wraps a function (or returns a :class:`Preprocess` as is, ``None`` for ``None``).

        Raises:
            ConfigurationError: ``fn`` is not callable, takes no batch, or cannot be pickled.
        """
        if fn is None or isinstance(fn, Preprocess):
            return fn
        if not callable(fn):
            raise ConfigurationError(f"The '{param}' parameter must be a function of a batch (a dict of numpy "
                                     f"arrays) or None. Got {fn!r} instead.")
        try:
            parameters = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            parameters = {}
        kinds = {p.kind for p in parameters.values()}
        var_kw = inspect.Parameter.VAR_KEYWORD in kinds
        positional = [p for p in parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in PASSED]
        usage = f"def {getattr(fn, '__name__', 'fn')}(batch, seeds=None, training=False)"
        readable = _signature(fn) is not None
        if readable and not positional and inspect.Parameter.VAR_POSITIONAL not in kinds:
            raise ConfigurationError(f"The '{param}' parameter must take the batch as its first argument "
                                     f"({usage}). Got {_describe(fn)}{inspect.signature(fn)}, which takes "
                                     f"{'no parameter' if not parameters else 'no batch'}, instead.")
        _check_parameters(fn, parameters, positional[1:], param, usage)
        from pyspark import cloudpickle

        try:
            payload = cloudpickle.dumps(fn)
        except Exception as exc:  # noqa: BLE001 - whatever cloudpickle refuses
            raise ConfigurationError(
                f"The '{param}' parameter must be a function executors can receive; {_describe(fn)} cannot be "
                f"pickled: {_one_line(exc)}. Define it at the top level of a module or of the notebook."
            ) from None
        return cls(
            name=_describe(fn),
            payload=payload,
            digest=hashlib.sha256(payload).hexdigest(),
            takes_seeds=var_kw or "seeds" in parameters,
            takes_training=var_kw or "training" in parameters,
        )

    def with_columns(self, columns) -> "Preprocess":
        return replace(self, columns=tuple(columns))

    def function(self) -> Callable:
        """The function, unpickled once per process.

        Raises:
            ConfigurationError: it cannot be unpickled here, most often because its module is not importable on the
                executors.
        """
        with _LOCK:
            fn = _FUNCTIONS.get(self.digest)
            if fn is None:
                import pickle

                try:
                    fn = _FUNCTIONS[self.digest] = pickle.loads(self.payload)
                except Exception as exc:  # noqa: BLE001 - ModuleNotFoundError above all
                    raise ConfigurationError(
                        f"The preprocessing function {self.name!r} cannot be loaded on this executor: "
                        f"{_one_line(exc)}. Ship its module to the executors (--py-files, "
                        "spark.sparkContext.addPyFile, or spark.addArtifacts(..., pyfile=True) under Spark "
                        "Connect), or define the function in the notebook or the job script itself."
                    ) from None
            return fn

    def call(self, batch: Mapping, seeds: Optional[np.ndarray], training: bool):
        """Calls the function with the keyword arguments it takes."""
        kwargs = {}
        if self.takes_seeds:
            kwargs["seeds"] = seeds
        if self.takes_training:
            kwargs["training"] = training
        return self.function()(batch, **kwargs)

    def apply(self, batch: Dict[str, Any], seeds: Optional[np.ndarray], training: bool, what: str,
              first: int = 0, row_ids: Optional[np.ndarray] = None) -> Mapping:
        """The function's output on ``batch``; a failure becomes a ``DataError`` naming the row that fails.

        Args:
            batch: The raw columns of the minibatch.
            seeds: One seed per example (:func:`example_seeds`), or ``None``.
            training: Whether the batch is trained on.
            what: The data, for the message ("training data").
            first: The index of the batch's first example, for the message.
            row_ids: The examples' indices in the staged data (messages name the row by it); default ``first, ...``.

        Raises:
            DataError: the function raised, or returned something that is not a dict.
        """
        self.function()  # a function that cannot be loaded is not the rows' fault
        try:
            out = self.call(batch, seeds, training)
        except Exception as exc:  # noqa: BLE001 - the user's code: name it, the row and the cause
            raise self._failure(batch, seeds, training, what, first, row_ids, exc) from exc
        if not isinstance(out, Mapping):
            raise DataError(f"The preprocessing function {self.name!r} must return a dict of arrays (model inputs "
                            f"and labels by name). Got {type(out).__name__} instead.")
        return out

    def _failure(self, batch, seeds, training, what, first, row_ids, exc) -> DataError:
        """The first row the function fails on alone (else the batch), as a ``DataError``."""
        n = _rows(batch)
        failing, cause = None, exc
        for i in range(n if n <= 4096 else 0):
            one = {k: _take(v, i) for k, v in batch.items()}
            try:
                self.call(one, None if seeds is None else seeds[i: i + 1], training)
            except Exception as row_exc:  # noqa: BLE001
                failing, cause = i, row_exc
                break
        columns = sorted(batch)
        if failing is None:
            where = f"a batch of {n} rows from row {first} of the {what}"
        else:
            where = describe_row(batch, failing, what, first, row_ids)
        return DataError(f"The preprocessing function {self.name!r} failed on {where} (columns {columns}): "
                         f"{_one_line(cause)}")

    def dry_run(self, batch: Dict[str, Any], training: bool, what: str) -> Tuple[Mapping, Tuple[str, ...]]:
        """Runs the function on a few rows on the driver; returns its output and the columns it read.

        All the batch's columns count as read when the function iterates over the batch (``batch.items()``) or
        returns the batch itself (``batch["y2"] = ...; return batch``): what it returns is staged, whether it read it
        or passed it through.
        """
        recorder = _Recorder(batch)
        seeds = example_seeds(0, 0, np.arange(_rows(batch))) if self.takes_seeds else None
        out = self.apply(recorder, seeds, training, what)  # type: ignore[arg-type]
        everything = recorder.everything or out is recorder
        read = tuple(batch) if everything else tuple(c for c in batch if c in recorder.read)
        return out, read


def describe_row(batch: Mapping, i: int, what: str, first: int = 0, row_ids: Optional[np.ndarray] = None) -> str:
    """Row ``i`` of ``batch`` for a message: "row 12 of the training data; path '.../3.png'".

    The row's number is its index in the staged data (``row_ids[i]``, else ``first + i``); where the batch holds
    :data:`ORIGIN_COLUMNS` (or an image struct's ``origin``) the row's origin is named too.
    """
    row = int(row_ids[i]) if row_ids is not None else first + i
    origin = next((f"; {c} {_take(batch[c], i)[0]!r}" for c in ORIGIN_COLUMNS
                   if c in batch and not isinstance(batch[c], dict)), "")
    if not origin and any(isinstance(v, dict) and "origin" in v for v in batch.values()):
        image = next(v for v in batch.values() if isinstance(v, dict) and "origin" in v)
        origin = f"; origin {image['origin'][i]!r}"
    return f"row {row} of the {what}{origin}"


def _rows(batch: Mapping) -> int:
    for value in batch.values():
        return _rows(value) if isinstance(value, Mapping) else len(value)
    return 0


def _take(value, i: int):
    if isinstance(value, Mapping):
        return {k: _take(v, i) for k, v in value.items()}
    return value[i: i + 1]
