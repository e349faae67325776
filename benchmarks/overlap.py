"""Overlapped rounds (issue 50, ``overlap_rounds``): accuracy and round times against synchronous rounds.

Fits the trainer on ``local[2]`` with README's session (``benchmarks/harness.py``),
2 workers, with ``benchmarks/diloco.py``'s datasets, models and measurements
(the digits 64-64-10 MLP: 1,500 examples, 10 epochs, held-out 297; the suite
CNN: 20,000 synthetic images, 3 epochs, held-out 2,000; ``Adam(1e-3)``), each
seed's arms one after another (interleaved, seeds outermost):

* ``local``: synchronous rounds, ``optimizer_state="local"`` (the arm overlap composes with);
* ``overlap-per-round``: the same with ``overlap_rounds=True`` (eager updates: each average applied one round
  late, each worker's own delta standing in for its share) and ``standing_rounds="off"``: each round a Spark
  job of its own (``state_transport="auto"``: files, as ``local``'s), so nothing announced ahead;
* ``overlap``: ``overlap_rounds=True``, its rounds in one standing job, each announced while the round before
  it trains (part 2: the workers go straight on to the next round while the driver reads, sums and applies
  theirs).

Also prints the timing table: per arm, the median round wall time and the
slowest worker's compute over the steady rounds (not the first of a fit),
their ratio, the fit's wall time (its staging included) and the rounds
announced ahead.

Prints diloco.py's table (medians over seeds of each arm's difference from
the first arm with the same seed: held-out accuracy, final training loss,
round and aggregate times). Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/overlap.py [--seeds 0 1 2] \\
        [--datasets digits cnn] [--ks digits:8 digits:32] [--workers 8] [--out ...]

Writes ``benchmarks/results/overlap.json``.

``--efficiency``: the issue's one-host target instead, on README's settings
(``benchmarks/suite.py``'s task: the suite CNN, 20,000 synthetic 28×28
images, 5,000 held out, ``Adam(1e-3)``, batch 32, 3 epochs, the same initial
weights): per repeat, interleaved, each fit after an untimed one-round fit
(warm workers, ``suite.warm_workers``), the arms ``one worker`` (1 worker on
one core, k = 128: the ideal is 2 × its compute throughput, as the suite's),
and at each ``--efficiency-ks`` k ``sync`` (README's arm, plain averaging),
``sync-local`` (``optimizer_state="local"``) and ``overlap``
(``optimizer_state="local"``, ``overlap_rounds=True``, rounds announced
ahead). An epoch's time is the time between two epochs' ends (epochs 2+:
under ``overlap_rounds`` the next epoch's first round starts before the
epoch ends); efficiency = the ideal epoch time / the arm's, medians over
repeats. Writes ``benchmarks/results/overlap_efficiency.json`` by default::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/overlap.py --efficiency [--repeats 3] \\
        [--efficiency-ks 128 312]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness  # noqa: E402
import diloco  # noqa: E402

ARMS = {
    "local": dict(optimizer_state="local"),
    "overlap-per-round": dict(optimizer_state="local", overlap_rounds=True, standing_rounds="off"),
    "overlap": dict(optimizer_state="local", overlap_rounds=True),
}


def main() -> int:
    p = harness.parser(__doc__, out="overlap.json", repeats=3,
                       repeats_help="--efficiency: repetitions of every arm, interleaved")
    p.add_argument("--efficiency", action="store_true", help="the suite CNN's warm-fit efficiency against the ideal")
    p.add_argument("--efficiency-ks", type=int, nargs="+", default=[128, 312])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--datasets", nargs="+", default=["digits"], choices=["digits", "cnn"])
    p.add_argument("--ks", nargs="*", default=None, metavar="DATASET:K", help="replace a dataset's k values")
    p.add_argument("--workers", type=int, default=diloco.WORKERS,
                   help="workers per fit, on local[workers] (default: %(default)s; issue 50's accuracy arm: 8)")
    args = p.parse_args()
    diloco.WORKERS = args.workers
    if args.efficiency:
        if args.out == harness.default_out("overlap.json"):
            args.out = harness.default_out("overlap_efficiency.json")
        return efficiency(args)
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


EFFICIENCY_ARMS = {
    "sync": {},
    "sync-local": dict(optimizer_state="local"),
    "overlap": dict(optimizer_state="local", overlap_rounds=True),
}
ONE = "one worker"
EXAMPLES, TEST_EXAMPLES, EPOCHS, BATCH = 20000, 5000, 3, 32  # benchmarks/suite.py's defaults (README's table)


def efficiency(args) -> int:
    """``--efficiency``: the arms, interleaved per repeat; prints and writes the table (see the module doc)."""
    import suite
    from bench_cnn import build_model, make_data

    x, y = make_data(EXAMPLES + TEST_EXAMPLES)
    d = {"x": x[:EXAMPLES], "y": y[:EXAMPLES], "xt": x[EXAMPLES:], "yt": y[EXAMPLES:],
         "weights": build_model().get_weights()}
    arms = [(ONE, 128, 1, {})] + [(arm, k, 2, options) for k in args.efficiency_ks
                                   for arm, options in EFFICIENCY_ARMS.items()]
    spark = harness.session("local[2]")
    rows = []
    try:
        spark.sparkContext.parallelize(range(2), 2).foreach(lambda _: __import__("tensorflow"))
        for rep in range(args.repeats):
            for arm, k, workers, options in arms:
                suite.warm_workers(d, BATCH, 2)
                row = {"repeat": rep, "arm": arm, "k": k, "load_1min": os.getloadavg()[0],
                       **efficiency_fit(d, k, workers, options, build_model)}
                rows.append(row)
                print({key: (round(v, 3) if isinstance(v, float) else v) for key, v in row.items()}, flush=True)
                harness.write_results(args.out, args, rows=rows)
    finally:
        spark.stop()
    print(efficiency_table(rows))
    return 0


def efficiency_fit(d, k: int, workers: int, options, build_model) -> dict:
    """One fit of the suite CNN; its epochs' times (between epoch ends), compute per epoch and held-out accuracy."""
    import keras

    from sparkdl_avg import ParameterAveragingTrainer

    model = build_model(d["weights"])
    ends = []

    class Ends(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            ends.append(time.perf_counter())

    with ParameterAveragingTrainer(model, num_workers=workers, batch_size=BATCH, averaging_frequency=k, seed=1,
                                   **options) as trainer:
        t0 = time.perf_counter()
        trainer.fit((d["x"], d["y"]), epochs=EPOCHS, verbose=0, callbacks=[Ends()])
        fit_s = time.perf_counter() - t0
        records = trainer.stats.records
    accuracy = float(model.evaluate(d["xt"], d["yt"], verbose=0, batch_size=256)[1])
    return {
        "epoch_s": [b - a for a, b in zip([t0] + ends, ends)],  # the first includes the fit's start (staging)
        "compute_per_epoch_s": [sum(r.compute_max_s for r in records if r.epoch == e) for e in range(EPOCHS)],
        "fit_s": fit_s, "accuracy": accuracy, "rounds": len(records),
        "announced_ahead": sum(1 for r in records if r.announced_ahead),
    }


def efficiency_table(rows) -> str:
    """Per arm and k: median epoch time (epochs 2+), examples/s, efficiency against the ideal, accuracy."""
    med = statistics.median
    one = [r for r in rows if r["arm"] == ONE]
    ideal = med(c for r in one for c in r["compute_per_epoch_s"][1:]) / 2
    lines = [f"ideal epoch (2 × one worker's compute throughput): {ideal:.3f} s, {EXAMPLES / ideal:.0f} examples/s",
             "| arm | k | epoch s (median, epochs 2+) | examples/s | efficiency vs ideal | held-out acc (median) | "
             "rounds ahead | load (median) |", "|---|---|---|---|---|---|---|---|"]
    for arm, k in dict.fromkeys((r["arm"], r["k"]) for r in rows):
        mine = [r for r in rows if (r["arm"], r["k"]) == (arm, k)]
        epoch = med(t for r in mine for t in r["epoch_s"][1:])
        lines.append(f"| {arm} | {k} | {epoch:.3f} | {EXAMPLES / epoch:.0f} | {ideal / epoch:.1%} | "
                     f"{med(r['accuracy'] for r in mine):.4f} | {med(r['announced_ahead'] for r in mine):.0f}/"
                     f"{med(r['rounds'] for r in mine):.0f} | {med(r['load_1min'] for r in mine):.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
