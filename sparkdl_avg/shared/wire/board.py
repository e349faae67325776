"""The standing round job's board: the protocol's one implementation, as step programs over a store of entries.

A standing job (docs/round-protocol.md) runs a fit's rounds in ``N`` long tasks: the driver posts its *word* for each
round, the tasks post their *answers*. This module owns what each side may do to the board and in which order; where
the entries live is the store's business:

* ``round-<seq>``: the driver's word for the job's round ``seq`` (0, 1, ...);
* ``done-<seq>-<worker>``: that worker's answer to round ``seq``;
* ``stop``: the tasks end, whichever round they wait for.

Every operation is a *step program*: a generator that yields the store's primitive operations one at a time
(``("list",)``, ``("exists", name)``, ``("read", name)``, ``("write", name, data)``, ``("remove", name)``; a write
replaces an entry atomically) and returns its result. :func:`perform` runs one to its end. The files board runs them on
a directory (:class:`DirectoryStore`, :mod:`sparkdl_avg.shared.wire.standing`), the driver's socket server on a dict
under its lock (:class:`MemoryStore`, :mod:`sparkdl_avg.shared.wire.standing_net`), and the protocol's model test
interleaves the programs of a driver and of many tasks step by step (tests/transport/test_round_protocol.py), checking
the invariants after every step. So both boards are the model, not copies of it.

A query that cannot be answered yet returns :data:`WAIT`: the caller asks again (a poll on files, a condition on the
socket) until its deadline.
"""

from __future__ import annotations

import os
import uuid
from typing import Dict, Generator, Optional, Sequence

STOP = "stop"
PASSED = ("passed",)
""":func:`word`'s answer for a round the driver has moved past (its word removed): it needs no answer."""
WAIT = "wait"
"""The answer of a query that the board cannot give yet (no word announced): ask again."""

Program = Generator[tuple, object, object]


def round_name(seq: int) -> str:
    """The entry of the driver's word for round ``seq``."""
    return f"round-{seq}"


def answer_name(seq: int, worker: int) -> str:
    """The entry of ``worker``'s answer to round ``seq``."""
    return f"done-{seq}-{worker}"


def _seq(name: str, prefix: str) -> Optional[int]:
    """The round number of a ``prefix`` entry's name, else ``None``."""
    if not name.startswith(prefix):
        return None
    number = name[len(prefix):].split("-")[0]
    return int(number) if number.isdigit() else None


# ------------------------------------------------------------------------------------------------ the driver's steps


def announce(seq: int, word: bytes, keep_from: Optional[int] = None) -> Program:
    """Driver: posts the word for round ``seq``; removes every entry of the rounds before ``keep_from`` (the floor).

    ``keep_from``: the lowest round still in progress (default ``seq``). A
    round announced ahead (``overlap_rounds``) keeps the round before it,
    whose tasks still train and whose retried attempt must join there.
    Every word below the floor goes before any answer (invariant 4 of the
    protocol page): a task that finds its answer missing and the word still
    there knows the round still waits for it.
    """
    yield ("write", round_name(seq), word)
    floor = seq if keep_from is None else keep_from
    names = yield ("list",)
    for prefix in ("round-", "done-"):
        for name in names:
            s = _seq(name, prefix)
            if s is not None and s < floor:
                yield ("remove", name)


def stop() -> Program:
    """Driver: tells the tasks to end, whichever round they wait for."""
    yield ("write", STOP, b"")


def collect(seq: int, workers: Sequence[int]) -> Program:
    """Driver: every worker's answer to round ``seq`` (bytes, in ``workers``' order) once all are there, else ``None``.

    The answers stay until a later round's word moves the floor past it: a
    retried task that joins meanwhile finds the round answered.
    """
    found = []
    for w in workers:
        data = yield ("read", answer_name(seq, w))
        if data is None:
            return None
        found.append(data)
    return found


# ------------------------------------------------------------------------------------------------- a task's steps


def first_round() -> Program:
    """Task: the round in progress (the lowest word present: where a task joins); ``None``: told to stop; or WAIT."""
    names = yield ("list",)
    if STOP in names:
        return None
    seqs = [s for s in (_seq(n, "round-") for n in names) if s is not None]
    return min(seqs) if seqs else WAIT


def word(seq: int) -> Program:
    """Task: the word of round ``seq`` (its bytes), :data:`PASSED`, ``None`` (told to stop) or :data:`WAIT`.

    A word that is missing is either not announced yet or removed (the
    round is over). The driver writes the words in order, but with a round
    announced ahead both ``seq`` and a later one may have come since the
    read: so a later word present sends the task back to read ``seq`` again,
    and only a word still missing after a later one was seen is over.
    """
    while True:
        if (yield ("exists", STOP)):
            return None
        data = yield ("read", round_name(seq))
        if data is not None:
            return data
        names = yield ("list",)
        if not any((_seq(n, "round-") or -1) > seq for n in names):
            return WAIT
        if not (yield ("exists", round_name(seq))):
            return PASSED


def owed(seq: int, workers: Sequence[int]) -> Program:
    """Task: whether round ``seq``, whose word the task has read, still waits for ``workers``' answers.

    In this order: answered, then the word still there. The driver removes a
    round's word before its answers, so an answer missing here and the word
    present after it means the round still waits for this task; answers
    removed with the word gone mean the round is over.
    """
    if (yield from answered(seq, workers)):
        return False  # an earlier attempt of this task answered
    return bool((yield ("exists", round_name(seq))))


def answer(seq: int, worker: int, data: bytes) -> Program:
    """Task: posts ``worker``'s answer to round ``seq``; returns whether it is kept.

    An attempt that outlived its round (the floor moved past it while it
    trained) finds the word gone once its answer is written, and removes the
    answer itself: the driver's removal may have listed the entries before
    the answer came (invariant 3).
    """
    yield ("write", answer_name(seq, worker), data)
    if (yield ("exists", round_name(seq))):
        return True
    yield ("remove", answer_name(seq, worker))
    return False


def answered(seq: int, workers: Sequence[int]) -> Program:
    """Task: whether all ``workers`` have answered round ``seq``."""
    for w in workers:
        if not (yield ("exists", answer_name(seq, w))):
            return False
    return True


# ------------------------------------------------------------------------------------------------------- stores


def perform(program: Program, store) -> object:
    """Runs ``program`` to its end on ``store``; returns its result."""
    try:
        op = next(program)
        while True:
            op = program.send(store.do(op))
    except StopIteration as done:
        return done.value


class MemoryStore:
    """The entries in a dict (the driver's socket server, under its lock; the protocol's model test)."""

    def __init__(self) -> None:
        self.entries: Dict[str, bytes] = {}

    def do(self, op: tuple):
        """One primitive operation (see the module docstring)."""
        kind, *args = op
        if kind == "list":
            return list(self.entries)
        if kind == "exists":
            return args[0] in self.entries
        if kind == "read":
            return self.entries.get(args[0])
        if kind == "write":
            self.entries[args[0]] = bytes(args[1])
            return None
        if kind == "remove":
            self.entries.pop(args[0], None)
            return None
        raise ValueError(f"Unknown store operation {kind!r}; expected list, exists, read, write or remove.")


class DirectoryStore:
    """The entries as files in ``directory`` (a local path), each written atomically (a rename)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def do(self, op: tuple):
        """One primitive operation (see the module docstring)."""
        kind, *args = op
        if kind == "list":
            return [n for n in os.listdir(self.directory) if not n.startswith(".")]
        path = os.path.join(self.directory, args[0])
        if kind == "exists":
            return os.path.exists(path)
        if kind == "read":
            try:
                with open(path, "rb") as f:
                    return f.read()
            except FileNotFoundError:
                return None
        if kind == "write":
            tmp = os.path.join(self.directory, f".{args[0]}-{uuid.uuid4().hex}")
            with open(tmp, "wb") as f:
                f.write(args[1])
            os.replace(tmp, path)
            return None
        if kind == "remove":
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            return None
        raise ValueError(f"Unknown store operation {kind!r}; expected list, exists, read, write or remove.")

