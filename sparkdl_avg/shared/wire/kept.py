"""What a worker keeps between rounds, the executors' half: one protocol, its view of a worker's round, its files.

Error feedback's residuals, ``optimizer_state="local"``'s optimizer states,
``overlap_rounds``' own terms and ``sync_fragments``' own weights are each a
*kind* of state a worker keeps from one round to its next. The driver's half
of a kind (:mod:`sparkdl_avg.driver.transport.chains`) gives every round's
task one :class:`Kept` per kind (``RoundTask.kept``); the task calls each
one's :meth:`Kept.begin` before training and :meth:`Kept.end` after it, in
the kinds' registration order, on one :class:`WorkerRound`: what the worker
was sent, starts from, ended with and returns. A kind changes the round only
through that view, so the round's body names none of them.

:class:`WorkerRoundFiles` is the files such state lives in between rounds:
each worker's file per round, chained from the round that wrote it to the
round that reads it (the driver's book: :class:`~sparkdl_avg.driver.transport.chains.RoundChains`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional


@dataclass
class WorkerRound:
    """One worker's round as what it keeps sees it (units: the model's arrays, in its order).

    Attributes:
        worker: The worker's index in the round.
        num_workers: The round's workers (``N``).
        sent: The weights the round sent (what sums of deltas are taken from).
        sent_optimizer: The optimizer variables the round sent.
        start: The weights training starts from (default: ``sent``).
        start_optimizer: The optimizer variables training starts from (default: ``sent_optimizer``).
        end: After training: the weights the worker returns (a kind may change them, and ``sent`` with them).
        end_optimizer: After training: the replica's optimizer variables.
        finite: After training: whether its loss and weights are finite.
        restarted: A kind lost what the worker kept (it restarts from what was sent).
        residuals: Error feedback's files (:class:`~sparkdl_avg.shared.wire.delta_sums.FeedbackFiles`), which the
            round's codec reads and writes when it packs the worker's delta.
    """

    worker: int
    num_workers: int
    sent: List[Any]
    sent_optimizer: List[Any]
    start: List[Any]
    start_optimizer: List[Any]
    end: Optional[List[Any]] = None
    end_optimizer: Optional[List[Any]] = None
    finite: bool = True
    restarted: bool = False
    residuals: Any = None


class Kept:
    """One kind of state a worker keeps between rounds, for one round's task (picklable: it travels in the task).

    Attributes:
        host_local: Whether it keeps files on the workers' hosts (its records then name the host).
    """

    host_local = False

    def begin(self, w: WorkerRound) -> Any:
        """Before training: reads what the worker kept and sets where it starts; returns what :meth:`end` needs."""
        return None

    def end(self, w: WorkerRound, begun: Any) -> None:
        """After training: keeps what the next round reads; may change what the worker returns (``w.end``)."""


@dataclass(frozen=True)
class WorkerRoundFiles(Kept):
    """Files that chain each worker from one round to its next, under the fit's staging directory.

    Worker ``i`` of a round reads ``<directory>/<read>-w<i>.bin`` (what it
    wrote in the round ``read`` names) and writes ``<directory>/<write>-w<i>.bin``,
    atomically, so a retried task reads and writes the same bytes.

    Attributes:
        directory: The fit's directory of such files.
        read: The name of the round whose files this round's workers read (``None``: none yet).
        write: This round's name.
        fresh: Workers that have no file in ``read`` (none had one yet: they start from zero or the sent state).
    """

    directory: str
    read: Optional[str]
    write: str
    fresh: frozenset = frozenset()

    #: What the files hold, for the error a missing one raises.
    what = "file"

    def path(self, name: str, worker: int) -> str:
        from ..files.fs import join

        return join(self.directory, f"{name}-w{worker}.bin")

    def read_bytes(self, worker: int) -> Optional[bytes]:
        """Worker ``worker``'s file from the round ``read`` names (``None``: it has none)."""
        from ..files.fs import read_bytes

        if self.read is None or worker in self.fresh:
            return None
        uri = self.path(self.read, worker)
        try:
            return read_bytes(uri)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"worker {worker}'s {self.what} {uri!r} is missing: every executor must read and write the staging "
                "directory (staging_dir), which holds it between rounds"
            ) from None

    def write_bytes(self, worker: int, data: bytes) -> None:
        """Writes worker ``worker``'s file of this round (atomically: a retry rewrites the same bytes)."""
        from ..files.fs import write_atomically

        write_atomically(self.path(self.write, worker), data)
