"""The storage paths against a real S3-compatible server (SeaweedFS on 127.0.0.1, the ``s3_store`` fixture).

Everything the package keeps outside Spark goes through :mod:`sparkdl_avg.shared.files.fs`
as a local path or a ``pyarrow.fs`` URI: the fs helpers themselves, the
exchange files of ``state_transport="files"`` (round state out, the workers'
partial sums back), the staged data and the checkpoints. These tests run
each of them against plain ``s3://bucket/path`` URIs, which ``pyarrow.fs``
resolves through the AWS environment variables the fixture sets, and end with
a fit whose staging directory (hence exchange files) and checkpoints live on
S3 and must give the weights of the same fit on local directories.

Object-store semantics these tests pin down: there is no rename (a
``move`` is a server-side copy plus a delete), so single-file writes go up in
one PUT (:func:`sparkdl_avg.shared.files.fs.write_atomically`) and an output directory is
filled file by file with ``_SUCCESS`` last (:class:`sparkdl_avg.shared.files.fs.OutputDir`);
"directories" are key prefixes (plus marker objects ``pyarrow`` writes).
"""

import glob
import io
import os
import tempfile

import numpy as np
import pyarrow.fs as pafs
import pytest

from conftest import spark_session
from sparkdl_avg.driver.checkpoint import files as ckpt
from sparkdl_avg.driver.data import staging as data_mod
from sparkdl_avg.shared.data import staged_dataset
from sparkdl_avg.shared.wire import exchange
from sparkdl_avg.shared.files import fs
from sparkdl_avg.driver.checkpoint import policy as resume
from sparkdl_avg.driver.transport import files as transport_mod
from sparkdl_avg.shared.wire.aggregation import PartialResult
from sparkdl_avg.errors import ConfigurationError, PathError


def objects(store, prefix: str):
    """The files (not directory markers) under ``prefix`` of the bucket, as paths relative to the bucket."""
    s3 = store.filesystem()
    infos = s3.get_file_info(pafs.FileSelector(f"{store.bucket}/{prefix}".rstrip("/"), recursive=True,
                                               allow_not_found=True))
    return sorted(i.path[len(store.bucket) + 1 :] for i in infos if i.type == pafs.FileType.File)


@pytest.fixture
def prefix(request):
    """A fresh key prefix per test (one bucket for the session)."""
    return f"{request.node.name}-{os.urandom(4).hex()}"


def test_uris_resolve_to_the_server_through_the_environment(s3_store):
    filesystem, path = fs.resolve(s3_store.uri("a/b"))
    assert type(filesystem).__name__ == "S3FileSystem"
    assert path == f"{s3_store.bucket}/a/b"
    # Hadoop's schemes are read as s3:// (what a Spark user writes).
    assert fs.resolve(f"s3a://{s3_store.bucket}/a/b")[1] == path
    assert filesystem.get_file_info(s3_store.bucket).type == pafs.FileType.Directory


# --------------------------------------------------------------- fs helpers


def test_write_atomically_read_bytes_and_exists(s3_store, prefix):
    uri = s3_store.uri(f"{prefix}/dir/file.bin")
    payload = os.urandom(3 << 20) + b"end"  # several MiB: more than one upload part of pyarrow's buffer
    assert not fs.exists(uri)
    fs.write_atomically(uri, payload)
    assert fs.read_bytes(uri) == payload
    assert fs.exists(uri) and fs.exists(s3_store.uri(f"{prefix}/dir"), empty_dir=False)
    # One PUT, no temporary object beside it (no rename on object stores).
    assert objects(s3_store, prefix) == [f"{prefix}/dir/file.bin"]

    fs.write_atomically(uri, b"second")
    assert fs.read_bytes(uri) == b"second"
    with pytest.raises(PathError, match="already exists"):
        fs.write_atomically(uri, b"third", overwrite=False)
    assert fs.read_bytes(uri) == b"second"
    with pytest.raises(FileNotFoundError):
        fs.read_bytes(s3_store.uri(f"{prefix}/missing"))


def test_open_atomically_moves_into_place_and_cleans_up_on_failure(s3_store, prefix):
    uri = s3_store.uri(f"{prefix}/staged.arrow")
    with fs.open_atomically(uri, parents=False) as out:  # as staged_dataset.write_examples does
        out.write(b"abc" * 1000)
    assert fs.read_bytes(uri) == b"abc" * 1000
    with pytest.raises(RuntimeError):
        with fs.open_atomically(s3_store.uri(f"{prefix}/failed.bin")) as out:
            out.write(b"partial")
            raise RuntimeError("writer failed")
    # Neither the failed target nor any temporary (.tmp-*) object is left.
    assert objects(s3_store, prefix) == [f"{prefix}/staged.arrow"]


def test_remove_tree_deletes_every_object_under_the_prefix(s3_store, prefix):
    keys = [f"{prefix}/tree/a.bin", f"{prefix}/tree/sub/b.bin", f"{prefix}/tree/sub/deeper/c.bin",
            f"{prefix}/tree-sibling.bin"]  # same string prefix, another "directory": must survive
    for key in keys:
        fs.write_atomically(s3_store.uri(key), key.encode())
    fs.make_dir(s3_store.uri(f"{prefix}/tree/empty"))
    fs.remove_tree(s3_store.uri(f"{prefix}/tree"))
    assert objects(s3_store, prefix) == [f"{prefix}/tree-sibling.bin"]
    assert not fs.exists(s3_store.uri(f"{prefix}/tree/sub/b.bin"))
    # (Not `exists(tree, empty_dir=False)`: SeaweedFS's filer keeps the emptied folder `sub` a
    # while and lists it as a common prefix; on AWS S3 nothing is left under the prefix.)
    fs.remove_tree(s3_store.uri(f"{prefix}/tree"))  # a missing tree is fine
    fs.remove_tree(s3_store.uri(f"{prefix}/never-was"))


def test_make_dir_gives_an_empty_directory(s3_store, prefix):
    uri = s3_store.uri(f"{prefix}/made/deep")
    fs.make_dir(uri, private=True)  # private is for local directories only
    assert fs.exists(uri)
    assert not fs.exists(uri, empty_dir=False)
    assert objects(s3_store, prefix) == []


def test_local_copy_and_download(s3_store, prefix, tmp_path):
    uri = s3_store.uri(f"{prefix}/model.keras")
    fs.write_atomically(uri, b"model bytes")
    with fs.local_copy(uri) as local:
        assert os.path.isfile(local) and open(local, "rb").read() == b"model bytes"
    assert not os.path.exists(local)  # the temporary copy is gone
    fs.download(uri, str(tmp_path / "copy"))
    assert (tmp_path / "copy").read_bytes() == b"model bytes"
    with pytest.raises(PathError, match="No such file"):
        with fs.local_copy(s3_store.uri(f"{prefix}/missing.keras")):
            pass


def test_output_dir_commits_file_by_file_and_overwrites_without_stale_files(s3_store, prefix):
    uri = s3_store.uri(f"{prefix}/out")
    out = fs.OutputDir(uri)
    out.check()
    out.write_json("metrics.json", {"run": 1})
    with open(out.file("report.html"), "w") as f:
        f.write("<html>1</html>")
    assert out.commit() == uri
    assert objects(s3_store, prefix) == [f"{prefix}/out/_SUCCESS", f"{prefix}/out/metrics.json",
                                         f"{prefix}/out/report.html"]
    with pytest.raises(PathError, match="already exists"):
        fs.OutputDir(uri).check()

    again = fs.OutputDir(uri, overwrite=True)
    again.write_json("metrics.json", {"run": 2})
    again.commit()
    # The old output's report.html, which the new one lacks, is gone: no mix of two runs.
    assert objects(s3_store, prefix) == [f"{prefix}/out/_SUCCESS", f"{prefix}/out/metrics.json"]
    assert b'"run": 2' in fs.read_bytes(f"{uri}/metrics.json")


# ------------------------------------------------------------ exchange files


def _arrays():
    rng = np.random.default_rng(0)
    return [
        np.array(7, dtype=np.int64),                 # 0-d counter (Adam's iterations)
        rng.normal(size=(5, 3)).astype(np.float32),  # 60 bytes: the next array starts after padding
        rng.normal(size=(13,)),                      # float64, odd length
        np.asfortranarray(rng.normal(size=(4, 6))),  # not C-contiguous
        np.zeros((0, 4), np.float32),                # empty
        np.array([np.nan, -0.0, np.inf]),            # bit patterns that == would not check
    ]


def assert_bitwise_equal(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
        assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(e).tobytes()


def test_exchange_store_and_load_are_bitwise_exact(s3_store, prefix):
    arrays = _arrays()
    stored = exchange.store(s3_store.uri(f"{prefix}/round"), "state", arrays)
    assert stored.uri.startswith(f"s3://{s3_store.bucket}/{prefix}/round/state-")
    loaded = exchange.load(stored)
    assert_bitwise_equal(loaded, arrays)
    assert loaded[0].ndim == 0 and int(loaded[0]) == 7
    exchange.remove(stored)
    assert objects(s3_store, prefix) == []
    exchange.remove(stored)  # a missing file is fine


def test_exchange_store_state_and_load_state(s3_store, prefix):
    weights, optimizer = _arrays()[1:4], _arrays()[:1] + _arrays()[4:]
    directory = s3_store.uri(f"{prefix}/round-0")
    with_opt = exchange.store_state(directory, "state", weights, optimizer)
    without = exchange.store_state(directory, "state", weights, None)
    assert with_opt.arrays.uri != without.arrays.uri  # one unique file per call
    w, o = with_opt.load()
    assert_bitwise_equal(w, weights)
    assert_bitwise_equal(o, optimizer)
    w, o = exchange.load_state(without)
    assert_bitwise_equal(w, weights) and o is None
    assert len(objects(s3_store, prefix)) == 2


def test_file_transport_adds_the_workers_stored_sums_from_s3(s3_store, prefix):
    rng = np.random.default_rng(1)
    directory = s3_store.uri(f"{prefix}/exchange-1/round-3")
    parts = []
    for worker in range(2):
        weights = [rng.normal(size=(32, 16)).astype(np.float32), rng.normal(size=(16,))]
        optimizer = [np.array(5 + worker, np.int64), rng.normal(size=(32, 16)).astype(np.float32)]
        parts.append((weights, optimizer))
    stored = [exchange.StoreSums(directory).deliver(PartialResult(32, w, o), f"sums-{i}").sums for i, (w, o) in enumerate(parts)]
    assert len(objects(s3_store, prefix)) == 2
    weight_sums, optimizer_sums = transport_mod._add_stored(stored)
    expected_w = [parts[0][0][i] + parts[1][0][i] for i in range(2)]
    expected_o = [parts[0][1][i] + parts[1][1][i] for i in range(2)]
    assert_bitwise_equal(weight_sums, expected_w)
    assert_bitwise_equal(optimizer_sums, expected_o)
    assert int(optimizer_sums[0]) == 11
    assert objects(s3_store, prefix) == []  # the driver deletes the files it read


# --------------------------------------------------------------- checkpoints


def _checkpoint(epoch, seed=3):
    rng = np.random.default_rng(epoch)
    return ckpt.Checkpoint(
        epoch=epoch, rounds_done=2, steps_done=8,
        weights=[rng.normal(size=(4, 3)), rng.normal(size=(3,)).astype(np.float32)],
        optimizer=[np.array(10 * epoch, np.int64), rng.normal(size=(4, 3))],
        rule_state={"delta": [rng.normal(size=(4, 3))]},
        meta=ckpt.RunMeta(seed=seed, run={"batch_size": 8}, history={"loss": [0.5] * epoch}),
    )


def test_checkpoints_save_find_latest_and_load_back(s3_store, prefix):
    directory = s3_store.uri(f"{prefix}/ckpt")
    assert ckpt.latest(directory) is None
    assert resume.find(directory, resume=True) is None  # nothing to resume from: start afresh
    first = ckpt.save(directory, _checkpoint(1))
    second = ckpt.save(directory, _checkpoint(2))
    assert first == f"{directory}/ckpt-000000" and second == f"{directory}/ckpt-000001"
    assert ckpt.latest(directory) == second == resume.find(directory, resume=True)
    # keep=1: the older checkpoint is deleted once LATEST names the new one.
    assert objects(s3_store, prefix) == [f"{prefix}/ckpt/LATEST", f"{prefix}/ckpt/ckpt-000001/arrays.npz",
                                         f"{prefix}/ckpt/ckpt-000001/meta.json"]
    loaded, expected = ckpt.load(second), _checkpoint(2)
    assert (loaded.epoch, loaded.rounds_done, loaded.steps_done) == (2, 2, 8)
    assert_bitwise_equal(loaded.weights, expected.weights)
    assert_bitwise_equal(loaded.optimizer, expected.optimizer)
    assert_bitwise_equal(loaded.rule_state["delta"], expected.rule_state["delta"])
    assert loaded.meta == expected.meta
    with pytest.raises(ConfigurationError, match="already holds checkpoints"):
        resume.find(directory, resume=False)


def test_latest_without_latest_file_takes_the_newest_complete_checkpoint(s3_store, prefix):
    directory = s3_store.uri(f"{prefix}/ckpt")
    ckpt.save(directory, _checkpoint(1), keep=3)
    ckpt.save(directory, _checkpoint(2), keep=3)
    s3 = s3_store.filesystem()
    s3.delete_file(f"{s3_store.bucket}/{prefix}/ckpt/LATEST")
    s3.delete_file(f"{s3_store.bucket}/{prefix}/ckpt/ckpt-000001/meta.json")  # incomplete: meta.json is last
    assert ckpt.latest(directory) == f"{directory}/ckpt-000000"
    assert ckpt.load(ckpt.latest(directory)).epoch == 1


def test_checkpoint_dir_holding_other_objects_is_refused(s3_store, prefix):
    directory = s3_store.uri(f"{prefix}/ckpt")
    fs.write_atomically(f"{directory}/notes.txt", b"mine")
    with pytest.raises(ConfigurationError, match="notes.txt"):
        ckpt.latest(directory)


# ------------------------------------------------------------- staged data


def test_stage_arrays_to_s3_and_read_examples_back(s3_store, prefix):
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(50, 4, 2)), rng.integers(0, 3, size=50)
    staged = data_mod.stage((x, y), root=s3_store.uri(f"{prefix}/staging"), x_shapes=[(4, 2)], x_dtype="float64")
    assert [f.uri.split("/")[-1] for f in staged.files] == ["part-00000.arrow"]
    assert staged.files[0].uri.startswith(f"s3://{s3_store.bucket}/{prefix}/staging/training-")
    assert staged.num_examples == 50 and [f.dtype for f in staged.y_fields] == ["int32"]
    assert objects(s3_store, prefix) == [staged.files[0].uri.split("/", 3)[3]]  # no temporary object left
    indices = np.array([49, 0, 7, 7, 23])
    examples = staged_dataset.read_examples(staged, indices)
    np.testing.assert_array_equal(examples.xs[0], x[indices])
    np.testing.assert_array_equal(examples.ys[0], y[indices])
    fs.remove_tree(s3_store.uri(f"{prefix}/staging"))
    assert objects(s3_store, prefix) == []


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def spark(s3_store):
    # spark_conf(): the pyspark gateway JVM may predate the fixture's environment (an earlier module's).
    with spark_session("local[2]", "sparkdl_avg-s3", **s3_store.spark_conf()) as session:
        yield session


def digits_model(seed):
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((64,), dtype="float64")
    h = keras.layers.Dense(32, activation="relu", dtype="float64")(inputs)
    out = keras.layers.Dense(10, activation="softmax", dtype="float64")(h)
    model = keras.Model(inputs, out)
    model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _fit_twice(staging_dir, checkpoint_dir, data, seen=None, **transport):
    """One epoch with checkpoints, then a new trainer (other initial weights) resuming for the second."""
    from sparkdl_avg import ParameterAveragingTrainer

    options = dict(num_workers=2, batch_size=32, averaging_frequency=4, seed=1, staging_dir=staging_dir,
                   **(transport or {"state_transport": "files"}))
    histories = []
    for epochs, model_seed, resume_flag in ((1, 0, False), (2, 5, True)):
        model = digits_model(model_seed)
        with ParameterAveragingTrainer(model, **options) as trainer:
            histories.append(trainer.fit(data, epochs=epochs, verbose=0, checkpoint_dir=checkpoint_dir,
                                         resume=resume_flag).history)
            if seen is not None:
                seen(trainer)
    return model, histories


def test_fit_with_staging_exchange_and_checkpoints_on_s3_equals_local(spark, s3_store, prefix, tmp_path, monkeypatch):
    from sklearn.datasets import load_digits

    digits = load_digits()
    data = ((digits.data[:1024] / 16.0).astype(np.float64), digits.target[:1024].astype(np.int32))

    # Record what the driver sends and reads back: round state out, the workers' partial sums back.
    sent, gathered = [], []
    real_store_state, real_add_stored = exchange.store_state, transport_mod._add_stored
    monkeypatch.setattr(exchange, "store_state", lambda d, *a: sent.append(d) or real_store_state(d, *a))
    monkeypatch.setattr(transport_mod, "_add_stored",
                        lambda stored: gathered.extend(s.arrays.uri for s in stored) or real_add_stored(stored))
    staging = s3_store.uri(f"{prefix}/staging")
    after_fit = []
    temporary = set(glob.glob(os.path.join(tempfile.gettempdir(), "sparkdl_avg-cache-*")))

    def seen(trainer):  # after fit, before close: the staged data is still there, the exchange files not
        after_fit.append(objects(s3_store, f"{prefix}/staging"))
        after_fit[-1].append(len(trainer.stats.records))

    model, histories = _fit_twice(staging, s3_store.uri(f"{prefix}/ckpt"), data, seen)
    rounds = after_fit[0][-1] + after_fit[1][-1]
    assert rounds == 8  # 1024 examples / (2 workers × 32) = 16 steps per epoch, k=4
    assert len(sent) == rounds and all(d.startswith(f"{staging}/sparkdl_avg-") and "/exchange-" in d for d in sent)
    assert len(gathered) == 2 * rounds and all(u.startswith(f"{staging}/") for u in gathered)
    for listing in after_fit:
        files = listing[:-1]
        assert files and all("/training-" in f and f.endswith(".arrow") for f in files), files
        assert not [f for f in files if "/exchange-" in f]
    assert objects(s3_store, f"{prefix}/staging") == []  # close() deleted the staged data
    assert objects(s3_store, f"{prefix}/ckpt")[0] == f"{prefix}/ckpt/LATEST"
    # The workers' local copies of the staged files are in the executor's files directory, which Spark deletes with
    # the executor, and none in the temporary directory (where they outlived the application); all in one directory,
    # where both Python workers of this executor (local[2]) find them, not one of their own each.
    from pyspark import SparkFiles

    copies = glob.glob(os.path.join(SparkFiles.getRootDirectory(), "sparkdl_avg-cache-*", "*.arrow"))
    assert copies == glob.glob(os.path.join(SparkFiles.getRootDirectory(), "sparkdl_avg-cache-executor", "*.arrow"))
    assert copies, copies
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "sparkdl_avg-cache-*"))) == temporary

    monkeypatch.undo()
    local_model, local_histories = _fit_twice(str(tmp_path / "staging"), str(tmp_path / "ckpt"), data)
    for a, e in zip(model.get_weights(), local_model.get_weights()):
        np.testing.assert_array_equal(a, e)  # bitwise: the same sums in the same order, only the storage differs
    assert histories == local_histories
    assert len(histories[1]["loss"]) == 2  # the resumed fit holds both epochs


def test_the_sql_round_with_storage_reducers_on_s3_equals_local_files(spark, s3_store, prefix, tmp_path):
    """State out as an S3 object, the workers' sums as S3 objects, reducers reading their slices by ranged GETs."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    data = ((digits.data[:512] / 16.0).astype(np.float64), digits.target[:512].astype(np.int32))
    staging = s3_store.uri(f"{prefix}/staging")
    model, histories = _fit_twice(staging, s3_store.uri(f"{prefix}/ckpt"), data,
                                  state_transport="sql", aggregation="storage", aggregation_shards=3)
    assert objects(s3_store, f"{prefix}/staging") == []  # state, sums and staged data all deleted
    local_model, local_histories = _fit_twice(str(tmp_path / "staging"), str(tmp_path / "ckpt"), data)
    for a, e in zip(model.get_weights(), local_model.get_weights()):
        np.testing.assert_array_equal(a, e)
    assert histories == local_histories
