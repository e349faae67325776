"""What an option's value must be: the constraint types of the table's rows, the parsers of its flags, and the checks across options.

A row of :data:`sparkdl_avg.driver.config.options.OPTIONS` declares its ``check`` as a :class:`Constraint`
(:class:`Ints`, :class:`OneOf`, :class:`Parsed`, ...), which renders the one message style (:func:`must_be`). A check
that joins several options is declared in the table too, right after its rows
(:data:`~sparkdl_avg.driver.config.options.JOINTS`): a :class:`Requires` ("A, when set, needs B to be one of S") or a
:class:`Joint` (A, when set, and any other predicate of the values), run in their declared order by
:func:`check_joints`. The parsers (:func:`parse_rate`, :func:`import_function`, :func:`on_off`, ...) turn the jobs' flag
text, or a Param's string, into an option's value. This module knows no row: the table imports it.
"""

from __future__ import annotations

import os

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple, Union

from ...errors import ConfigurationError

def must_be(name: str, what: str, value: Any) -> ConfigurationError:
    """The one message of a value an option refuses: ``The 'name' parameter must be <what>. Got <value> instead.``"""
    return ConfigurationError(f"The '{name}' parameter must be {what}. Got {value!r} instead.")


class Constraint:
    """What an option's value must be: a row's ``check``, called as ``check(name, value)``.

    A constraint says what it accepts (``str(c)``: "an int in the range [1, inf)") and refuses anything else with
    :func:`must_be`'s message, so every option's error reads the same; the CLI and the estimator rename the option in it
    (:func:`rename`). Subclasses define :meth:`accepts` and ``__str__``, or override :meth:`__call__` where a parser
    raises its own, more specific message (the update rule, the schedule, the link rate).
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
    """A finite number of seconds above 0 (an int or a float, not ``bool``): ``inf`` would wait forever."""

    def accepts(self, value: Any) -> bool:
        return (not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
                and value > 0)

    def __str__(self) -> str:
        return "a finite number of seconds above 0 (not inf: for a long wait give a large number, e.g. 86400)"


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
class PathText(Constraint):
    """A local path or a ``pyarrow.fs`` URI: a non-empty ``str`` or an ``os.PathLike`` (``pathlib.Path``), or ``None``."""

    def accepts(self, value: Any) -> bool:
        return value is None or _path_like(value)

    def __str__(self) -> str:
        return "a non-empty str or os.PathLike (a local path or a pyarrow.fs URI) or None"


def _path_like(value: Any) -> bool:
    return (isinstance(value, str) and value != "") or (isinstance(value, os.PathLike) and os.fspath(value) != "")


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
        return isinstance(value, bool) or _path_like(value)

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


#: The largest weight ``class_weight`` takes. Adam, RMSprop and Adagrad square the gradient, which a class's
#: weight scales: float32 overflows above 3.4e38, so a weight of 1e30 turns the first step's second moment into
#: inf, and the fit stops at round 0 with the NaN error. At 1e6 the squared weight (1e12) leaves 26 orders
#: of magnitude for the unweighted gradient's square, and a loss sum of 1e6 × 16.1 (cross-entropy's most, at
#: Keras' 1e-7 clipping) × 2^31 examples stays near 3.5e16. Larger ratios between classes are no use anyway:
#: float32 keeps about 7 significant digits, so a class weighing 1e7 times another drowns it.
MAX_CLASS_WEIGHT = 1e6


@dataclass(frozen=True)
class ClassWeights(Constraint):
    """A dict of class index (int ≥ 0) → weight (a finite number in ``[0, MAX_CLASS_WEIGHT]``), or ``None``, as Keras' ``class_weight``."""

    def accepts(self, value: Any) -> bool:
        if value is None:
            return True
        return isinstance(value, dict) and bool(value) and all(
            Ints(0).accepts(k) and _class_weight_ok(v) for k, v in value.items())

    def __call__(self, name: str, value: Any) -> None:
        """Refuses a bad dict naming the class and the weight (or key) at fault; anything else as :func:`must_be`."""
        if isinstance(value, dict) and value:
            for k, v in value.items():
                if not Ints(0).accepts(k):
                    raise ConfigurationError(
                        f"The '{name}' parameter has the key {k!r}; expected class indices (ints >= 0) as keys, "
                        f"such as {{0: 1.0, 1: 5.0}}. Got {value!r} instead.")
                if not _class_weight_ok(v):
                    raise ConfigurationError(
                        f"The '{name}' parameter gives class {k} the weight {v!r}; expected a finite number in "
                        f"[0, {MAX_CLASS_WEIGHT:g}] (larger weights overflow float32 in the optimizer's squared "
                        f"gradients; scale the weights down together). Got {value!r} instead.")
            if not any(value.values()):
                raise ConfigurationError(
                    f"The '{name}' parameter gives every class the weight 0, so the fit would train nothing; expected "
                    f"at least one weight above 0. Got {value!r} instead.")
        super().__call__(name, value)

    def __str__(self) -> str:
        return f"a non-empty dict of class index (an int >= 0) to weight (a number in [0, {MAX_CLASS_WEIGHT:g}]), or None"


def _class_weight_ok(v: Any) -> bool:
    return (isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
            and 0 <= v <= MAX_CLASS_WEIGHT)


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
    """``--class-weight``'s ``CLASS=WEIGHT,...`` (``0=1,1=5``) as a dict.

    Raises ``argparse.ArgumentTypeError``, whose message argparse prints as the flag's error; the weights' range is
    checked by :class:`ClassWeights`.
    """
    import argparse

    weights = {}
    for part in str(text).split(","):
        key, sep, value = part.partition("=")
        try:
            if not sep:
                raise ValueError
            weights[int(key)] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected CLASS=WEIGHT,... such as 0=1,1=5 (a class index, '=', its weight; commas between), "
                f"got {text!r}") from None
    return weights


def class_weight_text(value: Any) -> str:
    """The estimator's ``classWeight`` Param: a dict ``{class: weight}`` or ``CLASS=WEIGHT,...`` text as ``"0=1.0,1=5.0"``.

    Text, so that a saved stage's JSON metadata keeps the int classes (JSON keys are strings); the weights' range is
    checked when the estimator fits (:class:`ClassWeights`). Raises ``TypeError`` (the Param's converter: the estimator
    names the Param and what it takes).
    """
    if isinstance(value, str):
        try:
            value = parse_class_weight(value)
        except Exception as exc:  # noqa: BLE001 - argparse.ArgumentTypeError
            raise TypeError(str(exc)) from None
    if not isinstance(value, dict):
        raise TypeError(f"expected a dict or CLASS=WEIGHT,... text, got {value!r}")
    try:
        return ",".join(f"{int(k)}={float(v)!r}" for k, v in value.items())
    except (TypeError, ValueError):
        raise TypeError(f"expected int classes and number weights, got {value!r}") from None


def class_weight_option(text: Any) -> Optional[Dict[int, float]]:
    """``classWeight``'s text back as ``fit``'s ``class_weight`` (``None`` stays)."""
    return None if text is None else parse_class_weight(text)


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


# ------------------------------------------------------------- checks across options


class CrossCheck:
    """A check of several options together, declared in the table after their rows (``JOINTS``).

    It concerns option ``name`` when that is set: its value is one of ``when``, or, with ``when=None``, not its row's
    default; then :meth:`refused` says whether the other options' values refuse it. The error's text is ``message``: a
    template formatted with the values by name (``{synchronization!r}``) and ``default`` (``name``'s default), or a
    function of the values.
    """

    name: str
    message: Union[str, Callable[[Mapping[str, Any]], str]]
    when: Optional[Tuple[Any, ...]]

    def refused(self, values: Mapping[str, Any]) -> bool:
        raise NotImplementedError

    def is_set(self, value: Any, default: Any) -> bool:
        """Whether ``name``'s ``value`` is one this check concerns."""
        return value in self.when if self.when is not None else value != default

    def check(self, values: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
        """Raises ``ConfigurationError`` with the message when ``values`` (every option of the scope by name) are refused."""
        if self.is_set(values[self.name], defaults[self.name]) and self.refused(values):
            message = self.message
            raise ConfigurationError(message(values) if callable(message)
                                     else message.format(**values, default=defaults[self.name]))


@dataclass(frozen=True)
class Requires(CrossCheck):
    """Option ``name``, when set, needs option ``other`` to be one of ``among``: most checks across options."""

    name: str
    other: str
    among: Tuple[Any, ...]
    message: str
    when: Optional[Tuple[Any, ...]] = None

    def refused(self, values: Mapping[str, Any]) -> bool:
        return values[self.other] not in self.among


@dataclass(frozen=True)
class Joint(CrossCheck):
    """Option ``name``, when set, is refused where ``refuses(values)`` holds: a check across options of another form."""

    name: str
    refuses: Callable[[Mapping[str, Any]], bool]
    message: Union[str, Callable[[Mapping[str, Any]], str]]
    when: Optional[Tuple[Any, ...]] = None

    def refused(self, values: Mapping[str, Any]) -> bool:
        return bool(self.refuses(values))


def check_joints(checks: Iterable[CrossCheck], values: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
    """Runs ``checks`` on ``values`` in their declared order: the first that refuses raises its ``ConfigurationError``."""
    for joint in checks:
        joint.check(values, defaults)
