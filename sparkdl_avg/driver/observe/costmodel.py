"""The cost model of an epoch: whether parameter averaging beats one process, from measured constants.

This module owns the arithmetic and none of the measuring: pure functions of numbers and round records (no Spark, no
Keras, no trainer), shared by :func:`sparkdl_avg.advise` and ``fit``'s slow warning.

* :class:`CostModel`: an epoch's time with ``W`` workers and averaging frequency ``k``, and one process's, from one
  worker's time per minibatch and a round's fixed cost, interpolated between measured worker counts (extrapolated
  beyond, marked so).
* :func:`predict` and :func:`recommend`: the rows of a prediction table and the answer in words (within the cluster's
  task slots), for :func:`sparkdl_avg.advise` (:mod:`sparkdl_avg.driver.api.advisor` measures the constants).
* :func:`is_cold` and :func:`steady_costs`: which round records are steady state, and the constants read from them.
* :func:`slower_than_one_process` and :data:`WARM_ROUNDS`: ``fit``'s warning (``slow_warning``) that a fit is slower
  than one process would be, from the fit's own rounds.

With ``W`` workers, batch ``B``, averaging frequency ``k`` and ``D`` examples, each worker trains ``S = D // (W·B)``
minibatches an epoch in ``R = ⌈S/k⌉`` rounds, and

    epoch(W, k) = S · t_step(W) + R · fixed(W)
    one process = (D / B) · t_single

``t_step`` is one worker's compute and loading per minibatch, ``fixed`` the rest of a round (launching the job, moving
the state, aggregating, the update). Both are read from steady rounds only (:func:`is_cold`). The derivation, and how
well it predicts real fits, are in docs/guides/advise.md and docs/benchmarks.md.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...errors import DataError

WARM_ROUNDS = 3  #: steady rounds ``fit``'s slow warning waits for (until the fit's last epoch)


@dataclass(frozen=True)
class CostModel:
    """Epoch time of parameter averaging and of one process, from measured constants.

    Attributes:
        t_single: One process's time per minibatch of ``batch_size`` (s): ``keras.Model.fit`` on the driver, the best
            of plain and ``steps_per_execution``.
        t_step: Worker count → one worker's compute and loading time per minibatch (s).
        fixed: Worker count → a round's time besides the slowest worker's compute and loading (s): the job, the state
            out and the sums back, the update.
        measured_workers: The largest worker count measured; beyond it the prediction is an extrapolation.
    """

    t_single: float
    t_step: Dict[int, float]
    fixed: Dict[int, float]

    @property
    def measured_workers(self) -> int:
        return max(self.t_step)

    def step_s(self, workers: int) -> float:
        """One worker's time per minibatch at ``workers`` (constant beyond the largest measured count)."""
        return _interpolate(self.t_step, workers, extend=False)

    def fixed_s(self, workers: int) -> float:
        """A round's fixed cost at ``workers`` (the last measured slope beyond, never below the largest)."""
        return _interpolate(self.fixed, workers, extend=True)

    def epoch_s(self, num_examples: int, workers: int, batch_size: int, k: int) -> float:
        """Predicted time of one epoch with ``workers`` and averaging frequency ``k``; ``inf`` if no round fits."""
        steps = num_examples // (workers * batch_size)
        if steps == 0:
            return math.inf
        return steps * self.step_s(workers) + math.ceil(steps / min(k, steps)) * self.fixed_s(workers)

    def single_epoch_s(self, num_examples: int, batch_size: int) -> float:
        """Predicted time of one epoch of ``keras.Model.fit`` in one process."""
        return num_examples / batch_size * self.t_single


def _interpolate(points: Dict[int, float], x: int, extend: bool) -> float:
    xs = sorted(points)
    if x <= xs[0]:
        return points[xs[0]]
    for lo, hi in zip(xs, xs[1:]):
        if x <= hi:
            return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)
    if not extend or len(xs) == 1:
        return points[xs[-1]]
    lo, hi = xs[-2], xs[-1]
    slope = max(0.0, (points[hi] - points[lo]) / (hi - lo))
    return points[hi] + slope * (x - hi)


def predict(cost: CostModel, num_examples: int, batch_size: int, epochs: int, one_off_s: float,
            workers: Sequence[int], frequencies: Sequence[int]) -> List[Dict[str, Any]]:
    """The rows of :attr:`sparkdl_avg.driver.api.advisor.Advice.rows` for ``workers`` × ``frequencies`` (one process first)."""
    single = cost.single_epoch_s(num_examples, batch_size)
    rows = [dict(workers=1, averaging_frequency=None, epoch_s=single, total_s=single * epochs, speedup=1.0,
                 efficiency=1.0, extrapolated=False)]
    for w in workers:
        steps = num_examples // (w * batch_size)
        if steps == 0:
            continue
        for k in sorted({min(k, steps) for k in frequencies}):
            epoch = cost.epoch_s(num_examples, w, batch_size, k)
            total = one_off_s + epochs * epoch
            rows.append(dict(workers=w, averaging_frequency=k, epoch_s=epoch, total_s=total,
                             speedup=single * epochs / total, efficiency=steps * cost.step_s(w) / epoch,
                             extrapolated=w > cost.measured_workers))
    return rows


def recommend(rows: List[Dict[str, Any]], one_off_s: float, epochs: int,
              slots: Optional[int] = None) -> Tuple[str, Dict[str, Any]]:
    """The advice in words and the recommended row, from the prediction rows.

    Among the measured worker counts within ``slots`` (the cluster's task slots, its default parallelism; ``None``: no
    limit), the fastest total wins; its averaging frequency is the smallest within 10% of that worker count's fastest
    (more frequent averaging trains closer to one process). When no such row beats one process, the answer is to stay,
    with the extrapolated row that might pay if there is one: beyond ``slots``, said to be a projection for a bigger
    cluster.
    """
    single = rows[0]
    measured = [r for r in rows[1:] if not r["extrapolated"] and (slots is None or r["workers"] <= slots)]
    if not measured:
        raise DataError("No worker count could train one round on this data; use one process (keras.Model.fit).")
    fastest = min(measured, key=lambda r: r["total_s"])
    if fastest["total_s"] >= single["total_s"]:
        two = min((r for r in measured if r["workers"] == fastest["workers"]), key=lambda r: r["epoch_s"])
        beyond = [r for r in rows[1:] if r["extrapolated"] and r["total_s"] < single["total_s"]]
        hint = ""
        if beyond:
            far = min(beyond, key=lambda r: r["total_s"])
            if slots is not None and far["workers"] > slots:
                hint = (f" Only a bigger cluster might pay (this one has {slots} task slots): "
                        f"{far['workers']} workers at averaging_frequency={far['averaging_frequency']} are "
                        f"projected, by extrapolation, to {far['speedup']:.1f}x.")
            else:
                hint = (f" More workers than measured might pay: {far['workers']} workers at averaging_frequency="
                        f"{far['averaging_frequency']} are extrapolated to {far['speedup']:.1f}x.")
        return (
            f"Stay on one machine: one epoch takes {_s(single['epoch_s'])} here with keras.Model.fit; on "
            f"{two['workers']} workers it would take {_s(two['epoch_s'])}, plus {_s(one_off_s)} of start-up."
            + hint,
            single,
        )
    same = [r for r in measured if r["workers"] == fastest["workers"]]
    best_epoch = min(r["epoch_s"] for r in same)
    pick = min((r for r in same if r["epoch_s"] <= 1.1 * best_epoch), key=lambda r: r["averaging_frequency"])
    text = (
        f"Use {pick['workers']} workers with averaging_frequency >= {pick['averaging_frequency']} "
        f"(≈ {pick['efficiency']:.0%} efficiency): {epochs} epoch{'s' if epochs != 1 else ''} in "
        f"{_s(pick['total_s'])} including {_s(one_off_s)} of start-up, against {_s(single['total_s'])} in one "
        f"process ({pick['speedup']:.1f}x)."
    )
    if pick["averaging_frequency"] >= 32:
        text += " Consider update_rule='bmuf' to keep accuracy at that averaging frequency."
    return text, pick


def _s(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.0f} s"


# ------------------------------------------------------------------ steady rounds, and fit's warning


def is_cold(record) -> bool:
    """Whether a round record includes one-off work: a worker built its replica or traced its step function.

    Such a round is not steady state: the build lands in the fixed cost, the trace and the traced function's first run
    (several times a later run) in the compute, seconds that a median over a few rounds would take for compute. A fit's
    first round is cold, and often its second too, where Spark hands the round to another pair of Python workers.
    """
    if getattr(record, "replicas_built", 0):
        return True
    return any(getattr(w, "replica_built", False) or getattr(w, "traced", False)
               for w in getattr(record, "workers", None) or ())


def steady_costs(records) -> Tuple[float, float, int]:
    """``(t_step, fixed, rounds)``: one worker's seconds per minibatch and a round's fixed cost, from ``records``.

    Medians over the steady rounds (not :func:`is_cold`): ``t_step`` of (slowest worker's compute + loading) / k,
    ``fixed`` of (wall time − that); ``rounds`` is how many. With none, over the cold rounds with the measured build and
    trace seconds taken out (``rounds`` 0): an upper bound, as the traced function's first run and a new Python worker's
    start remain in it.
    """
    if not records:
        raise ValueError("no round records")
    warm = [r for r in records if not is_cold(r)]
    if warm:
        return (statistics.median((r.compute_max_s + r.load_max_s) / r.averaging_frequency for r in warm),
                statistics.median(max(0.0, r.wall_s - r.compute_max_s - r.load_max_s) for r in warm), len(warm))

    def compute(r):
        workers = getattr(r, "workers", None) or ()
        return max((w.compute_s - getattr(w, "trace_s", 0.0) for w in workers), default=r.compute_max_s)

    def built(r):
        return max((getattr(w, "build_s", 0.0) for w in getattr(r, "workers", None) or ()), default=0.0)

    return (statistics.median((compute(r) + r.load_max_s) / r.averaging_frequency for r in records),
            statistics.median(max(0.0, r.wall_s - r.compute_max_s - r.load_max_s - built(r)) for r in records), 0)


def slower_than_one_process(records, num_examples: int, num_workers: int, batch_size: int) -> Optional[str]:
    """The warning ``fit`` gives when one process would have been faster, else ``None``.

    ``records``: the fit's round records so far. Only steady rounds count (:func:`steady_costs`): without one, no
    warning. One process is credited with one worker's time per minibatch (it has at least one worker's cores), so the
    comparison errs towards distributing.
    """
    steps = num_examples // (num_workers * batch_size)
    if not records or steps < 1:  # (no epoch of num_workers workers to compare)
        return None
    t_step, fixed, rounds = steady_costs(records)
    if not rounds:
        return None
    k = max(r.averaging_frequency for r in records)
    cost = CostModel(t_single=t_step, t_step={num_workers: t_step}, fixed={num_workers: fixed})
    epoch = cost.epoch_s(num_examples, num_workers, batch_size, k)
    single = cost.single_epoch_s(num_examples, batch_size)
    if not epoch > single:
        return None
    per_epoch = math.ceil(steps / min(k, steps))
    overhead = f"{per_epoch} rounds'" if per_epoch != 1 else "1 round's"
    if k < steps:
        advice = (f"Raise averaging_frequency (now {k}; up to the {steps} minibatches of a worker's epoch), "
                  "train with keras.Model.fit, or measure with sparkdl_avg.advise(model, data).")
    else:  # one round per epoch already: a larger k is cut to the epoch, so naming it would advise the impossible
        advice = (f"Each round already spans a worker's whole epoch ({steps} minibatches, as many as "
                  "averaging_frequency can reach), so the data is too small for a round's fixed cost: train "
                  "with keras.Model.fit, or train on more data per epoch.")
    split = round_split(records)
    comm = split and communication_advice(split[0], split[1], k, max_k=steps, overlapping=overlapping(records))
    if comm:
        advice += " " + comm
    return (
        f"This fit is slower than one process would be: an epoch takes {_s(epoch)} on {num_workers} workers "
        f"({_s(steps * t_step)} computing, {_s(per_epoch * fixed)} in "
        f"{overhead} overhead), while one process at one worker's speed "
        f"({t_step * 1000:.1f} ms per minibatch, the median of {rounds} round{'s' if rounds != 1 else ''} without "
        f"replica builds or tracing) would take {_s(single)}. {advice} Silence this with slow_warning=False."
    )


# ------------------------------------------------------------------ communication: overlap, or a larger k

#: Communication at least this share of a round before overlapped rounds or a larger ``k`` are advised. Hiding
#: it then saves at least this share of the round: ``1 / (1 - 0.2) = 1.25x`` at the threshold.
COMMUNICATION_SHARE = 0.2

#: Compute below this fraction of a round's communication: a larger ``k`` is advised first (an overlapped round
#: costs ``max(compute, communication)``, so overlap alone would still wait on communication for most of it).
LARGER_K_BELOW = 0.5


def round_split(records) -> Optional[Tuple[float, float, int, int]]:
    """``(compute_s, communication_s, k, rounds)`` of a synchronous round, medians over the steady ones.

    ``compute_s``: the slowest worker's compute and loading; ``communication_s``: the rest of the round's wall time (the
    state going out, the job's start, the sums' way back and their reduction, the update), what overlapped rounds hide
    behind the next round's compute. ``None`` without a steady round (:func:`is_cold`) or with chunk records
    (stale/async rounds overlap already).
    """
    warm = [r for r in records if not is_cold(r) and getattr(r, "chunk", None) is None]
    if not warm:
        return None
    compute = statistics.median(r.compute_max_s + r.load_max_s for r in warm)
    wall = statistics.median(r.wall_s for r in warm)
    return compute, max(0.0, wall - compute), max(r.averaging_frequency for r in warm), len(warm)


_OVERLAP = 'overlap_rounds=True and optimizer_state="local"'  # overlap refuses the default "average"

def overlapping(records) -> bool:
    """Whether the records are of a fit with ``overlap_rounds`` on (its advice then names only a larger ``k``)."""
    return any(getattr(r, "overlapped", False) for r in records)


def communication_advice(compute_s: float, comm_s: float, k: int, max_k: Optional[int] = None,
                         overlapping: bool = False) -> Optional[str]:
    """When overlapped rounds (``overlap_rounds=True``) or a larger ``k`` would pay, in words with the gain; else ``None``.

    The rule (reasoning in docs/benchmarks/network_auto.md): a round costs ``compute + comm``; an overlapped one
    ``max(compute, comm)``, as the sums of round t travel while round t+1 computes. Nothing is advised while ``comm`` is
    under :data:`COMMUNICATION_SHARE` of the round. With ``compute >= LARGER_K_BELOW · comm`` overlap is advised, with
    the gain ``(compute + comm) / max(compute, comm)``. With less compute than that a larger ``k`` is advised first:
    ``k · ⌈comm / compute⌉`` (at most ``max_k``, a worker's minibatches in an epoch) brings compute up to the
    communication, cutting the communication per minibatch by that factor; overlap then hides the rest. ``compute_s``,
    ``comm_s``: one round's seconds at averaging frequency ``k``. ``overlapping``: the fit already runs
    ``overlap_rounds``; only a larger ``k`` is then advised. The overlapped round's ``max(compute, comm)`` is what was
    measured, across hosts and on one host (docs/benchmarks/overlap.md).
    """
    round_s = compute_s + comm_s
    if round_s <= 0 or comm_s < COMMUNICATION_SHARE * round_s:
        return None
    if overlapping and compute_s >= LARGER_K_BELOW * comm_s:
        return None
    share = comm_s / round_s
    measured = (f"Communication is {share:.0%} of a round: {_s(comm_s)} (the state going out, the job, the sums "
                f"back, the update) against {_s(compute_s)} of the slowest worker's compute at "
                f"k = {k}.")
    if compute_s >= LARGER_K_BELOW * comm_s:
        overlapped = max(compute_s, comm_s)
        return (f"{measured} Overlapped rounds ({_OVERLAP}) would hide it behind the next round's "
                f"compute: about {_s(overlapped)} a round instead of {_s(round_s)} "
                f"({round_s / overlapped:.1f}x the throughput).")
    factor = math.ceil(comm_s / max(compute_s, 1e-9))
    bigger = k * factor if max_k is None else min(k * factor, max_k)
    if bigger <= k:
        if overlapping:
            return None
        overlapped = max(compute_s, comm_s)
        return (f"{measured} A round already spans a worker's epoch, so k cannot grow; overlapped rounds "
                f"({_OVERLAP}) would make a round about {_s(overlapped)} instead of {_s(round_s)} "
                f"({round_s / overlapped:.1f}x).")
    grown = compute_s * bigger / k  # one round's compute at the larger k
    now, then = round_s / k, (grown + comm_s) / bigger  # seconds per minibatch
    hidden = max(grown, comm_s) / bigger
    larger_k = (f"{measured} A larger k pays: raising averaging_frequency to {bigger} would spend "
                f"{comm_s / bigger * 1000:.1f} ms per minibatch communicating instead of "
                f"{comm_s / k * 1000:.1f} ms, about {now / then:.1f}x the throughput")
    if overlapping:
        return larger_k + "."
    return f"{larger_k}; with {_OVERLAP} there too, about {now / hidden:.1f}x."


__all__ = ["COMMUNICATION_SHARE", "CostModel", "LARGER_K_BELOW", "WARM_ROUNDS", "communication_advice", "is_cold", "overlapping",
           "predict", "recommend", "round_split", "slower_than_one_process", "steady_costs"]
