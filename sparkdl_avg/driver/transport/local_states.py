"""``optimizer_state="local"`` on the driver: which round's optimizer state each worker reads, where its task should run, what a checkpoint carries.

Each worker chains its own optimizer variables from round to round
(:mod:`sparkdl_avg.shared.wire.local_state`, the executors' half) as error
feedback chains residuals; :class:`LocalStateLedger` keeps the book on
:class:`~sparkdl_avg.driver.transport.chains.RoundChains`, with a lag of one
round and checkpoint entries tagged :data:`LOCAL_TAG`. Kept on the workers'
hosts (``host_local``), its files are under the shared directory only for
rounds the trainer marks ``share`` (a checkpoint may follow them), and it
tells the transport which host each worker's next task should run on
(:meth:`LocalStateLedger.places`).
"""

from __future__ import annotations

import logging
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ...shared.files.fs import join, write_atomically
from ...shared.wire.local_state import FIT_ALIVE, LocalStateFiles
from .chains import KEPT, RoundChains, name_of

logger = logging.getLogger("sparkdl_avg")

LOCAL_TAG = "local-optimizer"
"""The tag of ``optimizer_state="local"``'s files in a checkpoint (where error feedback's name their compression)."""


@KEPT.register
class LocalStateLedger(RoundChains):
    """The workers' own optimizer states over one fit's rounds (thread-safe).

    Args:
        directory: Where the shared files live (under the fit's staging directory).
        num_workers: Workers per round.
        host_local: Keep the states in files on the workers' hosts, their tasks placed there (classic
            sessions; see :mod:`sparkdl_avg.shared.wire.local_state`).
        tag, kind: The checkpoint entries' tag and the files' class; ``sync_fragments`` keeps each worker's own
            weights with this ledger (:mod:`sparkdl_avg.driver.fit.fragments`).
    """

    name = "local"

    def __init__(self, directory: str, num_workers: int, host_local: bool = False, tag: str = LOCAL_TAG,
                 kind: type = LocalStateFiles) -> None:
        super().__init__(directory, num_workers, 1, tag)
        self.host_local = host_local
        self.kind = kind  # the files' class: LocalStateFiles, or sync_fragments' WeightFiles (same format, own name)
        self._hosts: Dict[int, Tuple[str, ...]] = {}  # host_local: worker -> the names of the host it last ran on
        self._alive = False  # host_local: FIT_ALIVE written (before the first round's tasks)

    @classmethod
    def for_fit(cls, fit) -> Optional["LocalStateLedger"]:
        """Under ``optimizer_state="local"``: each worker's own optimizer state, beside the transport's files, kept
        on the workers' hosts where tasks can be placed there (classic sessions: a locality preference)."""
        if fit.config.optimizer_state != "local":
            return None
        return cls(join(fit.exchange, "local"), fit.plan.num_workers, host_local=fit.plan.engine.sc is not None)

    def for_round(self, epoch: int, rnd: int, workers: Iterable[int], share: bool = False,
                  ahead: bool = False) -> LocalStateFiles:
        """What round ``rnd`` of ``epoch``'s tasks for ``workers`` read and write.

        ``share``: with ``host_local``, the round also writes its files under the shared directory;
        ``ahead``: see :meth:`~sparkdl_avg.driver.transport.chains.RoundChains._round`.
        """
        if self.host_local and not self._alive:  # while it exists, other fits' tasks leave these hosts' files
            write_atomically(join(self.directory, FIT_ALIVE), b"")  # (shared/wire/local_state.py's sweep)
            self._alive = True
        g, read, fresh = self._round(epoch, rnd, workers, shared=share or not self.host_local, ahead=ahead)
        if self.host_local:
            return self.kind(self.directory, read, name_of(g), fresh, host_local=True, share=g in self._shared)
        return self.kind(self.directory, read, name_of(g), fresh)

    def done(self, epoch: int, rnd: int, workers: Iterable[int], records=()) -> None:
        """The round's files are written; ``records`` (its :class:`~sparkdl_avg.shared.wire.stats.WorkerRecord`\\ s)
        say where each worker ran, where its next task is placed."""
        super().done(epoch, rnd, workers)
        self.placed(records)

    def placed(self, records) -> None:
        """Records where the workers of ``records`` (:class:`~sparkdl_avg.shared.wire.stats.WorkerRecord`\\ s) ran."""
        with self._lock:
            for record in records:
                if record.host_names:
                    self._hosts[record.worker] = tuple(record.host_names)

    def places(self, workers: Sequence[int], live: Iterable[str]) -> Optional[List[Optional[str]]]:
        """The host each of ``workers``' tasks should run on: the one holding its state, if among ``live``.

        ``live``: the hosts of the session's live executors, as Spark names
        them. ``None`` where there is no choice to make: the states are not
        kept on hosts, or fewer than two hosts are live (one host's files are
        every task's).
        """
        live = set(live)
        if not self.host_local or len(live) < 2:
            return None
        with self._lock:
            return [next((name for name in self._hosts.get(w, ()) if name in live), None) for w in workers]

    def export(self) -> Dict[str, bytes]:
        """The newest complete round's states (:meth:`RoundChains.export`), if under the shared directory.

        States kept on the hosts are there only if the round was marked
        ``share``; a checkpoint saved after another round (a callback's
        ``stop_training`` mid-epoch) carries none, with a warning: a fit
        resumed from it restarts every worker's optimizer state.
        """
        complete, unshared = self._complete()
        if unshared:
            logger.warning("This checkpoint carries no optimizer_state='local' states: the workers kept them on "
                           "their hosts after the round before it; a fit resumed from it restarts them from the "
                           "driver's optimizer variables.")
            return {}
        return self._read(complete)
