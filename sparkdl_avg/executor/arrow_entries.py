"""The ``mapInArrow`` entry points that need no model replica: a task's ids, the standing round job's loop, the staging probe.

Executor side. The Spark SQL round's and the warm-up's bodies in :mod:`sparkdl_avg.executor.worker` read their ids
with :func:`task_ids`; the standing job's task (:func:`run_standing_rounds`) runs round after round the bodies the
driver announces (:mod:`sparkdl_avg.shared.wire.standing`); the staging check's task (:func:`probe_path_batches`) says
whether this executor sees the driver's files. All three are importable from :mod:`sparkdl_avg.executor.worker` too.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from typing import Iterator

from ..shared.wire import standing


def task_ids(batches) -> list:
    """The ids of ``spark.range(n, numPartitions=n)``'s rows a ``mapInArrow`` task got (all of its input)."""
    return [int(i) for batch in batches for i in batch.column(0).to_pylist()]


def run_standing_rounds(directory, deadline_s: float, batches, opening=None) -> Iterator:
    """``mapInArrow`` body of a standing round job: trains each round the driver announces until told to stop.

    One task per worker id, for many rounds (:mod:`sparkdl_avg.shared.wire.standing`: the driver's word for each round
    and the answers, through ``directory``, a local path, or a board such as
    :class:`~sparkdl_avg.shared.wire.standing_net.NetBoard`). Each round runs the announced entry (the body a per-round
    job would run, :func:`run_round_partition` or a test's wrapper) on the announced :class:`RoundTask`, and its rows
    go to the round's answer instead of the job's result; the job itself yields nothing. A retried attempt joins at the
    round in progress and skips the rounds its worker has answered and those the driver has moved past. A task whose
    next word does not come within ``deadline_s`` seconds ends. A round's answer is sent by a sender thread while the
    task goes on to the next round (announced ahead under ``overlap_rounds``), and where the board says so
    (``prefetch``: the driver's socket) the next round's word is read while this one trains; the task ends once its
    last answer is sent. ``opening``: the state the job was started with (a
    :class:`~sparkdl_avg.shared.wire.exchange.BroadcastState` in the job's closure), which a word whose task's state
    is :data:`~sparkdl_avg.shared.wire.standing.OPENING` trains from.
    """
    board = standing.board_of(directory)
    ids = task_ids(batches)
    sender = _Sender()
    reader = _Reader(board, deadline_s) if board.prefetch else None
    try:
        seq = board.first_round(deadline_s)
        while seq is not None:
            word = reader.take(seq) if reader is not None else board.word(seq, deadline_s)
            if word is None:
                break
            if reader is not None:
                reader.fetch(seq + 1)  # while this round trains
            if word is not standing.PASSED and board.owed(seq, ids):  # not answered by an earlier attempt, not over
                entry, task = word
                if opening is not None and getattr(task, "state", None) is standing.OPENING:
                    task = dataclasses.replace(task, state=opening)
                # the answer goes out in the sender's thread while this one reads the next word and trains it
                sender.send(board.answer, seq, list(entry(task, ids)))
                if opening is not None and getattr(task, "state", None) is opening:
                    _forget(opening)
            seq += 1
    finally:
        try:
            sender.close()
        finally:
            if reader is not None:
                reader.close()
            board.close()
    return
    yield  # a generator: mapInArrow's body


def _forget(state) -> None:
    """Lets the Python worker drop the arrays of a broadcast state once its round has read them.

    PySpark keeps a broadcast's value, once read, for as long as the worker holds the broadcast: for a standing task,
    the whole job, where only its first round reads it. Where it was read from a file (no encryption), a retried
    round would read the file again; with Spark's encryption it came through a socket at the task's start and stays.
    """
    broadcast = getattr(state, "broadcast", None)
    if getattr(broadcast, "_path", None) is not None:
        vars(broadcast).pop("_value", None)


class _Reader:
    """Reads a standing task's next word in a thread of its own while the task trains the round before it."""

    def __init__(self, board, deadline_s: float) -> None:
        self.board, self.deadline_s = board, deadline_s
        self._seq = self._thread = None
        self._word = self._error = None

    def fetch(self, seq: int) -> None:
        """Starts reading round ``seq``'s word."""
        self._seq, self._word, self._error = seq, None, None

        def run():
            try:
                self._word = self.board.word(seq, self.deadline_s)
            except BaseException as exc:  # noqa: BLE001 - raised in the task's own thread
                self._error = exc

        self._thread = threading.Thread(target=run, name="sparkdl_avg-standing-reader", daemon=True)
        self._thread.start()

    def take(self, seq: int):
        """Round ``seq``'s word (:meth:`~sparkdl_avg.shared.wire.standing.FileBoard.word`'s answers)."""
        if self._seq != seq:
            return self.board.word(seq, self.deadline_s)
        self._thread.join()
        self._thread, self._seq = None, None
        if self._error is not None:
            raise self._error
        return self._word

    def close(self) -> None:
        """Leaves a read in flight to end with the board (the driver's stop, or its deadline)."""
        self._thread = self._seq = None


class _Sender:
    """Writes a standing task's answers in a thread of its own, one at a time and in order.

    Each :meth:`send` first waits for the answer before it (and raises what writing it raised), so answers are written
    in their rounds' order and at most one is in flight; :meth:`close` waits for the last.
    """

    def __init__(self) -> None:
        self._thread = None
        self._error = None

    def send(self, fn, *args) -> None:
        self.close()

        def run():
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - raised in the task's own thread
                self._error = exc

        self._thread = threading.Thread(target=run, name="sparkdl_avg-standing-sender", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def probe_path_batches(marker: str, batches) -> Iterator:
    """``mapInArrow`` body of the staging check: one row saying whether this executor sees the file ``marker``.

    The driver wrote ``marker`` (a local path) just before the job; an executor on another host, whose ``/tmp`` is its
    own, does not see it (:func:`sparkdl_avg.driver.data.staging.check_shared_root`).
    """
    import pyarrow as pa

    ids = task_ids(batches)
    seen = os.path.exists(marker)
    yield pa.RecordBatch.from_pydict({
        "task": pa.array([int(i) for i in ids], pa.int64()),
        "host": pa.array([socket.gethostname() + "/" + _address()] * len(ids), pa.string()),
        "seen": pa.array([seen] * len(ids), pa.bool_()),
    })


def _address() -> str:
    """The address this executor's Spark binds to (``SPARK_LOCAL_IP``), else its host name's."""
    try:
        return os.environ.get("SPARK_LOCAL_IP") or socket.gethostbyname(socket.gethostname())
    except OSError:  # a host name that does not resolve (some containers): the name alone says enough
        return ""
