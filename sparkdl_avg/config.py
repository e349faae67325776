"""The single place where trainer options and the model are validated.

``TrainerConfig`` holds the constructor options of
:class:`~sparkdl_avg.ParameterAveragingTrainer`; the Spark ML layer builds the
same object, so every entry point gets the same checks, all of which run on
the driver before any Spark job starts.

``TrainerConfig`` is generated with :func:`dataclasses.make_dataclass` from
the :data:`~sparkdl_avg.options.TRAINER` rows of
:data:`sparkdl_avg.options.OPTIONS`: its fields, defaults, docstring and the
checks ``__post_init__`` runs (each row's own, in table order) are declared
there once. A hand-written dataclass would repeat every name and default a
second time, which is how the entry points drifted apart; what the generated
class costs is that static type checkers do not see its fields (it is still a
frozen, picklable ``sparkdl_avg.config.TrainerConfig`` with ``__eq__`` and
``dataclasses.fields``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from . import options
from .errors import ConfigurationError
from .options import NONFINITE_POLICIES, OPTIMIZER_STATE_POLICIES, STATE_TRANSPORTS, check_int  # noqa: F401 (API)
from .rules import UpdateRule, as_update_rule
from .schedules import AveragingSchedule, as_schedule


def _schedule(self) -> AveragingSchedule:
    """``averaging_frequency`` as a schedule (an int becomes a fixed period)."""
    return as_schedule(self.averaging_frequency)


def _rule(self, num_workers: int) -> UpdateRule:
    """``update_rule`` as a rule, with defaults for ``num_workers`` filled in."""
    return as_update_rule(self.update_rule).resolve(num_workers)


def _post_init(self) -> None:
    for row in options.of(options.TRAINER):
        options.check(row.name, getattr(self, row.name))


_DOC = """Validated options of a parameter-averaging run (the constructor options of the trainer).

    Fields, defaults and checks come from :data:`sparkdl_avg.options.OPTIONS`.

    Args:
    """

#: A frozen dataclass with one field per :data:`~sparkdl_avg.options.TRAINER` row.
TrainerConfig = dataclasses.make_dataclass(
    "TrainerConfig",
    [(o.name, o.annotation, dataclasses.field(default=o.default)) for o in options.of(options.TRAINER)],
    namespace={
        "__doc__": options.document(_DOC, options.trainer_entries()),
        "schedule": _schedule,
        "rule": _rule,
        "__post_init__": _post_init,
        "__module__": __name__,  # make_dataclass's own module= needs Python 3.12
    },
    frozen=True,
)
for _name, _method in (("schedule", _schedule), ("rule", _rule), ("__post_init__", _post_init)):
    _method.__name__, _method.__qualname__ = _name, f"TrainerConfig.{_name}"


def check_checkpoint_args(checkpoint_dir: Any, checkpoint_every: Any, resume: Any) -> None:
    """Validates ``fit``'s checkpoint arguments (see ``ParameterAveragingTrainer.fit``)."""
    options.check("checkpoint_dir", checkpoint_dir)
    options.check("checkpoint_every", checkpoint_every)
    options.check("resume", resume)
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
