"""The cases of ``benchmarks/bad_inputs.py``: the session's fixtures and 221 bad inputs a fresh user might make.

Each :class:`Case` makes one mistake when run; ``names`` are the parameter, column, flag or value a clear
message names. The jobs' flags run ``jobs/train.py`` in this process (:func:`_run_job`).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, List, Sequence, Tuple


@dataclass
class Case:
    """One bad input: ``run()`` makes the mistake; ``names`` must all be in a clear message."""

    id: str
    group: str
    what: str
    run: Callable[[], Any]
    names: Tuple[str, ...]
    expect: str = "refuse"  # or "warn": a warning naming ``names`` is the right answer (Keras accepts it too)
    expectation: bool = True  # False: the cause is the user's own exception, whose message is theirs


# ------------------------------------------------------------------ fixtures


class Fixtures:
    """The session, models and data the cases share (built once)."""

    def __init__(self, spark):
        import numpy as np
        import pyarrow as pa

        self.spark = spark
        rng = np.random.default_rng(0)
        n = 64
        self.n = n
        self.x = rng.normal(size=(n, 4)).astype("float32")
        self.y = (np.arange(n) % 3).astype("int32")
        self.w = np.ones(n, dtype="float64")
        self.table = {"features": list(self.x), "label": self.y, "w": self.w}
        self.df = spark.createDataFrame(pa.table(self.table))
        self.pa = pa
        self.np = np

    def frame(self, **columns):
        """``df`` with columns replaced or added (Arrow arrays or lists)."""
        table = dict(self.table)
        for k, v in columns.items():
            if v is None:
                table.pop(k, None)
            else:
                table[k] = v
        return self.spark.createDataFrame(self.pa.table(table))

    @staticmethod
    def mlp(loss="sparse_categorical_crossentropy", outputs=3, inputs=4, activation="softmax"):
        import keras

        model = keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(outputs, activation=activation)])
        model.compile("sgd", loss)
        return model

    def trainer(self, model=None, **options):
        from sparkdl_avg import ParameterAveragingTrainer

        base = {"num_workers": 2, "batch_size": 4, "seed": 0}
        base.update(options)
        return ParameterAveragingTrainer(model if model is not None else self.mlp(), **base)

    def fit(self, data=None, model=None, options=None, **fit):
        trainer = self.trainer(model, **(options or {}))
        with trainer:
            fit.setdefault("verbose", 0)
            return trainer.fit(self.df if data is None else data, **fit)


# --------------------------------------------------------------------- the cases


def cases(f: Fixtures) -> List[Case]:
    import keras
    import numpy as np
    import pyarrow as pa

    import sparkdl_avg
    from sparkdl_avg import DiLoCo, SlowMo

    out: List[Case] = []

    def case(id, group, what, run, *names, expect="refuse", expectation=True):
        out.append(Case(id, group, what, run, tuple(names), expect, expectation))

    T = f.trainer
    # --- options of the trainer
    for name, value in [("batch_size", 0.5), ("batch_size", "32"), ("batch_size", True), ("batch_size", -8),
                        ("num_workers", 2.0), ("num_workers", 0), ("averaging_frequency", 0),
                        ("averaging_frequency", "epoch"), ("aggregation_depth", 0), ("aggregation_depth", 1.5),
                        ("optimizer_state", "averaged"), ("optimizer_state", None), ("seed", -5), ("seed", 1.5),
                        ("seed", "abc"), ("update_rule", "bmuf2"), ("update_rule", 5), ("on_nonfinite", "ignore"),
                        ("state_transport", "http"), ("aggregation", "tree"), ("synchronization", "asynchronous"),
                        ("staging_dir", 123), ("network_rate", "fast"), ("network_rate", -1),
                        ("update_compression", "fp8"), ("aggregation_shards", 0), ("slow_warning", "yes"),
                        ("check_data", "no"), ("staleness", -1), ("reproducible", "sometimes"),
                        ("block_momentum", 1.5), ("error_feedback", 2)]:
        case(f"option-{name}-{value!r}", "options", f"ParameterAveragingTrainer({name}={value!r})",
             lambda name=name, value=value: T(**{name: value}), name)
    case("option-min>max", "options", "min_workers=3, max_workers=2", lambda: T(min_workers=3, max_workers=2),
         "min_workers", "max_workers")
    case("option-min_workers-0", "options", "min_workers=0", lambda: T(min_workers=0), "min_workers")
    case("option-elastic-inf", "options", "elastic_timeout_s=inf with min_workers",
         lambda: T(min_workers=1, elastic_timeout_s=float("inf")), "elastic_timeout_s", "inf")
    case("option-elastic-negative", "options", "elastic_timeout_s=-1 with min_workers",
         lambda: T(min_workers=1, elastic_timeout_s=-1), "elastic_timeout_s")
    case("option-typo-batchsize", "options", "batchsize=32 (typo)", lambda: T(batchsize=32), "batchsize", "batch_size")
    case("option-keras-lr", "options", "learning_rate=0.1 (a compile setting)", lambda: T(learning_rate=0.1),
         "learning_rate")
    case("option-epochs-in-trainer", "options", "epochs=3 given to the trainer", lambda: T(epochs=3), "epochs")
    case("rule-diloco-lr-negative", "options", "DiLoCo(outer_lr=-0.5)", lambda: T(update_rule=DiLoCo(outer_lr=-0.5)),
         "outer_lr", "(0")
    case("rule-diloco-lr-zero", "options", "DiLoCo(outer_lr=0)", lambda: T(update_rule=DiLoCo(outer_lr=0)),
         "outer_lr", "(0")
    case("rule-diloco-momentum", "options", "DiLoCo(outer_momentum=1.5)",
         lambda: T(update_rule=DiLoCo(outer_momentum=1.5)), "outer_momentum")
    case("rule-slowmo-other-rules-name", "options", "SlowMo(block_momentum=0.9) (BlockMomentum's name)",
         lambda: T(update_rule=SlowMo(block_momentum=0.9)), "block_momentum")
    case("rule-slowmo-string", "options", "SlowMo(slow_momentum='0.9')",
         lambda: T(update_rule=SlowMo(slow_momentum="0.9")), "slow_momentum")
    case("rule-text-typo", "options", "update_rule='slowmo(momentum=0.9)'",
         lambda: T(update_rule="slowmo(momentum=0.9)"), "momentum")
    case("rule-class", "options", "update_rule=DiLoCo (the class)", lambda: T(update_rule=DiLoCo), "update_rule")

    # --- the model
    case("model-none", "model", "ParameterAveragingTrainer(None)", lambda: T(model=None) if False else
         sparkdl_avg.ParameterAveragingTrainer(None), "model")
    case("model-uncompiled", "model", "an uncompiled model",
         lambda: T(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])), "compile")
    case("model-class", "model", "keras.Sequential (the class)",
         lambda: sparkdl_avg.ParameterAveragingTrainer(keras.Sequential), "model")
    case("model-path", "model", "a path of no file", lambda: sparkdl_avg.ParameterAveragingTrainer("nope.keras"),
         "model")
    case("model-unknown-shape", "model", "a model of input (None,) (unknown width)",
         lambda: T(_compiled(keras.Sequential([keras.Input((None, 4)), keras.layers.GlobalAveragePooling1D(),
                                               keras.layers.Dense(3, activation="softmax")]))), "shape")

    # --- preprocess functions
    def seeds_misspelt(batch, sed=None):
        return {"features": np.stack(batch["features"])}

    def seeds_misspelt2(batch, random_seed=None):
        return {"features": np.stack(batch["features"])}

    def seeds_misspelt3(batch, seeds_=None, training=False):
        return {"features": np.stack(batch["features"])}

    def training_misspelt(batch, train=False):
        return {"features": np.stack(batch["features"])}

    def two_required(batch, other):
        return batch

    def returns_list(batch):
        return [batch["features"]]

    def returns_none(batch):
        return None

    def returns_wrong_key(batch):
        return {"img": np.stack(batch["features"])}

    def generator(batch):
        yield {"features": np.stack(batch["features"])}

    def raises(batch):
        raise KeyError("pixels")

    def wrong_width(batch):
        return {"features": np.stack(batch["features"])[:, :3], "label": batch["label"]}

    def returns_strings(batch):
        return {"features": np.array([["a"] * 4] * len(batch["label"]), dtype=object), "label": batch["label"]}

    def returns_nan(batch):
        return {"features": np.full((len(batch["label"]), 4), np.nan, "float32"), "label": batch["label"]}

    def ragged(batch):
        return {"features": [np.zeros(i % 3 + 1) for i in range(len(batch["label"]))], "label": batch["label"]}

    def scalar(batch):
        return {"features": 1.0, "label": batch["label"]}

    def wrong_rows(batch):
        return {"features": np.zeros((1, 4), "float32"), "label": batch["label"]}

    def bad_labels(batch):
        return {"features": np.stack(batch["features"]), "label": np.full(len(batch["label"]), 7)}

    def only_when_training(batch, training=False):
        return {"image": np.stack(batch["features"])} if training else {}

    for id, fn, names, expect in [
            ("pre-not-callable", 5, ("preprocess",), "refuse"),
            ("pre-zero-params", lambda: None, ("preprocess", "parameter"), "refuse"),
            ("pre-two-required", two_required, ("two_required", "other"), "refuse"),
            ("pre-generator", generator, ("generator", "dict"), "refuse"),
            ("pre-seed-sed", seeds_misspelt, ("sed", "seeds"), "warn"),
            ("pre-seed-random_seed", seeds_misspelt2, ("random_seed", "seeds"), "warn"),
            ("pre-seed-seeds_", seeds_misspelt3, ("seeds_", "seeds"), "warn"),
            ("pre-train", training_misspelt, ("train", "training"), "warn")]:
        case(id, "preprocess", f"preprocess={getattr(fn, '__name__', fn)!r}",
             lambda fn=fn: f.fit(options={"preprocess": fn}), *names, expect=expect)
    for id, fn, names in [
            ("pre-returns-list", returns_list, ("returns_list", "dict")),
            ("pre-returns-none", returns_none, ("returns_none", "dict")),
            ("pre-wrong-key", returns_wrong_key, ("returns_wrong_key", "image")),
            ("pre-raises", raises, ("raises", "pixels")),
            ("pre-wrong-width", wrong_width, ("wrong_width", "features")),
            ("pre-strings", returns_strings, ("returns_strings", "features")),
            ("pre-nan", returns_nan, ("returns_nan", "NaN")),
            ("pre-ragged", ragged, ("ragged", "features")),
            ("pre-scalar", scalar, ("scalar", "features")),
            ("pre-wrong-rows", wrong_rows, ("wrong_rows", "features")),
            ("pre-label-out-of-range", bad_labels, ("bad_labels", "7")),
            ("pre-eval-only-key", only_when_training, ("only_when_training", "image"))]:
        kwargs = {"features_col": "image"} if id in ("pre-wrong-key", "pre-eval-only-key") else {}
        if id == "pre-eval-only-key":
            kwargs["validation_data"] = f.df
        case(id, "preprocess", f"a preprocess that {id[4:]}",
             lambda fn=fn, kwargs=kwargs: f.fit(options={"preprocess": fn}, **kwargs), *names,
             expectation=id != "pre-raises")

    # --- fit's arguments
    for name, value in [("epochs", 0), ("epochs", -1), ("epochs", 2.5), ("epochs", "3"), ("shuffle", "yes"),
                        ("verbose", 5), ("verbose", "loud"), ("checkpoint_every", "weekly"), ("checkpoint_every", 0),
                        ("resume", "yes"), ("features_col", 5), ("features_col", []), ("label_col", 3.0),
                        ("sample_weight_col", 1), ("class_weight", {0: float("inf")}), ("class_weight", {1: 1e30}),
                        ("class_weight", {0: -1.0}), ("class_weight", {"0": 1.0}), ("class_weight", {0: "1"}),
                        ("class_weight", [1.0, 5.0]), ("class_weight", {}), ("class_weight", {12: 1.0}),
                        ("class_weight", {0: float("nan")}), ("callbacks", "early_stopping"),
                        ("callbacks", keras.callbacks.EarlyStopping)]:
        shown = value.__name__ if isinstance(value, type) else value
        case(f"fit-{name}-{shown!r}", "fit", f"fit({name}={shown!r})",
             lambda name=name, value=value: f.fit(**{name: value}), name)
    case("fit-initial>epochs", "fit", "fit(initial_epoch=5, epochs=3)", lambda: f.fit(initial_epoch=5, epochs=3),
         "initial_epoch", "epochs")
    case("fit-typo-kwarg", "fit", "fit(epoch=3) (typo)", lambda: f.fit(epoch=3), "epoch")
    case("fit-batch_size-kwarg", "fit", "fit(batch_size=8) (Keras' spelling, a trainer option here)",
         lambda: f.fit(batch_size=8), "batch_size")
    case("fit-validation-path", "fit", "validation_data='val.parquet'", lambda: f.fit(validation_data="val.parquet"),
         "validation", "str")
    case("fit-validation-1-tuple", "fit", "validation_data=(x,)", lambda: f.fit(validation_data=(f.x,)),
         "validation", "tuple")
    case("fit-validation-no-label", "fit", "validation_data without the label column",
         lambda: f.fit(validation_data=f.df.drop("label")), "label")
    case("fit-validation-split", "fit", "validation_split=0.2 (Keras' argument)", lambda: f.fit(validation_split=0.2),
         "validation_split")
    case("fit-checkpoint-resume-nodir", "fit", "resume=True without checkpoint_dir", lambda: f.fit(resume=True),
         "resume", "checkpoint_dir")

    # --- data containers and arrays
    x, y = f.x, f.y
    case("data-none", "data", "fit(None)", lambda: f.trainer().fit(None), "data")
    case("data-list-rows", "data", "a list of (x, y) rows", lambda: f.fit(list(zip(x, y))), "data")
    case("data-pandas", "data", "a pandas DataFrame",
         lambda: f.fit(__import__("pandas").DataFrame({"features": list(x), "label": y})), "DataFrame")
    case("data-1-tuple", "data", "(x,)", lambda: f.fit((x,)), "data")
    case("data-4-tuple", "data", "(x, y, w, extra)", lambda: f.fit((x, y, f.w, f.w)), "data")
    case("data-length", "data", "x of 64 rows, y of 60", lambda: f.fit((x, y[:60])), "64", "60")
    case("data-width", "data", "x of width 5 for an input of 4", lambda: f.fit((np.zeros((64, 5), "float32"), y)),
         "5", "4")
    case("data-3d", "data", "x of shape (64, 2, 3)", lambda: f.fit((np.zeros((64, 2, 3), "float32"), y)), "(4,)")
    case("data-x-nan", "data", "x with a NaN", lambda: f.fit((_with(x, (3, 1), np.nan), y)), "NaN", "3")
    case("data-x-inf", "data", "x with an inf", lambda: f.fit((_with(x, (5, 0), np.inf), y)), "inf", "5")
    case("data-y-class-12", "data", "label 12 for 3 classes", lambda: f.fit((x, _with(y, (2,), 12))), "12", "3")
    case("data-y-negative", "data", "label -1", lambda: f.fit((x, _with(y, (2,), -1))), "-1")
    case("data-y-strings", "data", "labels 'a', 'b'", lambda: f.fit((x, np.array(["a", "b"] * 32))), "y", "numeric")
    case("data-x-object", "data", "x of dtype object (lists)", lambda: f.fit((np.array([list(r) for r in x] + [[1]],
                                                                                    dtype=object)[:64], y)), "x")
    case("data-x-complex", "data", "x of complex numbers", lambda: f.fit((x.astype("complex64"), y)), "complex")
    case("data-y-onehot-sparse", "data", "one-hot y for a sparse loss", lambda: f.fit((x, np.eye(3)[y])), "label")
    case("data-y-float-frac", "data", "labels 0.5 for a sparse loss", lambda: f.fit((x, y + 0.5)), "0.5")
    case("data-w-length", "data", "sample weights of 10 rows", lambda: f.fit((x, y, f.w[:10])), "10")
    case("data-w-2d", "data", "sample weights of shape (64, 2)", lambda: f.fit((x, y, np.ones((64, 2)))), "weight")
    case("data-w-negative", "data", "a negative sample weight", lambda: f.fit((x, y, _with(f.w, (4,), -1.0))),
         "-1", "weight")
    case("data-w-nan", "data", "a NaN sample weight", lambda: f.fit((x, y, _with(f.w, (4,), np.nan))), "NaN", "weight")
    case("data-w-zero", "data", "all-zero sample weights (numpy)", lambda: f.fit((x, y, np.zeros(64))), "weight",
         "weight 0")
    case("data-empty", "data", "0 rows", lambda: f.fit((x[:0], y[:0])), "0")
    case("data-too-few", "data", "5 rows for 2 workers × batch 4", lambda: f.fit((x[:5], y[:5])), "5")
    case("data-x-int-strings", "data", "x as strings of numbers", lambda: f.fit((x.astype(str), y)), "x")

    # --- DataFrame columns
    fr = f.frame
    case("df-features-missing", "columns", "features_col='featurez'", lambda: f.fit(features_col="featurez"),
         "featurez")
    case("df-label-missing", "columns", "label_col='lbl'", lambda: f.fit(label_col="lbl"), "lbl")
    case("df-weight-missing", "columns", "sample_weight_col='weight'", lambda: f.fit(sample_weight_col="weight"),
         "weight")
    case("df-features-twice", "columns", "features_col=['features', 'features'] for one input",
         lambda: f.fit(features_col=["features", "features"]), "features")
    case("df-label-twice", "columns", "label_col=['label', 'label'] for one output",
         lambda: f.fit(label_col=["label", "label"]), "label")
    case("df-features-string", "columns", "a string features column",
         lambda: f.fit(fr(features=["1,2,3,4"] * 64)), "features", "string")
    case("df-features-array-string", "columns", "array<string> features",
         lambda: f.fit(fr(features=[["1", "2", "3", "4"]] * 64)), "features")
    case("df-features-null-values", "columns", "an array with a null inside",
         lambda: f.fit(fr(features=pa.array([[1.0, None, 2.0, 3.0]] + [list(r) for r in x[1:]]))), "features", "null")
    case("df-features-null-row", "columns", "a null features row",
         lambda: f.fit(fr(features=pa.array([None] + [list(r) for r in x[1:]], pa.list_(pa.float32())))),
         "features", "null")
    case("df-label-null", "columns", "a null label", lambda: f.fit(fr(label=pa.array([None] + list(y[1:]), pa.int32()))),
         "label", "null")
    case("df-label-string", "columns", "labels 'cat'/'dog'", lambda: f.fit(fr(label=["cat", "dog"] * 32)), "label")
    case("df-label-frac", "columns", "label 1.5 for a sparse loss", lambda: f.fit(fr(label=[1.5] * 64)), "label", "1.5")
    case("df-label-12", "columns", "label 12 for 3 classes", lambda: f.fit(fr(label=[12] * 64)), "label", "12")
    case("df-ragged", "columns", "arrays of 3 and 4 values",
         lambda: f.fit(fr(features=[list(r)[: 3 + i % 2] for i, r in enumerate(x)])), "features", "3")
    case("df-vector-size", "columns", "a Vector of 6 values", lambda: f.fit(_vectors(f, 6)), "features", "6")
    case("df-label-array", "columns", "an array label for a sparse loss",
         lambda: f.fit(fr(label=[[0.0, 1.0, 0.0]] * 64)), "label")
    case("df-empty", "columns", "an empty DataFrame", lambda: f.fit(f.df.limit(0)), "empty")
    case("df-features-map", "columns", "a map column", lambda: f.fit(fr(features=[{"a": 1.0}] * 64)), "features")
    case("df-features-nested-wrong", "columns", "array<array<float>> of 2×3 for an input of 4",
         lambda: f.fit(fr(features=[[[1.0] * 3] * 2] * 64)), "features", "array<array")
    case("df-features-nan", "columns", "a NaN in features", lambda: f.fit(fr(features=[list(_with(x, (2, 0), np.nan)[i])
                                                                                  for i in range(64)])),
         "features", "NaN")
    case("df-features-inf", "columns", "an inf in features",
         lambda: f.fit(fr(features=[list(_with(x, (2, 0), np.inf)[i]) for i in range(64)])), "features", "inf")
    case("df-weight-string", "columns", "a string weight column", lambda: f.fit(fr(w=["1"] * 64), sample_weight_col="w"),
         "w")
    case("df-weight-negative", "columns", "a negative weight", lambda: f.fit(fr(w=[-1.0] + [1.0] * 63),
                                                                            sample_weight_col="w"), "w", "-1")
    case("df-weight-nan", "columns", "a NaN weight", lambda: f.fit(fr(w=[float("nan")] + [1.0] * 63),
                                                                  sample_weight_col="w"), "w", "NaN")
    case("df-weight-null", "columns", "a null weight", lambda: f.fit(fr(w=pa.array([None] + [1.0] * 63)),
                                                                    sample_weight_col="w"), "w", "null")
    case("df-weight-zero", "columns", "all-zero weights", lambda: f.fit(fr(w=[0.0] * 64), sample_weight_col="w"),
         "'w'", "weight 0")
    case("df-weight-array", "columns", "an array weight column", lambda: f.fit(fr(w=[[1.0]] * 64),
                                                                              sample_weight_col="w"), "w")
    case("df-rdd-triples", "columns", "an RDD of (x, y, w) triples",
         lambda: f.fit(f.spark.sparkContext.parallelize([(list(map(float, r)), int(l), 1.0) for r, l in zip(x, y)])),
         "RDD")
    case("df-rdd-wrong-width", "columns", "an RDD of x with 2 values",
         lambda: f.fit(f.spark.sparkContext.parallelize([([1.0, 2.0], 0)] * 64)), "2", "4")

    # --- ids
    def id_model(dtype="int64", dim=100):
        ids_in = keras.Input((1,), dtype=dtype)
        out = keras.layers.Dense(3, activation="softmax")(keras.layers.Flatten()(keras.layers.Embedding(dim, 4)(ids_in)))
        return _compiled(keras.Model(ids_in, out))

    ids = lambda values, t=pa.int64(): fr(features=None, item=pa.array(values, t))  # noqa: E731
    case("ids-float32-big", "ids", "ids above 2^24 into a float32 input",
         lambda: f.fit(ids([2**24 + 1] * 64), model=_float_model(1), features_col="item"), "item", str(2**24 + 1))
    case("ids-negative", "ids", "a negative id into an Embedding",
         lambda: f.fit(ids([-3] + [1] * 63), model=id_model(), features_col="item"), "item", "-3", expect="warn")
    case("ids-too-large", "ids", "id 1000 into Embedding(100)",
         lambda: f.fit(ids([1000] + [1] * 63), model=id_model(), features_col="item"), "item", "1000")
    case("ids-strings", "ids", "string ids into an int64 input",
         lambda: f.fit(ids(["a1"] * 64, pa.string()), model=id_model(), features_col="item"), "item")
    case("ids-fraction", "ids", "id 1.5 into an int64 input",
         lambda: f.fit(ids([1.5] * 64, pa.float64()), model=id_model(), features_col="item"), "item", "1.5")
    case("ids-null", "ids", "a null id", lambda: f.fit(ids([None] + [1] * 63), model=id_model(), features_col="item"),
         "item", "null")

    # --- images
    def image_model(h=4, w=4, c=3):
        return _compiled(keras.Sequential([keras.Input((h, w, c)), keras.layers.Flatten(),
                                           keras.layers.Dense(3, activation="softmax")]))

    def image_frame(h, w, c, n=64, mode=16):
        struct = {"origin": "file:/img.png", "height": h, "width": w, "nChannels": c, "mode": mode,
                  "data": bytes(h * w * c)}
        return fr(features=None, image=[struct] * n)

    case("image-wrong-size", "images", "8x8 images for a 4x4 input",
         lambda: f.fit(image_frame(8, 8, 3), model=image_model(), features_col="image"), "image", "8x8")
    case("image-wrong-channels", "images", "1-channel images for 3 channels",
         lambda: f.fit(image_frame(4, 4, 1, mode=0), model=image_model(), features_col="image"), "image", "channel")
    case("image-binary-direct", "images", "PNG bytes fed to a float input without preprocess",
         lambda: f.fit(fr(features=None, content=[b"\x89PNG...."] * 64), model=image_model(), features_col="content"),
         "content")
    case("image-not-png", "images", "decode_images of bytes that are no image", lambda: f.fit(
        fr(features=None, content=[b"hello"] * 64), model=image_model(),
        options={"preprocess": _decoder}, features_col="image"), "_decoder", "decode")
    case("image-struct-for-flat", "images", "an image struct column for a (4,) input",
         lambda: f.fit(image_frame(2, 2, 1, mode=0), features_col="image"), "image")

    # --- text
    def text_model():
        text_in = keras.Input((1,), dtype="string")
        vec = keras.layers.TextVectorization(max_tokens=20, output_sequence_length=4)
        vec.adapt(["good movie", "bad film"])
        out = keras.layers.Dense(3, activation="softmax")(keras.layers.Flatten()(keras.layers.Embedding(20, 4)(vec(text_in))))
        return _compiled(keras.Model(text_in, out))

    case("text-into-float", "text", "a string column into a float input",
         lambda: f.fit(fr(features=None, text=["good movie"] * 64), features_col="text"), "text")
    case("text-numbers-into-string", "text", "a float column into a string input",
         lambda: f.fit(fr(features=None, text=[1.0] * 64), model=text_model(), features_col="text"), "text")
    case("text-null", "text", "a null text", lambda: f.fit(fr(features=None, text=[None] + ["good"] * 63),
                                                          model=text_model(), features_col="text"), "text", "null")
    case("text-array-of-strings", "text", "array<string> into a (1,) string input",
         lambda: f.fit(fr(features=None, text=[["good", "movie"]] * 64), model=text_model(), features_col="text"),
         "text")

    # --- evaluate and predict
    def fitted():
        t = f.trainer()
        return t

    case("eval-batch-0", "evaluate", "evaluate(batch_size=0)", lambda: fitted().evaluate(f.df, batch_size=0),
         "batch_size")
    case("eval-label-missing", "evaluate", "evaluate without the label column",
         lambda: fitted().evaluate(f.df.drop("label")), "label")
    case("predict-numpy", "predict", "predict(x) on numpy arrays", lambda: fitted().predict(x), "DataFrame")
    case("predict-features-missing", "predict", "predict with features_col='feats'",
         lambda: fitted().predict(f.df, features_col="feats"), "feats")
    case("predict-batch-0", "predict", "predict(batch_size=0)", lambda: fitted().predict(f.df, batch_size=0),
         "batch_size")
    case("predict-col-clash", "predict", "prediction_col='label' (an existing column)",
         lambda: fitted().predict(f.df, prediction_col="features").collect(), "features")

    # --- the estimator
    from sparkdl_avg.ml import KerasAveragingEstimator

    case("est-batch-string", "estimator", "batchSize='big'",
         lambda: KerasAveragingEstimator(kerasModel=f.mlp(), batchSize="big"), "batchSize")
    case("est-snake", "estimator", "batch_size=8 (the trainer's spelling)",
         lambda: KerasAveragingEstimator(kerasModel=f.mlp(), batch_size=8), "batch_size", "batchSize")
    case("est-model-string", "estimator", "kerasModel='nope.keras'",
         lambda: KerasAveragingEstimator(kerasModel="nope.keras").fit(f.df), "kerasModel")
    case("est-class-weight-inf", "estimator", "classWeight={0: inf}",
         lambda: KerasAveragingEstimator(kerasModel=f.mlp(), numWorkers=2, batchSize=4,
                                         classWeight={0: float("inf")}).fit(f.df), "classWeight")

    # --- the train job's flags
    base = ["--data", f.parquet, "--model", f.model_path, "--output-dir", f.output_dir, "--epochs", "1",
            "--num-workers", "2", "--batch-size", "4", "--no-check-executors"]

    def job(*flags, replace=()):
        argv = [a for a in base]
        for flag in replace:
            i = argv.index(flag)
            del argv[i:i + 2]
        return _run_job(argv + list(flags))

    for flags, names in [
            (("--batch-size", "abc"), ("--batch-size", "abc")), (("--batch-size", "0"), ("--batch-size",)),
            (("--epochs", "-1"), ("--epochs",)), (("--class-weight", "0:1,1:5"), ("--class-weight", "0=1")),
            (("--class-weight", "0=inf"), ("--class-weight", "inf")),
            (("--class-weight", "0=1e30"), ("--class-weight", "1e+30")),
            (("--num-workers", "two"), ("--num-workers", "two")), (("--optimizer-state", "foo"), ("--optimizer-state",)),
            (("--averaging-frequency", "0"), ("--averaging-frequency",)), (("--seed", "-1"), ("--seed",)),
            (("--update-rule", "nope"), ("--update-rule", "nope")), (("--checkpoint-every", "soon"), ("--checkpoint-every",)),
            (("--min-workers", "1", "--elastic-timeout-s", "inf"), ("--elastic-timeout-s",)),
            (("--min-workers", "0"), ("--min-workers",)), (("--on-nonfinite", "ignore"), ("--on-nonfinite", "ignore")),
            (("--state-transport", "http"), ("--state-transport", "http")), (("--verbose", "loud"), ("--verbose",)),
            (("--unknown-flag",), ("--unknown-flag",)), (("--learning-rate", "0.1"), ("--learning-rate",)),
            (("--batchsize", "8"), ("--batchsize", "--batch-size")), (("--validation-split", "1.5"), ("--validation-split",)),
            (("--validation-split", "0.2", "--validation-data", f.parquet), ("--validation-data", "--validation-split")),
            (("--read-option", "badpair"), ("--read-option",)), (("--preprocess", "nomodule:f"), ("nomodule",)),
            (("--features-col", ","), ("column",)), (("--resume",), ("--resume", "--checkpoint-dir")),
            (("--sample-weight-col", "wt"), ("wt",)), (("--label-col", "lbl"), ("lbl",)),
            (("--features-col", "feats"), ("feats",)), (("--format", "csvv"), ("csvv",)),
            (("--staleness", "-2"), ("--staleness",)), (("--update-compression", "fp8"), ("--update-compression", "fp8"))]:
        case("job" + "".join(" " + a for a in flags), "job flags", "train.py " + " ".join(flags),
             lambda flags=flags: job(*flags), *names)
    case("job --model-builder nomodule:fn", "job flags", "--model-builder of a missing module",
         lambda: job("--model-builder", "nomodule:build", replace=("--model",)), "nomodule")
    case("job --model-builder os:nope", "job flags", "--model-builder of a missing function",
         lambda: job("--model-builder", "os:nope", replace=("--model",)), "nope")
    case("job --model-builder nocolon", "job flags", "--model-builder without a colon",
         lambda: job("--model-builder", "nocolon", replace=("--model",)), "MODULE:FUNCTION")
    case("job --model missing", "job flags", "--model of no file",
         lambda: job("--model", "/nonexistent/m.keras", replace=("--model",)), "/nonexistent/m.keras")
    case("job --data missing", "job flags", "--data of no file",
         lambda: job("--data", "/nonexistent/d.parquet", replace=("--data",)), "/nonexistent/d.parquet")
    case("job no --output-dir", "job flags", "no --output-dir",
         lambda: job(replace=("--output-dir",)), "--output-dir")
    return out


def _compiled(model):
    model.compile("sgd", "sparse_categorical_crossentropy")
    return model


def _float_model(width):
    import keras

    return _compiled(keras.Sequential([keras.Input((width,)), keras.layers.Dense(3, activation="softmax")]))


def _with(array, index, value):
    out = array.astype("float64").copy() if value is not None and isinstance(value, float) else array.copy()
    out[index] = value
    return out


def _vectors(f, width):
    from pyspark.ml.linalg import Vectors

    return f.spark.createDataFrame([(Vectors.dense([0.5] * width), 1) for _ in range(64)], ["features", "label"])


def _decoder(batch):
    import sparkdl_avg

    return {"image": sparkdl_avg.decode_images(batch["content"], channels=3).astype("float32")}


# --------------------------------------------------------------- the train job


def _run_job(argv: Sequence[str]) -> Tuple[int, str]:
    """``jobs/train.py``'s ``cli.run(main, argv)`` in this process: its exit status and stderr.

    The job's own session is this process's (``getOrCreate``); its ``stop()`` is kept from stopping it.
    """
    import sparkdl_avg
    from sparkdl_avg.driver.api import cli

    jobs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(sparkdl_avg.__file__))), "jobs")
    if jobs not in sys.path:
        sys.path.insert(0, jobs)  # the jobs/ beside the package under test
    import train

    stderr = io.StringIO()
    real = cli.spark_session

    def shared_session(name):
        spark = real(name)
        return _NoStop(spark)

    cli.spark_session = shared_session
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = cli.run(train.main, list(argv))
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 1
    finally:
        cli.spark_session = real
    return rc, stderr.getvalue()


class _NoStop:
    def __init__(self, spark):
        self._spark = spark

    def stop(self):
        pass

    def __getattr__(self, name):
        return getattr(self._spark, name)
