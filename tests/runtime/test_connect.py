"""The trainer on a real local Spark Connect server: fit, evaluate, predict, the ML pipeline, checkpoints, retries.

``SparkSession.builder.remote("local[2, 2]")`` starts a Spark Connect server
in this process' JVM (``pyspark[connect]``'s dependencies) and returns a thin
client: no SparkContext, no RDDs, no broadcasts. ``[2, 2]``: two cores and
two attempts per task, so a failed task is retried as on a cluster. The
references are computed first on a classic ``local[2]`` session (one JVM
runs one of the two at a time), with the same data and seeds.

The ``Test*`` classes run tests/parity.py's tests, whose bodies the classic
modules run too, on this module's Connect session (``session``).
"""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import pytest

from conftest import make_model, regression_data, spark_session, stop_active_session
from parity import (CompressedUpdatesMixin, DataKindsMixin, ElasticMixin, EstimatorPathMixin, ExecutorCheckMixin,
                    FragmentsMixin, LocalOptimizerStateMixin, OverlapRoundsMixin, TaskRetryMixin)
from sparkdl_avg import RECOMMENDED_CONF, ConfigurationError, DataError, ParameterAveragingTrainer, testing
from sparkdl_avg.executor import worker as worker_module

pytestmark = pytest.mark.integration  # tests/conftest.py: not in make test-fast's unit tier

N, B, K = 2, 8, 4
X, Y = regression_data(256, seed=5)


def trainer_for(model, **options):
    return ParameterAveragingTrainer(
        model, num_workers=N, batch_size=B, averaging_frequency=K, seed=3, **options
    )


def frame(spark, x=X, y=Y):
    return spark.createDataFrame([(a.tolist(), float(b)) for a, b in zip(x, y)], ["features", "label"])


@pytest.fixture(scope="module")
def reference():
    """What a classic session gives: weights and history of a 2-epoch fit, its evaluation and predictions."""
    with spark_session("local[2]", "sparkdl_avg-connect-reference") as spark:
        model = make_model(seed=4)
        trainer = trainer_for(model)
        history = trainer.fit(frame(spark), epochs=2, verbose=0)
        evaluation = trainer.evaluate(frame(spark), return_dict=True)
        predictions = np.array([r.prediction for r in trainer.predict(frame(spark)).orderBy("features").collect()])
        yield types.SimpleNamespace(
            weights=model.get_weights(), history=history.history, evaluation=evaluation, predictions=predictions,
            transport=trainer.stats.records[0].to_dict(),
        )


@pytest.fixture(scope="module")
def connect(reference, tmp_path_factory):
    from pyspark.sql import SparkSession

    stop_active_session()
    local_dir = str(tmp_path_factory.mktemp("connect-local"))
    spark = (
        SparkSession.builder.remote("local[2, 2]")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", local_dir)
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config(map=RECOMMENDED_CONF)  # static settings: the server's
        .getOrCreate()
    )
    try:
        yield spark
    finally:
        spark.stop()


@pytest.fixture(scope="module")
def session(connect):
    """The session of tests/parity.py's tests: their bodies run here under Connect as in their classic modules."""
    return connect


class TestTaskRetry(TaskRetryMixin):
    """A failed first attempt retried by Spark (classic: test_reliability.py)."""


class TestLocalOptimizerState(LocalOptimizerStateMixin):
    """optimizer_state="local" (classic: test_reliability.py)."""


class TestElastic(ElasticMixin):
    """Elastic rounds with scripted slots (classic: test_reliability.py)."""


class TestOverlapRounds(OverlapRoundsMixin):
    """``overlap_rounds``' eager updates (classic: tests/fit/test_overlap.py)."""


class TestEstimatorPath(EstimatorPathMixin):
    """``kerasModel`` as a ``.keras`` path (classic: test_ml.py)."""


class TestExecutorCheck(ExecutorCheckMixin):
    """``preflight.check_executors`` (classic: test_daemon.py)."""


class TestCompressedUpdates(CompressedUpdatesMixin):
    """``update_compression`` on every Spark SQL path, and a retried task (classic: test_update_compression.py)."""


class TestFragments(FragmentsMixin):
    """sync_fragments (classic: tests/fit/test_fragments.py)."""


class TestDataKinds(DataKindsMixin):
    """Ids, text, PNG bytes, weights, image structs and the estimator (classic: test_data_kinds.py)."""


def test_the_session_is_a_connect_client_without_a_spark_context(connect):
    from sparkdl_avg.driver.data.adapters import engine_for
    from sparkdl_avg.driver.runtime.session import Engine

    engine = engine_for(frame(connect))
    assert engine.connect and engine.sc is None
    assert engine.default_parallelism == 2  # from the master URL: Connect has no defaultParallelism
    assert isinstance(engine_for((X, Y)), Engine) and engine_for((X, Y)).connect


def test_fit_under_connect_gives_bitwise_the_classic_sessions_weights(connect, reference):
    model = make_model(seed=4)
    trainer = trainer_for(model)
    history = trainer.fit(frame(connect), epochs=2, verbose=0)
    # Bitwise: the same replicas train on the same examples, and every transport adds the two workers'
    # float64 sums in worker order (with two workers a + b is order-free anyway).
    for got, want in zip(model.get_weights(), reference.weights):
        np.testing.assert_array_equal(got, want)
    assert history.history == reference.history
    assert {r.to_dict()["num_workers"] for r in trainer.stats.records} == {N}
    # A local server and staging directory: the client sums the workers' files itself.
    assert {(r.transport, r.aggregation) for r in trainer.stats.records} == {("sql", "files")}
    assert len(trainer.stats.records) == 2 * (256 // (N * B)) // K


def test_numpy_arrays_train_under_connect_the_same_as_a_dataframe(connect, reference):
    model = make_model(seed=4)
    trainer_for(model).fit((X, Y), epochs=2, verbose=0)
    for got, want in zip(model.get_weights(), reference.weights):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("aggregation, shards", [("driver", None), ("shuffle", 3), ("storage", 2)])
def test_every_aggregation_under_connect_gives_the_same_weights(connect, reference, aggregation, shards):
    model = make_model(seed=4)
    trainer_for(model, aggregation=aggregation, aggregation_shards=shards).fit(frame(connect), epochs=2, verbose=0)
    for got, want in zip(model.get_weights(), reference.weights):
        np.testing.assert_array_equal(got, want)


def test_optimizer_state_reset_trains_under_connect_the_same_through_files_and_storage(connect):
    """With optimizer_state="reset" workers return no optimizer sums; every aggregation must still add up."""
    import keras

    runs = []
    for aggregation in ("files", "storage"):
        model = make_model(seed=4, optimizer=keras.optimizers.Adam(0.01))
        trainer_for(model, optimizer_state="reset", aggregation=aggregation).fit(frame(connect), epochs=1, verbose=0)
        runs.append(model.get_weights())
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    assert all(np.isfinite(w).all() for w in runs[0])


def test_evaluate_and_predict_under_connect_equal_the_classic_session(connect, reference):
    model = make_model(seed=4)
    model.set_weights(reference.weights)
    trainer = trainer_for(model)
    got = trainer.evaluate(frame(connect), return_dict=True)
    assert got.keys() == reference.evaluation.keys()
    for name, value in got.items():
        assert value == pytest.approx(reference.evaluation[name], rel=1e-12)
    predictions = np.array([r.prediction for r in trainer.predict(frame(connect)).orderBy("features").collect()])
    np.testing.assert_allclose(predictions, reference.predictions, rtol=1e-12)
    expected = model.predict(X, verbose=0)[:, 0]
    ordered = np.array(sorted(zip(X.tolist(), expected)), dtype=object)[:, 1].astype(float)
    np.testing.assert_allclose(predictions, ordered, rtol=1e-6)


def test_a_checkpointed_fit_resumes_under_connect_to_the_uninterrupted_weights(connect, reference, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    first = make_model(seed=4)
    trainer_for(first).fit(frame(connect), epochs=1, verbose=0, checkpoint_dir=ckpt)
    resumed = make_model(seed=4)
    history = trainer_for(resumed).fit(frame(connect), epochs=2, verbose=0, checkpoint_dir=ckpt, resume=True)
    for got, want in zip(resumed.get_weights(), reference.weights):
        np.testing.assert_array_equal(got, want)
    assert history.history["loss"] == reference.history["loss"]


def test_the_estimator_in_a_pipeline_fits_saves_and_loads_under_connect(connect, reference, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel

    from sparkdl_avg.ml import KerasAveragingEstimator

    estimator = KerasAveragingEstimator(
        kerasModel=make_model(seed=4), numWorkers=N, batchSize=B, averagingFrequency=K, seed=3, epochs=2
    )
    fitted = Pipeline(stages=[estimator]).fit(frame(connect))
    for got, want in zip(fitted.stages[0].kerasModel.get_weights(), reference.weights):
        np.testing.assert_array_equal(got, want)
    path = str(tmp_path / "pipeline")
    fitted.write().save(path)
    assert os.path.isfile(os.path.join(path, "stages", os.listdir(os.path.join(path, "stages"))[0], "model.keras"))
    loaded = PipelineModel.load(path)
    predictions = np.array([r.prediction for r in loaded.transform(frame(connect)).orderBy("features").collect()])
    np.testing.assert_allclose(predictions, reference.predictions, rtol=1e-12)
    fitted.write().overwrite().save(path)  # overwrite has no JVM to ask under Connect
    assert PipelineModel.load(path).stages[0].kerasModel.get_weights()[0].shape == reference.weights[0].shape


def test_classic_only_transports_and_rdds_are_refused_under_connect_before_any_job(connect):
    from pyspark import RDD

    with pytest.raises(ConfigurationError, match=r"'state_transport' parameter must be 'auto' or 'sql' under Spark "
                                                 r"Connect .* Got 'spark' instead"):
        trainer_for(make_model(seed=4), state_transport="spark").fit(frame(connect), verbose=0)
    data, before = frame(connect), _spark_job_ids()
    with pytest.raises(ConfigurationError, match=r"^The 'standing_rounds' parameter must be 'auto' or 'off' under "
                                                 r"Spark Connect \(its standing job waits on files that the client "
                                                 r"writes under the staging directory, not on a socket\). Got "
                                                 r"'socket' instead.$"):
        trainer_for(make_model(seed=4), overlap_rounds=True, optimizer_state="local",
                    standing_rounds="socket").fit(data, verbose=0)
    assert _spark_job_ids() == before
    fake_rdd = object.__new__(RDD)  # Connect cannot make one; a user may still pass one from elsewhere
    with pytest.raises(DataError, match=r"The data must be a Spark DataFrame or a tuple \(x, y\) of numpy arrays "
                                        r"under Spark Connect, which has no RDDs .* Got an RDD instead"):
        trainer_for(make_model(seed=4)).fit(fake_rdd, verbose=0)


def test_warm_up_runs_under_connect_and_workers_start_with_tensorflow(connect):
    import sparkdl_avg

    warm = sparkdl_avg.warm_up(connect)
    pids = warm.result(timeout=120)
    assert pids and all(isinstance(p, int) for p in pids)
    assert sparkdl_avg.warm_up(connect) is warm  # within WARM_UP_REUSE_S: not repeated

    def probe(batches):
        import os
        import sys

        import pyarrow as pa

        for batch in batches:
            yield pa.RecordBatch.from_pydict({"pid": [os.getpid()] * batch.num_rows,
                                              "tf": ["tensorflow" in sys.modules] * batch.num_rows})

    rows = connect.range(2, numPartitions=2).mapInArrow(probe, "pid long, tf boolean").collect()
    assert all(r.tf for r in rows)  # the server's daemon (sparkdl_avg.daemon) imported it before forking


def test_a_fit_under_connect_is_tracked_in_mlflow(connect, reference, tmp_path):
    mlflow = pytest.importorskip("mlflow")
    from sparkdl_avg.tracking import MlflowLogger

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    client.create_experiment("connect", artifact_location=str(tmp_path / "artifacts"))
    model = make_model(seed=4)
    tracker = MlflowLogger(experiment="connect", tracking_uri=uri)
    trainer_for(model).fit(frame(connect), epochs=2, callbacks=[tracker], verbose=0)
    run = client.get_run(tracker.run_id)
    assert tracker.not_logged == [] and run.info.status == "FINISHED"
    assert run.data.params["spark_connect"] == "True" and run.data.params["transport"] == "sql"
    losses = sorted(client.get_metric_history(tracker.run_id, "loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in losses] == list(enumerate(reference.history["loss"]))
    assert {"model", "stats.json", "report.html"} <= {a.path for a in client.list_artifacts(tracker.run_id)}


def test_advise_measures_under_connect(connect):
    from sparkdl_avg import advise

    # a budget that a loaded machine keeps too (a quiet one takes about 10 s): what is measured, not how fast
    advice = advise(make_model(seed=4), frame(connect), epochs=2, batch_size=B, averaging_frequency=K, budget_s=120)
    m = advice.measurements
    assert m["transport"] == "sql" and m["parallelism"] == N and m["num_examples"] == 256
    assert m["elapsed_s"] <= 120 and advice.summary.startswith(("Stay on one machine", "Use "))


def test_stale_synchronous_and_asynchronous_chunks_run_under_connect(connect, reference):
    from collections import Counter

    from sparkdl_avg.testing import Straggler

    model = make_model(seed=4)
    trainer = trainer_for(model, synchronization="stale", staleness=0)
    history = trainer.fit(frame(connect), epochs=2, verbose=0)
    # staleness 0 is the synchronous round, up to the order in which the two workers' updates are added
    for got, want in zip(model.get_weights(), reference.weights):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(history.history["loss"], reference.history["loss"], rtol=0, atol=1e-12)
    records = trainer.stats.records
    assert {r.transport for r in records} == {"sql"} and [r.num_workers for r in records] == [1] * len(records)
    assert sorted(r.chunk for r in records if r.epoch == 1) == list(range(N * 256 // (N * B) // K))
    assert {r.staleness for r in records} == {0}

    # Slot 0 sleeps 99 times its task (as tests/fit/test_stale.py's straggler): with a small factor the Connect job's
    # own overhead, not the task, sets a chunk's time, and the two slots' shares of the 8 chunks follow the load.
    trainer = trainer_for(make_model(seed=4), synchronization="async")
    with Straggler(slot=0, factor=100.0):
        trainer.fit(frame(connect), epochs=1, verbose=0)
    records = trainer.stats.records
    assert sorted(r.chunk for r in records) == list(range(N * 256 // (N * B) // K))
    assert Counter(r.slot for r in records).keys() == {0, 1}
    # no barrier held worker 1 back: one of its chunks started before a chunk of an earlier round was applied, and
    # read weights that lacked that round (a synchronous round would have waited for it)
    end = {r.chunk: r.t_start + r.wall_s for r in records}
    assert any(a.round > b.round and a.t_start < end[b.chunk] for a in records if a.slot == 1
               for b in records if b.slot == 0)
    assert max(r.staleness for r in records) >= 1


def _spark_job_ids():
    """The ids of every Spark job so far (the in-process Connect server's context, which runs no job group)."""
    from pyspark import SparkContext

    return set(SparkContext._active_spark_context.statusTracker().getJobIdsForGroup(None))


def _no_spark_job_running() -> bool:
    from pyspark import SparkContext

    return not SparkContext._active_spark_context.statusTracker().getActiveJobsIds()


def test_a_fits_rounds_run_in_one_standing_spark_job_that_ends_with_the_fit(connect, reference):
    before = _spark_job_ids()
    model = make_model(seed=4)
    trainer = trainer_for(model)
    trainer.fit(frame(connect), epochs=2, verbose=0)
    assert len(trainer.stats.records) == 2 * 256 // (N * B * K)  # 8 rounds
    assert len(_spark_job_ids() - before) <= 3  # staging, the standing job (and a warm-up): not a job per round
    assert _no_spark_job_running()
    for got, want in zip(model.get_weights(), reference.weights):
        np.testing.assert_array_equal(got, want)
    # standing_rounds="off": a Spark job per round, the same weights
    before, model = _spark_job_ids(), make_model(seed=4)
    trainer_for(model, standing_rounds="off").fit(frame(connect), epochs=2, verbose=0)
    assert len(_spark_job_ids() - before) >= 8
    for got, want in zip(model.get_weights(), reference.weights):
        np.testing.assert_array_equal(got, want)


def test_a_callbacks_spark_job_between_rounds_gets_the_slots_the_standing_job_holds(connect, reference):
    import keras

    from sparkdl_avg.driver.transport import standing as transport

    counts = []

    class CountEachRound(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            counts.append(connect.range(4).count())  # needs a task slot; the standing job's tasks hold both

    model = make_model(seed=4)
    trainer_for(model).fit(frame(connect), epochs=1, verbose=0, callbacks=[CountEachRound()])
    assert counts == [4] * 4  # each waited for the standing job to stop (STANDING_IDLE_S), then ran
    assert transport.STANDING_IDLE_S <= 1.0
    assert _no_spark_job_running()


def _fail_in_round(real, failing_round, task, ids):
    from sparkdl_avg.errors import WorkerError
    from sparkdl_avg.shared.errors import remote_errors

    if task.round == failing_round:
        raise remote_errors.failure(WorkerError, f"injected failure in round {task.round}")
    yield from real(task, ids)


def test_a_worker_error_in_the_standing_job_fails_the_fit_as_its_round_and_leaves_no_job(connect):
    from functools import partial

    from sparkdl_avg import WorkerError

    trainer = trainer_for(make_model(seed=4))
    with testing.RoundEntry(partial(_fail_in_round, worker_module.run_round_partition, 2)):
        with pytest.raises(WorkerError, match="injected failure in round 2"):
            trainer.fit(frame(connect), epochs=1, verbose=0)
    assert [r.round for r in trainer.stats.records] == [0, 1]
    assert _no_spark_job_running()
    trainer.fit(frame(connect), epochs=1, verbose=0)  # the trainer and the session still work
