"""A disk that fills up: checkpoints, staged data and a job's output directory on a real small filesystem.

Each test mounts a tmpfs of a few hundred kB (as root: CI runs as root;
elsewhere the tests skip) and fills it, or lets the data fill it, so that a
write fails with ``ENOSPC`` where it would on a real disk. Wanted (issue 38,
item 4): a ``PathError`` (``CheckpointError`` for checkpoints) whose first
sentence names the parameter, the path and the full disk, says what is
intact, and no half-written file left for a resume or a reader to take.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from conftest import run_job_in_process
from sparkdl_avg import CheckpointError, ParameterAveragingTrainer, PathError, WorkerError
from sparkdl_avg.driver.checkpoint import files as ckpt

FULL = "the disk is full (no space left on device)"


@pytest.fixture
def small_disk(tmp_path):
    """``mount(size)``: a tmpfs of ``size`` (``"256k"``) mounted at a new directory, its path; unmounted at the end."""
    mounted = []

    def mount(size: str) -> str:
        path = str(tmp_path / f"small-{len(mounted)}")
        os.makedirs(path)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", path], check=True)


def fill(directory: str) -> str:
    """Writes a file into ``directory`` until its filesystem is full; returns the file's path (delete it to free)."""
    path = os.path.join(directory, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        with contextlib.suppress(OSError):  # unbuffered: nothing left to flush at the end
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    with pytest.raises(OSError) as full:  # nothing more fits, not even a small file
        with open(os.path.join(directory, "probe"), "wb") as f:
            f.write(b"x" * 4096)
    assert full.value.errno == errno.ENOSPC
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, "probe"))
    return path


def digits():
    """scikit-learn's digits: 1,797 rows of 64 pixels scaled to [0, 1] (float32), labels 0..9."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int64)


def tiny_model(seed: int = 0):
    """Softmax regression on the digits' 64 pixels: 650 weights."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def trainer(**options):
    return ParameterAveragingTrainer(tiny_model(), num_workers=2, batch_size=128, averaging_frequency=4, seed=1,
                                     **options)


def test_a_checkpoint_dir_that_fills_up_mid_fit_names_it_and_keeps_the_last_checkpoint(spark, small_disk):
    directory = small_disk("512k")
    saved = {}

    def fill_after_epoch(epoch, logs):
        if epoch == 1:  # after the first checkpoint: the second one finds the disk full
            saved["weights"] = [w.copy() for w in fit.model.get_weights()]
            saved["filler"] = fill(directory)

    import keras

    fit = trainer()
    with fit, pytest.raises(CheckpointError) as err:
        fit.fit(digits(), epochs=3, verbose=0, checkpoint_dir=directory, checkpoint_every="epoch",
                callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=fill_after_epoch)])
    message = str(err.value)
    last = os.path.join(directory, "ckpt-000000")
    assert message.startswith(f"Cannot write a checkpoint to the 'checkpoint_dir' {directory!r}: {FULL}. The model in "
                              "memory is intact (it holds the weights this checkpoint was to save); the last complete "
                              f"checkpoint, {last!r}, is unchanged and fit(resume=True) continues from it. Nothing of "
                              f"the new checkpoint ({os.path.join(directory, 'ckpt-000001')!r}) was left."), message
    assert "Errno" not in message and "\n" not in message
    # The model in memory holds what the failed checkpoint was to save.
    for got, want in zip(fit.model.get_weights(), saved["weights"]):
        np.testing.assert_array_equal(got, want)
    # No half-written checkpoint (nor a temporary file) left for a resume to consider.
    assert sorted(os.listdir(directory)) == ["LATEST", "ckpt-000000", "filler"]
    assert sorted(os.listdir(last)) == [ckpt.ARRAYS, ckpt.META]
    os.remove(saved["filler"])
    assert ckpt.latest(directory) == last
    assert ckpt.load(last).epoch == 1  # complete and verified: a resume continues after epoch 0


@pytest.mark.parametrize("kind", ["dataframe", "numpy"])
def test_a_staging_dir_that_fills_up_names_it_without_an_executor_trace(spark, small_disk, kind):
    """DataFrames are staged by Spark tasks (the full disk reported in their result rows); numpy arrays on the driver."""
    directory = small_disk("192k")  # the trainer's root and marker fit; 460 kB of staged pixels do not
    x, y = digits()
    if kind == "dataframe":
        data = spark.createDataFrame([(xi.tolist(), int(yi)) for xi, yi in zip(x, y)], "features array<float>, "
                                     "label long").repartition(2)
    else:
        data = (x, y)
    fit = trainer(staging_dir=directory)
    before = fit.model.get_weights()
    with fit:
        with pytest.raises(PathError) as err:
            fit.fit(data, epochs=1, verbose=0)
        assert not isinstance(err.value, WorkerError)
        message = str(err.value)
        # the file a task was writing, or (numpy arrays, written on the driver) the data's directory
        written = "part-[0-9]{5}[.]arrow" if kind == "dataframe" else ""
        assert re.fullmatch(
            re.escape(f"Cannot stage the training data in the 'staging_dir' {directory!r}: {FULL} (writing "
                      f"'{directory}/sparkdl_avg-") + f"[^/']+/training-[0-9a-f]+/{written}" + re.escape(
                "'). The model is unchanged and the partly staged data was removed. Free space there, or give a "
                "'staging_dir' on a larger filesystem."), message), message
        assert "\n" not in message and "Traceback" not in message and err.value.__cause__ is None
        staged = [name for _, _, names in os.walk(directory) for name in names if not name.startswith(".")]
        assert staged == [], staged  # the partly staged files are gone (the root's owner marker is hidden)
    for got, want in zip(fit.model.get_weights(), before):
        np.testing.assert_array_equal(got, want)


def test_a_full_output_dir_says_so_first_and_where_the_model_was_kept(spark, small_disk, tmp_path, monkeypatch,
                                                                      capsys):
    x, y = digits()
    data = str(tmp_path / "digits.parquet")
    spark.createDataFrame([(xi.tolist(), int(yi)) for xi, yi in zip(x[:512], y[:512])],
                          "features array<float>, label long").write.parquet(data)
    model_path = str(tmp_path / "tiny.keras")
    model = tiny_model()
    model.optimizer.build(model.trainable_variables)  # saved with its variables: loading it warns of none
    model.save(model_path)
    directory = small_disk("16k")  # the job's check writes a few bytes there; model.keras and report.html do not fit
    out = os.path.join(directory, "out")
    code, _ = run_job_in_process(spark, monkeypatch, "train", "--data", data, "--model", model_path,
                                 "--num-workers", "2", "--batch-size", "64", "--averaging-frequency", "2",
                                 "--epochs", "1", "--no-check-executors", "--output-dir", out)
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err[-3000:]
    line = lines[0]
    assert line.startswith(f"error: Cannot write the --output-dir {out!r}: {FULL}. Its files (metrics.json, "
                           "model.keras, report.html, stats.json) were saved to "), line
    assert line.endswith(" instead; copy them from there."), line
    kept = line.split(" were saved to ")[1].split(" instead;")[0]
    assert len(line) - len(repr(out)) - len(kept) < 200, line  # one short line besides the two paths
    try:
        import keras

        assert keras.saving.load_model(os.path.join(kept, "model.keras"), compile=False).count_params() == 650
        assert os.listdir(directory) == []  # nothing half-copied next to where the output was to go
    finally:
        shutil.rmtree(kept, ignore_errors=True)
