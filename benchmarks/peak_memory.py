"""Peak memory of a fit against the model's size: the driver and each executor worker, and ``keras.Model.fit``.

The model is README's ids model (``--kind embedding``: ``Input((1,), int64)``
→ ``Embedding(--rows, 8)`` → ``Flatten`` → ``Dense(1)``) or a dense one
(``--kind dense``: ``Input((1000,))`` → ``Dense(--rows // 1000)`` → ``Dense(1)``),
compiled with Adam, so its state (weights and two moments) is about
``12 × parameters`` bytes. It trains one epoch on ``--examples`` (2,048)
random rows with 2 workers on ``local[2]`` (README's settings,
``benchmarks/harness.py``), ``batch_size=32``, ``averaging_frequency=8``:
4 rounds.

Measured as **peak RSS above each process's level just before the fit** (``--level fit``), or, on the
driver, **before the user's model is built** (``--level model``, the default: what a user's process holds for the
fit, the model and its optimizer's slots included; the session, the data and Keras' import come first, as in a
notebook):

* the driver: this process's ``VmHWM`` after the fit minus its ``VmRSS``
  before it, the peak having been reset to the current level first
  (``echo 5 > /proc/self/clear_refs``);
* each executor Python worker: the same, done from here on the worker's
  ``/proc/<pid>`` (the workers are the JVM's grandchildren; a warm-up job
  starts them before the fit, and PySpark reuses them for the fit's tasks);
* ``--arm keras``: ``keras.Model.fit`` of the same model and data in this
  process, no Spark (model built and compiled before the level is taken).

One JSON line per run to ``benchmarks/results/peak_memory.jsonl``::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/peak_memory.py --rows 4194304
    .venv/bin/python benchmarks/peak_memory.py --rows 4194304 --arm keras
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import harness  # noqa: E402


def status_mb(pid="self") -> dict:
    """``VmRSS`` and ``VmHWM`` of process ``pid`` in MB (``{}`` when it is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


def reset_peak(pid="self") -> bool:
    """Resets ``VmHWM`` of ``pid`` to its current RSS (Linux ``clear_refs`` 5); ``False`` where refused."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def python_workers(jvm_pid: int) -> list:
    """The pids of the JVM's Python workers (grandchildren: JVM → daemon → worker)."""
    children: dict = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(name))
    return [pid for daemon in children.get(jvm_pid, []) for pid in children.get(daemon, [])]


def build_model(kind: str, rows: int):
    import keras

    keras.utils.set_random_seed(0)
    if kind == "embedding":
        ids = keras.Input((1,), dtype="int64")
        x = keras.layers.Flatten()(keras.layers.Embedding(rows, 8)(ids))
        model = keras.Model(ids, keras.layers.Dense(1, activation="sigmoid")(x))
    else:
        inputs = keras.Input((1000,))
        x = keras.layers.Dense(max(1, rows // 1000), activation="relu")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))
    model.compile("adam", "binary_crossentropy")
    return model


def data(kind: str, rows: int, examples: int):
    import numpy as np

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, examples).astype("float32")
    if kind == "embedding":
        return rng.integers(0, rows, (examples, 1)).astype("int64"), y
    return rng.random((examples, 1000), dtype="float32"), y


def main() -> None:
    p = harness.parser(__doc__, out="peak_memory.jsonl")
    p.add_argument("--rows", type=int, default=2**22, help="embedding rows (dense: parameters ≈ 1000 × rows/1000)")
    p.add_argument("--kind", choices=["embedding", "dense"], default="embedding")
    p.add_argument("--arm", choices=["sparkdl_avg", "keras"], default="sparkdl_avg")
    p.add_argument("--examples", type=int, default=2048)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--optimizer-state", default="average")
    p.add_argument("--level", choices=["model", "fit"], default="model",
                   help="the driver's level: before the model is built (as a user counts) or just before the fit")
    args = p.parse_args()

    import numpy as np

    x, y = data(args.kind, args.rows, args.examples)
    spark = df = None
    if args.arm == "sparkdl_avg":
        import sparkdl_avg

        spark = harness.session(f"local[{args.num_workers}]", app_name="sparkdl_avg-peak-memory")
        sparkdl_avg.warm_up(spark).result()
        rows = [(int(a[0]) if args.kind == "embedding" else a.tolist(), float(b)) for a, b in zip(x, y)]
        schema = "features bigint, label float" if args.kind == "embedding" else "features array<float>, label float"
        df = spark.createDataFrame(rows, schema).cache()
        df.count()
    import keras  # noqa: F401  (TensorFlow's import is not the model's: a user imports it before building one)

    model_level = status_mb()["VmRSS"]
    reset_peak()
    model = build_model(args.kind, args.rows)
    model.optimizer.build(model.trainable_variables)
    built = status_mb()  # what building the model took, and its peak (the user's own code: not the fit's)
    built = {"rss_above_mb": round(built["VmRSS"] - model_level, 1),
             "peak_above_mb": round(built["VmHWM"] - model_level, 1)}
    state_mb = (sum(w.nbytes for w in model.get_weights())
                + sum(np.asarray(v.numpy()).nbytes for v in model.optimizer.variables)) / 2**20
    from sparkdl_avg.driver.observe.memory import estimate, model_state_sizes

    est = estimate(*model_state_sizes(model), average_optimizer=args.optimizer_state == "average",
                   local_optimizer=args.optimizer_state == "local")
    result = {"level": args.level, "built": built,
              "kind": args.kind, "rows": args.rows, "arm": args.arm, "parameters": int(model.count_params()),
              "state_mb": round(state_mb, 1), "num_workers": args.num_workers,
              "optimizer_state": args.optimizer_state,
              "estimate_mb": {"driver": round(est.driver_bytes / 2**20), "worker": round(est.worker_bytes / 2**20)}}
    if args.arm == "keras":
        before = model_level if args.level == "model" else status_mb()["VmRSS"]
        if args.level == "fit":
            reset_peak()
        t0 = time.perf_counter()
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
        result.update(seconds=round(time.perf_counter() - t0, 1),
                      driver_peak_above_mb=round(status_mb()["VmHWM"] - before, 1))
    else:
        from sparkdl_avg import ParameterAveragingTrainer

        jvm_pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())
        # The workers build their replicas in the fit: their level is before it either way.
        workers = {pid: status_mb(pid)["VmRSS"] for pid in python_workers(jvm_pid) if reset_peak(pid)}
        before = model_level if args.level == "model" else status_mb()["VmRSS"]
        if args.level == "fit":
            reset_peak()
        t0 = time.perf_counter()
        with ParameterAveragingTrainer(model, num_workers=args.num_workers, batch_size=32, averaging_frequency=8,
                                       seed=0, optimizer_state=args.optimizer_state) as trainer:
            trainer.fit(df, epochs=1, verbose=0)
            seconds = time.perf_counter() - t0
            driver = status_mb()["VmHWM"] - before
            summary = trainer.stats.summary()
        after = {pid: status_mb(pid).get("VmHWM", float("nan")) - base for pid, base in workers.items()}
        result.update(
            seconds=round(seconds, 1),
            driver_peak_above_mb=round(driver, 1),
            workers_peak_above_mb={str(pid): round(v, 1) for pid, v in sorted(after.items())},
            stats_peak_memory_mb={k: None if v is None else round(v / 2**20, 1) for k, v in summary.items() if "peak" in k},
        )
        spark.stop()
    peaks = [result["driver_peak_above_mb"], *result.get("workers_peak_above_mb", {}).values()]
    result["peak_over_state"] = [round(v / state_mb, 2) for v in peaks]
    result["load_avg"] = os.getloadavg()[0]
    print(json.dumps(result), flush=True)
    harness.append_results(args.out, args, **result)


if __name__ == "__main__":
    main()
