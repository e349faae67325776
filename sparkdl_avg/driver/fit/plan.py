"""What a fit settles before its first round: :class:`FitPlan`, and the arithmetic of workers and minibatches.

This module owns the plan's record and the pure decisions behind it — how many
workers a fit has (:func:`fit_workers`), how many minibatches each trains per
epoch (:func:`epoch_steps`), what a checkpoint of the fit must match
(:func:`run_settings`) and :class:`FitInfo`, what observers of a fit are told.
The trainer (:mod:`sparkdl_avg.driver.api.trainer`) checks ``fit``'s arguments,
stages the data and builds the plan; :mod:`.loop` runs it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Dict, Optional

from ...errors import ConfigurationError, DataError
from ...shared.data.example_order import steps_per_epoch
from ...shared.data.staged_dataset import StagedDataset
from ...shared.model.modelspec import ModelSpec, architecture_signature
from ..algorithms.schedules import AveragingSchedule
from ..config.options import TRAINER, of

logger = logging.getLogger("sparkdl_avg")


@dataclass
class FitPlan:
    """What ``fit`` settled before its first round (``ParameterAveragingTrainer._plan``).

    ``fit``'s arguments, checked, and what they resolved to: the engine, the
    workers, the staged data, the schedule and update rule, and the
    checkpoint this fit continues (already restored into the model).
    """

    epochs: int
    initial_epoch: int
    features_col: Any
    label_col: Any
    verbose: Any
    shuffle: bool
    checkpoint_dir: Optional[str]
    checkpoint_every: Any
    engine: Any
    num_workers: int
    spec: ModelSpec
    train: StagedDataset
    val: Optional[StagedDataset]
    staging_s: float
    epoch_steps: int
    schedule: AveragingSchedule
    rule: Any
    run_settings: Dict[str, Any]
    resumed_from: Optional[str] = None  # the checkpoint's URI
    restored: Any = None  # the checkpoint (sparkdl_avg.driver.checkpoint.files.Checkpoint) this fit continues

    @property
    def start_epoch(self) -> int:
        """The first epoch this fit trains: the checkpoint's, else ``initial_epoch``."""
        return self.restored.epoch if self.restored is not None else self.initial_epoch


@dataclass
class FitInfo:
    """What a fit tells the callbacks that ask for it: trackers such as :class:`~sparkdl_avg.driver.observe.tracking.MlflowLogger`.

    A callback with an ``on_fit_begin(fit)`` method gets it called with this
    before ``on_train_begin``, and ``on_fit_end(fit, error)`` once the fit is
    over, also when it fails (``error``: the exception, which then
    propagates; ``None`` on success, when ``trainer.history`` is set).

    Attributes:
        trainer: The trainer: its ``model``, ``stats`` (this fit's rounds so
            far) and ``write_report``.
        params: The fit's settings, flat and JSON-able: the trainer's options
            (the update rule and schedule as their descriptions), ``fit``'s,
            and what the fit resolved (workers, examples, the transport, the
            master, the versions).
        epochs: ``fit``'s ``epochs`` (the epoch to stop before).
        start_epoch: The first epoch this fit trains: ``initial_epoch``, or the checkpoint's.
        resumed_from: The checkpoint this fit continues, or ``None``.
        tracking: JSON-able state saved in every checkpoint of the fit and
            restored from it on resume; trackers keep what they need to
            continue there (MLflow's run id).
    """

    trainer: Any
    params: Dict[str, Any]
    epochs: int
    start_epoch: int
    resumed_from: Optional[str]
    tracking: Dict[str, Any]


def fit_workers(config, engine) -> int:
    """The fit's workers: the option, or the task slots; warns when there are more than the slots.

    Elastic rounds: the most workers a round may have (``max_workers``, else
    ``num_workers``, else the task slots now), which the update rule's
    defaults are resolved for; each round plans its own (:mod:`sparkdl_avg.driver.elastic.membership`).
    """
    if config.elastic:
        return config.max_workers or config.num_workers or engine.default_parallelism
    num_workers = config.num_workers or engine.default_parallelism
    if num_workers > engine.default_parallelism:
        logger.warning(
            "num_workers=%d but the cluster has %d task slots (spark.default.parallelism): only %d workers "
            "run at once, so each round takes about %.1fx as long.",
            num_workers, engine.default_parallelism, engine.default_parallelism,
            num_workers / engine.default_parallelism,
        )
    return num_workers


def epoch_steps(config, train: StagedDataset, num_workers: int) -> int:
    """Minibatches each worker trains per epoch; refuses data too small for one round.

    Elastic rounds need enough data for ``min_workers`` (their rounds
    have at most as many workers as the data has minibatches).
    """
    if config.elastic:
        num_workers = min(num_workers, max(config.min_workers or 1, train.num_examples // config.batch_size))
    steps = steps_per_epoch(train.num_examples, num_workers, config.batch_size)
    if not steps:
        workers = "min_workers" if config.elastic else "num_workers"
        raise DataError(
            f"The training data has {train.num_examples} examples; one round needs at "
            f"least {workers} * batch_size = {num_workers} * {config.batch_size} = "
            f"{num_workers * config.batch_size}. Lower '{workers}' or 'batch_size'."
        )
    return steps


def run_settings(config, model, train: StagedDataset, num_workers: int, rule, schedule,
                 shuffle: bool) -> Dict[str, Any]:
    """What a checkpoint of this fit records and a resumed fit must match (:func:`sparkdl_avg.driver.checkpoint.files.check_compatible`)."""
    return {
        "model": architecture_signature(model),
        "num_examples": train.num_examples,
        # elastic rounds: the bounds, not the workers now (a resumed fit plans for the slots it has)
        "num_workers": None if config.elastic else num_workers,
        "elastic": [config.min_workers, config.max_workers or config.num_workers] if config.elastic else None,
        "batch_size": config.batch_size,
        "optimizer_state": config.optimizer_state,
        "update_rule": rule.describe(),
        "averaging_frequency": schedule.describe(),
        "shuffle": shuffle,
        # what the examples are; absent from older checkpoints, where they were all unset
        "preprocess": train.preprocess.name if train.preprocess is not None else None,
        "sample_weight_col": next((c.source for c in train.columns if c.role == "w"), train.weight_name),
        "class_weight": [list(pair) for pair in train.class_weight] if train.class_weight else None,
        # fragment rounds' own weights and counter belong to their F (absent with F = 1, as in older checkpoints)
        **({"sync_fragments": config.sync_fragments} if config.sync_fragments > 1 else {}),
    }


def check_classes(class_weight: dict, checks) -> None:
    """Refuses ``class_weight`` keys that are not classes of the model's classification loss (they would never apply)."""
    shape = checks.label_shapes[0] if checks is not None and checks.label_shapes else None
    if shape is None or shape.kind not in ("sparse", "categorical", "binary"):
        return
    classes = 2 if shape.kind == "binary" and shape.units == 1 else shape.units
    if shape.kind == "binary" and shape.units > 1:
        return  # multi-label: Keras' class_weight does not apply per unit
    unknown = [k for k in class_weight if not 0 <= int(k) < classes]
    if unknown:
        raise ConfigurationError(
            f"The 'class_weight' parameter names class {unknown[0]!r}, which the model does not have: its loss "
            f"{shape.loss!r} takes classes 0..{classes - 1}, so that weight would never apply. Got "
            f"class_weight={class_weight!r} instead."
        )


def fit_params(config, model, plan: FitPlan, settings, transport, seed: int, preprocess) -> Dict[str, Any]:
    """:attr:`FitInfo.params`: the options, ``fit``'s, and what this fit resolved, flat and JSON-able."""
    import keras
    import pyspark

    from ...version import __version__

    def flat(value: Any) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        return json.dumps(value, sort_keys=True, default=str)

    engine = plan.engine
    params = {o.name: getattr(config, o.name) for o in of(TRAINER)}
    params.update(update_rule=plan.rule.describe(), averaging_frequency=plan.schedule.describe(), seed=seed,
                  preprocess=preprocess.name if preprocess is not None else None)
    params.update(epochs=plan.epochs, initial_epoch=plan.initial_epoch, shuffle=plan.shuffle,
                  features_col=plan.features_col, label_col=plan.label_col,
                  checkpoint_dir=plan.checkpoint_dir, checkpoint_every=plan.checkpoint_every)
    params.update(
        num_workers=settings.num_workers,
        num_examples=settings.dataset.num_examples,
        validation_examples=plan.val.num_examples if plan.val is not None else None,
        epoch_steps=settings.epoch_steps,
        transport=transport.name,
        master=engine.master,
        spark_connect=engine.connect,
        spark_version=engine.version,
        model=model.name,
        model_parameters=int(model.count_params()),
        sparkdl_avg_version=__version__,
        keras_version=keras.__version__,
        pyspark_version=pyspark.__version__,
    )
    return {k: flat(v) for k, v in params.items()}
