"""Round overhead under Spark Connect against a classic session, 2 workers, side by side.

Each arm is one process (a JVM runs one of them at a time): a classic
``local[2]`` session and a local Spark Connect server
(``builder.remote("local[2]")``, ``harness.session(connect=True)``), each
with the README's settings (``benchmarks/harness.py``:
``spark.python.daemon.module=sparkdl_avg.daemon``, Unix domain sockets;
``classic``, ``connect``) and with PySpark's own daemon (``classic-plain``,
``connect-plain``: the arms that deviate, with ``spark.python.daemon.module``
unset, to show what the daemon does under each), and ``connect-per-round``:
README's settings with a Spark job for every round
(``standing_rounds="off"``, what every Connect round did before rounds
ran in one standing job), run in alternating order ``--repeats`` times
(``--arms``: which of them, default all). In each, the MLPs of ``overhead.py`` (1e5 and 1e6
parameters, Adam, batch 32, ``k = 1``) train ``--rounds`` rounds per fit,
the first dropped (replica build), after one unrecorded fit that warms the
JVM; the classic arm runs its default (``state_transport="auto"``:
files on one host) and the Spark SQL round, the Connect arm the Spark SQL
round (the only one there). Round overhead = round wall − slowest compute.
Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/connect_overhead.py

Writes ``benchmarks/results/connect_overhead.json`` and prints a Markdown table.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# Under Connect, tasks run in a per-session directory: a relative interpreter path would not be found.
os.environ["PYSPARK_PYTHON"] = os.path.abspath(os.environ["PYSPARK_PYTHON"])

import numpy as np  # noqa: E402

import harness  # noqa: E402
from arms import run_alternating  # noqa: E402
from overhead import WIDTHS, build_mlp, params_of  # noqa: E402

SIZES = ("1e5", "1e6")
ARMS = ("classic", "connect", "connect-per-round", "classic-plain", "connect-plain")
#: The arms that deviate from the README's settings: PySpark's own daemon.
ARM_CONF = {arm: {"spark.python.daemon.module": None} for arm in ARMS if arm.endswith("-plain")}


def child(arm: str, rounds: int) -> list:
    from sparkdl_avg import ParameterAveragingTrainer

    connect = arm.startswith("connect")
    standing = "off" if arm == "connect-per-round" else "auto"
    spark = harness.session("local[2]", connect=connect, conf=ARM_CONF.get(arm))
    transports = ["auto"] if connect else ["auto", "sql"]
    out = []
    # The first fit of a JVM runs its planner and scheduler code cold (about 50 ms more per round under
    # Connect): one unrecorded fit first, so each arm reports the steady state that a long fit sees.
    plan = [(True, SIZES[0], transports[0])] + [(False, size, t) for size in SIZES for t in transports]
    for warm_up, size, transport in plan:
        model = build_mlp(WIDTHS[size])
        n = 2 * 32 * rounds
        rng = np.random.default_rng(0)
        df = spark.createDataFrame(
            [(row.tolist(), int(label)) for row, label in zip(rng.normal(size=(n, 64)), rng.integers(0, 10, n))],
            "features array<float>, label int",
        )
        with ParameterAveragingTrainer(model, num_workers=2, batch_size=32, averaging_frequency=1, seed=1,
                                       state_transport=transport, standing_rounds=standing,
                                       slow_warning=False) as tr:
            tr.fit(df, epochs=1, verbose=0)
            records = tr.stats.records[1:]
        if warm_up:
            continue
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
    p = harness.parser(__doc__, out="connect_overhead.json", repeats=2, rounds=8)
    p.add_argument("--tables-only", action="store_true", help="print the tables of the existing --out file")
    p.add_argument("--arms", default=",".join(ARMS),
                   help="comma-separated arms to run, of " + ", ".join(ARMS) + " (default: all)")
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
        return print_tables(saved["results"], saved["load_avg_1min"], saved["args"]["repeats"])
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        p.error(f"unknown arms {unknown}; choose among {', '.join(ARMS)}")
    results, load = run_alternating(__file__, arms, args.repeats, args.rounds, args.out)
    harness.write_results(args.out, args, conf=harness.settings(), arm_conf=ARM_CONF, load_avg_1min=load,
                          results=results)
    print_tables(results, load, args.repeats)


def print_tables(results: list, load: list, repeats: int) -> None:
    print("\n| session | params | path | round overhead ms (median over repeats) | round wall ms | aggregate ms | "
          "broadcast ms |")
    print("|---|---|---|---|---|---|---|")
    keys = sorted({(r["arm"], r["size"], r["transport"], r["aggregation"]) for r in results},
                  key=lambda k: (float(k[1]), ARMS.index(k[0]), k[2]))
    for arm, size, transport, aggregation in keys:
        rs = [r for r in results if (r["arm"], r["size"], r["transport"], r["aggregation"]) == (arm, size, transport,
                                                                                               aggregation)]
        med = lambda key: 1000 * statistics.median(r["median"][key] for r in rs)  # noqa: E731
        path = transport + (f":{aggregation}" if aggregation else "")
        print(f"| {arm} | {rs[0]['params']:,} | {path} | {med('overhead_s'):.0f} | {med('wall_s'):.0f} | "
              f"{med('aggregate_s'):.0f} | {med('broadcast_s'):.0f} |")
    print("\n| Connect arm | params | its round overhead / the classic arm's (same daemon), per repeat | median |")
    print("|---|---|---|---|")
    present = {r["arm"] for r in results}
    for arm in (a for a in ARMS if a.startswith("connect") and a in present):
        classic = "classic-plain" if arm.endswith("-plain") else "classic"
        if classic not in present:
            continue
        for size in SIZES:
            ratios = [ratio(results, rep, size, arm, classic) for rep in range(repeats)]
            print(f"| {arm} | {size} | {', '.join(f'{r:.2f}' for r in ratios)} | {statistics.median(ratios):.2f} |")
    print(f"\n1-min load average during the run: {', '.join(f'{v:.1f}' for v in load)}")


def ratio(results: list, repeat: int, size: str, arm: str, classic: str) -> float:
    """``arm``'s round overhead over the ``classic`` arm's default (``files``) in one repeat, for one model size."""
    def overhead(name, transports):
        return next(r["median"]["overhead_s"] for r in results
                    if (r["arm"], r["size"], r["repeat"]) == (name, size, repeat) and r["transport"] in transports)

    return overhead(arm, ("sql",)) / overhead(classic, ("files",))


if __name__ == "__main__":
    main()
