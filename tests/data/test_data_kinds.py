"""Data as users keep it (issue 37): exact conversions, per-example seeds, preprocessing functions, class
weights and Spark's image struct without Spark; then tests/parity.py's ``DataKindsMixin`` on a classic session
(its Connect twin is in test_connect.py), and jobs/train.py with ``--preprocess`` and ``--sample-weight-col``
run in-process on that session.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pyarrow as pa
import pytest

from conftest import run_job_in_process
from parity import DataKindsMixin, digits_cnn, digits_png, image_schema, shipped_by_value
from sparkdl_avg import ConfigurationError, DataError, ParameterAveragingTrainer
from sparkdl_avg.shared.data.columns import Column, Field, exact_cast, raw_value, read_column, stage_arrow
from sparkdl_avg.shared.data.preprocess import Preprocess, example_seeds
from sparkdl_avg.shared.data.staged_dataset import StagedDataset, StagedFile, class_weights, read_examples, write_columns



# ------------------------------------------------------------------ exact_cast


def test_int64_ids_into_int64_stay_exact():
    ids = np.array([[2**53 + 1], [2**62 + 3], [-(2**40) - 1]], np.int64)
    out = exact_cast(ids, "int64", "Column 'ids'")
    assert out.dtype == np.int64 and out.tolist() == ids.tolist()
    # from a narrower integer type too
    assert exact_cast(np.array([[2**31 - 1]], np.int32), "int64", "x").tolist() == [[2**31 - 1]]


def test_ids_a_float_cannot_hold_are_refused_naming_the_column_value_and_dtype():
    ids = np.array([[5], [2**24], [2**24 + 1]], np.int64)
    with pytest.raises(DataError) as info:
        exact_cast(ids, "float32", "Column 'ids'", first_row=10)
    message = str(info.value)
    assert message.startswith("Column 'ids' holds 16777217 (row 12 of its partition), which float32 cannot hold "
                              "exactly (float32 holds integers exactly only up to 2^24)"), message
    assert "never rounded silently" in message
    # 2^24 itself is exact in float32, 2^53 + 1 is not in float64
    assert exact_cast(ids[:2], "float32", "x").tolist() == [[5.0], [16777216.0]]
    with pytest.raises(DataError, match=r"x holds 9007199254740993 .*float64 .*2\^53"):
        exact_cast(np.array([[2**53 + 1]], np.int64), "float64", "x")


def test_fractions_into_an_integer_input_are_refused():
    with pytest.raises(DataError, match=r"Column 'n' holds 1\.5 \(row 1\).*int32 cannot hold exactly.*whole numbers"):
        exact_cast(np.array([[2.0], [1.5]]), "int32", "Column 'n'", where="")
    assert exact_cast(np.array([[2.0], [-3.0]]), "int32", "x").tolist() == [[2], [-3]]
    with pytest.raises(DataError, match=r"holds nan"):
        exact_cast(np.array([[np.nan]]), "int64", "x")
    with pytest.raises(DataError, match=r"holds 300 .*uint8 holds 0\.\.255"):
        exact_cast(np.array([[300]], np.int64), "uint8", "x")


def test_uint8_pixels_into_float32_are_exact():
    pixels = np.arange(256, dtype=np.uint8).reshape(4, 64)
    out = exact_cast(pixels, "float32", "Column 'image'")
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, pixels.astype(np.float32))


# ------------------------------------------------------------------ seeds


def test_example_seeds_are_deterministic_and_independent_of_the_batch_split():
    indices = np.array([17, 3, 250, 0, 99, 4, 1000003], np.int64)
    seeds = example_seeds(7, 2, indices)
    assert seeds.dtype == np.int64 and (seeds >= 0).all() and len(set(seeds.tolist())) == len(indices)
    np.testing.assert_array_equal(seeds, example_seeds(7, 2, indices.copy()))
    for split in (1, 2, 3):
        parts = np.concatenate([example_seeds(7, 2, indices[i: i + split]) for i in range(0, len(indices), split)])
        np.testing.assert_array_equal(parts, seeds)
    # one example's seed depends on (seed, epoch, index) only
    assert example_seeds(7, 2, np.array([250]))[0] == seeds[2]
    assert not np.isin(example_seeds(7, 3, indices), seeds).any()
    assert not np.isin(example_seeds(8, 2, indices), seeds).any()


def echo_seeds(batch, seeds=None, training=False):
    """The examples' seeds as the model's input (and the raw values, to check the order)."""
    assert training
    return {"x": np.stack([seeds, batch["v"]], axis=1)}


def test_read_examples_gives_each_example_its_seed_however_the_minibatches_split(tmp_path):
    uris = [str(tmp_path / "part-00000.arrow"), str(tmp_path / "part-00001.arrow")]
    write_columns(uris[0], {"v": pa.array(np.arange(0, 6, dtype=np.int64))})
    write_columns(uris[1], {"v": pa.array(np.arange(6, 10, dtype=np.int64))})
    dataset = StagedDataset(
        (StagedFile(uris[0], 6), StagedFile(uris[1], 4)), (Column("v", "v", "raw", None, "raw"),), ("x",),
        (Field((2,), "int64"),), (), (), preprocess=Preprocess.of(echo_seeds).with_columns(["v"]),
    )
    indices = np.array([7, 2, 9, 0, 5, 6, 1], np.int64)
    whole = read_examples(dataset, indices, labels=False, seed=11, epoch=1, training=True)
    np.testing.assert_array_equal(whole.xs[0][:, 0], example_seeds(11, 1, indices))
    np.testing.assert_array_equal(whole.xs[0][:, 1], indices)
    for batch_size in (1, 3, 4):
        split = read_examples(dataset, indices, labels=False, seed=11, epoch=1, training=True, batch_size=batch_size)
        np.testing.assert_array_equal(split.xs[0], whole.xs[0])


# ------------------------------------------------------------------ Preprocess.of


def test_preprocess_refuses_what_executors_cannot_call_naming_the_parameter():
    with pytest.raises(ConfigurationError, match=r"The 'preprocess' parameter must be a function of a batch .* "
                                                 r"Got 42 instead"):
        Preprocess.of(42)
    lock = threading.Lock()
    with pytest.raises(ConfigurationError, match=r"The 'preprocess' parameter must be a function executors can "
                                                 r"receive; .*<lambda> cannot be pickled: TypeError: .*lock"):
        Preprocess.of(lambda batch: lock.acquire() and batch)

    def no_batch(seeds=None, training=False):
        return {}

    with pytest.raises(ConfigurationError, match=r"The 'preprocess' parameter must take the batch as its first "
                                                 r"argument"):
        Preprocess.of(no_batch)
    # the trainer checks it when it is made
    with pytest.raises(ConfigurationError, match=r"The 'preprocess' parameter"):
        ParameterAveragingTrainer(digits_cnn(), preprocess=lambda batch: lock.locked())
    assert Preprocess.of(None) is None


def test_preprocess_knows_which_keyword_arguments_the_function_takes():
    def plain(batch):
        return batch

    def seeded(batch, seeds=None):
        return batch

    def both(batch, **kwargs):
        return batch

    assert (Preprocess.of(plain).takes_seeds, Preprocess.of(plain).takes_training) == (False, False)
    assert (Preprocess.of(seeded).takes_seeds, Preprocess.of(seeded).takes_training) == (True, False)
    assert (Preprocess.of(both).takes_seeds, Preprocess.of(both).takes_training) == (True, True)
    wrapped = Preprocess.of(seeded)
    assert Preprocess.of(wrapped) is wrapped and wrapped.name.endswith("seeded")
    assert wrapped.digest == Preprocess.of(seeded).digest


def test_a_failing_function_is_named_with_the_row_its_path_and_the_cause():
    def decode(batch):
        return {"x": np.array([[float(v.decode())] for v in batch["content"]])}

    batch = {"path": np.array(["a.png", "b.png", "c.png"], dtype=object),
             "content": np.array([b"1", b"2", b"x!"], dtype=object)}
    with pytest.raises(DataError) as info:
        Preprocess.of(decode).apply(batch, None, True, "training data", first=40, row_ids=np.array([40, 41, 97]))
    message = str(info.value)
    assert "decode'" in message and "row 97 of the training data; path 'c.png'" in message, message
    assert "ValueError: could not convert string to float: 'x!'" in message, message


# ------------------------------------------------------------------ class weights


def test_class_weights_multiply_each_examples_weight_by_its_class():
    table = ((0, 0.5), (2, 4.0))
    y = np.array([0, 1, 2, 2], np.int32)
    np.testing.assert_array_equal(class_weights(table, y, None), [0.5, 1.0, 4.0, 4.0])
    np.testing.assert_array_equal(class_weights(table, y.reshape(-1, 1), np.array([2.0, 3.0, 0.5, 0.0], np.float32)),
                                  [1.0, 3.0, 2.0, 0.0])
    one_hot = np.eye(3, dtype=np.float32)[y]  # categorical labels: the argmax is the class
    np.testing.assert_array_equal(class_weights(table, one_hot, None), [0.5, 1.0, 4.0, 4.0])


# ------------------------------------------------------------------ Spark's image struct


def _image_struct(images, origins, channels=3, mode=16, order=slice(None, None, -1)):
    data = [img[..., order].tobytes() for img in images]
    return pa.StructArray.from_arrays(
        [pa.array(origins), pa.array([i.shape[0] for i in images], pa.int32()),
         pa.array([i.shape[1] for i in images], pa.int32()), pa.array([channels] * len(images), pa.int32()),
         pa.array([mode] * len(images), pa.int32()), pa.array(data, pa.binary())],
        names=["origin", "height", "width", "nChannels", "mode", "data"],
    )


def test_an_image_struct_of_bgr_bytes_reads_back_as_rgb():
    rgb = np.random.default_rng(0).integers(0, 256, size=(3, 2, 5, 3), dtype=np.uint8)
    struct = _image_struct(list(rgb), ["a", "b", "c"])  # BGR, as Spark's image source stores it
    column = Column("image", "image", "image", Field((2, 5, 3), "float32"), "x", 0)
    out = read_column(struct, column)
    assert out.dtype == np.float32 and out.shape == (3, 2, 5, 3)
    np.testing.assert_array_equal(out, rgb.astype(np.float32))
    np.testing.assert_array_equal(read_column(struct.slice(1, 2), column), rgb[1:].astype(np.float32))
    # BGRA -> RGBA; one channel as it is
    rgba = np.random.default_rng(1).integers(0, 256, size=(2, 3, 3, 4), dtype=np.uint8)
    bgra = _image_struct(list(rgba), ["a", "b"], 4, 24, order=[2, 1, 0, 3])
    np.testing.assert_array_equal(read_column(bgra, Column("i", "i", "image", Field((3, 3, 4), "uint8"))), rgba)
    gray = np.random.default_rng(2).integers(0, 256, size=(2, 3, 3, 1), dtype=np.uint8)
    np.testing.assert_array_equal(
        read_column(_image_struct(list(gray), ["a", "b"], 1, 0, order=slice(None)),
                    Column("i", "i", "image", Field((3, 3, 1), "uint8"))), gray)
    # a preprocessing function gets the struct's fields
    raw = raw_value(struct)
    assert raw["origin"].tolist() == ["a", "b", "c"] and raw["height"].tolist() == [2, 2, 2]
    assert raw["data"][0] == rgb[0][..., ::-1].tobytes()


def test_an_image_of_another_size_is_refused_naming_the_column_row_and_origin():
    images = [np.zeros((2, 5, 3), np.uint8), np.zeros((3, 5, 3), np.uint8)]
    column = Column("photo", "photo", "image", Field((2, 5, 3), "float32"), "x", 0)
    with pytest.raises(DataError, match=r"Column 'photo' holds an image of 3x5x3 \(height x width x channels; row 8 "
                                        r"of its partition, origin 'file:/b\.jpg'\); the model's input 0 takes 2x5x3"):
        stage_arrow(_image_struct(images, ["file:/a.jpg", "file:/b.jpg"]), column, first_row=7)


# ------------------------------------------------------------------ on a classic session


def test_the_mixins_image_schema_is_sparks(spark):
    from pyspark.ml.image import ImageSchema

    assert image_schema() == ImageSchema.imageSchema


class TestDataKinds(DataKindsMixin):
    """Ids, text, PNG bytes, weights, image structs and the estimator (Connect: test_connect.py)."""


def test_the_train_job_takes_preprocess_and_sample_weight_col(spark, tmp_path, monkeypatch):
    paths, pngs, labels, _ = digits_png()
    weights = np.where(labels % 2 == 0, 2.0, 0.5)
    data = str(tmp_path / "digits.parquet")
    spark.createDataFrame(pa.table({"path": paths, "content": pa.array(pngs, pa.binary()), "label": labels,
                                    "w": weights})).write.parquet(data)
    model_path = str(tmp_path / "cnn.keras")
    digits_cnn().save(model_path)
    out = tmp_path / "out"
    with shipped_by_value():  # executors cannot import tests/parity.py
        code, _ = run_job_in_process(
            spark, monkeypatch, "train", "--data", data, "--model", model_path, "--preprocess", "parity:decode_digits",
            "--features-col", "image", "--sample-weight-col", "w", "--class-weight", "0=3,1=1", "--num-workers", "2",
            "--batch-size", "16", "--averaging-frequency", "2", "--epochs", "1", "--seed", "5",
            "--no-check-executors", "--output-dir", str(out))
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["flags"]["preprocess"] == "parity:decode_digits" and metrics["flags"]["sample_weight_col"] == "w"
    assert len(metrics["history"]["loss"]) == 1 and np.isfinite(metrics["history"]["loss"][0])
    assert len(json.loads((out / "stats.json").read_text())) == 128 // (2 * 16) // 2  # rounds of one epoch
    staged = metrics["summary"]["staged_bytes"]
    own = (pa.array(pngs, pa.binary()).nbytes + pa.array(paths, pa.string()).nbytes + labels.nbytes
           + weights.nbytes)  # the columns as they came: bytes, the paths that name a failing row, labels, weights
    assert 0 < staged <= 1.05 * own

    # the same fit through the trainer: the job trained what the flags say
    model = digits_cnn()
    with shipped_by_value():
        from parity import decode_digits

        trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=2, seed=5,
                                            preprocess=decode_digits)
    trainer.fit(spark.read.parquet(data), features_col="image", sample_weight_col="w", class_weight={0: 3, 1: 1},
                epochs=1, verbose=0)
    import keras

    saved = keras.models.load_model(str(out / "model.keras"))
    for got, want in zip(saved.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------ a layer that cannot decode a row


def test_a_layer_that_cannot_decode_a_row_is_named_with_the_row_input_and_column():
    """A model that decodes PNG bytes itself (a string input): the failing example is found and named."""
    import keras
    import tensorflow as tf

    from sparkdl_avg.executor.worker import naming_failing_rows
    from sparkdl_avg.shared.data.staged_dataset import Examples

    class Decode(keras.layers.Layer):
        def call(self, x):
            return tf.map_fn(lambda b: tf.cast(tf.reshape(tf.io.decode_png(b[0], channels=1), (8, 8, 1)),
                                               tf.float32), x, fn_output_signature=tf.float32)

    inputs = keras.Input((1,), dtype="string")
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(Decode()(inputs))))
    _, pngs, labels, _ = digits_png()
    xs = np.array(list(pngs[:6]), dtype=object).reshape(-1, 1)
    xs[4, 0] = b"not a png"
    dataset = StagedDataset((), (Column("x0", "content", "text", Field((1,), "string"), "x", 0),), ("x0",),
                            (Field((1,), "string"),), (), ())
    with pytest.raises(DataError) as err:
        with naming_failing_rows(model, dataset, Examples([xs], []), np.arange(100, 106), "training data"):
            model(xs)
    message = str(err.value)
    assert message.startswith("The model failed on row 104 of the training data: its string input 0 (column "
                              "'content') holds b'not a png'"), message
    assert "InvalidArgumentError" in message and "\x1b[" not in message
    # a failure with nothing to do with the rows passes through as it was
    with pytest.raises(ZeroDivisionError):
        with naming_failing_rows(model, dataset, Examples([xs[:4]], []), np.arange(4), "training data"):
            1 / 0
