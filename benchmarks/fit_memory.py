"""Executor memory over many fits in one session: the notebook habit of re-running a cell.

Each of ``--fits`` fits builds a new model (the same architecture, as a
re-run cell does, or a different width each time with ``--vary``), a new
trainer, trains one epoch on scikit-learn's digits and closes the trainer,
on ``local[2]`` with the README's settings (``benchmarks/harness.py``). After every fit it
reads each executor Python worker's anonymous memory (``RssAnon``, from
``/proc``: the workers are the forked children of the PySpark daemon), and
reports the replicas built per fit. The target (issue 28, item 3) is at
most 5 MB of growth per fit after the second, and no tf.function retracing
warning (count them in stderr)::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/fit_memory.py 2> /tmp/fit_memory.err
    grep -c retracing /tmp/fit_memory.err

Appends one JSON line to ``benchmarks/results/fit_memory.jsonl`` (``--out``).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import harness  # noqa: E402


def _rss_anon_mb(pid: int):
    """``RssAnon`` of process ``pid`` in MB, or ``None`` when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) / 1024
    except (OSError, StopIteration):
        return None


def daemons(jvm_pid: int) -> dict:
    """``{pid: RssAnon MB}`` of the JVM's PySpark daemons (its Python children, which fork the workers)."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            rss = _rss_anon_mb(int(name)) if ppid == jvm_pid else None
            if rss is not None:
                out[int(name)] = rss
    return out


def python_workers(jvm_pid: int) -> dict:
    """``{pid: RssAnon MB}`` of the JVM's Python workers (grandchildren: JVM → daemon → worker)."""
    children: dict = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        children.setdefault(ppid, []).append(int(name))
    out = {}
    for daemon in children.get(jvm_pid, []):
        for pid in children.get(daemon, []):
            try:
                with open(f"/proc/{pid}/status") as f:
                    rss = next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))
            except (OSError, StopIteration):
                continue
            out[pid] = rss / 1024
    return out


def main() -> None:
    p = harness.parser(__doc__, out="fit_memory.jsonl")
    p.add_argument("--fits", type=int, default=10)
    p.add_argument("--vary", action="store_true", help="a different hidden width each fit (a new architecture)")
    args = p.parse_args()

    import keras
    from sklearn.datasets import load_digits

    import sparkdl_avg
    from sparkdl_avg import ParameterAveragingTrainer

    spark = harness.session("local[2]", app_name="sparkdl_avg-fit-memory")
    sparkdl_avg.warm_up(spark).result()
    jvm_pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int32")
    df = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x, y)], "features array<float>, label int")
    df = df.cache()
    df.count()

    per_fit = []
    for i in range(args.fits):
        width = 64 + (i if args.vary else 0)
        model = keras.Sequential(
            [keras.Input((64,)), keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10, activation="softmax")]
        )
        model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
        t0 = time.perf_counter()
        with ParameterAveragingTrainer(model, num_workers=2, batch_size=32, averaging_frequency=8, seed=0) as trainer:
            trainer.fit(df, epochs=1, verbose=0)
            built = trainer.stats.summary()["replicas_built"]
        seconds = time.perf_counter() - t0
        del model, trainer
        gc.collect()
        workers = python_workers(jvm_pid)
        per_fit.append({"fit": i, "seconds": round(seconds, 2), "replicas_built": built,
                        "workers_rss_anon_mb": {str(k): round(v, 1) for k, v in sorted(workers.items())},
                        "daemons_rss_anon_mb": {str(k): round(v, 1) for k, v in sorted(daemons(jvm_pid).items())}})
        print(json.dumps(per_fit[-1]), flush=True)

    # Growth per fit after the second, per worker that lived through all fits.
    first, last = per_fit[1]["workers_rss_anon_mb"], per_fit[-1]["workers_rss_anon_mb"]
    growth = [(last[pid] - first[pid]) / (args.fits - 2) for pid in last if pid in first]
    result = {
        "fits": args.fits,
        "vary": args.vary,
        "growth_mb_per_fit_after_second": round(statistics.median(growth), 2) if growth else None,
        "replicas_built": [f["replicas_built"] for f in per_fit],
        "seconds": [f["seconds"] for f in per_fit],
        "load_avg": os.getloadavg()[0],
        "per_fit": per_fit,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "per_fit"}))
    harness.append_results(args.out, args, **result)
    spark.stop()


if __name__ == "__main__":
    main()
