"""The int8 block size and the codecs' error on real round deltas (issue 30: compressed updates).

No Spark: one Keras replica of the suite CNN (``bench_cnn.py``: 31k
parameters, Adam, batch 32) trains ``k`` minibatches from a state, as a
worker does in a round, at several points of training (the first round, and
after 1 and 3 epochs of single-process training). Each round's delta (the
weights' and the Adam variables' change from the round's start) is encoded
with ``sparkdl_avg.shared.wire.compression`` as ``bf16`` and as ``int8`` with
blocks of 32 … 4096 values, and a 10⁶-value delta drawn from the CNN's
times its size is timed. For every arm it reports the bytes against
float32, the relative error ``‖decode(encode(d)) − d‖ / ‖d‖`` (weights and
optimizer apart: Adam's second moments span many magnitudes) and the
seconds to encode and decode 10⁶ values on one core. Usage::

    .venv/bin/python benchmarks/compression.py [--k 32 128] [--repeats 5]

Writes ``benchmarks/results/compression.json`` and prints a Markdown table.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

import harness
from bench_cnn import build_model, make_data

BLOCKS = (32, 64, 128, 256, 512, 1024, 4096)


def _flat(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float32).ravel() for a in arrays])


def _state(model):
    from sparkdl_avg.shared.model.modelspec import get_state

    weights, opt = get_state(model)
    return _flat(weights), _flat([v for v in opt if np.asarray(v).dtype == np.float32 and np.asarray(v).size > 1])


def round_deltas(k_values, points, examples=6400, batch=32):
    """``{(point, k): (weight delta, optimizer delta)}``: one worker's round of k minibatches from each point."""
    x, y = make_data(examples, seed=0)
    model = build_model()
    model.optimizer.build(model.trainable_variables)  # Adam's moments exist from the first round on
    out = {}
    trained = 0
    for point in points:
        if point > trained:
            model.fit(x, y, batch_size=batch, epochs=point - trained, verbose=0, shuffle=True)
            trained = point
        start = [w.copy() for w in model.get_weights()], [v.numpy().copy() for v in model.optimizer.variables]
        w0, o0 = _state(model)
        for k in k_values:
            sub = slice(0, k * batch)
            model.fit(x[sub], y[sub], batch_size=batch, epochs=1, verbose=0, shuffle=False)
            w1, o1 = _state(model)
            out[(point, k)] = (w1 - w0, o1 - o0)
            model.set_weights(start[0])
            for var, value in zip(model.optimizer.variables, start[1]):
                var.assign(value)
    return out


def _rel_error(codec, block, d):
    from sparkdl_avg.shared.wire import compression as c

    if not np.any(d):
        return 0.0
    e = c.encode(d, codec, block)
    return float(np.linalg.norm(c.decode(e) - d) / np.linalg.norm(d)), e.nbytes / (4 * d.size)


def _time_1e6(codec, block, sample, repeats):
    from sparkdl_avg.shared.wire import compression as c

    rng = np.random.default_rng(0)
    d = rng.choice(sample, size=1_000_000).astype(np.float32)
    enc, dec = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        e = c.encode(d, codec, block)
        enc.append(time.perf_counter() - t)
        t = time.perf_counter()
        c.decode(e)
        dec.append(time.perf_counter() - t)
    return statistics.median(enc), statistics.median(dec)


def main() -> None:
    p = harness.parser(__doc__.split("\n\n")[0], out="compression.json", repeats=5)
    p.add_argument("--k", type=int, nargs="+", default=[32, 128])
    p.add_argument("--points", type=int, nargs="+", default=[0, 1, 3], help="epochs of training before the round")
    args = p.parse_args()
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)  # one core, as one worker of local[2]
    deltas = round_deltas(args.k, args.points)
    arms = [("bf16", None)] + [("int8", b) for b in BLOCKS]
    rows = []
    sample = np.concatenate([d[0] for d in deltas.values()])
    for codec, block in arms:
        errors_w, errors_o, ratio = [], [], None
        for (point, k), (dw, do) in sorted(deltas.items()):
            ew, ratio = _rel_error(codec, block or 256, dw)
            eo, _ = _rel_error(codec, block or 256, do)
            errors_w.append(ew)
            errors_o.append(eo)
        enc_s, dec_s = _time_1e6(codec, block or 256, sample, args.repeats)
        rows.append({
            "codec": codec, "block": block, "bytes_vs_float32": ratio,
            "weights_rel_error_median": statistics.median(errors_w), "weights_rel_error_max": max(errors_w),
            "optimizer_rel_error_median": statistics.median(errors_o), "optimizer_rel_error_max": max(errors_o),
            "encode_ms_per_1e6": enc_s * 1e3, "decode_ms_per_1e6": dec_s * 1e3,
        })
        print(rows[-1], file=sys.stderr, flush=True)
    harness.write_results(args.out, args, rows=rows,
                          deltas={f"{p}/{k}": [float(np.linalg.norm(w)), float(np.linalg.norm(o)), int(w.size), int(o.size)]
                                  for (p, k), (w, o) in deltas.items()})
    print("| codec | block | bytes vs float32 | weights' error (median / max) | optimizer's error (median / max) "
          "| encode + decode, ms per 10⁶ values |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['codec']} | {r['block'] or '–'} | {r['bytes_vs_float32']:.4f} | "
              f"{r['weights_rel_error_median']:.4f} / {r['weights_rel_error_max']:.4f} | "
              f"{r['optimizer_rel_error_median']:.4f} / {r['optimizer_rel_error_max']:.4f} | "
              f"{r['encode_ms_per_1e6']:.1f} + {r['decode_ms_per_1e6']:.1f} |")


if __name__ == "__main__":
    main()
