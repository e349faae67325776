"""Overlapped rounds (issue 50, ``overlap_rounds``): accuracy and round times against synchronous rounds.

Fits the trainer on ``local[2]`` with README's session (``benchmarks/harness.py``),
2 workers, with ``benchmarks/diloco.py``'s datasets, models and measurements
(the digits 64-64-10 MLP: 1,500 examples, 10 epochs, held-out 297; the suite
CNN: 20,000 synthetic images, 3 epochs, held-out 2,000; ``Adam(1e-3)``), each
seed's arms one after another (interleaved, seeds outermost):

* ``local``: synchronous rounds, ``optimizer_state="local"`` (the arm overlap composes with);
* ``overlap-seq``: the same with ``overlap_rounds=True`` (eager updates: each average applied one round late,
  each worker's own delta standing in for its share), its rounds one after another in the standing job
  (``sparkdl_avg.driver.fit.rounds.PIPELINE = False``);
* ``overlap``: the same, each round announced while the round before it trains (part 2: the workers go
  straight on to the next round while the driver reads, sums and applies theirs).

Also prints the timing table: per arm, the median round wall time and the
slowest worker's compute over the steady rounds (not the first of a fit),
their ratio, the fit's wall time (its staging included) and the rounds
announced ahead.

Prints diloco.py's table (medians over seeds of each arm's difference from
the first arm with the same seed: held-out accuracy, final training loss,
round and aggregate times). Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/overlap.py [--seeds 0 1 2] \\
        [--datasets digits cnn] [--ks digits:8 digits:32] [--out ...]

Writes ``benchmarks/results/overlap.json``.
"""

from __future__ import annotations

import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness  # noqa: E402
import diloco  # noqa: E402
from sparkdl_avg.driver.fit import rounds  # noqa: E402

ARMS = {
    "local": dict(optimizer_state="local"),
    "overlap-seq": dict(optimizer_state="local", overlap_rounds=True),
    "overlap": dict(optimizer_state="local", overlap_rounds=True),
}


def main() -> int:
    p = harness.parser(__doc__, out="overlap.json")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--datasets", nargs="+", default=["digits"], choices=["digits", "cnn"])
    p.add_argument("--ks", nargs="*", default=None, metavar="DATASET:K", help="replace a dataset's k values")
    args = p.parse_args()
    diloco.ARMS.clear()
    diloco.ARMS.update(ARMS)  # diloco.fit reads its arms' options from there; its table's base arm is the first
    plan = diloco.runs()
    if args.ks:
        for name in plan:
            plan[name]["ks"] = [int(spec.split(":")[1]) for spec in args.ks if spec.split(":")[0] == name]
    spark = harness.session("local[2]")
    rows = []
    try:
        for seed in args.seeds:
            for name in args.datasets:
                for k in plan[name]["ks"]:
                    for arm in ARMS:
                        rounds.PIPELINE = arm != "overlap-seq"
                        row = diloco.fit(name, plan[name], k, seed, arm)
                        rows.append(row)
                        print({key: v for key, v in row.items() if key != "loss"}, flush=True)
                        harness.write_results(args.out, args, rows=rows)
    finally:
        spark.stop()
    print(table(rows))
    print(timing(rows))
    return 0


def table(rows) -> str:
    """diloco.py's table with ``local`` as its base arm (named ``none`` there)."""
    diloco.ARMS.clear()
    diloco.ARMS.update({"none": ARMS["local"], **{a: o for a, o in ARMS.items() if a != "local"}})
    return diloco.table([{**r, "arm": "none" if r["arm"] == "local" else r["arm"]} for r in rows])


def timing(rows) -> str:
    """Round wall time against the slowest worker's compute, per arm (medians over seeds)."""
    med = statistics.median
    lines = ["| dataset | k | arm | round ms | compute (slowest) ms | round / compute | round vs local | fit s | "
             "fit vs local | rounds ahead |", "|---|---|---|---|---|---|---|---|---|---|"]
    for dataset, k in sorted({(r["dataset"], r["k"]) for r in rows}):
        group = [r for r in rows if (r["dataset"], r["k"]) == (dataset, k)]
        base = {r["seed"]: r for r in group if r["arm"] == "local"}
        for arm in ARMS:
            mine = [r for r in group if r["arm"] == arm and r["seed"] in base]
            if not mine:
                continue
            b = [base[r["seed"]] for r in mine]
            lines.append(
                f"| {dataset} | {k} | {arm} | {med(r['round_ms'] for r in mine):.0f} | "
                f"{med(r['compute_max_ms'] for r in mine):.0f} | "
                f"{med(r['round_ms'] / r['compute_max_ms'] for r in mine):.2f} | "
                f"{med(r['round_ms'] / s['round_ms'] for r, s in zip(mine, b)):.2f}× | "
                f"{med(r['fit_s'] for r in mine):.1f} | {med(r['fit_s'] / s['fit_s'] for r, s in zip(mine, b)):.2f}× | "
                f"{med(r['announced_ahead'] for r in mine):.0f}/{med(r['rounds'] for r in mine):.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
