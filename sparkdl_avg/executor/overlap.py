"""``overlap_rounds`` on the executors: a worker's eager start and the own term it keeps for its next round.

Worker ``i`` keeps ``e_i = δ_i/N`` — its delta of the round it just trained
(its end weights minus its own start), divided by the round's workers — in a
file chained from round to round like ``optimizer_state="local"``'s states
(:class:`OwnTerms`; the driver's book :class:`~sparkdl_avg.driver.fit.overlap.OwnDeltaLedger`). Its next round
starts from the sent global weights plus ``e_i`` (:func:`eager_start`) and
returns its end weights minus ``e_i`` (:func:`eager_finish`), so the
replicas' mean is the sent weights plus the round's averaged delta, which
the driver applies one round late
(:class:`~sparkdl_avg.driver.algorithms.overlap.OneRoundLate`). A worker
with no file (the fit's first round, one an elastic round adds) has a zero
own term; a retried task reads the same file and writes the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..shared.wire.kept import WorkerRound
from ..shared.wire.local_state import LocalStateFiles


def _floating(w) -> bool:
    return np.asarray(w).dtype.kind == "f"


def eager_start(files, worker: int, sent: Sequence[np.ndarray]) -> Tuple[List[np.ndarray], Optional[List[np.ndarray]]]:
    """The weights worker ``worker`` starts from (``sent + e``) and its own term ``e`` (``None``: it has none)."""
    own, _ = files.load(worker, sent)
    if own is None:
        return list(sent), None
    return [np.asarray(s) + e if _floating(s) else np.asarray(s) for s, e in zip(sent, own)], own


def eager_finish(files, worker: int, num_workers: int, sent: Sequence[np.ndarray], own: Optional[Sequence[np.ndarray]],
                 end: List[np.ndarray], finite: bool) -> List[np.ndarray]:
    """What the worker returns (``end − e``), after saving its next own term ``(end − e − sent)/N``.

    ``end``: the replica's weights after training (modified in place where
    float). A replica that went non-finite keeps a zero own term (its delta
    is left out of the average, so nothing stands in for it).
    """
    if own is not None:
        for i, (w, e) in enumerate(zip(end, own)):
            if _floating(w):
                end[i] = np.subtract(w, e, out=w) if isinstance(w, np.ndarray) and w.flags.writeable else w - e
    n = float(num_workers)
    keep = [((np.asarray(w) - s) / np.asarray(n, np.asarray(w).dtype)) if finite and _floating(w)
            else np.zeros_like(np.asarray(w)) for w, s in zip(end, sent)]
    files.save(worker, keep)
    return end


@dataclass(frozen=True)
class OwnTerms(LocalStateFiles):
    """Where a round's workers read and write their own terms (kept as ``optimizer_state="local"``'s states are)."""

    what = "own term (overlap_rounds)"

    def begin(self, w: WorkerRound) -> Optional[List[np.ndarray]]:
        w.start, own = eager_start(self, w.worker, w.sent)
        return own

    def end(self, w: WorkerRound, begun: Optional[List[np.ndarray]]) -> None:
        w.end = eager_finish(self, w.worker, w.num_workers, w.sent, begun, list(w.end), w.finite)
