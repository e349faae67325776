"""Experiment tracking of fits in MLflow: :class:`MlflowLogger`, a callback of ``fit``.

This module owns what a fit logs to MLflow and when: which run it logs into (the active run, a run continued after a
resume, or a new run of an experiment), the fit's settings as params, one step of metrics per epoch, and at the end the
trained model (Keras flavour, with a tensor signature), ``stats.json`` and ``report.html``. The options come from the
:data:`~sparkdl_avg.driver.config.options.TRACKING` rows of :data:`sparkdl_avg.driver.config.options.OPTIONS`, so the
jobs (``--mlflow-experiment``, ...) and the estimator (``mlflowExperiment``, ...) make the same logger
(:func:`from_options`).

It talks to the tracking store through an ``MlflowClient`` of its own and leaves MLflow's global state alone (tracking
URI, active run). MLflow is an optional dependency (``pip install 'sparkdl_avg[mlflow]'``): the rest of the library
never imports it, and this module only when a logger is made.

Tracking never costs the training: a failing call (an unreachable server, a full disk) gives one
:class:`TrackingWarning`, nothing more is sent to MLflow in that fit, training goes on, and the fit's end says what was
not logged. MLflow's HTTP retries are bounded meanwhile (2 retries, 30 s per request) unless the user set
``MLFLOW_HTTP_REQUEST_*`` themselves, so an unreachable server costs seconds, not MLflow's default minutes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional

import keras

from ...errors import ConfigurationError
from ..config.codegen import constructor, document, trainer_entries
from ..config.options import TRACKING, check, of

logger = logging.getLogger("sparkdl_avg")

RUN_ID = "mlflow_run_id"  #: the key of the run id in ``FitInfo.tracking`` (and so in checkpoints)
LOGGED_TAG = "sparkdl_avg.fit"  #: set on a run a fit logged into; a second fit in that active run nests
ARTIFACT_MODEL = "model"  #: the model's artifact path: ``runs:/<run id>/model``
_SWITCH = ("mlflow",)  #: the rows that turn tracking on for the jobs and the estimator, not the logger's
_NAMED = ("experiment", "tracking_uri", "run_name")  #: giving any of these turns tracking on too
# MLflow's own defaults (7 retries, exponential backoff, 120 s timeout) stall a fit for minutes
# on an unreachable server; a user's MLFLOW_HTTP_REQUEST_* settings win.
_HTTP_LIMITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


class TrackingWarning(UserWarning):
    """Something could not be logged to MLflow; training went on."""


def _import_mlflow():
    try:
        import mlflow
    except ImportError:
        raise ConfigurationError(
            "MLflow tracking needs the mlflow package, which is not installed. "
            "Install it with: pip install 'sparkdl_avg[mlflow]'"
        ) from None
    return mlflow


@contextlib.contextmanager
def _bounded_http():
    added = [k for k in _HTTP_LIMITS if k not in os.environ]
    os.environ.update({k: _HTTP_LIMITS[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


class _Guard:
    """Runs tracking calls; after the first failure warns once and skips the rest, noting what."""

    def __init__(self) -> None:
        self.error: Optional[str] = None
        self.missed: List[str] = []

    def __call__(self, what: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        if self.error is not None:
            self.missed.append(what)
            return None
        try:
            with _bounded_http():
                return fn(*args, **kwargs)
        except Exception as exc:  # tracking must never stop training
            text = " ".join(f"{type(exc).__name__}: {exc}".split())
            self.error = text if len(text) <= 300 else text[:297] + "..."
            self.missed.append(what)
            warnings.warn(
                f"MLflow tracking failed while logging {what} ({self.error}). Training goes on; nothing "
                "more is logged to MLflow in this fit.",
                TrackingWarning,
                stacklevel=3,
            )
            return None


class MlflowLogger(keras.callbacks.Callback):
    """Logs a ``ParameterAveragingTrainer.fit`` to MLflow: pass it in ``fit(callbacks=[...])``.

    Which run: the run this fit's checkpoint was logged into when the fit resumes (``fit(resume=True)`` continues that
    run, without logging an epoch twice); else MLflow's active run (``with mlflow.start_run():``, a pipeline's run,
    ``mlflow.pyspark.ml.autolog()``'s), or a run nested in it when another fit already logged into it (tuning several
    models in one run); else a new run in ``experiment``. A run the logger started it also ends (``FINISHED``, or
    ``FAILED`` when the fit fails); the active run stays the user's.

    What: at the start, the fit's settings as params (the trainer's options, ``fit``'s, the workers, examples,
    transport, master and versions: ``FitInfo.params``); after every epoch, at step = the epoch, the epoch's logs
    (``loss``, compiled metrics, ``val_*``) and its ``epoch_time_s`` (rounds' wall time), ``examples_per_s``,
    ``compute_share`` (the slowest worker's compute over wall time) and ``overhead_share`` (the rest: launching, moving
    state, aggregating); at the end, with ``log_model``, the trained model, ``stats.json`` and ``report.html``.
    :meth:`log_evaluation` adds a final evaluation.

    Args:

    Attributes:
        run_id: The run the latest fit logged into (``None`` before a fit, or when the run could not be created).
        not_logged: What the latest fit could not log (empty when all went well).
    """

    __doc__ = document(__doc__, trainer_entries(TRACKING, exclude=_SWITCH))

    @constructor(TRACKING, exclude=_SWITCH)
    def __init__(self, **options: Any) -> None:
        super().__init__()
        for name, value in options.items():
            check(name, value)
        self.experiment: Optional[str] = options["experiment"]
        self.tracking_uri: Optional[str] = options["tracking_uri"]
        self.run_name: Optional[str] = options["run_name"]
        self.log_model: bool = options["log_model"]
        self._mlflow = _import_mlflow()  # refuse at construction, before any Spark job
        self.run_id: Optional[str] = None
        self.not_logged: List[str] = []
        self._fit = None
        self._client = None
        self._guard = _Guard()
        self._owns_run = False
        self._last_step = -1  # the last epoch already in the run (a resumed run's)

    # ------------------------------------------------------------ fit hooks

    def on_fit_begin(self, fit) -> None:
        """Finds or starts the run, records it in ``fit.tracking`` (checkpoints) and logs the params."""
        from mlflow import MlflowClient

        self._fit, self._guard, self.run_id, self.not_logged = fit, _Guard(), None, []
        self._owns_run, self._last_step = False, -1
        self._client = self._guard("the run", MlflowClient, self.tracking_uri)
        if self._client is not None:
            self.run_id = self._guard("the run", self._open_run, fit)
        if self.run_id is None:
            self._guard.missed.append("params")
            return
        fit.tracking[RUN_ID] = self.run_id
        self._guard("params", self._log_params, fit.params)

    def on_train_begin(self, logs=None) -> None:
        if self._fit is None:
            raise ConfigurationError(
                "MlflowLogger logs ParameterAveragingTrainer.fit (and the estimator's fit). For "
                "keras.Model.fit use mlflow.keras.autolog() or mlflow.keras.MlflowCallback."
            )

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Logs the epoch's logs and timings at step ``epoch`` (unless the resumed run has it)."""
        if epoch <= self._last_step:
            return
        metrics = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, (int, float))}
        metrics.update(self._epoch_timings(epoch))
        self._log_metrics(f"the metrics of epoch {epoch}", metrics, step=epoch)

    def on_fit_end(self, fit, error: Optional[BaseException]) -> None:
        """Logs the model and artifacts (after a successful fit), ends a run it started, reports misses."""
        if self.run_id is not None:
            if error is None and self.log_model:
                with tempfile.TemporaryDirectory(prefix="sparkdl_avg-mlflow-") as tmp:
                    self._guard("the model", self._log_keras_model, tmp)
                    self._guard("stats.json and report.html", self._log_reports, tmp)
            if self._owns_run:
                status = "FINISHED" if error is None else "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
                self._guard("the run's end", self._client.set_terminated, self.run_id, status)
        elif error is None and self.log_model:
            self._guard.missed.append("the model, stats.json and report.html")
        self._report_missed()
        self._fit = None

    def log_evaluation(self, metrics: Mapping[str, float], prefix: str = "final_") -> None:
        """Logs ``metrics`` (``trainer.evaluate(..., return_dict=True)``) into the latest fit's run.

        Each as ``prefix + name`` at the step of the fit's last epoch; the run may have ended. Without a run (none yet,
        or it could not be created) this warns and logs nothing.
        """
        if self.run_id is None or self._client is None:
            warnings.warn("MlflowLogger.log_evaluation: no run to log into (fit first).", TrackingWarning, stacklevel=2)
            return
        step = max(self._last_step, 0)
        self._guard = _Guard()
        self._log_metrics("the evaluation", {prefix + k: float(v) for k, v in metrics.items()}, step=step)
        self._report_missed()

    # ------------------------------------------------------------ internals

    def _open_run(self, fit) -> str:
        mlflow, client = self._mlflow, self._client
        previous = fit.tracking.get(RUN_ID) if fit.resumed_from else None
        if previous:
            try:
                run = client.get_run(previous)
            except Exception as exc:  # not in this store (another tracking URI), or deleted
                warnings.warn(
                    f"The checkpoint {fit.resumed_from} was logged to MLflow run {previous}, which this "
                    f"tracking store does not have ({type(exc).__name__}); logging to a new run.",
                    TrackingWarning,
                    stacklevel=4,
                )
            else:
                history = client.get_metric_history(previous, "loss")
                self._last_step = max((m.step for m in history), default=-1)
                client.update_run(previous, status="RUNNING")
                self._owns_run = True
                logger.info("MLflow: continuing run %s of experiment %s.", previous, run.info.experiment_id)
                return previous
        active = mlflow.active_run()
        if active is not None and (self.tracking_uri is None or self.tracking_uri == mlflow.get_tracking_uri()):
            if LOGGED_TAG not in client.get_run(active.info.run_id).data.tags:
                client.set_tag(active.info.run_id, LOGGED_TAG, "1")
                return active.info.run_id
            parent = active.info
            return self._create_run(parent.experiment_id, {"mlflow.parentRunId": parent.run_id})
        return self._create_run(self._experiment_id(), {})

    def _create_run(self, experiment_id: str, tags: Dict[str, str]) -> str:
        from mlflow.tracking.context.registry import resolve_tags

        run = self._client.create_run(
            experiment_id, run_name=self.run_name, tags=resolve_tags({**tags, LOGGED_TAG: "1"})
        )
        self._owns_run = True
        logger.info("MLflow: logging to run %s (%s) of experiment %s.", run.info.run_id, run.info.run_name,
                    experiment_id)
        return run.info.run_id

    def _experiment_id(self) -> str:
        client = self._client
        if self.experiment is not None:
            found = client.get_experiment_by_name(self.experiment)
            return found.experiment_id if found is not None else client.create_experiment(self.experiment)
        if self.tracking_uri is None:  # MLflow's current experiment: set_experiment, the environment, Databricks'
            from mlflow.tracking.fluent import _get_experiment_id

            return _get_experiment_id()
        if os.environ.get("MLFLOW_EXPERIMENT_ID"):
            return os.environ["MLFLOW_EXPERIMENT_ID"]
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "Default")
        found = client.get_experiment_by_name(name)
        return found.experiment_id if found is not None else client.create_experiment(name)

    def _log_params(self, params: Dict[str, Any]) -> None:
        from mlflow.entities import Param

        logged = self._client.get_run(self.run_id).data.params
        new = {k: str(v) for k, v in params.items() if k not in logged}
        changed = sorted(k for k, v in params.items() if k in logged and logged[k] != str(v))
        if changed:  # MLflow params cannot change; a resumed fit may, e.g., train to more epochs
            logger.info("MLflow: run %s keeps its earlier params %s.", self.run_id, ", ".join(changed))
        items = [Param(k, v) for k, v in new.items()]
        for i in range(0, len(items), 100):  # MLflow's limit per log_batch
            self._client.log_batch(self.run_id, params=items[i:i + 100])

    def _log_metrics(self, what: str, metrics: Dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        if self.run_id is None:
            self._guard.missed.append(what)
            return
        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in metrics.items()]
        self._guard(what, self._client.log_batch, self.run_id, metrics=items)

    def _epoch_timings(self, epoch: int) -> Dict[str, float]:
        from ...shared.wire.stats import wall_time

        records = [r for r in self._fit.trainer.stats.records if r.epoch == epoch]
        wall = wall_time(records)
        if not records or wall <= 0:
            return {}
        compute = sum(r.compute_max_s for r in records)
        slots = len({r.slot for r in records})  # chunk records (asynchronous modes) overlap: per worker
        return {
            "epoch_time_s": wall,
            "examples_per_s": sum(r.examples for r in records) / wall,
            "compute_share": compute / (wall * slots),
            "overhead_share": sum(r.overhead_s for r in records) / (wall * slots),
        }

    def _log_keras_model(self, tmp: str) -> None:
        import mlflow.keras

        path = os.path.join(tmp, ARTIFACT_MODEL)
        model = self._fit.trainer.model
        preprocess = getattr(self._fit.trainer, "_preprocess", None)
        if preprocess is not None:  # raw columns in: the function, then the model (sparkdl_avg.driver.observe.pyfunc)
            from . import pyfunc

            keras_file = os.path.join(tmp, "keras", "model.keras")
            os.makedirs(os.path.dirname(keras_file))
            model.save(keras_file)
            features = self._fit.params.get("features_col", "features") if self._fit.params else "features"
            pyfunc.save(path, keras_file, preprocess.payload, features if isinstance(features, list) else [features],
                        _requirements() + ["numpy", "pyarrow"])
            self._client.log_artifacts(self.run_id, path, ARTIFACT_MODEL)
            return
        mlflow.keras.save_model(
            model,
            path,
            signature=_signature(model),
            # MLflow's inference of requirements loads the model in a subprocess (seconds); these are known.
            pip_requirements=_requirements(),
        )
        self._client.log_artifacts(self.run_id, path, ARTIFACT_MODEL)

    def _log_reports(self, tmp: str) -> None:
        trainer = self._fit.trainer
        out = os.path.join(tmp, "reports")
        os.makedirs(out)
        trainer.stats.to_json(os.path.join(out, "stats.json"))
        trainer.write_report(os.path.join(out, "report.html"))
        self._client.log_artifacts(self.run_id, out)

    def _report_missed(self) -> None:
        self.not_logged = list(self._guard.missed)
        if self.not_logged:
            warnings.warn(
                f"Not logged to MLflow{f' run {self.run_id}' if self.run_id else ''}: "
                f"{_summarize(self.not_logged)}" + (f" ({self._guard.error})" if self._guard.error else "") + ".",
                TrackingWarning,
                stacklevel=3,
            )


def _summarize(missed: List[str]) -> str:
    """``["params", "the metrics of epoch 0", "the metrics of epoch 1"]`` → ``params, the metrics of epochs 0-1``."""
    epochs = [int(m.rsplit(" ", 1)[1]) for m in missed if m.startswith("the metrics of epoch ")]
    out: List[str] = []
    for m in missed:
        if m.startswith("the metrics of epoch "):
            if m == f"the metrics of epoch {epochs[0]}":
                span = f"{epochs[0]}" if len(epochs) == 1 else f"s {epochs[0]}-{epochs[-1]}"
                out.append(f"the metrics of epoch{span}")
        elif m not in out:
            out.append(m)
    return ", ".join(out)


def _tensor_schema(tensors, names):
    import numpy as np
    from mlflow.types import Schema, TensorSpec

    specs = []
    for t, name in zip(tensors, names):
        shape = tuple(-1 if d is None else int(d) for d in t.shape)
        specs.append(TensorSpec(np.dtype(keras.backend.standardize_dtype(t.dtype)), shape,
                                name if len(tensors) > 1 else None))
    return Schema(specs)


def _signature(model):
    """The model's tensor signature: each input's and output's dtype and shape (batch axis ``-1``)."""
    from mlflow.models import ModelSignature

    return ModelSignature(
        inputs=_tensor_schema(model.inputs, [getattr(t, "name", f"input_{i}") for i, t in enumerate(model.inputs)]),
        outputs=_tensor_schema(model.outputs, list(model.output_names) if hasattr(model, "output_names")
                               else [f"output_{i}" for i in range(len(model.outputs))]),
    )


def _requirements() -> List[str]:
    import tensorflow as tf

    return [f"tensorflow=={tf.__version__}", f"keras=={keras.__version__}"]


def from_options(values: Mapping[str, Any]) -> Optional[MlflowLogger]:
    """The logger the jobs' flags or the estimator's Params ask for, or ``None`` when tracking is off.

    ``values`` holds the :data:`~sparkdl_avg.driver.config.options.TRACKING` options by name. Tracking is on when
    ``mlflow`` is true or an ``experiment``, ``tracking_uri`` or ``run_name`` is given.
    """
    values = dict(values)
    for name in _SWITCH:
        check(name, values.get(name, False))
    on = any(values.pop(name, False) for name in _SWITCH)
    if not on and all(values.get(name) is None for name in _NAMED):
        return None
    return MlflowLogger(**{o.name: values[o.name] for o in of(TRACKING)
                           if o.name not in _SWITCH and values.get(o.name) is not None})


__all__ = ["MlflowLogger", "TrackingWarning", "from_options"]
