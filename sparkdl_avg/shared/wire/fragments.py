"""``sync_fragments``: the executors' half of fragment rounds (Streaming DiLoCo): own weights, adoption, what returns.

With ``sync_fragments=F > 1`` each worker keeps its own full weights from
round to round, in files kept as ``optimizer_state="local"`` keeps optimizer
variables (:class:`~sparkdl_avg.shared.wire.local_state.LocalStateFiles`: on the
worker's host on classic sessions, under the staging directory on Spark
Connect). A round's task (:class:`FragmentRound`, made by the driver's
:class:`~sparkdl_avg.driver.fit.fragments.Fragments`):

1. starts from the worker's own weights with the variables the previous round
   synchronised (``adopt``) replaced by the values the driver sent, which are
   their new global values; a worker with no own weights (the fit's first
   round, a worker an elastic round adds, a file lost with its host) starts
   from everything the driver sent, and its record says so when a file was lost;
2. trains as any round;
3. saves its full weights as its own (a replica that went non-finite keeps the
   weights it started from) and returns only the ``synced`` variables' sums or
   deltas: the round's fragment of the trainable variables and every
   non-trainable variable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .kept import Kept, WorkerRound
from .local_state import LocalStateFiles


@dataclass(frozen=True)
class WeightFiles(LocalStateFiles):
    """Where a round's workers read and write their own weights (``sync_fragments``); see :class:`LocalStateFiles`."""

    what = "own weights (sync_fragments)"


@dataclass(frozen=True)
class FragmentRound(Kept):
    """What one fragment round's workers do with their own weights (see the module docstring).

    Attributes:
        files: Where each worker's own weights are (:class:`WeightFiles`).
        adopt: Indices (into the model's weights) of the variables taken from the sent state over the
            worker's own: those the previous round synchronised. ``None``: all of them (the fit's first round).
        synced: Indices of the variables this round returns, ascending.
    """

    files: LocalStateFiles
    adopt: Optional[Tuple[int, ...]]
    synced: Tuple[int, ...]

    def start(self, worker: int, sent: Sequence[np.ndarray]) -> Tuple[List[np.ndarray], bool]:
        """Worker ``worker``'s weights to train from, and whether its own were lost (it restarts from ``sent``)."""
        own, restarted = self.files.load(worker, sent)
        if own is None or self.adopt is None:
            return list(sent), restarted
        for j in self.adopt:
            own[j] = sent[j]
        return own, restarted

    def save(self, worker: int, weights: Sequence[np.ndarray]) -> None:
        """Keeps ``weights`` as worker ``worker``'s own for its next round."""
        self.files.save(worker, weights)

    def pick(self, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        """The synced variables of a full list of weights, in order."""
        return [arrays[j] for j in self.synced]

    @property
    def host_local(self) -> bool:
        return self.files.host_local

    def begin(self, w: WorkerRound) -> None:
        w.start, lost = self.start(w.worker, w.sent)
        w.restarted = w.restarted or lost

    def end(self, w: WorkerRound, begun=None) -> None:
        """Keeps the worker's own weights; it returns the synced part only (and its delta is from that part)."""
        self.save(w.worker, w.end if w.finite else w.start)
        w.end, w.sent = self.pick(w.end), self.pick(w.sent)
