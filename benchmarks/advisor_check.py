"""Checks ``sparkdl_avg.advise``'s predictions against real fits (docs/advisor.md).

For each master (a child process each: one SparkContext per JVM) and each
model — the suite's CNN (31k parameters, 20,000 synthetic 28×28 images,
``benchmarks/bench_cnn.py``) and the 1e6-parameter MLP of
``benchmarks/overhead.py`` (8,192 random 64-feature examples) — and each of
two averaging frequencies: ``advise(model, data, epochs=E, averaging_frequency=k)``,
then a real ``fit`` of ``E`` epochs with the session's parallelism as workers
and that ``k``. Compared: the predicted epoch time against the measured one
(the median over the fit's epochs after the first of the sum of its rounds'
wall times: the steady state the cost model describes), and the predicted
total (one-off costs + ``E`` epochs) against the fit's wall time. The 1-minute
load average is recorded with every case. Sessions: the README's settings
(``benchmarks/harness.py``) and a 2 GB driver. Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/advisor_check.py

Writes ``benchmarks/results/advisor_check.json`` and prints a Markdown table.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness  # noqa: E402

CONF = {"spark.driver.memory": "2g", "spark.executorEnv.PYSPARK_PYTHON": sys.executable}
FREQUENCIES = {"cnn": (8, 128), "mlp1e6": (4, 32)}


def data_and_builder(name: str):
    import numpy as np

    if name == "cnn":
        import bench_cnn

        x, y = bench_cnn.make_data(20000)
        return (x, y.astype("int64")), bench_cnn.build_model
    import overhead

    rng = np.random.default_rng(0)
    x = rng.normal(size=(8192, overhead.INPUT_DIM)).astype("float32")
    y = rng.integers(0, 10, size=8192).astype("int64")
    return (x, y), lambda: overhead.build_mlp(overhead.WIDTHS["1e6"])


def child(master: str, models, epochs: int, budget: float) -> list:
    from sparkdl_avg import ParameterAveragingTrainer, advise

    spark = harness.session(master, conf=CONF)
    out = []
    try:
        for name in models:
            data, build = data_and_builder(name)
            for k in FREQUENCIES[name]:
                load_before = os.getloadavg()[0]
                advice = advise(build(), data, epochs=epochs, averaging_frequency=k, budget_s=budget)
                workers = advice.measurements["parallelism"]
                row = next(r for r in advice.rows if r["workers"] == workers and r["averaging_frequency"] == min(
                    k, advice.measurements["num_examples"] // (workers * 32)))
                trainer = ParameterAveragingTrainer(build(), num_workers=workers, batch_size=32, averaging_frequency=k,
                                                    seed=0, slow_warning=False)
                t0 = time.perf_counter()
                trainer.fit(data, epochs=epochs, verbose=0)
                fit_s = time.perf_counter() - t0
                per_epoch = [sum(r.wall_s for r in trainer.stats.records if r.epoch == e) for e in range(epochs)]
                measured = statistics.median(per_epoch[1:]) if epochs > 1 else per_epoch[0]
                trainer.close()
                out.append(dict(
                    model=name, master=master, workers=workers, k=k, predicted_epoch_s=row["epoch_s"],
                    measured_epoch_s=measured, epochs_s=per_epoch, error=row["epoch_s"] / measured - 1,
                    predicted_total_s=row["total_s"], fit_s=fit_s, summary=advice.summary,
                    advise_s=advice.measurements["elapsed_s"], t_single=advice.measurements["t_single"],
                    t_step=advice.measurements["t_step"], fixed=advice.measurements["fixed"],
                    one_off_s=advice.measurements["staging_full_s"] + advice.measurements["first_round_extra_s"],
                    load=[load_before, os.getloadavg()[0]],
                ))
                print(json.dumps(out[-1]), flush=True)
    finally:
        spark.stop()
    return out


def main() -> None:
    p = harness.parser(__doc__, out="advisor_check.json")
    p.add_argument("--masters", nargs="+", default=["local[2]", "local-cluster[2,1,2048]"])
    p.add_argument("--models", nargs="+", default=["cnn", "mlp1e6"])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--budget", type=float, default=60.0)
    p.add_internal("--child", default=None)
    args = p.parse_args()
    if args.child:
        child(args.child, args.models, args.epochs, args.budget)
        return
    results = []
    for master in args.masters:
        proc = subprocess.run([sys.executable, __file__, "--child", master, "--models", *args.models,
                               "--epochs", str(args.epochs), "--budget", str(args.budget)],
                              capture_output=True, text=True)
        rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0:
            print(f"{master}: child failed ({proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
        results.extend(rows)
    harness.write_results(args.out, args, conf=harness.settings(CONF), epochs=args.epochs, budget_s=args.budget,
                          results=results)
    print_table(results)


def print_table(results) -> None:
    print("| model | master | workers | k | predicted epoch s | measured epoch s | error | within ±25% | "
          "predicted total s | fit s | advise s | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        ok = "yes" if abs(r["error"]) <= 0.25 else "**no**"
        print(f"| {r['model']} | {r['master']} | {r['workers']} | {r['k']} | {r['predicted_epoch_s']:.2f} | "
              f"{r['measured_epoch_s']:.2f} | {r['error']:+.0%} | {ok} | {r['predicted_total_s']:.1f} | "
              f"{r['fit_s']:.1f} | {r['advise_s']:.0f} | {r['load'][0]:.1f}–{r['load'][1]:.1f} |")


if __name__ == "__main__":
    main()
