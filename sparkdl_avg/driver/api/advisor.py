"""Should this model be distributed? :func:`advise` measures the user's model, data and cluster, and predicts.

This module owns the measurement and the answer: :func:`advise` measures, on the user's own session and data and within
a time budget, one process's time per minibatch and, by short fits of copies of the model at a few worker counts, one
worker's time per minibatch and a round's fixed cost; it feeds them to the cost model
(:mod:`sparkdl_avg.driver.observe.costmodel`, which ``fit``'s slow warning shares) and returns the answer in words, as a
table and as a figure (:class:`Advice`). It measures through the trainer's public API only: one
:class:`~sparkdl_avg.ParameterAveragingTrainer` per worker count, its ``fit`` and ``trainer.stats``. What it measures
and how close its predictions come to real fits: docs/guides/advise.md.

The cost model's names (:class:`CostModel`, :func:`predict`, :func:`recommend`, :func:`is_cold`, :func:`steady_costs`,
:func:`slower_than_one_process`, :data:`WARM_ROUNDS`) are importable from here too.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ...errors import DataError
from ..observe.costmodel import WARM_ROUNDS, CostModel, communication_advice, is_cold, predict, recommend, slower_than_one_process, steady_costs  # noqa: F401  (the cost model's public names, importable from here too)
from ..config.options import Ints, must_be, require

#: Averaging frequencies the table compares, besides the user's own (cut to the minibatches of an epoch).
FREQUENCIES = (1, 4, 16, 64, 256)
MIN_BUDGET_S = 10.0  #: below this not even one short distributed fit can be measured
_ROUNDS = 10  #: rounds per measuring fit at the largest worker count (if the data has them)
_FIT_BUDGET_SHARE = 0.75  #: of the budget left after staging and the baseline, what the distributed fits may use
_SINGLE_STEPS = 64  #: minibatches of one process's measurement (at most)


@dataclass
class Advice:
    """What :func:`advise` found: the answer in words, the predictions, and what was measured.

    Attributes:
        summary: The answer in words (also ``str(advice)``'s first line).
        rows: One dict per (workers, averaging frequency): ``workers``, ``averaging_frequency``, ``epoch_s``,
            ``total_s`` (the planned epochs plus the one-off costs), ``speedup`` (one process's total over this one's),
            ``efficiency`` (the workers' compute share of the epoch) and ``extrapolated`` (more workers than measured);
            the first row is one process (``workers=1``, ``averaging_frequency=None``).
        cost: The :class:`CostModel` the predictions come from.
        measurements: What was measured, in seconds and bytes: ``t_single``, ``t_step``, ``fixed``, ``staging_s`` (the
            measured sample) and ``staging_full_s`` (scaled to all the data), ``first_round_extra_s`` (building
            replicas, starting Python workers), ``state_bytes`` per round, ``num_examples``, ``parallelism``,
            ``elapsed_s``, ``budget_s``.
        best: The recommended row (the one-process row when staying is faster).
    """

    summary: str
    rows: List[Dict[str, Any]]
    cost: CostModel
    measurements: Dict[str, Any]
    best: Dict[str, Any]
    epochs: int = 1

    def __str__(self) -> str:
        return self.summary + "\n\n" + self.table()

    def table(self) -> str:
        """The predictions as a text table."""
        head = f"{'workers':>8} {'k':>6} {'epoch s':>9} {'total s':>9} {'speed-up':>9} {'efficiency':>10}"
        lines = [head]
        slots = self.measurements.get("parallelism")
        for r in self.rows:
            k = "-" if r["averaging_frequency"] is None else str(r["averaging_frequency"])
            mark = " (extrapolated)" if r["extrapolated"] else ""
            if slots and r["workers"] > slots:
                mark = f" (extrapolated; a bigger cluster: {slots} task slots here)"
            lines.append(f"{r['workers']:>8} {k:>6} {r['epoch_s']:>9.3f} {r['total_s']:>9.2f} "
                         f"{r['speedup']:>8.2f}x {r['efficiency']:>10.0%}{mark}")
        return "\n".join(lines)

    def to_dict(self) -> Dict[str, Any]:
        """Everything as JSON-able data."""
        return {"summary": self.summary, "rows": self.rows, "best": self.best, "epochs": self.epochs,
                "measurements": self.measurements}

    def figure(self):
        """A plotly figure: predicted speed-up over one process by workers, one line per averaging frequency."""
        import plotly.graph_objects as go

        fig = go.Figure()
        frequencies = sorted({r["averaging_frequency"] for r in self.rows if r["averaging_frequency"] is not None})
        for k in frequencies:
            rows = [r for r in self.rows if r["averaging_frequency"] == k]
            for extrapolated in (False, True):
                part = [r for r in rows if r["extrapolated"] == extrapolated]
                if extrapolated and part:  # join the dashed part to the last measured point
                    part = [r for r in rows if not r["extrapolated"]][-1:] + part
                if not part:
                    continue
                fig.add_trace(go.Scatter(
                    x=[r["workers"] for r in part], y=[r["speedup"] for r in part], mode="lines+markers",
                    name=f"k={k}" + (" (extrapolated)" if extrapolated else ""),
                    line={"dash": "dash" if extrapolated else "solid"}, legendgroup=str(k),
                    showlegend=not extrapolated or not any(not r["extrapolated"] for r in rows),
                    hovertemplate="%{x} workers: %{y:.2f}× one process<extra>k=" + str(k) + "</extra>",
                ))
        fig.add_hline(y=1.0, line={"color": "grey", "dash": "dot"}, annotation_text="one process")
        fig.update_layout(title=self.summary if len(self.summary) < 110 else self.summary[:107] + "...",
                          xaxis_title="workers", yaxis_title=f"speed-up over one process ({self.epochs} epochs)",
                          xaxis_type="log", template="plotly_white")
        return fig

    def _repr_html_(self) -> str:
        import html

        rows = "".join(
            f"<tr><td>{r['workers']}</td><td>{r['averaging_frequency'] or '-'}</td><td>{r['epoch_s']:.3f}</td>"
            f"<td>{r['total_s']:.2f}</td><td>{r['speedup']:.2f}×</td><td>{r['efficiency']:.0%}</td>"
            f"<td>{'extrapolated' if r['extrapolated'] else ''}</td></tr>"
            for r in self.rows
        )
        return (f"<p><b>{html.escape(self.summary)}</b></p><table><tr><th>workers</th><th>k</th><th>epoch s</th>"
                f"<th>total s</th><th>speed-up</th><th>efficiency</th><th></th></tr>{rows}</table>")

    def write_html(self, path: str) -> str:
        """Writes the answer, the table and the figure to one self-contained HTML file; returns ``path``."""
        import html

        from ...shared.files.fs import write_atomically

        page = ("<!doctype html><html><head><meta charset='utf-8'><title>sparkdl_avg advice</title></head><body>"
                + self._repr_html_()
                + self.figure().to_html(full_html=False, include_plotlyjs=True)
                + f"<pre>{html.escape(_measurements_text(self.measurements))}</pre></body></html>")
        write_atomically(path, page.encode("utf-8"))
        return path


def _measurements_text(m: Dict[str, Any]) -> str:
    return "\n".join(f"{k}: {v}" for k, v in m.items())


# ------------------------------------------------------------------ measurement


def advise(
    model,
    data,
    *,
    epochs: int = 10,
    batch_size: int = 32,
    averaging_frequency: Optional[int] = None,
    features_col: Any = "features",
    label_col: Any = "label",
    budget_s: float = 60.0,
    max_workers: Optional[int] = None,
    staging_dir: Optional[str] = None,
    state_transport: str = "auto",
) -> Advice:
    """Measures whether training ``model`` on ``data`` by parameter averaging pays, within ``budget_s``.

    On the session that holds ``data`` (classic or Connect), it measures: one process's ``keras.Model.fit`` throughput
    on the driver (plain and with ``steps_per_execution``) on examples of ``data``; one worker's time per minibatch and
    a round's fixed cost by a few short fits at 2 workers and at the session's parallelism (and 1 when that is 2), with
    the transport ``fit`` would use, from the rounds where no worker built its replica or traced its step function; the
    one-off costs (staging the data, those rounds' excess). Then it predicts, with :class:`CostModel`, the epoch time,
    efficiency and speed-up over one process for worker counts up to the parallelism (and, extrapolated, up to
    ``max_workers``) and for averaging frequencies, and the total for ``epochs``. ``model`` itself is not trained
    (copies are).

    Args:
        model: The compiled ``keras.Model`` you plan to train.
        data: Spark DataFrame, RDD of ``(x, y)`` or ``(x, y)`` numpy arrays, as for ``fit``.
        epochs: The epochs you plan to train. Default 10.
        batch_size: Examples per minibatch, per worker (and of one process). Default 32.
        averaging_frequency: The ``k`` you plan to use; compared with 1, 4, 16, 64 and 256. Default ``None``: those
            alone.
        features_col, label_col: As in ``fit``.
        budget_s: Seconds the measurement may take, roughly (the first Python workers' start counts too). At least 10.
            Default 60.
        max_workers: The largest worker count to predict (extrapolated beyond the parallelism). Default ``None``: 8 ×
            the parallelism.
        staging_dir: As the trainer's option; where the sample is staged.
        state_transport: As the trainer's option. Default ``"auto"``.

    Returns:
        An :class:`Advice`: ``str(advice)`` is the answer and the table, ``advice.figure()`` a plotly figure,
        ``advice.rows`` the numbers.

    Raises:
        ConfigurationError: a bad argument or model, or a budget below 10 s.
        DataError: empty data, or too few examples for one round at 2 workers.
    """
    from ...shared.model.modelspec import ModelSpec, check_model_loads, get_state
    from ..config.trainer_config import validate_model
    from ..data.adapters import engine_for, find_data_adapter, get_data_adapter, known_data
    from .trainer import ParameterAveragingTrainer

    started = time.perf_counter()
    validate_model(model)
    require("epochs", epochs, Ints(1))
    require("batch_size", batch_size, Ints(1))
    require("averaging_frequency", averaging_frequency, Ints(1, allow_none=True))
    require("max_workers", max_workers, Ints(1, allow_none=True))
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not budget_s >= MIN_BUDGET_S:
        raise must_be("budget_s", f"a number of seconds >= {MIN_BUDGET_S:g}: less cannot measure one process and "
                      "one short distributed fit", budget_s)
    spec = ModelSpec.from_model(model)
    check_model_loads(spec)
    if find_data_adapter(data) is None:
        raise DataError(
            "The data must be a Spark DataFrame, an RDD of (x, y) pairs or a tuple (x, y) of numpy arrays. "
            f"Got {type(data).__name__} instead."
        )
    data = known_data(data)  # a user's container converted once
    engine = engine_for(data)
    parallelism = engine.default_parallelism
    total = get_data_adapter(data).count()
    if total == 0:
        raise DataError("The data is empty: there is nothing to measure.")
    if total < 2 * batch_size:
        raise DataError(
            f"The data has {total} examples; one round at 2 workers needs at least 2 * batch_size = "
            f"{2 * batch_size}. Lower 'batch_size' or pass more data."
        )
    counts = sorted({2, min(parallelism, max(2, total // batch_size))} | ({1} if parallelism <= 2 else set()))
    # 2 workers first: a budget that allows one fit has then measured a distributed count to recommend (measuring 1
    # first left nothing to compare with one process when the budget ran out after it).
    order = sorted(counts, key=lambda w: (w != 2, w == 1, w))
    k_plan = averaging_frequency or 8
    # The planned k where the data allows ~10 rounds at the largest count (the first rounds after a start are
    # slower, so a few steady rounds overstate a fresh cluster's fixed cost); at most all the data.
    widest = max(counts)
    k_measure = max(1, min(k_plan, total // (widest * batch_size * _ROUNDS)))
    sample_n = min(total, widest * batch_size * k_measure * (_ROUNDS + 2))
    sample = _head(data, sample_n, total)

    t_step: Dict[int, float] = {}
    fixed: Dict[int, float] = {}
    first_extra = 0.0
    deadline = started + budget_s
    t0 = time.perf_counter()
    for i, w in enumerate(order):
        left = deadline - time.perf_counter()
        if i > 0 and left < _FIT_BUDGET_SHARE * (time.perf_counter() - t0) / (i + 1):
            break  # the next fit would likely overrun the budget
        # A trainer per count, on a copy of the model: the same replica fingerprint, so executors keep their
        # cached replica. Each stages the sample itself (the first fit's staging time is the one measured).
        with ParameterAveragingTrainer(spec.build(), num_workers=w, batch_size=batch_size,
                                       averaging_frequency=k_measure, seed=0, staging_dir=staging_dir,
                                       state_transport=state_transport, slow_warning=False) as trainer:
            trainer.fit(sample, epochs=1, features_col=features_col, label_col=label_col, verbose=0, shuffle=False)
            stats = trainer.stats  # this fit's
        records = stats.records
        t_step[w], fixed[w], _ = steady_costs(records)
        # what the rounds with replica builds or first traces took beyond a steady round of their size
        first_extra = max(first_extra, sum(
            max(0.0, r.wall_s - r.averaging_frequency * t_step[w] - fixed[w]) for r in records if is_cold(r)))
        transport = records[-1].transport
        if i == 0:
            staging_s = stats.staging_s
            # after the first fit, which checked that the executors see staging_dir (the head is staged there)
            head = _head(sample, min(sample_n, batch_size * _SINGLE_STEPS), sample_n)
            t_single = _single_process_step(model, spec, head, features_col, label_col, batch_size, k_plan,
                                            staging_dir, engine)
    weights, optimizer = get_state(model)
    staging_full_s = staging_s * max(1.0, total / sample_n)
    one_off = staging_full_s + first_extra
    cost = CostModel(t_single=t_single, t_step=t_step, fixed=fixed)
    top = max_workers or 8 * parallelism
    workers = sorted({w for w in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if w <= top}
                     | {w for w in counts if w > 1} | ({parallelism} if parallelism <= top else set()))
    frequencies = sorted(set(FREQUENCIES) | ({averaging_frequency} if averaging_frequency else set()))
    rows = predict(cost, total, batch_size, epochs, one_off, workers, frequencies)
    summary, best = recommend(rows, one_off, epochs, slots=parallelism)
    communication = _communication(cost, rows, best, total, batch_size, parallelism)
    if communication:
        summary += " " + communication
    if len(t_step) < len(counts):
        summary += (f" (The budget of {budget_s:g} s measured {', '.join(map(str, sorted(t_step)))} worker"
                    f"{'s' if max(t_step) != 1 else ''} of {', '.join(map(str, counts))}: a larger budget_s "
                    "measures the rest.)")
    measurements = dict(
        t_single=t_single, t_step=t_step, fixed=fixed, staging_s=staging_s, staging_full_s=staging_full_s,
        first_round_extra_s=first_extra, state_bytes=int(sum(a.nbytes for a in weights + optimizer)),
        num_examples=total, sample_examples=sample_n, measured_k=k_measure, parallelism=parallelism,
        transport=transport, master=engine.master, elapsed_s=time.perf_counter() - started, budget_s=float(budget_s),
    )
    return Advice(summary=summary, rows=rows, cost=cost, measurements=measurements, best=best, epochs=epochs)


def _communication(cost: CostModel, rows, best, num_examples: int, batch_size: int, slots: int) -> Optional[str]:
    """:func:`communication_advice` for the recommended row, or when staying, for the fastest measured distributed one."""
    if best["workers"] == 1:
        measured = [r for r in rows[1:] if not r["extrapolated"] and r["workers"] <= slots]
        if not measured:
            return None
        best = min(measured, key=lambda r: r["total_s"])
    w, k = best["workers"], best["averaging_frequency"]
    return communication_advice(k * cost.step_s(w), cost.fixed_s(w), k, max_k=num_examples // (w * batch_size))


def _head(data, n: int, total: int):
    """The first ``n`` examples of ``data``, of the same kind (all of it when ``n >= total``)."""
    from ..data.adapters import get_data_adapter

    return data if n >= total else get_data_adapter(data).head(n)


def _single_process_step(model, spec, head, features_col, label_col, batch_size: int, k: int,
                         staging_dir: Optional[str], engine) -> float:
    """One process's seconds per minibatch: ``keras.Model.fit`` on ``head`` (examples of the data), best of two ways.

    ``head`` is staged as ``fit`` stages data (:func:`sparkdl_avg.driver.data.staging.stage`: the same checks, dtypes
    and layout; one small Spark job for a DataFrame or an RDD) under a root of its own in ``staging_dir``, read back on
    the driver, and the root removed.
    """
    import numpy as np

    from ...shared.model.modelspec import input_dtypes, input_shapes, inputs_dtype
    from ...shared.data.staged_dataset import read_examples, structure
    from ..data import staging
    from ..data.staging_roots import StagingRoot

    root = StagingRoot.new(staging_dir, id(head))
    try:
        root.make(private=engine.one_host)
        staged = staging.stage(head, root=root.uri, x_shapes=input_shapes(model), x_dtype=input_dtypes(model),
                                label_dtype=inputs_dtype(model),
                                num_outputs=len(model.outputs), features_col=features_col, label_col=label_col,
                                what="training", checks=staging.data_checks(model))
        steps = staged.num_examples // batch_size
        examples = read_examples(staged, np.arange(steps * batch_size))
    finally:
        root.remove()
    xs, ys = structure(examples.xs), structure(examples.ys)
    best = math.inf
    for per_call in sorted({1, max(1, min(k, steps))}):
        copy = spec.build()
        copy.steps_per_execution = per_call
        copy.fit(xs, ys, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)  # traces; not timed
        t0 = time.perf_counter()
        copy.fit(xs, ys, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
        best = min(best, (time.perf_counter() - t0) / steps)
    return best


__all__ = ["Advice", "CostModel", "WARM_ROUNDS", "advise", "is_cold", "predict", "recommend",
           "slower_than_one_process", "steady_costs"]
