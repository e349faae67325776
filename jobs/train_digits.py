"""Main job: train a small CNN on scikit-learn's bundled digits by parameter averaging.

Run with spark-submit (``make train`` does)::

    spark-submit --master 'local[2]' jobs/train_digits.py --output-dir output/digits

Loads the 1,797 8×8 digit images that ship with scikit-learn (no download),
holds out 20% for testing, trains with :class:`ParameterAveragingTrainer` on
a Spark DataFrame, prints per-epoch progress and the held-out accuracy, and
writes ``model.keras``, ``stats.json``, ``metrics.json`` and the training
report ``report.html`` to the output directory.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv=None) -> argparse.Namespace:
    from sparkdl_avg.cli import ArgumentParser  # a bad flag: one line, not the usage

    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", default="output/digits", help="where model.keras, stats.json and metrics.json go")
    p.add_argument("--epochs", type=int, default=20, help="passes over the training data (default 20)")
    p.add_argument("--num-workers", type=int, default=None, help="replicas per round (default: Spark's defaultParallelism)")
    p.add_argument("--batch-size", type=int, default=32, help="examples per minibatch per worker (default 32)")
    p.add_argument("--averaging-frequency", type=int, default=8, help="minibatches per worker between averagings (default 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split, the initial weights and the data order (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing model in --output-dir")
    return p.parse_args(argv)


def build_model(seed: int):
    """A ~10k-parameter CNN for 8×8×1 images and 10 classes."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="digits_cnn",
    )
    model.compile(
        optimizer=keras.optimizers.Adam(2e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    log = logging.getLogger("train_digits")

    model_path = os.path.join(args.output_dir, "model.keras")
    if os.path.exists(model_path) and not args.overwrite:
        print(f"error: {model_path} already exists; pass --overwrite to replace it.", file=sys.stderr)
        return 2

    import pyarrow as pa
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from sparkdl_avg import ParameterAveragingTrainer
    from sparkdl_avg.cli import spark_session
    from sparkdl_avg.shared.files.fs import replace_atomically

    # Warm executors: their workers import TensorFlow while this driver loads the data.
    spark = spark_session("sparkdl_avg train_digits")
    spark.sparkContext.setLogLevel("WARN")
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.2, random_state=args.seed, stratify=digits.target
    )
    # From Arrow tables, not lists of rows: a DataFrame made from Python rows runs a Python step of its own
    # under the staging job, which leaves executors twice the Python workers and each replica built twice
    # (README, "What fit accepts").
    train_df = spark.createDataFrame(pa.table({"features": list(x_train), "label": y_train.astype("int32")}))
    test_df = spark.createDataFrame(pa.table({"features": list(x_test), "label": y_test.astype("int32")}))
    log.info("training on %d digits, testing on %d", len(x_train), len(x_test))

    model = build_model(args.seed)
    with ParameterAveragingTrainer(
        model,
        num_workers=args.num_workers,
        batch_size=args.batch_size,
        averaging_frequency=args.averaging_frequency,
        seed=args.seed,
        # A demo of the mechanics: 1,437 digits train faster in one process (sparkdl_avg.advise says so),
        # and fit would warn that it is slower than one process.
        slow_warning=False,
    ) as trainer:
        history = trainer.fit(train_df, epochs=args.epochs, validation_data=test_df, verbose=2)
        test = trainer.evaluate(test_df, return_dict=True)
        summary = trainer.stats.summary()
        os.makedirs(args.output_dir, exist_ok=True)
        trainer.write_report(os.path.join(args.output_dir, "report.html"))

    print(f"Held-out test accuracy: {test['accuracy']:.4f} (loss {test['loss']:.4f})")
    print(
        f"Rounds: {summary['rounds']}, compute share {summary['compute_share']:.0%}, "
        f"median per-round overhead {summary['overhead_s_median'] * 1000:.0f} ms, "
        f"replicas built: {summary['replicas_built']}"
    )

    # An existing model is only ever replaced by a complete one.
    with replace_atomically(model_path, suffix=".keras") as tmp_path:
        model.save(tmp_path)
    trainer.stats.to_json(os.path.join(args.output_dir, "stats.json"))
    with open(os.path.join(args.output_dir, "metrics.json"), "w") as f:
        json.dump({"test": test, "history": history.history, "summary": summary}, f, indent=1)
    print(f"Saved {model_path}")
    spark.stop()
    return 0


if __name__ == "__main__":
    from sparkdl_avg.cli import run

    sys.exit(run(main))
