"""The files through which one long Spark job runs round after round: the driver's word and the workers' answers.

Under Spark Connect a job per round costs tens of milliseconds of planning that a classic session's RDD round does
not pay (docs/benchmarks/connect_overhead.md). Where the client and the executors share a host and a local staging
directory (a local Connect server), the Spark SQL round (:class:`~sparkdl_avg.driver.transport.sql.SqlTransport`)
therefore runs its rounds in one *standing* job: ``N`` tasks, one per worker, that train each round the driver
announces here and answer here, until told to stop (:func:`sparkdl_avg.executor.arrow_entries.run_standing_rounds`).

The job's board is a directory (a local path) whose files are the protocol's entries
(:mod:`sparkdl_avg.shared.wire.board`: ``round-<seq>``, the driver's word, a pickled ``(entry, task)`` made by
:func:`go`; ``done-<seq>-<worker>``, a worker's answer as Arrow IPC
:data:`~sparkdl_avg.shared.wire.round_rows.ROUND_SCHEMA` rows; ``stop``), each written atomically. This module runs the
board's step programs on that directory: the driver's side (:class:`FilePost`) and a task's (:class:`FileBoard`, which
polls for a word until its deadline: a task that hears nothing ends, the driver has gone). The states, who writes what
and the invariants are on the protocol's page (docs/round-protocol.md). Executors on other hosts, which cannot see the
driver's files, reach the same protocol through the driver's socket (:mod:`sparkdl_avg.shared.wire.standing_net`).
"""

from __future__ import annotations

import pickle
import time
from typing import Any, List, Optional, Sequence

from . import board as protocol
from .board import PASSED, WAIT, DirectoryStore, perform

__all__ = ["OPENING", "PASSED", "FileBoard", "FilePost", "announce", "board_of", "go", "ipc_batches", "ipc_bytes"]

_POLL_FIRST_S = 0.0002
_POLL_MAX_S = 0.002  # a stat costs microseconds; the wait is the round's latency once the file appears


def _wait(program_of, directory: str, deadline_s: float):
    """Runs ``program_of()`` on ``directory`` until it answers something other than WAIT, or ``deadline_s`` passes."""
    store = DirectoryStore(directory)
    deadline = time.monotonic() + deadline_s
    delay = _POLL_FIRST_S
    while True:
        reply = perform(program_of(), store)
        if reply is not WAIT:
            return reply
        if time.monotonic() > deadline:
            return None
        time.sleep(delay)
        delay = min(2 * delay, _POLL_MAX_S)


class Opening:
    """The state a standing job's tasks were started with: what its first word carries in place of the round's arrays.

    Through the driver's socket every task reads each word from the driver's one link, so a round's state sent in
    its words crosses that link once per worker. A job's first round instead puts its state in a Spark broadcast
    that the job's closure carries (Spark's torrent: executors also fetch its blocks from each other), and its word
    carries this marker; :func:`~sparkdl_avg.executor.arrow_entries.run_standing_rounds` puts the job's state in its
    place.
    """

    def __reduce__(self):
        return "OPENING"  # one marker per process: unpickled as this module's own

    def load(self):
        raise RuntimeError("A round's word refers to its standing job's opening state, which this task was not given.")


#: The one :class:`Opening` marker.
OPENING = Opening()


def announce(directory: str, seq: int, word: bytes, keep_from: Optional[int] = None) -> None:
    """Driver: writes the word (:func:`go`) for round ``seq``; see :func:`sparkdl_avg.shared.wire.board.announce`."""
    perform(protocol.announce(seq, word, keep_from), DirectoryStore(directory))


def go(entry, task) -> bytes:
    """The word that has the tasks train ``task`` with ``entry`` (what a per-round job's tasks would run)."""
    from pyspark import cloudpickle  # PySpark's: what a test registers its modules with (pickled by value)

    return cloudpickle.dumps((entry, task))


def ipc_bytes(batch) -> bytes:
    """One worker's answer (an Arrow batch) as Arrow IPC stream bytes."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def ipc_batches(data) -> List[Any]:
    """The Arrow batches of :func:`ipc_bytes`' bytes."""
    import pyarrow as pa

    return list(pa.ipc.open_stream(data))


class FileBoard:
    """A task's side of a standing job whose words and answers are files in ``directory`` (a local path).

    The other side of the protocol is :class:`FilePost`; :class:`~sparkdl_avg.shared.wire.standing_net.NetBoard` is
    the same protocol through the driver's socket. ``prefetch``: whether the task should read the next round's word
    while it trains this one (not for files: reading one costs a page-cache copy).
    """

    prefetch = False

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def first_round(self, deadline_s: float) -> Optional[int]:
        """The round in progress (the lowest announced: where a task joins).

        ``None``: told to stop, or none within ``deadline_s``.
        """
        return _wait(protocol.first_round, self.directory, deadline_s)

    def word(self, seq: int, deadline_s: float) -> Optional[tuple]:
        """The driver's word for round ``seq``, unpickled, or :data:`PASSED` if the driver has moved past it.

        ``None``: told to stop, or no word within ``deadline_s``.
        """
        reply = _wait(lambda: protocol.word(seq), self.directory, deadline_s)
        return reply if reply is None or reply is PASSED else pickle.loads(reply)

    def owed(self, seq: int, workers: Sequence[int]) -> bool:
        """Whether round ``seq`` still waits for ``workers``' answers (see :func:`~sparkdl_avg.shared.wire.board.owed`)."""
        return bool(perform(protocol.owed(seq, [int(w) for w in workers]), DirectoryStore(self.directory)))

    def answer(self, seq: int, batches: Sequence[Any]) -> None:
        """Writes each worker's rows of round ``seq`` (one Arrow batch per worker, its ``worker`` column)."""
        store = DirectoryStore(self.directory)
        for batch in batches:
            perform(protocol.answer(seq, batch.column("worker")[0].as_py(), ipc_bytes(batch)), store)

    def close(self) -> None:
        """Nothing to close: the files stay for the driver."""


def board_of(where) -> Any:
    """The task's board: a :class:`FileBoard` for a directory's path, else ``where`` itself (a board)."""
    return FileBoard(where) if isinstance(where, str) else where


class FilePost:
    """The driver's side of a standing job's files in ``path`` (a local directory): what it announces and collects."""

    def __init__(self, path: str) -> None:
        self.path = path

    def board(self) -> str:
        """What the job's tasks are given to reach this post (:func:`board_of` turns it into a :class:`FileBoard`)."""
        return self.path

    def announce(self, seq: int, word: bytes, keep_from: Optional[int] = None) -> None:
        """See :func:`announce`."""
        announce(self.path, seq, word, keep_from)

    def stop(self) -> None:
        """Tells the tasks to end, whichever round they wait for."""
        perform(protocol.stop(), DirectoryStore(self.path))

    def collect(self, seq: int, workers: Sequence[int]) -> Optional[List[Any]]:
        """The rows of round ``seq`` once all ``workers`` have answered, else ``None``.

        The files stay until the next round is announced: a retried task that joins meanwhile finds the round answered.
        """
        found = perform(protocol.collect(seq, [int(w) for w in workers]), DirectoryStore(self.path))
        return None if found is None else [batch for data in found for batch in ipc_batches(data)]

    def reached(self) -> bool:
        """Always: the tasks read the files where they run (the driver's host)."""
        return True

    def close(self) -> None:
        """Nothing to close: the job's directory goes with the job."""
