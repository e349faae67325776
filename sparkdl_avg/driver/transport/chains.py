"""The driver's book of files that chain each worker from one round to its next: which round reads which, and when files go.

Two concerns keep such files (the executors' half is
:class:`~sparkdl_avg.shared.wire.delta_sums.WorkerRoundFiles`): error
feedback's residuals (:class:`~sparkdl_avg.driver.transport.feedback.ResidualLedger`)
and ``optimizer_state="local"``'s optimizer states
(:class:`~sparkdl_avg.driver.transport.local_states.LocalStateLedger`). Both
number the fit's rounds in the order they start (``g``) and tell each
round's task which round's files to read: round ``g`` reads ``g - lag``'s
and writes its own. A round's files are deleted once the round that reads
them is complete; a checkpoint carries the newest ``lag`` complete rounds'
files (:meth:`RoundChains.export`), which a resumed fit writes back
(:meth:`RoundChains.restore`) to continue exactly. This module holds that
bookkeeping once; the ledgers add what is theirs.

What a worker keeps between rounds, whatever it is, is walked by the fit
without being named (:attr:`sparkdl_avg.driver.fit.rounds.RoundRunner.kept`):
``resize(num_workers)`` (elastic rounds), ``done(epoch, rnd, workers,
records)`` (a round has ended), ``host_local`` and ``places(workers, live)``
(where the next round's tasks should run), ``export()`` / ``restore(files)``
(a checkpoint's entries, ``"<tag>/..."``: each kind names itself), and
``close()`` (the fit's end). :class:`RoundChains` is that walk for files
chained from round to round; the kinds: error feedback's residuals
(:class:`~sparkdl_avg.driver.transport.feedback.ResidualLedger`),
``optimizer_state="local"``'s states
(:class:`~sparkdl_avg.driver.transport.local_states.LocalStateLedger`),
``overlap_rounds``' own terms
(:class:`~sparkdl_avg.driver.fit.overlap.OwnDeltaLedger`) and
``sync_fragments``' own weights (:class:`~sparkdl_avg.driver.fit.fragments.Fragments`).
"""

from __future__ import annotations

import logging
import threading
from typing import Dict, Iterable, List, Set, Tuple

from ...shared.files.fs import join, read_bytes, remove_tree, resolve, write_atomically

logger = logging.getLogger("sparkdl_avg")


class RoundChains:
    """The chained files of one fit's rounds (thread-safe: stale chunks start and end on several threads).

    Args:
        directory: Where the files live (under the fit's staging directory).
        num_workers: Workers per round (``N``): a round is complete once all wrote their file.
        lag: Rounds between a file's writer and its reader.
        tag: What names the files' format in a checkpoint's entries (``"<tag>/<rounds back>/<worker>"``).
    """

    def __init__(self, directory: str, num_workers: int, lag: int, tag: str) -> None:
        self.directory, self.num_workers, self.lag, self.tag = directory, num_workers, lag, tag
        self._shared: Set[int] = set()  # rounds whose files are under the shared directory
        self._seq: Dict[Tuple[int, int], int] = {}  # (epoch, round) -> g
        self._size: Dict[int, int] = {}  # g -> its workers (elastic rounds change num_workers between rounds)
        self._next = 0
        self._written: Dict[int, Set[int]] = {}  # g -> workers whose file exists
        self._lock = threading.Lock()

    def resize(self, num_workers: int) -> None:
        """Elastic rounds: the rounds that start from now on have ``num_workers`` workers."""
        with self._lock:
            self.num_workers = num_workers

    def _round(self, epoch: int, rnd: int, workers: Iterable[int], shared: bool,
               ahead: bool = False) -> Tuple[int, object, frozenset]:
        """``(g, the name of the round to read or None, the workers without a file there)`` of round ``rnd`` of ``epoch``.

        Numbers the round at its first call; ``shared``: its files go under the shared directory. ``ahead``:
        the round is announced while the one it reads still runs (``overlap_rounds``, lag 1): its
        ``workers`` are taken to have written their files there, as they will have before they read them.
        """
        workers = list(workers)
        with self._lock:
            g = self._seq.get((epoch, rnd))
            if g is None:
                g = self._seq[(epoch, rnd)] = self._next
                self._size[g] = self.num_workers
                self._next += 1
            if shared:
                self._shared.add(g)
            have = self._written.get(g - self.lag, set())
            if ahead:
                have = have | set(workers)
            fresh = frozenset(w for w in workers if w not in have)
            return g, (name_of(g - self.lag) if have else None), fresh

    host_local = False  # whether the files are on the workers' hosts (where the next round's tasks are placed)

    def done(self, epoch: int, rnd: int, workers: Iterable[int], records=()) -> None:
        """Records that ``workers`` of round ``rnd`` of ``epoch`` wrote their files (their tasks succeeded).

        ``records``: the workers' :class:`~sparkdl_avg.shared.wire.stats.WorkerRecord` (where they ran).
        """
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
                _remove(join(self.directory, f"{name_of(old)}-w{worker}.bin"))

    def _complete(self) -> Tuple[List[Tuple[int, List[int]]], List[int]]:
        """The newest ``lag`` complete rounds with their workers, and those of them not under the shared directory."""
        with self._lock:
            complete = sorted(g for g, w in self._written.items() if len(w) == self._size.get(g, self.num_workers))
            complete = [(g, sorted(self._written[g])) for g in complete[-self.lag:]]
            return complete, [g for g, _ in complete if g not in self._shared]

    def export(self) -> Dict[str, bytes]:
        """The newest ``lag`` complete rounds' files, ``"<tag>/<rounds back>/<worker>" -> bytes``."""
        complete, _ = self._complete()
        return self._read(complete)

    def _read(self, complete: List[Tuple[int, List[int]]]) -> Dict[str, bytes]:
        out = {}
        for back, (g, workers) in enumerate(reversed(complete), start=1):
            for worker in workers:
                out[f"{self.tag}/{back}/{worker}"] = read_bytes(join(self.directory, f"{name_of(g)}-w{worker}.bin"))
        return out

    def restore(self, files: Dict[str, bytes]) -> None:
        """Writes a checkpoint's files (:meth:`export`) back as the rounds before this fit's first.

        Files of another tag (another format) or of rounds further back
        than ``lag`` (a larger staleness) are left out: those chains start
        from zero.
        """
        with self._lock:
            self._next = self.lag
            for key, data in files.items():
                tag, back, worker = key.split("/")
                back, worker = int(back), int(worker)
                if tag != self.tag or back > self.lag or worker >= self.num_workers:
                    continue
                g = self.lag - back
                write_atomically(join(self.directory, f"{name_of(g)}-w{worker}.bin"), data)
                self._written.setdefault(g, set()).add(worker)
                self._shared.add(g)
            for g, workers in self._written.items():
                self._size[g] = len(workers)

    def close(self) -> None:
        """Deletes every file of the fit; a failure is logged (it must not hide the fit's own error)."""
        try:
            remove_tree(self.directory)
        except OSError as exc:
            logger.warning("Could not delete %s: %s", self.directory, exc)


def name_of(g: int) -> str:
    """The name of the fit's ``g``-th round in its files' names."""
    return f"g{g}"


def _remove(uri: str) -> None:
    """Deletes a chained file; a failure is logged (the fit's directory goes at its end anyway)."""
    fs, path = resolve(uri)
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("Could not delete %s: %s", uri, exc)
