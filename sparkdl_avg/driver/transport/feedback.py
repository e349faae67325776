"""Error feedback's residuals over one fit, on the driver: which files each round reads and writes, and how long they live.

Under ``update_compression`` with error feedback every worker keeps what its
codec dropped (its residual) in a file under the fit's staging directory
(:class:`~sparkdl_avg.shared.wire.delta_sums.FeedbackFiles`, the executors'
half). :class:`FeedbackLedger` numbers the fit's rounds in the order they
start (``g``) and tells each round's task which round's residuals to add:
round ``g`` reads ``g - lag``'s and writes its own. ``lag`` is 1 in
synchronous training; with ``synchronization="stale"`` and staleness ``s`` it
is ``s + 1``, the newest round whose every chunk has surely returned when a
chunk of round ``g`` starts (the bound), so the choice never depends on
timing and ``reproducible=True`` stays bitwise reproducible: ``s + 1``
interleaved chains per worker, each losing nothing over rounds.

A round's files are deleted once the round that reads them is complete; a
checkpoint carries the newest ``lag`` complete rounds' files
(:meth:`FeedbackLedger.export`), which a resumed fit writes back
(:meth:`FeedbackLedger.restore`) to continue exactly.

``optimizer_state="local"`` chains each worker's own optimizer variables from
round to round the same way (:mod:`sparkdl_avg.shared.wire.local_state`): a second
ledger, its files :class:`~sparkdl_avg.shared.wire.local_state.LocalStateFiles`,
its checkpoint entries tagged :data:`LOCAL_TAG`. Kept on the workers' hosts
(``host_local``), its files are under the shared directory only for rounds
the trainer marks ``share`` (a checkpoint may follow them), and it tells the
transport which host each worker's next task should run on (:meth:`FeedbackLedger.places`).
"""

from __future__ import annotations

import logging
import threading
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ...shared.wire.delta_sums import FeedbackFiles
from ...shared.wire.local_state import LocalStateFiles
from ...shared.files.fs import join, read_bytes, remove_tree, resolve, write_atomically

logger = logging.getLogger("sparkdl_avg")

LOCAL_TAG = "local-optimizer"
"""The tag of ``optimizer_state="local"``'s files in a checkpoint (where error feedback's name their compression)."""


class FeedbackLedger:
    """The residual files of one fit's rounds (thread-safe: stale chunks start and end on several threads).

    Args:
        directory: Where the residual files live (under the fit's staging directory).
        num_workers: Workers per round (``N``): a round is complete once all wrote their residual.
        lag: Rounds between a residual's writer and its reader (see the module docstring).
        compression: ``update_compression``: the residuals' format, named in what a checkpoint carries
            (:data:`LOCAL_TAG` for the workers' own optimizer states).
        files: What a round's tasks get: :class:`FeedbackFiles`, or :class:`LocalStateFiles` for local states.
        host_local: Local states only: kept in files on the workers' hosts (see :mod:`sparkdl_avg.shared.wire.local_state`).
    """

    def __init__(self, directory: str, num_workers: int, lag: int, compression: str, files=FeedbackFiles,
                 host_local: bool = False) -> None:
        self.directory, self.num_workers, self.lag, self.compression = directory, num_workers, lag, compression
        self._files = files
        self.host_local = host_local
        self._shared: Set[int] = set()  # rounds whose files are under the shared directory (host_local: marked share)
        self._hosts: Dict[int, Tuple[str, ...]] = {}  # host_local: worker -> the names of the host it last ran on
        self._seq: Dict[Tuple[int, int], int] = {}  # (epoch, round) -> g
        self._size: Dict[int, int] = {}  # g -> its workers (elastic rounds change num_workers between rounds)
        self._next = 0
        self._written: Dict[int, Set[int]] = {}  # g -> workers whose residual file exists
        self._lock = threading.Lock()

    def resize(self, num_workers: int) -> None:
        """Elastic rounds: the rounds that start from now on have ``num_workers`` workers."""
        with self._lock:
            self.num_workers = num_workers

    @classmethod
    def local_states(cls, directory: str, num_workers: int, host_local: bool = False) -> "FeedbackLedger":
        """The ledger of ``optimizer_state="local"``: each worker's optimizer variables, read by its next round.

        ``host_local``: kept on the workers' hosts, their tasks placed there (classic sessions).
        """
        return cls(directory, num_workers, 1, LOCAL_TAG, files=LocalStateFiles, host_local=host_local)

    def files(self, epoch: int, rnd: int, workers: Iterable[int], share: bool = False):
        """What round ``rnd`` of ``epoch``'s tasks for ``workers`` read and write.

        ``share``: with ``host_local``, the round also writes its files under the shared directory.
        """
        with self._lock:
            g = self._seq.get((epoch, rnd))
            if g is None:
                g = self._seq[(epoch, rnd)] = self._next
                self._size[g] = self.num_workers
                self._next += 1
            if share or not self.host_local:
                self._shared.add(g)
            have = self._written.get(g - self.lag, set())
            fresh = frozenset(w for w in workers if w not in have)
            read = _name(g - self.lag) if have else None
            if self.host_local:
                return self._files(self.directory, read, _name(g), fresh, host_local=True, share=g in self._shared)
            return self._files(self.directory, read, _name(g), fresh)

    def placed(self, workers) -> None:
        """Records where ``workers`` (a round's :class:`~sparkdl_avg.shared.wire.stats.WorkerRecord`\\ s) ran."""
        with self._lock:
            for record in workers:
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

    def done(self, epoch: int, rnd: int, workers: Iterable[int]) -> None:
        """Records that ``workers`` of round ``rnd`` of ``epoch`` wrote their residuals (their tasks succeeded)."""
        with self._lock:
            g = self._seq[(epoch, rnd)]
            written = self._written.setdefault(g, set())
            written.update(workers)
            complete = len(written) == self._size[g]
            old = g - self.lag
            stale = complete and old in self._written
            if stale:
                gone = self._written.pop(old)
                stale = old in self._shared
                self._shared.discard(old)
        if stale:  # round g read them and is complete: no task reads them again, a retry included
            for worker in sorted(gone):
                _remove(join(self.directory, f"{_name(old)}-w{worker}.bin"))

    def export(self) -> Dict[str, bytes]:
        """The newest ``lag`` complete rounds' residual files, ``"<compression>/<rounds back>/<worker>" -> bytes``.

        Local states kept on the hosts are there only if the round was marked
        ``share``; a checkpoint saved after another round (a callback's
        ``stop_training`` mid-epoch) carries none, with a warning: a fit
        resumed from it restarts every worker's optimizer state.
        """
        with self._lock:
            complete = sorted(g for g, w in self._written.items() if len(w) == self._size.get(g, self.num_workers))
            complete = [(g, sorted(self._written[g])) for g in complete[-self.lag:]]
            unshared = [g for g, _ in complete if g not in self._shared]
        if unshared:
            logger.warning("This checkpoint carries no optimizer_state='local' states: the workers kept them on "
                           "their hosts after the round before it; a fit resumed from it restarts them from the "
                           "driver's optimizer variables.")
            return {}
        out = {}
        for back, (g, workers) in enumerate(reversed(complete), start=1):
            for worker in workers:
                out[f"{self.compression}/{back}/{worker}"] = read_bytes(join(self.directory, f"{_name(g)}-w{worker}.bin"))
        return out

    def restore(self, files: Dict[str, bytes]) -> None:
        """Writes a checkpoint's residual files (:meth:`export`) back as the rounds before this fit's first.

        Residuals of another ``update_compression`` (another format) or of
        rounds further back than ``lag`` (a larger staleness) are left out:
        those chains start from zero.
        """
        with self._lock:
            self._next = self.lag
            for key, data in files.items():
                compression, back, worker = key.split("/")
                back, worker = int(back), int(worker)
                if compression != self.compression or back > self.lag or worker >= self.num_workers:
                    continue
                g = self.lag - back
                write_atomically(join(self.directory, f"{_name(g)}-w{worker}.bin"), data)
                self._written.setdefault(g, set()).add(worker)
                self._shared.add(g)
            for g, workers in self._written.items():
                self._size[g] = len(workers)

    def close(self) -> None:
        """Deletes every residual file of the fit; a failure is logged (it must not hide the fit's own error)."""
        try:
            remove_tree(self.directory)
        except OSError as exc:
            logger.warning("Could not delete %s: %s", self.directory, exc)


def _name(g: int) -> str:
    return f"g{g}"


def _remove(uri: str) -> None:
    """Deletes a residual file; a failure is logged (the fit's directory goes at its end anyway)."""
    fs, path = resolve(uri)
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("Could not delete %s: %s", uri, exc)


def lag_of(synchronization: str, staleness: Optional[int]) -> int:
    """Rounds between a residual's writer and its reader: 1 in sync, ``staleness + 1`` in stale."""
    return 1 if synchronization == "sync" else int(staleness) + 1
