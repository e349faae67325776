"""User-reported surprises (issue 16): errors that name the wrong thing, silent caps, and continued fits.

- the estimator's errors name its camelCase Params (``kerasModel``), the
  jobs' errors name the flags (``--batch-size``), from the option table;
- an ``averaging_frequency`` above an epoch's minibatches is cut with a warning;
- ``KerasAveragingModel.history`` is a Keras ``History`` like ``trainer.fit``'s;
- ``trainer.stats`` and ``trainer.history`` both describe the latest fit;
- ``fit(initial_epoch=...)`` continues a fit as ``keras.Model.fit`` does.
"""

from __future__ import annotations

import importlib.util
import logging
import os

import keras
import numpy as np
import pytest

from conftest import assert_weights_close, make_model, regression_data
from sparkdl_avg import ConfigurationError, ParameterAveragingTrainer, cli
from sparkdl_avg.driver import options
from sparkdl_avg.ml import KerasAveragingEstimator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N, B, STEPS = 2, 8, 3  # workers, batch size, minibatches per worker per epoch
DATA = regression_data(N * B * STEPS, seed=5)


def _trainer(model=None, **kwargs):
    kwargs = {"num_workers": N, "batch_size": B, "averaging_frequency": 2, "seed": 11, **kwargs}
    return ParameterAveragingTrainer(model if model is not None else make_model(seed=1), **kwargs)


@pytest.fixture(scope="module")
def df(spark):
    x, y = DATA
    return spark.createDataFrame([(list(map(float, a)), float(b)) for a, b in zip(x, y)],
                                 "features array<double>, label double")


# ------------------------------------------------------- A: errors name what the user wrote


def test_a_missing_keras_model_path_names_kerasModel_and_the_path(spark, tmp_path):
    path = str(tmp_path / "no_such_model.keras")
    with pytest.raises(ConfigurationError) as err:
        KerasAveragingEstimator(kerasModel=path)
    message = str(err.value)
    assert "'kerasModel'" in message and path in message and "no file" in message
    assert "Py4J" not in message and "java" not in message.lower()
    with pytest.raises(ConfigurationError, match="'kerasModel'.*cannot be read"):
        KerasAveragingEstimator(kerasModel="nosuchscheme://bucket/model.keras")


def test_an_uncompiled_model_names_kerasModel_given_as_a_model_or_a_path(spark, df, tmp_path):
    uncompiled = make_model(compile=False)
    with pytest.raises(ConfigurationError, match=r"^The 'kerasModel' parameter must be a compiled keras.Model. Got the uncompiled model"):
        KerasAveragingEstimator(kerasModel=uncompiled)
    path = str(tmp_path / "uncompiled.keras")
    uncompiled.save(path)
    est = KerasAveragingEstimator(kerasModel=path, numWorkers=N, batchSize=B)
    with pytest.raises(ConfigurationError) as err:
        est.fit(df)
    assert str(err.value).startswith("The 'kerasModel' parameter must be a compiled keras.Model. Got the uncompiled model"), str(err.value)
    assert "'model'" not in str(err.value)


def _bad_flag_values():
    """One bad value per option with a flag and a check, as the command line would give it."""
    bad = {"averaging_frequency": "0", "optimizer_state": "bogus", "on_nonfinite": "bogus", "seed": "-1",
           "update_rule": "nope", "staging_dir": "", "checkpoint_every": "soon", "checkpoint_dir": "",
           "state_transport": None, "aggregation": None, "check_data": None, "resume": None, "slow_warning": None,
           "mlflow": None, "log_model": None, "experiment": "", "tracking_uri": "", "run_name": ""}
    # None: a flag argparse checks itself (choices, store_true/store_false)
    for row in options.OPTIONS:
        if row.cli is None or row.check is None or bad.get(row.name, "") is None:
            continue
        if row.cli.choices is not None or row.cli.action is not None:
            continue  # argparse checks choices and switches itself
        yield row, bad.get(row.name, "-1")


def test_every_flag_error_names_the_flag_not_the_option(capsys):
    job = _train_job()
    seen = []
    for row, value in _bad_flag_values():
        flag = row.cli.flag or "--" + row.name.replace("_", "-")
        args = job.parse_args(["--data", "d", "--model", "m.keras", "--output-dir", "o", flag, value])

        def main(argv, args=args):
            config_args = cli.trainer_options(args)
            from sparkdl_avg import TrainerConfig

            TrainerConfig(**config_args)
            cli.check_fit_flags(args)
            cli.tracker(args)

        assert cli.run(main) == 2, flag
        line = capsys.readouterr().err
        assert flag in line and f"'{row.name}'" not in line, (flag, line)
        seen.append(flag)
    assert {"--batch-size", "--epochs", "--initial-epoch", "--num-workers", "--checkpoint-every",
            "--mlflow-experiment", "--mlflow-tracking-uri"} <= set(seen)


def _train_job():
    spec = importlib.util.spec_from_file_location("train_job_surprises", os.path.join(ROOT, "jobs", "train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_job_names_batch_size_and_epochs_the_same_way(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "jobs"))
    job = _train_job()
    common = ["--data", str(tmp_path / "none.parquet"), "--output-dir", str(tmp_path / "out"),
              "--model-builder", "digits_model:build"]
    lines = {}
    for flags in (["--batch-size", "-1"], ["--epochs", "0"], ["--epochs", "2", "--initial-epoch", "2"]):
        assert cli.run(job.main, [*common, *flags]) == 2
        lines[flags[-2]] = capsys.readouterr().err.strip().splitlines()[-1]
    assert lines["--batch-size"] == "error: The --batch-size flag must be an int in the range [1, inf). Got -1 instead."
    assert lines["--epochs"] == "error: The --epochs flag must be an int in the range [1, inf). Got 0 instead."
    assert lines["--initial-epoch"].startswith("error: The --initial-epoch flag must be less than --epochs (2)")


# ----------------------------------------------------------- B1: a capped averaging_frequency


def test_an_averaging_frequency_above_the_epoch_warns_once_with_the_effective_value(spark, caplog):
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


# ----------------------------------------------------- B2, B3: what a fit leaves behind


def test_the_fitted_models_history_is_a_keras_history(spark, df):
    fitted = KerasAveragingEstimator(kerasModel=make_model(seed=1), numWorkers=N, batchSize=B, averagingFrequency=2, epochs=2,
                                     seed=3).fit(df)
    assert isinstance(fitted.history, keras.callbacks.History)
    assert fitted.history.epoch == [0, 1] and len(fitted.history.history["loss"]) == 2
    assert [r.epoch for r in fitted.stats] == [0, 0, 1, 1]


def test_stats_and_history_describe_the_latest_fit(spark, tmp_path):
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


# ---------------------------------------------------------------- B4: initial_epoch


class _Epochs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.begun = []

    def on_epoch_begin(self, epoch, logs=None):
        self.begun.append(epoch)


def test_initial_epoch_continues_a_fit_like_one_longer_fit(spark, caplog):
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


def test_initial_epoch_is_validated(spark):
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


def test_initial_epoch_with_checkpoints_and_resume(spark, tmp_path):
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
