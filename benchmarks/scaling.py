"""Projects time per epoch and efficiency to 8–256 workers from measured per-round costs.

Reads ``benchmarks/results/overhead.json`` (bare Spark probes and per-round
phases) and ``benchmarks/results/suite.json`` (the CNN's compute per
minibatch), fits the cost model of ``docs/scaling.md`` and prints its
projections as Markdown; writes ``benchmarks/results/scaling.json``. Usage::

    .venv/bin/python benchmarks/scaling.py

The model (all terms measured on the 2-core machine unless stated)::

    round(N, k, d) = fixed + k·t_step
    fixed        = job(N) + bcast(P, N) + setup(P) + agg(N, S, d) + update(P)
    job(N)       = job₂ + c_task·(N − 2)                  empty Spark job, per extra task
    bcast(P, N)  = c_bcast·M + ⌈log₂ N⌉·M / bw            M: MB broadcast (weights + optimizer state)
    agg(N, S, d) = Σ_levels [stage + fan_in·S·c_shuffle]  (reducers of a level run in parallel)
                   + parts_at_driver·S·c_driver           S: MB returned per worker
    epoch        = ⌈D / (N·B·k)⌉ · fixed + (D / (N·B))·t_step      D examples, batch B
    efficiency   = (D / (N·B))·t_step / epoch

With ``--aggregation`` (``benchmarks/results/aggregation.json``, the
``aggregation`` sweep of ``overhead.py``) it also projects the Spark SQL
round with storage reducers (``state_transport="sql"``,
``aggregation="storage"``, one shard per worker)::

    fixed_sql(N, S) = job_sql(N) + e_sql + c_sql·S + update
    job_sql(N)      = an empty N-task mapInArrow job (fitted linear in N)

where ``S`` is one model's sums in MB: each worker writes its S, each
reducer reads N slices of S/N, the driver receives S, all in parallel across
executors, so no term grows with N·S. ``e_sql`` and ``c_sql`` are fitted at
2 workers (both tasks have a core of their own); the storage's aggregate
bandwidth is assumed to grow with the executors (HDFS, an object store),
until it saturates, which the projection does not model.

``levels``, ``fan_in`` and ``parts_at_driver`` follow PySpark's
``RDD.treeAggregate`` exactly (scale = max(⌈N^(1/d)⌉, 2); a level while
parts > scale + parts/scale). Network bandwidth ``bw`` is an assumption
(10 Gb/s, 1250 MB/s); on one host it does not show up in the measurements.
"""

from __future__ import annotations

import json
import math
import os
import statistics

import harness

HERE = os.path.dirname(os.path.abspath(__file__))


def tree_levels(n: int, depth: int):
    """PySpark treeAggregate: list of (parts in, parts out) per shuffle level; parts reaching the driver."""
    scale = max(int(math.ceil(pow(n, 1.0 / depth))), 2)
    parts, levels = float(n), []
    while parts > scale + parts / scale:
        new = parts / scale
        levels.append((int(math.ceil(parts)), int(new)))
        parts = new
    return levels, int(parts)


def _slope(points):
    """Least-squares slope of (x, y) points."""
    xs, ys = zip(*points)
    mx, my = statistics.mean(xs), statistics.mean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def fit_costs(overhead: dict, bandwidth_mb_s: float) -> dict:
    probes = overhead["probes"]

    def p(probe, tasks, **kw):
        return [r for r in probes if r["probe"] == probe and r["tasks"] == tasks
                and all(r.get(k) == v for k, v in kw.items())]

    job2 = p("empty job", 2)[0]["s"]
    job8 = p("empty job", 8)[0]["s"] if p("empty job", 8) else job2
    c_task = max(0.0, (job8 - job2) / 6)
    bc = p("broadcast", 2)
    c_bcast = max(0.0, _slope([(r["mb"], r["s"]) for r in bc])) if len(bc) > 1 else 0.0
    agg1 = p("aggregate", 2, dtype="float64", depth=2)  # 2 parts: no shuffle level, straight to the driver
    c_driver = max(0.0, _slope([(2 * r["mb"], r["s"]) for r in agg1]))  # per MB reaching the driver
    costs = {"job2_s": job2, "c_task_s": c_task, "c_bcast_s_per_mb": c_bcast, "c_driver_s_per_mb": c_driver,
             "bandwidth_mb_s": bandwidth_mb_s}
    d1 = {r["mb"]: r["s"] for r in p("aggregate", 8, depth=1)}
    d2 = {r["mb"]: r["s"] for r in p("aggregate", 8, depth=2)}
    if d1 and d2:
        # depth 2 with 8 parts: one level 8 → 3 parts (fan-in 3) then 3 parts to the driver.
        mbs = sorted(set(d1) & set(d2))
        small = mbs[0]
        extra = [(mb, d2[mb] - (job8 + 3 * mb * c_driver)) for mb in mbs]
        # On 2 cores all 8 map outputs and 3 reducers share the CPU: the level's work is 8·mb MB in all.
        c_shuffle = max(0.0, _slope([(8 * mb, e) for mb, e in extra])) if len(extra) > 1 else 0.0
        stage = max(0.0, extra[0][1] - 8 * small * c_shuffle)
        costs.update({"stage_s": stage, "c_shuffle_s_per_mb": c_shuffle})
    else:
        costs.update({"stage_s": 0.9, "c_shuffle_s_per_mb": c_driver})
    return costs


def round_time(costs, model, n, k, depth, partial_dtype_bytes=8):
    m_bcast = model["broadcast_mb"]
    s = model["partial_mb_f64"] * partial_dtype_bytes / 8
    job = costs["job2_s"] + costs["c_task_s"] * (n - 2)
    bcast = costs["c_bcast_s_per_mb"] * m_bcast + math.ceil(math.log2(max(n, 2))) * m_bcast / costs["bandwidth_mb_s"]
    levels, at_driver = tree_levels(n, depth)
    agg = 0.0
    for parts_in, parts_out in levels:
        fan_in = math.ceil(parts_in / parts_out)
        agg += costs["stage_s"] + fan_in * s * (costs["c_shuffle_s_per_mb"] + 1 / costs["bandwidth_mb_s"])
    agg += at_driver * s * (costs["c_driver_s_per_mb"] + 1 / costs["bandwidth_mb_s"])
    fixed = job + bcast + model["setup_s"] + agg + model["update_s"]
    return fixed, k * model["t_step_s"]


def project(costs, model, workers, freqs, depths, examples, batch, partial_dtype_bytes=8):
    rows = []
    for n in workers:
        for k in freqs:
            for d in depths:
                fixed, compute = round_time(costs, model, n, k, d, partial_dtype_bytes)
                steps = examples / (n * batch)
                rounds = math.ceil(steps / k)
                ideal = steps * model["t_step_s"]
                epoch = rounds * fixed + ideal  # the epoch's last round is cut to the steps left
                rows.append({"model": model["name"], "workers": n, "k": k, "depth": d,
                             "partial_bytes": partial_dtype_bytes, "round_fixed_s": fixed,
                             "round_compute_s": compute, "epoch_s": epoch, "ideal_epoch_s": ideal,
                             "efficiency": ideal / epoch})
    return rows


def fit_sql_costs(aggregation: dict) -> dict:
    """The Spark SQL round's constants from the aggregation sweep (see the module docstring)."""
    floor = [(r["tasks"], r["s"]) for r in aggregation["probes"] if r["probe"] == "empty mapInArrow job"]
    c_task = max(0.0, _slope(floor)) if len(floor) > 1 else 0.0
    job2 = min((s for n, s in floor if n == 2), default=0.15)
    rows = [r for r in aggregation["configs"] if "failed" not in r and r["transport"] == "sql:storage"
            and r["workers"] == 2]
    points = [(r["model_sum_bytes"] / 1e6, r["median"]["round_overhead_s"] - r["median"]["update_s"] - job2)
              for r in rows]
    c_mb = max(0.0, _slope(points)) if len(points) > 1 else 0.0
    e = statistics.median(y - c_mb * x for x, y in points) if points else 0.0
    return {"job_sql2_s": job2, "c_task_sql_s": c_task, "e_sql_s": e, "c_sql_s_per_mb": c_mb}


def project_sql(costs, model, workers, freqs, examples, batch, sum_bytes=8):
    """Projected rows of the Spark SQL round with storage reducers (``sum_bytes``: 8 float64 sums, 4 float32)."""
    rows = []
    s = model["partial_mb_f64"] * sum_bytes / 8
    for n in workers:
        for k in freqs:
            fixed = (costs["job_sql2_s"] + costs["c_task_sql_s"] * (n - 2) + costs["e_sql_s"]
                     + costs["c_sql_s_per_mb"] * s + model["update_s"])
            steps = examples / (n * batch)
            ideal = steps * model["t_step_s"]
            epoch = math.ceil(steps / k) * fixed + ideal
            rows.append({"model": model["name"], "workers": n, "k": k, "path": "sql:storage",
                         "partial_bytes": sum_bytes, "round_fixed_s": fixed, "epoch_s": epoch,
                         "ideal_epoch_s": ideal, "efficiency": ideal / epoch})
    return rows


def models_from(overhead: dict, suite: dict):
    prof = {p["size"]: p for p in overhead["profiles"]}
    cfg = {c["size"]: c for c in overhead["configs"] if c["sweep"] == "size"}
    out = []
    if suite:
        one = next(r for name, r in suite["runs"].items() if name.startswith("trainer 1 worker") and r)
        steps = suite["args"]["examples"] // suite["args"]["batch_size"]
        t_step = statistics.median(c / steps for r in one for c in r["compute_per_epoch_s"][1:])
        small = cfg.get("1e4") or next(iter(cfg.values()))
        # 31k parameters, Adam: 0.37 MB broadcast, 0.75 MB back per worker (float64).
        out.append({"name": "CNN 31k params", "params": 31_466, "t_step_s": t_step,
                    "broadcast_mb": 31_466 * 12 / 1e6, "partial_mb_f64": 31_466 * 24 / 1e6,
                    "setup_s": small["median"]["setup_max_s"], "update_s": small["median"]["update_s"]})
    for size in ("1e6", "1e7"):
        if size in cfg and size in prof:
            c = cfg[size]
            out.append({"name": f"MLP {c['params'] / 1e6:.1f}M params", "params": c["params"],
                        "t_step_s": c["median"]["compute_max_s"] / c["k"],
                        "broadcast_mb": prof[size]["broadcast_bytes"] / 1e6,
                        "partial_mb_f64": prof[size]["partial_bytes_float64"] / 1e6,
                        "setup_s": c["median"]["setup_max_s"], "update_s": c["median"]["update_s"]})
    return out


def main() -> None:
    p = harness.parser(__doc__, out="scaling.json")
    p.add_argument("--overhead", default=os.path.join(HERE, "results", "overhead.json"))
    p.add_argument("--suite", default=os.path.join(HERE, "results", "suite.json"))
    p.add_argument("--examples", type=int, default=1_280_000, help="examples per epoch (D)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--bandwidth", type=float, default=1250.0, help="network MB/s per node (assumed)")
    p.add_argument("--task-ms", type=float, default=None,
                   help="per-task cost of a job in ms (default: measured, 2 → 8 tasks on local[8], pessimistic)")
    p.add_argument("--aggregation", default=os.path.join(HERE, "results", "aggregation.json"),
                   help="overhead.py's aggregation sweep, for the Spark SQL round's projection")
    args = p.parse_args()
    with open(args.overhead) as f:
        overhead = json.load(f)
    suite = None
    if os.path.exists(args.suite):
        with open(args.suite) as f:
            suite = json.load(f)
    costs = fit_costs(overhead, args.bandwidth)
    if args.task_ms is not None:
        costs["c_task_s"] = args.task_ms / 1000
    models = models_from(overhead, suite)
    workers = [8, 16, 32, 64, 128, 256]
    rows = []
    for m in models:
        rows += project(costs, m, workers, [8, 32, 128, 512], [1, 2, 3], args.examples, args.batch_size)
        rows += project(costs, m, workers, [8, 32, 128, 512], [1, 2, 3], args.examples, args.batch_size, 4)
    sql_costs, sql_rows = None, []
    if os.path.exists(args.aggregation):
        with open(args.aggregation) as f:
            sql_costs = fit_sql_costs(json.load(f))
        for m in models:
            sql_rows += project_sql(sql_costs, m, workers, [8, 32, 128, 512], args.examples, args.batch_size, 4)
    harness.write_results(args.out, args, costs=costs, models=models, rows=rows, sql_costs=sql_costs,
                          sql_rows=sql_rows)

    print("Fitted costs:", ", ".join(f"{k} = {v:.4g}" for k, v in costs.items()))
    for m in models:
        print(f"\n{m['name']}: t_step {1000 * m['t_step_s']:.1f} ms, broadcast {m['broadcast_mb']:.2f} MB, "
              f"partial {m['partial_mb_f64']:.2f} MB per worker (float64)")
    print(f"\nD = {args.examples:,} examples, batch {args.batch_size}; efficiency (epoch s) with the best depth "
          "for float64 partials / float32 partials:")
    for m in models:
        print(f"\n{m['name']}\n\n| workers | " + " | ".join(f"k={k}" for k in [8, 32, 128, 512]) + " | best depth (k=128) |")
        print("|---|---|---|---|---|---|")
        for n in workers:
            cells, best_d = [], None
            for k in [8, 32, 128, 512]:
                parts = []
                for pb in (8, 4):
                    cand = [r for r in rows if r["model"] == m["name"] and r["workers"] == n and r["k"] == k
                            and r["partial_bytes"] == pb]
                    best = min(cand, key=lambda r: r["epoch_s"])
                    parts.append(f"{100 * best['efficiency']:.0f}% ({best['epoch_s']:.0f} s)")
                    if k == 128 and pb == 8:
                        best_d = best["depth"]
                cells.append(" / ".join(parts))
            print(f"| {n} | " + " | ".join(cells) + f" | {best_d} |")
    if sql_rows:
        print("\nSpark SQL round, storage reducers (float32 sums):", ", ".join(f"{k} = {v:.4g}" for k, v in sql_costs.items()))
        for m in models:
            print(f"\n{m['name']}, state_transport='sql' (storage), float32 sums: efficiency (epoch s) / the best "
                  "Spark-tree depth's, float32\n\n| workers | " + " | ".join(f"k={k}" for k in [8, 32, 128, 512]) + " |")
            print("|---|---|---|---|---|")
            for n in workers:
                cells = []
                for k in [8, 32, 128, 512]:
                    r = next(r for r in sql_rows if r["model"] == m["name"] and r["workers"] == n and r["k"] == k)
                    tree = min((t for t in rows if t["model"] == m["name"] and t["workers"] == n and t["k"] == k
                                and t["partial_bytes"] == 4), key=lambda t: t["epoch_s"])
                    cells.append(f"{100 * r['efficiency']:.0f}% ({r['epoch_s']:.0f} s) / {100 * tree['efficiency']:.0f}%")
                print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
