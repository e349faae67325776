"""What derives from the option table's rows in code: signatures, keyword checks and docstrings' Args.

:func:`constructor` gives ``ParameterAveragingTrainer.__init__`` (and ``MlflowLogger``'s) the
signature of a scope's rows, binding the options by name with their defaults and refusing
unknown ones (:func:`check_names`); :func:`signature` is the same for other callers (the
estimator's camelCase keywords); :func:`document` adds a scope's Args entries
(:func:`trainer_entries`) to a docstring; :func:`literal` writes a default as the options page does.
The CLI's flags and the estimator's Params are derived where they are made
(``sparkdl_avg.driver.api.cli``, ``sparkdl_avg.driver.api.ml``), from the same rows.
"""

from __future__ import annotations

import inspect
import textwrap
from typing import Any, Callable, Iterable, Optional, Sequence, Tuple

from .options import of
from .rows import TRAINER, Option


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
