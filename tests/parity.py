"""Tests that run unchanged on a classic session and under Spark Connect.

Each class here is a mixin of test methods that take a ``session`` fixture
(as PySpark's own TorchDistributor tests share theirs through ``...Mixin``
classes). A classic test module subclasses it next to its own tests, with
``session`` its classic session; ``tests/test_connect.py`` subclasses it
with ``session`` its Spark Connect session. So one body runs on both
engines, each in a module that holds that session already: no test starts
a Spark session of its own (a Connect server takes ~25 s to start, and one
JVM runs one of the two kinds at a time).

=====================  ==========================  =================
Mixin                  classic subclass            Connect subclass
=====================  ==========================  =================
``TaskRetryMixin``     test_reliability.py         test_connect.py
``EstimatorPathMixin`` test_ml.py                  test_connect.py
``ExecutorCheckMixin`` test_daemon.py              test_connect.py
=====================  ==========================  =================

This module's name does not start with ``test_``: pytest collects the tests
only through the subclasses (whose names start with ``Test``).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from pyspark import cloudpickle

from conftest import assert_weights_close, dropout_model, make_model, regression_data
from sparkdl_avg import BlockMomentum, ConfigurationError, ParameterAveragingTrainer
from sparkdl_avg.executor import worker as worker_module


class TaskRetryMixin:
    """A task whose first attempt fails is retried by Spark (the sessions allow 2+ attempts per task)."""

    def test_a_task_retried_by_spark_gives_exactly_the_weights_of_a_clean_run(self, session, monkeypatch, tmp_path):
        # Dropout: the replicas draw random numbers, which the retried attempt must draw again identically.
        data = regression_data(12 * 2 * 8, seed=11)  # 12 minibatches per worker per epoch

        def fit(model):
            trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=3,
                                                update_rule=BlockMomentum(0.5), seed=3)
            trainer.fit(data, epochs=2, verbose=0)  # numpy arrays: through the active session, `session`
            return trainer

        clean = dropout_model()
        fit(clean)
        cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import this module
        real = worker_module.run_round_partition
        marker = str(tmp_path / "failed-once")
        monkeypatch.setattr(
            worker_module, "run_round_partition", lambda task, it: _fail_first_attempt(real, task, it, marker)
        )
        try:
            retried = dropout_model()
            trainer = fit(retried)
        finally:
            cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        assert os.path.exists(marker)  # the first attempt did fail, and Spark retried it
        assert_weights_close(retried.get_weights(), clean.get_weights(), atol=0)
        assert np.isfinite(trainer.stats.records[-1]["loss"])


def _fail_first_attempt(real, task, iterator, marker):
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if task.epoch == 1 and task.round == 1 and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
        list(iterator)
        open(marker, "w").close()
        raise RuntimeError("injected failure on the first attempt")
    return real(task, iterator)


class EstimatorPathMixin:
    """``kerasModel`` given as the path of a saved ``.keras`` file (the driver reads it, with any session)."""

    def test_the_estimator_reads_a_keras_path_and_names_a_missing_one(self, session, tmp_path):
        from sparkdl_avg.ml import KerasAveragingEstimator

        saved = make_model(seed=4)
        path = str(tmp_path / "m.keras")
        saved.save(path)
        estimator = KerasAveragingEstimator(kerasModel=path)
        assert_weights_close(estimator.getKerasModel().get_weights(), saved.get_weights(), atol=0)
        with pytest.raises(ConfigurationError, match=r"'kerasModel' parameter must be .* Got '.*nothing.keras' instead"):
            KerasAveragingEstimator(kerasModel=str(tmp_path / "nothing.keras"))


class ExecutorCheckMixin:
    """``preflight.check_executors`` runs one probe per default-parallelism slot (2 on both test sessions)."""

    def test_the_executor_check_describes_each_slots_python(self, session):
        from sparkdl_avg.driver.preflight import check_executors

        import sparkdl_avg
        from sparkdl_avg import version

        infos = check_executors(session)
        assert len(infos) == 2
        for info in infos:  # the executors run this Python and this checkout (conftest sets PYSPARK_PYTHON)
            assert "import_error" not in info, info
            assert info["python"] == sys.executable and info["sparkdl_avg_version"] == version.__version__, info
            assert info["sparkdl_avg_file"] == os.path.abspath(sparkdl_avg.__file__), info
