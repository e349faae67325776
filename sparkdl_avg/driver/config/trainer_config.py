"""Where trainer options, ``fit``'s options and the model are validated, on the driver, before any Spark job.

``TrainerConfig`` holds the constructor options of
:class:`~sparkdl_avg.ParameterAveragingTrainer`; the Spark ML layer builds the
same object, so every entry point gets the same checks. It is generated with
:func:`dataclasses.make_dataclass` from the :data:`~sparkdl_avg.driver.config.options.TRAINER`
rows of :data:`sparkdl_avg.driver.config.options.OPTIONS`, which declare its fields,
defaults, docstring and per-option checks once (a hand-written dataclass
would repeat each of them); ``__post_init__`` adds the checks that concern
several options, declared after the rows (:data:`~sparkdl_avg.driver.config.options.JOINTS`). :func:`check_fit_args` is the one check of ``fit``'s
options, :func:`validate_model` of a model. Static type checkers do not see its fields; it is still a
frozen, picklable dataclass with ``__eq__`` and ``dataclasses.fields``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Tuple

from ...errors import ConfigurationError
from ...shared.wire.delta_sums import segment_feedback, sparse_weights
from . import options
from .codegen import document, trainer_entries
from .constraints import check_joints
from ..algorithms.overlap import OneRoundLate
from ..algorithms.rules import UpdateRule, as_update_rule
from ..algorithms.schedules import AveragingSchedule, as_schedule


def _schedule(self) -> AveragingSchedule:
    """``averaging_frequency`` as a schedule (an int becomes a fixed period)."""
    return as_schedule(self.averaging_frequency)


def _rule(self, num_workers: int) -> UpdateRule:
    """``update_rule`` as a rule, with defaults for ``num_workers`` and ``update_compression`` filled in
    (:meth:`~sparkdl_avg.driver.algorithms.rules.UpdateRule.resolve`); applied one round late with
    ``overlap_rounds`` (:class:`~sparkdl_avg.driver.algorithms.overlap.OneRoundLate`)."""
    rule = as_update_rule(self.update_rule).resolve(num_workers, sparse_weights(self.update_compression))
    return OneRoundLate(rule) if self.overlap_rounds else rule


def _post_init(self) -> None:
    """Each row's check, then the checks across options (:data:`~sparkdl_avg.driver.config.options.JOINTS`), in order."""
    values = {row.name: getattr(self, row.name) for row in options.of(options.TRAINER)}
    for name, value in values.items():
        options.check(name, value)
    check_joints(options.JOINTS, values, options.DEFAULTS)


def _elastic(self) -> bool:
    """Whether rounds are elastic (``min_workers`` or ``max_workers`` given): re-planned for the live task slots."""
    return self.min_workers is not None or self.max_workers is not None


def _feedback(self) -> Tuple[bool, ...]:
    """Per compressed segment (weights, first moments, other optimizer variables), whether workers keep its residual.

    From ``error_feedback``; ``()`` without ``update_compression``; see
    :func:`~sparkdl_avg.shared.wire.delta_sums.segment_feedback`.
    """
    if self.update_compression is None:
        return ()
    return segment_feedback(self.update_compression, self.error_feedback)


_DOC = """Validated options of a parameter-averaging run (the constructor options of the trainer).

    Fields, defaults and checks come from :data:`sparkdl_avg.driver.config.options.OPTIONS`.

    Args:
    """

#: A frozen dataclass with one field per :data:`~sparkdl_avg.driver.config.options.TRAINER` row.
TrainerConfig = dataclasses.make_dataclass(
    "TrainerConfig",
    [(o.name, o.annotation, dataclasses.field(default=o.default)) for o in options.of(options.TRAINER)],
    namespace={
        "__doc__": document(_DOC, trainer_entries()),
        "schedule": _schedule,
        "rule": _rule,
        "__post_init__": _post_init,
        "feedback": property(_feedback),
        "elastic": property(_elastic),
        "__module__": __name__,  # make_dataclass's own module= needs Python 3.12
    },
    frozen=True,
)
for _name, _method in (("schedule", _schedule), ("rule", _rule), ("__post_init__", _post_init),
                      ("feedback", _feedback), ("elastic", _elastic)):
    _method.__name__, _method.__qualname__ = _name, f"TrainerConfig.{_name}"


def check_fit_args(synchronization: str = "sync", **values: Any) -> Dict[str, Any]:
    """Validates ``fit``'s options, each and together, before any Spark job; returns them, ``verbose`` resolved.

    ``values`` are :data:`~sparkdl_avg.driver.config.options.FIT` options by name
    (those given: the jobs pass the ones they have flags for);
    ``synchronization`` is the trainer's. As in ``keras.Model.fit``,
    ``epochs`` is the index of the epoch to stop before and ``initial_epoch``
    the first one trained, so a fit trains ``epochs - initial_epoch`` epochs;
    one that would train none is refused. ``verbose="auto"`` is 1 on a
    terminal, else 2.

    Raises:
        ConfigurationError: naming the option.
    """
    for name, value in values.items():
        options.check(name, value)
    epochs, initial_epoch = values.get("epochs"), values.get("initial_epoch", 0)
    if epochs is not None and initial_epoch >= epochs:
        raise ConfigurationError(
            f"The 'initial_epoch' parameter must be less than 'epochs' ({epochs}): as in keras.Model.fit, "
            f"'epochs' is the index of the epoch to stop before, so to continue a fit of {epochs} epochs by "
            f"n more pass epochs={epochs}+n, initial_epoch={epochs}. Got {initial_epoch!r} instead."
        )
    checkpoint_dir = values.get("checkpoint_dir")
    if values.get("resume") is True and checkpoint_dir is None:
        raise ConfigurationError("The 'resume' parameter is True but no 'checkpoint_dir' was given; resuming needs "
                                 "the 'checkpoint_dir' the interrupted fit wrote its checkpoints to.")
    checkpoint_every = values.get("checkpoint_every", "epoch")
    if checkpoint_dir is None and checkpoint_every != "epoch":
        raise ConfigurationError(
            "The 'checkpoint_every' parameter applies only with a 'checkpoint_dir' (where the checkpoints go; "
            "without one nothing is checkpointed): give a 'checkpoint_dir' or leave 'checkpoint_every' at 'epoch'. "
            f"Got checkpoint_every={checkpoint_every!r} without a 'checkpoint_dir' instead."
        )
    if synchronization != "sync" and checkpoint_dir is not None and checkpoint_every != "epoch":
        raise ConfigurationError(
            f"The 'checkpoint_every' parameter must be 'epoch' with synchronization={synchronization!r}: "
            "its chunks finish out of order, so only an epoch's end is a point every worker has reached. "
            f"Got {checkpoint_every!r} instead."
        )
    if values.get("verbose") == "auto":
        import sys

        values = {**values, "verbose": 1 if sys.stdout.isatty() else 2}
    return values


def check_with_model(config: Any, model: Any) -> None:
    """The checks of options against the (validated) model, before any Spark job.

    ``aggregation_shards`` cuts the state's values into slices: more slices
    than the model has parameters would leave some empty and cost a reducer
    task each per round.

    Raises:
        ConfigurationError: naming the option and the model's size.
    """
    shards, parameters = config.aggregation_shards, model.count_params()
    if shards is not None and shards > parameters:
        raise ConfigurationError(
            f"The 'aggregation_shards' parameter must be at most the model's {parameters} parameters (each slice "
            f"of the sums holds some of them; the default is one per worker). Got aggregation_shards={shards!r} "
            "instead."
        )


def check_loss(model: Any, what: str) -> None:
    """Refuses to ``what`` (``"fit"``, ``"evaluate"``) a model compiled without a loss, before any Spark job.

    Keras would fail in every worker's first minibatch ("No loss to
    compute"). A model that computes its own loss (a ``train_step`` or
    ``compute_loss`` of its own) needs none; ``predict`` needs none.

    Raises:
        ConfigurationError: naming the model.
    """
    import keras

    if (getattr(model, "loss", None) is None and type(model).train_step is keras.Model.train_step
            and type(model).compute_loss is keras.Model.compute_loss):
        raise ConfigurationError(
            f"The 'model' parameter must be compiled with a loss to {what}. Got the model {model.name!r}, "
            "compiled without one, instead; call model.compile(optimizer=..., loss=...)."
        )


def validate_model(model: Any, name: str = "model") -> None:
    """Checks that ``model`` is a compiled Keras model with fully known input shapes.

    Args:
        name: What the caller calls the model, for the messages (the
            estimator's ``"kerasModel"``). Default ``"model"``.

    Raises:
        ConfigurationError: naming ``name`` and what was received.
    """
    import keras

    if not isinstance(model, keras.Model):
        raise ConfigurationError(
            f"The '{name}' parameter must be a compiled keras.Model. Got {model!r} "
            f"of type {type(model).__name__} instead."
        )
    if not getattr(model, "compiled", False) or model.optimizer is None:
        raise ConfigurationError(
            f"The '{name}' parameter must be a compiled keras.Model. Got the uncompiled model "
            f"{model.name!r} instead; call model.compile(optimizer=..., loss=...) first."
        )
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        inputs = None
    if not inputs:
        raise ConfigurationError(
            f"The '{name}' parameter must be a model with a known input shape. Got model "
            f"{model.name!r}, which has no inputs, instead; start it with keras.Input(shape=...)."
        )
    for tensor in inputs:
        if any(d is None for d in tensor.shape[1:]):
            raise ConfigurationError(
                f"The '{name}' parameter must be a model with fully defined input shapes (besides "
                f"the batch dimension). Got input shape {tuple(tensor.shape)} instead."
            )
