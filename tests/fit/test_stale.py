"""Stale-synchronous and asynchronous training (``synchronization="stale"``/``"async"``, sparkdl_avg.driver.fit.stale_async).

One ``local[2,3]`` session (2 cores, up to 3 attempts per task) for the whole
module, so a chunk whose first attempt fails is retried by Spark and two
chunks (one-task jobs) run at once.

Models are float64 MLPs with fixed layer, model and optimizer names, so every
fit of the module has the same fingerprint and reuses the Python workers'
replicas (no replica build and ``tf.function`` trace per fit: fits take well
under a second and the chunks' compute times are steady, which the straggler
tests rely on).

The straggler tests slow slot 0 with :class:`sparkdl_avg.testing.Straggler`,
which sleeps ``(factor - 1)`` times what the task took on the executor: a few
milliseconds for these models against ~0.1 s of Spark job per chunk, so the
factor is large (at 4, slot 0 would be barely slower than slot 1).
"""

from __future__ import annotations

import collections
import contextlib
import os
import statistics

import numpy as np
import pytest

import keras

from conftest import assert_weights_close, record_jobs, regression_data, shared_spark
from sparkdl_avg import ConfigurationError, ParameterAveragingTrainer, TrainerConfig, cli
from sparkdl_avg.driver.checkpoint import files as ckpt
from sparkdl_avg import testing
from sparkdl_avg.ml import KerasAveragingEstimator
from sparkdl_avg.shared.data.example_order import steps_per_epoch

N, B, K = 2, 8, 3
DATA = regression_data(10 * N * B + 5, seed=7)  # 10 minibatches per worker per epoch (5 examples left over)
EPOCH_STEPS = steps_per_epoch(len(DATA[0]), N, B)
ROUNDS = -(-EPOCH_STEPS // K)  # rounds of 3, 3, 3 and 1 minibatches
SLOW_FACTOR = 100.0  # slot 0: ~0.4 s a chunk (the sleep), slot 1: ~0.1 s (mostly the job)


# ``local[2,3]`` (up to 3 attempts per task, for the retried tasks), shared with the other modules that ask for it.
spark = shared_spark("local[2,3]", log_level="OFF")


def mlp(seed=0, optimizer=None):
    """A float64 MLP, compiled; the same names every time (one fingerprint, one replica per Python worker)."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,), dtype="float64", name="x")
    h = keras.layers.Dense(8, activation="tanh", dtype="float64", name="hidden")(inputs)
    out = keras.layers.Dense(1, dtype="float64", name="out")(h)
    model = keras.Model(inputs, out, name="stale_mlp")
    model.compile(optimizer or keras.optimizers.Adam(0.01, name="adam"), "mse", metrics=["mae"])
    return model


def trainer_for(model, **kw):
    options = dict(num_workers=N, batch_size=B, averaging_frequency=K, seed=3, slow_warning=False)
    options.update(kw)
    return ParameterAveragingTrainer(model, **options)


@pytest.fixture
def install_straggler():
    """``install_straggler(factor)``: slot 0 ``factor`` times slower per chunk from then on in the test, on warm Python
    workers (:class:`sparkdl_avg.testing.Straggler`; a later call's replaces an earlier one's).

    An untimed synchronous fit first: a Python worker that has to build the
    replica (a new one after an earlier test's failed task) would sleep
    ``factor`` times the build and its trace. The Straggler lives in the
    package, so it pickles by reference.
    """
    with contextlib.ExitStack() as installed:
        def install(factor=SLOW_FACTOR):
            trainer_for(mlp(seed=5)).fit(DATA, epochs=1, verbose=0)
            installed.enter_context(testing.Straggler(slot=0, factor=factor))

        yield install


def chunk_records(trainer, epoch):
    return [r for r in trainer.stats.records if r.epoch == epoch]


def end(record):
    """When the driver had applied the chunk (its record is made right after the update)."""
    return record.t_start + record.wall_s


def assert_each_chunk_once(records, expected_examples):
    assert sorted(r.chunk for r in records) == list(range(ROUNDS * N))
    assert all(r.num_workers == 1 and r.round == r.chunk // N for r in records)  # chunk = round * N + part
    assert sum(r.examples for r in records) == expected_examples


# ------------------------------------------------------------ staleness=0 is sync


@pytest.mark.parametrize("rule", [None, "bmuf"], ids=["average", "bmuf"])
def test_staleness_zero_ends_with_the_weights_and_losses_of_sync(in_process_engine, rule):
    sync = mlp()
    sync_trainer = trainer_for(sync, update_rule=rule, optimizer_state="average")
    sync_history = sync_trainer.fit(DATA, epochs=2, verbose=0)

    stale = mlp()
    stale_trainer = trainer_for(stale, update_rule=rule, optimizer_state="average", synchronization="stale",
                                staleness=0)
    stale_history = stale_trainer.fit(DATA, epochs=2, verbose=0)

    assert_weights_close(stale.get_weights(), sync.get_weights(), atol=1e-12)
    for a, e in zip(stale.optimizer.variables, sync.optimizer.variables):  # Adam's moments and iteration counter
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), atol=1e-12, rtol=0)
    assert int(np.asarray(stale.optimizer.iterations)) == 2 * EPOCH_STEPS
    for key in ("loss", "mae"):
        assert len(stale_history.history[key]) == 2
        np.testing.assert_allclose(stale_history.history[key], sync_history.history[key], rtol=1e-12, atol=0)
    if rule == "bmuf":
        deltas = stale_trainer.update_rule_state["state"]["delta"], sync_trainer.update_rule_state["state"]["delta"]
        for a, e in zip(*deltas):
            np.testing.assert_allclose(a, e, atol=1e-12, rtol=0)
    # synchronous rounds: every chunk read the weights after the round before, and was applied unscaled
    records = stale_trainer.stats.records
    assert len(records) == 2 * ROUNDS * N
    assert {r.staleness for r in records} == {0}
    assert all(r.delay < 1 and r.update_scale == 1 / N for r in records)
    assert all(r.chunk is None for r in sync_trainer.stats.records)


def test_staleness_zero_with_a_straggler_still_reads_whole_rounds(spark, install_straggler):
    # A slow slot makes the epoch's-end rule pass it over; at staleness 0 that must not let a chunk start
    # after part of its own round was applied.
    install_straggler(factor=20.0)
    sync = mlp()
    trainer_for(sync).fit(DATA, epochs=2, verbose=0)
    stale = mlp()
    trainer = trainer_for(stale, synchronization="stale", staleness=0)
    trainer.fit(DATA, epochs=2, verbose=0)
    assert_weights_close(stale.get_weights(), sync.get_weights(), atol=1e-12)
    assert all(r.delay < 1 for r in trainer.stats.records)


@pytest.mark.parametrize("bound", [1, 2])
def test_reproducible_runs_repeat_bitwise_whatever_the_timing(spark, install_straggler, bound):
    runs = []
    for factor in (20.0, 1.0, 40.0):  # slot 0 much slower, as fast, slower still: other arrival orders
        install_straggler(factor=factor)
        model = mlp()
        trainer = trainer_for(model, synchronization="stale", staleness=bound, reproducible=True)
        history = trainer.fit(DATA, epochs=2, verbose=0)
        runs.append((model.get_weights(), history.history["loss"], trainer.stats.records))
    for weights, losses, records in runs[1:]:
        assert_weights_close(weights, runs[0][0], atol=0)
        assert losses == runs[0][1]
    for _, _, records in runs:
        assert all(r.staleness == min(bound, r.round) for r in records)  # read exactly `bound` rounds back
        # applied in chunk order: the delay and the scale follow from the chunk alone
        assert [(r.epoch, r.chunk) for r in records] == sorted((r.epoch, r.chunk) for r in records)
    delays = [sorted((r.epoch, r.chunk, r.delay, r.update_scale) for r in records) for _, _, records in runs]
    assert delays[0] == delays[1] == delays[2]
    slow = collections.Counter(r.slot for r in runs[2][2])
    assert slow[1] > slow[0]  # the fast slot still ran ahead: the order is fixed, not the pace


@pytest.mark.parametrize("synchronization", ["sync", "async"])
def test_reproducible_needs_the_stale_bound(in_process_engine, synchronization):
    with pytest.raises(ConfigurationError, match=r"The 'reproducible' parameter needs synchronization='stale'"):
        trainer_for(mlp(), synchronization=synchronization, reproducible=True)


def test_staleness_zero_shows_the_schedule_the_logs_of_sync(in_process_engine):
    seen = {}
    for synchronization in ("sync", "stale"):
        asked = seen[synchronization] = []

        def schedule(epoch, rnd, logs, asked=asked):
            asked.append((epoch, rnd, logs.get("loss")))
            return K

        bound = {"staleness": 0} if synchronization == "stale" else {}  # staleness with "sync" is refused
        trainer_for(mlp(), averaging_frequency=schedule, synchronization=synchronization, **bound).fit(
            DATA, epochs=1, verbose=0)
    rounds = [(0, r) for r in range(ROUNDS)]
    assert [(e, r) for e, r, _ in seen["stale"]] == [(e, r) for e, r, _ in seen["sync"]] == rounds
    assert seen["stale"][0][2] is None and seen["sync"][0][2] is None  # nothing trained yet
    np.testing.assert_allclose([loss for _, _, loss in seen["stale"][1:]], [loss for _, _, loss in seen["sync"][1:]],
                               rtol=1e-12, atol=0)


# ------------------------------------------------------------ the bound, with a straggler


@pytest.mark.parametrize("bound, aware", [(1, True), (2, False)], ids=["s=1-aware", "s=2-unscaled"])
def test_a_straggler_lets_the_fast_worker_run_ahead_by_at_most_the_bound(spark, install_straggler, bound, aware):
    install_straggler()
    model = mlp()
    trainer = trainer_for(model, synchronization="stale", staleness=bound, staleness_aware=aware)
    history = trainer.fit(DATA, epochs=1, verbose=0)
    records = chunk_records(trainer, 0)
    assert_each_chunk_once(records, EPOCH_STEPS * N * B)
    assert len(history.history["loss"]) == 1 and np.isfinite(history.history["loss"][0])
    assert all(np.isfinite(w).all() for w in model.get_weights())

    by_slot = collections.defaultdict(list)
    for r in records:
        assert r.slot == r.workers[0].worker
        by_slot[r.slot].append(r)
    assert sorted(by_slot) == [0, 1]
    slow, fast = by_slot[0], by_slot[1]
    # the straggler did slow slot 0
    assert min(r.wall_s for r in slow) > 2 * statistics.median(r.wall_s for r in fast)

    # the bound: no chunk read weights lacking more than `bound` rounds, and the fast slot used that slack
    assert all(0 <= r.staleness <= bound for r in records)
    assert max(r.staleness for r in records) >= 1
    assert len(fast) > len(slow)
    assert statistics.median(r.delay for r in slow) > statistics.median(r.delay for r in fast)

    # the same, from the driver's clock: a chunk of round r started only once rounds < r - s were all applied,
    # and its staleness and delay are what was applied by its read and by its own update
    for r in records:
        before_read = [q for q in records if end(q) < r.t_start]
        assert all(end(q) < r.t_start for q in records if q.round < r.round - bound), r.chunk
        complete = 0
        while sum(1 for q in before_read if q.round == complete) == N:
            complete += 1
        assert r.staleness == r.round - complete, r.chunk
        applied_between = sum(1 for q in records if q is not r and r.t_start < end(q) < end(r))
        assert r.delay == pytest.approx(applied_between / N, abs=1e-12), r.chunk

    # the update's factor: 1/(N·max(1, delay)) with staleness_aware, else 1/N
    for r in records:
        expected = 1 / (N * max(1.0, r.delay)) if aware else 1 / N
        assert r.update_scale == pytest.approx(expected, rel=1e-12), (r.chunk, r.delay, r.update_scale)
    if aware:
        assert any(r.delay > 1 for r in slow)  # so some updates were scaled down
        assert min(r.update_scale for r in records) < 1 / N


# ------------------------------------------------------------------------- async


def test_async_trains_every_chunk_of_every_epoch_exactly_once(spark, install_straggler, tmp_path):
    sync_trainer = trainer_for(mlp())
    sync_trainer.fit(DATA, epochs=2, verbose=0)
    sync_examples = {e: sum(r.examples for r in sync_trainer.stats.records if r.epoch == e) for e in (0, 1)}
    sync_rounds = {e: sum(1 for r in sync_trainer.stats.records if r.epoch == e) for e in (0, 1)}

    install_straggler()  # chunks finish out of order
    model = mlp()
    trainer = trainer_for(model, synchronization="async")
    history = trainer.fit(DATA, epochs=2, verbose=0)

    assert sorted({r.epoch for r in trainer.stats.records}) == [0, 1]
    for epoch in (0, 1):
        records = chunk_records(trainer, epoch)
        assert sync_rounds[epoch] == ROUNDS
        assert_each_chunk_once(records, sync_examples[epoch])
        assert sync_examples[epoch] == EPOCH_STEPS * N * B
    # epochs end together: every chunk of epoch 0 was applied before any of epoch 1 started
    assert max(end(r) for r in chunk_records(trainer, 0)) < min(r.t_start for r in chunk_records(trainer, 1))
    assert len(history.history["loss"]) == 2 and np.all(np.isfinite(history.history["loss"]))
    assert all(np.isfinite(w).all() for w in model.get_weights())
    summary = trainer.stats.summary()
    records = trainer.stats.records
    assert summary["rounds"] == 2 * ROUNDS * N
    assert summary["staleness_max"] == max(r.staleness for r in records) >= 1  # no bound held the fast slot
    assert summary["delay_median"] == statistics.median(r.delay for r in records)
    assert "staleness_max" not in sync_trainer.stats.summary()
    # overlapping chunks: the epoch's span, not the sum of the chunks' times
    span = max(end(r) for r in records) - min(r.t_start for r in records)
    assert summary["wall_s"] <= span + 1e-6 < sum(r.wall_s for r in records)
    # the report and stats.json read the chunk records: one timeline row per slot
    import json

    report = trainer.write_report(str(tmp_path / "report.html"))
    text = open(report, encoding="utf-8").read()
    assert "worker 0" in text and "worker 1" in text and "worker 2" not in text
    rows = json.loads(trainer.stats.to_json())
    assert {(row["slot"], row["chunk"]) for row in rows} == {(r.slot, r.chunk) for r in records}


class _StopAfterBlocks(keras.callbacks.Callback):
    def __init__(self, blocks):
        super().__init__()
        self.blocks, self.ends = blocks, 0

    def on_train_batch_end(self, batch, logs=None):
        self.ends += 1
        if self.ends == self.blocks:
            self.model.stop_training = True
            self.weights = [w.copy() for w in self.model.get_weights()]


def test_stop_training_at_a_block_end_applies_nothing_after_it(spark, install_straggler):
    install_straggler(factor=20.0)  # slot 1 has chunks of later rounds in flight at the stop
    model = mlp()
    stop = _StopAfterBlocks(2)
    trainer = trainer_for(model, synchronization="stale", staleness=2)
    history = trainer.fit(DATA, epochs=2, verbose=0, callbacks=[stop])
    assert stop.ends == 2 and len(history.history["loss"]) == 1
    assert len(trainer.stats.records) == 2 * N  # two blocks of N updates, nothing applied after the stop
    assert_weights_close(model.get_weights(), stop.weights, atol=0)


def test_a_bfloat16_model_trains_stale_synchronously_like_sync(in_process_engine):
    def bf16_model():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((4,), name="x")
        h = keras.layers.Dense(8, activation="tanh", dtype="bfloat16", name="hidden")(inputs)
        out = keras.layers.Dense(1, dtype="float32", name="out")(h)
        model = keras.Model(inputs, out, name="stale_bf16")
        model.compile(keras.optimizers.SGD(0.2, name="sgd"), "mse")  # steps bfloat16 can resolve
        return model

    x, y = DATA
    data = (x.astype("float32"), y.astype("float32"))
    sync, stale = bf16_model(), bf16_model()
    before = [np.asarray(w, np.float32) for w in stale.get_weights()]
    trainer_for(sync).fit(data, epochs=1, verbose=0)
    trainer_for(stale, synchronization="stale", staleness=0).fit(data, epochs=1, verbose=0)
    assert str(stale.get_weights()[0].dtype) == "bfloat16"
    for got, want, start in zip(stale.get_weights(), sync.get_weights(), before):
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        assert not np.array_equal(got, start)  # the bfloat16 layer's weights move too
        np.testing.assert_allclose(got, want, atol=2e-2, rtol=0)  # bfloat16's resolution near 1: 2^-7


# ------------------------------------------------------------------------- retries


def _fail_first_attempt(task, workers, marker):
    from pyspark import TaskContext

    ids = list(workers)
    ctx = TaskContext.get()
    if task.epoch == 1 and task.round == 1 and ids == [0] and ctx.attemptNumber() == 0:
        open(marker, "w").close()
        raise RuntimeError("injected failure on the first attempt")
    from sparkdl_avg.executor import worker

    return worker.run_round_partition(task, ids)


def test_a_chunk_retried_by_spark_gives_the_weights_of_a_clean_run(spark, tmp_path):
    clean = mlp()
    trainer_for(clean, synchronization="stale", staleness=0).fit(DATA, epochs=2, verbose=0)

    marker = str(tmp_path / "failed-once")
    retried = mlp()
    trainer = trainer_for(retried, synchronization="stale", staleness=0)
    with testing.RoundEntry(lambda task, workers: _fail_first_attempt(task, workers, marker)):
        trainer.fit(DATA, epochs=2, verbose=0)
    assert os.path.exists(marker)  # the first attempt did fail, and Spark retried it
    assert_weights_close(retried.get_weights(), clean.get_weights(), atol=1e-12)
    for epoch in (0, 1):
        assert_each_chunk_once(chunk_records(trainer, epoch), EPOCH_STEPS * N * B)  # one record for the retried chunk


def _always_fail(task, ids):
    ids = list(ids)
    if task.epoch == 1 and task.round == 2 and ids == [1]:
        raise RuntimeError("injected failure on every attempt")
    from sparkdl_avg.executor import worker

    return worker.run_round_partition(task, ids)


class _LastBlock(keras.callbacks.Callback):
    """Keeps the model's weights after every block (Keras batch) the fit ends."""

    def on_train_batch_end(self, batch, logs=None):
        self.weights = [w.copy() for w in self.model.get_weights()]


def test_a_chunk_failing_for_good_stops_the_fit_with_the_last_blocks_weights(spark):
    from sparkdl_avg import WorkerError

    model = mlp()
    last = _LastBlock()
    trainer = trainer_for(model, synchronization="stale", staleness=0)
    with testing.RoundEntry(_always_fail), pytest.raises(
            WorkerError, match=r"Worker 1's chunk of round 2 of epoch 1.*injected failure on every attempt"):
        trainer.fit(DATA, epochs=2, verbose=0, callbacks=[last])
    # Round 2's other chunk may have been applied, but not a block's end: the model is as the last block left it.
    assert_weights_close(model.get_weights(), last.weights, atol=0)
    assert not [r for r in trainer.stats.records if r.epoch == 1 and r.chunk == 2 * N + 1]  # never applied


# ------------------------------------------------------------------------- bad options


@pytest.mark.parametrize(
    "options, pattern",
    [
        (dict(synchronization="stale", staleness=-1),
         r"The 'staleness' parameter must be an int in the range \[0, inf\)\. Got -1"),
        (dict(synchronization="stale", staleness=True), r"The 'staleness' parameter must be an int"),
        (dict(synchronization="bogus"),
         r"The 'synchronization' parameter must be one of 'sync', 'stale', 'async'\. Got 'bogus'"),
        (dict(synchronization="stale", staleness_aware="yes"),
         r"The 'staleness_aware' parameter must be a bool\. Got 'yes'"),
    ],
)
def test_bad_options_are_refused_by_the_constructor(spark, options, pattern):
    with record_jobs(spark) as jobs:
        with pytest.raises(ConfigurationError, match=pattern):
            trainer_for(mlp(), **options)
    assert jobs.job_ids == []


@pytest.mark.parametrize("synchronization", ["stale", "async"])
def test_checkpoints_every_n_rounds_are_refused_before_any_job(spark, tmp_path, synchronization):
    directory = tmp_path / "ckpt"
    trainer = trainer_for(mlp(), synchronization=synchronization)
    with record_jobs(spark) as jobs:
        pattern = rf"'checkpoint_every' parameter must be 'epoch' with synchronization='{synchronization}'.*Got 2"
        with pytest.raises(ConfigurationError, match=pattern):
            trainer.fit(DATA, epochs=2, verbose=0, checkpoint_dir=str(directory), checkpoint_every=2)
    assert jobs.job_ids == []
    assert not directory.exists()
    assert len(trainer.stats) == 0 and trainer.history is None


# ------------------------------------------------------------------------- checkpoints


class CrashAtEpochBegin(keras.callbacks.Callback):
    """Simulates a driver crash at the start of ``epoch`` (after the previous epoch's checkpoint)."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise Crash(f"simulated crash at the start of epoch {epoch}")


class Crash(RuntimeError):
    pass


def test_resume_after_a_crash_continues_at_the_epoch_and_equals_an_uninterrupted_run(in_process_engine, tmp_path):
    reference = mlp()
    ref_history = trainer_for(reference, synchronization="stale", staleness=0).fit(DATA, epochs=3, verbose=0)

    directory = str(tmp_path / "ckpt")
    with pytest.raises(Crash):
        trainer_for(mlp(), synchronization="stale", staleness=0).fit(
            DATA, epochs=3, verbose=0, checkpoint_dir=directory, callbacks=[CrashAtEpochBegin(2)]
        )
    saved = ckpt.load(ckpt.latest(directory))
    assert (saved.epoch, saved.rounds_done, saved.steps_done) == (2, 0, 0)
    assert len(saved.meta.history["loss"]) == 2

    fresh = mlp(seed=99)  # other initial weights: the checkpoint's must win
    trainer = trainer_for(fresh, seed=None, synchronization="stale", staleness=0)  # the seed comes from the checkpoint
    history = trainer.fit(DATA, epochs=3, verbose=0, checkpoint_dir=directory, resume=True)
    assert history.epoch == [0, 1, 2]
    assert len(history.history["loss"]) == 3 and np.all(np.isfinite(history.history["loss"]))
    np.testing.assert_allclose(history.history["loss"], ref_history.history["loss"], rtol=1e-12, atol=0)
    assert_weights_close(fresh.get_weights(), reference.get_weights(), atol=1e-12)
    assert int(np.asarray(fresh.optimizer.iterations)) == 3 * EPOCH_STEPS
    records = trainer.stats.records  # only epoch 2 ran, as chunks
    assert {r.epoch for r in records} == {2}
    assert_each_chunk_once(records, EPOCH_STEPS * N * B)
    assert ckpt.load(ckpt.latest(directory)).epoch == 3


# ------------------------------------------------------------------------- estimator


def test_the_estimator_takes_the_synchronization_params(spark):
    x, y = DATA
    df = spark.createDataFrame([(list(map(float, r)), float(t)) for r, t in zip(x, y)],
                               "features array<double>, label double")
    est = KerasAveragingEstimator(kerasModel=mlp(), numWorkers=N, batchSize=B, averagingFrequency=K, epochs=1,
                                  seed=3, verbose=0, slowWarning=False, synchronization="stale", staleness=1)
    assert (est.getSynchronization(), est.getStaleness(), est.getStalenessAware()) == ("stale", 1, True)
    options = est._trainer_options()
    assert (options["synchronization"], options["staleness"], options["staleness_aware"]) == ("stale", 1, True)
    fitted = est.fit(df)
    records = fitted.stats.records
    assert_each_chunk_once(records, EPOCH_STEPS * N * B)
    assert all(0 <= r.staleness <= 1 for r in records)
    assert len(fitted.history.history["loss"]) == 1 and np.isfinite(fitted.history.history["loss"][0])

    unscaled = KerasAveragingEstimator(kerasModel=mlp(), synchronization="async", stalenessAware=False)
    assert unscaled._trainer_options()["staleness_aware"] is False

    with record_jobs(spark) as jobs:
        with pytest.raises(ConfigurationError, match=r"The 'staleness' parameter must be an int in the range"):
            KerasAveragingEstimator(kerasModel=mlp(), synchronization="stale", staleness=-1).fit(df)
        with pytest.raises(ConfigurationError, match=r"The 'synchronization' parameter must be one of"):
            KerasAveragingEstimator(kerasModel=mlp(), synchronization="bogus").fit(df)
    assert jobs.job_ids == []


# ------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def parse():
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location("train_job_stale", os.path.join(root, "jobs", "train.py"))
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    required = ["--data", "d.parquet", "--model", "m.keras", "--output-dir", "out"]
    return lambda *flags: job.parse_args([*required, *flags])


def test_the_cli_flags_set_the_synchronization_options(parse, capsys):
    defaults = cli.trainer_options(parse())
    assert (defaults["synchronization"], defaults["staleness"], defaults["staleness_aware"]) == ("sync", 2, True)

    options = cli.trainer_options(parse("--synchronization", "stale", "--staleness", "3", "--no-staleness-aware"))
    assert (options["synchronization"], options["staleness"], options["staleness_aware"]) == ("stale", 3, False)
    config = TrainerConfig(**options)
    assert (config.synchronization, config.staleness, config.staleness_aware) == ("stale", 3, False)
    assert cli.trainer_options(parse("--synchronization", "async"))["synchronization"] == "async"

    def main(argv):
        TrainerConfig(**cli.trainer_options(parse("--synchronization", "stale", "--staleness", "-1")))
        return 0

    assert cli.run(main) == 2
    assert capsys.readouterr().err == (
        "error: The --staleness flag must be an int in the range [0, inf). Got -1 instead.\n"
    )
    with pytest.raises(SystemExit) as exit_info:  # argparse's choices
        parse("--synchronization", "bogus")
    assert exit_info.value.code == 2
    assert "--synchronization" in capsys.readouterr().err
