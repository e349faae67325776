"""Benchmark suite: this trainer against plain Keras, Elephas and the ideal, side by side.

One run, one machine, the CNN task of ``benchmarks/bench_cnn.py`` (a 31k
parameter CNN on 20,000 synthetic 28×28 images, 5,000 held out; Adam 1e-3,
batch 32, the same epochs and initial weights for every arm). Arms:

* ``keras``: ``model.fit`` in this process, TensorFlow on all cores (the
  baseline the ratios refer to), and with ``steps_per_execution=128`` (Keras'
  own multi-step graph loop, a stronger single-process baseline); and in a
  Python of its own with TensorFlow's oneDNN kernels on, as the trainer's
  executors run them (TensorFlow turns them on by itself only on CPUs with
  AVX-512 VNNI; a user gets them with ``TF_ENABLE_ONEDNN_OPTS=1``);
* ``trainer``: ``ParameterAveragingTrainer`` on ``local[2]`` with 2 workers,
  plain averaging at several averaging frequencies ``k`` and block momentum
  (``update_rule="bmuf"``, ``η = 1 − 1/N = 0.5``);
* ``trainer 1 worker``: the same with one worker (one core); 2 × its compute
  throughput is the **ideal** (N × single-worker throughput), shown as its
  own row;
* ``elephas``: Elephas 7.3.0, synchronous, averaging once per epoch, on
  ``local[2]``, run in its own venv (``benchmarks/.venv-elephas``, created on
  first use by ``benchmarks/elephas_env.py``) as a subprocess; skipped with a
  message when it cannot be installed. It is the one arm without the
  README's settings (``spark.python.daemon.module`` and Unix domain sockets
  unset; ``elephas_arm.py`` says why); the trainer arms' session has them
  (``benchmarks/harness.py``).

Arms are interleaved within each repeat so that drift in the machine's load
hits all of them alike. Before each trainer arm an untimed one-round fit
keeps the Python workers warm (TensorFlow imported, replica built), so every
trainer arm starts like a user's second ``fit`` on the same cluster. Held-out accuracy is measured on the driver after
every epoch (not timed); "time to target" is the training time from the
start of ``fit`` (staging included) to the end of the first epoch whose
held-out accuracy reaches the target; "whole fit" is the wall time of the
``fit`` call as a user times it (the trainer's data staging included), less
those evaluations, which a user's fit does not run. Usage::

    make bench                                   # suite + overhead + plots
    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/suite.py [--repeats 3]

Writes ``benchmarks/results/suite.json`` and prints Markdown tables.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np  # noqa: E402

import harness  # noqa: E402
from bench_cnn import EpochTimer, build_model, make_data  # noqa: E402

BASELINE = "keras (1 process)"
ONEDNN = "keras (1 process, oneDNN kernels as the executors run)"


def _accuracy_callback(xt, yt, t0, state):
    """Evaluates held-out accuracy at each epoch end; records elapsed training time without it."""
    import keras

    class _HeldOut(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            state["elapsed_s"].append(time.perf_counter() - t0 - state["eval_s"])
            te = time.perf_counter()
            state["epoch_accuracy"].append(float(self.model.evaluate(xt, yt, verbose=0, batch_size=256)[1]))
            state["eval_s"] += time.perf_counter() - te

    return _HeldOut()


def run_keras(d, epochs, batch, steps_per_execution=1):
    model = build_model(d["weights"], steps_per_execution)
    timer = EpochTimer()
    state = {"elapsed_s": [], "epoch_accuracy": [], "eval_s": 0.0}
    t0 = time.perf_counter()
    cb = _accuracy_callback(d["xt"], d["yt"], t0, state)
    model.fit(d["x"], d["y"], batch_size=batch, epochs=epochs, shuffle=True, verbose=0, callbacks=[timer, cb])
    fit_s = time.perf_counter() - t0 - state["eval_s"]
    return {"epoch_s": timer.times, "fit_s": fit_s, "elapsed_s": state["elapsed_s"],
            "epoch_accuracy": state["epoch_accuracy"], "accuracy": state["epoch_accuracy"][-1]}


def run_keras_onednn(npz, epochs, batch, out_dir):
    """:func:`run_keras` in a Python of its own with TensorFlow's oneDNN kernels on, as the trainer's executors run
    (``quiet.EXECUTOR_TF_ENVIRONMENT``; TensorFlow leaves them off on CPUs without AVX-512 VNNI and reads the setting
    only when it is imported): the one-process baseline a user gets by setting the variable."""
    from sparkdl_avg.shared.model import quiet

    out = os.path.join(out_dir, "keras-onednn.json")
    env = {**os.environ, **quiet.EXECUTOR_TF_ENVIRONMENT}
    subprocess.run([sys.executable, os.path.abspath(__file__), "--keras-child", npz, "--keras-child-out", out,
                    "--epochs", str(epochs), "--batch-size", str(batch)], env=env, check=True)
    with open(out) as f:
        return json.load(f)


def keras_child(args) -> None:
    """The body of :func:`run_keras_onednn`'s subprocess: the data and weights from ``--keras-child``'s npz."""
    from tensorflow.python.util import _pywrap_util_port

    with np.load(args.keras_child) as z:
        d = {k: z[k] for k in ("x", "y", "xt", "yt")}
        d["weights"] = [z[f"w{i}"] for i in range(int(z["n_weights"]))]
    run = run_keras(d, args.epochs, args.batch_size)
    run["onednn"] = bool(_pywrap_util_port.IsMklEnabled())  # the kernels really on
    with open(args.keras_child_out, "w") as f:
        json.dump(run, f)


def run_trainer(d, epochs, batch, k, workers, rule=None):
    from sparkdl_avg import ParameterAveragingTrainer

    model = build_model(d["weights"])
    timer = EpochTimer()
    state = {"elapsed_s": [], "epoch_accuracy": [], "eval_s": 0.0}
    with ParameterAveragingTrainer(
        model, num_workers=workers, batch_size=batch, averaging_frequency=k, update_rule=rule, seed=1
    ) as tr:
        t0 = time.perf_counter()
        cb = _accuracy_callback(d["xt"], d["yt"], t0, state)
        tr.fit((d["x"], d["y"]), epochs=epochs, verbose=0, callbacks=[timer, cb])
        fit_s = time.perf_counter() - t0 - state["eval_s"]
        records = tr.stats.records
    compute_per_epoch = [sum(r["compute_max_s"] for r in records if r["epoch"] == e) for e in range(epochs)]
    return {
        "epoch_s": timer.times,
        "fit_s": fit_s,
        "elapsed_s": state["elapsed_s"],
        "epoch_accuracy": state["epoch_accuracy"],
        "accuracy": state["epoch_accuracy"][-1],
        "rounds": len(records),
        "round_wall_ms_median": 1000 * statistics.median(r["wall_s"] for r in records),
        "round_overhead_ms_median": 1000 * statistics.median(r["wall_s"] - r["compute_max_s"] for r in records),
        "round_wall_minus_busy_ms_median": 1000 * statistics.median(r["overhead_s"] for r in records),
        "compute_share": sum(r["compute_max_s"] for r in records) / sum(r["wall_s"] for r in records),
        "compute_per_epoch_s": compute_per_epoch,
        "worker_compute_per_epoch_s": [
            sum(w["compute_s"] for r in records if r["epoch"] == e for w in r["workers"]) for e in range(epochs)
        ],
        "replicas_built": sum(r["replicas_built"] for r in records),
    }


def warm_workers(d, batch, workers):
    """An untimed one-round fit: Python workers alive, TensorFlow imported, the replica built.

    PySpark drops a Python worker that has been idle for a minute (a fixed
    timeout in its worker pool), and the keras and Elephas arms take longer
    than that; without this the first trainer arm after them would pay for
    importing TensorFlow and building the replica again while the others
    would not. Every trainer arm starts like a user's second ``fit``.
    """
    from sparkdl_avg import ParameterAveragingTrainer

    n = workers * batch
    with ParameterAveragingTrainer(build_model(d["weights"]), num_workers=workers, batch_size=batch,
                                   averaging_frequency=1, seed=1, slow_warning=False) as tr:  # one round: not a speed
        tr.fit((d["x"][:n], d["y"][:n]), epochs=1, verbose=0)


def run_elephas(npz, epochs, batch, workers, out_dir):
    from elephas_env import ensure

    python, reason = ensure()
    if python is None:
        return None, reason
    out = os.path.join(out_dir, "elephas.json")
    env = {**os.environ, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [python, os.path.join(HERE, "elephas_arm.py"), npz, out, "--epochs", str(epochs),
         "--batch-size", str(batch), "--workers", str(workers), "--repeats", "1"],
        env=env, capture_output=True, text=True,
    )
    if proc.returncode != 0 or not os.path.exists(out):
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        return None, f"the Elephas arm failed (exit {proc.returncode}): {tail}"
    with open(out) as f:
        res = json.load(f)
    os.remove(out)
    run = res["runs"][0]
    run["versions"] = res["versions"]
    run["conf"] = res.get("conf")  # the Elephas session's settings (elephas_arm.py)
    return run, ""


def _median(values):
    values = list(values)
    return statistics.median(values) if values else float("nan")


def _time_to_target(run, target):
    for t, acc in zip(run["elapsed_s"], run["epoch_accuracy"]):
        if acc >= target:
            return t
    return math.inf


def summarize(results, args, ideal_from):
    base_runs = results[BASELINE]
    base_epoch = _median(t for r in base_runs for t in (r["epoch_s"][1:] or r["epoch_s"]))
    base_acc = _median(r["accuracy"] for r in base_runs)
    target = args.target_accuracy if args.target_accuracy is not None else round(base_acc - 0.01, 4)
    base_ttt = _median(_time_to_target(r, target) for r in base_runs)
    base_fit = _median(r["fit_s"] for r in base_runs)
    onednn_fit = _median(r["fit_s"] for r in results.get(ONEDNN, []))
    rows = []
    for name, runs in results.items():
        if not runs:
            continue
        epoch = _median(t for r in runs for t in (r["epoch_s"][1:] or r["epoch_s"]))
        ttt = _median(_time_to_target(r, target) for r in runs)
        row = {
            "arm": name,
            "epoch_s_median": epoch,
            "first_epoch_s_median": _median(r["epoch_s"][0] for r in runs),
            "fit_s_median": _median(r["fit_s"] for r in runs),
            "fit_speedup_vs_keras": base_fit / _median(r["fit_s"] for r in runs),
            "fit_speedup_vs_keras_onednn": onednn_fit / _median(r["fit_s"] for r in runs),
            "examples_per_s": args.examples / epoch,
            "ratio_to_keras": epoch / base_epoch,
            "speedup_vs_keras": base_epoch / epoch,
            "accuracy_median": _median(r["accuracy"] for r in runs),
            "accuracy_delta_vs_keras": _median(r["accuracy"] for r in runs) - base_acc,
            "epoch_accuracy_median": [_median(r["epoch_accuracy"][e] for r in runs) for e in range(len(runs[0]["epoch_accuracy"]))],
            "time_to_target_s_median": ttt,
            "target_reached": sum(_time_to_target(r, target) < math.inf for r in runs),
            "repeats": len(runs),
            "ttt_ratio_to_keras": ttt / base_ttt if math.isfinite(ttt) and math.isfinite(base_ttt) else None,
        }
        for key in ("round_overhead_ms_median", "round_wall_minus_busy_ms_median", "round_wall_ms_median", "compute_share"):
            if key in runs[0]:
                row[key] = _median(r[key] for r in runs)
        if "rounds" in runs[0]:
            row["rounds_per_fit"] = runs[0]["rounds"]
            row["replicas_built_per_fit"] = max(r["replicas_built"] for r in runs)
        if "versions" in runs[0]:
            row["versions"] = runs[0]["versions"]
        rows.append(row)
    if ideal_from in results and results[ideal_from]:
        runs = results[ideal_from]
        # One worker alone on one core; N of them in parallel with nothing else.
        compute = _median(c for r in runs for c in (r["compute_per_epoch_s"][1:] or r["compute_per_epoch_s"]))
        epoch = compute / args.workers
        rows.append({
            "arm": f"ideal ({args.workers} × one worker's compute throughput)",
            "epoch_s_median": epoch,
            "examples_per_s": args.examples / epoch,
            "ratio_to_keras": epoch / base_epoch,
            "speedup_vs_keras": base_epoch / epoch,
        })
    # Elephas averages once per epoch and may not reach the main target in the
    # same epochs: compare to it at the accuracy it does reach (its median
    # final accuracy, rounded down to 0.001) when that is lower.
    elephas_runs = next((runs for name, runs in results.items() if name.startswith("elephas") and runs), None)
    common = target
    if elephas_runs:
        common = min(target, math.floor(1000 * _median(r["accuracy"] for r in elephas_runs)) / 1000)
    e_ttt = _median(_time_to_target(r, common) for r in elephas_runs) if elephas_runs else None
    e_epoch = _median(t for r in elephas_runs for t in (r["epoch_s"][1:] or r["epoch_s"])) if elephas_runs else None
    for row in rows:
        runs = results.get(row["arm"])
        if not runs:
            continue
        row["common_target"] = common
        row["time_to_common_target_s_median"] = t = _median(_time_to_target(r, common) for r in runs)
        if e_ttt is not None:
            row["speedup_to_common_target_vs_elephas"] = e_ttt / t if math.isfinite(t) and math.isfinite(e_ttt) else None
            row["epoch_speedup_vs_elephas"] = e_epoch / row["epoch_s_median"]
    return rows, target, common


def _fmt(v, spec=".2f"):
    if v is None or (isinstance(v, float) and (math.isnan(v))):
        return "–"
    if isinstance(v, float) and math.isinf(v):
        return "not reached"
    return format(v, spec)


def print_tables(rows, target, common, args):
    print(f"\nTarget held-out accuracy: {target:.4f} (plain Keras' final − 0.01); common target with Elephas: {common:.4f}"
          f"  ({args.examples} examples, {args.epochs} epochs, batch {args.batch_size})")
    print(
        f"\n| arm | whole fit s ({args.epochs} epochs) | whole fit vs keras | vs keras with oneDNN | epoch s | examples/s | speed-up vs keras "
        f"| first epoch s | held-out acc | Δ acc vs keras | time to {target:.3f} s | time to {common:.3f} s "
        f"| faster than Elephas to {common:.3f} | round overhead ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        speedup = r.get("fit_speedup_vs_keras")
        print(
            f"| {r['arm']} | {_fmt(r.get('fit_s_median'))} | {_fmt(speedup)}{'×' if speedup else ''} | "
            f"{_fmt(r.get('fit_speedup_vs_keras_onednn'))}{'×' if r.get('fit_speedup_vs_keras_onednn') else ''} | "
            f"{_fmt(r['epoch_s_median'])} | {_fmt(r['examples_per_s'], '.0f')} | "
            f"{_fmt(r['speedup_vs_keras'])}× | {_fmt(r.get('first_epoch_s_median'))} | "
            f"{_fmt(r.get('accuracy_median'), '.4f')} | {_fmt(r.get('accuracy_delta_vs_keras'), '+.4f')} | "
            f"{_fmt(r.get('time_to_target_s_median'), '.1f')} | {_fmt(r.get('time_to_common_target_s_median'), '.1f')} | "
            f"{_fmt(r.get('speedup_to_common_target_vs_elephas'))}{'×' if r.get('speedup_to_common_target_vs_elephas') else ''} | "
            f"{_fmt(r.get('round_overhead_ms_median'), '.0f')} |"
        )


def main() -> None:
    p = harness.parser(__doc__, out="suite.json", repeats=3)
    p.add_argument("--examples", type=int, default=20000)
    p.add_argument("--test-examples", type=int, default=5000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--frequencies", type=int, nargs="+", default=[32, 128, 312],
                   help="k for plain averaging (312: one round per epoch at 20,000 examples, like Elephas)")
    p.add_argument("--bmuf-frequencies", type=int, nargs="*", default=[32, 128], help="k for block momentum")
    p.add_argument("--target-accuracy", type=float, default=None,
                   help="held-out accuracy to time; default: plain Keras' median final accuracy − 0.01")
    p.add_argument("--no-elephas", action="store_true", help="skip the Elephas arm")
    p.add_internal("--keras-child", default=None)
    p.add_internal("--keras-child-out", default=None)
    args = p.parse_args()
    if args.keras_child:
        return keras_child(args)

    x, y = make_data(args.examples + args.test_examples)
    d = {"x": x[: args.examples], "y": y[: args.examples], "xt": x[args.examples:], "yt": y[args.examples:],
         "weights": build_model().get_weights()}
    tmp = tempfile.mkdtemp(prefix="sparkdl_avg-suite-")
    npz = os.path.join(tmp, "data.npz")
    np.savez(npz, x=d["x"], y=d["y"], xt=d["xt"], yt=d["yt"], n_weights=len(d["weights"]),
             **{f"w{i}": w for i, w in enumerate(d["weights"])})
    spark = harness.session(f"local[{args.workers}]")
    # Warm the Python workers' imports once so no arm pays for them alone.
    spark.sparkContext.parallelize(range(args.workers), args.workers).foreach(lambda _: __import__("tensorflow"))

    E, B, N = args.epochs, args.batch_size, args.workers
    one_worker = "trainer 1 worker (1 core) k=128"
    arms = {
        BASELINE: lambda: run_keras(d, E, B),
        "keras (1 process, steps_per_execution=128)": lambda: run_keras(d, E, B, steps_per_execution=128),
        ONEDNN: lambda: run_keras_onednn(npz, E, B, tmp),
    }
    for k in args.frequencies:
        arms[f"trainer local[{N}] average k={k}"] = lambda k=k: run_trainer(d, E, B, k, N)
    for k in args.bmuf_frequencies:
        arms[f"trainer local[{N}] bmuf k={k}"] = lambda k=k: run_trainer(d, E, B, k, N, rule="bmuf")
    arms[one_worker] = lambda: run_trainer(d, E, B, 128, 1)
    elephas_name = f"elephas 7.3.0 local[{N}] (sync, averages once per epoch)"
    skip_reason = "--no-elephas" if args.no_elephas else ""
    if not args.no_elephas:
        arms[elephas_name] = None
    results = {name: [] for name in arms}
    load = []
    for rep in range(args.repeats):
        for name, fn in arms.items():  # interleaved, so drift hits every arm alike
            load.append(os.getloadavg()[0])
            if fn is None:
                if skip_reason:
                    continue
                r, skip_reason = run_elephas(npz, E, B, N, tmp)
                if r is None:
                    print(f"SKIPPING the Elephas arm: {skip_reason}", flush=True)
                    continue
            else:
                if name.startswith("trainer"):
                    warm_workers(d, B, N)
                r = fn()
            results[name].append(r)
            print(f"[{rep}] {name}: epochs {[round(t, 2) for t in r['epoch_s']]} "
                  f"held-out acc {[round(a, 4) for a in r['epoch_accuracy']]}", flush=True)
    spark.stop()

    rows, target, common = summarize(results, args, one_worker)
    # The Elephas arm's settings, as what it changes of the trainer arms' (README's) settings.
    elephas_conf = next((r["conf"] for r in results.get(elephas_name, []) if r.get("conf") is not None), None)
    arm_conf = {elephas_name: harness.overrides(harness.settings(), elephas_conf)} if elephas_conf else {}
    harness.write_results(
        args.out, args, arm_conf=arm_conf,
        target_accuracy=target, common_target_accuracy=common, cpus=os.cpu_count(),
        load_avg_1min={"min": min(load), "median": _median(load), "max": max(load)},
        elephas_skipped=skip_reason or None, rows=rows, runs=results,
    )
    print_tables(rows, target, common, args)
    print(f"\n1-min load average during the run: min {min(load):.1f}, median {_median(load):.1f}, max {max(load):.1f}")
    if skip_reason:
        print(f"Elephas arm skipped: {skip_reason}")


if __name__ == "__main__":
    main()
