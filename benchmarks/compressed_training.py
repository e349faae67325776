"""``update_compression`` in real fits: accuracy, loss curve, bytes and encoding time against float32 sums.

Fits the trainer on ``local[2]`` with README's session (``benchmarks/harness.py``),
2 workers, for each dataset, ``k``, update rule, seed and arm, interleaved (a
seed's arms run one after another):

* ``cnn``: the suite CNN (``bench_cnn.py``: 20,000 synthetic 28×28 images,
  Adam, held-out 2,000), ``k`` = 32 and 128, 3 epochs; plain averaging, and BMUF at k = 32;
* ``digits``: scikit-learn's digits (a 64-64-10 MLP, Adam; held-out 297), ``k`` = 8, 10 epochs.

Arms: ``none`` (float32 sums), ``bf16``, ``bf16+ef`` (with error feedback)
and ``int8`` (weights in int8 with error feedback, Adam's moments in bf16).
Seeds change the initial weights and the data order. Per fit it records the
held-out accuracy, the training loss per epoch, the bytes each worker sent
per round and the workers' encoding and residual-file time against their
compute (steady rounds: no replica build, no trace). Prints a Markdown table
of the medians over seeds of each arm's difference from ``none`` with the
same seed. Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/compressed_training.py [--seeds 0 1 2]

Writes ``benchmarks/results/compressed_training.json``.
"""

from __future__ import annotations

import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import harness  # noqa: E402
from bench_cnn import build_model, make_data  # noqa: E402

ARMS = {"none": {}, "bf16": dict(update_compression="bf16"),
        "bf16+ef": dict(update_compression="bf16", error_feedback=True), "int8": dict(update_compression="int8")}
WORKERS, BATCH = 2, 32


def digits_model(seed: int):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def datasets():
    from sklearn.datasets import load_digits

    x, y = make_data(22000, seed=0)  # one draw of the prototypes: the held-out images are of the same classes
    x, y, xt, yt = x[:20000], y[:20000], x[20000:], y[20000:]
    dx, dy = load_digits(return_X_y=True)
    dx = (dx / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(dx))
    dx, dy = dx[order], dy[order].astype(np.int32)
    return {
        "cnn": dict(data=(x, y), test=(xt, yt), epochs=3, runs=[(32, None), (128, None), (32, "bmuf")]),
        "digits": dict(data=(dx[:1500], dy[:1500]), test=(dx[1500:], dy[1500:]), epochs=10, runs=[(8, None)]),
    }


def model_for(name: str, seed: int):
    if name == "digits":
        return digits_model(seed)
    import keras

    model = build_model()
    keras.utils.set_random_seed(seed)  # other initial weights per seed: a fresh model of the same shapes
    fresh = keras.models.clone_model(model)
    model.set_weights(fresh.get_weights())
    return model


def fit(name: str, d: dict, k: int, rule, seed: int, arm: str) -> dict:
    from sparkdl_avg import ParameterAveragingTrainer
    from sparkdl_avg.driver.observe.costmodel import is_cold

    model = model_for(name, seed)
    with ParameterAveragingTrainer(model, num_workers=WORKERS, batch_size=BATCH, averaging_frequency=k,
                                   update_rule=rule, seed=seed, **ARMS[arm]) as trainer:
        history = trainer.fit(d["data"], epochs=d["epochs"], verbose=0)
        records = trainer.stats.records
    accuracy = float(model.evaluate(*d["test"], verbose=0, batch_size=256)[1])
    steady = [r for r in records if not is_cold(r)] or records
    workers = [w for r in steady for w in r.workers]
    return {
        "dataset": name, "k": k, "rule": rule or "average", "seed": seed, "arm": arm,
        "accuracy": accuracy, "loss": [float(v) for v in history.history["loss"]],
        "sent_bytes_per_worker": statistics.median(r.sent_bytes / r.num_workers for r in records),
        "encode_share": sum(w.encode_s for w in workers) / sum(w.compute_s for w in workers),
        "feedback_share": sum(w.feedback_s for w in workers) / sum(w.compute_s for w in workers),
        "round_ms": 1000 * statistics.median(r.wall_s for r in steady),
        "rounds": len(records),
    }


def table(rows) -> str:
    lines = ["| dataset | k | rule | arm | held-out acc (median) | Δ acc vs none (median) | worst loss Δ after epoch 1 "
             "(median) | bytes vs float32 | encoding / compute | residual files / compute |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["dataset"], r["k"], r["rule"]) for r in rows}, key=str)
    for dataset, k, rule in keys:
        group = [r for r in rows if (r["dataset"], r["k"], r["rule"]) == (dataset, k, rule)]
        base = {r["seed"]: r for r in group if r["arm"] == "none"}
        for arm in ARMS:
            mine = [r for r in group if r["arm"] == arm and r["seed"] in base]
            if not mine:
                continue
            dacc = statistics.median(r["accuracy"] - base[r["seed"]]["accuracy"] for r in mine)
            dloss = statistics.median(
                max(abs(a - b) / b for a, b in zip(r["loss"][1:], base[r["seed"]]["loss"][1:])) for r in mine)
            ratio = statistics.median(r["sent_bytes_per_worker"] / base[r["seed"]]["sent_bytes_per_worker"]
                                      for r in mine)
            lines.append(
                f"| {dataset} | {k} | {rule} | {arm} | {statistics.median(r['accuracy'] for r in mine):.4f} | "
                f"{dacc:+.4f} | {100 * dloss:.2f}% | {ratio:.3f}× | "
                f"{100 * statistics.median(r['encode_share'] for r in mine):.2f}% | "
                f"{100 * statistics.median(r['feedback_share'] for r in mine):.2f}% |")
    return "\n".join(lines)


def main() -> None:
    p = harness.parser(__doc__, out="compressed_training.json")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--datasets", nargs="+", default=["cnn", "digits"])
    p.add_argument("--table-only", action="store_true", help="print the table of --out and stop")
    args = p.parse_args()
    if args.table_only:
        import json

        with open(args.out) as f:
            print(table(json.load(f)["rows"]))
        return
    spark = harness.session("local[2]")
    data = datasets()
    rows = []
    try:
        for name in args.datasets:
            d = data[name]
            for k, rule in d["runs"]:
                for seed in args.seeds:
                    for arm in ARMS:
                        if rule is not None and arm in ("bf16", "bf16+ef"):
                            continue  # BMUF: float32 against int8
                        row = fit(name, d, k, rule, seed, arm)
                        rows.append(row)
                        print(row, flush=True)
                        harness.write_results(args.out, args, rows=rows)
    finally:
        spark.stop()
    print(table(rows))


if __name__ == "__main__":
    sys.exit(main())
