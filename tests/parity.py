"""Tests that run unchanged on a classic session and under Spark Connect.

Each class here is a mixin of test methods that take a ``session`` fixture
(as PySpark's own TorchDistributor tests share theirs through ``...Mixin``
classes). A classic test module subclasses it next to its own tests, with
``session`` its classic session; ``tests/runtime/test_connect.py`` subclasses it
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
``CompressedUpdatesMixin`` test_update_compression.py test_connect.py
``DataKindsMixin``     test_data_kinds.py          test_connect.py
``ElasticMixin``       test_reliability.py         test_connect.py
``LocalOptimizerStateMixin`` test_reliability.py   test_connect.py
``OverlapRoundsMixin``  fit/test_overlap.py         test_connect.py
``FragmentsMixin``     fit/test_fragments.py       test_connect.py
=====================  ==========================  =================

This module's name does not start with ``test_``: pytest collects the tests
only through the subclasses (whose names start with ``Test``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import numpy as np
import pytest
from pyspark import cloudpickle

from conftest import assert_weights_close, dropout_model, make_model, regression_data
from sparkdl_avg import BlockMomentum, ConfigurationError, ParameterAveragingTrainer, testing
from sparkdl_avg.executor import worker as worker_module


class TaskRetryMixin:
    """A task whose first attempt fails is retried by Spark (the sessions allow 2+ attempts per task)."""

    def test_a_task_retried_by_spark_gives_exactly_the_weights_of_a_clean_run(self, session, tmp_path):
        # Dropout: the replicas draw random numbers, which the retried attempt must draw again identically.
        data = regression_data(12 * 2 * 8, seed=11)  # 12 minibatches per worker per epoch

        def fit(model):
            trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=3,
                                                update_rule=BlockMomentum(0.5), seed=3)
            trainer.fit(data, epochs=2, verbose=0)  # numpy arrays: through the active session, `session`
            return trainer

        clean = dropout_model()
        fit(clean)
        real = worker_module.run_round_partition
        marker = str(tmp_path / "failed-once")
        with testing.RoundEntry(lambda task, it: _fail_first_attempt(real, task, it, marker)):
            retried = dropout_model()
            trainer = fit(retried)
        assert os.path.exists(marker)  # the first attempt did fail, and Spark retried it
        assert_weights_close(retried.get_weights(), clean.get_weights(), atol=0)
        assert np.isfinite(trainer.stats.records[-1]["loss"])

    def test_a_task_retried_after_it_ran_the_augmenting_preprocess_gives_the_clean_runs_weights(
            self, session, tmp_path):
        df = digits_frame(session)

        def fit():
            model = digits_cnn()
            trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=2,
                                                seed=5, preprocess=decode_digits)
            trainer.fit(df, features_col="image", epochs=2, verbose=0)
            return model

        cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import this module
        try:
            clean = fit()
        finally:
            cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        real = worker_module.run_round_partition
        marker = str(tmp_path / "failed-once")
        with testing.RoundEntry(lambda task, it: _fail_after_first_attempt(real, task, it, marker)):
            retried = fit()
        assert os.path.exists(marker)  # the first attempt decoded, augmented and trained, then failed
        assert_weights_close(retried.get_weights(), clean.get_weights(), atol=0)


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

    def test_a_pipeline_checkpoints_and_resumes_bitwise(self, session, tmp_path):
        """Issue 38: the estimator had no checkpointDir, checkpointEvery or resume, though fit and the jobs have."""
        import pyarrow as pa
        from pyspark.ml import Pipeline

        from sparkdl_avg.ml import KerasAveragingEstimator

        x, y = regression_data(96, seed=5)
        df = session.createDataFrame(pa.table({"features": list(x), "label": y}))
        directory = str(tmp_path / "ckpt")

        def estimator(epochs, **params):
            return KerasAveragingEstimator(kerasModel=make_model(seed=4), numWorkers=2, batchSize=8,
                                           averagingFrequency=3, epochs=epochs, seed=3, **params)

        whole = estimator(3).fit(df)
        first = Pipeline(stages=[estimator(2, checkpointDir=directory, checkpointEvery=2)]).fit(df)
        assert first.stages[0].history.epoch == [0, 1]
        assert sorted(n for n in os.listdir(directory) if n.startswith("ckpt-")), os.listdir(directory)
        with pytest.raises(ConfigurationError, match=r"The 'checkpointDir' .* already holds checkpoints .* Pass "
                                                     r"resume=True"):
            estimator(3, checkpointDir=directory).fit(df)
        resumed = Pipeline(stages=[estimator(3, checkpointDir=directory, resume=True)]).fit(df).stages[0]
        assert resumed.history.epoch == [0, 1, 2]  # the checkpoint's epochs, then the one it had not trained
        assert resumed.history.history["loss"][:2] == first.stages[0].history.history["loss"]
        assert_weights_close(resumed.kerasModel.get_weights(), whole.kerasModel.get_weights(), atol=0)
        assert estimator(3, checkpointDir=directory, resume=True).getCheckpointEvery() == "epoch"


class ExecutorCheckMixin:
    """``preflight.check_executors`` runs one probe per default-parallelism slot (2 on both test sessions)."""

    def test_the_executor_check_describes_each_slots_python(self, session):
        from sparkdl_avg.driver.runtime.preflight import check_executors

        import sparkdl_avg
        from sparkdl_avg import version

        infos = check_executors(session)
        assert len(infos) == 2
        for info in infos:  # the executors run this Python and this checkout (conftest sets PYSPARK_PYTHON)
            assert "import_error" not in info, info
            assert info["python"] == sys.executable and info["sparkdl_avg_version"] == version.__version__, info
            assert info["sparkdl_avg_file"] == os.path.abspath(sparkdl_avg.__file__), info


def f32_model(seed=0, hidden=64, dropout=0.2, optimizer=None):
    """A float32 MLP with dropout and Adam: what ``update_compression`` compresses (float32 weights and moments)."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,))
    h = keras.layers.Dense(hidden, activation="tanh")(inputs)
    h = keras.layers.Dropout(dropout)(h)
    out = keras.layers.Dense(1)(h)
    model = keras.Model(inputs, out)
    model.compile(optimizer or keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
    return model


COMPRESSED_DATA = regression_data(10 * 2 * 8, seed=5)  # 10 minibatches per worker per epoch


def compressed_fit(compression, epochs=2, model=None, fit=None, **options):
    """A fit of :func:`f32_model` with ``update_compression=compression``; returns ``(model, trainer)``.

    ``options``: the trainer's; ``fit``: ``fit``'s (checkpoints).
    """
    model = model if model is not None else f32_model()
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=3, seed=4,
                                        update_compression=compression, **options)
    trainer.fit(COMPRESSED_DATA, epochs=epochs, verbose=0, **(fit or {}))
    return model, trainer


class CompressedUpdatesMixin:
    """``update_compression``: every Spark SQL path sums the compressed deltas bitwise alike, and a retry changes nothing."""

    def test_every_sql_path_sums_compressed_deltas_bitwise_alike_and_records_the_bytes(self, session):
        float32 = compressed_fit(None, state_transport="sql", aggregation="driver")[1].stats.records
        paths = ({"aggregation": "driver"}, {"aggregation": "files"}, {"aggregation": "shuffle", "aggregation_shards": 3},
                 {"aggregation": "storage", "aggregation_shards": 2})
        # int4 and topk differ from int8 only in their codecs: the whole delta, and one sharded (cut at whole blocks,
        # bytes and chunks)
        for compression, ratio, options_list in (("int8", (0.40, 0.45), paths), ("bf16", (0.49, 0.51), paths),
                                                 ("int4", (0.36, 0.40), paths[::2]),
                                                 ("topk", (0.33, 0.35), paths[::2]),
                                                 ("threshold", (0.33, 0.35), paths[::2])):
            reference = None
            for options in options_list:
                model, trainer = compressed_fit(compression, state_transport="sql", **options)
                weights = model.get_weights()
                if reference is None:
                    reference = weights
                for got, want in zip(weights, reference):
                    np.testing.assert_array_equal(got, want, err_msg=f"{compression} {options}")
                records = trainer.stats.records
                assert [r.compression for r in records] == [compression] * len(records)
                assert [r.aggregation for r in records] == [options["aggregation"]] * len(records)
                # int8: the weights at 1 byte + a scale per 256, Adam's two moments in bf16: (1 + 2 * 2) / 12;
                # int4: half a byte + a scale per 128: (0.53 + 2 * 2) / 12; topk: 8 of the 385 weights, 18 bytes;
                # threshold: 1 to 7 of them (1e-4 to 2e-2), 8 to 19 bytes
                low, high = ratio
                for record, plain in zip(records, float32):
                    assert low * plain.sent_bytes < record.sent_bytes < high * plain.sent_bytes, (compression, record)
                    assert all(w.encode_s > 0 for w in record.workers)
                    assert (record.feedback_max_s > 0) == (compression != "bf16")  # bf16: no feedback by default
                    # the reducers' decoding and summing, reported back with their shards
                    assert (record.reduce_max_s > 0) == (options["aggregation"] in ("shuffle", "storage"))
                assert not [f for f in os.listdir(trainer._staging_root) if f.startswith("exchange")]
            assert max(float(np.max(np.abs(a - b))) for a, b in zip(reference, f32_model().get_weights())) > 1e-3

    def test_a_task_retried_after_writing_its_residual_gives_the_clean_weights(self, session, tmp_path):
        clean, _ = compressed_fit("int8", state_transport="sql")
        real = worker_module.run_round_partition
        marker = str(tmp_path / "failed-once")
        with testing.RoundEntry(lambda task, it: _fail_after_first_attempt(real, task, it, marker)):
            retried, _ = compressed_fit("int8", state_transport="sql")
        assert os.path.exists(marker)  # the first attempt trained, wrote its residual, then failed
        assert_weights_close(retried.get_weights(), clean.get_weights(), atol=0)


def _fail_after_first_attempt(real, task, iterator, marker):
    """Runs the task, residual file included, then fails its first attempt in epoch 1, round 1."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    results = list(real(task, iterator))
    if task.epoch == 1 and task.round == 1 and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
        open(marker, "w").close()
        raise RuntimeError("injected failure after the residual was written")
    return iter(results)


# ------------------------------------------------------------------ data as users keep it (issue 37)
#
# Module-level on purpose: a preprocessing function travels to the executors pickled with cloudpickle, by
# reference unless its module is registered by value; executors cannot import this module, so the trainers
# and stages that take these functions are made inside ``shipped_by_value()``, which pickles them by value.


@contextlib.contextmanager
def shipped_by_value():
    """Functions of this module made into a trainer's or stage's ``preprocess`` inside the block travel by value."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        yield
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def decode_digits(batch, seeds=None, training=False):
    """PNG bytes (``content``) to ``image`` floats in [0, 1]; in training, a seeded random flip per example."""
    import tensorflow as tf

    images = np.stack([tf.io.decode_png(b).numpy() for b in batch["content"]]).astype("float32") / 255.0
    if training:
        flip = np.array([np.random.default_rng(int(s)).random() < 0.5 for s in seeds], dtype=bool)
        images[flip] = images[flip, :, ::-1]
    return {"image": images}


def decode_wrong_shape(batch):
    """Gives ``image`` of 7x7x1 per row where the model takes 8x8x1."""
    return {"image": np.zeros((len(batch["content"]), 7, 7, 1), "float32")}


DIGITS_ROWS = 128


@functools.lru_cache(maxsize=None)
def digits_png():
    """``(paths, pngs, labels, images)``: scikit-learn's first 128 digits as PNG bytes (as binaryFile gives them).

    ``images`` are what :func:`decode_digits` gives with ``training=False`` (``(n, 8, 8, 1)`` float32).
    """
    import tensorflow as tf
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.round(digits.images[:DIGITS_ROWS] / 16 * 255).astype(np.uint8)[..., None]
    labels = digits.target[:DIGITS_ROWS].astype(np.int32)
    pngs = [tf.io.encode_png(p).numpy() for p in pixels]
    paths = [f"file:/data/digits/{y}/img{i:03d}.png" for i, y in enumerate(labels)]
    return paths, pngs, labels, pixels.astype("float32") / 255.0


def digits_frame(session, bad_row=None):
    """The digits as a DataFrame of ``row, path, content, label`` (``binaryFile``'s path and content); row
    ``bad_row`` holds bytes that do not decode."""
    import pyarrow as pa

    paths, pngs, labels, _ = digits_png()
    pngs = list(pngs)
    if bad_row is not None:
        pngs[bad_row] = b"not a png"
    table = pa.table({"row": np.arange(len(pngs), dtype=np.int64), "path": paths,
                      "content": pa.array(pngs, pa.binary()), "label": labels})
    return session.createDataFrame(table)


def digits_cnn(seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    out = keras.layers.Dense(10, activation="softmax")(keras.layers.Flatten()(h))
    model = keras.Model(inputs, out)
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


ID_VOCABULARY = [2**24 + 1, 2**24 + 3, 2**53 + 1]
# Each exact id next to what rounding would make of it (float32: 2^24 + 1 -> 2^24, 2^24 + 3 -> 2^24 + 4;
# float64: 2^53 + 1 -> 2^53), and one small id: the rounded ones are out of the vocabulary.
IDS = np.resize(np.array([2**24 + 1, 2**24, 2**24 + 3, 2**24 + 4, 2**53 + 1, 2**53, 7, 2**24 + 1], np.int64), 64)
ID_LABELS = np.resize(np.array([1, 0, 1, 0, 1, 0, 0, 1], np.int32), 64)


def id_model(seed=0):
    """int64 ids -> IntegerLookup (ids above 2^24 and 2^53) -> Embedding -> softmax: the id itself picks the row."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((1,), dtype="int64")
    index = keras.layers.IntegerLookup(vocabulary=np.array(ID_VOCABULARY, np.int64))(inputs)
    h = keras.layers.Flatten()(keras.layers.Embedding(len(ID_VOCABULARY) + 1, 4)(index))
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(h))
    model.compile(keras.optimizers.SGD(0.5), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


WORDS = ["good", "great", "fun", "bad", "awful", "dull", "film", "plot"]


@functools.lru_cache(maxsize=None)
def texts():
    """``(texts, labels)``: 64 three-word reviews, labelled 1 when they hold more good words than bad ones."""
    rng = np.random.default_rng(37)
    words = rng.integers(0, len(WORDS), size=(64, 3))
    text = [" ".join(WORDS[w] for w in row) for row in words]
    score = ((words < 3).sum(axis=1) - ((words >= 3) & (words < 6)).sum(axis=1))
    return text, (score > 0).astype(np.int32)


def text_model(seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    vectorize = keras.layers.TextVectorization(max_tokens=12, output_sequence_length=3)
    vectorize.adapt(texts()[0])
    inputs = keras.Input((1,), dtype="string")
    h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(12, 4)(vectorize(inputs)))
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(h))
    model.compile(keras.optimizers.Adam(0.05), "binary_crossentropy", metrics=["accuracy"])
    return model


IMAGE_STRUCT_FIELDS = ("origin", "height", "width", "nChannels", "mode", "data")


def image_schema():
    """The schema of ``spark.read.format("image")`` (``ImageSchema.imageSchema``, which needs a JVM)."""
    from pyspark.sql import types as T

    image = T.StructType([
        T.StructField("origin", T.StringType(), True),
        T.StructField("height", T.IntegerType(), False),
        T.StructField("width", T.IntegerType(), False),
        T.StructField("nChannels", T.IntegerType(), False),
        T.StructField("mode", T.IntegerType(), False),
        T.StructField("data", T.BinaryType(), False),
    ])
    return T.StructType([T.StructField("image", image, True)])


def image_rows(rgb, origins):
    """Rows of Spark's image struct (OpenCV's BGR bytes, mode 16 = CV_8UC3) for ``(n, h, w, 3)`` uint8 RGB images."""
    return [((origin, int(img.shape[0]), int(img.shape[1]), 3, 16, bytes(img[..., ::-1].tobytes())),)
            for img, origin in zip(rgb, origins)]


def _probabilities(df, key="row"):
    rows = sorted(df.select(key, "probability").collect(), key=lambda r: r[key])
    return np.stack([r.probability.toArray() for r in rows])


class DataKindsMixin:
    """Data as users keep it (issue 37): int64 ids, text, PNG bytes with a preprocessing function, sample weights,
    Spark's image struct, through fit, evaluate, predict and the estimator."""

    def test_int64_ids_stay_exact_through_fit_evaluate_and_predict(self, session):
        import keras
        import pyarrow as pa

        from sparkdl_avg import DataError

        df = session.createDataFrame(pa.table({"row": np.arange(len(IDS)), "id": IDS, "label": ID_LABELS}))
        model = id_model()
        trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
        before = model.get_weights()
        trainer.fit(df, features_col="id", epochs=1, verbose=0)
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), before)) > 1e-3
        got = _probabilities(trainer.predict(df, features_col="id"))
        want = model.predict(IDS.reshape(-1, 1), verbose=0)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        # each exact id is looked up as itself: its rounded neighbour (out of the vocabulary) predicts otherwise
        for exact, rounded in ((0, 1), (2, 3), (4, 5)):
            assert np.abs(got[exact] - got[rounded]).max() > 1e-4, (IDS[exact], IDS[rounded])
        evaluation = trainer.evaluate(df, features_col="id", return_dict=True)
        reference = model.evaluate(IDS.reshape(-1, 1), ID_LABELS, return_dict=True, verbose=0)
        for name in ("loss", "accuracy"):
            assert evaluation[name] == pytest.approx(reference[name], abs=1e-5), name

        # a float32 input cannot take ids above 2^24: refused by the staging, before any round
        inputs = keras.Input((1,))
        lossy = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(inputs))
        lossy.compile("sgd", "sparse_categorical_crossentropy")
        weights = lossy.get_weights()
        refused = ParameterAveragingTrainer(lossy, num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
        with pytest.raises(DataError, match=r"Column 'id' holds \d+ .*float32 cannot hold exactly.*2\^24") as info:
            refused.fit(df, features_col="id", epochs=1, verbose=0)
        assert int(str(info.value).split(" holds ")[1].split(" ")[0]) > 2**24
        assert refused.stats.records == []
        assert_weights_close(lossy.get_weights(), weights, atol=0)

    def test_a_text_model_fits_on_a_string_column_and_matches_keras(self, session):
        import pyarrow as pa

        text, labels = texts()
        df = session.createDataFrame(pa.table({"row": np.arange(len(text)), "text": text, "label": labels}))
        model = text_model()
        trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
        history = trainer.fit(df, features_col="text", epochs=2, verbose=0)
        assert history.history["loss"][1] < history.history["loss"][0]
        import tensorflow as tf

        x = tf.constant(np.array(text).reshape(-1, 1))  # Keras' fit and predict take strings as a tf.string tensor
        evaluation = trainer.evaluate(df, features_col="text", return_dict=True)
        reference = model.evaluate(x, labels, return_dict=True, verbose=0)
        for name in ("loss", "accuracy"):
            assert evaluation[name] == pytest.approx(reference[name], abs=1e-5), name
        got = _probabilities(trainer.predict(df, features_col="text"))
        want = model.predict(x, verbose=0)[:, 0]
        np.testing.assert_allclose(got[:, 1], want, rtol=0, atol=1e-6)

    def test_png_bytes_with_a_seeded_augmenting_preprocess_repeat_bitwise_and_stage_compactly(self, session):
        import pyarrow as pa

        _, pngs, labels, images = digits_png()
        df = digits_frame(session)

        def fit():
            model = digits_cnn()
            with shipped_by_value():
                trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=2,
                                                    seed=5, preprocess=decode_digits)
            trainer.fit(df, features_col="image", epochs=1, verbose=0)
            return model, trainer

        first, trainer = fit()
        again, _ = fit()
        assert_weights_close(again.get_weights(), first.get_weights(), atol=0)
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(first.get_weights(), digits_cnn().get_weights())) > 1e-3

        (staged,) = [s for _, s in trainer._staged.values()]
        # what the function reads, the label it passes through, and the path that names a row it fails on
        assert [(c.name, c.kind) for c in staged.columns] == [("content", "raw"), ("label", "raw"), ("path", "raw")]
        nbytes = sum(f.nbytes for f in staged.files)
        assert nbytes == trainer.stats.staged_bytes > 0
        paths, *_ = digits_png()
        own = pa.array(pngs, pa.binary()).nbytes + labels.nbytes + pa.array(paths, pa.string()).nbytes
        assert nbytes <= 1.05 * own, (nbytes, own)  # as they came: nothing decoded or widened

        # evaluate and predict decode with training=False: no flips, so they equal Keras on the decoded images
        evaluation = trainer.evaluate(df, features_col="image", return_dict=True)
        reference = first.evaluate(images, labels, return_dict=True, verbose=0)
        for name in ("loss", "accuracy"):
            assert evaluation[name] == pytest.approx(reference[name], abs=1e-5), name
        got = _probabilities(trainer.predict(df, features_col="image"))
        np.testing.assert_allclose(got, first.predict(images, verbose=0), rtol=0, atol=1e-6)

    def test_a_preprocess_that_raises_names_the_function_row_path_and_cause(self, session):
        import tensorflow as tf

        from sparkdl_avg import DataError, WorkerError

        try:
            tf.io.decode_png(b"not a png")
        except Exception as exc:  # noqa: BLE001 - the cause, as the function meets it
            cause = str(exc).strip().splitlines()[0].split("}}")[-1].strip()
        paths = digits_png()[0]
        for bad_row, dry_run in ((3, True), (77, False)):
            model = digits_cnn()
            with shipped_by_value():
                trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=2,
                                                    seed=5, preprocess=decode_digits)
            with pytest.raises((DataError, WorkerError)) as info:
                trainer.fit(digits_frame(session, bad_row), features_col="image", epochs=1, verbose=0)
            message = str(info.value)
            assert "'parity.decode_digits'" in message, message
            assert f"row {bad_row} of the training data" in message, message
            assert paths[bad_row] in message, message
            assert "InvalidArgumentError" in message and cause in message, message
            if dry_run:  # the driver's dry run on the first rows: nothing staged, no round
                assert isinstance(info.value, DataError) and trainer._staged == {}, message
            else:  # past the dry run's rows: the worker that decodes it
                assert trainer._staged != {}, message

    def test_a_preprocess_output_of_the_wrong_shape_fails_before_any_round(self, session):
        from sparkdl_avg import DataError

        model = digits_cnn()
        weights = model.get_weights()
        with shipped_by_value():
            trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=2, seed=5,
                                                preprocess=decode_wrong_shape)
        with pytest.raises(DataError) as info:
            trainer.fit(digits_frame(session), features_col="image", epochs=1, verbose=0)
        message = str(info.value)
        assert "'parity.decode_wrong_shape'" in message and "'image'" in message, message
        assert "(7, 7, 1)" in message and "(8, 8, 1)" in message, message
        assert trainer._staged == {} and trainer.stats.records == []
        assert_weights_close(model.get_weights(), weights, atol=0)

    def test_sample_and_class_weights_equal_keras_fit(self, session, floatx64):
        import keras
        import pyarrow as pa

        from conftest import clone_compiled
        from sparkdl_avg import DataError

        rng = np.random.default_rng(21)
        x = np.asarray(rng.normal(size=(64, 4)), np.float32).astype(np.float64)
        y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int32)
        w = rng.integers(0, 9, size=64) / 4.0  # float32-exact, zeros included
        class_weight = {0: 0.5, 1: 3.0}
        factor = np.where(y == 1, 3.0, 0.5)

        def pair(**fit):
            model = make_model(outputs=2, loss="sparse_categorical_crossentropy", output_activation="softmax",
                               metrics=(), seed=8)
            ref = clone_compiled(model, keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
                                 metrics=())
            ref.fit(x, y, batch_size=8, shuffle=False, epochs=1, verbose=0, **fit)
            trainer = ParameterAveragingTrainer(model, num_workers=1, batch_size=8, averaging_frequency=3, seed=0)
            return model, ref, trainer

        model, ref, trainer = pair(sample_weight=w)
        trainer.fit((x, y, w), epochs=1, shuffle=False, verbose=0)
        assert_weights_close(model.get_weights(), ref.get_weights(), atol=1e-10)

        model, ref, trainer = pair(class_weight=class_weight)
        trainer.fit((x, y), epochs=1, shuffle=False, verbose=0, class_weight=class_weight)
        assert_weights_close(model.get_weights(), ref.get_weights(), atol=1e-10)

        df = session.createDataFrame(pa.table({"features": list(x), "label": y, "w": w}))
        model, ref, trainer = pair(sample_weight=w * factor)  # Keras takes one of the two at a time
        trainer.fit(df, epochs=1, shuffle=False, verbose=0, sample_weight_col="w", class_weight=class_weight)
        assert_weights_close(model.get_weights(), ref.get_weights(), atol=1e-10)
        unweighted = make_model(outputs=2, loss="sparse_categorical_crossentropy", output_activation="softmax",
                                metrics=(), seed=8)
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), unweighted.get_weights())) > 1e-3
        got = trainer.evaluate(df, sample_weight_col="w")
        assert got == pytest.approx(model.evaluate(x, y, sample_weight=w, verbose=0), rel=1e-9)
        assert got != pytest.approx(model.evaluate(x, y, verbose=0), rel=1e-3)

        negative = w.copy()
        negative[37] = -0.25
        bad = session.createDataFrame(pa.table({"features": list(x), "label": y, "w": negative}))
        with pytest.raises(DataError, match=r"Column 'w' holds the sample weight -0\.25 .*expected weights >= 0"):
            trainer.fit(bad, epochs=1, verbose=0, sample_weight_col="w")

    def test_spark_image_structs_train_and_predict_and_a_wrong_size_names_the_origin(self, session):
        import keras

        from sparkdl_avg import DataError

        rng = np.random.default_rng(3)
        rgb = rng.integers(0, 256, size=(64, 4, 4, 3), dtype=np.uint8)
        labels = (rgb[..., 0].mean(axis=(1, 2)) > rgb[..., 2].mean(axis=(1, 2))).astype(np.int32)
        origins = [f"file:/data/images/{i:02d}.png" for i in range(64)]
        schema = image_schema().add("label", "integer").add("row", "integer")
        rows = [(*r, int(y), i) for i, (r, y) in enumerate(zip(image_rows(rgb, origins), labels))]
        df = session.createDataFrame(rows, schema)

        keras.utils.set_random_seed(1)
        inputs = keras.Input((4, 4, 3))
        h = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
        model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(h))
        model.compile(keras.optimizers.SGD(0.5), "sparse_categorical_crossentropy", metrics=["accuracy"])
        trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=0)
        history = trainer.fit(df, features_col="image", epochs=2, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
        got = _probabilities(trainer.predict(df, features_col="image"))
        # RGB: the channels Spark stores as BGR reach the model reversed, as decode_png gives them
        np.testing.assert_allclose(got, model.predict(rgb.astype("float32"), verbose=0), rtol=0, atol=1e-6)
        assert np.abs(got - model.predict(rgb[..., ::-1].astype("float32"), verbose=0)).max() > 1e-4

        odd = list(rows)
        odd[41] = ((origins[41], 5, 4, 3, 16, bytes(60)), int(labels[41]), 41)
        with pytest.raises(DataError, match=r"Column 'image' holds an image of 5x4x3 .*origin "
                                            r"'file:/data/images/41\.png'.* takes 4x4x3"):
            ParameterAveragingTrainer(keras.models.clone_model(model), num_workers=2, batch_size=8).fit(
                session.createDataFrame(odd, schema), features_col="image", verbose=0)

    def test_the_estimator_with_preprocess_fits_transforms_saves_and_loads(self, session, tmp_path):
        from pyspark.ml import Pipeline, PipelineModel

        from sparkdl_avg.ml import KerasAveragingEstimator

        _, _, _, images = digits_png()
        df = digits_frame(session)
        with shipped_by_value():
            estimator = KerasAveragingEstimator(kerasModel=digits_cnn(), preprocess=decode_digits,
                                                featuresCol="image", numWorkers=2, batchSize=16,
                                                averagingFrequency=2, seed=5, epochs=1)
        fitted = Pipeline(stages=[estimator]).fit(df)
        stage = fitted.stages[0]
        assert stage.getPreprocess() is not None
        got = _probabilities(fitted.transform(df))
        np.testing.assert_allclose(got, stage.kerasModel.predict(images, verbose=0), rtol=0, atol=1e-6)
        path = str(tmp_path / "pipeline")
        fitted.write().save(path)
        stage_dir = os.path.join(path, "stages", os.listdir(os.path.join(path, "stages"))[0])
        assert {"model.keras", "preprocess.pkl"} <= set(os.listdir(stage_dir))
        loaded = PipelineModel.load(path)
        np.testing.assert_array_equal(_probabilities(loaded.transform(df)), got)


class ElasticMixin:
    """Elastic rounds (issue 39) with scripted task slots: the plan follows the slots, and follows only them."""

    def _fit(self, slots, epochs=2, **options):
        from sparkdl_avg.driver.elastic.membership import ScriptedSlots

        x, y = regression_data(200, seed=1)
        model = make_model(seed=2)
        trainer = ParameterAveragingTrainer(model, batch_size=8, averaging_frequency=3, seed=3, **options)
        with (slots if isinstance(slots, ScriptedSlots) else ScriptedSlots(slots)):
            trainer.fit((x, y), epochs=epochs, verbose=0)
        return trainer, model

    def test_steady_slots_train_the_fixed_fits_weights_bitwise(self, session):
        _, fixed = self._fit([(0, 0, 2)], num_workers=2)  # no elastic option: the script is not read
        trainer, elastic = self._fit([(0, 0, 2)], min_workers=1, max_workers=2)
        assert_weights_close(elastic.get_weights(), fixed.get_weights(), atol=0)
        assert trainer.stats.membership == [
            {"epoch": 0, "round": 0, "workers": 2, "slots": 2, "hosts": ["scripted"], "reason": "start"}]

    def test_workers_that_leave_and_join_train_each_example_once_and_replay_bitwise(self, session,
                                                                                   tmp_path):
        from sparkdl_avg.driver.elastic.membership import ScriptedSlots

        script = [(0, 0, 3), (0, 2, 2), (1, 1, 3)]  # 3 workers, 2 from round 2 of epoch 0, 3 again from epoch 1's round 1
        real = worker_module.run_round_partition
        directory = str(tmp_path / "examples")
        os.makedirs(directory)
        with testing.RoundEntry(lambda task, it: _recording_examples(real, task, it, directory)):
            trainer, model = self._fit(script, min_workers=1, max_workers=3, update_compression="int8")

        records = trainer.stats.records
        assert [(r.epoch, r.round, r.num_workers, r.start) for r in records] == [
            (0, 0, 3, 0), (0, 1, 3, 72), (0, 2, 2, 144), (1, 0, 2, 0), (1, 1, 3, 48), (1, 2, 3, 120)]
        assert [(c["epoch"], c["round"], c["workers"], c["reason"]) for c in trainer.stats.membership] == [
            (0, 0, 3, "start"), (0, 2, 2, "slots lost"), (1, 1, 3, "slots joined")]
        # the worker that left had a residual (int8's error feedback): dropped, and counted where it was
        assert [r.residuals_dropped for r in records] == [0, 0, 1, 0, 0, 0]
        # counted by the tasks themselves: every example of an epoch trained once, 200 - 192 left over (< 3·8)
        for epoch in range(2):
            trained = np.concatenate([np.load(os.path.join(directory, f)) for f in sorted(os.listdir(directory))
                                      if f.startswith(f"e{epoch}-")])
            assert len(trained) == 192 and len(np.unique(trained)) == 192, epoch
            assert set(trained.tolist()) <= set(range(200))

        _, replayed = self._fit(ScriptedSlots.replay(trainer.stats.membership), min_workers=1, max_workers=3,
                                update_compression="int8")
        assert_weights_close(replayed.get_weights(), model.get_weights(), atol=0)

    def test_stale_synchronous_epochs_are_planned_at_their_start_and_replay_bitwise(self, session):
        from sparkdl_avg.driver.elastic.membership import ScriptedSlots

        script = [(0, 0, 2), (0, 3, 1), (1, 0, 1)]  # the change at round 3 waits for epoch 1: chunks keep their workers
        trainer, model = self._fit(script, min_workers=1, max_workers=2, synchronization="stale", reproducible=True)
        assert [(c["epoch"], c["workers"], c["reason"]) for c in trainer.stats.membership] == [
            (0, 2, "start"), (1, 1, "slots lost")]
        chunks = [(r.epoch, r.round) for r in trainer.stats.records]
        assert len([c for c in chunks if c[0] == 0]) == 2 * 4  # 200 // (2·8) = 12 minibatches each: 4 rounds of 3
        assert sorted(c for c in chunks if c[0] == 1) == [(1, r) for r in range(9)]  # 25 minibatches: 8 rounds of 3, 1
        _, replayed = self._fit(ScriptedSlots.replay(trainer.stats.membership), min_workers=1, max_workers=2,
                                synchronization="stale", reproducible=True)
        assert_weights_close(replayed.get_weights(), model.get_weights(), atol=0)

    def test_live_slots_are_read_from_spark_and_a_probe_job_counts_them(self, session):
        from sparkdl_avg.driver.elastic.membership import LiveSlots, probe_slots
        from sparkdl_avg.driver.runtime.session import Engine

        engine = Engine(session)
        assert LiveSlots(engine, 4)().count == 2  # classic: the status store; Connect on local[2]: the master
        probed = probe_slots(engine, 4)  # 4 short tasks on 2 slots run in 2 Python workers
        assert probed.count == 2 and len(probed.hosts) == 1, probed

    def test_too_few_slots_for_min_workers_fail_after_the_timeout_keeping_the_weights(self, session):
        from sparkdl_avg import WorkerError

        with pytest.raises(WorkerError, match=r"min_workers=2 task slots, and only 1 were live .*"
                                              r"elastic_timeout_s=0\.5.* lower min_workers, and fit again"):
            self._fit([(0, 0, 2), (0, 1, 1)], min_workers=2, max_workers=2, elastic_timeout_s=0.5)

    def test_a_resumed_elastic_fit_continues_its_membership_and_equals_the_uninterrupted_one(self, session, tmp_path):
        import keras

        script = [(0, 0, 2), (0, 2, 1), (1, 0, 2)]
        _, whole = self._fit(script, epochs=2, min_workers=1, max_workers=2)

        class Stop(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch == 3:  # epoch 0's round 3: after the change to 1 worker, mid-epoch
                    raise KeyboardInterrupt

        from sparkdl_avg.driver.elastic.membership import ScriptedSlots

        x, y = regression_data(200, seed=1)
        directory = str(tmp_path / "ckpt")
        first = ParameterAveragingTrainer(make_model(seed=2), batch_size=8, averaging_frequency=3, seed=3,
                                          min_workers=1, max_workers=2)
        with ScriptedSlots(script), pytest.raises(KeyboardInterrupt):
            first.fit((x, y), epochs=2, verbose=0, checkpoint_dir=directory, checkpoint_every=1, callbacks=[Stop()])
        model = make_model(seed=2)
        second = ParameterAveragingTrainer(model, batch_size=8, averaging_frequency=3, seed=3, min_workers=1,
                                           max_workers=2)
        with ScriptedSlots(script):
            second.fit((x, y), epochs=2, verbose=0, checkpoint_dir=directory, resume=True)
        assert_weights_close(model.get_weights(), whole.get_weights(), atol=0)
        first_record = second.stats.records[0]
        assert (first_record.epoch, first_record.round, first_record.num_workers, first_record.start) == (0, 4, 1, 144)
        assert first_record.membership["reason"] == "resumed"


def _recording_examples(real, task, iterator, directory):
    """Runs a round's task, saving the example indices each of its workers trained (``e<epoch>-r<round>-w<worker>``)."""
    from sparkdl_avg.shared.data.example_order import EpochOrder, worker_positions

    workers = list(iterator)
    order = EpochOrder(task.dataset.num_examples, task.seed, task.epoch, task.shuffle)
    for worker in workers:
        positions = worker_positions(task.steps_before, task.steps, worker, task.num_workers, task.batch_size,
                                     start=task.start)
        np.save(os.path.join(directory, f"e{task.epoch}-r{task.round}-w{worker}.npy"),
                order.indices(positions.start, positions.stop))
    return real(task, iter(workers))


def lose_host_files(staging_dir: str, kind: str, worker: int) -> list:
    """Deletes what worker ``worker`` keeps on this host for the fits staged under ``staging_dir``, as if its host went.

    ``kind``: the ledger's directory in the fit's, ``"local"`` (``optimizer_state="local"``) or ``"fragments"``
    (``sync_fragments``). Returns the deleted files' names. Only those fits' files: a host keeps every fit's
    in a directory keyed by the fit's own directory (:func:`~sparkdl_avg.shared.wire.local_state.host_directory`),
    and deleting ``*-w1.bin`` in all of them (as these tests once did) also took those of a fit that another
    process on the host was running, whose worker 1 then restarted its state: its retried-task test ended 0.02
    from its clean run (test_reliability.py, ``test_a_neighbour_losing_its_states_leaves_this_fits_alone``).
    """
    from sparkdl_avg.shared.files.uris import join
    from sparkdl_avg.shared.wire.local_state import host_directory

    gone = []
    for root in os.listdir(staging_dir):  # the trainers' roots, each holding its fits' exchange-<n> directories
        fits = os.listdir(os.path.join(staging_dir, root)) if os.path.isdir(os.path.join(staging_dir, root)) else []
        for fit in (f for f in fits if f.startswith("exchange-")):
            here = host_directory(join(join(join(staging_dir, root), fit), kind))  # as the fit names it
            for name in (os.listdir(here) if os.path.isdir(here) else []):
                if name.endswith(f"-w{worker}.bin"):
                    os.remove(os.path.join(here, name))
                    gone.append(name)
    return gone


class LocalOptimizerStateMixin:
    """``optimizer_state="local"`` (issue 40): each worker keeps its own Adam state; only the weights travel."""

    def _fit(self, num_workers=2, epochs=2, optimizer_state="local", callbacks=None, staging_dir=None,
             **fit_options):
        import keras

        x, y = regression_data(192, seed=6)
        model = make_model(seed=3, optimizer=keras.optimizers.Adam(0.01))
        trainer = ParameterAveragingTrainer(model, num_workers=num_workers, batch_size=8, averaging_frequency=3,
                                            seed=4, optimizer_state=optimizer_state, staging_dir=staging_dir)
        trainer.fit((x, y), epochs=epochs, verbose=0, callbacks=callbacks, **fit_options)
        return trainer, model

    def test_each_worker_continues_its_own_adam_state_and_sends_its_weights_alone(self, session):
        trainer, model = self._fit()
        weight_bytes = sum(w.nbytes for w in model.get_weights())
        assert {r.sent_bytes for r in trainer.stats.records} == {2 * weight_bytes}  # no optimizer variables
        # the driver's Adam keeps its moments from before the fit (zeros); its step counter follows the fit
        moments = [v.numpy() for v in model.optimizer.variables if "momentum" in v.path or "velocity" in v.path]
        assert moments and not any(np.any(m) for m in moments)
        assert int(model.optimizer.iterations.numpy()) == 2 * 12  # 192 // (2·8) minibatches a worker, 2 epochs
        # one worker continuing its own state is one worker averaging its state with itself
        _, alone = self._fit(num_workers=1)
        _, averaged = self._fit(num_workers=1, optimizer_state="average")
        assert_weights_close(alone.get_weights(), averaged.get_weights(), atol=1e-12)
        _, reset = self._fit(optimizer_state="reset")  # and it is not a fresh state each round
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), reset.get_weights())) > 1e-4

    def test_a_retried_task_continues_the_same_state_bitwise(self, session, tmp_path):
        first, clean = self._fit()
        real = worker_module.run_round_partition
        marker = str(tmp_path / "failed-once")
        with testing.RoundEntry(lambda task, it: _fail_first_attempt(real, task, it, marker)):
            trainer, retried = self._fit()
        assert os.path.exists(marker)  # the first attempt failed before it trained
        # every worker found its state, the retried one included (a lost one would restart: weights 0.02 apart)
        assert first.stats.local_states_restarted == 0 and trainer.stats.local_states_restarted == 0
        assert_weights_close(retried.get_weights(), clean.get_weights(), atol=0)

    def test_a_worker_whose_state_is_lost_restarts_from_the_drivers_and_is_counted(self, session, tmp_path):
        import keras

        # classic sessions keep each worker's state in a file on its host; Connect under the staging directory
        on_hosts = not type(session).__module__.startswith("pyspark.sql.connect")
        staging = str(tmp_path / "staging")

        class LoseWorker1(keras.callbacks.Callback):  # as if worker 1's host went between rounds 1 and 2
            def on_train_batch_end(self, batch, logs=None):
                if batch == 1:
                    lose_host_files(staging, "local", 1)  # this fit's: never another's on the host

        trainer, model = self._fit(callbacks=[LoseWorker1()], staging_dir=staging)
        _, clean = self._fit()
        restarted = [[w.worker for w in r.workers if w.local_state_restarted] for r in trainer.stats.records]
        if on_hosts:  # 4 rounds an epoch: its round 2 restarts worker 1 from the driver's Adam state
            assert restarted == [[], [], [1], []] * 2
            assert [r.local_states_restarted for r in trainer.stats.records] == [0, 0, 1, 0] * 2
            assert trainer.stats.local_states_restarted == 2
            assert max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), clean.get_weights())) > 1e-6
        else:  # nothing of this fit was there: the states are the staging directory's, and nothing restarts
            assert restarted == [[]] * 8 and trainer.stats.local_states_restarted == 0
            assert_weights_close(model.get_weights(), clean.get_weights(), atol=0)

    def test_a_checkpoint_after_a_stop_mid_epoch_says_what_it_lacks(self, session, tmp_path, caplog):
        import keras

        from sparkdl_avg.driver.checkpoint import files as checkpoint

        class StopAfterRound1(keras.callbacks.Callback):  # unforeseen: the round before it kept its states
            def on_train_batch_end(self, batch, logs=None):
                if batch == 1:
                    self.model.stop_training = True

        directory = str(tmp_path / "ckpt")
        with caplog.at_level("WARNING", logger="sparkdl_avg"):
            self._fit(epochs=2, callbacks=[StopAfterRound1()], checkpoint_dir=directory)
        saved = checkpoint.load(checkpoint.latest(directory))
        warned = [r.getMessage() for r in caplog.records if "carries no optimizer_state='local' states" in r.getMessage()]
        if type(session).__module__.startswith("pyspark.sql.connect"):  # the staging directory has every round's
            assert sorted(saved.feedback) == ["local-optimizer/1/0", "local-optimizer/1/1"] and not warned
        else:  # on the hosts, and only rounds that may end an epoch (or come before a due checkpoint) shared them
            assert saved.feedback == {} and len(warned) == 1
            assert "restarts them from the driver's optimizer variables" in warned[0]

    def test_a_checkpoint_carries_every_workers_state_and_resumes_bitwise(self, session, tmp_path):
        import keras

        from sparkdl_avg.driver.checkpoint import files as checkpoint

        _, whole = self._fit(epochs=2)

        class Stop(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch == 2:  # epoch 0, mid-epoch
                    raise KeyboardInterrupt

        directory = str(tmp_path / "ckpt")
        with pytest.raises(KeyboardInterrupt):
            self._fit(epochs=2, callbacks=[Stop()], checkpoint_dir=directory, checkpoint_every=1)
        saved = checkpoint.load(checkpoint.latest(directory))
        assert sorted(saved.feedback) == ["local-optimizer/1/0", "local-optimizer/1/1"]
        _, resumed = self._fit(epochs=2, checkpoint_dir=directory, resume=True)
        assert_weights_close(resumed.get_weights(), whole.get_weights(), atol=0)
        # after every epoch (the default): the epoch's last round wrote the states where the checkpoint reads them
        directory = str(tmp_path / "each-epoch")
        self._fit(epochs=1, checkpoint_dir=directory)
        saved = checkpoint.load(checkpoint.latest(directory))
        assert sorted(saved.feedback) == ["local-optimizer/1/0", "local-optimizer/1/1"]
        _, resumed = self._fit(epochs=2, checkpoint_dir=directory, resume=True)
        assert_weights_close(resumed.get_weights(), whole.get_weights(), atol=0)


def _linear_sgd_reference(x, y, init, num_workers, batch_size, k, epochs, lr):
    """Overlapped rounds (eager updates) in float64 numpy, written as docs/guides/rounds.md states them.

    A linear model ``x·W + b``, MSE, plain SGD. Returns the driver's weights after each round (``G_t``, every
    average up to round ``t − 1`` applied) and after the fit (the last average applied too).
    """
    n_per_epoch = len(x) // (num_workers * batch_size * k)  # rounds per epoch
    G = [np.array(w, np.float64) for w in init]
    own = [None] * num_workers  # δ_i^{t-1}, worker i's delta of the round before
    pending = None  # Δ̄_{t-1}, applied at the end of round t
    after_rounds = []
    for _ in range(epochs):
        for r in range(n_per_epoch):
            deltas = []
            for i in range(num_workers):
                W, b = [g.copy() for g in G]
                if own[i] is not None:  # x_i^t = G_{t-1} + δ_i^{t-1}/N
                    W, b = W + own[i][0] / num_workers, b + own[i][1] / num_workers
                start = [W.copy(), b.copy()]
                first = (r * num_workers * k + i * k) * batch_size
                for s in range(k):
                    xb = x[first + s * batch_size: first + (s + 1) * batch_size]
                    yb = y[first + s * batch_size: first + (s + 1) * batch_size].reshape(-1, 1)
                    err = xb @ W + b - yb
                    W = W - lr * 2.0 / batch_size * xb.T @ err
                    b = b - lr * 2.0 / batch_size * err.sum(axis=0)
                deltas.append([W - start[0], b - start[1]])  # δ_i^t = y_i^t − x_i^t
            mean = [sum(d[j] for d in deltas) / num_workers for j in range(2)]  # Δ̄_t
            if pending is not None:  # G_t = G_{t-1} + Δ̄_{t-1}: one round late
                G = [g + p for g, p in zip(G, pending)]
            pending, own = mean, deltas
            after_rounds.append([g.copy() for g in G])
    final = [g + p for g, p in zip(G, pending)]
    return after_rounds, final


class OverlapRoundsMixin:
    """``overlap_rounds`` (issue 50): eager updates, each worker's own delta standing in for its share of the
    average the driver applies one round late."""

    B, K, LR = 4, 2, 0.0625  # float32 holds the learning rate exactly

    def _linear(self):
        import keras

        keras.utils.set_random_seed(7)
        inputs = keras.Input((3,), dtype="float64")
        out = keras.layers.Dense(1, dtype="float64")(inputs)
        model = keras.Model(inputs, out)
        model.compile(keras.optimizers.SGD(self.LR), "mse")
        return model

    def _fit(self, model=None, num_workers=2, epochs=2, callbacks=None, **fit_options):
        x, y = regression_data(48, d=3, seed=9)
        model = model or self._linear()
        options = dict(optimizer_state="local", overlap_rounds=True)
        options.update(fit_options.pop("options", {}))
        trainer = ParameterAveragingTrainer(model, num_workers=num_workers, batch_size=self.B,
                                            averaging_frequency=self.K, seed=4, **options)
        trainer.fit((x, y), epochs=epochs, verbose=0, shuffle=False, callbacks=callbacks, **fit_options)
        return trainer, model

    def test_two_workers_equal_the_float64_reference_round_by_round(self, session, floatx64):
        import keras

        class Record(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.seen = []

            def on_train_batch_end(self, batch, logs=None):
                self.seen.append(self.model.get_weights())

        x, y = regression_data(48, d=3, seed=9)
        model = self._linear()
        init = model.get_weights()
        record = Record()
        trainer, model = self._fit(model, callbacks=[record])
        rounds, final = _linear_sgd_reference(x, y, init, 2, self.B, self.K, 2, self.LR)
        assert len(record.seen) == len(rounds) == 6
        for got, want in zip(record.seen, rounds):
            assert_weights_close(got, want, atol=1e-12)
        assert_weights_close(model.get_weights(), final, atol=1e-12)
        # not the synchronous rounds' weights, nor the naive delay's
        _, sync = self._fit(options=dict(overlap_rounds=False))
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(sync.get_weights(), final)) > 1e-6

    def test_one_worker_is_sequential_training(self, session, floatx64):
        x, y = regression_data(48, d=3, seed=9)
        _, model = self._fit(num_workers=1)
        alone = self._linear()
        alone.fit(x, y, batch_size=self.B, epochs=2, shuffle=False, verbose=0)
        assert_weights_close(model.get_weights(), alone.get_weights(), atol=1e-12)

    def test_runs_repeat_bitwise_and_a_retried_task_gives_the_clean_runs_weights(self, session,
                                                                                tmp_path):
        _, clean = self._fit()
        _, again = self._fit()
        assert_weights_close(again.get_weights(), clean.get_weights(), atol=0)
        real = worker_module.run_round_partition
        marker = str(tmp_path / "failed-once")
        with testing.RoundEntry(lambda task, it: _fail_first_attempt(real, task, it, marker)):
            _, retried = self._fit()
        assert os.path.exists(marker)
        assert_weights_close(retried.get_weights(), clean.get_weights(), atol=0)

    def test_a_checkpoint_carries_what_is_in_flight_and_resumes_bitwise(self, session, tmp_path):
        import keras

        from sparkdl_avg.driver.checkpoint import files as checkpoint

        _, whole = self._fit()

        class Stop(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch == 1:  # epoch 0, mid-epoch: an average and both workers' deltas in flight
                    raise KeyboardInterrupt

        directory = str(tmp_path / "ckpt")
        with pytest.raises(KeyboardInterrupt):
            self._fit(callbacks=[Stop()], checkpoint_dir=directory, checkpoint_every=1)
        saved = checkpoint.load(checkpoint.latest(directory))
        assert sorted(k for k in saved.feedback if k.startswith("overlap")) == ["overlap-own/1/0", "overlap-own/1/1"]
        assert any(np.any(p) for p in saved.rule_state["overlap_pending"])
        _, resumed = self._fit(checkpoint_dir=directory, resume=True)
        assert_weights_close(resumed.get_weights(), whole.get_weights(), atol=0)

    def test_elastic_rounds_give_a_joining_worker_no_own_term(self, session):
        from sparkdl_avg.driver.elastic.membership import ScriptedSlots

        _, fixed = self._fit()
        with ScriptedSlots([(0, 0, 2)]):
            _, steady = self._fit(options=dict(min_workers=1, max_workers=2))
        assert_weights_close(steady.get_weights(), fixed.get_weights(), atol=0)
        script = [(0, 0, 1), (0, 1, 2)]  # worker 1 joins at round 1 of epoch 0 with no delta of its own
        with ScriptedSlots(script):
            trainer, joined = self._fit(options=dict(min_workers=1, max_workers=2))
        with ScriptedSlots(script):
            _, again = self._fit(options=dict(min_workers=1, max_workers=2))
        assert [r.num_workers for r in trainer.stats.records][:2] == [1, 2]
        assert_weights_close(again.get_weights(), joined.get_weights(), atol=0)
        assert all(np.isfinite(w).all() for w in joined.get_weights())
# ------------------------------------------------------------------ sync_fragments (issue 50, part 3)


def linear_model(seed=0, lr=0.1, inputs=4, hidden=None):
    """A float64 linear model (two trainable variables: kernel, bias) with plain SGD; ``hidden``: an MLP."""
    import keras

    keras.utils.set_random_seed(seed)
    x = keras.Input((inputs,), dtype="float64")
    h = keras.layers.Dense(hidden, activation="tanh", dtype="float64")(x) if hidden else x
    model = keras.Model(x, keras.layers.Dense(1, dtype="float64")(h))
    model.compile(keras.optimizers.SGD(lr), "mse")
    return model


def simulate_fragments(weights, x, y, N, B, k, E, F, lr, groups):
    """A float64 numpy simulation of fragment rounds on a linear model (kernel, bias), plain SGD, average rule.

    ``groups``: per fragment, the indices of the variables it holds. Each worker keeps its own weights; round
    ``c`` starts from them with fragment ``(c - 1) mod F`` replaced by the global values (everything in the
    first round), trains ``k`` minibatches and the global fragment ``c mod F`` becomes the workers' average.
    """
    from sparkdl_avg.shared.data import example_order

    glob = [np.array(w, np.float64) for w in weights]
    own = [None] * N
    c = 0
    for _ in range(E):
        before = 0
        for steps in example_order.round_lengths(len(x), N, B, k):
            ends = []
            for worker in range(N):
                w = [a.copy() for a in glob] if own[worker] is None else [a.copy() for a in own[worker]]
                if own[worker] is not None:
                    for j in groups[(c - 1) % F]:
                        w[j] = glob[j].copy()
                pos = example_order.worker_positions(before, steps, worker, N, B)
                for s in range(steps):
                    xb = x[pos.start + s * B: pos.start + (s + 1) * B]
                    yb = y[pos.start + s * B: pos.start + (s + 1) * B].reshape(-1, 1)
                    err = xb @ w[0] + w[1] - yb
                    w[0] = w[0] - lr * (2.0 / B) * (xb.T @ err)
                    w[1] = w[1] - lr * (2.0 / B) * err.sum(axis=0)
                own[worker] = w
                ends.append(w)
            for j in groups[c % F]:
                glob[j] = sum(e[j] for e in ends) / N
            c += 1
            before += steps
    return glob


def fragment_fit(F, epochs=2, model=None, fit=None, **options):
    """A fit of a float32 dropout MLP (Adam) with ``sync_fragments=F``; returns ``(model, trainer)``."""
    model = model if model is not None else f32_model(hidden=16)
    trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=3, seed=4,
                                        sync_fragments=F, **options)
    trainer.fit(COMPRESSED_DATA, epochs=epochs, verbose=0, **(fit or {}))
    return model, trainer


class FragmentsMixin:
    """``sync_fragments`` (issue 50): fragments synchronised in turn, each worker keeping its own weights."""

    def test_two_fragments_equal_a_float64_numpy_simulation_term_by_term(self, session, floatx64):
        B, N, k, E, F, lr = 8, 2, 3, 2, 2, 0.125  # float32-exact: Keras keeps the learning rate in float32
        x, y = regression_data(N * B * 5, seed=7)  # 5 minibatches per worker per epoch: rounds of 3 and 2
        model = linear_model(seed=2, lr=lr)
        start = model.get_weights()
        trainer = ParameterAveragingTrainer(model, num_workers=N, batch_size=B, averaging_frequency=k, seed=0,
                                            sync_fragments=F)
        trainer.fit((x, y), epochs=E, shuffle=False, verbose=0)
        want = simulate_fragments(start, x, y, N, B, k, E, F, lr, groups=[[0], [1]])
        assert_weights_close(model.get_weights(), want, atol=1e-12)
        # and it is not plain averaging: the same fit with one fragment ends elsewhere
        plain = linear_model(seed=2, lr=lr)
        ParameterAveragingTrainer(plain, num_workers=N, batch_size=B, averaging_frequency=k,
                                  seed=0).fit((x, y), epochs=E, shuffle=False, verbose=0)
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(plain.get_weights(), want)) > 1e-6

    @pytest.mark.parametrize("options", [
        {"optimizer_state": "local", "update_rule": "diloco"},
        {"optimizer_state": "local", "update_rule": "bmuf_nesterov", "update_compression": "int8"},
        {"update_rule": "slowmo", "update_compression": "int4"},
    ], ids=["local-diloco", "local-bmuf-nesterov-int8", "slowmo-int4"])
    def test_compositions_run_finite_and_repeat_bitwise(self, session, options):
        model, trainer = fragment_fit(2, **options)
        again, _ = fragment_fit(2, **options)
        assert all(np.isfinite(w).all() for w in model.get_weights())
        assert_weights_close(again.get_weights(), model.get_weights(), atol=0)
        assert max(float(np.max(np.abs(a - b)))
                   for a, b in zip(model.get_weights(), f32_model(hidden=16).get_weights())) > 1e-3
        sizes = sorted({r.sent_bytes for r in trainer.stats.records})
        assert len(sizes) == 2  # the two fragments' rounds, each about half the model's

    def test_a_retried_task_gives_the_clean_runs_weights(self, session, tmp_path):
        clean, _ = fragment_fit(2, optimizer_state="local", update_compression="int8")
        real = worker_module.run_round_partition
        marker = str(tmp_path / "failed-once")
        with testing.RoundEntry(lambda task, it: _fail_after_first_attempt(real, task, it, marker)):
            retried, _ = fragment_fit(2, optimizer_state="local", update_compression="int8")
        assert os.path.exists(marker)  # the first attempt trained, wrote its own weights, then failed
        assert_weights_close(retried.get_weights(), clean.get_weights(), atol=0)

    def test_a_resumed_fit_continues_bitwise(self, session, tmp_path):
        options = dict(optimizer_state="local", update_rule="diloco", update_compression="int8")
        whole, _ = fragment_fit(3, epochs=2, **options)
        directory = str(tmp_path / "ckpt")
        first = f32_model(hidden=16)
        fragment_fit(3, epochs=1, model=first, fit={"checkpoint_dir": directory}, **options)
        resumed = f32_model(hidden=16)
        fragment_fit(3, epochs=2, model=resumed, fit={"checkpoint_dir": directory, "resume": True}, **options)
        assert_weights_close(resumed.get_weights(), whole.get_weights(), atol=0)

    def test_elastic_rounds_start_a_joining_worker_from_the_global_weights_and_replay_bitwise(self, session):
        from sparkdl_avg.driver.elastic.membership import ScriptedSlots

        x, y = regression_data(200, seed=1)

        def fit(slots):
            model = make_model(seed=2)
            trainer = ParameterAveragingTrainer(model, batch_size=8, averaging_frequency=3, seed=3, min_workers=1,
                                                max_workers=3, sync_fragments=2, update_compression="int8")
            with slots:
                trainer.fit((x, y), epochs=2, verbose=0)
            return trainer, model

        trainer, model = fit(ScriptedSlots([(0, 0, 3), (0, 2, 2), (1, 1, 3)]))  # worker 2 leaves, then joins again
        assert [r.num_workers for r in trainer.stats.records] == [3, 3, 2, 2, 3, 3]
        assert all(np.isfinite(w).all() for w in model.get_weights())
        _, replayed = fit(ScriptedSlots.replay(trainer.stats.membership))
        assert_weights_close(replayed.get_weights(), model.get_weights(), atol=0)

    def test_a_worker_whose_own_weights_are_lost_restarts_from_the_global_ones_and_is_counted(self, session,
                                                                                              tmp_path):
        import keras

        # classic sessions keep each worker's own weights in a file on its host; Connect under the staging directory
        on_hosts = not type(session).__module__.startswith("pyspark.sql.connect")
        staging = str(tmp_path / "staging")

        class LoseWorker1(keras.callbacks.Callback):  # as if worker 1's host went between rounds 1 and 2
            def on_train_batch_end(self, batch, logs=None):
                if batch == 1:
                    lose_host_files(staging, "fragments", 1)  # this fit's: never another's on the host

        model, trainer = fragment_fit(2, fit={"callbacks": [LoseWorker1()]}, staging_dir=staging)
        clean, _ = fragment_fit(2)
        restarted = [[w.worker for w in r.workers if w.local_state_restarted] for r in trainer.stats.records]
        if on_hosts:  # 4 rounds an epoch: its round 2 restarts worker 1 from the sent (global) weights
            assert restarted == [[], [], [1], []] * 2
            assert trainer.stats.local_states_restarted == 2
            assert all(np.isfinite(w).all() for w in model.get_weights())
            assert max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), clean.get_weights())) > 1e-6
        else:  # nothing of this fit was there: the weights are the staging directory's, and nothing restarts
            assert restarted == [[]] * 8 and trainer.stats.local_states_restarted == 0
            assert_weights_close(model.get_weights(), clean.get_weights(), atol=0)
