"""Update rules: how the replicas' average becomes the next global weights.

A round starts every replica from the *sent* weights and ends with their
example-weighted average ``w̄``. The rule then sets the global weights:

- :class:`PlainAveraging` (the default, ``update_rule=None``): ``w ← w̄``.
- :class:`BlockMomentum` (BMUF, Chen & Huo, ICASSP 2016): with the block
  gradient ``G = w̄ − sent``, ``Δ ← η·Δ + ζ·G`` and ``w ← w_prev + Δ``. The
  classical variant sends ``w``; the Nesterov variant sends the look-ahead
  ``w + η·Δ``. Default ``η = 1 − 1/N`` (``N`` workers), ``ζ = 1``, as the
  paper and CNTK recommend.
- :class:`SlowMo` (Wang et al. 2020, arXiv 1910.00643): with the base
  optimizer's learning rate ``γ`` at the round's start,
  ``u ← β·u + (sent − w̄)/γ`` and ``w ← w_prev − α·γ·u``. At a constant
  learning rate this is classical BMUF with ``η = β`` and ``ζ = α``
  (substitute ``Δ = −α·γ·u``); with a learning-rate schedule SlowMo's
  momentum buffer is in gradient units, so a decaying ``γ`` also shrinks the
  momentum step, while BMUF's ``Δ`` keeps its size.

- :class:`DiLoCo` (Douillard et al. 2023, arXiv 2311.08105): DiLoCo's outer
  optimizer, SGD with Nesterov momentum on the outer gradient ``g = sent − w̄``
  exactly as PyTorch's ``torch.optim.SGD(nesterov=True)`` steps it:
  ``v ← μ·v + g``, ``w ← w − lr·(g + μ·v)``, sending ``w`` itself. Defaults
  ``lr = 0.7``, ``μ = 0.9``, the paper's. It equals ``BlockMomentum(μ, lr,
  nesterov=True)`` in the points it sends (BMUF's look-ahead is DiLoCo's
  ``w``), but the weights a fit ends with are DiLoCo's ``w``, not BMUF's
  ``w`` before the look-ahead; docs/algorithms.md checks it term by term.

Momentum applies to the trainable weights; non-trainable ones (batch-norm
statistics) are plainly averaged. The rule's state (``Δ`` or ``u``, float64
numpy arrays) is kept by the trainer between rounds and between ``fit``
calls. Rules are small frozen dataclasses: validated when built, with no
state of their own, so one rule can configure several trainers.
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ...errors import ConfigurationError
from ...shared.model.modelspec import trainable_mask

State = Dict[str, List[np.ndarray]]

RULE_NAMES = ("average", "bmuf", "bmuf_nesterov", "slowmo", "diloco")


def _check_float(rule: str, name: str, value: Any, low: float, high: float, high_open: bool) -> None:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and np.isfinite(value)
    ok = ok and low <= value and (value < high if high_open else value <= high)
    if not ok:
        bracket = ")" if high_open else "]"
        raise ConfigurationError(
            f"The '{name}' parameter of {rule} must be a float in the range [{low}, {high}{bracket}. "
            f"Got {value!r} instead."
        )


def _check_momentum_and_lr(rule: Any, momentum: str, lr: str) -> None:
    """Checks a rule's momentum field (in ``[0, 1)``) and learning-rate field (``> 0``) and makes both floats."""
    owner = type(rule).__name__
    _check_float(owner, momentum, getattr(rule, momentum), 0.0, 1.0, high_open=True)
    _check_float(owner, lr, getattr(rule, lr), 0.0, float("inf"), high_open=True)
    if getattr(rule, lr) == 0:
        raise ConfigurationError(f"The '{lr}' parameter of {owner} must be > 0. Got {getattr(rule, lr)!r} instead.")
    object.__setattr__(rule, momentum, float(getattr(rule, momentum)))  # numpy scalars → float
    object.__setattr__(rule, lr, float(getattr(rule, lr)))


def _buffers(weights, trainable) -> List[np.ndarray]:
    """A rule's float64 state: zeros shaped as each trainable weight."""
    return [np.zeros(np.shape(w), np.float64) for w, t in zip(weights, trainable) if t]


class UpdateRule:
    """Base class of update rules. Subclasses override the four methods below."""

    #: Short name recorded in the stats and accepted by ``update_rule=``.
    name = "average"

    def resolve(self, num_workers: int) -> "UpdateRule":
        """The rule with defaults that depend on the number of workers filled in."""
        return self

    def init_state(self, weights: Sequence[np.ndarray], trainable: Sequence[bool]) -> State:
        """The rule's state before the first round (empty for plain averaging)."""
        return {}

    def to_send(self, weights: Sequence[np.ndarray], state: State, trainable: Sequence[bool]) -> List[np.ndarray]:
        """The weights broadcast to the replicas, given the global weights."""
        return list(weights)

    def apply(
        self,
        weights: Sequence[np.ndarray],
        sent: Sequence[np.ndarray],
        average: Sequence[np.ndarray],
        state: State,
        trainable: Sequence[bool],
        learning_rate: float,
    ) -> List[np.ndarray]:
        """The next global weights; updates ``state`` in place.

        Args:
            weights: The global weights before the round (``w_prev``).
            sent: The weights the replicas started from.
            average: The replicas' example-weighted average (``w̄``), float64.
            state: The rule's state, from :meth:`init_state`.
            trainable: Per weight, whether momentum applies to it.
            learning_rate: The base optimizer's learning rate at the round's start.

        Returns:
            One array per weight, in the dtype of ``weights``.
        """
        return [np.asarray(a).astype(w.dtype, copy=False) for a, w in zip(average, weights)]

    def describe(self) -> Dict[str, Any]:
        """Name and parameters, for stats, reports and checkpoints."""
        return {"name": self.name}


@dataclass(frozen=True)
class PlainAveraging(UpdateRule):
    """``w ← w̄``: the average of the replicas is the next global weights (DL4J's rule)."""

    name = "average"


@dataclass(frozen=True)
class BlockMomentum(UpdateRule):
    """Block-wise model-update filtering (BMUF; Chen & Huo, ICASSP 2016).

    Args:
        block_momentum: ``η`` in ``[0, 1)``. Default ``None``: ``1 − 1/N`` for
            ``N`` workers, as the paper recommends. ``0`` with
            ``block_lr=1`` is plain averaging.
        block_lr: ``ζ``, the block learning rate, in ``(0, inf)``. Default 1.
        nesterov: Send the look-ahead ``w + η·Δ`` to the replicas (the
            paper's Nesterov variant). Default False (classical).
    """

    block_momentum: Optional[float] = None
    block_lr: float = 1.0
    nesterov: bool = False

    def __post_init__(self) -> None:
        if self.block_momentum is not None:
            _check_float("BlockMomentum", "block_momentum", self.block_momentum, 0.0, 1.0, high_open=True)
            object.__setattr__(self, "block_momentum", float(self.block_momentum))  # numpy scalars → float
        _check_float("BlockMomentum", "block_lr", self.block_lr, 0.0, float("inf"), high_open=True)
        if self.block_lr == 0:
            raise ConfigurationError(
                f"The 'block_lr' parameter of BlockMomentum must be > 0. Got {self.block_lr!r} instead."
            )
        if not isinstance(self.nesterov, bool):
            raise ConfigurationError(
                f"The 'nesterov' parameter of BlockMomentum must be a bool. Got {self.nesterov!r} instead."
            )
        object.__setattr__(self, "block_lr", float(self.block_lr))

    @property
    def name(self) -> str:  # type: ignore[override]
        return "bmuf_nesterov" if self.nesterov else "bmuf"

    def resolve(self, num_workers: int) -> "BlockMomentum":
        if self.block_momentum is not None:
            return self
        return BlockMomentum(1.0 - 1.0 / num_workers, self.block_lr, self.nesterov)

    def init_state(self, weights, trainable) -> State:
        return {"delta": _buffers(weights, trainable)}

    def to_send(self, weights, state, trainable) -> List[np.ndarray]:
        if not self.nesterov:
            return list(weights)
        eta = self._eta()
        deltas = iter(state["delta"])
        return [(w + eta * next(deltas)).astype(w.dtype) if t else w for w, t in zip(weights, trainable)]

    def apply(self, weights, sent, average, state, trainable, learning_rate) -> List[np.ndarray]:
        eta, zeta = self._eta(), self.block_lr
        out, deltas, k = [], state["delta"], 0
        for w, s, a, t in zip(weights, sent, average, trainable):
            if t:
                d = deltas[k]
                d *= eta
                d += zeta * (np.asarray(a, np.float64) - s)
                out.append((w + d).astype(w.dtype))
                k += 1
            else:
                out.append(np.asarray(a).astype(w.dtype, copy=False))
        return out

    def _eta(self) -> float:
        if self.block_momentum is None:
            raise RuntimeError("BlockMomentum.resolve(num_workers) must be called before use.")
        return self.block_momentum

    def describe(self) -> Dict[str, Any]:
        return {"name": self.name, **asdict(self)}


@dataclass(frozen=True)
class SlowMo(UpdateRule):
    """Slow momentum (SlowMo; Wang, Tantia, Ballas & Rabbat, ICLR 2020).

    Args:
        slow_momentum: ``β`` in ``[0, 1)``. Default 0.5 (the paper finds
            0.4–0.8 works well for ``α = 1``).
        slow_lr: ``α``, the slow learning rate, in ``(0, inf)``. Default 1.

    ``α = 1, β = 0`` is plain averaging; at a constant learning rate
    ``SlowMo(β, α)`` equals ``BlockMomentum(β, α)``.
    """

    slow_momentum: float = 0.5
    slow_lr: float = 1.0
    name = "slowmo"

    def __post_init__(self) -> None:
        _check_momentum_and_lr(self, "slow_momentum", "slow_lr")

    def init_state(self, weights, trainable) -> State:
        return {"u": _buffers(weights, trainable)}

    def apply(self, weights, sent, average, state, trainable, learning_rate) -> List[np.ndarray]:
        if not learning_rate > 0:
            raise ConfigurationError(
                f"SlowMo needs the optimizer's learning rate to be > 0. Got {learning_rate!r}."
            )
        beta, alpha, gamma = self.slow_momentum, self.slow_lr, float(learning_rate)
        out, buffers, k = [], state["u"], 0
        for w, s, a, t in zip(weights, sent, average, trainable):
            if t:
                u = buffers[k]
                u *= beta
                u += (np.asarray(s, np.float64) - a) / gamma
                out.append((w - (alpha * gamma) * u).astype(w.dtype))
                k += 1
            else:
                out.append(np.asarray(a).astype(w.dtype, copy=False))
        return out

    def describe(self) -> Dict[str, Any]:
        return {"name": self.name, **asdict(self)}


@dataclass(frozen=True)
class DiLoCo(UpdateRule):
    """DiLoCo's outer optimizer (Douillard et al. 2023): SGD with Nesterov momentum on the outer gradient.

    With the outer gradient ``g = sent − w̄`` (what the round's average moved
    the weights, negated), ``v ← μ·v + g`` and ``w ← w − lr·(g + μ·v)``:
    ``torch.optim.SGD(lr, momentum=μ, nesterov=True)``'s step. The recipe
    around it (README, "DiLoCo"): an inner AdamW, ``optimizer_state="local"``
    (each worker keeps its own moments), long rounds (hundreds of inner
    steps in the paper).

    Args:
        outer_lr: ``lr`` in ``(0, inf)``. Default 0.7, the paper's.
        outer_momentum: ``μ`` in ``[0, 1)``. Default 0.9, the paper's.
    """

    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    name = "diloco"

    def __post_init__(self) -> None:
        _check_momentum_and_lr(self, "outer_momentum", "outer_lr")

    def init_state(self, weights, trainable) -> State:
        return {"v": _buffers(weights, trainable)}

    def apply(self, weights, sent, average, state, trainable, learning_rate) -> List[np.ndarray]:
        lr, mu = self.outer_lr, self.outer_momentum
        out, buffers, k = [], state["v"], 0
        for w, s, a, t in zip(weights, sent, average, trainable):
            if t:
                g = np.asarray(s, np.float64) - a
                v = buffers[k]
                v *= mu
                v += g
                out.append((w - lr * (g + mu * v)).astype(w.dtype))
                k += 1
            else:
                out.append(np.asarray(a).astype(w.dtype, copy=False))
        return out

    def describe(self) -> Dict[str, Any]:
        return {"name": self.name, **asdict(self)}


def as_update_rule(value: Any) -> UpdateRule:
    """The rule for an ``update_rule`` argument: ``None``, a name or an :class:`UpdateRule`.

    Names: ``"average"``, ``"bmuf"``, ``"bmuf_nesterov"`` (defaults of
    :class:`BlockMomentum`), ``"slowmo"`` (defaults of :class:`SlowMo`),
    ``"diloco"`` (defaults of :class:`DiLoCo`).

    Raises:
        ConfigurationError: anything else.
    """
    if value is None or value == "average":
        return PlainAveraging()
    if isinstance(value, UpdateRule):
        return value
    if value == "bmuf":
        return BlockMomentum()
    if value == "bmuf_nesterov":
        return BlockMomentum(nesterov=True)
    if value == "slowmo":
        return SlowMo()
    if value == "diloco":
        return DiLoCo()
    raise ConfigurationError(
        "The 'update_rule' parameter must be None, one of "
        f"{', '.join(repr(n) for n in RULE_NAMES)}, or an UpdateRule such as "
        f"BlockMomentum(...), SlowMo(...) or DiLoCo(...). Got {value!r} instead."
    )


def rule_from_name(name: Any, momentum: Optional[float] = None, lr: float = 1.0) -> UpdateRule:
    """A rule from a name and its two numbers (the Spark ML layer's flat params).

    Args:
        name: ``"average"``, ``"bmuf"``, ``"bmuf_nesterov"`` or ``"slowmo"``.
        momentum: BMUF's ``η`` (``None``: ``1 − 1/N``) or SlowMo's ``β``
            (``None``: 0.5). Must be ``None`` for ``"average"``.
        lr: BMUF's ``ζ`` or SlowMo's ``α``. Default 1.
    """
    if name in ("bmuf", "bmuf_nesterov"):
        return BlockMomentum(momentum, lr, nesterov=name == "bmuf_nesterov")
    if name == "slowmo":
        return SlowMo(0.5 if momentum is None else momentum, lr)
    if name == "diloco":  # the flat block_lr's default (1.0) stands for DiLoCo's own, 0.7
        return DiLoCo(0.7 if lr == 1.0 else lr, 0.9 if momentum is None else momentum)
    rule = as_update_rule(name)
    if momentum is not None or lr != 1.0:
        raise ConfigurationError(
            f"The 'block_momentum' and 'block_lr' parameters apply to the block-momentum rules "
            f"('bmuf', 'bmuf_nesterov', 'slowmo'), not to update_rule={name!r}. "
            f"Got block_momentum={momentum!r}, block_lr={lr!r}."
        )
    return rule

class RuleState:
    """The update rule's state (e.g. BMUF's ``Δ``) and what it belongs to; carried across a trainer's fits."""

    def __init__(self) -> None:
        self.state: Optional[Dict[str, List[np.ndarray]]] = None
        self.key: Optional[Dict[str, Any]] = None

    @staticmethod
    def key_of(rule: UpdateRule, model) -> Dict[str, Any]:
        """What a rule's state belongs to: the rule and the trainable weights' shapes."""
        shapes = [list(w.shape) for w in model.trainable_weights]
        return {**rule.describe(), "trainable_shapes": shapes, "mask": trainable_mask(model)}

    def ensure(self, rule: UpdateRule, model) -> None:
        """Creates the rule's state unless this holds one for the same rule and weights."""
        key = self.key_of(rule, model)
        if self.state is None or self.key != key:
            self.state = rule.init_state(model.get_weights(), trainable_mask(model))
            self.key = key

    def restore(self, state: Dict[str, List[np.ndarray]], rule: UpdateRule, model) -> None:
        """Takes a checkpoint's rule state for ``rule`` on ``model``."""
        self.state = state
        self.key = self.key_of(rule, model)
