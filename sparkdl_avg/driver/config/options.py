"""The one table of trainer options, :data:`OPTIONS`: every entry point derives its options from it.

Each :class:`Option` row declares an option once: its snake_case name,
default, type, documentation, check, how the jobs' command line spells it
(:class:`Flag`) and which Spark ML Param carries it (:class:`SparkParam`).
From the rows derive:

- :class:`~sparkdl_avg.driver.config.trainer_config.TrainerConfig` (the :data:`TRAINER` rows: its
  fields, defaults, docstring and the checks ``__post_init__`` runs);
- ``ParameterAveragingTrainer.__init__``'s signature, its unknown-keyword
  error and its docstring's Args (:func:`constructor`, :func:`document`);
- the jobs' flags (``sparkdl_avg.driver.api.cli.add_trainer_args``, ``add_data_args``)
  and ``cli.trainer_options``;
- ``KerasAveragingEstimator``'s Params, keyword arguments, defaults,
  setters, getters, ``_trainer_options`` and the snake_case → camelCase map
  of its error messages (``sparkdl_avg.driver.api.ml``);
- :class:`~sparkdl_avg.driver.observe.tracking.MlflowLogger`'s signature and Args (the
  :data:`TRACKING` rows but the ``mlflow`` switch), the jobs' ``--mlflow-*``
  flags and the estimator's ``mlflow*`` Params, made into one logger by
  :func:`sparkdl_avg.driver.observe.tracking.from_options`;
- the checks of README.md's configuration reference (tests/test_readme.py)
  and tests/test_options.py (every row reaches all three entry points with
  the same default and the same error).

Where an entry point gives an option another default or form, the row says
so: the CLI and the estimator name the update rule (``update_rule="average"``,
or a spec) and give its numbers flat (the :data:`RULE` rows ``block_momentum``
and ``block_lr``, whose help derives from the rules' declared parameters,
combined by :func:`from_flat`); the CLI prints one line per epoch
(``verbose=2``), the estimator is silent (``verbose=0``).

Every row's ``check`` is a :class:`Constraint`, which renders the one message
style (:func:`must_be`). The trainer's rows are checked by ``TrainerConfig``
(with the checks across options), the :data:`FIT` rows by
:func:`sparkdl_avg.driver.config.trainer_config.check_fit_args`, which ``fit`` and, before
Spark starts, the jobs (``sparkdl_avg.driver.api.cli.check_fit_flags``) call. Whatever the check, the
CLI's message names the flag (``--batch-size``, :func:`flag_names`) and the
estimator's the Param (``batchSize``) where the trainer's names the option.
Besides its row, an option's name appears only where it is used, in
messages and in other callables' own options such as ``evaluate``'s
``batch_size`` (``grep -rn "batch_size\\|batchSize\\|batch-size" sparkdl_avg/``).
"""

from __future__ import annotations

import inspect
import math
import numbers
import operator
import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from ...errors import ConfigurationError
from ..algorithms.rules import as_update_rule, flat_option, names_help
from ..algorithms.schedules import as_schedule

TRAINER = "trainer"  #: a ``ParameterAveragingTrainer``/``TrainerConfig`` option
RULE = "rule"  #: one of update_rule's numbers, given flat by the CLI and the estimator
FIT = "fit"  #: an option of ``ParameterAveragingTrainer.fit``
TRACKING = "tracking"  #: an option of :class:`sparkdl_avg.driver.observe.tracking.MlflowLogger` (MLflow tracking of a fit)

OPTIMIZER_STATE_POLICIES = ("average", "reset", "local")
NONFINITE_POLICIES = ("raise", "skip")
STATE_TRANSPORTS = ("auto", "spark", "files", "sql")
AGGREGATIONS = ("auto", "driver", "files", "shuffle", "storage")
#: The most ``aggregation_shards`` a fit takes. Each slice is a reducer task of every round: 2,000 made a
#: 14k-parameter model's rounds take 14.5 s against 1.0 s at 64 (issue 38), and 10**6 stalled the fit.
MAX_AGGREGATION_SHARDS = 1024
SYNCHRONIZATIONS = ("sync", "stale", "async")
UPDATE_COMPRESSIONS = ("bf16", "int8", "int4")  # sparkdl_avg.shared.wire.delta_sums.COMPRESSIONS (the executors' side)


class _Same:
    def __repr__(self) -> str:
        return "SAME"


SAME = _Same()  #: "the row's default" in :class:`Flag` and :class:`SparkParam`

# ------------------------------------------------------------- constraints


def must_be(name: str, what: str, value: Any) -> ConfigurationError:
    """The one message of a value an option refuses: ``The 'name' parameter must be <what>. Got <value> instead.``"""
    return ConfigurationError(f"The '{name}' parameter must be {what}. Got {value!r} instead.")


class Constraint:
    """What an option's value must be: a row's ``check``, called as ``check(name, value)``.

    A constraint says what it accepts (``str(c)``: "an int in the range [1,
    inf)") and refuses anything else with :func:`must_be`'s message, so every
    option's error reads the same; the CLI and the estimator rename the
    option in it (:func:`rename`). Subclasses define :meth:`accepts` and
    ``__str__``, or override :meth:`__call__` where a parser raises its own,
    more specific message (the update rule, the schedule, the link rate).
    """

    def accepts(self, value: Any) -> bool:
        raise NotImplementedError

    def __call__(self, name: str, value: Any) -> None:
        """Raises ``ConfigurationError`` naming ``name`` unless ``value`` is accepted."""
        if not self.accepts(value):
            raise must_be(name, str(self), value)


@dataclass(frozen=True)
class Ints(Constraint):
    """An integer in ``[low, high]`` (numpy integers too, not ``bool``), or ``None`` where ``allow_none``.

    ``high=None``: no upper bound.
    """

    low: int
    allow_none: bool = False
    high: Optional[int] = None

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.allow_none
        return (not isinstance(value, bool) and isinstance(value, numbers.Integral) and value >= self.low
                and (self.high is None or value <= self.high))

    def __str__(self) -> str:
        upper = "inf)" if self.high is None else f"{self.high}]"
        return f"an int in the range [{self.low}, {upper}" + (" or None" if self.allow_none else "")


@dataclass(frozen=True)
class Seconds(Constraint):
    """A number of seconds above 0 (an int or a float, not ``bool``, finite)."""

    def accepts(self, value: Any) -> bool:
        return (not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
                and value > 0)

    def __str__(self) -> str:
        return "a number of seconds above 0"


@dataclass(frozen=True)
class OneOf(Constraint):
    """One of ``choices``."""

    choices: Tuple[Any, ...]

    def accepts(self, value: Any) -> bool:
        return value in self.choices

    def __str__(self) -> str:
        return "one of " + ", ".join(repr(c) for c in self.choices)


@dataclass(frozen=True)
class Bool(Constraint):
    """``True`` or ``False`` (or ``None`` with ``allow_none``)."""

    allow_none: bool = False

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool) or (self.allow_none and value is None)

    def __str__(self) -> str:
        return "a bool or None" if self.allow_none else "a bool"


@dataclass(frozen=True)
class Text(Constraint):
    """A non-empty ``str`` or ``None``; ``what`` says what the string is, where it is more than text."""

    what: str = ""

    def accepts(self, value: Any) -> bool:
        return value is None or (isinstance(value, str) and value != "")

    def __str__(self) -> str:
        return f"a non-empty str{f' ({self.what})' if self.what else ''} or None"


@dataclass(frozen=True)
class RoundsOrEpoch(Constraint):
    """``"epoch"`` or a number of rounds ≥ 1."""

    def accepts(self, value: Any) -> bool:
        return value == "epoch" or Ints(1).accepts(value)

    def __str__(self) -> str:
        return "'epoch' or an int in the range [1, inf) (rounds)"


@dataclass(frozen=True)
class BoolOrPath(Constraint):
    """A bool, or the path of a checkpoint."""

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool) or (isinstance(value, str) and value != "")

    def __str__(self) -> str:
        return "a bool or the path of a checkpoint"


@dataclass(frozen=True)
class Parsed(Constraint):
    """Whatever ``parse(value)`` accepts; its ``ConfigurationError`` says what else it takes."""

    parse: Callable[[Any], Any]
    what: str

    def accepts(self, value: Any) -> bool:
        return True

    def __call__(self, name: str, value: Any) -> None:
        self.parse(value)

    def __str__(self) -> str:
        return self.what


@dataclass(frozen=True)
class Function(Constraint):
    """A function executors can receive (:meth:`sparkdl_avg.shared.data.preprocess.Preprocess.of` says why not), or ``None``."""

    def accepts(self, value: Any) -> bool:
        return True

    def __call__(self, name: str, value: Any) -> None:
        from ...shared.data.preprocess import Preprocess

        Preprocess.of(value, name)

    def __str__(self) -> str:
        return "a function of a batch (a dict of numpy arrays) or None"


@dataclass(frozen=True)
class ClassWeights(Constraint):
    """A dict of class index (int ≥ 0) → weight (a number ≥ 0), or ``None``, as Keras' ``class_weight``."""

    def accepts(self, value: Any) -> bool:
        if value is None:
            return True
        return isinstance(value, dict) and bool(value) and all(
            Ints(0).accepts(k) and isinstance(v, numbers.Real) and not isinstance(v, bool) and v >= 0
            for k, v in value.items())

    def __str__(self) -> str:
        return "a dict of class index (an int >= 0) to weight (a number >= 0), or None"


def import_function(text: str) -> Any:
    """``MODULE:FUNCTION`` (``--preprocess``) as the function; the module must be importable on the driver.

    Raises ``argparse.ArgumentTypeError``, whose message argparse prints as the flag's error.
    """
    import argparse
    import importlib

    module_name, sep, name = str(text).partition(":")
    if not sep or not module_name or not name:
        raise argparse.ArgumentTypeError(f"expected MODULE:FUNCTION, got {text!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise argparse.ArgumentTypeError(f"cannot import module {module_name!r} ({exc}); put it on the driver's path and ship it "
                         "to executors with --py-files") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise argparse.ArgumentTypeError(f"module {module_name!r} has no function {name!r}")
    return fn


def parse_class_weight(text: str) -> Dict[int, float]:
    """``--class-weight``'s ``CLASS=WEIGHT,...`` (``0=1,1=5``) as a dict."""
    weights = {}
    for part in str(text).split(","):
        key, sep, value = part.partition("=")
        try:
            weights[int(key)] = float(value)
        except ValueError:
            raise ValueError(f"expected CLASS=WEIGHT,... such as 0=1,1=5, got {text!r}") from None
        if not sep:
            raise ValueError(f"expected CLASS=WEIGHT,... such as 0=1,1=5, got {text!r}")
    return weights


def parse_rate(rate: Any) -> float:
    """Bytes per second of a link rate: a positive number (bytes/s) or a string such as ``"1gbit"``, ``"800mbit"``.

    Raises:
        ConfigurationError: anything else, naming ``network_rate``.
    """
    if isinstance(rate, numbers.Real) and not isinstance(rate, bool) and rate > 0:
        return float(rate)
    if isinstance(rate, str):
        text = rate.strip().lower()
        try:
            return parse_rate(float(text))  # a number of bytes/s, as a Spark ML Param holds it
        except ValueError:
            pass
        for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
            if text.endswith(unit):
                try:
                    value = float(text[: -len(unit)])
                except ValueError:
                    break
                if value > 0:
                    return value * scale / 8
                break
    raise must_be("network_rate", "a link rate such as '1gbit', '10gbit' or '800mbit', or a positive number of bytes "
                  "per second", rate)


def parse_optional_rate(rate: Any) -> Optional[float]:
    """:func:`parse_rate`, with ``None`` (the option's default: 1 Gbit/s) kept."""
    return None if rate is None else parse_rate(rate)


def on_off(text: str) -> bool:
    """A flag's ``on``/``off`` (also ``true``/``false``, ``1``/``0``) as a bool."""
    value = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}.get(text.strip().lower())
    if value is None:
        raise ValueError(f"expected on or off, got {text!r}")
    return value


def rounds_or_epoch(value: Any) -> Any:
    """``--checkpoint-every``'s text as the option: ``"epoch"`` stays, digits become an int (checked by the row)."""
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    return value


def require(name: str, value: Any, constraint: Constraint) -> None:
    """Checks an argument that is not an option row (``evaluate``'s ``batch_size``, ``advise``'s ``max_workers``)."""
    constraint(name, value)


# ------------------------------------------------------------------- rows


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
        converter: The name of a ``pyspark.ml.param.TypeConverters`` function.
        default: The Param's default; :data:`SAME`: the option's; ``None``: unset.
        shared: Declared by a ``pyspark.ml.param.shared`` mixin the stage
            inherits (``HasSeed``'s default is a hash of the class name).
        unset: What unset means for the estimator, when not the row's ``unset``.
    """

    name: str
    converter: str
    default: Any = SAME
    shared: bool = False
    unset: Optional[str] = None


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


OPTIONS: Tuple[Option, ...] = (
    Option(
        "num_workers", None, "Optional[int]",
        help="replicas per round, one Spark task each",
        unset="Spark's defaultParallelism",
        doc="Replicas trained in parallel per round, one Spark task each. Default ``None``: Spark's "
            "``defaultParallelism``, resolved when the trainer first needs it (under Spark Connect from the master URL or "
            "a one-off small job). More than the task slots: ``fit`` warns that only that many run at once, "
            "so the rounds take proportionally longer.",
        check=Ints(1, allow_none=True),
        cli=Flag(type=int),
        param=SparkParam("numWorkers", "toInt"),
    ),
    Option(
        "batch_size", 32, "int",
        help="examples per minibatch, per worker",
        doc="Examples per minibatch, per worker. Default 32.",
        check=Ints(1),
        cli=Flag(type=int),
        param=SparkParam("batchSize", "toInt"),
    ),
    Option(
        "averaging_frequency", 8, "Any",
        help="minibatches each worker trains between averagings",
        doc="Minibatches each worker trains between two averagings (DL4J's ``averagingFrequency``; "
            "\"k\"). Default 8. Also a schedule from :mod:`sparkdl_avg.driver.algorithms.schedules` (``PostLocalSGD``, "
            "``AdaComm``) or a callable ``(epoch, round, logs) -> k``, asked before every round.",
        check=Parsed(as_schedule, "an int in the range [1, inf) or a schedule"),
        cli=Flag(type=int),
        param=SparkParam("averagingFrequency", "toInt"),
    ),
    Option(
        "aggregation_depth", 1, "int",
        help="depth of the treeAggregate",
        doc="Depth of the ``treeAggregate`` that sums the rounds' results with ``state_transport=\"spark\"`` "
            "and evaluation's metric sums with ``\"spark\"`` and ``\"files\"`` (the ``\"sql\"`` round uses "
            "``aggregation``). Default 1: the driver merges every worker's result. Deeper levels are shuffles "
            "of pickled partials between Python workers and measured slower (docs/benchmarks.md, \"Aggregation "
            "paths\"); go deeper only where your cluster's driver merge is measured to be the bottleneck "
            "(docs/scaling.md, \"What it implies\").",
        check=Ints(1),
        cli=Flag(type=int),
        param=SparkParam("aggregationDepth", "toInt"),
    ),
    Option(
        "optimizer_state", "average", "str",
        help="'average' (average the optimizer variables), 'reset' (fresh each round) or 'local' (each worker "
             "keeps its own, as DiLoCo does; only the weights travel)",
        doc="``\"average\"`` (default) averages every optimizer variable (Adam moments, momentum) "
            "like DL4J's ``saveUpdater``; ``\"reset\"`` starts every round from the optimizer's "
            "initial state; ``\"local\"`` lets each worker keep its own optimizer variables from round to "
            "round, never sent (DiLoCo's inner optimizer state), so a round moves the weights alone: with Adam "
            "a third of ``\"average\"``'s bytes. Classic sessions keep each worker's state in a file on its host "
            "and place its next task there (a lost host's workers restart from the driver's optimizer state, "
            "counted in ``local_states_restarted``); Spark Connect keeps them under the staging directory "
            "(:mod:`sparkdl_avg.shared.wire.local_state`). The driver's optimizer then keeps its state from before the fit (a "
            "saved model holds it) but for the iteration counter; ``synchronization=\"sync\"`` only. Either way "
            "the optimizer's iteration counter follows the global step (minibatches per worker so far), so "
            "learning-rate schedules see the same step as in single-machine training.",
        check=OneOf(OPTIMIZER_STATE_POLICIES),
        cli=Flag(),
        param=SparkParam("optimizerState", "toString"),
    ),
    Option(
        "update_rule", None, "Any",
        help=f"how the average becomes the next weights: {names_help()}",
        doc="How the replicas' average becomes the next global weights (:mod:`sparkdl_avg.driver.algorithms.rules`). "
            "``None`` or ``\"average\"``: plain averaging; ``\"bmuf\"`` / ``\"bmuf_nesterov\"``: "
            "block momentum with ``η = 1 − 1/num_workers``, ``ζ = 1``; ``\"slowmo\"``: SlowMo with "
            "``β = 0.5``, ``α = 1``; ``\"diloco\"``: DiLoCo's outer Nesterov SGD with ``lr = 0.7``, "
            "``μ = 0.9``; or a ``BlockMomentum(...)`` / ``SlowMo(...)`` / ``DiLoCo(...)`` with your "
            "parameters, an ``OuterOptimizer(keras_optimizer)`` (any Keras optimizer on the outer gradient) "
            "or your own :class:`~sparkdl_avg.UpdateRule`. The rule's state (block momentum ``Δ``) carries "
            "over to the next ``fit`` of this trainer. The CLI and the estimator take the name or a spec "
            "(``\"slowmo:slow_momentum=0.7\"``, ``\"outer:sgd:lr=0.7,momentum=0.9,nesterov\"``), with "
            "``block_momentum`` and ``block_lr``.",
        check=Parsed(as_update_rule, "an update rule"),
        cli=Flag(default="average"),
        param=SparkParam("updateRule", "toString", default="average"),
    ),
    Option(
        "block_momentum", None, "Optional[float]", scope=RULE,
        **flat_option("block_momentum", "the rule's momentum"),  # help, unset, aliases: from the rules' params
        cli=Flag(type=float),
        param=SparkParam("blockMomentum", "toFloat"),
    ),
    Option(
        "block_lr", None, "Optional[float]", scope=RULE,
        **flat_option("block_lr", "the rule's learning rate"),
        cli=Flag(type=float),
        param=SparkParam("blockLearningRate", "toFloat"),
    ),
    Option(
        "seed", None, "Optional[int]",
        help="seed of the data order",
        unset="random",
        doc="Seed of the data order; ``None`` draws one.",
        check=Ints(0, allow_none=True),
        cli=Flag(type=int, help="seed of the data order (and of --model-builder, --validation-split)"),
        param=SparkParam("seed", "toInt", shared=True, unset="the stage's default seed (Spark's hash of the class name)"),
    ),
    Option(
        "staging_dir", None, "Optional[str]",
        help="where the data is staged once per fit (a local path or pyarrow.fs URI); on a multi-host "
             "cluster a filesystem every executor reads (hdfs://..., s3://...)",
        unset="the system temp dir",
        doc="Where the data is staged once per fit (a local path or a ``pyarrow.fs`` URI every "
            "executor can read: HDFS, S3, NFS on a multi-host cluster). Default: the system temp dir. "
            "On a master other than ``local[N]``/``local-cluster`` a local path is checked once with a "
            "small job (:func:`sparkdl_avg.driver.data.staging.check_shared_root`): executors that cannot see it (hosts "
            "with their own ``/tmp``) make the fit fail at once with a ``ConfigurationError`` naming "
            "``staging_dir``, before anything is staged. "
            "The trainer writes into a new subdirectory and deletes it on :meth:`close` or when the "
            "trainer is garbage-collected.",
        check=Text("a local path or a pyarrow.fs URI"),
        cli=Flag(metavar="PATH_OR_URI"),
        param=SparkParam("stagingDir", "toString"),
    ),
    Option(
        "on_nonfinite", "raise", "str",
        help="a replica with NaN/Inf loss or weights: 'raise' (stop, keep the last good weights) or "
             "'skip' (leave it out of that round's average)",
        doc="``\"raise\"`` (default): a replica whose loss or weights become NaN/Inf stops ``fit`` "
            "with a ``WorkerError`` naming the epoch, round and worker; the model keeps the last good "
            "weights. ``\"skip\"``: such replicas are left out of that round's average, with a "
            "warning (all of them: raise).",
        check=OneOf(NONFINITE_POLICIES),
        cli=Flag(),
        param=SparkParam("onNonfinite", "toString"),
    ),
    Option(
        "check_data", True, "bool",
        help="check while staging that features and labels are finite and labels fit the loss",
        doc="Check while staging that features and labels are finite and that labels fit the loss "
            "(class indices in ``[0, classes)`` for a sparse categorical cross-entropy, ``[0, 1]`` "
            "for a binary one); a ``DataError`` names the column. Default True.",
        check=Bool(),
        cli=Flag("--no-check-data", action="store_false",
                 help="skip the NaN/Inf and label-range checks made while staging"),
        param=SparkParam("checkData", "toBoolean"),
    ),
    Option(
        "state_transport", "auto", "str",
        help="how each round's weights reach workers and their sums the driver: 'sql' (a DataFrame job, "
             "state as a staging file, sums as Arrow rows; the only one under Spark Connect), 'spark' "
             "(broadcast + treeAggregate), 'files' (files under the staging dir), 'auto' (files when all "
             "executors run on the driver's host, else spark while the driver's link is cheaper than sharding, "
             "sql above)",
        doc="How a round's state moves between driver and workers (:mod:`sparkdl_avg.driver.transport.paths`). "
            "``\"sql\"``: the round is a DataFrame job (``spark.range(N).mapInArrow``), the state a file under "
            "the staging directory, the workers' sums raw bytes in Arrow rows, summed as ``aggregation`` says; "
            "the only one under Spark Connect. ``\"spark\"``: broadcast out, ``treeAggregate`` back (classic "
            "sessions). ``\"files\"``: both directions as files under the staging directory, summed by the "
            "driver (classic sessions whose driver and executors share a fast filesystem). ``\"auto\"`` "
            "(default): files when every executor runs on the driver's host (``local[N]``, ``local-cluster``) "
            "and the staging directory is local; on hosts of their own Spark's tree while bringing every "
            "worker's sums through the driver's link (``network_rate``) costs less than a sharded round, else "
            "sql; always sql under Connect (the whole rule: :func:`sparkdl_avg.driver.transport.paths.choose`). Name one only "
            "to compare them, or ``\"files\"`` with a fast shared filesystem. Measurements: docs/benchmarks.md, "
            "\"On a shaped network\" and \"Aggregation paths\".",
        check=OneOf(STATE_TRANSPORTS),
        cli=Flag(choices=STATE_TRANSPORTS),
        param=SparkParam("stateTransport", "toString"),
    ),
    Option(
        "aggregation", "auto", "str",
        help="how the sql round sums the workers' sums: 'driver' (all to the driver), 'files' (the driver reads "
             "the workers' files), 'shuffle' (S reducers through Spark's shuffle), 'storage' (S reducers reading "
             "the workers' files), 'auto'",
        doc="How ``state_transport=\"sql\"`` sums the workers' sums. ``\"driver\"``: every worker's "
            "sums reach the driver (``N`` models' bytes). ``\"files\"``: workers write their sums under the "
            "staging directory and the driver reads them (``N`` models' bytes, through the page cache on one "
            "host). ``\"shuffle\"``: sums cut into ``aggregation_shards`` slices, slice ``j`` of every worker "
            "summed by reducer task ``j`` after a shuffle. ``\"storage\"``: workers write their sums under the "
            "staging directory and ``aggregation_shards`` reducer tasks sum them slice by slice (ranged reads). "
            "Sharded, the driver receives one model's bytes. ``\"auto\"`` (default): files under Spark Connect "
            "when its master and the staging directory are local (client and executors share its files); on hosts of their own the driver while "
            "that costs less than sharding (``network_rate``), else shuffle; on one host the driver up to "
            ":data:`sparkdl_avg.driver.transport.paths.DRIVER_SUM_BYTES` of sums in all, else storage (the whole rule: "
            ":func:`sparkdl_avg.driver.transport.paths.plan_aggregation`; measurements: docs/benchmarks.md, \"Aggregation "
            "paths\" and \"On a shaped network\"). All give bitwise the same sums, so name one only to compare "
            "them. Anything but ``\"auto\"`` is refused with ``state_transport=\"spark\"`` or ``\"files\"``, "
            "which sum on the driver.",
        check=OneOf(AGGREGATIONS),
        cli=Flag(choices=AGGREGATIONS),
        param=SparkParam("aggregation", "toString"),
    ),
    Option(
        "aggregation_shards", None, "Optional[int]",
        help="slices S the sql round's sharded aggregation cuts the sums into",
        unset="one per worker, each at least 256 kB",
        doc="Slices (reducer tasks) of the sharded aggregations (``aggregation=\"shuffle\"`` or "
            "``\"storage\"``; refused with ``\"driver\"`` or ``\"files\"``). At most "
            f"{MAX_AGGREGATION_SHARDS} (:data:`~sparkdl_avg.driver.config.options.MAX_AGGREGATION_SHARDS`) and at most "
            "the model's parameters. Default ``None``: one per worker, each slice at least 256 kB.",
        check=Ints(1, allow_none=True, high=MAX_AGGREGATION_SHARDS),
        cli=Flag(type=int),
        param=SparkParam("aggregationShards", "toInt"),
    ),
    Option(
        "slow_warning", True, "bool",
        help="warn early in a fit when one process would have trained an epoch faster",
        doc="Early in a fit, warn (once, with the numbers) when an epoch takes longer than one "
            "process would at one worker's measured speed per minibatch: the rounds' fixed cost outweighs "
            "what the workers add (:func:`sparkdl_avg.driver.api.advisor.slower_than_one_process`, the cost model of "
            ":func:`sparkdl_avg.advise`). It reads rounds where no worker built its replica or traced its "
            "step function, at the end of the first epoch that brings 3 of them (or of the last). Also, once "
            "per application, say how long the first fit waited for new executor workers to import TensorFlow "
            "and what removes that (a session without RECOMMENDED_CONF). Default True.",
        check=Bool(),
        cli=Flag("--no-slow-warning", action="store_false",
                 help="do not warn when the fit is slower than one process would be"),
        param=SparkParam("slowWarning", "toBoolean"),
    ),
    Option(
        "synchronization", "sync", "str",
        help="'sync' (every round waits for every worker), 'stale' (a worker may run up to 'staleness' rounds "
             "ahead of the slowest) or 'async' (no bound)",
        doc="How workers wait for each other (:mod:`sparkdl_avg.driver.fit.stale_async`). ``\"sync\"`` (default): rounds, each "
            "waiting for its slowest worker. ``\"stale\"``: stale-synchronous parallel (Ho et al. 2013); each "
            "worker trains its own chunks of ``averaging_frequency`` minibatches as small Spark jobs and the "
            "driver applies each worker's update as it arrives, so a worker gets the current weights and its "
            "next chunk at once; a chunk of round ``r`` starts only when every round before ``r - staleness`` "
            "is applied (``staleness=0`` is ``\"sync\"``). ``\"async\"``: no bound. Epochs still end "
            "together (validation, callbacks and checkpoints see every chunk of the epoch applied); "
            "``checkpoint_every`` must be ``\"epoch\"``.",
        check=OneOf(SYNCHRONIZATIONS),
        cli=Flag(choices=SYNCHRONIZATIONS),
        param=SparkParam("synchronization", "toString"),
    ),
    Option(
        "staleness", 2, "int",
        help="with synchronization='stale': how many rounds a worker may run ahead of the slowest",
        doc="With ``synchronization=\"stale\"``, the bound ``s``: rounds a worker's chunk may run ahead of "
            "the oldest chunk not yet applied, which is also the most rounds the weights a chunk starts from "
            "can lack; another value than the default is refused with ``\"sync\"``. Default 2 (measured in "
            "docs/benchmarks.md, \"Stragglers\").",
        check=Ints(0),
        cli=Flag(type=int),
        param=SparkParam("staleness", "toInt"),
    ),
    Option(
        "staleness_aware", True, "bool",
        help="scale each asynchronous update by 1/delay (Zhang et al. 2016)",
        doc="With ``synchronization=\"stale\"`` or ``\"async\"``, scale each worker's update by "
            "``1/max(1, τ)`` where ``τ`` is the updates applied since the worker read the weights, in "
            "rounds (``num_workers`` updates; Zhang, Gupta, Lian & Liu, IJCAI 2016). Default True.",
        check=Bool(),
        cli=Flag("--no-staleness-aware", action="store_false",
                 help="apply asynchronous updates unscaled, whatever their delay"),
        param=SparkParam("stalenessAware", "toBoolean"),
    ),
    Option(
        "reproducible", False, "bool",
        help="with synchronization='stale': apply updates in chunk order, each chunk reading the weights after "
             "exactly the rounds before its own minus 'staleness', so runs repeat bitwise",
        doc="With ``synchronization=\"stale\"``: apply the workers' updates in chunk order and have a chunk of "
            "round ``r`` read the weights after exactly the rounds before ``r - staleness``, so the run does not "
            "depend on the workers' timing and repeats bitwise. The workers still run ahead; each chunk reads "
            "weights ``staleness`` rounds old even when newer ones exist. Default False (updates applied as they "
            "arrive, each chunk reading the newest weights).",
        check=Bool(),
        cli=Flag(action="store_true"),
        param=SparkParam("reproducible", "toBoolean"),
    ),
    Option(
        "network_rate", None, "Any",
        help="the driver's network link rate (e.g. '1gbit', '10gbit'), which state_transport='auto' and "
             "aggregation='auto' weigh on hosts of their own",
        unset="1 Gbit/s",
        doc="The rate of the driver's network link on a cluster of several hosts, which ``\"auto\"`` "
            "(``state_transport``, ``aggregation``) weighs: a string such as ``\"1gbit\"``, ``\"10gbit\"`` or "
            "``\"800mbit\"``, or bytes per second. Default ``None``: 1 Gbit/s. Every worker's sums go straight "
            "to the driver while that costs less than sharding them "
            "(:func:`sparkdl_avg.driver.transport.paths.driver_bound_pays`), else they are sharded through the shuffle and the "
            "driver's link carries about one model's bytes each way per round. Give your link's rate when it is "
            "not 1 Gbit/s. Not used when every executor runs on the driver's host (``local[N]``, "
            "``local-cluster``). Measurements: docs/benchmarks.md, \"On a shaped network\".",
        check=Parsed(parse_optional_rate, "a link rate"),
        cli=Flag(metavar="RATE"),
        param=SparkParam("networkRate", "toString"),
    ),
    Option(
        "update_compression", None, "Optional[str]",
        help="send each worker's round delta compressed: 'bf16' (2 bytes a value), 'int8' or 'int4' (the weights "
             "at about 1 byte or half a byte, with error feedback)",
        unset="float32 sums, uncompressed",
        doc="Send each worker's *delta* from the round's starting state compressed instead of its float32 "
            "sums (:mod:`sparkdl_avg.shared.wire.delta_sums`); the sums are still added in float32, so only the wire "
            "changes. ``\"bf16\"``: bfloat16, round to nearest even (0.5× the bytes). ``\"int8\"``: the weights "
            "in int8 with a float32 scale per 256 values and error feedback, the optimizer's variables in bf16 "
            "(int8 on Adam's second moments diverged in our measurements): 0.42× with Adam. ``\"int4\"`` (Streaming "
            "DiLoCo's 4-bit outer gradients): likewise with the weights in signed 4-bit values, two a byte, and a "
            "float32 scale per 128 values: 0.13× for the weights alone, 0.38× with Adam. Works with every update "
            "rule, "
            "``synchronization=\"stale\"``, every ``state_transport`` and ``aggregation``, and Spark Connect. "
            "Default ``None``: float32 sums. Measured in docs/benchmarks.md, \"Compressed updates\".",
        check=OneOf((None,) + UPDATE_COMPRESSIONS),
        cli=Flag(choices=UPDATE_COMPRESSIONS),
        param=SparkParam("updateCompression", "toString"),
    ),
    Option(
        "error_feedback", None, "Optional[bool]",
        help="with update_compression: keep what the codec drops per worker and add it to its next delta",
        unset="for what travels in int8 or int4, not for bf16",
        doc="With ``update_compression``: each worker keeps what its codec dropped (its residual, in a file "
            "under the staging directory, so a retried task or a lost executor changes nothing) and adds it "
            "to its next round's delta, so nothing is lost over rounds (Seide et al. 2014; Karimireddy et al. "
            "2019). Default ``None``: for what travels in int8 or int4 (``\"int8\"``'s and ``\"int4\"``'s weights), not for bf16 "
            "(measured equal to float32 without it); ``True``: for everything compressed; ``False``: none. Not "
            "with ``synchronization=\"async\"``, whose chunks have no fixed predecessor.",
        check=Bool(allow_none=True),
        cli=Flag(type=on_off, metavar="on|off"),
        param=SparkParam("errorFeedback", "toBoolean"),
    ),
    Option(
        "preprocess", None, "Any",
        help="a function run on the executors that maps a minibatch of raw columns (a dict of numpy arrays) to the "
             "model's inputs and labels (decode images, tokenize, augment); in fit, evaluate and predict",
        unset="the columns feed the model as they are",
        doc="A function ``fn(batch, seeds=None, training=False)`` that maps a minibatch of raw DataFrame columns "
            "(a dict of numpy arrays: numbers, object arrays of ``bytes``/``str``, dicts for structs) to a dict "
            "holding the model's inputs and labels by name (``features_col``, ``label_col`` and "
            "``sample_weight_col`` then name its keys; a name it does not return is taken from the batch). It "
            "runs on the executors, per minibatch, in ``fit``, ``evaluate`` and ``predict``; ``seeds`` (one "
            "int64 per example from the fit's seed, the epoch and the example) makes random augmentation repeat "
            "bitwise; ``training`` is True only in ``fit``'s rounds. Only the columns it reads are staged, as "
            "they came (found by running it on a few rows on the driver first, which also checks its output "
            "against the model). Shipped by value when defined in ``__main__``; otherwise its module must be "
            "importable on the executors. Default ``None``. See README, \"Images, text and ids\".",
        check=Function(),
        cli=Flag(metavar="MODULE:FUNCTION", type=import_function, group="data",
                 help="a function that maps a minibatch of raw columns (a dict of numpy arrays) to the model's "
                      "inputs and labels, run on the executors (decode images, tokenize, augment); ship its module "
                      "with --py-files"),
    ),
    Option(
        "min_workers", None, "Optional[int]",
        help="elastic rounds: the fewest workers a round may run with; set it (or max_workers) to re-plan each "
             "round for the task slots Spark has live",
        unset="elastic rounds off: every round has num_workers workers",
        doc="Elastic rounds (README, \"Elastic rounds\"): the fewest workers a round may run with. Setting it or "
            "``max_workers`` makes the rounds elastic: before each round the trainer reads the task slots Spark "
            "has live (:mod:`sparkdl_avg.driver.elastic.membership`) and plans ``min(max_workers, slots)`` workers, which "
            "split what the epoch has left, so a host that leaves costs one retried task and a host that joins "
            "trains from the next round. While fewer than ``min_workers`` slots are live the fit waits, at most "
            "``elastic_timeout_s``, then fails. Default ``None``: elastic rounds off, every round has "
            "``num_workers`` workers.",
        check=Ints(1, allow_none=True),
        cli=Flag(type=int),
        param=SparkParam("minWorkers", "toInt"),
    ),
    Option(
        "max_workers", None, "Optional[int]",
        help="elastic rounds: the most workers a round may run with",
        unset="num_workers when given, else every live task slot",
        doc="Elastic rounds: the most workers a round may run with (also what the update rule's defaults, "
            "e.g. BMUF's ``η = 1 − 1/N``, are resolved for). Default ``None``: ``num_workers`` when it is given, "
            "else as many as Spark has task slots (with ``min_workers`` set).",
        check=Ints(1, allow_none=True),
        cli=Flag(type=int),
        param=SparkParam("maxWorkers", "toInt"),
    ),
    Option(
        "elastic_timeout_s", 300.0, "float",
        help="elastic rounds: seconds a fit waits for min_workers task slots before it fails",
        doc="Elastic rounds: how long a fit waits, in seconds, for ``min_workers`` task slots to be live before "
            "it fails with a ``WorkerError`` that says how many there were. Default 300.",
        check=Seconds(),
        cli=Flag(type=float),
        param=SparkParam("elasticTimeoutS", "toFloat"),
    ),
    # ------------------------------------------------- fit options the CLI and the estimator expose
    Option(
        "epochs", 1, "int", scope=FIT,
        help="passes over the training data (with initial_epoch: the index of the epoch to stop before)",
        check=Ints(1),
        cli=Flag(type=int),
        param=SparkParam("epochs", "toInt"),
    ),
    Option(
        "initial_epoch", 0, "int", scope=FIT,
        help="epoch at which to start, to continue an earlier fit (as in keras.Model.fit); must be below epochs",
        check=Ints(0),
        cli=Flag(type=int),
    ),
    Option(
        "features_col", "features", "Any", scope=FIT,
        help="features column(s): array<float/double> or ml Vector",
        cli=Flag(action="append", default=None, metavar="COL", group="data",
                 help="features column(s): array<float/double> or ml Vector; for a model with several inputs "
                      "repeat the flag or give a comma list, in the order of model.inputs (default: features)"),
        param=SparkParam("featuresCol", "toString", shared=True),
    ),
    Option(
        "label_col", "label", "Any", scope=FIT,
        help="label column(s)",
        cli=Flag(action="append", default=None, metavar="COL", group="data",
                 help="label column(s); several for a model with several outputs (default: label)"),
        param=SparkParam("labelCol", "toString", shared=True),
    ),
    Option(
        "shuffle", True, "bool", scope=FIT,
        help="shuffle the examples every epoch",
        check=Bool(),
        cli=Flag("--no-shuffle", action="store_true", dest="no_shuffle", to_option=operator.not_,
                 help="keep the data's order instead of shuffling each epoch"),
        param=SparkParam("shuffle", "toBoolean"),
    ),
    Option(
        "verbose", "auto", "Any", scope=FIT,
        help="0 silent, 1 progress bar, 2 one line per epoch",
        check=OneOf(("auto", 0, 1, 2)),
        cli=Flag(type=int, choices=(0, 1, 2), default=2),
        param=SparkParam("verbose", "toInt", default=0),
    ),
    Option(
        "checkpoint_dir", None, "Optional[str]", scope=FIT,
        help="write atomic checkpoints there (new or empty directory, or this run's checkpoints)",
        check=Text("a local path or a pyarrow.fs URI"),
        cli=Flag(metavar="PATH_OR_URI"),
        param=SparkParam("checkpointDir", "toString"),
    ),
    Option(
        "checkpoint_every", "epoch", "Any", scope=FIT,
        help="'epoch' or a number of rounds",
        check=RoundsOrEpoch(),
        cli=Flag(to_option=rounds_or_epoch),
        param=SparkParam("checkpointEvery", "identity"),
    ),
    Option(
        "resume", False, "Any", scope=FIT,
        help="continue from the latest checkpoint in --checkpoint-dir, if there is one",
        check=BoolOrPath(),
        cli=Flag(action="store_true"),
        param=SparkParam("resume", "identity"),
    ),
    Option(
        "sample_weight_col", None, "Optional[str]", scope=FIT,
        help="column of each example's weight in the loss (Keras' sample_weight)",
        unset="every example weighs 1",
        check=Text("a column name"),
        cli=Flag(metavar="COL", group="data"),
        param=SparkParam("weightCol", "toString", shared=True),
    ),
    Option(
        "class_weight", None, "Optional[dict]", scope=FIT,
        help="weight of each class in the loss, as Keras' class_weight ({class index: weight}; a flag: 0=1,1=5)",
        unset="every class weighs 1",
        check=ClassWeights(),
        cli=Flag(metavar="CLASS=WEIGHT,...", type=parse_class_weight),
    ),
    # ------------------------------------------------- MLflow tracking (sparkdl_avg.driver.observe.tracking.MlflowLogger)
    Option(
        "mlflow", False, "bool", scope=TRACKING,
        help="log the fit to MLflow (also on when an experiment, tracking URI or run name is given)",
        doc="Log the fit to MLflow: into the active run, else into a new run of ``experiment``. The "
            "jobs and the estimator only; an ``MlflowLogger`` in ``callbacks`` is this switch for the trainer.",
        check=Bool(),
        cli=Flag(action="store_true", group="tracking"),
        param=SparkParam("mlflowTracking", "toBoolean"),
    ),
    Option(
        "experiment", None, "Optional[str]", scope=TRACKING,
        help="MLflow experiment of the run (created if missing)",
        unset="the active run's, else MLflow's (MLFLOW_EXPERIMENT_NAME / _ID, or 'Default')",
        doc="Name of the MLflow experiment a new run goes into, created if it does not exist. Default "
            "``None``: the active run's, else MLflow's current experiment (``mlflow.set_experiment``, "
            "``MLFLOW_EXPERIMENT_NAME``/``_ID``, else ``\"Default\"``).",
        check=Text(),
        cli=Flag("--mlflow-experiment", metavar="NAME", group="tracking"),
        param=SparkParam("mlflowExperiment", "toString"),
    ),
    Option(
        "tracking_uri", None, "Optional[str]", scope=TRACKING,
        help="MLflow tracking URI (http://host:5000, sqlite:///mlflow.db, databricks)",
        unset="MLflow's (mlflow.set_tracking_uri, MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)",
        doc="Where the run is tracked: a tracking server (``http://host:5000``), a database "
            "(``sqlite:///mlflow.db``) or ``databricks``. Default ``None``: MLflow's current tracking URI "
            "(``mlflow.set_tracking_uri``, ``MLFLOW_TRACKING_URI``). Only this logger uses it; MLflow's "
            "global setting is not changed.",
        check=Text(),
        cli=Flag("--mlflow-tracking-uri", metavar="URI", group="tracking"),
        param=SparkParam("mlflowTrackingUri", "toString"),
    ),
    Option(
        "run_name", None, "Optional[str]", scope=TRACKING,
        help="name of a new MLflow run",
        unset="MLflow's generated name",
        doc="Name of the new run (not used when logging into the active run or resuming one). Default "
            "``None``: MLflow generates one.",
        check=Text(),
        cli=Flag("--mlflow-run-name", metavar="NAME", group="tracking"),
        param=SparkParam("mlflowRunName", "toString"),
    ),
    Option(
        "log_model", True, "bool", scope=TRACKING,
        help="log the trained model (Keras flavour, with its signature), stats.json and report.html at the end",
        doc="At the end of a fit, log the trained model in MLflow's Keras flavour (artifact ``model``, "
            "with an input/output tensor signature; ``mlflow.keras.load_model(\"runs:/<id>/model\")``) "
            "and the ``stats.json`` and ``report.html`` artifacts. Default True.",
        check=Bool(),
        cli=Flag("--mlflow-no-log-model", action="store_false", dest="log_model", group="tracking",
                 help="do not log the trained model, stats.json and report.html to MLflow"),
        param=SparkParam("mlflowLogModel", "toBoolean"),
    ),
)

_BY_NAME: Dict[str, Option] = {o.name: o for o in OPTIONS}
assert len(_BY_NAME) == len(OPTIONS), "an option is declared twice"


def option(name: str) -> Option:
    """The row of ``name``."""
    return _BY_NAME[name]


def of(*scopes: str) -> Tuple[Option, ...]:
    """The rows of ``scopes``, in table order."""
    return tuple(o for o in OPTIONS if o.scope in scopes)


def check(name: str, value: Any) -> None:
    """Runs the check of ``name``'s row on ``value``."""
    row = _BY_NAME[name]
    if row.check is not None:
        row.check(name, value)


def flag_names() -> Dict[str, str]:
    """snake_case names in the trainer's messages → the jobs' flags (``"batch_size"`` → ``"--batch-size"``)."""
    return {name: o.cli.flag or "--" + o.name.replace("_", "-")
            for o in OPTIONS if o.cli is not None for name in (o.name, *o.aliases)}


def param_names() -> Dict[str, str]:
    """snake_case names in the trainer's messages → the estimator's Params (``"batch_size"`` → ``"batchSize"``)."""
    return {name: o.param.name for o in OPTIONS if o.param is not None for name in (o.name, *o.aliases)}


def rename(message: str, names: Mapping[str, str], quote: bool = True) -> str:
    """``message`` with each quoted option name (``'batch_size'``) of ``names``, and each ``name=`` of one, replaced by its entry.

    With ``quote=False`` the replacement is written bare (flags: ``--batch-size``). A quoted word
    that is also a value some option takes (``'shuffle'``, an ``aggregation``) is a value in the
    messages (``Got aggregation='shuffle'``), and stays: issue 38 found the jobs turning it into
    ``--no-shuffle``. ``The 'shuffle' parameter`` is renamed by the callers' own rule.
    """
    import re

    values = {c for o in OPTIONS if isinstance(o.check, OneOf) for c in o.check.choices if isinstance(c, str)}

    def sub(m: "re.Match") -> str:
        if m.group(1) not in names or m.group(1) in values:
            return m.group(0)
        new = names[m.group(1)]
        return f"'{new}'" if quote else new

    def assignment(m: "re.Match") -> str:  # "Got checkpoint_every=3": the value an option was given
        return f"{names[m.group(1)]}=" if m.group(1) in names else m.group(0)

    message = re.sub(r"'([a-z]+(?:_[a-z]+)*)'", sub, message)
    # not inside an update rule's spec ('slowmo:slow_lr=2,slow_momentum=0.7'): the names the user wrote stay
    return re.sub(r"(?<![\w.'\-:,])([a-z]+(?:_[a-z]+)*)=(?!=)", assignment, message)


# ------------------------------------------------------------- derivations


def from_flat(values: Mapping[str, Any]) -> Dict[str, Any]:
    """The trainer's options from the CLI's or the estimator's flat values.

    ``values`` holds the :data:`TRAINER` and :data:`RULE` options by name;
    ``update_rule`` is a rule name or spec, made a rule with the :data:`RULE`
    options by :func:`~sparkdl_avg.driver.algorithms.rules.as_update_rule`.
    """
    out = {o.name: values[o.name] for o in of(TRAINER) if o.name in values}
    out["update_rule"] = as_update_rule(values["update_rule"], {o.name: values[o.name] for o in of(RULE)})
    return out


def literal(value: Any) -> str:
    """``value`` as README.md and the docs write it: ``"average"``, ``None``, ``32``."""
    return f'"{value}"' if isinstance(value, str) else repr(value)


def signature(rows: Iterable[Option], leading: Sequence[inspect.Parameter] = (),
              kind: Any = inspect.Parameter.POSITIONAL_OR_KEYWORD, camel: bool = False) -> inspect.Signature:
    """A signature: ``leading`` parameters, then one per row with its default.

    With ``camel`` the rows' Param names and Param defaults (the estimator's).
    """
    params = list(leading)
    for o in rows:
        if camel:
            params.append(inspect.Parameter(o.param.name, kind, default=o.param_default(), annotation=o.annotation))
        else:
            params.append(inspect.Parameter(o.name, kind, default=o.default, annotation=o.annotation))
    return inspect.Signature(params)


def check_names(owner: str, given: Iterable[str], valid: Sequence[str]) -> None:
    """Raises ``TypeError`` naming the keyword arguments of ``given`` that are not ``valid``."""
    unknown = [n for n in given if n not in valid]
    if unknown:
        raise TypeError(
            f"{owner} got unexpected keyword argument(s) {', '.join(repr(n) for n in unknown)}. "
            f"Valid options: {', '.join(valid)}."
        )


def constructor(scope: str = TRAINER, exclude: Sequence[str] = ()) -> Callable:
    """Decorates ``__init__(self, model, **kwargs)``: the signature shows ``scope``'s options.

    The parameters before ``**kwargs`` (``self, model``; ``self`` alone) come
    first, then one per row of ``scope`` except those named in ``exclude``.

    The wrapped ``__init__`` gets the options bound by name with their
    defaults (positional ones in table order, as a written-out signature
    would take them) as ``kwargs``; an unknown name raises ``TypeError``
    listing the valid ones.
    """

    def decorate(init: Callable) -> Callable:
        first = [p for p in inspect.signature(init).parameters.values() if p.kind is not p.VAR_KEYWORD]
        rows = [o for o in of(scope) if o.name not in exclude]
        sig = signature(rows, leading=[p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in first])
        names = [o.name for o in rows]

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            check_names(type(self).__name__, [k for k in kwargs if k not in (p.name for p in first)], names)
            try:
                bound = sig.bind(self, *args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{type(self).__name__}(): {exc}") from None
            bound.apply_defaults()
            values = dict(bound.arguments)
            lead = [values.pop(p.name) for p in first]
            init(*lead, **values)

        __init__.__signature__ = sig
        __init__.__doc__ = init.__doc__
        __init__.__qualname__ = init.__qualname__
        __init__.__module__ = init.__module__
        __init__.__wrapped__ = init
        return __init__

    return decorate


def args_entries(entries: Iterable[Tuple[str, str]], indent: int = 8, width: int = 96) -> str:
    """Google-style Args entries ``name: text``, wrapped, continuation lines indented by 4 more."""
    out = []
    for name, text in entries:
        out.append(textwrap.fill(f"{name}: {text}", width=width, initial_indent=" " * indent,
                                 subsequent_indent=" " * (indent + 4), break_on_hyphens=False,
                                 break_long_words=False))
    return "\n".join(out)


def document(doc: Optional[str], entries: Iterable[Tuple[str, str]]) -> str:
    """``doc`` with ``entries`` added at the end of its ``Args`` section (8-space indented entries)."""
    lines = (doc or "").split("\n")
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Args") and line.rstrip().endswith(":"))
    end = start + 1
    while end < len(lines) and lines[end].strip():
        end += 1
    return "\n".join(lines[:end] + [args_entries(entries)] + lines[end:])


def trainer_entries(scope: str = TRAINER, exclude: Sequence[str] = ()) -> Tuple[Tuple[str, str], ...]:
    """The Args entries of ``scope``'s options (but those named in ``exclude``): ``(name, doc)``."""
    return tuple((o.name, o.doc or o.help) for o in of(scope) if o.name not in exclude)
