"""Importing the modules that define a saved model's custom layers, before Keras loads it.

A ``.keras`` archive names, for every custom object (a layer, loss, metric
or activation registered with ``keras.saving.register_keras_serializable``),
the Python module that defines it (``"module": "mymodels"``). Keras only
finds registered classes, and registration happens when that module is
imported; Keras imports ``keras*`` modules itself but not the user's. On an
executor nothing has imported the user's module, so building a replica of a
model with custom layers fails with "Could not locate class ...". The worker
calls :func:`import_custom_modules` before it builds a replica (and the jobs
before they load a model file), which imports those modules (they must be on
the executors' path: ship them with ``--py-files`` or in an ``--archives``
environment). A module that cannot be imported is skipped; Keras then
reports the missing class as usual.

Only modules named in the archive's own config are imported, as Keras
itself does for its packages; no pickle or lambda is deserialized.
"""

from __future__ import annotations

import importlib
import io
import json
import sys
import zipfile
from typing import Any, Iterator, List, Union

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
