"""state_transport="auto" learning the link (issue 50, part 5): a simulated slow link on one host, three arms.

What it measures: whether ``"auto"``, which starts as if the driver's link ran
at 1 Gbit/s, finds a slower link from the rounds' own records and switches
from Spark's tree (every worker's sums through the driver) to the sharded
Spark SQL round, and what that saves per round. The link is *simulated* on
``local[W]``: the engine is taken for hosts of their own (``Engine.one_host``
patched to ``False``, so ``"auto"`` chooses as on a cluster) and each round's
job waits as a link of ``--link-s`` seconds per worker's sums would make it
wait: ``W × link_s`` on a driver-bound path (``W`` sums through the driver's
link), ``link_s`` on a sharded one (about one worker's sums per link). The
real shuffle's own seconds on this host come on top. For a real shaped link
run ``benchmarks/network.py`` on scripts/hosts.py's cluster (docs/benchmarks/network_auto.md).

Arms, interleaved per repeat: ``tree`` (``state_transport="spark"``: the
first choice, kept), ``auto`` (learns and switches), ``auto+rate``
(``network_rate`` given as the simulated rate: sharded from the first round).
Per arm: the round each switch took effect, each round's path and wall time,
and the median wall time of the steady rounds after the 10th (where ``auto``
has switched).

    PYTHONPATH=. .venv/bin/python benchmarks/network_auto.py [--workers 3] [--params 1e6] [--rounds 24]
        [--link-s 0.32] [--repeats 1]

Results: benchmarks/results/network_auto.json; the table for docs/benchmarks/network_auto.md.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ARMS = ("tree", "auto", "auto+rate")


def _mlp(params: float, seed: int = 0):
    """An MLP of about ``params`` parameters on 64 features, plain SGD (the sums are the weights alone)."""
    import keras

    keras.utils.set_random_seed(seed)
    width = max(8, int(params / (64 + 64 + 2)))
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    return model


def _simulate_link(link_s: float) -> None:
    """Every round's job waits as the link would: ``W × link_s`` through the driver, ``link_s`` sharded."""
    from sparkdl_avg.driver.runtime.session import Engine
    from sparkdl_avg.driver.config.options import AGGREGATIONS
    from sparkdl_avg.driver.transport.base import StateTransport

    Engine.one_host = property(lambda self: False)
    run_job = StateTransport.run_job

    def slow(self, name, weights, optimizer, make_task, entry, workers, what, **kw):
        out = run_job(self, name, weights, optimizer, make_task, entry, workers, what, **kw)
        sharded = self.last_plan is not None and AGGREGATIONS.get(self.last_plan[0]).sharded
        time.sleep(link_s * (1 if sharded else len(workers)))
        return out

    StateTransport.run_job = slow


def main() -> None:
    p = harness.parser(__doc__, out="network_auto.json", repeats=1, rounds=24,
                       rounds_help="rounds per fit (k=4 minibatches each)")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--params", type=float, default=1e6)
    p.add_argument("--link-s", type=float, default=0.32,
                   help="simulated seconds of one worker's sums on the link (4 MB at 100 Mbit/s: 0.32)")
    args = p.parse_args()

    import numpy as np

    from sparkdl_avg import ParameterAveragingTrainer

    spark = harness.session(f"local[{args.workers}]", app_name="network_auto")
    _simulate_link(args.link_s)
    logging.getLogger("sparkdl_avg").setLevel(logging.INFO)
    logging.basicConfig(level=logging.WARNING)
    rng = np.random.default_rng(0)
    batch, k = 32, 4
    n = args.workers * batch * k * args.rounds
    x = rng.normal(size=(n, 64)).astype("float32")
    y = (x[:, :1] * 0.5 + rng.normal(size=(n, 1)) * 0.1).astype("float32")
    nbytes = sum(w.nbytes for w in _mlp(args.params).get_weights())
    rate = nbytes / args.link_s
    runs = []
    for repeat in range(args.repeats):
        for arm in ARMS:
            options = dict(state_transport="spark") if arm == "tree" else dict(
                network_rate=rate) if arm == "auto+rate" else {}
            with ParameterAveragingTrainer(_mlp(args.params), num_workers=args.workers, batch_size=batch,
                                           averaging_frequency=k, seed=1, slow_warning=False, **options) as t:
                started = time.perf_counter()
                t.fit((x, y), epochs=1, verbose=0, shuffle=False)
                elapsed = time.perf_counter() - started
                records = t.stats.records
            paths = [f"{r.transport}/{r.aggregation}" if r.aggregation else r.transport for r in records]
            switches = [i for i in range(1, len(paths)) if paths[i] != paths[i - 1]]
            late = [r.wall_s for r in records[10:]]
            row = dict(arm=arm, repeat=repeat, fit_s=elapsed, paths=paths, switches=switches,
                       wall_s=[r.wall_s for r in records], aggregate_s=[r.aggregate_s for r in records],
                       link_rate=[r.link_rate for r in records], median_round_s_after_10=statistics.median(late),
                       sum_s=sum(r.wall_s for r in records))
            runs.append(row)
            print(f"{arm:>10}: fit {elapsed:6.1f} s, rounds {sum(row['wall_s']):6.1f} s, median round after the "
                  f"10th {row['median_round_s_after_10']:.2f} s, switches at {switches}, paths {paths[0]} -> "
                  f"{paths[-1]}", flush=True)
    harness.write_results(args.out, args, sums_bytes_per_worker=nbytes, simulated_rate=rate, runs=runs)


if __name__ == "__main__":
    main()
