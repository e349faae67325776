"""Error feedback's residuals over one fit, on the driver: which files each round reads and writes, and which it drops.

Under ``update_compression`` with error feedback every worker keeps what its
codec dropped (its residual) in a file under the fit's staging directory
(:class:`~sparkdl_avg.shared.wire.delta_sums.FeedbackFiles`, the executors'
half). :class:`ResidualLedger` (on :class:`~sparkdl_avg.driver.transport.chains.RoundChains`'
bookkeeping) tells each round's task which round's residuals to add: round
``g`` reads ``g - lag``'s and writes its own. ``lag`` is 1 in synchronous
training; with ``synchronization="stale"`` and staleness ``s`` it is
``s + 1`` (:func:`lag_of`), the newest round whose every chunk has surely
returned when a chunk of round ``g`` starts (the bound), so the choice never
depends on timing and ``reproducible=True`` stays bitwise reproducible:
``s + 1`` interleaved chains per worker, each losing nothing over rounds. A
checkpoint's entries are tagged with the ``update_compression`` (the
residuals' format).
"""

from __future__ import annotations

from typing import Iterable, Optional

from ...shared.files.fs import join
from ...shared.wire.delta_sums import FeedbackFiles
from .chains import KEPT, RoundChains, name_of


@KEPT.register
class ResidualLedger(RoundChains):
    """The residual files of one fit's rounds (thread-safe).

    Args:
        directory: Where the residual files live (under the fit's staging directory).
        num_workers: Workers per round (``N``): a round is complete once all wrote their residual.
        lag: Rounds between a residual's writer and its reader (:func:`lag_of`).
        compression: ``update_compression``: the residuals' format, named in what a checkpoint carries.
    """

    name = "feedback"

    pipelined = False  # a residual is read by the round after the one that wrote it, which must have ended

    def __init__(self, directory: str, num_workers: int, lag: int, compression: str) -> None:
        super().__init__(directory, num_workers, lag, compression)

    @classmethod
    def for_fit(cls, fit) -> Optional["ResidualLedger"]:
        """Under ``update_compression`` with error feedback: residual files beside the transport's."""
        config = fit.config
        if not any(config.feedback):
            return None
        # under sync_fragments a residual is its fragment's: read again F rounds later, at the fragment's next turn
        lag = config.sync_fragments if config.sync_fragments > 1 else lag_of(config.synchronization, config.staleness)
        return cls(join(fit.exchange, "feedback"), fit.plan.num_workers, lag, config.update_compression)

    @property
    def compression(self) -> str:
        """The residuals' format (``update_compression``)."""
        return self.tag

    def for_round(self, epoch: int, rnd: int, workers: Iterable[int], share: bool = False,
                  ahead: bool = False) -> FeedbackFiles:
        """What round ``rnd`` of ``epoch``'s tasks for ``workers`` read and write.

        An epoch's first round also names every worker whose residual it reads (``peers``): the ``"threshold"``
        codec starts its workers from their thresholds' mean there (Deeplearning4j averages them at an epoch's end).
        """
        g, read, fresh = self._round(epoch, rnd, workers, shared=True)
        with self._lock:
            peers = tuple(sorted(self._written.get(g - self.lag, ()))) if rnd == 0 and read is not None else ()
        return FeedbackFiles(self.directory, read, name_of(g), fresh, peers)

    def dropped(self, epoch: int, rnd: int) -> int:
        """Residuals that round ``rnd`` of ``epoch`` leaves unread: those of workers its elastic plan no longer has.

        Such a worker's residual (what its codec rounded off in its last
        round) is dropped: it belonged to a replica that no longer exists,
        and added to another worker's delta it would count twice when that
        worker's own residual is added too. Counted in the round's record.
        """
        with self._lock:
            g = self._seq.get((epoch, rnd))
            if g is None:
                return 0
            return sum(1 for w in self._written.get(g - self.lag, ()) if w >= self._size[g])


def lag_of(synchronization: str, staleness: Optional[int]) -> int:
    """Rounds between a residual's writer and its reader: 1 in sync, ``staleness + 1`` in stale."""
    return 1 if synchronization == "sync" else int(staleness) + 1
