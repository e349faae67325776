"""sparkdl_avg: train Keras models on Apache Spark by synchronous parameter averaging.

The public API is what this module exports (``__all__``): the trainer and its
options, the Spark ML stages, the MLflow callback, the fit's records and the
error types; see README.md. The code is split by where it runs:

- :mod:`sparkdl_avg.driver`: the user's process (the trainer, a round, the transports, the Spark ML layer);
- :mod:`sparkdl_avg.executor`: the Spark tasks' bodies in the executors' Python workers;
- :mod:`sparkdl_avg.shared`: formats, records and protocols both sides import.

``sparkdl_avg.daemon``, ``sparkdl_avg.ml``, ``sparkdl_avg.tracking``,
``sparkdl_avg.cli`` and ``sparkdl_avg.testing`` are the paths users and jobs
write; they name the modules in the subpackages.

Its other modules:

* :mod:`.api`: the public names of sparkdl_avg (``sparkdl_avg.<name>``), gathered from the modules that own
  them.
* :mod:`.errors`: error types raised by sparkdl_avg: one hierarchy under :class:`SparkdlAvgError`.
* :mod:`.version`: the package's version, in a module of its own: the driver's records and the executors'
  self-description read it without importing the package root (which imports the whole public API).
"""

import re as _re
import warnings as _warnings

from .shared.model import quiet as _quiet

# Imported here, before the user's `import keras` where sparkdl_avg comes first (as in README), so that
# TensorFlow's start-up notices (printed twice per import, absl's "before InitializeLog" lines) are filtered;
# on the driver its devices start here too (the cuInit notice). Not on executors (PySpark's workers and
# daemon, quiet.on_executor()): they pin the task's GPUs before TensorFlow's devices start.
_quiet.import_tensorflow(devices=not _quiet.on_executor())

if not _quiet.on_executor():
    from .api import *  # noqa: E402,F401,F403 - the public names (sparkdl_avg.api.__all__)
    from .api import __all__  # noqa: E402
    from .driver.runtime.session import RECOMMENDED_CONF as _RECOMMENDED_CONF  # noqa: E402

    # A local Spark Connect server (`builder.remote("local[N]").config(map=RECOMMENDED_CONF)`) starts with
    # these static settings, then the client sets them again as session settings and the server refuses,
    # warning although they took effect. Where they did not (a remote server), the first fit says so with the
    # seconds it cost (trainer's cold-start note).
    for _key in _RECOMMENDED_CONF:
        _warnings.filterwarnings(
            "ignore", message=rf"Failed to set {_re.escape(_key)} to Some\(.*\) due to \[CANNOT_MODIFY_CONFIG\]",
            category=UserWarning)
else:
    # Executors' tasks import sparkdl_avg.executor and sparkdl_avg.shared only: the driver's API (with
    # PySpark ML and pandas, slow to import) loads if a public name is asked for.
    from .version import __version__  # noqa: E402,F401

    def __getattr__(name):
        """A public name asked for on an executor: the driver's API is imported then (:mod:`sparkdl_avg.api`)."""
        import importlib

        api = importlib.import_module(".api", __name__)  # not `from . import api`: that asks this hook for "api"
        if name in api.__all__:
            return getattr(api, name)
        raise AttributeError(f"module 'sparkdl_avg' has no attribute {name!r}")
