"""The one registry idiom, :class:`Registry`: classes found by name, for the option or parameter whose values name them.

Update rules (:mod:`sparkdl_avg.driver.algorithms.registry`), state transports and aggregation paths (declared by
:mod:`sparkdl_avg.driver.config.options`, filled by the transport modules), data adapters
(:mod:`sparkdl_avg.driver.data.adapters`), column kinds (:mod:`sparkdl_avg.shared.data.kinds`) and the kinds of
state workers keep between rounds (:mod:`sparkdl_avg.driver.transport.chains`) each are one,
joined with ``@REGISTRY.register``; what differs between them is an option of the class, not another idiom.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..errors import ConfigurationError


class Registry:
    """Classes found by name, for the option (or parameter) whose values name them.

    A class registers under its names with :meth:`register` (a class
    decorator). A class defined again (the same module and qualified name: a
    notebook cell run twice) replaces itself; another class taking a taken
    name is an error.

    Args:
        option: The option or parameter whose values name the classes, for the error an unknown name raises.
        what: What a class is, in words ("state transport").
        also: Values the option takes that name no class (``"auto"``): in :attr:`choices` and in the error.
        names_of: A class's names; default ``(cls.name,)``.
        pattern: The regular expression a name matches; ``None``: any string.
        latest_first: Ask the latest registered first (registering again moves a class first), not the first.
        instances: Keep one instance of each class (stateless handlers) rather than the class.
        unknown: The error of an unknown name, from the name and :meth:`names`; default a
            ``ConfigurationError`` naming the option, the value and the names there are.
    """

    def __init__(self, option: str, what: str, also: Tuple[str, ...] = (),
                 names_of: Callable[[type], Any] = lambda cls: (cls.name,),
                 pattern: Optional[str] = r"[a-z][a-z0-9_]*", latest_first: bool = False, instances: bool = False,
                 unknown: Optional[Callable[[Any, Tuple[str, ...]], Exception]] = None) -> None:
        self.option, self.what, self.also, self.names_of, self.pattern = option, what, also, names_of, pattern
        self.latest_first, self.instances, self.unknown = latest_first, instances, unknown
        self._entries: Dict[str, Any] = {}
        #: The option's values, ``also`` then the names, read when used: the option table is built before the
        #: modules that register have all loaded.
        self.choices = _Choices(self)

    def register(self, cls: type) -> type:
        """Registers ``cls`` under its names; returns it.

        Raises:
            TypeError: its names are not a tuple of strings (``names = "mine"``).
            ValueError: a name does not match ``pattern``, or another class has it.
        """
        names, label = self.names_of(cls), f"{self.what[0].upper()}{self.what[1:]} {cls.__name__}"
        if not isinstance(names, tuple) or not all(isinstance(n, str) for n in names):
            raise TypeError(f"{label}'s names must be a tuple of strings, such as ('mine',). Got {names!r} instead.")
        for name in names:
            if self.pattern is not None and not re.fullmatch(self.pattern, name):
                raise ValueError(f"{label} needs a name of its own matching {self.pattern}. Got {name!r} instead.")
            old = self._entries.get(name)
            old = type(old) if self.instances and old is not None else old
            if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
                raise ValueError(f"{label} needs a name of its own: {name!r} is taken by "
                                 f"{old.__module__}.{old.__qualname__}.")
        entry = cls() if self.instances else cls
        for name in names:
            if self.latest_first:
                self._entries.pop(name, None)
            self._entries[name] = entry  # not latest_first: in the place of the class it replaces
        return cls

    def get(self, name: Any) -> Any:
        """The class (or instance) registered as ``name``.

        Raises:
            ConfigurationError: no such name (or ``unknown``'s error).
        """
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            if self.unknown is not None:
                raise self.unknown(name, self.names()) from None
            also = f" (or {', '.join(map(repr, self.also))})" if self.also else ""
            raise ConfigurationError(
                f"The '{self.option}' parameter names no {self.what}: it must be one of "
                f"{', '.join(map(repr, self.names()))}{also}. Got {name!r} instead."
            ) from None

    def names(self) -> Tuple[str, ...]:
        """The registered names, in the order they are asked."""
        return tuple(reversed(self._entries) if self.latest_first else self._entries)

    def entries(self) -> List[Any]:
        """The registered classes (or instances), each once, in the order they are asked."""
        return list(dict.fromkeys(self._entries[n] for n in self.names()))

    def __contains__(self, name: object) -> bool:
        return name in self._entries


class _Choices(Sequence):
    """A registry's option values, ``also`` then its names, as a tuple read at each use."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def __getitem__(self, index):
        return (*self._registry.also, *self._registry.names())[index]

    def __len__(self) -> int:
        return len(self._registry.also) + len(self._registry.names())
