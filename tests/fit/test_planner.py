"""The fit loop's parts without Spark: the round planner, the epoch's state and the hooks' dispatch.

The loop itself runs in every fit of the suite; these pin what each part decides on its own:
how an epoch is cut into rounds, what an elastic round asks of the membership, where a resumed
epoch starts, and that the built-in behaviours are called in the loop's order.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from sparkdl_avg.driver.algorithms.schedules import FixedPeriod, PostLocalSGD
from sparkdl_avg.driver.fit import hooks as fit_hooks
from sparkdl_avg.driver.fit.planner import EpochState, PlannedRound, RoundPlanner


def _ctx(epoch_steps=10, k=4, num_workers=2, batch_size=8, examples=160, membership=None, schedule=None):
    settings = SimpleNamespace(num_workers=num_workers, batch_size=batch_size,
                               dataset=SimpleNamespace(num_examples=examples))
    return SimpleNamespace(epoch_steps=epoch_steps, schedule=schedule or FixedPeriod(k), membership=membership,
                           rounds=SimpleNamespace(settings=settings), feedback=None)


def _run(planner, epoch, state, examples=4.0):
    """Plans the epoch's rounds, advancing ``state`` as the loop does after each; returns them."""
    planned = []
    for rnd in planner.rounds(epoch, state):
        planned.append(rnd)
        state.advance(rnd, SimpleNamespace(examples=examples, metric_sums={"loss": examples * 0.5}), 8)
    return planned


def test_an_epoch_is_cut_into_rounds_of_k_and_the_last_round_takes_what_is_left():
    planner = RoundPlanner(_ctx(epoch_steps=10, k=4))
    state = EpochState()
    rounds = _run(planner, 3, state)
    assert [(r.epoch, r.index, r.steps_before, r.steps) for r in rounds] == [(3, 0, 0, 4), (3, 1, 4, 4), (3, 2, 8, 2)]
    assert [r.epoch_may_end for r in rounds] == [False, False, True]
    assert all(r.workers == 2 and r.start is None and r.change is None for r in rounds)
    assert (state.steps_before, state.rounds_done, state.logs) == (10, 3, {"loss": 0.5})
    assert rounds[0].progress_steps(2) is None  # a fixed-size round: the bar counts its k


def test_k_above_an_epoch_is_cut_to_it_and_warned_once_per_fit(caplog):
    planner = RoundPlanner(_ctx(epoch_steps=5, k=32))
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        first = _run(planner, 0, EpochState())
        second = _run(planner, 1, EpochState())
    assert [r.steps for r in first + second] == [5, 5]
    warnings = [r.getMessage() for r in caplog.records if "averaging_frequency=32" in r.getMessage()]
    assert len(warnings) == 1 and "the effective averaging_frequency is 5" in warnings[0]


def test_a_schedule_gets_the_epochs_logs_so_far():
    seen = []

    class Recording(FixedPeriod):
        def period(self, epoch, round, logs):  # noqa: A002
            seen.append((epoch, round, dict(logs)))
            return 3

    planner = RoundPlanner(_ctx(epoch_steps=6, schedule=Recording(3)))
    _run(planner, 0, EpochState(logs={"loss": 9.0}))
    assert seen == [(0, 0, {"loss": 9.0}), (0, 1, {"loss": 0.5})]


def test_post_local_sgd_rounds_are_one_minibatch_until_its_epoch():
    planner = RoundPlanner(_ctx(epoch_steps=3, schedule=PostLocalSGD(switch_epoch=1, period_after=3)))
    assert [r.steps for r in _run(planner, 0, EpochState())] == [1, 1, 1]
    assert [r.steps for r in _run(planner, 1, EpochState())] == [3]


def test_a_resumed_epoch_starts_where_its_checkpoint_stopped_with_its_sums():
    checkpoint = SimpleNamespace(steps_done=8, rounds_done=2, meta=SimpleNamespace(
        position=0, epoch_examples=32.0, epoch_metric_sums={"loss": 8.0}))
    state = EpochState.begin(checkpoint, {"loss": 99.0})
    assert (state.steps_before, state.rounds_done, state.logs) == (8, 2, {"loss": 0.25})
    rounds = _run(RoundPlanner(_ctx(epoch_steps=10, k=4)), 0, state)
    assert [(r.index, r.steps_before, r.steps) for r in rounds] == [(2, 8, 2)]
    assert state.result.examples == 36.0


class _Membership:
    """Elastic rounds' membership as the planner sees it: workers per round, commits."""

    def __init__(self, workers):
        self.workers = list(workers)
        self.max_workers = max(workers)
        self.committed = []

    def plan(self, epoch, rnd):
        last = len(self.workers) - 1
        workers, before = self.workers[min(rnd, last)], self.workers[min(rnd - 1, last)]
        return workers, (SimpleNamespace(workers=workers) if rnd and workers != before else None)

    def commit(self, change):
        self.committed.append(change.workers)


def test_elastic_rounds_take_consecutive_positions_for_the_workers_each_has():
    membership = _Membership([2, 1, 2])
    planner = RoundPlanner(_ctx(k=2, num_workers=2, batch_size=8, examples=100, membership=membership))
    state = EpochState()
    rounds = _run(planner, 0, state)
    # 100 examples, B=8: round 0 takes 2·2·8=32, round 1 (one worker) 16, round 2 32, then 20 left < 2·8
    assert [(r.workers, r.start, r.steps) for r in rounds] == [(2, 0, 2), (1, 32, 2), (2, 48, 2), (2, 80, 1)]
    assert membership.committed == [1, 2]
    assert [r.progress_steps(2) for r in rounds] == [2.0, 1.0, 2.0, 1.0]
    assert rounds[-1].epoch_may_end and not rounds[0].epoch_may_end
    assert state.position == 96


def test_hooks_are_called_in_order_for_each_event_and_unknown_events_are_refused():
    calls = []

    class Recorder(fit_hooks.FitHook):
        def __init__(self, name):
            self.name = name

        def epoch_begin(self, epoch):
            calls.append((self.name, "epoch_begin", epoch))

        def batch_end(self, index, logs):
            calls.append((self.name, "batch_end", index, logs["loss"]))

    hooks = fit_hooks.Hooks([Recorder("a"), fit_hooks.FitHook(), Recorder("b")])
    hooks.epoch_begin(2)
    hooks.round_done(None, None, None)  # no hook overrides it: nothing happens
    hooks.batch_end(5, {"loss": 0.1})
    assert calls == [("a", "epoch_begin", 2), ("b", "epoch_begin", 2), ("a", "batch_end", 5, 0.1),
                     ("b", "batch_end", 5, 0.1)]
    with pytest.raises(AttributeError, match="on_epoch_begin"):
        hooks.on_epoch_begin(2)  # a Keras callback's name is not an event of the loop


def test_checkpoint_saves_get_the_epochs_position_and_the_fits_round_count():
    saved = []
    checkpoints = SimpleNamespace(after_round=lambda *a: saved.append(("round", *a)),
                                  after_epoch=lambda epoch, last: saved.append(("epoch", epoch, last)))
    ctx = SimpleNamespace(rounds_in_fit=7)
    hook = fit_hooks.CheckpointSaves(checkpoints, ctx)
    state = EpochState(steps_before=6, rounds_done=3, position=48, result="sums")
    hook.round_done(PlannedRound(1, 2, 4, 2, 2, None, None, False), state, None)
    hook.round_done(PlannedRound(1, 2, 4, 2, 2, 32, None, False), state, None)
    hook.epoch_saved(1, True)
    assert saved == [("round", 7, 1, 3, 6, "sums", 0), ("round", 7, 1, 3, 6, "sums", 48), ("epoch", 1, True)]
