"""The first predict after a fit, with and without one pool of Python workers for RDD rounds and SQL jobs.

Issue 16: a fit's rounds (RDD jobs with ``state_transport="files"``) and
``predict`` (an Arrow UDF, a SQL job) ran in separate pools of Python
workers, so the first predict after a fit started and warmed new workers.
``sparkdl_avg.session._share_python_workers`` makes them one pool. One child
process per run (a fresh ``local[2]`` session), the arms alternated
``--repeats`` times: the digits MLP (64-64-10) fitted on a cached DataFrame of
scikit-learn's digits for 2 epochs (k=8, 2 workers), twice (cold, warm), then
``predict(df).collect()`` twice. Arm ``off`` empties the shared variables.
Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/shared_pool.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time


def child(arm: str) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    from pyspark.sql import SparkSession
    from sklearn.datasets import load_digits

    import sparkdl_avg.session as session
    from sparkdl_avg import ParameterAveragingTrainer

    if arm == "off":
        session._SQL_WORKER_ENV.clear()
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    x, y = load_digits(return_X_y=True)
    df = spark.createDataFrame([(r.tolist(), int(t)) for r, t in zip(x / 16.0, y)], "features array<float>, label int")
    df = df.cache()
    df.count()

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
        m.compile("adam", "sparse_categorical_crossentropy")
        return m

    out = {}
    for name in ("fit_cold", "fit_warm"):
        trainer = ParameterAveragingTrainer(model(), num_workers=2, averaging_frequency=8, seed=0,
                                            state_transport="files", slow_warning=False)
        t0 = time.perf_counter()
        trainer.fit(df, epochs=2, verbose=0)
        out[name] = time.perf_counter() - t0
    for name in ("predict_first", "predict_again"):
        t0 = time.perf_counter()
        trainer.predict(df).collect()
        out[name] = time.perf_counter() - t0
    spark.stop()
    return out


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
        return
    repeats = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 3
    runs = {"off": [], "on": []}
    for _ in range(repeats):
        for arm in ("off", "on"):
            proc = subprocess.run([sys.executable, __file__, "--child", arm], capture_output=True, text=True)
            runs[arm].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print("| pool | cold fit s | warm fit s | first predict s | second predict s | first − second s |")
    print("|---|---|---|---|---|---|")
    for arm, rows in runs.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        extra = statistics.median(r["predict_first"] - r["predict_again"] for r in rows)
        print(f"| {'shared' if arm == 'on' else 'separate'} | {med['fit_cold']:.2f} | {med['fit_warm']:.2f} | "
              f"{med['predict_first']:.2f} | {med['predict_again']:.2f} | {extra:.2f} |")
    print(f"1-minute load at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
