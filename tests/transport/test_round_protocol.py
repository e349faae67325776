"""The standing round job's protocol (docs/round-protocol.md): a model of its interleavings, and one
conformance suite for both boards. No Spark.

The model runs in one thread. The driver, each task attempt, its prefetching
reader and its answer sender are *actors*: generators that yield one
primitive operation of the board's store at a time, through the same step
programs the files board and the socket server run
(:mod:`sparkdl_avg.shared.wire.board`). Hypothesis picks which actor takes
the next step, which one stalls (anywhere, or right after a query of a
chosen kind: between a read and what it does with the answer) while the
others run on, when a task attempt dies (and Spark retries it), when an
attempt outlives its round (a retry starts while it runs on), and when the
driver re-plans (a membership change: the job stops, a new one starts); the
protocol's numbered invariants are checked after every step.
"""

import itertools
import threading

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sparkdl_avg.executor import worker
from sparkdl_avg.shared.wire import board as protocol
from sparkdl_avg.shared.wire import exchange, standing
from sparkdl_avg.shared.wire.board import PASSED, WAIT, MemoryStore, answer_name, round_name
from sparkdl_avg.shared.wire.standing_net import RoundServer

# ----------------------------------------------------------------------------------------------- the model

TURNS = 200  # the most turns each actor takes in a stall (a whole fit of 8 rounds takes about 100)
QUERIES = {"driver": ["list", "read", "miss"], "task": ["list", "exists", "read", "miss"],
           "reader": ["list", "exists", "read", "miss"], "sender": ["exists"]}  # the queries each kind of actor makes


class Violation(AssertionError):
    """An invariant of the round protocol does not hold; the message names it."""

    raised = 0  # how many were raised (a run that raised one does not run on at its teardown)

    def __init__(self, message) -> None:
        super().__init__(message)
        Violation.raised += 1


CHANGES = itertools.count(1)  # one count for every store: a version never repeats across a driver's jobs


class Store(MemoryStore):
    """The model's board: a dict whose version changes with every change, checking invariant 4 at every removal."""

    def __init__(self) -> None:
        super().__init__()
        self.version = next(CHANGES)

    def do(self, op):
        if op[0] == "remove" and op[1].startswith("done-"):
            seq = int(op[1].split("-")[1])
            if round_name(seq) in self.entries:
                raise Violation(f"invariant 4: {op[1]} removed while its round's word is present")
        if op[0] in ("write", "remove"):
            self.version = next(CHANGES)
        return super().do(op)


class Actor:
    """One generator of store operations (a driver, a task attempt, its reader or sender) and where it stands."""

    def __init__(self, name, program, store, kind) -> None:
        self.name, self.program, self.store = name, program, store
        self.kind = kind  # "driver", "task" (an attempt), "reader" (its prefetching reader) or "sender"
        self.last = None  # its last operation
        self.reply = None
        self.started = False
        self.done = False
        self.result = None
        self.blocked_at = None  # the store's version when its last poll, which found nothing (WAIT), began
        self.polled_from = None  # the store's version at the first operation of the poll under way
        self.waiting_on = None  # the actor it joins (a task's reader or sender), until that one ends
        self.children = []

    def did(self, query) -> bool:
        """Whether its last operation was ``query`` ("list", "exists", "read"), or "miss": a read that found nothing."""
        if query == "miss":
            return self.last is not None and self.last[0] == "read" and self.reply is None
        return self.last is not None and self.last[0] == query

    def runnable(self) -> bool:
        if self.done or (self.waiting_on is not None and not self.waiting_on.done):
            return False
        return self.blocked_at != self.store.version

    def step(self) -> None:
        try:
            op = self.program.send(self.reply) if self.started else next(self.program)
        except StopIteration as end:
            self.done, self.result = True, end.value
            return
        self.started = True
        self.last = op
        if op[0] == "blocked":  # a poll that found nothing: runnable again once the store changes after it began
            self.blocked_at, self.polled_from, self.reply = self.polled_from, None, None
        elif op[0] == "join":  # waits for another actor (a task's reader or sender) to end
            self.blocked_at, self.waiting_on = None, op[1]
        else:
            if self.polled_from is None:
                self.polled_from = self.store.version
            self.blocked_at = None
            self.reply = self.store.do(op)


def word_of(rnd):
    return f"r{rnd}".encode()


def trained(word, worker_id):
    """What a worker answers for a round's word (training is deterministic: an attempt's answer is its word's)."""
    return word + f"-w{worker_id}".encode()


class Model:
    """A driver and its standing job's tasks (``ids``: the workers of each task), ``rounds`` fit rounds.

    ``ahead``: the driver announces each round while the one before it trains (``overlap_rounds``).
    """

    def __init__(self, rounds, ids, ahead) -> None:
        self.rounds, self.ids, self.ahead = rounds, ids, ahead
        self.store = Store()
        self.actors = []
        self.collected = {}  # fit round -> the answers the driver collected
        self.floor = 0  # the driver's floor once its last announce ended
        self.announcing = False
        self.replan = False
        self.attempts = 0
        self.driver = Actor("driver", self._driver(), self.store, "driver")
        self.actors.append(self.driver)
        for task_ids in ids:
            self.start_attempt(task_ids, self.store)

    # -- the driver (what SqlTransport.run_job and StandingJob do, as the protocol page states it)

    def _announce(self, seq, rnd, keep_from=None):
        self.announcing = True
        yield from protocol.announce(seq, word_of(rnd), keep_from)
        self.announcing = False
        self.floor = max(self.floor, seq if keep_from is None else keep_from)

    def _driver(self):
        seq = -1
        ahead = None  # (fit round, seq) announced ahead
        workers = [w for task_ids in self.ids for w in task_ids]
        for rnd in range(self.rounds):
            if ahead is not None and ahead[0] == rnd:
                this = ahead[1]
            else:
                seq += 1
                this = seq
                yield from self._announce(this, rnd)
            ahead = None
            if self.ahead and rnd + 1 < self.rounds:
                seq += 1
                yield from self._announce(seq, rnd + 1, keep_from=this)
                ahead = (rnd + 1, seq)
            while True:
                found = yield from protocol.collect(this, workers)
                if found is not None:
                    break
                yield ("blocked",)
            if rnd in self.collected:
                raise Violation(f"invariant 1: round {rnd} collected twice")
            expected = [trained(word_of(rnd), w) for w in workers]
            if found != expected:
                raise Violation(f"invariant 1: round {rnd} (seq {this}) collected {found}, expected {expected}")
            self.collected[rnd] = found
            if self.replan and rnd + 1 < self.rounds:  # a membership change: this job stops, a new one starts
                self.replan = False
                yield from protocol.stop()
                self.new_job()
                seq, ahead = -1, None
        yield from protocol.stop()

    def new_job(self):
        """The driver's next standing job: a board of its own, new task attempts; the old job's actors run on."""
        self.store = Store()
        self.driver.store = self.store
        self.floor = 0
        for task_ids in self.ids:
            self.start_attempt(task_ids, self.store)

    # -- a task attempt (what run_standing_rounds does: its prefetching reader and its answer sender as actors)

    def start_attempt(self, task_ids, store):
        """A new attempt of the task of workers ``task_ids`` in the job whose board is ``store``."""
        self.attempts += 1
        actor = Actor(f"task{task_ids}#{self.attempts}", None, store, "task")
        actor.program = self._task(actor, task_ids)
        self.actors.append(actor)
        return actor

    def _poll(self, program_of):
        while True:
            reply = yield from program_of()
            if reply is not WAIT:
                return reply
            yield ("blocked",)

    def _check_not_skipped(self, store, seq, task_ids, why):
        """Invariant 2: a round whose word is present and that these workers have not all answered is not skipped."""
        if round_name(seq) in store.entries and not all(answer_name(seq, w) in store.entries for w in task_ids):
            raise Violation(f"invariant 2: {why} round {seq} while its word is present and unanswered by {task_ids}")

    def _task(self, me, task_ids):
        store = me.store
        seq = yield from self._poll(protocol.first_round)
        if seq is not None:
            for s in range(seq):
                self._check_not_skipped(store, s, task_ids, f"joined at {seq}, above")
        reader = sender = None
        while seq is not None:
            if reader is not None:
                yield ("join", reader)
                word, reader = reader.result, None
            else:
                word = yield from self._poll(lambda: protocol.word(seq))
            if word is None:
                break
            reader = self._child(me, f"{me.name}-read{seq + 1}", self._poll(lambda s=seq + 1: protocol.word(s)), store,
                                 "reader")
            owes = word is not PASSED and (yield from protocol.owed(seq, task_ids))
            if not owes:
                self._check_not_skipped(store, seq, task_ids, "skipped")
            else:
                answers = [trained(word, w) for w in task_ids]  # training: one step, no store operation
                if sender is not None:
                    yield ("join", sender)
                sender = self._child(me, f"{me.name}-send{seq}", self._send(seq, task_ids, answers), store,
                                     "sender")
                sender.sending = (seq, task_ids)
            seq += 1
        if sender is not None:
            yield ("join", sender)

    def _child(self, parent, name, program, store, kind):
        actor = Actor(name, program, store, kind)
        parent.children.append(actor)
        self.actors.append(actor)
        return actor

    def _send(self, seq, task_ids, answers):
        for w, data in zip(task_ids, answers):
            yield from protocol.answer(seq, w, data)

    def kill(self, actor):
        """A task attempt dies (its process with it): it and its reader and sender take no further step."""
        for a in [actor] + actor.children:
            a.done = True

    def tasks(self):
        return [a for a in self.actors if a.name.startswith("task") and "-" not in a.name and not a.done]

    # -- the invariants a step can break without raising at once

    def check(self):
        if not self.announcing:  # invariant 3: no answer below the floor stays, once the answer's own check is done
            for name in self.store.entries:
                if name.startswith("done-") and int(name.split("-")[1]) < self.floor:
                    seq, w = int(name.split("-")[1]), int(name.split("-")[2])
                    in_flight = [a for a in self.actors if not a.done and a.store is self.store
                                 and getattr(a, "sending", None) is not None and a.sending[0] == seq
                                 and w in a.sending[1]]
                    if not in_flight:
                        raise Violation(f"invariant 3: {name} stays below the floor {self.floor}")
        if not self.driver.done and not any(a.runnable() for a in self.actors):  # invariant 5: no deadlock
            raise Violation(f"invariant 5: every actor waits and the driver has collected {sorted(self.collected)} "
                            f"of {self.rounds} rounds; the board holds {sorted(self.store.entries)}")


class RoundProtocol(RuleBasedStateMachine):
    """Hypothesis interleaves the model's actors, failures, late attempts and re-plans; invariants after each step."""

    @initialize(rounds=st.integers(2, 8), ids=st.sampled_from([[[0], [1]], [[0, 1]], [[0], [1], [2]]]),
                ahead=st.booleans())
    def start(self, rounds, ids, ahead):
        self.model = Model(rounds, ids, ahead)
        self.failures = 0
        self.violations = Violation.raised

    @rule(pick=st.integers(0, 63))
    def step(self, pick):
        runnable = [a for a in self.model.actors if a.runnable()]
        if runnable:
            runnable[pick % len(runnable)].step()

    @rule(pick=st.integers(0, 63), steps=st.integers(1, 40))
    def one_stalls(self, pick, steps):
        """One actor stalls (a descheduled thread, a slow link) while the others take ``steps`` steps in turn."""
        runnable = [a for a in self.model.actors if a.runnable()]
        if runnable:
            self._others_run(runnable[pick % len(runnable)], steps)

    @rule(stall=st.sampled_from([(kind, query) for kind, queries in QUERIES.items() for query in queries]))
    def one_stalls_after_a_query(self, stall):
        """Every actor takes steps in turn until one of the chosen kind has made the chosen query (a list, an exists,
        a read, or a "miss": a read that found nothing, a word not announced yet or an answer not posted); that one
        stalls right there, between the query and what it does with the answer (a descheduled thread), while the
        others run on in turn until they all wait."""
        kind, query = stall
        stalled = self._run_until(lambda actor: actor.kind == kind and actor.did(query) and actor.runnable())
        if stalled is not None:
            self._others_run(stalled, TURNS)

    def _run_until(self, reached):
        """Every runnable actor takes a step, in turn (at most ``TURNS`` times), until one has ``reached(actor)``;
        returns that actor, else ``None``."""
        for _ in range(TURNS):
            runnable = [a for a in self.model.actors if a.runnable()]
            if not runnable:
                return None
            for actor in runnable:
                actor.step()
                self.model.check()
                if reached(actor):
                    return actor
        return None

    def _others_run(self, stalled, turns):
        """Every runnable actor but ``stalled`` takes a step, in turn, ``turns`` times or until they all wait."""
        for _ in range(turns):
            others = [a for a in self.model.actors if a.runnable() and a is not stalled]
            if not others:
                return
            for actor in others:
                actor.step()
                self.model.check()

    @precondition(lambda self: self.failures < 3)
    @rule(pick=st.integers(0, 63), outlives=st.booleans(), answered=st.booleans())
    def task_fails(self, pick, outlives, answered):
        """A task attempt fails (or, ``outlives``, Spark gives up on it while it runs on); Spark starts another.

        ``answered``: it fails right after its sender has posted a round's answers (every actor takes steps in turn
        until then), the moment its retry must find that round answered, or over."""
        tasks = self.model.tasks()
        if not tasks or self.model.driver.done:
            return
        self.failures += 1
        victim = tasks[pick % len(tasks)]
        if answered:
            sent = [c for c in victim.children if c.done]
            self._run_until(lambda actor: actor is victim and actor.done
                            or actor.kind == "sender" and actor.done and actor in victim.children and actor not in sent)
        if not outlives:
            self.model.kill(victim)
        task_ids = next(ids for ids in self.model.ids if victim.name.startswith(f"task{ids}#"))
        self.model.start_attempt(task_ids, victim.store)  # a retry belongs to the victim's job

    @precondition(lambda self: not self.model.replan)
    @rule()
    def membership_changes(self):
        self.model.replan = True

    @invariant()
    def holds(self):
        self.model.check()

    def teardown(self):
        # Let every actor run to its end (fairly, in turn): the fit must finish with every round collected.
        if Violation.raised != self.violations:  # a step broke an invariant: that failure is reported, not this one
            return
        model = self.model
        for _ in range(20_000):
            runnable = [a for a in model.actors if a.runnable()]
            if not runnable:
                break
            for actor in runnable:
                actor.step()
                model.check()
        assert model.driver.done, f"the driver did not finish: {sorted(model.collected)}"
        assert sorted(model.collected) == list(range(model.rounds))


RoundProtocol.TestCase.settings = settings(max_examples=1000, stateful_step_count=80, deadline=None,
                                           suppress_health_check=list(HealthCheck), derandomize=True)
test_the_round_protocol_keeps_its_invariants_under_every_interleaving = RoundProtocol.TestCase


# ------------------------------------------------------------------------------ one conformance suite, both boards

CALLS = []


def fake_entry(task, workers):
    """What ``run_round_partition`` yields through the SQL sinks: one batch per worker; ``task`` is a round number."""
    for w in workers:
        CALLS.append((task, w))
        yield pa.RecordBatch.from_pydict({"shard": [-1], "worker": [w], "meta": [f"round {task}"], "data": [None],
                                          "uri": [None], "offsets": [None]}, schema=exchange.round_arrow_schema())


@pytest.fixture(params=["files", "socket"])
def post(request, tmp_path):
    """The driver's side of a standing job's board: files in a directory, or the driver's socket."""
    CALLS.clear()
    if request.param == "files":
        yield standing.FilePost(str(tmp_path))
    else:
        server = RoundServer("127.0.0.1")
        yield server
        server.close()


def task_board(post):
    return standing.board_of(post.board())


def start_task(post, ids, deadline_s=30.0):
    """The body of one task of the job, in a thread; returns the thread (it ends when the task ends)."""
    batches = [pa.RecordBatch.from_pydict({"id": list(ids)})]
    thread = threading.Thread(target=lambda: list(worker.run_standing_rounds(post.board(), deadline_s, batches)))
    thread.start()
    return thread


def wait_answers(post, seq, workers, timeout_s=10.0):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batches = post.collect(seq, workers)
        if batches is not None:
            return [b.column("meta")[0].as_py() for b in batches]
        time.sleep(0.001)
    raise AssertionError(f"no answers to round {seq}")


def test_each_question_has_the_same_answer_on_both_boards(post):
    board = task_board(post)
    assert board.first_round(0.01) is None and board.word(0, 0.01) is None  # nothing announced within the deadline
    post.announce(0, standing.go(fake_entry, 10))
    assert board.first_round(1.0) == 0
    entry, task = board.word(0, 1.0)
    assert task == 10 and board.owed(0, [0]) and post.collect(0, [0]) is None
    board.answer(0, list(fake_entry(0, [0])))
    assert not board.owed(0, [0]) and board.owed(0, [0, 1])
    assert [b.column("meta")[0].as_py() for b in post.collect(0, [0])] == ["round 0"]
    assert post.collect(0, [0, 1]) is None
    post.announce(1, standing.go(fake_entry, 11))  # round 0 over: its word and answers go
    assert board.word(0, 1.0) is PASSED and board.first_round(1.0) == 1 and post.collect(0, [0]) is None
    board.answer(0, list(fake_entry(0, [1])))  # a late attempt's answer to a round that is over is not kept
    assert post.collect(0, [1]) is None
    post.announce(2, standing.go(fake_entry, 12), keep_from=1)  # ahead: round 1 is still in progress
    assert board.first_round(1.0) == 1 and board.word(1, 1.0)[1] == 11 and board.word(2, 1.0)[1] == 12
    assert board.owed(1, [0]) and board.owed(2, [0])
    post.stop()
    assert board.first_round(1.0) is None and board.word(3, 1.0) is None and board.word(2, 1.0) is None
    board.close()


def test_tasks_train_each_announced_round_in_order_and_end_when_told(post):
    post.announce(0, standing.go(fake_entry, 10))
    tasks = [start_task(post, [0]), start_task(post, [1])]
    assert wait_answers(post, 0, [0, 1]) == ["round 10", "round 10"]
    for seq, task in ((1, 11), (2, 12)):
        post.announce(seq, standing.go(fake_entry, task))
        assert wait_answers(post, seq, [0, 1]) == [f"round {task}"] * 2
    post.stop()
    for t in tasks:
        t.join(10)
        assert not t.is_alive()
    assert sorted(CALLS) == [(r, w) for r in (10, 11, 12) for w in (0, 1)]


def test_a_retried_attempt_while_a_round_is_announced_ahead_trains_the_round_in_progress_then_the_one_ahead(post):
    """overlap_rounds: worker 0's task fails in round 1 while round 2 is announced ahead and worker 1 has answered
    both. Its retried attempt joins at round 1 (the lowest word present), not at round 2, and trains round 1, then
    round 2, each once."""
    post.announce(0, standing.go(fake_entry, 0))
    other = start_task(post, [1])
    board = task_board(post)
    board.answer(0, list(fake_entry(0, [0])))  # worker 0's first attempt answers round 0, then fails
    wait_answers(post, 0, [0, 1])
    post.announce(1, standing.go(fake_entry, 1))
    post.announce(2, standing.go(fake_entry, 2), keep_from=1)  # ahead: round 1 still waits for worker 0
    assert wait_answers(post, 1, [1]) == ["round 1"] and wait_answers(post, 2, [1]) == ["round 2"]
    CALLS.clear()
    retried = start_task(post, [0])
    assert wait_answers(post, 1, [0, 1]) == ["round 1"] * 2
    assert wait_answers(post, 2, [0, 1]) == ["round 2"] * 2
    post.announce(3, standing.go(fake_entry, 3), keep_from=2)  # round 1 over; round 2's answers still read
    assert post.collect(1, [0, 1]) is None and wait_answers(post, 2, [0, 1]) == ["round 2"] * 2
    assert wait_answers(post, 3, [0, 1]) == ["round 3"] * 2
    post.stop()
    for t in (retried, other):
        t.join(10)
        assert not t.is_alive()
    assert [c for c in CALLS if c[1] == 0] == [(1, 0), (2, 0), (3, 0)]
    assert [c for c in CALLS if c[1] == 1] == [(3, 1)]
    board.close()


def test_a_task_that_hears_nothing_ends_at_its_deadline(post):
    task = start_task(post, [0], deadline_s=0.2)
    task.join(10)
    assert not task.is_alive()
    post.announce(0, standing.go(fake_entry, 0))
    task = start_task(post, [0], deadline_s=0.2)
    wait_answers(post, 0, [0])
    task.join(10)  # no round 1 comes
    assert not task.is_alive()
