"""Round overhead under Spark Connect against a classic session, 2 workers, side by side.

Each arm is one process (a JVM runs one of the two at a time): a classic
``local[2]`` session and a local Spark Connect server
(``SparkSession.builder.remote("local[2]")``), run alternately ``--repeats``
times. In each, the MLPs of ``overhead.py`` (1e5 and 1e6 parameters, Adam,
batch 32, ``k = 1``) train ``--rounds`` rounds per fit, the first dropped
(replica build); the classic arm runs its default (``state_transport="auto"``:
files on one host) and the Spark SQL round, the Connect arm the Spark SQL
round (the only one there). Round overhead = round wall − slowest compute.
Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/connect_overhead.py

Writes ``benchmarks/results/connect_overhead.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# Under Connect, tasks run in a per-session directory: a relative interpreter path would not be found.
os.environ["PYSPARK_PYTHON"] = os.path.abspath(os.environ["PYSPARK_PYTHON"])

import numpy as np  # noqa: E402

from overhead import WIDTHS, build_mlp, params_of  # noqa: E402

SIZES = ("1e5", "1e6")


def child(arm: str, rounds: int) -> list:
    from pyspark.sql import SparkSession

    from sparkdl_avg import ParameterAveragingTrainer

    if arm == "connect":
        spark = SparkSession.builder.remote("local[2]").getOrCreate()
        transports = ["auto"]
    else:
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        transports = ["auto", "sql"]
    out = []
    for size in SIZES:
        for transport in transports:
            model = build_mlp(WIDTHS[size])
            n = 2 * 32 * rounds
            rng = np.random.default_rng(0)
            df = spark.createDataFrame(
                [(row.tolist(), int(label)) for row, label in zip(rng.normal(size=(n, 64)), rng.integers(0, 10, n))],
                "features array<float>, label int",
            )
            with ParameterAveragingTrainer(model, num_workers=2, batch_size=32, averaging_frequency=1, seed=1,
                                           state_transport=transport) as tr:
                tr.fit(df, epochs=1, verbose=0)
                records = tr.stats.records[1:]
            med = {k: statistics.median(r[k] for r in records) for k in
                   ("wall_s", "broadcast_s", "schedule_s", "workers_s", "aggregate_s", "update_s", "compute_max_s")}
            med["overhead_s"] = statistics.median(r["wall_s"] - r["compute_max_s"] for r in records)
            out.append({"arm": arm, "size": size, "params": params_of(WIDTHS[size]),
                        "transport": records[-1]["transport"], "aggregation": records[-1]["aggregation"],
                        "rounds": len(records), "median": med})
            print(f"  {arm} {size} {out[-1]['transport']}: overhead {1000 * med['overhead_s']:.0f} ms", flush=True)
    spark.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=os.path.join(HERE, "results", "connect_overhead.json"))
    p.add_argument("--arm", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.arm:
        with open(args.child_out, "w") as f:
            json.dump(child(args.arm, args.rounds), f)
        return
    load, results = [os.getloadavg()[0]], []
    for rep in range(args.repeats):
        for arm in (("classic", "connect") if rep % 2 == 0 else ("connect", "classic")):
            tmp = os.path.join(os.path.dirname(args.out), f".connect-{arm}.tmp")
            subprocess.run([sys.executable, __file__, "--arm", arm, "--child-out", tmp, "--rounds", str(args.rounds)],
                           check=True)
            with open(tmp) as f:
                for r in json.load(f):
                    results.append({**r, "repeat": rep})
            os.remove(tmp)
            load.append(os.getloadavg()[0])
    with open(args.out, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "load_avg_1min": load, "args": vars(args),
                   "results": results}, f, indent=1)
    print("\n| session | params | path | round overhead ms (median over repeats) | aggregate ms | broadcast ms |")
    print("|---|---|---|---|---|---|")
    keys = sorted({(r["arm"], r["size"], r["transport"], r["aggregation"]) for r in results},
                  key=lambda k: (float(k[1]), k[0], k[2]))
    for arm, size, transport, aggregation in keys:
        rs = [r for r in results if (r["arm"], r["size"], r["transport"], r["aggregation"]) == (arm, size, transport,
                                                                                               aggregation)]
        med = lambda key: 1000 * statistics.median(r["median"][key] for r in rs)  # noqa: E731
        path = transport + (f":{aggregation}" if aggregation else "")
        print(f"| {arm} | {rs[0]['params']:,} | {path} | {med('overhead_s'):.0f} | {med('aggregate_s'):.0f} | "
              f"{med('broadcast_s'):.0f} |")
    print(f"\n1-min load average during the run: {', '.join(f'{v:.1f}' for v in load)}")


if __name__ == "__main__":
    main()
