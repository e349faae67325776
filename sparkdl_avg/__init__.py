"""sparkdl_avg: train Keras models on Apache Spark by synchronous parameter averaging.

The public entry point is :class:`ParameterAveragingTrainer`; :func:`advise` says whether
distributing pays for a model and data; see README.md.
"""

import os as _os
import re as _re
import warnings as _warnings

from . import quiet as _quiet
from .session import RECOMMENDED_CONF as _RECOMMENDED_CONF

# Imported here, before the user's `import keras` where sparkdl_avg comes first (as in README), so that
# TensorFlow's start-up notices (printed twice per import, absl's "before InitializeLog" lines) are filtered;
# on the driver its devices start here too (the cuInit notice). Not on executors (PySpark's workers and
# daemon have PYTHON_WORKER_FACTORY_SECRET): they pin the task's GPUs before TensorFlow's devices start.
_quiet.import_tensorflow(devices="PYTHON_WORKER_FACTORY_SECRET" not in _os.environ)
# A local Spark Connect server (`builder.remote("local[N]").config(map=RECOMMENDED_CONF)`) starts with these
# static settings, then the client sets them again as session settings and the server refuses, warning
# although they took effect. Where they did not (a remote server), the first fit says so with the seconds
# it cost (trainer's cold-start note).
for _key in _RECOMMENDED_CONF:
    _warnings.filterwarnings(
        "ignore", message=rf"Failed to set {_re.escape(_key)} to Some\(.*\) due to \[CANNOT_MODIFY_CONFIG\]",
        category=UserWarning)

from .advisor import Advice, advise  # noqa: E402
from .config import TrainerConfig  # noqa: E402
from .errors import (  # noqa: E402
    CheckpointError, ConfigurationError, DataError, NotFittedError, PathError, SessionError, WorkerError,
)
from .rules import BlockMomentum, PlainAveraging, SlowMo, UpdateRule  # noqa: E402
from .schedules import AdaComm, AveragingSchedule, PostLocalSGD  # noqa: E402
from .session import DAEMON_MODULE, RECOMMENDED_CONF, warm_up  # noqa: E402
from .trainer import ParameterAveragingTrainer  # noqa: E402
from .version import __version__  # noqa: E402

__all__ = [
    "ParameterAveragingTrainer",
    "advise",
    "warm_up",
    "DAEMON_MODULE",
    "RECOMMENDED_CONF",
    "Advice",
    "TrainerConfig",
    "UpdateRule",
    "PlainAveraging",
    "BlockMomentum",
    "SlowMo",
    "AveragingSchedule",
    "PostLocalSGD",
    "AdaComm",
    "ConfigurationError",
    "DataError",
    "WorkerError",
    "PathError",
    "CheckpointError",
    "SessionError",
    "NotFittedError",
]
