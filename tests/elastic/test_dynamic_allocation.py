"""Elastic rounds under Spark's dynamic allocation (issue 39): executors requested and released between rounds.

A ``local-cluster[2,1,1024]`` application with dynamic allocation on (shuffle
tracking, as a cluster without an external shuffle service needs), one
executor to start with and at most two. An elastic fit starts on the one
slot, asks Spark for the executor ``max_workers`` lacks, trains on two once it
registers, and goes back to one when dynamic allocation releases an executor
that sat idle while a callback ran. Every epoch still trains each example once.
"""

import threading
import time

import numpy as np
import pytest

from conftest import make_model, regression_data, spark_session
from sparkdl_avg import ParameterAveragingTrainer
from sparkdl_avg.driver.elastic.membership import status_slots

pytestmark = pytest.mark.slow

B, K = 8, 2
DATA = regression_data(2 * B * K * 6, seed=4)  # 6 rounds an epoch on two workers


@pytest.fixture(scope="module")
def spark():
    conf = {
        "spark.dynamicAllocation.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.minExecutors": "1",
        "spark.dynamicAllocation.initialExecutors": "1",
        "spark.dynamicAllocation.maxExecutors": "2",
        # the fit's next round must reach a new executor before it idles this long (5 s: 2 s was tight under load)
        "spark.dynamicAllocation.executorIdleTimeout": "5s",
        "spark.executor.cores": "1",
        "spark.executor.memory": "768m",
    }
    with spark_session("local-cluster[2,1,1024]", "sparkdl_avg-dynamic-allocation", **conf) as session:
        yield session


def wait_for(predicate, timeout, what, busy=None):
    """Polls ``predicate`` every 0.25 s; ``busy``: a SparkContext kept busy meanwhile (tiny jobs, one after another,
    from a thread of their own).

    A busy executor is not idle, so dynamic allocation does not release it
    while the fit waits for another to register: the fit would otherwise
    see the new executor arrive and the old one go at once. The jobs run
    beside the polls, not between them: on a loaded machine a job can take
    longer than ``executorIdleTimeout``, and the requested executor register,
    sit idle and be released between two polls, which is the likely cause of
    CI's failure of 2026-12-07 (no second executor seen in 90 s).
    """
    stop = threading.Event()

    def keep_busy():
        while not stop.is_set():
            busy.parallelize([0], 1).count()
            stop.wait(0.25)

    if busy is not None:
        threading.Thread(target=keep_busy, name="keep-busy", daemon=True).start()
    try:
        deadline = time.time() + timeout
        while not predicate():
            if time.time() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.25)
    finally:
        stop.set()  # its last job may still run: it takes one slot for a moment, as a callback's job would


def test_an_elastic_fit_requests_the_executors_it_lacks_and_lets_idle_ones_go(spark):
    import keras

    sc = spark.sparkContext
    wait_for(lambda: status_slots(sc).count == 1, 60, "the initial executor")

    class Pace(keras.callbacks.Callback):
        """Waits for the requested executor after the first round, then idles past executorIdleTimeout once."""

        def on_train_batch_end(self, batch, logs=None):
            reasons = [c["reason"] for c in trainer.stats.membership]
            if reasons == ["start"]:
                wait_for(lambda: status_slots(sc).count == 2, 90, "the executor the fit requested", busy=sc)
            elif reasons == ["start", "slots joined"] and trainer.stats.records[-1].epoch == 1:
                wait_for(lambda: status_slots(sc).count == 1, 90, "dynamic allocation to release an idle executor")

    trainer = ParameterAveragingTrainer(make_model(seed=1), batch_size=B, averaging_frequency=K, seed=2,
                                        min_workers=1, max_workers=2)
    history = trainer.fit(DATA, epochs=3, verbose=0, callbacks=[Pace()])

    changes = [(c["workers"], c["reason"]) for c in trainer.stats.membership]
    # (a fit still running REQUEST_EVERY_S after its first request asks again, and may grow once more)
    assert changes[:3] == [(1, "start"), (2, "slots joined"), (1, "slots lost")], changes
    joined = trainer.stats.membership[1]
    assert (joined["epoch"], joined["round"]) == (0, 1)  # the round after the one that waited for it
    assert {w.worker for w in trainer.stats.records[1].workers} == {0, 1}
    for epoch in range(3):  # consecutive positions from 0, each example once
        rounds = [r for r in trainer.stats.records if r.epoch == epoch]
        ends = [r.start + r.num_workers * r.averaging_frequency * B for r in rounds]
        assert [r.start for r in rounds] == [0] + ends[:-1]
        assert len(DATA[0]) - rounds[-1].num_workers * B < ends[-1] <= len(DATA[0])
    assert np.isfinite(history.history["loss"]).all()
