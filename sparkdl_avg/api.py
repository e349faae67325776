"""The public names of sparkdl_avg (``sparkdl_avg.<name>``), gathered from the modules that own them.

The package's ``__init__`` re-exports them in the user's process. On the
executors, whose tasks import only :mod:`sparkdl_avg.executor` and
:mod:`sparkdl_avg.shared`, it loads this module (the driver's API, PySpark ML,
pandas) only if something asks for one of these names, which shortens each
Python worker's start (docs/benchmarks/first_fit.md).
"""

from .driver.api.advisor import Advice, advise
from .driver.config.trainer_config import TrainerConfig
from .driver.api.ml import KerasAveragingEstimator, KerasAveragingModel
from .driver.algorithms.rules import BlockMomentum, DiLoCo, PlainAveraging, RuleParam, SlowMo, UpdateRule
from .driver.algorithms.outer import OuterOptimizer
from .driver.algorithms.schedules import AdaComm, AveragingSchedule, PostLocalSGD
from .driver.runtime.session import DAEMON_MODULE, RECOMMENDED_CONF, warm_up
from .driver.runtime.inprocess import in_process
from .driver.observe.tracking import MlflowLogger
from .driver.api.trainer import FitInfo, ParameterAveragingTrainer
from .driver.data.adapters import DataAdapter, register_data_adapter
from .errors import (
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
from .shared.data.preprocess import decode_images, example_seeds
from .shared.wire.stats import RoundRecord, TrainingStats, WorkerRecord
from .version import __version__


__all__ = [
    # training
    "ParameterAveragingTrainer", "TrainerConfig", "FitInfo",
    "UpdateRule", "RuleParam", "PlainAveraging", "BlockMomentum", "SlowMo", "DiLoCo", "OuterOptimizer",
    "AveragingSchedule", "PostLocalSGD", "AdaComm",
    # the session
    "warm_up", "DAEMON_MODULE", "RECOMMENDED_CONF",
    # a fit's rounds without Spark, to test a rule, a callback or a preprocessing function of one's own
    "in_process",
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
