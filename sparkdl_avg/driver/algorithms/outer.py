"""``OuterOptimizer``: any Keras optimizer applied to the outer gradient ``sent − w̄`` (torchft's ``outer_optimizer``).

This module owns the update rule registered as ``"outer"`` and its spec,
``"outer:<optimizer>[:<key>=<value>,...]"`` (``--update-rule
outer:sgd:lr=0.7,momentum=0.9,nesterov``, ``updateRule="outer:adam:lr=0.001"``),
parsed by :meth:`OuterOptimizer.from_spec` only.

How the optimizer steps, on the driver, with no model built: it is rebuilt
from its class and ``get_config()`` (the instance you pass is never used or
changed; its state, if any, is not taken) and built against float64 Keras
variables shaped as the trainable weights, as the built-in rules keep their
state in float64 (the DESIGN's "sums in float32 or better"). Each round the
variables take ``w_prev`` (as float64), the gradient is ``sent − w̄``
(float64), the optimizer's ``apply`` steps them, and the result is cast to
the model's dtypes; non-trainable weights are plainly averaged, as with every
rule. The optimizer's variables (Keras makes its iteration counter int64, its
learning rate float32, its slots float64) are the rule's state, a list of
numpy arrays under ``"optimizer"``: they go into checkpoints and come back
bitwise. Keras (TensorFlow backend) turns a float hyperparameter into a
float32 before casting it to the variables' float64, so a step uses
``float32(lr)`` and ``float32(μ)``; the configuration keeps the decimal you
wrote (``0.7``, where ``get_config()`` gives ``0.699999988``). The iteration counter counts outer steps (rounds), so a Keras
learning-rate schedule is a schedule over rounds.

``OuterOptimizer(keras.optimizers.SGD(lr, momentum=μ, nesterov=True))`` is
:class:`~sparkdl_avg.driver.algorithms.rules.DiLoCo` ``(lr, μ)``: Keras keeps
``m = μ·m − lr·g`` and steps ``w ← w + μ·m − lr·g``; with ``m = −lr·v`` that
is PyTorch's ``v ← μ·v + g``, ``w ← w − lr·(g + μ·v)`` at a constant ``lr``.
Steps of float64 variables with ``float32(lr)``, ``float32(μ)`` (above), it
equals ``DiLoCo(float32(lr), float32(μ))`` to float64 rounding, and
``DiLoCo(lr, μ)`` to float32 rounding.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ...errors import ConfigurationError
from .rules import State, UpdateRule, _check_float, parse_arguments


def _keras():
    import keras

    return keras


def _json(value: Any, what: str) -> Any:
    """``value`` as JSON gives it back (tuples become lists), so a checkpoint's copy compares equal."""
    try:
        return json.loads(json.dumps(value, sort_keys=True))
    except (TypeError, ValueError) as e:
        raise ConfigurationError(
            f"The 'optimizer' parameter of OuterOptimizer must be a Keras optimizer whose get_config() is JSON "
            f"(numbers, strings, serialized schedules). {what}'s is not: {e}."
        ) from None


def _not_rebuilt(optimizer: Any, error: Exception) -> ConfigurationError:
    # Keras' own message goes on to suggest its unsafe deserialization mode: its first sentence says what failed
    first = str(error).split(". ")[0].rstrip(".")
    return ConfigurationError(
        "The 'optimizer' parameter of OuterOptimizer must be a Keras optimizer that its get_config() rebuilds "
        "(a learning rate that is a number or a keras.optimizers.schedules.LearningRateSchedule, not a function): "
        "the optimizer is rebuilt from its config in checkpoints and on resume. "
        f"{type(optimizer).__name__}'s is not rebuilt ({type(error).__name__}: {first})."
    )


def _learning_rate(value: Any) -> Any:
    """A config's learning rate as the user wrote it: Keras keeps a float one as a float32 variable, whose
    ``get_config()`` gives ``0.699999988079071`` for ``0.7``; the shortest decimal of that float32 is ``0.7``."""
    if isinstance(value, float) and float(np.float32(value)) == value:
        return float(str(np.float32(value)))
    return value


class OuterOptimizer(UpdateRule):
    """Any Keras optimizer applied to the outer gradient ``g = sent − w̄`` (as torchft's ``DiLoCo(outer_optimizer=)``).

    ``OuterOptimizer(keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True))``
    is ``update_rule="diloco"`` up to float32 rounding. Its state (the
    optimizer's variables) carries over to the next ``fit`` and into
    checkpoints; stale and asynchronous fits step it once per block of ``N``
    chunks, as any rule. The jobs and the estimator take it as a spec:
    ``"outer:sgd:lr=0.7,momentum=0.9,nesterov"`` (``lr`` stands for
    ``learning_rate``; a bare key is ``True``).

    Args:
        optimizer: A Keras optimizer. Only its class and configuration are
            taken; the rule builds its own copy on float64 variables.
    """

    names = ("outer",)
    syntax = "'outer:<optimizer>:<key>=<value>,...'"

    def __init__(self, optimizer: Any) -> None:
        keras = _keras()
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise ConfigurationError(
                "The 'optimizer' parameter of OuterOptimizer must be a Keras optimizer such as "
                f"keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True). Got {optimizer!r} instead."
            )
        what = f"OuterOptimizer({type(optimizer).__name__})"
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):  # it would scale a loss the outer step has not
            raise ConfigurationError(
                f"The 'optimizer' parameter of OuterOptimizer must be a Keras optimizer that steps the outer gradient "
                "as it is; a LossScaleOptimizer scales a loss, which the outer step does not have. Pass its "
                f"inner_optimizer instead. Got {optimizer!r}."
            )
        self._class = type(optimizer)
        try:
            config = {k: v for k, v in optimizer.get_config().items() if k != "name"}  # "sgd_1": a counter
        except Exception as e:
            raise _not_rebuilt(optimizer, e) from None
        if "learning_rate" in config:
            config["learning_rate"] = _learning_rate(config["learning_rate"])
            if not isinstance(config["learning_rate"], dict):  # (a schedule's config is a dict)
                _check_float(what, "learning_rate", config["learning_rate"], 0.0, float("inf"), high_open=True,
                             low_open=True)
        for key in ("momentum", "beta_1", "beta_2", "rho"):  # decay rates of the optimizers' averages
            if config.get(key) is not None:
                _check_float(what, key, config[key], 0.0, 1.0, high_open=True)
        self._config = _json(config, type(optimizer).__name__)
        try:  # what each round does: a new optimizer from the configuration
            self.optimizer
        except Exception as e:
            raise _not_rebuilt(optimizer, e) from None
        self._built: Optional[Tuple[Any, Any, List[Any]]] = None  # (shapes, optimizer, variables): a cache

    @classmethod
    def from_spec(cls, name: str, args: str, values: Mapping[str, Any], spec: str) -> "OuterOptimizer":
        """``"outer:<optimizer>[:<key>=<value>,...]"``: a name ``keras.optimizers.get`` knows, and its arguments."""
        keras = _keras()
        ident, _, arguments = args.partition(":")
        try:
            made = keras.optimizers.get(ident) if ident else None
        except (ValueError, TypeError):
            made = None
        if not isinstance(made, keras.optimizers.Optimizer):
            raise ConfigurationError(
                "The 'update_rule' parameter must be 'outer:<optimizer>:<key>=<value>,...' with a Keras optimizer's "
                f"name (sgd, adam, adamw, rmsprop, ...) as <optimizer>. Got {spec!r} instead."
            )
        signature = inspect.signature(type(made).__init__).parameters
        takes = [p for p in signature if p not in ("self", "kwargs", "name")]
        unknown = [k for k in parse_arguments(arguments, spec) if k not in ("lr", *takes)]
        if unknown:
            raise ConfigurationError(
                f"The 'update_rule' parameter must be an 'outer' spec with {type(made).__name__}'s arguments "
                f"(lr, {', '.join(takes)}); {unknown[0]} is none of them. Got {spec!r} instead."
            )
        # each value as its default's type: a bool is true or false ("nesterov=yes" is refused), "momentum=0" a float
        types = {k: type(signature[k].default) if type(signature[k].default) in (bool, float) else Any for k in takes}
        kwargs = parse_arguments(arguments, spec, {"lr": float, **types})
        if "lr" in kwargs:
            if "learning_rate" in kwargs:
                raise ConfigurationError(f"The 'update_rule' parameter gives the learning rate twice (lr stands for "
                                         f"learning_rate): give it once. Got {spec!r} instead.")
            kwargs["learning_rate"] = kwargs.pop("lr")
        try:
            optimizer = type(made)(**kwargs)
        except (ValueError, TypeError) as e:
            raise ConfigurationError(
                f"The 'update_rule' parameter must be an 'outer' spec whose arguments {type(made).__name__} "
                f"accepts ({e}). Got {spec!r} instead."
            ) from None
        return cls(optimizer)

    @property
    def optimizer(self):
        """A new Keras optimizer of the configured class and configuration (not built)."""
        return self._class.from_config(json.loads(json.dumps(self._config)))

    def describe(self) -> Dict[str, Any]:
        return {"name": self.name, "optimizer": f"{self._class.__module__}.{self._class.__qualname__}",
                "config": self._config}

    def __eq__(self, other: Any) -> bool:
        return type(other) is type(self) and (self._class, self._config) == (other._class, other._config)

    def __hash__(self) -> int:
        return hash((self._class, json.dumps(self._config, sort_keys=True)))

    def __repr__(self) -> str:
        return f"OuterOptimizer({self._class.__name__}.from_config({self._config!r}))"

    def __getstate__(self) -> Dict[str, Any]:
        return {**self.__dict__, "_built": None}  # Keras variables do not pickle; the state is not in the cache

    # ---------------------------------------------------------------- the step

    def _build(self, weights: List[np.ndarray]) -> Tuple[Any, List[Any]]:
        """The optimizer built on float64 variables shaped as ``weights`` (cached: every use loads the state)."""
        shapes = [np.shape(w) for w in weights]
        if self._built is None or self._built[0] != shapes:
            keras = _keras()
            variables = [keras.Variable(np.zeros(s, np.float64), dtype="float64", trainable=True,
                                        name=f"outer_{i}") for i, s in enumerate(shapes)]
            optimizer = self.optimizer
            optimizer.build(variables)
            self._built = (shapes, optimizer, variables)
        return self._built[1], self._built[2]

    def init_state(self, weights, trainable) -> State:
        keras = _keras()
        optimizer = self.optimizer  # a fresh one: its initial variables
        variables = [keras.Variable(np.zeros(np.shape(w), np.float64), dtype="float64")
                     for w, t in zip(weights, trainable) if t]
        optimizer.build(variables)
        return {"optimizer": [np.array(keras.ops.convert_to_numpy(v)) for v in optimizer.variables]}

    def apply(self, weights, sent, average, state, trainable, learning_rate) -> List[np.ndarray]:
        keras = _keras()
        index = [i for i, t in enumerate(trainable) if t]
        optimizer, variables = self._build([weights[i] for i in index])
        for v, value in zip(optimizer.variables, state["optimizer"]):
            v.assign(value)
        for v, i in zip(variables, index):
            v.assign(np.asarray(weights[i], np.float64))
        grads = [keras.ops.convert_to_tensor(np.asarray(sent[i], np.float64) - average[i]) for i in index]
        optimizer.apply(grads, variables)
        state["optimizer"][:] = [np.array(keras.ops.convert_to_numpy(v)) for v in optimizer.variables]
        out = [np.asarray(a).astype(w.dtype, copy=False) for a, w in zip(average, weights)]
        for v, i in zip(variables, index):
            out[i] = keras.ops.convert_to_numpy(v).astype(weights[i].dtype)
        return out
