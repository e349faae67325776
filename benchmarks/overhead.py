"""Where a round's time goes as the work grows.

Per-round phases from ``trainer.stats`` (see :mod:`sparkdl_avg.shared.wire.stats`) for an
MLP ``64 → H → H → 10`` whose width ``H`` sets the parameter count (≈1e4 to
≈1e7), Adam, batch 32, synthetic data; swept one factor at a time:

* ``size``: model size at 2 workers, ``k = 8``, depth 2;
* ``frequency``: ``k`` ∈ {1, 8, 32, 128} at 2 workers, 1e5 parameters;
* ``workers``: 2, 4, 8 replicas (``local[N]``: all tasks of a round run at
  once, time-sharing the 2 cores), 1e5 and 1e6 parameters, ``k = 8``;
* ``depth``: ``aggregation_depth`` 1, 2, 3 at 8 workers, 1e5 and 1e6
  parameters, results through Spark (through files the tree has depth 1);
* ``transport``: ``state_transport="spark"`` against ``"files"``
  (interleaved) per model size at 2 workers, and at 8 workers;
* ``aggregation``: every way a round's sums can come back, interleaved per
  (workers, size) for 2, 4, 8, 16 workers × 1e5, 1e6, 3e6 parameters, ``k = 1``:
  ``spark`` at depth 1 and 2, ``files`` (the one-host shortcut), and the Spark
  SQL round with ``aggregation`` = ``driver``, ``shuffle`` and ``storage``
  (written ``sql:driver`` etc.), with the bytes the driver received and its
  own decoding/summing time per round, and the floor: an empty
  ``mapInArrow`` job of the same task count (``--sweeps aggregation``).

The other sweeps use the default ``state_transport="auto"`` (files on
``local[N]``).

Each configuration runs one ``fit`` of ``--rounds`` rounds and drops the
first round (replica build). "Round overhead" is the round's wall time minus
the slowest worker's compute (it includes broadcast, scheduling, state
assignment on the workers, data loading, result serialisation, tree
aggregation and the driver's update). Also per model size: bytes broadcast
and aggregated per round (pickled sizes of the objects the trainer moves),
the time to move the model's float32 bytes through a loopback socket, and a
driver-side micro-profile of each per-round step (with float32 alternatives)
to show what dominates. Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/overhead.py [--quick]

Each ``local[N]`` runs in its own subprocess (one SparkContext per process),
with the README's settings (``benchmarks/harness.py``) and a 4 GB driver.
Writes ``benchmarks/results/overhead.json`` and prints Markdown tables; while
it runs, ``<out>.partial`` holds what the finished ``local[N]`` measured.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np  # noqa: E402

import harness  # noqa: E402

INPUT_DIM = 64
CONF = {"spark.driver.memory": "4g"}
# Width H → parameters 64H + H² + H + H + 10H + 10 (≈ H² for large H).
WIDTHS = {"1e4": 70, "1e5": 280, "1e6": 960, "3e6": 1700, "1e7": 3120}


def params_of(width: int) -> int:
    return INPUT_DIM * width + width + width * width + width + width * 10 + 10


def build_mlp(width: int):
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((INPUT_DIM,)),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def plan(quick: bool):
    """Configurations per master: (sweep, size, k, workers, depth, state_transport)."""
    sizes = ["1e4", "1e5", "1e6"] if quick else ["1e4", "1e5", "1e6", "3e6", "1e7"]
    cfgs = {2: [], 4: [], 8: []}
    for s in sizes:
        cfgs[2].append(("size", s, 8, 2, 2, "auto"))
    for k in ([1, 8, 32] if quick else [1, 8, 32, 128]):
        cfgs[2].append(("frequency", "1e5", k, 2, 2, "auto"))
    for n in (2, 4, 8):
        for s in ("1e5", "1e6"):
            cfgs[n].append(("workers", s, 8, n, 2, "auto"))
    for depth in (1, 2, 3):
        for s in ("1e5", "1e6"):
            cfgs[8].append(("depth", s, 8, 8, depth, "spark"))
    # Spark's result path against files, interleaved, at the default depth.
    for s in sizes:
        for transport in ("spark", "files", "spark", "files"):
            cfgs[2].append(("transport", s, 8, 2, 2, transport))
    for s in ("1e5", "1e6"):
        for transport in ("spark", "files"):
            cfgs[8].append(("transport", s, 8, 8, 2, transport))
    cfgs[16] = []
    for n in (2, 4, 8, 16):
        for s in ("1e5", "1e6", "3e6"):
            for path in AGGREGATION_PATHS:
                transport, depth = (path.split("@")[0], int(path.split("@")[1])) if "@" in path else (path, 2)
                cfgs[n].append(("aggregation", s, 1, n, depth, transport))
    return cfgs


#: The aggregation sweep's paths, in their interleaved order ("spark@1": state_transport="spark", depth 1).
AGGREGATION_PATHS = ("spark@1", "spark@2", "files", "sql:driver", "sql:shuffle", "sql:storage")


def _path_name(transport: str, depth: int) -> str:
    """A configuration's name in :data:`AGGREGATION_PATHS`."""
    return f"{transport}@{depth}" if transport == "spark" else transport


# ------------------------------------------------------------------ child

def run_config(sc, sweep, size, k, workers, depth, transport, rounds, batch, optimizer_state="average"):
    from sparkdl_avg import ParameterAveragingTrainer

    width = WIDTHS[size]
    model = build_mlp(width)
    n = workers * batch * k * rounds
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, INPUT_DIM)).astype(np.float32)
    y = rng.integers(0, 10, size=n).astype(np.int32)
    state_transport, _, aggregation = transport.partition(":")
    with ParameterAveragingTrainer(model, num_workers=workers, batch_size=batch, averaging_frequency=k,
                                   aggregation_depth=depth, optimizer_state=optimizer_state, seed=1,
                                   state_transport=state_transport, aggregation=aggregation or "auto") as tr:
        tr.fit((x, y), epochs=1, verbose=0)
        records = tr.stats.records[1:]  # the first round builds the replicas
    keys = ["wall_s", "broadcast_s", "schedule_s", "workers_s", "aggregate_s", "update_s", "compute_max_s",
            "compute_min_s", "setup_max_s", "load_max_s", "overhead_s"]
    med = {k2: statistics.median(r[k2] for r in records) for k2 in keys}
    med["round_overhead_s"] = statistics.median(r["wall_s"] - r["compute_max_s"] for r in records)
    med["driver_sum_s"] = statistics.median(r["driver_sum_s"] for r in records)
    med["driver_own_s"] = statistics.median(r["driver_sum_s"] + r["update_s"] for r in records)
    med["driver_cpu_s"] = statistics.median(r.get("driver_cpu_s", float("nan")) for r in records)
    received = [r["received_bytes"] for r in records if r["received_bytes"] is not None]
    med["received_bytes"] = statistics.median(received) if received else None
    med["shards"] = records[-1]["shards"]
    # The workers' span beyond the slowest busy time: task start skew + get_state/finite check after compute.
    med["span_minus_busy_s"] = statistics.median(
        r["workers_s"] - max(w["setup_s"] + w["load_s"] + w["compute_s"] for w in r["workers"]) for r in records
    )
    from sparkdl_avg.shared.wire.exchange import FlatLayout
    from sparkdl_avg.shared.model.modelspec import get_state

    model_sum_bytes = FlatLayout.of(*get_state(model)).nbytes  # one model's state in sum dtypes
    return {"sweep": sweep, "size": size, "params": params_of(width), "width": width, "k": k,
            "model_sum_bytes": model_sum_bytes,
            "workers": workers, "depth": depth, "transport": transport, "rounds_measured": len(records), "median": med,
            "records": [{k2: r[k2] for k2 in keys} for r in records]}


def _combine(a, b):
    if a is None:
        return b
    if b is None:
        return a
    a += b
    return a


def _job_s(fn, repeats):
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def spark_probe(sc, tasks, depths, sizes_mb, dtypes=("float64",), repeats=5):
    """Bare Spark costs without a model: an empty job; a job whose tasks each return
    ``mb`` MB through ``treeAggregate`` (summing arrays, like the trainer); a
    broadcast of ``mb`` MB that every task reads."""
    out = []

    def empty():
        sc.parallelize(range(tasks), tasks).mapPartitions(lambda it: [len(list(it))]).collect()

    empty()
    base = _job_s(empty, repeats)
    out.append({"probe": "empty job", "tasks": tasks, "mb": 0, "s": base})
    for mb in sizes_mb:
        for dtype in dtypes:
            elems = int(mb * 1e6 / np.dtype(dtype).itemsize)

            def part(it, elems=elems, dtype=dtype):
                list(it)
                yield np.ones(elems, dtype)

            for depth in depths:
                job = lambda: sc.parallelize(range(tasks), tasks).mapPartitions(part).treeAggregate(  # noqa: E731
                    None, _combine, _combine, depth)
                out.append({"probe": "aggregate", "tasks": tasks, "mb": mb, "dtype": dtype, "depth": depth,
                            "s": _job_s(job, repeats)})
        value = np.ones(int(mb * 1e6 / 4), np.float32)

        def bcast():
            b = sc.broadcast(value)
            sc.parallelize(range(tasks), tasks).mapPartitions(lambda it: [len(list(it)) + b.value.size]).collect()
            b.unpersist()

        out.append({"probe": "broadcast", "tasks": tasks, "mb": mb, "s": _job_s(bcast, repeats)})
    for r in out:
        print(f"  probe {r}", flush=True)
    return out


def arrow_probe(spark, tasks, repeats=5):
    """The floor of a Spark SQL round: an empty ``mapInArrow`` job of ``tasks`` tasks, brought back with ``toArrow``."""
    import pyarrow as pa

    def body(batches):
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"x": [1]})

    def job():
        spark.range(tasks, numPartitions=tasks).mapInArrow(body, "x long").toArrow()

    job()
    out = [{"probe": "empty mapInArrow job", "tasks": tasks, "mb": 0, "s": _job_s(job, repeats)}]
    print(f"  probe {out[0]}", flush=True)
    return out


def child(args) -> None:
    cfgs = json.loads(args.configs)
    n = max(c[3] for c in cfgs)
    spark = harness.session(f"local[{n}]", conf=CONF)
    out = []
    for c in cfgs:
        t = time.perf_counter()
        r = run_config(spark.sparkContext, *c, rounds=args.rounds, batch=args.batch_size,
                       optimizer_state=args.optimizer_state)
        m = r["median"]
        print(f"  {c}: wall {1000 * m['wall_s']:.0f} ms, compute {1000 * m['compute_max_s']:.0f} ms, "
              f"overhead {1000 * m['round_overhead_s']:.0f} ms ({time.perf_counter() - t:.0f} s)", flush=True)
        out.append(r)
        with open(args.child_out, "w") as f:  # after every configuration: a crash keeps what was measured
            json.dump({"configs": out, "probes": []}, f)
    probes = []
    if args.no_probes:
        pass
    elif all(c[0] == "aggregation" for c in cfgs):
        probes = arrow_probe(spark, n)
    elif n == 2:
        probes = spark_probe(spark.sparkContext, 2, [2], args.probe_mb, ("float64", "float32"))
    elif n == 8:
        probes = spark_probe(spark.sparkContext, 8, [1, 2, 3], [mb for mb in args.probe_mb if mb <= 8], repeats=3)
    import sparkdl_avg

    print(f"  sparkdl_avg from {os.path.dirname(sparkdl_avg.__file__)}", flush=True)
    spark.stop()
    with open(args.child_out, "w") as f:
        json.dump({"configs": out, "probes": probes}, f)


# ------------------------------------------------------------ driver-side

def loopback_move_s(arrays, repeats=3) -> float:
    """Seconds to pickle ``arrays``, send them through a loopback TCP socket and unpickle them."""
    times = []
    for _ in range(repeats):
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        t0 = time.perf_counter()
        payload = pickle.dumps(arrays, protocol=pickle.HIGHEST_PROTOCOL)

        def send():
            with socket.create_connection(("127.0.0.1", port)) as c:
                c.sendall(len(payload).to_bytes(8, "little") + payload)

        th = threading.Thread(target=send)
        th.start()
        conn, _ = srv.accept()
        size = int.from_bytes(conn.recv(8, socket.MSG_WAITALL), "little")
        buf = bytearray(size)
        view, got = memoryview(buf), 0
        while got < size:
            got += conn.recv_into(view[got:], size - got)
        pickle.loads(buf)
        times.append(time.perf_counter() - t0)
        th.join()
        conn.close()
        srv.close()
    return statistics.median(times)


def _t(fn, repeats=3):
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def profile_size(size: str) -> dict:
    """Bytes moved per round and driver/worker-side step costs for one model size (no Spark)."""
    from sparkdl_avg.shared.wire.aggregation import PartialResult, merge, weighted
    from sparkdl_avg.shared.model.modelspec import get_state, set_state

    model = build_mlp(WIDTHS[size])
    model.fit(np.zeros((32, INPUT_DIM), np.float32), np.zeros(32, np.int32), verbose=0)  # create Adam slots
    weights, opt = get_state(model)
    wbytes = sum(w.nbytes for w in weights)
    state_bytes = len(pickle.dumps((weights, opt), protocol=pickle.HIGHEST_PROTOCOL))
    n = 256

    # What a worker returns: float32 sums of a float32 model (the trainer's `weighted`), and for comparison
    # the float64 sums it returned before (and still returns for float64 models).
    def f64(a):
        out = np.array(a, np.float64)  # then *=: keeps 0-d counters arrays, as merge's in-place sums need
        out *= n
        return out

    def partial64():
        return PartialResult(n, [f64(w) for w in weights], [f64(o) for o in opt], {"loss": 1.0})

    def partial32():
        return PartialResult(n, weighted(weights, n), weighted(opt, n), {"loss": 1.0})

    p64 = partial64()
    p64_bytes = len(pickle.dumps(p64, protocol=pickle.HIGHEST_PROTOCOL))
    p32_bytes = len(pickle.dumps(partial32(), protocol=pickle.HIGHEST_PROTOCOL))
    blob64 = pickle.dumps(p64, protocol=pickle.HIGHEST_PROTOCOL)
    steps = {
        "get_state_s": _t(lambda: get_state(model)),
        "set_state_s": _t(lambda: set_state(model, weights, opt)),
        "pickle_state_s": _t(lambda: pickle.dumps((weights, opt), protocol=pickle.HIGHEST_PROTOCOL)),
        "weighted_float64_s": _t(partial64),
        "weighted_float32_s": _t(partial32),
        "pickle_partial_float64_s": _t(lambda: pickle.dumps(p64, protocol=pickle.HIGHEST_PROTOCOL)),
        "unpickle_partial_float64_s": _t(lambda: pickle.loads(blob64)),
        "merge_float64_s": _t(lambda: merge(partial64(), p64)) - _t(partial64),
        "average_float64_s": _t(lambda: [s / 512 for s in p64.weight_sums] + p64.average(p64.optimizer_sums, opt)),
        "isfinite_s": _t(lambda: all(np.isfinite(w).all() for w in weights)),
    }
    return {
        "size": size,
        "params": params_of(WIDTHS[size]),
        "model_bytes_float32": wbytes,
        "broadcast_bytes": state_bytes,
        "partial_bytes_float64": p64_bytes,
        "partial_bytes_if_float32": p32_bytes,
        "move_model_bytes_s": loopback_move_s(weights),
        "steps": steps,
    }


def main() -> None:
    p = harness.parser(__doc__, out="overhead.json", rounds=5,
                       rounds_help="rounds per configuration (the first is dropped)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and frequencies (smoke test)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--only", nargs="*", type=int, default=None, help="run only these worker counts")
    p.add_argument("--probe-mb", type=float, nargs="*", default=[1, 8, 24, 48],
                   help="payload sizes (MB per task) of the bare Spark probes (8 tasks: only those ≤ 8)")
    p.add_argument("--sweeps", nargs="*", default=None, help="only these sweeps (size, frequency, workers, depth, transport)")
    p.add_argument("--paths", nargs="*", default=None,
                   help=f"only these paths of the aggregation sweep (of {', '.join(AGGREGATION_PATHS)})")
    p.add_argument("--sizes", nargs="*", default=None, help="only these model sizes of the aggregation sweep")
    p.add_argument("--optimizer-state", default="average", choices=["average", "reset"])
    p.add_argument("--no-probes", action="store_true", help="skip the bare Spark probes")
    p.add_argument("--tables-only", action="store_true", help="print the tables of the existing --out file")
    p.add_argument("--profiles-only", action="store_true",
                   help="recompute only the driver-side profiles (no Spark) into the existing --out file")
    p.add_internal("--child-out")
    p.add_internal("--configs")
    args = p.parse_args()
    if args.configs:
        return child(args)
    if args.tables_only:
        with open(args.out) as f:
            previous = json.load(f)
        return print_tables(previous["configs"], previous.get("profiles", []), previous.get("probes", []))
    if args.profiles_only:
        with open(args.out) as f:
            previous = json.load(f)
        previous["profiles"] = [profile_size(s) for s in sorted({r["size"] for r in previous["configs"]}, key=float)]
        previous["profiles_date"] = time.strftime("%Y-%m-%d %H:%M")
        harness.write_json(args.out, previous)  # the file as it was, the profiles replaced
        return print_tables(previous["configs"], previous["profiles"], previous["probes"])

    load = [os.getloadavg()[0]]
    results, probes = [], []
    for n, cfgs in plan(args.quick).items():
        # The aggregation sweep (≈ 20 min, up to 16 workers) runs only when asked for.
        cfgs = [c for c in cfgs if (c[0] in args.sweeps if args.sweeps else c[0] != "aggregation")]
        if args.paths:
            cfgs = [c for c in cfgs if c[0] != "aggregation" or _path_name(c[5], c[4]) in args.paths]
        if args.sizes:
            cfgs = [c for c in cfgs if c[0] != "aggregation" or c[1] in args.sizes]
        if (args.only and n not in args.only) or not cfgs:
            continue
        print(f"local[{n}]: {len(cfgs)} configurations", flush=True)
        out = os.path.join(os.path.dirname(args.out), f".overhead-{n}.tmp")
        left = list(cfgs)
        while left:
            if os.path.exists(out):
                os.remove(out)
            done = subprocess.run([sys.executable, __file__, "--configs", json.dumps(left), "--child-out", out,
                                   "--rounds", str(args.rounds), "--batch-size", str(args.batch_size),
                                   "--optimizer-state", args.optimizer_state,
                                   *(["--no-probes"] if args.no_probes else []),
                                   "--probe-mb", *map(str, args.probe_mb)])
            child_res = {"configs": [], "probes": []}
            if os.path.exists(out):
                with open(out) as f:
                    child_res = json.load(f)
                os.remove(out)
            results.extend(child_res["configs"])
            probes.extend(child_res["probes"])
            left = left[len(child_res["configs"]):]
            if done.returncode != 0 and left:
                # The configuration that was running took its Spark application down (e.g. the driver JVM out
                # of memory): record it as failed and go on with the rest in a new application.
                failed = left.pop(0)
                print(f"  {failed}: FAILED (exit {done.returncode}); continuing", flush=True)
                results.append({"sweep": failed[0], "size": failed[1], "params": params_of(WIDTHS[failed[1]]),
                                "k": failed[2], "workers": failed[3], "depth": failed[4], "transport": failed[5],
                                "failed": f"the Spark application died (exit {done.returncode})"})
            elif done.returncode != 0:
                break
        load.append(os.getloadavg()[0])
        harness.write_results(args.out + ".partial", args, conf=harness.settings(CONF), load_avg_1min=load,
                              configs=results, probes=probes)

    sizes = sorted({r["size"] for r in results if "failed" not in r}, key=float)
    print("profiling driver-side steps per model size", flush=True)
    profiles = [] if args.sweeps == ["aggregation"] else [profile_size(s) for s in sizes]
    load.append(os.getloadavg()[0])
    harness.write_results(args.out, args, conf=harness.settings(CONF), load_avg_1min=load, configs=results,
                          profiles=profiles, probes=probes)
    if os.path.exists(args.out + ".partial"):
        os.remove(args.out + ".partial")
    print_tables(results, profiles, probes)
    print(f"\n1-min load average during the run: {', '.join(f'{v:.1f}' for v in load)}")


def print_aggregation_table(results, probes=()):
    """The aggregation sweep: one row per (workers, size, path)."""
    floor = {p["tasks"]: p["s"] for p in probes if p["probe"] == "empty mapInArrow job"}
    rows = [r for r in results if r["sweep"] == "aggregation"]
    if not rows:
        return
    print("\n| workers | params | path | shards | aggregate ms | job ms | empty job ms | round overhead ms | "
          "driver MB received | × one model | driver own ms (sum + update) | driver CPU ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "failed" in r:
            path = r["transport"] + (f"@{r['depth']}" if r["transport"] == "spark" else "")
            print(f"| {r['workers']} | {r['params']:,} | {path} | | {r['failed']} | | | | | | | |")
            continue
        m = r["median"]
        model_mb = r["model_sum_bytes"] / 1e6
        got = m.get("received_bytes")
        path = r["transport"] + (f"@{r['depth']}" if r["transport"] == "spark" else "")
        print(f"| {r['workers']} | {r['params']:,} | {path} | {m.get('shards') or ''} | {1000 * m['aggregate_s']:.0f} | "
              f"{1000 * (m['schedule_s'] + m['workers_s'] + m['aggregate_s']):.0f} | {1000 * floor.get(r['workers'], float('nan')):.0f} | "
              f"{1000 * m['round_overhead_s']:.0f} | {'' if got is None else f'{got / 1e6:.1f}'} | "
              f"{'' if got is None else f'{got / 1e6 / model_mb:.2f}'} | {1000 * m['driver_own_s']:.0f} | "
              f"{1000 * m.get('driver_cpu_s', float('nan')):.0f} |")


def print_tables(results, profiles, probes=()):
    print_aggregation_table(results, probes)
    results = [r for r in results if r["sweep"] != "aggregation"]
    if not results:
        return
    prof = {p["size"]: p for p in profiles}
    print("\n| sweep | transport | params | k | workers | depth | round wall ms | slowest compute ms | overhead ms | broadcast | "
          "schedule | state assign (setup) | load | span − busy | aggregate | update | budget ms | within |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        m = {k: 1000 * v for k, v in r["median"].items() if v is not None}  # received_bytes: not known on Spark's path
        budget = 150 + 2000 * prof[r["size"]]["move_model_bytes_s"] if r["size"] in prof else float("nan")
        print(f"| {r['sweep']} | {r.get('transport', 'spark')} | {r['params']:,} | {r['k']} | {r['workers']} | {r['depth']} | {m['wall_s']:.0f} | "
              f"{m['compute_max_s']:.0f} | {m['round_overhead_s']:.0f} | {m['broadcast_s']:.0f} | {m['schedule_s']:.0f} | "
              f"{m['setup_max_s']:.0f} | {m['load_max_s']:.0f} | {m['span_minus_busy_s']:.0f} | {m['aggregate_s']:.0f} | "
              f"{m['update_s']:.0f} | {budget:.0f} | {'yes' if m['round_overhead_s'] <= budget else 'no'} |")
    print("\n| params | model MB (f32) | broadcast MB | partial MB per worker (f64) | same in f32 | loopback move of model s |"
          " get_state ms | set_state ms | weighted f64 ms | weighted f32 ms | pickle partial ms | unpickle partial ms | merge ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in profiles:
        s = {k: 1000 * v for k, v in p["steps"].items()}
        print(f"| {p['params']:,} | {p['model_bytes_float32'] / 1e6:.2f} | {p['broadcast_bytes'] / 1e6:.2f} | "
              f"{p['partial_bytes_float64'] / 1e6:.2f} | {p['partial_bytes_if_float32'] / 1e6:.2f} | "
              f"{p['move_model_bytes_s']:.4f} | {s['get_state_s']:.1f} | {s['set_state_s']:.1f} | "
              f"{s['weighted_float64_s']:.1f} | {s['weighted_float32_s']:.1f} | {s['pickle_partial_float64_s']:.1f} | "
              f"{s['unpickle_partial_float64_s']:.1f} | {s['merge_float64_s']:.1f} |")
    if probes:
        print("\n| probe | tasks | MB per task | dtype | depth | job s |")
        print("|---|---|---|---|---|---|")
        for r in probes:
            print(f"| {r['probe']} | {r['tasks']} | {r['mb']} | {r.get('dtype', '')} | {r.get('depth', '')} | {r['s']:.3f} |")


if __name__ == "__main__":
    main()
