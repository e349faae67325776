"""DiLoCo as published (issue 40): each worker's own optimizer state, only the weights on the wire.

Fits the trainer on ``local[2]`` with README's session (``benchmarks/harness.py``),
2 workers, with the datasets and models of ``compressed_training.py`` (the
suite CNN: 20,000 synthetic 28×28 images, 3 epochs, held-out 2,000; the
digits 64-64-10 MLP: 1,500 examples, 10 epochs, held-out 297; both Keras'
``Adam(1e-3)`` as inner optimizer, no weight decay), for each dataset, ``k``,
seed and arm, interleaved (a seed's arms run one after another, seeds outermost):

* ``none``: float32 ``"average"`` (weights and Adam's moments averaged each round);
* ``local``: ``optimizer_state="local"`` (each worker keeps its own moments), float32 weights;
* ``local+int8``, ``local+int4``: the same with ``update_compression`` (``int4`` only where the
  library has it);
* ``diloco``: ``local+int8`` with ``update_rule="diloco"`` (DiLoCo's outer Nesterov SGD,
  ``outer_lr=0.7``, ``outer_momentum=0.9``), at each dataset's longer ``k`` only; ``diloco+f32`` and
  ``diloco+topk``, ``diloco+threshold``: the same with float32 weights and with ``update_compression="topk"``
  (SparseLoCo's sparse deltas) or ``"threshold"`` (Deeplearning4j's), docs/benchmarks/sparse_codecs.md.

Runs: ``cnn`` at k = 32 and 128; ``digits`` at k = 8 and 32 (an epoch has 23
minibatches a worker, so k = 32 is one round an epoch); ``digits-split``
(optional, not in the default ``--datasets``): digits without shuffling,
arranged so that worker 0 only ever sees the labels 0-4 and worker 1 the
labels 5-9 (data that differs between workers), at k = 8 and 32.

Per fit: held-out accuracy, training loss per epoch, bytes each worker sent
per round, the medians of the steady rounds' (no replica build, no trace)
aggregate phase and wall time, and the workers' ``local_state_s`` (reading
and writing their state files) against their compute. Prints a Markdown
table of medians over seeds of each arm's difference from ``none`` with the
same seed. Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/diloco.py [--seeds 0 1 2] \\
        [--datasets cnn digits digits-split] [--arms none local local+int8 local+int4 diloco] \\
        [--ks cnn:8 digits:2] [--lr 0.007] [--out ...]
    .venv/bin/python benchmarks/diloco.py --table benchmarks/results/diloco.json ...   # the table of saved runs

``--ks`` replaces the datasets' ``k`` (the short-round runs), ``--lr`` the
inner Adam's learning rate (1e-3). Writes ``benchmarks/results/diloco.json``.
"""

from __future__ import annotations

import os
import statistics
import time
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import harness  # noqa: E402
from compressed_training import BATCH, WORKERS, datasets as base_datasets, model_for  # noqa: E402

ARMS = {
    "none": {},
    "local": dict(optimizer_state="local"),
    "local+int8": dict(optimizer_state="local", update_compression="int8"),
    "local+int4": dict(optimizer_state="local", update_compression="int4"),
    "diloco": dict(optimizer_state="local", update_compression="int8", update_rule="diloco"),
    "diloco+f32": dict(optimizer_state="local", update_rule="diloco"),
    "diloco+topk": dict(optimizer_state="local", update_compression="topk", update_rule="diloco"),
    "diloco+threshold": dict(optimizer_state="local", update_compression="threshold", update_rule="diloco"),
}
LONG_ONLY = {"diloco"}  # arms run at each dataset's longer k only


def available_arms():
    from sparkdl_avg.driver.config.options import UPDATE_COMPRESSIONS

    return [a for a, kw in ARMS.items() if kw.get("update_compression") in (None,) + tuple(UPDATE_COMPRESSIONS)]


def split_by_worker(x, y, k: int):
    """``(x, y)`` rearranged so that, visited in order, worker 0 trains on labels 0-4 only and worker 1 on 5-9."""
    from sparkdl_avg.shared.data.example_order import round_lengths, worker_positions

    rng = np.random.default_rng(0)
    pools = [rng.permutation(np.flatnonzero(y < 5)), rng.permutation(np.flatnonzero(y >= 5))]
    taken = [0, 0]
    order = np.full(len(y), -1, np.int64)
    before = 0
    for steps in round_lengths(len(y), WORKERS, BATCH, k):
        for i in range(WORKERS):
            pos = np.asarray(worker_positions(before, steps, i, WORKERS, BATCH))
            pool = pools[i]
            order[pos] = pool[(taken[i] + np.arange(len(pos))) % len(pool)]  # wraps if a pool runs short
            taken[i] += len(pos)
        before += steps
    rest = np.flatnonzero(order < 0)  # positions no round visits
    order[rest] = rng.permutation(len(y))[: len(rest)]
    return x[order], y[order]


def runs():
    base = base_datasets()
    cnn, digits = base["cnn"], base["digits"]
    out = {
        "cnn": dict(data=cnn["data"], test=cnn["test"], epochs=cnn["epochs"], ks=[32, 128], shuffle=True),
        "digits": dict(data=digits["data"], test=digits["test"], epochs=digits["epochs"], ks=[8, 32], shuffle=True),
        "digits-split": dict(data=digits["data"], test=digits["test"], epochs=digits["epochs"], ks=[8, 32],
                             shuffle=False, split=True),
    }
    return out


def fit(name: str, d: dict, k: int, seed: int, arm: str, lr=None) -> dict:
    from sparkdl_avg import ParameterAveragingTrainer
    from sparkdl_avg.driver.observe.costmodel import is_cold

    data = split_by_worker(*d["data"], k) if d.get("split") else d["data"]
    model = model_for("digits" if name.startswith("digits") else name, seed)
    if lr is not None:  # the inner Adam's learning rate (both models: 1e-3)
        model.optimizer.learning_rate.assign(lr)
    with ParameterAveragingTrainer(model, num_workers=WORKERS, batch_size=BATCH, averaging_frequency=k, seed=seed,
                                   **ARMS[arm]) as trainer:
        t0 = time.perf_counter()
        history = trainer.fit(data, epochs=d["epochs"], verbose=0, shuffle=d["shuffle"])
        fit_s = time.perf_counter() - t0
        records = trainer.stats.records
    loss, accuracy = (float(v) for v in model.evaluate(*d["test"], verbose=0, batch_size=256)[:2])
    steady = [r for r in records if not is_cold(r)] or records
    workers = [w for r in steady for w in r.workers]
    compute = sum(w.compute_s for w in workers)
    return {
        "dataset": name, "k": k, "seed": seed, "arm": arm,
        "accuracy": accuracy, "test_loss": loss, "loss": [float(v) for v in history.history["loss"]],
        "sent_bytes_per_worker": statistics.median(r.sent_bytes / r.num_workers for r in records),
        "aggregate_ms": 1000 * statistics.median(r.aggregate_s for r in steady),
        "round_ms": 1000 * statistics.median(r.wall_s for r in steady),
        "compute_ms": 1000 * statistics.median(w.compute_s for w in workers),
        "local_state_ms": 1000 * statistics.median(w.local_state_s for w in workers),
        "local_state_share": sum(w.local_state_s for w in workers) / compute,
        "encode_share": sum(w.encode_s for w in workers) / compute,
        "feedback_share": sum(w.feedback_s for w in workers) / compute,
        "rounds": len(records),
        "fit_s": fit_s,
        "compute_max_ms": 1000 * statistics.median(r.compute_max_s for r in steady),
        "rounds_wall_s": sum(r.wall_s for r in records),
        "announced_ahead": sum(1 for r in records if getattr(r, "announced_ahead", False)),
    }


def table(rows) -> str:
    lines = ["| dataset | k | arm | held-out acc (median) | Δ acc vs none (median) | final train loss vs none "
             "(median) | bytes / worker / round | bytes vs none | aggregate ms | round ms | round time vs none | "
             "state files ms / compute ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    order = list(ARMS)
    names = ["cnn", "digits", "digits-split"]
    keys = sorted({(r["dataset"], r["k"]) for r in rows}, key=lambda t: (names.index(t[0]), t[1]))
    med = statistics.median
    for dataset, k in keys:
        group = [r for r in rows if (r["dataset"], r["k"]) == (dataset, k)]
        base = {r["seed"]: r for r in group if r["arm"] == "none"}
        for arm in order:
            mine = [r for r in group if r["arm"] == arm and r["seed"] in base]
            if not mine:
                continue
            b = [base[r["seed"]] for r in mine]
            dacc = med(r["accuracy"] - s["accuracy"] for r, s in zip(mine, b))
            dloss = med(r["loss"][-1] / s["loss"][-1] - 1 for r, s in zip(mine, b))
            ratio = med(r["sent_bytes_per_worker"] / s["sent_bytes_per_worker"] for r, s in zip(mine, b))
            tratio = med(r["round_ms"] / s["round_ms"] for r, s in zip(mine, b))
            state = (f"{med(r['local_state_ms'] for r in mine):.1f} / {med(r['compute_ms'] for r in mine):.0f}"
                     if arm != "none" else "–")
            lines.append(
                f"| {dataset} | {k} | {arm} | {med(r['accuracy'] for r in mine):.4f} | {dacc:+.4f} | "
                f"{100 * dloss:+.1f}% | {med(r['sent_bytes_per_worker'] for r in mine):,.0f} | {ratio:.3f}× | "
                f"{med(r['aggregate_ms'] for r in mine):.1f} | {med(r['round_ms'] for r in mine):.0f} | "
                f"{tratio:.2f}× | {state} |")
    return "\n".join(lines)


def main() -> None:
    p = harness.parser(__doc__, out="diloco.json")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--datasets", nargs="+", default=["cnn", "digits"], choices=["cnn", "digits", "digits-split"])
    p.add_argument("--arms", nargs="+", default=None, choices=list(ARMS),
                   help="default: every arm the library has (int4 only where update_compression has it)")
    p.add_argument("--ks", nargs="+", default=None, metavar="DATASET:K",
                   help="other k than each dataset's own (e.g. cnn:8 digits:2); diloco still runs only at the "
                        "dataset's own longer k")
    p.add_argument("--lr", type=float, default=None, help="the inner Adam's learning rate (default 1e-3)")
    p.add_argument("--table", nargs="+", metavar="JSON", help="print the table of these results files' rows and stop")
    args = p.parse_args()
    if args.table:
        import json

        rows = []
        for path in args.table:
            with open(path) as f:
                rows += json.load(f)["rows"]
        print(table(rows))
        return
    arms = args.arms or available_arms()
    args.arms = arms
    plan = runs()
    longer = {name: max(d["ks"]) for name, d in plan.items()}
    if args.ks:
        for name in plan:
            plan[name]["ks"] = [int(spec.split(":")[1]) for spec in args.ks if spec.split(":")[0] == name]
    spark = harness.session("local[2]")
    rows = []
    try:
        for seed in args.seeds:
            for name in args.datasets:
                d = plan[name]
                for k in d["ks"]:
                    for arm in arms:
                        if arm in LONG_ONLY and k != longer[name]:
                            continue
                        row = fit(name, d, k, seed, arm, args.lr)
                        rows.append(row)
                        print({key: v for key, v in row.items() if key != "loss"}, flush=True)
                        harness.write_results(args.out, args, rows=rows)
    finally:
        spark.stop()
    print(table(rows))


if __name__ == "__main__":
    sys.exit(main())
