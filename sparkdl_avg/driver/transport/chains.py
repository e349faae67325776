"""What a worker keeps between rounds, the driver's half: one protocol, one registry of kinds, the files' book.

A *kind* of state a worker keeps from one round to its next is one
:class:`KeptKind` subclass, registered in :data:`KEPT`, with its executors'
half a :class:`~sparkdl_avg.shared.wire.kept.Kept`. The kinds (each reads
and changes its own part of a worker's round, so their order does not
matter): error feedback's residuals
(:class:`~sparkdl_avg.driver.transport.feedback.ResidualLedger`),
``optimizer_state="local"``'s states
(:class:`~sparkdl_avg.driver.transport.local_states.LocalStateLedger`),
``overlap_rounds``' own terms (:class:`~sparkdl_avg.driver.fit.overlap.OwnDeltaLedger`)
and ``sync_fragments``' own weights (:class:`~sparkdl_avg.driver.fit.fragments.Fragments`).
Each registers in :data:`KEPT`. The fit makes each kind that applies (:meth:`KeptKind.for_fit`) and walks
them without naming any: the round runner
(:attr:`sparkdl_avg.driver.fit.rounds.RoundRunner.kept`) asks each for its
half of a round's task (:meth:`KeptKind.for_round`), tells it the round is
done, resizes it (elastic rounds), asks where tasks should run; the
checkpoint carries each one's :meth:`KeptKind.export` (entries
``"<tag>/..."``: each kind names itself) and a resumed fit restores them; the
fit's end closes them.

:class:`RoundChains` is the book of files chained from round to round that
the residuals and the states keep: which round reads which, and when files
go. Rounds are numbered in the order they start (``g``); round ``g`` reads
``g - lag``'s files and writes its own. A round's files are deleted once
the round that reads them is complete; a checkpoint carries the newest
``lag`` complete rounds' files (:meth:`RoundChains.export`), which a resumed
fit writes back (:meth:`RoundChains.restore`) to continue exactly.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ...shared.files.fs import join, read_bytes, remove_tree, resolve, write_atomically
from ...shared.registry import Registry
from ...shared.wire.kept import Kept

logger = logging.getLogger("sparkdl_avg")


@dataclass(frozen=True)
class KeptFit:
    """What a kind is made from (:meth:`KeptKind.for_fit`): the trainer's config, the driver's model, the fit's
    :class:`~sparkdl_avg.driver.fit.planner.FitPlan`, its transport, and its directory under the staging root."""

    config: Any
    model: Any
    plan: Any
    transport: Any
    exchange: str


class KeptKind:
    """One kind of state workers keep between rounds, over one fit (the driver's half; see the module docstring).

    A subclass registers itself with ``@KEPT.register``; what is not overridden here is a kind that keeps nothing
    on hosts, pipelines, and has nothing to export.

    Attributes:
        name: The kind's name in :data:`KEPT`.
        host_local: Whether it keeps files on the workers' hosts, where the next round's tasks are placed.
        pipelined: Whether a round may be announced while the one before it trains (``overlap_rounds``).
    """

    name = ""
    host_local = False
    pipelined = True

    @classmethod
    def for_fit(cls, fit) -> Optional["KeptKind"]:
        """The kind for the fit (a :class:`KeptFit`), or ``None`` where it does not apply."""
        raise NotImplementedError

    def for_round(self, epoch: int, rnd: int, workers: Iterable[int], share: bool, ahead: bool) -> Kept:
        """Its half of round ``rnd`` of ``epoch``'s tasks for ``workers`` (``share``, ``ahead``: see
        :meth:`~sparkdl_avg.driver.fit.rounds.RoundRunner.run`)."""
        raise NotImplementedError

    def resize(self, num_workers: int) -> None:
        """Elastic rounds: the rounds that start from now on have ``num_workers`` workers."""

    def done(self, epoch: int, rnd: int, workers: Iterable[int], records=()) -> None:
        """``workers`` of round ``rnd`` of ``epoch`` succeeded (``records``: their
        :class:`~sparkdl_avg.shared.wire.stats.WorkerRecord`, where they ran)."""

    def places(self, workers: Sequence[int], live: Iterable[str]) -> Optional[List[Optional[str]]]:
        """The host each of ``workers``' tasks should run on, among ``live`` ones; ``None``: anywhere."""
        return None

    def returned(self) -> Optional[Tuple[int, ...]]:
        """The variables the next round's sums hold (indices into the model's weights); ``None``: all."""
        return None

    def dropped(self, epoch: int, rnd: int) -> int:
        """What round ``rnd`` of ``epoch`` leaves unread of workers its elastic plan no longer has (recorded)."""
        return 0

    def export(self) -> Dict[str, bytes]:
        """What a checkpoint carries of it: ``"<tag>/..." -> bytes``."""
        return {}

    def restore(self, files: Dict[str, bytes]) -> None:
        """Takes its own entries (by its tag) of a checkpoint's :meth:`export`\\ s, before the fit's first round."""

    def close(self) -> None:
        """The fit's end: everything it kept goes."""


KEPT = Registry("kept", "kind of kept state")
"""The kinds, by ``name``, in registration order: the order their executors' halves run."""


class RoundChains(KeptKind):
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
