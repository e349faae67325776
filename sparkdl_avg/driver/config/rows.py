"""What a row of the option table declares: :class:`Option` (with its :class:`Flag` and :class:`SparkParam`) and its scope.

The rows themselves are :data:`sparkdl_avg.driver.config.options.OPTIONS`; the constraint
types of their ``check`` are in :mod:`.constraints`, what derives from them (signatures,
docstrings) in :mod:`.codegen` and the renaming of their messages in :mod:`.messages`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

from .constraints import Constraint

TRAINER = "trainer"  #: a ``ParameterAveragingTrainer``/``TrainerConfig`` option
RULE = "rule"  #: one of update_rule's numbers, given flat by the CLI and the estimator
FIT = "fit"  #: an option of ``ParameterAveragingTrainer.fit``
TRACKING = "tracking"  #: an option of :class:`sparkdl_avg.driver.observe.tracking.MlflowLogger` (MLflow tracking of a fit)


class _Same:
    def __repr__(self) -> str:
        return "SAME"


SAME = _Same()  #: "the row's default" in :class:`Flag` and :class:`SparkParam`


@dataclass(frozen=True)
class Flag:
    """How the jobs' command line (``sparkdl_avg.driver.api.cli``) spells an option.

    Attributes:
        flag: The flag; default ``--`` and the name in kebab-case.
        type: argparse ``type`` (``int``, ``float``); ``None``: a string.
        default: The flag's default; :data:`SAME`: the option's.
        action: argparse ``action`` (``"store_false"`` for ``--no-check-data``).
        dest: The ``argparse.Namespace`` attribute; default the option's name.
        choices: argparse ``choices``.
        metavar: argparse ``metavar``.
        help: The help text when the option's ``help`` does not fit the flag.
        to_option: Turns the parsed value into the option's (``--no-shuffle``).
        group: ``"training"`` (``add_trainer_args``), ``"data"`` (``add_data_args``) or
            ``"tracking"`` (``add_tracking_args``).
    """

    flag: Optional[str] = None
    type: Optional[Callable[[str], Any]] = None
    default: Any = SAME
    action: Optional[str] = None
    dest: Optional[str] = None
    choices: Optional[Tuple[Any, ...]] = None
    metavar: Optional[str] = None
    help: Optional[str] = None
    to_option: Optional[Callable[[Any], Any]] = None
    group: str = "training"


@dataclass(frozen=True)
class SparkParam:
    """The Spark ML Param of ``KerasAveragingEstimator`` that carries an option.

    Attributes:
        name: camelCase, like Spark's own Params.
        converter: The name of a ``pyspark.ml.param.TypeConverters`` function, or a
            function of the same kind (raises ``TypeError`` for a value the Param refuses).
        to_option: Turns the Param's value into the option's (``classWeight``'s text → a dict);
            ``None``: the value is the option's.
        default: The Param's default; :data:`SAME`: the option's; ``None``: unset.
        shared: Declared by a ``pyspark.ml.param.shared`` mixin the stage
            inherits (``HasSeed``'s default is a hash of the class name).
        unset: What unset means for the estimator, when not the row's ``unset``.
    """

    name: str
    converter: Any
    default: Any = SAME
    shared: bool = False
    unset: Optional[str] = None
    to_option: Optional[Callable[[Any], Any]] = None


@dataclass(frozen=True)
class Option:
    """One option, declared once.

    Attributes:
        name: snake_case: the ``TrainerConfig`` field and keyword argument.
        default: The trainer's (or ``fit``'s) default.
        annotation: The type, as written in the generated signatures.
        help: One line (flag help, Param doc): what the option is.
        doc: The Args entry of the trainer's and ``TrainerConfig``'s docstrings.
        scope: :data:`TRAINER`, :data:`RULE`, :data:`FIT` or :data:`TRACKING`.
        check: The :class:`Constraint` the value must meet, or ``None``: any value.
        unset: What ``None`` means, for help texts ("Spark's defaultParallelism").
        cli: The flag, or ``None``: no flag.
        param: The estimator's Param, or ``None``: no Param.
        aliases: Other snake_case names the trainer's messages give the
            same value (``SlowMo``'s ``slow_lr`` is ``block_lr``).
    """

    name: str
    default: Any
    annotation: str
    help: str
    doc: str = ""
    scope: str = TRAINER
    check: Optional[Constraint] = None
    unset: str = ""
    cli: Optional[Flag] = None
    param: Optional[SparkParam] = None
    aliases: Tuple[str, ...] = ()

    def flag_default(self) -> Any:
        return self.default if self.cli is None or self.cli.default is SAME else self.cli.default

    def param_default(self) -> Any:
        return self.default if self.param is None or self.param.default is SAME else self.param.default

    def param_doc(self) -> str:
        """The Param's doc: ``help``, and what unset means."""
        unset = self.unset if self.param is None or self.param.unset is None else self.param.unset
        return self.help + (f"; unset: {unset}" if self.param_default() is None and unset else "")
