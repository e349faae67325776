"""Cold start: how much slower is a session's first fit than a warm one, after an idle gap, and the first predict?

Issue 16's target: a first fit ≤ 1.5 s slower than a warm one, likewise a fit
after 2 idle minutes and the first predict after a fit. Each configuration
runs in a fresh ``local[2]`` application of its own (``spark.python.daemon.module``
is a static setting), one after the other: scikit-learn's digits as numpy
arrays, the suite's small CNN, 3 epochs, 2 workers, k=8. Configurations:

* ``plain``: PySpark's own daemon, no warm-up (a user's session without the
  daemon). The one configuration that deviates from the README's settings
  (``benchmarks/harness.py``): ``spark.python.daemon.module`` unset, since the
  daemon is what this benchmark compares; the rest (Unix domain sockets) is
  the README's in every configuration;
* ``daemon``: ``spark.python.daemon.module=sparkdl_avg.daemon`` (the README's
  settings), no warm-up;
* ``daemon_warm_up``: the daemon, and ``sparkdl_avg.warm_up(spark)`` right
  after the session starts, the first fit right away (a job that fits at once);
* ``daemon_warmed``: the same, the first fit once the warm-up is done (a
  notebook's next cell, or a job that reads its data meanwhile; the
  warm-up's own time is recorded).

Arms of each, in order: ``cold`` (the application's first fit), ``warm`` and
``warm2`` (the same fit again, new trainer and model), ``idle`` (after
``--idle`` seconds, default 130, without jobs: PySpark drops Python workers
idle for a minute), ``predict_first`` / ``predict_again`` (``trainer.predict(df)``
collected right after the last fit, then again). Prints a table and writes
JSON (``--out``). Run:
``PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/cold_start.py`` (≈ 12 min).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness  # noqa: E402

CONFIGS = {
    "plain": {"daemon": None, "warm_up": None},
    "daemon": {"daemon": "sparkdl_avg.daemon", "warm_up": None},
    "daemon_warm_up": {"daemon": "sparkdl_avg.daemon", "warm_up": "start"},
    "daemon_warmed": {"daemon": "sparkdl_avg.daemon", "warm_up": "wait"},
}


def arm_conf(name: str) -> dict:
    """What configuration ``name`` passes to ``harness.session``: PySpark's own daemon where it has no daemon."""
    daemon = CONFIGS[name]["daemon"]
    return {} if daemon == "sparkdl_avg.daemon" else {"spark.python.daemon.module": daemon}


def run_config(name: str, idle: float) -> dict:
    """One configuration in this process: its arms' wall times and the summary against the target."""
    import keras
    import numpy as np
    from sklearn.datasets import load_digits

    import sparkdl_avg
    from sparkdl_avg import ParameterAveragingTrainer

    config = CONFIGS[name]
    spark = harness.session("local[2]", conf=arm_conf(name))
    results = {}
    if config["warm_up"]:
        t = time.perf_counter()
        warm = sparkdl_avg.warm_up(spark)
        if config["warm_up"] == "wait":
            warm.result()
            results["warm_up"] = {"wall_s": time.perf_counter() - t}
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

    trainer = None

    def fit(arm):
        nonlocal trainer
        if trainer is not None:
            trainer.close()
        trainer = ParameterAveragingTrainer(model(), num_workers=2, batch_size=32, averaging_frequency=8, seed=0,
                                            slow_warning=False)
        t = time.perf_counter()
        trainer.fit((x, y), epochs=3, verbose=0)
        results[arm] = {"wall_s": time.perf_counter() - t, "first_round_s": trainer.stats.records[0].wall_s,
                        "replicas_built": sum(r.replicas_built for r in trainer.stats.records)}
        print(f"{name:>15} {arm:>14}: {results[arm]['wall_s']:.2f} s (first round {results[arm]['first_round_s']:.2f} s, "
              f"replicas built {results[arm]['replicas_built']})", flush=True)

    fit("cold")
    fit("warm")
    fit("warm2")
    time.sleep(idle)
    fit("idle")
    df = spark.createDataFrame([(row.reshape(-1).tolist(),) for row in x], "features array<float>")
    for arm in ("predict_first", "predict_again"):
        t = time.perf_counter()
        trainer.predict(df).select("prediction").collect()
        results[arm] = {"wall_s": time.perf_counter() - t}
        print(f"{name:>15} {arm:>14}: {results[arm]['wall_s']:.2f} s", flush=True)
    warm = float(np.median([results["warm"]["wall_s"], results["warm2"]["wall_s"]]))
    summary = {
        "first_fit_minus_warm_s": results["cold"]["wall_s"] - warm,
        "idle_fit_minus_warm_s": results["idle"]["wall_s"] - warm,
        "first_predict_minus_second_s": results["predict_first"]["wall_s"] - results["predict_again"]["wall_s"],
        "load_1min": os.getloadavg()[0],
    }
    trainer.close()
    spark.stop()
    return {"arms": results, "summary": summary, **config}


def main() -> None:
    p = harness.parser(__doc__, out="cold_start.json")
    p.add_argument("--idle", type=float, default=130.0, help="seconds without jobs before the 'idle' arm")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {sorted(CONFIGS)}")
    p.add_internal("--one", default=None)  # run one configuration here
    args = p.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_config(args.one, args.idle)), flush=True)
        return

    runs = {}
    for name in args.configs.split(","):
        if name not in CONFIGS:
            p.error(f"--configs: unknown configuration {name!r}; expected some of {sorted(CONFIGS)}")
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--idle", str(args.idle)],
                              capture_output=True, text=True)
        lines = proc.stdout.splitlines()
        sys.stdout.write("".join(line + "\n" for line in lines if not line.startswith("RESULT ")))
        result = [line for line in lines if line.startswith("RESULT ")]
        if proc.returncode or not result:
            raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
        runs[name] = json.loads(result[-1][len("RESULT "):])
    print(f"\n{'configuration':>15} | first fit − warm | idle fit − warm | first predict − second | load")
    for name, run in runs.items():
        s = run["summary"]
        print(f"{name:>15} | {s['first_fit_minus_warm_s']:+15.2f} s | {s['idle_fit_minus_warm_s']:+13.2f} s | "
              f"{s['first_predict_minus_second_s']:+19.2f} s | {s['load_1min']:.2f}")
    harness.write_results(args.out, args, conf=harness.settings(),
                          arm_conf={name: arm_conf(name) for name in runs if arm_conf(name)},
                          configs=runs, idle_s=args.idle)


if __name__ == "__main__":
    main()
