"""The single place where trainer options and the model are validated.

``TrainerConfig`` holds the constructor options of
:class:`~sparkdl_avg.ParameterAveragingTrainer`; the Spark ML layer builds the
same object, so every entry point gets the same checks, all of which run on
the driver before any Spark job starts.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Optional

from .errors import ConfigurationError
from .rules import UpdateRule, as_update_rule
from .schedules import AveragingSchedule, as_schedule

OPTIMIZER_STATE_POLICIES = ("average", "reset")
NONFINITE_POLICIES = ("raise", "skip")
STATE_TRANSPORTS = ("auto", "spark", "files")


def check_int(name: str, value: Any, low: int, allow_none: bool = False) -> None:
    """Raises ``ConfigurationError`` unless ``value`` is an integer ≥ ``low`` (numpy ints too)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        none = " or None" if allow_none else ""
        raise ConfigurationError(
            f"The '{name}' parameter must be an int in the range [{low}, inf){none}. "
            f"Got {value!r} instead."
        )


@dataclass(frozen=True)
class TrainerConfig:
    """Validated options of a parameter-averaging run.

    Args:
        num_workers: Replicas trained in parallel per round (one Spark task
            each). ``None`` means Spark's ``defaultParallelism``, resolved by the
            trainer when it first needs the SparkContext.
        batch_size: Examples per minibatch, per worker. Default 32.
        averaging_frequency: Minibatches each worker trains between two
            averagings (DL4J's ``averagingFrequency``; "k"). Default 8. Also
            a schedule (:mod:`sparkdl_avg.schedules`: ``PostLocalSGD``,
            ``AdaComm``) or a callable ``(epoch, round, logs) -> k``.
        aggregation_depth: Depth of Spark's ``treeAggregate`` that sums the
            replicas' results on Spark's path (``state_transport``; through
            files it is 1) and the metric sums of evaluation. Default 2.
        optimizer_state: ``"average"`` averages every optimizer variable across
            replicas each round (DL4J's ``saveUpdater``); ``"reset"`` starts
            each round from the optimizer's initial state.
        update_rule: How the averaged weights become the next global weights
            (:mod:`sparkdl_avg.rules`): ``None`` or ``"average"`` (plain
            averaging), ``"bmuf"``, ``"bmuf_nesterov"``, ``"slowmo"``, or a
            ``BlockMomentum(...)``/``SlowMo(...)`` instance.
        seed: Makes the data order repeatable. ``None`` draws one at random.
        staging_dir: Directory (local path or ``pyarrow.fs`` URI) where the
            data is written once per fit, pre-converted to Arrow. ``None``
            means a fresh directory under the system temp dir. On a
            multi-host cluster it must be a filesystem every executor reads
            (HDFS, S3, NFS).
        on_nonfinite: What a round does when a replica's loss or weights
            become NaN/Inf: ``"raise"`` (default) stops ``fit`` with a
            ``WorkerError`` naming the epoch, round and worker, leaving the
            last good weights in the model; ``"skip"`` leaves such replicas
            out of that round's average, with a warning (all of them: raise).
        check_data: Check, while staging, that features and labels are
            finite and that labels fit the loss (class indices in
            ``[0, classes)`` for a sparse categorical cross-entropy, values
            in ``[0, 1]`` for a binary one). Default True.
        state_transport: How a round's state moves: ``"spark"``: the driver
            broadcasts weights and optimizer variables, workers return
            their sums as task results through ``treeAggregate``;
            ``"files"``: both directions as files under the staging
            directory (:mod:`sparkdl_avg.exchange`; driver and executors
            must read each other's files there); ``"auto"`` (default):
            files when every executor runs on the driver's host
            (``local[N]``, ``local-cluster``) and the staging directory is
            local, else Spark.
    """

    num_workers: Optional[int] = None
    batch_size: int = 32
    averaging_frequency: Any = 8
    aggregation_depth: int = 2
    optimizer_state: str = "average"
    update_rule: Any = None
    seed: Optional[int] = None
    staging_dir: Optional[str] = None
    on_nonfinite: str = "raise"
    check_data: bool = True
    state_transport: str = "auto"

    def schedule(self) -> AveragingSchedule:
        """``averaging_frequency`` as a schedule (an int becomes a fixed period)."""
        return as_schedule(self.averaging_frequency)

    def rule(self, num_workers: int) -> UpdateRule:
        """``update_rule`` as a rule, with defaults for ``num_workers`` filled in."""
        return as_update_rule(self.update_rule).resolve(num_workers)

    def __post_init__(self) -> None:
        check_int("num_workers", self.num_workers, 1, allow_none=True)
        check_int("batch_size", self.batch_size, 1)
        as_schedule(self.averaging_frequency)
        check_int("aggregation_depth", self.aggregation_depth, 1)
        check_int("seed", self.seed, 0, allow_none=True)
        if self.optimizer_state not in OPTIMIZER_STATE_POLICIES:
            raise ConfigurationError(
                f"The 'optimizer_state' parameter must be one of "
                f"{', '.join(repr(p) for p in OPTIMIZER_STATE_POLICIES)}. "
                f"Got {self.optimizer_state!r} instead."
            )
        as_update_rule(self.update_rule)
        if self.on_nonfinite not in NONFINITE_POLICIES:
            raise ConfigurationError(
                f"The 'on_nonfinite' parameter must be one of "
                f"{', '.join(repr(p) for p in NONFINITE_POLICIES)}. Got {self.on_nonfinite!r} instead."
            )
        if self.state_transport not in STATE_TRANSPORTS:
            raise ConfigurationError(
                f"The 'state_transport' parameter must be one of "
                f"{', '.join(repr(p) for p in STATE_TRANSPORTS)}. Got {self.state_transport!r} instead."
            )
        if not isinstance(self.check_data, bool):
            raise ConfigurationError(f"The 'check_data' parameter must be a bool. Got {self.check_data!r} instead.")
        if self.staging_dir is not None and (
            not isinstance(self.staging_dir, str) or not self.staging_dir
        ):
            raise ConfigurationError(
                "The 'staging_dir' parameter must be a non-empty str (a local path or "
                f"a pyarrow.fs URI) or None. Got {self.staging_dir!r} instead."
            )


def check_checkpoint_args(checkpoint_dir: Any, checkpoint_every: Any, resume: Any) -> None:
    """Validates ``fit``'s checkpoint arguments (see ``ParameterAveragingTrainer.fit``)."""
    if checkpoint_dir is not None and (not isinstance(checkpoint_dir, str) or not checkpoint_dir):
        raise ConfigurationError(
            "The 'checkpoint_dir' parameter must be a non-empty str (a local path or a pyarrow.fs "
            f"URI) or None. Got {checkpoint_dir!r} instead."
        )
    if checkpoint_every != "epoch":
        if isinstance(checkpoint_every, str) or checkpoint_every is None:
            raise ConfigurationError(
                "The 'checkpoint_every' parameter must be 'epoch' or an int in the range [1, inf) "
                f"(rounds). Got {checkpoint_every!r} instead."
            )
        check_int("checkpoint_every", checkpoint_every, 1)
    if not isinstance(resume, (bool, str)) or resume == "":
        raise ConfigurationError(
            "The 'resume' parameter must be a bool or the path of a checkpoint. "
            f"Got {resume!r} instead."
        )
    if resume is True and checkpoint_dir is None:
        raise ConfigurationError("The 'resume' parameter is True but no 'checkpoint_dir' was given.")


def validate_model(model: Any) -> None:
    """Checks that ``model`` is a compiled Keras model with fully known input shapes.

    Raises:
        ConfigurationError: naming ``model`` and what was received.
    """
    import keras

    if not isinstance(model, keras.Model):
        raise ConfigurationError(
            f"Expected 'model' to be a compiled keras.Model. Received: model={model!r} "
            f"of type {type(model).__name__}."
        )
    if not getattr(model, "compiled", False) or model.optimizer is None:
        raise ConfigurationError(
            "Expected 'model' to be compiled. Received: an uncompiled model "
            f"{model.name!r}; call model.compile(optimizer=..., loss=...) first."
        )
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        inputs = None
    if not inputs:
        raise ConfigurationError(
            f"Expected 'model' to be built with a known input shape. Received: model "
            f"{model.name!r} has no inputs; start it with keras.Input(shape=...)."
        )
    for tensor in inputs:
        if any(d is None for d in tensor.shape[1:]):
            raise ConfigurationError(
                "Expected 'model' to have fully defined input shapes (besides the batch "
                f"dimension). Received: input shape {tuple(tensor.shape)}."
            )
