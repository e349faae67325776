"""Training that survives: checkpoints and resume, retried tasks, NaN, bad input.

The module runs on ``local[2,3]`` (2 cores, up to 3 attempts per task), so a
task that fails on its first attempt is retried by Spark.
"""

import json
import logging
import os
import shutil

import numpy as np
import pytest

import keras

from conftest import assert_weights_close, dropout_model, make_model, record_jobs, regression_data, shared_spark
from parity import ElasticMixin, LocalOptimizerStateMixin, TaskRetryMixin, lose_host_files
from sparkdl_avg import BlockMomentum, ConfigurationError, DataError, ParameterAveragingTrainer, WorkerError
from sparkdl_avg.driver.checkpoint import files as ckpt
from sparkdl_avg.shared.files import fs
from sparkdl_avg.driver.checkpoint import policy as resume_mod
from sparkdl_avg.errors import CheckpointError, PathError

B, N = 8, 2


# ``local[2,3]`` (up to 3 attempts per task, for the retried tasks), shared with the other modules that ask for it.
spark = shared_spark("local[2,3]", log_level="OFF")



@pytest.fixture
def tmp(tmp_path):
    return str(tmp_path)


DATA = regression_data(12 * N * B, seed=11)  # 12 minibatches per worker per epoch


def trainer_for(model, **kw):
    options = dict(num_workers=N, batch_size=B, averaging_frequency=3, update_rule=BlockMomentum(0.5), seed=3)
    options.update(kw)
    return ParameterAveragingTrainer(model, **options)


class StopAfterRounds(keras.callbacks.Callback):
    """Simulates a driver crash: raises after ``rounds`` rounds."""

    def __init__(self, rounds):
        super().__init__()
        self.rounds, self.seen = rounds, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.rounds:
            raise KeyboardInterrupt("simulated crash")


# ------------------------------------------------------------ checkpoints


def test_resume_after_a_crash_ends_with_the_weights_of_an_uninterrupted_run(in_process_engine, tmp):
    reference = dropout_model()
    ref_history = trainer_for(reference).fit(DATA, epochs=3, verbose=0)

    model = dropout_model()
    directory = os.path.join(tmp, "ckpt")
    with pytest.raises(KeyboardInterrupt):
        trainer_for(model).fit(
            DATA, epochs=3, verbose=0, checkpoint_dir=directory, checkpoint_every=2, callbacks=[StopAfterRounds(7)]
        )
    # 4 rounds per epoch; the last checkpoint is after round 6 = epoch 1, round 2
    saved = ckpt.load(ckpt.latest(directory))
    assert (saved.epoch, saved.rounds_done, saved.steps_done) == (1, 2, 6)
    assert sorted(os.listdir(directory)) == ["LATEST", "ckpt-000001", "ckpt-000002"]  # the previous one is kept

    fresh = dropout_model(seed=99)  # other initial weights: the checkpoint's must win
    trainer = trainer_for(fresh, seed=None)  # the seed comes from the checkpoint
    history = trainer.fit(DATA, epochs=3, verbose=0, checkpoint_dir=directory, checkpoint_every=2, resume=True)
    assert_weights_close(fresh.get_weights(), reference.get_weights(), atol=1e-12)
    np.testing.assert_allclose(history.history["loss"], ref_history.history["loss"], rtol=1e-12)
    assert len(trainer.stats.records) == 6  # only the rounds after the checkpoint ran


def test_resume_refuses_another_configuration(in_process_engine, tmp):
    directory = os.path.join(tmp, "ckpt")
    trainer_for(make_model()).fit(DATA, epochs=1, verbose=0, checkpoint_dir=directory)
    with pytest.raises(ConfigurationError, match=r"another configuration \(batch_size: checkpoint 8, now 4\)"):
        trainer_for(make_model(), batch_size=4).fit(DATA, epochs=2, verbose=0, checkpoint_dir=directory, resume=True)
    with pytest.raises(ConfigurationError, match=r"already holds checkpoints.*Pass resume=True"):
        trainer_for(make_model()).fit(DATA, epochs=2, verbose=0, checkpoint_dir=directory)


def test_checkpoint_dir_takes_a_path_and_a_tilde_and_resume_says_when_it_finds_nothing(in_process_engine, tmp, monkeypatch,
                                                                                        caplog):
    """'~/x' is the home's x (not a folder named '~'); a pathlib.Path is a path; resume=True in a directory with no
    checkpoint (a first run, or a typo) says that the fit starts from the beginning."""
    import logging
    import pathlib

    monkeypatch.setenv("HOME", os.path.join(tmp, "home"))
    monkeypatch.chdir(tmp)
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        trainer_for(make_model()).fit(DATA, epochs=1, verbose=0, checkpoint_dir="~/ckpt", resume=True)
    assert "resume=True found no checkpoint in " in caplog.text and "starts from the beginning" in caplog.text
    assert not os.path.exists(os.path.join(tmp, "~"))
    assert sorted(os.listdir(os.path.join(tmp, "home", "ckpt"))) == ["LATEST", "ckpt-000000"]
    caplog.clear()
    trainer = trainer_for(make_model())
    trainer.fit(DATA, epochs=2, verbose=0, checkpoint_dir=pathlib.Path(tmp, "home", "ckpt"), resume=True)
    assert "found no checkpoint" not in caplog.text
    assert [r.epoch for r in trainer.stats.records] == [1] * 4  # only the second epoch ran


def test_checkpoint_dir_holding_something_else_is_refused_and_kept(in_process_engine, tmp):
    (open(os.path.join(tmp, "notes.txt"), "w")).write("mine")
    with pytest.raises(ConfigurationError, match=r"'checkpoint_dir'.*holds \['notes.txt'\]"):
        trainer_for(make_model()).fit(DATA, epochs=1, verbose=0, checkpoint_dir=tmp)
    assert open(os.path.join(tmp, "notes.txt")).read() == "mine"


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(checkpoint_every=0), r"'checkpoint_every'.*\[1, inf\).*Got 0"),
        (dict(checkpoint_every="round"), r"'checkpoint_every'.*Got 'round'"),
        (dict(resume=True), r"'resume' parameter is True but no 'checkpoint_dir'"),
        (dict(resume=1), r"'resume' parameter must be a bool or the path"),
    ],
)
def test_invalid_checkpoint_arguments(in_process_engine, kwargs, pattern):
    with pytest.raises(ConfigurationError, match=pattern):
        trainer_for(make_model()).fit(DATA, verbose=0, **kwargs)


def test_a_failed_checkpoint_write_keeps_the_previous_one(tmp, monkeypatch):
    good = ckpt.Checkpoint(1, 0, 0, [np.ones(3)], [np.zeros(1)], {"delta": [np.full(3, 0.5)]}, ckpt.RunMeta(seed=1))
    first = ckpt.save(tmp, good)
    real = fs.write_atomically

    def failing(uri, data, overwrite=True):  # every file a checkpoint writes goes through fs.write_atomically
        if uri.endswith(ckpt.META):
            raise OSError("disk full")
        real(uri, data, overwrite)

    monkeypatch.setattr(fs, "write_atomically", failing)
    with pytest.raises(CheckpointError, match=r"^Cannot write a checkpoint to the 'checkpoint_dir' .*: disk full\. "
                                              r"The model in memory is intact"):
        ckpt.save(tmp, ckpt.Checkpoint(2, 0, 0, [np.full(3, 9.0)], [np.zeros(1)], {}, ckpt.RunMeta(seed=1)))
    assert ckpt.latest(tmp) == first and sorted(os.listdir(tmp)) == ["LATEST", "ckpt-000000"]  # nothing half-written
    loaded = ckpt.load(first)
    np.testing.assert_array_equal(loaded.weights[0], np.ones(3))
    np.testing.assert_array_equal(loaded.rule_state["delta"][0], np.full(3, 0.5))
    assert loaded.meta.seed == 1


# ------------------------------------------------------ damaged checkpoints


def _two_checkpoints(directory):
    """Two checkpoints (epochs 1 and 2) kept in ``directory``, as a fit keeps them."""
    first = ckpt.save(directory, ckpt.Checkpoint(1, 0, 0, [np.ones(3)], [np.zeros(1)], {}, ckpt.RunMeta(seed=1)),
                      keep=resume_mod.KEEP)
    second = ckpt.save(directory, ckpt.Checkpoint(2, 0, 0, [np.full(3, 2.0)], [np.zeros(1)], {}, ckpt.RunMeta(seed=1)),
                       keep=resume_mod.KEEP)
    return first, second


DAMAGES = {  # the file, what happens to its bytes, what the message says
    "arrays.npz truncated": (ckpt.ARRAYS, lambda b: b[: len(b) // 2], "does not match the SHA-256 recorded in meta.json"),
    "arrays.npz emptied": (ckpt.ARRAYS, lambda b: b"", "arrays.npz (0 bytes) does not match the SHA-256"),
    "meta.json overwritten": (ckpt.META, lambda b: b"garbage{", "meta.json is not JSON"),
    "meta.json not an object": (ckpt.META, lambda b: b"[1, 2]", "meta.json holds a list, not a checkpoint's metadata"),
    # issue 38: values of the wrong types read as "format version 'three'", a ConfigurationError without the fall-back
    "meta.json version a word": (ckpt.META, lambda b: _edit_meta(b, format_version="three"),
                                 "meta.json holds format_version='three' where a non-negative integer belongs"),
    "meta.json epoch a string": (ckpt.META, lambda b: _edit_meta(b, epoch="2"),
                                 "meta.json holds epoch='2' where a non-negative integer belongs"),
    "meta.json sizes a list": (ckpt.META, lambda b: _edit_meta(b, rule_state_sizes=[1]),
                               "meta.json holds rule_state_sizes=[1] where an object belongs"),
}


def _edit_meta(data, **values):
    return json.dumps({**json.loads(data), **values}).encode()


def _damage(uri, kind):
    name, change, _ = DAMAGES[kind]
    path = os.path.join(uri, name)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(change(data))


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_a_damaged_checkpoint_is_a_checkpoint_error_naming_it_and_the_remedy(tmp, kind):
    _, second = _two_checkpoints(tmp)
    _damage(second, kind)
    with pytest.raises(CheckpointError) as err:
        ckpt.load(second)
    message = str(err.value)
    assert message.startswith(f"The checkpoint at '{second}' is damaged: "), message
    assert DAMAGES[kind][2] in message
    assert "fit(resume=True) takes the previous checkpoint in its directory when one reads back" in message
    assert isinstance(err.value, PathError) and isinstance(err.value, ValueError)


@pytest.mark.parametrize("kind", ["arrays.npz truncated", "meta.json overwritten", "meta.json version a word"])
def test_resume_takes_the_newest_checkpoint_that_reads_back_with_a_warning(tmp, caplog, kind):
    first, second = _two_checkpoints(tmp)
    assert sorted(os.listdir(tmp)) == ["LATEST", "ckpt-000000", "ckpt-000001"]
    _damage(second, kind)
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        uri, saved = resume_mod.locate(tmp, resume=True)
    assert uri == first and saved.epoch == 1
    np.testing.assert_array_equal(saved.weights[0], np.ones(3))
    assert f"Skipping the checkpoint {second}: The checkpoint at '{second}' is damaged" in caplog.text
    assert f"Resuming from {first}, the newest checkpoint in {tmp} that reads back." in caplog.text
    with pytest.raises(CheckpointError, match=r"^The 'resume' parameter '.*ckpt-000001' is not a checkpoint to "
                                              r"resume from: The checkpoint at .* is damaged"):
        resume_mod.locate(tmp, resume=second)  # the one asked for by path is not replaced by another
    with pytest.raises(CheckpointError, match=r"^The 'resume' parameter 'yes' is not a checkpoint to resume from: "
                                              r"No complete sparkdl_avg checkpoint at 'yes'.*\(resume=True continues"):
        resume_mod.locate(None, resume="yes")
    _damage(first, "arrays.npz emptied")
    with pytest.raises(CheckpointError, match=r"No other checkpoint in '.*' reads back either\."):
        resume_mod.locate(tmp, resume=True)


@pytest.mark.parametrize("pointer", ["../outside", "../../etc", "/etc", "ckpt-000000/../../outside", "sub/ckpt-1"])
def test_a_latest_pointer_that_leads_out_of_the_directory_is_ignored(tmp_path, caplog, pointer):
    directory = str(tmp_path / "ckpt")
    inside = ckpt.save(directory, ckpt.Checkpoint(1, 0, 0, [np.ones(3)], [np.zeros(1)], {}, ckpt.RunMeta(seed=1)))
    shutil.copytree(inside, tmp_path / "outside")  # a complete checkpoint outside the directory
    with open(os.path.join(directory, ckpt.LATEST), "w") as f:
        f.write(pointer)
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        assert ckpt.latest(directory) == inside
    assert f"Ignoring {directory}/LATEST: it holds {pointer!r}, not the name of a checkpoint" in caplog.text


def test_a_latest_naming_a_missing_checkpoint_is_warned_about_once_per_resume(tmp_path, caplog):
    directory = str(tmp_path / "ckpt")
    inside = ckpt.save(directory, ckpt.Checkpoint(1, 0, 0, [np.ones(3)], [np.zeros(1)], {}, ckpt.RunMeta(seed=1)))
    with open(os.path.join(directory, ckpt.LATEST), "w") as f:
        f.write("ckpt-999999")
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        uri, saved = resume_mod.locate(directory, resume=True)
    assert uri == inside and saved.epoch == 1
    warned = [r.getMessage() for r in caplog.records if "which is not there" in r.getMessage()]
    assert warned == [f"{directory}/LATEST names ckpt-999999, which is not there; taking the newest complete "
                      "checkpoint instead."]  # issue 38: it was logged twice


def test_a_fit_keeps_the_previous_checkpoint_and_resumes_from_it_when_the_latest_is_damaged(in_process_engine, tmp, caplog):
    directory = os.path.join(tmp, "ckpt")
    trainer_for(make_model()).fit(DATA, epochs=2, verbose=0, checkpoint_dir=directory)
    assert sorted(os.listdir(directory)) == ["LATEST", "ckpt-000000", "ckpt-000001"]
    _damage(os.path.join(directory, "ckpt-000001"), "arrays.npz truncated")
    trainer = trainer_for(make_model())
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        history = trainer.fit(DATA, epochs=3, verbose=0, checkpoint_dir=directory, resume=True)
    assert f"Skipping the checkpoint {directory}/ckpt-000001" in caplog.text
    assert sorted({r.epoch for r in trainer.stats.records}) == [1, 2]  # from the epoch-1 checkpoint on
    assert history.epoch == [0, 1, 2] and len(history.history["loss"]) == 3
    assert sorted(os.listdir(directory)) == ["LATEST", "ckpt-000002", "ckpt-000003"]  # the damaged one is gone


def _checkpoint(epoch):
    return ckpt.Checkpoint(epoch, 0, 0, [np.full(3, float(epoch))], [np.zeros(1)], {}, ckpt.RunMeta(seed=1))


@pytest.mark.parametrize("kind", ["arrays.npz truncated", "meta.json overwritten"])
def test_the_save_after_a_skipped_damaged_checkpoint_keeps_the_one_that_verifies(tmp, caplog, kind):
    # A resume skipped the damaged latest (ckpt-000001) for ckpt-000000; the next save must keep
    # ckpt-000000, the newest earlier checkpoint that verifies, not the damaged one by its name.
    first, second = _two_checkpoints(tmp)
    _damage(second, kind)
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        third = ckpt.save(tmp, _checkpoint(3), keep=resume_mod.KEEP)
    assert sorted(os.listdir(tmp)) == ["LATEST", "ckpt-000000", "ckpt-000002"]
    assert f"Deleting the checkpoint {second}, which does not read back" in caplog.text
    assert ckpt.latest(tmp) == third and ckpt.load(third).epoch == 3
    np.testing.assert_array_equal(ckpt.load(first).weights[0], np.ones(3))
    _damage(third, "arrays.npz truncated")  # the new one damaged in turn: the fit can still resume
    uri, saved = resume_mod.locate(tmp, resume=True)
    assert uri == first and saved.epoch == 1


def test_pruning_keeps_checkpoints_that_do_not_verify_while_none_earlier_does(tmp, caplog):
    first, second = _two_checkpoints(tmp)
    _damage(first, "arrays.npz emptied")
    _damage(second, "arrays.npz truncated")
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        third = ckpt.save(tmp, _checkpoint(3), keep=resume_mod.KEEP)
    assert sorted(os.listdir(tmp)) == ["LATEST", "ckpt-000000", "ckpt-000001", "ckpt-000002"]
    assert f"Keeping the checkpoint {second}, which does not read back" in caplog.text
    fourth = ckpt.save(tmp, _checkpoint(4), keep=resume_mod.KEEP)  # third verifies: the rest goes
    assert sorted(os.listdir(tmp)) == ["LATEST", "ckpt-000002", "ckpt-000003"]
    assert ckpt.load(third).epoch == 3 and ckpt.load(fourth).epoch == 4
    # keep=1 deletes every earlier one without reading it
    ckpt.save(tmp, _checkpoint(5))
    assert sorted(os.listdir(tmp)) == ["LATEST", "ckpt-000004"]


def test_a_checkpoint_that_does_not_read_back_as_written_is_not_committed(tmp, monkeypatch):
    first, second = _two_checkpoints(tmp)
    real = fs.write_atomically

    def truncating(uri, data, overwrite=True):  # a storage that loses the end of arrays.npz
        real(uri, data[: len(data) // 2] if uri.endswith(ckpt.ARRAYS) else data, overwrite)

    monkeypatch.setattr(fs, "write_atomically", truncating)
    with pytest.raises(CheckpointError, match=r"The checkpoint just written to '.*ckpt-000002' does not read back: .*"
                                              r"LATEST still names the previous checkpoint and none was deleted"):
        ckpt.save(tmp, _checkpoint(3), keep=resume_mod.KEEP)
    assert ckpt.latest(tmp) == second
    assert sorted(os.listdir(tmp)) == ["LATEST", "ckpt-000000", "ckpt-000001", "ckpt-000002"]
    uri, saved = resume_mod.locate(tmp, resume=True)
    assert uri == second and saved.epoch == 2
    np.testing.assert_array_equal(ckpt.load(first).weights[0], np.ones(3))


def test_a_fit_resumed_past_a_damaged_checkpoint_keeps_the_good_one_after_its_next_save(in_process_engine, tmp, caplog):
    directory = os.path.join(tmp, "ckpt")
    trainer_for(make_model()).fit(DATA, epochs=2, verbose=0, checkpoint_dir=directory)
    good, damaged = os.path.join(directory, "ckpt-000000"), os.path.join(directory, "ckpt-000001")
    before = ckpt.load(good)
    _damage(damaged, "arrays.npz truncated")
    trainer = trainer_for(make_model())
    with caplog.at_level(logging.WARNING, logger="sparkdl_avg"):
        trainer.fit(DATA, epochs=2, verbose=0, checkpoint_dir=directory, resume=True)  # one more epoch: one save
    assert f"Skipping the checkpoint {damaged}" in caplog.text
    assert sorted({r.epoch for r in trainer.stats.records}) == [1]
    # the new checkpoint and the good one it resumed from; the damaged one is gone
    assert sorted(os.listdir(directory)) == ["LATEST", "ckpt-000000", "ckpt-000002"]
    new = os.path.join(directory, "ckpt-000002")
    assert ckpt.latest(directory) == new and ckpt.load(new).epoch == 2
    kept = ckpt.load(good)
    assert kept.epoch == before.epoch == 1
    assert_weights_close(kept.weights, before.weights, atol=0)
    _damage(new, "arrays.npz truncated")  # should the new one be damaged too, the fit can still resume
    assert resume_mod.locate(directory, resume=True)[0] == good


# ---------------------------------------------------------------- retries


class TestTaskRetry(TaskRetryMixin):
    """tests/parity.py: the same test runs under Spark Connect in test_connect.py."""


class TestLocalOptimizerState(LocalOptimizerStateMixin):
    """tests/parity.py: optimizer_state="local"; the same tests run under Spark Connect in test_connect.py."""

    def test_a_neighbour_losing_its_states_leaves_this_fits_alone(self, session, tmp_path):
        """The flake of the retried-task test (weights 0.02 apart, once): another process on the host ran a
        lost-state test, which deleted worker 1's files of every fit there, this one's too, between two rounds.
        Forced here: the neighbour's loss runs between this fit's rounds 1 and 2 of each epoch."""
        from sparkdl_avg.shared.files.uris import join
        from sparkdl_avg.shared.wire.local_state import host_directory

        neighbour = str(tmp_path / "neighbour")  # a fit staged there, with worker 1's state of its round 1 on the host
        os.makedirs(os.path.join(neighbour, "sparkdl_avg-20260101-000000-1", "exchange-1"))
        kept = host_directory(join(neighbour, "sparkdl_avg-20260101-000000-1/exchange-1/local"))
        os.makedirs(kept, exist_ok=True)
        open(os.path.join(kept, "g1-w1.bin"), "wb").close()
        lost = []

        class NeighbourLosesWorker1(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch == 1:
                    lost.extend(lose_host_files(neighbour, "local", 1))

        try:
            trainer, model = self._fit(callbacks=[NeighbourLosesWorker1()])
        finally:
            shutil.rmtree(kept, ignore_errors=True)
        _, clean = self._fit()
        assert lost == ["g1-w1.bin"]  # the neighbour's, once
        assert trainer.stats.local_states_restarted == 0
        assert_weights_close(model.get_weights(), clean.get_weights(), atol=0)


class TestElastic(ElasticMixin):
    """tests/parity.py: elastic rounds with scripted slots; the same tests run under Spark Connect in test_connect.py."""


# ------------------------------------------------------------ bad numbers


def nan_data():
    """Regression data where worker 1's first example of round 1 is NaN (shuffle=False)."""
    x, y = regression_data(12 * N * B, seed=11)
    x = x.copy()
    # unshuffled, round 1 (k=3) has minibatches 3..5; worker 1 takes the second half of them
    x[3 * N * B + 3 * B] = np.nan
    return x, y


class Snapshot(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        self.weights = self.model.get_weights()


def test_nan_on_one_worker_stops_with_the_named_error_and_the_last_good_weights(in_process_engine, tmp):
    model = make_model(seed=1)
    snapshot = Snapshot()
    trainer = trainer_for(model, update_rule=None, check_data=False)
    with pytest.raises(WorkerError, match=r"Non-finite loss or weights \(NaN/Inf\) from worker\(s\) 1 \(loss nan\) in epoch 0, round 1"):
        trainer.fit(nan_data(), epochs=1, verbose=0, shuffle=False, callbacks=[snapshot], checkpoint_dir=tmp, checkpoint_every=1)
    assert_weights_close(model.get_weights(), snapshot.weights, atol=0)  # the weights after round 0
    assert all(np.isfinite(w).all() for w in model.get_weights())
    assert_weights_close(ckpt.load(ckpt.latest(tmp)).weights, snapshot.weights, atol=0)


def test_nan_replicas_can_be_skipped(in_process_engine, caplog):
    model = make_model(seed=1)
    trainer = trainer_for(model, update_rule=None, check_data=False, on_nonfinite="skip")
    with caplog.at_level("WARNING", logger="sparkdl_avg"):
        history = trainer.fit(nan_data(), epochs=1, verbose=0, shuffle=False)
    assert "Left worker(s) 1 (loss nan) out of the average of epoch 0, round 1" in caplog.text
    assert all(np.isfinite(w).all() for w in model.get_weights())
    assert np.isfinite(history.history["loss"][0])
    assert trainer.stats.records[1]["examples"] == 3 * B  # only worker 0's


# -------------------------------------------------------------- bad input


def test_nan_in_dataframe_features_is_a_data_error_naming_the_column(spark):
    x, y = DATA
    rows = [(list(map(float, r)), float(t)) for r, t in zip(x, y)]
    rows[5] = ([float("nan")] * 4, rows[5][1])
    df = spark.createDataFrame(rows, "feats array<double>, target double")
    with pytest.raises(DataError, match=r"Column 'feats' contains NaN or Inf \(4 values; the first in row 5"):
        trainer_for(make_model()).fit(df, features_col="feats", label_col="target", verbose=0)


def classifier(loss="sparse_categorical_crossentropy", units=3, activation="softmax"):
    model = make_model(outputs=units, output_activation=activation, loss=loss, metrics=())
    return model


def test_labels_out_of_range_for_the_loss(spark):
    x = DATA[0]
    labels = np.arange(len(x)) % 3
    labels[17] = 3
    df = spark.createDataFrame(
        [(list(map(float, r)), int(t)) for r, t in zip(x, labels)], "features array<double>, label int"
    )
    with pytest.raises(DataError, match=r"Column 'label' holds the label 3; expected a class index in 0..2"):
        trainer_for(classifier()).fit(df, verbose=0)
    with pytest.raises(DataError, match=r"The training array y holds the label 3; expected a class index in 0..2"):
        trainer_for(classifier()).fit((x, labels), verbose=0)
    binary = classifier("binary_crossentropy", units=1, activation="sigmoid")
    with pytest.raises(DataError, match=r"holds the label 2.0; expected a value in \[0, 1\]"):
        trainer_for(binary).fit((x, np.where(labels == 3, 2.0, 0.0)), verbose=0)
    # check_data=False stages it anyway (the loss then fails or not, as Keras would)
    trainer_for(classifier(), check_data=False)._stage((x, labels), "features", "label", "training")


@pytest.mark.parametrize("sparse_loss", ["sparse_categorical_crossentropy", keras.losses.sparse_categorical_crossentropy,
                                         keras.losses.SparseCategoricalCrossentropy()], ids=["string", "function", "object"])
def test_one_hot_labels_with_a_sparse_loss_are_refused_before_any_round(spark, sparse_loss):
    """Keras would fail in round 0 on the executors, about the rank of target and output (issue #29 item 8)."""
    x = DATA[0]
    one_hot = np.eye(3)[np.arange(len(x)) % 3]
    name = sparse_loss if isinstance(sparse_loss, str) else getattr(sparse_loss, "__name__", type(sparse_loss).__name__)
    expected = (rf"{name} expects one integer class index per row; {{}} holds vectors of length 3: "
                r"use categorical_crossentropy or argmax the labels")
    trainer = trainer_for(classifier(sparse_loss))
    with record_jobs(spark) as jobs:
        with pytest.raises(DataError, match=expected.format("the training array y")):
            trainer.fit((x, one_hot), verbose=0)
    assert jobs.job_ids == []
    df = spark.createDataFrame([(list(map(float, r)), list(map(float, t))) for r, t in zip(x, one_hot)],
                               "features array<double>, onehot array<float>")
    with pytest.raises(DataError, match=expected.format("label column 'onehot'")):
        trainer.fit(df, label_col="onehot", verbose=0)  # known once the staging job has read the arrays
    with pytest.raises(DataError, match=expected.format("the validation array y")):
        trainer.fit((x, np.arange(len(x)) % 3), validation_data=(x, one_hot), verbose=0)
    assert len(trainer.stats) == 0  # no round ran
    # (n, 1) class indices are what Keras takes too
    trainer_for(classifier(sparse_loss))._stage((x, (np.arange(len(x)) % 3)[:, None]), "features", "label", "training")


@pytest.mark.parametrize("loss", ["categorical_crossentropy", keras.losses.categorical_crossentropy,
                                  keras.losses.CategoricalCrossentropy()], ids=["string", "function", "object"])
def test_class_indices_with_a_categorical_loss_are_refused_before_any_job(spark, loss):
    x = DATA[0]
    labels = np.arange(len(x)) % 3
    name = loss if isinstance(loss, str) else getattr(loss, "__name__", type(loss).__name__)
    expected = (rf"{name} expects a one-hot vector of 3 values per row \(the model's output has 3 classes\); "
                r"{} holds one number per row: use sparse_categorical_crossentropy for class indices or one-hot "
                r"encode the labels")
    df = spark.createDataFrame([(list(map(float, r)), int(t)) for r, t in zip(x, labels)],
                               "features array<double>, label int")
    trainer = trainer_for(classifier(loss))
    with record_jobs(spark) as jobs:
        with pytest.raises(DataError, match=expected.format("the training array y")):
            trainer.fit((x, labels), verbose=0)
        with pytest.raises(DataError, match=expected.format("label column 'label'")):
            trainer.fit(df, verbose=0)  # from the schema: an int column holds one number per row
        with pytest.raises(DataError, match=expected.format("the evaluation array y")):
            trainer.evaluate((x, labels[:, None]))
    assert jobs.job_ids == []
    with pytest.raises(DataError, match=rf"{name} expects a one-hot vector of 3 values per row.*"
                                        r"the training array y holds vectors of length 4: give 3 values per row or "
                                        r"change the output layer to 4 units"):
        trainer.fit((x, np.eye(4)[labels]), verbose=0)
    pairs = [(r, t) for r, t in zip(x, labels.astype(float))]
    with pytest.raises(DataError, match=expected.format("the labels of the training RDD")):
        trainer.fit(spark.sparkContext.parallelize(pairs, 2), verbose=0)
    assert len(trainer.stats) == 0
    # check_data=False stages them anyway (Keras then fails in the first round)
    trainer_for(classifier(loss), check_data=False)._stage((x, labels), "features", "label", "training")


def test_binary_labels_must_match_the_outputs_units(in_process_engine):
    x = DATA[0]
    multi_label = classifier("binary_crossentropy", units=3, activation="sigmoid")
    with pytest.raises(DataError, match=r"binary_crossentropy expects 3 value\(s\) in \[0, 1\] per row \(one per unit "
                                        r"of the model's output\); the training array y holds one number per row"):
        trainer_for(multi_label).fit((x, np.arange(len(x)) % 2), verbose=0)
    one = classifier("binary_crossentropy", units=1, activation="sigmoid")
    trainer_for(one)._stage((x, np.arange(len(x)) % 2), "features", "label", "training")  # (n,) fits a 1-unit output


@pytest.mark.parametrize("loss", ["mse", keras.losses.mean_absolute_error, keras.losses.Huber()],
                         ids=["string", "function", "object"])
def test_value_by_value_losses_need_labels_as_wide_as_the_output_before_any_round(spark, loss):
    """Issue 38: a 3-output MSE model with 2-value labels failed in round 0 with a TensorFlow trace."""
    x = DATA[0]
    model = classifier(loss, units=3, activation=None)
    name = loss if isinstance(loss, str) else getattr(loss, "__name__", type(loss).__name__)
    expected = (rf"^{name} expects 3 value\(s\) per row \(one per unit of the model's output\); {{}} holds vectors "
                r"of length 2: give 3 value\(s\) per row or change the output layer to 2 units\.$")
    two = np.ones((len(x), 2))
    with record_jobs(spark) as jobs:
        with pytest.raises(DataError, match=expected.format("the training array y")):
            trainer_for(model).fit((x, two), verbose=0)
    assert jobs.job_ids == []
    df = spark.createDataFrame([(list(map(float, r)), [1.0, 2.0]) for r in x], "features array<double>, y array<double>")
    trainer = trainer_for(model)
    with pytest.raises(DataError, match=expected.format("label column 'y'")):
        trainer.fit(df, label_col="y", verbose=0)  # known once the staging job has read the arrays
    assert len(trainer.stats) == 0  # no round ran
    # one value per row is refused too (Keras fails on it: "Incompatible shapes: [16] vs. [16,3]") ...
    with pytest.raises(DataError, match=rf"^{name} expects 3 value\(s\) per row .*; the training array y holds one "
                                        r"number per row"):
        trainer_for(model).fit((x, np.ones(len(x))), verbose=0)
    # ... and as wide as the output is staged, and one value for a 1-unit output
    trainer_for(model)._stage((x, np.ones((len(x), 3))), "features", "label", "training")
    trainer_for(classifier(loss, units=1, activation=None))._stage((x, np.ones(len(x))), "features", "label", "training")


def test_nan_in_rdd_labels(spark):
    x, y = DATA
    pairs = [(r, float("inf") if i == 2 else float(t)) for i, (r, t) in enumerate(zip(x, y))]
    with pytest.raises(DataError, match=r"The labels of RDD partition 0 contains NaN or Inf"):
        trainer_for(make_model()).fit(spark.sparkContext.parallelize(pairs, 2), verbose=0)


class Unregistered(keras.layers.Layer):
    def call(self, x):
        return x * 2.0


def test_model_that_executors_cannot_rebuild_is_refused_on_the_driver(spark):
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1)(Unregistered()(inputs)))
    model.compile("sgd", "mse")
    with record_jobs(spark) as jobs:
        with pytest.raises(ConfigurationError, match=r"cannot be rebuilt from its Keras config.*register_keras_serializable.*Keras said: TypeError"):
            trainer_for(model).fit(DATA, verbose=0)
    assert jobs.job_ids == []


# ------------------------------------------------------- review follow-ups


def test_latest_falls_back_to_the_newest_complete_checkpoint_without_latest(tmp):
    ckpt.save(tmp, ckpt.Checkpoint(0, 1, 1, [np.ones(2)], [np.zeros(1)], {}, ckpt.RunMeta(seed=1)), keep=2)
    second = ckpt.save(tmp, ckpt.Checkpoint(0, 2, 2, [np.full(2, 2.0)], [np.zeros(1)], {}, ckpt.RunMeta(seed=1)), keep=2)
    os.remove(os.path.join(tmp, ckpt.LATEST))  # a crash in HDFS's delete + rename of LATEST
    os.makedirs(os.path.join(tmp, "ckpt-000002"))  # a newer checkpoint that never got its meta.json
    assert ckpt.latest(tmp) == second


def test_numpy_scalars_in_rules_schedules_and_seed_survive_a_checkpoint(in_process_engine, tmp):
    from sparkdl_avg import PostLocalSGD

    rule = BlockMomentum(np.float32(0.5), np.float64(1.0))
    assert type(rule.block_momentum) is float and type(rule.block_lr) is float
    model = make_model()
    trainer = trainer_for(
        model, update_rule=rule, averaging_frequency=PostLocalSGD(np.int64(1), np.int64(3)), seed=np.int64(3)
    )
    trainer.fit(DATA, epochs=1, verbose=0, checkpoint_dir=tmp)
    assert ckpt.load(ckpt.latest(tmp)).meta.seed == 3


def test_freezing_layers_between_fits_rebuilds_the_rule_state(in_process_engine):
    model = make_model()
    trainer = trainer_for(model)
    trainer.fit(DATA, epochs=1, verbose=0)
    assert len(trainer.update_rule_state["state"]["delta"]) == 4
    model.layers[1].trainable = False
    model.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
    trainer.fit(DATA, epochs=1, verbose=0)
    assert [d.shape for d in trainer.update_rule_state["state"]["delta"]] == [(8, 1), (1,)]


def test_resuming_from_an_older_path_into_a_directory_with_newer_checkpoints_is_refused(in_process_engine, tmp):
    directory = os.path.join(tmp, "ckpt")
    trainer_for(make_model()).fit(DATA, epochs=1, verbose=0, checkpoint_dir=directory)
    other = os.path.join(tmp, "elsewhere", "ckpt-000000")
    with pytest.raises(ConfigurationError, match=r"holds other checkpoints \(latest: .*ckpt-000000\) than resume="):
        trainer_for(make_model()).fit(DATA, epochs=2, verbose=0, checkpoint_dir=directory, resume=other)


# Last in the module: its quick jobs can leave more idle Python workers than slots, which the Connect probe of
# elastic rounds (TestElastic) would count as slots.
def test_local_states_place_each_workers_next_task_on_the_host_that_keeps_its_state(spark):
    import pyarrow as pa

    from sparkdl_avg.driver.transport.local_states import LocalStateLedger
    from sparkdl_avg.driver.runtime.session import Engine
    from sparkdl_avg.shared.wire.local_state import host_names
    from sparkdl_avg.shared.wire.stats import WorkerRecord

    ledger = LocalStateLedger("unused", 3, host_local=True)
    ledger.placed([WorkerRecord(worker=w, host=f"h{w}", pid=1, examples=8, start=0.0, end=0.0,
                                host_names=(f"h{w}", f"10.0.0.{w + 1}")) for w in (0, 1)])
    live = {"10.0.0.1", "10.0.0.2", "10.0.0.3"}
    assert ledger.places(range(3), live) == ["10.0.0.1", "10.0.0.2", None]  # worker 2 has not run yet
    assert ledger.places(range(3), {"10.0.0.2", "10.0.0.3"}) == [None, "10.0.0.2", None]  # worker 0's host is gone
    assert ledger.places(range(3), {"10.0.0.1"}) is None  # one host: its files are every task's
    assert LocalStateLedger("unused", 3).places(range(3), live) is None  # shared files: anywhere
    assert host_names() and all(isinstance(n, str) and n for n in host_names())

    engine = Engine(spark)
    places = ["10.0.0.1", None, "10.0.0.3"]  # hosts this session lacks: the tasks run anyway, at once
    rdd = engine.located([0, 1, 2], places)
    java = rdd._jrdd.rdd()
    assert [java.preferredLocations(p).toString() for p in java.partitions()] == ["List(10.0.0.1)", "List()",
                                                                                   "List(10.0.0.3)"]
    assert rdd.mapPartitions(lambda it: [list(it)]).collect() == [[0], [1], [2]]

    def ids(batches):
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"id": batch.column(0).to_pylist()})

    assert [r.id for r in engine.run_tasks(3, ids, "id long", start=4, places=places).collect()] == [4, 5, 6]
