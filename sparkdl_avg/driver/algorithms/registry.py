"""The update rules' registry: names → rule classes, their declared parameters, and the specs' arguments.

This module owns what the rule classes of :mod:`.rules` declare about themselves and where their names
are kept: :class:`RuleParam` (a parameter a rule declares), :data:`RULES` (a
:class:`~sparkdl_avg.shared.registry.Registry`: a class that declares ``names`` registers itself through
``UpdateRule.__init_subclass__``), the one parser of a spec's arguments
(:func:`parse_arguments`: ``"lr=0.7,momentum=0.9,nesterov"``), and the help texts the flat options and
``update_rule``'s row derive from the registered rules (:func:`flat_option`, :func:`names_help`).
Resolving a name or a spec into a rule is :func:`.rules.as_update_rule`'s.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence

from ...errors import ConfigurationError
from ...shared.registry import Registry

#: The update rules by ``update_rule`` name, in registration order; a class's names are its own ``names``.
RULES = Registry("update_rule", "update rule", names_of=lambda cls: cls.__dict__["names"])


@dataclass(frozen=True)
class RuleParam:
    """One parameter a rule class declares in its ``params``.

    Attributes:
        name: The rule's keyword argument (its dataclass field: the type and
            default come from there).
        doc: What it is, short, as help texts name it: ``"BMUF's eta"``.
        flat: The flat option of the CLI and the estimator that carries it
            (``"block_momentum"``, ``"block_lr"``), or ``None``: a spec only.
        unset: The default as help texts write it when it is computed
            (``"1 - 1/workers"``); ``None``: the field's default.
    """

    name: str
    doc: str
    flat: Optional[str] = None
    unset: Optional[str] = None


@dataclass(frozen=True)
class Parameter:
    """A declared :class:`RuleParam` with its field's type and default (:meth:`UpdateRule.parameters`)."""

    name: str
    type: Any
    default: Any
    doc: str
    flat: Optional[str]
    unset: str


def _words(items: Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def as_text(value: Any) -> str:
    """A default as help texts write it: ``1`` for 1.0, ``0.5``, ``None``."""
    return f"{value:g}" if isinstance(value, float) else repr(value)


def _from_text(raw: str, kind: Any, spec: str, key: str) -> Any:
    """A spec's value ``raw`` as ``kind``: ``bool``, ``int``, ``float`` or ``Optional[...]`` of one; else inferred
    (``true``/``false``, ``none``, an int, a float, else the string)."""
    low = raw.lower()
    if typing.get_origin(kind) is typing.Union and type(None) in typing.get_args(kind):
        if low == "none":
            return None
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if kind is bool:
        if low in ("true", "false", "1", "0"):
            return low in ("true", "1")
    elif kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    else:
        if low in ("true", "false", "none"):
            return {"true": True, "false": False, "none": None}[low]
        for convert in (int, float):
            try:
                return convert(raw)
            except ValueError:
                pass
        return raw
    what = {bool: "true or false", int: "an int", float: "a float"}[kind]
    raise ConfigurationError(
        f"The 'update_rule' parameter must be a rule spec whose {key} is {what}. Got {spec!r} instead."
    )


def parse_arguments(text: str, spec: str, types: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """A spec's arguments: ``"lr=0.7,momentum=0.9,nesterov"`` → ``{"lr": 0.7, "momentum": 0.9, "nesterov": True}``.

    A bare key is ``True``; values are converted to ``types[key]`` (keys not
    in ``types`` are refused, naming those it takes); without ``types`` a
    value is a bool (``true``/``false``), ``None``, an int, a float, else the
    string. ``spec``: the whole spec, for messages.
    """
    out: Dict[str, Any] = {}
    for item in (text.split(",") if text else []):
        key, eq, raw = (part.strip() for part in item.partition("="))
        if not key.isidentifier() or (eq and not raw):
            raise ConfigurationError(
                "The 'update_rule' parameter must be a rule spec 'name:key=value,...' (a bare key means True). "
                f"Got {spec!r} instead."
            )
        if key in out:
            raise ConfigurationError(f"The 'update_rule' parameter gives {key} twice. Got {spec!r} instead.")
        if types is not None and key not in types:
            takes = ", ".join(types) or "no parameters"
            raise ConfigurationError(
                f"The 'update_rule' parameter must be a rule spec with the rule's parameters ({takes}); "
                f"{key} is none of them. Got {spec!r} instead."
            )
        out[key] = _from_text(raw, Any if types is None else types[key], spec, key) if eq else True
    return out


def names_help() -> str:
    """The registered rules as help texts list them: ``'average', 'bmuf', ... or 'outer:<optimizer>:...'``."""
    return _words([c.syntax or ", ".join(repr(n) for n in c.__dict__["names"]) for c in RULES.entries()])


def flat_option(flat: str, what: str) -> Dict[str, Any]:
    """A flat option's ``help``, ``unset`` and ``aliases`` (an :class:`~..config.options.Option`'s), from the rules.

    ``what``: what the option is, for all rules ("the rule's momentum").
    """
    carried = [(c, p) for c in RULES.entries() for p in c.parameters() if p.flat == flat]
    return {
        "help": f"{what}: {_words([p.doc for _, p in carried])}",
        "unset": ", ".join(f"{p.unset} for {c.label or c.__name__}" for c, p in carried),
        "aliases": tuple(dict.fromkeys(p.name for _, p in carried if p.name != flat)),
    }


