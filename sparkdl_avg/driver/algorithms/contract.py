"""A user's update rule held to :class:`~sparkdl_avg.driver.algorithms.rules.UpdateRule`'s contract, at each call.

A rule class of the user's (defined outside this package) gets its own ``init_state``, ``to_send`` and
``apply`` wrapped (:func:`hold`, from ``UpdateRule.__init_subclass__``): what they return is checked
against the model's weights (one numeric array per weight, of its shape; finite), and the rule's state
(a dict of lists of numeric arrays, which checkpoints store). A broken promise raises a
``ConfigurationError`` naming the rule, the method and the promise, before the driver's model or a
checkpoint is touched, instead of a worker's NaN, a raw ``TypeError`` or a failed checkpoint. The
library's own rules are not wrapped: they are tested, and a check of every weight each round costs time.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np

from ...errors import ConfigurationError


def hold(cls: type) -> None:
    """Wraps the contract's methods that ``cls`` defines itself, if it is not one of the library's rules."""
    if cls.__module__.startswith("sparkdl_avg."):
        return
    for method, returns in (("init_state", _state), ("to_send", _arrays), ("apply", _arrays)):
        fn = cls.__dict__.get(method)
        if fn is not None and not getattr(fn, "_held", False):
            setattr(cls, method, _checked(method, fn, returns))


def _checked(method: str, fn: Callable, returns: Callable) -> Callable:
    @functools.wraps(fn)
    def checked(self, weights, *args, **kwargs):
        out = fn(self, weights, *args, **kwargs)
        returns(self, method, out, weights)
        if method == "apply":  # its state, updated in place (args: sent, average, state, ...)
            state = kwargs["state"] if "state" in kwargs else args[2] if len(args) > 2 else None
            _state(self, method, state, weights)
        return out

    checked._held = True
    return checked


def _label(rule: Any, method: str) -> str:
    return f"The update rule {getattr(rule, 'name', '?')!r} ({type(rule).__qualname__})'s {method}()"


def _arrays(rule: Any, method: str, got: Any, weights: Sequence[Any]) -> None:
    label, count = _label(rule, method), len(weights)
    if not isinstance(got, (list, tuple)):
        raise ConfigurationError(f"{label} must return a list of arrays, one per weight of the model ({count}). "
                                 f"Got {type(got).__name__} instead.")
    if len(got) != count:
        raise ConfigurationError(f"{label} must return one array per weight of the model: {count}. Got {len(got)}.")
    for j, (a, w) in enumerate(zip(got, weights)):
        a, shape = np.asarray(a), np.shape(w)
        if a.shape != shape:
            raise ConfigurationError(f"{label} must return arrays shaped as the weights: weight {j} is {shape}. "
                                     f"Got {a.shape} instead.")
        if a.dtype.kind not in "biuf":
            raise ConfigurationError(f"{label} must return arrays of numbers. Got dtype {a.dtype} for weight {j}.")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise ConfigurationError(
                f"{label} returned NaN or Inf for weight {j}, from finite inputs: check its arithmetic and its "
                "numbers (a learning rate of NaN or Inf). The model keeps its weights from before this round.")


def _state(rule: Any, method: str, state: Any, weights: Sequence[Any] = ()) -> None:
    label = _label(rule, method)
    if not isinstance(state, dict):
        raise ConfigurationError(f"{label} must keep the rule's state as a dict of lists of numeric arrays. "
                                 f"Got {type(state).__name__} instead.")
    for key, arrays in state.items():
        if not isinstance(key, str) or not isinstance(arrays, (list, tuple)):
            raise ConfigurationError(f"{label} must keep the rule's state as a dict of lists of numeric arrays "
                                     f"(checkpoints store them). Got {key!r}: {type(arrays).__name__}.")
        for a in arrays:
            if np.asarray(a).dtype.kind not in "biuf":
                raise ConfigurationError(f"{label} must keep the rule's state as numeric arrays (checkpoints store "
                                         f"them). Got an array of dtype {np.asarray(a).dtype} in {key!r}.")
