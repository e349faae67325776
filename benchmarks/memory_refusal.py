"""How fast, and at what memory, a fit too large for this machine is refused (docs/benchmarks/memory.md).

The user's steps, timed as a user sees them: README's session (``local[2]``, ``RECOMMENDED_CONF``), a model with an
``Embedding(rows, dim)`` table and Adam built (the user's own memory), then ``fit`` on a few rows, which must raise the
memory refusal. Prints the seconds from ``fit`` to the refusal and the process tree's peak RSS (this process, the
JVM and its Python workers, sampled every 20 ms) above its level just before ``fit``, and after the model was built.

    PYSPARK_PYTHON=$PWD/.venv/bin/python .venv/bin/python benchmarks/memory_refusal.py --rows 33554432 --dim 32
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import psutil


def tree_rss() -> int:
    me = psutil.Process()
    total = 0
    for p in [me] + me.children(recursive=True):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2 ** 25)
    parser.add_argument("--dim", type=int, default=32)
    args = parser.parse_args()

    import numpy as np
    from pyspark.sql import SparkSession

    import sparkdl_avg
    import keras

    spark = SparkSession.builder.master("local[2]").config(map=sparkdl_avg.RECOMMENDED_CONF).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    start = tree_rss()
    available = psutil.virtual_memory().available
    inputs = keras.Input((1,), dtype="int32")
    hidden = keras.layers.Flatten()(keras.layers.Embedding(args.rows, args.dim)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(keras.optimizers.Adam(), "mse")
    state = 3 * args.rows * args.dim * 4  # the table and Adam's two moments, float32
    built = tree_rss()
    peak = [built]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss())
            time.sleep(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    x = np.random.default_rng(0).integers(0, args.rows, size=(64, 1)).astype("int32")
    trainer = sparkdl_avg.ParameterAveragingTrainer(model, num_workers=2, batch_size=8)
    t0 = time.perf_counter()
    try:
        trainer.fit((x, np.zeros(64, "float32")), epochs=1, verbose=0)
        refused, message = False, ""
    except sparkdl_avg.ConfigurationError as e:
        refused, message = True, str(e)
    seconds = time.perf_counter() - t0
    done.set()
    thread.join()
    print(json.dumps({
        "rows": args.rows, "dim": args.dim, "state_gb": round(state / 1e9, 2),
        "available_before_gb": round(available / 1e9, 2), "model_gb": round((built - start) / 1e9, 2),
        "refused": refused, "fit_to_refusal_s": round(seconds, 2),
        "peak_above_before_fit_gb": round((peak[0] - built) / 1e9, 3), "message": message,
    }, indent=1))
    spark.stop()
    sys.exit(0 if refused else 1)


if __name__ == "__main__":
    main()
