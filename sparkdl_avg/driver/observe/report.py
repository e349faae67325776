"""The training report: one self-contained HTML file describing a fit.

It shows (1) a timeline of every worker's activity per round — replica setup, data loading and compute — under the
driver's phases (broadcast, scheduling, aggregation, update), zoomable so hundreds of rounds stay readable; (2) the loss
and metric curves per epoch (train and validation) and the loss per round; for an elastic fit
(``min_workers``/``max_workers``, see :mod:`sparkdl_avg.driver.elastic.membership`), each round's workers and examples
per second, on the curves' epoch axis, with every change of workers marked by its reason ("slots lost: 3 → 2"); (3)
where the time went, per epoch and in total. Plotly draws it; its JavaScript is embedded in the file, so the report
opens offline.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from typing import Dict, List, Optional, Sequence

from ...shared.files.fs import replace_atomically

_DRIVER_PHASES = (
    ("broadcast_s", "broadcast", "#9467bd"),
    ("schedule_s", "scheduling", "#c5b0d5"),
    ("aggregate_s", "aggregation", "#d62728"),
    ("update_s", "driver update", "#8c564b"),
)
_DRIVER_NAMES = frozenset(name for _, name, _ in _DRIVER_PHASES)  # listed in the legend by the timeline
_WORKER_PHASES = (
    ("setup_s", "replica setup", "#7f7f7f"),
    ("load_s", "data loading", "#ff7f0e"),
    ("compute_s", "compute", "#1f77b4"),
)


def _timeline(fig, records: Sequence[dict], row: int) -> None:
    import plotly.graph_objects as go

    t0 = records[0]["t_start"]
    bars: Dict[str, Dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        label = f"epoch {r.epoch + 1} round {r.round + 1} (k={r.averaging_frequency})"
        start = r.t_start - t0
        marks = {
            "broadcast_s": start,
            "schedule_s": start + r.broadcast_s,
            "aggregate_s": start + r.broadcast_s + r.schedule_s + r.workers_s,
            "update_s": start + r.broadcast_s + r.job_s,
        }
        for key, name, _ in _DRIVER_PHASES:
            b = bars[name]
            b["y"].append("driver")
            b["base"].append(marks[key])
            b["x"].append(getattr(r, key))
            b["text"].append(f"{label}<br>{name}: {getattr(r, key) * 1000:.1f} ms")
        for w in r.workers:
            at = w.start - t0
            for key, name, _ in _WORKER_PHASES:
                b = bars[name]
                b["y"].append(f"worker {w.worker}")
                b["base"].append(at)
                b["x"].append(getattr(w, key))
                b["text"].append(
                    f"{label}<br>worker {w.worker} on {w.host} (pid {w.pid})<br>"
                    f"{name}: {getattr(w, key) * 1000:.1f} ms"
                )
                at += getattr(w, key)
    colors = {name: color for _, name, color in _DRIVER_PHASES + _WORKER_PHASES}
    for name, b in bars.items():
        fig.add_trace(
            go.Bar(
                name=name,
                orientation="h",
                y=b["y"],
                x=b["x"],
                base=b["base"],
                hovertext=b["text"],
                hoverinfo="text",
                marker_color=colors[name],
                # a driver phase's own group: the breakdown's bar of the same phase joins it, unlisted
                legendgroup=f"phase:{name}" if name in _DRIVER_NAMES else "timeline",
            ),
            row=row,
            col=1,
        )


def _rounds_per_epoch(records: Sequence[dict]) -> Dict[int, int]:
    """Each epoch's rounds, which place a round at ``epoch + (round + 1) / rounds`` on the curves' epoch axis."""
    rounds: Dict[int, int] = defaultdict(int)
    for r in records:
        rounds[r.epoch] = max(rounds[r.epoch], r.round + 1)
    return rounds


def _elastic(records: Sequence[dict]) -> bool:
    """Whether the records are an elastic fit's (any change of workers recorded), which the report plots."""
    return any(r.get("membership") is not None for r in records)


def _change_text(change: dict, before: Optional[int]) -> str:
    """A membership change's label: its reason, and the workers before (where this fit had a round before it) and after."""
    if before is None:
        return f"{change['reason']}: {change['workers']} worker{'s' if change['workers'] != 1 else ''}"
    return f"{change['reason']}: {before} → {change['workers']}"


def _workers(fig, records: Sequence[dict], row: int) -> None:
    """An elastic fit's workers per round (a step line, left axis) and examples/s (right axis), each change of workers labelled."""
    import plotly.graph_objects as go

    per_epoch = _rounds_per_epoch(records)
    records = sorted(records, key=lambda r: (r["epoch"], r["round"]))
    # A round spans (its start, its end] on the epoch axis; the loss per round is plotted at its end, and so are
    # the examples/s. The step line's first point is the first round's start, so that it spans that round too.
    starts = [r["epoch"] + r["round"] / per_epoch[r["epoch"]] for r in records]
    ends = [r["epoch"] + (r["round"] + 1) / per_epoch[r["epoch"]] for r in records]
    labels = [f"epoch {r['epoch'] + 1} round {r['round'] + 1}" for r in records]
    fig.add_trace(
        go.Scatter(
            x=[starts[0]] + ends,
            y=[records[0]["num_workers"]] + [r["num_workers"] for r in records],
            hovertext=[labels[0]] + [f"{label}: {r['num_workers']} workers" for label, r in zip(labels, records)],
            hoverinfo="text",
            mode="lines",
            line={"shape": "vh", "color": "#2ca02c"},
            name="workers",
            legendgroup="workers",
        ),
        row=row,
        col=1,
        secondary_y=False,
    )
    fig.add_trace(
        go.Scatter(
            x=ends,
            y=[r["examples_per_s"] for r in records],
            hovertext=[f"{label}: {r['examples_per_s']:.1f} examples/s" for label, r in zip(labels, records)],
            hoverinfo="text",
            mode="lines+markers",
            line={"color": "#17becf"},
            name="examples/s",
            legendgroup="workers",
        ),
        row=row,
        col=1,
        secondary_y=True,
    )
    changes = []
    for i, r in enumerate(records):
        change = r.get("membership")
        if change is not None:
            before = records[i - 1]["num_workers"] if i else None
            hosts = ", ".join(change.get("hosts") or ())
            changes.append((starts[i], change["workers"], _change_text(change, before),
                            f"{labels[i]}: {change['reason']}, {change['workers']} workers on {change['slots']} live "
                            f"slots{f' ({hosts})' if hosts else ''}"))
    fig.add_trace(
        go.Scatter(
            x=[c[0] for c in changes],
            y=[c[1] for c in changes],
            hovertext=[c[3] for c in changes],
            hoverinfo="text",
            mode="markers",
            marker={"symbol": "diamond", "size": 10, "color": "#2ca02c"},
            name="change of workers",
            legendgroup="workers",
        ),
        row=row,
        col=1,
        secondary_y=False,
    )
    for i, (x, y, text, _) in enumerate(changes):
        # staggered heights: changes a few rounds apart would print their labels over each other
        fig.add_annotation(x=x, y=y, text=text, showarrow=True, arrowhead=2, ax=0, ay=-25 - 18 * (i % 3),
                           font={"size": 11}, row=row, col=1, secondary_y=False)
    # the curves' epoch axis (row 2's x axis, "x2"): zooming one zooms both
    fig.update_xaxes(title_text="epoch", matches="x2", row=row, col=1)
    # whole workers only; about six ticks however many there are
    most = max(r["num_workers"] for r in records)
    fig.update_yaxes(title_text="workers", rangemode="tozero", dtick=max(1, math.ceil(most / 6)), row=row, col=1,
                     secondary_y=False)
    fig.update_yaxes(title_text="examples/s", rangemode="tozero", showgrid=False, row=row, col=1, secondary_y=True)


def _curves(fig, history: Dict[str, List[float]], records: Sequence[dict], row: int) -> None:
    import plotly.graph_objects as go

    for name, values in history.items():
        fig.add_trace(
            go.Scatter(
                x=list(range(1, len(values) + 1)),
                y=values,
                mode="lines+markers",
                name=name,
                line={"dash": "dot" if name.startswith("val_") else "solid"},
                legendgroup="curves",
            ),
            row=row,
            col=1,
        )
    per_epoch = _rounds_per_epoch(records)
    # sorted: asynchronous chunks (one record each) finish out of their rounds' order
    points = sorted(((r.epoch + (r.round + 1) / per_epoch[r.epoch], r.loss) for r in records), key=lambda p: p[0])
    fig.add_trace(
        go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points], mode="lines", name="loss per round", opacity=0.5,
                   legendgroup="curves"),
        row=row,
        col=1,
    )


def _breakdown(fig, records: Sequence[dict], row: int) -> None:
    import plotly.graph_objects as go

    parts = [
        ("compute (slowest worker)", lambda r: r.compute_max_s, "#1f77b4"),
        ("data loading (slowest)", lambda r: r.load_max_s, "#ff7f0e"),
        ("replica setup (slowest)", lambda r: r.setup_max_s, "#7f7f7f"),
        ("waiting for stragglers", lambda r: max(0.0, r.workers_s - r.compute_max_s - r.load_max_s - r.setup_max_s), "#bcbd22"),
        ("broadcast", lambda r: r.broadcast_s, "#9467bd"),
        ("scheduling", lambda r: r.schedule_s, "#c5b0d5"),
        ("aggregation", lambda r: r.aggregate_s, "#d62728"),
        ("driver update + other", lambda r: r.update_s + r.other_s, "#8c564b"),
    ]
    epochs = sorted({r.epoch for r in records})
    # Stacked by hand (explicit bases): the figure's barmode is "overlay" so
    # that the timeline's bars sit at their own start times.
    below = [0.0] * len(epochs)
    for name, get, color in parts:
        totals = [sum(get(r) for r in records if r.epoch == e) for e in epochs]
        fig.add_trace(
            go.Bar(
                name=name,
                x=[f"epoch {e + 1}" for e in epochs],
                y=totals,
                base=list(below),
                marker_color=color,
                # a phase the timeline lists already is listed once (else the legend names it twice)
                legendgroup=f"phase:{name}" if name in _DRIVER_NAMES else "breakdown",
                showlegend=name not in _DRIVER_NAMES,
            ),
            row=row,
            col=1,
        )
        below = [b + t for b, t in zip(below, totals)]


def _sent(records: Sequence[dict], summary: Dict[str, float]) -> str:
    """The title's words on what each worker sent per round (and its compression's cost), or nothing."""
    sent = summary.get("sent_bytes_per_worker_median")
    if sent is None:
        return ""
    compression = records[-1].compression
    if not compression:
        return f"; each worker sent {sent / 1e6:.3g} MB of sums per round (median)"
    return (f"; each worker sent {sent / 1e6:.3g} MB per round ({compression} deltas, median), encoding "
            f"{summary['encode_s_median'] * 1000:.1f} ms")


def _memory(summary: Dict[str, float]) -> str:
    """The title's words on the fit's peak memory above the level before it (driver, busiest worker), or nothing."""
    parts = [f"{who} +{summary[key] / 2**30:.2f} GiB" for who, key in
             (("driver", "driver_peak_memory_bytes"), ("each worker ≤", "worker_peak_memory_bytes"))
             if summary.get(key) is not None]
    return f"; peak memory above the fit's start: {', '.join(parts)}" if parts else ""


def write_report(path: str, records: Sequence[dict], history: Optional[Dict[str, List[float]]] = None,
                 title: str = "sparkdl_avg training report", driver_peak_memory: Optional[int] = None) -> str:
    """Writes the HTML report of ``records`` (``trainer.stats.records``) to ``path``.

    Args:
        path: Output file; written to a temporary file and renamed, so an existing report is replaced only by a
            complete one.
        records: Round records of :class:`~sparkdl_avg.shared.wire.stats.TrainingStats`.
        history: ``History.history`` of the fit (per-epoch logs), optional.
        title: Page title.
        driver_peak_memory: ``TrainingStats.driver_peak_memory`` (bytes), shown in the summary with the
            workers' peak from the records; ``None``: not shown.

    Returns:
        ``path``.
    """
    from plotly.subplots import make_subplots

    if not records:
        raise ValueError("The 'records' parameter must hold at least one round record to report on. Got 0 records instead.")
    from ...shared.wire.stats import TrainingStats

    stats = TrainingStats()
    stats.records = list(records)
    stats.driver_peak_memory = driver_peak_memory
    summary = stats.summary()
    titles = [
        "Timeline: driver phases and each worker's setup, loading and compute (seconds since the first round; drag to zoom)",
        "Loss and metrics per epoch (dotted: validation); loss per round",
        "Where the time went per epoch (seconds)",
    ]
    elastic = _elastic(records)
    if elastic:
        # under the curves, whose epoch axis it shares
        titles.insert(2, "Workers per round (left) and examples per second (right); changes of workers and why")
    fig = make_subplots(
        rows=len(titles),
        cols=1,
        row_heights=[0.38, 0.24, 0.18, 0.2] if elastic else [0.45, 0.3, 0.25],
        vertical_spacing=0.06 if elastic else 0.08,
        subplot_titles=titles,
        specs=[[{}], [{}], [{"secondary_y": True}], [{}]] if elastic else None,
    )
    _timeline(fig, records, row=1)
    _curves(fig, dict(history or {}), records, row=2)
    if elastic:
        _workers(fig, records, row=3)
    _breakdown(fig, records, row=len(titles))
    fig.update_layout(
        title=(
            f"{title}<br><sup>{summary['rounds']} round{'s' if summary['rounds'] != 1 else ''}, {summary['examples']} examples, "
            f"{summary['wall_s']:.1f} s in rounds; compute share {summary['compute_share']:.0%}; "
            f"median per-round overhead {summary['overhead_s_median'] * 1000:.0f} ms; "
            f"median straggler ratio {summary['straggler_ratio_median']:.2f}{_sent(records, summary)}{_memory(summary)}</sup>"
        ),
        barmode="overlay",
        height=1400 if elastic else 1100,
        legend={"groupclick": "toggleitem"},
        template="plotly_white",
    )
    fig.update_xaxes(title_text="seconds", row=1, col=1)
    fig.update_xaxes(title_text="epoch", row=2, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    page = fig.to_html(include_plotlyjs=True, full_html=True)
    # plotly's page has no <title>: a browser tab or bookmark would show the file name only
    page = page.replace("<head>", f"<head><title>{html.escape(title)}</title>", 1)
    with replace_atomically(path, suffix=".html") as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(page)
    return path
