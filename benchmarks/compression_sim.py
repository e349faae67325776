"""Compressed deltas in parameter averaging, simulated in one process: what they cost in accuracy (issue 30).

A pre-study before the option exists: N Keras replicas of the suite CNN
(``bench_cnn.py``) train in turn in this process, each k minibatches of its
own quarter of the data from the round's global state (weights and Adam
variables), as the trainer's workers do; each replica's delta from the
round's start is sent through a codec of ``sparkdl_avg.shared.wire.compression``
(with or without error feedback, one residual per replica), the decoded
deltas are averaged in float32 and added to the global state (plain
averaging). Arms: ``none`` (float32 deltas: plain averaging of the states),
``bf16``, ``bf16+ef``, ``int8`` and ``int8+ef`` (blocks of
:data:`~sparkdl_avg.shared.wire.compression.BLOCK`) for the whole delta, and
``int8+ef/bf16+ef`` (the weights' delta in int8, Adam's in bf16), for each k and seed, at
equal epochs; reports the held-out accuracy after every epoch and the
training loss. No Spark: the trainer's own numbers come when the option
exists. Usage::

    .venv/bin/python benchmarks/compression_sim.py [--k 32 128] [--seeds 0 1 2] [--epochs 3]

Writes ``benchmarks/results/compression_sim.json`` and prints a Markdown table.
"""

from __future__ import annotations

import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

import harness
from bench_cnn import build_model, make_data

ARMS = ("none", "bf16", "bf16+ef", "int8", "int8+ef", "int8+ef/bf16+ef", "int8+ef/int8+ef/bf16")
"""``codec[+ef]`` for the whole delta, ``weights' codec/optimizer's codec``, or ``weights' codec/first
moments' codec/other optimizer variables' codec`` (first moments: the variables named ``*_momentum``,
what ``update_compression="int8"`` sends in int8)."""


def _flat(arrays):
    return np.concatenate([np.asarray(a, dtype=np.float32).ravel() for a in arrays])


def _unflat(vector, like):
    out, i = [], 0
    for a in like:
        n = int(np.prod(np.shape(a)))
        out.append(vector[i:i + n].reshape(np.shape(a)).astype(np.asarray(a).dtype))
        i += n
    return out


def _float_vars(model):
    return [v for v in model.optimizer.variables if v.dtype == "float32" and len(v.shape) > 0]


def run(arm, k, seed, epochs, workers, x, y, xt, yt, batch=32):
    """Held-out accuracy and mean training loss after each epoch of simulated averaging."""
    from sparkdl_avg.shared.wire import compression as c

    import keras

    model = build_model()
    model.optimizer.build(model.trainable_variables)
    opt_vars = _float_vars(model)
    w_global = _flat(model.get_weights())
    o_global = _flat([v.numpy() for v in opt_vars])
    shards = np.array_split(np.random.default_rng(seed).permutation(len(x)), workers)
    steps = len(shards[0]) // batch
    parts = arm.split("/") if "/" in arm else [arm, arm]
    if len(parts) == 2:
        parts = [parts[0], parts[1], parts[1]]
    plans = [(None if p == "none" else p.split("+")[0], p.endswith("+ef")) for p in parts]  # weights, m, others
    residuals = [[None, None, None] for _ in range(workers)]
    # Each optimizer value's plan: first moments (named *_momentum) or the others.
    moment = np.concatenate([np.full(int(np.prod(v.shape)), v.path.endswith("_momentum")) for v in opt_vars])
    shapes_w, shapes_o = model.get_weights(), [v.numpy() for v in opt_vars]
    out = []
    iterations = 0
    for epoch in range(epochs):
        losses = []
        order = [np.random.default_rng((seed, epoch, w)).permutation(s) for w, s in enumerate(shards)]
        for start in range(0, steps, k):
            n = min(k, steps - start)
            total = np.zeros(w_global.size + o_global.size, dtype=np.float32)
            for w in range(workers):
                model.set_weights(_unflat(w_global, shapes_w))
                for var, value in zip(opt_vars, _unflat(o_global, shapes_o)):
                    var.assign(value)
                model.optimizer.iterations.assign(iterations)
                idx = order[w][start * batch:(start + n) * batch]
                h = model.fit(x[idx], y[idx], batch_size=batch, epochs=1, verbose=0, shuffle=False)
                losses.append(h.history["loss"][0])
                opt_delta = _flat([v.numpy() for v in opt_vars]) - o_global
                deltas = (_flat(model.get_weights()) - w_global, opt_delta[moment], opt_delta[~moment])
                sums = []
                for part, ((codec, feedback), delta) in enumerate(zip(plans, deltas)):
                    view = np.zeros_like(delta)
                    if codec is None:
                        view += delta
                    elif feedback:
                        e, residuals[w][part] = c.with_feedback(delta, residuals[w][part], codec)
                        c.add_decoded(view, e)
                    else:
                        c.add_decoded(view, c.encode(delta, codec))
                    sums.append(view)
                total[: w_global.size] += sums[0]
                opt_total = np.zeros_like(opt_delta)
                opt_total[moment], opt_total[~moment] = sums[1], sums[2]
                total[w_global.size:] += opt_total
            total /= np.float32(workers)
            w_global = w_global + total[: w_global.size]
            o_global = o_global + total[w_global.size:]
            iterations += n
        model.set_weights(_unflat(w_global, shapes_w))
        acc = float(np.mean(np.argmax(model.predict(xt, batch_size=1024, verbose=0), axis=1) == yt))
        out.append({"epoch": epoch, "accuracy": acc, "loss": float(np.mean(losses))})
        print(f"{arm} k={k} seed={seed} epoch {epoch}: acc {acc:.4f} loss {np.mean(losses):.4f}",
              file=sys.stderr, flush=True)
    keras.backend.clear_session()
    return out


def main() -> None:
    p = harness.parser(__doc__.split("\n\n")[0], out="compression_sim.json")
    p.add_argument("--k", type=int, nargs="+", default=[32, 128])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--examples", type=int, default=20000)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    args = p.parse_args()
    x, y = make_data(args.examples + 5000, seed=0)
    x, y, xt, yt = x[: args.examples], y[: args.examples], x[args.examples:], y[args.examples:]
    runs = []
    for k in args.k:
        for seed in args.seeds:
            for arm in args.arms:  # interleaved: every arm of a (k, seed) runs back to back
                runs.append({"arm": arm, "k": k, "seed": seed,
                             "epochs": run(arm, k, seed, args.epochs, args.workers, x, y, xt, yt)})
    rows = []
    for k in args.k:
        base = None
        for arm in args.arms:
            mine = [r["epochs"] for r in runs if r["arm"] == arm and r["k"] == k]
            acc = statistics.median(e[-1]["accuracy"] for e in mine)
            loss = [statistics.median(e[i]["loss"] for e in mine) for i in range(args.epochs)]
            if arm == "none":
                base = (acc, loss)
            rows.append({"arm": arm, "k": k, "accuracy_median": acc, "loss_median": loss,
                         "accuracy_delta": acc - base[0] if base else None,
                         "loss_rel_after_first": (max(abs(a / b - 1) for a, b in zip(loss[1:], base[1][1:]))
                                                  if base and args.epochs > 1 else None)})
    harness.write_results(args.out, args, rows=rows, runs=runs)
    print("| k | arm | held-out accuracy (median of seeds) | Δ vs none | training loss per epoch | "
          "largest loss gap after epoch 1 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        gap = "–" if r["loss_rel_after_first"] is None else f"{100 * r['loss_rel_after_first']:.1f}%"
        print(f"| {r['k']} | {r['arm']} | {r['accuracy_median']:.4f} | {r['accuracy_delta']:+.4f} | "
              f"{' / '.join(f'{v:.4f}' for v in r['loss_median'])} | {gap} |")


if __name__ == "__main__":
    main()
