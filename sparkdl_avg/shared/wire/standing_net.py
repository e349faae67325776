"""The standing round job's protocol through the driver's socket: for executors on hosts of their own.

A standing job (:mod:`sparkdl_avg.shared.wire.standing`) runs a fit's rounds in ``N`` long tasks that read the
driver's word for each round and answer it. Its files need the driver's directory; executors on other hosts see none
of it. Here the driver keeps the words and answers in memory and serves them on a TCP socket (:class:`RoundServer`,
bound to the address the executors reach the driver at, ``spark.driver.host``), and each task asks for them
(:class:`NetBoard`): the same questions as :class:`~sparkdl_avg.shared.wire.standing.FileBoard`'s, answered by the
same step programs (:mod:`sparkdl_avg.shared.wire.board`, run on a dict under the server's lock instead of a
directory), so :func:`~sparkdl_avg.executor.arrow_entries.run_standing_rounds` runs either. A word carries the round's
weights itself (the optimizer variables only as :class:`RemoteArrays`, fetched by a task that needs them; a job's
first round's state goes in a Spark broadcast in the job's closure instead, and its word carries
:data:`~sparkdl_avg.shared.wire.standing.OPENING`) and an answer the worker's sums (the ``"driver"`` aggregation's
Arrow rows): nothing of a round goes through the staging store. Why a socket of its own: docs/round-protocol.md.

The connections are :mod:`multiprocessing.connection`'s (Python's own: length-framed messages, and an HMAC challenge
with a random 32-byte key that the tasks carry in their closure, as they carry the round's state): a client without
the key is refused before anything it sends is unpickled. Requests are pickled tuples; replies are plain values, a
word its pickled bytes as the driver made them.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import threading
import time
from multiprocessing.connection import Client, Listener
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import board as protocol
from .board import PASSED, WAIT, MemoryStore, perform
from .standing import ipc_batches, ipc_bytes

logger = logging.getLogger("sparkdl_avg")


class NetBoard:
    """A task's side of a standing job served by the driver's :class:`RoundServer` at ``address``.

    Picklable (the address and key travel in the job's closure); the connections are made on first use, one per
    thread that asks at once (the task's own, its prefetch and its sender), and kept.
    """

    prefetch = True

    def __init__(self, address: Tuple[str, int], authkey: bytes) -> None:
        self.address, self.authkey = tuple(address), authkey
        self._free: List[Any] = []
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"address": self.address, "authkey": self.authkey}

    def __setstate__(self, state) -> None:
        self.__init__(state["address"], state["authkey"])

    def _call(self, *request):
        with self._lock:
            conn = self._free.pop() if self._free else None
        if conn is None:
            conn = Client(self.address, authkey=self.authkey)
        try:
            conn.send(request)
            reply = conn.recv()
        except BaseException:
            conn.close()
            raise
        with self._lock:
            self._free.append(conn)
        return reply

    def _wait(self, *request):
        """A request that waits for the driver; ``None`` if the driver has gone (the connection is lost)."""
        try:
            return self._call(*request)
        except (EOFError, OSError):
            return None

    def first_round(self, deadline_s: float) -> Optional[int]:
        """The round in progress (where a task joins); ``None``: told to stop, none within ``deadline_s``, or no driver."""
        return self._wait("first", deadline_s)

    def word(self, seq: int, deadline_s: float) -> Optional[tuple]:
        """The driver's word for round ``seq``, unpickled, or :data:`~sparkdl_avg.shared.wire.standing.PASSED`.

        ``None``: told to stop, no word within ``deadline_s``, or no driver.
        """
        reply = self._wait("word", seq, deadline_s)
        if reply is None:
            return None
        return PASSED if reply == PASSED else pickle.loads(reply)

    def owed(self, seq: int, workers: Sequence[int]) -> bool:
        """Whether round ``seq`` still waits for ``workers``' answers (see :func:`~sparkdl_avg.shared.wire.board.owed`)."""
        return bool(self._call("owed", seq, [int(w) for w in workers]))

    def answer(self, seq: int, batches: Sequence[Any]) -> None:
        """Sends each worker's rows of round ``seq`` (one Arrow batch per worker)."""
        for batch in batches:
            self._call("answer", seq, batch.column("worker")[0].as_py(), ipc_bytes(batch))

    def fetch(self, key: str) -> Optional[bytes]:
        """The bytes the driver keeps under ``key`` (:meth:`RoundServer.keep`); ``None`` if it keeps none."""
        return self._call("fetch", key)

    def close(self) -> None:
        """Closes this task's connections."""
        with self._lock:
            conns, self._free = self._free, []
        for conn in conns:
            conn.close()


class RemoteArrays:
    """A round's arrays the driver keeps until a task asks for them (:meth:`RoundServer.keep`): a read-only sequence.

    With ``optimizer_state="local"`` a worker trains from its own optimizer variables and needs the driver's only to
    start or restart, so a word carries their shapes alone and a task that needs them fetches them once (on the first
    access of an array). ``specs``: ``(dtype, shape)`` per array, read without fetching.
    """

    def __init__(self, board: NetBoard, key: str, specs) -> None:
        self.board, self.key, self.specs = board, key, [(np.dtype(d), tuple(s)) for d, s in specs]
        self._arrays: Optional[List[np.ndarray]] = None

    def __getstate__(self):
        return {"board": self.board, "key": self.key, "specs": self.specs}

    def __setstate__(self, state) -> None:
        self.__init__(state["board"], state["key"], state["specs"])

    def _fetched(self) -> List[np.ndarray]:
        if self._arrays is None:
            from .local_state import from_bytes

            try:
                data = self.board.fetch(self.key)
            finally:
                self.board.close()  # fetched once: no connection kept per round
            if data is None:
                raise RuntimeError(f"The driver no longer keeps {self.key!r}: its round is over.")
            self._arrays = from_bytes(data, self)
        return self._arrays

    def __len__(self) -> int:
        return len(self.specs)

    def __getitem__(self, i):
        return self._fetched()[i]

    def __iter__(self):
        return iter(self._fetched())


class RoundServer:
    """The driver's side: one standing job's words and answers, served to its tasks (thread-safe).

    Args:
        host: The address the executors reach the driver at (``spark.driver.host``).
        bind: The address to listen on (``spark.driver.bindAddress``); default ``host``.

    The port is the system's choice. :meth:`close` stops serving (after the job has ended).
    """

    def __init__(self, host: str, bind: Optional[str] = None) -> None:
        self._key = os.urandom(32)
        self._listener = Listener((bind or host, 0), family="AF_INET", authkey=self._key)
        self.address = (host, self._listener.address[1])
        self._cond = threading.Condition()
        self._store = MemoryStore()  # the board's entries (shared/wire/board.py), guarded by _cond
        self._kept: Dict[str, bytes] = {}  # what RemoteArrays fetch, by key
        self._closed = False
        self._conns: List[Any] = []
        self._accepted = 0  # connections that passed the key's challenge
        threading.Thread(target=self._accept, name="sparkdl_avg-round-server", daemon=True).start()

    def board(self) -> NetBoard:
        """What the job's tasks are given to reach this server."""
        return NetBoard(self.address, self._key)

    def _perform(self, program):
        """Runs one of the board's step programs on this server's entries, at once (holding the lock)."""
        with self._cond:
            reply = perform(program, self._store)
            self._cond.notify_all()
            return reply

    def announce(self, seq: int, word: bytes, keep_from: Optional[int] = None) -> None:
        """The word for round ``seq``; the rounds before ``keep_from`` (default ``seq``) are over."""
        self._perform(protocol.announce(seq, word, keep_from))

    def reached(self) -> bool:
        """Whether any task has connected (``False`` once a job has ended: its executors cannot reach this address)."""
        with self._cond:
            return self._accepted > 0

    def keep(self, key: str, arrays: Sequence[np.ndarray]) -> RemoteArrays:
        """Keeps ``arrays`` for the tasks to fetch until :meth:`forget`; what a word carries in their place."""
        from .local_state import to_bytes

        specs = [(np.asarray(a).dtype, np.shape(a)) for a in arrays]
        data = to_bytes(arrays)
        with self._cond:
            self._kept[key] = data
        return RemoteArrays(self.board(), key, specs)

    def forget(self, key: str) -> None:
        """Drops what :meth:`keep` kept under ``key``."""
        with self._cond:
            self._kept.pop(key, None)

    def stop(self) -> None:
        """Tells the tasks to end, whichever round they wait for."""
        self._perform(protocol.stop())

    def collect(self, seq: int, workers: Sequence[int]) -> Optional[List[Any]]:
        """The rows of round ``seq`` once all ``workers`` have answered, else ``None``."""
        data = self._perform(protocol.collect(seq, [int(w) for w in workers]))
        return None if data is None else [batch for d in data for batch in ipc_batches(d)]

    def close(self) -> None:
        """Stops serving: the listener closed and every connection shut (the tasks' next request finds no driver)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            perform(protocol.stop(), self._store)
            self._cond.notify_all()
            conns, self._conns = self._conns, []
        try:  # wakes the accepting thread (a socket closed under a blocked accept does not), which then ends
            socket.create_connection(self._listener.address, timeout=1.0).close()
        except OSError:
            pass
        self._listener.close()
        for conn in conns:  # each connection's thread closes it, once its wait for a request ends here
            try:
                with socket.socket(fileno=os.dup(conn.fileno())) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed by its thread
                pass

    def _accept(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except Exception as exc:  # noqa: BLE001 - a client without the key, or the listener closed
                if self._closed:
                    return
                logger.debug("standing job: a connection refused: %s", exc)
                continue
            with self._cond:
                if self._closed:
                    conn.close()
                    return
                self._conns.append(conn)
                self._accepted += 1
            threading.Thread(target=self._serve, args=(conn,), name="sparkdl_avg-round-conn", daemon=True).start()

    def _serve(self, conn) -> None:
        try:
            while True:
                request = conn.recv()
                conn.send(getattr(self, "_on_" + request[0])(*request[1:]))
        except (EOFError, OSError):
            pass  # the task ended, or the server closed
        finally:
            with self._cond:
                if conn in self._conns:
                    self._conns.remove(conn)
            conn.close()

    def _wait_until(self, program_of, deadline_s: float):
        """Runs ``program_of()`` (holding the condition) until it answers other than WAIT; ``None`` at the deadline."""
        deadline = time.monotonic() + deadline_s
        with self._cond:
            while True:
                reply = perform(program_of(), self._store)
                if reply is not WAIT:
                    return reply
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def _on_first(self, deadline_s: float) -> Optional[int]:
        return self._wait_until(protocol.first_round, deadline_s)

    def _on_word(self, seq: int, deadline_s: float):
        return self._wait_until(lambda: protocol.word(seq), deadline_s)

    def _on_fetch(self, key: str) -> Optional[bytes]:
        with self._cond:
            return self._kept.get(key)

    def _on_owed(self, seq: int, workers: List[int]) -> bool:
        return bool(self._perform(protocol.owed(seq, workers)))

    def _on_answer(self, seq: int, worker: int, data: bytes) -> bool:
        return bool(self._perform(protocol.answer(seq, int(worker), data)))
