"""``overlap_rounds`` on a classic ``local[2]`` session (tests/parity.py's ``OverlapRoundsMixin``; its Connect run is
in tests/runtime/test_connect.py), and its arithmetic apart from Spark."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import shared_spark
from parity import OverlapRoundsMixin
from sparkdl_avg.driver.algorithms.overlap import PENDING, OneRoundLate, flush
from sparkdl_avg.driver.algorithms.rules import PlainAveraging


# ``local[2,3]`` (3 attempts: a retried task), shared with the other modules that ask for it.
spark = shared_spark("local[2,3]", log_level="OFF")



class TestOverlapRounds(OverlapRoundsMixin):
    """tests/parity.py: the same tests run under Spark Connect in test_connect.py."""


def test_the_rule_applies_each_average_one_round_late_and_the_end_applies_the_last():
    rule = OneRoundLate(PlainAveraging())
    G = [np.array([1.0, 2.0]), np.array(3.0)]
    state = rule.init_state(G, [True, True])
    avg1 = [np.array([1.5, 2.5]), np.array(2.0)]
    after1 = rule.apply(G, G, avg1, state, [True, True], 0.1)
    np.testing.assert_array_equal(after1[0], G[0])  # nothing pending yet
    np.testing.assert_array_equal(state[PENDING][0], [0.5, 0.5])
    avg2 = [np.array([2.0, 2.0]), np.array(2.0)]  # round 2's replicas' mean, from after1
    after2 = rule.apply(after1, after1, avg2, state, [True, True], 0.1)
    np.testing.assert_array_equal(after2[0], [1.5, 2.5])  # round 1's average, applied at round 2's end
    np.testing.assert_array_equal(flush(after2, state)[0], [2.5, 2.5])  # and round 2's at the fit's end
    assert not np.any(state[PENDING][0])
    assert rule.describe() == {"name": "average", "overlap_rounds": True} and rule.name == "average"


@pytest.mark.parametrize("options, message", [
    (dict(synchronization="stale", optimizer_state="reset"),
     r"^The 'overlap_rounds' parameter needs synchronization='sync': .* stale and asynchronous chunks have no round "
     r"to stand in for. Got overlap_rounds=True with synchronization='stale' instead.$"),
    (dict(optimizer_state="average"),
     r"^The 'overlap_rounds' parameter needs optimizer_state='local' or 'reset'.* Got overlap_rounds=True with "
     r"optimizer_state='average' instead.$"),
    (dict(optimizer_state="local", update_rule="bmuf"),
     r"^The 'overlap_rounds' parameter needs update_rule='average': .* Got overlap_rounds=True with "
     r"update_rule='bmuf' instead.$"),
])
def test_overlap_rounds_refuses_what_it_does_not_define_before_any_job(options, message):
    from conftest import make_model
    from sparkdl_avg import ConfigurationError, ParameterAveragingTrainer

    with pytest.raises(ConfigurationError, match=message):
        ParameterAveragingTrainer(make_model(), num_workers=2, overlap_rounds=True, **options)


def test_standing_rounds_socket_is_refused_without_overlap_rounds_before_any_job():
    from conftest import make_model
    from sparkdl_avg import ConfigurationError, ParameterAveragingTrainer

    with pytest.raises(ConfigurationError, match=r"^The 'standing_rounds' parameter 'socket' needs overlap_rounds=True: "
                                                 r".* Got standing_rounds='socket' with overlap_rounds=False "
                                                 r"instead.$"):
        ParameterAveragingTrainer(make_model(), num_workers=2, standing_rounds="socket")


def test_the_drivers_socket_is_refused_where_spark_encrypts_its_traffic_naming_the_setting_and_the_way_out():
    """Overlapped rounds on hosts of their own go through a socket that is authenticated, not encrypted: on a session
    that encrypts Spark's traffic they are refused before any job, unless they run as jobs of their own."""
    from sparkdl_avg.driver.transport.policy import check_standing_rounds, round_socket
    from sparkdl_avg.errors import ConfigurationError

    hosts = dict(connect=False, one_host=False, local_fs=False)
    assert round_socket(True, "auto", **hosts) and round_socket(True, "socket", **{**hosts, "one_host": True})
    assert not round_socket(True, "auto", connect=False, one_host=True, local_fs=True)  # files on one host
    assert not round_socket(True, "off", **hosts) and not round_socket(False, "auto", **hosts)
    assert not round_socket(True, "auto", **{**hosts, "connect": True})
    for key in ("spark.network.crypto.enabled", "spark.ssl.enabled"):
        with pytest.raises(ConfigurationError, match=(
                r"^The 'standing_rounds' parameter must be 'off' with overlap_rounds=True on a session that encrypts "
                rf"Spark's traffic \({key}=true\): .* authenticated but not encrypted\. .* "
                r"Got standing_rounds='auto'\.$")):
            check_standing_rounds("auto", False, socket=True, conf={key: "true"})
        check_standing_rounds("auto", False, socket=False, conf={key: "true"})  # files, or jobs of their own: fine
    check_standing_rounds("auto", False, socket=True, conf={"spark.network.crypto.enabled": "false"})


def test_rounds_announced_a_round_ahead_give_the_sequential_rounds_weights_bitwise(session):
    """Part 2: on one host, an overlap_rounds fit's rounds run in one standing job, each announced while the round
    before it trains; only when they run changes, not the arithmetic (against standing_rounds="off": a Spark job per
    round)."""
    fits = OverlapRoundsMixin()
    trainer, pipelined = fits._fit()
    records = trainer.stats.records
    assert [r.transport for r in records] == ["sql"] * 6
    assert [r.announced_ahead for r in records] == [False] + [True] * 5  # all but the first (no validation)
    from conftest import regression_data

    trainer, validated = fits._fit(validation_data=regression_data(16, d=3, seed=5))
    # a validation (a job of its own) between epochs: each epoch's first round is not announced ahead
    assert [r.announced_ahead for r in trainer.stats.records] == [False, True, True] * 2
    _, files = fits._fit(options=dict(state_transport="files"))  # one Spark job per round
    trainer, sequential = fits._fit(options=dict(state_transport="sql", standing_rounds="off"))  # a SQL job per round
    assert [r.transport for r in trainer.stats.records] == ["sql"] * 6
    assert not any(r.announced_ahead for r in trainer.stats.records)
    for a, b, c, d in zip(pipelined.get_weights(), sequential.get_weights(), files.get_weights(),
                          validated.get_weights()):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(a, d)


def test_a_round_announced_ahead_that_a_callback_made_stale_runs_anew_with_the_sequential_weights(session):
    """A callback that changes the learning rate after round 0: round 1, announced with the old rate, is dropped and
    run anew (not announced ahead); the weights equal the same fit's with a Spark job per round."""
    import keras

    class HalveOnce(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0 and not getattr(self, "done", False):
                self.done = True
                self.model.optimizer.learning_rate.assign(self.model.optimizer.learning_rate / 2)

    fits = OverlapRoundsMixin()
    trainer, pipelined = fits._fit(callbacks=[HalveOnce()])
    assert [r.announced_ahead for r in trainer.stats.records] == [False, False] + [True] * 4
    trainer, sequential = fits._fit(callbacks=[HalveOnce()], options=dict(standing_rounds="off"))
    assert not any(r.announced_ahead for r in trainer.stats.records)
    for a, b in zip(pipelined.get_weights(), sequential.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_rounds_through_the_drivers_socket_give_the_files_rounds_weights_bitwise(session, monkeypatch):
    """Part 2 on hosts of their own: the standing job's words (with the round's state in them) and answers (with the
    sums) go through the driver's socket, which executors on other hosts reach (tests/runtime/test_hosts.py runs it
    across hosts); here on one host (standing_rounds="socket"), against the same fit through local files. A job's
    first round takes its state from a broadcast in the job's closure: its word carries a marker, not the arrays."""
    import pickle

    from conftest import regression_data
    from sparkdl_avg.shared.wire import standing
    from sparkdl_avg.shared.wire.standing_net import RoundServer

    fits = OverlapRoundsMixin()
    validation = regression_data(16, d=3, seed=5)
    _, files = fits._fit()
    _, files_validated = fits._fit(validation_data=validation)
    states = []  # (round's number in its job, where its word's state is) of each word the driver announces
    announce = RoundServer.announce
    monkeypatch.setattr(RoundServer, "announce", lambda self, seq, word, keep_from=None: (
        states.append((seq, type(pickle.loads(word)[1].state).__name__)), announce(self, seq, word, keep_from))[1])
    trainer, socket = fits._fit(options=dict(standing_rounds="socket"))
    records = trainer.stats.records
    assert [(r.transport, r.aggregation) for r in records] == [("sql", "driver")] * 6
    assert [r.announced_ahead for r in records] == [False] + [True] * 5
    assert states == [(0, "Opening")] + [(s, "InlineState") for s in range(1, 6)]
    # a validation (a job of its own) between epochs: the standing job stops and a new one takes the next epoch
    states.clear()
    trainer, validated = fits._fit(validation_data=validation, options=dict(standing_rounds="socket"))
    assert [r.announced_ahead for r in trainer.stats.records] == [False, True, True] * 2
    assert states == [(0, "Opening"), (1, "InlineState"), (2, "InlineState")] * 2
    assert standing.OPENING is pickle.loads(pickle.dumps(standing.OPENING))
    for a, b, c, d in zip(socket.get_weights(), files.get_weights(), validated.get_weights(),
                          files_validated.get_weights()):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(c, d)


def test_executors_that_cannot_reach_the_drivers_socket_get_a_job_per_round_and_a_warning(session, monkeypatch,
                                                                                          caplog):
    """A cluster whose executors cannot connect to spark.driver.host (a firewall): the first standing job ends
    without a task connecting, the fit says so once and runs its rounds one Spark job each, with the same weights."""
    import logging
    import socket

    from sparkdl_avg.shared.wire.standing_net import NetBoard, RoundServer

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()
    monkeypatch.setattr(RoundServer, "board", lambda self: NetBoard(closed, b"k" * 32))
    fits = OverlapRoundsMixin()
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        trainer, unreachable = fits._fit(options=dict(standing_rounds="socket"))
    warnings = [r.getMessage() for r in caplog.records if "could not connect to the driver" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("The executors could not connect to the driver at ")
    assert "each round runs as a Spark job of its own" in warnings[0]
    assert not any(r.announced_ahead for r in trainer.stats.records) and len(trainer.stats.records) == 6
    _, files = fits._fit()
    for a, b in zip(unreachable.get_weights(), files.get_weights()):
        np.testing.assert_array_equal(a, b)
