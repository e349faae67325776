"""What ``state_transport="auto"`` learns from a fit's own rounds: the driver's link rate, and when to change path.

On hosts of their own, ``"auto"``'s first choice (:func:`.policy.auto_transport`)
assumes the driver's link runs at :data:`.policy.DEFAULT_NETWORK_RATE` unless
``network_rate`` says otherwise. This module reads what the rounds measured
instead and says when the other path would be cheaper:

* :func:`round_rate`: the driver link's effective rate (bytes/s) one round
  measured, from the bytes of sums its workers sent (``RoundRecord.sent_bytes``)
  and the seconds its aggregate phase took beyond the driver's own summing
  (``aggregate_s - driver_sum_s``), read through the path the round took:

  - *driver-bound* (Spark's tree, the Spark SQL round's ``"driver"``): all
    ``N`` workers' sums, ``N·S`` bytes, came in through the driver's link:
    ``rate = N·S / seconds``;
  - *sharded* (``"shuffle"``, ``"storage"``): ``(N-1)/N·S`` bytes crossed each
    worker's link (the slices' exchange), then ``S`` came in through the
    driver's (the summed slices), besides a second stage of fixed cost
    :data:`.policy.SHARDED_STAGE_S`:
    ``rate = (2 - 1/N)·S / (seconds - SHARDED_STAGE_S)``.

  The seconds include the job's own latency, so the rate is the link's
  *effective* rate for rounds of this size, not its line rate: what the
  choice between the paths needs.
* :func:`estimate_rate`: the median of the latest :data:`WINDOW` steady
  rounds' rates (one slow round, a garbage collection, does not move it).
* :func:`path_seconds`: the seconds each path would take to bring the sums
  back at that rate, by the model :func:`.policy.driver_bound_pays` decides
  with: driver-bound ``N·S/rate``, sharded ``SHARDED_STAGE_S + (2 - 1/N)·S/rate``.
* :class:`LinkChoice`: whether to switch, with hysteresis: the other path
  must be predicted cheaper by :data:`MARGIN` of the current path's seconds
  and at least :data:`MIN_SAVING_S`; the first switch needs :data:`MIN_ROUNDS`
  steady rounds on the first path, a later one :data:`SWITCH_EVERY` rounds
  after the last, and a path left before is predicted by the seconds it
  measured then (not by the rate), so the fit does not flip back and forth
  on the noise of one estimate. The fit loop asks between rounds, never during one
  (:class:`sparkdl_avg.driver.fit.hooks.TransportChoice`).
* The model weighs the sums' way back only; a round also sends the state out,
  which costs each path differently (on 10 Mbit/s hosts the Spark SQL round's
  rounds took 27.7 s against the tree's 12.6 s, while its sums came back
  sooner: docs/benchmarks/sparse_codecs.md). So a switch is checked against
  what it bought: once :data:`MIN_ROUNDS` steady rounds ran on the new path,
  if their time beyond compute (:func:`overhead`) exceeds the path left's by
  :data:`MARGIN` (and :data:`MIN_SAVING_S`), the fit goes back and stays there
  (:attr:`Switch.back`): the choice is never slower than the path it left for
  more than those rounds.

Learned only where ``"auto"`` chooses between the paths by the link
(:func:`learns`): a classic session on hosts of their own, ``aggregation``
``"auto"``, synchronous rounds, and no ``network_rate`` given; a user's
``network_rate`` wins over any estimate. The reasoning and a worked example:
docs/benchmarks/network_auto.md.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence

from ..config.options import AGGREGATIONS, parse_rate
from .policy import DEFAULT_NETWORK_RATE, SHARDED_STAGE_S, SPARK_TREE_BYTES

WINDOW = 5  #: the estimate is the median over at most this many of the latest steady rounds on the current path
MIN_ROUNDS = 3  #: steady rounds on the current path before a switch is considered
SWITCH_EVERY = 10  #: rounds at least between two switches (a fit switches back only on clear evidence)
MARGIN = 0.25  #: the other path must be predicted at least this share of the current path's seconds cheaper...
MIN_SAVING_S = 0.05  #: ...and at least this many seconds a round
_FLOOR_S = 1e-3  #: seconds below which a transfer is not told from zero (a rate is bytes over at least this)

#: The state transport ``"auto"`` takes for each path: Spark's tree (driver-bound) or the Spark SQL round, which
#: shards through the shuffle when its plan is given the measured rate (:func:`.policy.plan_aggregation`).
TRANSPORT_OF = {True: "spark", False: "sql"}


def learns(mode: str, network_rate, aggregation: str, synchronization: str, connect: bool, one_host: bool) -> bool:
    """Whether a fit's ``state_transport="auto"`` learns the link's rate from its rounds (see the module doc)."""
    return (mode == "auto" and network_rate is None and aggregation == "auto" and synchronization == "sync"
            and not connect and not one_host)


def assumed_rate() -> str:
    """The rate ``"auto"``'s first choice assumes without ``network_rate``, in words (``"1.00 Gbit/s"``)."""
    return _rate(parse_rate(DEFAULT_NETWORK_RATE))


def driver_bound(record) -> Optional[bool]:
    """Whether a round's sums came in through the driver's link (``False``: sharded; ``None``: neither, or unknown)."""
    if record.transport == "spark":
        return True
    if record.transport == "sql" and record.aggregation in AGGREGATIONS:
        return not AGGREGATIONS.get(record.aggregation).sharded
    return None  # "files": a shared file system, no path through the driver's link to measure


def round_rate(record) -> Optional[float]:
    """The driver link's effective rate (bytes/s) one round's record measured; ``None`` where it cannot say."""
    bound = driver_bound(record)
    n = record.num_workers
    if bound is None or not record.sent_bytes or not n or record.chunk is not None:
        return None
    seconds = record.aggregate_s - record.driver_sum_s
    if bound:
        return record.sent_bytes / max(seconds, _FLOOR_S)
    return (2 - 1 / n) * record.sent_bytes / n / max(seconds - SHARDED_STAGE_S, _FLOOR_S)


def estimate_rate(records: Sequence, steady: Callable[[object], bool] = lambda r: True) -> Optional[tuple]:
    """``(rate, rounds)``: the median rate (bytes/s) of the latest :data:`WINDOW` ``steady`` records that say one.

    ``None`` when no record does.
    """
    rates = [rate for rate in (round_rate(r) for r in records if steady(r)) if rate is not None][-WINDOW:]
    if not rates:
        return None
    return statistics.median(rates), len(rates)


def overhead(records: Sequence, steady: Callable[[object], bool] = lambda r: True) -> Optional[tuple]:
    """``(seconds, rounds)``: the median time beyond compute (``wall_s - compute_max_s``: the state out, the job, the
    sums back, the update) of the latest :data:`WINDOW` ``steady`` records; ``None`` when there is none."""
    seconds = [r.wall_s - r.compute_max_s for r in records if steady(r)][-WINDOW:]
    return (statistics.median(seconds), len(seconds)) if seconds else None


def path_seconds(driver_path: bool, num_workers: int, nbytes: float, rate: float) -> float:
    """Seconds a round's sums take back at ``rate`` (bytes/s): ``N·S/rate`` driver-bound,
    ``SHARDED_STAGE_S + (2 - 1/N)·S/rate`` sharded (:func:`.policy.driver_bound_pays`).

    ``nbytes``: one worker's sums. A driver-bound round whose ``N`` sums exceed
    :data:`.policy.SPARK_TREE_BYTES` (which the driver holds at once) is ``inf``.
    """
    if driver_path:
        return num_workers * nbytes / rate if num_workers * nbytes <= SPARK_TREE_BYTES else float("inf")
    return SHARDED_STAGE_S + (2 - 1 / num_workers) * nbytes / rate


@dataclass(frozen=True)
class Switch:
    """A decision to change path: to ``transport`` (``"spark"`` or ``"sql"``) at ``rate`` bytes/s.

    ``rounds``: how many rounds the rate is the median of; ``nbytes``: one
    worker's sums; ``now_s``/``then_s``: the predicted seconds of the sums'
    way back on the current and the new path. ``back``: the switch undoes
    the one before it, which measured slower; ``now_s``/``then_s`` are then
    the rounds' measured seconds beyond compute on the current path and on the
    one it goes back to, and ``rate`` the rate the first switch used.
    """

    transport: str
    rate: float
    rounds: int
    num_workers: int
    nbytes: float
    now_s: float
    then_s: float
    back: bool = False

    def message(self, current: str, where: str, assumed: str) -> str:
        """The INFO line saying what was measured and what was chosen (``where``: the round it takes effect)."""
        if self.back:
            return (f"state_transport='auto': {self.rounds} round{'s' if self.rounds != 1 else ''} on {current!r} "
                    f"took {self.now_s:.2f} s beyond compute (the median), against {self.then_s:.2f} s on "
                    f"{self.transport!r} before the switch: going back to {self.transport!r} from {where}, for the "
                    "rest of the fit. Pass network_rate to fix the choice.")
        how = {"spark": "Spark's tree (every worker's sums through the driver's link)",
               "sql": "the Spark SQL round (sums sharded through the shuffle)"}
        return (f"state_transport='auto': the driver's link measured {_rate(self.rate)} (the median of "
                f"{self.rounds} round{'s' if self.rounds != 1 else ''}; {self.num_workers} workers' sums of "
                f"{_size(self.nbytes)} each), where the first choice assumed {assumed}: switching from "
                f"{current!r} to {self.transport!r}, {how[self.transport]}, from {where}, which should bring the "
                f"sums back in about {self.then_s:.2f} s a round instead of {self.now_s:.2f} s. Pass network_rate "
                "to fix the choice.")


def _rate(bytes_s: float) -> str:
    bits = bytes_s * 8
    if bits >= 1e9:
        return f"{bits / 1e9:.2f} Gbit/s"
    return f"{bits / 1e6:.0f} Mbit/s" if bits >= 1e7 else f"{bits / 1e3:.3g} kbit/s" if bits < 1e6 else \
        f"{bits / 1e6:.2g} Mbit/s"


def _size(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f} MB" if nbytes >= 1e5 else f"{nbytes / 1e3:.3g} kB"


class LinkChoice:
    """The hysteresis of ``"auto"``'s choice between the paths during one fit.

    Args:
        current: The transport the fit started with (``"spark"`` or ``"sql"``).
        steady: Which records count (not a round that built a replica or traced).
    """

    def __init__(self, current: str, steady: Callable[[object], bool]) -> None:
        self.current = current
        self.steady = steady
        self.switched_at: Optional[int] = None  # the fit's round count at the latest switch
        self.measured: Dict[str, float] = {}  # a path left -> the seconds its sums took back then (median)
        self.left: Optional[tuple] = None  # (path, its rounds' seconds beyond compute, the rate) of the latest switch
        self.settled = False  # a switch undone: the path stays for the rest of the fit

    def consider(self, records: Sequence, rounds_in_fit: int) -> Optional[Switch]:
        """A :class:`Switch` when the rounds so far (``records``, in order) say the other path is cheaper, or that
        the latest switch made rounds slower (:attr:`Switch.back`); else ``None``.

        Only the records on the current transport since the latest switch count.
        """
        if self.settled:
            return None
        mine = [r for r in records if r.transport == self.current and r.chunk is None]
        if self.switched_at is not None:
            mine = mine[len(mine) - min(len(mine), rounds_in_fit - self.switched_at):]
            back = self._undo(mine, rounds_in_fit)
            if back is not None or rounds_in_fit - self.switched_at < SWITCH_EVERY:
                return back
        found = estimate_rate(mine, self.steady)
        if found is None or found[1] < MIN_ROUNDS:
            return None
        rate, rounds = found
        last = mine[-1]
        bound = driver_bound(last)
        if bound is None or TRANSPORT_OF[not bound] == self.current:
            return None  # not a path "auto" chooses between (a pinned aggregation)
        n = last.num_workers
        nbytes = last.sent_bytes / n
        now = path_seconds(bound, n, nbytes, rate)
        # A path measured before is predicted by what it measured, not by the model: a sharded round's rate is
        # the small difference of two larger numbers (its seconds less the stage's), which must not send the fit
        # back to a path it left for being slow, and forth again (no flip-flop).
        then = self.measured.get(TRANSPORT_OF[not bound], path_seconds(not bound, n, nbytes, rate))
        if not then <= now - max(MARGIN * now, MIN_SAVING_S):
            return None
        self.measured[self.current] = now
        spent = overhead(mine, self.steady)
        self.left = (self.current, spent[0], rate) if spent is not None else None
        self.current, self.switched_at = TRANSPORT_OF[not bound], rounds_in_fit
        return Switch(self.current, rate, rounds, n, nbytes, now, then)

    def _undo(self, mine: Sequence, rounds_in_fit: int) -> Optional[Switch]:
        """The switch back when the rounds since the latest switch took longer beyond compute than the path left."""
        spent = overhead(mine, self.steady)
        if self.left is None or spent is None or spent[1] < MIN_ROUNDS:
            return None
        path, then, rate = self.left
        now, rounds = spent
        if not now > then + max(MARGIN * then, MIN_SAVING_S):
            return None
        last = mine[-1]
        self.current, self.switched_at, self.settled = path, rounds_in_fit, True
        return Switch(path, rate, rounds, last.num_workers, last.sent_bytes / last.num_workers, now, then, back=True)


__all__ = ["LinkChoice", "Switch", "assumed_rate", "driver_bound", "estimate_rate", "learns", "overhead", "path_seconds",
           "round_rate"]
