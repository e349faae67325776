"""A compiled Keras model described for executors, and its state as numpy arrays.

``ModelSpec`` carries the model as the bytes of a ``.keras`` archive without weights (its ``config.json``:
architecture and compile configuration; built with Keras' safe mode, no pickle; the round's state is assigned to the
replica in place, so nothing the size of the model travels with the spec or is written to a temporary file), the
custom objects executors cannot import (those defined in ``__main__``: a notebook cell, the job script), pickled by
value (see :mod:`sparkdl_avg.shared.model.custom_objects`), and a fingerprint of its architecture, compile settings
and those objects, under which executors cache the replica they build from it.

The state helpers (:func:`get_state`, :func:`state_of`, :func:`set_state`, :func:`assign_state`) move weights and
optimizer variables between a model and numpy arrays; the driver and executors both use them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from collections.abc import Sequence
from typing import List, Tuple

import numpy as np

from .custom_objects import pack_custom_objects, register_custom_objects


@dataclass(frozen=True)
class ModelSpec:
    """What an executor needs to build a replica of the user's model.

    Attributes:
        keras_bytes: The model as a ``.keras`` archive without weights (``config.json`` and ``metadata.json``,
            :func:`config_archive`): a few kB whatever the model's size.
        fingerprint: Hash of the architecture (layer names aside, see :func:`architecture`), compile config, Keras
            version and ``custom_objects``.
        optimizer_shapes: Shapes of the optimizer's variables, in order, to check that a replica's optimizer matches
            the driver's.
        floatx: The driver's ``keras.config.floatx()``; losses and metrics compute in it, so replicas use the same.
        custom_objects: The model's registered custom objects that executors cannot import (defined in ``__main__``),
            pickled by value with cloudpickle under their Keras names; ``b""`` if none.
    """

    keras_bytes: bytes
    fingerprint: str
    optimizer_shapes: Tuple[Tuple[int, ...], ...]
    floatx: str = "float32"
    custom_objects: bytes = b""

    @classmethod
    def from_model(cls, model) -> "ModelSpec":
        """Describes a compiled model, building its optimizer's variables if needed.

        Raises:
            ConfigurationError: a custom object defined in ``__main__`` cannot be pickled by value (see
                :func:`~sparkdl_avg.shared.model.custom_objects.pack_custom_objects`).
        """
        import keras

        data = config_archive(model)
        shipped = pack_custom_objects(data)
        try:
            description = json.dumps(
                [architecture(model), compile_settings(model), keras.__version__, keras.config.floatx()],
                sort_keys=True,
                default=str,
            ).encode()
        except NotImplementedError:
            # Subclassed models without get_config(): fall back to the archive.
            description = data
        # A notebook cell re-run with a changed layer gives another class, another pickle: a new replica.
        description += hashlib.sha256(shipped).digest() if shipped else b""
        return cls(
            keras_bytes=data,
            fingerprint=hashlib.sha256(description).hexdigest(),
            optimizer_shapes=tuple(tuple(v.shape) for v in model.optimizer.variables),
            floatx=keras.config.floatx(),
            custom_objects=shipped,
        )

    def build(self):
        """Registers the shipped custom objects, then builds the compiled model from its config (Keras safe mode).

        Its weights and optimizer variables are freshly initialized: every task assigns the round's state first.
        """
        import keras

        keras.config.set_floatx(self.floatx)
        register_custom_objects(self.custom_objects)
        model = model_from_archive(self.keras_bytes)
        ensure_optimizer_built(model)
        shapes = tuple(tuple(v.shape) for v in model.optimizer.variables)
        if shapes != self.optimizer_shapes:
            raise RuntimeError(
                "The replica's optimizer variables do not match the driver's: expected "
                f"shapes {self.optimizer_shapes}, built {shapes}."
            )
        return model


_LOADABLE: set = set()


def check_model_loads(spec: ModelSpec) -> None:
    """Checks on the driver that executors can rebuild the model from ``spec`` (once per fingerprint).

    Raises:
        ConfigurationError: the archive does not load in Keras' safe mode, most often a custom layer, loss or metric
            that is not registered.
    """
    from ...errors import ConfigurationError

    if spec.fingerprint in _LOADABLE:
        return
    try:
        model_from_archive(spec.keras_bytes)
    except Exception as exc:  # noqa: BLE001 - any failure means executors fail the same way
        message = " ".join(str(exc).split())
        raise ConfigurationError(
            "The model cannot be rebuilt from its Keras config, as executors must. Register "
            "custom layers, losses and metrics with @keras.saving.register_keras_serializable() "
            "and give them get_config(); those defined in __main__ are shipped to the executors, "
            "ship any other module with --py-files or spark.sparkContext.addPyFile. Keras said: "
            f"{type(exc).__name__}: {message[:500]}"
        ) from None
    _LOADABLE.add(spec.fingerprint)


def input_shapes(model) -> Tuple[Tuple[int, ...], ...]:
    """The shape of one example of each model input, in the order of ``model.inputs``."""
    return tuple(tuple(int(d) for d in t.shape[1:]) for t in model.inputs)


def inputs_dtype(model) -> str:
    """The dtype of float labels: ``float64`` if every input is float64, else ``float32``."""
    dtypes = {str(t.dtype) for t in model.inputs}
    return "float64" if dtypes == {"float64"} else "float32"


def input_dtypes(model) -> Tuple[str, ...]:
    """Each model input's dtype, in the order of ``model.inputs`` (``"string"`` for a string input).

    Features are staged in these, so an ``int64`` input gets its ids exactly.
    """
    return tuple(str(getattr(t.dtype, "name", t.dtype)) for t in model.inputs)


def keras_to_bytes(model) -> bytes:
    """The model as the bytes of a ``.keras`` archive (architecture, compile config, weights).

    The optimizer's variables are built first, so the archive loads without Keras' warning about a saved optimizer
    with fewer variables.
    """
    if getattr(model, "optimizer", None) is not None:
        ensure_optimizer_built(model)
    with tempfile.TemporaryDirectory(prefix="sparkdl_avg-model-") as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def config_archive(model) -> bytes:
    """The model as a ``.keras`` archive without weights: its ``config.json`` (as ``model.save`` writes it) and ``metadata.json``.

    Built in memory (no temporary file); :func:`model_from_archive` builds the compiled model back. ``metadata.json``
    holds no date, so the same model gives the same bytes (a subclassed model's fingerprint is them).
    """
    import io
    import zipfile

    import keras

    if any(hasattr(layer, "save_assets") for layer in model._flatten_layers()):
        # A layer whose state is an asset (TextVectorization's vocabulary, a lookup table) is not rebuilt by its
        # config nor set by the round's state: such a model travels whole, as a full archive.
        return keras_to_bytes(model)
    if getattr(model, "optimizer", None) is not None:
        ensure_optimizer_built(model)
    with _object_sharing():
        config = keras.saving.serialize_keras_object(model)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("metadata.json", json.dumps({"keras_version": keras.__version__}))
        zf.writestr("config.json", json.dumps(config))
    return out.getvalue()


#: What every initializer of a rebuilt model becomes (:func:`model_from_archive`): a zero-filled variable takes its
#: size, where a random initializer's temporaries stayed with the process, 3x the table's size for an Embedding.
_ZEROS = {"module": "keras.initializers", "class_name": "Zeros", "config": {}, "registered_name": None}


def _zero_initializers(config):
    """``config`` (a serialized model) with every layer's ``*_initializer`` replaced by zeros."""
    if isinstance(config, dict):
        return {key: dict(_ZEROS, config={}) if key.endswith("_initializer") and isinstance(value, (dict, str))
                else _zero_initializers(value) for key, value in config.items()}
    if isinstance(config, list):
        return [_zero_initializers(value) for value in config]
    return config


def model_from_archive(data: bytes):
    """Builds the compiled model of a ``.keras`` archive's ``config.json``, in Keras' safe mode (no pickle), without its weights.

    What ``keras.saving.load_model`` does before it loads the weights, with every initializer zeros: whoever builds it
    assigns the state it trains from (a replica, each task) or discards it (the driver's check that it loads). A
    random initializer's temporaries stay with the process: a worker built ``Embedding(2**22, 8)`` at 400 MB resident
    for its 128 MB table, 132 MB with zeros. A full archive (weights, assets: what :func:`config_archive` gives for a
    model with assets) is loaded whole.
    """
    import io
    import zipfile

    import keras

    from .custom_objects import archive_config

    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        whole = any(name not in ("config.json", "metadata.json") for name in zf.namelist())
    if whole:
        return keras_from_bytes(data)
    with _object_sharing():
        return keras.saving.deserialize_keras_object(_zero_initializers(archive_config(data)), safe_mode=True)


def _object_sharing():
    """Keras' scope that (de)serializes an object shared by several layers once, as ``model.save`` does."""
    try:
        from keras.src.saving.serialization_lib import ObjectSharingScope
    except ImportError:  # private in Keras; without it a shared object is duplicated, as before Keras 3.1
        return contextlib.nullcontext()
    return ObjectSharingScope()


def keras_from_bytes(data: bytes):
    """Loads a compiled model from ``.keras`` archive bytes, in Keras' safe mode (no pickle)."""
    import keras

    with tempfile.TemporaryDirectory(prefix="sparkdl_avg-model-") as tmp:
        path = os.path.join(tmp, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        return keras.saving.load_model(path, compile=True, safe_mode=True)


def architecture(model) -> dict:
    """``model.get_config()`` with its layer and model names replaced by their order of appearance.

    Keras names layers by a process-wide counter (``dense``, ``dense_1``, ...), so each run of a notebook cell that
    builds "the same" model would give another config, another fingerprint, and one more replica per fit on the
    executors. Weights move by position, so a replica of the same layers under other names trains the same. The names
    of a multi-output model's outputs stay: its metric names carry them.
    """
    keep = {layer.name for layer in _output_layers(model)} if len(model.outputs) > 1 else set()
    names: dict = {}

    def collect(config: dict) -> None:
        names.setdefault(config.get("name"), f"#{len(names)}")
        for layer in config.get("layers") or []:
            if isinstance(layer, dict) and isinstance(layer.get("config"), dict):
                collect(layer["config"])  # a nested model's layers too

    def new(name):
        return names.get(name, name) if isinstance(name, str) and name not in keep else name

    def refs(node):  # [name, node_index, tensor_index] references, possibly nested in lists
        if isinstance(node, (list, tuple)):
            return [new(node[0]), *node[1:]] if node and isinstance(node[0], str) else [refs(n) for n in node]
        return node

    def rename(node, parent_key=None):
        if isinstance(node, (list, tuple)):
            return [rename(value, parent_key) for value in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            if key == "name" and parent_key in ("layers", "config", None):
                out[key] = new(value)
            elif key in ("keras_history", "input_layers", "output_layers"):
                out[key] = refs(value)
            else:
                out[key] = rename(value, key)
        return out

    config = model.get_config()
    collect(config)
    return rename(config)


def compile_settings(model) -> dict:
    """``model.get_compile_config()`` without the optimizer's name (``adam``, ``adam_1``, ...: another counter)."""
    config = model.get_compile_config() or {}
    optimizer = config.get("optimizer")
    if isinstance(optimizer, dict) and isinstance(optimizer.get("config"), dict):
        config = {**config, "optimizer": {**optimizer, "config": {**optimizer["config"], "name": None}}}
    return config


def _output_layers(model) -> list:
    try:
        return [tensor._keras_history[0] for tensor in model.outputs]
    except (AttributeError, TypeError):
        return []


def ensure_optimizer_built(model) -> None:
    """Creates the optimizer's variables (slots, iteration counter) if not yet done."""
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)


def iterations_index(model) -> int:
    """Position of the optimizer's iteration counter in ``optimizer.variables``."""
    for i, v in enumerate(model.optimizer.variables):
        if v is model.optimizer.iterations:
            return i
    raise RuntimeError("The optimizer has no iteration counter among its variables.")


def architecture_signature(model) -> str:
    """What a checkpoint must match to be resumed into ``model``, independent of layer names.

    The layers' classes and weight shapes, the optimizer's class and variable shapes, and the loss: auto-generated
    names (``dense_3``) differ between two builds of the same model, so :attr:`ModelSpec.fingerprint` would not do.
    """
    layers = [(type(layer).__name__, [tuple(w.shape) for w in layer.weights]) for layer in model.layers]
    optimizer = (type(model.optimizer).__name__, [tuple(v.shape) for v in model.optimizer.variables])
    import keras

    loss = keras.tree.map_structure(
        lambda leaf: leaf
        if isinstance(leaf, str) or leaf is None
        else getattr(leaf, "name", None) or getattr(leaf, "__name__", None) or type(leaf).__name__,
        model.loss,
    )
    description = json.dumps([layers, optimizer, loss], default=str)
    return hashlib.sha256(description.encode()).hexdigest()[:16]


def trainable_mask(model) -> List[bool]:
    """Per entry of ``model.get_weights()``: whether it is a trainable weight."""
    trainable = {id(v) for v in model.trainable_weights}
    return [id(v) in trainable for v in model.weights]


def current_learning_rate(model) -> float:
    """The optimizer's learning rate at its current iteration (schedules evaluated)."""
    import keras

    return float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))


def get_state(model) -> Tuple[List[np.ndarray], List[np.ndarray]]:
    """Returns ``(weights, optimizer_variables)`` of ``model`` as numpy arrays."""
    return model.get_weights(), [np.asarray(v.numpy()) for v in model.optimizer.variables]


class VariableArrays(Sequence):
    """Variables read as numpy arrays on access, one at a time: a model's state without a copy of the whole.

    Each item is a fresh array, what :func:`get_state` gives for it; the sequence itself holds none. The driver
    publishes a round's state from it (written array by array, :func:`~sparkdl_avg.shared.wire.exchange.store`) and
    reads it again for the update (the model does not change during a round), and a worker writes its sums from its
    replica's, so neither holds a copy of the model's state beside the model. :meth:`specs` gives the dtypes and
    shapes without reading any.
    """

    def __init__(self, variables) -> None:
        self._variables = list(variables)

    def __len__(self) -> int:
        return len(self._variables)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return VariableArrays(self._variables[i])
        return np.asarray(self._variables[i].numpy())

    def __iter__(self):
        # Not Sequence.__iter__: its generator keeps the array it yielded last in a local until the next one is read,
        # so a loop over a model's state held two arrays where it uses one (Adam's two moments of a table: a table's
        # size more, at the driver's send and update).
        for i in range(len(self)):
            yield self[i]

    def flat(self, i: int, lo: int, hi: int) -> np.ndarray:
        """Elements ``lo:hi`` of variable ``i`` flattened in C order: a slice read without a copy of the whole.

        The same values as ``self[i].reshape(-1)[lo:hi]`` (the driver's update reads the state a round started from
        slice by slice, :func:`~sparkdl_avg.driver.fit.update.means_as`).
        """
        import keras

        variable = self._variables[i]
        flat = keras.ops.reshape(getattr(variable, "value", variable), (-1,))
        return np.asarray(keras.ops.convert_to_numpy(flat[lo:hi]))

    def rows(self, i: int, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` of variable ``i``: ``self[i][rows]`` without a copy of the whole."""
        import tensorflow as tf

        variable = self._variables[i]
        # A gather from the variable's value (a dense read: its buffer, not a copy), not from the variable itself: a
        # sparse read (ResourceGather) switches a variable to copying its whole buffer on every later read and update.
        value = tf.convert_to_tensor(getattr(variable, "value", variable))
        return np.asarray(tf.gather(value, tf.convert_to_tensor(rows, dtype=tf.int64)).numpy())

    def specs(self) -> List[Tuple[np.dtype, Tuple[int, ...]]]:
        """``(dtype, shape)`` per variable, read from the variables (an unknown dtype name: from its array)."""
        out = []
        for i, v in enumerate(self._variables):
            try:
                dtype = np.dtype(str(getattr(v, "dtype", "")))
            except TypeError:  # bfloat16 and other extension dtypes have no numpy name
                dtype = self[i].dtype
            out.append((dtype, tuple(int(d) for d in v.shape)))
        return out


def state_of(model) -> Tuple[VariableArrays, VariableArrays]:
    """``(weights, optimizer_variables)`` of ``model`` as :class:`VariableArrays`: :func:`get_state` read on access."""
    return VariableArrays(model.weights), VariableArrays(model.optimizer.variables)


@dataclass(frozen=True)
class RowUpdate:
    """New values for some rows of a variable, the others unchanged: what :func:`assign` writes for a table whose
    round moved a few rows (:class:`~sparkdl_avg.shared.wire.sparse_rows.RowSums`).

    ``rows``: sorted row indices; ``values``: their new values, in the variable's dtype (``(len(rows), ...)``).
    """

    rows: np.ndarray
    values: np.ndarray


def row_runs(rows: np.ndarray) -> List[Tuple[int, int]]:
    """``(start, stop)`` positions in ``rows`` (sorted, unique) of each run of consecutive row numbers."""
    breaks = (np.flatnonzero(np.diff(rows) != 1) + 1).tolist()
    return list(zip([0] + breaks, breaks + [len(rows)])) if len(rows) else []


def assign(variable, value) -> None:
    """``variable.assign(value)``; a :class:`RowUpdate` writes its rows alone, in place.

    Its rows go by TensorFlow's strided-slice assignment on the variable's handle, one per run of consecutive rows (not
    ``variable[a:b].assign``, which reads the variable first, nor ``scatter_update``, a sparse write that switches the
    variable to copying its whole buffer on every later read and update: the user's own training of the model after
    the fit). Where the variable has no handle, the whole array is read, its rows set and assigned.
    """
    if isinstance(value, RowUpdate):
        target = getattr(variable, "value", None)
        if getattr(target, "handle", None) is not None:
            import tensorflow as tf

            rest = list(value.values.shape[1:])
            for lo, hi in row_runs(value.rows):
                first = int(value.rows[lo])
                tf.raw_ops.ResourceStridedSliceAssign(
                    ref=target.handle, begin=[first] + [0] * len(rest), end=[first + hi - lo] + rest,
                    strides=[1] * (1 + len(rest)), value=value.values[lo:hi])
            return
        whole = np.array(variable.numpy())
        whole[value.rows] = value.values
        value = whole
    variable.assign(value)


def set_state(model, weights: List[np.ndarray], optimizer_variables: List[np.ndarray]) -> None:
    """Assigns weights and optimizer variables (as from :func:`get_state`) to ``model``, one at a time.

    A value given as ``None`` keeps the variable's (a round that does not average the optimizer's variables sets only
    its iteration counter, without a copy of the others); a :class:`RowUpdate` sets its rows alone.
    """
    for variables, values in ((model.weights, weights), (model.optimizer.variables, optimizer_variables)):
        if len(variables) != len(values):
            raise ValueError(f"The state holds {len(values)} arrays where the model has {len(variables)}.")
        for i, var in enumerate(variables):
            if values[i] is not None:
                assign(var, values[i])


# Elements of a received array copied into a replica's variable at a time (4 MiB of float32): each block's mapped
# pages are let go before the next is read.
IN_PLACE_BLOCK = 1 << 20


def _own_buffer(variable, value):
    """The variable's own buffer as a writable numpy array, or ``None`` where it cannot be written in place.

    On the CPU, reading a resource variable gives a tensor that shares the variable's buffer (TensorFlow counts the
    reference); two reads at one address show it. A variable in copy-on-read mode (after a sparse write) or on a GPU
    reads as copies, so it gets ``None``, as do a dtype or layout that ``assign`` would convert.
    """
    if not isinstance(value, np.ndarray) or not value.flags.c_contiguous:
        return None
    try:  # anything unexpected (another backend, a distributed variable): None, and ``assign`` as before
        if value.dtype != np.dtype(variable.dtype):
            return None
        target = variable.value
        if "CPU" not in str(target.device).upper():
            return None
        first, second = target.value()._numpy(), target.value()._numpy()
    except Exception:
        return None
    same = first.__array_interface__["data"][0] == second.__array_interface__["data"][0]
    if not (same and first.flags.writeable and first.flags.c_contiguous and first.shape == value.shape):
        return None
    return first


def _write(variable, value, release) -> None:
    """``variable.assign(value)`` for a replica's variable that nothing else reads, copied into its own buffer.

    Why: ``assign`` of a numpy array converts it to a tensor and gives the variable a new buffer: two transient copies
    (+256 MiB resident for a 128 MiB table), the worker's peak of the round. Written in place, a block at a time, the
    variable keeps its buffer and ``release`` lets each block of a memory-mapped ``value`` go as it is copied.
    """
    buffer = _own_buffer(variable, value)
    if buffer is None:
        variable.assign(value)
        release([value])
        return
    into, source = buffer.reshape(-1), value.reshape(-1)
    for lo in range(0, len(source), IN_PLACE_BLOCK):
        into[lo:lo + IN_PLACE_BLOCK] = source[lo:lo + IN_PLACE_BLOCK]
        release([source[lo:lo + IN_PLACE_BLOCK]])


def assign_state(model, weights, optimizer_variables) -> None:
    """:func:`set_state` of an executor's replica, one variable at a time, each written into its own buffer.

    A state read from a file is a memory map (:func:`~sparkdl_avg.shared.wire.exchange.load`); each block of an array
    leaves this process's resident memory once it is in the replica (:func:`_write`), so the worker's peak holds the
    replica and a block of the received state, not two whole states. Only for a replica: a tensor read from one of
    its variables before this call would see the new values.
    """
    from ..wire.exchange import release_pages

    for variables, values in ((model.weights, weights), (model.optimizer.variables, optimizer_variables)):
        if len(variables) != len(values):
            raise ValueError(f"The round's state holds {len(values)} arrays where the replica has {len(variables)}.")
        for var, value in zip(variables, values):
            if tuple(var.shape) != tuple(np.shape(value)):
                raise ValueError(f"The round's state has shape {np.shape(value)} for {var.path}, "
                                 f"whose shape is {tuple(var.shape)}.")
            _write(var, value, release_pages)
