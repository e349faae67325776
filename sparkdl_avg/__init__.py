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
"""

import re as _re
import warnings as _warnings

from .driver.runtime.session import RECOMMENDED_CONF as _RECOMMENDED_CONF
from .shared.model import quiet as _quiet

# Imported here, before the user's `import keras` where sparkdl_avg comes first (as in README), so that
# TensorFlow's start-up notices (printed twice per import, absl's "before InitializeLog" lines) are filtered;
# on the driver its devices start here too (the cuInit notice). Not on executors (PySpark's workers and
# daemon, quiet.on_executor()): they pin the task's GPUs before TensorFlow's devices start.
_quiet.import_tensorflow(devices=not _quiet.on_executor())
# A local Spark Connect server (`builder.remote("local[N]").config(map=RECOMMENDED_CONF)`) starts with these
# static settings, then the client sets them again as session settings and the server refuses, warning
# although they took effect. Where they did not (a remote server), the first fit says so with the seconds
# it cost (trainer's cold-start note).
for _key in _RECOMMENDED_CONF:
    _warnings.filterwarnings(
        "ignore", message=rf"Failed to set {_re.escape(_key)} to Some\(.*\) due to \[CANNOT_MODIFY_CONFIG\]",
        category=UserWarning)

from .driver.api.advisor import Advice, advise  # noqa: E402
from .driver.config.trainer_config import TrainerConfig  # noqa: E402
from .driver.api.ml import KerasAveragingEstimator, KerasAveragingModel  # noqa: E402
from .driver.algorithms.rules import BlockMomentum, DiLoCo, PlainAveraging, RuleParam, SlowMo, UpdateRule  # noqa: E402
from .driver.algorithms.outer import OuterOptimizer  # noqa: E402
from .driver.algorithms.schedules import AdaComm, AveragingSchedule, PostLocalSGD  # noqa: E402
from .driver.runtime.session import DAEMON_MODULE, RECOMMENDED_CONF, warm_up  # noqa: E402
from .driver.observe.tracking import MlflowLogger  # noqa: E402
from .driver.api.trainer import FitInfo, ParameterAveragingTrainer  # noqa: E402
from .driver.data.adapters import DataAdapter, register_data_adapter  # noqa: E402
from .errors import (  # noqa: E402
    CheckpointError,
    ConfigurationError,
    DataError,
    ExecutorEnvironmentError,
    NotFittedError,
    PathError,
    SessionError,
    SparkdlAvgError,
    WorkerError,
)
from .shared.data.preprocess import decode_images, example_seeds  # noqa: E402
from .shared.wire.stats import RoundRecord, TrainingStats, WorkerRecord  # noqa: E402
from .version import __version__  # noqa: E402

__all__ = [
    # training
    "ParameterAveragingTrainer", "TrainerConfig", "FitInfo",
    "UpdateRule", "RuleParam", "PlainAveraging", "BlockMomentum", "SlowMo", "DiLoCo", "OuterOptimizer",
    "AveragingSchedule", "PostLocalSGD", "AdaComm",
    # the session
    "warm_up", "DAEMON_MODULE", "RECOMMENDED_CONF",
    # should it be distributed?
    "advise", "Advice",
    # data as users keep it: helpers for preprocessing functions, containers of their own
    "decode_images", "example_seeds", "DataAdapter", "register_data_adapter",
    # pipelines and tracking
    "KerasAveragingEstimator", "KerasAveragingModel", "MlflowLogger",
    # what a fit reports
    "TrainingStats", "RoundRecord", "WorkerRecord",
    # errors
    "SparkdlAvgError", "ConfigurationError", "DataError", "WorkerError", "PathError", "CheckpointError", "SessionError",
    "NotFittedError", "ExecutorEnvironmentError",
    "__version__",
]
