"""Importing the modules that define a saved model's custom layers, before Keras loads it.

A ``.keras`` archive names, for every custom object (a layer, loss, metric or activation registered with
``keras.saving.register_keras_serializable``), the Python module that defines it (``"module": "mymodels"``). Keras
only finds registered classes, and registration happens when that module is imported; Keras imports ``keras*``
modules itself but not the user's. On an executor nothing has imported the user's module, so building a replica of a
model with custom layers fails with "Could not locate class ...". The worker calls :func:`import_custom_modules`
before it builds a replica (and the jobs before they load a model file), which imports those modules (they must be on
the executors' path: ship them with ``--py-files`` or in an ``--archives`` environment). A module that cannot be
imported is skipped; Keras then reports the missing class as usual. Only modules named in the archive's own config are
imported, as Keras itself does for its packages.

Custom objects that executors cannot import at all, those defined in ``__main__`` (a notebook cell, the job script
itself) or in a module with no file, travel by value instead, the way Spark ships a notebook's functions: on the
driver :func:`pack_custom_objects` finds the registered objects the archive's config names, and pickles those with
cloudpickle (PySpark's bundled copy); on the executor :func:`register_custom_objects` unpickles them and registers
each under its Keras name (``package>Name``) before the archive loads. That pickle comes from the driver of the same
Spark application, like every task closure. An object cloudpickle cannot pickle is refused on the driver with a
:class:`~sparkdl_avg.errors.ConfigurationError`.
"""

from __future__ import annotations

import importlib
import io
import json
import pickle
import sys
import zipfile
from typing import Any, Dict, Iterator, List, Union

_KERAS_PACKAGES = ("keras", "keras_hub", "keras_cv", "keras_nlp", "tensorflow", "tf_keras", "builtins")


def _walk(node: Any) -> Iterator[dict]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def custom_modules(config: Any) -> List[str]:
    """The non-Keras modules named by registered objects in a Keras config, in first-seen order."""
    seen: List[str] = []
    for obj in _walk(config):
        module, registered = obj.get("module"), obj.get("registered_name")
        if not isinstance(module, str) or not module or not registered or not isinstance(registered, str):
            continue
        if module.split(".", 1)[0] in _KERAS_PACKAGES:
            continue
        if module not in seen:
            seen.append(module)
    return seen


def archive_config(archive: Union[bytes, str]) -> Any:
    """The parsed ``config.json`` of a ``.keras`` archive (bytes or a path)."""
    source = io.BytesIO(archive) if isinstance(archive, (bytes, bytearray)) else archive
    with zipfile.ZipFile(source) as zf:
        return json.loads(zf.read("config.json"))


def import_custom_modules(archive: Union[bytes, str]) -> List[str]:
    """Imports the modules of the archive's custom objects; returns the ones imported now or before."""
    try:
        names = custom_modules(archive_config(archive))
    except (zipfile.BadZipFile, KeyError, ValueError, OSError):
        return []  # not a .keras archive: let Keras report it
    imported = []
    for name in names:
        if name in sys.modules:
            imported.append(name)
            continue
        try:
            importlib.import_module(name)
        except Exception:
            continue
        imported.append(name)
    return imported


def _keras_names(config: Any) -> List[str]:
    """The names Keras looks custom objects up by, for every object in a config, in first-seen order.

    A class is looked up by its ``registered_name``; a function (``"class_name": "function"``) by its ``config``,
    which holds its registered name.
    """
    seen: List[str] = []
    for obj in _walk(config):
        module = obj.get("module")
        if isinstance(module, str) and module != "builtins" and module.split(".", 1)[0] in _KERAS_PACKAGES:
            continue  # built-ins; custom functions are saved with module "builtins"
        name = obj.get("config") if obj.get("class_name") == "function" else obj.get("registered_name")
        if isinstance(name, str) and name and name not in seen:
            seen.append(name)
    return seen


def _unimportable_module(obj: Any):
    """The module of ``obj`` if executors cannot import it by name (``__main__``, no file), else ``None``.

    Returns the module's name when it is not even in ``sys.modules``.
    """
    name = getattr(obj, "__module__", None) or type(obj).__module__
    if name == "__main__":
        return name
    module = sys.modules.get(name)
    if module is None:
        return name
    return module if getattr(module, "__file__", None) is None else None


def custom_objects_by_value(config: Any) -> Dict[str, Any]:
    """The registered custom objects that ``config`` names and executors cannot import, by Keras name.

    Names are resolved like Keras does when it loads (the active ``custom_object_scope``, then the global registry);
    names that resolve to nothing are left for Keras to report.
    """
    import keras

    found = {}
    for name in _keras_names(config):
        obj = keras.saving.get_registered_object(name)
        if obj is not None and _unimportable_module(obj) is not None:
            found[name] = obj
    return dict(sorted(found.items()))


def pack_custom_objects(archive: Union[bytes, str, Any]) -> bytes:
    """Pickles by value (cloudpickle) the custom objects of a model that executors cannot import.

    Args:
        archive: A ``.keras`` archive (bytes or path) or its parsed config.

    Returns:
        The pickle of ``{keras_name: object}``, or ``b""`` when there is none.

    Raises:
        ConfigurationError: cloudpickle cannot pickle one of them (it holds a lock, a SparkSession, an open file...).
    """
    from pyspark import cloudpickle

    config = archive if isinstance(archive, (dict, list)) else archive_config(archive)
    objects = custom_objects_by_value(config)
    if not objects:
        return b""
    modules = {m for m in map(_unimportable_module, objects.values()) if not isinstance(m, str)}
    for module in modules:  # a module with no file: all of its objects by value
        cloudpickle.register_pickle_by_value(module)
    try:
        try:
            return cloudpickle.dumps(objects)
        except Exception:  # noqa: BLE001 - find the one that fails, for the message
            for name, obj in objects.items():
                try:
                    cloudpickle.dumps(obj)
                except Exception as exc:  # noqa: BLE001
                    raise _unpicklable(name, obj, exc) from None
            raise
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)


def _unpicklable(name: str, obj: Any, exc: Exception):
    from ...errors import ConfigurationError

    module = _unimportable_module(obj)
    where = module if isinstance(module, str) else module.__name__
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    return ConfigurationError(
        f"The custom object {name!r} is defined in {where}, which executors cannot import, and it "
        f"cannot be shipped to them by value (cloudpickle said {reason}). Move it into a module "
        "and ship that module to the executors: spark-submit --py-files, "
        "spark.sparkContext.addPyFile(path) or spark.addArtifacts(path, pyfile=True)."
    )


def register_custom_objects(data: bytes) -> List[str]:
    """Executor side: unpickles :func:`pack_custom_objects`' bytes and registers each object under its Keras name.

    The registration is global to the Python worker (as the driver's ``register_keras_serializable`` was), so later
    lookups by name work too. Returns the names registered.
    """
    if not data:
        return []
    import keras

    try:
        objects = pickle.loads(data)  # noqa: S301 - written by this application's driver
    except Exception as exc:  # noqa: BLE001 - say which objects, then how to fix
        raise RuntimeError(
            "The custom objects shipped by value from the driver's __main__ cannot be unpickled "
            f"on this executor ({type(exc).__name__}: {exc}). A module they use is missing here: "
            "ship it with --py-files, spark.sparkContext.addPyFile(path) or "
            "spark.addArtifacts(path, pyfile=True)."
        ) from exc
    keras.saving.get_custom_objects().update(objects)
    return list(objects)
