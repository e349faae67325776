"""``sync_fragments`` (issue 50, part 3): a round's bytes per worker against F, and digits accuracy against F.

Fits the trainer on ``local[2]`` with README's session (``benchmarks/harness.py``), 2 workers, batch 32,
``optimizer_state="local"`` (each worker keeps its Adam moments, so only the weights' fragment travels), for each
seed and ``F`` in ``--fragments`` (default 1 2 4), the ``F`` arms of a seed one after another:

* ``bytes``: a 352-352×8-10 MLP with Keras' Adam(1e-3) (997,578 parameters in eight equal hidden layers, so
  that fragments of whole variables can be balanced) on 4,096 synthetic examples,
  ``k = 8``, one epoch (8 rounds): each round's bytes per worker (``RoundRecord.sent_bytes / num_workers``), the
  largest over the rounds against F = 1's, and the target ``≤ 1.1/F``;
* ``digits``: ``compressed_training.py``'s digits 64-64-10 MLP (1,500 examples, 297 held out), 10 epochs,
  ``k = 8``: the held-out accuracy against F = 1's with the same seed.

Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/fragments.py [--seeds 0 1 2] [--fragments 1 2 4]

Writes ``benchmarks/results/fragments.json`` and prints a Markdown table.
"""

from __future__ import annotations

import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import harness  # noqa: E402
from compressed_training import BATCH, WORKERS, digits_model  # noqa: E402


WIDTH = 352


def mlp(seed: int):
    """352 inputs, eight Dense(352, relu), Dense(10) softmax, Adam: 997,578 parameters."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((WIDTH,))] + [keras.layers.Dense(WIDTH, activation="relu")
                                                         for _ in range(8)]
                             + [keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def digits_data() -> dict:
    """``compressed_training.py``'s digits split (its ``datasets()`` also draws the CNN's 22,000 images)."""
    from sklearn.datasets import load_digits

    dx, dy = load_digits(return_X_y=True)
    dx = (dx / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(dx))
    dx, dy = dx[order], dy[order].astype(np.int32)
    return {"data": (dx[:1500], dy[:1500]), "test": (dx[1500:], dy[1500:])}


def fit(kind: str, F: int, seed: int, data, test=None) -> dict:
    from sparkdl_avg import ParameterAveragingTrainer

    model = mlp(seed) if kind == "bytes" else digits_model(seed)
    epochs = 1 if kind == "bytes" else 10
    with ParameterAveragingTrainer(model, num_workers=WORKERS, batch_size=BATCH, averaging_frequency=8, seed=seed,
                                   optimizer_state="local", sync_fragments=F, slow_warning=False) as trainer:
        trainer.fit(data, epochs=epochs, verbose=0)
        records = trainer.stats.records
    row = {"kind": kind, "F": F, "seed": seed, "rounds": len(records),
           "bytes_per_worker": [r.sent_bytes / r.num_workers for r in records],
           "round_ms": 1000 * statistics.median(r.wall_s for r in records[1:] or records),
           "params": int(sum(np.asarray(w).size for w in model.get_weights()))}
    if test is not None:
        row["accuracy"] = float(model.evaluate(*test, verbose=0, batch_size=256)[1])
    return row


def table(rows) -> str:
    base = {(r["kind"], r["seed"]): r for r in rows if r["F"] == 1}
    out = ["| F | bytes/worker, largest round / F=1's (median over seeds) | target 1.1/F | digits accuracy − F=1's "
           "(median) | digits accuracy (median) |", "|---|---|---|---|---|"]
    for F in sorted({r["F"] for r in rows}):
        ratio = [max(r["bytes_per_worker"]) / max(base[("bytes", r["seed"])]["bytes_per_worker"])
                 for r in rows if r["F"] == F and r["kind"] == "bytes" and ("bytes", r["seed"]) in base]
        acc = [r["accuracy"] for r in rows if r["F"] == F and r["kind"] == "digits"]
        diff = [r["accuracy"] - base[("digits", r["seed"])]["accuracy"]
                for r in rows if r["F"] == F and r["kind"] == "digits" and ("digits", r["seed"]) in base]
        med = lambda v, f: f.format(statistics.median(v)) if v else "–"  # noqa: E731
        out.append(f"| {F} | {med(ratio, '{:.3f}')} | {1.1 / F:.3f} | {med(diff, '{:+.4f}')} | {med(acc, '{:.4f}')} |")
    return "\n".join(out)


def main() -> None:
    p = harness.parser(__doc__, out="fragments.json")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--fragments", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--kinds", nargs="+", default=["bytes", "digits"])
    args = p.parse_args()
    spark = harness.session("local[2]")
    digits = None
    rng = np.random.default_rng(0)
    synthetic = (rng.normal(size=(4096, WIDTH)).astype(np.float32), rng.integers(0, 10, 4096).astype(np.int32))
    rows = []
    try:
        for seed in args.seeds:
            for kind in args.kinds:
                for F in args.fragments:
                    if kind == "bytes":
                        row = fit(kind, F, seed, synthetic)
                    else:
                        if digits is None:
                            digits = digits_data()
                        row = fit(kind, F, seed, digits["data"], digits["test"])
                    rows.append(row)
                    print({k: v for k, v in row.items() if k != "bytes_per_worker"}, max(row["bytes_per_worker"]),
                          flush=True)
                    harness.write_results(args.out, args, rows=rows)
    finally:
        spark.stop()
    print(table(rows))
    print("load:", os.getloadavg(), file=sys.stderr)


if __name__ == "__main__":
    main()
