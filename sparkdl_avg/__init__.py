"""sparkdl_avg: train Keras models on Apache Spark by synchronous parameter averaging.

The public entry point is :class:`ParameterAveragingTrainer`; :func:`advise` says whether
distributing pays for a model and data; see README.md.
"""

from .advisor import Advice, advise
from .config import TrainerConfig
from .errors import ConfigurationError, DataError, WorkerError
from .rules import BlockMomentum, PlainAveraging, SlowMo, UpdateRule
from .schedules import AdaComm, AveragingSchedule, PostLocalSGD
from .session import DAEMON_MODULE, RECOMMENDED_CONF, warm_up
from .trainer import ParameterAveragingTrainer

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
]
__version__ = "0.1.0"
