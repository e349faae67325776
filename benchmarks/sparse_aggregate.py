"""The driver's aggregation of sparse deltas in whole fits: float32 against ``"topk"`` and ``"threshold"``.

``benchmarks/sparse_sums.py`` times the sum alone, in one process (a slice). This script times what a user's fit
does around it: README's session (``local[2]``, ``benchmarks/harness.py``), 2 workers, the 969,810-parameter MLP
of the hosts benchmarks (64-700-1300-10, Adam(1e-3) inside) on scikit-learn's digits (1,797 examples, standardized),
``update_rule="diloco"``, ``optimizer_state="local"``, batch 32, ``k`` minibatches a round, each arm a whole ``fit``
(``--epochs``), the arms interleaved in each repeat. Each ``ARM`` is ``PATH/COMPRESSION``: the path
``files`` (``state_transport="files"``, what ``"auto"`` takes on one host: the driver reads each worker's file),
``driver`` (the Spark SQL round, ``aggregation="driver"``: every worker's sums to the driver as Arrow rows) or
``storage`` (``aggregation="storage"``: sharded reducers); the compression ``none`` (float32) or a codec. Per arm,
medians over the repeats of: the fit's wall time, and of its rounds after the first, ``aggregate_s`` (the sums' way
back and their sum), ``driver_sum_s`` (the driver's decoding and adding, part of it) and ``encode_max_s`` (the
slowest worker's encoding), and the bytes a worker sent::

    PYSPARK_PYTHON=$PWD/.venv/bin/python .venv/bin/python benchmarks/sparse_aggregate.py --repeats 3

Results go to ``benchmarks/results/sparse_aggregate.json``; a Markdown table is printed
(docs/benchmarks/sparse_codecs.md).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

ARMS = ["files/none", "files/topk", "files/threshold", "driver/none", "driver/topk", "driver/threshold",
        "storage/none", "storage/topk", "storage/threshold"]
PATHS = {"files": {"state_transport": "files"},
         "driver": {"state_transport": "sql", "aggregation": "driver"},
         "storage": {"state_transport": "sql", "aggregation": "storage"}}


def model(seed: int):
    """The hosts benchmarks' MLP: 64-700-1300-10, 969,810 parameters, Adam(1e-3)."""
    import keras

    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(700, activation="relu"),
                          keras.layers.Dense(1300, activation="relu"), keras.layers.Dense(10, activation="softmax")])
    m.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return m


def main() -> None:
    p = harness.parser(__doc__, out="sparse_aggregate.json", repeats=3)
    p.add_argument("--k", type=int, default=4, help="averaging_frequency (minibatches a worker trains a round)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("arms", nargs="*", default=ARMS, metavar="PATH/COMPRESSION")
    args = p.parse_args()

    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.preprocessing import StandardScaler

    import sparkdl_avg

    x, y = load_digits(return_X_y=True)
    x, y = StandardScaler().fit_transform(x).astype("float32"), y.astype("int32")
    spark = harness.session("local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    runs = {arm: [] for arm in args.arms}
    for repeat in range(args.repeats + 1):  # the first repeat warms the Python workers and is not kept
        for arm in args.arms:
            path, compression = arm.split("/")
            trainer = sparkdl_avg.ParameterAveragingTrainer(
                model(0), num_workers=2, batch_size=32, averaging_frequency=args.k, seed=0, update_rule="diloco",
                optimizer_state="local", update_compression=None if compression == "none" else compression,
                slow_warning=False, **PATHS[path])
            start = time.perf_counter()
            trainer.fit((x, y), epochs=args.epochs, verbose=0)
            fit_s = time.perf_counter() - start
            later = trainer.stats.records[1:]
            run = {"fit_s": fit_s, "rounds": len(trainer.stats.records),
                   "aggregate_s": statistics.median(r.aggregate_s for r in later),
                   "driver_sum_s": statistics.median(r.driver_sum_s or 0.0 for r in later),
                   "sent_bytes_per_worker": statistics.median(r.sent_bytes / r.num_workers for r in later),
                   "encode_max_s": statistics.median(r.encode_max_s or 0.0 for r in later),
                   "feedback_max_s": statistics.median(r.feedback_max_s or 0.0 for r in later),
                   "round_s": statistics.median(r.wall_s for r in later),
                   "transport": later[0].transport, "aggregation": later[0].aggregation,
                   "load": os.getloadavg()[0]}
            print(f"repeat {repeat} {arm}: {run}", flush=True)
            if repeat:
                runs[arm].append(run)
    spark.stop()

    def med(arm, key):
        return float(np.median([r[key] for r in runs[arm]]))

    print(f"\n{args.repeats} repeats, medians; load {min(r['load'] for v in runs.values() for r in v):.1f}-"
          f"{max(r['load'] for v in runs.values() for r in v):.1f}\n")
    print("| path | compression | bytes a worker sends a round | whole fit s | aggregate ms a round | "
          "driver's sum ms a round | aggregate × float32 | slowest worker's encoding ms a round |")
    print("|---|---|---|---|---|---|---|---|")
    for arm in args.arms:
        path, compression = arm.split("/")
        base = f"{path}/none"
        ratio = med(arm, "aggregate_s") / med(base, "aggregate_s") if base in runs else float("nan")
        print(f"| {path} | {compression} | {med(arm, 'sent_bytes_per_worker'):,.0f} | {med(arm, 'fit_s'):.2f} | "
              f"{1e3 * med(arm, 'aggregate_s'):.0f} | {1e3 * med(arm, 'driver_sum_s'):.1f} | {ratio:.2f} | "
              f"{1e3 * med(arm, 'encode_max_s'):.0f} |")
    harness.write_results(args.out, args, runs=runs)


if __name__ == "__main__":
    main()
