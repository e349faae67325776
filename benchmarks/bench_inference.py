"""Inference benchmark: ``trainer.predict`` on ``local[2]`` vs ``model.predict`` in one process.

The CNN of ``bench_cnn.py`` (31k parameters) scores N synthetic 28×28
images. The one-process arm runs ``model.predict(x, batch_size=1024)`` on a
numpy array (TensorFlow using both cores). The Spark arm runs
``trainer.predict(df)`` on a cached DataFrame of ``array<float>`` rows and
forces it with the ``noop`` writer (so nothing is collected); its time
includes Arrow transfer and the pandas UDF, but not building the DataFrame.
A warm-up pass builds the replicas first. Two more arms explain the result:
``model.predict`` with TensorFlow limited to one thread (in a subprocess;
what each of the two Spark workers has), whose doubled throughput is the
ceiling of two single-threaded workers, and the same Arrow UDF path without
inference (the cost of moving the features JVM → Python → JVM). Arms are
interleaved, medians of ``--repeats``. The session has the README's settings
(``benchmarks/harness.py``) and Arrow for pandas conversions. Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/bench_inference.py

Results go to ``benchmarks/results/inference.json``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from typing import Iterator  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import harness  # noqa: E402
from bench_cnn import build_model, make_data  # noqa: E402


def main() -> None:
    p = harness.parser(__doc__, out="inference.json", repeats=3)
    p.add_argument("--examples", type=int, default=50000)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_internal("--one-thread-probe", action="store_true")
    args = p.parse_args()
    if args.one_thread_probe:
        return one_thread_probe(args)

    import pandas as pd

    from sparkdl_avg import ParameterAveragingTrainer

    x, _ = make_data(args.examples, seed=3)
    model = build_model()
    spark = harness.session("local[2]", conf={"spark.sql.execution.arrow.pyspark.enabled": "true"})
    pdf = pd.DataFrame({"features": list(x.reshape(len(x), -1))})
    df = spark.createDataFrame(pdf, "features array<float>").repartition(2).cache()
    assert df.count() == len(x)
    trainer = ParameterAveragingTrainer(model, num_workers=2)

    def spark_arm():
        trainer.predict(df, batch_size=args.batch_size).write.format("noop").mode("overwrite").save()

    def local_arm():
        model.predict(x, batch_size=args.batch_size, verbose=0)

    from pyspark.sql.functions import arrow_udf

    @arrow_udf("prediction double")
    def no_inference(batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
        for column in batches:
            values = column.flatten().to_numpy(zero_copy_only=False)  # what predict_batches reads
            yield pa.StructArray.from_arrays([pa.array(np.zeros(len(column)) + 0 * values[:1].sum())], names=["prediction"])

    def data_path_arm():
        df.select(no_inference("features")).write.format("noop").mode("overwrite").save()

    def one_thread_arm():
        import subprocess

        out = subprocess.run(
            [sys.executable, __file__, "--one-thread-probe", "--examples", str(args.examples),
             "--batch-size", str(args.batch_size)],
            check=True, capture_output=True, text=True,
        ).stdout
        return float(out.strip().splitlines()[-1])

    spark_arm()  # warm-up: replicas, traced predict functions
    local_arm()
    data_path_arm()
    arms = (
        ("model.predict (1 process)", local_arm),
        ("trainer.predict local[2]", spark_arm),
        ("Arrow UDF without inference local[2] (data path)", data_path_arm),
    )
    times = {name: [] for name, _ in arms}
    times["model.predict (1 process, TensorFlow on 1 thread)"] = []
    for _ in range(args.repeats):
        for name, fn in arms:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        times["model.predict (1 process, TensorFlow on 1 thread)"].append(one_thread_arm())
    spark.stop()

    base = statistics.median(times["model.predict (1 process)"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"arm": name, "seconds_median": med, "examples_per_s": args.examples / med, "speedup": base / med})
    harness.write_results(args.out, args, times=times, rows=rows)
    print("| arm | seconds (median) | examples/s | speed-up vs one process |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['seconds_median']:.2f} | {r['examples_per_s']:.0f} | {r['speedup']:.2f} |")
    one = statistics.median(times["model.predict (1 process, TensorFlow on 1 thread)"])
    print(f"\nCeiling of two single-threaded workers with a free data path: 2 × {args.examples / one:.0f} "
          f"= {2 * args.examples / one:.0f} examples/s = {2 * base / one:.2f}× one process.")


def one_thread_probe(args) -> None:
    """Times ``model.predict`` with TensorFlow on one thread; prints the median seconds."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    x, _ = make_data(args.examples, seed=3)
    model = build_model()
    model.predict(x[:2048], batch_size=args.batch_size, verbose=0)
    t0 = time.perf_counter()
    model.predict(x, batch_size=args.batch_size, verbose=0)
    print(time.perf_counter() - t0)


if __name__ == "__main__":
    main()
