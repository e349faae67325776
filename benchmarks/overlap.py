"""Overlapped rounds (issue 50, ``overlap_rounds``): accuracy and round times against synchronous rounds.

Fits the trainer on ``local[2]`` with README's session (``benchmarks/harness.py``),
2 workers, with ``benchmarks/diloco.py``'s datasets, models and measurements
(the digits 64-64-10 MLP: 1,500 examples, 10 epochs, held-out 297; the suite
CNN: 20,000 synthetic images, 3 epochs, held-out 2,000; ``Adam(1e-3)``), each
seed's arms one after another (interleaved, seeds outermost):

* ``local``: synchronous rounds, ``optimizer_state="local"`` (the arm overlap composes with);
* ``overlap``: the same with ``overlap_rounds=True`` (eager updates: each average applied one round late,
  each worker's own delta standing in for its share).

Prints diloco.py's table (medians over seeds of each arm's difference from
the first arm with the same seed: held-out accuracy, final training loss,
round and aggregate times). Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/overlap.py [--seeds 0 1 2] \\
        [--datasets digits cnn] [--ks digits:8 digits:32] [--workers 8] [--out ...]

Writes ``benchmarks/results/overlap.json``.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness  # noqa: E402
import diloco  # noqa: E402

ARMS = {
    "local": dict(optimizer_state="local"),
    "overlap": dict(optimizer_state="local", overlap_rounds=True),
}


def main() -> int:
    p = harness.parser(__doc__, out="overlap.json")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--datasets", nargs="+", default=["digits"], choices=["digits", "cnn"])
    p.add_argument("--ks", nargs="*", default=None, metavar="DATASET:K", help="replace a dataset's k values")
    p.add_argument("--workers", type=int, default=diloco.WORKERS,
                   help="workers per fit, on local[workers] (default: %(default)s; issue 50's accuracy arm: 8)")
    args = p.parse_args()
    diloco.WORKERS = args.workers
    diloco.ARMS.clear()
    diloco.ARMS.update(ARMS)  # diloco.fit reads its arms' options from there; its table's base arm is the first
    plan = diloco.runs()
    if args.ks:
        for name in plan:
            plan[name]["ks"] = [int(spec.split(":")[1]) for spec in args.ks if spec.split(":")[0] == name]
    spark = harness.session(f"local[{max(2, args.workers)}]")
    rows = []
    try:
        for seed in args.seeds:
            for name in args.datasets:
                for k in plan[name]["ks"]:
                    for arm in ARMS:
                        row = diloco.fit(name, plan[name], k, seed, arm)
                        rows.append(row)
                        print({key: v for key, v in row.items() if key != "loss"}, flush=True)
                        harness.write_results(args.out, args, rows=rows)
    finally:
        spark.stop()
    print(table(rows))
    return 0


def table(rows) -> str:
    """diloco.py's table with ``local`` as its base arm (named ``none`` there)."""
    diloco.ARMS.clear()
    diloco.ARMS.update({"none": ARMS["local"], "overlap": ARMS["overlap"]})
    return diloco.table([{**r, "arm": "none" if r["arm"] == "local" else r["arm"]} for r in rows])


if __name__ == "__main__":
    sys.exit(main())
