"""Aggregation paths on hosts that share only a network: shaped links, per-link bytes against the wire floor.

Starts scripts/hosts.py's cluster (one worker host per worker, 1 core each,
every link shaped with ``tc tbf``, the driver's included; the S3 store on a
host of its own, unshaped) for each (workers, rate), and runs this file
again on host 0 as the driver (``--driver``), with the README's settings
(``benchmarks/harness.py``; executors of 768 MB, a 2 GB driver, staging on
the store). For each model size (an MLP of about 1e5, 1e6, 3e6 parameters,
Adam, ``optimizer_state="average"``) and each path (``spark`` at depth 1
and 2; ``sql`` with ``driver``, ``shuffle``, ``storage``; ``auto``, and
``auto+rate``: ``auto`` given ``network_rate`` = the links' rate), one
unrecorded fit warms the replicas, then a fit of ``--rounds`` rounds at
``k=1`` is measured. Per round it
records the aggregate phase (``aggregate_s``), the round's wall time, and
the bytes through the driver's link (rx, tx) and through the busiest
worker link, read from the hosts' kernel counters before and after each
round (a Keras callback: ``on_train_batch_begin``/``end``); and each against
its wire floor, bytes ÷ link rate. Medians over the measured rounds.

``--compressions`` (among ``none``, ``bf16``, ``int8``; default ``none``
only) runs each path once per compression, the trainer given
``update_compression`` = ``None``, ``"bf16"``, ``"int8"``; ``local``,
``local+int8``, ``local+int4`` also set ``optimizer_state="local"`` (each
worker keeps its own Adam state in a file on its host, its tasks placed
there; ``local_state_ms`` records the slowest worker's seconds with it,
``local_states_restarted`` the states lost, ``same_host`` whether every
worker stayed on one host): an arm may be named again (``none local+int8
none local+int8``) to interleave repeats. Each row records
its ``compression`` (rows written before the option have none: float32
sums), the bytes each worker sent per round (``sent_per_worker``: the round
record's ``sent_bytes`` ÷ its workers) and the slowest worker's encoding and
residual-file time (``encode_ms``, ``feedback_ms``, 0 without compression).

    .venv/bin/python benchmarks/network.py [--workers 4 8] [--rates 1gbit] [--params 1e5 1e6 3e6] [--rounds 6]
        [--compressions none bf16 int8]

Needs root (namespaces). Results: benchmarks/results/network.json, and the
table printed for docs/benchmarks.md ("On a shaped network").
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import harness  # noqa: E402
import hosts  # noqa: E402

PATHS = {
    "spark d1": dict(state_transport="spark", aggregation_depth=1),
    "spark d2": dict(state_transport="spark", aggregation_depth=2),
    "sql driver": dict(state_transport="sql", aggregation="driver"),
    "sql shuffle": dict(state_transport="sql", aggregation="shuffle"),
    "sql storage": dict(state_transport="sql", aggregation="storage"),
    "auto": dict(),
    "auto+rate": dict(network_rate=None),  # auto told the links' rate (network_rate=the cluster's)
}
COMPRESSIONS = {"none": None, "bf16": "bf16", "int8": "int8"}  # --compressions -> update_compression
# --compressions arms with optimizer_state="local" (issue 40): each worker keeps its own Adam state, weights travel
LOCAL_ARMS = {"local": None, "local+int8": "int8", "local+int4": "int4"}
BATCH = 32
CONF = {"spark.executor.memory": "768m", "spark.driver.memory": "2g", "spark.driver.maxResultSize": "0"}


def mlp(params: float):
    import keras

    hidden = max(8, int(params / 75))  # 64 inputs -> hidden -> 10: about 75 * hidden parameters
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(hidden, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def drive(args) -> None:
    """On host 0: every (params, path, compression) arm on the running cluster; appends rows to ``args.out``."""
    import keras
    import numpy as np

    from sparkdl_avg import ParameterAveragingTrainer

    cluster = hosts.Cluster.attach()
    rate = hosts.rate_bytes(cluster.rate)
    spark = harness.session(cluster.master_url, conf=CONF)
    workers = len(cluster.workers)
    rng = np.random.default_rng(0)
    n = workers * BATCH * (args.rounds + 1)
    x = rng.random((n, 64), dtype=np.float32)
    y = rng.integers(0, 10, n)
    df = spark.createDataFrame([(r.tolist(), int(v)) for r, v in zip(x, y)], "features array<float>, label int")
    store = f"s3://{hosts.BUCKET}/network-{workers}-{cluster.rate}"
    driver_ns = cluster.hosts[0].ns
    worker_ns = [h.ns for h in cluster.workers]

    class Bytes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.rounds, self.before = [], None

        def on_train_batch_begin(self, batch, logs=None):
            self.before = cluster.counters()

        def on_train_batch_end(self, batch, logs=None):
            after = cluster.counters()
            d = {ns: {k: after[ns][k] - self.before[ns][k] for k in ("rx", "tx")} for ns in after}
            self.rounds.append(d)

    rows = []
    arms = [(params, name, compression) for params in args.params for name in args.paths
            for compression in args.compressions]
    for params, name, compression in arms:
        if compression in LOCAL_ARMS:
            options = dict(PATHS[name], update_compression=LOCAL_ARMS[compression], optimizer_state="local")
        else:
            options = dict(PATHS[name], update_compression=COMPRESSIONS[compression])
        if "network_rate" in options:
            options["network_rate"] = cluster.rate
        row = {"workers": workers, "rate": cluster.rate, "params": None, "path": name, "compression": compression}
        try:
            with ParameterAveragingTrainer(mlp(params), num_workers=workers, batch_size=BATCH,
                                           averaging_frequency=1, seed=0, slow_warning=False,
                                           staging_dir=f"{store}/staging", **options) as trainer:
                trainer.fit(df, epochs=1, verbose=0)  # warm: replicas built, data staged
                model = trainer.model
                row["params"] = int(model.count_params())
                counter = Bytes()
                trainer.fit(df, epochs=1, verbose=0, callbacks=[counter])
                records = trainer.stats.records[1:]  # the first round of a fit also ships the model
                bytes_ = counter.rounds[1:]
        except Exception as exc:  # noqa: BLE001 - recorded: a path that fails at a size is a result
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
            continue
        state = sum(np.asarray(v).nbytes for v in list(model.weights) + list(model.optimizer.variables))
        med = statistics.median
        row.update(
            state_bytes=state,
            transport=records[-1].transport, aggregation=records[-1].aggregation, shards=records[-1].shards,
            aggregate_ms=1000 * med(r.aggregate_s for r in records),
            round_ms=1000 * med(r.wall_s for r in records),
            compute_ms=1000 * med(r.compute_max_s for r in records),
            driver_rx=med(b[driver_ns]["rx"] for b in bytes_),
            driver_tx=med(b[driver_ns]["tx"] for b in bytes_),
            busiest_worker=med(max(max(b[ns]["rx"], b[ns]["tx"]) for ns in worker_ns) for b in bytes_),
            store_rx=med(b[cluster.store.ns]["rx"] for b in bytes_) if cluster.store else 0,
            sent_per_worker=med((r.sent_bytes or 0) / r.num_workers for r in records),
            encode_ms=1000 * med(r.encode_max_s for r in records),
            feedback_ms=1000 * med(r.feedback_max_s for r in records),
            local_state_ms=1000 * med(max(w.local_state_s for w in r.workers) for r in records),
            local_states_restarted=sum(r.local_states_restarted for r in records),
            same_host=all(len({w.host for r in records for w in r.workers if w.worker == i}) == 1
                          for i in range(workers)),
            record_compression=records[-1].compression,
            rounds=len(records),
        )
        row["driver_in_floor_ms"] = 1000 * row["driver_rx"] / rate
        row["driver_out_floor_ms"] = 1000 * row["driver_tx"] / rate
        row["busiest_floor_ms"] = 1000 * row["busiest_worker"] / rate
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    spark.stop()


def table(rows) -> str:
    lines = ["| workers | rate | params | path (took) | compression | aggregate ms | round ms | "
             "driver in / out per round (× state) | in / out floor ms | busiest worker link (floor ms) | "
             "sent per worker | encode / feedback ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        compression = r.get("compression", "none")  # rows from before --compressions: float32 sums
        if "error" in r:
            lines.append(f"| {r['workers']} | {r['rate']} | | {r['path']} | {compression} | failed: {r['error'][:80]} "
                         "| | | | | | |")
            continue
        sent = f"{r['sent_per_worker'] / 1e6:.1f} MB" if "sent_per_worker" in r else ""
        coding = f"{r['encode_ms']:.0f} / {r['feedback_ms']:.0f}" if "encode_ms" in r else ""
        took = r["aggregation"] if r["transport"] == "sql" else r["transport"]
        s = r["state_bytes"]
        lines.append(
            f"| {r['workers']} | {r['rate']} | {r['params']:,} | {r['path']} ({took}{', ' + str(r['shards']) if r['shards'] else ''}) | "
            f"{compression} | {r['aggregate_ms']:.0f} | {r['round_ms']:.0f} | {r['driver_rx'] / 1e6:.1f} / {r['driver_tx'] / 1e6:.1f} MB "
            f"({r['driver_rx'] / s:.2f} / {r['driver_tx'] / s:.2f}) | {r['driver_in_floor_ms']:.0f} / "
            f"{r['driver_out_floor_ms']:.0f} | {r['busiest_worker'] / 1e6:.1f} MB ({r['busiest_floor_ms']:.0f}) | "
            f"{sent} | {coding} |")
    return "\n".join(lines)


def main() -> None:
    p = harness.parser(__doc__, out="network.json")
    p.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    p.add_argument("--rates", nargs="+", default=["1gbit"])
    p.add_argument("--params", type=float, nargs="+", default=[1e5, 1e6, 3e6])
    p.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    p.add_argument("--rounds", type=int, default=6, help="measured rounds per arm (the first is left out)")
    p.add_argument("--compressions", nargs="+", default=["none"], choices=list(COMPRESSIONS) + list(LOCAL_ARMS),
                   help="update_compression arms per path (default: none only, float32 sums)")
    p.add_internal("--driver", action="store_true")
    p.add_argument("--table-only", action="store_true", help="print the table of --out and stop")
    args = p.parse_args()
    if args.driver:
        drive(args)
        return
    if not args.table_only:
        partial = args.out + ".tmp"
        with open(partial, "w"):
            pass
        load = os.getloadavg()
        for workers in args.workers:
            for rate in args.rates:
                t0 = time.monotonic()
                with hosts.Cluster(hosts=workers + 1, rate=rate, worker_memory="1200m").running() as cluster:
                    cmd = [sys.executable, os.path.abspath(__file__), "--driver", "--out", partial,
                           "--rounds", str(args.rounds), "--params", *map(str, args.params), "--paths", *args.paths,
                           "--compressions", *args.compressions]
                    proc = cluster.run(0, cmd, env=cluster.driver_env(), timeout=3600, check=False)
                    if proc.returncode:
                        print((proc.stdout + proc.stderr)[-4000:], file=sys.stderr)
                print(f"{workers} workers at {rate}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
        with open(partial) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        harness.write_results(args.out, args, conf=harness.settings(CONF), rows=rows, load_before=load,
                              load_after=os.getloadavg(), command=" ".join(sys.argv))
        os.remove(partial)
    with open(args.out) as f:
        data = json.load(f)
    print(table(data["rows"]))
    print(f"load average before {data['load_before']}, after {data['load_after']}")


if __name__ == "__main__":
    main()
