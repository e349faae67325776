"""Rounds that carry the changed rows of an ``Embedding(2**20, 8)`` against dense rounds: bytes and round time.

Fits ``Embedding(rows, 8) → Flatten → Dense(1)`` (ids in, mse) on ``local[2]``
with README's session (``benchmarks/harness.py``), 2 workers, ``batch`` ids per
minibatch, ``k`` minibatches per round, one epoch of ``rounds`` rounds, for SGD
and Adam (``optimizer_state="average"``: Adam's two moments of the table are
averaged too), in two arms interleaved per repeat:

* ``dense``: every worker sends its whole state (``n · w``, float32), as before
  ``sparkdl_avg/shared/wire/sparse_rows.py`` (forced by giving the trainer no tables);
* ``sparse``: the default: each worker sends its delta, the table's (and its
  slots') changed rows only, with their indices.

Every example's id is distinct, so a worker's round touches exactly
``k · batch`` rows of the table (``touched``). Per fit it records the bytes
each worker sent per round (``trainer.stats``), the rounds' wall time
(steady rounds: no replica build, no trace) and the largest weight
difference from the dense arm of the same repeat. Usage::

    PYSPARK_PYTHON=/work/main/.venv/bin/python /work/main/.venv/bin/python benchmarks/sparse_rounds.py

Writes ``benchmarks/results/sparse_rounds.json``.
"""

from __future__ import annotations

import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import harness  # noqa: E402

WORKERS, DIM = 2, 8


def model_for(rows: int, optimizer: str):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((1,), dtype="int64"), keras.layers.Embedding(rows, DIM),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    opt = keras.optimizers.SGD(0.1) if optimizer == "sgd" else keras.optimizers.Adam(1e-3)
    model.compile(optimizer=opt, loss="mse")
    return model


def fit(args, optimizer: str, arm: str, data):
    from sparkdl_avg import ParameterAveragingTrainer
    from sparkdl_avg.driver.observe.costmodel import is_cold
    from sparkdl_avg.driver.transport import base

    model = model_for(args.rows, optimizer)
    original = base.table_groups
    if arm == "dense":
        base.table_groups = lambda model, optimizer_sums: ()
    try:
        with ParameterAveragingTrainer(model, num_workers=WORKERS, batch_size=args.batch, averaging_frequency=args.k,
                                       seed=1) as trainer:
            trainer.fit(data, epochs=1, verbose=0)
            records = trainer.stats.records
    finally:
        base.table_groups = original
    steady = [r for r in records if not is_cold(r)] or records
    return model.get_weights(), {
        "optimizer": optimizer, "arm": arm,
        "sent_bytes_per_worker": [r.sent_bytes / r.num_workers for r in records],
        "round_s": statistics.median(r.wall_s for r in steady),
        "wait_s": statistics.median(r.job_s for r in steady),
        "encode_s": statistics.median(w.encode_s for r in steady for w in r.workers),
        "rounds": len(records),
    }


def main() -> None:
    p = harness.parser(__doc__, out="sparse_rounds.json", repeats=3)
    p.add_argument("--rows", type=int, default=2 ** 20, help="rows of the table (default: %(default)s)")
    p.add_argument("--batch", type=int, default=64, help="ids per minibatch (default: %(default)s)")
    p.add_argument("--k", type=int, default=8, help="minibatches per round (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=6, help="rounds per fit (default: %(default)s)")
    p.add_argument("--optimizers", nargs="+", default=["sgd", "adam"])
    args = p.parse_args()
    n = WORKERS * args.k * args.batch * args.rounds
    rng = np.random.default_rng(0)
    ids = rng.choice(args.rows, size=n, replace=False).astype(np.int64)[:, None]
    data = (ids, (ids[:, 0] % 97 / 97.0).astype(np.float32)[:, None])
    spark = harness.session("local[2]")
    rows = []
    try:
        for repeat in range(args.repeats):
            for optimizer in args.optimizers:
                weights = {}
                for arm in ("dense", "sparse"):
                    weights[arm], row = fit(args, optimizer, arm, data)
                    row["repeat"] = repeat
                    rows.append(row)
                diff = max(float(np.max(np.abs(a - b))) for a, b in zip(weights["sparse"], weights["dense"]))
                rows[-1]["max_abs_diff_vs_dense"] = diff
                print(rows[-2], "\n", rows[-1], flush=True)
                harness.write_results(args.out, args, rows=rows)
    finally:
        spark.stop()
    touched = args.k * args.batch
    for optimizer in args.optimizers:
        for arm in ("dense", "sparse"):
            mine = [r for r in rows if r["optimizer"] == optimizer and r["arm"] == arm]
            sent = statistics.median(b for r in mine for b in r["sent_bytes_per_worker"])
            slots = 1 if optimizer == "sgd" else 3
            print(f"{optimizer} {arm}: bytes/worker/round median {sent:,.0f} "
                  f"(= {sent / (touched * (4 + 4 * DIM * slots)):.2f}× this round's {touched} rows' bytes), "
                  f"round {1000 * statistics.median(r['round_s'] for r in mine):.0f} ms, "
                  f"job {1000 * statistics.median(r['wait_s'] for r in mine):.0f} ms, "
                  f"encoding {1000 * statistics.median(r['encode_s'] for r in mine):.1f} ms")


if __name__ == "__main__":
    sys.exit(main())
