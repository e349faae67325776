"""The driver's own work per round as the number of workers grows, without Spark and without contention.

In the aggregation sweep (``overhead.py --sweeps aggregation``) the driver's
time per round is measured while N workers and the reducers time-share this
machine's 2 cores (1-minute load up to 14 at 16 workers), so it grows with
N even where the driver's work does not. This script measures that work
alone, in one process: for N = 2, 4, 8, 16 workers and the MLPs of
``overhead.py`` (1e6 and 3e6 parameters, Adam) it builds the Arrow table a
Spark SQL round's job returns to the driver (``sql:storage`` and
``sql:shuffle``: the N workers' result rows and the S summed shards of
:func:`~sparkdl_avg.driver.transport.policy.plan_aggregation`; ``sql:driver``: every
worker's whole sums), then times what the driver does with it in a round,
with the same functions the round runs: decoding and summing
(``sql_paths.read_rows`` and ``sql_paths.assemble``) and the update
(:meth:`sparkdl_avg.driver.fit.rounds.RoundRunner.update`: the averages, the update
rule, the optimizer's average and setting the Keras model's state). The
sweep runs twice; each configuration runs 3 untimed rounds (a fit's rounds
find the allocator warm) and ``--repeats`` timed ones; medians reported.
No Spark session (the results' ``conf`` is empty). Usage::

    .venv/bin/python benchmarks/driver_scaling.py

Writes ``benchmarks/results/driver_scaling.json`` and prints a Markdown table.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import harness  # noqa: E402
from overhead import INPUT_DIM, WIDTHS, build_mlp, params_of  # noqa: E402

WORKERS = (2, 4, 8, 16)
SIZES = ("1e6", "3e6")
PATHS = ("sql:storage", "sql:driver")


def round_table(layout, f32, f64, workers: int, how: str):
    """The Arrow table the round's job gives the driver for ``workers`` workers, and its shard count."""
    import pyarrow as pa

    from sparkdl_avg.shared.wire import round_rows
    from sparkdl_avg.driver.transport import policy as transport
    from sparkdl_avg.shared.wire.aggregation import PartialResult
    from sparkdl_avg.shared.wire.stats import WorkerRecord

    _, shards = transport.plan_aggregation(how, None, workers, layout.nbytes)
    rows = []
    for w in range(workers):
        result = PartialResult(64, metric_sums={"loss": 140.0, "accuracy": 10.0}, workers=[WorkerRecord(
            worker=w, host="host", pid=1000 + w, examples=64, start=1.0, end=2.0, load_s=0.01, compute_s=0.5)])
        rows.append({"shard": -1, "worker": w, "meta": round_rows.encode_meta(result), "data": None, "uri": None,
                     "offsets": None})
        if how == "driver":  # every worker's whole sums
            rows.append({"shard": 0, "worker": w, "meta": None, "data": layout.shard_bytes(f32, f64, 0, 1),
                         "uri": None, "offsets": None})
    if how != "driver":  # the reducers' summed shards
        for j in range(shards):
            rows.append(round_rows._summed_row(j, layout.parse_shard(layout.shard_bytes(f32, f64, j, shards), j, shards),
                                               layout, shards, 0.0))
    return pa.Table.from_batches([round_rows._batch(rows)]), shards


def measure(size: str, repeats: int) -> list:
    from sparkdl_avg.shared.wire import exchange
    from sparkdl_avg.driver.transport import sql_paths
    from sparkdl_avg.driver.config.options import AGGREGATIONS
    from sparkdl_avg.shared.model.modelspec import current_learning_rate, get_state, trainable_mask
    from sparkdl_avg.driver.fit.rounds import RoundRunner, RoundSettings, RuleState
    from sparkdl_avg.driver.algorithms.rules import PlainAveraging

    model = build_mlp(WIDTHS[size])
    model.fit(np.zeros((32, INPUT_DIM), np.float32), np.zeros(32, np.int32), verbose=0)  # creates Adam's slots
    weights, opt_vars = get_state(model)
    layout = exchange.FlatLayout.of(weights, opt_vars)
    f32, f64 = layout.flatten([np.asarray(w) * 64 for w in weights], [np.asarray(v) * 64 for v in opt_vars])
    rule = PlainAveraging()
    rule_state = RuleState()
    rule_state.ensure(rule, model)
    settings = RoundSettings(spec=None, fingerprint="", dataset=None, num_workers=0, batch_size=32, seed=1,
                             shuffle=False, average_optimizer=True, on_nonfinite="raise", epochs=1, epoch_steps=1)
    runner = RoundRunner(None, model, settings, rule, rule_state, None, None)
    mask, learning_rate = trainable_mask(model), current_learning_rate(model)
    tables = {(n, path): round_table(layout, f32, f64, n, path.split(":")[1]) for path in PATHS for n in WORKERS}
    times = {key: [] for key in tables}
    for _ in range(2):  # the whole sweep twice, so that a drift of the machine shows in both halves alike
        for (n, path), (table, shards) in tables.items():
            # A fit does the same work every round, so the allocator is warm: 3 untimed rounds first.
            for i in range(3 + repeats):
                w, o = get_state(model)
                t0 = time.perf_counter()
                results, pieces, _ = sql_paths.read_rows(table)
                total, _ = sql_paths.assemble(results, pieces, layout, AGGREGATIONS.get(path.split(":")[1])(), shards)
                t1 = time.perf_counter()
                runner.update(total, w, w, o, mask, learning_rate, 1)
                if i >= 3:
                    times[(n, path)].append((t1 - t0, time.perf_counter() - t1))
    out = []
    for (n, path), samples in times.items():
        out.append({"size": size, "params": params_of(WIDTHS[size]), "workers": n, "path": path,
                    "shards": tables[(n, path)][1], "table_bytes": tables[(n, path)][0].nbytes,
                    "sum_s": statistics.median(s for s, _ in samples),
                    "update_s": statistics.median(u for _, u in samples),
                    "own_s": statistics.median(s + u for s, u in samples)})
    return out


def main() -> None:
    p = harness.parser(__doc__, out="driver_scaling.json", repeats=10,
                       repeats_help="timed rounds per configuration, after 3 untimed ones")
    args = p.parse_args()
    load = [os.getloadavg()[0]]
    results = []
    for size in SIZES:
        results += measure(size, args.repeats)
        load.append(os.getloadavg()[0])
    harness.write_results(args.out, args, load_avg_1min=load, results=results)  # no Spark: conf {}
    print("\n| params | path | workers | shards | MB to the driver | decode + sum ms | update ms | driver own ms | "
          "× 4 workers |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        base = next(b for b in results if (b["size"], b["path"], b["workers"]) == (r["size"], r["path"], 4))
        print(f"| {r['params']:,} | {r['path']} | {r['workers']} | {r['shards']} | {r['table_bytes'] / 1e6:.1f} | "
              f"{1000 * r['sum_s']:.1f} | {1000 * r['update_s']:.1f} | {1000 * r['own_s']:.1f} | "
              f"{r['own_s'] / base['own_s']:.2f} |")
    print(f"\n1-min load average during the run: {', '.join(f'{v:.1f}' for v in load)}")


if __name__ == "__main__":
    main()
