"""The files through which one long Spark job runs round after round: the driver's word and the workers' answers.

Under Spark Connect every Spark job is analysed, optimised and planned by the
server, and its Python tasks start and end through Spark SQL's Python
runner: tens of milliseconds a round that a classic session's RDD round does
not pay (docs/benchmarks.md, "Spark Connect round overhead, one job for the
rounds"). Where the client and the executors share a host and a local
staging directory (a local Connect server), the Spark SQL round
(:class:`~sparkdl_avg.driver.transport.sql.SqlTransport`) therefore runs its
rounds in one *standing* job: ``N`` tasks, one per worker, that train each
round the driver announces here and answer here, until told to stop
(:func:`sparkdl_avg.executor.arrow_entries.run_standing_rounds`).

In the job's directory (a local path):

* ``round-<seq>``: the driver's word for the job's round ``seq`` (0, 1, ...),
  written atomically (:func:`announce`): a pickled ``(entry, task)`` (the
  partition body and the round's
  :class:`~sparkdl_avg.executor.worker.RoundTask`, as a per-round job's
  closure would carry them). The driver removes a round's word once the
  round is over (after writing a later round's word, and before the round's
  answers), so the lowest round present is the one in progress, where a
  task that starts late (a retried attempt) joins (:func:`first_round`), and
  a round whose word is gone needs no answer (:func:`passed`), whether or
  not its answer files are still there. With ``overlap_rounds`` the driver
  announces a round while the one before it trains (``keep_from``), so two
  words may be present: the lower one is still in progress.
* ``stop``: the tasks end (:func:`stop`), whichever round they wait for.
* ``done-<seq>-<worker>``: what that worker's task yields for round ``seq``
  (Arrow IPC, :data:`~sparkdl_avg.shared.wire.exchange.ROUND_SCHEMA` rows),
  written atomically once the round is trained (:func:`answer`); the driver
  reads them (:func:`collect`) and deletes them after the round's word when
  it announces a later round.

A task waits for the next word by polling its file; a task whose word does
not come within its deadline ends (the driver has gone). These files come
from the driver, as the round's state and the model's spec do.

Both sides reach these files through a *board* (the task's side:
:class:`FileBoard`) and a *post* (the driver's: :class:`FilePost`); executors
on other hosts, which cannot see the driver's files, reach the same protocol
through the driver's socket instead
(:mod:`sparkdl_avg.shared.wire.standing_net`).
"""

from __future__ import annotations

import os
import pickle
import time
import uuid
from typing import Any, List, Optional, Sequence

_STOP = "stop"
PASSED = ("passed",)  # :func:`word`'s answer for a round the driver has already moved past
_POLL_FIRST_S = 0.0002
_POLL_MAX_S = 0.002  # a stat costs microseconds; the wait is the round's latency once the file appears


def _round_file(directory: str, seq: int) -> str:
    return os.path.join(directory, f"round-{seq}")


def _done_file(directory: str, seq: int, worker: int) -> str:
    return os.path.join(directory, f"done-{seq}-{worker}")


def _write_atomically(path: str, data: bytes) -> None:
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}-{uuid.uuid4().hex}")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def announce(directory: str, seq: int, word: bytes, keep_from: Optional[int] = None) -> None:
    """Driver: writes the word (:func:`go`) for round ``seq``; removes the files of the rounds before ``keep_from``.

    ``keep_from``: the lowest round still in progress (default ``seq``). A
    round announced ahead (``overlap_rounds``) keeps the round before it,
    whose tasks still train and whose retried attempt must join there.
    Every word to remove goes before any answer: a task that finds an answer
    missing and the word still there knows the round still waits for it
    (:func:`passed`).
    """
    _write_atomically(_round_file(directory, seq), word)
    keep_from = seq if keep_from is None else keep_from
    names = os.listdir(directory)
    for prefix in ("round-", "done-"):
        for name in names:
            number = name[len(prefix):].split("-")[0] if name.startswith(prefix) else ""
            if number.isdigit() and int(number) < keep_from:
                _remove(os.path.join(directory, name))


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def go(entry, task) -> bytes:
    """The word that has the tasks train ``task`` with ``entry`` (what a per-round job's tasks would run)."""
    from pyspark import cloudpickle  # PySpark's: what a test registers its modules with (pickled by value)

    return cloudpickle.dumps((entry, task))


def stop(directory: str) -> None:
    """Driver: tells the tasks to end, whichever round they wait for."""
    _write_atomically(os.path.join(directory, _STOP), b"")


def first_round(directory: str, deadline_s: float) -> Optional[int]:
    """Task: the round in progress (the lowest announced: where a task joins).

    ``None``: told to stop, or none within ``deadline_s``.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        names = os.listdir(directory)
        if _STOP in names:
            return None
        seqs = [int(name[6:]) for name in names if name.startswith("round-")]
        if seqs:
            return min(seqs)
        if time.monotonic() > deadline:
            return None
        time.sleep(_POLL_MAX_S)


def passed(directory: str, seq: int) -> bool:
    """Whether round ``seq``, whose word the task has read, is over (its word removed): it needs no answer."""
    return not os.path.exists(_round_file(directory, seq))


def word(directory: str, seq: int, deadline_s: float) -> Optional[tuple]:
    """Task: the driver's word for round ``seq``, unpickled, or :data:`PASSED` if the driver has moved past it.

    ``None``: told to stop, or no word within ``deadline_s``.
    """
    path = _round_file(directory, seq)
    stopped = os.path.join(directory, _STOP)
    deadline = time.monotonic() + deadline_s
    delay = _POLL_FIRST_S
    while True:
        try:
            with open(path, "rb") as f:
                return pickle.loads(f.read())
        except FileNotFoundError:
            # Not announced yet, or removed (over) between the task's listing and its read: a later word says which.
            # The driver writes the words in order, but with a round announced ahead both may have come since the
            # open above: the word missing still, after the later one was seen, is the one that is over.
            if any(name.startswith("round-") and int(name[6:]) > seq for name in os.listdir(directory)):
                if not os.path.exists(path):
                    return PASSED
                continue
        if os.path.exists(stopped) or time.monotonic() > deadline:
            return None
        time.sleep(delay)
        delay = min(2 * delay, _POLL_MAX_S)


def answered(directory: str, seq: int, workers: Sequence[int]) -> bool:
    """Whether ``workers`` have answered round ``seq`` (an earlier attempt of a retried task did)."""
    return all(os.path.exists(_done_file(directory, seq, w)) for w in workers)


def answer(directory: str, seq: int, batches: Sequence[Any]) -> None:
    """Task: writes each worker's rows of round ``seq`` (one Arrow batch per worker, its ``worker`` column)."""
    for batch in batches:
        _write_atomically(_done_file(directory, seq, batch.column("worker")[0].as_py()), ipc_bytes(batch))


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


def collect(directory: str, seq: int, workers: Sequence[int]) -> Optional[List[Any]]:
    """Driver: the rows of round ``seq`` once all ``workers`` have answered, else ``None``.

    The files stay until the next round is announced: a retried task that
    joins meanwhile finds the round answered.
    """
    paths = [_done_file(directory, seq, w) for w in workers]
    if not all(os.path.exists(p) for p in paths):
        return None
    batches = []
    for path in paths:
        with open(path, "rb") as f:
            batches.extend(ipc_batches(f.read()))
    return batches


class FileBoard:
    """A task's side of a standing job whose words and answers are files in ``directory`` (a local path).

    The other side of the protocol is :class:`FilePost`;
    :class:`~sparkdl_avg.shared.wire.standing_net.NetBoard` is the same
    protocol through the driver's socket. ``prefetch``: whether the task
    should read the next round's word while it trains this one (not for
    files: reading one costs a page-cache copy).
    """

    prefetch = False

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def first_round(self, deadline_s: float) -> Optional[int]:
        """See :func:`first_round`."""
        return first_round(self.directory, deadline_s)

    def word(self, seq: int, deadline_s: float) -> Optional[tuple]:
        """See :func:`word`."""
        return word(self.directory, seq, deadline_s)

    def answered(self, seq: int, workers: Sequence[int]) -> bool:
        """See :func:`answered`."""
        return answered(self.directory, seq, workers)

    def passed(self, seq: int) -> bool:
        """See :func:`passed`."""
        return passed(self.directory, seq)

    def answer(self, seq: int, batches: Sequence[Any]) -> None:
        """See :func:`answer`."""
        answer(self.directory, seq, batches)

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
        """See :func:`stop`."""
        stop(self.path)

    def collect(self, seq: int, workers: Sequence[int]) -> Optional[List[Any]]:
        """See :func:`collect`."""
        return collect(self.path, seq, workers)

    def reached(self) -> bool:
        """Always: the tasks read the files where they run (the driver's host)."""
        return True

    def close(self) -> None:
        """Nothing to close: the job's directory goes with the job."""
