"""Round overhead with the JVMs talking to Python over loopback TCP against Unix domain sockets, side by side.

``spark.python.unix.domain.socket.enabled`` (Spark >= 4.1) is a static
setting, so each arm is one process: a classic ``local[2]`` session and a
local Spark Connect server (``remote("local[2]")``), each over TCP (Spark's
default) and over Unix domain sockets, all with
``spark.python.daemon.module=sparkdl_avg.daemon``, in alternating order
``--repeats`` times. The ``uds`` arms have the README's settings
(``benchmarks/harness.py``); the ``tcp`` arms deviate in the one setting
this benchmark compares (``spark.python.unix.domain.socket.enabled=false``).
In each, one unrecorded fit warms the JVM; then the 1e5-parameter MLP of
``overhead.py`` (Adam, batch 32, ``k = 1``, 2 workers) trains ``--rounds``
rounds per fit with the first dropped: the default transport (classic:
``files``; Connect: the Spark SQL round) and, on the classic session, the
Spark SQL round too. Also a bare probe per arm: one
Python task that only reads its one input row (``mapPartitions`` of a
cached one-row RDD on classic sessions), split into the time until the
task's function starts, the wait for its input, and the result's way back.
Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/unix_sockets.py

Writes ``benchmarks/results/unix_sockets.json`` and prints a Markdown table.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ["PYSPARK_PYTHON"] = os.path.abspath(os.environ["PYSPARK_PYTHON"])

import numpy as np  # noqa: E402

import harness  # noqa: E402
from arms import run_alternating  # noqa: E402
from overhead import WIDTHS, build_mlp  # noqa: E402

ARMS = ("classic tcp", "classic uds", "connect tcp", "connect uds")
#: The arms that deviate from the README's settings: loopback TCP (``sparkdl_avg.driver.runtime.session.UNIX_SOCKETS``).
ARM_CONF = {arm: {"spark.python.unix.domain.socket.enabled": "false"} for arm in ARMS if arm.endswith("tcp")}


def _probe_task(rows):
    start = time.time()
    n = len(list(rows))  # the whole input: a worker that leaves it unread is not reused
    return [(start, time.time(), n)]


def probe(sc, repeats: int = 30) -> dict:
    """Medians (s) of one bare Python task: submit to its start, its wait for input, its end to the driver."""
    ids = sc.parallelize([0], 1).cache()
    ids.count()
    spans = []
    for _ in range(repeats):
        t0 = time.time()
        (start, got, _), = ids.mapPartitions(_probe_task).collect()
        spans.append((start - t0, got - start, time.time() - got))
    spans = spans[5:]
    return {key: statistics.median(s[i] for s in spans) for i, key in enumerate(("to_start_s", "input_s", "back_s"))}


def child(arm: str, rounds: int) -> list:
    from sparkdl_avg import ParameterAveragingTrainer
    from sparkdl_avg.driver.runtime.session import UNIX_SOCKETS

    session, sockets = arm.split()
    spark = harness.session("local[2]", connect=session == "connect", conf=ARM_CONF.get(arm))
    assert harness.settings(ARM_CONF.get(arm))[UNIX_SOCKETS] == ("true" if sockets == "uds" else "false")
    transports = ["auto"] if session == "connect" else ["auto", "sql"]
    n = 2 * 32 * rounds
    rng = np.random.default_rng(0)
    df = spark.createDataFrame(
        [(row.tolist(), int(label)) for row, label in zip(rng.normal(size=(n, 64)), rng.integers(0, 10, n))],
        "features array<float>, label int",
    )
    out = []
    for warm_up, transport in [(True, transports[0])] + [(False, t) for t in transports]:
        with ParameterAveragingTrainer(build_mlp(WIDTHS["1e5"]), num_workers=2, batch_size=32, averaging_frequency=1,
                                       seed=1, state_transport=transport, slow_warning=False) as tr:
            tr.fit(df, epochs=1, verbose=0)
            records = tr.stats.records[1:]
        if warm_up:
            continue
        med = {k: statistics.median(getattr(r, k) for r in records) for k in
               ("wall_s", "schedule_s", "workers_s", "aggregate_s", "update_s", "compute_max_s")}
        med["overhead_s"] = statistics.median(r.wall_s - r.compute_max_s for r in records)
        path = records[-1].transport + (f":{records[-1].aggregation}" if records[-1].aggregation else "")
        out.append({"arm": arm, "path": path, "rounds": len(records), "median": med})
        print(f"  {arm} {path}: overhead {1000 * med['overhead_s']:.0f} ms", flush=True)
    if session == "classic":
        out.append({"arm": arm, "path": "probe", "median": probe(spark.sparkContext)})
        print(f"  {arm} probe: {out[-1]['median']}", flush=True)
    spark.stop()
    return out


def print_tables(results: list, load: list) -> None:
    print("\n| session | path | sockets | round overhead ms (median over repeats) | schedule ms | aggregate ms |")
    print("|---|---|---|---|---|---|")
    keys = sorted({(r["arm"].split()[0], r["path"], r["arm"].split()[1]) for r in results if r["path"] != "probe"})
    for session, path, sockets in keys:
        rs = [r for r in results if r["arm"] == f"{session} {sockets}" and r["path"] == path]
        med = lambda key: 1000 * statistics.median(r["median"][key] for r in rs)  # noqa: E731
        print(f"| {session} | {path} | {sockets} | {med('overhead_s'):.0f} | {med('schedule_s'):.0f} | "
              f"{med('aggregate_s'):.0f} |")
    print("\n| sockets | bare task: submit to start ms | wait for its input ms | result back ms |")
    print("|---|---|---|---|")
    for sockets in ("tcp", "uds"):
        rs = [r["median"] for r in results if r["arm"] == f"classic {sockets}" and r["path"] == "probe"]
        if rs:
            print(" | ".join([f"| {sockets}"] + [f"{1000 * statistics.median(r[k] for r in rs):.1f}"
                                                for k in ("to_start_s", "input_s", "back_s")]) + " |")
    print(f"\n1-min load average during the run: {', '.join(f'{v:.1f}' for v in load)}")


def main() -> None:
    p = harness.parser(__doc__, out="unix_sockets.json", repeats=2, rounds=16)
    p.add_argument("--tables-only", action="store_true", help="print the tables of the existing --out file")
    p.add_internal("--arm")
    p.add_internal("--child-out")
    args = p.parse_args()
    if args.arm:
        with open(args.child_out, "w") as f:
            json.dump(child(args.arm, args.rounds), f)
        return
    if args.tables_only:
        with open(args.out) as f:
            saved = json.load(f)
        return print_tables(saved["results"], saved["load_avg_1min"])
    results, load = run_alternating(__file__, ARMS, args.repeats, args.rounds, args.out)
    harness.write_results(args.out, args, conf=harness.settings(), arm_conf=ARM_CONF, load_avg_1min=load,
                          results=results)
    print_tables(results, load)


if __name__ == "__main__":
    main()
