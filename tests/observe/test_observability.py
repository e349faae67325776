"""What a fit reports and how it continues: callbacks on the driver, validation, timing stats, the HTML report.

Also the epochs a fit runs and reports: an ``averaging_frequency`` above an
epoch's minibatches is cut with a warning; ``trainer.stats`` and
``trainer.history`` both describe the latest fit; ``fit(initial_epoch=...)``
continues a fit as ``keras.Model.fit`` does, with checkpoints too.
"""

import csv
import json
import logging
import math
import os

import keras
import numpy as np
import pytest

from conftest import assert_weights_close, make_model, regression_data
from sparkdl_avg import ConfigurationError, ParameterAveragingTrainer, WorkerError

N, B, STEPS = 2, 8, 3  # workers, batch size, minibatches per worker per epoch (of DATA)
DATA = regression_data(N * B * STEPS, seed=5)


def _trainer(model=None, **kwargs):
    kwargs = {"num_workers": N, "batch_size": B, "averaging_frequency": 2, "seed": 11, **kwargs}
    return ParameterAveragingTrainer(model if model is not None else make_model(seed=1), **kwargs)


class WeightsPerEpoch(keras.callbacks.Callback):
    """Keeps a copy of the model's weights at every epoch end."""

    def __init__(self):
        super().__init__()
        self.weights = []

    def on_epoch_end(self, epoch, logs=None):
        self.weights.append([w.copy() for w in self.model.get_weights()])


def test_early_stopping_stops_and_restores_best_weights(in_process_engine):
    x, y = regression_data(256, seed=1)
    # Validation targets of the opposite sign: the better the model fits the
    # training data, the worse val_loss gets, so the best epoch is the first.
    model = make_model(optimizer=keras.optimizers.SGD(0.2))
    keeper = WeightsPerEpoch()
    stopper = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, restore_best_weights=True)
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=2, seed=0)
    history = trainer.fit((x, y), epochs=20, validation_data=(x, -y), callbacks=[keeper, stopper], verbose=0)
    val = history.history["val_loss"]
    assert len(val) < 20, "EarlyStopping did not stop the fit"
    best = int(np.argmin(val))
    assert best < len(val) - 1
    for got, want in zip(model.get_weights(), keeper.weights[best]):
        np.testing.assert_array_equal(got, want)


def test_model_checkpoint_writes_a_loadable_model_and_csv_logger_a_row_per_epoch(in_process_engine, tmp_path):
    x, y = regression_data(128, seed=2)
    model = make_model()
    ckpt = tmp_path / "best.keras"
    log = tmp_path / "log.csv"
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=2, seed=0)
    trainer.fit(
        (x, y),
        epochs=3,
        validation_data=(x, y),
        callbacks=[keras.callbacks.ModelCheckpoint(str(ckpt)), keras.callbacks.CSVLogger(str(log))],
        verbose=0,
    )
    loaded = keras.saving.load_model(str(ckpt))
    np.testing.assert_allclose(loaded.predict(x[:8], verbose=0), model.predict(x[:8], verbose=0), atol=1e-12)
    rows = list(csv.DictReader(log.open()))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    assert {"loss", "mae", "val_loss", "val_mae"} <= set(rows[0])


def test_learning_rate_scheduler_reaches_the_replicas(in_process_engine):
    x, y = regression_data(128, seed=3)
    model = make_model()
    before = [w.copy() for w in model.get_weights()]
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=2, seed=0)
    trainer.fit((x, y), epochs=2, callbacks=[keras.callbacks.LearningRateScheduler(lambda e, lr: 0.0)], verbose=0)
    for got, want in zip(model.get_weights(), before):
        np.testing.assert_array_equal(got, want)
    assert float(model.optimizer.learning_rate) == 0.0


def test_divergence_stops_before_non_finite_weights_reach_the_model(in_process_engine):
    """What Keras' TerminateOnNaN did after the fact, the trainer does before averaging."""
    x, y = regression_data(256, seed=4)
    model = make_model(optimizer=keras.optimizers.SGD(1e6))  # diverges at once
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=1, seed=0)
    with pytest.raises(WorkerError, match=r"Non-finite loss or weights \(NaN/Inf\) from worker\(s\) 0 \(loss .*\), 1 .* in epoch 0, round \d+"):
        trainer.fit((x, y), epochs=5, callbacks=[keras.callbacks.TerminateOnNaN()], verbose=0)
    assert all(np.isfinite(w).all() for w in model.get_weights())
    assert len(trainer.stats) < 256 // 32  # stopped before the epoch's last round


def test_stats_records_agree_with_the_workers_clocks_the_history_and_json(spark, tmp_path):
    x, y = regression_data(300, seed=5)
    model = make_model()
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=3, seed=0)
    history = trainer.fit((x, y), epochs=2, verbose=0)
    # 300 // 32 = 9 minibatches per worker per epoch: rounds of 3, 3, 3.
    path = tmp_path / "stats.json"
    records = json.loads(trainer.stats.to_json(str(path)))
    assert json.loads(path.read_text()) == records
    assert len(records) == 6
    assert [(r["epoch"], r["round"]) for r in records] == [(e, r) for e in range(2) for r in range(3)]
    for before, after in zip(records, records[1:]):  # rounds follow each other on the driver's clock
        assert after["t_start"] >= before["t_start"] + before["wall_s"]
    for r in records:
        # The workers' span (their own clocks) holds each worker's busy time, and the round holds the span.
        busy = [w["setup_s"] + w["load_s"] + w["compute_s"] for w in r["workers"]]
        spread = max(w["end"] for w in r["workers"]) - min(w["start"] for w in r["workers"])
        assert max(busy) <= spread + 1e-3 and r["workers_s"] == pytest.approx(spread, abs=5e-3)
        assert r["compute_max_s"] == max(w["compute_s"] for w in r["workers"]) > 0
        assert r["averaging_frequency"] == 3 and r["examples"] == 2 * 3 * 16
        assert {w["worker"] for w in r["workers"]} == {0, 1}
        assert all(w["host"] and w["pid"] > 0 for w in r["workers"])
        assert math.isfinite(r["loss"])
    for epoch in range(2):  # the rounds' losses, weighted by examples, are the epoch's loss
        rounds = [r for r in records if r["epoch"] == epoch]
        mean = sum(r["loss"] * r["examples"] for r in rounds) / sum(r["examples"] for r in rounds)
        assert mean == pytest.approx(history.history["loss"][epoch], rel=1e-9)
    summary = trainer.stats.summary()
    assert summary["rounds"] == 6 and 0 < summary["compute_share"] < 1


def test_report_is_self_contained_with_timeline_and_curves(spark, tmp_path):
    x, y = regression_data(200, seed=6)
    model = make_model()
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=2, seed=0)
    with pytest.raises(RuntimeError, match="needs a completed fit"):
        trainer.write_report(str(tmp_path / "early.html"))
    trainer.fit((x, y), epochs=2, validation_data=(x, y), verbose=0)
    path = trainer.write_report(str(tmp_path / "report.html"))
    html = open(path, encoding="utf-8").read()
    assert "Timeline" in html and "worker 1" in html and "driver" in html
    for trace in ('"name":"compute"', '"name":"data loading"', '"name":"val_loss"', '"name":"loss"'):
        assert trace in html, trace
    assert "MB of sums per round (median)" in html
    assert "<script src=" not in html  # plotly.js is embedded: opens offline
    assert f"<head><title>sparkdl_avg training report: {model.name}</title>" in html  # issue 38: the tab showed the file name
    assert len(html) > 1_000_000
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]


def _plotly_figure(html):
    """The traces and layout a report's page hands to ``Plotly.newPlot``, as JSON."""
    decoder = json.JSONDecoder()
    at = html.index("[", html.index("Plotly.newPlot("))
    data, at = decoder.raw_decode(html, at)
    layout, _ = decoder.raw_decode(html, html.index("{", at))
    return data, layout


def test_report_of_an_elastic_fit_plots_workers_and_examples_per_s_and_marks_each_change(spark, tmp_path):
    from sparkdl_avg.driver.elastic.membership import ScriptedSlots

    x, y = regression_data(96)
    trainer = ParameterAveragingTrainer(make_model(), min_workers=1, max_workers=2, batch_size=8, averaging_frequency=2,
                                        seed=0)
    with ScriptedSlots([(0, 0, 2), (0, 2, 1), (1, 1, 2)]):
        trainer.fit((x, y), epochs=2, verbose=0)
    records = trainer.stats.records
    assert [(r.epoch, r.round, r.num_workers) for r in records] == [
        (0, 0, 2), (0, 1, 2), (0, 2, 1), (0, 3, 1), (1, 0, 1), (1, 1, 2), (1, 2, 2), (1, 3, 2)]
    data, layout = _plotly_figure(open(trainer.write_report(str(tmp_path / "elastic.html")), encoding="utf-8").read())
    traces = {t.get("name"): t for t in data}
    titles = [a["text"] for a in layout["annotations"]]
    assert any(t.startswith("Workers per round") for t in titles)
    # on the per-round loss's epoch axis: a step per round, from the first round's start to each round's end
    workers = traces["workers"]
    assert workers["line"]["shape"] == "vh"
    assert workers["x"] == [0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2]
    assert workers["y"] == [2, 2, 2, 1, 1, 1, 2, 2, 2]
    rate = traces["examples/s"]
    assert rate["x"] == workers["x"][1:] and rate["y"] == [r.examples_per_s for r in records]
    assert rate["yaxis"] != workers["yaxis"] and layout[rate["yaxis"].replace("y", "yaxis")]["side"] == "right"
    assert traces["change of workers"]["x"] == [0, 0.5, 1.25] and traces["change of workers"]["y"] == [2, 1, 2]
    changes = [a["text"] for a in layout["annotations"] if a["xref"] != "paper"]  # subplot titles sit on "paper"
    assert changes == ["start: 2 workers", "slots lost: 2 → 1", "slots joined: 1 → 2"]

    # a fixed fit's report has no such figure, nor room for one
    fixed = _trainer()
    fixed.fit(DATA, epochs=1, verbose=0)
    data, layout = _plotly_figure(open(fixed.write_report(str(tmp_path / "fixed.html")), encoding="utf-8").read())
    assert not {"workers", "examples/s", "change of workers"} & {t.get("name") for t in data}
    assert len(layout["annotations"]) == 3 and layout["height"] == 1100
    assert "yaxis4" not in layout


def test_verbose_logs_one_line_per_epoch_and_a_summary(in_process_engine, caplog):
    x, y = regression_data(128, seed=7)
    model = make_model()
    # slow_warning=False: the tiny fit is slower than one process, and warnings are not progress lines
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=2, seed=0,
                                        slow_warning=False)
    with caplog.at_level("INFO", logger="sparkdl_avg"):
        trainer.fit((x, y), epochs=2, verbose=2)
    lines = [r.getMessage() for r in caplog.records if r.name == "sparkdl_avg"]
    assert [l.split(" - ")[0] for l in lines if l.startswith("Epoch")] == ["Epoch 1/2", "Epoch 2/2"]
    assert any(l.startswith("Time in rounds:") and "overhead" in l for l in lines)
    caplog.clear()
    with caplog.at_level("INFO", logger="sparkdl_avg"):
        trainer.fit((x, y), epochs=1, verbose=0)
    assert not [r for r in caplog.records if r.name == "sparkdl_avg"]


class _CrashAfterRounds(keras.callbacks.Callback):
    def __init__(self, rounds):
        super().__init__()
        self.left = rounds

    def on_train_batch_end(self, batch, logs=None):
        self.left -= 1
        if not self.left:
            raise KeyboardInterrupt("simulated crash")


def test_epoch_lines_count_this_fits_rounds_in_the_workers_metric_order(spark, caplog, tmp_path):
    """Issue 38: "1 rounds"; after a resume "3 rounds" when 2 ran, and accuracy before loss (the checkpoint's order)."""
    x, y = regression_data(128, seed=7)  # 4 minibatches per worker and epoch

    def trainer(k):
        model = make_model(metrics=[keras.metrics.MeanAbsoluteError(name="abs_error")])  # sorts before 'loss'
        return ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=k, seed=0,
                                         slow_warning=False)

    def epoch_lines():
        lines = [r.getMessage() for r in caplog.records if r.name == "sparkdl_avg" and r.getMessage().startswith("Epoch")]
        caplog.clear()
        return lines

    with caplog.at_level("INFO", logger="sparkdl_avg"):
        trainer(4).fit((x, y), epochs=1, verbose=2)
        assert epoch_lines()[0].startswith("Epoch 1/1 - 1 round - ")
        directory = str(tmp_path / "ckpt")
        with pytest.raises(KeyboardInterrupt):  # checkpoints after each round; epoch 2's first is the last
            trainer(1).fit((x, y), epochs=2, verbose=2, checkpoint_dir=directory, checkpoint_every=1,
                           callbacks=_CrashAfterRounds(6))  # one callback alone, as keras.Model.fit takes it
        first = epoch_lines()
        assert first[0].startswith("Epoch 1/2 - 4 rounds - ") and " - loss: " in first[0]
        assert first[0].index(" - loss: ") < first[0].index(" - abs_error: "), first[0]
        trainer(1).fit((x, y), epochs=2, verbose=2, checkpoint_dir=directory, resume=True)
        [resumed] = epoch_lines()
    assert resumed.startswith("Epoch 2/2 - 2 rounds after the checkpoint's 2 - "), resumed
    assert resumed.index(" - loss: ") < resumed.index(" - abs_error: "), resumed


def test_tensorboard_callback_writes_epoch_and_round_scalars(in_process_engine, tmp_path):
    import glob

    import tensorflow as tf

    x, y = regression_data(128, seed=8)
    model = make_model()
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=2, seed=0)
    board = keras.callbacks.TensorBoard(str(tmp_path), update_freq="batch")
    trainer.fit((x, y), epochs=2, validation_data=(x, y), callbacks=[board], verbose=0)
    tags = {}
    for kind in ("train", "validation"):
        for path in glob.glob(str(tmp_path / kind / "events.out.tfevents.*")):
            for event in tf.compat.v1.train.summary_iterator(path):
                for value in event.summary.value:
                    tags.setdefault(kind, set()).add(value.tag)
    assert {"epoch_loss", "epoch_mae"} <= tags["train"]
    assert "batch_loss" in tags["train"]  # written once per round
    assert "epoch_loss" in tags["validation"]


# ----------------------------------------------------------- a capped averaging_frequency
# Issue 16, user-reported surprise B1: a silent cap.


def test_an_averaging_frequency_above_the_epoch_warns_once_with_the_effective_value(in_process_engine, caplog):
    trainer = _trainer(averaging_frequency=8)
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        trainer.fit(DATA, epochs=2, verbose=0)
    warnings = [r.getMessage() for r in caplog.records if "averaging_frequency=8" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"the effective averaging_frequency is {STEPS}" in warnings[0]
    assert [r.averaging_frequency for r in trainer.stats] == [STEPS, STEPS]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        _trainer(averaging_frequency=STEPS).fit(DATA, epochs=1, verbose=0)
        _trainer(averaging_frequency=lambda epoch, rnd, logs: 2).fit(DATA, epochs=1, verbose=0)
    assert not [r for r in caplog.records if "averaging_frequency=" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        _trainer(averaging_frequency=lambda epoch, rnd, logs: 10).fit(DATA, epochs=2, verbose=0)
    assert len([r for r in caplog.records if "averaging_frequency=10" in r.getMessage()]) == 1


# ----------------------------------------------------------- the latest fit's stats and history
# Issue 16, user-reported surprise B3.


def test_stats_and_history_describe_the_latest_fit(in_process_engine, tmp_path):
    trainer = _trainer()
    trainer.fit(DATA, epochs=2, verbose=0)
    first = trainer.stats
    assert len(first) == 4
    history = trainer.fit(DATA, epochs=1, verbose=0)
    assert trainer.history is history
    assert len(trainer.stats) == 2 and [r.epoch for r in trainer.stats] == history.epoch * 2  # 2 rounds of epoch 0
    assert trainer.stats.summary()["rounds"] == 2
    assert len(first) == 4  # the previous fit's records are kept by whoever holds them
    trainer.write_report(str(tmp_path / "report.html"))


# ---------------------------------------------------------------- initial_epoch
# Issue 16, user-reported surprise B4: continued fits.


class _Epochs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.begun = []

    def on_epoch_begin(self, epoch, logs=None):
        self.begun.append(epoch)


def test_initial_epoch_continues_a_fit_like_one_longer_fit(in_process_engine, caplog):
    reference = make_model(seed=1)
    ref_history = _trainer(reference).fit(DATA, epochs=4, verbose=0)

    model = make_model(seed=1)
    trainer = _trainer(model)
    trainer.fit(DATA, epochs=2, verbose=0)
    epochs = _Epochs()
    with caplog.at_level(logging.INFO, logger="sparkdl_avg"):
        history = trainer.fit(DATA, epochs=4, initial_epoch=2, verbose=2, callbacks=[epochs])
    # the same data order (epochs 2 and 3), so the same weights as one fit of 4 epochs
    assert_weights_close(model.get_weights(), reference.get_weights(), atol=1e-12)
    assert history.epoch == [2, 3] and epochs.begun == [2, 3]
    np.testing.assert_allclose(history.history["loss"], ref_history.history["loss"][2:], rtol=1e-12)
    assert [r.epoch for r in trainer.stats] == [2, 2, 3, 3]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Epoch ")]
    assert [line.split(" - ")[0] for line in lines] == ["Epoch 3/4", "Epoch 4/4"]


def test_initial_epoch_is_validated(in_process_engine):
    trainer = _trainer()
    with pytest.raises(ConfigurationError, match=r"'initial_epoch' parameter must be an int in the range \[0, inf\)"):
        trainer.fit(DATA, epochs=2, initial_epoch=-1, verbose=0)
    with pytest.raises(ConfigurationError, match=r"'initial_epoch' parameter must be less than 'epochs' \(2\)"):
        trainer.fit(DATA, epochs=2, initial_epoch=2, verbose=0)
    with pytest.raises(ConfigurationError, match=r"'initial_epoch'.*Got 1.5"):
        trainer.fit(DATA, epochs=2, initial_epoch=1.5, verbose=0)
    assert len(trainer.stats) == 0


class _StopAfterEpoch(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            self.model.stop_training = True


def test_initial_epoch_with_checkpoints_and_resume(in_process_engine, tmp_path):
    reference = make_model(seed=1)
    _trainer(reference).fit(DATA, epochs=4, verbose=0)
    directory = str(tmp_path / "ckpt")

    model = make_model(seed=1)
    _trainer(model).fit(DATA, epochs=2, verbose=0, checkpoint_dir=directory)
    # continue in the same directory: its latest checkpoint is at epoch 2, where this fit starts
    trainer = _trainer(model)
    trainer.fit(DATA, epochs=4, initial_epoch=2, verbose=0, checkpoint_dir=directory, resume=True,
                callbacks=[_StopAfterEpoch(2)])  # a "crash" after epoch 2: the checkpoint is at epoch 3
    # the same command again resumes at epoch 3; the history holds epochs 2 and 3
    fresh = make_model(seed=5)
    history = _trainer(fresh).fit(DATA, epochs=4, initial_epoch=2, verbose=0, checkpoint_dir=directory, resume=True)
    assert history.epoch == [2, 3] and len(history.history["loss"]) == 2
    assert_weights_close(fresh.get_weights(), reference.get_weights(), atol=1e-12)

    # a checkpoint before initial_epoch does not hold the model being continued: refused, model untouched
    early = str(tmp_path / "early")
    _trainer(make_model(seed=1)).fit(DATA, epochs=1, verbose=0, checkpoint_dir=early)
    before = fresh.get_weights()
    with pytest.raises(ConfigurationError, match=r"is at epoch 1, before initial_epoch=2"):
        _trainer(fresh).fit(DATA, epochs=4, initial_epoch=2, verbose=0, checkpoint_dir=early, resume=True)
    assert_weights_close(fresh.get_weights(), before, atol=0)


def test_the_slow_warning_of_an_elastic_fit_counts_the_workers_that_ran_not_max_workers(spark, caplog):
    """max_workers=64 on local[2]: the slow-fit check compared the fit against 64 workers with no minibatch each
    (a ZeroDivisionError ended the fit); it compares the 2 that ran."""
    x, y = regression_data(192, seed=3)
    trainer = ParameterAveragingTrainer(make_model(), num_workers=None, max_workers=64, batch_size=8,
                                        averaging_frequency=1, seed=0)
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        trainer.fit((x, y), epochs=2, verbose=0)
    assert {r.num_workers for r in trainer.stats.records} == {2}
    slow = [r.getMessage() for r in caplog.records if r.getMessage().startswith("This fit is slower than one process")]
    assert len(slow) == 1 and " on 2 workers " in slow[0]
