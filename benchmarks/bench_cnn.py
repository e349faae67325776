"""Benchmark of the foundation issue: plain Keras in one process vs the trainer on local[2].

A CNN with two conv layers (~31k parameters) on 20,000 synthetic 28×28
images (10 classes: noisy, randomly shifted class prototypes; generated, no
download), batch 32, 3 epochs. Arms, run one after the other in one process
so that they see the same machine:

* ``keras``: ``model.fit`` in this process, TensorFlow using all cores, with
  the default ``steps_per_execution=1`` and with 128 (Keras' own multi-step
  graph loop, a stronger baseline);
* ``trainer k=32`` and ``trainer k=128``: ``ParameterAveragingTrainer`` on
  ``local[2]`` with 2 workers.

Each arm starts from the same initial weights and is repeated ``--repeats``
times; the table reports medians. The session has the README's settings
(``benchmarks/harness.py``). Usage::

    make bench            # or: PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/bench_cnn.py

Results go to ``benchmarks/results/cnn.json`` and are printed as Markdown.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np

import harness


def make_data(n: int, seed: int = 0):
    """Noisy, shifted class prototypes: learnable, but not in one epoch."""
    rng = np.random.default_rng(seed)
    protos = np.zeros((10, 28, 28), dtype=np.float32)
    yy, xx = np.mgrid[0:28, 0:28]
    for c in range(10):
        for _ in range(3):
            cy, cx = rng.uniform(6, 22, size=2)
            s = rng.uniform(2, 4)
            protos[c] += np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * s * s))
    y = rng.integers(0, 10, size=n)
    shifts = rng.integers(-2, 3, size=(n, 2))
    x = np.empty((n, 28, 28), dtype=np.float32)
    for i in range(n):
        x[i] = np.roll(protos[y[i]], tuple(shifts[i]), axis=(0, 1))
    x += rng.normal(0, 0.6, size=x.shape).astype(np.float32)
    return x[..., None], y.astype(np.int32)


def build_model(weights=None, steps_per_execution=1):
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        keras.optimizers.Adam(1e-3),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )
    if weights is not None:
        model.set_weights(weights)
    return model


class EpochTimer:
    """Keras callback recording wall time per epoch."""

    def __new__(cls):
        import keras

        class _Timer(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self._t = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                self.times.append(time.perf_counter() - self._t)

        timer = _Timer()
        timer.times = []
        return timer


def run_keras(x, y, xt, yt, weights, epochs, batch, steps_per_execution=1):
    model = build_model(weights, steps_per_execution)
    timer = EpochTimer()
    t0 = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=True, verbose=0, callbacks=[timer])
    total = time.perf_counter() - t0
    acc = model.evaluate(xt, yt, verbose=0)[1]
    return {"epoch_s": timer.times, "fit_s": total, "accuracy": float(acc)}


def run_trainer(x, y, xt, yt, weights, epochs, batch, k, workers):
    from sparkdl_avg import ParameterAveragingTrainer

    model = build_model(weights)
    timer = EpochTimer()
    with ParameterAveragingTrainer(model, num_workers=workers, batch_size=batch, averaging_frequency=k, seed=1) as tr:
        t0 = time.perf_counter()
        tr.fit((x, y), epochs=epochs, verbose=0, callbacks=[timer])
        total = time.perf_counter() - t0
        acc = model.evaluate(xt, yt, verbose=0)[1]
        summary = tr.stats.summary()
        rounds = tr.stats.records
    pids = {w["pid"] for r in rounds for w in r["workers"]}
    return {
        "epoch_s": timer.times,
        "fit_s": total,
        "accuracy": float(acc),
        "overhead_s_median": summary["overhead_s_median"],
        "wall_minus_compute_s_median": statistics.median(r["wall_s"] - r["compute_max_s"] for r in rounds),
        "compute_share": summary["compute_share"],
        "rounds": summary["rounds"],
        "replicas_built": summary["replicas_built"],
        "python_workers": len(pids),
    }


def main() -> None:
    p = harness.parser(__doc__, out="cnn.json", repeats=3)
    p.add_argument("--examples", type=int, default=20000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--frequencies", type=int, nargs="+", default=[32, 128])
    args = p.parse_args()

    x, y = make_data(args.examples + 5000)
    x, xt, y, yt = x[: args.examples], x[args.examples :], y[: args.examples], y[args.examples :]
    weights = build_model().get_weights()
    spark = harness.session("local[2]")
    # Warm the Python workers' imports once so no arm pays for them alone.
    spark.sparkContext.parallelize(range(2), 2).foreach(lambda _: __import__("tensorflow"))

    arms = {
        "keras (1 process)": lambda: run_keras(x, y, xt, yt, weights, args.epochs, args.batch_size),
        # A stronger single-process baseline: Keras' own multi-step graph loop,
        # the same trick the trainer's workers use.
        "keras (1 process, steps_per_execution=128)": lambda: run_keras(
            x, y, xt, yt, weights, args.epochs, args.batch_size, steps_per_execution=128
        ),
    }
    for k in args.frequencies:
        arms[f"trainer local[2] k={k}"] = (
            lambda k=k: run_trainer(x, y, xt, yt, weights, args.epochs, args.batch_size, k, 2)
        )
    results = {name: [] for name in arms}
    for rep in range(args.repeats):
        for name, fn in arms.items():  # interleaved, so drift hits every arm alike
            r = fn()
            results[name].append(r)
            print(f"[{rep}] {name}: epochs {[round(t, 2) for t in r['epoch_s']]} acc {r['accuracy']:.4f}", flush=True)
    spark.stop()

    base = statistics.median(t for r in results["keras (1 process)"] for t in r["epoch_s"][1:] or r["epoch_s"])
    rows = []
    for name, runs in results.items():
        epoch = statistics.median(t for r in runs for t in (r["epoch_s"][1:] or r["epoch_s"]))
        row = {
            "arm": name,
            "epoch_s_median": epoch,
            "first_epoch_s_median": statistics.median(r["epoch_s"][0] for r in runs),
            "fit_s_median": statistics.median(r["fit_s"] for r in runs),
            "ratio_to_keras": epoch / base,
            "accuracy_median": statistics.median(r["accuracy"] for r in runs),
        }
        if "overhead_s_median" in runs[0]:
            row["round_overhead_ms_median"] = 1000 * statistics.median(r["overhead_s_median"] for r in runs)
            row["wall_minus_compute_ms_median"] = 1000 * statistics.median(r["wall_minus_compute_s_median"] for r in runs)
            row["replicas_built_per_fit"] = max(r["replicas_built"] for r in runs)
            row["python_workers"] = max(r["python_workers"] for r in runs)
        rows.append(row)
    harness.write_results(args.out, args, rows=rows, runs=results)

    print(
        "\n| arm | epoch s (median, epochs 2+) | ratio to keras | first epoch s | fit s | held-out acc "
        "| round wall − slowest busy, ms | round wall − slowest compute, ms | replicas built / fit |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['arm']} | {r['epoch_s_median']:.2f} | {r['ratio_to_keras']:.2f} | {r['first_epoch_s_median']:.2f} | "
            f"{r['fit_s_median']:.2f} | {r['accuracy_median']:.4f} | "
            f"{r.get('round_overhead_ms_median', float('nan')):.0f} | "
            f"{r.get('wall_minus_compute_ms_median', float('nan')):.0f} | {r.get('replicas_built_per_fit', '-')} |"
        )


if __name__ == "__main__":
    main()
