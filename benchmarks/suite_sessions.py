"""What the test suite pays when a test module's Spark session is restarted instead of kept for the next module.

tests/conftest.py shares one session among the modules that ask for the same master and settings
(``shared_spark``). This measures what keeping it saves per module boundary, on one ``local[2]``
application, the two arms interleaved so that both see the same machine load:

* ``kept``: the next module's first fit on the running session: a new small model (a name of its own,
  so a replica is built, as a new module's model needs one), 2 workers, 1 epoch of 64 examples;
* ``restart``: ``stop()`` and a new session first (what ``spark_session`` or a module's own session
  costs), then the same fit: a new SparkContext in the running JVM, the Python workers forked anew
  from ``sparkdl_avg.daemon`` (README's settings, as the suite's sessions have).

Prints a table and writes JSON (``--out``). Run:
``PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/suite_sessions.py --repeats 5`` (≈ 2 min).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness  # noqa: E402


def small_fit(index: int) -> float:
    """Seconds of one fit of a new model named ``m<index>`` (a fingerprint of its own: its replicas are built)."""
    import keras
    import numpy as np

    from sparkdl_avg import ParameterAveragingTrainer

    rng = np.random.default_rng(index)
    x, y = rng.normal(size=(64, 4)), rng.normal(size=(64, 1))
    keras.utils.set_random_seed(index)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8, activation="tanh")(inputs)),
                        name=f"m{index}")
    model.compile("sgd", "mse")
    start = time.perf_counter()
    ParameterAveragingTrainer(model, num_workers=2, batch_size=8, averaging_frequency=2, seed=0,
                              slow_warning=False).fit((x, y), epochs=1, verbose=0)
    return time.perf_counter() - start


def main() -> None:
    args = harness.parser(__doc__.splitlines()[0], out="suite_sessions.json", repeats=5).parse_args()
    spark = harness.session("local[2]")
    small_fit(0)  # the application's first fit: the workers' start, not what either arm measures
    runs = {"kept": [], "restart": []}
    for i in range(args.repeats):
        for arm in ("kept", "restart") if i % 2 == 0 else ("restart", "kept"):
            start = time.perf_counter()
            if arm == "restart":
                spark.stop()
                spark = harness.session("local[2]")
            small_fit(1 + 2 * i + (arm == "restart"))
            runs[arm].append(time.perf_counter() - start)
    spark.stop()
    medians = {arm: statistics.median(times) for arm, times in runs.items()}
    rows = [{"arm": arm, "median_s": round(medians[arm], 2), "runs_s": [round(t, 2) for t in runs[arm]]}
            for arm in runs]
    per_restart = medians["restart"] - medians["kept"]
    for row in rows:
        print(f"{row['arm']:8s} median {row['median_s']:6.2f} s  runs {row['runs_s']}")
    print(f"one restart costs {per_restart:.2f} s more than a kept session")
    harness.write_results(args.out, args, rows=rows, restart_cost_s=round(per_restart, 2))


if __name__ == "__main__":
    main()
