"""Reference experiment of docs/algorithms.md: plain averaging vs block momentum vs schedules.

Task (after Su & Chen 2015, Chen & Huo 2016, Wang et al. 2020, Lin et al.
2020, on data that needs no download): scikit-learn's digits (all 1,797
images, standardized), an MLP 64-128-10 (ReLU, softmax), plain SGD
(learning rate ``--lr``), batch 16 per worker, 8 workers on ``local[2]`` (the
8 replicas time-share the 2 cores: this experiment measures statistical
efficiency, not speed). The measure is the training loss of the global model
on the whole training set at the end of every epoch (evaluated on the
driver), so every arm is judged on the same quantity.

Arms (each from the same initial weights, per seed):

* ``single``: one worker, i.e. plain sequential Keras SGD with batch 16
  (``model.fit``; the trainer with one worker equals it exactly, see
  tests/algorithms/test_identities.py);
* ``plain``: parameter averaging;
* ``bmuf`` / ``bmuf_nesterov``: block momentum, ``η = 1 − 1/8``, ``ζ = 1``;
* ``slowmo0.5`` / ``slowmo0.7``: SlowMo, ``β`` ∈ {0.5, 0.7}, ``α = 1``;
* ``postlocal``: post-local SGD, ``k = 1`` for the first ``--switch-epoch``
  epochs, then the period;
* ``stale2`` / ``async``: stale-synchronous (bound ``s = 2``) and
  asynchronous chunks (:mod:`sparkdl_avg.driver.fit.stale_async`) with the staleness-aware
  factor ``1/max(1, τ)``, and ``stale2_unscaled`` / ``async_unscaled``
  without it, plain averaging of each update, and ``stale2_bmuf`` (``s = 2``
  with block momentum, ``η = 1 − 1/8``, applied once per 8 updates); at periods
  ``ASYNC_PERIODS`` only (a chunk is a Spark job: period 1 would be 1,120
  jobs per run). 8 replicas time-sharing 2 cores make their own staleness.

For averaging periods ``--periods`` (default 1 2 5 10 20). An epoch has
``1797 // (8·16) = 14`` minibatches per worker, so period 20 means one
round of 14 minibatches per epoch. Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/algorithms.py          # all runs (~30 min)
    .venv/bin/python benchmarks/algorithms.py --report                                  # table + plots only

The session has the README's settings (``benchmarks/harness.py``). Every
finished run is appended to ``benchmarks/results/algorithms.jsonl`` (``--out``;
runs already there are skipped, so an interrupted experiment resumes); the
report step writes ``docs/algorithms_loss.png`` and
``docs/algorithms_period.png`` and prints the Markdown table.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import keras  # before Spark starts its JVM
import numpy as np

import harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS, BATCH = 8, 16
ARMS = ("plain", "bmuf", "bmuf_nesterov", "slowmo0.5", "slowmo0.7", "postlocal",
        "stale2", "stale2_unscaled", "async", "async_unscaled", "stale2_bmuf")
SYNC_OPTIONS = {
    "stale2": dict(synchronization="stale", staleness=2),
    "stale2_unscaled": dict(synchronization="stale", staleness=2, staleness_aware=False),
    "async": dict(synchronization="async"),
    "async_unscaled": dict(synchronization="async", staleness_aware=False),
    "stale2_bmuf": dict(synchronization="stale", staleness=2),
}
ASYNC_PERIODS = (5, 10, 20)


def load_data():
    from sklearn.datasets import load_digits
    from sklearn.preprocessing import StandardScaler

    x, y = load_digits(return_X_y=True)
    return StandardScaler().fit_transform(x).astype(np.float32), y.astype(np.int32)


def build_model(seed: int, lr: float):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10, activation="softmax")]
    )
    model.compile(keras.optimizers.SGD(lr), "sparse_categorical_crossentropy")
    return model


class TrainLoss(keras.callbacks.Callback):
    """Records the global model's loss on the whole training set at every epoch end."""

    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y
        self.losses = []

    def on_epoch_end(self, epoch, logs=None):
        self.losses.append(float(self.model.evaluate(self.x, self.y, batch_size=1024, verbose=0)))


def run_arm(arm: str, period: int, seed: int, args, x, y) -> dict:
    from sparkdl_avg import BlockMomentum, ParameterAveragingTrainer, PostLocalSGD, SlowMo

    model = build_model(seed, args.lr)
    initial = float(model.evaluate(x, y, batch_size=1024, verbose=0))
    record = TrainLoss(x, y)
    t0 = time.perf_counter()
    if arm == "single":
        model.fit(x, y, batch_size=BATCH, epochs=args.epochs, shuffle=True, verbose=0, callbacks=[record])
    else:
        rule = {
            "plain": None,
            "bmuf": BlockMomentum(),
            "bmuf_nesterov": BlockMomentum(nesterov=True),
            "slowmo0.5": SlowMo(0.5),
            "slowmo0.7": SlowMo(0.7),
            "postlocal": None,
            "stale2_bmuf": BlockMomentum(),
        }.get(arm)
        k = PostLocalSGD(args.switch_epoch, period) if arm == "postlocal" else period
        trainer = ParameterAveragingTrainer(
            model, num_workers=WORKERS, batch_size=BATCH, averaging_frequency=k, update_rule=rule, seed=seed,
            slow_warning=False, **SYNC_OPTIONS.get(arm, {}),
        )
        with trainer:
            trainer.fit((x, y), epochs=args.epochs, verbose=0, callbacks=[record])
    return {
        "arm": arm,
        "period": period,
        "seed": seed,
        "lr": args.lr,
        "epochs": args.epochs,
        "loss": [initial, *record.losses],  # index e: after e epochs
        "seconds": time.perf_counter() - t0,
    }


def run(args) -> None:
    x, y = load_data()
    done = {(r["arm"], r["period"], r["seed"], r["lr"], r["epochs"]) for r in read_results(args.out)}
    spark = harness.session("local[2]", app_name="sparkdl_avg-algorithms",
                            conf={"spark.executorEnv.PYSPARK_PYTHON": sys.executable})
    plan = [("single", 0, s) for s in args.seeds]
    # post-local SGD with period 1 is plain averaging with k=1: not run twice
    plan += [
        (arm, p, s) for s in args.seeds for p in args.periods for arm in args.arms
        if not (arm == "postlocal" and p == 1) and (arm not in SYNC_OPTIONS or p in ASYNC_PERIODS)
    ]
    try:
        for arm, period, seed in plan:
            if (arm, period, seed, args.lr, args.epochs) in done:
                continue
            result = run_arm(arm, period, seed, args, x, y)
            harness.append_results(args.out, args, **result)
            print(
                f"{arm:>14} k={period:<3} seed={seed} loss@{args.report_epoch}="
                f"{result['loss'][args.report_epoch]:.4f} final={result['loss'][-1]:.4f} "
                f"({result['seconds']:.0f}s)",
                flush=True,
            )
    finally:
        spark.stop()


def read_results(path: str) -> list:
    """The runs of ``path``: one JSON object per line (older lines without the harness's keys too)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def report(args) -> None:
    rows = [r for r in read_results(args.out) if r["lr"] == args.lr and r["epochs"] == args.epochs]
    e = args.report_epoch

    def median_at(arm, period, epoch):
        if arm == "postlocal" and period == 1:
            arm = "plain"
        values = [r["loss"][epoch] for r in rows if r["arm"] == arm and r["period"] == period]
        return statistics.median(values) if values else None

    single = median_at("single", 0, e)
    counts = {}
    for r in rows:
        counts[(r["arm"], r["period"])] = counts.get((r["arm"], r["period"]), 0) + 1
    n = sorted(set(counts.values()))
    print(f"Training loss after {e} epochs (median over seeds: {n[0]}–{n[-1]} per cell; lr={args.lr}); "
          f"single worker: {single:.4f}\n")
    print("| arm | " + " | ".join(f"k={p}" for p in args.periods) + " |")
    print("|---|" + "---|" * len(args.periods))
    for arm in args.arms:
        cells = []
        for p in args.periods:
            v = median_at(arm, p, e)
            cells.append("—" if v is None else f"{v:.4f} ({v / single:.2f}×)")
        print(f"| {arm} | " + " | ".join(cells) + " |")
    plot(rows, args, single)


def plot(rows, args, single) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = os.path.join(ROOT, "docs")
    epochs = np.arange(args.epochs + 1)

    def median_curve(arm, period):
        curves = [r["loss"] for r in rows if r["arm"] == arm and r["period"] == period]
        return np.median(np.array(curves), axis=0) if curves else None

    prefix = "algorithms" if args.epochs == 10 else f"algorithms_{args.epochs}epochs"
    panels = [p for p in (1, 10, 20) if p in args.periods][:2]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, period in zip(axes, panels):
        ax.plot(epochs, median_curve("single", 0), "k-", lw=2.5, label="single worker")
        for arm in args.arms:
            curve = median_curve(arm, period)
            if curve is not None:
                ax.plot(epochs, curve, label=arm, ls="--" if arm in SYNC_OPTIONS else "-")
        ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_title(f"8 workers, averaging period k={period}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("training loss (whole training set)")
    axes[-1].legend()
    fig.tight_layout()
    fig.savefig(os.path.join(docs, f"{prefix}_loss.png"), dpi=90)

    if len(args.periods) < 3:
        return  # a loss-vs-period curve needs more periods
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.axhline(single, color="k", lw=2.5, label="single worker")
    for arm in args.arms:
        ys = [
            statistics.median([r["loss"][args.report_epoch] for r in rows if r["arm"] == arm and r["period"] == p] or [np.nan])
            for p in args.periods
        ]
        ax.plot(args.periods, ys, marker="o", label=arm)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(args.periods, [str(p) for p in args.periods])
    ax.set_xlabel("averaging period k (minibatches)")
    ax.set_ylabel(f"training loss after {args.report_epoch} epochs")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(docs, f"{prefix}_period.png"), dpi=90)


def main() -> None:
    parser = harness.parser(__doc__, out="algorithms.jsonl")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--periods", type=int, nargs="+", default=[1, 2, 5, 10, 20])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--report-epoch", type=int, default=10, help="the epoch the table compares")
    parser.add_argument("--lr", type=float, default=0.02, help="SGD learning rate of every arm")
    parser.add_argument("--switch-epoch", type=int, default=2, help="post-local SGD: epochs of k=1")
    parser.add_argument("--report", action="store_true", help="only print the table and write the plots")
    args = parser.parse_args()
    if not args.report:
        run(args)
    report(args)


if __name__ == "__main__":
    main()
