"""The in-process engine (``sparkdl_avg.driver.runtime.inprocess``): fits without Spark, bitwise those on ``local[2]``.

The arithmetic tests (test_identities, test_rules, ...) run their fits on it; this module checks that what they
check there holds on Spark too: the same weights, optimizer variables, histories and evaluations, bit for bit, for
the rules and the state workers keep between rounds; and that it refuses what only Spark runs.
"""

from __future__ import annotations

import numpy as np
import pytest

import keras

from conftest import make_model, regression_data
from sparkdl_avg import ConfigurationError, ParameterAveragingTrainer, testing
from sparkdl_avg.driver.runtime.inprocess import in_process
from sparkdl_avg.shared.model.modelspec import get_state
from sparkdl_avg.shared.wire.local_broadcast import LocalBroadcast

CONFIGS = {
    "sgd": dict(),
    "adam-local-state": dict(optimizer_state="local"),
    "adam-int8-feedback": dict(update_compression="int8"),
    "diloco-local-state": dict(update_rule="diloco", optimizer_state="local"),
}


def _fit(options, **fit_kw):
    adam = "sgd" not in options.get("_name", "")
    model = make_model(optimizer=keras.optimizers.Adam(0.01) if adam else keras.optimizers.SGD(0.1), seed=3)
    options = {k: v for k, v in options.items() if k != "_name"}
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=3, seed=5,
                                        slow_warning=False, **options)
    x, y = regression_data(200, seed=7)
    history = trainer.fit((x, y), epochs=3, verbose=0, validation_data=(x[:40], y[:40]), **fit_kw)
    weights, optimizer = get_state(model)
    return dict(weights=weights, optimizer=optimizer, history=history.history, evaluate=trainer.evaluate((x, y)),
                transport=trainer.stats.records[-1].transport if trainer.stats.records else None)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_fit_in_process_is_bitwise_the_fit_on_local_2(spark, name):
    options = dict(CONFIGS[name], _name=name)
    on_spark = _fit(options)
    with in_process(2):
        here = _fit(options)
    assert here["history"] == on_spark["history"]
    assert here["evaluate"] == on_spark["evaluate"]
    for got, want in zip(here["weights"] + here["optimizer"], on_spark["weights"] + on_spark["optimizer"]):
        np.testing.assert_array_equal(got, want)
    assert len(here["weights"]) == len(on_spark["weights"]) and len(here["optimizer"]) == len(on_spark["optimizer"])


def test_a_fit_in_process_starts_no_spark_and_trains():
    # the unit tier: this test's guard fails it if a Spark JVM starts
    with in_process(2) as engine:
        model = make_model(optimizer=keras.optimizers.SGD(0.1), seed=1)
        before = [w.copy() for w in model.get_weights()]
        trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=0,
                                            slow_warning=False)
        history = trainer.fit(regression_data(96, seed=1), epochs=2, verbose=0)
    assert engine.master == "inprocess[2]" and engine.default_parallelism == 2
    assert [r.transport for r in trainer.stats.records] == ["inprocess"] * 6
    assert history.history["loss"][1] < history.history["loss"][0]
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), before)) > 1e-3
    assert [w.worker for w in trainer.stats.records[0].workers] == [0, 1]


@pytest.mark.parametrize("option, value, expected", [
    ("state_transport", "sql", "The 'state_transport' parameter must be 'auto' on the in-process engine"),
    ("aggregation", "shuffle", "The 'aggregation' parameter must be 'auto' on the in-process engine"),
    ("overlap_rounds", True, "The 'overlap_rounds' parameter must be off on the in-process engine"),
])
def test_options_only_spark_runs_are_refused_before_any_round(option, value, expected):
    model = make_model(seed=1)
    kwargs = {option: value}
    if option == "overlap_rounds":
        kwargs["optimizer_state"] = "local"
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, **kwargs)
    before = [w.copy() for w in model.get_weights()]
    with in_process(2), pytest.raises(ConfigurationError, match=expected):
        trainer.fit(regression_data(64), epochs=1, verbose=0)
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), before))
    assert trainer.stats.records == []


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "2"])
def test_in_process_wants_a_positive_integer_of_workers(bad):
    with pytest.raises(ConfigurationError, match=r"The 'num_workers' parameter of in_process must be an integer >= 1. "
                                                 rf"Got {bad!r:s} instead."):
        with in_process(bad):
            pass


def test_each_read_of_the_stand_in_broadcast_is_a_copy_of_its_own():
    state = ([np.arange(3.0)], None)
    bc = LocalBroadcast(state)
    first = bc.value
    first[0][0][:] = -1  # a task changing what it loaded in place
    assert bc.value[0][0].tolist() == [0.0, 1.0, 2.0]
    bc.destroy()
    with pytest.raises(RuntimeError, match="This broadcast was destroyed"):
        bc.value  # noqa: B018


def test_a_round_entry_installed_by_a_test_runs_in_process_for_each_worker(tmp_path):
    seen, marks = [], str(tmp_path)

    def recording(task, workers):
        import os

        from sparkdl_avg.executor import worker

        ids = list(workers)
        for result in worker.run_round_partition(task, ids):
            seen.append(ids)  # the entry is unpickled per task, as on an executor: this appends to a copy
            open(os.path.join(marks, f"e{task.epoch}-r{task.round}-w{ids[0]}-pid{os.getpid()}"), "w").close()
            yield result

    with in_process(2), testing.RoundEntry(recording):
        trainer = ParameterAveragingTrainer(make_model(seed=1), num_workers=2, batch_size=8, averaging_frequency=2,
                                            seed=0, slow_warning=False)
        trainer.fit(regression_data(64), epochs=1, verbose=0)
    import os

    assert sorted(os.listdir(marks)) == sorted(f"e0-r{r}-w{w}-pid{os.getpid()}" for r in (0, 1) for w in (0, 1))
    assert seen == []  # the test's own list: each task ran on a copy of the entry
    assert [[w.worker for w in r.workers] for r in trainer.stats.records] == [[0, 1], [0, 1]]


def test_a_fit_outside_the_block_runs_on_spark_again(spark):
    with in_process(2):
        pass
    trainer = ParameterAveragingTrainer(make_model(seed=1), num_workers=2, batch_size=8, averaging_frequency=2,
                                        seed=0, slow_warning=False)
    trainer.fit(regression_data(64), epochs=1, verbose=0)
    assert trainer.stats.records[-1].transport == "files"  # "auto" on local[2] with a local staging directory
