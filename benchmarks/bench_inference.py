"""Inference benchmark: ``trainer.predict`` on ``local[2]`` vs ``model.predict`` in one process.

The CNN of ``bench_cnn.py`` (31k parameters) scores N synthetic 28×28
images. The one-process arm runs ``model.predict(x, batch_size=1024)`` on a
numpy array (TensorFlow using both cores). The Spark arm runs
``trainer.predict(df)`` on a cached DataFrame of ``array<float>`` rows and
forces it with the ``noop`` writer (so nothing is collected); its time
includes Arrow transfer and the pandas UDF, but not building the DataFrame.
A warm-up pass builds the replicas first. Arms are interleaved, medians of
``--repeats``. Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/bench_inference.py

Results go to ``benchmarks/results/inference.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_cnn import build_model, make_data  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=50000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "inference.json"))
    args = p.parse_args()

    import pandas as pd
    from pyspark.sql import SparkSession

    from sparkdl_avg import ParameterAveragingTrainer

    x, _ = make_data(args.examples, seed=3)
    model = build_model()
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    pdf = pd.DataFrame({"features": list(x.reshape(len(x), -1))})
    df = spark.createDataFrame(pdf, "features array<float>").repartition(2).cache()
    assert df.count() == len(x)
    trainer = ParameterAveragingTrainer(model, num_workers=2)

    def spark_arm():
        trainer.predict(df, batch_size=args.batch_size).write.format("noop").mode("overwrite").save()

    def local_arm():
        model.predict(x, batch_size=args.batch_size, verbose=0)

    spark_arm()  # warm-up: replicas, traced predict functions
    local_arm()
    times = {"model.predict (1 process)": [], "trainer.predict local[2]": []}
    for _ in range(args.repeats):
        for name, fn in (("model.predict (1 process)", local_arm), ("trainer.predict local[2]", spark_arm)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    spark.stop()

    base = statistics.median(times["model.predict (1 process)"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"arm": name, "seconds_median": med, "examples_per_s": args.examples / med, "speedup": base / med})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "times": times, "rows": rows}, f, indent=1)
    print("| arm | seconds (median) | examples/s | speed-up vs one process |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['seconds_median']:.2f} | {r['examples_per_s']:.0f} | {r['speedup']:.2f} |")


if __name__ == "__main__":
    main()
