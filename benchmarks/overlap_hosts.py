"""Overlapped rounds across hosts (issue 50's target): 3 worker hosts on 100 Mbit/s links, sync rounds against overlap.

Starts scripts/hosts.py's cluster (host 0: the master and the driver; one
1-core worker on each other host; every link shaped with ``tc tbf``, the
driver's included; S3 on a host of its own, unshaped) and runs this file
again on host 0 as the driver (``--driver``), with the README's settings
(``benchmarks/harness.py``). The model is an MLP of about 1e6 parameters
(``network.py``'s, Adam) with ``optimizer_state="local"`` (each worker keeps
its Adam state: only weights travel), ``k`` minibatches of 32 a round,
trained on generated data (scikit-learn's ``make_classification``: 64
features, 10 classes) of ``--rounds-per-epoch`` rounds an epoch. Arms,
interleaved per repeat, each a trainer of its own:

* ``sync``: synchronous rounds, ``state_transport="auto"`` (what it takes there);
* ``overlap``: ``overlap_rounds=True`` (the standing job through the driver's socket);
* ``overlap-jobs`` (not run by default): the same with one Spark job per round
  (``standing_rounds="off"``, ``state_transport="sql"``: the Spark SQL rounds
  one after another, as under Spark Connect across hosts), what a job per round
  costs there.

Each arm fits one epoch to warm its replicas, then ``--epochs`` measured
epochs. Per arm: the measured ``fit`` call's wall time as a user times it
(``whole fit``; "vs sync" is sync's over the arm's: the same examples) and where it goes (the seconds before the
first round starts, each round's wall time on the driver, the seconds after the last round ends), the steady round period (the time between the first and
the last measured rounds' ends over the rounds between them), throughput
(examples a second), the round records' median compute (slowest worker) and
wall time, the bytes through the driver's link per round, and the held-out
accuracy after the fit. ``communication`` is the sync arm's median round
time beyond its compute (the time overlap hides); the target is each
overlapped round ≤ 1.15 × max(compute, communication), and throughput ≥ 1.5×
sync's at held-out accuracy within 0.02.

    sudo .venv/bin/python benchmarks/overlap_hosts.py [--rate 100mbit] [--k 192] [--repeats 2] [--epochs 2]
        [--arms sync overlap overlap-jobs]

Results: benchmarks/results/overlap_hosts.json; the table for docs/benchmarks/overlap.md.
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

WORKERS = 3
BATCH = 32
TEST = 5000
CONF = {"spark.executor.memory": "768m", "spark.driver.memory": "2g", "spark.driver.maxResultSize": "0"}
ARMS = {"sync": dict(optimizer_state="local"), "overlap": dict(optimizer_state="local", overlap_rounds=True),
        "overlap-jobs": dict(optimizer_state="local", overlap_rounds=True, standing_rounds="off",
                             state_transport="sql")}  # one Spark SQL job per round (no standing job)


def data(args):
    import numpy as np
    from sklearn.datasets import make_classification

    n = WORKERS * BATCH * args.k * args.rounds_per_epoch
    x, y = make_classification(n_samples=n + TEST, n_features=64, n_informative=32, n_classes=10,
                               n_clusters_per_class=1, random_state=0)
    return x[:n].astype(np.float32), y[:n], x[n:].astype(np.float32), y[n:]


def attached(args):
    """On host 0: the running cluster, a session on its master (README's settings), the training data as a cached
    DataFrame of ``WORKERS`` partitions, and the held-out ``(x, y)``."""
    cluster = hosts.Cluster.attach()
    extra = dict(c.split("=", 1) for c in getattr(args, "conf", None) or ())  # --conf KEY=VALUE, an arm of settings
    spark = harness.session(cluster.master_url, conf={**CONF, **extra})
    x, y, x_test, y_test = data(args)
    df = spark.createDataFrame([(r.tolist(), int(v)) for r, v in zip(x, y)], "features array<float>, label int")
    df = df.repartition(WORKERS).cache()
    df.count()
    return cluster, spark, df, (x_test, y_test)


def print_results(path: str, summary) -> None:
    """Prints ``summary`` of the rows of the results file ``path``, and the load around its run."""
    with open(path) as f:
        saved = json.load(f)
    print(summary(saved["rows"]))
    print(f"load average before {saved['load_before']}, after {saved['load_after']}")


def drive(args) -> None:
    """On host 0: the arms, interleaved; appends a row per arm and repeat to ``args.out``."""
    import keras
    import numpy as np

    from network import mlp
    from sparkdl_avg import ParameterAveragingTrainer

    cluster, spark, df, (x_test, y_test) = attached(args)
    store = f"s3://{hosts.BUCKET}/overlap-hosts"
    driver_ns = cluster.hosts[0].ns

    class Bytes(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.before = cluster.counters()

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
                                           **ARMS[arm]) as trainer:
                trainer.fit(df, epochs=1, verbose=0)  # warm: replicas built, data staged
                counter = Bytes()
                t0, w0 = time.monotonic(), time.time()
                trainer.fit(df, epochs=args.epochs, verbose=0, callbacks=[counter])
                row["fit_s"] = time.monotonic() - t0
                w1 = time.time()
                records = trainer.stats.records
            # where the whole fit's time goes: before its first round, each round (on the driver), after its last
            row["before_first_round_s"] = records[0].t_start - w0
            row["round_walls_s"] = [r.wall_s for r in records]
            row["after_last_round_s"] = w1 - (records[-1].t_start + records[-1].wall_s)
            # the first round's workers: what a steady round does not pay (a replica built, a trace, state restarted)
            row["first_round_workers"] = [
                {k: getattr(w, k) for k in ("host", "pid", "start", "end", "setup_s", "load_s", "compute_s", "build_s",
                                            "trace_s", "replica_built", "local_state_s", "local_state_restarted")}
                for w in records[0].workers]
            row["first_round_phases"] = {k: getattr(records[0], k, None) for k in (
                "schedule_s", "broadcast_s", "compute_max_s", "aggregate_s", "update_s", "overhead_s")}
            ends = [r.t_start + r.wall_s for r in records]
            med = statistics.median
            period = (ends[-1] - ends[0]) / (len(ends) - 1)
            examples = med(r.examples for r in records[1:])
            row.update(
                params=int(model.count_params()), rounds=len(records), period_s=period,
                throughput=examples / period, examples_per_round=examples,
                round_s=med(r.wall_s for r in records[1:]), compute_s=med(r.compute_max_s for r in records[1:]),
                paths=sorted({f"{r.transport}/{r.aggregation}" for r in records}),
                announced_ahead=sum(r.announced_ahead for r in records),
                driver_rx_per_round=counter.rx / len(records), driver_tx_per_round=counter.tx / len(records),
                accuracy=float(np.mean(np.argmax(model.predict(x_test, verbose=0), axis=1) == y_test)),
                load_after=os.getloadavg()[0],
            )
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    spark.stop()


def run_on_cluster(script: str, args) -> None:
    """Starts the hosts cluster (``WORKERS`` one-core workers at ``args.rate``), runs ``script --driver`` on host 0
    with the arguments below, and writes its rows to ``args.out`` (harness' results format)."""
    partial = args.out + ".tmp"
    with open(partial, "w"):
        pass
    load = os.getloadavg()
    with hosts.Cluster(hosts=WORKERS + 1, rate=args.rate, worker_memory="1200m").running() as cluster:
        cmd = [sys.executable, script, "--driver", "--out", partial, "--k", str(args.k),
               "--repeats", str(args.repeats), "--epochs", str(args.epochs),
               "--rounds-per-epoch", str(args.rounds_per_epoch), "--arms", *args.arms,
               *(f"--conf={c}" for c in getattr(args, "conf", None) or ())]
        proc = cluster.run(0, cmd, env=cluster.driver_env(), timeout=3600, check=False)
        if proc.returncode:
            print((proc.stdout + proc.stderr)[-4000:], file=sys.stderr)
    with open(partial) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    extra = dict(c.split("=", 1) for c in getattr(args, "conf", None) or ())
    harness.write_results(args.out, args, conf=harness.settings({**CONF, **extra}), rows=rows, load_before=load,
                          load_after=os.getloadavg(), command=" ".join(sys.argv))
    os.remove(partial)


def summary(rows) -> str:
    med = statistics.median
    by = {arm: [r for r in rows if r["arm"] == arm] for arm in ARMS}
    lines = ["| arm | path | whole fit s (median) | whole fit vs sync | round period s (median) | compute s | "
             "throughput ex/s | vs sync | held-out acc | driver in / out MB per round |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    sync_tp = med(r["throughput"] for r in by["sync"]) if by["sync"] else None
    sync_fit = med(r["fit_s"] for r in by["sync"]) if by["sync"] else None
    for arm, rs in by.items():
        if not rs:
            continue
        tp = med(r["throughput"] for r in rs)
        fit = med(r["fit_s"] for r in rs)
        lines.append(f"| {arm} | {', '.join(rs[0]['paths'])} | {fit:.1f} | {sync_fit / fit:.2f}× | "
                     f"{med(r['period_s'] for r in rs):.2f} | "
                     f"{med(r['compute_s'] for r in rs):.2f} | {tp:.0f} | "
                     f"{tp / sync_tp:.2f}× | {med(r['accuracy'] for r in rs):.4f} | "
                     f"{med(r['driver_rx_per_round'] for r in rs) / 1e6:.1f} / "
                     f"{med(r['driver_tx_per_round'] for r in rs) / 1e6:.1f} |" if sync_tp else "")
    if by["sync"] and by["overlap"]:
        communication = med(r["period_s"] - r["compute_s"] for r in by["sync"])
        compute = med(r["compute_s"] for r in by["overlap"])
        period = med(r["period_s"] for r in by["overlap"])
        lines.append("")
        lines.append(f"communication (sync period − compute) {communication:.2f} s, overlap compute {compute:.2f} s: "
                     f"overlapped round {period:.2f} s = {period / max(compute, communication):.2f}× "
                     f"max(compute, communication)")
    return "\n".join(lines)


def main() -> None:
    p = harness.parser(__doc__, out="overlap_hosts.json", repeats=2)
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--k", type=int, default=192)
    p.add_argument("--epochs", type=int, default=2, help="measured epochs per arm (after one warm epoch)")
    p.add_argument("--rounds-per-epoch", type=int, default=3)
    p.add_argument("--arms", nargs="+", default=["sync", "overlap"], choices=list(ARMS))
    p.add_internal("--driver", action="store_true")
    p.add_argument("--table-only", action="store_true", help="print the table of --out and stop")
    args = p.parse_args()
    if args.driver:
        drive(args)
        return
    if not args.table_only:
        run_on_cluster(os.path.abspath(__file__), args)
    print_results(args.out, summary)


if __name__ == "__main__":
    main()
