"""Prints a SHA-256 digest of the weights a fixed fit on local[2] produces (refactors must not change it).

Run: PYSPARK_PYTHON=.venv/bin/python .venv/bin/python scripts/weights_digest.py [--state-transport spark|files]
[--synchronization stale]
Two fits (plain averaging with Adam, then BMUF with SGD) of a small MLP on scikit-learn's digits,
float32, seed 0, 2 workers; the digest covers every weight and optimizer variable after both.
``--synchronization stale`` runs them stale-synchronously with ``staleness=1`` and ``reproducible=True``
(updates applied in chunk order: deterministic, so the digest is too).
"""

import argparse
import hashlib
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--state-transport", default="auto")
    p.add_argument("--synchronization", default="sync", choices=["sync", "stale"])
    args = p.parse_args()
    import keras
    import numpy as np
    from pyspark.sql import SparkSession
    from sklearn.datasets import load_digits

    from sparkdl_avg import ParameterAveragingTrainer

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    df = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x, y)], "features array<float>, label int")
    digest = hashlib.sha256()
    stale = dict(synchronization="stale", staleness=1, reproducible=True) if args.synchronization == "stale" else {}
    for rule, opt in (("average", "adam"), ("bmuf", "sgd")):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dropout(0.1), keras.layers.Dense(10, activation="softmax")])
        model.compile(opt, "sparse_categorical_crossentropy", metrics=["accuracy"])
        trainer = ParameterAveragingTrainer(model, num_workers=2, batch_size=16, averaging_frequency=4,
                                            update_rule=rule, seed=0, state_transport=args.state_transport, **stale)
        with trainer:
            history = trainer.fit(df, epochs=2, verbose=0)
        for w in model.get_weights() + [np.asarray(v) for v in model.optimizer.variables]:
            digest.update(np.ascontiguousarray(w).tobytes())
        print(rule, opt, "loss", history.history["loss"])
    print("digest", args.state_transport, args.synchronization, digest.hexdigest())
    spark.stop()


if __name__ == "__main__":
    main()
