"""Tracing a replica's step function with and without its training state built first (issue 48: tracing quadrupled).

A ``tf.function`` whose first trace creates variables is traced again by
TensorFlow; a replica's first ``train_step`` created the compiled metrics'
variables, so the executors traced twice. This script traces the workers'
step function (:func:`sparkdl_avg.executor.worker._steps_function`, the
suite's CNN, fresh replica each time, one thread as a ``local[2]`` worker
has) with ``build_training_state`` (``once``) and without (``twice``),
interleaved, and reports the medians of the trace and of the first run.
Run: ``PYTHONPATH=. .venv/bin/python benchmarks/trace_once.py [--repeats 5]``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness  # noqa: E402


def trace(once: bool) -> dict:
    """One fresh replica's step function: seconds tracing, seconds of its first run, Python traces of ``train_step``."""
    import numpy as np

    from bench_cnn import build_model
    from sparkdl_avg.executor import worker
    from sparkdl_avg.shared.data.columns import Field
    from sparkdl_avg.shared.model import tracing
    from sparkdl_avg.shared.model.modelspec import ensure_optimizer_built

    model = build_model()
    ensure_optimizer_built(model)
    calls = []
    step = model.train_step
    model.train_step = lambda data: (calls.append(1), step(data))[1]
    fields = tracing.TraceSignature((Field((28, 28, 1), "float32"),), (Field((), "float32"),))
    saved = worker.build_training_state
    if not once:
        worker.build_training_state = lambda *a, **k: False
    try:
        t = time.perf_counter()
        fn = worker._steps_function(model, f"bench-{time.time_ns()}", fields)
        fn.get_concrete_function()
        traced = time.perf_counter() - t
    finally:
        worker.build_training_state = saved
    x = np.random.default_rng(0).random((256, 28, 28, 1), np.float32)
    y = np.zeros((256,), np.float32)
    t = time.perf_counter()
    fn([x], [y], np.zeros((0,), np.float32), np.int32(8), np.int32(32))
    return {"trace_s": traced, "first_run_s": time.perf_counter() - t, "train_step_traces": len(calls)}


def main() -> None:
    p = harness.parser(__doc__, out="trace_once.json", repeats=5)
    args = p.parse_args()
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)  # a local[2] worker's task has one CPU
    tf.config.threading.set_inter_op_parallelism_threads(1)
    trace(True)  # TensorFlow's own first-use costs, in neither arm
    runs = {"once": [], "twice": []}
    for _ in range(args.repeats):
        for arm in runs:
            runs[arm].append(trace(arm == "once"))
    rows = {arm: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for arm, rs in runs.items()}
    harness.write_results(args.out, args, rows=rows, runs=runs)
    load = os.getloadavg()[0]
    print(f"| arm | trace s | first run s | train_step traced |  (medians of {args.repeats}; load {load:.1f})")
    print("|---|---|---|---|")
    for arm, row in rows.items():
        print(f"| {arm} | {row['trace_s']:.2f} | {row['first_run_s']:.2f} | {row['train_step_traces']:.0f} |")


if __name__ == "__main__":
    main()
