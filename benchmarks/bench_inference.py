"""Inference benchmark: ``trainer.predict`` against ``predict_batch_udf`` and one-process ``model.predict``.

The CNN of ``bench_cnn.py`` (31k parameters; 28×28×1 inputs, 10 classes)
scores N synthetic images, on two kinds of data:

* ``floats``: ``array<float>`` rows of 784 values, written to Parquet, read
  back and cached (as users' feature tables are);
* ``png``: the same images as PNG bytes (``tf.io.encode_png``) in a
  ``binary`` column, likewise from Parquet and cached, decoded on the
  executors by the same function in both Spark arms (``trainer.predict``
  with ``preprocess=``, ``predict_batch_udf`` inside its predict function).

Arms, interleaved, medians of ``--repeats``: ``model.predict(x,
batch_size=1024)`` in one process (TensorFlow on both cores; on PNGs a
``tf.data`` pipeline that decodes with ``map(num_parallel_calls=AUTOTUNE)``
and ``prefetch``), ``trainer.predict`` and Spark's own
``pyspark.ml.functions.predict_batch_udf`` (batch 1024, the model built
once per Python worker) on ``local[2]``, each forced with the ``noop``
writer (nothing collected). Three more arms explain the float result: the
Arrow UDF path without inference (moving the features JVM → Python → JVM),
and two subprocesses that run TensorFlow as the executors do, with oneDNN's
kernels on (``TF_ENABLE_ONEDNN_OPTS=1``, ``quiet.EXECUTOR_TF_ENVIRONMENT``;
TensorFlow's own default leaves them off on CPUs without AVX-512 VNNI):
``model.predict`` on all cores, and on one thread (what each of the two Spark
workers has; twice its throughput is the ceiling of two single-threaded
workers). The session has the README's settings
(``benchmarks/harness.py``). Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/bench_inference.py

Results go to ``benchmarks/results/inference.json``.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from typing import Iterator  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import harness  # noqa: E402
from bench_cnn import build_model, make_data  # noqa: E402

ONE_PROCESS = "model.predict (1 process)"
ONE_PROCESS_ONEDNN = "model.predict (1 process, oneDNN kernels)"
ONE_THREAD = "model.predict (1 process, TensorFlow on 1 thread, oneDNN kernels)"


def decode_png(batch, training=False):
    """The PNG arms' preprocessing function: bytes → 28×28×1 float32 in [0, 1]."""
    import tensorflow as tf

    images = np.stack([tf.io.decode_png(b).numpy() for b in batch["content"]])
    return {"image": images.astype(np.float32) / 255.0}


def main() -> None:
    p = harness.parser(__doc__, out="inference.json", repeats=3)
    p.add_argument("--examples", type=int, default=40000)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--kinds", nargs="+", default=["floats", "png"], choices=["floats", "png"])
    p.add_argument("--source", choices=["cached", "parquet"], default="cached",
                   help="the Spark arms read the Parquet files once and cache them (default), or read them each time")
    p.add_internal("--probe-threads", type=int, default=0)
    args = p.parse_args()
    if args.probe_threads:
        return probe(args)

    import tensorflow as tf
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.functions import arrow_udf
    from pyspark.sql.types import ArrayType, FloatType

    from sparkdl_avg import ParameterAveragingTrainer

    x, _ = make_data(args.examples, seed=3)
    model = build_model()
    model.save(os.path.join(tempfile.gettempdir(), "sparkdl_avg-bench-inference.keras"))
    with open(os.path.join(tempfile.gettempdir(), "sparkdl_avg-bench-inference.keras"), "rb") as f:
        keras_bytes = f.read()  # what predict_batch_udf's workers load, as users load their model from a file
    # With --source parquet, each of the 2 files is one task (Spark would otherwise pack both into one split).
    spark = harness.session("local[2]", conf={"spark.sql.files.openCostInBytes": str(1 << 30)}
                            if args.source == "parquet" else None)
    tmp = tempfile.mkdtemp(prefix="sparkdl_avg-bench-inference-")
    frames = {}
    if "floats" in args.kinds:
        pa_table = pa.table({"features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 784)})
        import pyarrow.parquet as pq

        os.makedirs(f"{tmp}/floats.parquet")
        table = pa_table.cast(pa.schema([("features", pa.list_(pa.float32()))]))
        for i, half in enumerate((table.slice(0, len(x) // 2), table.slice(len(x) // 2))):  # 2 files: 2 tasks
            pq.write_table(half, f"{tmp}/floats.parquet/part-{i}.parquet")
        frames["floats"] = source(spark.read.parquet(f"{tmp}/floats.parquet"), args.source)
    pngs = None
    if "png" in args.kinds:
        import pyarrow.parquet as pq

        pixels = np.clip(np.round((x - x.min()) / (x.max() - x.min()) * 255), 0, 255).astype(np.uint8)
        pngs = [tf.io.encode_png(image).numpy() for image in pixels]
        os.makedirs(f"{tmp}/png.parquet")
        table = pa.table({"content": pa.array(pngs, pa.binary())})
        for i, half in enumerate((table.slice(0, len(x) // 2), table.slice(len(x) // 2))):
            pq.write_table(half, f"{tmp}/png.parquet/part-{i}.parquet")
        frames["png"] = source(spark.read.parquet(f"{tmp}/png.parquet"), args.source)
    for df in frames.values():
        assert df.count() == len(x)

    plain = ParameterAveragingTrainer(model, num_workers=2)
    decoding = ParameterAveragingTrainer(model, num_workers=2, preprocess=decode_png)

    def make_predict_fn(decode):
        def make():
            import keras

            path = os.path.join(tempfile.mkdtemp(), "model.keras")
            with open(path, "wb") as f:
                f.write(keras_bytes)
            local = keras.saving.load_model(path)

            def predict(inputs: np.ndarray) -> np.ndarray:
                if decode:
                    inputs = decode_png({"content": inputs})["image"]
                return local.predict_on_batch(inputs.reshape(-1, 28, 28, 1))
            return predict
        return make

    spark_udfs = {
        "floats": predict_batch_udf(make_predict_fn(False), return_type=ArrayType(FloatType()), batch_size=args.batch_size,
                                    input_tensor_shapes=[[784]]),
        "png": predict_batch_udf(make_predict_fn(True), return_type=ArrayType(FloatType()), batch_size=args.batch_size),
    }

    @arrow_udf("prediction double")
    def no_inference(batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
        for column in batches:
            values = column.flatten().to_numpy(zero_copy_only=False)  # what predict_batches reads
            yield pa.StructArray.from_arrays([pa.array(np.zeros(len(column)) + 0 * values[:1].sum())],
                                             names=["prediction"])

    def noop(df):
        df.write.format("noop").mode("overwrite").save()

    arms = []
    if "floats" in args.kinds:
        arms += [
            (f"floats: {ONE_PROCESS}", lambda: model.predict(x, batch_size=args.batch_size, verbose=0)),
            ("floats: trainer.predict local[2]",
             lambda: noop(plain.predict(frames["floats"], batch_size=args.batch_size))),
            ("floats: predict_batch_udf local[2]",
             lambda: noop(frames["floats"].select(spark_udfs["floats"]("features")))),
            ("floats: Arrow UDF without inference local[2] (data path)",
             lambda: noop(frames["floats"].select(no_inference("features")))),
        ]
    if "png" in args.kinds:
        def one_process_png():
            data = tf.data.Dataset.from_tensor_slices(pngs).map(
                lambda b: tf.cast(tf.io.decode_png(b), tf.float32) / 255.0, num_parallel_calls=tf.data.AUTOTUNE)
            model.predict(data.batch(args.batch_size).prefetch(tf.data.AUTOTUNE), verbose=0)

        arms += [
            (f"png: {ONE_PROCESS}, tf.data decode", one_process_png),
            ("png: trainer.predict local[2], preprocess decode",
             lambda: noop(decoding.predict(frames["png"], features_col="image", batch_size=args.batch_size))),
            ("png: predict_batch_udf local[2], decode in predict_fn",
             lambda: noop(frames["png"].select(spark_udfs["png"]("content")))),
        ]
    for _, fn in arms:  # warm-up: replicas, traced predict functions
        fn()
    times = {name: [] for name, _ in arms}
    probes = {f"floats: {ONE_PROCESS_ONEDNN}": 0, f"floats: {ONE_THREAD}": 1} if "floats" in args.kinds else {}
    times.update({name: [] for name in probes})
    for _ in range(args.repeats):
        for name, fn in arms:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        for name, threads in probes.items():
            times[name].append(probe_arm(args, threads))
    spark.stop()

    rows = []
    for name, ts in times.items():
        kind = name.split(":")[0]
        base = statistics.median(next(v for k, v in times.items() if k.startswith(f"{kind}: {ONE_PROCESS}")))
        med = statistics.median(ts)
        rows.append({"arm": name, "seconds_median": med, "examples_per_s": args.examples / med,
                     "speedup": base / med})
    ratios = {}
    for kind in frames:
        ours = statistics.median(times[next(k for k in times if k.startswith(f"{kind}: trainer.predict"))])
        theirs = statistics.median(times[next(k for k in times if k.startswith(f"{kind}: predict_batch_udf"))])
        ratios[f"{kind}: trainer.predict vs predict_batch_udf"] = theirs / ours
    if "floats" in args.kinds:
        ours = statistics.median(times["floats: trainer.predict local[2]"])
        for arm in (ONE_PROCESS, ONE_PROCESS_ONEDNN):
            ratios[f"floats: trainer.predict vs {arm}"] = statistics.median(times[f"floats: {arm}"]) / ours
    harness.write_results(args.out, args, times=times, rows=rows, ratios=ratios)
    print("| arm | seconds (median) | examples/s | speed-up vs one process |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['seconds_median']:.2f} | {r['examples_per_s']:.0f} | {r['speedup']:.2f} |")
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.2f}x")
    if "floats" in args.kinds:
        one = statistics.median(times[f"floats: {ONE_THREAD}"])
        base = statistics.median(times[f"floats: {ONE_PROCESS}"])
        onednn = statistics.median(times[f"floats: {ONE_PROCESS_ONEDNN}"])
        print(f"\nCeiling of two single-threaded workers with a free data path: 2 × {args.examples / one:.0f} "
              f"= {2 * args.examples / one:.0f} examples/s = {2 * base / one:.2f}× one process, "
              f"{2 * onednn / one:.2f}× one process with oneDNN kernels.")


def source(df, how: str):
    """``df`` in 2 partitions, cached (``"cached"``), or straight from its 2 Parquet files (``"parquet"``)."""
    return df.repartition(2).cache() if how == "cached" else df


def probe_arm(args, threads: int) -> float:
    """Seconds of ``model.predict`` in a fresh process with oneDNN's kernels, as the executors run TensorFlow.

    ``threads``: TensorFlow's thread pools (1: what each of the two Spark workers has), or 0 for TensorFlow's
    default (all cores). A subprocess, since both are fixed when TensorFlow is imported.
    """
    import subprocess

    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1")  # what sparkdl_avg's executors set (quiet.EXECUTOR_TF_ENVIRONMENT)
    out = subprocess.run(
        [sys.executable, __file__, "--probe-threads", str(threads or -1), "--examples", str(args.examples),
         "--batch-size", str(args.batch_size)],
        check=True, capture_output=True, text=True, env=env,
    ).stdout
    return float(out.strip().splitlines()[-1])


def probe(args) -> None:
    """Times ``model.predict`` with ``--probe-threads`` TensorFlow threads (-1: its default); prints the seconds."""
    import tensorflow as tf

    if args.probe_threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(args.probe_threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.probe_threads)
    x, _ = make_data(args.examples, seed=3)
    model = build_model()
    model.predict(x[:2048], batch_size=args.batch_size, verbose=0)
    t0 = time.perf_counter()
    model.predict(x, batch_size=args.batch_size, verbose=0)
    print(time.perf_counter() - t0)


if __name__ == "__main__":
    main()
