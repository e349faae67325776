"""The trainer's messages in the words of the other entry points: flags for the jobs, camelCase Params for the estimator.

Every message names an option as the trainer does (``'batch_size'``, ``Got batch_size=0``);
the jobs show it with the flag (``--batch-size``, :func:`flag_names`) and the estimator with
its Param (``batchSize``, :func:`param_names`), both through :func:`rename`. The names come from
the rows of :data:`sparkdl_avg.driver.config.options.OPTIONS` (with their ``aliases``).
"""

from __future__ import annotations

from typing import Dict, Mapping

from .constraints import OneOf
from .options import OPTIONS


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
    messages (``Got aggregation='shuffle'``), and stays (renamed, the jobs' messages said ``--no-shuffle``).
    ``The 'shuffle' parameter`` is renamed by the callers' own rule.
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
