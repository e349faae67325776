"""The standing round job's file protocol (sparkdl_avg.shared.wire.standing), without Spark.

A task body (``worker.run_standing_rounds``) runs in a thread here, with a
stand-in for the round's entry; the test plays the driver: it announces
rounds, collects the answers and stops the task. Spark Connect runs the same
body in a real job (tests/runtime/test_connect.py).
"""

import threading

import pyarrow as pa
import pytest

from sparkdl_avg.executor import worker
from sparkdl_avg.shared.wire import exchange, standing

CALLS = []


def fake_entry(task, workers):
    """What ``run_round_partition`` yields through the SQL sinks: one batch per worker; ``task`` is a round number."""
    for w in workers:
        CALLS.append((task, w))
        yield pa.RecordBatch.from_pydict({"shard": [-1], "worker": [w], "meta": [f"round {task}"], "data": [None],
                                          "uri": [None], "offsets": [None]}, schema=exchange.round_arrow_schema())


def ids_batch(*ids):
    return pa.RecordBatch.from_pydict({"id": list(ids)})


def start_task(directory, ids, deadline_s=30.0):
    """The body of one task of the job, in a thread; returns the thread (it ends when the task ends)."""
    thread = threading.Thread(target=lambda: list(worker.run_standing_rounds(str(directory), deadline_s,
                                                                             [ids_batch(*ids)])))
    thread.start()
    return thread


def wait_answers(directory, seq, workers, timeout_s=10.0):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batches = standing.collect(str(directory), seq, workers)
        if batches is not None:
            return [b.column("meta")[0].as_py() for b in batches]
        time.sleep(0.001)
    raise AssertionError(f"no answers to round {seq}")


@pytest.fixture(autouse=True)
def fresh_calls():
    CALLS.clear()


def test_tasks_train_each_announced_round_in_order_and_end_when_told(tmp_path):
    standing.announce(str(tmp_path), 0, standing.go(fake_entry, 10))
    tasks = [start_task(tmp_path, [0]), start_task(tmp_path, [1])]
    assert wait_answers(tmp_path, 0, [0, 1]) == ["round 10", "round 10"]
    for seq, task in ((1, 11), (2, 12)):
        standing.announce(str(tmp_path), seq, standing.go(fake_entry, task))
        assert wait_answers(tmp_path, seq, [0, 1]) == [f"round {task}"] * 2
    standing.stop(str(tmp_path))
    for t in tasks:
        t.join(10)
        assert not t.is_alive()
    assert sorted(CALLS) == [(r, w) for r in (10, 11, 12) for w in (0, 1)]
    # Announcing a round removes the round before it and its answers.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done-2-0", "done-2-1", "round-2", "stop"]


def test_a_retried_task_joins_at_the_round_in_progress_and_skips_what_its_worker_answered(tmp_path):
    first = start_task(tmp_path, [0])
    standing.announce(str(tmp_path), 0, standing.go(fake_entry, 0))
    wait_answers(tmp_path, 0, [0])
    standing.announce(str(tmp_path), 1, standing.go(fake_entry, 1))
    wait_answers(tmp_path, 1, [0])
    standing.stop(str(tmp_path))
    first.join(10)
    # A second attempt of the same task: round 1 is the one in progress and its worker answered it.
    (tmp_path / "stop").unlink()
    CALLS.clear()
    retried = start_task(tmp_path, [0])
    standing.announce(str(tmp_path), 2, standing.go(fake_entry, 2))
    wait_answers(tmp_path, 2, [0])
    standing.stop(str(tmp_path))
    retried.join(10)
    assert CALLS == [(2, 0)]


def test_a_task_that_read_a_round_the_driver_has_moved_past_skips_it(tmp_path, monkeypatch):
    """The races a loaded machine hits: a retried task lists round 1 as in progress, then the driver announces
    round 2, removing round 1's word and answers either before the task reads the word or just after."""
    read = standing.word

    def word_then_round_2(directory, seq, deadline_s):
        got = read(directory, seq, deadline_s)
        if seq == 1 and not (tmp_path / "round-2").exists():
            standing.announce(str(tmp_path), 2, standing.go(fake_entry, 2))  # just after the task read it
        return got

    monkeypatch.setattr(standing, "word", word_then_round_2)
    standing.announce(str(tmp_path), 1, standing.go(fake_entry, 1))
    task = start_task(tmp_path, [0])  # answered round 1 in an earlier attempt, whose answer is now removed
    assert wait_answers(tmp_path, 2, [0]) == ["round 2"]
    monkeypatch.setattr(standing, "word", read)
    monkeypatch.setattr(standing, "first_round", lambda directory, deadline_s: 1)  # listed before the removal
    retried = start_task(tmp_path, [1])
    assert wait_answers(tmp_path, 2, [1]) == ["round 2"]
    standing.stop(str(tmp_path))
    for t in (task, retried):
        t.join(10)
        assert not t.is_alive()
    assert CALLS == [(2, 0), (2, 1)]
    assert standing.word(str(tmp_path), 1, 1.0) is standing.PASSED
    assert standing.word(str(tmp_path), 3, 0.01) is None  # not announced yet (and told to stop)


def test_a_task_that_hears_nothing_ends_at_its_deadline(tmp_path):
    task = start_task(tmp_path, [0], deadline_s=0.2)
    task.join(10)
    assert not task.is_alive()
    standing.announce(str(tmp_path), 0, standing.go(fake_entry, 0))
    task = start_task(tmp_path, [0], deadline_s=0.2)
    wait_answers(tmp_path, 0, [0])
    task.join(10)  # no round 1 comes
    assert not task.is_alive()


def test_a_round_announced_ahead_keeps_the_round_in_progress_where_a_retried_attempt_joins(tmp_path):
    """overlap_rounds: round 2 is announced while round 1 trains; round 1's word stays, round 0's files go."""
    d = str(tmp_path)
    standing.announce(d, 0, standing.go(fake_entry, 0))
    first = start_task(tmp_path, [0])
    wait_answers(tmp_path, 0, [0])
    standing.announce(d, 1, standing.go(fake_entry, 1))
    standing.announce(d, 2, standing.go(fake_entry, 2), keep_from=1)  # ahead: round 1 may still train
    assert {"round-1", "round-2"} <= {p.name for p in tmp_path.iterdir()}
    assert not any(p.name in ("round-0", "done-0-0") for p in tmp_path.iterdir())
    assert wait_answers(tmp_path, 1, [0]) == ["round 1"] and wait_answers(tmp_path, 2, [0]) == ["round 2"]
    standing.stop(d)
    first.join(10)
    assert CALLS == [(0, 0), (1, 0), (2, 0)]  # each round once, in order, the next one found waiting
    # A retried attempt joins at round 1 (the lowest announced), which its worker answered: it trains nothing again.
    (tmp_path / "stop").unlink()
    CALLS.clear()
    retried = start_task(tmp_path, [0])
    standing.announce(d, 3, standing.go(fake_entry, 3), keep_from=2)
    wait_answers(tmp_path, 3, [0])
    standing.stop(d)
    retried.join(10)
    assert CALLS == [(3, 0)]


def test_a_retried_attempt_while_a_round_is_announced_ahead_trains_the_round_in_progress_then_the_one_ahead(tmp_path):
    """overlap_rounds: worker 0's task fails in round 1 while round 2 is announced ahead and worker 1 has answered
    both. Its retried attempt joins at round 1 (kept: the lowest word present), not at round 2, and trains round 1,
    then round 2, each once; the round after them removes round 1's word and answers only."""
    d = str(tmp_path)
    standing.announce(d, 0, standing.go(fake_entry, 0))
    other = start_task(tmp_path, [1])
    standing.answer(d, 0, list(fake_entry(0, [0])))  # worker 0's first attempt answers round 0, then fails
    wait_answers(tmp_path, 0, [0, 1])
    standing.announce(d, 1, standing.go(fake_entry, 1))
    standing.announce(d, 2, standing.go(fake_entry, 2), keep_from=1)  # ahead: round 1 still waits for worker 0
    assert wait_answers(tmp_path, 1, [1]) == ["round 1"] and wait_answers(tmp_path, 2, [1]) == ["round 2"]
    names = {p.name for p in tmp_path.iterdir()}
    assert {"round-1", "round-2", "done-1-1", "done-2-1"} <= names
    assert not names & {"round-0", "done-0-0", "done-0-1", "done-1-0", "done-2-0"}
    CALLS.clear()
    retried = start_task(tmp_path, [0])
    assert wait_answers(tmp_path, 1, [0, 1]) == ["round 1"] * 2
    assert wait_answers(tmp_path, 2, [0, 1]) == ["round 2"] * 2
    standing.announce(d, 3, standing.go(fake_entry, 3), keep_from=2)  # round 1 over; round 2's answers still read
    names = {p.name for p in tmp_path.iterdir()}
    assert {"round-2", "round-3", "done-2-0", "done-2-1"} <= names
    assert not any(n in names for n in ("round-1", "done-1-0", "done-1-1"))
    assert wait_answers(tmp_path, 3, [0, 1]) == ["round 3"] * 2
    standing.stop(d)
    for t in (retried, other):
        t.join(10)
        assert not t.is_alive()
    assert [c for c in CALLS if c[1] == 0] == [(1, 0), (2, 0), (3, 0)]
    assert [c for c in CALLS if c[1] == 1] == [(3, 1)]


def test_a_task_waiting_for_a_round_reads_it_when_it_and_the_round_ahead_come_at_once(tmp_path, monkeypatch):
    """The race a round announced ahead adds: a task finds round 1's word missing (not announced yet), and by the
    time it lists the directory the driver has announced round 1 and round 2 after it. Round 2 present does not
    make round 1 over: the task reads round 1's word."""
    import os

    d, listdir = str(tmp_path), os.listdir

    def announce_both_first(path):
        if path == d and not (tmp_path / "round-1").exists():
            monkeypatch.setattr(os, "listdir", listdir)
            standing.announce(d, 1, standing.go(fake_entry, 1))
            standing.announce(d, 2, standing.go(fake_entry, 2), keep_from=1)
        return listdir(path)

    monkeypatch.setattr(os, "listdir", announce_both_first)
    assert standing.word(d, 1, 5.0) == (fake_entry, 1)
    assert standing.word(d, 0, 0.01) is standing.PASSED  # missing, and a later round present: over
