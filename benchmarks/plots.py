"""Draws the figures of docs/benchmarks.md and docs/scaling.md from benchmarks/results/*.json.

Usage::

    .venv/bin/python benchmarks/plots.py     # writes docs/bench_suite.png, docs/bench_overhead.png, docs/scaling.png

Missing result files are skipped. A results file is read in either layout:
the harness's (``benchmarks/harness.py``: ``benchmark``, ``date``,
``machine``, ``conf``, ``arm_conf``, ``args``, then the script's own keys)
or the older one of the committed files (the script's keys alone, some
without ``date``); the figures use only the script's keys, which have the
same names in both.
"""

from __future__ import annotations

import json
import os
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
DOCS = os.path.join(HERE, "..", "docs")


def _load(name):
    """A results file's object, in the harness's layout or the older one (see the module docstring)."""
    path = os.path.join(RESULTS, name)
    if not os.path.exists(path):
        print(f"skipping {name}: not found")
        return None
    with open(path) as f:
        d = json.load(f)
    if "machine" in d:
        m = d["machine"]
        print(f"{name}: {d.get('date')}, {m.get('cpus')} CPUs, load {m.get('load_avg_1min')}, "
              f"sparkdl_avg {m.get('sparkdl_avg')}")
    return d


def _short(arm: str) -> str:
    return (arm.replace("trainer local[2] ", "trainer ").replace("(1 process, steps_per_execution=128)", "spe=128")
            .replace(" (1 process)", "").replace(" (sync, averages once per epoch)", "")
            .replace("ideal (2 × one worker's compute throughput)", "ideal (2 × 1 worker)")
            .replace("trainer 1 worker (1 core) k=128", "trainer 1 worker k=128"))


def suite_plot(d):
    rows = d["rows"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    names = [_short(r["arm"]) for r in rows]
    vals = [r["examples_per_s"] for r in rows]
    colors = ["#888" if n.startswith("keras") else "#c44" if n.startswith("elephas") else "#4a4" if n.startswith("ideal")
              else "#36c" for n in names]
    ax1.barh(range(len(rows)), vals, color=colors)
    ax1.set_yticks(range(len(rows)), names, fontsize=8)
    ax1.invert_yaxis()
    base = rows[0]["examples_per_s"]
    for i, v in enumerate(vals):
        ax1.text(v, i, f" {v / base:.2f}×", va="center", fontsize=8)
    ax1.set_xlabel("training examples/s (median, epochs 2+)")
    ax1.set_title(f"CNN, {d['args']['examples']:,} examples, batch {d['args']['batch_size']}, local[2]")
    for name, runs in d["runs"].items():
        if not runs:
            continue
        epochs = len(runs[0]["elapsed_s"])
        xs = [statistics.median(r["elapsed_s"][e] for r in runs) for e in range(epochs)]
        ys = [statistics.median(r["epoch_accuracy"][e] for r in runs) for e in range(epochs)]
        ax2.plot(xs, ys, marker="o", label=_short(name))
    ax2.axhline(d["target_accuracy"], color="k", lw=0.8, ls="--")
    ax2.set_xlabel("training time since fit() started, s (median)")
    ax2.set_ylabel("held-out accuracy after each epoch")
    ax2.set_ylim(max(0.5, min(ax2.get_ylim()[0], d["target_accuracy"] - 0.05)), 1.0)
    ax2.legend(fontsize=7)
    ax2.set_title(f"time to accuracy (dashed: target {d['target_accuracy']:.3f})")
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, "bench_suite.png"), dpi=110)


PHASES = [("broadcast_s", "broadcast"), ("schedule_s", "schedule"), ("setup_max_s", "state assign"),
          ("load_max_s", "data load"), ("compute_max_s", "compute (slowest)"), ("aggregate_s", "aggregate"),
          ("update_s", "driver update")]


def _median_of_repeats(cfgs):
    """One configuration per (transport, workers, size, k, depth): the median of each phase over repeats."""
    groups = {}
    for c in cfgs:
        key = (c.get("transport", "spark"), c["workers"], c["params"], c["k"], c["depth"])
        groups.setdefault(key, []).append(c)
    out = []
    for same in groups.values():
        first = dict(same[0])
        first["median"] = {k: (statistics.median(c["median"][k] for c in same)
                           if all(c["median"][k] is not None for c in same) else None)  # received_bytes: Spark's path
                       for k in first["median"]}
        out.append(first)
    return out


def overhead_plot(d):
    cfgs = d["configs"]
    prof = {p["size"]: p for p in d["profiles"]}
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.6))
    groups = [
        ("transport", lambda c: f"{c['transport']} {c['workers']}w {c['params'] / 1e6:.2g}M",
         "state_transport (k=8, depth 2)"),
        ("size", lambda c: f"{c['params'] / 1e6:.2g}M" if c["params"] >= 1e6 else f"{c['params'] / 1e3:.0f}k",
         "parameters (2 workers, k=8, depth 2)"),
        ("workers", lambda c: f"{c['workers']}w {c['params'] / 1e6:.2g}M", "workers (local[N], k=8, depth 2)"),
        ("depth", lambda c: f"d{c['depth']} {c['params'] / 1e6:.2g}M", "aggregation_depth (8 workers, k=8)"),
    ]
    for ax, (sweep, label, title) in zip(axes, groups):
        sel = _median_of_repeats([c for c in cfgs if c["sweep"] == sweep])
        if not sel:
            continue
        bottom = [0.0] * len(sel)
        for key, name in PHASES:
            vals = [1000 * c["median"][key] for c in sel]
            ax.bar(range(len(sel)), vals, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, vals)]
        if sweep == "size":
            budget = [150 + 2000 * prof[c["size"]]["move_model_bytes_s"] for c in sel]
            over = [1000 * c["median"]["round_overhead_s"] for c in sel]
            ax.plot(range(len(sel)), budget, "k--", marker="_", label="target: 150 ms + 2 × move")
            ax.plot(range(len(sel)), over, "r:", marker="x", label="overhead (wall − compute)")
        ax.set_xticks(range(len(sel)), [label(c) for c in sel], fontsize=8, rotation=30)
        ax.set_yscale("log")
        ax.set_ylabel("ms per round (median)")
        ax.set_title(title, fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(os.path.join(DOCS, "bench_overhead.png"), dpi=110)


def scaling_plot(d):
    models = [m["name"] for m in d["models"]]
    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models), 4.2), squeeze=False)
    for ax, m in zip(axes[0], models):
        for k, color in zip((8, 32, 128, 512), ("C0", "C1", "C2", "C3")):
            for pb, ls in ((8, "-"), (4, ":")):
                pts = {}
                for r in d["rows"]:
                    if r["model"] == m and r["k"] == k and r["partial_bytes"] == pb:
                        pts[r["workers"]] = max(pts.get(r["workers"], 0), r["efficiency"])
                ns = sorted(pts)
                ax.plot(ns, [pts[n] for n in ns], ls, color=color, marker="o" if pb == 8 else None,
                        label=f"k={k}" + (" (float32 partials)" if pb == 4 else ""))
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1)
        ax.set_xlabel("workers")
        ax.set_ylabel("projected efficiency (best depth)")
        ax.set_title(m)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, "scaling.png"), dpi=110)


def main() -> None:
    for name, fn in (("suite.json", suite_plot), ("overhead.json", overhead_plot), ("scaling.json", scaling_plot)):
        d = _load(name)
        if d is not None:
            fn(d)
            print(f"drew {name}")


if __name__ == "__main__":
    main()
