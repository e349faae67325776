"""Sparse rounds across hosts at 10 Mbit/s (issue 58's target): time to the dense arm's accuracy, whole fits.

Starts scripts/hosts.py's cluster (host 0: the master and the driver; one
1-core worker on each of 3 other hosts; every link shaped with ``tc tbf`` at
``--rate``, the driver's included; S3 on a host of its own, unshaped) and
runs this file again on host 0 as the driver (``--driver``), with the
README's settings (``benchmarks/harness.py``). The model: ``network.py``'s
MLP of about 1e6 parameters (64-13333-10, Adam inside), ``optimizer_state=
"local"`` and ``update_rule="diloco:outer_momentum=0.5"`` (what the sparse
codecs are for, docs/benchmarks/sparse_codecs.md), ``k`` minibatches of 32 a
round, generated data (scikit-learn's ``make_classification``: 64 features,
10 classes). Arms, interleaved per repeat, each a trainer of its own, the
data staged by an untimed first ``fit`` of one epoch:

* ``float32``: no ``update_compression`` (the dense arm: its final held-out accuracy is the target);
* ``int8``, ``topk``, ``threshold``: ``update_compression`` as named;
* ``topk-average``, ``threshold-average``: the same with ``update_rule="average"`` (no outer momentum), whose
  rounds change only the weights the workers sent: the ``"spark"`` transport then sends the state out as small
  patches too (docs/benchmarks/sparse_codecs.md, "The state sent as a patch").

Each arm's timed ``fit`` of ``--epochs`` epochs is timed whole; a callback
takes the held-out accuracy at each epoch's end on the driver (its own time
left out of the clock). Per arm: the fit's seconds, the seconds to the first
epoch end at or above the dense arm's final accuracy, the rounds' median wall
time and compute (slowest worker), the bytes through the driver's link per
round (in and out), the bytes a worker sent per round::

    sudo .venv/bin/python benchmarks/sparse_hosts.py [--rate 10mbit] [--k 64] [--epochs 4] [--repeats 1]

Results: benchmarks/results/sparse_hosts.json; the table for docs/benchmarks/sparse_codecs.md.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import hosts  # noqa: E402
from overlap_hosts import BATCH, WORKERS, attached, print_results, run_on_cluster  # noqa: E402  the same cluster

COMMON = dict(optimizer_state="local", update_rule="diloco:outer_momentum=0.5")
ARMS = {"float32": {}, "int8": dict(update_compression="int8"), "topk": dict(update_compression="topk"),
        "threshold": dict(update_compression="threshold"),
        "topk-average": dict(update_compression="topk", update_rule="average"),
        "threshold-average": dict(update_compression="threshold", update_rule="average")}


def drive(args) -> None:
    """On host 0: the arms, interleaved; appends a row per arm and repeat to ``args.out``."""
    import keras
    import numpy as np

    from network import mlp
    from sparkdl_avg import ParameterAveragingTrainer

    cluster, spark, df, (x_test, y_test) = attached(args)
    store = f"s3://{hosts.BUCKET}/sparse-hosts"
    driver_ns = cluster.hosts[0].ns

    class Clock(keras.callbacks.Callback):
        """Held-out accuracy at each epoch's end, and the fit's seconds to it without this callback's own."""

        def on_train_begin(self, logs=None):
            self.before, self.t0, self.own, self.points = cluster.counters(), time.monotonic(), 0.0, []

        def on_epoch_end(self, epoch, logs=None):
            t = time.monotonic()
            accuracy = float(np.mean(np.argmax(self.model.predict(x_test, verbose=0), axis=1) == y_test))
            self.points.append((t - self.t0 - self.own, accuracy))
            self.own += time.monotonic() - t

        def on_train_end(self, logs=None):
            after = cluster.counters()
            self.rx, self.tx = (after[driver_ns][k] - self.before[driver_ns][k] for k in ("rx", "tx"))

    for repeat in range(args.repeats):
        for arm in args.arms:
            row = {"arm": arm, "repeat": repeat, "k": args.k, "rate": cluster.rate, "workers": WORKERS,
                   "load_before": os.getloadavg()[0]}
            model = mlp(1e6)
            with ParameterAveragingTrainer(model, num_workers=WORKERS, batch_size=BATCH, averaging_frequency=args.k,
                                           seed=0, slow_warning=False, staging_dir=f"{store}/{arm}-{repeat}",
                                           **{**COMMON, **ARMS[arm]}) as trainer:
                trainer.fit(df, epochs=1, verbose=0)  # untimed: data staged, replicas built
                clock = Clock()
                t0 = time.monotonic()
                trainer.fit(df, epochs=args.epochs, verbose=0, callbacks=[clock])
                row["fit_s"] = time.monotonic() - t0 - clock.own
                records = trainer.stats.records
            med = statistics.median
            row.update(
                params=int(model.count_params()), rounds=len(records), curve=clock.points,
                accuracy=clock.points[-1][1], round_s=med(r.wall_s for r in records),
                compute_s=med(r.compute_max_s for r in records),
                sent_per_worker=med(r.sent_bytes / r.num_workers for r in records),
                state_per_round=med(r.state_bytes or 0 for r in records),
                state_per_round_each=[r.state_bytes for r in records],
                paths=sorted({f"{r.transport}/{r.aggregation}" for r in records}),
                path_per_round=[f"{r.transport}/{r.aggregation}" for r in records],
                round_s_per_round=[round(r.wall_s, 2) for r in records],
                driver_rx_per_round=clock.rx / len(records), driver_tx_per_round=clock.tx / len(records),
                load_after=os.getloadavg()[0])
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    spark.stop()


def summary(rows) -> str:
    med = statistics.median
    dense = [r for r in rows if r["arm"] == "float32"]
    target = med(r["accuracy"] for r in dense) if dense else None
    lines = [f"target: the float32 arm's final held-out accuracy, {target}" if target is not None else "",
             "| arm | path | fit s | s to the target | round s | compute s | sent / worker / round | state out / round | "
             "driver in / out MB per round | held-out acc |", "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in ARMS:
        rs = [r for r in rows if r["arm"] == arm]
        if not rs:
            continue
        reach = [next((t for t, a in r["curve"] if target is not None and a >= target), None) for r in rs]
        reached = [t for t in reach if t is not None]
        lines.append(f"| {arm} | {', '.join(rs[0]['paths'])} | {med(r['fit_s'] for r in rs):.1f} | "
                     f"{med(reached):.1f} |" if reached else
                     f"| {arm} | {', '.join(rs[0]['paths'])} | {med(r['fit_s'] for r in rs):.1f} | not reached |")
        lines[-1] += (f" {med(r['round_s'] for r in rs):.2f} | {med(r['compute_s'] for r in rs):.2f} | "
                      f"{med(r['sent_per_worker'] for r in rs):,.0f} | "
                      f"{med(r.get('state_per_round') or 0 for r in rs):,.0f} | "
                      f"{med(r['driver_rx_per_round'] for r in rs) / 1e6:.2f} / "
                      f"{med(r['driver_tx_per_round'] for r in rs) / 1e6:.2f} | {med(r['accuracy'] for r in rs):.4f} |")
    return "\n".join(lines)


def main() -> None:
    p = harness.parser(__doc__, out="sparse_hosts.json", repeats=1)
    p.add_argument("--rate", default="10mbit")
    p.add_argument("--k", type=int, default=64)
    p.add_argument("--epochs", type=int, default=4, help="timed epochs per arm (after one untimed epoch)")
    p.add_argument("--rounds-per-epoch", type=int, default=3)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_internal("--driver", action="store_true")
    p.add_argument("--table-only", action="store_true", help="print the table of --out and stop")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting of the driver's session beside README's (repeatable)")
    args = p.parse_args()
    if args.driver:
        drive(args)
        return
    if not args.table_only:
        run_on_cluster(os.path.abspath(__file__), args)
    print_results(args.out, summary)


if __name__ == "__main__":
    main()
