"""Cold start: how much slower is a session's first fit than a warm one, after an idle gap, and the first predict?

Issue 16's target: a first fit ≤ 1.5 s slower than a warm one, likewise a fit
after 2 idle minutes and the first predict after a fit. One fresh ``local[2]``
session (fresh Python workers), scikit-learn's digits as numpy arrays, the
suite's small CNN, 3 epochs, 2 workers, k=8. Arms, in order:

1. ``cold``: the session's first fit (Python workers start, TensorFlow
   imports, replicas build);
2. ``warm``: the same fit again (new trainer and model, same architecture);
3. ``warm2``: once more (a second warm sample);
4. ``idle``: after ``--idle`` seconds (default 130) without jobs (PySpark
   drops Python workers idle for a minute);
5. ``predict_first`` / ``predict_again``: ``trainer.predict(df)`` collected,
   right after the last fit, then again.

Also the first round's wall time of each fit. Prints a table and writes JSON
(``--out``). Run: ``PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/cold_start.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--idle", type=float, default=130.0, help="seconds without jobs before the 'idle' arm")
    p.add_argument("--out", default="benchmarks/results/cold_start.json")
    p.add_argument("--daemon", default=None, help="spark.python.daemon.module (default: PySpark's own)")
    p.add_argument("--warm-up-gap", type=float, default=None,
                   help="call sparkdl_avg.warm_up(spark) right after creating the session and wait this many "
                        "seconds (a notebook's next cell) before the first fit; default: no explicit warm-up")
    args = p.parse_args()

    import keras
    import numpy as np
    from pyspark.sql import SparkSession
    from sklearn.datasets import load_digits

    from sparkdl_avg import ParameterAveragingTrainer

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false"))
    if args.daemon:
        spark = spark.config("spark.python.daemon.module", args.daemon)
    spark = spark.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if args.warm_up_gap is not None:
        import sparkdl_avg

        sparkdl_avg.warm_up(spark)
        time.sleep(args.warm_up_gap)
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32").reshape(-1, 8, 8, 1)
    y = y.astype("int64")

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                              keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
        m.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
        return m

    results = {}
    trainer = None

    def fit(name):
        nonlocal trainer
        if trainer is not None:
            trainer.close()
        trainer = ParameterAveragingTrainer(model(), num_workers=2, batch_size=32, averaging_frequency=8, seed=0,
                                            slow_warning=False)
        t = time.perf_counter()
        trainer.fit((x, y), epochs=3, verbose=0)
        results[name] = {"wall_s": time.perf_counter() - t, "first_round_s": trainer.stats.records[0].wall_s,
                         "replicas_built": sum(r.replicas_built for r in trainer.stats.records)}
        print(f"{name:>14}: {results[name]['wall_s']:.2f} s (first round {results[name]['first_round_s']:.2f} s, "
              f"replicas built {results[name]['replicas_built']})", flush=True)

    fit("cold")
    fit("warm")
    fit("warm2")
    print(f"idle for {args.idle:.0f} s ...", flush=True)
    time.sleep(args.idle)
    fit("idle")
    df = spark.createDataFrame([(row.reshape(-1).tolist(),) for row in x], "features array<float>")
    for name in ("predict_first", "predict_again"):
        t = time.perf_counter()
        trainer.predict(df).select("prediction").collect()
        results[name] = {"wall_s": time.perf_counter() - t}
        print(f"{name:>14}: {results[name]['wall_s']:.2f} s", flush=True)
    warm = float(np.median([results["warm"]["wall_s"], results["warm2"]["wall_s"]]))
    summary = {
        "first_fit_minus_warm_s": results["cold"]["wall_s"] - warm,
        "idle_fit_minus_warm_s": results["idle"]["wall_s"] - warm,
        "first_predict_minus_second_s": results["predict_first"]["wall_s"] - results["predict_again"]["wall_s"],
        "load_1min": os.getloadavg()[0],
    }
    print(json.dumps(summary, indent=1))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"arms": results, "summary": summary, "idle_s": args.idle, "daemon": args.daemon,
                   "warm_up_gap_s": args.warm_up_gap}, f, indent=1)
    trainer.close()
    spark.stop()


if __name__ == "__main__":
    main()
