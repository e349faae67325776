"""The standing round job through the driver's socket (sparkdl_avg.shared.wire.standing_net), without Spark.

What only the socket has (the questions both boards answer alike are in
tests/transport/test_round_protocol.py): the task body
(``run_standing_rounds``) runs in threads with a :class:`NetBoard`; the test
plays the driver with a :class:`RoundServer` on 127.0.0.1. The same body and server run in real Spark jobs in
tests/fit/test_overlap.py and, across hosts, tests/runtime/test_hosts.py.
"""

import threading
import time
from multiprocessing.connection import Client

import pytest

from sparkdl_avg.shared.wire import standing
from sparkdl_avg.shared.wire.standing_net import NetBoard, RoundServer

from test_round_protocol import CALLS, fake_entry, start_task, wait_answers


@pytest.fixture
def server():
    CALLS.clear()
    s = RoundServer("127.0.0.1")
    yield s
    s.close()


TRAINING, RELEASE = threading.Event(), threading.Event()


def slow_entry(task, workers):
    """Round 0 trains until the test releases it."""
    if task == 0:
        TRAINING.set()
        assert RELEASE.wait(10)
    yield from fake_entry(task, workers)


def test_a_task_reads_the_round_announced_ahead_while_it_trains_the_one_before(server, monkeypatch):
    """overlap_rounds across hosts: round 1's word (its state) is read while round 0 trains, not after."""
    training, release, served = TRAINING, RELEASE, []
    training.clear(), release.clear()
    on_word = RoundServer._on_word

    def spy(self, seq, deadline_s):
        reply = on_word(self, seq, deadline_s)
        served.append((seq, training.is_set() and not release.is_set()))
        return reply

    monkeypatch.setattr(RoundServer, "_on_word", spy)

    server.announce(0, standing.go(slow_entry, 0))
    task = start_task(server, [0])
    assert training.wait(10)
    server.announce(1, standing.go(slow_entry, 1), keep_from=0)
    deadline = time.monotonic() + 10
    while (1, True) not in served and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (1, True) in served, served  # round 1's word went out while round 0 trained
    release.set()
    assert wait_answers(server, 0, [0]) == ["round 0"] and wait_answers(server, 1, [0]) == ["round 1"]
    server.stop()
    task.join(10)
    assert not task.is_alive()
    assert CALLS == [(0, 0), (1, 0)]


def test_a_task_ends_when_the_driver_goes_or_says_nothing_within_its_deadline(server):
    task = start_task(server, [0], deadline_s=0.2)
    task.join(10)
    assert not task.is_alive() and CALLS == []
    server.announce(0, standing.go(fake_entry, 0))
    task = start_task(server, [0])
    wait_answers(server, 0, [0])
    server.close()  # the driver gone: no stop word, the connection lost
    task.join(10)
    assert not task.is_alive()
    # nothing of the server left: its accepting thread ends (a closed socket alone would not wake it) and its port
    # takes no connection
    deadline = time.monotonic() + 5
    while any(t.name == "sparkdl_avg-round-server" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name == "sparkdl_avg-round-server" for t in threading.enumerate())
    with pytest.raises(ConnectionRefusedError):
        Client(server.address, authkey=server.board().authkey)


def test_a_client_without_the_key_is_refused_and_the_server_serves_on(server):
    from multiprocessing import AuthenticationError

    with pytest.raises(AuthenticationError):
        Client(server.address, authkey=b"not the key")
    board = NetBoard(server.address, server.board().authkey)
    server.announce(0, standing.go(fake_entry, 3))
    assert board.first_round(1.0) == 0
    entry, task = board.word(0, 1.0)
    assert task == 3 and board.owed(0, [0])
    board.close()


def test_optimizer_variables_the_driver_keeps_are_fetched_only_when_a_task_reads_them(server, monkeypatch):
    """optimizer_state="local": a word carries the optimizer variables' shapes alone; a worker that starts or restarts
    its own state fetches them once."""
    import pickle

    import numpy as np

    from sparkdl_avg.shared.wire.local_state import from_bytes, to_bytes

    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array(7, dtype=np.int64)]
    remote = pickle.loads(pickle.dumps(server.keep("round-1", arrays)))  # as a word carries it
    fetched = []
    fetch = NetBoard.fetch
    monkeypatch.setattr(NetBoard, "fetch", lambda self, key: fetched.append(key) or fetch(self, key))
    assert len(remote) == 2 and remote.specs == [(np.dtype("float32"), (2, 3)), (np.dtype("int64"), ())]
    assert from_bytes(to_bytes(arrays), remote)[1] == 7 and fetched == []  # a template without its data
    np.testing.assert_array_equal(remote[0], arrays[0])
    assert int(list(remote)[1]) == 7 and fetched == ["round-1"]  # once
    server.forget("round-1")
    late = pickle.loads(pickle.dumps(server.keep("round-2", arrays)))
    server.forget("round-2")
    with pytest.raises(RuntimeError, match=r"^The driver no longer keeps 'round-2': its round is over\.$"):
        late[0]
