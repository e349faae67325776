"""The driver's sum of sparse deltas against the dense sums' at the same model size (issue 58's third target).

What one aggregation step costs where every worker's delta is summed on the driver (``aggregation="driver"``, and
each reducer of the sharded paths on its shard): ``SumsLayout.add`` of each worker's value in worker order, then
``sums``, every arm as ``sql_paths.DriverSum`` does it (no copy of the sum on the way out). Float32 averaging adds
``n · w`` (:class:`~sparkdl_avg.shared.wire.exchange.FlatLayout`); the codecs add
``n · decode(delta)`` (:class:`~sparkdl_avg.shared.wire.delta_sums.DeltaLayout`), the sparse ones at their positions
only. The state: the 969,810 weights of the hosts benchmarks' MLP (64-700-1300-10, ``network.py``), weights only
(``optimizer_state="local"``); each worker's delta a heavy-tailed draw (normal, 1e-3, every 97th value 50× larger).
A slice of a round, in one process, no Spark: the arms interleaved per repeat, the median per arm::

    .venv/bin/python benchmarks/sparse_sums.py [--workers 3] [--repeats 15]

Prints a Markdown table (docs/benchmarks/sparse_codecs.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = [(64, 700), (700,), (700, 1300), (1300,), (1300, 10), (10,)]
ARMS = ("float32", "int8", "topk", "threshold")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()

    from sparkdl_avg.shared.wire.delta_sums import DeltaLayout
    from sparkdl_avg.shared.wire.exchange import FlatLayout

    rng = np.random.default_rng(0)
    sent = [rng.normal(size=s).astype(np.float32) for s in SHAPES]
    flat = FlatLayout.of(sent, None)
    values = {}
    for arm in ARMS:
        if arm == "float32":
            values[arm] = (flat, [flat.shard_bytes(*flat.flatten([(w + 1) * np.float32(100 + i) for w in sent], None),
                                                   0, 1) for i in range(args.workers)])
            continue
        layout = DeltaLayout(flat, arm, feedback=(False, False, False))
        out = []
        for i in range(args.workers):
            new = []
            for w in sent:
                d = rng.normal(size=w.shape).astype(np.float32) * np.float32(1e-3)
                d.reshape(-1)[::97] *= 50
                new.append(w + d)
            packed, _ = layout.pack(new, None, sent, None, 100 + i, None)
            out.append(layout.shard_bytes(packed, 0, 1))
        values[arm] = (layout, out)
    times = {arm: [] for arm in ARMS}
    for _ in range(args.repeats):
        for arm in ARMS:
            layout, data = values[arm]
            t0 = time.perf_counter()
            acc = None
            for v in data:
                acc = layout.add(acc, v, 0, 1)
            layout.sums([acc])  # as aggregation="driver" (sql_paths.DriverSum): the one writable sum as it is
            times[arm].append(time.perf_counter() - t0)
    base = statistics.median(times["float32"])
    print(f"{flat.sizes[0]:,} float32 values, {args.workers} workers, median of {args.repeats} (load "
          f"{os.getloadavg()[0]:.1f})\n")
    print("| arm | bytes a worker sends | sum of the workers' values, ms (median) | × float32 |")
    print("|---|---|---|---|")
    for arm in ARMS:
        med = statistics.median(times[arm])
        size = statistics.median(len(v) for v in values[arm][1])
        print(f"| {arm} | {size:,.0f} | {med * 1e3:.1f} | {med / base:.2f} |")


if __name__ == "__main__":
    main()
