"""The Elephas arm of ``benchmarks/suite.py``, run in ``benchmarks/.venv-elephas``.

Not meant to be run by hand: the suite writes the data and the initial
weights to an ``.npz`` file and runs::

    benchmarks/.venv-elephas/bin/python benchmarks/elephas_arm.py DATA.npz OUT.json \
        --epochs 3 --batch-size 32 --workers 2 --repeats 3

It trains the suite's CNN (same architecture, initial weights, optimizer,
batch size and data) with Elephas 7.3.0's synchronous mode on ``local[2]``
(``SparkModel(mode="synchronous", frequency="epoch")``: every worker trains
its partition for one epoch with ``model.fit``, the driver averages once per
epoch). Each epoch is one ``SparkModel.fit(rdd, epochs=1)`` call so that the
held-out accuracy can be measured after every epoch on the driver (not
timed); this costs the same per epoch as ``fit(epochs=E)``, which also
repartitions the uncached RDD and recompiles the workers' models every epoch.

The session comes from ``benchmarks/harness.py`` without the README's
settings (``harness.session(readme=False)``: no ``sparkdl_avg.daemon``, no
Unix domain sockets), the arm that deviates: this venv has no sparkdl_avg
for the daemon to import, and its pyspark 4.0.0 has no Unix-socket setting
(Spark >= 4.1). It writes the suite's private hand-over file (``OUT.json``),
not a results file.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import harness  # noqa: E402

#: Of the README's settings, the one the Elephas arm can have: no console progress bars.
CONF = {"spark.ui.showConsoleProgress": "false"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()

    import contextlib
    import io

    import elephas
    import pyspark
    import tensorflow as tf
    from elephas.spark_model import SparkModel
    from elephas.utils.rdd_utils import to_simple_rdd

    from bench_cnn import build_model

    d = np.load(args.data)
    x, y, xt, yt = d["x"], d["y"], d["xt"], d["yt"]
    weights = [d[f"w{i}"] for i in range(int(d["n_weights"]))]
    spark = harness.session(f"local[{args.workers}]", readme=False, conf=CONF)
    sc = spark.sparkContext
    sc.parallelize(range(args.workers), args.workers).foreach(lambda _: __import__("tensorflow"))

    runs = []
    for rep in range(args.repeats):
        model = build_model(weights)
        t0 = time.perf_counter()
        rdd = to_simple_rdd(sc, x, y)
        spark_model = SparkModel(model, frequency="epoch", mode="synchronous", num_workers=args.workers)
        epoch_s, elapsed, accuracy, eval_total = [], [], [], 0.0
        for _ in range(args.epochs):
            t = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):  # Elephas prints ">>> Fit model"
                spark_model.fit(rdd, epochs=1, batch_size=args.batch_size, verbose=0, validation_split=0.0)
            epoch_s.append(time.perf_counter() - t)
            elapsed.append(time.perf_counter() - t0 - eval_total)
            te = time.perf_counter()
            accuracy.append(float(spark_model.master_network.evaluate(xt, yt, verbose=0)[1]))
            eval_total += time.perf_counter() - te
        fit_s = time.perf_counter() - t0 - eval_total
        runs.append({"epoch_s": epoch_s, "elapsed_s": elapsed, "epoch_accuracy": accuracy,
                     "accuracy": accuracy[-1], "fit_s": fit_s})
        print(f"[{rep}] elephas: epochs {[round(t, 2) for t in epoch_s]} acc {accuracy}", flush=True)
    spark.stop()
    versions = {"elephas": getattr(elephas, "__version__", "7.3.0"), "tensorflow": tf.__version__,
                "pyspark": pyspark.__version__, "python": sys.version.split()[0]}
    harness.write_json(args.out, {"versions": versions, "conf": harness.settings(CONF, readme=False), "runs": runs})


if __name__ == "__main__":
    main()
