"""Straggler benchmark: synchronous rounds against stale-synchronous and asynchronous chunks.

The suite's CNN task (``benchmarks/bench_cnn.py``: a 31k-parameter CNN on
synthetic 28×28 images, Adam 1e-3, batch 32, the same initial weights for
every arm), 2 and 4 workers on ``local[N]``, (a) with no straggler and (b)
with worker 0 three times slower per minibatch (:class:`sparkdl_avg.testing.Straggler`:
it sleeps twice its compute after each chunk, which shows as compute in its
records). Arms: ``sync`` (rounds), ``stale`` at several bounds ``s``,
``reproducible s=2`` (``reproducible=True``) and ``async``, all with the
staleness-aware factor (the default) unless the arm says ``unscaled``. They run
interleaved within each repeat, each after an untimed one-round warm-up fit,
so the Python workers are warm alike. The sessions have the README's
settings (``benchmarks/harness.py``: ``sparkdl_avg.RECOMMENDED_CONF``), as
users are told to run, and a 2 GB driver.

Per arm it records the time of ``--epochs`` epochs (held-out evaluation
excluded), throughput (training examples per second over them), the
held-out accuracy after each epoch (the "final" one after ``--epochs``),
the time at which it first reaches the synchronous arm's final held-out
accuracy (of the same repeat, workers and straggler condition; linearly
interpolated between epochs), and the chunk records' staleness and delay
distributions. The other arms train ``--extra-epochs`` more epochs, used
only for that time: an arm whose accuracy after ``--epochs`` is a hair below
sync's (8,000 held-out images: 0.001 is eight of them) may reach it early in
the next. Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/straggler.py [--repeats 2]

Writes ``benchmarks/results/straggler.json`` and prints Markdown tables.
"""

from __future__ import annotations

import collections
import contextlib
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np  # noqa: E402

import harness  # noqa: E402
from bench_cnn import build_model, make_data  # noqa: E402

CONF = {"spark.driver.memory": "2g"}


def _session(workers: int):
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    # As README recommends: the daemon, Unix sockets (one job per chunk).
    return harness.session(f"local[{workers}]", app_name=f"straggler-{workers}", conf=CONF)


def _arm_options(arm: str):
    if arm == "sync":
        return {"synchronization": "sync"}
    if arm == "async":
        return {"synchronization": "async"}
    # "stale s=2", or "reproducible s=2": the same bound, updates in chunk order
    # ... with " unscaled": staleness_aware=False
    return {"synchronization": "stale", "staleness": int(arm.split("=")[1].split()[0]),
            "reproducible": arm.startswith("repro"), "staleness_aware": "unscaled" not in arm}


def run_arm(d, arm: str, workers: int, straggler: bool, epochs: int, k: int, batch: int, extra: int = 0):
    import keras

    from sparkdl_avg import ParameterAveragingTrainer, testing

    installed = contextlib.ExitStack()
    if straggler:
        installed.enter_context(testing.Straggler(slot=0, factor=3.0))
    try:
        # The same layer names for the warm-up and the timed model: one fingerprint, so the timed fit finds the
        # replicas built and traced (a straggler's first chunk would otherwise sleep 2× a replica build).
        keras.backend.clear_session()
        model = build_model(d["weights"])
        with ParameterAveragingTrainer(model, num_workers=workers, batch_size=batch, averaging_frequency=1,
                                       seed=1, slow_warning=False, **_arm_options(arm)) as warm:
            n = workers * batch
            warm.fit((d["x"][:n], d["y"][:n]), epochs=1, verbose=0)  # untimed: workers warm, replica built
        keras.backend.clear_session()
        model = build_model(d["weights"])
        state = {"elapsed": [], "acc": [], "eval_s": 0.0}

        class HeldOut(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                state["elapsed"].append(time.perf_counter() - t0 - state["eval_s"])
                te = time.perf_counter()
                state["acc"].append(float(self.model.evaluate(d["xt"], d["yt"], verbose=0, batch_size=512)[1]))
                state["eval_s"] += time.perf_counter() - te

        with ParameterAveragingTrainer(model, num_workers=workers, batch_size=batch, averaging_frequency=k, seed=1,
                                       slow_warning=False, **_arm_options(arm)) as tr:
            t0 = time.perf_counter()
            tr.fit((d["x"], d["y"]), epochs=epochs + (0 if arm == "sync" else extra), verbose=0, callbacks=[HeldOut()])
            records = [r for r in tr.stats.records if r.epoch < epochs]
    finally:
        installed.close()
    fit_s = state["elapsed"][epochs - 1]
    examples = sum(r.examples for r in records)
    out = {"fit_s": fit_s, "examples": examples, "examples_per_s": examples / fit_s, "elapsed_s": state["elapsed"],
           "epoch_accuracy": state["acc"], "accuracy": state["acc"][epochs - 1]}
    if records[0].chunk is not None:
        by_slot = collections.Counter(r.slot for r in records)
        out.update(
            chunks_by_slot={str(s): c for s, c in sorted(by_slot.items())},
            staleness=dict(sorted(collections.Counter(r.staleness for r in records).items())),
            delay_median={str(s): statistics.median(r.delay for r in records if r.slot == s) for s in sorted(by_slot)},
            delay_max=max(r.delay for r in records),
            scale_min=min(r.update_scale for r in records),
        )
    return out


def time_to(run, target: float):
    """Seconds into the fit at which held-out accuracy first reaches ``target`` (linear between epochs)."""
    prev_t, prev_a = 0.0, None
    for t, a in zip(run["elapsed_s"], run["epoch_accuracy"]):
        if a >= target - 1e-9:
            if prev_a is None or a == prev_a:
                return t
            return prev_t + (t - prev_t) * (target - prev_a) / (a - prev_a) if prev_a < target else t
        prev_t, prev_a = t, a
    return None


def main() -> None:
    parser = harness.parser(__doc__.split("\n")[0], out="straggler.json", repeats=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--extra-epochs", type=int, default=2)
    parser.add_argument("--held-out", type=int, default=8000)
    parser.add_argument("--examples", type=int, default=16000)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--arms", nargs="+", default=["sync", "stale s=1", "stale s=2", "stale s=4", "async"])
    args = parser.parse_args()

    x, y = make_data(args.examples + args.held_out, seed=0)
    d = {"x": x[: args.examples], "y": y[: args.examples], "xt": x[args.examples:], "yt": y[args.examples:],
         "weights": build_model().get_weights()}
    results = []
    started = time.time()
    for workers in args.workers:
        _session(workers)
        for rep in range(args.repeats):
            for straggler in (False, True):
                for arm in args.arms:
                    load = os.getloadavg()[0]
                    run = run_arm(d, arm, workers, straggler, args.epochs, args.k, args.batch, args.extra_epochs)
                    run.update(workers=workers, straggler=straggler, arm=arm, repeat=rep, load=load)
                    results.append(run)
                    print(f"N={workers} straggler={straggler} {arm}: {run['fit_s']:.1f}s "
                          f"{run['examples_per_s']:.0f} ex/s acc {run['accuracy']:.4f} load {load:.1f}", flush=True)
    for run in results:  # time to the sync arm's final accuracy, same repeat and condition
        sync = next(r for r in results if r["arm"] == "sync" and r["workers"] == run["workers"]
                    and r["straggler"] == run["straggler"] and r["repeat"] == run["repeat"])
        run["target"] = sync["accuracy"]
        run["time_to_target_s"] = time_to(run, sync["accuracy"])
    meta = {k: v for k, v in vars(args).items() if k != "out"}
    meta.update(cpus=os.cpu_count(), minutes=(time.time() - started) / 60)
    harness.write_results(args.out, args, meta=meta, runs=results)
    print_tables(results, args)


def print_tables(results, args) -> None:
    print("\n| workers | straggler | arm | examples/s | × sync | time to sync's final acc (s) | × sync | final acc "
          "| Δ acc | staleness counts | median delay by slot | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for workers in args.workers:
        for straggler in (False, True):
            group = [r for r in results if r["workers"] == workers and r["straggler"] == straggler]
            base = [r for r in group if r["arm"] == "sync"]
            b_tp = statistics.median(r["examples_per_s"] for r in base)
            b_tt = statistics.median(r["time_to_target_s"] for r in base)
            b_acc = statistics.median(r["accuracy"] for r in base)
            for arm in args.arms:
                runs = [r for r in group if r["arm"] == arm]
                tp = statistics.median(r["examples_per_s"] for r in runs)
                tts = [r["time_to_target_s"] for r in runs]
                tt = statistics.median(tts) if all(t is not None for t in tts) else None
                acc = statistics.median(r["accuracy"] for r in runs)
                stale = runs[0].get("staleness", "-")
                delay = runs[0].get("delay_median", "-")
                if isinstance(delay, dict):
                    delay = ", ".join(f"{s}: {v:.2f}" for s, v in delay.items())
                print(f"| {workers} | {'yes' if straggler else 'no'} | {arm} | {tp:.0f} | {tp / b_tp:.2f} | "
                      f"{'not reached' if tt is None else f'{tt:.1f}'} | "
                      f"{'-' if tt is None else f'{b_tt / tt:.2f}'} | {acc:.4f} | {acc - b_acc:+.4f} | {stale} | "
                      f"{delay} | {statistics.median(r['load'] for r in runs):.1f} |")


if __name__ == "__main__":
    main()
