"""Issue 50, part 5: ``state_transport="auto"`` learns the driver link's rate from the rounds' records and re-chooses.

The estimator and the hysteresis on synthetic records (numbers against hand-computed references); a fit on a
link made slow in proportion to its bytes switches from Spark's tree to the sharded Spark SQL round once, and says so.
"""

import logging
import time
import types

import pytest

from conftest import make_model, regression_data
from sparkdl_avg import ParameterAveragingTrainer
from sparkdl_avg.driver.observe.costmodel import is_cold
from sparkdl_avg.driver.transport import link_rate
from sparkdl_avg.driver.transport.link_rate import LinkChoice, estimate_rate, learns, path_seconds, round_rate
from sparkdl_avg.driver.transport.policy import SHARDED_STAGE_S, driver_bound_pays


def _round(transport="spark", aggregation="", workers=3, nbytes=4_000_000, aggregate_s=1.0, driver_sum_s=0.0,
           cold=False, other_s=0.0):
    """A synchronous round's record as the estimator reads it: ``nbytes`` of sums per worker; 1 s of compute, then the
    sums' way back and ``other_s`` more (the state out, the job) in its wall time."""
    return types.SimpleNamespace(transport=transport, aggregation=aggregation, num_workers=workers,
                                 sent_bytes=workers * nbytes, aggregate_s=aggregate_s, driver_sum_s=driver_sum_s,
                                 chunk=None, replicas_built=int(cold), workers=[], compute_max_s=1.0,
                                 wall_s=1.0 + aggregate_s + other_s)


def test_one_rounds_rate_reads_the_bytes_through_the_path_it_took():
    # Spark's tree: 3 x 4 MB through the driver's link in 1.0 s, of which 0.04 s summing on the driver
    assert round_rate(_round(aggregate_s=1.0, driver_sum_s=0.04)) == pytest.approx(12e6 / 0.96)
    assert round_rate(_round("sql", "driver", aggregate_s=0.5)) == pytest.approx(12e6 / 0.5)
    # sharded: 2/3 of each worker's 4 MB over the workers' links, then the 4 MB of summed slices into the driver,
    # after the second stage's fixed cost
    assert round_rate(_round("sql", "shuffle", aggregate_s=0.3 + 0.32)) == pytest.approx(5 / 3 * 4e6 / 0.32)
    # nothing to say: files (no link), no bytes, chunks of stale rounds
    assert round_rate(_round("files")) is None
    assert round_rate(_round(nbytes=0)) is None
    assert round_rate(types.SimpleNamespace(**{**vars(_round()), "chunk": 3})) is None


def test_the_estimate_is_the_median_of_the_latest_steady_rounds():
    seconds = [9.0, 1.0, 1.2, 0.8, 5.0, 1.1, 0.9, 1.0]  # a cold first round, a slow one (a GC) in the middle
    records = [_round(aggregate_s=s, cold=i == 0) for i, s in enumerate(seconds)]
    rate, rounds = estimate_rate(records, lambda r: not is_cold(r))
    # the latest 5 steady rounds: 0.8, 5.0, 1.1, 0.9, 1.0 s -> median 1.0 s for 12 MB
    assert rounds == 5 and rate == pytest.approx(12e6 / 1.0)
    assert estimate_rate([_round("files")]) is None


def test_the_paths_cost_what_driver_bound_pays_decides_by():
    # 100 Mbit/s = 12.5 MB/s, 3 workers x 4 MB: driver-bound 0.96 s, sharded 0.3 + (2/3 + 1) x 0.32 s
    assert path_seconds(True, 3, 4e6, 12.5e6) == pytest.approx(0.96)
    assert path_seconds(False, 3, 4e6, 12.5e6) == pytest.approx(SHARDED_STAGE_S + 5 / 3 * 0.32)
    assert not driver_bound_pays(3, 4e6, 12.5e6)  # 0.96 against 0.83 s: the model's choice; auto's margin keeps it
    assert driver_bound_pays(3, 4e6, 125e6)  # at 1 Gbit/s: 0.096 against 0.35 s
    assert path_seconds(True, 8, 16 << 20, 1e9) == float("inf")  # 128 MB of sums: more than the driver holds


def test_a_slow_link_switches_once_and_only_on_clear_evidence():
    choice = LinkChoice("spark", lambda r: not is_cold(r))
    # the tree's rounds: 2.4 s for the sums, 1.04 s more for the state going out (3.44 s beyond compute)
    slow = [_round(aggregate_s=9.0, cold=True)] + [_round(aggregate_s=2.4, other_s=1.04)] * 2
    assert choice.consider(slow, 3) is None  # 2 steady rounds: not yet
    switch = choice.consider(slow + [_round(aggregate_s=2.4, other_s=1.04)], 4)
    assert switch is not None and switch.transport == "sql" and choice.current == "sql"
    assert switch.rate == pytest.approx(5e6) and switch.rounds == 3
    assert switch.now_s == pytest.approx(2.4) and switch.then_s == pytest.approx(0.3 + 5 / 3 * 0.8)
    text = switch.message("spark", "the fit's round 5", link_rate.assumed_rate())
    assert link_rate._rate(2e3) == "16 kbit/s" and link_rate._rate(5e5) == "4 Mbit/s"
    assert text == ("state_transport='auto': the driver's link measured 40 Mbit/s (the median of 3 rounds; 3 "
                    "workers' sums of 4.00 MB each), where the first choice assumed 1.00 Gbit/s: switching from "
                    "'spark' to 'sql', the Spark SQL round (sums sharded through the shuffle), from the fit's round "
                    "5, which should bring the sums back in about 1.63 s a round instead of 2.40 s. Pass "
                    "network_rate to fix the choice.")
    # on the sharded path now, fast: 4 MB in 0.01 s past the stage reads as 667 MB/s, where the model would put
    # the tree at 0.02 s; but the tree measured 2.4 s, and that is what it is predicted to take: no flip back
    records = slow + [_round(aggregate_s=2.4, other_s=1.04)] + [_round("sql", "shuffle", aggregate_s=0.31)] * 20
    assert choice.consider(records, 24) is None and choice.current == "sql"
    # the shuffle's sums grown slow (3.5 s a round, no slower beyond compute than the tree's 3.44 s by MARGIN): back
    # to the tree by the model, but not within SWITCH_EVERY rounds of the switch
    slower = slow + [_round(aggregate_s=2.4, other_s=1.04)] + [_round("sql", "shuffle", aggregate_s=3.5)] * 9
    assert choice.consider(slower, 13) is None
    back = choice.consider(slower + [_round("sql", "shuffle", aggregate_s=3.5)], 14)
    assert back is not None and back.transport == "spark" and back.now_s == pytest.approx(3.5) and not back.back
    assert back.then_s == pytest.approx(2.4)


def test_a_switch_whose_rounds_took_longer_is_undone_after_three_steady_rounds_and_the_path_kept():
    """The hosts at 10 Mbit/s: the shuffle brought the sums back sooner, its rounds took longer (the state out)."""
    choice = LinkChoice("spark", lambda r: not is_cold(r))
    tree = [_round(aggregate_s=2.4, other_s=9.8)] * 3  # 3 x 1 MB in 2.4 s: 1.25 MB/s; 12.2 s beyond compute
    switch = choice.consider(tree, 3)
    assert switch.transport == "sql" and not switch.back
    shuffle = [_round("sql", "shuffle", nbytes=1_000_000, aggregate_s=1.1, other_s=25.0, cold=True)]
    shuffle += [_round("sql", "shuffle", nbytes=1_000_000, aggregate_s=1.1, other_s=25.0)] * 2
    assert choice.consider(tree + shuffle, 6) is None  # the first round on the new path is cold: 2 steady so far
    shuffle.append(_round("sql", "shuffle", nbytes=1_000_000, aggregate_s=1.1, other_s=25.0))
    back = choice.consider(tree + shuffle, 7)
    assert back.back and back.transport == "spark" and choice.current == "spark"
    assert (back.rounds, back.now_s, back.then_s, back.rate) == (3, pytest.approx(26.1), pytest.approx(12.2),
                                                                 switch.rate)
    assert back.message("sql", "the fit's round 8", link_rate.assumed_rate()) == (
        "state_transport='auto': 3 rounds on 'sql' took 26.10 s beyond compute (the median), against 12.20 s on "
        "'spark' before the switch: going back to 'spark' from the fit's round 8, for the rest of the fit. Pass "
        "network_rate to fix the choice.")
    # settled: whatever the tree's rounds measure from now on, the fit stays on it
    assert choice.consider(tree + shuffle + [_round(aggregate_s=2.4, other_s=9.8)] * 30, 37) is None
    # a switch whose rounds took no longer (within MARGIN) stays
    kept = LinkChoice("spark", lambda r: True)
    assert kept.consider(tree, 3).transport == "sql"
    same = [_round("sql", "shuffle", nbytes=1_000_000, aggregate_s=1.1, other_s=13.0)] * 5  # 14.1 s <= 1.25 x 12.2
    assert kept.consider(tree + same, 8) is None and kept.current == "sql"


def test_a_small_difference_does_not_switch():
    choice = LinkChoice("spark", lambda r: True)
    # 3 x 1 MB in 0.5 s: 6 MB/s; driver-bound 0.5 s, sharded 0.3 + 5/3 x 0.167 = 0.578 s: dearer
    assert choice.consider([_round(nbytes=1_000_000, aggregate_s=0.5)] * 5, 5) is None
    # 3 x 1 MB in 0.8 s: sharded 0.3 + 5/3 x 0.267 = 0.744 s, cheaper, but within the margin
    assert choice.consider([_round(nbytes=1_000_000, aggregate_s=0.8)] * 5, 5) is None
    assert choice.current == "spark"


def test_only_auto_on_hosts_of_their_own_without_a_given_rate_learns():
    assert learns("auto", None, "auto", "sync", connect=False, one_host=False)
    assert not learns("auto", "100mbit", "auto", "sync", connect=False, one_host=False)  # the user's rate wins
    assert not learns("spark", None, "auto", "sync", connect=False, one_host=False)
    assert not learns("auto", None, "shuffle", "sync", connect=False, one_host=False)
    assert not learns("auto", None, "auto", "stale", connect=False, one_host=False)
    assert not learns("auto", None, "auto", "sync", connect=True, one_host=False)
    assert not learns("auto", None, "auto", "sync", connect=False, one_host=True)


def test_a_fit_on_a_slow_link_switches_path_once_and_says_so(spark, monkeypatch, caplog):
    """local[2] taken for hosts of their own, 3 workers; every round's sums wait as on links of S / 0.6 s per worker's
    S: the tree brings 3 S through the driver's, the shuffle (2/3 + 1) S through the workers' and then the driver's."""
    from sparkdl_avg.driver.runtime.session import Engine
    from sparkdl_avg.driver.config.options import AGGREGATIONS
    from sparkdl_avg.driver.transport.base import StateTransport

    monkeypatch.setattr(Engine, "one_host", property(lambda self: False))
    run_job = StateTransport.run_job
    per_worker_s = 0.6

    def slow_link(self, name, weights, optimizer, make_task, entry, workers, what, **kw):
        out = run_job(self, name, weights, optimizer, make_task, entry, workers, what, **kw)
        sharded = self.last_plan is not None and AGGREGATIONS.get(self.last_plan[0]).sharded
        time.sleep(per_worker_s * ((2 - 1 / len(workers)) if sharded else len(workers)))
        return out

    monkeypatch.setattr(StateTransport, "run_job", slow_link)
    x, y = regression_data(3 * 32 * 7, seed=5)
    trainer = ParameterAveragingTrainer(make_model(), num_workers=3, batch_size=32, averaging_frequency=1,
                                        seed=1, slow_warning=False)
    with caplog.at_level(logging.INFO, logger="sparkdl_avg"):
        history = trainer.fit((x, y), epochs=1, verbose=0, shuffle=False)
    records = trainer.stats.records
    paths = [(r.transport, r.aggregation) for r in records]
    switched = next(i for i, p in enumerate(paths) if p[0] == "sql")
    assert paths == [("spark", "")] * switched + [("sql", "shuffle")] * (len(paths) - switched), paths
    assert 3 <= switched <= 6 and len(paths) == 7
    lines = [r.getMessage() for r in caplog.records if "switching from 'spark' to 'sql'" in r.getMessage()]
    assert len(lines) == 1 and f"from the fit's round {switched + 1}," in lines[0]
    # each round recorded the rate it measured: on the tree about S / 0.6 s (the job's latency makes it lower); on
    # the shuffle its seconds less SHARDED_STAGE_S, which local[2] runs in less: higher, and only recorded
    nbytes = records[-1].sent_bytes / 3
    for r in records[switched - 3:switched]:
        assert 0.6 * nbytes / per_worker_s <= r.link_rate <= nbytes / per_worker_s * 1.01, r.link_rate
    assert all(r.link_rate > 0 for r in records[switched:])
    assert f"{nbytes / 1e3:.3g} kB each" in lines[0] and "kbit/s (the median of 3 rounds" in lines[0]
    assert all(v == v for v in history.history["loss"])
